"""Jain & Neal (2004) restricted-Gibbs split-merge sampler for conjugate mixtures, pure core.

One move (docs/mathematics.md §1-2, acceptance as in §4):

1. pick two distinct points ``i`` and ``j`` uniformly; ``S`` is the set of
   the other points of their clusters;
2. launch state: ``i`` in cluster ``A``, ``j`` in cluster ``B``, each point
   of ``S`` in ``A`` or ``B`` with probability 1/2, then
   ``num_restricted_scans`` restricted Gibbs scans over ``S`` (a point of
   ``S`` joins ``A`` or ``B`` with probability
   ``∝ w(n_c) p(x | X_c)``, ``w`` the measure's weight of an existing cluster);
3. if ``i`` and ``j`` share a cluster, propose the split drawn by one more
   restricted scan from the launch state, with probability ``q(Π*|Π)``
   (the product of that scan's conditionals); otherwise propose the merge of
   their clusters, and ``q(Π|Π*)`` is the probability that a restricted scan
   from the launch state would give back the current split;
4. accept with ``r = p(X, Π*, u) q(Π|Π*) / (p(X, Π, u) q(Π*|Π))``, where
   ``log p(X, Π, u) = measure.log_eppf(counts, u) + Σ_c family.log_marginal``
   (a merge is deterministic, its ``q`` is 1).

The launch state depends only on ``i``, ``j``, ``S`` and the random key, never
on how ``S`` is split now, which is what makes the move exact (Jain & Neal
2004, §4). Given ``u`` (NGGP) the move leaves ``p(Π | X, u)`` invariant, and
split and merge moves alone reach every partition, so split-merge moves alone
are an irreducible sampler of the partition. This is the "SM" baseline of
Lee & Choi (2015, tgMCMC), where ``u`` is slice-sampled after the moves.

Everything has static shapes and runs under ``jit``/``vmap``: the restricted
scans are ``fori_loop`` s over the members of ``S`` (a dynamic trip count over
a fixed-size index array), with the two clusters' statistics packed in one
``(2, P)`` array. The new cluster of a split takes the first free slot; if
every slot is used and the split would be accepted, the state stays put and
``overflow`` is set (the kernel raises ``CapacityError``), never a silent drop.

Kernel pattern: ``split_merge_move_info(key, clusters, X, measure, family, u)``
returns ``(ClusterState, SplitMergeInfo)`` (proposal kind, ``log r``, acceptance). As a
composable move:
:func:`jaxbnp.inference.partition.moves.split_merge`; the NumPyro kernel is
:class:`jaxbnp.inference.partition.kernels.SplitMerge` (``bnp.SplitMerge``).

Example
-------
>>> import jax, numpyro, jaxbnp as bnp
>>> from numpyro.infer import MCMC
>>> def model(X):
...     z = numpyro.sample("z", bnp.Partition(bnp.DP(1.0), X.shape[0]))
...     numpyro.sample("X", bnp.ConjugateMixture(bnp.NormalGamma(), z), obs=X)
>>> kernel = bnp.SplitMerge(model, num_split_merge=5, gibbs_sweeps=1)
>>> mcmc = MCMC(kernel, num_warmup=10, num_samples=10, progress_bar=False)
>>> mcmc.run(jax.random.key(0), jax.numpy.zeros((5, 1)))
>>> mcmc.get_samples()["z"].shape
(10, 5)
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from ..._validation import check_int
from ...models.measures import Measure
from .clusters import ClusterState, first_free_slot
from .gibbs import packer

__all__ = ["SplitMergeInfo", "split_merge_move_info"]


class SplitMergeInfo(NamedTuple):
    """What one split-merge move did.

    i, j: the two chosen points (``i`` goes to the new cluster of a split).
    is_split: whether a split was proposed (``i`` and ``j`` shared a cluster).
    log_ratio: ``log r`` of the MH acceptance (before ``min(0, ·)``).
    log_proposal: ``log`` of the final restricted scan's probability of the
        split configuration: ``log q(Π*|Π)`` for a split, ``log q(Π|Π*)`` for a merge.
    accepted: whether the proposal was taken.
    """

    i: jax.Array
    j: jax.Array
    is_split: jax.Array
    log_ratio: jax.Array
    log_proposal: jax.Array
    accepted: jax.Array


def _restricted_scans(
    order, num_moving, num_scans, side, stats, counts, point_stats, X, log_uniforms, target,
    force_last, measure, family, unpack, u,
):
    """``num_scans`` restricted Gibbs scans over ``order[:num_moving]`` between clusters A and B.

    ``side[k]`` is True when point ``k`` is in A; ``stats`` ``(2, P)`` (packed,
    ``unpack`` undoes it) and ``counts`` ``(2,)`` are A's and B's statistics and
    sizes at the start. A point joins A with probability
    ``∝ w(n_A) p(x | X_A)`` (docs/mathematics.md §1), using ``log_uniforms[scan, position]``;
    in the last scan, when ``force_last``, it goes to ``target[k]`` instead.
    Returns the new ``side`` and the log probability of the last scan's choices.

    The scans run as one flat loop of ``num_scans * num_moving`` steps (one
    loop, one copy of the body). Families with rank-one updates of their
    predictive parameters (``params_add``/``params_remove``, e.g.
    NormalWishart) carry those parameters, with no factorisation per point: a
    point is scored against its own cluster without it by
    ``log_predictive_removed`` (one quadratic form), and the two clusters'
    parameters are updated only when it changes side (a ``lax.cond``; 30-D
    breast-cancer data: a move 14 -> 4 ms, ``benchmarks/results/pairwise_scores.md``).
    The others carry the statistics and recompute the two predictives.
    """
    rank_one = hasattr(family, "params_add") and hasattr(family, "params_remove")
    per_scan = jnp.maximum(num_moving, 1)

    def where_in_scans(t):
        """Step ``t``'s scan, its position in the scan and the point it visits."""
        scan = t // per_scan
        position = t - scan * per_scan
        return scan, position, order[position]

    def choose(t, counts, scores):
        """The step's draw given ``scores`` (``(2,)`` log predictives of ``x`` under A and B
        without it) and the counts without it: ``(to_a, log p(choice) in the last scan)``."""
        scan, position, k = where_in_scans(t)
        last = scan == num_scans - 1
        # both clusters keep i or j, so both weights are the "existing cluster" ones
        log_w, _ = measure.gibbs_log_weights(counts, u)
        logits = log_w + scores
        log_norm = jnp.logaddexp(logits[0], logits[1])
        log_p_a, log_p_b = logits[0] - log_norm, logits[1] - log_norm
        to_a = jnp.where(last & force_last, target[k], log_uniforms[scan, position] < log_p_a)
        return to_a, jnp.where(last, jnp.where(to_a, log_p_a, log_p_b), 0.0)

    if rank_one:
        # the two clusters' predictive parameters are carried; a point is scored against its
        # own cluster without it by one quadratic form where the family has
        # ``log_predictive_removed``, and the parameters change only when it moves
        params = family.predictive_params(unpack(stats))
        pack_params, unpack_params = packer(params)
        removed_score = hasattr(family, "log_predictive_removed")

        def body(t, carry):
            side, table, counts, log_q = carry
            k = where_in_scans(t)[2]
            x = X[k]
            own = jnp.where(side[k], 0, 1)
            own_row = unpack_params(table[own][None])
            if removed_score:
                own_score = family.log_predictive_removed(own_row, x)[0]
            else:
                own_score = family.log_predictive_from_params(x, family.params_remove(own_row, x))[0]
            other_score = family.log_predictive_from_params(x, unpack_params(table[1 - own][None]))[0]
            scores = jnp.where(jnp.arange(2) == own, own_score, other_score)
            counts_out = counts - (jnp.arange(2) == own).astype(counts.dtype)
            to_a, lq = choose(t, counts_out, scores)
            new = jnp.where(to_a, 0, 1)

            def move(table):
                down = pack_params(family.params_remove(own_row, x))[0]
                table = lax.dynamic_update_index_in_dim(table, down.astype(table.dtype), own, 0)
                up = pack_params(family.params_add(unpack_params(table[new][None]), x))[0]
                return lax.dynamic_update_index_in_dim(table, up.astype(table.dtype), new, 0)

            table = lax.cond(new != own, move, lambda t: t, table)
            counts = counts_out + (jnp.arange(2) == new).astype(counts.dtype)
            # casts keep the carry's dtypes when data and parameters differ (float32 data, x64 on)
            return side.at[k].set(to_a), table, counts, (log_q + lq).astype(log_q.dtype)

        state = pack_params(params)
    else:
        def body(t, carry):
            side, state, counts, log_q = carry
            k = where_in_scans(t)[2]
            x = X[k]
            member = jnp.stack([side[k], ~side[k]])
            state = (state - jnp.where(member[:, None], point_stats[k], 0.0)).astype(state.dtype)
            counts = counts - member.astype(counts.dtype)
            to_a, lq = choose(t, counts, family.log_predictive(x, unpack(state)))
            member = jnp.stack([to_a, ~to_a])
            state = (state + jnp.where(member[:, None], point_stats[k], 0.0)).astype(state.dtype)
            counts = counts + member.astype(counts.dtype)
            return side.at[k].set(to_a), state, counts, (log_q + lq).astype(log_q.dtype)

        state = stats

    log_q0 = jnp.zeros((), stats.dtype)
    side, _, _, log_q = lax.fori_loop(
        0, num_scans * num_moving, body, (side, state, counts, log_q0)
    )
    return side, log_q


def split_merge_move_info(
    key: jax.Array,
    clusters: ClusterState,
    X: jax.Array,
    measure: Measure,
    family,
    u: jax.Array | None = None,
    num_restricted_scans: int = 5,
    pair: tuple[Any, Any] | None = None,
) -> tuple[ClusterState, SplitMergeInfo]:
    """One Jain-Neal split-merge move; also returns a :class:`SplitMergeInfo`.

    Shapes: ``X`` ``(n, D)``; ``clusters`` with ``capacity`` slots; ``u`` a
    scalar (used by measures with ``has_auxiliary``, i.e. NGGP, and ignored
    otherwise). ``pair=(i, j)`` fixes the two chosen points (``i != j``)
    instead of drawing them, for tests and for composed moves. The statistics
    of the touched slots are recomputed from the points (no rounding drift).
    """
    X = jnp.asarray(X)
    num_restricted_scans = check_int("num_restricted_scans", num_restricted_scans)
    n = X.shape[0]
    labels, counts = clusters.labels, clusters.counts
    capacity = counts.shape[0]
    if n < 2:  # no pair to choose: nothing moves
        false, zero = jnp.array(False), jnp.zeros((), X.dtype)
        idx0 = jnp.zeros((), jnp.int32)
        return clusters, SplitMergeInfo(idx0, idx0, false, zero, zero, false)
    # one draw of uniforms for the whole move (one random-bits call keeps compilation short):
    # rows 0..R the restricted scans, row R+1 the launch coins, then the pair and the MH test
    num_rows = num_restricted_scans + 2
    uniforms = jax.random.uniform(key, (num_rows * n + 3,), X.dtype)
    scan_uniforms = uniforms[: num_rows * n].reshape(num_rows, n)
    if pair is None:
        # the same ordered pair undoes the move, so its law cancels from r (any law that
        # does not depend on the state is exact; float rounding of floor(u n) is harmless)
        i = jnp.minimum(jnp.floor(uniforms[-3] * n), n - 1).astype(jnp.int32)
        j = jnp.minimum(jnp.floor(uniforms[-2] * (n - 1)), n - 2).astype(jnp.int32)
        j = j + (j >= i)
    else:
        i, j = (jnp.asarray(p, jnp.int32) for p in pair)
    c_i, c_j = labels[i], labels[j]
    is_split = c_i == c_j
    points = jnp.arange(n)
    in_union = (labels == c_i) | (labels == c_j)
    in_s = in_union & (points != i) & (points != j)
    num_s = jnp.sum(in_s)
    # the members of S first, in index order: the scans loop over num_s of them only
    (order,) = jnp.nonzero(in_s, size=n, fill_value=0)

    pack, unpack = packer(family.point_stats(X[:1]))
    point_stats = pack(family.point_stats(X))  # (n, P)

    def two_clusters(side):
        # one segment sum over the points (A: 0, B: 1, the rest dropped as out of range)
        in_a, in_b = in_union & side, in_union & ~side
        stats = pack(family.stats_from_labels(X, jnp.where(in_a, 0, jnp.where(in_b, 1, 2)), 2))
        sizes = jnp.stack([jnp.sum(in_a), jnp.sum(in_b)]).astype(counts.dtype)
        return stats, sizes

    # launch state: S split uniformly at random, then the intermediate restricted scans;
    # it depends on i, j, S and the key only, not on how S is split now
    side = (points == i) | (in_s & (scan_uniforms[-1] < 0.5))
    log_uniforms = jnp.log(scan_uniforms[:-1])
    target = labels == c_i  # the current split (used by a merge's reverse probability)

    stats_ab, counts_ab = two_clusters(side)
    # the last scan draws the split (split) or scores the current split (merge)
    side, log_q = _restricted_scans(
        order, num_s, num_restricted_scans + 1, side, stats_ab, counts_ab, point_stats, X,
        log_uniforms, target, ~is_split, measure, family, unpack, u,
    )

    # log p(X, split) - log p(X, merged), statistics recomputed from the points
    stats_ab, counts_ab = two_clusters(side)
    stats_union = stats_ab[0] + stats_ab[1]
    log_marginals = family.log_marginal(
        unpack(jnp.concatenate([stats_ab, stats_union[None]], axis=0))
    )
    log_lik_ratio = log_marginals[0] + log_marginals[1] - log_marginals[2]
    free_slot, has_free = first_free_slot(counts)
    # one extra slot stands for "a new cluster" when none is free, so the ratio
    # (and hence whether a new slot is needed) is computed either way
    counts_ext = jnp.append(counts, jnp.zeros((1,), counts.dtype))
    new_slot = jnp.where(has_free, free_slot, capacity)
    counts_split = jnp.where(
        is_split, counts_ext.at[new_slot].set(counts_ab[0]).at[c_i].set(counts_ab[1]), counts_ext
    )
    counts_merged = jnp.where(
        is_split, counts_ext, counts_ext.at[c_i].set(0).at[c_j].set(counts_ab[0] + counts_ab[1])
    )
    u_joint = u if measure.has_auxiliary else None
    log_prior_ratio = measure.log_eppf(counts_split, u_joint) - measure.log_eppf(counts_merged, u_joint)
    log_split_over_merged = log_lik_ratio + log_prior_ratio
    log_ratio = jnp.where(is_split, log_split_over_merged - log_q, log_q - log_split_over_merged)
    wants = jnp.log(uniforms[-1]) < log_ratio
    no_slot = is_split & ~has_free
    accepted = wants & ~no_slot

    # the proposed state: split -> A to the free slot, B stays in c_i; merge -> all to c_j
    stats = pack(clusters.stats)
    proposed_labels = jnp.where(
        is_split,
        jnp.where(in_union & side, free_slot, labels),
        jnp.where(in_union, c_j, labels),
    ).astype(labels.dtype)
    proposed_counts = jnp.where(is_split, counts_split, counts_merged)[:capacity]
    proposed_stats = jnp.where(
        is_split,
        stats.at[free_slot].set(stats_ab[0]).at[c_i].set(stats_ab[1]),
        stats.at[c_i].set(0.0).at[c_j].set(stats_union),
    )
    new_stats = unpack(jnp.where(accepted, proposed_stats, stats))
    new_stats = jax.tree.map(lambda a, b: a.astype(b.dtype), new_stats, clusters.stats)
    new_clusters = ClusterState(
        jnp.where(accepted, proposed_labels, labels),
        jnp.where(accepted, proposed_counts, counts),
        new_stats,
        clusters.overflow | (wants & no_slot),
    )
    info = SplitMergeInfo(
        i.astype(jnp.int32), j.astype(jnp.int32), is_split, log_ratio, log_q, accepted
    )
    return new_clusters, info
