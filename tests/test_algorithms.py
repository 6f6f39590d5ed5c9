"""The one shape (``jaxbnp.inference.base.SamplingAlgorithm``, issue #39): every sampler's
``algorithm(...)`` gives ``init(key, *position) -> State`` and ``step(key, state) ->
(State, Info)``, whose step keeps the state's structure, shapes and dtypes (so chains are a
``vmap`` and a run a ``lax.scan``), and takes the same step as the sampler's core function
for the same key."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxbnp as bnp
from jaxbnp.inference.base import SamplingAlgorithm, run_steps
from jaxbnp.inference.bhmc import sampler as bhmc
from jaxbnp.inference.partition import auxiliary, moves, slice_gibbs, subcluster
from jaxbnp.inference.trees import mcmc as ddt_mcmc
from jaxbnp.inference.trees import population
from jaxbnp.models import nested

X = jnp.asarray(np.r_[np.linspace(-2.2, -1.8, 4), np.linspace(1.8, 2.2, 4)][:, None])
NG = bnp.NormalGamma(0.0, 0.5, 2.0, 1.0)
HYPER = nested.NestedHDP(depth=2, alpha=1.0, gamma0=1.0, gamma=1.0, Sigma=0.2 * np.eye(1), Sigma0=np.eye(1))
# the path and component updates alone (a smaller program to compile; the sweep's other moves
# are tests/test_bhmc.py's and tests/exact/test_bhmc_exact.py's)
BHMC_CONFIG = bhmc.BHMCConfig(2, nested.default_node_capacity(8, 2), 6, update_beta=False, regraft=False,
                              split_merge=0)


def _same_structure(a, b):
    chex.assert_trees_all_equal_structs(a, b)
    chex.assert_trees_all_equal_shapes_and_dtypes(a, b)


def _moves():
    move = moves.chain(moves.gibbs_sweep(), moves.update_u())
    ctx = moves.Context(X, bnp.DP(1.0), NG)
    return (moves.algorithm(move, X, bnp.DP(1.0), NG), (np.r_[np.zeros(4), np.ones(4)],),
            lambda k, s: moves.step(k, s, ctx, move))


def _subcluster():
    move, ctx = subcluster.subcluster_move(2), moves.Context(X, bnp.DP(1.0), NG)
    return (subcluster.algorithm(X, bnp.DP(1.0), NG, num_launch_sweeps=2), (),
            lambda k, s: moves.step(k, s, ctx, move))


def _poisson_model(data):
    import numpyro
    import numpyro.distributions as dist

    z = numpyro.sample("z", bnp.Partition(bnp.DP(1.0), data.shape[0]))
    with numpyro.plate("clusters", 4):
        rate = numpyro.sample("rate", dist.LogNormal(0.0, 1.0))
    numpyro.sample("x", dist.Poisson(rate[z]), obs=data)


def _auxiliary():
    data = jnp.asarray(np.r_[np.zeros(4), 9.0 * np.ones(4)])
    kernel = bnp.AuxiliaryGibbs(_poisson_model)
    _, spec = kernel.read_model({}, (data,), {})
    make = lambda: auxiliary.algorithm(_poisson_model, spec, (data,), {})  # noqa: E731
    return (make(), (jnp.array([0, 0, 0, 0, 1, 1, 1, 1]), {"rate": jnp.arange(1.0, 5.0)}),
            lambda k, s: make().step(k, s))


def _slice_gibbs():
    data = jnp.asarray(np.r_[np.zeros(4), 9.0 * np.ones(4)])
    _, spec = bnp.SliceGibbs(_poisson_model).read_model({}, (data,), {})
    make = lambda: slice_gibbs.algorithm(_poisson_model, spec, (data,), {})  # noqa: E731
    return (make(), (jnp.array([0, 0, 0, 0, 1, 1, 1, 1]), {"rate": jnp.arange(1.0, 5.0)}),
            lambda k, s: make().step(k, s))


def _trees_mcmc():
    tree = bnp.models.ddt.sample_tree(jax.random.key(5), 1.0, X.shape[0], X.dtype)
    return (ddt_mcmc.algorithm(X, num_subtree_moves=3), (tree, 1.0, 1.0, 0.1),
            lambda k, s: ddt_mcmc.step(k, s, X, num_subtree_moves=3))


def _population():
    # the exchange moves alone (the within-chain sweep is trees.mcmc's)
    trees = jax.vmap(lambda k: bnp.models.ddt.sample_tree(k, 1.0, X.shape[0], X.dtype))(
        jax.random.split(jax.random.key(6), 4))
    return (population.algorithm(X, 4, subset_size=2, within_chain=False), (trees, 1.0, 1.0, 0.1),
            lambda k, s: population.step(k, s, X, subset_size=2, within_chain=False))


def _bhmc():
    model = bhmc.make_model(HYPER)
    return (bhmc.algorithm(X, HYPER, model, BHMC_CONFIG), (),
            lambda k, s: bhmc.step(k, s, X, model, BHMC_CONFIG))


#: each sampler: ``() -> (algorithm, init arguments after the key, the core's own step)``
ALGORITHMS = {"moves": _moves, "subcluster": _subcluster, "auxiliary": _auxiliary,
              "slice_gibbs": _slice_gibbs, "trees.mcmc": _trees_mcmc,
              "population": _population, "bhmc": _bhmc}


@pytest.mark.parametrize("name", ALGORITHMS)
def test_every_sampler_has_the_one_shape(name):
    alg, position, core_step = ALGORITHMS[name]()
    assert isinstance(alg, SamplingAlgorithm), name
    state = alg.init(jax.random.key(1), *position)
    # one program: the algorithm's step and the sampler's own step, same (legacy) key
    both = jax.jit(lambda k, s: (alg.step(k, s), core_step(k, s)))
    (new, info), (want, want_info) = both(jax.random.PRNGKey(2), state)
    _same_structure(new, state)  # so a run is a lax.scan of step (run_steps), chains a vmap
    chex.assert_trees_all_equal(new, want)
    chex.assert_trees_all_equal(info, want_info)


def test_run_steps_scans_the_step():
    alg = moves.algorithm(moves.gibbs_sweep(), X, bnp.DP(1.0), NG)
    state = alg.init(jax.random.key(0))
    last, infos = run_steps(alg, jax.random.key(3), state, 3)
    _same_structure(last, state)
    s = state
    for k in jax.random.split(jax.random.key(3), 3):
        s, _ = alg.step(k, s)
    chex.assert_trees_all_equal(last, s)
    assert infos.mh.num_proposed.shape == (3,)


def test_init_draws_the_start_it_is_not_given():
    """Without a position, the tree samplers start from a draw of the prior (the key's)."""
    alg = ddt_mcmc.algorithm(X)
    a, b = alg.init(jax.random.key(0)), alg.init(jax.random.key(1))
    assert not np.array_equal(np.asarray(a.tree.time), np.asarray(b.tree.time))
    chex.assert_trees_all_equal(a, alg.init(jax.random.key(0)))
    pop = population.algorithm(X, 3, subset_size=2).init(jax.random.key(0))
    assert pop.tree.time.shape == (3, 2 * X.shape[0] - 1)
    # a partition algorithm starts from one cluster, NGGP's u at its mode
    state = moves.algorithm(moves.update_u(), X, bnp.NGGP(1.0, 0.3), NG).init(jax.random.key(0))
    assert int(state.partition.clusters.num_clusters) == 1
    assert float(state.partition.u) == pytest.approx(float(bnp.NGGP(1.0, 0.3).u_mode(jnp.array([8.0]))),
                                                     rel=1e-6)


def _kept(state):
    """What the runner keeps of an AlgorithmKernel's state (module-level: programs reused)."""
    return {"labels": state.state.partition.clusters.labels, "accepted": state.info.mh.num_accepted}


def test_the_runner_and_numpyro_drive_a_pure_core():
    """``AlgorithmKernel`` runs any algorithm: through ``runner.run`` and through NumPyro's
    ``MCMC`` the draws are those of the algorithm stepped by hand with the documented keys
    (``k_init, k_run = split(chain_key)``; step ``t`` takes the ``t``-th ``key, k =
    split(key)``), and the step's info is kept beside the state."""
    from numpyro.infer import MCMC

    from jaxbnp.inference.adapter import AlgorithmKernel
    from jaxbnp.inference.runner import run

    move = moves.chain(moves.split_merge(2), moves.gibbs_sweep())

    def make(X):
        return moves.algorithm(move, X, bnp.DP(1.0), NG)

    key, warmup, draws = jax.random.key(4), 2, 3
    result = run(lambda capacity: AlgorithmKernel(make), key, (X,), num_warmup=warmup,
                 num_samples=draws, num_chains=2, collect=_kept)
    mcmc = MCMC(AlgorithmKernel(make), num_warmup=warmup, num_samples=draws, num_chains=2,
                chain_method="vectorized", progress_bar=False)
    mcmc.run(jax.random.PRNGKey(4), X)  # a legacy key: the same draws
    by_numpyro = np.asarray(mcmc.get_samples(group_by_chain=True).partition.clusters.labels)
    step = jax.jit(make(X).step)
    for c, chain_key in enumerate(jax.random.split(key, 2)):
        k_init, k = jax.random.split(chain_key)
        state = make(X).init(k_init)
        for t in range(warmup + draws):
            k, k_step = jax.random.split(k)
            state, info = step(k_step, state)
            if t >= warmup:
                labels = np.asarray(state.partition.clusters.labels)
                np.testing.assert_array_equal(result.samples["labels"][c, t - warmup], labels)
                np.testing.assert_array_equal(by_numpyro[c, t - warmup], labels)
                assert result.samples["accepted"][c, t - warmup] == int(info.mh.num_accepted)
    assert len({r.tobytes() for r in result.samples["labels"].reshape(-1, X.shape[0])}) > 1  # it moves


def test_the_sharded_gibbs_sweep_has_the_one_shape():
    """``sharded.algorithm``: the data-parallel sweep over the suite's 4 host devices in the
    one shape; its step is the sweep of ``sharded.gibbs(key, ..., num_sweeps=1)`` (labels,
    counts and the log joint), and the state keeps its structure."""
    from jaxbnp.inference import sharded

    X2 = jnp.asarray(np.r_[np.linspace(-2.3, -1.7, 6), np.linspace(1.7, 2.3, 6)][:, None])
    start = np.r_[np.zeros(6), np.ones(6)].astype(np.int32)
    start[[0, 7]] = [1, 0]  # two points in the wrong cluster
    alg = sharded.algorithm(X2, bnp.DP(1.0), NG, capacity=6, block_size=4)
    assert isinstance(alg, SamplingAlgorithm)
    state = alg.init(jax.random.key(0), start)
    for seed in (3, 4):
        key = jax.random.key(seed)
        new, info = alg.step(key, state)
        _same_structure(state, new)
        ref = sharded.gibbs(key, X2, bnp.DP(1.0), NG, 6, num_sweeps=1, block_size=4, labels=start)
        np.testing.assert_array_equal(sharded.labels_in_order(new, 12, 4), ref.clusters.labels)
        np.testing.assert_array_equal(new.counts, ref.clusters.counts)
        np.testing.assert_allclose(info.log_joint, ref.log_joint[0], rtol=1e-12)
    assert not np.array_equal(sharded.labels_in_order(new, 12, 4), start)  # the sweep moved points
