"""Samplers and optimisers of one partition of the data: the fixed-capacity cluster
state (``clusters``), collapsed Gibbs (``gibbs``), Jain-Neal split-merge
(``split_merge``), Neal's Algorithm 8 for any likelihood on a cluster plate
(``auxiliary``), Walker's slice sampler on stick-breaking weights for the same
models (``slice_gibbs``), sub-cluster split/merge MCMC (``subcluster``), composable moves
over a partition (``moves``), MAP-DP (``mapdp``), hyperparameter selection
(``hyperparameters``) and their NumPyro kernels (``kernels``)."""

from .auxiliary import AuxiliaryGibbs
from .slice_gibbs import SliceGibbs
from .clusters import CapacityError, ClusterState, PartitionState
from .kernels import (
    CollapsedGibbs, CollapsedGibbsState, PartitionKernel, PartitionKernelState, SplitMerge,
    SubClusterMCMC, collapsed_gibbs_fn,
)

__all__ = ["AuxiliaryGibbs", "CapacityError", "ClusterState", "CollapsedGibbs", "CollapsedGibbsState",
           "PartitionKernel", "PartitionKernelState", "PartitionState", "SliceGibbs", "SplitMerge", "SubClusterMCMC",
           "collapsed_gibbs_fn"]
