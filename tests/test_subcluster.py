"""SubClusterMCMC (docs/mathematics.md §7): a sharded run is the single-device chain, the
same key gives the same draws under every chain method, one compilation serves new
states, bad input fails before compiling, a full capacity raises or grows, and the
samples have the kernels' form. The exactness checks (enumeration) are in
``tests/exact/test_subcluster_exact.py``.

Two processes joined by ``jax.distributed`` over loopback, the points sharded over both
processes' devices, give the same draws too.

The 8-device check runs in a subprocess (``XLA_FLAGS=--xla_force_host_platform_device_count=8``,
float64; the main test process has 4 host devices), started when the module's first
test starts so that it compiles while the other tests run; it prints one JSON object.
"""

from __future__ import annotations

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import pytest
from numpyro.infer import MCMC

import jaxbnp as bnp
from jaxbnp.inference.partition import cleanup, subcluster
from jaxbnp.inference.runner import run

from .device_scripts import background_fixture, run_processes
from .test_kernel import NG, _data, dp_model, nggp_model

EXTRA = ("log_joint", "num_clusters", "num_accepted", "num_proposed", "mean_log_accept")

EIGHT_DEVICES = r'''
import json
import jax, jax.numpy as jnp, numpy as np, numpyro
from numpyro.infer import MCMC
import jaxbnp as bnp
from jaxbnp.inference import sharded
from jaxbnp.inference.partition import subcluster
assert jax.device_count() == 8 and jnp.zeros(()).dtype == jnp.float64
n, C, T = 203, 16, 3  # 203 points: 8 shards of 26 rows, 5 of them padding
rng = np.random.default_rng(0)
centres = np.array([[-4.0, 0.0], [0.0, 4.0], [4.0, 0.0]])
X = jnp.asarray(centres[np.arange(n) % 3] + rng.normal(size=(n, 2)))
family = bnp.NormalGamma(np.zeros(2), 0.1, 2.0, np.ones(2))
measure = bnp.DP(1.0)
mesh = sharded.make_mesh()
static = ("capacity", "num_launch_sweeps", "num_absorb_moves", "num_reassign_moves")
moves = dict(num_absorb_moves=2, num_reassign_moves=8)  # the cleanup moves sharded too (§7)
one = jax.jit(subcluster.iteration, static_argnames=static)
many = jax.jit(subcluster.sharded_iteration(mesh), static_argnames=static)
valid = jnp.ones(n, bool)
a = b = jnp.zeros(n, jnp.int32)
iterations = []
for t in range(20):
    k_noise, k_iter = jax.random.split(jax.random.key(t))
    noise = subcluster.point_noise(k_noise, n, T, X.dtype)
    a, ca, _, _, ia = one(k_iter, noise, X, valid, a, measure, family, capacity=C, num_launch_sweeps=T, **moves)
    b, cb, _, _, ib = many(k_iter, noise, X, valid, b, measure, family, capacity=C, num_launch_sweeps=T, **moves)
    iterations.append(dict(
        same_labels=bool(np.array_equal(np.asarray(a), np.asarray(b))),
        same_counts=bool(np.array_equal(np.asarray(ca), np.asarray(cb))),
        same_info=[int(ia.num_splits), int(ia.num_merges), int(ia.mh.num_proposed), bool(ia.labels_accepted),
                   int(ia.num_absorbs)]
        == [int(ib.num_splits), int(ib.num_merges), int(ib.mh.num_proposed), bool(ib.labels_accepted),
            int(ib.num_absorbs)],
        num_clusters=int(np.sum(np.asarray(ca) > 0)), num_splits=int(ia.num_splits),
        num_merges=int(ia.num_merges)))

def model(X):
    z = numpyro.sample("z", bnp.Partition(measure, X.shape[0]))
    numpyro.sample("X", bnp.ConjugateMixture(family, z), obs=X)

kernel = {}
for name, m in (("one", None), ("mesh", mesh)):
    mc = MCMC(bnp.SubClusterMCMC(model, capacity=C, mesh=m), num_warmup=5, num_samples=10, progress_bar=False)
    mc.run(jax.random.key(3), X, extra_fields=("num_accepted", "num_proposed", "num_clusters"))
    kernel[name] = dict(z=np.asarray(mc.get_samples()["z"]).tolist(),
                        **{f: np.asarray(v).tolist() for f, v in mc.get_extra_fields().items()})
print("JSON" + json.dumps(dict(iterations=iterations, kernel=kernel)))
'''


_eight_device_run = background_fixture(EIGHT_DEVICES)

# two processes x 2 host devices over loopback jax.distributed: the kernel of EIGHT_DEVICES
# (same data, model, key and lengths) on a mesh spanning both processes
LOOPBACK = r'''
import json, sys
pid, port = int(sys.argv[1]), int(sys.argv[2])
from jaxbnp.inference import distributed
index, count = distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=pid)
import jax, jax.numpy as jnp, numpy as np, numpyro
from numpyro.infer import MCMC
import jaxbnp as bnp
from jaxbnp.inference import sharded
n, C = 203, 16
rng = np.random.default_rng(0)
centres = np.array([[-4.0, 0.0], [0.0, 4.0], [4.0, 0.0]])
X = jnp.asarray(centres[np.arange(n) % 3] + rng.normal(size=(n, 2)))
family = bnp.NormalGamma(np.zeros(2), 0.1, 2.0, np.ones(2))

def model(X):
    z = numpyro.sample("z", bnp.Partition(bnp.DP(1.0), X.shape[0]))
    numpyro.sample("X", bnp.ConjugateMixture(family, z), obs=X)

mesh = sharded.make_mesh()
mc = MCMC(bnp.SubClusterMCMC(model, capacity=C, mesh=mesh), num_warmup=5, num_samples=10,
          progress_bar=False)
mc.run(jax.random.key(3), X)
print("JSON" + json.dumps(dict(index=index, count=count, devices=jax.device_count(),
                               local_devices=jax.local_device_count(),
                               z=np.asarray(mc.get_samples()["z"]).tolist())), flush=True)
jax.distributed.shutdown()
'''


@functools.cache
def _mcmc(chain_method, chain_batching="auto"):
    mcmc = MCMC(
        bnp.SubClusterMCMC(dp_model, chain_batching=chain_batching), num_warmup=5, num_samples=20,
        num_chains=2, chain_method=chain_method, progress_bar=False,
    )
    mcmc.run(jax.random.key(42), _data(), extra_fields=EXTRA)
    return mcmc


# ----------------------------------------------------------------------------- sharded
def test_sharded_iterations_equal_the_single_device_chain(_eight_device_run):
    """20 iterations on 203 points over 8 devices: the same labels, counts and decisions as
    on one device, every iteration, and the chain really splits."""
    iterations = _eight_device_run.result["iterations"]
    assert len(iterations) == 20
    for t, it in enumerate(iterations):
        assert it["same_labels"] and it["same_counts"] and it["same_info"], (t, it)
    assert sum(it["num_splits"] for it in iterations) >= 2
    assert iterations[-1]["num_clusters"] >= 3


def test_sharded_kernel_gives_the_single_device_draws(_eight_device_run):
    kernel = _eight_device_run.result["kernel"]
    assert set(kernel["mesh"]) == set(kernel["one"]) >= {"z", "num_accepted", "num_proposed"}
    for field, value in kernel["one"].items():
        assert kernel["mesh"][field] == value, field
    assert np.asarray(kernel["one"]["z"]).shape == (10, 203)
    assert max(kernel["one"]["num_clusters"]) >= 3


def test_two_processes_give_the_single_device_draws(_eight_device_run):
    """jax.distributed over loopback (gloo): 2 processes x 2 host devices, the points sharded
    over all 4, give every process the single-device chain's draws."""
    outs = run_processes(LOOPBACK)
    want = _eight_device_run.result["kernel"]["one"]["z"]
    for i, o in enumerate(outs):
        assert (o["index"], o["count"], o["devices"], o["local_devices"]) == (i, 2, 4, 2)
        assert o["z"] == want


# ----------------------------------------------------------------------------- draws
def test_chain_methods_give_identical_draws():
    ref = _mcmc("vectorized")
    want = ref.get_samples(group_by_chain=True)
    want_extra = ref.get_extra_fields(group_by_chain=True)
    assert want["z"].shape == (2, 20, 12)
    for method, batching in (("sequential", "auto"), ("parallel", "auto"), ("vectorized", "vmap")):
        other = _mcmc(method, batching)
        np.testing.assert_array_equal(other.get_samples(group_by_chain=True)["z"], want["z"],
                                      err_msg=method)
        for field in EXTRA:
            np.testing.assert_array_equal(other.get_extra_fields(group_by_chain=True)[field],
                                          want_extra[field], err_msg=f"{method} {field}")
    # the chains differ (the keys are split)
    assert not np.array_equal(want["z"][0], want["z"][1])


def test_samples_are_canonical_with_the_kernels_extra_fields():
    mcmc = _mcmc("vectorized")
    z = np.asarray(mcmc.get_samples()["z"])
    extra = mcmc.get_extra_fields()
    assert z.dtype == np.int32 and set(extra) == set(EXTRA)
    for row in z:  # first-appearance order: each new label is one more than the largest so far
        seen = np.maximum.accumulate(row)
        assert row[0] == 0 and np.all(row <= np.r_[0, seen[:-1] + 1])
    np.testing.assert_array_equal(extra["num_clusters"], [len(np.unique(r)) for r in z])
    for i in (0, 13, 39):
        np.testing.assert_allclose(extra["log_joint"][i], bnp.log_joint(_data(), z[i], bnp.DP(1.0), NG),
                                   rtol=1e-10)
    accepted, proposed = np.asarray(extra["num_accepted"]), np.asarray(extra["num_proposed"])
    assert accepted.dtype == proposed.dtype == np.int32
    assert np.all(accepted <= proposed) and proposed.sum() > 0
    assert np.all(np.asarray(extra["mean_log_accept"]) <= 0.0)


# ----------------------------------------------------------------------------- compilation
def test_step_compiles_once_for_new_keys_labels_and_hyperparameters():
    X = jnp.asarray(_data())

    @jax.jit
    @chex.assert_max_traces(n=1)
    def step(key, labels, alpha):
        return subcluster.step(key, labels, X, bnp.DP(alpha), NG, capacity=8)

    labels = jnp.zeros(X.shape[0], jnp.int32)
    for i in range(4):
        labels, _, _ = step(jax.random.key(i), labels, jnp.asarray(0.5 + i))
    assert labels.dtype == jnp.int32
    assert 1 <= len(np.unique(np.asarray(labels))) <= 8


# ----------------------------------------------------------------------------- errors
def test_nggp_is_refused_before_anything_compiles(monkeypatch):
    traced = []
    original = subcluster.iteration
    monkeypatch.setattr(subcluster, "iteration", lambda *a, **k: traced.append(1) or original(*a, **k))
    mcmc = MCMC(bnp.SubClusterMCMC(nggp_model), num_warmup=2, num_samples=2, progress_bar=False)
    with pytest.raises(ValueError, match="SubClusterMCMC supports DP and PitmanYor"):
        mcmc.run(jax.random.key(0), _data())
    assert not traced  # refused while reading the model, before the iteration is traced
    with pytest.raises(ValueError, match="NGGP"):
        subcluster.check_measure(bnp.NGGP(1.0, 0.3))


@pytest.mark.parametrize("value", [-1, 1.5, "a", True, None])
def test_bad_num_launch_sweeps(value):
    with pytest.raises(ValueError, match="num_launch_sweeps must be an integer >= 0"):
        bnp.SubClusterMCMC(dp_model, num_launch_sweeps=value)
    with pytest.raises(ValueError, match="num_launch_sweeps"):
        subcluster.subcluster_move(num_launch_sweeps=value)


def test_bad_kernel_arguments():
    for kwargs in ({"capacity": 0}, {"init_strategy": "random"}, {"chain_batching": "pmap"}):
        with pytest.raises(ValueError):
            bnp.SubClusterMCMC(dp_model, **kwargs)
    bnp.SubClusterMCMC(dp_model, num_launch_sweeps=0)  # random launches are allowed


# ----------------------------------------------------------------------------- capacity
def _blobs():
    """3 well-separated groups of 10 points: the posterior has 3 clusters."""
    rng = np.random.default_rng(0)
    centres = np.array([[-6.0, 0.0], [6.0, 0.0], [0.0, 8.0]])
    return np.repeat(centres, 10, axis=0) + 0.5 * rng.normal(size=(30, 2))


BLOB_FAMILY = bnp.NormalGamma(m0=np.zeros(2), k0=0.01, a0=2.0, b0=np.full(2, 0.5))


def blob_model(X):
    z = numpyro.sample("z", bnp.Partition(bnp.DP(1.0), X.shape[0]))
    numpyro.sample("X", bnp.ConjugateMixture(BLOB_FAMILY, z), obs=X)


def _collect(state):
    return {"z": state.z["z"], "num_clusters": state.num_clusters}


def test_full_capacity_raises_then_grows_under_the_runner():
    """Every slot in use (2 slots, the chain splits off a second group at once) is an error
    under MCMC; the runner restarts with twice the slots until the clusters fit."""
    X = _blobs()
    mcmc = MCMC(bnp.SubClusterMCMC(blob_model, capacity=2), num_warmup=10, num_samples=5,
                progress_bar=False)
    with pytest.raises(Exception, match="all 2 cluster slots are in use"):
        mcmc.run(jax.random.key(0), X)
    restarts = []
    result = run(lambda capacity: bnp.SubClusterMCMC(blob_model, capacity=capacity), jax.random.key(0),
                 (X,), num_warmup=30, num_samples=5, collect=_collect, capacity=2, max_capacity=30,
                 on_restart=restarts.append)
    assert restarts[0] == 4 and result.capacity == restarts[-1]
    k = result.samples["num_clusters"]
    assert k.max() < result.capacity and k.min() >= 3
    for z in result.samples["z"].reshape(-1, X.shape[0]):  # the three groups, each whole
        assert len({tuple(np.unique(z[g * 10:(g + 1) * 10])) for g in range(3)}) == 3


@pytest.mark.parametrize("family", [NG, bnp.NormalWishart(np.zeros(3), 0.5, 5.0, np.eye(3)),
                                    bnp.NormalWishart(np.zeros(10), 0.5, 14.0, np.eye(10)),
                                    bnp.BetaBernoulli()],
                         ids=["NormalGamma", "NormalWishart", "NormalWishart-D10", "BetaBernoulli"])
def test_one_component_log_likelihood_is_a_column_of_the_matrix(family):
    """The absorb move's one-component log-likelihood (the Gaussian families' direct form:
    written out column by column up to ``cleanup.SMALL_D`` dimensions, a matrix product
    beyond) equals the column of ``family.log_likelihood``; and its weighted sums of the
    points' statistics (written out up to ``cleanup.TINY_D`` dimensions) are the family's
    statistics of the weighted points."""
    d = jax.tree.leaves(family)[0].shape[-1] if isinstance(family, bnp.NormalWishart) else 3
    assert 2 <= cleanup.TINY_D and 3 <= cleanup.SMALL_D < 10  # both paths of both functions are run
    rng = np.random.default_rng(3)
    X = rng.normal(size=(40, d)) if not isinstance(family, bnp.BetaBernoulli) else \
        (rng.random((40, d)) < 0.4).astype(float)
    stats = family.stats_from_labels(jnp.asarray(X), jnp.asarray(np.arange(40) % 4), 4)
    params = family.sample_params(jax.random.key(1), stats)
    full = np.asarray(family.log_likelihood(jnp.asarray(X), params))
    for k in range(4):
        one = cleanup.log_likelihood_one(family, X, jax.tree.map(lambda a, k=k: a[k], params))
        np.testing.assert_allclose(np.asarray(one), full[:, k], rtol=1e-9, atol=1e-9)
    if isinstance(family, bnp.NormalWishart):
        w = rng.random(40)
        for cols in (2, d):  # 2: written out; d = 10: the matrix product
            got = cleanup._weighted_sum(jnp.asarray(X[:, :cols]), None, type(family.point_stats(X[:1])),
                                        jnp.asarray(w), None)
            np.testing.assert_allclose(np.asarray(got.sum_xx), (X[:, :cols] * w[:, None]).T @ X[:, :cols],
                                       rtol=1e-12)
            np.testing.assert_allclose(np.asarray(got.sum_x), w @ X[:, :cols], rtol=1e-12)
            np.testing.assert_allclose(float(got.n), w.sum(), rtol=1e-12)
