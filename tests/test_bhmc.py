"""BHMC (docs/mathematics.md §6): recovery, input checks, reproducibility, vmapped chains, the
NumPyro kernel, per-level metrics."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions
import pytest
from numpyro import handlers
from numpyro.infer import MCMC

from jaxbnp import metrics
from jaxbnp.errors import CapacityError
from jaxbnp.inference.bhmc import fit as bhmc_fit
from jaxbnp.inference.bhmc import sampler as bhmc
from jaxbnp.inference.bhmc import start as bhmc_start
from jaxbnp.models import nested

FAST = {"xla_backend_optimization_level": 0, "xla_cpu_use_fusion_emitters": False}


# ------------------------------------------------------------------------ recovery
def simulated_tree_data(seed=4, per_leaf=10):
    """Data from the model given a tree (3 first-level nodes, 4 leaves) and ``γ = 0.3``.

    The weights, components, means and points are drawn by the NumPyro program
    (``handlers.condition`` on ``paths``); the seed is one where the four
    leaves have four different dominant components (checked), so the leaves
    are identifiable from the data.
    """
    paths = np.repeat(np.array([[1, 5], [2, 6], [3, 7], [3, 8]]), per_leaf, axis=0)
    hyper = nested.NestedHDP(depth=2, alpha=1.0, gamma0=3.0, gamma=0.3, Sigma=0.05 * np.eye(2),
                             Sigma0=16.0 * np.eye(2))
    model = handlers.condition(nested.nested_hdp_model, {"paths": paths})
    tr = handlers.trace(handlers.seed(model, jax.random.key(seed))).get_trace(
        hyper=hyper, num_points=len(paths), component_capacity=32)
    c = np.asarray(tr["c"]["value"])
    dominant = [np.bincount(c[paths[:, 1] == leaf]).argmax() for leaf in (5, 6, 7, 8)]
    return np.asarray(tr["x"]["value"]), paths, c, dominant


def test_recovers_simulated_tree():
    """Three fits (keys 0, 1, 2) of 40 points from the BHMC program with the defaults: the
    components are found (best draw) and the leaves of the posterior summary are nearly pure
    (the best draw's need not be: with the subtree moves the chain keeps exploring, and one
    high-likelihood draw can hold a leaf of two components). The nCRP(α = 1) prior splits a
    true leaf into several (~10 leaves for 40 points a priori), so leaves are fragmented.
    The top level is not asserted: in these data the two leaves under one first-level node
    share no component, so nothing in the data says they belong together (BHMC sees the
    data only through the component labels; ``benchmarks/bhmc_model.py`` simulates data
    whose levels are identifiable). 50 + 25 iterations per fit: keys 0-5 gave ARI 1.0 and
    leaf purity 0.925-0.975 there, as with 100 + 50 (0.925-0.95)."""
    X, paths, c, dominant = simulated_tree_data()
    assert len(set(dominant)) == 4  # precondition: the leaves differ in their main component
    scores = []
    for key in range(3):
        fit = bhmc.fit_bhmc(X, key=jax.random.key(key), depth=2, alpha=1.0, gamma0=3.0, gamma=0.3,
                            Sigma=0.05 * np.eye(2), Sigma0=16.0 * np.eye(2), mu0=np.zeros(2),
                            num_warmup=50, num_samples=25, num_chains=1, compiler_options=FAST)
        assert fit.paths.shape == (40, 2) and fit.labels_per_level.shape == (2, 40)
        assert fit.log_lik.shape == (1, 25) and np.all(np.isfinite(fit.log_lik))
        summary = np.stack(fit.summary_labels_per_level, axis=1)  # the posterior summary per level
        scores.append((metrics.ari(c, fit.components), metrics.level_scores(paths, summary, 2)["purity"]))
    ari_c, leaf_purity = np.mean(scores, axis=0)
    assert ari_c > 0.9 and leaf_purity > 0.8, scores
    # the fit's outputs agree with each other
    np.testing.assert_array_equal(fit.level_labels(2), fit.labels_per_level[1])
    assert fit.best.log_lik == pytest.approx(np.max(fit.log_lik))
    live = np.asarray(fit.best.count) > 0
    assert set(np.unique(fit.paths)) <= set(np.nonzero(live)[0])
    assert np.all(fit.tree[fit.paths[:, 1]] == fit.paths[:, 0]) and np.all(fit.tree[fit.paths[:, 0]] == 0)


# ------------------------------------------------------------------------ input checks
@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"alpha": 0.0}, "alpha must be > 0"),
        ({"gamma0": -1.0}, "gamma0 must be > 0"),
        ({"gamma": float("nan")}, "gamma must be > 0"),
        ({"depth": 0}, "depth must be an integer >= 1"),
        ({"depth": 1.5}, "depth must be an integer >= 1"),
        ({"Sigma": np.array([[1.0, 2.0], [2.0, 1.0]])}, "symmetric positive-definite"),
        ({"Sigma0": np.array([[1.0, 0.5], [0.0, 1.0]])}, "not symmetric"),
        ({"Sigma": np.eye(3)}, "features"),
        ({"num_samples": 0}, "num_samples must be an integer >= 1"),
    ],
)
def test_bad_hyperparameters_raise_before_compiling(kwargs, message):
    X = np.zeros((5, 2))
    with pytest.raises(ValueError, match=message):
        bhmc.fit_bhmc(X, key=jax.random.key(0), **kwargs)


@pytest.mark.parametrize(
    "X, message",
    [
        (np.array([[0.0, np.nan], [1.0, 1.0]]), "NaN or inf"),
        (np.zeros(4), "2-D"),
        (np.zeros((0, 2)), "empty"),
        (np.array([["a", "b"]]), "numeric"),
    ],
)
def test_bad_data_raise(X, message):
    with pytest.raises(ValueError, match=message):
        bhmc.fit_bhmc(X, key=jax.random.key(0))


def test_hyperparameter_dataclass_checks():
    with pytest.raises(ValueError, match="positive definite"):
        nested.NestedHDP(depth=2, alpha=1.0, gamma0=1.0, gamma=1.0, Sigma=-np.eye(2), Sigma0=np.eye(2))
    h = nested.NestedHDP(depth=2, alpha=1, gamma0=1, gamma=1, Sigma=np.eye(2), Sigma0=2.0)
    assert h.Sigma0.shape == (2, 2) and h.mu0.shape == (2,)


# ------------------------------------------------------------------------ reproducibility, chains
N_SMALL, L_SMALL = 6, 2
HYPER = nested.NestedHDP(depth=L_SMALL, alpha=1.0, gamma0=1.0, gamma=1.0, Sigma=0.2 * np.eye(1), Sigma0=np.eye(1))
# the hyperparameter MH (paper's hyperpriors) is on, so this test also runs that code path
CONFIG = bhmc.BHMCConfig(L_SMALL, nested.default_node_capacity(N_SMALL, L_SMALL), 6, update_hyper=True)
MODEL = bhmc.make_model(HYPER)
X_SMALL = jnp.asarray(np.linspace(-2.0, 2.0, N_SMALL)[:, None])


def _run(key):
    k0, k1 = jax.random.split(key)
    state = bhmc.init(k0, X_SMALL, HYPER, MODEL, CONFIG)

    def body(s, k):
        s, info = bhmc.step(k, s, X_SMALL, MODEL, CONFIG)
        return s, (s.paths, s.c, s.log_lik, jnp.stack([s.alpha, s.gamma0, s.gamma]), info)

    return jax.lax.scan(body, state, jax.random.split(k1, 5))[1]


run_one = jax.jit(chex.assert_max_traces(_run, n=1), compiler_options=FAST)


def test_same_key_same_draws_and_vmap_equals_sequential():
    keys = jax.random.split(jax.random.key(5), 3)
    a = run_one(keys[0])
    b = run_one(keys[0])
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    batched = jax.jit(jax.vmap(_run), compiler_options=FAST)(keys)
    for i in range(3):
        single = run_one(keys[i])  # no retrace (assert_max_traces)
        np.testing.assert_array_equal(np.asarray(batched[0][i]), np.asarray(single[0]))
        np.testing.assert_array_equal(np.asarray(batched[1][i]), np.asarray(single[1]))
        np.testing.assert_allclose(np.asarray(batched[2][i]), np.asarray(single[2]), rtol=1e-10)
    assert not np.array_equal(np.asarray(batched[0][0]), np.asarray(batched[0][1]))
    hyper = np.asarray(batched[3])  # (chains, sweeps, 3): α, γ0, γ move, stay positive, γ < 1.5
    assert np.all(np.isfinite(np.asarray(batched[2]))) and np.all(hyper > 0) and np.all(hyper[..., 2] < 1.5)
    assert len(np.unique(hyper[..., 0])) > 1
    info = batched[4]  # BHMCInfo of every sweep: one path proposal per point
    assert np.all(np.asarray(info.num_proposed) == N_SMALL)
    assert np.all((np.asarray(info.num_accepted) >= 0) & (np.asarray(info.num_accepted) <= N_SMALL))
    assert np.asarray(info.num_accepted).sum() > 0 and np.asarray(info.hyper_accepted).shape == (3, 5, 3)


class _Ticks:
    def __init__(self):
        self.total = 0

    def tick(self, n=1):
        self.total += n


@pytest.mark.parametrize("chain_method", ["auto", "threads"])
def test_kernel_under_numpyro_mcmc_gives_fit_bhmc_draws(monkeypatch, chain_method):
    """BHMCKernel under MCMC(chain_method="vectorized") with fit_bhmc's keys (init_params)
    draws what fit_bhmc (runner.run over the same kernel) draws, whichever way fit_bhmc runs
    its chains ("auto": one per device, the suite's 4 host devices, with the compiler
    options; "threads": one per core, from threads); the state carries all."""
    from jaxbnp.inference import runner

    monkeypatch.setattr(runner, "cpu_cores", lambda: 2)
    expected = {"auto": "parallel", "threads": "threads"}[chain_method]
    assert runner.resolve_chain_method(chain_method, 2) == expected
    X = np.linspace(-2.0, 2.0, 6)[:, None]
    key = jax.random.key(3)
    ticks = _Ticks()
    fit = bhmc.fit_bhmc(X, key=key, depth=2, num_warmup=1, num_samples=2, num_chains=2, heartbeat=ticks,
                        compiler_options=FAST, init="prior", chain_method=chain_method)
    assert ticks.total == 2 * (1 + 2)  # chain sweeps
    timing = fit.samples["timing"]
    assert timing["num_first_sweeps"] + timing["num_other_sweeps"] == 3 and timing["num_chains"] == 2
    assert fit.samples["accept_rate"].shape == (2, 2)
    # NumPyro's MCMC over the same program: the same draws as fit_bhmc's chains
    kernel = bhmc.BHMCKernel(nested.nested_hdp_model, bhmc.BHMCConfig(2, 6 * 2 + 3, 6))
    mcmc = MCMC(kernel, num_warmup=1, num_samples=2, num_chains=2, chain_method="vectorized", progress_bar=False)
    mcmc.run(jax.random.key(99), jnp.asarray(X), hyper=fit.hyper, component_capacity=6,
             init_params={"rng_key": jnp.stack([key, key]), "chain": jnp.arange(2, dtype=jnp.int32)})
    draws = mcmc.get_samples(group_by_chain=True)
    np.testing.assert_array_equal(np.asarray(draws.paths), fit.samples["paths"])
    np.testing.assert_array_equal(np.asarray(draws.c), fit.samples["c"])
    np.testing.assert_allclose(np.asarray(draws.log_lik), fit.log_lik, rtol=1e-12)
    last = mcmc.last_state
    assert isinstance(last, bhmc.BHMCKernelState) and not kernel.overflowed(last)
    assert float(np.max(np.asarray(last.best.log_lik))) == pytest.approx(float(fit.best.log_lik))
    np.testing.assert_array_equal(np.asarray(last.iteration), [3, 3])
    with pytest.raises(TypeError, match="NumPyro program"):
        bhmc.BHMCKernel({"depth": 2})
    with pytest.raises(TypeError, match="the first argument is the NumPyro program"):
        bhmc.BHMCKernel(bhmc.BHMCConfig(2, 15, 6))  # the old BHMCKernel(config) with model_args
    with pytest.raises(TypeError, match="must be a BHMCConfig"):
        bhmc.BHMCKernel(nested.nested_hdp_model, {"depth": 2})
    with pytest.raises(TypeError, match="unknown settings.*depth"):
        bhmc.BHMCKernel(nested.nested_hdp_model, depth=3)
    with pytest.raises(ValueError, match="path_update must be one of"):
        bhmc.BHMCKernel(nested.nested_hdp_model, path_update="gibs")
    with pytest.raises(ValueError, match="init_params names \\['strat'\\]"):
        MCMC(bhmc.BHMCKernel(nested.nested_hdp_model), num_warmup=0, num_samples=1).run(
            key, jnp.asarray(X), hyper=fit.hyper, component_capacity=6, init_params={"strat": None})


def test_the_kernel_reads_the_program():
    """BHMCKernel reads the data, the constants and the hyperparameters from the NumPyro program
    (here one that wraps nested_hdp_model, run with jit_model_args=True and the hyperparameters
    traced): its draws are those of the pure core given the same values by hand. A program
    without BHMC's sites, or a config of another depth or truncation, is an error that says so."""
    X = np.r_[np.linspace(-2.0, -1.6, 3), np.linspace(1.6, 2.0, 3)][:, None]
    hyper = nested.NestedHDP(depth=2, alpha=2.0, gamma0=0.5, gamma=3.0, Sigma=0.3 * np.eye(1),
                             Sigma0=4.0 * np.eye(1), mu0=[0.7])
    config = bhmc.BHMCConfig(2, 15, 5, split_merge=0)

    def program(X, hyper):
        nested.nested_hdp_model(X, hyper=hyper, component_capacity=5)

    mcmc = MCMC(bhmc.BHMCKernel(program, config), num_warmup=0, num_samples=3, jit_model_args=True,
                progress_bar=False)
    key = jax.random.key(5)
    mcmc.run(key, jnp.asarray(X), jax.tree.map(jnp.asarray, hyper))
    draws = mcmc.get_samples()
    last = mcmc.last_state.sample
    np.testing.assert_allclose([last.alpha, last.gamma0, last.gamma], [2.0, 0.5, 3.0], rtol=1e-12)

    core = bhmc.algorithm(jnp.asarray(X), bhmc.BHMCHyper(*(jnp.asarray(v) for v in (2.0, 0.5, 3.0))),
                          bhmc.make_model(hyper), config)
    k_init, k_run = jax.random.split(key)
    state = core.init(jax.random.fold_in(k_init, 0))
    for i in range(3):
        state, _ = core.step(jax.random.fold_in(jax.random.fold_in(k_run, i), 0), state)
        np.testing.assert_array_equal(np.asarray(draws.paths[i]), np.asarray(state.paths))
        np.testing.assert_array_equal(np.asarray(draws.c[i]), np.asarray(state.c))
        np.testing.assert_allclose(np.asarray(draws.theta[i]), np.asarray(state.theta), rtol=1e-9)

    def no_data(X):
        nested.nested_hdp_model(None, hyper=hyper, num_points=6, component_capacity=5)

    with pytest.raises(ValueError, match="site 'x' must be observed"):
        MCMC(bhmc.BHMCKernel(no_data), num_warmup=0, num_samples=1).run(key, X)

    def other(X):
        numpyro.sample("x", numpyro.distributions.Normal(0.0, 1.0).expand(X.shape).to_event(2), obs=X)

    with pytest.raises(ValueError, match=r"BHMCKernel: the model has no sample site \['paths'"):
        MCMC(bhmc.BHMCKernel(other), num_warmup=0, num_samples=1).run(key, X)
    with pytest.raises(ValueError, match="component_capacity=5; the program has depth=2 .* and 6 sticks"):
        MCMC(bhmc.BHMCKernel(nested.nested_hdp_model, config), num_warmup=0, num_samples=1).run(
            key, X, hyper=hyper, component_capacity=6)


def test_node_capacity_overflow_raises():
    X = np.random.default_rng(0).normal(size=(30, 1))
    with pytest.raises(CapacityError, match="node_capacity"):
        bhmc.fit_bhmc(X, key=jax.random.key(0), depth=2, alpha=50.0, node_capacity=6, num_warmup=0,
                      num_samples=2, compiler_options=FAST)


@pytest.mark.parametrize("progress_bar", [True, False], ids=["progress-bar", "no-progress-bar"])
def test_the_kernel_raises_when_its_slots_run_out(progress_bar, monkeypatch):
    """Under NumPyro's ``MCMC`` a chain that runs out of node slots raises ``CapacityError``
    (it used to stop moving, silently): from the progress bar's check on the host, with no
    callback in the step, or else from the step's callback (callbacks counted, both ways)."""
    from jaxbnp.inference.bhmc import kernel as bhmc_kernel

    calls = []
    real = bhmc_kernel.raise_capacity_error_if
    monkeypatch.setattr(bhmc_kernel, "raise_capacity_error_if",
                        lambda *a, **k: (calls.append(1), real(*a, **k))[1])
    X = np.random.default_rng(0).normal(size=(30, 1))
    h = nested.NestedHDP(depth=2, alpha=50.0, gamma0=1.0, gamma=1.0, Sigma=np.eye(1), Sigma0=np.eye(1))
    start = (np.tile([1, 2], (30, 1)), np.zeros(30, int))  # one path: the start fits 6 node slots
    mcmc = MCMC(bhmc.BHMCKernel(nested.nested_hdp_model, node_capacity=6), num_warmup=0, num_samples=3)
    mcmc.progress_bar = progress_bar  # NumPyro turns it off under pytest-xdist and CI
    with pytest.raises(Exception, match="node or component slot.*node_capacity=6") as err:
        mcmc.run(jax.random.key(0), jnp.asarray(X), hyper=h, component_capacity=6, init_params={"start": start})
    assert bool(calls) != progress_bar
    if progress_bar:
        assert err.type is CapacityError


def test_node_capacity_grows_by_default():
    """``node_capacity=None`` starts with 64 node slots and doubles them (rerunning from the
    start) when a chain runs out: many small leaves (α = 50) need more than 64."""
    X = np.random.default_rng(0).normal(size=(60, 1))
    fit = bhmc.fit_bhmc(X, key=jax.random.key(0), depth=2, alpha=50.0, num_warmup=1, num_samples=2,
                        compiler_options=FAST)
    assert fit.tree.shape[0] > 64  # the capacity of the kept run
    assert int(np.sum(np.asarray(fit.best.count) > 0)) > 64 - 3  # it was needed
    assert not bool(fit.best.overflow)


# ------------------------------------------------------------------------ metrics
def test_f_measure_and_level_scores():
    assert metrics.f_measure([0, 0, 1, 1], [0, 0, 1, 1]) == 1.0
    assert metrics.f_measure([0, 0, 1, 1], [0, 0, 0, 1]) == pytest.approx(0.5 * 0.8 + 0.5 * 2 / 3)
    # the paper's rule: a path shorter than the evaluated depth keeps its last label
    np.testing.assert_array_equal(metrics.extend_paths([[3, 5], [4, -1]], 3), [[3, 5, 5], [4, 4, 4]])
    true = [[0, 0], [0, 1], [1, 0], [1, 1]]
    s = metrics.level_scores(true, [[7, 1], [7, 1], [8, 1], [8, 2]], 2)  # same leaf id under 7 and 8
    assert s["num_clusters"] == 3 and s["purity"] == 0.75
    top = metrics.level_scores(true, [[7, 1], [7, 1], [8, 1], [8, 2]], 1)
    assert top["ari"] == 1.0 and top["f_measure"] == 1.0
    deep = metrics.level_scores([[0, -1], [0, -1], [1, 2], [1, 3]], [[5, 6], [5, 6], [9, 1], [9, 2]], 3)
    assert deep["ari"] == 1.0


# ------------------------------------------------------------------------ data-driven start
@pytest.mark.parametrize("depth", [1, 2, 3])
def test_ward_start_is_a_nested_tree(depth, monkeypatch):
    """Ward's tree cut to the depth: nested levels (a node has one parent), node ids level
    by level from 1, one component per leaf; with more points than WARD_SAMPLE the others
    join the nearest leaf and the result is still a tree."""
    rng = np.random.default_rng(0)
    centres = np.repeat(rng.normal(0, 10, (9, 2)), 20, axis=0)
    X = centres + rng.normal(size=centres.shape)
    for sample in (10_000, 50):
        monkeypatch.setattr(bhmc_start, "WARD_SAMPLE", sample)
        paths, c = bhmc.ward_start(X, depth, 9)
        assert paths.shape == (180, depth) and c.shape == (180,)
        full = np.concatenate([np.zeros((180, 1), int), paths], axis=1)
        for level in range(1, depth + 1):
            parents = {}
            for node, par in zip(full[:, level], full[:, level - 1]):
                assert parents.setdefault(node, par) == par  # one parent per node
        ids = np.unique(paths)
        np.testing.assert_array_equal(ids, np.arange(1, len(ids) + 1))
        assert len(np.unique(paths[:, -1])) == len(np.unique(c)) <= 9
        # the leaves are the deepest cut: each leaf is one component
        assert all(len(np.unique(c[paths[:, -1] == leaf])) == 1 for leaf in np.unique(paths[:, -1]))
        if sample == 10_000:
            assert metrics.ari(np.arange(180) // 20, paths[:, -1]) > 0.9


def test_fit_options_and_posterior_summary():
    X = np.r_[np.random.default_rng(0).normal(-3, 0.3, (10, 2)), np.random.default_rng(1).normal(3, 0.3, (10, 2))]
    with pytest.raises(ValueError, match="init"):
        bhmc.fit_bhmc(X, key=jax.random.key(0), init="kmeans")
    with pytest.raises(ValueError, match="path_update"):
        bhmc.fit_bhmc(X, key=jax.random.key(0), path_update="slice")
    fit = bhmc.fit_bhmc(X, key=jax.random.key(0), depth=2, num_samples=10, num_warmup=5, num_chains=2,
                        compiler_options=FAST)
    assert fit.summary_labels_per_level.shape == (2, 20)
    for level in range(2):
        # the summary is the expected-VI point estimate of that level's node draws, all chains
        draws = fit.samples["paths"][..., level].reshape(-1, 20)
        np.testing.assert_array_equal(fit.summary_labels_per_level[level], metrics.point_estimate(draws))
    # the leaves separate the two groups (a leaf holds points of one group only). The first
    # level need not: the groups share no component, so nothing in BHMC's likelihood keeps
    # them under different first-level nodes, and the nCRP prefers one (the subtree moves
    # find that posterior; a sampler stuck at Ward's start would not)
    leaves = fit.summary_labels_per_level[1]
    group = np.arange(20) // 10
    assert all(len(np.unique(group[leaves == j])) == 1 for j in np.unique(leaves))
    assert len(np.unique(leaves)) >= 2
    prior = bhmc.fit_bhmc(X, key=jax.random.key(0), depth=2, num_samples=3, num_warmup=1, init="prior",
                          store_samples=False, compiler_options=FAST)
    assert prior.summary_labels_per_level is None


def test_fit_starts_from_given_paths_and_components():
    """``init=(paths, c)``: a node is its path prefix (ids need only tell siblings apart), the
    components are compacted, and the chains start there (the first draw, one sweep on, keeps
    the single path it was given, where Ward's start has two first-level nodes); bad starts raise before anything compiles."""
    X = np.r_[np.random.default_rng(0).normal(-3, 0.3, (10, 2)), np.random.default_rng(1).normal(3, 0.3, (10, 2))]
    group = np.arange(20) // 10
    paths = np.stack([group + 7, np.arange(20) % 2], axis=1)  # leaf id 0/1 reused under both groups
    c = 5 * group + 40
    out, comps = bhmc_fit._given_start((paths, c), 20, 2)
    np.testing.assert_array_equal(out[:, 0], 1 + group)
    assert len(np.unique(out[:, 1])) == 4 and out[:, 1].min() == 3  # four leaves, numbered after level 1
    np.testing.assert_array_equal(comps, group)
    for bad, match in [((paths[:, :1], c), r"paths of shape \(20, 2\)"), ((paths, c[:5]), "c of shape"),
                       ((paths + 0.5, c), "integers"), ("kmeans", "init must be"), ((paths,), "pair")]:
        with pytest.raises(ValueError, match=match):
            bhmc.fit_bhmc(X, key=jax.random.key(0), init=bad)
    with pytest.raises(ValueError, match="component_capacity"):
        bhmc.fit_bhmc(X, key=jax.random.key(0), init=(paths, np.arange(20)), component_capacity=4)
    # a start Ward's would not give: every point on one path; with a tiny alpha no point
    # leaves it in a sweep, and Ward's two first-level nodes stay two
    one_path = (np.ones((20, 2), int), c)
    draws = [bhmc.fit_bhmc(X, key=jax.random.key(0), depth=2, alpha=1e-4, num_samples=1, num_warmup=0,
                           init=init,
                           regraft=False, compiler_options=FAST).samples["paths"][0, 0, :, 0]
             for init in [one_path, "ward"]]
    assert [len(np.unique(d)) for d in draws] == [1, 2]


@pytest.mark.parametrize("start", ["one-component", "three-components"])
def test_split_merge_finds_the_two_groups(start):
    """The component split-merge (with the weights' update, no point moves) splits one component
    that holds two far groups and merges two components that cut one group: from either start,
    40 moves reach one component per group (a move with its ratio inverted would not)."""
    X = np.r_[np.random.default_rng(0).normal(-3, 0.3, (10, 2)), np.random.default_rng(1).normal(3, 0.3, (10, 2))]
    group = np.arange(20) // 10
    hyper = nested.NestedHDP(depth=2, alpha=1.0, gamma0=1.0, gamma=1.0, Sigma=0.1 * np.eye(2),
                             Sigma0=10.0 * np.eye(2), mu0=np.zeros(2))
    model = bhmc.make_model(hyper)
    config = bhmc.BHMCConfig(2, 16, 8)
    Xj = jnp.asarray(X, jnp.result_type(float))
    c = np.zeros(20, int) if start == "one-component" else np.where(group == 0, np.arange(20) % 2, 2)
    state = bhmc.init_from(jax.random.key(0), Xj, np.ones((20, 2), int), c, hyper, model, config)

    @jax.jit
    def moves(key, state):
        def body(t, carry):
            state, n = carry
            k_sm, k_beta = jax.random.split(jax.random.fold_in(key, t))
            state, go = bhmc.split_merge(k_sm, state, Xj, model, config)
            return bhmc.update_beta_exact(k_beta, state, config), n + go
        return jax.lax.fori_loop(0, 40, body, (state, 0))

    state, accepted = moves(jax.random.key(1), state)
    assert int(accepted) >= 1 and not bool(state.overflow)
    assert metrics.ari(group, np.asarray(state.c)) == pytest.approx(1.0)
    np.testing.assert_array_equal(np.asarray(state.node_comp[0]).sum(), 20)
    assert int(state.comp_active.sum()) == 2


def test_old_argument_order_warns_and_fits_the_same():
    """``fit_bhmc(X, key=...)`` is the order of every ``fit_*`` function (issue #39); the old
    ``fit_bhmc(key, X)`` still gives the same fit, with a FutureWarning."""
    X = np.linspace(-2.0, 2.0, 6)[:, None]
    kw = dict(depth=2, num_warmup=1, num_samples=2, compiler_options=FAST, init="prior")
    new = bhmc.fit_bhmc(X, key=jax.random.key(5), **kw)
    with pytest.warns(FutureWarning, match="old argument order"):
        old = bhmc.fit_bhmc(jax.random.key(5), X, **kw)
    np.testing.assert_array_equal(old.samples["paths"], new.samples["paths"])
    np.testing.assert_array_equal(old.log_lik, new.log_lik)
    with pytest.raises(TypeError, match="given twice"):
        bhmc.fit_bhmc(jax.random.key(5), X, key=jax.random.key(5), **kw)
