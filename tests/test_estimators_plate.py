"""DirichletProcessMixture with a likelihood written with a cluster plate
(``method="auxiliary"`` / ``"slice"``, ``likelihood=``): the draws are those of the kernel run
by NumPyro's ``MCMC``, the posterior predictive is a density, the cluster parameters come
sorted by the clusters of ``labels_``, capacity grows, bad settings raise.

scikit-learn's own checks run on ``method="auxiliary"`` in ``tests/test_sklearn.py``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.infer import MCMC
from scipy.stats import norm
from sklearn.metrics import adjusted_rand_score

import jaxbnp as bnp
from jaxbnp.models.likelihoods import default_prior, plate_mixture

SETTINGS = dict(num_warmup=20, num_samples=20, random_state=0, progress_bar=False)
RATES = np.array([2.0, 12.0, 45.0])


def _counts(n=120, seed=0):
    rng = np.random.default_rng(seed)
    y = np.arange(n) % 3
    return rng.poisson(RATES[y])[:, None].astype(float), y


@pytest.fixture(scope="module")
def poisson_fit():
    X, y = _counts()
    return X, y, bnp.DirichletProcessMixture(method="auxiliary", likelihood="poisson", **SETTINGS).fit(X)


def test_the_draws_are_the_kernels_under_numpyro_mcmc(poisson_fit):
    X, _, est = poisson_fit
    model = plate_mixture("poisson", est.capacity_)
    prior = {k: jnp.asarray(v, jnp.result_type(float)) for k, v in default_prior("poisson", X).items()}
    mcmc = MCMC(bnp.AuxiliaryGibbs(model), num_warmup=20, num_samples=20, num_chains=2,
                chain_method="vectorized", progress_bar=False)
    mcmc.run(jax.random.key(0), jnp.asarray(X, jnp.result_type(float)), bnp.DP(1.0), prior)
    z = np.asarray(mcmc.get_samples(group_by_chain=True)["z"])
    np.testing.assert_array_equal(est.posterior_samples_["labels"], z)


def test_finds_the_groups_and_sorts_the_parameters_by_cluster(poisson_fit):
    X, y, est = poisson_fit
    assert adjusted_rand_score(y, est.labels_) > 0.8
    rate = est.posterior_samples_["rate"]
    assert rate.shape == (2, 20, est.n_clusters_, 1) and est.cluster_sites_ == ("rate",)
    for k in range(est.n_clusters_):  # each cluster's rate: near the mean of its points
        mean = X[est.labels_ == k, 0].mean()
        assert abs(np.median(rate[:, :, k, 0]) - mean) < 0.25 * mean + 1.0, (k, mean)
    assert isinstance(est.measure_, bnp.DP) and est.family_ is None
    idata = bnp.diagnostics.to_arviz(est)
    assert idata.posterior["rate"].dims[:3] == ("chain", "draw", "cluster")


def test_the_poisson_predictive_is_a_distribution(poisson_fit):
    X, _, est = poisson_fit
    grid = np.arange(0, 300, dtype=float)[:, None]
    total = np.exp(est.score_samples(grid)).sum()
    assert total == pytest.approx(1.0, abs=1e-3)
    proba = est.predict_proba(np.array([[2.0], [12.0], [45.0], [400.0]]))
    np.testing.assert_allclose(proba.sum(axis=1), 1.0, rtol=1e-5)
    assert proba[3, -1] > 0.9  # far from every cluster: a new one
    groups = est.predict(np.array([[1.0], [12.0], [48.0]]))
    assert len(set(groups.tolist())) == 3
    assert est.predict(np.array([[400.0]]), allow_new=True)[0] == -1


@pytest.mark.parametrize("method", ["auxiliary", "slice"])
def test_default_likelihood_density_in_the_datas_units(method):
    rng = np.random.default_rng(1)
    X = np.r_[rng.normal(-3.0, 1.0, 60), rng.normal(4.0, 0.5, 40)][:, None] * 100.0 + 1e3
    est = bnp.DirichletProcessMixture(method=method, **SETTINGS).fit(X)
    assert adjusted_rand_score(np.r_[np.zeros(60), np.ones(40)], est.labels_) > 0.85
    grid = np.linspace(-1000.0, 3000.0, 4001)
    dens = np.exp(est.score_samples(grid[:, None]))
    assert np.trapezoid(dens, grid) == pytest.approx(1.0, abs=0.01)
    # near the truth where the data are (the mixture of the two Gaussians)
    truth = 0.6 * norm.pdf(grid, 700.0, 100.0) + 0.4 * norm.pdf(grid, 1400.0, 50.0)
    assert np.abs(dens - truth).sum() * (grid[1] - grid[0]) < 0.3
    # a second fit on data of the same shape compiles nothing (issue #36's compile-once)
    assert _compilations(lambda: bnp.DirichletProcessMixture(method=method, **SETTINGS).fit(X + 1.0)) == 0


def _compilations(fn) -> int:
    """Programs XLA compiled (or loaded from the persistent cache) while ``fn()`` ran."""
    events = []
    listen = lambda event, *args, **kwargs: events.append(event)  # noqa: E731
    jax.monitoring.register_event_duration_secs_listener(listen)
    jax.monitoring.register_event_listener(listen)
    try:
        fn()
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)
        jax.monitoring.unregister_event_listener(listen)
    return sum(e in ("/jax/core/compile/backend_compile_duration", "/jax/compilation_cache/cache_hits")
               for e in events)


def test_a_model_of_the_users_own():
    def model(X):
        z = numpyro.sample("z", bnp.Partition(bnp.DP(1.0), X.shape[0]))
        with numpyro.plate("clusters", 16):
            rate = numpyro.sample("rate", dist.LogNormal(2.0, 1.5))
        numpyro.sample("X", dist.Poisson(rate[z][:, None]).to_event(1), obs=X)  # X is (n, 1)

    X, y = _counts()
    est = bnp.DirichletProcessMixture(method="auxiliary", likelihood=model,  # the launch moves too
                                      method_options={"split_merge": "launch"}, **SETTINGS).fit(X)
    assert adjusted_rand_score(y, est.labels_) > 0.8 and est.capacity_ == 16
    assert est.posterior_samples_["rate"].shape == (2, 20, est.n_clusters_)
    assert np.exp(est.score_samples(np.arange(0, 300.0)[:, None])).sum() == pytest.approx(1.0, abs=1e-3)
    with pytest.raises(ValueError, match="latent sites"):  # a hyperprior: the kernel alone cannot

        def hyper(X):
            a = numpyro.sample("a", dist.Gamma(2.0, 1.0))
            z = numpyro.sample("z", bnp.Partition(bnp.DP(1.0), X.shape[0]))
            with numpyro.plate("clusters", 16):
                rate = numpyro.sample("rate", dist.LogNormal(jnp.log(a), 1.5))
            numpyro.sample("X", dist.Poisson(rate[z][:, None]).to_event(1), obs=X)

        bnp.DirichletProcessMixture(method="auxiliary", likelihood=hyper, **SETTINGS).fit(X)

    def one_d(X):  # written for X of shape (n,): the estimator's X is (n, 1)
        z = numpyro.sample("z", bnp.Partition(bnp.DP(1.0), X.shape[0]))
        with numpyro.plate("clusters", 16):
            rate = numpyro.sample("rate", dist.LogNormal(2.0, 1.5))
        numpyro.sample("X", dist.Poisson(rate[z]), obs=X)

    with pytest.raises(ValueError, match="one log density per point"):
        bnp.DirichletProcessMixture(method="auxiliary", likelihood=one_d, **SETTINGS).fit(X)


def test_a_full_plate_grows():
    X, _ = _counts(60)
    est = bnp.DirichletProcessMixture(method="auxiliary", likelihood="poisson", capacity=2,
                                      **SETTINGS).fit(X)
    assert est.capacity_ > 2 and est.n_clusters_ >= 3


@pytest.mark.parametrize("kwargs, match", [
    (dict(likelihood="poisson"), "method='auxiliary'"),
    (dict(method="auxiliary", likelihood="gamma"), "likelihood must be"),
    (dict(method="auxiliary", family=bnp.NormalGamma.from_data(np.arange(5.0)[:, None])), "family= is for"),
    (dict(method="slice", likelihood=lambda X: None, measure=bnp.DP(2.0)), "holds the measure"),
    (dict(method="slice", likelihood=lambda X: None, capacity=8), "plate's size"),
    (dict(method="auxiliary", measure=bnp.NGGP(1.0, 0.3)), "DP and PitmanYor"),
    (dict(method="auxiliary", init="kmeans++"), "not 'kmeans\\+\\+'"),
    (dict(method="auxiliary", method_options={"num_swap_passes": 2}), "not options"),
])
def test_bad_settings_raise_before_compiling(kwargs, match):
    X, _ = _counts(20)
    with pytest.raises(ValueError, match=match):
        bnp.DirichletProcessMixture(**kwargs).fit(X)


def test_counts_must_be_counts():
    with pytest.raises(ValueError, match="counts"):
        bnp.DirichletProcessMixture(method="auxiliary", likelihood="poisson").fit(np.array([[1.5], [2.0]]))
