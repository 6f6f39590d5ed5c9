"""The sub-cluster sampler's cleanup moves (docs/mathematics.md §7, "Absorb moves" and
"Reassign moves"): exact moves that remove what the splits of
:mod:`jaxbnp.inference.partition.subcluster` leave behind, two components sharing one
cluster and stray clusters of a few points. Every sum over points is a :func:`psum` and every
choice of a point a ``pmin``, so they run inside ``jax.shard_map`` as the iteration does.
"""

from __future__ import annotations

import itertools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.scipy.special import gammaln

from ... import _math
from ..._math import LOG_2PI
from ..._random import log_beta_pair, uniform_rows
from ...models.families import (
    NormalGamma, NormalGammaComponent, NormalWishart, NormalWishartComponent, NormalWishartStats,
)

__all__ = ["ABSORB_SWEEPS", "absorb_moves", "reassign_moves", "log_likelihood_one",
           "log_correction", "psum"]

#: launch sweeps of an absorb move (§7, "Absorb moves")
ABSORB_SWEEPS = 6
#: dimensions up to which a component's quadratic form is written out column by column
SMALL_D = 8
#: ... and up to which the weighted sums of x xᵀ are
TINY_D = 3


def log_correction(measure, counts, a):
    """``log`` of the labelled partition law over the ``C``-slot symmetric ``Dir(a)``
    mixture's law of the same labels, up to a constant (§7): the Metropolis-Hastings
    ratio of the label step is its difference."""
    C = counts.shape[-1]
    c = counts.astype(jnp.result_type(float))
    k = jnp.sum(counts > 0)
    labelled = measure.log_eppf(counts) + gammaln(C - k + 1.0)
    finite = jnp.sum(gammaln(c + a) - gammaln(a))
    return labelled - finite


def psum(x, axis_name):
    return x if axis_name is None else lax.psum(x, axis_name)


def _weighted_sum(X, flat, unflatten, weight, axis_name):
    """The family statistics ``Σ_i weight_i s(x_i)`` (one pytree, no leading axis). The
    Gaussian families' from ``X`` (``Σ w x xᵀ = (w X)ᵀ X``: the ``n × D²`` outer products are
    never read); the others' from the points' statistics flattened to an ``(n, S)`` matrix."""
    if flat is None:
        w = weight.astype(X.dtype)
        wx = X * w[:, None]
        full = unflatten is NormalWishartStats
        D = X.shape[-1]
        if full and D <= TINY_D:  # D² sums in one pass: 2.3 times faster than the product at D = 2
            sum_xx = jnp.stack([jnp.stack([jnp.sum(wx[:, i] * X[:, j]) for j in range(D)]) for i in range(D)])
        else:
            sum_xx = wx.T @ X if full else jnp.sum(wx * X, 0)
        return unflatten(*psum((jnp.sum(w), jnp.sum(wx, 0), sum_xx), axis_name))
    return unflatten(psum(weight.astype(flat.dtype) @ flat, axis_name))


def log_likelihood_one(family, X, theta):
    """One component's log-likelihood of every point, ``(n,)``. The Gaussian families take
    ``x − μ`` directly: ``family.log_likelihood`` builds ``(n, D² + D + 1)`` features for
    its matrix product, about ten times the memory traffic of ``X`` at ``D = 10``, which is
    right for ``C`` components at once and wasteful for one."""
    X = jnp.asarray(X)
    if isinstance(theta, NormalWishartComponent):
        L = _math.cholesky(theta.precision)  # Λ = L Lᵀ: (x − μ)ᵀ Λ (x − μ) = |(x − μ)ᵀ L|²
        diff, L = X - theta.mean, L.astype(X.dtype)
        D = X.shape[-1]
        if D <= SMALL_D:
            # the columns as vectors: XLA fuses the D² products into one pass over the
            # points, where the (n, D) x (D, D) matrix product is a library call that takes
            # about 3 times as long up to D = 8 (10^4 points)
            cols = [diff[:, i] for i in range(D)]
            quad = sum(sum(cols[i] * L[i, j] for i in range(D)) ** 2 for j in range(D))
        else:
            r = diff @ L
            quad = jnp.sum(r * r, -1)
        half_logdet = jnp.sum(jnp.log(jnp.diagonal(L)))
        return half_logdet - 0.5 * quad - 0.5 * D * LOG_2PI
    if isinstance(theta, NormalGammaComponent):
        lam = theta.precision
        return (0.5 * jnp.sum(jnp.log(lam)) - 0.5 * jnp.sum(lam * (X - theta.mean) ** 2, -1)
                - 0.5 * X.shape[-1] * LOG_2PI)
    return family.log_likelihood(X, jax.tree.map(lambda x: x[None], theta))[:, 0]


def _draw_one(logits, u):
    """One index drawn by inversion from a vector of log weights (``-inf``: impossible) and
    one uniform; never an impossible index. (The cleanup moves' scalar draws: a cumulative
    sum of ``C`` entries, where ``_categorical_from_uniform``'s unrolled loop over the columns
    would add ``C`` steps to compile per call.)"""
    w = jnp.exp(logits - jnp.max(logits))
    idx = jnp.sum(jnp.cumsum(w) <= u * jnp.sum(w))
    possible = jnp.isfinite(logits)
    last = jnp.max(jnp.where(possible, jnp.arange(logits.shape[0]), 0))
    return jnp.minimum(idx, last).astype(jnp.int32)


def _pmin(x, axis_name):
    return x if axis_name is None else lax.pmin(x, axis_name)


def _choose_point(u, u1, u2, labels, valid, counts, axis_name):
    """An occupied slot ``c`` uniformly (from the scalar ``u``) and a point of it uniformly:
    the one with the smallest pair ``(u1, u2)`` of its per-point uniforms (in float32 a tie
    of both has probability about ``N_c 2^-46``). Returns ``c`` and the point's mask."""
    c = _draw_one(jnp.where(counts > 0, 0.0, -jnp.inf), u)
    in_c = valid & (labels == c)
    cand = in_c & (u1 == _pmin(jnp.min(jnp.where(in_c, u1, 2.0)), axis_name))
    return c, cand & (u2 == _pmin(jnp.min(jnp.where(cand, u2, 2.0)), axis_name))


def _log_beta_density(lv, l1v, p, q):
    """``log Beta(v | p, q)`` from ``log v`` and ``log(1 − v)``."""
    return (p - 1.0) * lv + (q - 1.0) * l1v - (gammaln(p) + gammaln(q) - gammaln(p + q))


def _slot(tree, k):
    return jax.tree.map(lambda x: lax.dynamic_index_in_dim(x, k, axis=0, keepdims=False), tree)


def absorb_moves(key, X, valid, labels, counts, stats, log_w, params, ll, measure, family, a,
                 num_moves: int, num_sweeps: int, axis_name=None):
    """``num_moves`` absorb moves in turn (§7, "Absorb moves"), each on the instantiated
    state of the label step: weights ``log_w``, parameters ``params`` and their ``(n, C)``
    log-likelihoods ``ll``.

    A move picks an occupied slot ``c`` uniformly, a point ``i`` of it uniformly and a
    partner ``h ≠ c`` with probability ``∝ f(x_i | θ_h)``; holding ``θ_h``, it proposes new
    parameters
    for ``c`` and a new split ``v`` of the pair's weight, either fitted to the pair's union
    ``U`` with ``h`` all but emptied (an absorb) or fitted to the part of ``U`` that a
    ``num_sweeps``-sweep launch beside ``θ_h`` gives ``c`` (the reverse), then redraws the
    labels of ``U`` between the two but ``i``'s, which stays in ``c``. Metropolis-Hastings
    with the labels of ``U`` summed out (the finite mixture's ratio), then the count
    correction of the label step (delayed acceptance): exact for the partition posterior.

    :returns: ``(labels, counts, stats, num_absorbed)``, the last the number of accepted
        moves that emptied a slot.
    """
    C, T, M = counts.shape[0], int(num_sweeps), int(num_moves)
    dtype = log_w.dtype
    n_local = X.shape[0]
    ps = family.point_stats(X)
    start = 0 if axis_name is None else lax.axis_index(axis_name) * n_local
    # per move: two uniforms per point that choose c's point, one that redraws U's labels
    u_pts = uniform_rows(jax.random.fold_in(key, 0), start, n_local, 3 * M, dtype)
    if isinstance(family, (NormalGamma, NormalWishart)):
        flat, unflatten = None, type(ps)
    else:
        leaves, treedef = jax.tree.flatten(ps)
        flat = jnp.concatenate([x.reshape(n_local, -1).astype(dtype) for x in leaves], axis=1)
        widths = [math.prod(x.shape[1:]) for x in leaves]

        def unflatten(v):
            parts = jnp.split(v, list(itertools.accumulate(widths))[:-1])
            return jax.tree.unflatten(treedef, [p.reshape(x.shape[1:]).astype(x.dtype)
                                                for p, x in zip(parts, leaves)])
    zero_stats = jax.tree.map(lambda s: jnp.zeros(s.shape[1:], s.dtype), stats)

    slots = jnp.arange(C)

    def loglik(theta):
        return log_likelihood_one(family, X, theta).astype(dtype)

    def move(carry, m):
        labels, counts, stats, log_w, params, ll_t, num = carry
        k = jax.random.split(jax.random.fold_in(key, m + 1), 2 * T + 6)
        u = jax.random.uniform(k[0], (5,), dtype)
        # c uniform over the occupied slots, a point i of c uniformly (the smallest pair of
        # its uniforms), h ∝ f(x_i | θ_h) over the other slots (parameters the move keeps)
        num_occupied = jnp.sum(counts > 0)
        c, at = _choose_point(u[0], u_pts[:, 3 * m], u_pts[:, 3 * m + 1], labels, valid, counts,
                              axis_name)
        local = jnp.argmax(at)  # i's row, when it is on this shard
        row = psum(jnp.where(at[local], ll_t[:, local], 0.0), axis_name)
        h = _draw_one(jnp.where(slots == c, -jnp.inf, row), u[1])
        in_u = valid & ((labels == c) | (labels == h))
        n_u = counts[c] + counts[h]
        stats_u = jax.tree.map(lambda s: s[c] + s[h], stats)
        f_h, f_c = ll_t[h], ll_t[c]
        # the launch beside the held θ_h, a law of U and θ_h alone: T sweeps of c's
        # responsibilities against h, then parameters and weights given the expected
        # statistics
        nu_ = n_u.astype(dtype)

        def sweep(t, carry):  # one compiled copy of the launch sweep
            theta, lw, _, _ = carry
            resp = jnp.where(in_u, jax.nn.sigmoid(lw[0] - lw[1] + loglik(theta) - f_h), 0.0)
            stats_a = _weighted_sum(X, flat, unflatten, resp, axis_name)
            n_a = psum(jnp.sum(resp), axis_name)
            theta = family.sample_params(k[2 + 2 * t], stats_a)  # the last sweep's is unused
            lw = jnp.stack(log_beta_pair(k[3 + 2 * t], n_a + 1.0, nu_ - n_a + 1.0)).astype(dtype)
            return theta, lw, stats_a, n_a

        init = (family.sample_params(k[1], stats_u), jnp.full((2,), jnp.log(0.5), dtype),
                stats_u, nu_)
        _, _, stats_a, n_a = lax.fori_loop(0, T, sweep, init)
        ab = ((nu_ + a, a), (n_a + a, nu_ - n_a + a))  # Beta shapes of v: absorb, launch

        def log_q(dens, lv, l1v):  # dens: the densities under (prior, U, launch)
            one = dens[1] + _log_beta_density(lv, l1v, *ab[0])
            two = dens[2] + _log_beta_density(lv, l1v, *ab[1])
            return jnp.logaddexp(one, two) - jnp.log(2.0)

        def log_target(dens, lv, l1v, f):
            # the labels of U summed out, but i's, which stays in c
            lik = jnp.where(at, lv + f, jnp.where(in_u, jnp.logaddexp(lv + f, l1v + f_h), 0.0))
            return dens[0] + (a - 1.0) * (lv + l1v) + psum(jnp.sum(lik), axis_name)

        # the proposal: an absorb or the launch's fit, with probability 1/2 each
        absorb = u[2] < 0.5
        prop_stats = jax.tree.map(lambda x, y: jnp.where(absorb, x, y), stats_u, stats_a)
        theta_new = family.sample_params(k[2 * T + 2], prop_stats)
        lv_new, l1v_new = log_beta_pair(k[2 * T + 3], jnp.where(absorb, ab[0][0], ab[1][0]),
                                        jnp.where(absorb, ab[0][1], ab[1][1]))
        lv_new, l1v_new = lv_new.astype(dtype), l1v_new.astype(dtype)
        log_s = jnp.logaddexp(log_w[c], log_w[h])
        lv, l1v = log_w[c] - log_s, log_w[h] - log_s
        theta_c = _slot(params, c)
        f_new = loglik(theta_new)
        # the labels of U redrawn between c and h given the proposed state, i's kept in c:
        # the reverse move chooses c, then i among c's N_c' points, then h with the same
        # probability
        to_c = at | (u_pts[:, 3 * m + 2] < jax.nn.sigmoid(lv_new + f_new - l1v_new - f_h))
        new_labels = jnp.where(in_u, jnp.where(to_c, c, h), labels)
        n_c_new = psum(jnp.sum((in_u & to_c).astype(counts.dtype)), axis_name).astype(counts.dtype)
        counts_new = counts.at[c].set(n_c_new).at[h].set(n_u - n_c_new)
        log_sel = (jnp.log(counts[c].astype(dtype)) - jnp.log(n_c_new.astype(dtype))
                   + jnp.log(num_occupied.astype(dtype)) - jnp.log(jnp.sum(counts_new > 0).astype(dtype)))
        # the six parameter densities in one call (one compiled copy): θ_c and θ_c' under
        # the prior, the posterior given U and the launch's
        dens = family.log_params_density(
            jax.tree.map(lambda x, y: jnp.stack([x, y] * 3), theta_c, theta_new),
            jax.tree.map(lambda z, su, sa: jnp.stack([z, z, su, su, sa, sa]), zero_stats, stats_u,
                         stats_a)).reshape(3, 2)
        log_r1 = (log_target(dens[:, 1], lv_new, l1v_new, f_new) - log_target(dens[:, 0], lv, l1v, f_c)
                  + log_q(dens[:, 0], lv, l1v) - log_q(dens[:, 1], lv_new, l1v_new) + log_sel)
        log_r2 = log_correction(measure, counts_new, a) - log_correction(measure, counts, a)
        ok = (jnp.log(u[3]) < log_r1) & (jnp.log(u[4]) < log_r2)
        stats_c = _weighted_sum(X, flat, unflatten, in_u & to_c, axis_name)
        stats_h = _weighted_sum(X, flat, unflatten, in_u & ~to_c, axis_name)

        def put(tree, k_, value):
            return jax.tree.map(lambda x, v: x.at[k_].set(jnp.where(ok, v, x[k_])), tree, value)

        num = num + (ok & (counts_new[h] == 0) & (counts[h] > 0)).astype(jnp.int32)
        labels = jnp.where(ok, new_labels, labels)
        counts = jnp.where(ok, counts_new, counts)
        stats = put(put(stats, c, stats_c), h, stats_h)
        log_w = log_w.at[c].set(jnp.where(ok, log_s + lv_new, log_w[c]))
        log_w = log_w.at[h].set(jnp.where(ok, log_s + l1v_new, log_w[h]))
        params = put(params, c, theta_new)
        ll_t = lax.dynamic_update_index_in_dim(ll_t, jnp.where(ok, f_new, f_c), c, axis=0)
        return (labels, counts, stats, log_w, params, ll_t, num), None

    carry = (labels, counts, stats, log_w, params, ll.T.astype(dtype), jnp.int32(0))
    (labels, counts, stats, _, _, _, num), _ = lax.scan(move, carry, jnp.arange(M))
    return labels, counts, stats, num


def reassign_moves(key, X, valid, labels, counts, stats, measure, family, num_moves: int,
                   axis_name=None):
    """``num_moves`` collapsed moves of one point each (§7, "Reassign moves"): an occupied
    slot ``c`` chosen uniformly, a point ``i`` of it uniformly, and a new slot for ``i`` from
    its collapsed conditional over the other clusters and a new one, accepted by
    Metropolis-Hastings with the choice's probability (``1/(K N_c)``) in the ratio. Small
    clusters are chosen as often as big ones, so a stray cluster of a few points dissolves
    point by point where the posterior wants it gone.

    :returns: ``(labels, counts, stats, num_closed)``, the last the number of accepted moves
        that emptied a slot.
    """
    C, M = counts.shape[0], int(num_moves)
    n_local = X.shape[0]
    dtype = jnp.result_type(X.dtype, float)
    start = 0 if axis_name is None else lax.axis_index(axis_name) * n_local
    # two uniforms per point and move: the point of c with the smallest pair is uniform
    # over c's points (_choose_point)
    u_pts = uniform_rows(jax.random.fold_in(key, 0), start, n_local, 2 * M, dtype)
    slots = jnp.arange(C)

    def log_joint_change(cnt0, st0, cnt1, st1, c, dest):
        """The change of ``log p(Π) + Σ log P(X_k) + log (C − K)!`` of the labelled target
        (§7); only slots ``c`` and ``dest`` differ, so only their four marginals are
        computed (in one call: one compiled copy)."""
        pair = jnp.stack([c, dest])
        both = jax.tree.map(lambda x, y: jnp.concatenate([x[pair], y[pair]]), st0, st1)
        marg = jnp.where(jnp.concatenate([cnt0[pair], cnt1[pair]]) > 0, family.log_marginal(both), 0.0)
        eppf = (measure.log_eppf(cnt0), measure.log_eppf(cnt1))
        slots_term = gammaln(C - jnp.stack([jnp.sum(cnt0 > 0), jnp.sum(cnt1 > 0)]) + 1.0)
        return (eppf[1] - eppf[0] + marg[2] + marg[3] - marg[0] - marg[1] + slots_term[1]
                - slots_term[0])

    def predictive_rows(tree, ks):
        return family.predictive_params(jax.tree.map(lambda s: s[ks], tree))

    def move(carry, m):
        labels, counts, stats, table, num = carry
        u = jax.random.uniform(jax.random.fold_in(key, m + 1), (3,), dtype)
        K = jnp.sum(counts > 0)
        c, chosen = _choose_point(u[0], u_pts[:, 2 * m], u_pts[:, 2 * m + 1], labels, valid,
                                  counts, axis_name)
        x = psum(jnp.sum(jnp.where(chosen[:, None], X, 0.0), 0), axis_name).astype(X.dtype)
        ps_i = family.point_stats(x)
        # the state without i
        cnt0 = counts.at[c].add(-1)
        st0 = jax.tree.map(lambda s, p: s.at[c].add(-p), stats, ps_i)
        st0 = jax.tree.map(lambda s: jnp.where((cnt0 > 0).reshape((C,) + (1,) * (s.ndim - 1)), s, 0.0), st0)
        log_existing, log_new = measure.gibbs_log_weights(cnt0)
        # every slot's predictive from the carried parameters, c's refitted without i (the
        # table holds each slot's predictive parameters: only the two changed slots are
        # refitted after a move, not all C)
        table0 = jax.tree.map(lambda t, r: t.at[c].set(r[0]), table, predictive_rows(st0, c[None]))
        w = log_existing + family.log_predictive_from_params(x, table0).astype(dtype)  # -inf: empty
        w_new = log_new + family.prior_log_predictive(x).astype(dtype)
        # forward: another occupied slot, or a new cluster when c keeps other points
        can_new = cnt0[c] > 0
        fwd = jnp.where(slots == c, -jnp.inf, w)
        logits = jnp.concatenate([fwd, jnp.where(can_new, w_new, -jnp.inf)[None]])
        b = _draw_one(logits, u[1])
        to_new = b == C
        empty = cnt0 == 0
        num_empty = jnp.sum(empty & (slots != c))
        e = _draw_one(jnp.where(empty & (slots != c), 0.0, -jnp.inf), u[2])
        dest = jnp.where(to_new, e, b)
        log_q = jax.nn.logsumexp(logits)  # minus log q of the forward choice
        log_q = (jnp.where(to_new, w_new - jnp.log(jnp.maximum(num_empty, 1).astype(dtype)), w[dest])
                 - log_q)
        cnt1 = cnt0.at[dest].add(1)
        st1 = jax.tree.map(lambda s, p: s.at[dest].add(p), st0, ps_i)
        # reverse: from dest back to c (a new cluster in slot c when i was alone in c)
        rev = jnp.where(slots == dest, -jnp.inf, w)
        rev_logits = jnp.concatenate([rev, jnp.where(~to_new, w_new, -jnp.inf)[None]])
        num_empty1 = jnp.sum(cnt1 == 0)
        log_q_rev = (jnp.where(can_new, w[c], w_new - jnp.log(jnp.maximum(num_empty1, 1).astype(dtype)))
                     - jax.nn.logsumexp(rev_logits))
        log_sel = (jnp.log(K.astype(dtype)) + jnp.log(counts[c].astype(dtype))
                   - jnp.log(jnp.sum(cnt1 > 0).astype(dtype)) - jnp.log(cnt1[dest].astype(dtype)))
        log_r = log_joint_change(counts, stats, cnt1, st1, c, dest) + log_q_rev - log_q + log_sel
        ok = jnp.log(jax.random.uniform(jax.random.fold_in(key, M + m + 1), (), dtype)) < log_r
        num = num + (ok & ~can_new).astype(jnp.int32)
        labels = jnp.where(ok & chosen, dest, labels)
        counts = jnp.where(ok, cnt1, counts)
        stats = jax.tree.map(lambda a_, b_: jnp.where(ok, b_, a_), stats, st1)
        pair = jnp.stack([c, dest])
        moved = predictive_rows(st1, pair)
        table = jax.tree.map(lambda t, r: t.at[pair].set(jnp.where(ok, r, t[pair])), table, moved)
        return (labels, counts, stats, table, num), None

    carry = (labels, counts, stats, family.predictive_params(stats), jnp.int32(0))
    (labels, counts, stats, _, num), _ = lax.scan(move, carry, jnp.arange(M))
    return labels, counts, stats, num


