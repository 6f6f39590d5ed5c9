"""``AuxiliaryGibbs`` as a NumPyro kernel: the issue's model as written, chain methods,
composition with NUTS, ``log_likelihood``, and the errors a model it cannot read gets (the
exact tests are in ``tests/exact/test_auxiliary_exact.py``)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.infer import MCMC, NUTS, Gibbs
from numpyro.infer.util import log_likelihood

import jaxbnp as bnp

RNG = np.random.default_rng(0)
X = jnp.asarray(np.concatenate([RNG.poisson(2.0, 20), RNG.poisson(30.0, 20)]).astype(float))


def model(X):  # the issue's model, as written
    z = numpyro.sample("z", bnp.Partition(bnp.DP(1.0), X.shape[0]))
    with numpyro.plate("clusters", 32):
        rate = numpyro.sample("rate", dist.LogNormal(0.0, 1.0))
    numpyro.sample("X", dist.Poisson(rate[z]), obs=X)


def _run(kernel, key, num_chains=1, chain_method="sequential", data=X, **run_kwargs):
    mcmc = MCMC(kernel, num_warmup=20, num_samples=30, num_chains=num_chains, chain_method=chain_method,
                progress_bar=False)
    fields = () if isinstance(kernel, Gibbs) else ("num_clusters", "log_joint")
    mcmc.run(key, data, extra_fields=fields, **run_kwargs)
    return mcmc


def test_the_issue_model_runs_and_finds_the_two_groups():
    mcmc = _run(bnp.AuxiliaryGibbs(model), jax.random.key(0))
    s = mcmc.get_samples()
    assert s["z"].shape == (30, 40) and s["z"].dtype == jnp.int32
    assert s["rate"].shape == (30, 32)
    z = np.asarray(s["z"][-1])
    assert len(set(z[:20]) & set(z[20:])) == 0  # Poisson(2) and Poisson(30) never share a cluster
    rate = np.asarray(s["rate"][-1])
    assert np.all(rate[z[20:]] > 15) and np.all(rate[z[:20]] < 8)  # slots renumbered with labels
    assert np.isfinite(mcmc.get_extra_fields()["log_joint"]).all()
    ll = log_likelihood(model, s, X)["X"]
    assert ll.shape == (30, 40) and np.isfinite(ll).all()


def test_chain_methods_give_the_same_draws():
    """Sequential, vectorized and parallel chains (the suite's 4 host devices; a traced
    start) give the same draws (the key types: tests/test_keys.py)."""
    seq = _run(bnp.AuxiliaryGibbs(model), jax.random.key(3), num_chains=2).get_samples()["z"]
    for method in ("vectorized", "parallel"):
        other = _run(bnp.AuxiliaryGibbs(model), jax.random.key(3), num_chains=2,
                     chain_method=method).get_samples()["z"]
        np.testing.assert_array_equal(seq, other)


def hyper_model(X):
    mu0 = numpyro.sample("mu0", dist.Normal(0.0, 2.0))
    z = numpyro.sample("z", bnp.Partition(bnp.PitmanYor(1.0, 0.2), X.shape[0]))
    with numpyro.plate("clusters", 16):
        rate = numpyro.sample("rate", dist.LogNormal(mu0, 1.0))
    numpyro.sample("X", dist.Poisson(rate[z]), obs=X)


def test_hyperprior_above_the_plate_by_nuts():
    kernel = Gibbs([(bnp.AuxiliaryGibbs(hyper_model), ["z", "rate"]), (NUTS(hyper_model), ["mu0"])])
    s = _run(kernel, jax.random.key(1)).get_samples()
    assert set(s) == {"z", "rate", "mu0"} and np.isfinite(s["mu0"]).all()
    assert len(np.unique(np.asarray(s["mu0"]))) > 1  # NUTS moved it


def test_a_latent_site_outside_the_plate_is_named_with_the_fix():
    with pytest.raises(ValueError, match=r"\['mu0'\].*numpyro.infer.Gibbs"):
        _run(bnp.AuxiliaryGibbs(hyper_model), jax.random.key(0))


def test_a_full_plate_raises_capacity_error_naming_it():
    def small(X):
        z = numpyro.sample("z", bnp.Partition(bnp.DP(1.0), X.shape[0]))
        with numpyro.plate("slots", 1):
            rate = numpyro.sample("rate", dist.LogNormal(0.0, 1.0))
        numpyro.sample("X", dist.Poisson(rate[z]), obs=X)

    with pytest.raises(Exception, match="plate 'slots'"):
        _run(bnp.AuxiliaryGibbs(small), jax.random.key(0))


@pytest.mark.parametrize("kernel", ["AuxiliaryGibbs", "SliceGibbs"])
@pytest.mark.parametrize("progress_bar", [True, False], ids=["progress-bar", "no-progress-bar"])
def test_a_full_plate_raises_with_or_without_a_callback(kernel, progress_bar, monkeypatch):
    """NumPyro's progress bar reads every step's state on the host: there the step holds no
    overflow callback and ``get_diagnostics_str`` raises ``CapacityError``; without the bar
    the step's callback raises (callbacks counted, both ways)."""
    from jaxbnp.inference.partition import auxiliary, slice_gibbs

    calls = []
    for module in (auxiliary, slice_gibbs):
        real = module.raise_capacity_error_if
        monkeypatch.setattr(module, "raise_capacity_error_if",
                            lambda *a, real=real, **k: (calls.append(1), real(*a, **k))[1])

    def small(X):
        z = numpyro.sample("z", bnp.Partition(bnp.DP(5.0), X.shape[0]))
        with numpyro.plate("slots", 2):
            rate = numpyro.sample("rate", dist.LogNormal(0.0, 1.0))
        numpyro.sample("X", dist.Poisson(rate[z]), obs=X)

    mcmc = MCMC(getattr(bnp, kernel)(small), num_warmup=20, num_samples=30)
    mcmc.progress_bar = progress_bar  # NumPyro turns it off under pytest-xdist and CI
    with pytest.raises(Exception, match="plate 'slots'") as err:
        mcmc.run(jax.random.key(0), X)
    assert bool(calls) != progress_bar
    if progress_bar:
        assert err.type is bnp.CapacityError


def _no_plate(X):
    z = numpyro.sample("z", bnp.Partition(bnp.DP(1.0), X.shape[0]))
    rate = numpyro.sample("rate", dist.LogNormal(0.0, 1.0))
    numpyro.sample("X", dist.Poisson(rate * jnp.ones(X.shape[0]) + z), obs=X)


def _two_plates(X):
    z = numpyro.sample("z", bnp.Partition(bnp.DP(1.0), X.shape[0]))
    with numpyro.plate("features", 2, dim=-1), numpyro.plate("clusters", 8, dim=-2):
        rate = numpyro.sample("rate", dist.LogNormal(0.0, 1.0))
    numpyro.sample("X", dist.Poisson(rate[z].sum(-1)), obs=X)


def _conjugate(X):
    z = numpyro.sample("z", bnp.Partition(bnp.DP(1.0), X.shape[0]))
    numpyro.sample("X", bnp.ConjugateMixture(bnp.NormalGamma(), z), obs=X[:, None])


def _nggp(X):
    u = numpyro.sample("u", bnp.AuxiliaryU())
    z = numpyro.sample("z", bnp.Partition(bnp.NGGP(1.0, 0.3), X.shape[0], u=u))
    with numpyro.plate("clusters", 8):
        rate = numpyro.sample("rate", dist.LogNormal(0.0, 1.0))
    numpyro.sample("X", dist.Poisson(rate[z]), obs=X)


@pytest.mark.parametrize("bad, message", [
    (_no_plate, "one numpyro.plate"),
    (_two_plates, "to_event"),
    (_conjugate, "collapsed kernels"),
    (_nggp, "DP and PitmanYor"),
])
def test_models_it_cannot_read_say_what_to_write(bad, message):
    with pytest.raises(ValueError, match=message):
        _run(bnp.AuxiliaryGibbs(bad), jax.random.key(0))


def test_launch_split_merge_splits_one_cluster_without_sweeps():
    """``split_merge="launch"`` alone (no sweep) takes the one starting cluster to the two
    groups: a split that draws both halves' rates; beside NUTS owning the rates it is refused
    with the fix."""
    mcmc = _run(bnp.AuxiliaryGibbs(model, num_sweeps=0, num_split_merge=2, split_merge="launch"),
                jax.random.key(2))
    z = np.asarray(mcmc.get_samples()["z"][-1])
    assert len(set(z[:20]) & set(z[20:])) == 0 and np.asarray(mcmc.get_extra_fields()["num_clusters"])[-1] >= 2
    kernel = Gibbs([(bnp.AuxiliaryGibbs(model, split_merge="launch"), ["z"]), (NUTS(model), ["rate"])])
    with pytest.raises(ValueError, match="split_merge='given'"):
        _run(kernel, jax.random.key(0))


def test_more_slots_than_points_beside_nuts_is_refused():
    kernel = Gibbs([(bnp.AuxiliaryGibbs(model), ["z"]), (NUTS(model), ["rate"])])
    with pytest.raises(ValueError, match="at most n = 5 slots"):
        _run(kernel, jax.random.key(0), data=X[:5])


def test_bad_settings_and_starts():
    for kwargs in ({"num_param_steps": 0}, {"step_size": -1.0}, {"init_strategy": "singletons"},
                   {"chain_batching": "pmap"}, {"split_merge": "restricted"}, {"num_launch_steps": 0}):
        with pytest.raises(ValueError):
            bnp.AuxiliaryGibbs(model, **kwargs)
    with pytest.raises(ValueError, match="misspelt|init_params names"):
        _run(bnp.AuxiliaryGibbs(model), jax.random.key(0), init_params={"rates": jnp.ones(32)})
    with pytest.raises(ValueError, match="more clusters than plate|has 40 clusters"):
        _run(bnp.AuxiliaryGibbs(model), jax.random.key(0), init_params={"z": jnp.arange(40)})


def test_arviz_sees_the_parameters_by_cluster():
    """``arviz.from_numpyro`` (the posterior, the pointwise log likelihood) and
    ``bnp.diagnostics.to_arviz`` (with the extra fields): the parameters come slot by slot in
    the clusters' first-appearance order, so ``rate[..., 0]`` is the first point's cluster's."""
    import warnings

    mcmc = _run(bnp.AuxiliaryGibbs(model), jax.random.key(2), num_chains=2, chain_method="vectorized")
    idata = bnp.diagnostics.to_arviz(mcmc)
    assert idata.posterior["rate"].shape == (2, 30, 32)
    assert idata.sample_stats["num_clusters"].shape == (2, 30)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        import arviz

        full = arviz.from_numpyro(mcmc)
    assert full.log_likelihood["X"].shape == (2, 30, 40)
    z = np.asarray(full.posterior["z"])
    assert (z[..., 0] == 0).all()  # first appearance: the first point is always in cluster 0
    rate0 = np.asarray(full.posterior["rate"])[..., 0]
    assert np.all(rate0 < 8)  # the first point is a Poisson(2) count: its cluster's rate is low


def test_a_prior_start_and_a_plate_of_n_slots_without_a_host_callback(monkeypatch):
    """``init_strategy="prior"`` starts from a draw of the partition prior; with at least n
    slots a free slot always exists, so the program holds no overflow callback (counted)."""
    from jaxbnp.inference.partition import auxiliary

    calls = []
    monkeypatch.setattr(auxiliary, "raise_capacity_error_if", lambda *a, **k: calls.append(a))

    def roomy(X, slots):
        z = numpyro.sample("z", bnp.Partition(bnp.PitmanYor(1.0, 0.3), X.shape[0]))
        with numpyro.plate("clusters", slots):
            rate = numpyro.sample("rate", dist.LogNormal(0.0, 1.0))
        numpyro.sample("X", dist.Poisson(rate[z]), obs=X)

    mcmc = MCMC(bnp.AuxiliaryGibbs(roomy, init_strategy="prior"), num_warmup=0, num_samples=5,
                progress_bar=False)
    mcmc.run(jax.random.key(4), X, X.shape[0], extra_fields=("num_clusters",))
    assert mcmc.get_extra_fields()["num_clusters"][0] > 1  # the prior's draw, one sweep on
    assert calls == []
    mcmc = MCMC(bnp.AuxiliaryGibbs(roomy), num_warmup=0, num_samples=1, progress_bar=False)
    mcmc.run(jax.random.key(4), X, X.shape[0] - 1)  # the power check: one slot fewer
    assert calls


def test_a_data_plate_around_the_likelihood():
    """NumPyro's usual ``numpyro.plate("data", n)`` around the likelihood is read the same way."""

    def plated(X):
        z = numpyro.sample("z", bnp.Partition(bnp.DP(1.0), X.shape[0]))
        with numpyro.plate("clusters", 32):
            rate = numpyro.sample("rate", dist.LogNormal(0.0, 1.0))
        with numpyro.plate("data", X.shape[0]):
            numpyro.sample("X", dist.Poisson(rate[z]), obs=X)

    z = np.asarray(_run(bnp.AuxiliaryGibbs(plated), jax.random.key(0)).get_samples()["z"][-1])
    assert len(set(z[:20]) & set(z[20:])) == 0


def test_slice_step_moves_only_the_active_rows_and_as_it_would_with_all():
    """``slice_slots(active=...)``: the inactive rows keep their values, and each active row
    lands where it lands when every row steps (the rows' draws do not depend on each other);
    the power check: the same step with every row active moves the inactive rows."""
    from jaxbnp.inference.partition.auxiliary import slice_slots

    centres = jnp.array([[0.0, 0.0], [3.0, -1.0], [-2.0, 5.0], [1.0, 1.0]])
    scales = jnp.array([0.3, 2.0, 8.0, 1.0])  # a wide row needs more stepping rounds

    def log_density(x):
        return -0.5 * jnp.sum(((x - centres) / scales[:, None]) ** 2, axis=1)

    x0 = centres + 0.1
    active = jnp.array([True, False, False, True])
    key = jax.random.key(4)
    every, _ = jax.jit(lambda k: slice_slots(k, log_density, x0, log_density(x0), 1.0))(key)
    some, lp_some = jax.jit(lambda k: slice_slots(k, log_density, x0, log_density(x0), 1.0,
                                                  active=active))(key)
    on, x0, every, some = np.asarray(active), np.asarray(x0), np.asarray(every), np.asarray(some)
    np.testing.assert_array_equal(some[~on], x0[~on])
    np.testing.assert_array_equal(some[on], every[on])
    np.testing.assert_allclose(np.asarray(lp_some), np.asarray(log_density(some)), rtol=1e-12)
    assert not np.allclose(every[~on], x0[~on])
