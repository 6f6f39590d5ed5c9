"""Data-parallel MAP-DP and collapsed Gibbs over a device mesh (``jax.shard_map`` + ``lax.psum``).

The mesh and the layout of the points over it are :mod:`jaxbnp.inference.mesh`'s (re-exported
here: ``sharded.make_mesh``, ``sharded.shard_data``, ...).

The points are sharded over a one-axis device mesh; every device holds the
cluster ``counts`` and additive statistics of *all* points (docs/mathematics.md §2:
statistics add), and the per-shard changes are combined with ``lax.psum``.
JAX is the distributed engine: the same program runs on host devices
(``XLA_FLAGS=--xla_force_host_platform_device_count=8``), on GPUs, and across
hosts after ``jax.distributed.initialize`` (see :mod:`jaxbnp.inference.distributed`).

Layout
------
With ``S`` shards and a global block of ``block_size`` points, each shard
takes a local block of ``B = ceil(block_size / S)`` points, so a global
block is ``S·B`` points. Points are laid out *block-cyclically*: global block
``b`` is points ``b·S·B … (b+1)·S·B − 1`` of the input order, and shard ``s``
holds the slice ``s·B … (s+1)·B − 1`` of every global block. ``n`` is padded
to a whole number of global blocks; padded rows carry a ``valid = False``
mask and never enter a count or a statistic (nothing is dropped, no
divisibility is required).

MAP-DP (exact: the same algorithm as ``mapdp.fit(mode="batched")``)
-------------------------------------------------------------------
Global blocks are visited in order. In a block, every shard proposes moves
for its ``B`` points against the globally synchronised statistics
(:func:`jaxbnp.inference.partition.mapdp.block_proposal`: each point left out of its
own cluster, the best option chosen, all "new cluster" points of the block
sent to the first free slot, which every shard sees the same); the changes
of counts and statistics are summed with ``psum``. The combined update is
kept only if the global NLL does not rise; otherwise the block (gathered with
``all_gather``, ``S·B`` points) is redone sequentially by ICM, redundantly on
every device, and each shard keeps its slice. So the NLL never increases, and
the run is **the same algorithm** as single-device batched MAP-DP with
``block_size = S·B`` on the same point order: same proposals, same accept
decisions, same fallback; only the summation order of the statistics
differs (float rounding). ``tests/test_distributed.py`` checks equal NLL
trajectories in float64. The trade-off against the sequential algorithm is
the one of ``mode="batched"``: a larger global block is more parallel but is
rejected (and redone sequentially) more often.

Collapsed Gibbs (approximate: blocked, "asynchronous" Gibbs)
-----------------------------------------------------------
Each shard runs an ordinary sequential collapsed-Gibbs pass over its local
block against its *local view* of the statistics (the global statistics at
the start of the block plus its own moves only); at the end of the block the
changes are summed with ``psum``. New clusters: every shard opens them in
slots that were empty at the start of the block; shard 0 keeps its slots and
the other shards' new clusters are moved to other free slots (so new
clusters of different shards never merge); if the free slots run out the
block is reverted and ``overflow`` is set. A point's conditional ignores the
moves other shards made in the same block, so with ``S > 1`` this is **not**
an exact Gibbs sampler and it does not target the exact posterior (it is the
approximate distributed sampler of AD-LDA type; its error shrinks as the
block shrinks relative to the cluster sizes). A cluster that one shard
empties and reopens within a block may also receive other shards' points.
With one shard it *is* the sequential collapsed Gibbs sampler (tested: equal
draws). Counts and statistics stay consistent with the labels after every
block (tested). ``u`` (NGGP) is held fixed here; update it between calls
from the global ``counts``.

Example
-------
>>> import jax, numpy as np, jaxbnp as bnp
>>> from jaxbnp.inference import sharded
>>> X = np.random.default_rng(0).normal(size=(1000, 2))
>>> mesh = sharded.make_mesh()                     # all devices on one axis
>>> res = sharded.fit_mapdp(X, bnp.DP(1.0), bnp.NormalGamma.from_data(X), capacity=32,
...                         mesh=mesh, block_size=256)
>>> res.nll_trace.shape
(101,)
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from .._validation import check_data, check_int
from ..models.measures import Measure
from .base import SamplingAlgorithm
from .mesh import (
    AXIS_NAME, Layout, ShardedData, make_layout, make_mesh, mesh_axis, shard_data, shard_labels,
)
from .partition.clusters import ClusterState, cluster_log_joint, start_labels
from .partition.gibbs import assignment_sweep, step_uniforms
from .partition.mapdp import MAPDPResult, block_delta, block_proposal

#: rows validated at a time (a ``np.memmap`` is read once, never held whole in memory)
VALIDATION_ROWS = 1 << 20

__all__ = [
    "AXIS_NAME",
    "Layout",
    "ShardedData",
    "ShardedGibbsResult",
    "make_mesh",
    "make_layout",
    "shard_data",
    "shard_labels",
    "fit_mapdp",
    "gibbs",
    "make_mapdp_sweep",
    "make_gibbs_sweeps",
    "algorithm",
    "ShardedGibbsState",
    "ShardedGibbsInfo",
    "labels_in_order",
]

def _check_points(X: Any, family) -> Any:
    """``check_data`` for small inputs; a NumPy array (or ``np.memmap``) is checked in row
    chunks without a float64 copy of the whole array, and returned as it is."""
    if not isinstance(X, np.ndarray) or X.shape[0] <= VALIDATION_ROWS:
        return check_data(X, family=family)
    if X.ndim != 2 or X.shape[1] == 0:
        raise ValueError(
            f"X must be a 2-D array of shape (num_points, num_features), got shape {X.shape}."
        )
    for s in range(0, X.shape[0], VALIDATION_ROWS):
        check_data(X[s:s + VALIDATION_ROWS], name=f"X[{s}:{min(s + VALIDATION_ROWS, X.shape[0])}]",
                   family=family)
    return X


def _check_inputs(X, family, capacity, block_size, mesh):
    X = _check_points(X, family)
    capacity = check_int("capacity", capacity, 1)
    block_size = check_int("block_size", block_size, 1)
    mesh = make_mesh() if mesh is None else mesh
    mesh_axis(mesh)
    return X, capacity, block_size, mesh


# ----------------------------------------------------------------------------- per-shard pieces
def _stats_of(Xl, valid_l, labels, family, capacity, axis):
    """Global ``(counts, stats)`` of ``labels``: local segment sums, then ``psum``."""
    w = valid_l.astype(Xl.dtype)
    ps = family.point_stats(Xl)
    stats = jax.tree.map(
        lambda p: jax.ops.segment_sum(p * w.reshape((-1,) + (1,) * (p.ndim - 1)), labels,
                                      num_segments=capacity),
        ps,
    )
    counts = jax.ops.segment_sum(valid_l.astype(jnp.int32), labels, num_segments=capacity)
    return lax.psum(counts, axis), lax.psum(stats, axis)


def _block_slices(Xl, valid_l, labels, b, B):
    start = b * B
    return (lax.dynamic_slice_in_dim(Xl, start, B), lax.dynamic_slice_in_dim(valid_l, start, B),
            lax.dynamic_slice_in_dim(labels, start, B))


def _nll(counts, stats, measure, family):
    return -cluster_log_joint(ClusterState(None, counts, stats, None), measure, family)


def _mapdp_sweep(Xl, valid_l, labels, counts, stats, overflow, measure, family, layout, axis):
    """One data-parallel batched MAP-DP sweep (module docstring), inside ``shard_map``."""
    B, capacity = layout.local_block, counts.shape[0]
    shard = lax.axis_index(axis)
    prior_params = family.prior_predictive_params(Xl.shape[1], Xl.dtype)
    positions = jnp.arange(layout.global_block)

    def block(b, carry):
        labels, counts, stats, overflow = carry
        xb, valid, own = _block_slices(Xl, valid_l, labels, b, B)
        proposal, over_new = block_proposal(counts, stats, xb, own, valid, measure, family,
                                            prior_params)
        d_counts, d_stats = block_delta(family.point_stats(xb), valid, proposal, own, capacity,
                                        counts.dtype, Xl.dtype)
        d_counts, d_stats = lax.psum((d_counts, d_stats), axis)
        over_new = lax.psum(over_new.astype(jnp.int32), axis) > 0
        joint_counts = counts + d_counts
        joint_stats = jax.tree.map(jnp.add, stats, d_stats)
        ok = _nll(joint_counts, joint_stats, measure, family) <= _nll(counts, stats, measure, family)
        # the whole global block on every device, for the sequential fallback
        xg = lax.all_gather(xb, axis, tiled=True)
        own_g = lax.all_gather(own, axis, tiled=True)
        valid_g = lax.all_gather(valid, axis, tiled=True)
        # padding rows revisit the block's last valid point (as mapdp.batched_sweep does)
        last = jnp.max(jnp.where(valid_g, positions, 0))
        order = jnp.where(valid_g, positions, last)

        def joint():
            return proposal, joint_counts, joint_stats, overflow | over_new

        def sequential():
            st = assignment_sweep(ClusterState(own_g, counts, stats, overflow), xg, measure, family,
                                  order=order, subset=True)
            return (lax.dynamic_slice_in_dim(st.labels, shard * B, B), st.counts, st.stats,
                    st.overflow)

        new_own, counts, stats, overflow = lax.cond(ok, joint, sequential)
        labels = lax.dynamic_update_slice_in_dim(labels, new_own, b * B, 0)
        return labels, counts, stats, overflow

    return lax.fori_loop(0, layout.num_blocks, block, (labels, counts, stats, overflow))


@functools.lru_cache(maxsize=32)
def _mapdp_program(mesh: Mesh, layout: Layout, capacity: int, tol: float, max_iter: int):
    axis = mesh_axis(mesh)

    def run(Xl, valid_l, measure, family):
        dtype = Xl.dtype
        labels = jnp.zeros(Xl.shape[0], jnp.int32)
        counts, stats = _stats_of(Xl, valid_l, labels, family, capacity, axis)
        nll0 = _nll(counts, stats, measure, family)
        trace0 = jnp.full((max_iter + 1,), jnp.nan, dtype).at[0].set(nll0)

        def cond(c):
            return (c[5] < max_iter) & ~c[6]

        def body(c):
            labels, counts, stats, overflow, nll, it, _, trace = c
            new_labels, _, _, overflow = _mapdp_sweep(
                Xl, valid_l, labels, counts, stats, overflow, measure, family, layout, axis
            )
            # statistics rebuilt from the labels: the NLL is exact, not a sum of updates
            counts, stats = _stats_of(Xl, valid_l, new_labels, family, capacity, axis)
            new_nll = _nll(counts, stats, measure, family)
            changed = lax.psum(jnp.sum((new_labels != labels) & valid_l), axis) > 0
            done = (nll - new_nll < tol) | ~changed
            return (new_labels, counts, stats, overflow, new_nll, it + 1, done,
                    trace.at[it + 1].set(new_nll))

        init = (labels, counts, stats, jnp.array(False), nll0, jnp.int32(0), jnp.array(False), trace0)
        labels, counts, stats, overflow, nll, it, _, trace = lax.while_loop(cond, body, init)
        return labels, counts, stats, overflow, nll, it, trace

    program = jax.shard_map(
        run, mesh=mesh, in_specs=(P(axis), P(axis), P(), P()),
        out_specs=(P(axis), P(), P(), P(), P(), P(), P()), check_vma=False,
    )
    return jax.jit(program)


@functools.lru_cache(maxsize=32)
def make_mapdp_sweep(mesh: Mesh, layout: Layout, capacity: int):
    """A jitted ``(X, valid, labels, measure, family) -> (labels, counts, stats, overflow, nll)``:
    one data-parallel MAP-DP sweep from ``labels`` (sharded arrays from :func:`shard_data`),
    statistics rebuilt from the labels before and after it. For benchmarks and custom loops."""
    axis = mesh_axis(mesh)

    def run(Xl, valid_l, labels, measure, family):
        counts, stats = _stats_of(Xl, valid_l, labels, family, capacity, axis)
        labels, _, _, overflow = _mapdp_sweep(Xl, valid_l, labels, counts, stats, jnp.array(False),
                                              measure, family, layout, axis)
        counts, stats = _stats_of(Xl, valid_l, labels, family, capacity, axis)
        return labels, counts, stats, overflow, _nll(counts, stats, measure, family)

    return jax.jit(jax.shard_map(
        run, mesh=mesh, in_specs=(P(axis), P(axis), P(axis), P(), P()),
        out_specs=(P(axis), P(), P(), P(), P()), check_vma=False,
    ))


def make_gibbs_sweeps(mesh: Mesh, layout: Layout, capacity: int, num_sweeps: int = 1):
    """A jitted ``(key, X, valid, labels, measure, family, u) -> (labels, counts, stats, overflow,
    log_joint (num_sweeps,))``: the program behind :func:`gibbs`, on sharded arrays."""
    return _gibbs_program(mesh, layout, capacity, num_sweeps)


@jax.jit
def _take_jit(labels, rows):
    return jnp.take(labels, rows)


def _take(labels, layout: Layout) -> jax.Array:
    """Labels back in input order (on every process when the mesh spans several)."""
    rows = layout.row_of_point()
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        return jnp.asarray(np.asarray(multihost_utils.process_allgather(labels, tiled=True))[rows])
    return _take_jit(labels, jnp.asarray(rows))


def fit_mapdp(
    X: Any,
    measure: Measure,
    family,
    capacity: int,
    mesh: Mesh | None = None,
    block_size: int = 4096,
    tol: float = 1e-6,
    max_iter: int = 100,
) -> MAPDPResult:
    """Data-parallel batched MAP-DP (module docstring) from the one-cluster start, points in input order.

    The same algorithm as ``mapdp.fit(key, X, measure, family, capacity,
    mode="batched", block_size=S·ceil(block_size/S), tol=tol, max_iter=max_iter)``
    (``S`` = number of devices in ``mesh``); no restarts or split moves (permute
    ``X`` yourself for another order). Returns a ``MAPDPResult`` whose labels
    are in input order; ``nll_trace`` is ``(max_iter + 1,)``, NaN after the end.
    Raises ``CapacityError`` if the clusters outgrew ``capacity``.
    """
    X, capacity, block_size, mesh = _check_inputs(X, family, capacity, block_size, mesh)
    max_iter = check_int("max_iter", max_iter, 1)
    layout = make_layout(X.shape[0], mesh.devices.size, block_size)
    data = shard_data(X, mesh, layout)
    out = _mapdp_program(mesh, layout, capacity, float(tol), max_iter)(data.X, data.valid, measure, family)
    labels, counts, stats, overflow, nll, it, trace = out
    _raise_overflow(overflow, capacity)
    labels = _take(labels, layout)
    return MAPDPResult(ClusterState(labels, counts, stats, overflow), nll, it, trace)


def _raise_overflow(overflow, capacity):
    from .partition.clusters import CapacityError

    if bool(np.asarray(jax.device_get(overflow))):
        raise CapacityError(
            f"jaxbnp: all {capacity} cluster slots are in use and a new cluster was needed; "
            "pass a larger capacity (e.g. twice as large)."
        )


# ----------------------------------------------------------------------------- collapsed Gibbs
class ShardedGibbsResult(NamedTuple):
    """clusters: final ``ClusterState`` (labels in input order, global counts/statistics as
    carried by the sampler); log_joint: ``(num_sweeps,)`` ``log p(X, Π[, u])`` after each sweep."""

    clusters: ClusterState
    log_joint: jax.Array


def _gibbs_block(key, Xl, valid_l, labels, counts, stats, overflow, b, measure, family, u,
                 layout, axis):
    """One block of the asynchronous Gibbs sweep (module docstring), inside ``shard_map``."""
    B, capacity = layout.local_block, counts.shape[0]
    shard = lax.axis_index(axis)
    xb, valid, own = _block_slices(Xl, valid_l, labels, b, B)
    noise = step_uniforms(jax.random.fold_in(key, b), B, Xl.dtype)
    positions = jnp.arange(B)
    order = jnp.where(valid, positions, jnp.max(jnp.where(valid, positions, 0)))
    local = ClusterState(own, counts, stats, overflow)
    local = lax.cond(
        jnp.any(valid),
        lambda: assignment_sweep(local, xb, measure, family, u, noise=noise, order=order, subset=True),
        lambda: local,
    )
    new = local.labels
    start_free = counts == 0
    opened = start_free & (jax.ops.segment_sum(valid.astype(jnp.int32), new, num_segments=capacity) > 0)
    # shard 0 keeps its new slots; the others' new clusters go to the remaining free slots
    opened_all = lax.all_gather(opened, axis)  # (S, capacity)
    num_opened = jnp.sum(opened_all, axis=1)
    available = start_free & ~opened_all[0]
    available_slots = jnp.argsort(~available, stable=True)
    offset = jnp.cumsum(num_opened)[shard] - num_opened[shard] - num_opened[0]
    rank = jnp.cumsum(opened) - 1
    target = available_slots[jnp.clip(offset + rank, 0, capacity - 1)]
    mapping = jnp.where((shard > 0) & opened, target, jnp.arange(capacity)).astype(new.dtype)
    short = jnp.sum(num_opened) - num_opened[0] > jnp.sum(available)
    final = jnp.where(short | ~valid, own, mapping[new])  # out of slots: the block is reverted
    d_counts, d_stats = block_delta(family.point_stats(xb), valid, final, own, capacity,
                                    counts.dtype, Xl.dtype)
    d_counts, d_stats = lax.psum((d_counts, d_stats), axis)
    overflow = overflow | short | (lax.psum(local.overflow.astype(jnp.int32), axis) > 0)
    labels = lax.dynamic_update_slice_in_dim(labels, final, b * B, 0)
    return labels, counts + d_counts, jax.tree.map(jnp.add, stats, d_stats), overflow


@functools.lru_cache(maxsize=32)
def _gibbs_program(mesh: Mesh, layout: Layout, capacity: int, num_sweeps: int):
    axis = mesh_axis(mesh)

    def run(key, Xl, valid_l, labels, measure, family, u):
        shard = lax.axis_index(axis)

        def sweep(t, carry):
            labels, _, _, overflow, trace = carry
            key_ts = jax.random.fold_in(jax.random.fold_in(key, t), shard)
            # rebuilt from the labels once per sweep, as gibbs.gibbs_sweep does
            counts, stats = _stats_of(Xl, valid_l, labels, family, capacity, axis)

            def block(b, c):
                return _gibbs_block(key_ts, Xl, valid_l, *c, b, measure, family, u, layout, axis)

            labels, counts, stats, overflow = lax.fori_loop(
                0, layout.num_blocks, block, (labels, counts, stats, overflow)
            )
            st = ClusterState(None, counts, stats, None)
            lj = cluster_log_joint(st, measure, family, u)
            return labels, counts, stats, overflow, trace.at[t].set(lj)

        counts, stats = _stats_of(Xl, valid_l, labels, family, capacity, axis)
        trace = jnp.zeros((num_sweeps,), Xl.dtype)
        return lax.fori_loop(0, num_sweeps, sweep, (labels, counts, stats, jnp.array(False), trace))

    program = jax.shard_map(
        run, mesh=mesh, in_specs=(P(), P(axis), P(axis), P(axis), P(), P(), P()),
        out_specs=(P(axis), P(), P(), P(), P()), check_vma=False,
    )
    return jax.jit(program)


def _initial_labels(labels, n: int, capacity: int) -> np.ndarray:
    """Host labels of a start (default: one cluster), relabelled in first-appearance order and
    checked against the capacity."""
    return np.zeros(n, np.int32) if labels is None else start_labels(labels, n, capacity)


def gibbs(
    key: jax.Array,
    X: Any,
    measure: Measure,
    family,
    capacity: int,
    num_sweeps: int = 1,
    mesh: Mesh | None = None,
    block_size: int = 4096,
    labels: Any = None,
    u: float = 1.0,
) -> ShardedGibbsResult:
    """``num_sweeps`` data-parallel collapsed-Gibbs sweeps (approximate for more than one
    device: module docstring) from ``labels`` (default: one cluster).

    Random numbers: sweep ``t``, shard ``s``, local block ``b`` uses one uniform per point,
    ``gibbs.step_uniforms(fold_in(fold_in(fold_in(key, t), s), b), B, dtype)``.
    ``u`` (NGGP) is held fixed. Raises ``CapacityError`` if the clusters
    outgrew ``capacity``.
    """
    X, capacity, block_size, mesh = _check_inputs(X, family, capacity, block_size, mesh)
    num_sweeps = check_int("num_sweeps", num_sweeps, 1)
    n = X.shape[0]
    labels = _initial_labels(labels, n, capacity)
    layout = make_layout(n, mesh.devices.size, block_size)
    data = shard_data(X, mesh, layout)
    lab = shard_labels(labels, mesh, layout)
    program = _gibbs_program(mesh, layout, capacity, num_sweeps)
    out = program(key, data.X, data.valid, lab, measure, family, jnp.asarray(u, data.X.dtype))
    labels_s, counts, stats, overflow, trace = out
    _raise_overflow(overflow, capacity)
    labels_out = _take(labels_s, layout)
    return ShardedGibbsResult(ClusterState(labels_out, counts, stats, overflow), trace)


class ShardedGibbsState(NamedTuple):
    """State of :func:`algorithm`: the labels in the mesh's block-cyclic layout (``(padded n,)``,
    sharded over the mesh; :func:`labels_in_order` gives them in input order), the global
    ``counts`` and ``stats`` of the labels, and ``overflow`` (a sweep needed a slot while all
    were used: the chain must be discarded)."""

    labels: jax.Array
    counts: jax.Array
    stats: Any
    overflow: jax.Array


class ShardedGibbsInfo(NamedTuple):
    """``log_joint``: ``log p(X, Π[, u])`` after the sweep."""

    log_joint: jax.Array


def algorithm(X: Any, measure: Measure, family, capacity: int, mesh: Mesh | None = None,
              block_size: int = 4096, u: float = 1.0) -> SamplingAlgorithm:
    """The data-parallel collapsed-Gibbs sweep in the one shape
    (:class:`~jaxbnp.inference.base.SamplingAlgorithm`), approximate with more than one device
    (module docstring):

    * ``init(key, labels=None) -> ShardedGibbsState``: the start (default: one cluster) laid
      out over the mesh; host side (the labels are placed shard by shard), ``key`` unused;
    * ``step(key, state) -> (ShardedGibbsState, ShardedGibbsInfo)``: one sweep, the sweep of
      ``gibbs(key, ..., num_sweeps=1)`` (its random numbers: ``fold_in(fold_in(fold_in(key, 0),
      s), b)`` for shard ``s`` and block ``b``).

    ``X`` is placed on the mesh once, here; ``u`` (NGGP) is held fixed.
    """
    X, capacity, block_size, mesh = _check_inputs(X, family, capacity, block_size, mesh)
    n = X.shape[0]
    layout = make_layout(n, mesh.devices.size, block_size)
    data = shard_data(X, mesh, layout)
    program = _gibbs_program(mesh, layout, capacity, 1)
    axis = mesh_axis(mesh)
    stats_of = jax.jit(jax.shard_map(
        lambda Xl, valid_l, labels: _stats_of(Xl, valid_l, labels, family, capacity, axis),
        mesh=mesh, in_specs=(P(axis), P(axis), P(axis)), out_specs=(P(), P()), check_vma=False))
    u = jnp.asarray(u, data.X.dtype)

    def init_fn(key, labels=None):
        del key  # the start is given
        lab = shard_labels(_initial_labels(labels, n, capacity), mesh, layout)
        counts, stats = stats_of(data.X, data.valid, lab)
        return ShardedGibbsState(lab, counts, stats, jnp.array(False))

    def step_fn(key, state):
        labels, counts, stats, overflow, trace = program(key, data.X, data.valid, state.labels,
                                                         measure, family, u)
        return ShardedGibbsState(labels, counts, stats, overflow | state.overflow), \
            ShardedGibbsInfo(trace[0])

    return SamplingAlgorithm(init_fn, step_fn)


def labels_in_order(state: ShardedGibbsState, X_rows: int, block_size: int = 4096,
                    mesh: Mesh | None = None) -> jax.Array:
    """The labels of an :func:`algorithm` state in input order (``X_rows`` points; the same
    ``mesh`` and ``block_size`` as the algorithm's)."""
    mesh = make_mesh() if mesh is None else mesh
    return _take(state.labels, make_layout(X_rows, mesh.devices.size, block_size))
