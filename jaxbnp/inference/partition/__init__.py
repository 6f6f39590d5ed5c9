"""Samplers and optimisers of one partition of the data: the fixed-capacity cluster
state (``clusters``), collapsed Gibbs (``gibbs``), Jain-Neal split-merge
(``split_merge``), MAP-DP (``mapdp``), hyperparameter updates
(``hyperparameters``) and their NumPyro kernels (``kernels``)."""

from .clusters import CapacityError, ClusterState
from .kernels import CollapsedGibbs, CollapsedGibbsState, collapsed_gibbs_fn
from .split_merge import SplitMerge

__all__ = ["CapacityError", "ClusterState", "CollapsedGibbs", "CollapsedGibbsState",
           "SplitMerge", "collapsed_gibbs_fn"]
