"""How to fit the models: one module per algorithm, thin NumPyro adapters in ``kernels``."""

from .clusters import CapacityError, ClusterState
from .kernels import CollapsedGibbs, CollapsedGibbsState, collapsed_gibbs_fn
from .split_merge import SplitMerge
from .tgmcmc import TreeGuidedMCMC

__all__ = [
    "CapacityError", "ClusterState", "CollapsedGibbs", "CollapsedGibbsState", "collapsed_gibbs_fn",
    "SplitMerge", "TreeGuidedMCMC",
]

# Dirichlet diffusion trees: within-chain MCMC and population MCMC (MATH.md §5)
from .ddt_mcmc import DDTFit, DiffusionTreeMCMC, fit_ddt  # noqa: E402
from .population import PopulationDDT  # noqa: E402

__all__ += ["DDTFit", "DiffusionTreeMCMC", "PopulationDDT", "fit_ddt"]

# BHMC: nested CRP + multilevel HDP mixture (MATH.md §6)
from .bhmc import BHMCFit, fit_bhmc  # noqa: E402

__all__ += ["BHMCFit", "fit_bhmc"]
