"""BHMC's global updates: the node weights ``β`` (the paper's eqs. 3-4, or the exact
conditionals), the component means ``θ`` (eq. 5), the complete log-likelihood and the
random-walk updates of the hyperparameters (docs/mathematics.md §6)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
from jax.scipy.special import logsumexp

from ..._math import cho_solve, cholesky, solve_triangular
from ...models.nested import (
    path_log_prior_table,
)
from .model import (
    BHMCConfig,
    BHMCModel,
    BHMCState,
    HyperInfo,
    log_dirichlet_logc,
    mvn_logpdf,
)
from .regraft import (
    regraft_leaves,
)


def update_beta(key, state: BHMCState, config: BHMCConfig) -> BHMCState:
    """Eqs. 3–4 top down: ``β_root ~ Dir(N_1..N_K, γ0)``, ``β_z' ~ Dir(N_z'k + γβ_zk, γβ*_z)``.

    docs/mathematics.md §6. A draw of ``B`` given the rest (no statistics to report, so it
    returns the state alone).
    """
    K, L = config.component_capacity, config.depth
    ftype = state.log_beta.dtype
    nk = state.node_comp.astype(ftype)
    log_nk = jnp.where(state.node_comp > 0, jnp.log(jnp.maximum(nk, 1.0)), -jnp.inf)
    log_nk = jnp.where(state.comp_active[None, :], log_nk, -jnp.inf)
    live = state.count > 0
    p = jnp.maximum(state.parent, 0)
    log_g = jnp.log(state.gamma)
    root_row = jnp.concatenate([log_nk[0], jnp.log(state.gamma0)[None]])

    def level_update(level, lb):
        at = live & (state.depth == level)
        par = lb[p]
        conc = jnp.concatenate([jnp.logaddexp(log_nk, log_g + par[:, :K]), log_g + par[:, K:]], axis=1)
        conc = conc.at[0].set(root_row)  # the root (level 0): eq. 3
        drawn = log_dirichlet_logc(jax.random.fold_in(key, level), conc)
        return jnp.where(at[:, None], drawn, lb)

    lb = lax.fori_loop(0, L + 1, level_update, state.log_beta)
    lb = jnp.where(live[:, None], lb, -jnp.inf)
    return state._replace(log_beta=lb)


def antoniak(key, n, a):
    """Number of tables of ``n`` customers in a CRP(``a``): ``Σ_{i<n} Bernoulli(a / (a + i))``,
    elementwise (``n`` integer, ``a > 0``); a loop over ``i`` up to ``max(n)``."""
    ftype = jnp.result_type(a)
    n = jnp.asarray(n)

    def body(carry):
        i, m = carry
        u = jax.random.uniform(jax.random.fold_in(key, i), n.shape, ftype)
        return i + 1, m + ((i < n) & (u * (a + i.astype(ftype)) < a)).astype(jnp.int32)

    return lax.while_loop(lambda c: c[0] < jnp.max(n), body, (jnp.int32(0), jnp.zeros(n.shape, jnp.int32)))[1]


def update_beta_exact(key, state: BHMCState, config: BHMCConfig) -> BHMCState:
    """Exact updates of every node's weights ``β`` given the tree and the components
    (docs/mathematics.md §6, "Exact β updates"); returns the state.

    1. Nodes above the leaves' parents, level by level from the root: ``beta_mh_steps``
       random-walk Metropolis-Hastings steps in additive log-ratio coordinates (all nodes of
       a level at once: they are independent given their parents and children) on the full
       conditional ``Dir(β_z; γβ_parent) Π_children Dir(β_c; γβ_z)``; at the root the prior
       factor is ``Π_k β_k^{-1} β*^{γ0 - 1}`` (the GEM weights of the components in use and
       the rest).
    2. Each parent ``z`` of leaves together with its leaves, by Chinese-restaurant-franchise
       table counts: the leaves' weights integrated out, ``m_ℓk ~ Antoniak(N_ℓk, γβ_zk)``,
       ``β_z ~ Dir(γβ_parent + Σ_ℓ m_ℓ)`` (the root at depth 1: ``Dir(Σ_ℓ m_ℓ, γ0)``), then
       the leaves ``β_ℓ ~ Dir(γβ_z + N_ℓ, γβ*_z)``.
    """
    return update_beta_exact_and_leaves(key, state, config, move_leaves=False)[0]


def update_beta_exact_and_leaves(key, state: BHMCState, config: BHMCConfig, move_leaves: bool
                                 ) -> tuple[BHMCState, jax.Array]:
    """:func:`update_beta_exact`, and with ``move_leaves`` the leaves' moves in between
    (:func:`regraft_leaves`). Returns the state and the number of leaves moved."""
    K, L, M = config.component_capacity, config.depth, config.node_capacity
    ftype = state.log_beta.dtype
    gamma, gamma0 = state.gamma, state.gamma0
    live = state.count > 0
    p = jnp.maximum(state.parent, 0)
    cols = jnp.concatenate([state.comp_active, jnp.ones(1, bool)])  # components in use, the rest
    floor = jnp.log(jnp.finfo(ftype).tiny)
    k_mh, k_tables, k_mid, k_leaf = jax.random.split(key, 4)
    lb = state.log_beta

    def safe(x):  # an underflowed weight counts as the smallest positive one
        return jnp.where(cols, jnp.maximum(x, floor), 0.0)

    def log_target(rows, lb, level):
        """Unnormalised log full conditional of each node's weights ``rows`` (M, K + 1)."""
        x = safe(rows)
        par = jnp.exp(lb[p])
        prior = jnp.where(level == 0,
                          jnp.sum(jnp.where(cols, jnp.where(jnp.arange(K + 1) == K, gamma0 - 1.0, -1.0) * x, 0.0), -1),
                          jnp.sum(jnp.where(cols, (gamma * par - 1.0) * x, 0.0), -1))
        child = live & (state.depth == level + 1)
        sum_log_children = jax.ops.segment_sum(jnp.where(child[:, None], safe(lb), 0.0), p, num_segments=M)
        num_children = jax.ops.segment_sum(child.astype(ftype), p, num_segments=M)
        b = gamma * jnp.exp(rows)
        lg = jnp.sum(jnp.where(cols, lax.lgamma(jnp.where(cols, b, 1.0)), 0.0), -1)
        children = -num_children * lg + jnp.sum(jnp.where(cols, b * sum_log_children, 0.0), -1)
        jac = jnp.sum(x, -1)  # d β / d η (additive log-ratio coordinates) = Π_j β_j
        return prior + children + jac

    for level in range(L - 1):  # nodes above the leaves' parents, from the root down
        at = live & (state.depth == level)

        def mh(i, lb, level=level, at=at):
            k_prop, k_u = jax.random.split(jax.random.fold_in(jax.random.fold_in(k_mh, level), i))
            eta = safe(lb) - safe(lb)[:, K:]
            eps = jax.random.normal(k_prop, lb.shape, ftype) * config.beta_mh_scale
            eta_new = jnp.where(cols & (jnp.arange(K + 1) < K), eta + eps, jnp.where(cols, eta, -jnp.inf))
            prop = eta_new - logsumexp(eta_new, axis=-1, keepdims=True)
            log_r = log_target(prop, lb, level) - log_target(lb, lb, level)
            accept = at & (jnp.log(jax.random.uniform(k_u, (M,), ftype)) < log_r)
            return jnp.where(accept[:, None], prop, lb)

        lb = lax.fori_loop(0, config.beta_mh_steps, mh, lb)

    # the leaves' parents with their leaves: table counts, the parent, the leaves
    leaf = live & (state.depth == L)
    n_leaf = jnp.where(leaf[:, None] & state.comp_active[None, :], state.node_comp, 0)
    a_leaf = gamma * jnp.exp(lb[p, :K])
    tables = antoniak(k_tables, n_leaf, jnp.where(n_leaf > 0, a_leaf, 1.0))
    num_moved = jnp.zeros((), jnp.int32)
    if move_leaves and L >= 2:  # the leaves change parent given their tables (parents' β integrated)
        state, num_moved = regraft_leaves(jax.random.fold_in(key, 7), state._replace(log_beta=lb), tables, config)
        lb, live, p = state.log_beta, state.count > 0, jnp.maximum(state.parent, 0)
        leaf = live & (state.depth == L)
    tables = jax.ops.segment_sum(tables, p, num_segments=M).astype(ftype)  # at each parent
    mid = live & (state.depth == L - 1)
    log_t = jnp.where(tables > 0, jnp.log(jnp.maximum(tables, 1.0)), -jnp.inf)
    log_t = jnp.concatenate([log_t, jnp.full((M, 1), -jnp.inf, ftype)], axis=1)
    par = lb[p]
    conc_mid = jnp.where(L == 1, jnp.concatenate(
        [jnp.full((M, K), -jnp.inf, ftype), jnp.full((M, 1), jnp.log(gamma0), ftype)], axis=1),
        jnp.log(gamma) + par)
    conc_mid = jnp.where(cols, jnp.logaddexp(conc_mid, log_t), -jnp.inf)
    lb = jnp.where(mid[:, None], log_dirichlet_logc(k_mid, conc_mid), lb)
    lb = draw_leaves(k_leaf, lb, n_leaf, state.comp_active, gamma, leaf, p)
    lb = jnp.where(live[:, None], lb, -jnp.inf)
    return state._replace(log_beta=lb), num_moved


def draw_leaves(key, log_beta, node_comp, comp_active, gamma, leaf, p):
    """Every ``leaf`` row of ``log_beta`` drawn from its conditional ``Dir(γβ_parent + N_ℓ,
    γβ*_parent)`` (``N_ℓ`` the leaf's row of ``node_comp``, ``p`` the parents); the other rows
    as they are."""
    ftype = log_beta.dtype
    cols = jnp.concatenate([comp_active, jnp.ones(1, bool)])
    counts = jnp.concatenate([node_comp, jnp.zeros((node_comp.shape[0], 1), node_comp.dtype)], axis=1).astype(ftype)
    log_n = jnp.where(counts > 0, jnp.log(jnp.maximum(counts, 1.0)), -jnp.inf)
    conc = jnp.where(cols, jnp.logaddexp(jnp.log(gamma) + log_beta[p], log_n), -jnp.inf)
    return jnp.where(leaf[:, None], log_dirichlet_logc(key, conc), log_beta)


def update_theta(key, state: BHMCState, X, model: BHMCModel, config: BHMCConfig) -> BHMCState:
    """Eq. 5: ``μ_k | X, c ~ N(Σ̃_k(Σ0⁻¹μ0 + Σ⁻¹ Σ_{c_n=k} x_n), Σ̃_k)``, ``Σ̃_k = (Σ0⁻¹ + N_k Σ⁻¹)⁻¹``.

    docs/mathematics.md §6. An exact conditional draw (returns the state alone).
    Inactive slots get prior draws (never used).
    """
    K = config.component_capacity
    ftype = state.theta.dtype
    nk = jnp.zeros(K, ftype).at[state.c].add(1.0)
    sums = jnp.zeros((K, X.shape[1]), ftype).at[state.c].add(X)

    def one(nk_k, sum_k, z):
        prec = model.prec0 + nk_k * model.prec_sigma
        chol = cholesky(prec)
        rhs = model.prec0_mu0 + model.prec_sigma @ sum_k
        mean = cho_solve(chol, rhs)
        return mean + solve_triangular(chol.T, z, lower=False)

    z = jax.random.normal(key, state.theta.shape, ftype)
    return state._replace(theta=jax.vmap(one)(nk, sums, z))


def complete_log_likelihood(state: BHMCState, X, model: BHMCModel, config: BHMCConfig) -> jax.Array:
    """``log p(X, c, V | B, θ) = Σ_n [log f(x_n; θ_{c_n}) + log β_{v_nL, c_n}] + log p(V | α)``
    (docs/mathematics.md §6)."""
    leaf = state.paths[:, -1]
    log_f = mvn_logpdf(X, state.theta[state.c], model.chol_sigma)
    log_w = state.log_beta[leaf, state.c]
    log_v = path_log_prior_table(state.parent, state.depth, state.count, state.alpha, config.depth)
    return jnp.sum(log_f + log_w) + log_v


def _log_dir_density(log_x, log_conc):
    """``log Dir(x; conc)`` over the entries with ``conc > 0`` (``x`` and ``conc`` in logs)."""
    ok = jnp.isfinite(log_conc) & jnp.isfinite(log_x)
    conc = jnp.where(ok, jnp.exp(log_conc), 1.0)
    terms = jnp.where(ok, (conc - 1.0) * log_x - lax.lgamma(conc), 0.0)
    return lax.lgamma(jnp.sum(jnp.where(ok, conc, 0.0), -1)) + jnp.sum(terms, -1)


def update_hyperparameters(key, state: BHMCState, config: BHMCConfig) -> tuple[BHMCState, HyperInfo]:
    """Random-walk MH on ``log α``, ``log γ0``, ``log γ`` (priors ``Ga(3,1)``, ``Ga(3.5,1)``, ``Unif(0,1.5)``).

    docs/mathematics.md §6. Returns the new state and a :class:`HyperInfo`.

    Targets: ``α`` the path prior ``p(V | α)``; ``γ0`` the CRP(``γ0``) partition
    probability of ``c`` (the Pólya-urn view of eq. 3); ``γ`` the densities
    ``Π_edges Dir(β_z'; γβ_z)``. The Jacobian of the log scale is included.
    """
    ftype = state.log_beta.dtype
    ks = jax.random.split(key, 6)
    step = config.hyper_step
    L = config.depth

    def mh(k_prop, k_u, value, log_target):
        prop = value * jnp.exp(step * jax.random.normal(k_prop, (), ftype))
        log_r = log_target(prop) - log_target(value) + jnp.log(prop) - jnp.log(value)
        accept = jnp.log(jax.random.uniform(k_u, (), ftype)) < log_r
        return jnp.where(accept, prop, value), accept

    def target_alpha(a):
        return (path_log_prior_table(state.parent, state.depth, state.count, a, L)
                + 2.0 * jnp.log(a) - a)

    nk = state.node_comp[0].astype(ftype)
    num_k = jnp.sum(state.comp_active)
    n = jnp.sum(nk)

    def target_gamma0(g):
        eppf = (num_k * jnp.log(g) + lax.lgamma(g) - lax.lgamma(n + g)
                + jnp.sum(jnp.where(state.comp_active, lax.lgamma(jnp.maximum(nk, 1.0)), 0.0)))
        return eppf + 2.5 * jnp.log(g) - g

    live = (state.count > 0) & (state.parent >= 0)
    par = state.log_beta[jnp.maximum(state.parent, 0)]

    def target_gamma(g):
        dens = _log_dir_density(state.log_beta, jnp.log(g) + par)
        return jnp.where(g < 1.5, jnp.sum(jnp.where(live, dens, 0.0)), -jnp.inf)

    alpha, acc_alpha = mh(ks[0], ks[1], state.alpha, target_alpha)
    gamma0, acc_gamma0 = mh(ks[2], ks[3], state.gamma0, target_gamma0)
    gamma, acc_gamma = mh(ks[4], ks[5], state.gamma, target_gamma)
    info = HyperInfo(jnp.stack([acc_alpha, acc_gamma0, acc_gamma]))
    return state._replace(alpha=alpha, gamma0=gamma0, gamma=gamma), info
