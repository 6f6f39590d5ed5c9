"""``SliceGibbs`` as a NumPyro kernel: the issue's model as written, chain methods, the
stick positions it keeps, composition with NUTS, the plate that is too small, bad settings
(the exact tests are in ``tests/exact/test_slice_gibbs_exact.py``)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.infer import MCMC, NUTS, Gibbs

import jaxbnp as bnp
from jaxbnp.inference.partition import slice_gibbs

from .test_auxiliary import X, _run, model  # the issue's model as written (32 slots), its data


def test_the_issue_model_runs_and_finds_the_two_groups():
    mcmc = _run(bnp.SliceGibbs(model), jax.random.key(0))
    s = mcmc.get_samples()
    assert s["z"].shape == (30, 40) and s["z"].dtype == jnp.int32
    assert s["rate"].shape == (30, 32)
    z = np.asarray(s["z"][-1])
    assert len(set(z[:20]) & set(z[20:])) == 0  # Poisson(2) and Poisson(30) never share a cluster
    assert z[0] == 0 and set(z) == set(range(z.max() + 1))  # first-appearance order
    rate = np.asarray(s["rate"][-1])
    assert np.all(rate[z[20:]] > 15) and np.all(rate[z[:20]] < 8)  # slots renumbered with labels
    fields = mcmc.get_extra_fields()
    assert np.isfinite(fields["log_joint"]).all()
    sticks = np.asarray(mcmc.last_state.sticks)  # each slot's stick position: a permutation
    assert sorted(sticks.tolist()) == list(range(32))


def test_chain_methods_give_the_same_draws():
    seq = _run(bnp.SliceGibbs(model), jax.random.key(3), num_chains=2).get_samples()["z"]
    for method in ("vectorized", "parallel"):
        other = _run(bnp.SliceGibbs(model), jax.random.key(3), num_chains=2,
                     chain_method=method).get_samples()["z"]
        np.testing.assert_array_equal(seq, other)


def test_swaps_keep_the_counts_and_move_big_clusters_forward():
    """One pass of neighbouring swaps: a permutation of the positions, the counts carried with
    their slots; a cluster of 30 points behind an empty position moves forward (its ratio is
    large), two empty positions never swap."""
    counts = jnp.array([0, 30, 0, 0, 5, 0], jnp.int32)
    slot_at = jnp.arange(6, dtype=jnp.int32)
    moved = 0
    for seed in range(20):
        new, accepted = slice_gibbs.swap_positions(jax.random.key(seed), counts, slot_at, 1.0, 0.0,
                                                   jnp.float64)
        new = np.asarray(new)
        assert sorted(new.tolist()) == list(range(6))
        assert int(accepted) <= 5
        moved += int(np.flatnonzero(new == 1)[0] == 0)
        assert np.asarray(counts)[new].sum() == 35
    assert moved >= 15


def test_the_swap_ratio_is_the_change_of_the_allocation_law():
    """``swap_log_ratio`` equals the change of :func:`position_log_prior` when two neighbouring
    positions trade their counts (DP and Pitman-Yor)."""
    rng = np.random.default_rng(0)
    for _ in range(4):
        c = jnp.asarray(rng.integers(0, 4, 8) * rng.integers(0, 2, 8), jnp.float64)
        for p in range(7):
            swapped = c.at[p].set(c[p + 1]).at[p + 1].set(c[p])
            later = c.sum() - jnp.cumsum(c)[p + 1]
            for alpha, d in [(1.0, 0.0), (0.7, 0.3)]:
                want = (slice_gibbs.position_log_prior(swapped, alpha, d)
                        - slice_gibbs.position_log_prior(c, alpha, d))
                got = slice_gibbs.swap_log_ratio(c[p], c[p + 1], later, float(p), alpha, d)
                np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("num_chains", [1, 2], ids=["one-chain", "vectorized"])
def test_a_plate_too_small_for_the_sticks_raises(num_chains):
    def small(X):
        z = numpyro.sample("z", bnp.Partition(bnp.DP(5.0), X.shape[0]))
        with numpyro.plate("slots", 4):
            rate = numpyro.sample("rate", dist.LogNormal(0.0, 1.0))
        numpyro.sample("X", dist.Poisson(rate[z]), obs=X)

    # NumPyro's loop reraises the host callback's CapacityError as a JaxRuntimeError with its text
    with pytest.raises(Exception, match=r"stick-breaking weight beyond the plate.s 4 slots.*plate .slots."):
        _run(bnp.SliceGibbs(small), jax.random.key(0), num_chains=num_chains, chain_method="vectorized")


def hyper_model(X):
    mu0 = numpyro.sample("mu0", dist.Normal(0.0, 2.0))
    z = numpyro.sample("z", bnp.Partition(bnp.PitmanYor(1.0, 0.05), X.shape[0]))
    with numpyro.plate("clusters", 40):
        rate = numpyro.sample("rate", dist.LogNormal(mu0, 1.0))
    numpyro.sample("X", dist.Poisson(rate[z]), obs=X)


def test_composes_with_nuts_above_and_on_the_plate():
    """NUTS on a hyperparameter above the plate (the kernel owns the partition and the rates),
    and NUTS on the rates themselves (the kernel owns the partition; the labels are slots)."""
    kernel = Gibbs([(bnp.SliceGibbs(hyper_model), ["z", "rate"]), (NUTS(hyper_model), ["mu0"])])
    s = _run(kernel, jax.random.key(1)).get_samples()
    assert set(s) == {"z", "rate", "mu0"} and np.isfinite(s["mu0"]).all()
    assert len(np.unique(np.asarray(s["mu0"]))) > 1  # NUTS moved it
    kernel = Gibbs([(bnp.SliceGibbs(hyper_model), ["z"]), (NUTS(hyper_model), ["rate", "mu0"])])
    s = _run(kernel, jax.random.key(2)).get_samples()
    z, rate = np.asarray(s["z"]), np.asarray(s["rate"])
    assert z.max() < 40 and np.isfinite(rate).all()
    assert len(set(z[-1, :20]) & set(z[-1, 20:])) == 0


def test_bad_settings():
    for kwargs in ({"num_swap_passes": -1}, {"num_swap_passes": 1.5}, {"num_split_merge": -1},
                   {"num_param_steps": 0},
                   {"step_size": 0.0}, {"init_strategy": "singletons"}, {"chain_batching": "pmap"}):
        with pytest.raises(ValueError):
            bnp.SliceGibbs(model, **kwargs)
    with pytest.raises(ValueError, match="more clusters than plate|has 40 clusters"):
        _run(bnp.SliceGibbs(model), jax.random.key(0), init_params={"z": jnp.arange(40)})


def test_points_sharded_over_a_mesh_give_the_same_draws():
    """Data placed on a mesh (``jax.device_put`` with a ``NamedSharding`` over the points; the
    suite's 4 host devices): XLA partitions every per-point computation (the label step, the
    slices, the likelihood), the labels come back sharded over the points, and the draws equal
    the one-device chain's (JAX's partitionable random bits)."""
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    def run(data):
        mcmc = MCMC(bnp.SliceGibbs(model), num_warmup=3, num_samples=5, progress_bar=False)
        mcmc.run(jax.random.key(5), data)
        return mcmc

    one = run(X)
    mesh = Mesh(np.array(jax.devices()[:4]), ("points",))
    many = run(jax.device_put(X, NamedSharding(mesh, P("points"))))
    np.testing.assert_array_equal(one.get_samples()["z"], many.get_samples()["z"])
    np.testing.assert_allclose(one.get_samples()["rate"], many.get_samples()["rate"], rtol=1e-12)
    labels = many.last_state.z["z"]
    assert labels.sharding.spec == P("points") and len(labels.sharding.device_set) == 4


def test_predictive_and_arviz_read_the_draws():
    """What a NumPyro user does next: ``Predictive`` replays the model on the draws (the
    posterior predictive counts come from each draw's own rates), ``arviz.from_numpyro`` and
    ``bnp.diagnostics.to_arviz`` export them with the pointwise log likelihood and the extra
    fields; the parameters come slot by slot in the clusters' first-appearance order."""
    import warnings

    from numpyro.infer import Predictive

    mcmc = _run(bnp.SliceGibbs(model), jax.random.key(6), num_chains=2, chain_method="vectorized")
    samples = mcmc.get_samples()
    pred = Predictive(model, samples)(jax.random.key(7), X)["X"]
    assert pred.shape == (60, 40)
    z, rate = np.asarray(samples["z"]), np.asarray(samples["rate"])
    mean = np.take_along_axis(rate, z, axis=1)  # each point's rate in each draw
    assert abs(np.asarray(pred).mean() - mean.mean()) < 0.1 * mean.mean()
    idata = bnp.diagnostics.to_arviz(mcmc)
    assert idata.posterior["rate"].shape == (2, 30, 32)
    assert idata.sample_stats["num_clusters"].shape == (2, 30)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        import arviz

        full = arviz.from_numpyro(mcmc)
    assert full.log_likelihood["X"].shape == (2, 30, 40)
    assert (np.asarray(full.posterior["z"])[..., 0] == 0).all()  # first appearance
    assert np.all(np.asarray(full.posterior["rate"])[..., 0] < 8)  # the first point's cluster: low rate
