"""CollapsedGibbs as a NumPyro kernel: chain methods, compositions, errors, recompilation."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.infer import MCMC, NUTS, HMCGibbs

import jaxbnp as bnp
from jaxbnp.inference.partition import gibbs
from jaxbnp.inference.partition.clusters import init_clusters

NG = bnp.NormalGamma(m0=0.0, k0=0.2, a0=2.0, b0=1.0)


def _data(n=12, dim=2, seed=0):
    rng = np.random.default_rng(seed)
    return np.array([[-2.0] * dim, [2.0] * dim])[np.arange(n) % 2] + 0.7 * rng.normal(size=(n, dim))


def dp_model(X):
    z = numpyro.sample("z", bnp.Partition(bnp.DP(1.0), X.shape[0]))
    numpyro.sample("X", bnp.ConjugateMixture(NG, z), obs=X)


def nggp_model(X):
    u = numpyro.sample("u", bnp.AuxiliaryU())
    z = numpyro.sample("z", bnp.Partition(bnp.NGGP(1.0, 0.3), X.shape[0], u=u))
    numpyro.sample("X", bnp.ConjugateMixture(NG, z), obs=X)


def _run(model, X, chain_method, num_chains=2, **kw):
    mcmc = MCMC(
        bnp.CollapsedGibbs(model, **kw), num_warmup=5, num_samples=20,
        num_chains=num_chains, chain_method=chain_method, progress_bar=False,
    )
    mcmc.run(jax.random.key(42), X, extra_fields=("log_joint", "num_clusters"))
    return mcmc


@pytest.mark.parametrize("model", [dp_model, nggp_model], ids=["DP", "NGGP"])
def test_chain_methods_give_identical_draws(model):
    X = _data()
    runs = {m: _run(model, X, m) for m in ("sequential", "vectorized", "parallel")}
    runs["vectorized-vmap"] = _run(model, X, "vectorized", chain_batching="vmap")
    ref = runs["vectorized"].get_samples(group_by_chain=True)
    assert ref["z"].shape == (2, 20, X.shape[0])
    for method in ("sequential", "parallel", "vectorized-vmap"):
        other = runs[method].get_samples(group_by_chain=True)
        assert set(other) == set(ref)
        for site in ref:
            if method == "vectorized-vmap" and site != "z":
                # batched chains (not the CPU default) may fuse NGGP's slice update of u in
                # another order: the same partitions, u equal up to rounding
                np.testing.assert_allclose(np.asarray(other[site]), np.asarray(ref[site]), rtol=1e-12)
                continue
            np.testing.assert_array_equal(np.asarray(other[site]), np.asarray(ref[site]), err_msg=method)
    # chains differ from each other (the keys are really split)
    assert not np.array_equal(ref["z"][0], ref["z"][1])


def test_same_key_same_draws_and_labels_canonical():
    X = _data()
    a = _run(dp_model, X, "vectorized").get_samples()["z"]
    b = _run(dp_model, X, "vectorized").get_samples()["z"]
    np.testing.assert_array_equal(a, b)
    z = np.asarray(a)
    assert z.dtype == np.int32
    for row in z:  # first-appearance order: each new label is one more than the max so far
        seen = np.maximum.accumulate(row)
        assert row[0] == 0 and np.all(row <= np.r_[0, seen[:-1] + 1])


@pytest.mark.parametrize("m", [1, 7, 40, 600], ids=lambda m: f"m{m}")
def test_orderings_without_a_sort_equal_jax_sorts(m):
    """``jaxbnp._ranks`` compares pairs up to ``RANK_BY_COMPARISON_MAX`` entries and sorts
    above (600): both give what JAX's sorts give. ``slot_order`` equals
    ``argsort(argsort(first appearance))`` (empty slots last, in their own order), ``argsort``
    is the stable one (ties, booleans), ``permutation`` is ``jax.random.permutation`` for
    typed and legacy keys."""
    from jaxbnp import _ranks
    from jaxbnp.inference.partition import clusters

    assert _ranks.RANK_BY_COMPARISON_MAX < 600
    rng = np.random.default_rng(m)
    for n in (1, 5, 30):
        labels = jnp.asarray(rng.integers(0, m, n))
        first = jax.ops.segment_min(jnp.arange(n), labels, num_segments=m)
        order = np.argsort(np.asarray(first), kind="stable")
        got_order, got_labels = clusters.slot_order(labels, m)
        np.testing.assert_array_equal(got_order, order)
        np.testing.assert_array_equal(got_labels, np.argsort(order, kind="stable")[np.asarray(labels)])
        assert got_labels.dtype == jnp.int32
        np.testing.assert_array_equal(_ranks.inverse_permutation(jnp.asarray(order)), np.argsort(order))
    ties = jnp.asarray(rng.integers(0, 3, (4, m)))
    want = np.argsort(np.argsort(np.asarray(ties), axis=-1, kind="stable"), axis=-1, kind="stable")
    np.testing.assert_array_equal(jax.vmap(_ranks.stable_rank)(ties), want)
    for x in (ties[0].astype(float) - 1.5, ties[0] == 1, jnp.asarray(rng.normal(size=m))):
        np.testing.assert_array_equal(_ranks.argsort(x), jnp.argsort(x, stable=True))
    for key in (jax.random.key(m), jax.random.PRNGKey(m)):
        np.testing.assert_array_equal(_ranks.permutation(key, m), jax.random.permutation(key, m))


def test_log_joint_field_matches_log_joint_function():
    X = _data()
    mcmc = _run(nggp_model, X, "vectorized", num_chains=2)
    s = mcmc.get_samples()
    lj = mcmc.get_extra_fields()["log_joint"]
    for i in (0, 7, 39):
        expected = bnp.log_joint(X, s["z"][i], bnp.NGGP(1.0, 0.3), NG, u=s["u"][i])
        np.testing.assert_allclose(lj[i], expected, rtol=1e-10)
    k = mcmc.get_extra_fields()["num_clusters"]
    np.testing.assert_array_equal(k, [len(np.unique(z)) for z in np.asarray(s["z"])])


def test_hmcgibbs_with_collapsed_gibbs_fn():
    X = _data()

    def model(X):
        alpha = numpyro.sample("alpha", dist.Gamma(2.0, 1.0))
        z = numpyro.sample("z", bnp.Partition(bnp.DP(alpha), X.shape[0]))
        numpyro.sample("X", bnp.ConjugateMixture(NG, z), obs=X)

    kernel = HMCGibbs(NUTS(model), gibbs_fn=bnp.collapsed_gibbs_fn(model, X), gibbs_sites=["z"])
    mcmc = MCMC(kernel, num_warmup=50, num_samples=100, progress_bar=False)
    mcmc.run(jax.random.key(0), X)
    s = mcmc.get_samples()
    assert s["z"].shape == (100, X.shape[0]) and np.all(np.asarray(s["alpha"]) > 0)
    # the two well separated groups are found in most draws
    k = np.array([len(np.unique(z)) for z in np.asarray(s["z"])])
    assert np.mean(k == 2) > 0.5


def test_sweep_compiles_once_for_new_states_keys_and_hyperparameters():
    X = jnp.asarray(_data())
    family = bnp.NormalWishart(np.zeros(2), 0.5, 4.0, np.eye(2))

    @jax.jit
    @chex.assert_max_traces(n=1)
    def sweep(key, clusters, alpha):
        return gibbs.gibbs_sweep(key, clusters, X, bnp.DP(alpha), family)

    state = init_clusters(family, X, np.zeros(X.shape[0], int), capacity=8)
    for i in range(4):
        state = sweep(jax.random.key(i), state, jnp.asarray(0.5 + i))
    assert int(state.counts.sum()) == X.shape[0]


@pytest.mark.parametrize("num_chains", [1, 2], ids=["one-chain", "vectorized"])
def test_capacity_overflow_raises_clear_error(num_chains):
    """One chain checks its own overflow; NumPyro's vectorized chains check once per
    iteration for the whole batch (one host callback)."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(40, 1)) * 30.0  # far apart points: many clusters

    def model(X):
        z = numpyro.sample("z", bnp.Partition(bnp.DP(1000.0), X.shape[0]))
        numpyro.sample("X", bnp.ConjugateMixture(bnp.NormalGamma(0.0, 0.01, 2.0, 0.01), z), obs=X)

    mcmc = MCMC(bnp.CollapsedGibbs(model, capacity=4), num_warmup=2, num_samples=2, num_chains=num_chains,
                chain_method="vectorized", progress_bar=False)
    with pytest.raises(Exception, match="cluster slots are in use.*larger capacity"):
        mcmc.run(jax.random.key(0), X)


def _crowded_model(X, alpha=1000.0):  # far apart points and a huge alpha: many clusters at once
    z = numpyro.sample("z", bnp.Partition(bnp.DP(alpha), X.shape[0]))
    numpyro.sample("X", bnp.ConjugateMixture(bnp.NormalGamma(0.0, 0.01, 2.0, 0.01), z), obs=X)


def _mcmc(kernel, progress_bar=True, **settings):
    """NumPyro's ``MCMC`` with its progress bar as asked (NumPyro turns it off where ``CI`` or
    ``PYTEST_XDIST_WORKER`` is set, as in this suite)."""
    mcmc = MCMC(kernel, **settings)
    mcmc.progress_bar = progress_bar
    return mcmc


MODES = {  # NumPyro's MCMC settings -> whether the step itself holds the overflow callback
    "progress-bar": (dict(progress_bar=True), False),
    "progress-bar-sequential": (dict(progress_bar=True, num_chains=2, chain_method="sequential"), False),
    "no-progress-bar": (dict(progress_bar=False), True),
    "vectorized": (dict(progress_bar=True, num_chains=2, chain_method="vectorized"), True),
}


@pytest.mark.parametrize("mode", list(MODES))
def test_overflow_raises_in_every_mode_and_the_progress_bar_needs_no_callback(mode, monkeypatch):
    """Where NumPyro's progress bar reads every step's state on the host (one chain at a time),
    ``get_diagnostics_str`` raises ``CapacityError`` and the step holds no host callback (so
    JAX's persistent cache can keep the loop); elsewhere the step's callback raises.
    Power: the callbacks traced are counted, both ways."""
    from jaxbnp.inference.partition import kernels

    calls = []
    real = kernels.raise_capacity_error_if
    monkeypatch.setattr(kernels, "raise_capacity_error_if",
                        lambda *a, **k: (calls.append(1), real(*a, **k))[1])
    settings, in_program = MODES[mode]
    X = np.random.default_rng(0).normal(size=(40, 1)) * 30.0
    # one iteration, the run's last: the check after it is the one that must raise
    mcmc = _mcmc(bnp.CollapsedGibbs(_crowded_model, capacity=4), num_warmup=0, num_samples=1, **settings)
    with pytest.raises(Exception, match="all 4 cluster slots are in use.*larger capacity") as err:
        mcmc.run(jax.random.PRNGKey(0), X)
    assert bool(calls) == in_program
    if not in_program:  # raised on the host: the error itself, not XLA's wrapper of it
        assert err.type is bnp.CapacityError


def test_overflow_raises_after_the_progress_bar_is_turned_off():
    """The state records where its overflow is raised (a leafless field, so the two are two
    tree structures): a program traced for the progress bar is never reused without it, for
    the same ``MCMC`` with its bar turned off, or for a state carried to another ``MCMC``."""
    X = np.random.default_rng(0).normal(size=(40, 1)) * 30.0
    kernel = bnp.CollapsedGibbs(_crowded_model, capacity=4)
    mcmc = _mcmc(kernel, num_warmup=0, num_samples=1, progress_bar=True)
    mcmc.run(jax.random.PRNGKey(5), X, 1e-30)  # one cluster: no overflow
    assert mcmc.last_state.overflow_on_host == () and int(mcmc.last_state.num_clusters) == 1
    state = mcmc.last_state
    mcmc.progress_bar = False
    with pytest.raises(Exception, match="cluster slots are in use"):
        mcmc.run(jax.random.PRNGKey(0), X)
    other = _mcmc(kernel, num_warmup=0, num_samples=3, progress_bar=False)
    other.post_warmup_state = state
    with pytest.raises(Exception, match="cluster slots are in use"):
        other.run(jax.random.PRNGKey(0), X)


def test_the_progress_bar_does_not_change_the_draws():
    X = jnp.asarray(_data(30, 2))
    family = bnp.NormalWishart(np.zeros(2), 0.5, 4.0, np.eye(2))

    def model(X):
        z = numpyro.sample("z", bnp.Partition(bnp.DP(1.0), X.shape[0]))
        numpyro.sample("X", bnp.ConjugateMixture(family, z), obs=X)

    draws = []
    for bar in (True, False):
        mcmc = _mcmc(bnp.SubClusterMCMC(model, capacity=8), num_warmup=3, num_samples=4, progress_bar=bar)
        mcmc.run(jax.random.key(3), X)
        draws.append(np.asarray(mcmc.get_samples()["z"]))
    np.testing.assert_array_equal(*draws)


def test_statistics_stay_consistent_with_labels():
    X = jnp.asarray(_data(30, 3))
    family = bnp.NormalWishart(np.zeros(3), 0.5, 5.0, np.eye(3))
    state = init_clusters(family, X, np.zeros(30, int), capacity=30)
    for i in range(5):
        state = gibbs.gibbs_sweep(jax.random.key(i), state, X, bnp.DP(2.0), family)
    fresh = family.stats_from_labels(X, state.labels, 30)
    for a, b in zip(jax.tree.leaves(state.stats), jax.tree.leaves(fresh)):
        np.testing.assert_allclose(a, b, atol=1e-9)
    np.testing.assert_array_equal(state.counts, np.bincount(state.labels, minlength=30))


# ----------------------------------------------------------------------------- bad input
def _init(model, X):
    mcmc = MCMC(bnp.CollapsedGibbs(model), num_warmup=1, num_samples=1, progress_bar=False)
    mcmc.run(jax.random.key(0), X)


def test_nan_in_data_raises():
    X = _data()
    X[3, 1] = np.nan
    with pytest.raises(ValueError, match="NaN or inf"):
        _init(dp_model, X)


def test_wrong_shape_raises():
    with pytest.raises(ValueError, match="2-D array"):
        _init(dp_model, np.zeros(10))


def test_empty_data_raises():
    with pytest.raises(ValueError):
        _init(dp_model, np.zeros((0, 2)))


def test_string_data_raises():
    with pytest.raises(ValueError, match="numeric"):
        bnp.inference.partition.kernels.check_data(np.array([["a", "b"]]))


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: bnp.DP(0.0), "alpha must be > 0"),
        (lambda: bnp.DP(-2.0), "alpha must be > 0"),
        (lambda: bnp.NGGP(1.0, 1.2), r"sigma must lie in \(0, 1\)"),
        (lambda: bnp.NGGP(1.0, 0.0), r"sigma must lie in \(0, 1\)"),
        (lambda: bnp.PitmanYor(1.0, 1.0), "discount d"),
        (lambda: bnp.NormalWishart(np.zeros(2), 1.0, 4.0, np.array([[1.0, 2.0], [2.0, 1.0]])),
         "positive definite"),
    ],
)
def test_invalid_hyperparameters_raise(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_invalid_hyperparameter_inside_model_raises_before_sampling():
    def model(X):
        z = numpyro.sample("z", bnp.Partition(bnp.DP(-1.0), X.shape[0]))
        numpyro.sample("X", bnp.ConjugateMixture(NG, z), obs=X)

    with pytest.raises(ValueError, match="alpha must be > 0"):
        _init(model, _data())


def test_model_without_partition_raises():
    def model(X):
        numpyro.sample("X", dist.Normal(0, 1), obs=X)

    with pytest.raises(ValueError, match="exactly one latent Partition site"):
        _init(model, _data())


def test_nggp_without_u_raises():
    def model(X):
        z = numpyro.sample("z", bnp.Partition(bnp.NGGP(1.0, 0.5), X.shape[0]))
        numpyro.sample("X", bnp.ConjugateMixture(NG, z), obs=X)

    with pytest.raises(ValueError, match="AuxiliaryU"):
        _init(model, _data())


def test_unhandled_latent_site_raises_with_advice():
    def model(X):
        alpha = numpyro.sample("alpha", dist.Gamma(1.0, 1.0))
        z = numpyro.sample("z", bnp.Partition(bnp.DP(alpha), X.shape[0]))
        numpyro.sample("X", bnp.ConjugateMixture(NG, z), obs=X)

    with pytest.raises(ValueError, match="NUTS"):
        _init(model, _data())


@pytest.mark.parametrize("name", ["CollapsedGibbs", "SplitMerge", "TreeGuidedMCMC", "SubClusterMCMC"])
def test_model_errors_name_the_users_kernel(name):
    """Every partition kernel reads the model through the same code; its errors name the kernel
    the user wrote, not ``CollapsedGibbs``."""
    cls = getattr(bnp, name)

    def no_partition(X):
        numpyro.sample("X", dist.Normal(0, 1), obs=X)

    def extra_site(X):
        alpha = numpyro.sample("alpha", dist.Gamma(1.0, 1.0))
        z = numpyro.sample("z", bnp.Partition(bnp.DP(alpha), X.shape[0]))
        numpyro.sample("X", bnp.ConjugateMixture(NG, z), obs=X)

    X = _data()
    with pytest.raises(ValueError, match=f"^{name} needs a model with exactly one latent Partition"):
        MCMC(cls(no_partition), num_warmup=1, num_samples=1, progress_bar=False).run(
            jax.random.key(0), X)
    with pytest.raises(ValueError, match=rf"that {name} does not update.*bnp\.{name}\(model\)"):
        MCMC(cls(extra_site), num_warmup=1, num_samples=1, progress_bar=False).run(
            jax.random.key(0), X)
    with pytest.raises(ValueError, match=rf"^{name}\(model\): model must be"):
        cls("not a model")
    # a misspelt init_params name is an error naming the kernel, never a value dropped
    with pytest.raises(ValueError, match=rf"^{name}: init_params names \['zz'\].*\['z'\]"):
        cls(dp_model).init(jax.random.key(0), 0, {"zz": jnp.zeros(12, jnp.int32)}, (X,), {})
    # and a user's subclass is named as the user wrote it
    mine = type(f"My{name}", (cls,), {})
    with pytest.raises(ValueError, match=f"^My{name} needs a model with exactly one latent Partition"):
        mine(no_partition).init(jax.random.key(0), 0, None, (X,), {})


def test_family_data_mismatch_raises():
    def model(X):
        z = numpyro.sample("z", bnp.Partition(bnp.DP(1.0), X.shape[0]))
        numpyro.sample("X", bnp.ConjugateMixture(bnp.BetaBernoulli(), z), obs=X)

    with pytest.raises(ValueError, match="binary"):
        _init(model, _data())


def test_bad_kernel_options_raise():
    with pytest.raises(ValueError, match="init_strategy"):
        bnp.CollapsedGibbs(dp_model, init_strategy="kmeans")
    with pytest.raises(ValueError, match="capacity"):
        bnp.CollapsedGibbs(dp_model, capacity=0)


# ----------------------------------------------------------------------------- distributions
def test_partition_sample_and_log_prob_shapes():
    d = bnp.Partition(bnp.PitmanYor(1.0, 0.3), 9)
    z = d.sample(jax.random.key(0), (5,))
    assert z.shape == (5, 9)
    assert d.log_prob(z).shape == (5,)
    # relabelling does not change the density
    relabelled = 8 - z[0]  # a bijection of the label ids
    np.testing.assert_allclose(d.log_prob(z[0]), d.log_prob(relabelled), rtol=1e-12)


def test_conjugate_mixture_sample_shape():
    labels = jnp.array([0, 0, 1, 1, 2])
    X = bnp.ConjugateMixture(bnp.NormalGamma(np.zeros(3), 1.0, 2.0, 1.0), labels).sample(jax.random.key(0))
    assert X.shape == (5, 3) and np.all(np.isfinite(X))
    X = bnp.ConjugateMixture(bnp.NormalWishart(np.zeros(2), 1.0, 4.0, np.eye(2)), labels).sample(
        jax.random.key(1), (2,)
    )
    assert X.shape == (2, 5, 2)


def test_normal_wishart_mixture_sample_is_the_prior_predictive_without_lapack():
    """``ConjugateMixture(NormalWishart).sample`` (what ``Predictive`` calls): each point's
    coordinates are Student-t (ν − d + 1 degrees of freedom, scale² ``Ψ_jj (r + 1) / (r (ν − d
    + 1))``, docs/mathematics.md §2); two points of one cluster covary by ``Cov(μ) = Ψ / (r (ν
    − d − 1))``, points of two clusters not at all. Checked to five standard errors of the
    Monte Carlo means; a sampler with ``Λ`` for ``Λ⁻¹`` or without ``r`` fails. The compiled
    batch holds no LAPACK call: with two, the jitted batch below hung for ever on a 2-core CPU
    (XLA's pool, ``jaxbnp._math.cholesky``)."""
    from scipy import stats

    from jaxbnp.inference.runner import calls_library_kernels

    m0, r, nu = np.array([1.0, -2.0]), 0.5, 10.0
    psi = np.array([[2.0, 0.6], [0.6, 1.0]])
    d, draws = 2, 40_000
    mix = bnp.ConjugateMixture(bnp.NormalWishart(m0, r, nu, psi), jnp.array([0, 0, 1]))
    sample = jax.jit(lambda k: mix.sample(k, (draws,)))
    assert not calls_library_kernels(sample.lower(jax.random.key(0)).compile())
    X = np.asarray(sample(jax.random.key(0)))
    assert X.shape == (draws, 3, d) and np.isfinite(X).all()
    df = nu - d + 1
    for j in range(d):
        scale = np.sqrt(psi[j, j] * (r + 1) / (r * df))
        assert stats.kstest(X[:, 0, j], stats.t(df, m0[j], scale).cdf).pvalue > 1e-3, j
    centred = X - m0
    for (a, b), expected in (((0, 1), psi / (r * (nu - d - 1))), ((0, 2), np.zeros((d, d))),
                             ((0, 0), psi * (r + 1) / (r * (nu - d - 1)))):
        prod = centred[:, a, :, None] * centred[:, b, None, :]
        se = prod.std(0) / np.sqrt(draws)
        assert np.all(np.abs(prod.mean(0) - expected) < 5 * se), (a, b, prod.mean(0), expected, se)


def test_nggp_u_starts_at_its_conditional_mode_unless_given():
    """Without ``init_params['u']`` the kernel starts ``u`` at the mode of ``p(u | Π0)``;
    a given ``u`` is kept."""
    X = np.random.default_rng(0).normal(size=(40, 1))
    kernel = bnp.CollapsedGibbs(nggp_model)
    labels = jnp.asarray(np.arange(40) % 3, jnp.int32)
    state = kernel.init(jax.random.key(0), 0, {"z": labels}, (jnp.asarray(X),), {})
    counts = jnp.bincount(labels, length=40)
    expected = float(bnp.NGGP(1.0, 0.3).u_mode(counts))
    assert float(state.z["u"]) == pytest.approx(expected, rel=1e-6)
    state = kernel.init(jax.random.key(0), 0, {"z": labels, "u": jnp.asarray(2.5)}, (jnp.asarray(X),), {})
    assert float(state.z["u"]) == pytest.approx(2.5)


# ----------------------------------------------------------------------------- composable moves
def _partition_state(X, u=1.0):
    from jaxbnp.inference.partition.clusters import PartitionState

    return PartitionState(init_clusters(NG, X, np.zeros(X.shape[0], int), X.shape[0]),
                          jnp.asarray(u, X.dtype))


def test_moves_chain_splits_the_key_once_and_matches_the_gibbs_core():
    """``chain(gibbs_sweep(), update_u())`` is the Gibbs core's sweep then its ``u`` update,
    the key split once into two."""
    from jaxbnp.inference.partition import moves

    X = jnp.asarray(_data(8))
    measure = bnp.NGGP(1.0, 0.3)
    state = _partition_state(X, u=2.0)
    ctx = moves.Context(X, measure, NG)
    move = moves.chain(moves.gibbs_sweep(), moves.update_u())
    key = jax.random.key(4)
    got, info = moves.step(key, moves.init(state, ctx, move), ctx, move)
    k_sweep, k_u = jax.random.split(key)
    clusters = gibbs.gibbs_sweep(k_sweep, state.clusters, X, measure, NG, state.u)
    u = gibbs.update_u(k_u, state.u, clusters.counts, measure)
    chex.assert_trees_all_equal(got.partition.clusters, clusters)
    chex.assert_trees_all_equal(got.partition.u, u)
    assert float(u) != 2.0  # the u update ran
    assert info.moves == ((), ()) and int(info.mh.num_proposed) == 0


def test_moves_repeat_zero_is_the_identity_and_counts_add_up():
    from jaxbnp.inference.partition import moves

    X = jnp.asarray(_data(8))
    state = _partition_state(X)
    ctx = moves.Context(X, bnp.DP(1.0), NG)
    for n in (0, 3):
        move = moves.chain(moves.split_merge(n), moves.gibbs_sweeps(n))
        new, info = moves.step(jax.random.key(0), moves.init(state, ctx, move), ctx, move)
        assert int(info.mh.num_proposed) == n
        assert 0 <= int(info.mh.num_accepted) <= n
        if n == 0:
            chex.assert_trees_all_equal(new.partition, state)
    # a chain of k-key moves hands out sum(num_keys) keys, in order
    assert moves.chain(moves.local_moves(1), moves.update_u()).num_keys == 1
    assert moves.local_moves(1).num_keys == 2


def test_partition_kernel_runs_a_users_move_and_keeps_nothing_on_self():
    """A user's ``chain`` of moves through ``PartitionKernel``; the MH statistics come back
    as extra fields, and sampling sets no attribute on the kernel."""
    from jaxbnp.inference.partition import moves
    from jaxbnp.inference.partition.kernels import PartitionKernel

    X = _data(8)
    move = moves.chain(moves.split_merge(2, num_restricted_scans=1), moves.local_moves(1), moves.update_u())
    kernel = PartitionKernel(dp_model, move)
    mcmc = MCMC(kernel, num_warmup=2, num_samples=4, num_chains=2, chain_method="vectorized",
                progress_bar=False)
    mcmc.run(jax.random.key(0), X, extra_fields=("num_proposed", "mean_log_accept"))
    before = dict(vars(kernel))
    kernel.sample(mcmc.last_state, (X,), {})
    assert vars(kernel).keys() == before.keys()
    assert np.all(np.asarray(mcmc.get_extra_fields()["num_proposed"]) == 2)
    assert np.all(np.asarray(mcmc.get_extra_fields()["mean_log_accept"]) <= 0.0)


@pytest.mark.parametrize("init", ["ibhc", "noisy"])
def test_tgmcmc_start_is_built_on_the_host_before_tracing(init, monkeypatch):
    """``TreeGuidedMCMC``'s IBHC and noisy starts: an eager ``init`` (NumPyro's vectorized
    chains) builds them on the host, so with device trees no program holds a host callback
    (JAX's compilation cache can keep them); a traced ``init`` builds the same labels through
    one callback, and ``initial_params`` gives them to a caller (the estimator, the runner)."""
    from jaxbnp.inference.tgmcmc import kernel as tg

    calls = []
    real = tg.io_callback

    def counted(*args, **kwargs):
        calls.append(init)
        return real(*args, **kwargs)

    monkeypatch.setattr(tg, "io_callback", counted)
    X = _data(16)
    keys = jax.random.split(jax.random.key(3), 3)
    kernel = bnp.TreeGuidedMCMC(dp_model, num_global_moves=2, init=init)
    eager = np.asarray(kernel.init(keys, 0, None, (X,), {}).z["z"])
    mcmc = MCMC(bnp.TreeGuidedMCMC(dp_model, num_global_moves=2, init=init), num_warmup=1,
                num_samples=2, num_chains=3, chain_method="vectorized", progress_bar=False)
    mcmc.run(jax.random.key(3), X)
    assert calls == []
    traced = np.asarray(jax.jit(lambda k: kernel.init(k, 0, None, (X,), {}).z["z"])(keys))
    assert calls == [init]  # the check sees a callback where there is one
    np.testing.assert_array_equal(eager, traced)
    np.testing.assert_array_equal(eager, kernel.initial_params(keys, None, (X,))["z"])
    assert len(np.unique(eager)) >= 2
    if init == "noisy":  # drawn from each chain's key: on overlapping data the starts differ
        X2 = np.random.default_rng(1).normal(size=(16, 2))
        rows = kernel.initial_params(jax.random.split(jax.random.key(3), 6), None, (X2,))["z"]
        assert len({row.tobytes() for row in rows}) > 1
    # a start with more clusters than slots is a CapacityError, before anything compiles
    small = bnp.TreeGuidedMCMC(dp_model, init=init, capacity=1)
    with pytest.raises(bnp.CapacityError, match="capacity is 1"):
        small.initial_params(keys, None, (X,))
