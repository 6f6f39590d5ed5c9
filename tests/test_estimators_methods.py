"""DirichletProcessMixture beyond the default settings: its draws against NumPyro's ``MCMC``
with two chains, split-merge, tree-guided MCMC (with an NGGP prior), sub-cluster MCMC and
MAP-DP.

Each test compiles its own samplers (about 10 s of CPU each on a 2-core machine).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from numpyro.infer import MCMC
from sklearn.metrics import adjusted_rand_score

import jaxbnp as bnp
from jaxbnp import _defaults as defaults
from jaxbnp.estimators import MAPDP, DirichletProcessMixture, SingleClusterWarning
from jaxbnp.models.distributions import mixture_model
from tests.test_estimators_dpm import _blobs


@pytest.mark.parametrize("settings", ["defaults", "gibbs-prior-start"])
def test_draws_equal_numpyro_mcmc_with_the_same_key_two_chains_thinned(settings):
    """The defaults (split-merge with five moves, two chains, each from its own k-means++
    start) and collapsed Gibbs from a prior draw: the draws of NumPyro's ``MCMC`` with the
    same kernel, key and starts."""
    X, _ = _blobs(12)
    family = bnp.NormalGamma(0.0, 0.2, 2.0, 1.0)
    model = functools.partial(mixture_model, measure=bnp.DP(1.0), family=family)
    common = dict(family=family, num_warmup=3, num_samples=3, thinning=2, random_state=7)
    init_params = None
    if settings == "defaults":
        dpm = DirichletProcessMixture(**common).fit(X)
        kernel = bnp.SplitMerge(model, num_split_merge=5)
        init_params = {"z": defaults.kmeans_starts(X, 7, defaults.INIT_CLUSTERS, 2)}
        assert init_params["z"].shape == (2, 12) and len(np.unique(init_params["z"][0])) > 3
    else:
        dpm = DirichletProcessMixture(method="gibbs", init="prior", num_chains=2, **common).fit(X)
        kernel = bnp.CollapsedGibbs(model, init_strategy="prior")
    mcmc = MCMC(kernel, num_warmup=3, num_samples=6,
                thinning=2, num_chains=2, chain_method="vectorized", progress_bar=False)
    mcmc.run(jax.random.key(7), jnp.asarray(X), extra_fields=("log_joint", "num_clusters"),
             init_params=init_params)
    extra = mcmc.get_extra_fields(group_by_chain=True)
    post = dpm.posterior_samples_
    assert post["labels"].shape == (2, 3, 12)
    np.testing.assert_array_equal(post["labels"], mcmc.get_samples(group_by_chain=True)["z"])
    np.testing.assert_array_equal(post["num_clusters"], extra["num_clusters"])
    # the data are an argument of the estimator's compiled program and constants of NumPyro's:
    # XLA may round the log joint differently in the last bit
    np.testing.assert_allclose(post["log_joint"], extra["log_joint"], rtol=1e-13)


def test_the_estimator_and_the_command_line_share_their_defaults():
    """One table (``jaxbnp._defaults``): the method, chains, run length, split-merge moves
    and k-means++ start of ``DirichletProcessMixture()`` are ``jaxbnp cluster``'s."""
    from jaxbnp import cli

    args = cli.build_parser().parse_args(["cluster"])
    cli._apply_method_defaults(args)
    dpm = DirichletProcessMixture()
    assert dpm.method == args.method == defaults.METHOD == "splitmerge"
    assert dpm.num_chains == args.chains == 2
    assert dpm._iterations() == (args.warmup, args.samples) == (50, 100)
    assert defaults.KERNEL_OPTIONS["splitmerge"]["num_split_merge"] == args.split_merge_moves == 5
    assert dpm.init is None and defaults.INIT["splitmerge"] == "kmeans++" and args.init == "kmeans"
    assert dpm.init_clusters == args.init_clusters == defaults.INIT_CLUSTERS
    for method in ("gibbs", "subcluster", "tgmcmc"):
        args = cli.build_parser().parse_args(["cluster", "--method", method])
        cli._apply_method_defaults(args)
        assert DirichletProcessMixture(method=method)._iterations() == (args.warmup, args.samples)
        if method in defaults.INIT:
            assert args.init == {"kmeans++": "kmeans", "one": "one"}[defaults.INIT[method]]


@pytest.mark.parametrize("method, measure, options", [
    ("splitmerge", bnp.DP(1.0), {"num_split_merge": 3}),
    ("tgmcmc", bnp.NGGP(1.0, 0.3), {"num_global_moves": 3, "depth": 1}),  # NGGP: the u site
])
def test_other_samplers_find_the_blobs(method, measure, options):
    X, y = _blobs(24)
    dpm = DirichletProcessMixture(method=method, measure=measure, method_options=options,
                                  num_warmup=20, num_samples=10, random_state=1).fit(X)
    assert adjusted_rand_score(y, dpm.labels_) == 1.0
    post = dpm.posterior_samples_
    assert post["labels"].shape == (2, 10, 24)  # two chains by default
    if measure.has_auxiliary:
        assert post["u"].shape == (2, 10) and np.all(post["u"] > 0)
    proba = dpm.predict_proba(X[:3])
    np.testing.assert_allclose(proba.sum(1), 1.0, rtol=1e-12)
    np.testing.assert_array_equal(dpm.predict(X[:3]), dpm.labels_[:3])


def _four_blobs(n=200, seed=0):
    rng = np.random.default_rng(seed)
    centres = np.array([[-6.0, 0.0], [6.0, 0.0], [0.0, 8.0], [0.0, -8.0]])
    y = np.arange(n) % 4
    return centres[y] + rng.normal(size=(n, 2)), y


@pytest.mark.parametrize("measure", [bnp.DP(1.0), bnp.PitmanYor(1.0, 0.2)])
def test_subcluster_default_settings_find_four_blobs(measure):
    """method="subcluster" with every other setting at its default (two chains, each from
    one cluster, 64 slots, 3 launch sweeps, 50 + 100 iterations): the four groups, no more,
    no fewer."""
    X, y = _four_blobs()
    dpm = DirichletProcessMixture(method="subcluster", measure=measure, random_state=0).fit(X)
    assert dpm.n_clusters_ == 4 and adjusted_rand_score(y, dpm.labels_) == 1.0
    assert dpm.capacity_ == 64 and isinstance(dpm.measure_, type(measure))
    post = dpm.posterior_samples_
    assert post["labels"].shape == (2, 100, 200) and "u" not in post
    np.testing.assert_array_equal(dpm.predict(X[:8]), dpm.labels_[:8])


def test_subcluster_rejects_nggp_and_foreign_options_before_sampling():
    X, _ = _blobs(24)
    with pytest.raises(ValueError, match="method='subcluster' supports DP and PitmanYor measures, got NGGP"):
        DirichletProcessMixture(method="subcluster", measure=bnp.NGGP(1.0, 0.3)).fit(X)
    with pytest.raises(ValueError, match=r"\['num_split_merge'\] are not options of method='subcluster'"):
        DirichletProcessMixture(method="subcluster", method_options={"num_split_merge": 3}).fit(X)
    with pytest.raises(ValueError, match="num_launch_sweeps must be an integer >= 0"):
        DirichletProcessMixture(method="subcluster", method_options={"num_launch_sweeps": -1}).fit(X)
    with pytest.raises(ValueError, match="method must be one of"):
        DirichletProcessMixture(method="sub-cluster").fit(X)


def test_mapdp_delegates_to_MAPDP():
    X, y = _blobs(24)
    dpm = DirichletProcessMixture(method="mapdp", random_state=3).fit(X)
    ref = MAPDP(alpha=1.0, random_state=3).fit(X)  # the same defaults, default prior included
    np.testing.assert_array_equal(dpm.labels_, ref.labels_)
    assert dpm.n_clusters_ == 3 and adjusted_rand_score(y, dpm.labels_) == 1.0
    # the paper's variant through method_options: one cluster, and the warning passes through
    with pytest.warns(SingleClusterWarning, match="one cluster"):
        DirichletProcessMixture(method="mapdp", method_options={
            "init": "one", "split_moves": False, "merge_moves": False, "mode": "sequential"},
            family=bnp.NormalWishart.from_data(X)).fit(X)
    np.testing.assert_allclose(dpm.predict_proba(X[:5]), ref.predict_proba(X[:5]))
    np.testing.assert_allclose(dpm.score_samples(X[:5]), ref.score_samples(X[:5]))
    assert dpm.posterior_samples_["labels"].shape == (1, 1, 24)
    assert dpm.posterior_samples_["log_joint"][0, 0] == pytest.approx(-ref.nll_)
    with pytest.raises(ValueError, match="X has 3 features, but DirichletProcessMixture is expecting 2"):
        dpm.predict(np.zeros((2, 3)))
