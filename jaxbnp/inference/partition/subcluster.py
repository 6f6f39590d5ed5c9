"""Sub-cluster split/merge MCMC (Chang & Fisher 2013), exact and data-parallel
(docs/mathematics.md §7).

One iteration is two data-parallel passes over the points, each scored as one
``(n, capacity)`` matrix of instantiated log-likelihoods
(``family.log_likelihood``, a matrix product for the Gaussian families):

1. **Labels.** Draw weights for all ``capacity`` slots from ``Dir(N_k + α/C)`` and each
   slot's parameters from its conjugate posterior (the prior for an empty slot;
   ``family.sample_params``), then propose every label independently,
   ``z_i ∝ w_k f(x_i | θ_k)``: the blocked Gibbs step of a ``C``-slot symmetric
   Dirichlet mixture. Metropolis-Hastings corrects it to the measure's partition law
   with a ratio of counts only (§7), so clusters can close and open here.
2. **Split/merge by sub-clusters.** The ``capacity`` slots are paired by a
   uniformly random matching (independent of the state). Every pair's points
   (the union ``U`` of its two slots) are fitted by a two-component sub-cluster
   mixture: sub-labels from two random anchors, then ``num_launch_sweeps`` restricted Gibbs sweeps
   of sub-cluster weights, parameters and sub-labels, all pairs at once. The
   sub-cluster parameters after the last sweep, ``L``, define the proposal
   ``q(z̄ | L) = Π_i p(z̄_i | L, x_i)`` (each probability raised to the power
   ``sharpness`` and renormalised). A pair with one occupied slot proposes to
   split it by a fresh draw of ``z̄``; a pair with two occupied slots proposes to
   merge them. Each proposal is accepted by Metropolis-Hastings with the ratio
   of §7, which includes ``q`` (the paper's ratio leaves it out) and the
   matching's slot factor; the decisions are a short scan over the pairs.

Why the sub-clusters are rebuilt every iteration (§7): Chang & Fisher keep the
sub-clusters from one iteration to the next. Their law given the partition is
then the history of the chain, a law with no density one can write, so no
Hastings ratio of a split proposed from them is computable, and the ratio the
paper uses (no proposal term) is not that of any reversible move. Built from
the union ``U`` alone, the sub-clusters are an auxiliary variable with the same
law in the split and in the merge that undoes it (Jain & Neal's launch
argument), so their density cancels and only ``q`` remains. The persistent
state is the last iteration's instantiated variables (:class:`SubClusterState`),
kept for inspection and never read by the next iteration.

Every per-point quantity comes from per-point uniforms (:func:`point_noise`) and
every per-cluster quantity from sums over points, so the same function runs on
one device and inside ``jax.shard_map`` with ``lax.psum`` over the points'
axis (``axis_name``): the same chain for the same key
(:func:`sharded_iteration`; ``SubClusterMCMC(model, mesh=...)``).
:func:`jaxbnp.inference.streamed.fit_subcluster_chunked` runs the same passes (this module's
building blocks) chunk by chunk over data kept in host memory.

Example
-------
>>> import jax, jax.numpy as jnp, jaxbnp as bnp
>>> from jaxbnp.inference.partition import subcluster
>>> X = jnp.concatenate([jnp.zeros((20, 1)) - 3.0, jnp.zeros((20, 1)) + 3.0])
>>> X = X + 0.3 * jax.random.normal(jax.random.key(0), X.shape)
>>> labels = jnp.zeros(40, jnp.int32)
>>> step = jax.jit(lambda key, labels: subcluster.step(key, labels, X, bnp.DP(1.0),
...                                                    bnp.NormalGamma(), capacity=4)[0])
>>> for t in range(20):
...     labels = step(jax.random.key(t), labels)
>>> set(labels[:20].tolist()) & set(labels[20:].tolist())   # the two groups share no cluster
set()
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from ..._random import (
    cut, log_dirichlet_from_uniform, loggamma_uniforms, sizes, typed_key, uniform,
    uniform_rows,
)
from ..._ranks import permutation
from ..._validation import check_int, check_real
from .cleanup import ABSORB_SWEEPS, absorb_moves, reassign_moves
from .cleanup import log_correction as _log_correction
from .cleanup import psum as _psum
from .clusters import ClusterState, PartitionState
from . import moves
from .moves import MHInfo, Move

__all__ = [
    "algorithm",
    "SubClusterState",
    "SubClusterInfo",
    "point_noise",
    "iteration",
    "step",
    "sharded_iteration",
    "subcluster_move",
    "check_measure",
]


#: random blocks of points whose label proposals are accepted one block at a time (§7)
LABEL_BLOCKS = 32
#: default power of the launch's probabilities in the split proposal (§7)
DEFAULT_SHARPNESS = 10.0
#: absorb moves and reassign moves per iteration by default (§7; benchmarks/subcluster_seeds.py)
DEFAULT_ABSORB_MOVES = 1
DEFAULT_REASSIGN_MOVES = 8


class SubClusterState(NamedTuple):
    """The instantiated variables of the last iteration (inspection only, §7).

    log_weights: ``(capacity,)`` log weights of every slot drawn in the label step
        (``Dir(N_k + a)``, §7).
    params: the clusters' parameters drawn in that step (family component, leading axis
        ``capacity``).
    sub_labels: ``(n,)`` int32 sub-label (0 or 1) of every point in its pair's last launch
        (the drawn split for a pair with one occupied slot).
    sub_log_weights: ``(capacity,)`` log sub-cluster weights of the launch, entry ``2 j + h``
        for sub-cluster ``h`` of pair ``j``.
    sub_params: the launch's sub-cluster parameters, indexed like ``sub_log_weights``.
    pair: ``(capacity,)`` int32 pair of each slot in the iteration's matching (``-1``: unpaired).
    """

    log_weights: jax.Array
    params: Any
    sub_labels: jax.Array
    sub_log_weights: jax.Array
    sub_params: Any
    pair: jax.Array


class SubClusterInfo(NamedTuple):
    """Statistics of one iteration.

    mh: :class:`~jaxbnp.inference.partition.moves.MHInfo` of the split and merge proposals
        (pairs whose proposal changes the partition).
    labels_accepted: the fraction of the label step's blocks whose proposal was kept (§7).
    num_splits, num_merges: accepted splits and merges.
    num_absorbs: accepted absorb moves that emptied a slot (§7, "Absorb moves").
    """

    mh: MHInfo
    labels_accepted: jax.Array
    num_splits: jax.Array
    num_merges: jax.Array
    num_absorbs: jax.Array


def check_measure(measure, owner: str = "SubClusterMCMC") -> None:
    """Raise ``ValueError`` for measures whose instantiated weights are not Dirichlet given
    the partition (NGGP): the restricted Gibbs step needs them (§7)."""
    if getattr(measure, "has_auxiliary", False):
        raise ValueError(
            f"{owner} supports DP and PitmanYor partitions: given the partition their occupied "
            f"weights are Dirichlet (docs/mathematics.md §7). {type(measure).__name__} is not; "
            "use CollapsedGibbs, SplitMerge or TreeGuidedMCMC for it."
        )


def point_noise(key: jax.Array, num_points: int, num_launch_sweeps: int, dtype=None,
                start=0) -> jax.Array:
    """The per-point uniforms of one iteration, rows ``start .. start + num_points`` of an
    ``(n, num_launch_sweeps + 4)`` array: column 0 the label proposal, 1 the launch's anchors,
    ``2 .. T + 1`` the launch sweeps, ``T + 2`` the split proposal, ``T + 3`` the label block.

    Each entry is a hash of the key and its (row, column) counter
    (:func:`jaxbnp._random.uniform_rows`), so a shard or a streamed chunk draws its own
    rows alone, the same numbers as the whole data set's."""
    dtype = dtype or jnp.result_type(float)
    return uniform_rows(key, start, num_points, num_launch_sweeps + 4, dtype)


def _categorical_from_uniform(logits: jax.Array, u: jax.Array) -> jax.Array:
    """Inverse-CDF draw of one index per row of ``logits`` (``-inf`` = impossible) from
    one uniform per row; never returns an impossible index.

    The running sum goes column by column in an unrolled loop: XLA's ``cumsum`` on a CPU
    is a ``reduce-window`` several times slower than these fused adds."""
    n, K = logits.shape
    m = jnp.max(logits, axis=-1, keepdims=True)
    w = jnp.exp(logits - m)
    t = u * jnp.sum(w, axis=-1)

    def column(j, carry):
        acc, idx, last = carry
        acc = acc + lax.dynamic_index_in_dim(w, j, axis=1, keepdims=False)
        possible = jnp.isfinite(lax.dynamic_index_in_dim(logits, j, axis=1, keepdims=False))
        return acc, idx + (acc <= t).astype(jnp.int32), jnp.where(possible, j, last)

    zero = jnp.zeros(n, jnp.int32)
    _, idx, last = lax.fori_loop(0, K, column, (jnp.zeros(n, w.dtype), zero, zero),
                                 unroll=True if K <= 256 else 16)
    return jnp.minimum(idx, last)


def _dirichlet_shape(measure, C: int, dtype):
    """The symmetric Dirichlet shape ``a`` of the label step's finite mixture (§7): the
    measure's new-cluster weight beside one cluster over ``C`` (``α/C`` for DP,
    ``(α + d)/C`` for Pitman-Yor), so that the finite mixture opens and closes clusters at
    about the measure's rate. Any ``a > 0`` is exact."""
    one = jnp.zeros(C, jnp.int32).at[0].set(1)
    _, log_new = measure.gibbs_log_weights(one)
    return (jnp.exp(log_new) / C).astype(dtype)


def segment_stats(point_stats, ids, num, axis_name):
    """Counts and family statistics (``point_stats``: one pytree row per point) summed by
    ``ids``; out-of-range ids are left out."""
    ones = jnp.ones(ids.shape, jnp.int32)
    counts = jax.ops.segment_sum(ones, ids, num_segments=num)
    stats = jax.tree.map(lambda s: jax.ops.segment_sum(s, ids, num_segments=num), point_stats)
    return _psum((counts, stats), axis_name)


@jax.tree_util.register_pytree_node_class
class IterationRandomness:
    """Every per-cluster random number of one iteration, from one uniform draw (on a CPU each
    ``jax.random`` call costs a loop of small operations, whatever its size): the label
    blocks' uniforms (``blocks``), the pairs' orientation and acceptance uniforms, the label
    step's weights (``w``) and parameters (``theta``), the anchors' parameters, then one block
    per launch step (:meth:`launch`: sub-weights, sub-parameters). The ``k_*`` keys feed
    only the Gamma draws' rare rejection redraws (``jaxbnp._random``), ``k_match`` the slot
    matching. ``stats``: any statistics with the ``capacity`` leading axis.

    A pytree (leaves: the uniforms and the keys; the shapes are static), so the streamed
    chain draws it once per iteration and passes it to each compiled per-cluster step."""

    def __init__(self, key, family, stats, capacity: int, num_launch_sweeps: int, dtype):
        C, T, B = capacity, num_launch_sweeps, LABEL_BLOCKS
        P, Ph = C // 2, (C + 1) // 2  # pairs; Dirichlet pairs of sub-clusters (odd C: one pad)
        # typed: the keys are sliced and reshaped below (legacy key data has a trailing axis)
        keys = jax.random.split(typed_key(key), 5 + 2 * (T + 1))
        param_shapes = [tuple(shape) for shape in family.param_uniforms(stats)[0]]
        head = ((B,), (P,), (P,), loggamma_uniforms((C,)), *param_shapes, *param_shapes)
        launch = (loggamma_uniforms((Ph, 2)), *param_shapes)
        size = sum(sizes(head)) + (T + 1) * sum(sizes(launch))
        self._flat, self._keys = uniform(keys[0], (size,), dtype), keys[1:]
        self._shapes = (head, launch, len(param_shapes))

    def tree_flatten(self):
        return (self._flat, self._keys), self._shapes

    @classmethod
    def tree_unflatten(cls, shapes, leaves):
        rng = object.__new__(cls)
        (rng._flat, rng._keys), rng._shapes = leaves, shapes
        return rng

    def _head(self):
        head = self._shapes[0]
        return cut(self._flat[:sum(sizes(head))], head)

    blocks = property(lambda self: self._head()[0])
    orient = property(lambda self: self._head()[1])
    accept = property(lambda self: self._head()[2])
    w = property(lambda self: self._head()[3])
    theta = property(lambda self: self._head()[4:4 + self._shapes[2]])
    anchor = property(lambda self: self._head()[4 + self._shapes[2]:])
    k_match = property(lambda self: self._keys[0])
    k_w = property(lambda self: self._keys[1])
    k_theta = property(lambda self: self._keys[2])
    k_anchor = property(lambda self: self._keys[3])

    def launch(self, t):
        """Launch step ``t``'s uniforms and redraw keys: ``(u_sub_weights, u_sub_params,
        key_sub_weights, key_sub_params)``."""
        head, launch, _ = self._shapes
        size = sum(sizes(launch))
        block = lax.dynamic_slice_in_dim(self._flat, sum(sizes(head)) + t * size, size)
        u_sw, *u_sp = cut(block, launch)
        keys = self._keys[4:].reshape(-1, 2)
        return u_sw, u_sp, keys[t, 0], keys[t, 1]


# ----------------------------------------------------------------------------- the stages
# An iteration alternates passes over the points (functions of a block of points and of
# per-cluster values: they return per-point outputs and sums over the block's points) with
# per-cluster steps (functions of those sums). :func:`iteration` runs every pass over all
# (or one shard's) points; ``jaxbnp.inference.streamed.fit_subcluster_chunked`` runs
# each pass chunk by chunk and adds the chunks' sums: the same numbers.


class _Pairs(NamedTuple):
    """The iteration's random matching of the ``C`` slots into ``P = C // 2`` pairs."""

    a_slot: jax.Array  # (P,) first slot of each pair
    b_slot: jax.Array  # (P,) second slot
    pair: jax.Array  # (C,) pair of each slot, -1: unpaired


class _PointPairs(NamedTuple):
    """Each point's pair (``pid``), whether it is in one (``in_pair``), its segment
    (``seg``: its pair, or ``P`` outside every pair) and its two sub-cluster columns."""

    pid: jax.Array
    in_pair: jax.Array
    seg: jax.Array
    cols: jax.Array


def pairing(rng, C: int) -> _Pairs:
    P = C // 2
    perm = permutation(rng.k_match, C).astype(jnp.int32)  # int64 under x64
    pair = jnp.full((C,), -1, jnp.int32).at[perm[:2 * P]].set(jnp.arange(2 * P, dtype=jnp.int32) // 2)
    return _Pairs(perm[0:2 * P:2], perm[1:2 * P:2], pair)


def point_pairs(labels, valid, pairs: _Pairs) -> _PointPairs:
    P = pairs.a_slot.shape[0]
    pid = pairs.pair[labels]
    in_pair = valid & (pid >= 0)
    pid = jnp.maximum(pid, 0)
    return _PointPairs(pid, in_pair, jnp.where(in_pair, pid, P), jnp.stack([2 * pid, 2 * pid + 1], -1))


def label_draws(rng, measure, family, counts, stats, dtype):
    """The label step's Dirichlet shape ``a``, weights and parameters of every slot."""
    C = counts.shape[0]
    a = _dirichlet_shape(measure, C, dtype)
    log_w = log_dirichlet_from_uniform(rng.w, (counts + a).astype(dtype), rng.k_w)
    params = family.sample_params_from_uniform(rng.theta, stats, rng.k_theta)
    return a, log_w, params


def propose_labels(X, noise, valid, labels, log_w, params, family, T: int, ll=None):
    """Pass: every point's proposed label, its block, and each block's change of counts
    ``(LABEL_BLOCKS, C)`` (a sum over points). ``ll``: ``family.log_likelihood(X, params)``
    when the caller has it."""
    B, C = LABEL_BLOCKS, log_w.shape[0]
    ll = family.log_likelihood(X, params) if ll is None else ll
    proposal = _categorical_from_uniform(ll + log_w, noise[:, 0])
    # the points fall in LABEL_BLOCKS random blocks; each block's proposal is accepted or
    # not in turn (with w and θ held, each is a valid MH step): a cluster that the proposal
    # would close then blocks one block, not every label
    block = jnp.minimum((noise[:, T + 3] * B).astype(jnp.int32), B - 1)
    ones = jnp.where(valid, 1, 0).astype(jnp.int32)
    delta = (jax.ops.segment_sum(ones, block * C + proposal, num_segments=B * C)
             - jax.ops.segment_sum(ones, block * C + labels, num_segments=B * C))
    return proposal, block, delta.reshape(B, C)


def accept_blocks(rng, measure, counts, a, delta):
    """The label blocks' Metropolis-Hastings decisions in turn: ``(counts, block_ok)``."""

    def block_step(carry, inp):
        c, corr = carry  # the counts and their log correction
        d, lu = inp
        c_new = c + d
        corr_new = _log_correction(measure, c_new, a)
        ok = lu < corr_new - corr
        return (jnp.where(ok, c_new, c), jnp.where(ok, corr_new, corr)), ok

    (counts, _), block_ok = lax.scan(block_step, (counts, _log_correction(measure, counts, a)),
                                     (delta, jnp.log(rng.blocks)))
    return counts, block_ok


def anchor_range(noise, pp: _PointPairs, P: int):
    """Pass: the smallest and largest anchor uniform of each pair's points."""
    lo = jax.ops.segment_min(jnp.where(pp.in_pair, noise[:, 1], 2.0), pp.seg, num_segments=P)
    hi = jax.ops.segment_max(jnp.where(pp.in_pair, noise[:, 1], -1.0), pp.seg, num_segments=P)
    return lo, hi


def anchors(noise, pp: _PointPairs, lo, hi):
    """Each point's anchor role: 0 or 1 for its pair's two anchors, -1 otherwise. The launch
    starts from the points of smallest and largest uniform (a law of the union only)."""
    u = noise[:, 1]
    return jnp.where(pp.in_pair & (u == lo[pp.pid]), 0, jnp.where(pp.in_pair & (u == hi[pp.pid]), 1, -1))


def anchor_sub_ids(anchor, pp: _PointPairs, C: int):
    return jnp.where(anchor >= 0, 2 * pp.pid + anchor, C)


def first_sub_labels(X, anchor, pp: _PointPairs, anchor_params, family):
    """Each point goes to the sub-cluster whose parameters, drawn given its anchor alone,
    explain it better."""
    ll0 = family.log_likelihood_at(X, anchor_params, pp.cols)
    return jnp.where(anchor >= 0, anchor, jnp.argmax(ll0, axis=-1)).astype(jnp.int32)


def sub_ids(h, pp: _PointPairs, C: int):
    return jnp.where(pp.in_pair, 2 * pp.pid + h, C)


def launch_draw(rng, t, family, sub_counts, sub_stats, dtype):
    """Launch step ``t``'s sub-cluster weights (``Dir(n_0 + 1, n_1 + 1)`` per pair) and
    parameters given the sub-cluster sums."""
    C = sub_counts.shape[0]
    u_sw, u_sp, k_sw, k_sp = rng.launch(t)
    sc = (sub_counts + 1).astype(dtype)
    sc = sc.reshape(-1, 2) if C % 2 == 0 else jnp.concatenate([sc, jnp.ones(1, dtype)]).reshape(-1, 2)
    sub_lw = log_dirichlet_from_uniform(u_sw, sc, k_sw).reshape(-1)[:C]
    return sub_lw, family.sample_params_from_uniform(u_sp, sub_stats, k_sp)


def sub_logit(X, pp: _PointPairs, sub_lw, sub_params, family):
    """Every point's log-odds of its second sub-cluster against its first."""
    ll = family.log_likelihood_at(X, sub_params, pp.cols) + sub_lw[pp.cols]
    return ll[:, 1] - ll[:, 0]


def draw(logit, u):
    """Sub-label 1 with probability ``sigmoid(logit)``."""
    return (u < jax.nn.sigmoid(logit)).astype(jnp.int32)


def split_proposal(logit, noise, labels, pp: _PointPairs, split_pair, a_slot, sharpness, T: int):
    """Pass: the split proposal (the launch's probabilities to the power ``sharpness``,
    renormalised) drawn for every point (``zbar``), each point's side of its pair's
    proposal (the drawn sub-label for a split, its slot for a merge), and per pair the
    log-probabilities of the proposal's two sub-label vectors (sums over points)."""
    P = a_slot.shape[0]
    logit = sharpness * logit
    zbar = draw(logit, noise[:, T + 2])
    lp = jnp.stack([-jax.nn.softplus(logit), -jax.nn.softplus(-logit)], axis=-1)
    side = jnp.where(split_pair[pp.pid], zbar, (labels != a_slot[pp.pid]).astype(jnp.int32))
    lp_side = jnp.take_along_axis(lp, side[:, None], axis=-1)[:, 0]
    lp_other = jnp.take_along_axis(lp, 1 - side[:, None], axis=-1)[:, 0]
    t1 = jax.ops.segment_sum(jnp.where(pp.in_pair, lp_side, 0.0), pp.seg, num_segments=P)
    t2 = jax.ops.segment_sum(jnp.where(pp.in_pair, lp_other, 0.0), pp.seg, num_segments=P)
    return zbar, side, t1, t2


def decide_pairs(rng, measure, family, counts, pairs: _Pairs, split_pair, merge_pair, t1, t2,
                  part_counts, part_stats, dtype):
    """The pairs' split and merge decisions in turn (§7): per pair whether it was accepted
    and proposed, ``min(0, log r)``, and the slots its parts go to."""
    C, P = counts.shape[0], pairs.a_slot.shape[0]
    log_q = jnp.logaddexp(t1, t2)
    log_part = jnp.where(part_counts > 0, family.log_marginal(part_stats), 0.0).reshape(P, 2)
    union_stats = jax.tree.map(lambda s: s.reshape((P, 2) + s.shape[1:]).sum(1), part_stats)
    log_union = family.log_marginal(union_stats)
    part_counts = part_counts.reshape(P, 2)

    def decide(carry, inp):
        c, k, eppf = carry  # the counts, the number of clusters and log EPPF(c)
        a, b, is_split, is_merge, n0, n1, lp0, lp1, lpu, lq, o, lu = inp
        l_slot, r_slot = jnp.where(o, b, a), jnp.where(o, a, b)
        # a split writes the two parts into the pair's slots, a merge the union into l_slot
        c_new = c.at[a].set(0).at[b].set(0).at[l_slot].set(jnp.where(is_split, n0, n0 + n1))
        c_new = c_new.at[r_slot].add(jnp.where(is_split, n1, 0))
        eppf_new = measure.log_eppf(c_new)
        r_split = (eppf_new - eppf + lp0 + lp1 - lpu
                   - jnp.log(jnp.maximum(C - k, 1).astype(dtype)) - lq)
        r_merge = (eppf_new - eppf + lpu - lp0 - lp1
                   + jnp.log((C - k + 1).astype(dtype)) + lq)
        proposed = (is_split & (n0 > 0) & (n1 > 0)) | is_merge
        log_r = jnp.where(is_split, r_split, r_merge)
        acc = proposed & (lu < log_r)
        c = jnp.where(acc, c_new, c)
        k = k + jnp.where(acc, jnp.where(is_split, 1, -1), 0)
        eppf = jnp.where(acc, eppf_new, eppf)
        return (c, k, eppf), (acc, proposed, jnp.where(proposed, jnp.minimum(log_r, 0.0), 0.0),
                              l_slot, r_slot)

    inputs = (pairs.a_slot, pairs.b_slot, split_pair, merge_pair, part_counts[:, 0],
              part_counts[:, 1], log_part[:, 0], log_part[:, 1], log_union, log_q,
              rng.orient < 0.5, jnp.log(rng.accept))
    num_active = jnp.sum(counts > 0).astype(jnp.int32)
    _, out = lax.scan(decide, (counts, num_active, measure.log_eppf(counts)), inputs)
    return out


def moved_labels(labels, side, pp: _PointPairs, acc_split, acc_merge, l_slot, r_slot):
    """Pass: the labels after the accepted splits and merges."""
    i = pp.pid
    new_slot = jnp.where(acc_split[i], jnp.where(side == 0, l_slot[i], r_slot[i]),
                         jnp.where(acc_merge[i], l_slot[i], labels))
    return jnp.where(pp.in_pair, new_slot, labels)


def split_kinds(counts, pairs: _Pairs):
    active = counts > 0
    act_a, act_b = active[pairs.a_slot], active[pairs.b_slot]
    return act_a != act_b, act_a & act_b


def _info(acc, proposed, log_acc, split_pair, merge_pair, labels_ok, num_absorbed):
    return SubClusterInfo(
        MHInfo(jnp.sum(acc).astype(jnp.int32), jnp.sum(proposed).astype(jnp.int32),
               jnp.sum(log_acc).astype(jnp.float32), jnp.sum(proposed).astype(jnp.int32)),
        labels_ok, jnp.sum(acc & split_pair).astype(jnp.int32),
        jnp.sum(acc & merge_pair).astype(jnp.int32), num_absorbed,
    )


def iteration(key, noise, X, valid, labels, measure, family, capacity: int,
              num_launch_sweeps: int, sharpness: float = DEFAULT_SHARPNESS, axis_name=None,
              totals=None, num_absorb_moves: int = 0, num_reassign_moves: int = 0):
    """One iteration on (a shard of) the points; module docstring and §7.

    :param key: the iteration's key (replicated over shards).
    :param noise: this shard's rows of :func:`point_noise`.
    :param X: ``(n_local, D)`` points; ``valid`` ``(n_local,)`` marks real rows (padding is
        ``False`` and never enters a sum).
    :param labels: ``(n_local,)`` slots, ``0 <= labels < capacity``.
    :param sharpness: the power ``β`` of the launch's sub-cluster probabilities in the split
        proposal, ``q(z̄_i) ∝ p(z̄_i | L, x_i)^β`` (§7; ``β = 1``: the launch's own law; larger,
        crisper splits; any ``β > 0`` is exact).
    :param axis_name: the mesh axis the points are sharded over (``None``: one device).
    :param totals: the global ``(counts, stats)`` of ``labels`` when the caller has them
        (the previous iteration's output); ``None``: summed here.
    :returns: ``(labels, counts, stats, SubClusterState, SubClusterInfo)``; ``counts`` and
        ``stats`` are the global per-slot sums of the new labels.
    """
    C, T = int(capacity), int(num_launch_sweeps)
    P = C // 2
    labels = labels.astype(jnp.int32)
    dtype = jnp.result_type(X.dtype, float)

    def masked(ids):
        return jnp.where(valid, ids, C)

    def psum(x):
        return _psum(x, axis_name)

    ps = family.point_stats(X)
    counts, stats = segment_stats(ps, masked(labels), C, axis_name) if totals is None else totals
    rng = IterationRandomness(key, family, stats, C, T, dtype)

    # 1. labels: weights over every slot, parameters, then every label at once (§7): the
    #    blocked Gibbs step of a C-slot symmetric Dirichlet mixture, corrected to the
    #    measure's partition law by Metropolis-Hastings (clusters may empty or open)
    a, log_w, params = label_draws(rng, measure, family, counts, stats, dtype)
    ll = family.log_likelihood(X, params)
    proposal, block, delta = propose_labels(X, noise, valid, labels, log_w, params, family, T, ll)
    counts, block_ok = accept_blocks(rng, measure, counts, a, psum(delta))
    labels = jnp.where(block_ok[block], proposal, labels)
    labels_ok = jnp.mean(block_ok.astype(dtype))
    num_absorbed = jnp.int32(0)
    if num_absorb_moves:
        # 1b. absorb moves on the label step's weights and parameters (§7, "Absorb moves")
        stats = segment_stats(ps, masked(labels), C, axis_name)[1]
        labels, counts, stats, num_absorbed = absorb_moves(
            jax.random.fold_in(typed_key(key), 1), X, valid, labels, counts, stats, log_w, params,
            ll, measure, family, a, num_absorb_moves, ABSORB_SWEEPS, axis_name)
    num_closed = jnp.int32(0)
    if num_reassign_moves:
        # 1c. single points moved between clusters, small clusters chosen as often as big
        #     ones (§7, "Reassign moves")
        if not num_absorb_moves:
            stats = segment_stats(ps, masked(labels), C, axis_name)[1]
        labels, counts, stats, num_closed = reassign_moves(
            jax.random.fold_in(typed_key(key), 2), X, valid, labels, counts, stats, measure, family,
            num_reassign_moves, axis_name)

    # 2. split/merge: a random matching of the slots, one launch per pair
    pairs = pairing(rng, C)
    pp = point_pairs(labels, valid, pairs)
    lo, hi = anchor_range(noise, pp, P)
    if axis_name is not None:
        lo, hi = lax.pmin(lo, axis_name), lax.pmax(hi, axis_name)
    anchor = anchors(noise, pp, lo, hi)
    _, anchor_stats = segment_stats(ps, anchor_sub_ids(anchor, pp, C), C, axis_name)
    anchor_params = family.sample_params_from_uniform(rng.anchor, anchor_stats, rng.k_anchor)
    h = first_sub_labels(X, anchor, pp, anchor_params, family)

    def launch(t, h):
        sub_counts, sub_stats = segment_stats(ps, sub_ids(h, pp, C), C, axis_name)
        sub_lw, sub_params = launch_draw(rng, t, family, sub_counts, sub_stats, dtype)
        return sub_lw, sub_params, sub_logit(X, pp, sub_lw, sub_params, family)

    # launch steps 0 .. T in one loop (one compiled copy of the launch): step t < T draws
    # the sub-labels from column 2 + t; the last step's draw is discarded
    def sweep(t, carry):
        h, _ = carry
        out = launch(t, h)
        u = lax.dynamic_index_in_dim(noise, 2 + t, axis=1, keepdims=False)
        return jnp.where(t < T, draw(out[2], u), h), out

    first = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), jax.eval_shape(launch, 0, h))
    h, (sub_lw, sub_params, logit) = lax.fori_loop(0, T + 1, sweep, (h, first))
    split_pair, merge_pair = split_kinds(counts, pairs)
    zbar, side, t1, t2 = split_proposal(logit, noise, labels, pp, split_pair, pairs.a_slot,
                                         sharpness, T)
    part_counts, part_stats = segment_stats(ps, jnp.where(pp.in_pair, 2 * pp.pid + side, C), 2 * P,
                                             axis_name)
    acc, proposed, log_acc, l_slot, r_slot = decide_pairs(
        rng, measure, family, counts, pairs, split_pair, merge_pair, *psum((t1, t2)), part_counts,
        part_stats, dtype)
    labels = moved_labels(labels, side, pp, acc & split_pair, acc & merge_pair, l_slot, r_slot)
    counts, stats = segment_stats(ps, masked(labels), C, axis_name)

    info = _info(acc, proposed, log_acc, split_pair, merge_pair, labels_ok, num_absorbed + num_closed)
    state = SubClusterState(log_w, params, zbar, sub_lw, sub_params, pairs.pair)
    return labels, counts, stats, state, info


def step(key, labels, X, measure, family, capacity: int, num_launch_sweeps: int = 3,
         sharpness: float = DEFAULT_SHARPNESS, num_absorb_moves: int = DEFAULT_ABSORB_MOVES,
         num_reassign_moves: int = DEFAULT_REASSIGN_MOVES):
    """One iteration on one device: ``(labels, SubClusterState, SubClusterInfo)``.

    ``key`` is split into the per-point noise key and the iteration's key, as in
    :func:`subcluster_move`."""
    labels, _, _, state, info = _keyed_iteration(iteration, key, labels, X, measure, family,
                                                 capacity, num_launch_sweeps, sharpness,
                                                 num_absorb_moves=num_absorb_moves,
                                                 num_reassign_moves=num_reassign_moves)
    return labels, state, info


def _keyed_iteration(run_iteration, key, labels, X, measure, family, capacity, num_launch_sweeps,
                     sharpness, totals=None, num_absorb_moves=0, num_reassign_moves=0):
    """``run_iteration`` (:func:`iteration` or a :func:`sharded_iteration`) on all points from
    one key, split into the per-point noise key and the iteration's key."""
    X = jnp.asarray(X)
    k_noise, k_iter = jax.random.split(key)
    noise = point_noise(k_noise, X.shape[0], num_launch_sweeps, jnp.result_type(X.dtype, float))
    return run_iteration(k_iter, noise, X, jnp.ones(X.shape[0], bool), labels, measure, family,
                         capacity, num_launch_sweeps, sharpness, totals=totals,
                         num_absorb_moves=num_absorb_moves, num_reassign_moves=num_reassign_moves)


def sharded_iteration(mesh, axis_name: str | None = None):
    """:func:`iteration` with the points sharded over ``mesh`` (``jax.shard_map``; every sum
    over points is a local sum then ``lax.psum``): a function with :func:`iteration`'s
    signature (``axis_name`` aside) and outputs, for the whole data set.

    ``n`` need not be a multiple of the number of devices (padded rows are masked). The
    per-point uniforms are drawn for the whole data set and sliced, so the chain is the
    one of :func:`iteration` for the same key, up to the summation order of the
    statistics (``tests/test_subcluster.py`` checks equal draws on 8 host devices)."""
    from jax.sharding import PartitionSpec as Ps

    axis = axis_name or mesh.axis_names[0]
    num_shards = mesh.shape[axis]

    def fn(key, noise, X, valid, labels, measure, family, capacity: int, num_launch_sweeps: int,
           sharpness: float = DEFAULT_SHARPNESS, totals=None, num_absorb_moves: int = 0,
           num_reassign_moves: int = 0):
        n = X.shape[0]
        pad = (-n) % num_shards

        def padded(a):
            return jnp.pad(a, [(0, pad)] + [(0, 0)] * (a.ndim - 1))

        def body(key, noise, X, valid, labels, measure, family, totals):
            return iteration(key, noise, X, valid, labels, measure, family, capacity,
                             num_launch_sweeps, sharpness, axis_name=axis, totals=totals,
                             num_absorb_moves=num_absorb_moves,
                             num_reassign_moves=num_reassign_moves)

        pts, rep = Ps(axis), Ps()
        state_specs = SubClusterState(rep, rep, pts, rep, rep, rep)
        labels, counts, stats, state, info = jax.shard_map(
            body, mesh=mesh,
            in_specs=(rep, pts, pts, pts, pts, rep, rep, rep),
            out_specs=(pts, rep, rep, state_specs, rep),
            check_vma=False,
        )(key, padded(noise), padded(X), padded(valid), padded(labels.astype(jnp.int32)), measure, family,
          totals)
        return labels[:n], counts, stats, state._replace(sub_labels=state.sub_labels[:n]), info

    return fn


def subcluster_move(num_launch_sweeps: int = 3, mesh=None, sharpness: float = DEFAULT_SHARPNESS,
                    num_absorb_moves: int = DEFAULT_ABSORB_MOVES,
                    num_reassign_moves: int = DEFAULT_REASSIGN_MOVES) -> Move:
    """The iteration as a :class:`~jaxbnp.inference.partition.moves.Move` (state:
    :class:`SubClusterState`; info: :class:`SubClusterInfo`, whose ``mh`` field the kernels
    report). DP and PitmanYor only (:func:`check_measure`). With ``mesh`` the points are
    sharded over the mesh's first axis (:func:`sharded_iteration`): the same chain.
    ``num_absorb_moves`` and ``num_reassign_moves``: the iteration's absorb and reassign
    moves (§7; ``0``: none)."""
    T = check_int("num_launch_sweeps", num_launch_sweeps, 0)
    num_absorb_moves = check_int("num_absorb_moves", num_absorb_moves, 0)
    num_reassign_moves = check_int("num_reassign_moves", num_reassign_moves, 0)
    sharpness = check_real("sharpness", sharpness, 0.0)
    if sharpness == 0.0:
        raise ValueError("sharpness must be > 0 (0 would propose every split alike), got 0.")
    run_iteration = iteration if mesh is None else sharded_iteration(mesh)

    def step_fn(key, state, move_state, ctx):
        clusters = state.clusters
        n, C = clusters.labels.shape[0], clusters.capacity
        labels, counts, stats, move_state, info = _keyed_iteration(
            run_iteration, key, clusters.labels, ctx.X, ctx.measure, ctx.family, C, T, sharpness,
            totals=(clusters.counts, clusters.stats), num_absorb_moves=num_absorb_moves,
            num_reassign_moves=num_reassign_moves)
        # every slot in use: the chain could not split any more, so the capacity must grow
        full = (jnp.sum(counts > 0) >= C) & (C < n)
        new = ClusterState(labels, counts, stats, clusters.overflow | full)
        return PartitionState(new, state.u), move_state, info

    def init_fn(state, ctx):
        shapes = jax.eval_shape(lambda k: step_fn(k, state, None, ctx)[1], jax.random.key(0))
        return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)

    return Move(init_fn, step_fn)


def algorithm(X, measure, family, capacity: int | None = None, num_launch_sweeps: int = 3,
              mesh=None, sharpness: float = DEFAULT_SHARPNESS,
              num_absorb_moves: int = None, num_reassign_moves: int = None):
    """The sub-cluster sampler in the one shape
    (:class:`~jaxbnp.inference.base.SamplingAlgorithm`): :func:`subcluster_move` run by
    :func:`jaxbnp.inference.partition.moves.algorithm` (``init(key, labels=None)``, one
    cluster by default, ``capacity`` slots, ``None``: ``n``; ``step(key, state)``: one
    iteration, the move's state its :class:`SubClusterState`, ``info.moves`` its
    :class:`SubClusterInfo`). A chain that fills every slot sets the state's ``overflow``."""
    check_measure(measure, "subcluster.algorithm")
    move = subcluster_move(
        num_launch_sweeps, mesh, sharpness,
        DEFAULT_ABSORB_MOVES if num_absorb_moves is None else num_absorb_moves,
        DEFAULT_REASSIGN_MOVES if num_reassign_moves is None else num_reassign_moves)
    return moves.algorithm(move, X, measure, family, capacity)
