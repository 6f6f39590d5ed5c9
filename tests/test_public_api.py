"""One obvious import: every public model, kernel, estimator and fitting function is ``bnp.<Name>``."""

import jaxbnp as bnp

# the list, and the rest of the public surface the README uses
REQUIRED = [
    "PopulationDDT", "DiffusionTreeMCMC", "DiffusionTree", "BrownianLeaves", "nested_hdp_model",
    "fit_ddt", "fit_bhmc", "cut_tree", "to_linkage", "from_linkage", "select_alpha",
    "CollapsedGibbs", "SplitMerge", "TreeGuidedMCMC", "MAPDP", "DirichletProcessMixture",
    "DP", "PitmanYor", "NGGP", "NormalGamma", "NormalWishart", "BetaBernoulli", "DirichletMultinomial",
    "Partition", "ConjugateMixture", "AuxiliaryU", "fit_mapdp_chunked", "enable_compilation_cache",
    "fit_subcluster_chunked",
    # composing moves (docs/design.md) and the shared model
    "PartitionKernel", "moves", "BHMCKernel", "mixture_model",
    # any NumPyro likelihood (issue #40)
    "AuxiliaryGibbs", "SliceGibbs",
]


def test_every_public_name_is_reachable_and_listed():
    assert len(set(bnp.__all__)) == len(bnp.__all__)
    missing = [name for name in REQUIRED if name not in bnp.__all__]
    assert not missing, missing
    unreachable = [name for name in bnp.__all__ if not hasattr(bnp, name)]
    assert not unreachable, unreachable
    assert set(bnp.__all__) <= set(dir(bnp))
    assert bnp.fit_ddt is bnp.inference.trees.fit.fit_ddt
    assert bnp.select_alpha is bnp.estimators.select_alpha
    assert bnp.moves is bnp.inference.partition.moves
