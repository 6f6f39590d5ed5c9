"""MAP-DP (Raykov et al. 2014): iterated conditional modes on the collapsed model (docs/mathematics.md §3).

Point ``i`` leaves its cluster and joins ``argmin_k d_ik`` with
``d_ik = −log p(x_i | X_k^{−i}) − log N_k^{−i}`` (new cluster:
``−log p(x_i) − log α``; Pitman-Yor: ``N_k − d`` and ``α + K d``). The
objective is ``NLL = −log p(X, Π)``.

Modes
-----
``sequential``
    The paper's sweep: each sweep visits
    the points in order (``lax.fori_loop`` via ``assignment_sweep``), remove /
    score / argmin / add. Each move is a coordinate-wise maximisation of the
    joint, so the NLL never increases. Stops when a sweep lowers the NLL by
    less than ``tol`` (or leaves the partition unchanged), or at ``max_iter``.
``batched``
    Points are visited in blocks of ``block_size``. All points of a block are
    scored at once against the statistics at the start of the block (each
    point's own cluster with the point left out): the batched Student-t step.
    Points whose best option is a new cluster go to one fresh cluster. With a
    ``NormalWishart`` family the block is scored against every cluster by one
    matrix product with the clusters' Cholesky factors of ``Ψ_n⁻¹``
    (``log_predictive_pairwise``), and each point's own cluster without it by a
    rank-one downdate of that cluster's cached parameters
    (``log_predictive_removed``), not a factorisation per point.
    **Rule:** the block's joint update is kept only if it does not increase
    the NLL; otherwise the block is redone sequentially (exact ICM), so the
    NLL never increases. ``block_size=1`` is the sequential algorithm.

Starting from one cluster (the paper's initialisation) MAP-DP can stay
there. A point leaves the big cluster only if ``α p(x) > (N−1) p(x | X)``:
with a vague prior on the cluster means the prior predictive ``p(x)`` is
wider than the one-cluster predictive, so with large ``N`` groups far from
the global mean are never peeled off one point at a time. Measured: four
well-separated 3-D Gaussian groups of 150 points stay in one cluster for
every NormalGamma prior tried, the true one included. Informative priors on
the cluster variances or larger ``α`` help; the UCI reproduction
(``benchmarks/``) reports what the paper's empirical rule gives.

Split moves (``split_moves=True``; on in ``MAPDP()``, off in :func:`fit`)
    When the sweeps have converged, every cluster proposes splits in two:
    its members are grouped by k-means (four proposals of 4 seeds drawn
    k-means++ style, ten Lloyd iterations on standardised coordinates, all
    clusters at once), and each group against the rest of the cluster is a
    candidate: a compact group can be peeled off a large cluster, which a
    2-means split of, e.g., a ring of clusters cannot do. The statistics of every
    (cluster, group) pair come from one pass over the points per proposal; a
    candidate's halves are sums of them.
    The exact change of ``log p(X, Π)`` of each candidate is computed
    (marginal likelihoods of the halves and the EPPF) and each cluster keeps
    its best candidate. The round keeps the
    best of three candidates, by exact NLL: every split that lowers the NLL,
    the single best split, or no split. Sweeps then start again; the run
    stops when a round keeps no split. Every step is a move to a partition
    with lower NLL, so the NLL still never increases, and MAP-DP escapes the
    one-cluster start.

Merge moves (``merge_moves=True``; on in ``MAPDP()``, off in :func:`fit`)
    When the sweeps have converged, every cluster scores merging with each of
    its 8 nearest clusters (centroid distance, standardised coordinates) by
    the exact change of ``log p(X, Π)``; pairs that chose each other with a
    positive gain are merged, keeping the best of "all those merges", "the
    single best merge" and "none" by exact NLL (``merge_round``). Rounds
    repeat until none merges; then sweeps again if something merged, else a
    split round. A run ends when neither a merge round nor a split round
    changes the partition (or at ``max_iter``). Merges bring an
    over-segmented start down to the right number of clusters.

Start (``init_clusters``; 32 in ``MAPDP()``, 1 in :func:`fit`)
    ``1`` is the paper's start (every point in one cluster). ``k > 1``: a
    k-means++ seeding of ``k`` centres in standardised coordinates, twenty
    Lloyd iterations (on at most ``LLOYD_SAMPLE`` points drawn with
    replacement), each point in the cluster of its nearest centre
    (``kmeanspp_labels``). This departs from the paper; the NLL trace starts
    at the NLL of that partition. With merge or split moves on, such a run
    starts with the merge and split rounds, then sweeps (and sweeps at least
    once): a start that put two groups in one cluster and one group in two is
    mended at once instead of after many sweeps that move the shared group's
    points a few at a time (10^6 x 10, 30 clusters: 8 iterations instead of 28).

Prior (``MAPDP(family=None)``, on standardised coordinates)
    :func:`default_prior`: a full-covariance ``NormalWishart`` (``m0`` = mean,
    ``r = 1/N`` as in the paper's empirical prior) whose expected cluster
    covariance is the within-group covariance of a 32-means clustering, worth
    ``D + 1`` points, instead of the data covariance (a departure: with the data
    covariance every cluster is a priori as wide as the data). The paper's
    diagonal NormalGamma with ``b0`` from a 2-means clustering is
    ``default_prior(X, covariance="diag", groups=2, weight=2)``, ``MAPDP()``'s default
    before (elongated clusters cost it a cluster per diagonal piece). When
    ``N < D (D + 1) / 2`` (:func:`default_covariance`) the default is the diagonal
    ``default_prior(X, covariance="diag")``: the full prior's variances, with its weight.

With ``split_moves=False``, ``merge_moves=False`` and ``init_clusters=1``
(:func:`fit`'s defaults; ``MAPDP.paper()``) and ``mode="sequential"`` a run
is the paper's algorithm exactly.

Padding (``num_points``): :func:`fit` can run on ``X`` followed by rows that are not points
(``MAPDP()`` pads to :func:`padded_size` rows, so that nearby sizes share one compiled
program). Those rows carry the label ``capacity``, outside every slot: segment sums drop
them, the sweeps stop after the points, the k-means++ start and the Lloyd iterations give
them no weight, and merge and split rounds leave their label alone. From the same start
and in index order the result is the unpadded fit's (tests/test_mapdp.py).

Restarts: ``n_restarts`` random point orders (and k-means++ seeds); sequential restarts are
``jax.vmap``-ed over PRNG keys, batched restarts run one after another
(``lax.map``) so that the fallback branch is only computed when taken. The
lowest NLL wins.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from ...models.measures import Measure
from .clusters import (
    ClusterState, cluster_log_joint, clusters_from_labels, first_free_slot, tree_index,
)
from .gibbs import assignment_sweep

__all__ = [
    "MAPDPResult",
    "negative_log_joint",
    "fit",
    "batched_sweep",
    "block_proposal",
    "block_delta",
    "predict_log_weights",
    "seed_labels",
    "merge_round",
    "split_round",
    "kmeanspp_labels",
    "default_prior",
    "default_covariance",
    "padded_size",
    "pad_rows",
]


class MAPDPResult(NamedTuple):
    """Result of one MAP-DP run.

    clusters: final ``ClusterState`` (``overflow`` set if capacity ran out).
    nll: final ``−log p(X, Π)``.
    n_iter: number of sweeps run (split rounds count as iterations too).
    nll_trace: ``(max_iter + 1,)`` NLL after each iteration (index 0 = initial), NaN after the end.
    """

    clusters: ClusterState
    nll: jax.Array
    n_iter: jax.Array
    nll_trace: jax.Array


def negative_log_joint(clusters: ClusterState, measure: Measure, family) -> jax.Array:
    """``−log p(X, Π) = −Σ_c log P(X_c) − log p(Π)`` from cluster statistics (docs/mathematics.md §2-3)."""
    return -cluster_log_joint(clusters, measure, family)


def batched_sweep(
    clusters: ClusterState, X: jax.Array, measure: Measure, family, block_size: int,
    order: jax.Array | None = None, num_points: jax.Array | None = None,
) -> ClusterState:
    """One batched MAP-DP sweep with the monotone block rule (module docstring).

    ``num_points`` (traced): only the first ``num_points`` entries of ``order`` are points
    (:func:`fit`'s padded rows come after them); the blocks after the last point are not run.
    """
    n = X.shape[0]
    capacity = clusters.counts.shape[0]
    order = jnp.arange(n) if order is None else order
    num_blocks = -(-n // block_size)
    pad = num_blocks * block_size - n
    # padding repeats the last point: masked out of the joint step, harmless in ICM
    padded = jnp.concatenate([order, jnp.full((pad,), order[-1], order.dtype)])
    valid_all = jnp.arange(num_blocks * block_size) < (n if num_points is None else num_points)
    prior_params = family.prior_predictive_params(X.shape[1], X.dtype)

    def block(b, st: ClusterState) -> ClusterState:
        idx = lax.dynamic_slice(padded, (b * block_size,), (block_size,))
        valid = lax.dynamic_slice(valid_all, (b * block_size,), (block_size,))
        xb = X[idx]
        own = st.labels[idx]
        proposal, overflow_new = block_proposal(
            st.counts, st.stats, xb, own, valid, measure, family, prior_params
        )
        overflow = st.overflow | overflow_new
        # joint update of the block
        delta_counts, delta = block_delta(family.point_stats(xb), valid, proposal, own, capacity,
                                          st.counts.dtype, X.dtype)
        joint = ClusterState(
            # only the valid entries: the padding repeats the last point, and a duplicate
            # index would write that point's old label over its proposal
            st.labels.at[jnp.where(valid, idx, n)].set(proposal, mode="drop"),
            st.counts + delta_counts,
            jax.tree.map(jnp.add, st.stats, delta),
            overflow,
        )
        ok = negative_log_joint(joint, measure, family) <= negative_log_joint(st, measure, family)
        # the fallback visits the block's points (with padded rows, the valid ones: a prefix)
        steps = None if num_points is None else jnp.sum(valid)
        return lax.cond(
            ok,
            lambda: joint,
            lambda: assignment_sweep(st, X, measure, family, order=idx, num_steps=steps),
        )

    blocks = num_blocks if num_points is None else (num_points + block_size - 1) // block_size
    return lax.fori_loop(0, blocks, block, clusters)


def block_proposal(
    counts: jax.Array, stats, xb: jax.Array, own: jax.Array, valid: jax.Array,
    measure: Measure, family, prior_params,
) -> tuple[jax.Array, jax.Array]:
    """The batched MAP-DP proposal of one block (module docstring, ``batched``).

    Every point of ``xb`` (``(B, D)``, currently in slots ``own``) is scored against
    the statistics ``counts``/``stats`` with itself left out of its own cluster;
    points whose best option is a new cluster all go to the first free slot (a point
    alone in its cluster keeps its own slot: that is its new cluster).
    Returns ``(proposal (B,), overflow)``: ``proposal`` equals ``own`` where
    ``valid`` is false; ``overflow`` is set when a valid point wanted a new
    cluster and no slot was free. Used by :func:`batched_sweep` and by the
    data-parallel sweep of :mod:`jaxbnp.inference.sharded`.
    """
    capacity = counts.shape[0]
    one_hot = jax.nn.one_hot(own, capacity, dtype=counts.dtype)
    counts_minus = counts[None, :] - one_hot
    log_existing, log_new = jax.vmap(lambda c: measure.gibbs_log_weights(c))(counts_minus)
    params = family.predictive_params(stats)
    # every point against every cluster (NormalWishart: one matrix product with the clusters'
    # Cholesky factors; the other families' default is a vmap of one point's predictive)
    log_pred = family.log_predictive_pairwise(xb, params)
    if hasattr(family, "log_predictive_removed"):
        # (NormalWishart) the own cluster without the point by a rank-one downdate of its
        # cached parameters: one quadratic form per point instead of a Cholesky
        # factorisation per point (docs/mathematics.md §2)
        own_params = jax.tree.map(lambda p: p[own], params)
        own_pred = family.log_predictive_removed(own_params, xb, family.removed_norms(counts[own]))
        # an outlier so far from its own cluster that the downdate's 1 - r q / (r - 1)
        # rounds to <= 0 leaves it (NaN otherwise); the block's NLL check stays exact
        own_pred = jnp.where(jnp.isnan(own_pred), -jnp.inf, own_pred)
    else:
        # own cluster with the point left out
        ps = family.point_stats(xb)
        own_stats = jax.tree.map(lambda s, p: s[own] - p, stats, ps)
        own_params = family.predictive_params(own_stats)
        own_pred = jax.vmap(
            lambda x, p: family.log_predictive_from_params(x, p)
        )(xb, own_params)
    log_pred = jnp.where(one_hot > 0, own_pred[:, None], log_pred)
    scores = jnp.where(counts_minus > 0, log_existing + log_pred, -jnp.inf)
    new_score = log_new + jax.vmap(
        lambda x: family.log_predictive_from_params(x, prior_params)[0]
    )(xb)
    free_slot, has_free = first_free_slot(counts)
    best = jnp.argmax(scores, axis=1)
    wants_new = new_score > jnp.max(scores, axis=1)
    # a point alone in its cluster frees its slot when it leaves: its "new cluster" is that
    # slot (with every slot in use, a free slot would wrongly look missing: overflow)
    alone = counts_minus[jnp.arange(own.shape[0]), own] == 0
    can_open = alone | has_free
    target = jnp.where(alone, own, free_slot)
    proposal = jnp.where(wants_new & can_open, target, best).astype(own.dtype)
    proposal = jnp.where(valid, proposal, own)
    return proposal, jnp.any(wants_new & valid & ~can_open)


def block_delta(ps, valid: jax.Array, proposal: jax.Array, own: jax.Array, capacity: int,
                count_dtype=jnp.int32, weight_dtype=None):
    """Change of ``(counts, stats)`` when the valid points of a block (point statistics
    ``ps``) move from slots ``own`` to slots ``proposal``; ``weight_dtype`` (default: the
    data's float dtype) is the dtype of the 0/1 weights that mask out invalid points."""
    w = valid.astype(weight_dtype or jnp.result_type(float))
    delta = jax.tree.map(
        lambda p: jax.ops.segment_sum(p * w.reshape((-1,) + (1,) * (p.ndim - 1)), proposal,
                                      num_segments=capacity)
        - jax.ops.segment_sum(p * w.reshape((-1,) + (1,) * (p.ndim - 1)), own,
                              num_segments=capacity),
        ps,
    )
    delta_counts = (
        jax.ops.segment_sum(valid.astype(count_dtype), proposal, num_segments=capacity)
        - jax.ops.segment_sum(valid.astype(count_dtype), own, num_segments=capacity)
    )
    return delta_counts, delta


LLOYD_SAMPLE = 16384  # points used by the split proposals' Lloyd iterations


def lloyd_sample(key: jax.Array, n: int, m: int, num_points: jax.Array | None = None) -> jax.Array:
    """``m`` of the ``n`` point indices for the Lloyd iterations: all of them when ``m == n``,
    else ``m`` drawn uniformly with replacement (sampling without replacement shuffles all
    ``n`` indices, three sorts of ``n`` keys: seconds at ``n = 10^6`` on a CPU). With
    ``num_points`` (traced; :func:`fit`'s padded rows), the ``m`` are drawn from the first
    ``num_points`` rows."""
    if m >= n:
        return jnp.arange(n)
    return jax.random.randint(key, (m,), 0, n if num_points is None else num_points)


def _seg_argmax(values: jax.Array, labels: jax.Array, capacity: int) -> jax.Array:
    """Index of the member with the largest ``values`` in each slot (0 for empty slots)."""
    n = values.shape[0]
    best = jax.ops.segment_max(values, labels, num_segments=capacity)
    cand = jnp.where(values == best[labels], jnp.arange(n), -1)
    return jnp.maximum(jax.ops.segment_max(cand, labels, num_segments=capacity), 0)


def _propose_split(key, clusters, Xs, X, measure, family, num_seeds, lloyd_iters, num_points=None):
    """One two-way split proposal per slot: ``(side (n,), gain (capacity,))``.

    Every slot's members are clustered into ``num_seeds`` groups (k-means++
    seeds, Lloyd iterations in standardised coordinates, all slots at once).
    The candidate splits are "group ``j`` against the rest of the slot" for
    each ``j`` (with two seeds: the 2-means split); each slot keeps its best.
    ``gain[c]`` is the exact increase of ``log p(X, Π)`` if slot ``c`` alone is
    split into its points with ``side == 0`` and ``side == 1`` (−inf if a half
    is empty).
    """
    n = X.shape[0]
    labels, counts = clusters.labels, clusters.counts
    capacity = counts.shape[0]
    keys = jax.random.split(key, num_seeds + 1)
    # k-means++ seeding inside every slot: a random member, then members drawn
    # with probability proportional to the squared distance to the nearest seed
    seeds = [_seg_argmax(jax.random.gumbel(keys[0], (n,), X.dtype), labels, capacity)]
    nearest = jnp.full((n,), jnp.inf, X.dtype)
    for j in range(1, num_seeds):
        nearest = jnp.minimum(nearest, jnp.sum((Xs - Xs[seeds[-1][labels]]) ** 2, axis=1))
        log_d = jnp.where(nearest > 0, jnp.log(jnp.where(nearest > 0, nearest, 1.0)), -jnp.inf)
        seeds.append(_seg_argmax(log_d + jax.random.gumbel(keys[j], (n,), X.dtype), labels, capacity))

    def assign(mu, Y, lab):
        d2 = jnp.sum((Y[:, None, :] - mu[lab]) ** 2, axis=-1)  # (points, num_seeds)
        return jnp.argmin(d2, axis=1).astype(labels.dtype)

    # Lloyd iterations on a random subsample of at most LLOYD_SAMPLE points
    m = min(n, LLOYD_SAMPLE)
    idx = lloyd_sample(keys[-1], n, m, num_points)
    # (padded rows, whose label is ``capacity``, fall outside every segment below)
    Ysub, lab_sub = Xs[idx], labels[idx]
    segs = num_seeds * capacity

    def lloyd(_, mu):
        sub = lab_sub * num_seeds + assign(mu, Ysub, lab_sub)
        tot = jax.ops.segment_sum(Ysub, sub, num_segments=segs)
        cnt = jax.ops.segment_sum(jnp.ones(m, X.dtype), sub, num_segments=segs)
        new = (tot / jnp.maximum(cnt, 1.0)[:, None]).reshape(capacity, num_seeds, -1)
        return jnp.where(cnt.reshape(capacity, num_seeds, 1) > 0, new, mu)

    mu = lax.fori_loop(0, lloyd_iters, lloyd, jnp.stack([Xs[a] for a in seeds], axis=1))
    group = assign(mu, Xs, labels)
    base_lm = family.log_marginal(clusters.stats)
    ext = jnp.concatenate([counts, jnp.zeros(1, counts.dtype)])
    base = measure.log_eppf(ext)

    # the statistics of every (slot, group) pair, in one pass over the points; a candidate's
    # halves are one group and the sum of the others (not a pass over the points each)
    pair = labels * num_seeds + group
    group_stats = jax.tree.map(
        lambda a: a.reshape((capacity, num_seeds) + a.shape[1:]),
        family.stats_from_labels(X, pair, capacity * num_seeds),
    )
    group_counts = jax.ops.segment_sum(jnp.ones_like(labels), pair, num_segments=capacity * num_seeds)
    group_counts = group_counts.reshape(capacity, num_seeds).astype(counts.dtype)

    def candidate(j):
        mine = jnp.arange(num_seeds) == j

        def halves(a):
            m = mine.reshape((1, num_seeds) + (1,) * (a.ndim - 2))
            return jnp.stack([jnp.sum(jnp.where(m, 0, a), 1, dtype=a.dtype),
                              jnp.sum(jnp.where(m, a, 0), 1, dtype=a.dtype)], 1)

        sub_counts = halves(group_counts)  # (capacity, 2): the rest, group j
        sub_lm = family.log_marginal(jax.tree.map(halves, group_stats))
        delta_lik = sub_lm.sum(1) - base_lm
        delta_prior = jax.vmap(
            lambda c, n0, n1: measure.log_eppf(ext.at[c].set(n0).at[capacity].set(n1)) - base
        )(jnp.arange(capacity), sub_counts[:, 0], sub_counts[:, 1])
        valid = (sub_counts[:, 0] > 0) & (sub_counts[:, 1] > 0)
        return jnp.where(valid, delta_lik + delta_prior, -jnp.inf)

    # with two seeds "group 1 vs rest" is the same split as "group 0 vs rest"
    gains = jax.vmap(candidate)(jnp.arange(1 if num_seeds == 2 else num_seeds))
    best = jnp.argmax(gains, axis=0)  # (capacity,)
    side = (group == best[labels]).astype(labels.dtype)
    return side, jnp.max(gains, axis=0)


def split_round(
    key: jax.Array, clusters: ClusterState, X: jax.Array, measure: Measure, family,
    scale: jax.Array, seeds: tuple[int, ...] = (4, 4, 4, 4), lloyd_iters: int = 10,
    num_points: jax.Array | None = None,
) -> ClusterState:
    """One round of split moves (module docstring); never increases the NLL.

    ``clusters.stats`` must match the labels. ``scale`` is a per-dimension
    scale for the proposal's distances (the data's standard deviation). Each
    cluster gets one proposal per entry of ``seeds`` (``_propose_split`` with
    that many k-means seeds: 2 gives the 2-means split, more seeds let a
    compact group be peeled off a large cluster) and keeps its best. When
    there are fewer free slots than good splits, the best splits are made and
    the others are proposed again in a later round; with no free slot at all,
    ``overflow`` is set. Rows labelled ``capacity`` (:func:`fit`'s padded rows; then
    ``num_points`` is the number of points before them) are not points and keep that label.
    """
    labels, counts = clusters.labels, clusters.counts
    capacity = counts.shape[0]
    n = X.shape[0]
    Xs = X / scale
    keys = jax.random.split(key, len(seeds))
    sides, gains = [], []
    for m in sorted(set(seeds)):  # proposals with the same number of seeds are vmapped
        ks = keys[jnp.asarray([i for i, v in enumerate(seeds) if v == m])]
        sd, g = jax.vmap(
            lambda k: _propose_split(k, clusters, Xs, X, measure, family, m, lloyd_iters,  # noqa: B023
                                     num_points)
        )(ks)
        sides.append(sd)
        gains.append(g)
    sides, gains = jnp.concatenate(sides), jnp.concatenate(gains)
    best = jnp.argmax(gains, axis=0)
    gain = jnp.max(gains, axis=0)
    side = sides[best[labels], jnp.arange(n)]

    free = counts == 0
    free_slots = jnp.argsort(~free, stable=True)  # free slots first, in order
    num_free = jnp.sum(free)
    # the best splits take the free slots; the others wait for a later round
    gain_rank = jnp.argsort(jnp.argsort(-gain, stable=True), stable=True)

    def propose(accept):
        fits = accept & (gain_rank < num_free)
        target = free_slots[jnp.clip(jnp.cumsum(fits) - 1, 0, capacity - 1)]
        # a padded row (label ``capacity``) reads the appended False and keeps its label
        moves = jnp.append(fits, False)[labels] & (side == 1)
        new_labels = jnp.where(moves, target[jnp.minimum(labels, capacity - 1)], labels)
        st = clusters_from_labels(family, X, new_labels, capacity,
                                  clusters.overflow | (jnp.any(accept) & (num_free == 0)))
        return st, negative_log_joint(st, measure, family)

    all_st, all_nll = propose(gain > 0)
    one_st, one_nll = propose((jnp.arange(capacity) == jnp.argmax(gain)) & (gain > 0))
    nll0 = negative_log_joint(clusters, measure, family)
    # no free slot for a split that would lower the NLL: keep the state but
    # flag it, so that the caller grows the capacity and refits
    full = all_st.overflow & ~clusters.overflow
    pick_all = all_nll < jnp.minimum(one_nll, nll0)
    pick_one = ~pick_all & (one_nll < nll0)
    out = jax.tree.map(
        lambda x, y, z: jnp.where(pick_all, x, jnp.where(pick_one, y, z)), all_st, one_st, clusters
    )
    return out._replace(overflow=out.overflow | full)


def kmeanspp_labels(key: jax.Array, Xs: jax.Array, k: int, lloyd_iters: int = 20,
                    num_points: jax.Array | None = None) -> jax.Array:
    """Labels ``(n,)`` in ``0..k-1``: k-means++ seeding, then ``lloyd_iters`` Lloyd iterations.

    ``Xs`` are standardised coordinates. Seeding and Lloyd iterations use a random
    subsample of at most ``LLOYD_SAMPLE`` points; every point then goes to its
    nearest centre. Duplicate seeds leave some labels unused (empty slots).
    ``num_points`` (traced): only the first ``num_points`` rows are points (:func:`fit`'s
    padded rows after them are never seeds and weigh nothing in the Lloyd means).
    """
    n, _ = Xs.shape
    m = min(n, LLOYD_SAMPLE)
    k_sub, k_first, k_seed = jax.random.split(key, 3)
    Y = Xs[lloyd_sample(k_sub, n, m, num_points)] if m < n else Xs
    # Y holds padded rows only when it is all of Xs (a subsample is drawn from the points)
    masked = num_points is not None and m == n
    w = (jnp.arange(m) < num_points).astype(Xs.dtype) if masked else jnp.ones(m, Xs.dtype)

    def sqdist(A, mu):  # (points, k) squared distances without a (points, k, D) tensor
        return jnp.maximum(
            jnp.sum(A * A, 1)[:, None] - 2.0 * A @ mu.T + jnp.sum(mu * mu, 1)[None, :], 0.0
        )

    first = jax.random.randint(k_first, (), 0, num_points if masked else m)
    seeds = jnp.zeros((k, Xs.shape[1]), Xs.dtype).at[0].set(Y[first])
    nearest = jnp.sum((Y - Y[first]) ** 2, axis=1) * w  # a padded row is never a seed

    def seed(j, carry):
        mu, near = carry
        log_d = jnp.where(near > 0, jnp.log(jnp.where(near > 0, near, 1.0)), -jnp.inf)
        i = jnp.argmax(log_d + jax.random.gumbel(jax.random.fold_in(k_seed, j), (m,), Xs.dtype))
        return mu.at[j].set(Y[i]), jnp.minimum(near, jnp.sum((Y - Y[i]) ** 2, axis=1) * w)

    seeds, _ = lax.fori_loop(1, k, seed, (seeds, nearest))

    def lloyd(_, mu):
        a = jnp.argmin(sqdist(Y, mu), axis=1)
        tot = jax.ops.segment_sum(Y * w[:, None], a, num_segments=k)
        cnt = jax.ops.segment_sum(w, a, num_segments=k)
        return jnp.where(cnt[:, None] > 0, tot / jnp.maximum(cnt, 1.0)[:, None], mu)

    mu = lax.fori_loop(0, lloyd_iters, lloyd, seeds)
    return jnp.argmin(sqdist(Xs, mu), axis=1).astype(jnp.int32)


def merge_round(
    clusters: ClusterState, X: jax.Array, measure: Measure, family, scale: jax.Array,
    num_partners: int = 8,
) -> ClusterState:
    """One round of merge moves; never increases the NLL.

    Every cluster is paired with each of its ``num_partners`` nearest clusters
    (centroid distance in coordinates divided by ``scale``) and the exact change
    of ``log p(X, Π)`` of merging the pair is computed (marginal likelihoods and
    the EPPF). Each cluster picks its best partner; pairs that picked each other
    with a positive gain are candidates (disjoint). The round keeps the best of
    three partitions by exact NLL: all those merges, the single best merge, or
    no merge. ``clusters.stats`` must match the labels. Rows labelled ``capacity``
    (:func:`fit`'s padded rows) are not points and keep that label.
    """
    labels, counts, stats = clusters.labels, clusters.counts, clusters.stats
    capacity = counts.shape[0]
    m = max(1, min(int(num_partners), capacity - 1))
    active = counts > 0
    cent = jax.ops.segment_sum(X / scale, labels, num_segments=capacity)
    cent = cent / jnp.maximum(counts, 1).astype(X.dtype)[:, None]
    sq = jnp.sum(cent * cent, 1)
    d2 = sq[:, None] - 2.0 * cent @ cent.T + sq[None, :]
    ok = active[:, None] & active[None, :] & ~jnp.eye(capacity, dtype=bool)
    d2 = jnp.where(ok, d2, jnp.inf)
    neg, partners = lax.top_k(-d2, m)  # (capacity, m)
    pair_ok = jnp.isfinite(neg)
    merged = jax.tree.map(
        lambda s: (s[:, None] + s[partners]).reshape((capacity * m,) + s.shape[1:]), stats
    )
    base_lm = family.log_marginal(stats)
    lm = family.log_marginal(merged).reshape(capacity, m)
    delta_lik = lm - base_lm[:, None] - base_lm[partners]
    base = measure.log_eppf(counts)
    rows = jnp.repeat(jnp.arange(capacity), m)
    cols = partners.reshape(-1)
    delta_prior = jax.vmap(
        lambda c, p: measure.log_eppf(counts.at[c].add(counts[p]).at[p].set(0)) - base
    )(rows, cols).reshape(capacity, m)
    gain = jnp.where(pair_ok, delta_lik + delta_prior, -jnp.inf)
    j = jnp.argmax(gain, axis=1)
    best_partner = partners[jnp.arange(capacity), j]
    best_gain = gain[jnp.arange(capacity), j]
    slots = jnp.arange(capacity)
    mutual = (best_partner[best_partner] == slots) & (slots < best_partner) & (best_gain > 0)

    def propose(accept):
        target = slots.at[jnp.where(accept, best_partner, capacity)].set(slots, mode="drop")
        target = jnp.append(target, capacity)  # a padded row keeps the label ``capacity``
        st = clusters_from_labels(family, X, target[labels], capacity, clusters.overflow)
        return st, negative_log_joint(st, measure, family)

    all_st, all_nll = propose(mutual)
    top = jnp.argmax(best_gain)
    one_st, one_nll = propose((slots == top) & (best_gain > 0))
    nll0 = negative_log_joint(clusters, measure, family)
    pick_all = all_nll < jnp.minimum(one_nll, nll0)
    pick_one = ~pick_all & (one_nll < nll0)
    return jax.tree.map(
        lambda x, y, z: jnp.where(pick_all, x, jnp.where(pick_one, y, z)), all_st, one_st, clusters
    )


def _one_run(
    key, X, measure, family, capacity, order, mode, block_size, tol, max_iter, split_moves,
    merge_moves=False, init_clusters=1, init_labels=None, num_points=None,
) -> MAPDPResult:
    if num_points is None:
        centre, std = jnp.mean(X, axis=0), jnp.std(X, axis=0)
    else:  # the first num_points rows are the points (fit's padded rows)
        valid = jnp.arange(X.shape[0]) < num_points
        w = valid.astype(X.dtype)[:, None]
        centre = jnp.sum(X * w, axis=0) / num_points
        std = jnp.sqrt(jnp.sum(((X - centre) * w) ** 2, axis=0) / num_points)
    scale = jnp.where(std > 0, std, 1.0)
    if init_labels is not None:
        labels0 = init_labels.astype(jnp.int32)
    elif init_clusters > 1:
        labels0 = kmeanspp_labels(jax.random.fold_in(key, 0x5EED), (X - centre) / scale,
                                  min(init_clusters, capacity, X.shape[0]), num_points=num_points)
    else:
        labels0 = jnp.zeros(X.shape[0], jnp.int32)
    if num_points is not None:  # padded rows sit in no slot: outside every segment sum
        labels0 = jnp.where(valid, labels0, capacity)
    state = clusters_from_labels(family, X, labels0, capacity)
    nll0 = negative_log_joint(state, measure, family)
    trace0 = jnp.full((max_iter + 1,), jnp.nan, X.dtype).at[0].set(nll0)
    moves = split_moves or merge_moves
    # phases: 0 sweep, 1 merge round, 2 split round
    first_move = 1 if merge_moves else 2

    def sweep(st):
        if mode == "sequential":
            return assignment_sweep(st, X, measure, family, order=order, num_steps=num_points)
        return batched_sweep(st, X, measure, family, block_size, order=order, num_points=num_points)

    def step(phase, st, it):
        branches = [sweep]
        branches.append((lambda s: merge_round(s, X, measure, family, scale)) if merge_moves
                        else (lambda s: s))
        branches.append(
            (lambda s: split_round(jax.random.fold_in(key, it), s, X, measure, family, scale,
                                   num_points=num_points))
            if split_moves else (lambda s: s)
        )
        if not moves:
            return sweep(st)
        return lax.switch(phase, branches, st)

    def cond(carry):
        return (carry[3] < max_iter) & ~carry[5]

    def body(carry):
        st, nll, _, it, phase, _, trace, merged, swept = carry
        new = step(phase, st, it)
        # statistics rebuilt from the labels: the NLL is exact, not a sum of updates
        new = new._replace(stats=family.stats_from_labels(X, new.labels, capacity))
        new_nll = negative_log_joint(new, measure, family)
        changed = jnp.any(new.labels != st.labels)
        converged = (nll - new_nll < tol) | ~changed
        if not moves:
            done = converged
            next_phase = phase
        else:
            # sweep -> (converged) merge rounds -> (none left) split round -> sweep ...
            # the run ends when neither a merge round nor a split round changes anything
            after_merge = jnp.where(
                changed, 1, jnp.where(merged, 0, 2 if split_moves else 0)
            )
            done = jnp.where(
                phase == 0, False,
                jnp.where(phase == 1, ~changed & ~merged & (not split_moves), ~changed),
            )
            next_phase = jnp.where(
                phase == 0, jnp.where(converged, first_move, 0),
                jnp.where(phase == 1, after_merge, 0),
            ).astype(jnp.int32)
            merged = jnp.where(phase == 1, merged | changed, False)
            # a run that starts with merge and split rounds sweeps at least once
            done = done & (swept | (phase == 0))
        swept = swept | (phase == 0)
        return (new, new_nll, nll, it + 1, next_phase, done, trace.at[it + 1].set(new_nll),
                merged, swept)

    # a k-means++ start goes through merge and split rounds before the first sweep: a start
    # that put two groups in one cluster and one group in two is mended at once, instead of
    # after many sweeps that move the shared group's points a few at a time
    start_moves = moves and init_clusters > 1 and init_labels is None
    init = (state, nll0, jnp.asarray(jnp.inf, X.dtype), jnp.int32(0),
            jnp.int32(first_move if start_moves else 0), jnp.array(False), trace0,
            jnp.array(False), jnp.array(not start_moves))
    st, nll, _, it, _, _, trace, _, _ = lax.while_loop(cond, body, init)
    return MAPDPResult(st, nll, it, trace)


@functools.partial(
    jax.jit, static_argnames=("capacity", "mode", "n_restarts", "max_iter", "block_size", "shuffle",
                     "split_moves", "merge_moves", "init_clusters")
)
def fit(
    key: jax.Array,
    X: jax.Array,
    measure: Measure,
    family,
    capacity: int,
    mode: str = "sequential",
    n_restarts: int = 1,
    tol: float = 1e-6,
    max_iter: int = 1000,
    block_size: int = 4096,
    shuffle: bool | None = None,
    split_moves: bool = False,
    merge_moves: bool = False,
    init_clusters: int = 1,
    init_labels: jax.Array | None = None,
    num_points: jax.Array | int | None = None,
) -> tuple[MAPDPResult, MAPDPResult]:
    """Run MAP-DP ``n_restarts`` times; return ``(best, all_runs)``.

    The first restart visits points in index order unless ``shuffle=True``
    (default: shuffle only when ``n_restarts > 1``); the others use random
    permutations drawn from ``key``. ``all_runs`` has a leading restart axis.
    The defaults (one-cluster start, no merge or split moves) are the paper's
    algorithm; ``MAPDP()`` calls this with ``mode="batched"``, ``split_moves``,
    ``merge_moves`` and ``init_clusters=32`` (module docstring).

    ``init_labels``: an ``(n,)`` start in slots ``0 .. capacity - 1`` (e.g.
    :func:`seed_labels` of a subsample's fit), used instead of the one-cluster
    or k-means++ start; such a run starts with sweeps.

    ``num_points`` (a traced integer; default all rows): only the first ``num_points`` rows
    of ``X`` are points, the rows after them are padding (any values the family accepts).
    Padding every data set to a few sizes (:func:`padded_size`) lets fits of different
    sizes share one compiled program, as ``MAPDP()`` does. Padded rows sit in no cluster:
    their label in the result is ``capacity``, and they count in no statistic, no NLL and
    no sweep (each sweep visits the points in a random order of its own, then the rows).
    """
    n = X.shape[0]
    if shuffle is None:
        shuffle = n_restarts > 1
    keys = jax.random.split(key, n_restarts)
    orders = jax.vmap(lambda k: jax.random.permutation(k, n))(keys)
    if num_points is not None:
        num_points = jnp.asarray(num_points, jnp.int32)
        # the points first, in the permutation's order (a uniform order of the points)
        orders = jax.vmap(lambda o: o[jnp.argsort(o >= num_points, stable=True)])(orders)
    if not shuffle:
        orders = orders.at[0].set(jnp.arange(n))
    run = lambda ko: _one_run(  # noqa: E731
        ko[0], X, measure, family, capacity, ko[1], mode, block_size, tol, max_iter, split_moves,
        merge_moves, init_clusters, init_labels, num_points,
    )
    if n_restarts == 1:  # no batching: lax.cond runs one branch (under vmap it runs both)
        runs = jax.tree.map(lambda x: x[None], run((keys[0], orders[0])))
    elif mode == "sequential":
        runs = jax.vmap(run)((keys, orders))
    else:
        runs = lax.map(run, (keys, orders))
    best = jnp.argmin(jnp.where(runs.clusters.overflow, jnp.inf, runs.nll))
    return tree_index(runs, best), runs


@jax.jit
def predict_log_weights(
    X_new: jax.Array, clusters: ClusterState, measure: Measure, family
) -> tuple[jax.Array, jax.Array]:
    """Log weights of each new point joining each cluster (``(m, capacity)``) or a new one (``(m,)``).

    ``log N_k + log p(x* | X_k)`` and ``log α + log p(x*)`` (docs/mathematics.md §3; Pitman-Yor:
    ``N_k − d`` and ``α + K d``). Empty slots get ``−inf``. Normalising over
    ``capacity + 1`` entries gives the mixture predictive's responsibilities,
    and ``logsumexp − log(N + α)`` its log density (DP).
    """
    log_existing, log_new = measure.gibbs_log_weights(clusters.counts)
    params = family.predictive_params(clusters.stats)
    prior_params = family.prior_predictive_params(X_new.shape[1], X_new.dtype)
    # every point against every cluster (NormalWishart: one matrix product with the clusters'
    # Cholesky factors; the other families' default is this vmap of one point's predictive)
    log_pred = family.log_predictive_pairwise(X_new, params)
    log_prior = jax.vmap(lambda x: family.log_predictive_from_params(x, prior_params)[0])(X_new)
    existing = jnp.where(clusters.counts > 0, log_existing + log_pred, -jnp.inf)
    return existing, log_new + log_prior


@functools.partial(jax.jit, static_argnames=("block_size",))
def seed_labels(X: jax.Array, seed: ClusterState, measure: Measure, family,
                block_size: int = 4096) -> jax.Array:
    """Each point in the occupied cluster of ``seed`` (e.g. a subsample's fit) with the largest
    MAP-DP weight ``log N_k + log p(x | X_k)`` (:func:`predict_log_weights`), ``block_size``
    points at a time: the start of a fit of all points from a fit of a few."""

    def best(x):
        return jnp.argmax(predict_log_weights(x[None], seed, measure, family)[0][0]).astype(jnp.int32)

    return lax.map(best, X, batch_size=block_size)


#: the smallest size :func:`padded_size` pads to
PADDED_MIN = 128


def pad_rows(a, rows: int):
    """``a`` (a NumPy array) followed by copies of its first row, ``rows`` rows in all: the
    padding of :func:`fit`'s ``num_points`` (see :func:`padded_size`)."""
    import numpy as np

    return np.concatenate([a, np.repeat(a[:1], rows - len(a), axis=0)])


def padded_size(n: int) -> int:
    """The number of rows ``MAPDP()`` pads ``n`` points to, so that data sets of nearby sizes
    share one compiled program (:func:`fit`'s ``num_points``): ``PADDED_MIN`` (128) up to
    128 points, then the smallest ``m 2^k >= n`` with ``8 <= m <= 15`` (eight sizes per
    doubling: at most 1/8 of the rows are padding)."""
    n = int(n)
    if n <= PADDED_MIN:
        return PADDED_MIN
    k = max(0, n.bit_length() - 4)
    m = -(-n // (1 << k))  # ceil(n / 2^k), 8..16
    return m << k


PRIOR_GROUPS = 32  # k-means groups (at most) behind the default prior's within-cluster covariance
PRIOR_POINTS_PER_GROUP = 20  # ... and, for the diagonal prior, at least this many points per group
PRIOR_SAMPLE = 4096  # points (at most) the default prior rule looks at


def default_covariance(n: int, d: int) -> str:
    """The covariance of ``MAPDP()``'s default prior for ``n`` points in ``d`` dimensions:
    ``"full"`` when ``n >= d (d + 1) / 2``, else ``"diag"``.

    A full covariance has ``d (d + 1) / 2`` free entries. With fewer points than that in the
    whole data set, no cluster's covariance is identified by its own points and the prior
    decides it (digits, 1,797 points in 64-D, 2,080 entries: NMI 0.55 with the full prior,
    0.65 with the diagonal one; breast cancer, 569 points in 30-D, 465 entries: 0.52 full,
    0.31 diagonal; docs/benchmarks.md)."""
    return "full" if 2 * int(n) >= int(d) * (int(d) + 1) else "diag"


def _within_group_residuals(X, groups: int, seed: int):
    """``(Y − centre of its group, var)``: the rows ``Y`` of ``X`` (at most ``PRIOR_SAMPLE``,
    drawn with ``seed``) minus the mean of their group in a ``groups``-means clustering
    (k-means++ seeds, Lloyd iterations, in standardised coordinates), and ``var``, the
    per-column variance of ``X`` (1 where a column is constant). NumPy only, deterministic."""
    import numpy as np

    X = np.asarray(X, dtype=float)
    n = X.shape[0]
    var = X.var(axis=0)
    var = np.where(var > 0, var, 1.0)
    rng = np.random.default_rng(seed)
    Y = X[rng.choice(n, PRIOR_SAMPLE, replace=False)] if n > PRIOR_SAMPLE else X
    Z = (Y - Y.mean(axis=0)) / np.sqrt(var)
    m = Z.shape[0]
    k = max(1, min(int(groups), m))
    mu = Z[[rng.integers(m)]]
    near = np.sum((Z - mu[0]) ** 2, axis=1)
    for _ in range(1, k):
        total = near.sum()
        i = rng.choice(m, p=near / total) if total > 0 else rng.integers(m)
        mu = np.vstack([mu, Z[i]])
        near = np.minimum(near, np.sum((Z - Z[i]) ** 2, axis=1))
    zz = np.sum(Z * Z, axis=1)[:, None]

    def nearest(mu):  # |z − μ|² = |z|² − 2 z·μ + |μ|²: no (m, k, D) array (k = 32, D in the 1,000s)
        return np.argmin(zz - 2.0 * (Z @ mu.T) + np.sum(mu * mu, axis=1)[None], axis=1)

    for _ in range(20):
        a = nearest(mu)
        new = np.array([Z[a == j].mean(axis=0) if np.any(a == j) else mu[j] for j in range(k)])
        if np.allclose(new, mu):
            break
        mu = new
    a = nearest(mu)
    centres = np.array([Y[a == j].mean(axis=0) if np.any(a == j) else Y.mean(axis=0) for j in range(k)])
    return Y - centres[a], var, k


def default_prior(X, groups: int | None = None, seed: int = 0, covariance: str = "full",
                  weight: float | None = None):
    """The default prior of :class:`jaxbnp.estimators.MAPDP` (``family=None``), docs/mathematics.md §3.

    A prior whose cluster covariance is the *within-group* covariance ``W`` of a
    ``groups``-means clustering (k-means++ seeds, Lloyd iterations, in standardised
    coordinates, on at most ``PRIOR_SAMPLE`` points drawn with ``seed``), not that of the
    whole data set (the MAP-DP paper's empirical prior, and ``from_data``): with the total
    covariance the prior says every cluster is as wide as the data, so that splitting a
    cluster rarely pays. ``groups``: ``None`` means ``PRIOR_GROUPS`` (32, as many as
    ``MAPDP()``'s start has clusters); for ``"diag"`` at most one group per
    ``PRIOR_POINTS_PER_GROUP`` (20) points, and at least 2. With fewer groups than clusters,
    ``W`` holds the spread between the clusters a group joins, and a prior as strong as this
    one then merges them (30 groups in 10-D: NMI 0.89 with 2 or 8 groups, 1.00 with 32).
    With many more groups than clusters, k-means cuts each cluster into pieces narrower
    than it; the diagonal prior is the default where there are few points for the
    dimension (``N < D (D + 1) / 2``), where a prior worth ``D + 1`` points weighs as much
    as a small cluster's own points and then cuts the clusters too (40 points in 10-D, 2
    clusters: ``MAPDP()`` finds 11 with 32 groups, 2 with 2;
    ``benchmarks/results/diag_prior_small.md``). Deterministic; uses no labels; NumPy and
    scikit-learn only.

    ``weight``: how many points the prior on the covariance is worth; ``None`` means
    ``D + 1`` (more as a covariance has more entries).

    ``covariance="full"`` (``MAPDP()``'s default, which calls it on standardised data):
    ``NormalWishart(m0 = mean, r = 1/N, ν = D + 1 + weight, Ψ = weight · W)``, so that
    ``E[Σ] = W``, with ``W`` the Ledoit-Wolf estimate from the residuals (positive definite
    with constant or collinear columns; a column with no within-group variance gets
    variance ``var`` and no covariance).

    ``covariance="diag"`` (the default of ``MAPDP()`` and of the samplers when
    ``N < D (D + 1) / 2``): ``NormalGamma(m0 = mean, k0 = 1/N, a0 = weight / 2,
    b0 = a0 diag W)``, the full prior's variances with its weight (each precision
    ``λ_d ~ Gamma(a0, rate b0)``, ``E[λ_d] = 1 / W_dd``, worth ``2 a0`` points).
    ``MAPDP()``'s diagonal default before, the paper's NormalGamma with ``b0`` the
    within-group variance of 2 groups instead of the whole data's variance, is
    ``default_prior(X, covariance="diag", groups=2, weight=2)``.
    """
    import numpy as np

    from ...models.families import NormalGamma, NormalWishart

    if covariance not in ("full", "diag"):
        raise ValueError(f"covariance must be 'full' or 'diag', got {covariance!r}.")
    X = np.asarray(X, dtype=float)
    n, d = X.shape
    if groups is None:
        groups = PRIOR_GROUPS
        if covariance == "diag":
            groups = max(2, min(PRIOR_GROUPS, n // PRIOR_POINTS_PER_GROUP))
    weight = d + 1.0 if weight is None else float(weight)
    if not weight > 0:
        raise ValueError(f"default_prior: weight must be positive, got {weight}.")
    R, var, k = _within_group_residuals(X, groups, seed)
    m = R.shape[0]
    within = np.sum(R ** 2, axis=0) / max(m - k, 1)
    flat = ~(within > 1e-6 * var)  # no within-group variance: the column's own variance
    if covariance == "diag":
        a0 = weight / 2.0
        return NormalGamma(m0=X.mean(axis=0), k0=1.0 / n, a0=a0, b0=a0 * np.where(flat, var, within))
    from sklearn.covariance import ledoit_wolf

    W = np.atleast_2d(ledoit_wolf(R, assume_centered=True)[0]) if m > 1 else np.diag(var)
    W[flat, :] = 0.0
    W[:, flat] = 0.0
    W[flat, flat] = var[flat]
    nu = d + 1.0 + weight
    psi = weight * W
    return NormalWishart(m0=X.mean(axis=0), r=1.0 / n, nu=nu, psi=0.5 * (psi + psi.T))
