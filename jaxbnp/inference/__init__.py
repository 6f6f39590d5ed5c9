"""How to fit the models, one subpackage per capability:

- ``partition``: one partition of the data (cluster state, collapsed Gibbs,
  split-merge, sub-cluster split/merge, MAP-DP, Algorithm 8 and Walker's slice sampler
  for any likelihood on a cluster plate) and their NumPyro kernels;
- ``tgmcmc``: tree-guided MCMC over IBHC trees;
- ``trees``: Dirichlet diffusion trees, within-chain and population MCMC;
- ``bhmc``: the nested CRP with multilevel HDP mixtures;
- ``mesh``: device meshes and the layout of points over them; ``sharded``: MAP-DP and
  collapsed Gibbs over a mesh; ``streamed``: the drivers over data larger than device
  memory; ``distributed``: multi-host start-up (and the three re-exported);
- ``base``, ``adapter``, ``runner``: the one algorithm shape, the NumPyro adapters, the one driver.
"""

from .adapter import AlgorithmKernel
from .bhmc import BHMCFit, BHMCKernel, fit_bhmc
from .partition import (
    AuxiliaryGibbs, CapacityError, ClusterState, CollapsedGibbs, CollapsedGibbsState, PartitionKernel, SliceGibbs,
    SplitMerge,
    SubClusterMCMC, collapsed_gibbs_fn,
)
from .partition import moves
from .tgmcmc import TreeGuidedMCMC
from .trees import DDTFit, DiffusionTreeMCMC, PopulationDDT, fit_ddt

__all__ = [
    "CapacityError", "ClusterState", "CollapsedGibbs", "CollapsedGibbsState", "collapsed_gibbs_fn",
    "SplitMerge", "SubClusterMCMC", "TreeGuidedMCMC", "DDTFit", "DiffusionTreeMCMC", "PopulationDDT", "fit_ddt",
    "BHMCFit", "BHMCKernel", "fit_bhmc", "PartitionKernel", "moves", "PARTITION_KERNELS",
    "AlgorithmKernel", "AuxiliaryGibbs", "SliceGibbs",
]

#: the ready-made partition samplers by the method names the estimators and the command
#: line use (``DirichletProcessMixture(method=...)``, ``jaxbnp cluster --method ...``)
PARTITION_KERNELS = {
    "gibbs": CollapsedGibbs, "splitmerge": SplitMerge, "tgmcmc": TreeGuidedMCMC,
    "subcluster": SubClusterMCMC,
}
