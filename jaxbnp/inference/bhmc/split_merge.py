"""BHMC's component split-merge move (docs/mathematics.md §6)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from ..._math import cho_solve, cholesky
from ..._random import log_beta_pair
from ..._ranks import argsort, permutation
from .beta import (
    draw_leaves,
    update_theta,
)
from .model import (
    BHMCConfig,
    BHMCModel,
    BHMCState,
    mvn_logpdf,
)


def _predictive_logpdf(x, n, total, model: BHMCModel):
    """``log p(x | the n points with sum total)`` of one component, its mean integrated out:
    ``N(x; m_n, Σ + Λ_n⁻¹)`` with ``Λ_n = Σ0⁻¹ + n Σ⁻¹``, ``m_n = Λ_n⁻¹(Σ0⁻¹μ0 + Σ⁻¹ total)``."""
    prec = model.prec0 + n * model.prec_sigma
    chol_prec = cholesky(prec)
    mean = cho_solve(chol_prec, model.prec0_mu0 + model.prec_sigma @ total)
    eye = jnp.eye(x.shape[0], dtype=x.dtype)
    cov = model.chol_sigma @ model.chol_sigma.T + cho_solve(chol_prec, eye)
    return mvn_logpdf(x[None, :], mean, cholesky(cov))[0]


def split_merge_log_ratio(state: BHMCState, X, model: BHMCModel, i, j, k, log_u, rank, log_unif, in_b):
    """Log Metropolis-Hastings ratio of splitting component ``k`` in two (docs/mathematics.md
    §6, "Component split-merge"), and the split: point ``i`` in the part ``a`` that keeps
    ``k``, ``j`` in the other, ``b``, and the other points of ``k`` allocated one by one in
    the order of ``rank`` ``(N,)``, each with its conditional given the points before it: drawn
    with the uniforms ``log_unif`` ``(N,)`` (logs), or, where ``in_b`` is given (a merge's
    reverse split), that one. Every node above the leaves splits its weight ``β_zk`` into
    ``u_z β_zk`` and ``(1 − u_z) β_zk`` (``log_u`` ``(M, 2)``: ``log u_z``, ``log(1 − u_z)``);
    the leaves' weights and the means are integrated out. With ``s`` the points of ``k``::

        log γ0 − log u_root − log(1 − u_root)
            + Σ_leaves [log DM(n_ℓa, n_ℓb; γβ_Pk u_P, γβ_Pk (1 − u_P)) − log DM(n_ℓs; γβ_Pk)]
            + log m(X_a) + log m(X_b) − log m(X_s) − log q(allocation)

    (``DM`` the Dirichlet-multinomial factor of a leaf below ``P``, ``m`` the Gaussian marginal
    of a component; the weights of the nodes between the root and the leaves' parents are
    split by their prior, ``u_z ~ Beta(γβ_pk u_p, γβ_pk (1 − u_p))``, which cancels).
    Returns ``(log ratio, in_b)``."""
    M = state.count.shape[0]
    n_pts, D = X.shape
    ftype = state.log_beta.dtype
    floor = jnp.log(jnp.finfo(ftype).tiny)
    forced = in_b is not None
    in_b = jnp.zeros(n_pts, bool) if in_b is None else in_b
    p = jnp.maximum(state.parent, 0)
    leaf_of = state.paths[:, -1]
    base = jnp.log(state.gamma) + jnp.maximum(state.log_beta[p, k], floor)
    # (M,): a leaf's two Dirichlet parameters (an underflowed weight: the smallest positive one)
    log_a, log_b = jnp.maximum(base + log_u[p, 0], floor), jnp.maximum(base + log_u[p, 1], floor)
    in_s = state.c == k
    n_all = jnp.arange(n_pts)
    sort_key = jnp.where(n_all == i, -2.0, jnp.where(n_all == j, -1.0, jnp.where(in_s, rank, rank + n_pts)))
    order = argsort(sort_key)  # i, j, then the other points of k: only those are visited

    def body(t, carry):
        n_a, n_b, stats, in_b, log_q, log_m = carry  # stats (3, 1 + D): count and sum of a, b, s
        n = order[t]
        x, ell = X[n], leaf_of[n]
        pred = jax.vmap(lambda st: _predictive_logpdf(x, st[0], st[1:], model))(stats)
        w_a = jnp.logaddexp(log_a[ell], jnp.log(n_a[ell].astype(ftype))) + pred[0]
        w_b = jnp.logaddexp(log_b[ell], jnp.log(n_b[ell].astype(ftype))) + pred[1]
        lp_b = w_b - jnp.logaddexp(w_a, w_b)
        lp_a = w_a - jnp.logaddexp(w_a, w_b)
        drawn = in_b[n] if forced else log_unif[n] < lp_b
        go_b = jnp.where(n == i, False, jnp.where(n == j, True, drawn)) & in_s[n]
        free = in_s[n] & (n != i) & (n != j)
        log_q = log_q + jnp.where(free, jnp.where(go_b, lp_b, lp_a), 0.0)
        log_m = log_m + jnp.where(in_s[n], jnp.where(go_b, pred[1], pred[0]) - pred[2], 0.0)
        add = in_s[n].astype(ftype) * jnp.concatenate([jnp.ones(1, ftype), x])
        stats = stats.at[go_b.astype(jnp.int32)].add(add).at[2].add(add)
        n_a = n_a.at[ell].add((in_s[n] & ~go_b).astype(jnp.int32))
        n_b = n_b.at[ell].add(go_b.astype(jnp.int32))
        return n_a, n_b, stats, in_b.at[n].set(go_b), log_q, log_m

    zeros = jnp.zeros(M, jnp.int32)
    carry = (zeros, zeros, jnp.zeros((3, 1 + D), ftype), in_b, jnp.zeros((), ftype), jnp.zeros((), ftype))
    n_a, n_b, _, in_b, log_q, log_m = lax.fori_loop(0, jnp.sum(in_s), body, carry)
    n_s = n_a + n_b
    ea, eb = jnp.exp(log_a), jnp.exp(log_b)
    es = ea + eb
    dm = (lax.lgamma(ea + n_a) - lax.lgamma(ea) + lax.lgamma(eb + n_b) - lax.lgamma(eb)
          - lax.lgamma(es + n_s) + lax.lgamma(es))
    log_dm = jnp.sum(jnp.where(n_s > 0, dm, 0.0))  # n_s > 0 only at leaves
    root = jnp.log(state.gamma0) - log_u[0, 0] - log_u[0, 1]
    return root + log_dm + log_m - log_q, in_b


def split_merge(key, state: BHMCState, X, model: BHMCModel, config: BHMCConfig, redraw: bool = True
                ) -> tuple[BHMCState, jax.Array]:
    """One Metropolis-Hastings split or merge of components (docs/mathematics.md §6, "Component
    split-merge"; Dahl's sequentially allocated split-merge): two points ``i ≠ j`` drawn at
    random; in one component, it splits in two (:func:`split_merge_log_ratio`; the root's
    ``u`` uniform, the nodes below the root by their prior), else their two components merge
    (the reverse). The leaves' weights and the means are integrated out in the ratio and drawn
    afterwards from their conditionals (every leaf ``Dir(γβ_parent + N_ℓ)``, :func:`update_theta`),
    whether or not the move is accepted; ``redraw=False`` leaves them as they were, for a caller
    that draws them next from their conditionals without reading them first (:func:`step` with
    the ``β`` update on: the leaves' weights and the means are drawn again before any update
    reads them). Returns the state and whether the move was accepted.
    A split that needs a component slot when none is free sets ``overflow`` when accepted.
    Needs at least two points."""
    L, M, K = config.depth, config.node_capacity, config.component_capacity
    n_pts = X.shape[0]
    if n_pts < 2:
        raise ValueError(f"split_merge needs at least 2 points, got {n_pts}.")
    ftype = state.log_beta.dtype
    k_pair, k_order, k_unif, k_root, k_nodes, k_acc, k_leaf, k_theta = jax.random.split(key, 8)
    i = jax.random.randint(k_pair, (), 0, n_pts)
    j = (i + 1 + jax.random.randint(jax.random.fold_in(k_pair, 1), (), 0, n_pts - 1)) % n_pts
    rank = permutation(k_order, n_pts).astype(ftype)
    ki, kj = state.c[i], state.c[j]
    split = ki == kj
    live = state.count > 0
    p = jnp.maximum(state.parent, 0)
    lb = state.log_beta
    floor = jnp.log(jnp.finfo(ftype).tiny)
    above = live & (state.depth < L) | (jnp.arange(M) == 0)  # the nodes whose weights are split

    # split: u by the prior top down (the root's uniform); merge: the u the components have
    def level_u(level, log_u):
        at = above & (state.depth == level) & (jnp.arange(M) > 0)
        a = state.gamma * jnp.exp(jnp.maximum(lb[p, ki], floor) + log_u[p, 0])
        b = state.gamma * jnp.exp(jnp.maximum(lb[p, ki], floor) + log_u[p, 1])
        lu, l1mu = log_beta_pair(jax.random.fold_in(k_nodes, level), a, b)
        return jnp.where(at[:, None], jnp.stack([lu, l1mu], -1), log_u)

    u0 = jax.random.uniform(k_root, (), ftype, minval=jnp.finfo(ftype).tiny, maxval=1.0)
    log_u = jnp.zeros((M, 2), ftype).at[0].set(jnp.stack([jnp.log(u0), jnp.log1p(-u0)]))
    log_u_split = lax.fori_loop(1, L, level_u, log_u)
    tot = jnp.logaddexp(lb[:, ki], lb[:, kj])
    log_u_merge = jnp.stack([lb[:, ki] - tot, lb[:, kj] - tot], -1)
    log_u_merge = jnp.where(jnp.isnan(log_u_merge), jnp.log(0.5), log_u_merge)  # both weights underflowed
    merged = state._replace(c=jnp.where(state.c == kj, ki, state.c), log_beta=lb.at[:, ki].set(tot))
    log_unif = jnp.log(jax.random.uniform(k_unif, (n_pts,), ftype, minval=jnp.finfo(ftype).tiny))
    def split_ratio(_):
        return split_merge_log_ratio(state, X, model, i, j, ki, log_u_split, rank, log_unif, None)

    def merge_ratio(_):  # the inverse of the ratio of the reverse split
        lr, _ = split_merge_log_ratio(merged, X, model, i, j, ki, log_u_merge, rank, log_unif, state.c == kj)
        return -lr, jnp.zeros(n_pts, bool)

    log_ratio, in_b_split = lax.cond(split, split_ratio, merge_ratio, None)
    accept = jnp.log(jax.random.uniform(k_acc, (), ftype)) < log_ratio
    slot = jnp.argmin(state.comp_active)
    no_slot = split & state.comp_active[slot]
    go = accept & ~no_slot

    def do_split(state):
        c = jnp.where(in_b_split, slot, state.c).astype(state.c.dtype)
        new_lb = lb.at[:, slot].set(jnp.where(above, lb[:, ki] + log_u_split[:, 1], -jnp.inf))
        new_lb = new_lb.at[:, ki].set(jnp.where(above, lb[:, ki] + log_u_split[:, 0], lb[:, ki]))
        return state._replace(c=c, log_beta=new_lb, comp_active=state.comp_active.at[slot].set(True))

    def do_merge(state):
        new_lb = lb.at[:, ki].set(jnp.where(above, tot, lb[:, ki])).at[:, kj].set(-jnp.inf)
        return state._replace(c=merged.c, log_beta=new_lb, comp_active=state.comp_active.at[kj].set(False))

    def recount(state):  # the component counts of every node, from the paths and the new c
        full = jnp.concatenate([jnp.zeros((n_pts, 1), jnp.int32), state.paths], axis=1)
        return state._replace(node_comp=jnp.zeros((M, K), jnp.int32).at[full, state.c[:, None]].add(1))

    state = lax.cond(go, lambda s: recount(lax.cond(split, do_split, do_merge, s)), lambda s: s, state)
    state = state._replace(overflow=state.overflow | (accept & no_slot))
    if not redraw:
        return state, go
    # the integrated-out weights of the leaves and the means, from their conditionals
    log_beta = draw_leaves(k_leaf, state.log_beta, state.node_comp, state.comp_active, state.gamma,
                            live & (state.depth == L), p)
    return update_theta(k_theta, state._replace(log_beta=log_beta), X, model, config), go
