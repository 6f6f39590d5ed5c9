"""Scale-out (issue #8): data-parallel MAP-DP and Gibbs over a mesh, chains over 8 devices,
two-process loopback ``jax.distributed``, chunked MAP-DP and the chunked sub-cluster chain.

The 8-device checks run in one subprocess (``XLA_FLAGS=--xla_force_host_platform_device_count=8``,
float64; the main test process already has 4 host devices) that prints one JSON object;
each test below asserts one part of it.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from sklearn.datasets import load_wine
from sklearn.metrics import adjusted_rand_score

import jaxbnp as bnp
from jaxbnp.inference import distributed, sharded
from jaxbnp.inference.partition import mapdp, subcluster
from jaxbnp.inference.partition.clusters import compact_labels

from .device_scripts import background_fixture, run_processes

# wine, standardised, with the prior of tests/test_mapdp.py: batched MAP-DP leaves the one-cluster start
PRELUDE = """
import numpy as np
from sklearn.datasets import load_wine
from sklearn.metrics import adjusted_rand_score
import jaxbnp as bnp
X = load_wine().data
X = (X - X.mean(0)) / X.std(0)
FAMILY = bnp.NormalGamma(np.zeros(X.shape[1]), 0.1, 2.0, np.full(X.shape[1], 0.2))
"""

EIGHT_DEVICES = PRELUDE + r'''
import json, jax, jax.numpy as jnp, numpyro
from numpyro.infer import MCMC
from jaxbnp.inference.partition import mapdp
from jaxbnp.inference import sharded
from jaxbnp.inference.partition import gibbs
from jaxbnp.inference.partition.clusters import clusters_from_labels
assert jax.device_count() == 8
out = {}
# 1. sharded MAP-DP (8 shards x 2 points = global blocks of 16; 178 points -> 14 padding rows)
res = sharded.fit_mapdp(X, bnp.DP(1.0), FAMILY, 32, mesh=sharded.make_mesh(8), block_size=16, max_iter=20)
ref, _ = mapdp.fit(jax.random.key(0), jnp.asarray(X), bnp.DP(1.0), FAMILY, 32, mode="batched",
                   block_size=16, max_iter=20)
out["mapdp"] = dict(trace=np.asarray(res.nll_trace)[: int(res.n_iter) + 1].tolist(),
                    ref=np.asarray(ref.nll_trace)[: int(ref.n_iter) + 1].tolist(),
                    same_labels=bool(np.array_equal(np.asarray(res.clusters.labels), np.asarray(ref.clusters.labels))),
                    num_clusters=int(np.sum(np.asarray(res.clusters.counts) > 0)),
                    sharding=str(res.clusters.counts.sharding))
# 2. sharded Gibbs on one shard = sequential collapsed Gibbs with the documented noise
X4 = jnp.asarray(X[:48, :4]); fam4 = bnp.NormalGamma(np.zeros(4), 0.1, 2.0, np.full(4, 0.2))
key, cap = jax.random.key(3), 64
one = sharded.gibbs(key, X4, bnp.DP(1.0), fam4, cap, num_sweeps=2, mesh=sharded.make_mesh(1), block_size=16)
st = clusters_from_labels(fam4, X4, jnp.zeros(48, jnp.int32), cap)
for t in range(2):
    k = jax.random.fold_in(jax.random.fold_in(key, t), 0)
    noise = jnp.concatenate([gibbs.step_uniforms(jax.random.fold_in(k, b), 16, X4.dtype) for b in range(3)])
    st = gibbs.assignment_sweep(st._replace(stats=fam4.stats_from_labels(X4, st.labels, cap)), X4, bnp.DP(1.0), fam4, noise=noise)
out["gibbs_one_shard"] = dict(equal=bool(np.array_equal(np.asarray(st.labels), np.asarray(one.clusters.labels))),
                              num_clusters=int(np.sum(np.asarray(st.counts) > 0)))
# 3. sharded Gibbs on 8 shards: carried statistics = statistics of the labels; new clusters of
#    different shards never share a slot (alpha huge: every point must end up alone)
checks = {}
for name, alpha in (("dp1", 1.0), ("singletons", 1e8)):
    r = sharded.gibbs(key, X4, bnp.DP(alpha), fam4, cap, num_sweeps=3, mesh=sharded.make_mesh(8), block_size=16)
    fresh = clusters_from_labels(fam4, X4, r.clusters.labels, cap)
    err = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b)))) for a, b in
              zip(jax.tree.leaves(fresh.stats), jax.tree.leaves(r.clusters.stats)))
    lj = float(bnp.log_joint(X4, r.clusters.labels, bnp.DP(alpha), fam4))
    checks[name] = dict(counts_equal=bool(np.array_equal(np.asarray(fresh.counts), np.asarray(r.clusters.counts))),
                        stats_err=err, num_clusters=int(np.sum(np.asarray(r.clusters.counts) > 0)),
                        log_joint=float(r.log_joint[-1]), log_joint_from_labels=lj)
out["gibbs_sharded"] = checks
# 4. chains over 8 devices: parallel == vectorized for the same key
def model(X):
    z = numpyro.sample("z", bnp.Partition(bnp.DP(1.0), X.shape[0]))
    numpyro.sample("X", bnp.ConjugateMixture(bnp.NormalGamma(0.0, 1.0, 2.0, 1.0), z), obs=X)
Xc = jnp.asarray(X[:12, :2])
chains = {}
for name, kernel in (("CollapsedGibbs", lambda: bnp.CollapsedGibbs(model)),
                     ("SplitMerge", lambda: bnp.SplitMerge(model, num_split_merge=2)),
                     # device trees by default (no callback); with trees="host" the callbacks run on 8 devices
                     ("TreeGuidedMCMC", lambda: bnp.TreeGuidedMCMC(model, num_global_moves=2, init="noisy"))):
    draws = {}
    for method in ("vectorized", "parallel"):
        m = MCMC(kernel(), num_warmup=2, num_samples=4, num_chains=8, chain_method=method, progress_bar=False)
        m.run(jax.random.key(7), Xc)
        draws[method] = np.asarray(m.get_samples(group_by_chain=True)["z"])
    chains[name] = dict(equal=bool(np.array_equal(draws["vectorized"], draws["parallel"])),
                        shape=list(draws["parallel"].shape),
                        distinct_chains=int(len({d.tobytes() for d in draws["parallel"]})))
out["chains"] = chains
print("JSON" + json.dumps(out))
'''

LOOPBACK = r'''
import json, sys
pid, port = int(sys.argv[1]), int(sys.argv[2])
from jaxbnp.inference import distributed
# first, before anything touches a JAX backend
index, count = distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=pid)
import jax
from jaxbnp.inference import sharded
from jax.sharding import NamedSharding, PartitionSpec as P
''' + PRELUDE + r'''
mesh = sharded.make_mesh()  # 2 processes x 2 host devices
local = np.full((2,), float(pid + 1))
arr = jax.make_array_from_process_local_data(NamedSharding(mesh, P("points")), local, (4,))
total = jax.jit(jax.shard_map(lambda x: jax.lax.psum(x, "points"), mesh=mesh, in_specs=P("points"),
                              out_specs=P()))(arr)
res = sharded.fit_mapdp(X, bnp.DP(1.0), FAMILY, 32, mesh=mesh, block_size=16, max_iter=20)
print("JSON" + json.dumps(dict(
    index=index, count=count, devices=jax.device_count(), local_devices=jax.local_device_count(),
    psum=np.asarray(total.addressable_data(0)).tolist(),
    trace=np.asarray(res.nll_trace.addressable_data(0))[: int(res.n_iter.addressable_data(0)) + 1].tolist(),
    labels=np.asarray(res.clusters.labels).tolist())), flush=True)
jax.distributed.shutdown()
'''


_eight_device_run = background_fixture(EIGHT_DEVICES)


@pytest.fixture
def eight(_eight_device_run) -> dict:
    return _eight_device_run.result


@functools.lru_cache(maxsize=1)
def _wine():
    X = load_wine().data
    X = (X - X.mean(0)) / X.std(0)
    return X, bnp.NormalGamma(np.zeros(X.shape[1]), 0.1, 2.0, np.full(X.shape[1], 0.2))


@functools.lru_cache(maxsize=1)
def _in_memory_reference():
    """Single-device ``mapdp.fit(mode="batched", block_size=16)`` on wine: trace and labels."""
    X, family = _wine()
    ref, _ = mapdp.fit(jax.random.key(0), jnp.asarray(X), bnp.DP(1.0), family, 32, mode="batched",
                       block_size=16, max_iter=20)
    return np.asarray(ref.nll_trace)[: int(ref.n_iter) + 1], np.asarray(ref.clusters.labels)


# ----------------------------------------------------------------------------- two processes
def test_two_processes_over_loopback_psum_and_sharded_mapdp():
    """jax.distributed on CPU (gloo collectives): a psum across processes, and the sharded MAP-DP of
    2 processes x 2 devices equals the single-process batched fit (global blocks of 16)."""
    outs = run_processes(LOOPBACK)
    trace, labels = _in_memory_reference()
    for i, o in enumerate(outs):
        assert (o["index"], o["count"], o["devices"], o["local_devices"]) == (i, 2, 4, 2)
        assert o["psum"] == [6.0]  # 1 + 1 + 2 + 2: one value from each device of both processes
        np.testing.assert_allclose(o["trace"], trace, rtol=1e-12)
        np.testing.assert_array_equal(o["labels"], labels)


def test_batched_mapdp_padding_keeps_labels_counts_and_nll_consistent():
    """Regression (fixed in mapdp.batched_sweep): the last block's padding repeats the last point;
    its old label used to overwrite that point's joint proposal (negative counts, rising NLL)."""
    X = jnp.asarray(np.r_[np.arange(4) * 0.01, 100.0].reshape(-1, 1))
    family = bnp.NormalGamma(0.0, 0.1, 2.0, 0.2)
    res, _ = mapdp.fit(jax.random.key(0), X, bnp.DP(1.0), family, 8, mode="batched", block_size=4,
                       max_iter=5)
    labels, counts = np.asarray(res.clusters.labels), np.asarray(res.clusters.counts)
    np.testing.assert_array_equal(counts, np.bincount(labels, minlength=8))
    trace = np.asarray(res.nll_trace)[: int(res.n_iter) + 1]
    assert np.all(np.diff(trace) <= 0)
    assert labels[4] != labels[0]  # the far point has its own cluster
    np.testing.assert_allclose(trace[-1], -float(bnp.log_joint(X, labels, bnp.DP(1.0), family)), rtol=1e-12)


# ----------------------------------------------------------------------------- chunked
def test_chunked_mapdp_equals_the_in_memory_fit_and_is_monotone():
    X, family = _wine()
    res = distributed.fit_mapdp_chunked(np.asarray(X), bnp.DP(1.0), family, 32, chunk_size=48,
                                        block_size=16, max_iter=20, init="one")
    trace, labels = _in_memory_reference()
    assert res.labels.shape == (178,) and res.n_iter == len(trace) - 1 >= 2
    np.testing.assert_allclose(res.nll_trace, trace, rtol=1e-12)
    np.testing.assert_array_equal(res.labels, labels)
    assert np.all(np.diff(res.nll_trace) <= 0)
    np.testing.assert_allclose(res.nll, float(bnp.log_joint(X, res.labels, bnp.DP(1.0), family)) * -1,
                               rtol=1e-12)


def test_chunked_mapdp_reads_a_memmap(tmp_path):
    """A np.memmap is read chunk by chunk (same result as the array; same compiled programs)."""
    X, family = _wine()
    path = tmp_path / "X.npy"
    np.save(path, X)
    res = distributed.fit_mapdp_chunked(np.load(path, mmap_mode="r"), bnp.DP(1.0), family, 32,
                                        chunk_size=48, block_size=16, max_iter=20, init="one")
    np.testing.assert_array_equal(res.labels, _in_memory_reference()[1])


def test_chunked_mapdp_starts_from_a_fit_of_a_subsample():
    """The default start: MAP-DP with moves on 300 of the 2300 points, every point in its best
    cluster of that fit, then streamed sweeps. It finds the four blobs (the one-cluster start
    finds one), the NLL never increases from the start and ends at -log p(X, labels)."""
    X, family = _blobs(2300)
    res = distributed.fit_mapdp_chunked(X, bnp.DP(1.0), family, 16, chunk_size=512, block_size=128,
                                        init_size=300)
    assert adjusted_rand_score(res.labels, np.arange(2300) % 4) > 0.99
    assert np.all(np.diff(res.nll_trace) <= 0)
    np.testing.assert_allclose(res.nll, -float(bnp.log_joint(X, res.labels, bnp.DP(1.0), family)),
                               rtol=1e-6)
    one = distributed.fit_mapdp_chunked(X, bnp.DP(1.0), family, 16, chunk_size=512, block_size=128,
                                        init="one")
    assert len(np.unique(one.labels)) < 4 and one.nll > res.nll


@functools.cache
def _subcluster_reference(n=2300, C=16, num_iterations=12, measure=bnp.DP(1.0)):
    """``subcluster.step`` iterated in memory from one cluster, keys split from key 5: the
    slot labels after each iteration."""
    X, family = _blobs(n)
    step = jax.jit(subcluster.step, static_argnames=("capacity", "num_launch_sweeps",
                                                     "num_absorb_moves", "num_reassign_moves"))
    labels, out = jnp.zeros(n, jnp.int32), []
    for k in jax.random.split(jax.random.key(5), num_iterations):
        # the streamed chain runs no absorb or reassign moves (fit_subcluster_chunked)
        labels = step(k, labels, jnp.asarray(X), measure, family, capacity=C, num_absorb_moves=0,
                      num_reassign_moves=0)[0]
        out.append(np.asarray(labels))
    return out


def _blobs(n):
    rng = np.random.default_rng(4)
    centres = np.array([[-5.0, 0.0], [0.0, 5.0], [5.0, 0.0], [0.0, -5.0]])
    return centres[np.arange(n) % 4] + rng.normal(size=(n, 2)), bnp.NormalGamma(np.zeros(2), 0.1, 2.0,
                                                                                np.ones(2))


def test_chunked_subcluster_is_the_in_memory_chain(tmp_path):
    """2,300 points in 3 chunks of 767 (``chunk_size=1000``; one padding row), read from a
    memmap: the chain of ``subcluster.step`` with the same keys, iteration for iteration
    (float64)."""
    X, family = _blobs(2300)
    path = tmp_path / "X.npy"
    np.save(path, X)
    ref = _subcluster_reference()
    res = distributed.fit_subcluster_chunked(np.load(path, mmap_mode="r"), bnp.DP(1.0), family, 12,
                                             key=jax.random.key(5), capacity=16, chunk_size=1000)
    np.testing.assert_array_equal(res.labels, compact_labels(ref[-1]))
    np.testing.assert_array_equal(res.num_clusters, [len(np.unique(r)) for r in ref])
    assert res.num_splits.sum() >= 3  # the chain left its one-cluster start by splits
    np.testing.assert_array_equal(res.counts, np.bincount(res.labels))
    np.testing.assert_allclose(res.log_joint[-1], float(bnp.log_joint(X, res.labels, bnp.DP(1.0), family)),
                               rtol=1e-10)
    # 2 chunks of 1,150 from the array: the same chain
    short = distributed.fit_subcluster_chunked(X, bnp.DP(1.0), family, 12, key=jax.random.key(5),
                                               capacity=16, chunk_size=2048)
    np.testing.assert_array_equal(short.labels, res.labels)


def test_chunked_subcluster_raises_when_every_slot_is_used():
    X, family = _blobs(2300)
    with pytest.raises(bnp.CapacityError, match="all 2 cluster slots are in use after iteration"):
        distributed.fit_subcluster_chunked(X, bnp.DP(1.0), family, 10, key=jax.random.key(5), capacity=2)


def test_chunked_subcluster_bad_input():
    X, family = _blobs(2300)
    key = jax.random.key(0)
    with pytest.raises(ValueError, match="NGGP is not|supports DP and PitmanYor"):
        distributed.fit_subcluster_chunked(X, bnp.NGGP(1.0, 0.3), family, 1, key=key)
    with pytest.raises(ValueError, match="num_iterations must be an integer >= 1"):
        distributed.fit_subcluster_chunked(X, bnp.DP(1.0), family, 0, key=key)
    with pytest.raises(ValueError, match="init_labels must be 2300 integers in"):
        distributed.fit_subcluster_chunked(X, bnp.DP(1.0), family, 1, key=key, capacity=4,
                                           init_labels=np.full(2300, 4))
    bad = np.array(X)
    bad[2200, 1] = np.nan
    with pytest.raises(ValueError, match=r"X\[1534:2300\] contains NaN or inf"):
        distributed.fit_subcluster_chunked(bad, bnp.DP(1.0), family, 1, key=key, chunk_size=1000)


# ----------------------------------------------------------------------------- validation
def test_bad_inputs_raise_before_compiling():
    X, family = _wine()
    with pytest.raises(ValueError, match="num_devices must be an integer between 1 and 4"):
        sharded.make_mesh(5)
    with pytest.raises(ValueError, match="block_size must be an integer >= 1"):
        sharded.fit_mapdp(X, bnp.DP(1.0), family, 32, block_size=0)
    with pytest.raises(ValueError, match="capacity must be an integer >= 1"):
        sharded.gibbs(jax.random.key(0), X, bnp.DP(1.0), family, 0)
    with pytest.raises(ValueError, match="NaN or inf"):
        sharded.fit_mapdp(np.where(np.arange(178)[:, None] == 3, np.nan, X), bnp.DP(1.0), family, 32)
    two_axes = jax.sharding.Mesh(np.asarray(jax.devices()).reshape(2, 2), ("a", "b"))
    with pytest.raises(ValueError, match="exactly one axis"):
        sharded.fit_mapdp(X, bnp.DP(1.0), family, 32, mesh=two_axes)
    with pytest.raises(ValueError, match="initial partition has 3 clusters but capacity is 2"):
        sharded.gibbs(jax.random.key(0), X, bnp.DP(1.0), family, 2, labels=np.arange(178) % 3)
    with pytest.raises(ValueError, match="non-empty 2-D"):
        distributed.fit_mapdp_chunked(X[:, 0], bnp.DP(1.0), family, 32)
    bad = np.array(X)
    bad[170, 2] = np.inf  # in the last chunk: found by the validation pass, before any sweep
    with pytest.raises(ValueError, match=r"X\[144:178\] contains NaN or inf"):
        distributed.fit_mapdp_chunked(bad, bnp.DP(1.0), family, 32, chunk_size=48, block_size=16,
                                      init="one")
    with pytest.raises(ValueError, match=r"X \(subsample\) contains NaN or inf"):
        distributed.fit_mapdp_chunked(bad, bnp.DP(1.0), family, 32, chunk_size=48, block_size=16)
    with pytest.raises(ValueError, match="init must be 'subsample' or 'one'"):
        distributed.fit_mapdp_chunked(X, bnp.DP(1.0), family, 32, init="kmeans")


def test_layout_pads_without_dropping_points():
    """Every point has exactly one row; padding rows are masked; blocks are cyclic over shards."""
    for n, shards, block in ((178, 8, 16), (5, 4, 3), (1, 8, 1), (1000, 3, 100)):
        layout = sharded.make_layout(n, shards, block)
        g = layout.global_index()
        assert layout.padded_size % shards == 0 and layout.global_block >= block
        assert sorted(g[g < n].tolist()) == list(range(n))
        assert np.all(g[layout.row_of_point()] == np.arange(n))
        # global block b of the input order is spread over the shards, B points each
        first = g.reshape(shards, layout.num_blocks, layout.local_block)[:, 0, 0]
        np.testing.assert_array_equal(first, np.arange(shards) * layout.local_block)
    data = sharded.shard_data(np.arange(10.0).reshape(5, 2), sharded.make_mesh(4), sharded.make_layout(5, 4, 4))
    assert data.X.shape == (8, 2) and int(np.sum(np.asarray(data.valid))) == 5


# ----------------------------------------------------------------------------- 8 devices
def test_sharded_mapdp_has_the_one_device_nll_trajectory(eight):
    """8 shards x 2 points per block = single-device batched MAP-DP with blocks of 16 (padding included)."""
    m = eight["mapdp"]
    assert len(m["trace"]) == len(m["ref"]) >= 3 and m["num_clusters"] >= 2
    np.testing.assert_allclose(m["trace"], m["ref"], rtol=1e-12)
    assert m["same_labels"]
    assert np.all(np.diff(m["trace"]) <= 0) and m["trace"][-1] < m["trace"][0]  # monotone, and it moved


def test_sharded_gibbs_on_one_shard_is_sequential_collapsed_gibbs(eight):
    g = eight["gibbs_one_shard"]
    assert g["equal"] and g["num_clusters"] >= 2


def test_sharded_gibbs_statistics_follow_the_labels_and_new_clusters_stay_apart(eight):
    for name, c in eight["gibbs_sharded"].items():
        assert c["counts_equal"], name
        assert c["stats_err"] < 1e-9, name
        np.testing.assert_allclose(c["log_joint"], c["log_joint_from_labels"], rtol=1e-10, err_msg=name)
    assert eight["gibbs_sharded"]["dp1"]["num_clusters"] >= 2
    # every one of the 48 points opened its own cluster, on 8 shards at once: none merged
    assert eight["gibbs_sharded"]["singletons"]["num_clusters"] == 48


@pytest.mark.parametrize("kernel", ["CollapsedGibbs", "SplitMerge", "TreeGuidedMCMC"])
def test_eight_device_parallel_chains_equal_vectorized_chains(eight, kernel):
    c = eight["chains"][kernel]
    assert c["shape"] == [8, 4, 12]
    assert c["equal"]
    assert c["distinct_chains"] > 1  # the keys are really split


@pytest.mark.parametrize("measure", [bnp.DP(1.0), bnp.PitmanYor(1.0, 0.3)], ids=["DP", "PY"])
def test_a_sweep_over_some_of_the_points_counts_the_whole_state(measure):
    """The sharded samplers sweep a block's rows against the global counts and statistics
    (``assignment_sweep(..., subset=True)``): the same labels as the sweep over all the rows
    visiting those points in the same order with the same uniforms. Without ``subset`` the
    count terms came from tables over the block's ``0..n`` only (the normaliser of a
    300-point cluster read as a 30-point one's), and the labels differed."""
    from jaxbnp.inference.partition.clusters import init_clusters
    from jaxbnp.inference.partition.gibbs import assignment_sweep, step_uniforms

    rng = np.random.default_rng(0)
    X = jnp.asarray(np.r_[rng.normal(-2, 1, (150, 2)), rng.normal(2, 1, (150, 2))])
    labels = np.r_[np.zeros(150, int), np.ones(150, int)]
    labels[::7] = 2
    family = bnp.NormalWishart.from_data(np.asarray(X))
    state = init_clusters(family, X, labels, 8)
    some = jnp.arange(0, 300, 10)
    noise = step_uniforms(jax.random.key(1), some.shape[0], X.dtype)
    whole = assignment_sweep(state, X, measure, family, noise=noise, order=some)
    block = assignment_sweep(state._replace(labels=state.labels[some]), X[some], measure, family,
                             noise=noise, order=jnp.arange(some.shape[0]), subset=True)
    np.testing.assert_array_equal(np.asarray(block.labels), np.asarray(whole.labels[some]))
    np.testing.assert_array_equal(np.asarray(block.counts), np.asarray(whole.counts))
    assert int(jnp.sum(whole.labels[some] != state.labels[some])) >= 3  # the sweep moved points
