"""How to fit the models: one module per algorithm, thin NumPyro adapters in ``kernels``."""

from .clusters import CapacityError, ClusterState
from .kernels import CollapsedGibbs, CollapsedGibbsState, collapsed_gibbs_fn
from .split_merge import SplitMerge
from .tgmcmc import TreeGuidedMCMC

__all__ = [
    "CapacityError", "ClusterState", "CollapsedGibbs", "CollapsedGibbsState", "collapsed_gibbs_fn",
    "SplitMerge", "TreeGuidedMCMC",
]
