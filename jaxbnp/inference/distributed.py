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

from .._pytree import tree_add
from .._validation import check_data, check_host_array, check_int
from .partition.clusters import CapacityError, ClusterState, log_joint_of_sums
from .partition.mapdp import batched_sweep, seed_labels
from .partition.mapdp import fit as mapdp_fit
from .partition.subcluster import ChunkedSubClusterResult, fit_subcluster_chunked
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
