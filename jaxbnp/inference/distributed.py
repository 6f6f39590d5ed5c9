"""Scale-out helpers: multi-host start-up, meshes, and MAP-DP on data larger than device memory.

JAX is the distributed engine; this module only wires jaxbnp to it.

* :func:`initialize` is ``jax.distributed.initialize`` (one call per process,
  before any other JAX call), returning ``(process_index, process_count)``.
  After it, ``jax.devices()`` lists the devices of *all* processes, and
  :func:`make_mesh` / :func:`fit_mapdp_sharded` / :func:`gibbs_sharded`
  (:mod:`jaxbnp.inference.sharded`) run one SPMD program over all of them;
  every process calls them with the same arguments (each process cuts only
  its own devices' rows out of ``X``, so ``X`` may be a ``np.memmap``).
* :func:`fit_mapdp_chunked` fits MAP-DP when the data do not fit in device
  memory: ``X`` stays on the host (a NumPy array or ``np.memmap``), chunks of
  ``chunk_size`` points go through one jitted per-chunk batched sweep
  (``mapdp.batched_sweep``), and the cluster counts and statistics are
  carried from chunk to chunk on the device. Device memory holds two or
  three chunks and the ``capacity`` cluster statistics; the host holds the
  ``n`` labels (int32).

* :func:`fit_subcluster_chunked` runs the sub-cluster split/merge chain
  (``SubClusterMCMC``) the same way: every pass of an iteration over the points
  goes chunk by chunk and the chunks' sums are added; the per-point uniforms of a
  chunk are its rows of the whole data set's (a counter-based hash), so it is the
  in-memory chain for the same key, up to the summation order of the statistics.

Exactness of the chunked MAP-DP path: with ``chunk_size`` a multiple of
``block_size`` the chunks' blocks are exactly the blocks of
``mapdp.fit(mode="batched", block_size=block_size)`` on the same point order,
the statistics carried between chunks are the same numbers, and the
end-of-sweep statistics are rebuilt from the labels (summed chunk by chunk:
only this summation order differs, float rounding). So it is **the same
algorithm** and its NLL never increases (the block rule); tested against the
in-memory fit.

Example
-------
>>> import numpy as np, jaxbnp as bnp
>>> from jaxbnp.inference.distributed import fit_mapdp_chunked
>>> X = np.random.default_rng(0).normal(size=(10_000, 2))   # or np.load(path, mmap_mode="r")
>>> res = fit_mapdp_chunked(X, bnp.DP(1.0), bnp.NormalGamma.from_data(X), capacity=64,
...                         chunk_size=4096, block_size=1024)
>>> res.labels.shape
(10000,)
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .._validation import check_data, check_int, check_real
from .partition.clusters import CapacityError, ClusterState, cluster_log_joint
from .partition import subcluster
from .partition.mapdp import batched_sweep
from .sharded import (
    AXIS_NAME, Layout, ShardedData, ShardedGibbsResult, make_layout, make_mesh, shard_data,
)
from .sharded import fit_mapdp as fit_mapdp_sharded
from .sharded import gibbs as gibbs_sharded
from ..models.measures import Measure

__all__ = [
    "initialize",
    "make_mesh",
    "make_layout",
    "shard_data",
    "fit_mapdp_sharded",
    "gibbs_sharded",
    "fit_mapdp_chunked",
    "ChunkedMAPDPResult",
    "fit_subcluster_chunked",
    "ChunkedSubClusterResult",
    "AXIS_NAME",
    "Layout",
    "ShardedData",
    "ShardedGibbsResult",
]


def initialize(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    **kwargs: Any,
) -> tuple[int, int]:
    """Start multi-process JAX (``jax.distributed.initialize``) and return
    ``(process_index, process_count)``.

    Call it first thing in every process, e.g.
    ``initialize("10.0.0.1:1234", num_processes=2, process_id=i)``; on
    clusters that JAX detects (Slurm, TPU pods) the arguments can be left out.
    Extra keyword arguments go to ``jax.distributed.initialize``
    (``local_device_ids``, ``initialization_timeout``, ...). CPU processes talk
    through gloo (JAX's default CPU collectives), which the loopback test uses.
    """
    jax.distributed.initialize(
        coordinator_address=coordinator_address, num_processes=num_processes,
        process_id=process_id, **kwargs,
    )
    return jax.process_index(), jax.process_count()


# ----------------------------------------------------------------------------- chunked MAP-DP
class ChunkedMAPDPResult(NamedTuple):
    """Result of :func:`fit_mapdp_chunked`.

    labels: ``(n,)`` host int32 slot of each point.
    counts, stats: global cluster counts and statistics (rebuilt from the labels).
    nll: final ``−log p(X, Π)``; n_iter: sweeps run;
    nll_trace: ``(n_iter + 1,)`` NLL after each sweep (index 0: the one-cluster start).
    """

    labels: np.ndarray
    counts: jax.Array
    stats: Any
    nll: float
    n_iter: int
    nll_trace: np.ndarray


@functools.partial(jax.jit, static_argnames=("capacity",))
def _chunk_stats(Xc, labels_c, family, capacity: int):
    counts = jax.ops.segment_sum(jnp.ones(labels_c.shape[0], jnp.int32), labels_c,
                                 num_segments=capacity)
    return counts, family.stats_from_labels(Xc, labels_c, capacity)


@functools.partial(jax.jit, static_argnames=("block_size",))
def _chunk_sweep(labels_c, counts, stats, overflow, Xc, measure: Measure, family, block_size: int):
    """The batched sweep over one chunk, and the statistics of the chunk's final labels."""
    capacity = counts.shape[0]
    old = labels_c
    st = batched_sweep(ClusterState(labels_c, counts, stats, overflow), Xc, measure, family, block_size)
    chunk_counts = jax.ops.segment_sum(jnp.ones(st.labels.shape[0], jnp.int32), st.labels,
                                       num_segments=capacity)
    chunk_stats = family.stats_from_labels(Xc, st.labels, capacity)
    return st.labels, st.counts, st.stats, st.overflow, chunk_counts, chunk_stats, jnp.any(st.labels != old)


@jax.jit
def _add(a, b):
    return jax.tree.map(jnp.add, a, b)


@jax.jit
def _nll(counts, stats, measure, family):
    return -cluster_log_joint(ClusterState(None, counts, stats, None), measure, family)


def _check_host_data(X: Any) -> Any:
    if not hasattr(X, "shape") or not hasattr(X, "__getitem__"):
        X = np.asarray(X)
    if len(X.shape) != 2 or X.shape[0] == 0 or X.shape[1] == 0:
        raise ValueError(
            f"X must be a non-empty 2-D array (num_points, num_features), got shape {tuple(X.shape)}."
        )
    return X


def fit_mapdp_chunked(
    X: Any,
    measure: Measure,
    family,
    capacity: int,
    chunk_size: int = 1 << 20,
    block_size: int = 4096,
    tol: float = 1e-6,
    max_iter: int = 100,
    device: jax.Device | None = None,
) -> ChunkedMAPDPResult:
    """Batched MAP-DP streaming host data through the device chunk by chunk (module docstring).

    ``X``: ``(n, D)`` NumPy array or ``np.memmap`` (never copied whole to the
    device). ``chunk_size`` is rounded down to a multiple of ``block_size``
    (at least one block). Starts from one cluster, visits the points in index
    order and stops like ``mapdp.fit``: when a sweep lowers the NLL by less than
    ``tol`` or changes no label, or after ``max_iter`` sweeps. Every chunk is
    validated (finite, numeric, the family's constraints) in the first pass,
    before any sweep. Two jitted programs (full chunks and the last, shorter
    chunk). Raises ``CapacityError`` if the clusters outgrow ``capacity``.
    """
    X = _check_host_data(X)
    for name, v in (("capacity", capacity), ("chunk_size", chunk_size), ("block_size", block_size),
                    ("max_iter", max_iter)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {v!r}.")
    n = int(X.shape[0])
    chunk_size = max(block_size, (chunk_size // block_size) * block_size)
    bounds = [(s, min(s + chunk_size, n)) for s in range(0, n, chunk_size)]
    dtype = jnp.result_type(float)
    device = device or jax.devices()[0]

    def load(s, e, validate=False):
        chunk = np.asarray(X[s:e])
        if validate:
            chunk = check_data(chunk, name=f"X[{s}:{e}]", family=family)
        return jax.device_put(np.asarray(chunk, dtype=dtype), device)

    labels = np.zeros(n, np.int32)
    # first pass: validate every chunk and build the one-cluster statistics
    counts = stats = None
    for s, e in bounds:
        c, st = _chunk_stats(load(s, e, validate=True), jax.device_put(labels[s:e], device), family,
                             capacity)
        counts, stats = (c, st) if counts is None else _add((counts, stats), (c, st))
    nll = _nll(counts, stats, measure, family)
    trace = [float(nll)]
    overflow = jax.device_put(np.asarray(False), device)
    it = 0
    while it < max_iter:
        acc = None
        changed = []
        pending = []  # (start, end, device labels): fetched lazily, so chunks pipeline
        for s, e in bounds:
            out = _chunk_sweep(jax.device_put(labels[s:e], device), counts, stats, overflow,
                               load(s, e), measure, family, block_size)
            lab_c, counts, stats, overflow, c_counts, c_stats, ch = out
            acc = (c_counts, c_stats) if acc is None else _add(acc, (c_counts, c_stats))
            changed.append(ch)
            pending.append((s, e, lab_c))
            if len(pending) > 2:
                s0, e0, l0 = pending.pop(0)
                labels[s0:e0] = np.asarray(l0)
        for s0, e0, l0 in pending:
            labels[s0:e0] = np.asarray(l0)
        if bool(overflow):
            raise CapacityError(
                f"jaxbnp: all {capacity} cluster slots are in use and a new cluster was needed; "
                "pass a larger capacity (e.g. twice as large)."
            )
        # statistics rebuilt from the labels: the NLL is exact, not a sum of updates
        counts, stats = acc
        new_nll = float(_nll(counts, stats, measure, family))
        it += 1
        trace.append(new_nll)
        done = (nll - new_nll < tol) or not any(bool(c) for c in changed)
        nll = new_nll
        if done:
            break
    return ChunkedMAPDPResult(labels, counts, stats, float(nll), it, np.asarray(trace))


# ----------------------------------------------------------------------------- chunked sub-cluster
class ChunkedSubClusterResult(NamedTuple):
    """Result of :func:`fit_subcluster_chunked`.

    labels: ``(n,)`` host int32 cluster of each point after the last iteration, numbered
        in order of first appearance (like the kernels' ``z``).
    counts: ``(K,)`` points per cluster, in the same order.
    num_clusters, log_joint, num_splits, num_merges: ``(num_iterations,)`` traces: the
        number of clusters, ``log p(X, Π)`` (docs/mathematics.md §2), accepted splits and
        merges after each iteration.
    capacity: the cluster slots the chain ran with.
    """

    labels: np.ndarray
    counts: np.ndarray
    num_clusters: np.ndarray
    log_joint: np.ndarray
    num_splits: np.ndarray
    num_merges: np.ndarray
    capacity: int


def _chunk_noise(k_noise, start, size, T, dtype):
    return subcluster.point_noise(k_noise, size, T, dtype, start=start)


def _rng(k_iter, family, stats, T, dtype):
    C = jax.tree.leaves(stats)[0].shape[0]
    return subcluster._IterationRandomness(k_iter, family, stats, C, T, dtype)


@functools.partial(jax.jit, static_argnames=("T",))
def _sc_label_draws(k_iter, counts, stats, measure, family, T):
    dtype = jax.tree.leaves(stats)[0].dtype
    return subcluster._label_draws(_rng(k_iter, family, stats, T, dtype), measure, family, counts,
                                   stats, dtype)


@functools.partial(jax.jit, static_argnames=("T",))
def _sc_propose(Xc, valid, labels_c, start, k_noise, log_w, params, family, T):
    noise = _chunk_noise(k_noise, start, Xc.shape[0], T, Xc.dtype)
    return subcluster._propose_labels(Xc, noise, valid, labels_c, log_w, params, family, T)


@functools.partial(jax.jit, static_argnames=("T",))
def _sc_accept(k_iter, counts, stats, a, delta, measure, family, T):
    dtype = jax.tree.leaves(stats)[0].dtype
    rng = _rng(k_iter, family, stats, T, dtype)
    counts, block_ok = subcluster._accept_blocks(rng, measure, counts, a, delta)
    return counts, block_ok, subcluster._pairing(rng, counts.shape[0])


@functools.partial(jax.jit, static_argnames=("T",))
def _sc_apply_labels(Xc, valid, labels_c, start, k_noise, log_w, params, block_ok, pairs, family, T):
    noise = _chunk_noise(k_noise, start, Xc.shape[0], T, Xc.dtype)
    proposal, block, _ = subcluster._propose_labels(Xc, noise, valid, labels_c, log_w, params,
                                                    family, T)
    labels_c = jnp.where(block_ok[block], proposal, labels_c)
    pp = subcluster._point_pairs(labels_c, valid, pairs)
    return (labels_c,) + subcluster._anchor_range(noise, pp, pairs.a_slot.shape[0])


def _anchor_roles(Xc, valid, labels_c, start, k_noise, pairs, lo, hi, T):
    noise = _chunk_noise(k_noise, start, Xc.shape[0], T, Xc.dtype)
    pp = subcluster._point_pairs(labels_c, valid, pairs)
    return noise, pp, subcluster._anchors(noise, pp, lo, hi)


def _sums(Xc, ids, num, family):
    return subcluster._segment_stats(family.point_stats(Xc), ids, num, None)


@functools.partial(jax.jit, static_argnames=("T",))
def _sc_anchor_stats(Xc, valid, labels_c, start, k_noise, pairs, lo, hi, family, T):
    _, pp, anchor = _anchor_roles(Xc, valid, labels_c, start, k_noise, pairs, lo, hi, T)
    C = pairs.pair.shape[0]
    return _sums(Xc, subcluster._anchor_sub_ids(anchor, pp, C), C, family)[1]


@functools.partial(jax.jit, static_argnames=("T",))
def _sc_anchor_params(k_iter, stats, anchor_stats, family, T):
    rng = _rng(k_iter, family, stats, T, jax.tree.leaves(stats)[0].dtype)
    return family.sample_params_from_uniform(rng.anchor, anchor_stats, rng.k_anchor)


@functools.partial(jax.jit, static_argnames=("T",))
def _sc_first_sub_stats(Xc, valid, labels_c, start, k_noise, pairs, lo, hi, anchor_params, family, T):
    _, pp, anchor = _anchor_roles(Xc, valid, labels_c, start, k_noise, pairs, lo, hi, T)
    h = subcluster._first_sub_labels(Xc, anchor, pp, anchor_params, family)
    C = pairs.pair.shape[0]
    return _sums(Xc, subcluster._sub_ids(h, pp, C), C, family)


@functools.partial(jax.jit, static_argnames=("T",))
def _sc_sub_stats(Xc, valid, labels_c, start, k_noise, pairs, t, sub_lw, sub_params, family, T):
    """Sums of the sub-labels of launch sweep ``t`` (drawn from step ``t - 1``'s parameters)."""
    noise = _chunk_noise(k_noise, start, Xc.shape[0], T, Xc.dtype)
    pp = subcluster._point_pairs(labels_c, valid, pairs)
    u = lax.dynamic_index_in_dim(noise, 1 + t, axis=1, keepdims=False)
    h = subcluster._draw(subcluster._sub_logit(Xc, pp, sub_lw, sub_params, family), u)
    C = pairs.pair.shape[0]
    return _sums(Xc, subcluster._sub_ids(h, pp, C), C, family)


@functools.partial(jax.jit, static_argnames=("T",))
def _sc_launch(k_iter, t, stats, sub_counts, sub_stats, family, T):
    dtype = jax.tree.leaves(stats)[0].dtype
    rng = _rng(k_iter, family, stats, T, dtype)
    return subcluster._launch_draw(rng, t, family, sub_counts, sub_stats, dtype)


def _sides(Xc, valid, labels_c, start, k_noise, pairs, split_pair, sub_lw, sub_params, sharpness,
           family, T):
    noise = _chunk_noise(k_noise, start, Xc.shape[0], T, Xc.dtype)
    pp = subcluster._point_pairs(labels_c, valid, pairs)
    logit = subcluster._sub_logit(Xc, pp, sub_lw, sub_params, family)
    _, side, t1, t2 = subcluster._split_proposal(logit, noise, labels_c, pp, split_pair,
                                                 pairs.a_slot, sharpness, T)
    return pp, side, t1, t2


@functools.partial(jax.jit, static_argnames=("T",))
def _sc_split_sums(Xc, valid, labels_c, start, k_noise, pairs, split_pair, sub_lw, sub_params,
                   sharpness, family, T):
    pp, side, t1, t2 = _sides(Xc, valid, labels_c, start, k_noise, pairs, split_pair, sub_lw,
                              sub_params, sharpness, family, T)
    C = pairs.pair.shape[0]
    P = pairs.a_slot.shape[0]
    parts = _sums(Xc, jnp.where(pp.in_pair, 2 * pp.pid + side, C), 2 * P, family)
    return t1, t2, parts


@functools.partial(jax.jit, static_argnames=("T",))
def _sc_decide(k_iter, counts, stats, pairs, split_pair, merge_pair, t1, t2, part_counts,
               part_stats, measure, family, T):
    dtype = jax.tree.leaves(stats)[0].dtype
    rng = _rng(k_iter, family, stats, T, dtype)
    return subcluster._decide_pairs(rng, measure, family, counts, pairs, split_pair, merge_pair,
                                    t1, t2, part_counts, part_stats, dtype)


@functools.partial(jax.jit, static_argnames=("T",))
def _sc_move(Xc, valid, labels_c, start, k_noise, pairs, split_pair, sub_lw, sub_params, sharpness,
             acc_split, acc_merge, l_slot, r_slot, family, T):
    pp, side, _, _ = _sides(Xc, valid, labels_c, start, k_noise, pairs, split_pair, sub_lw,
                            sub_params, sharpness, family, T)
    labels_c = subcluster._moved_labels(labels_c, side, pp, acc_split, acc_merge, l_slot, r_slot)
    C = pairs.pair.shape[0]
    return (labels_c,) + _sums(Xc, jnp.where(valid, labels_c, C), C, family)


@jax.jit
def _sc_split_kinds(counts, pairs):
    return subcluster._split_kinds(counts, pairs)


@functools.partial(jax.jit, static_argnames=("capacity",))
def _sc_stats(Xc, valid, labels_c, family, capacity):
    return _sums(Xc, jnp.where(valid, labels_c, capacity), capacity, family)


def fit_subcluster_chunked(
    X: Any,
    measure: Measure,
    family,
    num_iterations: int,
    *,
    key: jax.Array,
    capacity: int = 64,
    chunk_size: int = 1 << 20,
    num_launch_sweeps: int = 3,
    sharpness: float = subcluster.DEFAULT_SHARPNESS,
    init_labels: Any = None,
    device: jax.Device | None = None,
) -> ChunkedSubClusterResult:
    """The sub-cluster split/merge chain (``SubClusterMCMC``, docs/mathematics.md §7) on data
    kept in host memory, streamed through the device chunk by chunk.

    ``X``: ``(n, D)`` NumPy array or ``np.memmap`` (never copied whole to the device).
    Every sum over points that an iteration needs is summed chunk by chunk
    (``num_launch_sweeps + 6`` passes over the data per iteration) and every per-point
    draw comes from the same per-point uniforms
    (:func:`~jaxbnp.inference.partition.subcluster.point_noise`), so for the same ``key``
    this is the chain of :func:`~jaxbnp.inference.partition.subcluster.step` iterated
    ``num_iterations`` times with keys ``jax.random.split(key, num_iterations)``, up to
    the summation order of the statistics (float rounding). Device memory holds one chunk
    and its per-point work; the labels (``4 n`` bytes) stay on the device.

    The points are cut into ``ceil(n / chunk_size)`` chunks of equal size (the last one
    padded by a few masked rows), so every pass is one compiled program. Starts from one cluster, or
    from ``init_labels`` (``n`` integers in ``[0, capacity)``). DP and PitmanYor only.
    Every chunk is validated (finite, numeric, the family's constraints) in a first pass
    before any iteration. Raises ``CapacityError`` as soon as every slot is in use (the
    chain could not split any more): pass a larger ``capacity``.
    """
    X = _check_host_data(X)
    subcluster.check_measure(measure, owner="fit_subcluster_chunked")
    for name, v in (("capacity", capacity), ("chunk_size", chunk_size),
                    ("num_iterations", num_iterations)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {v!r}.")
    if capacity < 2:
        raise ValueError(f"capacity must be >= 2 (a split needs two slots), got {capacity}.")
    T = check_int("num_launch_sweeps", num_launch_sweeps, 0)
    sharpness = check_real("sharpness", sharpness, 0.0)
    if sharpness == 0.0:
        raise ValueError("sharpness must be > 0 (0 would propose every split alike), got 0.")
    n, C = int(X.shape[0]), int(capacity)
    num_chunks = -(-n // int(chunk_size))
    chunk_size = -(-n // num_chunks)  # equal chunks: the last one pads at most num_chunks - 1 rows
    bounds = [(s, min(s + chunk_size, n)) for s in range(0, n, chunk_size)]
    dtype = jnp.result_type(float)
    device = device or jax.devices()[0]
    if init_labels is None:
        host_labels = np.zeros(n, np.int32)
    else:
        host_labels = np.asarray(init_labels)
        if (host_labels.shape != (n,) or not np.issubdtype(host_labels.dtype, np.integer)
                or host_labels.min() < 0 or host_labels.max() >= C):
            raise ValueError(
                f"init_labels must be {n} integers in [0, {C}), got shape {host_labels.shape}, "
                f"dtype {host_labels.dtype}.")

    def put(a):
        return jax.device_put(a, device)

    def padded(a, size):
        pad = size - a.shape[0]
        return a if pad == 0 else np.pad(a, [(0, pad)] + [(0, 0)] * (a.ndim - 1), mode="edge")

    def load(s, e, validate=False):
        chunk = np.asarray(X[s:e])
        if validate:
            chunk = check_data(chunk, name=f"X[{s}:{e}]", family=family)
        return put(padded(np.asarray(chunk, dtype=dtype), chunk_size))

    valid = [put(np.arange(s, s + chunk_size) < e) for s, e in bounds]
    starts = [put(np.int32(s)) for s, _ in bounds]
    labels = [put(padded(host_labels[s:e].astype(np.int32), chunk_size)) for s, e in bounds]

    def total(parts):
        out = parts[0]
        for p in parts[1:]:
            out = _add(out, p)
        return out

    def each(fn, *args):
        """``fn(X_chunk, valid, labels, start, *args)`` over the chunks."""
        return [fn(load(s, e), valid[i], labels[i], starts[i], *args)
                for i, (s, e) in enumerate(bounds)]

    counts, stats = total([_sc_stats(load(s, e, validate=True), valid[i], labels[i], family, C)
                           for i, (s, e) in enumerate(bounds)])
    keys = jax.random.split(key, num_iterations)
    trace = {f: [] for f in ("num_clusters", "log_joint", "num_splits", "num_merges")}
    for it in range(num_iterations):
        k_noise, k_iter = jax.random.split(keys[it])
        # 1. labels
        a, log_w, params = _sc_label_draws(k_iter, counts, stats, measure, family, T)
        delta = total([out[2] for out in each(_sc_propose, k_noise, log_w, params, family, T)])
        counts_l, block_ok, pairs = _sc_accept(k_iter, counts, stats, a, delta, measure, family, T)
        applied = each(_sc_apply_labels, k_noise, log_w, params, block_ok, pairs, family, T)
        labels = [out[0] for out in applied]
        lo = functools.reduce(jnp.minimum, [out[1] for out in applied])
        hi = functools.reduce(jnp.maximum, [out[2] for out in applied])
        # 2. the launch: anchors, then num_launch_sweeps restricted Gibbs sweeps
        anchor_stats = total(each(_sc_anchor_stats, k_noise, pairs, lo, hi, family, T))
        anchor_params = _sc_anchor_params(k_iter, stats, anchor_stats, family, T)
        sub = total(each(_sc_first_sub_stats, k_noise, pairs, lo, hi, anchor_params, family, T))
        sub_lw, sub_params = _sc_launch(k_iter, 0, stats, *sub, family, T)
        for t in range(1, T + 1):
            sub = total(each(_sc_sub_stats, k_noise, pairs, t, sub_lw, sub_params, family, T))
            sub_lw, sub_params = _sc_launch(k_iter, t, stats, *sub, family, T)
        # 3. split and merge proposals, decided pair by pair
        split_pair, merge_pair = _sc_split_kinds(counts_l, pairs)
        t1, t2, (part_counts, part_stats) = total(each(
            _sc_split_sums, k_noise, pairs, split_pair, sub_lw, sub_params, sharpness, family, T))
        acc, _, _, l_slot, r_slot = _sc_decide(k_iter, counts_l, stats, pairs, split_pair,
                                               merge_pair, t1, t2, part_counts, part_stats,
                                               measure, family, T)
        moved = each(_sc_move, k_noise, pairs, split_pair, sub_lw, sub_params, sharpness,
                     acc & split_pair, acc & merge_pair, l_slot, r_slot, family, T)
        labels = [out[0] for out in moved]
        counts, stats = total([out[1:] for out in moved])
        num_clusters = int(jnp.sum(counts > 0))
        trace["num_clusters"].append(num_clusters)
        trace["log_joint"].append(float(-_nll(counts, stats, measure, family)))
        trace["num_splits"].append(int(jnp.sum(acc & split_pair)))
        trace["num_merges"].append(int(jnp.sum(acc & merge_pair)))
        if num_clusters >= C and C < n:
            raise CapacityError(
                f"jaxbnp: all {C} cluster slots are in use after iteration {it + 1}, so the chain "
                f"could not split any more; pass a larger capacity (e.g. {2 * C}).")
    slots = np.concatenate([np.asarray(lab)[:e - s] for lab, (s, e) in zip(labels, bounds)])
    _, first, inverse = np.unique(slots, return_index=True, return_inverse=True)
    order = np.argsort(first)
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    canonical = rank[inverse].astype(np.int32)
    return ChunkedSubClusterResult(
        canonical, np.bincount(canonical).astype(np.int64),
        *(np.asarray(trace[f]) for f in ("num_clusters", "log_joint", "num_splits", "num_merges")),
        C)
