"""What the models are: random measures, conjugate families, NumPyro distributions."""

from .distributions import AuxiliaryU, ConjugateMixture, Partition, log_joint, mixture_model
from .discrete import BetaBernoulli, DirichletMultinomial
from .families import Family, NormalGamma, NormalWishart
from .measures import DP, NGGP, Measure, PitmanYor

__all__ = [
    "AuxiliaryU", "ConjugateMixture", "Partition", "log_joint", "mixture_model",
    "BetaBernoulli", "DirichletMultinomial", "Family", "NormalGamma", "NormalWishart",
    "DP", "NGGP", "Measure", "PitmanYor",
]

# Dirichlet diffusion trees (docs/mathematics.md §5)
from .ddt import BrownianLeaves, DiffusionTree, Tree, cut_tree, from_linkage, to_linkage  # noqa: E402

__all__ += ["BrownianLeaves", "DiffusionTree", "Tree", "cut_tree", "from_linkage", "to_linkage"]

# BHMC's nested CRP + multilevel HDP mixture (docs/mathematics.md §6)
from .nested import NestedCRP, NestedHDP, nested_hdp_model, path_log_prior  # noqa: E402

__all__ += ["NestedCRP", "NestedHDP", "nested_hdp_model", "path_log_prior"]
