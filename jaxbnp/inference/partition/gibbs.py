"""Collapsed Gibbs sampling for conjugate BNP mixtures (Neal's algorithm 3), pure core.

A sweep visits every point once in index order: the point leaves its
cluster, then joins an existing cluster ``c`` with weight
``w_c · p(x_i | X_c)`` or a new one with weight ``w_new · p(x_i)``, where the
measure gives the weights ``w`` (docs/mathematics.md §1) and the family the predictive
(docs/mathematics.md §2). Everything is in log space; the sweep is one compiled loop
over blocks of points, each block scored against every cluster at once
(:func:`assignment_sweep`; docs/design.md, "The Gibbs sweep").

The sweep is a move of :mod:`jaxbnp.inference.partition.moves` (``moves.gibbs_sweep()``),
which composes it with the other moves over a partition into one kernel.

NGGP measures also carry ``u``, updated by slice sampling on ``log u``
(:func:`update_u`, docs/mathematics.md §1). The measure's hyperparameter updates are in
:mod:`jaxbnp.inference.partition.hyperparameters`.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ..._xla import mark_loop_program
from ...models.measures import Measure, NGGP
from .clusters import ClusterState
from ..slice import slice_sample

__all__ = [
    "packer",
    "gibbs_sweep",
    "step_uniforms",
    "assignment_sweep",
    "update_u",
]


def packer(tree):
    """Pack a pytree with leading axis ``m`` into one ``(m, P)`` array, and its inverse.

    One scatter then updates a slot's whole statistics (or cached predictive
    parameters), which keeps the per-point loop body small.
    """
    leaves, treedef = jax.tree.flatten(tree)
    shapes = [leaf.shape[1:] for leaf in leaves]
    sizes = [int(np.prod(shape)) for shape in shapes]
    dtype = jnp.result_type(*leaves)

    def pack(t):
        ls = jax.tree.leaves(t)
        lead = ls[0].shape[:-len(shapes[0])] if shapes[0] else ls[0].shape
        return jnp.concatenate(
            [leaf.reshape(lead + (-1,)).astype(dtype) for leaf in ls], axis=-1
        )

    def unpack(a):
        out, start = [], 0
        for shape, size in zip(shapes, sizes):
            out.append(a[..., start:start + size].reshape(a.shape[:-1] + shape))
            start += size
        return jax.tree.unflatten(treedef, out)

    return pack, unpack


#: points scored together against every cluster by :func:`assignment_sweep`
BLOCK_SIZE = 32
#: a block's scores are computed in tiles of this many slots, up to the highest occupied
#: slot only (:func:`assignment_sweep`)
SLOT_TILE = 16


def step_uniforms(key: jax.Array, steps: int, dtype) -> jax.Array:
    """The ``noise`` of a collapsed Gibbs :func:`assignment_sweep` of ``steps`` steps: one
    uniform per step in ``[tiny, 1)`` (inversion never lands on a cluster of probability
    zero)."""
    return jax.random.uniform(key, (steps,), dtype=dtype, minval=jnp.finfo(dtype).tiny)


def gibbs_sweep(
    key: jax.Array,
    clusters: ClusterState,
    X: jax.Array,
    measure: Measure,
    family,
    u: jax.Array | None = None,
    order: jax.Array | None = None,
    block_size: int = BLOCK_SIZE,
) -> ClusterState:
    """One systematic-scan collapsed Gibbs sweep over all points (or over ``order``).

    Shapes: ``X`` ``(n, D)``; ``clusters`` with ``capacity`` slots; ``order``
    optional point indices to visit, in that order (tgMCMC's local moves pass
    a random subset; chosen independently of the state, each update is exact). If a new
    cluster is drawn while every slot is taken the point stays put and
    ``overflow`` is set (the caller must raise; see ``raise_if_overflow``).

    Each point's new cluster is drawn by inversion from one uniform, so the random
    numbers a sweep uses do not depend on the capacity. ``block_size``: points scored
    together (:func:`assignment_sweep`); the draws do not depend on it beyond rounding.
    """
    capacity = clusters.counts.shape[0]
    # rebuild the statistics from the labels once per sweep: no rounding drift
    # accumulates from add/remove updates over long runs (O(n), cheap next to the sweep)
    clusters = clusters._replace(stats=family.stats_from_labels(X, clusters.labels, capacity))
    steps = X.shape[0] if order is None else order.shape[0]
    clusters = assignment_sweep(clusters, X, measure, family, u, noise=step_uniforms(key, steps, X.dtype),
                                order=order, block_size=block_size)
    # the same recount as above (rounding identical however the chains are batched); the
    # program that runs a sweep gets XLA:CPU's whole-loop kernels (jaxbnp._xla)
    return clusters._replace(stats=family.stats_from_labels(X, clusters.labels, capacity),
                             overflow=mark_loop_program(clusters.overflow))


def draw_by_inversion(p: jax.Array, uniform: jax.Array) -> jax.Array:
    """The index ``k`` with ``P_{k−1} < U P_K <= P_k`` (``P`` the cumulative sums of the
    weights ``p >= 0``, one positive): a draw from ``p / Σp`` by inversion of the uniform
    ``U``. The sums run in two levels, over rows of about ``√K`` weights and then within the
    row found: XLA writes a cumulative sum as a window reduction, ``K²/2`` additions for ``K``
    weights, and the collapsed Gibbs sweep draws one point at a time. Rounding can only move
    the draw to a neighbouring index of positive weight."""
    K = p.shape[0]
    C = max(1, math.isqrt(K - 1) + 1)  # row length, ⌈√K⌉
    R = -(-K // C)
    P = jnp.pad(p, (0, R * C - K)).reshape(R, C)
    within = jnp.cumsum(P, axis=1)  # (R, C): sums within each row
    rows = jnp.cumsum(within[:, -1])  # (R,): sums to the end of each row
    target = uniform * rows[-1]
    r = jnp.minimum(jnp.sum(rows < target), R - 1)
    before = jnp.where(r > 0, rows[jnp.maximum(r - 1, 0)], 0.0)
    row, cum = P[r], within[r]
    hit = (before + cum >= target) & (row > 0)
    last = jnp.max(jnp.where(row > 0, jnp.arange(C), 0))
    return r * C + jnp.where(jnp.any(hit), jnp.argmax(hit), last)


def assignment_sweep(
    clusters: ClusterState,
    X: jax.Array,
    measure: Measure,
    family,
    u: jax.Array | None = None,
    noise: jax.Array | None = None,
    order: jax.Array | None = None,
    block_size: int = BLOCK_SIZE,
    num_steps: jax.Array | None = None,
    subset: bool = False,
) -> ClusterState:
    """Visit the points listed in ``order`` (default ``0..n-1``; repeats allowed); each
    leaves its cluster and joins one drawn from ``log w_k + log p(x_i | X_k)``.

    ``num_steps`` (a traced integer, default ``len(order)``): visit only the first
    ``num_steps`` entries of ``order`` (MAP-DP's padded fits: the rows after the data are
    not points).

    ``subset``: ``X`` holds only some of the points that ``clusters``' counts and statistics
    count (the sharded samplers' blocks), so a count may exceed ``n``: the count terms (a
    slot's log weight, the own-cluster score's normaliser) are computed from each count
    instead of looked up in tables over the counts ``0..n``.

    ``noise`` decides how: ``None`` takes the argmax (MAP-DP's iterated conditional
    modes step, docs/mathematics.md §3: the argmax of the conditional is the argmin of
    ``d_ik``); a ``(len(order),)`` array of uniforms in ``(0, 1)``
    (:func:`step_uniforms`) draws by inversion (collapsed Gibbs). The last logit belongs
    to "a new cluster when no slot is free", which sets ``overflow``.

    How it runs (docs/design.md, "The Gibbs sweep"): the points go in blocks of
    ``block_size``. At the start of a block its points are scored against every
    cluster in one vectorised call (:meth:`log_predictive_pairwise`); inside the
    block only what a step changes is rescored: the visited point against its own
    cluster without it (``log_predictive_removed``, one quadratic form, where the family
    has it), and, when a point moves, the block's points against the two clusters it
    left and joined. The draws are those of the point-by-point sweep. Clusters keep
    cached predictive parameters (rank-one updates for families that have them, else
    recomputed from the two changed slots' statistics). Everything that follows a move
    sits in a ``lax.cond``: a point that stays, most points once a chain has settled,
    costs the scoring and the draw only.
    """
    n = X.shape[0]
    capacity = clusters.counts.shape[0]
    # every point in turn: a block is a contiguous run of rows, read and written with
    # dynamic slices (a scatter would keep XLA:CPU from compiling the loop over the blocks
    # as one kernel, jaxbnp._xla); the rows past n pad the last block and are not visited
    contiguous = order is None
    order = jnp.arange(n) if order is None else order
    steps = order.shape[0]
    B = max(1, min(int(block_size), steps))
    num_blocks = -(-steps // B)
    pad = num_blocks * B - steps
    if contiguous:
        X_rows = jnp.concatenate([X, jnp.zeros((pad,) + X.shape[1:], X.dtype)])
        labels_in = jnp.concatenate([clusters.labels, jnp.zeros((pad,), clusters.labels.dtype)])
    else:  # the order's last entry pads its last block
        padded = jnp.concatenate([order, jnp.full((pad,), order[-1], order.dtype)])
        labels_in = clusters.labels
    # entries visited: all of ``order``, or its first ``num_steps`` (then the loop over the
    # blocks stops after the last block that holds one)
    limit = steps if num_steps is None else num_steps
    rank_one = hasattr(family, "params_add") and hasattr(family, "params_remove")
    removed_score = hasattr(family, "log_predictive_removed")
    slots = jnp.arange(capacity)

    stats_in = clusters.stats
    params = family.predictive_params(stats_in)
    pack_params, unpack_params = packer(params)
    pack_stats, unpack_stats = packer(stats_in)
    prior_params = family.prior_predictive_params(X.shape[1], X.dtype)
    prior_packed = pack_params(prior_params)[0]
    # log p(x_i) under the prior does not depend on the state: all points at once
    prior_log_pred = family.log_predictive_pairwise(X, prior_params)[:, 0]
    table = pack_params(params)
    # count terms: tabulated over the counts 0..n once per sweep, or (a subset) computed
    if subset:
        def log_w_of(c):  # a slot's log weight depends on its count alone (and u)
            return measure.gibbs_log_weights(jnp.atleast_1d(c), u)[0].reshape(jnp.shape(c))

        norm_of = family.removed_norms if removed_score else None
    else:
        log_w_count = measure.gibbs_log_weights(jnp.arange(n + 1), u)[0]  # count 0: −inf
        log_w_of = log_w_count.__getitem__
        norm_of = family.removed_norms(jnp.arange(n + 1)).__getitem__ if removed_score else None
    stats_table = pack_stats(stats_in) if not rank_one else jnp.zeros((1, 1), X.dtype)
    zero_stats = jnp.zeros_like(stats_table[0])

    def score(Xs, rows):
        return family.log_predictive_pairwise(Xs, unpack_params(rows))

    def block_scores(Xb, table, counts):
        if capacity <= SLOT_TILE:
            return score(Xb, table) + log_w_of(counts)[None]
        # an empty slot's joint log weight is −inf (count 0), so only the tiles up to the
        # highest occupied slot are scored: new clusters take the first free slot, so a chain
        # with K clusters in 128 slots scores about K columns, not 128 (the last tile may
        # overlap the one before it: the same columns again)
        top = jnp.max(jnp.where(counts > 0, slots + 1, 0))

        def tile(t, joint):
            start = jnp.minimum(t * SLOT_TILE, capacity - SLOT_TILE)
            rows = lax.dynamic_slice_in_dim(table, start, SLOT_TILE)
            part = score(Xb, rows) + log_w_of(lax.dynamic_slice_in_dim(counts, start, SLOT_TILE))[None]
            return lax.dynamic_update_slice_in_dim(joint, part.astype(joint.dtype), start, axis=1)

        empty = jnp.full((Xb.shape[0], capacity), -jnp.inf, jnp.result_type(table.dtype, Xb.dtype))
        return lax.fori_loop(0, (top + SLOT_TILE - 1) // SLOT_TILE, tile, empty)

    def block(b, carry):
        labels, counts, table, stats_table, overflow = carry
        if contiguous:
            idx = b * B + jnp.arange(B, dtype=order.dtype)  # rows past n: padding
            Xb = lax.dynamic_slice_in_dim(X_rows, b * B, B)
            own0 = lax.dynamic_slice_in_dim(labels, b * B, B)
        else:
            idx = lax.dynamic_slice_in_dim(padded, b * B, B)
            Xb = X[idx]
            own0 = labels[idx]
        # (B, capacity) log w_k + log p(x | X_k) at the block's start (u is fixed in a sweep,
        # so a step reads joint log weights instead of taking a log per slot)
        joint_b = block_scores(Xb, table, counts)

        def step(j, c):
            own, counts, table, stats_table, overflow, joint_b = c
            t = b * B + j
            valid = t < limit
            i, x, old = jnp.minimum(idx[j], n - 1), Xb[j], own[j]
            # remove point i from its cluster (the counts array changes only if it moves)
            at_old = slots == old
            counts_out = jnp.where(at_old, counts - 1, counts)
            emptied = counts[old] == 1
            # its cluster's predictive without it (an emptied slot is the prior exactly)
            if rank_one:
                row = unpack_params(table[old][None])
                if removed_score:
                    own_score = family.log_predictive_removed(row, x, norm_of(counts[old]))[0]
                else:
                    own_score = score(x[None], pack_params(family.params_remove(row, x)))[0, 0]
            else:
                ps = pack_stats(family.point_stats(x[None]))[0]
                stats_down = jnp.where(emptied, zero_stats, stats_table[old] - ps)
                down = pack_params(family.predictive_params(unpack_stats(stats_down[None])))[0]
                own_score = score(x[None], down[None])[0, 0]
            own_score = jnp.where(emptied, prior_log_pred[i], own_score)
            # weights (docs/mathematics.md §1) times predictive (docs/mathematics.md §2); a
            # free slot's weight is −inf (the table's count 0)
            log_new = measure.gibbs_log_weights(counts_out, u)[1]
            new_logit = log_new + prior_log_pred[i]
            free = counts_out == 0
            joint = jnp.where(at_old, log_w_of(counts[old] - 1) + own_score, joint_b[j])
            # one pass: the largest logit of an occupied slot and the first free slot
            top, free_slot = lax.reduce(
                (joint, jnp.where(free, slots, capacity)),
                (jnp.array(-jnp.inf, joint.dtype), jnp.array(capacity, slots.dtype)),
                lambda a, b: (jnp.maximum(a[0], b[0]), jnp.minimum(a[1], b[1])), (0,))
            has_free = free_slot < capacity
            logits = jnp.where(slots == free_slot, new_logit, joint)
            logits = jnp.append(logits, jnp.where(has_free, -jnp.inf, new_logit))
            tn = jnp.minimum(t, steps - 1)
            if noise is None:
                choice = jnp.argmax(logits)
            else:
                # the largest logit: new_logit sits once, in a free slot or at the end
                choice = draw_by_inversion(jnp.exp(logits - jnp.maximum(top, new_logit)), noise[tn])
            overflow = overflow | ((choice == capacity) & valid)
            new = jnp.where((choice == capacity) | ~valid, old, choice).astype(own.dtype)

            def move(c):
                # write the two changed slots and rescore the block against them; a point
                # that stays changes nothing (lax.cond skips all of this)
                own, counts, table, stats_table, joint_b = c
                removed = (pack_params(family.params_remove(unpack_params(table[old][None]), x))[0]
                           if rank_one else down)
                down_row = jnp.where(emptied, prior_packed, removed)
                table = lax.dynamic_update_index_in_dim(table, down_row, old, 0)
                if rank_one:
                    up = pack_params(family.params_add(unpack_params(table[new][None]), x))[0]
                else:
                    stats_table = lax.dynamic_update_index_in_dim(stats_table, stats_down, old, 0)
                    stats_up = stats_table[new] + ps
                    stats_table = lax.dynamic_update_index_in_dim(stats_table, stats_up, new, 0)
                    up = pack_params(family.predictive_params(unpack_stats(stats_up[None])))[0]
                table = lax.dynamic_update_index_in_dim(table, up, new, 0)
                counts = jnp.where(slots == new, counts + 1, jnp.where(slots == old, counts - 1, counts))
                pair = jnp.stack([old, new])
                fresh = score(Xb, table[pair]) + log_w_of(counts[pair])
                joint_b = lax.dynamic_update_index_in_dim(joint_b, fresh[:, 0], old, 1)
                joint_b = lax.dynamic_update_index_in_dim(joint_b, fresh[:, 1], new, 1)
                own = jnp.where(idx == idx[j], new, own)  # repeats of i in the block see its new label
                return own, counts, table, stats_table, joint_b

            own, counts, table, stats_table, joint_b = lax.cond(
                new != old, move, lambda c: c, (own, counts, table, stats_table, joint_b))
            return own, counts, table, stats_table, overflow, joint_b

        own, counts, table, stats_table, overflow, _ = lax.fori_loop(
            0, B, step, (own0, counts, table, stats_table, overflow, joint_b)
        )
        if contiguous:
            labels = lax.dynamic_update_slice_in_dim(labels, own, b * B, 0)
        else:
            labels = labels.at[idx].set(own)
        return labels, counts, table, stats_table, overflow

    blocks = num_blocks if num_steps is None else (num_steps + B - 1) // B
    labels, counts, _, _, overflow = lax.fori_loop(
        0, blocks, block, (labels_in, clusters.counts, table, stats_table, clusters.overflow)
    )
    labels = labels[:n] if contiguous else labels
    # the statistics move with the points that changed cluster (exact sums, no drift)
    changed = labels != clusters.labels
    ps = jax.tree.map(
        lambda a: jnp.where(changed.reshape((-1,) + (1,) * (a.ndim - 1)), a, 0).astype(a.dtype),
        family.point_stats(X),
    )
    stats = jax.tree.map(
        lambda s, a: s
        + jax.ops.segment_sum(a, labels, num_segments=capacity)
        - jax.ops.segment_sum(a, clusters.labels, num_segments=capacity),
        stats_in, ps,
    )
    return ClusterState(labels, counts, stats, overflow)


def update_u(key: jax.Array, u: jax.Array, counts: jax.Array, measure: NGGP) -> jax.Array:
    """Slice-sample ``log u`` from ``p(log u | Π)`` (docs/mathematics.md §1)."""
    log_u = slice_sample(key, lambda t: measure.log_u_conditional(t, counts), jnp.log(u))
    return jnp.exp(log_u)
