"""jaxbnp: Bayesian nonparametric clustering on JAX and NumPyro.

The library computes in JAX's default dtype (float32 unless
``jax.config.update("jax_enable_x64", True)``); the exact-posterior tests run
in float64.
"""

from . import datasets
from .inference import (
    CapacityError, ClusterState, CollapsedGibbs, SplitMerge, TreeGuidedMCMC, collapsed_gibbs_fn,
)
from .models import (
    DP,
    NGGP,
    AuxiliaryU,
    BetaBernoulli,
    ConjugateMixture,
    DirichletMultinomial,
    NormalGamma,
    NormalWishart,
    Partition,
    PitmanYor,
    log_joint,
)

__version__ = "0.1.0"

__all__ = [
    "datasets",
    "DP", "NGGP", "PitmanYor",
    "NormalGamma", "NormalWishart", "DirichletMultinomial", "BetaBernoulli",
    "Partition", "ConjugateMixture", "AuxiliaryU", "log_joint",
    "CollapsedGibbs", "SplitMerge", "TreeGuidedMCMC", "collapsed_gibbs_fn", "ClusterState", "CapacityError",
]
