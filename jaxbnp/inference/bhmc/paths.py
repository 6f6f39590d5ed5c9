"""BHMC's point update (Huang et al., Algorithm 2, §4.1): each point's path, by the paper's
Metropolis-Hastings step or an exact Gibbs draw (:func:`path_gibbs`), and its component
(docs/mathematics.md §6)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
from jax.scipy.special import logsumexp

from ..._random import log_beta_pair
from .model import (
    BHMCConfig,
    BHMCModel,
    BHMCState,
    PointInfo,
    full_path,
    log_acceptance,
    log_dirichlet_logc,
    mvn_logpdf,
    ncrp_log_prob,
)


def ancestors(node, p, L: int):
    """``(L + 1,)``: ``node`` and the nodes 1, ..., L levels above it (``p`` the parents with
    the root its own parent, so the root repeats once reached)."""
    up = [node]
    for _ in range(L):
        up.append(p[up[-1]])
    return jnp.stack(up)


def path_sums(step_lp, p, L: int):
    """Sum of ``step_lp`` along each node's path from the root (the root's entry is 0), one
    gather per level."""
    nodes = jnp.arange(step_lp.shape[0])
    reach = jnp.zeros_like(step_lp)
    for _ in range(L):
        reach = jnp.where(nodes == 0, 0.0, reach[p] + step_lp)
    return reach


def path_gibbs(key, parent, depth, old, count_minus, log_beta, logf, logf_star, alpha, gamma,
               config: BHMCConfig):
    """Exact Gibbs draw of one point's path given the others (docs/mathematics.md §6).

    The candidates are every existing leaf and, at every node ``z`` above the leaves (the
    root included), a new branch below ``z``; all are scored at once over the node slots::

        log nCRP(path | V∖{v_n}) + log p(x_n | β)

    with ``c_n`` summed out, ``p(x | β) = Σ_k β_k f(x; θ_k) + β* f*(x)``. A new branch
    below ``z`` has prior ``nCRP(z) α / (N_z + α)`` and, since ``E[β_z'] = β_z`` under
    ``β_z' ~ DP(γ, β_z)`` and ``p(x | β)`` is linear in ``β``, the likelihood of ``β_z``:
    the new nodes' weights are integrated out. When a new branch is chosen its weights are
    drawn from their conditional given ``x_n``: an index ``j`` (a component or the rest)
    ``∝ β_zj f_j(x_n)``, then top down ``β_z' ~ Dir(γβ_parent + e_j)``. Nodes used only
    by the point (``count_minus = 0``) are not candidates (their weights are part of the
    block being drawn); their slots are free for the new nodes.

    ``old``: the point's current full path ``(L + 1,)``; ``count_minus``: node counts
    without the point; ``log_beta``: ``(M, K + 1)``; ``logf``: ``(K,)`` ``log f(x_n; θ_k)``
    (``−inf`` for inactive slots); ``logf_star``: ``log f*(x_n)``. Returns
    ``(path, parent, depth, log_beta, overflow)``; on overflow (no free node slot for the
    new branch) the old path is kept.
    """
    L, M, K = config.depth, config.node_capacity, config.component_capacity
    ftype = log_beta.dtype
    k_path, k_index, k_dir = jax.random.split(key, 3)
    nodes = jnp.arange(M)
    p = jnp.maximum(parent, 0)
    live = (count_minus > 0) | (nodes == 0)
    # log nCRP probability of reaching each node: one gather per level
    step_lp = (jnp.log(jnp.maximum(count_minus, 1).astype(ftype))
               - jnp.log(count_minus[p].astype(ftype) + alpha))
    reach = path_sums(step_lp, p, L)
    lik = jnp.logaddexp(logsumexp(log_beta[:, :K] + logf, axis=1), log_beta[:, K] + logf_star)
    is_leaf = depth == L
    branch = jnp.where(is_leaf, 0.0, jnp.log(alpha) - jnp.log(count_minus.astype(ftype) + alpha))
    score = jnp.where(live, reach + branch + lik, -jnp.inf)
    choice = jnp.argmax(score + jax.random.gumbel(k_path, (M,), ftype))
    d_choice = jnp.where(choice == 0, 0, depth[choice])
    # ancestors of the choice: anc[l] = its ancestor at depth l (l <= d_choice)
    up = ancestors(choice, p, L)  # up[i]: i levels above the choice
    levels = jnp.arange(L + 1)
    anc = up[jnp.clip(d_choice - levels, 0, L)]
    free = jnp.nonzero((count_minus == 0) & (nodes > 0), size=L, fill_value=M)[0]
    new_level = levels > d_choice
    slots = free[jnp.clip(levels - d_choice - 1, 0, L - 1)]
    overflow = jnp.any(new_level & (slots >= M))
    path = jnp.where(new_level, jnp.minimum(slots, M - 1), anc).astype(jnp.int32)
    # the new nodes' weights given x_n: j ∝ β_zj f_j(x_n), then Dir(γβ_parent + e_j) top down
    base = log_beta[choice]
    j = jnp.argmax(jnp.concatenate([base[:K] + logf, (base[K] + logf_star)[None]])
                   + jax.random.gumbel(k_index, (K + 1,), ftype))
    one_j = jnp.arange(K + 1) == j

    def new_weights(parent_lb, k):
        log_conc = jnp.log(gamma) + parent_lb
        drawn = log_dirichlet_logc(k, jnp.where(one_j, jnp.logaddexp(log_conc, 0.0), log_conc))
        return drawn, drawn

    _, drawn = lax.scan(new_weights, base, jax.random.split(k_dir, L))  # levels d+1 .. d+L
    # drawn[i] is the node i + 1 levels below the choice, i.e. at depth d_choice + 1 + i
    write = new_level[1:] & ~overflow
    rows = jnp.where(write, path[1:], M)  # M: dropped
    new_lb = drawn[jnp.clip(levels[1:] - d_choice - 1, 0, L - 1)]
    parent = parent.at[rows].set(path[:-1], mode="drop")
    depth = depth.at[rows].set(levels[1:].astype(depth.dtype), mode="drop")
    log_beta = log_beta.at[rows].set(new_lb, mode="drop")
    path = jnp.where(overflow, old, path)
    return path, parent, depth, log_beta, overflow


def point_update(key, state: BHMCState, n, X, model: BHMCModel, config: BHMCConfig) -> tuple[BHMCState, PointInfo]:
    """Steps 1–3 of the module docstring for point ``n``: clean up, MH on the path, Gibbs on ``c_n``.

    docs/mathematics.md §6. Returns the new state and a :class:`PointInfo`.

    Compile time: all discrete randomness comes from one ``uniform`` call and
    the Gamma draws from one ``loggamma`` call site per level loop.
    """
    L, M, K = config.depth, config.node_capacity, config.component_capacity
    D = X.shape[1]
    ftype = state.log_beta.dtype
    alpha, gamma, gamma0 = state.alpha, state.gamma, state.gamma0
    k_unif, k_beta, k_split = jax.random.split(key, 3)
    tiny = jnp.finfo(ftype).tiny
    unif = jax.random.uniform(k_unif, (L * (M + 1) + 1 + (K + 1) + K + D,), ftype, minval=tiny, maxval=1.0)
    gumbel_path = -jnp.log(-jnp.log(unif[: L * (M + 1)])).reshape(L, M + 1)
    o = L * (M + 1)
    log_u_acc = jnp.log(unif[o])
    gumbel_c = -jnp.log(-jnp.log(unif[o + 1: o + K + 2]))
    gumbel_fb = -jnp.log(-jnp.log(unif[o + K + 2: o + 2 * K + 2]))
    z_theta = jax.scipy.special.ndtri(unif[o + 2 * K + 2:])
    x = X[n]
    old = full_path(state.paths[n])
    k_old = state.c[n]

    # 1. clean up c_n (fold an emptied component into the rest) and v_n
    node_comp = state.node_comp.at[old, k_old].add(-1)
    emptied = node_comp[0, k_old] == 0
    lb = state.log_beta
    folded_rest = jnp.logaddexp(lb[:, K], lb[:, k_old])
    lb = jnp.where(emptied, lb.at[:, K].set(folded_rest).at[:, k_old].set(-jnp.inf), lb)
    comp_active = state.comp_active.at[k_old].set(jnp.where(emptied, False, state.comp_active[k_old]))
    count = state.count
    count_minus = count.at[old].add(-1)

    logf = jnp.where(comp_active, mvn_logpdf(x[None, :], state.theta, model.chol_sigma), -jnp.inf)
    logf_star = mvn_logpdf(x[None, :], model.mu0, model.chol_marginal)[0]

    if config.path_update == "gibbs":
        cur, parent, depth, lb, node_overflow = path_gibbs(
            k_beta, state.parent, state.depth, old, count_minus, lb, logf, logf_star, alpha, gamma,
            config)
    else:  # the paper's MH step
        def lik(log_beta_leaf):
            return jnp.logaddexp(logsumexp(log_beta_leaf[:K] + logf), log_beta_leaf[K] + logf_star)

        lik_old = lik(lb[old[L]])

        # 2. propose v'_n from the nCRP given V∖{v_n}; new nodes take free slots not used by v_n
        free = jnp.nonzero((count == 0) & (jnp.arange(M) > 0), size=L, fill_value=M)[0]
        log_cm = jnp.log(jnp.maximum(count_minus, 1).astype(ftype))

        def level_step(carry, inputs):
            node, prev_new, num_new, log_q, over, parent_lb = carry
            g, k = inputs
            is_child = (state.parent == node) & (count_minus > 0) & ~prev_new
            logits = jnp.concatenate([jnp.where(is_child, log_cm, -jnp.inf), jnp.log(alpha)[None]])
            choice = jnp.argmax(logits + g)
            norm = jnp.log(jnp.where(prev_new, 0, count_minus[node]).astype(ftype) + alpha)
            is_new = choice == M
            slot = free[jnp.minimum(num_new, L - 1)]
            over = over | (is_new & (slot >= M))
            child = jnp.where(is_new, jnp.minimum(slot, M - 1), choice).astype(jnp.int32)
            drawn = log_dirichlet_logc(k, jnp.log(gamma) + parent_lb)
            child_lb = jnp.where(is_new, drawn, lb[child])
            carry = (child, is_new, num_new + is_new.astype(jnp.int32), log_q + logits[choice] - norm, over, child_lb)
            return carry, (child, is_new, drawn)

        init_carry = (jnp.int32(0), jnp.bool_(False), jnp.int32(0), jnp.zeros((), ftype), jnp.bool_(False), lb[0])
        (_, _, _, q_fwd, node_overflow, leaf_lb), (children, new_flags, new_lbs) = lax.scan(
            level_step, init_carry, (gumbel_path, jax.random.split(k_beta, L)))
        prop = jnp.concatenate([jnp.zeros(1, jnp.int32), children])
        lik_new = lik(leaf_lb)
        q_back = ncrp_log_prob(old, count_minus, alpha)
        # p(V') / p(V) = nCRP(v'|V∖v_n) / nCRP(v|V∖v_n) (exchangeability; docs/mathematics.md §6 prior)
        prior_new, prior_old = ncrp_log_prob(prop, count_minus, alpha), q_back
        log_a = log_acceptance(lik_new, lik_old, prior_new, prior_old, q_fwd, q_back)
        accept = (log_u_acc < log_a) & ~node_overflow

        write = accept & new_flags
        rows = jnp.where(write, children, M)  # M: dropped
        parent = state.parent.at[rows].set(prop[:-1], mode="drop")
        depth = state.depth.at[rows].set(jnp.arange(1, L + 1, dtype=jnp.int32), mode="drop")
        lb = lb.at[rows].set(new_lbs, mode="drop")
        cur = jnp.where(accept, prop, old)
    changed = jnp.any(cur != old)
    count = count_minus.at[cur].add(1)
    paths = state.paths.at[n].set(cur[1:])

    # 3. Gibbs on c_n (eq. 2), a new component by breaking every node's rest stick
    leaf = cur[L]
    logits_c = jnp.concatenate([lb[leaf, :K] + logf, (lb[leaf, K] + logf_star)[None]])
    choice = jnp.argmax(logits_c + gumbel_c)
    wants_new = choice == K
    slot = jnp.argmin(comp_active)  # first free component slot
    comp_overflow = wants_new & comp_active[slot]
    fallback = jnp.argmax(logits_c[:K] + gumbel_fb)

    def create(args):
        lb, theta, comp_active = args
        j = slot
        cov_single = model.chol_single @ model.chol_single.T
        mean = cov_single @ (model.prec0_mu0 + model.prec_sigma @ x)
        theta = theta.at[j].set(mean + model.chol_single @ z_theta)
        on_path = jnp.zeros(M, bool).at[cur].set(True)
        live = count > 0
        p = jnp.maximum(parent, 0)
        extra = jnp.zeros(M, ftype) if config.paper_split else on_path.astype(ftype)

        def level_split(level, lb):
            at = live & (depth == level)
            root = level == 0
            a = jnp.where(root, 1.0, gamma * jnp.exp(lb[p, j]) + extra)
            b = jnp.where(root, gamma0, gamma * jnp.exp(lb[p, K]))
            lu, l1mu = log_beta_pair(jax.random.fold_in(k_split, level), a, b)
            # a node whose rest mass underflowed to zero (a = b = 0) has nothing to split
            some = (a > 0) | (b > 0)
            lu, l1mu = jnp.where(some, lu, -jnp.inf), jnp.where(some, l1mu, 0.0)
            new_j = jnp.where(at, lb[:, K] + lu, lb[:, j])
            new_rest = jnp.where(at, lb[:, K] + l1mu, lb[:, K])
            return lb.at[:, j].set(new_j).at[:, K].set(new_rest)

        lb = lax.fori_loop(0, L + 1, level_split, lb)
        return lb, theta, comp_active.at[j].set(True)

    do_create = wants_new & ~comp_overflow
    lb, theta, comp_active = lax.cond(do_create, create, lambda a: a, (lb, state.theta, comp_active))
    k_new = jnp.where(wants_new, jnp.where(comp_overflow, fallback, slot), choice).astype(jnp.int32)
    node_comp = node_comp.at[cur, k_new].add(1)
    c = state.c.at[n].set(k_new)
    state = state._replace(
        paths=paths, parent=parent, depth=depth, count=count, log_beta=lb, node_comp=node_comp, c=c,
        comp_active=comp_active, theta=theta, overflow=state.overflow | node_overflow | comp_overflow)
    return state, PointInfo(changed)
