"""jaxbnp: Bayesian nonparametric clustering on JAX and NumPyro.

The library computes in JAX's default dtype (float32 unless
``jax.config.update("jax_enable_x64", True)``); the exact-posterior tests run
in float64.
"""

from . import datasets
from ._cache import enable_compilation_cache
from ._xla import set_cpu_loop_kernels
from .inference import (
    AuxiliaryGibbs,
    BHMCFit,
    BHMCKernel,
    PartitionKernel,
    moves,
    CapacityError,
    ClusterState,
    CollapsedGibbs,
    CollapsedGibbsState,
    DDTFit,
    DiffusionTreeMCMC,
    PopulationDDT,
    SliceGibbs,
    SplitMerge,
    SubClusterMCMC,
    TreeGuidedMCMC,
    collapsed_gibbs_fn,
    fit_bhmc,
    fit_ddt,
)
from .models import (
    DP,
    NGGP,
    AuxiliaryU,
    BetaBernoulli,
    BrownianLeaves,
    ConjugateMixture,
    DiffusionTree,
    DirichletMultinomial,
    Family,
    Measure,
    NestedCRP,
    NestedHDP,
    NormalGamma,
    NormalWishart,
    Partition,
    PitmanYor,
    Tree,
    cut_tree,
    from_linkage,
    log_joint,
    mixture_model,
    nested_hdp_model,
    path_log_prior,
    to_linkage,
)

__version__ = "0.1.0"

#: names loaded on first use (scikit-learn and ArviZ are imported only when needed)
_LAZY = {
    "DirichletProcessMixture": ("jaxbnp.estimators", "DirichletProcessMixture"),
    "MAPDP": ("jaxbnp.estimators", "MAPDP"),
    "select_alpha": ("jaxbnp.estimators", "select_alpha"),
    "SingleClusterWarning": ("jaxbnp.estimators", "SingleClusterWarning"),
    "NotFittedError": ("jaxbnp.estimators", "NotFittedError"),
    "fit_mapdp_chunked": ("jaxbnp.inference.streamed", "fit_mapdp_chunked"),
    "fit_subcluster_chunked": ("jaxbnp.inference.streamed", "fit_subcluster_chunked"),
    "distributed": ("jaxbnp.inference.distributed", None),
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
    "datasets", "set_cpu_loop_kernels", "enable_compilation_cache",
    # random measures and conjugate families
    "DP", "NGGP", "PitmanYor", "Measure",
    "NormalGamma", "NormalWishart", "DirichletMultinomial", "BetaBernoulli", "Family",
    # models (NumPyro distributions and programs)
    "Partition", "ConjugateMixture", "AuxiliaryU", "log_joint", "mixture_model",
    "DiffusionTree", "BrownianLeaves", "Tree", "cut_tree", "from_linkage", "to_linkage",
    "NestedCRP", "NestedHDP", "nested_hdp_model", "path_log_prior",
    # kernels (NumPyro MCMCKernels)
    "CollapsedGibbs", "CollapsedGibbsState", "SplitMerge", "SubClusterMCMC", "TreeGuidedMCMC",
    "collapsed_gibbs_fn", "AuxiliaryGibbs", "SliceGibbs",
    "PartitionKernel", "moves", "BHMCKernel",
    "DiffusionTreeMCMC", "PopulationDDT",
    "ClusterState", "CapacityError",
    # estimators and fitting functions
    "DirichletProcessMixture", "MAPDP", "select_alpha", "SingleClusterWarning", "NotFittedError",
    "fit_ddt", "DDTFit", "fit_bhmc", "BHMCFit", "fit_mapdp_chunked",
    "fit_subcluster_chunked",
    # modules
    "metrics", "diagnostics", "checkpoint", "estimators", "plot", "distributed",
]


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
