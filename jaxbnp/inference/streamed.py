"""The streamed drivers: samplers and fits over data larger than device memory, in one place.

``X`` stays on the host (a NumPy array or ``np.memmap``); chunks of ``chunk_size`` points go
through jitted per-chunk programs, and the cluster counts and statistics are carried from
chunk to chunk on the device. Device memory holds a few chunks and the ``capacity`` cluster
statistics; the host holds the ``n`` labels (int32).

* :func:`fit_mapdp_chunked`: MAP-DP (``mapdp.batched_sweep`` chunk by chunk). With
  ``chunk_size`` a multiple of ``block_size`` the chunks' blocks are exactly the blocks of
  ``mapdp.fit(mode="batched", block_size=block_size)`` on the same point order, the
  statistics carried between chunks are the same numbers, and the end-of-sweep statistics
  are rebuilt from the labels (summed chunk by chunk: only this summation order differs,
  float rounding). So it is **the same algorithm** and its NLL never increases (the block
  rule); tested against the in-memory fit.
* :func:`fit_subcluster_chunked`: the sub-cluster split/merge chain (``SubClusterMCMC``,
  :mod:`jaxbnp.inference.partition.subcluster`'s building blocks): every pass of an
  iteration over the points goes chunk by chunk and the chunks' sums are added; the
  per-point uniforms of a chunk are its rows of the whole data set's (a counter-based hash),
  so it is the in-memory chain for the same key, up to the summation order of the
  statistics.

Both are re-exported by :mod:`jaxbnp.inference.distributed` and the package
(``bnp.fit_mapdp_chunked``, ``bnp.fit_subcluster_chunked``).

Example
-------
>>> import numpy as np, jaxbnp as bnp
>>> from jaxbnp.inference.streamed import fit_mapdp_chunked
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

from .._pytree import tree_add
from .._validation import check_data, check_host_array, check_int, check_real
from ..models.measures import Measure
from .partition.clusters import CapacityError, ClusterState, compact_labels, log_joint_of_sums
from .partition.mapdp import batched_sweep, seed_labels
from .partition.mapdp import fit as mapdp_fit
from .partition.subcluster import (
    DEFAULT_SHARPNESS, IterationRandomness, accept_blocks, anchor_range, anchor_sub_ids,
    anchors, check_measure, decide_pairs, draw, first_sub_labels, label_draws, launch_draw,
    moved_labels, pairing, point_noise, point_pairs, propose_labels, segment_stats, split_kinds,
    split_proposal, sub_ids, sub_logit,
)

__all__ = ["fit_mapdp_chunked", "ChunkedMAPDPResult", "fit_subcluster_chunked", "ChunkedSubClusterResult"]


# ----------------------------------------------------------------------------- MAP-DP
class ChunkedMAPDPResult(NamedTuple):
    """Result of :func:`fit_mapdp_chunked`.

    labels: ``(n,)`` host int32 slot of each point.
    counts, stats: global cluster counts and statistics (rebuilt from the labels).
    nll: final ``−log p(X, Π)``; n_iter: sweeps run;
    nll_trace: ``(n_iter + 1,)`` NLL after each sweep (index 0: the start).
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
def _chunk_seed(Xc, seed: ClusterState, measure: Measure, family, block_size: int):
    """Each point of the chunk in the cluster of ``seed`` (a subsample's fit) with the largest
    MAP-DP weight ``log N_k + log p(x | X_k)`` (``mapdp.predict_log_weights``), ``block_size``
    points at a time, and the chunk's counts and statistics."""

    labels_c = seed_labels(Xc, seed, measure, family, block_size)
    chunk_counts, chunk_stats = _chunk_stats(Xc, labels_c, family, seed.counts.shape[0])
    return labels_c, chunk_counts, chunk_stats


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
    init: str = "subsample",
    init_size: int = 1 << 16,
    random_state: int = 0,
) -> ChunkedMAPDPResult:
    """Batched MAP-DP streaming host data through the device chunk by chunk (module docstring).

    ``X``: ``(n, D)`` NumPy array or ``np.memmap`` (never copied whole to the
    device). ``chunk_size`` is rounded down to a multiple of ``block_size``
    (at least one block). Visits the points in index order and stops like
    ``mapdp.fit``: when a sweep lowers the NLL by less than ``tol`` or changes no
    label, or after ``max_iter`` sweeps. Every chunk is validated (finite, numeric,
    the family's constraints) in the first pass, before any sweep. Raises
    ``CapacityError`` if the clusters outgrow ``capacity``.

    ``init``: where the sweeps start.

    * ``"subsample"`` (default): MAP-DP with ``MAPDP()``'s moves (k-means++ start of
      32 clusters, merge and split rounds, batched sweeps; ``mapdp.fit``) on
      ``init_size`` points drawn without replacement with ``random_state``; then every
      point goes to the cluster of that fit with the largest ``log N_k + log p(x | X_k)``
      (a pass over the chunks, which also validates them). The sweeps over all points
      start from there. The streamed sweeps have no split or merge moves of their own:
      the subsample fit finds the clusters, the sweeps settle every point.
    * ``"one"``: every point in one cluster (the paper's start; with it this function is
      ``mapdp.fit(mode="batched")`` run chunk by chunk).

    The NLL never increases from the start on (``nll_trace[0]`` is the start's).
    """
    X = check_host_array(X)
    capacity, chunk_size, block_size, max_iter, init_size = (
        check_int(name, v, 1) for name, v in (("capacity", capacity), ("chunk_size", chunk_size),
                                              ("block_size", block_size), ("max_iter", max_iter),
                                              ("init_size", init_size)))
    if init not in ("subsample", "one"):
        raise ValueError(f"fit_mapdp_chunked: init must be 'subsample' or 'one', got {init!r}.")
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
    seed = None
    if init == "subsample" and n > 1:
        rng = np.random.default_rng(random_state)
        m = min(n, init_size)
        rows = np.sort(rng.choice(n, m, replace=False)) if m < n else np.arange(n)
        sub = jax.device_put(np.asarray(
            check_data(np.asarray(X[rows]), name="X (subsample)", family=family), dtype), device)
        best, _ = mapdp_fit(jax.random.key(random_state), sub, measure, family, capacity,
                            mode="batched", block_size=block_size, split_moves=True,
                            merge_moves=True, init_clusters=min(32, capacity, m))
        if bool(best.clusters.overflow):
            raise CapacityError(
                f"jaxbnp: all {capacity} cluster slots are in use in the fit of the subsample; "
                "pass a larger capacity (e.g. twice as large).")
        seed = best.clusters
    # first pass: validate every chunk and build the statistics of the start
    counts = stats = None
    for s, e in bounds:
        Xc = load(s, e, validate=True)
        if seed is None:
            c, st = _chunk_stats(Xc, jax.device_put(labels[s:e], device), family, capacity)
        else:
            lab_c, c, st = _chunk_seed(Xc, seed, measure, family, block_size)
            labels[s:e] = np.asarray(lab_c)
        counts, stats = (c, st) if counts is None else tree_add((counts, stats), (c, st))
    nll = -log_joint_of_sums(counts, stats, measure, family)
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
            acc = (c_counts, c_stats) if acc is None else tree_add(acc, (c_counts, c_stats))
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
        new_nll = -float(log_joint_of_sums(counts, stats, measure, family))
        it += 1
        trace.append(new_nll)
        done = (nll - new_nll < tol) or not any(bool(c) for c in changed)
        nll = new_nll
        if done:
            break
    return ChunkedMAPDPResult(labels, counts, stats, float(nll), it, np.asarray(trace))


# ----------------------------------------------------------------------------- sub-cluster split/merge
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


# The compiled steps of the streamed chain. Per-cluster steps take the iteration's
# randomness, drawn once (``_sc_randomness``). Passes take one chunk's rows (``Xc`` where
# they need the data, ``valid``, ``labels_c``, the chunk's first row ``start``) and the
# iteration's noise key, and redraw their rows' uniforms (cheaper than keeping ``T + 4``
# floats per point on the device).


def _dtype(stats):
    return jax.tree.leaves(stats)[0].dtype


def _sums(Xc, ids, num, family):
    return segment_stats(family.point_stats(Xc), ids, num, None)


@functools.partial(jax.jit, static_argnames=("capacity", "T"))
def _sc_randomness(k_iter, stats, family, capacity, T):
    return IterationRandomness(k_iter, family, stats, capacity, T, _dtype(stats))


@jax.jit
def _sc_label_draws(rng, counts, stats, measure, family):
    return label_draws(rng, measure, family, counts, stats, _dtype(stats))


@functools.partial(jax.jit, static_argnames=("T",))
def _sc_propose(Xc, valid, labels_c, start, k_noise, log_w, params, family, T):
    """Pass: the proposed labels and blocks (kept on the device until the blocks are
    decided) and the blocks' changes of counts."""
    noise = point_noise(k_noise, Xc.shape[0], T, Xc.dtype, start=start)
    return propose_labels(Xc, noise, valid, labels_c, log_w, params, family, T)


@jax.jit
def _sc_accept(rng, counts, a, delta, measure):
    """The blocks' decisions, the pairing, and which pairs propose a split or a merge."""
    counts, block_ok = accept_blocks(rng, measure, counts, a, delta)
    pairs = pairing(rng, counts.shape[0])
    return (counts, block_ok, pairs) + split_kinds(counts, pairs)


@functools.partial(jax.jit, static_argnames=("T", "dtype"))
def _sc_apply_labels(valid, labels_c, start, proposal, block, k_noise, block_ok, pairs, T, dtype):
    """Pass (no data read): the accepted blocks' labels, and the chunk's anchor range per pair."""
    labels_c = jnp.where(block_ok[block], proposal, labels_c)
    noise = point_noise(k_noise, labels_c.shape[0], T, dtype, start=start)
    pp = point_pairs(labels_c, valid, pairs)
    return (labels_c,) + anchor_range(noise, pp, pairs.a_slot.shape[0])


def _anchor_roles(Xc, valid, labels_c, start, k_noise, pairs, lo, hi, T):
    noise = point_noise(k_noise, Xc.shape[0], T, Xc.dtype, start=start)
    pp = point_pairs(labels_c, valid, pairs)
    return pp, anchors(noise, pp, lo, hi)


@functools.partial(jax.jit, static_argnames=("T",))
def _sc_anchor_stats(Xc, valid, labels_c, start, k_noise, pairs, lo, hi, family, T):
    pp, anchor = _anchor_roles(Xc, valid, labels_c, start, k_noise, pairs, lo, hi, T)
    C = pairs.pair.shape[0]
    return _sums(Xc, anchor_sub_ids(anchor, pp, C), C, family)[1]


@jax.jit
def _sc_anchor_params(rng, anchor_stats, family):
    return family.sample_params_from_uniform(rng.anchor, anchor_stats, rng.k_anchor)


@functools.partial(jax.jit, static_argnames=("T",))
def _sc_first_sub_stats(Xc, valid, labels_c, start, k_noise, pairs, lo, hi, anchor_params, family, T):
    """Pass: sums of the launch's first sub-labels (from the anchors)."""
    pp, anchor = _anchor_roles(Xc, valid, labels_c, start, k_noise, pairs, lo, hi, T)
    h = first_sub_labels(Xc, anchor, pp, anchor_params, family)
    C = pairs.pair.shape[0]
    return _sums(Xc, sub_ids(h, pp, C), C, family)


@functools.partial(jax.jit, static_argnames=("T",))
def _sc_sub_stats(Xc, valid, labels_c, start, k_noise, pairs, t, sub_lw, sub_params, family, T):
    """Pass: sums of the sub-labels of launch sweep ``t`` (drawn from step ``t - 1``'s parameters)."""
    noise = point_noise(k_noise, Xc.shape[0], T, Xc.dtype, start=start)
    pp = point_pairs(labels_c, valid, pairs)
    u = lax.dynamic_index_in_dim(noise, 1 + t, axis=1, keepdims=False)
    h = draw(sub_logit(Xc, pp, sub_lw, sub_params, family), u)
    C = pairs.pair.shape[0]
    return _sums(Xc, sub_ids(h, pp, C), C, family)


@jax.jit
def _sc_launch(rng, t, sub_counts, sub_stats, family):
    return launch_draw(rng, t, family, sub_counts, sub_stats, _dtype(sub_stats))


@functools.partial(jax.jit, static_argnames=("T",))
def _sc_split_sums(Xc, valid, labels_c, start, k_noise, pairs, split_pair, sub_lw, sub_params,
                   sharpness, family, T):
    """Pass: each point's side of its pair's proposal (kept on the device until the pairs are
    decided), the proposal's log-probability sums and the parts' statistics."""
    noise = point_noise(k_noise, Xc.shape[0], T, Xc.dtype, start=start)
    pp = point_pairs(labels_c, valid, pairs)
    logit = sub_logit(Xc, pp, sub_lw, sub_params, family)
    _, side, t1, t2 = split_proposal(logit, noise, labels_c, pp, split_pair, pairs.a_slot,
                                      sharpness, T)
    C, P = pairs.pair.shape[0], pairs.a_slot.shape[0]
    return side, t1, t2, _sums(Xc, jnp.where(pp.in_pair, 2 * pp.pid + side, C), 2 * P, family)


@jax.jit
def _sc_decide(rng, counts, pairs, split_pair, merge_pair, t1, t2, part_counts, part_stats,
               measure, family):
    return decide_pairs(rng, measure, family, counts, pairs, split_pair, merge_pair, t1, t2,
                         part_counts, part_stats, _dtype(part_stats))


@jax.jit
def _sc_move(Xc, valid, labels_c, start, side, pairs, acc_split, acc_merge, l_slot, r_slot, family):
    """Pass: the labels after the accepted moves and their statistics (``start`` unused: the
    moves draw nothing)."""
    pp = point_pairs(labels_c, valid, pairs)
    labels_c = moved_labels(labels_c, side, pp, acc_split, acc_merge, l_slot, r_slot)
    C = pairs.pair.shape[0]
    return (labels_c,) + _sums(Xc, jnp.where(valid, labels_c, C), C, family)


@functools.partial(jax.jit, static_argnames=("capacity",))
def _sc_stats(Xc, valid, labels_c, family, capacity):
    return _sums(Xc, jnp.where(valid, labels_c, capacity), capacity, family)


def fit_subcluster_chunked(
    X: Any,
    measure,
    family,
    num_iterations: int,
    *,
    key: jax.Array,
    capacity: int = 64,
    chunk_size: int = 1 << 20,
    num_launch_sweeps: int = 3,
    sharpness: float = DEFAULT_SHARPNESS,
    init_labels: Any = None,
    device: jax.Device | None = None,
) -> ChunkedSubClusterResult:
    """The sub-cluster split/merge chain (``SubClusterMCMC``, docs/mathematics.md §7) on data
    kept in host memory, streamed through the device chunk by chunk.

    ``X``: ``(n, D)`` NumPy array or ``np.memmap`` (never copied whole to the device).
    Every sum over points that an iteration needs is summed chunk by chunk (the data are
    read ``num_launch_sweeps + 5`` times per iteration) and every per-point draw comes from
    the same per-point uniforms (:func:`point_noise`), so for the same ``key`` this is the
    chain of :func:`step` iterated ``num_iterations`` times with keys
    ``jax.random.split(key, num_iterations)`` and no absorb or reassign moves
    (``num_absorb_moves=0, num_reassign_moves=0``: each move would read the data again;
    docs/mathematics.md §7), up to the summation order of the statistics (float rounding).
    Device memory holds one chunk and its per-point work; the labels (``4 n`` bytes) stay on
    the device, and within an iteration the proposed labels and
    label blocks, then each point's side of its pair's proposal (``8 n`` bytes at most).

    The points are cut into ``ceil(n / chunk_size)`` chunks of equal size (the last one
    padded by a few masked rows), so every pass is one compiled program. Starts from one
    cluster, or from ``init_labels`` (``n`` integers in ``[0, capacity)``). DP and PitmanYor
    only. Every chunk is validated (finite, numeric, the family's constraints) in a first
    pass before any iteration. Raises ``CapacityError`` as soon as every slot is in use (the
    chain could not split any more): pass a larger ``capacity``.
    """
    X = check_host_array(X)
    check_measure(measure, owner="fit_subcluster_chunked")
    C = check_int("capacity", capacity, 1)
    chunk_size = check_int("chunk_size", chunk_size, 1)
    num_iterations = check_int("num_iterations", num_iterations, 1)
    if C < 2:
        raise ValueError(f"capacity must be >= 2 (a split needs two slots), got {C}.")
    T = check_int("num_launch_sweeps", num_launch_sweeps, 0)
    sharpness = check_real("sharpness", sharpness, 0.0)
    if sharpness == 0.0:
        raise ValueError("sharpness must be > 0 (0 would propose every split alike), got 0.")
    n = int(X.shape[0])
    num_chunks = -(-n // chunk_size)
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
        return functools.reduce(tree_add, parts)

    def each(fn, *args, per_chunk=()):
        """``fn(X_chunk, valid, labels, start, *chunk's entries of per_chunk, *args)`` over
        the chunks: one read of the data."""
        return [fn(load(s, e), valid[i], labels[i], starts[i], *(p[i] for p in per_chunk), *args)
                for i, (s, e) in enumerate(bounds)]

    counts, stats = total([_sc_stats(load(s, e, validate=True), valid[i], labels[i], family, C)
                           for i, (s, e) in enumerate(bounds)])
    keys = jax.random.split(key, num_iterations)
    trace = {f: [] for f in ("num_clusters", "log_joint", "num_splits", "num_merges")}
    for it in range(num_iterations):
        k_noise, k_iter = jax.random.split(keys[it])
        rng = _sc_randomness(k_iter, stats, family, C, T)
        # 1. labels
        a, log_w, params = _sc_label_draws(rng, counts, stats, measure, family)
        proposal, block, delta = zip(*each(_sc_propose, k_noise, log_w, params, family, T))
        counts_l, block_ok, pairs, split_pair, merge_pair = _sc_accept(rng, counts, a,
                                                                       total(delta), measure)
        applied = [_sc_apply_labels(valid[i], labels[i], starts[i], proposal[i], block[i],
                                    k_noise, block_ok, pairs, T, dtype)
                   for i in range(len(bounds))]
        labels = [out[0] for out in applied]
        lo = functools.reduce(jnp.minimum, [out[1] for out in applied])
        hi = functools.reduce(jnp.maximum, [out[2] for out in applied])
        # 2. the launch: anchors, then num_launch_sweeps restricted Gibbs sweeps
        anchor_stats = total(each(_sc_anchor_stats, k_noise, pairs, lo, hi, family, T))
        anchor_params = _sc_anchor_params(rng, anchor_stats, family)
        sub = total(each(_sc_first_sub_stats, k_noise, pairs, lo, hi, anchor_params, family, T))
        sub_lw, sub_params = _sc_launch(rng, 0, *sub, family)
        for t in range(1, T + 1):
            sub = total(each(_sc_sub_stats, k_noise, pairs, t, sub_lw, sub_params, family, T))
            sub_lw, sub_params = _sc_launch(rng, t, *sub, family)
        # 3. split and merge proposals, decided pair by pair
        side, t1, t2, parts = zip(*each(_sc_split_sums, k_noise, pairs, split_pair, sub_lw,
                                        sub_params, sharpness, family, T))
        acc, _, _, l_slot, r_slot = _sc_decide(rng, counts_l, pairs, split_pair, merge_pair,
                                               total(t1), total(t2), *total(parts), measure,
                                               family)
        acc_split, acc_merge = acc & split_pair, acc & merge_pair
        moved = each(_sc_move, pairs, acc_split, acc_merge, l_slot, r_slot, family,
                     per_chunk=(side,))
        labels = [out[0] for out in moved]
        counts, stats = total([out[1:] for out in moved])
        num_clusters = int(jnp.sum(counts > 0))
        trace["num_clusters"].append(num_clusters)
        trace["log_joint"].append(float(log_joint_of_sums(counts, stats, measure, family)))
        trace["num_splits"].append(int(jnp.sum(acc_split)))
        trace["num_merges"].append(int(jnp.sum(acc_merge)))
        if num_clusters >= C and C < n:
            raise CapacityError(
                f"jaxbnp: all {C} cluster slots are in use after iteration {it + 1}, so the chain "
                f"could not split any more; pass a larger capacity (e.g. {2 * C}).")
    canonical = compact_labels(
        np.concatenate([np.asarray(lab)[:e - s] for lab, (s, e) in zip(labels, bounds)]))
    return ChunkedSubClusterResult(
        canonical, np.bincount(canonical).astype(np.int64),
        *(np.asarray(trace[f]) for f in ("num_clusters", "log_joint", "num_splits", "num_merges")),
        C)
