"""jaxbnp: Bayesian nonparametric clustering on JAX and NumPyro.

The library computes in JAX's default dtype (float32 unless
``jax.config.update("jax_enable_x64", True)``); the exact-posterior tests run
in float64.
"""

from . import datasets
from ._xla import set_cpu_loop_kernels
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

#: names loaded on first use (scikit-learn and ArviZ are imported only when needed)
_LAZY = {
    "DirichletProcessMixture": ("jaxbnp.estimators", "DirichletProcessMixture"),
    "MAPDP": ("jaxbnp.estimators", "MAPDP"),
    "metrics": ("jaxbnp.metrics", None),
    "diagnostics": ("jaxbnp.diagnostics", None),
    "checkpoint": ("jaxbnp.checkpoint", None),
    "estimators": ("jaxbnp.estimators", None),
    "plot": ("jaxbnp.plot", None),
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        module_name, attr = _LAZY[name]
        module = importlib.import_module(module_name)
        return module if attr is None else getattr(module, attr)
    raise AttributeError(f"module 'jaxbnp' has no attribute {name!r}")

__all__ = [
    "datasets", "set_cpu_loop_kernels",
    "DP", "NGGP", "PitmanYor",
    "NormalGamma", "NormalWishart", "DirichletMultinomial", "BetaBernoulli",
    "Partition", "ConjugateMixture", "AuxiliaryU", "log_joint",
    "CollapsedGibbs", "SplitMerge", "TreeGuidedMCMC", "collapsed_gibbs_fn", "ClusterState", "CapacityError",
    "DirichletProcessMixture", "MAPDP", "metrics", "diagnostics", "checkpoint", "estimators", "plot",
]
