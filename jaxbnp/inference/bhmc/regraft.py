"""BHMC's subtree moves: a Gibbs draw of the place of every subtree below the first level
(docs/mathematics.md §6, "Subtree moves")."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from ..._ranks import argsort, permutation
from .model import (
    BHMCConfig,
    BHMCState,
    log_dirichlet_logc,
)
from .paths import (
    ancestors,
    path_sums,
)


def _block_log_lik(z, log_beta, node_comp, comp_active, gamma, is_leaf, rows):
    """The factor of the subtree below ``z`` that depends on its parent's weights, for every
    candidate parent weight row ``rows`` ``(M, K + 1)`` (logs): for a leaf its weights
    integrated out, ``log ∫ Π_k β_k^{N_zk} Dir(β; γβ_parent) dβ``; for an internal node the
    density ``log Dir(β_z; γβ_parent)``. Columns: the components in use and the rest."""
    ftype = log_beta.dtype
    cols = jnp.concatenate([comp_active, jnp.ones(1, bool)])
    floor = jnp.log(jnp.finfo(ftype).tiny)
    a = jnp.where(cols, gamma * jnp.exp(jnp.maximum(rows, floor)), 1.0)  # an underflowed weight: tiny
    total = jnp.sum(jnp.where(cols, a, 0.0), -1)
    n = jnp.concatenate([node_comp[z], jnp.zeros(1, node_comp.dtype)]).astype(ftype)
    used = cols & (n > 0)
    leaf = (lax.lgamma(total) - lax.lgamma(total + jnp.sum(n))
            + jnp.sum(jnp.where(used, lax.lgamma(a + n) - lax.lgamma(a), 0.0), -1))
    x = jnp.maximum(log_beta[z], floor)
    dens = lax.lgamma(total) + jnp.sum(jnp.where(cols, (a - 1.0) * x - lax.lgamma(a), 0.0), -1)
    return jnp.where(is_leaf, leaf, dens)


def _subtree_place(z, state: BHMCState, config: BHMCConfig):
    """Where node ``z``'s subtree hangs: ``(ancestors, count_minus, current)``, the ancestors
    ``(L + 1,)`` by depth (entries from ``z``'s depth on are not ancestors), the node counts
    without the subtree, and the slot that stands for the present place among
    :func:`regraft_log_weights`'s candidates (the parent if it keeps other points, else the
    node the branch that would vanish starts from)."""
    L, M = config.depth, config.node_capacity
    levels = jnp.arange(L + 1)
    p = jnp.maximum(state.parent, 0)
    ell = state.depth[z]
    anc = ancestors(z, p, L)[jnp.clip(ell - levels, 0, L)]  # anc[d]: the ancestor at depth d < ell
    above = jnp.zeros(M, bool).at[jnp.where(levels < ell, anc, M)].set(True, mode="drop")
    count_minus = state.count - jnp.where(above, state.count[z], 0)
    keeps = (count_minus[anc] > 0) | (levels == 0)
    d_cur = jnp.max(jnp.where(keeps & (levels < ell), levels, 0))
    return anc, count_minus, anc[d_cur]


def regraft_log_weights(z, state: BHMCState, rows, config: BHMCConfig):
    """Log weights (up to a constant) of the places of node ``z``'s subtree (docs/mathematics.md
    §6, "Subtree moves"), one per node slot ``u``: below ``u`` if ``u`` is at depth
    ``ℓ − 1`` (``ℓ`` the depth of ``z``), at the end of a new branch from ``u`` if ``u`` is
    shallower; ``−inf`` where ``u`` is no candidate. With ``s = N_z`` and counts ``N⁻``
    without the subtree::

        log nCRP(the s points reach u) + log t(N⁻_u) + (ℓ − 1 − d_u) log t(0)
            + log p(subtree | β_parent)

    where ``t(N) = α Γ(s) Γ(N + α) / Γ(N + α + s)`` is the probability that ``s`` customers
    open one new table together in a restaurant of ``N``, and reaching ``u`` multiplies
    ``Γ(N⁻_u + s) Γ(N⁻_p + α) / [Γ(N⁻_u) Γ(N⁻_p + α + s)]`` over the edges ``p → u``
    above it. ``rows``: ``(M, K + 1)`` the weights (logs) the parent would have in each
    place: ``β_u`` below ``u``, an auxiliary draw at the end of a new branch
    (:func:`_block_log_lik`)."""
    lik = _block_log_lik(z, state.log_beta, state.node_comp, state.comp_active, state.gamma,
                         state.depth[z] == config.depth, rows)
    prior = regraft_log_prior(z, state, config)
    return jnp.where(prior > -jnp.inf, prior + lik, -jnp.inf)  # (rows of no candidate may give NaN)


def regraft_log_prior(z, state: BHMCState, config: BHMCConfig):
    """The path-prior part of :func:`regraft_log_weights` (``−inf`` where ``u`` is no
    candidate): the ``s`` points of ``z``'s subtree reach ``u`` together and open new tables
    there and in each new node of a branch."""
    L, M = config.depth, config.node_capacity
    ftype = state.log_beta.dtype
    alpha = state.alpha
    nodes = jnp.arange(M)
    p = jnp.maximum(state.parent, 0)
    ell = state.depth[z]
    _, count_minus, _ = _subtree_place(z, state, config)
    live = (count_minus > 0) | (nodes == 0)
    d = jnp.where(nodes == 0, 0, state.depth)
    sf = state.count[z].astype(ftype)
    cm = count_minus.astype(ftype)
    cmp = cm[p]
    step_lp = (lax.lgamma(jnp.maximum(cm, 1.0) + sf) - lax.lgamma(jnp.maximum(cm, 1.0))
               + lax.lgamma(cmp + alpha) - lax.lgamma(cmp + alpha + sf))
    reach = path_sums(step_lp, p, L)

    def log_t(n):
        return jnp.log(alpha) + lax.lgamma(sf) + lax.lgamma(n + alpha) - lax.lgamma(n + alpha + sf)

    fresh = jnp.maximum(ell - 1 - d, 0).astype(ftype)
    prior = reach + log_t(cm) + fresh * log_t(jnp.zeros((), ftype))
    return jnp.where(live & (d <= ell - 1), prior, -jnp.inf)


def _aux_branches(key, log_beta, gamma, config: BHMCConfig):
    """Auxiliary weights of a new branch from each row of ``log_beta`` ``(R, K + 1)``:
    ``chain[t]`` ``(R, K + 1)`` the node ``t`` levels below (``chain[0] = log_beta``), each
    ``Dir(γβ_above)``."""
    def one(prev, k):
        drawn = log_dirichlet_logc(k, jnp.log(gamma) + prev)
        return drawn, drawn

    _, chain = lax.scan(one, log_beta, jax.random.split(key, config.depth - 1))
    return jnp.concatenate([log_beta[None], chain])  # (L, R, K + 1)


def _move_subtree(state: BHMCState, z, choice, cur, anc, count_minus, chain, branch_row, config: BHMCConfig):
    """Hang ``z``'s subtree at place ``choice`` (:func:`regraft_log_weights`'s slots): the
    ancestors' counts and component counts, the new branch's nodes (free slots, weights from
    the auxiliary ``chain[t, branch_row[choice]]``), ``z``'s parent and the paths of its
    points. Returns ``(state, moved, overflow)``; with no free slot for a new branch the
    subtree stays and ``overflow`` is true."""
    L, M = config.depth, config.node_capacity
    levels = jnp.arange(L + 1)
    nodes = jnp.arange(M)
    ell = state.depth[z]
    d = jnp.where(nodes == 0, 0, state.depth)
    moved = choice != cur
    s, n_z = state.count[z], state.node_comp[z]
    d_new = d[choice]
    # the new ancestors by depth: those of the choice, then free slots for a new branch
    up = ancestors(choice, jnp.maximum(state.parent, 0), L)
    free = jnp.nonzero((count_minus == 0) & (nodes > 0), size=L, fill_value=M)[0]
    new_level = (levels > d_new) & (levels < ell)
    slots = free[jnp.clip(levels - d_new - 1, 0, L - 1)]
    overflow = moved & jnp.any(new_level & (slots >= M))
    new_anc = jnp.where(new_level, jnp.minimum(slots, M - 1),
                        up[jnp.clip(d_new - levels, 0, L)]).astype(jnp.int32)
    go = moved & ~overflow

    def apply(state):
        old_rows = jnp.where(levels < ell, anc, M)
        new_rows = jnp.where(levels < ell, new_anc, M)
        count = count_minus.at[new_rows].add(s, mode="drop")
        node_comp = state.node_comp.at[old_rows].add(-n_z, mode="drop").at[new_rows].add(n_z, mode="drop")
        made = jnp.where(new_level, new_anc, M)
        parent = state.parent.at[made].set(new_anc[jnp.maximum(levels - 1, 0)], mode="drop")
        parent = parent.at[z].set(new_anc[ell - 1])
        depth = state.depth.at[made].set(levels.astype(state.depth.dtype), mode="drop")
        log_beta = state.log_beta.at[made].set(chain[jnp.clip(levels - d_new, 0, L - 1), branch_row[choice]],
                                               mode="drop")
        in_sub = state.paths[:, jnp.clip(ell - 1, 0, L - 1)] == z
        cols = jnp.arange(L)
        paths = jnp.where(in_sub[:, None] & (cols[None, :] < ell - 1), new_anc[1 + cols][None, :], state.paths)
        return state._replace(paths=paths, parent=parent, depth=depth, count=count, log_beta=log_beta,
                              node_comp=node_comp)

    state = lax.cond(go, apply, lambda s: s, state)
    return state, go, overflow


def regraft_node(key, state: BHMCState, z, config: BHMCConfig, level: int | None = None
                 ) -> tuple[BHMCState, jax.Array]:
    """Gibbs draw of the place of node ``z``'s subtree (``z`` at depth ``ℓ ≥ 2``) given
    everything else (docs/mathematics.md §6, "Subtree moves"): below any node at depth
    ``ℓ − 1`` that keeps other points, or at the end of a new branch from any node above
    (Neal's algorithm 8 with one auxiliary branch per node, drawn from the prior; the branch
    that would vanish keeps its weights). A leaf's weights are integrated out and drawn
    again given its new parent, ``Dir(γβ_parent + N_z)``. Returns the state and whether the
    subtree moved. When a new branch finds no free node slot the state keeps its place and
    ``overflow`` is set. ``level``: the depth of ``z`` when known when tracing (at depth 2
    only the root starts new branches, so only its auxiliary branch is drawn)."""
    L, M = config.depth, config.node_capacity
    k_aux, k_choice, k_leaf = jax.random.split(key, 3)
    nodes = jnp.arange(M)
    ell = state.depth[z]
    d = jnp.where(nodes == 0, 0, state.depth)
    lb = state.log_beta
    anc, count_minus, cur = _subtree_place(z, state, config)
    root_only = level == 2  # the only node above depth 1 is the root
    chain = _aux_branches(k_aux, lb[:1] if root_only else lb, state.gamma, config)  # (L, R, K + 1)
    branch_row = jnp.zeros_like(nodes) if root_only else nodes
    rows = jnp.where((d < ell - 1)[:, None], chain[jnp.clip(ell - 1 - d, 0, L - 1), branch_row], lb)
    # rows: β_u below u, the end of u's auxiliary branch above
    rows = rows.at[cur].set(lb[anc[ell - 1]])  # the present place keeps its weights
    weights = regraft_log_weights(z, state, rows, config)
    choice = jnp.argmax(weights + jax.random.gumbel(k_choice, (M,), lb.dtype))
    state, go, overflow = _move_subtree(state, z, choice, cur, anc, count_minus, chain, branch_row, config)
    # a leaf's weights given its (new) parent
    cols = jnp.concatenate([state.comp_active, jnp.ones(1, bool)])
    n_z = state.node_comp[z]
    n = jnp.concatenate([n_z, jnp.zeros(1, n_z.dtype)]).astype(lb.dtype)
    log_n = jnp.where(n > 0, jnp.log(jnp.maximum(n, 1.0)), -jnp.inf)
    parent_row = jnp.where(go, rows[choice], lb[anc[ell - 1]])
    conc = jnp.where(cols, jnp.logaddexp(jnp.log(state.gamma) + parent_row, log_n), -jnp.inf)
    leaf_lb = log_dirichlet_logc(k_leaf, conc)
    log_beta = jnp.where(ell == L, state.log_beta.at[z].set(leaf_lb), state.log_beta)
    return state._replace(log_beta=log_beta, overflow=state.overflow | overflow), go


def leaf_table_log_weights(z, state: BHMCState, tables, rows, config: BHMCConfig):
    """Log weights of the places of leaf ``z`` given the leaves' table counts ``tables``
    ``(M, K)`` (int, one row per leaf) with every leaves' parent's weights integrated out
    (docs/mathematics.md §6, "Subtree moves"): :func:`regraft_log_prior` plus, with
    ``m = tables[z]`` and ``T⁻_u`` the tables of ``u``'s other children (none for a new
    parent), ``Σ_k log Γ(γβ_gk + T⁻_uk + m_k) − log Γ(γβ_gk + T⁻_uk)
    + log Γ(γ + T⁻_u) − log Γ(γ + T⁻_u + Σm)``. ``rows`` ``(M, K + 1)``: the weights
    ``β_g`` above the parent in each place (the parent's parent for an existing parent,
    ``u`` for a new parent below ``u``, an auxiliary draw for a longer new branch)."""
    L, M = config.depth, config.node_capacity
    ftype = state.log_beta.dtype
    nodes = jnp.arange(M)
    p = jnp.maximum(state.parent, 0)
    leaf = (state.count > 0) & (state.depth == L)
    m = tables[z]
    T = jax.ops.segment_sum(jnp.where(leaf[:, None] & (nodes != z)[:, None], tables, 0), p, num_segments=M)
    d = jnp.where(nodes == 0, 0, state.depth)
    T = jnp.where((d == L - 1)[:, None], T, 0).astype(ftype)  # a new parent has no tables yet
    floor = jnp.log(jnp.finfo(ftype).tiny)
    a = state.gamma * jnp.exp(jnp.maximum(rows[:, :-1], floor))  # (M, K): active columns
    used = state.comp_active & (m > 0)
    mf = m.astype(ftype)
    total = state.gamma * jnp.sum(jnp.exp(jnp.where(jnp.concatenate([state.comp_active, jnp.ones(1, bool)]),
                                                    jnp.maximum(rows, floor), -jnp.inf)), -1)
    lik = (jnp.sum(jnp.where(used, lax.lgamma(a + T + mf) - lax.lgamma(a + T), 0.0), -1)
           + lax.lgamma(total + T.sum(-1)) - lax.lgamma(total + T.sum(-1) + mf.sum()))
    prior = regraft_log_prior(z, state, config)
    return jnp.where(prior > -jnp.inf, prior + lik, -jnp.inf)  # (rows of no candidate may give NaN)


def regraft_leaves(key, state: BHMCState, tables, config: BHMCConfig) -> tuple[BHMCState, jax.Array]:
    """Gibbs draw of every leaf's place, in a random order, given the leaves' table counts
    with the parents' weights integrated out (:func:`leaf_table_log_weights`; inside the
    exact ``β`` update, between the table draw and the parents' draw, which then use the
    new tree). New branches longer than a parent take auxiliary weights drawn from the prior
    (Neal's algorithm 8; a branch that would vanish keeps its weights); a new parent's weights
    are drawn with the others' afterwards. Returns the state and the number of leaves moved."""
    L, M = config.depth, config.node_capacity
    nodes = jnp.arange(M)
    k_order, k_rest = jax.random.split(key)
    order = permutation(k_order, M)
    at = (state.count > 0) & (state.depth == L)
    order = order[argsort(~at[order])]
    keys = jax.random.split(k_rest, M)

    def one(key, state, z):
        k_aux, k_choice = jax.random.split(key)
        lb = state.log_beta
        p = jnp.maximum(state.parent, 0)
        d = jnp.where(nodes == 0, 0, state.depth)
        anc, count_minus, cur = _subtree_place(z, state, config)
        if L == 2:  # no branch longer than a parent: no auxiliary weights
            chain, branch_row = jnp.stack([lb, lb]), nodes
        else:  # at depth 3 only the root starts branches longer than a parent
            chain = _aux_branches(k_aux, lb[:1] if L == 3 else lb, state.gamma, config)
            branch_row = jnp.zeros_like(nodes) if L == 3 else nodes
        aux = chain[jnp.clip(L - 2 - d, 0, L - 1), branch_row]
        rows = jnp.where((d == L - 1)[:, None], lb[p], jnp.where((d == L - 2)[:, None], lb, aux))
        rows = rows.at[cur].set(lb[anc[L - 2]])  # the present place keeps its weights
        weights = leaf_table_log_weights(z, state, tables, rows, config)
        choice = jnp.argmax(weights + jax.random.gumbel(k_choice, (M,), lb.dtype))
        state, go, overflow = _move_subtree(state, z, choice, cur, anc, count_minus, chain, branch_row, config)
        return state._replace(overflow=state.overflow | overflow), go

    def body(i, carry):
        state, total = carry
        state, moved = lax.cond(state.overflow, lambda s: (s, jnp.bool_(False)),
                                lambda s: one(keys[i], s, order[i]), state)
        return state, total + moved.astype(jnp.int32)

    return lax.fori_loop(0, jnp.sum(at), body, (state, jnp.zeros((), jnp.int32)))


def regraft(key, state: BHMCState, config: BHMCConfig, last_level: int | None = None
            ) -> tuple[BHMCState, jax.Array]:
    """Subtree moves (docs/mathematics.md §6, "Subtree moves"): from depth 2 down to
    ``last_level`` (default: the leaves), every node of the level in a random order gets a
    Gibbs draw of its place (:func:`regraft_node`), its whole subtree with it. Returns the
    state and the number of subtrees moved. (With the exact ``β`` update the leaves move
    there instead, their parents' weights integrated out too: :func:`update_beta_exact`.)"""
    last_level = config.depth if last_level is None else last_level
    M = config.node_capacity
    total = jnp.zeros((), jnp.int32)
    for level in range(2, last_level + 1):  # a level's nodes stay those of the level while they move
        k_level = jax.random.fold_in(key, level)
        order = permutation(k_level, M)
        at = (state.count > 0) & (state.depth == level)
        order = order[argsort(~at[order])]  # the level's nodes first, shuffled
        keys = jax.random.split(jax.random.fold_in(k_level, 1), M)

        def body(i, carry, level=level, order=order, keys=keys):
            state, total = carry
            state, moved = lax.cond(state.overflow, lambda s: (s, jnp.bool_(False)),
                                    lambda s: regraft_node(keys[i], s, order[i], config, level), state)
            return state, total + moved.astype(jnp.int32)

        state, total = lax.fori_loop(0, jnp.sum(at), body, (state, total))
    return state, total
