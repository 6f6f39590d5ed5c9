"""BHMC sampler (Huang et al., Algorithm 2): MH on paths, Gibbs on components, β and θ updates.

docs/mathematics.md §6, model in :mod:`jaxbnp.models.nested`. One :func:`step` (a sweep) visits the
points in a random order (paper: ``Shuffled(X)``) and for point ``n``

1. cleans up ``c_n`` and ``v_n``: removes ``n`` from its component (a
   component left empty is folded back into the rest mass, ``β*_z += β_zk`` at
   every node) and from its path (the counts without ``n``, ``V∖{v_n}``);
2. proposes a path ``v'_n`` from the nested CRP given ``V∖{v_n}``, drawing
   ``β_z' ~ Dir(γβ_z1, …, γβ_zK, γβ*_z)`` for new nodes, and accepts it with
   probability (paper §4.1)::

       A = min{1, p(x_n | β_{v'_nL}, θ) p(V') nCRP(v_n; V∖{v_n})
                  / [p(x_n | β_{v_nL}, θ) p(V) nCRP(v'_n; V∖{v_n})]}

   with ``c_n`` summed out, ``p(x | β, θ) = Σ_k β_k f(x; θ_k) + β* f*(x)``
   (eq. 1), ``f = N(θ_k, Σ)``, ``f* = N(μ0, Σ0 + Σ)``; ``p(V')/p(V)`` is the
   path prior of docs/mathematics.md §6 (by exchangeability it equals the nCRP ratio, so
   the prior and proposal terms cancel and ``A`` is the likelihood ratio);
   By default (``path_update="gibbs"``) step 2 is instead an exact Gibbs draw of the
   path (:func:`path_gibbs`): every existing leaf and a new branch under every node,
   scored at once, the new branch's weights integrated out.
3. draws ``c_n`` by eq. 2: ``∝ β_zk f(x_n; θ_k)`` for an existing component,
   ``∝ β*_z f*(x_n)`` for a new one; a new component takes a free slot, its
   ``θ`` is drawn from ``N(θ | x_n)`` and every node breaks its rest stick
   (paper §4.1): the root by ``u ~ Beta(1, γ0)``, a child ``z'`` of ``z`` by
   ``u ~ Beta(γβ_z,new + 1[z' on v_n], γβ*_z)``, top down.

After all points, with ``regraft`` (default), every subtree below the first level gets a
Gibbs draw of its place (:func:`regraft`; docs/mathematics.md §6, "Subtree moves"). Then
the weights by eqs. 3–4 (``β_root ~ Dir(N_1..N_K, γ0)``,
``β_z' ~ Dir(N_z'k + γβ_zk, γβ*_z)``, top down, ``N_z'k`` the points of
component ``k`` below ``z'``), the means by eq. 5 and, optionally, a random-walk
MH on ``log α``, ``log γ0`` and ``log γ`` under the paper's hyperpriors
(``α ~ Ga(3, 1)``, ``γ0 ~ Ga(3.5, 1)``, ``γ ~ Unif(0, 1.5)``).

Deviations and exactness (say so, docs/mathematics.md §0):

* The new-component split adds ``+1`` to the first Beta parameter at the
  nodes on the point's own path. Paper §4.1 uses ``Beta(γβ_z,new, γβ*_z)``
  at every non-root node, which is the prior of an unselected atom; the atom
  was selected by ``x_n`` at its leaf, and the Chinese-restaurant-franchise
  posterior (one new table per restaurant on the path) gives the ``+1`` — the
  same ``+1`` the paper's root rule ``Beta(1, γ0)`` already has. Pass
  ``paper_split=True`` for the paper's rule.
* Steps 1–3 and eq. 5 are exact conditionals (checked by the Geweke test in
  ``tests/exact/test_bhmc_exact.py``). Eqs. 3–4, as in the paper, are not the exact
  conditionals of ``β`` once two points share a non-root node (they use point counts
  where the HDP needs table counts); the default ``beta_rule="exact"`` replaces them by
  :func:`update_beta_exact` (table counts for the leaves' parents, Metropolis-Hastings
  above), and the Geweke test runs with every update on. ``beta_rule="paper"`` keeps
  eqs. 3–4.
* Empty components are removed (folded into the rest mass), which is what
  eq. 3 does anyway (a ``Dir`` parameter ``N_k = 0`` gives ``β_0k = 0``).

Arrays: ``node_capacity`` node slots (node ``0`` the root) and
``component_capacity`` component slots. Running out of either sets
``overflow`` (the move that needed the slot is not made) and
:func:`fit_bhmc` raises :class:`~jaxbnp.errors.CapacityError`
naming the option to raise: nothing is dropped silently.

Kernel contract (BlackJAX's): ``init(key, X, hyper, model, config) -> BHMCState`` and
``step(key, state, X, model, config) -> (BHMCState, BHMCInfo)`` are pure and
jittable, the per-sweep move counts in :class:`BHMCInfo`. :class:`BHMCKernel`
is the NumPyro ``MCMCKernel`` over them (its whole state in
:class:`BHMCKernelState`); :func:`fit_bhmc` is the one-call entry, sampling
through :func:`jaxbnp.inference.runner.run`.

Example
-------
>>> import jax, numpy as np
>>> from jaxbnp.inference.bhmc.sampler import fit_bhmc
>>> X = np.r_[np.random.default_rng(0).normal(-3, 0.3, (10, 2)), np.random.default_rng(1).normal(3, 0.3, (10, 2))]
>>> fit = fit_bhmc(jax.random.key(0), X, depth=2, num_samples=20, num_warmup=20, num_chains=2)
>>> fit.labels_per_level.shape, fit.log_lik.shape
((2, 20), (2, 20))
"""

from __future__ import annotations

import math
import time
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.scipy.special import logsumexp
from numpyro.infer.mcmc import MCMCKernel
from numpyro.util import is_prng_key

from ..._cache import auto_enable
from ..._math import cho_solve, cholesky, solve_triangular
from ..._programs import call_cached
from ..._random import log_beta_pair, log_dirichlet, typed_key
from ..._validation import check_data, check_int
from ...errors import CapacityError
from ...models.nested import (
    NestedHDP,
    check_covariance,
    path_log_prior_table,
    sample_ncrp,
    tree_from_paths,
)
from ..runner import run

__all__ = [
    "FAST_COMPILE",
    "BHMCConfig",
    "BHMCFit",
    "BHMCHyper",
    "BHMCInfo",
    "BHMCKernel",
    "BHMCKernelState",
    "BHMCModel",
    "BHMCState",
    "HyperInfo",
    "PointInfo",
    "antoniak",
    "complete_log_likelihood",
    "fit_bhmc",
    "init",
    "init_from",
    "labels_at_level",
    "leaf_table_log_weights",
    "log_acceptance",
    "make_model",
    "path_gibbs",
    "point_update",
    "regraft",
    "regraft_leaves",
    "regraft_log_prior",
    "regraft_log_weights",
    "regraft_node",
    "split_merge",
    "split_merge_log_ratio",
    "state_from_simulation",
    "step",
    "update_beta",
    "update_beta_exact",
    "update_hyperparameters",
    "update_theta",
    "ward_start",
]

_LOG_2PI = math.log(2.0 * math.pi)
FAST_COMPILE = {"xla_backend_optimization_level": 0, "xla_cpu_use_fusion_emitters": False}


class BHMCConfig(NamedTuple):
    """Static settings (hashable; bound by closure or passed as a static argument).

    depth: ``L``. node_capacity, component_capacity: slots. update_beta: run
    eqs. 3–4 after each sweep. update_hyper: MH on ``α, γ0, γ``.
    paper_split: the paper's new-component split (no ``+1``, module docstring).
    hyper_step: random-walk scale on the log of each hyperparameter.
    path_update: ``"gibbs"`` (default: every existing path and a new branch at
    every node scored at once, :func:`path_gibbs`) or ``"mh"`` (the paper's
    Algorithm 2: one nCRP proposal, accepted by its likelihood ratio).
    beta_rule: ``"exact"`` (default: :func:`update_beta_exact`) or ``"paper"`` (eqs. 3–4
    with point counts, :func:`update_beta`; not the exact conditionals).
    beta_mh_steps, beta_mh_scale: the random-walk MH steps of ``"exact"`` on the nodes
    above the leaves' parents, and their scale in additive log-ratio coordinates.
    regraft: after the points, a Gibbs draw of the place of every subtree below the first
    level (:func:`regraft`: whole leaves and subtrees move to another parent or a new branch;
    with ``beta_rule="exact"`` the leaves move inside the ``β`` update, :func:`regraft_leaves`).
    split_merge: Metropolis-Hastings split-or-merge moves of the components per sweep, after
    the points (:func:`split_merge`; ``0``: none).
    """

    depth: int
    node_capacity: int
    component_capacity: int
    update_beta: bool = True
    update_hyper: bool = False
    paper_split: bool = False
    hyper_step: float = 0.3
    path_update: str = "gibbs"
    beta_rule: str = "exact"
    beta_mh_steps: int = 20
    beta_mh_scale: float = 0.3
    regraft: bool = True
    split_merge: int = 1


class BHMCModel(NamedTuple):
    """Model constants as arrays: ``H = N(mu0, Sigma0)``, ``f = N(θ, Sigma)`` and their factors."""

    mu0: jax.Array
    chol_sigma: jax.Array        # chol(Σ)
    prec_sigma: jax.Array        # Σ⁻¹
    prec0: jax.Array             # Σ0⁻¹
    prec0_mu0: jax.Array         # Σ0⁻¹ μ0
    chol_marginal: jax.Array     # chol(Σ0 + Σ): f*
    chol_single: jax.Array       # chol((Σ0⁻¹ + Σ⁻¹)⁻¹): θ | one point


class BHMCState(NamedTuple):
    """One chain of BHMC (module docstring).

    paths: ``(N, L)`` int32 node ids (root ``0`` implicit). parent, depth,
    count: ``(M,)`` int32 node table (``count = N_z``, ``count > 0`` = in the
    tree). log_beta: ``(M, K + 1)`` log weights (last column the rest).
    node_comp: ``(M, K)`` int32 ``N_zk``. c: ``(N,)`` component slots.
    comp_active: ``(K,)``. theta: ``(K, D)``. alpha, gamma0, gamma: the
    hyperparameters. overflow: a slot was needed while all were used (sticky).
    log_lik: the complete-data log likelihood ``log p(X, c, V | B, θ)`` of
    this state (:func:`complete_log_likelihood`).
    """

    paths: jax.Array
    parent: jax.Array
    depth: jax.Array
    count: jax.Array
    log_beta: jax.Array
    node_comp: jax.Array
    c: jax.Array
    comp_active: jax.Array
    theta: jax.Array
    alpha: jax.Array
    gamma0: jax.Array
    gamma: jax.Array
    overflow: jax.Array
    log_lik: jax.Array


class BHMCHyper(NamedTuple):
    """The starting hyperparameters ``α, γ0, γ`` as arrays (what :func:`init` reads of a
    :class:`~jaxbnp.models.nested.NestedHDP`; a pytree, so it can be a traced argument)."""

    alpha: jax.Array
    gamma0: jax.Array
    gamma: jax.Array


class PointInfo(NamedTuple):
    """What :func:`point_update` did. accepted: ``()`` bool, the point's path changed (with
    ``path_update="mh"``: a proposal was accepted and differs from the current path)."""

    accepted: jax.Array


class HyperInfo(NamedTuple):
    """What :func:`update_hyperparameters` did. accepted: ``(3,)`` bool, the MH moves of
    ``α, γ0, γ`` were accepted."""

    accepted: jax.Array


class BHMCInfo(NamedTuple):
    """What one :func:`step` did (docs/mathematics.md §6).

    num_accepted: ``()`` int32 points whose path changed (a proposal equal to
    the current path does not count). num_proposed: ``()`` int32 path updates
    made (one per point, ``N``). hyper_accepted: ``(3,)``
    bool, the MH moves of ``α, γ0, γ`` accepted (all ``False`` when
    ``update_hyper`` is off). num_regrafted: ``()`` int32 subtrees that :func:`regraft`
    moved to another place. num_split_merge: ``()`` int32 component splits and merges
    accepted (:func:`split_merge`).
    """

    num_accepted: jax.Array
    num_proposed: jax.Array
    hyper_accepted: jax.Array
    num_regrafted: jax.Array
    num_split_merge: jax.Array


# ------------------------------------------------------------------------------ model constants
def make_model(hyper: NestedHDP, dtype=None) -> BHMCModel:
    """Factor the covariances of ``hyper`` on the host (NumPy, float64) into a :class:`BHMCModel`."""
    dtype = jnp.result_type(float) if dtype is None else dtype
    S, S0, mu0 = hyper.Sigma, hyper.Sigma0, hyper.mu0
    prec, prec0 = np.linalg.inv(S), np.linalg.inv(S0)
    single = np.linalg.inv(prec0 + prec)
    arrs = (mu0, np.linalg.cholesky(S), prec, prec0, prec0 @ mu0, np.linalg.cholesky(S0 + S),
            np.linalg.cholesky((single + single.T) / 2))
    return BHMCModel(*(jnp.asarray(a, dtype) for a in arrs))


def _mvn_logpdf(x, mean, chol):
    z = solve_triangular(chol, (x - mean).T, lower=True)
    return (-0.5 * jnp.sum(z * z, axis=0) - jnp.sum(jnp.log(jnp.diag(chol)))
            - 0.5 * chol.shape[0] * _LOG_2PI)


def _log_dirichlet(key, log_conc):
    """``log`` of ``Dir(exp(log_conc))`` along the last axis; ``−inf`` entries stay zero weight."""
    return log_dirichlet(key, jnp.exp(log_conc))


def _full_path(row):
    return jnp.concatenate([jnp.zeros(1, row.dtype), row])


def _ncrp_log_prob(full, count_minus, alpha):
    """``log nCRP(v; V∖{v_n})`` of a full path ``(L+1,)`` given counts without point ``n``."""
    cm = count_minus[full]
    here = cm[1:]
    log_num = jnp.where(here > 0, jnp.log(jnp.maximum(here, 1).astype(alpha.dtype)), jnp.log(alpha))
    return jnp.sum(log_num - jnp.log(cm[:-1] + alpha))


def log_acceptance(lik_new, lik_old, prior_new, prior_old, q_fwd, q_back):
    """Paper §4.1: ``log A = [log p(x|v') + log p(V')] − [log p(x|v) + log p(V)] + log q(v|·) − log q(v'|·)``."""
    return (lik_new + prior_new) - (lik_old + prior_old) + (q_back - q_fwd)


# ------------------------------------------------------------------------------ point update
def _ancestors(node, p, L: int):
    """``(L + 1,)``: ``node`` and the nodes 1, ..., L levels above it (``p`` the parents with
    the root its own parent, so the root repeats once reached)."""
    up = [node]
    for _ in range(L):
        up.append(p[up[-1]])
    return jnp.stack(up)


def _reach(step_lp, p, L: int):
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
    reach = _reach(step_lp, p, L)
    lik = jnp.logaddexp(logsumexp(log_beta[:, :K] + logf, axis=1), log_beta[:, K] + logf_star)
    is_leaf = depth == L
    branch = jnp.where(is_leaf, 0.0, jnp.log(alpha) - jnp.log(count_minus.astype(ftype) + alpha))
    score = jnp.where(live, reach + branch + lik, -jnp.inf)
    choice = jnp.argmax(score + jax.random.gumbel(k_path, (M,), ftype))
    d_choice = jnp.where(choice == 0, 0, depth[choice])
    # ancestors of the choice: anc[l] = its ancestor at depth l (l <= d_choice)
    up = _ancestors(choice, p, L)  # up[i]: i levels above the choice
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
        drawn = _log_dirichlet(k, jnp.where(one_j, jnp.logaddexp(log_conc, 0.0), log_conc))
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
    old = _full_path(state.paths[n])
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

    logf = jnp.where(comp_active, _mvn_logpdf(x[None, :], state.theta, model.chol_sigma), -jnp.inf)
    logf_star = _mvn_logpdf(x[None, :], model.mu0, model.chol_marginal)[0]

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
            drawn = _log_dirichlet(k, jnp.log(gamma) + parent_lb)
            child_lb = jnp.where(is_new, drawn, lb[child])
            carry = (child, is_new, num_new + is_new.astype(jnp.int32), log_q + logits[choice] - norm, over, child_lb)
            return carry, (child, is_new, drawn)

        init_carry = (jnp.int32(0), jnp.bool_(False), jnp.int32(0), jnp.zeros((), ftype), jnp.bool_(False), lb[0])
        (_, _, _, q_fwd, node_overflow, leaf_lb), (children, new_flags, new_lbs) = lax.scan(
            level_step, init_carry, (gumbel_path, jax.random.split(k_beta, L)))
        prop = jnp.concatenate([jnp.zeros(1, jnp.int32), children])
        lik_new = lik(leaf_lb)
        q_back = _ncrp_log_prob(old, count_minus, alpha)
        # p(V') / p(V) = nCRP(v'|V∖v_n) / nCRP(v|V∖v_n) (exchangeability; docs/mathematics.md §6 prior)
        prior_new, prior_old = _ncrp_log_prob(prop, count_minus, alpha), q_back
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


# ------------------------------------------------------------------------------ subtree moves
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
    anc = _ancestors(z, p, L)[jnp.clip(ell - levels, 0, L)]  # anc[d]: the ancestor at depth d < ell
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
    reach = _reach(step_lp, p, L)

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
        drawn = _log_dirichlet(k, jnp.log(gamma) + prev)
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
    up = _ancestors(choice, jnp.maximum(state.parent, 0), L)
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
    leaf_lb = _log_dirichlet(k_leaf, conc)
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
    order = jax.random.permutation(k_order, M)
    at = (state.count > 0) & (state.depth == L)
    order = order[jnp.argsort(~at[order], stable=True)]
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
        order = jax.random.permutation(k_level, M)
        at = (state.count > 0) & (state.depth == level)
        order = order[jnp.argsort(~at[order], stable=True)]  # the level's nodes first, shuffled
        keys = jax.random.split(jax.random.fold_in(k_level, 1), M)

        def body(i, carry, level=level, order=order, keys=keys):
            state, total = carry
            state, moved = lax.cond(state.overflow, lambda s: (s, jnp.bool_(False)),
                                    lambda s: regraft_node(keys[i], s, order[i], config, level), state)
            return state, total + moved.astype(jnp.int32)

        state, total = lax.fori_loop(0, jnp.sum(at), body, (state, total))
    return state, total


# ------------------------------------------------------------------------------ component split-merge
def _predictive_logpdf(x, n, total, model: BHMCModel):
    """``log p(x | the n points with sum total)`` of one component, its mean integrated out:
    ``N(x; m_n, Σ + Λ_n⁻¹)`` with ``Λ_n = Σ0⁻¹ + n Σ⁻¹``, ``m_n = Λ_n⁻¹(Σ0⁻¹μ0 + Σ⁻¹ total)``."""
    prec = model.prec0 + n * model.prec_sigma
    chol_prec = cholesky(prec)
    mean = cho_solve(chol_prec, model.prec0_mu0 + model.prec_sigma @ total)
    eye = jnp.eye(x.shape[0], dtype=x.dtype)
    cov = model.chol_sigma @ model.chol_sigma.T + cho_solve(chol_prec, eye)
    return _mvn_logpdf(x[None, :], mean, cholesky(cov))[0]


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
    order = jnp.argsort(sort_key)  # i, j, then the other points of k: only those are visited

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
    rank = jax.random.permutation(k_order, n_pts).astype(ftype)
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
    log_beta = _draw_leaves(k_leaf, state.log_beta, state.node_comp, state.comp_active, state.gamma,
                            live & (state.depth == L), p)
    return update_theta(k_theta, state._replace(log_beta=log_beta), X, model, config), go


# ------------------------------------------------------------------------------ global updates
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
        drawn = _log_dirichlet(jax.random.fold_in(key, level), conc)
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
    return _update_beta_exact(key, state, config, move_leaves=False)[0]


def _update_beta_exact(key, state: BHMCState, config: BHMCConfig, move_leaves: bool
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
    lb = jnp.where(mid[:, None], _log_dirichlet(k_mid, conc_mid), lb)
    lb = _draw_leaves(k_leaf, lb, n_leaf, state.comp_active, gamma, leaf, p)
    lb = jnp.where(live[:, None], lb, -jnp.inf)
    return state._replace(log_beta=lb), num_moved


def _draw_leaves(key, log_beta, node_comp, comp_active, gamma, leaf, p):
    """Every ``leaf`` row of ``log_beta`` drawn from its conditional ``Dir(γβ_parent + N_ℓ,
    γβ*_parent)`` (``N_ℓ`` the leaf's row of ``node_comp``, ``p`` the parents); the other rows
    as they are."""
    ftype = log_beta.dtype
    cols = jnp.concatenate([comp_active, jnp.ones(1, bool)])
    counts = jnp.concatenate([node_comp, jnp.zeros((node_comp.shape[0], 1), node_comp.dtype)], axis=1).astype(ftype)
    log_n = jnp.where(counts > 0, jnp.log(jnp.maximum(counts, 1.0)), -jnp.inf)
    conc = jnp.where(cols, jnp.logaddexp(jnp.log(gamma) + log_beta[p], log_n), -jnp.inf)
    return jnp.where(leaf[:, None], _log_dirichlet(key, conc), log_beta)


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
    log_f = _mvn_logpdf(X, state.theta[state.c], model.chol_sigma)
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


def step(key, state: BHMCState, X, model: BHMCModel, config: BHMCConfig) -> tuple[BHMCState, BHMCInfo]:
    """One sweep of Algorithm 2 (module docstring, docs/mathematics.md §6): every point in a
    random order (:func:`point_update`), ``split_merge`` component split-or-merge moves
    (:func:`split_merge`), with ``regraft`` every subtree below the first level
    (:func:`regraft`), then ``B`` (:func:`update_beta_exact` or :func:`update_beta`), ``θ``
    (:func:`update_theta`) and, with ``update_hyper``, the hyperparameters.

    Pure and jittable; returns the new state and a :class:`BHMCInfo`.
    """
    n = X.shape[0]
    k_perm, k_points, k_beta, k_theta, k_hyper = jax.random.split(key, 5)
    k_regraft = jax.random.fold_in(key, 5)
    k_sm = jax.random.fold_in(key, 6)
    order = jax.random.permutation(k_perm, n)
    point_keys = jax.random.split(k_points, n)

    def body(i, carry):  # after an overflow the state stays as it was (the run is discarded)
        s, num_accepted = carry
        s, info = lax.cond(s.overflow, lambda s: (s, PointInfo(jnp.bool_(False))),
                           lambda s: point_update(point_keys[i], s, order[i], X, model, config), s)
        return s, num_accepted + info.accepted.astype(jnp.int32)

    state, num_accepted = lax.fori_loop(0, n, body, (state, jnp.zeros((), jnp.int32)))
    num_split_merge = jnp.zeros((), jnp.int32)
    if config.split_merge > 0 and n >= 2:
        def sm(t, carry):
            s, total = carry
            s, moved = lax.cond(s.overflow, lambda s: (s, jnp.bool_(False)),
                                lambda s: split_merge(jax.random.fold_in(k_sm, t), s, X, model, config,
                                                      redraw=not config.update_beta), s)
            return s, total + moved.astype(jnp.int32)

        state, num_split_merge = lax.fori_loop(0, config.split_merge, sm, (state, num_split_merge))
    num_regrafted = jnp.zeros((), jnp.int32)
    leaves_in_beta = config.update_beta and config.beta_rule == "exact"  # moved there, collapsed
    if config.regraft and config.depth >= 2:
        state, num_regrafted = regraft(k_regraft, state, config,
                                       config.depth - 1 if leaves_in_beta else config.depth)
    if leaves_in_beta:
        state, num_leaves_moved = _update_beta_exact(k_beta, state, config, move_leaves=config.regraft)
        num_regrafted = num_regrafted + num_leaves_moved
    elif config.update_beta:
        state = update_beta(k_beta, state, config)
    state = update_theta(k_theta, state, X, model, config)
    hyper_accepted = jnp.zeros(3, bool)
    if config.update_hyper:
        state, hyper_info = update_hyperparameters(k_hyper, state, config)
        hyper_accepted = hyper_info.accepted
    state = state._replace(log_lik=complete_log_likelihood(state, X, model, config))
    return state, BHMCInfo(num_accepted, jnp.asarray(n, jnp.int32), hyper_accepted, num_regrafted,
                           num_split_merge)


# ------------------------------------------------------------------------------ initial states
def _crp_labels(key, n, gamma0, capacity):
    """Component slots of ``n`` points seated one by one in a CRP(``γ0``); ``overflow`` past ``capacity``."""
    g = jax.random.gumbel(key, (n, capacity + 1))

    def seat(carry, gi):
        counts, used = carry
        logits = jnp.concatenate([jnp.where(counts > 0, jnp.log(jnp.maximum(counts, 1.0)), -jnp.inf),
                                  jnp.log(gamma0)[None]])
        ch = jnp.argmax(logits + gi)
        new = ch == capacity
        k = jnp.where(new, jnp.minimum(used, capacity - 1), ch)
        over = new & (used >= capacity)
        return (counts.at[k].add(1.0), used + new.astype(jnp.int32)), (k, over)

    (_, _), (labels, over) = lax.scan(seat, (jnp.zeros(capacity, gamma0.dtype), jnp.int32(0)), g)
    return labels.astype(jnp.int32), jnp.any(over)


def _assemble(paths, c, theta, log_beta, alpha, gamma0, gamma, X, model, config, overflow=False):
    M, K = config.node_capacity, config.component_capacity
    parent, depth, count = tree_from_paths(paths, M)
    full = jnp.concatenate([jnp.zeros((paths.shape[0], 1), jnp.int32), paths], axis=1)
    node_comp = jnp.zeros((M, K), jnp.int32).at[full, c[:, None]].add(1)
    comp_active = node_comp[0] > 0
    ftype = jnp.result_type(float)
    state = BHMCState(
        paths=paths, parent=parent, depth=depth, count=count, log_beta=log_beta, node_comp=node_comp,
        c=c, comp_active=comp_active, theta=theta, alpha=jnp.asarray(alpha, ftype),
        gamma0=jnp.asarray(gamma0, ftype), gamma=jnp.asarray(gamma, ftype),
        overflow=jnp.asarray(overflow), log_lik=jnp.zeros((), ftype))
    return state


def init(key, X, hyper: NestedHDP, model: BHMCModel, config: BHMCConfig) -> BHMCState:
    """A starting state: paths from the nCRP prior, components from a CRP(``γ0``), then eqs. 3–5.

    docs/mathematics.md §6. ``hyper``: anything with ``alpha``, ``gamma0``, ``gamma``
    (a :class:`~jaxbnp.models.nested.NestedHDP` or a :class:`BHMCHyper`).
    The nCRP ids are in creation order (``< N L + 1``); a tree with more nodes
    than ``node_capacity`` or more than ``component_capacity`` components
    sets ``overflow``.
    """
    n = X.shape[0]
    ftype = jnp.result_type(float)
    k_paths, k_c, k_beta, k_theta = jax.random.split(key, 4)
    big = n * config.depth + 1
    paths = sample_ncrp(k_paths, jnp.asarray(hyper.alpha, ftype), n, config.depth, big)
    node_over = jnp.max(paths) >= config.node_capacity
    paths = jnp.minimum(paths, config.node_capacity - 1)
    c, comp_over = _crp_labels(k_c, n, jnp.asarray(hyper.gamma0, ftype), config.component_capacity)
    K = config.component_capacity
    log_beta = jnp.full((config.node_capacity, K + 1), -jnp.inf, ftype)
    theta = jnp.zeros((K, X.shape[1]), ftype)
    state = _assemble(paths, c, theta, log_beta, hyper.alpha, hyper.gamma0, hyper.gamma, X, model, config,
                      node_over | comp_over)
    state = update_beta(k_beta, state, config)
    state = update_theta(k_theta, state, X, model, config)
    return state._replace(log_lik=complete_log_likelihood(state, X, model, config))


def state_from_simulation(sim: dict, hyper: NestedHDP, X, model: BHMCModel, config: BHMCConfig) -> BHMCState:
    """A :class:`BHMCState` from one draw of :func:`jaxbnp.models.nested.nested_hdp_model` (jittable).

    Keeps the occupied components (compacted into the first slots) and folds
    the weights of the others into the rest mass: the representation the
    sampler uses. ``sim`` needs ``paths``, ``c``, ``theta``, ``log_beta``
    (node ids and shapes as produced by the program with the same capacities
    ``node_capacity`` and ``component_capacity``). A draw in the program's
    rest column (``c = K``) sets ``overflow``.
    """
    K = config.component_capacity
    paths = jnp.asarray(sim["paths"], jnp.int32)
    c_raw = jnp.asarray(sim["c"], jnp.int32)
    lb_raw = jnp.asarray(sim["log_beta"])
    theta_raw = jnp.asarray(sim["theta"])
    occupied = jnp.zeros(lb_raw.shape[1], bool).at[c_raw].set(True).at[K].set(False)
    rank = jnp.cumsum(occupied) - 1  # new slot of each occupied raw component
    c = rank[c_raw].astype(jnp.int32)
    slot_of = jnp.where(occupied, rank, K)  # unoccupied -> the rest column
    lb = jnp.full((lb_raw.shape[0], K + 1), -jnp.inf, lb_raw.dtype)
    lb = lb.at[:, K].set(logsumexp(jnp.where(occupied[None, :], -jnp.inf, lb_raw), axis=1))
    idx = jnp.where(occupied, slot_of, K + 1)  # K+1: dropped by mode="drop"
    lb = lb.at[:, idx].set(lb_raw, mode="drop")
    theta = jnp.zeros((K, theta_raw.shape[1]), theta_raw.dtype).at[idx].set(theta_raw, mode="drop")
    over = jnp.any(c_raw == K)
    state = _assemble(paths, c, theta, lb, hyper.alpha, hyper.gamma0, hyper.gamma, X, model, config, over)
    live = state.count > 0
    state = state._replace(log_beta=jnp.where(live[:, None], lb, -jnp.inf))
    return state._replace(log_lik=complete_log_likelihood(state, X, model, config))


WARD_SAMPLE = 2000  # points (at most) Ward's linkage is built on; the others join the nearest centre


def ward_start(X: Any, depth: int, num_components: int | None = None, seed: int = 0):
    """A data-driven start for BHMC: ``(paths, c)`` from Ward's tree (SciPy, on standardised
    coordinates) cut into ``k_l = round(k^(l/L))`` clusters at level ``l`` (nested cuts), node
    ids numbered level by level from 1, and ``c`` the clusters of the deepest cut (one
    component per leaf). ``k = num_components`` (default ``round(sqrt(n / 2))``, at least 2,
    at most ``n``). With more than ``WARD_SAMPLE`` points the tree is built on that many
    points drawn with ``seed`` and every other point joins the leaf with the nearest centre.
    Only the burn-in depends on it: the chain's target is unchanged. Host side (NumPy)."""
    from scipy.cluster.hierarchy import fcluster, linkage

    X = np.asarray(X, float)
    n = X.shape[0]
    k = max(2, int(round(math.sqrt(n / 2)))) if num_components is None else int(num_components)
    k = max(1, min(k, n))
    scale = X.std(0)
    Z = (X - X.mean(0)) / np.where(scale > 0, scale, 1.0)
    rows = np.arange(n)
    if n > WARD_SAMPLE:
        rows = np.sort(np.random.default_rng(seed).choice(n, WARD_SAMPLE, replace=False))
    tree = linkage(Z[rows], method="ward") if len(rows) > 1 else None
    cuts = []
    for level in range(1, depth + 1):
        k_l = max(1, min(len(rows), int(round(k ** (level / depth)))))
        cut = (fcluster(tree, k_l, criterion="maxclust") - 1 if tree is not None
               else np.zeros(len(rows), int))
        cuts.append(cut)
    # every point to the deepest-level cluster with the nearest centre (the fitted points too)
    deep = cuts[-1]
    centres = np.stack([Z[rows][deep == j].mean(0) for j in np.unique(deep)])
    leaf_of = np.unique(deep)[np.argmin(((Z[:, None, :] - centres[None]) ** 2).sum(-1), axis=1)]
    # each deepest cluster's ancestors (the cuts are nested)
    first = {j: np.flatnonzero(deep == j)[0] for j in np.unique(deep)}
    paths = np.zeros((n, depth), np.int32)
    offset = 1
    for level, cut in enumerate(cuts):
        label_of_leaf = {j: cut[first[j]] for j in first}
        labels = np.array([label_of_leaf[j] for j in leaf_of])
        uniq, compact = np.unique(labels, return_inverse=True)
        paths[:, level] = offset + compact.reshape(-1)
        offset += len(uniq)
    c = np.unique(leaf_of, return_inverse=True)[1].reshape(-1).astype(np.int32)
    return paths, c


def init_from(key, X, paths, c, hyper, model: BHMCModel, config: BHMCConfig) -> BHMCState:
    """A starting state from given paths ``(N, L)`` (node ids ``1 .. node_capacity − 1``,
    a tree) and component slots ``c`` (``< component_capacity``): ``β`` by eqs. 3–4 and
    ``θ`` by eq. 5 (e.g. :func:`ward_start`'s; only the burn-in depends on it)."""
    k_beta, k_theta = jax.random.split(key)
    K = config.component_capacity
    ftype = jnp.result_type(float)
    log_beta = jnp.full((config.node_capacity, K + 1), -jnp.inf, ftype)
    theta = jnp.zeros((K, X.shape[1]), ftype)
    state = _assemble(jnp.asarray(paths, jnp.int32), jnp.asarray(c, jnp.int32), theta, log_beta,
                      hyper.alpha, hyper.gamma0, hyper.gamma, X, model, config)
    state = update_beta(k_beta, state, config)
    state = update_theta(k_theta, state, X, model, config)
    return state._replace(log_lik=complete_log_likelihood(state, X, model, config))


# ------------------------------------------------------------------------------ NumPyro kernel
class BHMCKernelState(NamedTuple):
    """State of :class:`BHMCKernel` (one chain, or chains on the leading axis).

    sample: the chain's :class:`BHMCState`. info: the :class:`BHMCInfo` of the
    last step (no moves after ``init``). best: the state with the highest
    ``log_lik`` among the post-warm-up iterations so far (``log_lik = −inf``
    before the first). rng_key: the chain's run key ``k_run``. chain: ``()``
    int32, the chain's index in its run. iteration: ``()`` int32, steps done.
    num_warmup: ``()`` int32. Step ``i`` uses the key
    ``fold_in(fold_in(rng_key, i), chain)``.
    """

    sample: BHMCState
    info: BHMCInfo
    best: BHMCState
    rng_key: jax.Array
    chain: jax.Array
    iteration: jax.Array
    num_warmup: jax.Array


class BHMCKernel(MCMCKernel):
    """NumPyro ``MCMCKernel`` over the pure :func:`init` and :func:`step` (docs/mathematics.md §6).

    :param config: the static settings, a :class:`BHMCConfig`.

    ``model_args = (X, model, hyper)``: the data ``(N, D)``, the model
    constants (:func:`make_model`) and the starting ``α, γ0, γ``
    (:class:`BHMCHyper`); ``model_kwargs`` are not used.

    Keys: chain ``chain`` of the run keyed ``key`` starts from
    ``init(fold_in(k_init, chain), ...)`` and takes step ``i`` with
    ``fold_in(fold_in(k_run, i), chain)``, where ``k_init, k_run = split(key)``.
    By default ``key`` is the ``rng_key`` passed to :meth:`init` and ``chain``
    is ``0``; ``init_params={"rng_key": key, "chain": c}`` (a leading chain axis
    on both when chains are batched) sets them, so that chains ``0..C−1`` with
    the same ``key`` are the chains of :func:`fit_bhmc`. ``init_params["start"] = (paths, c)``
    (a leading chain axis on both when chains are batched) starts the chains from those
    paths and components (:func:`init_from`; e.g.
    :func:`ward_start`) instead of a draw from the prior (:func:`init`). A batch of keys (what
    ``MCMC(..., chain_method="vectorized")`` and
    :func:`jaxbnp.inference.runner.run` pass) initialises the chains under
    ``jax.vmap`` and steps them one after another (``lax.map``: under ``vmap``
    every ``lax.cond`` of the sweep would run both branches).

    A chain whose state has overflowed (a slot was needed while all were used)
    stops moving, and :meth:`overflowed` says so of a state: the run must be
    discarded (:func:`fit_bhmc` raises :class:`~jaxbnp.errors.CapacityError`).
    Everything a step needs is in the state or the arguments.
    """

    sample_field = "sample"
    #: the chains are independent and keep no host-side state: :func:`jaxbnp.inference.runner.run`
    #: may cut them into groups run from threads (``chain_method="threads"``), the same draws
    chains_in_threads = True

    def __init__(self, config: BHMCConfig):
        if not isinstance(config, BHMCConfig):
            raise TypeError(f"BHMCKernel(config): config must be a BHMCConfig, got {type(config).__name__}.")
        self.config = config

    def init(self, rng_key, num_warmup, init_params, model_args, model_kwargs):
        X, model, hyper = model_args
        params = dict(init_params or {})
        rng_key = typed_key(rng_key)  # jax.random.PRNGKey or jax.random.key: the same draws
        auto_enable()  # JAX's persistent compilation cache (jaxbnp.enable_compilation_cache)
        batched = not is_prng_key(rng_key)
        run_key = typed_key(params.get("rng_key", rng_key))
        chain = params.get("chain", jnp.zeros(jnp.shape(rng_key)[:1] if batched else (), jnp.int32))
        start = params.get("start")
        config = self.config

        def init_one(key, chain, start, X, model, hyper):
            k_init, k_run = jax.random.split(key)
            k = jax.random.fold_in(k_init, chain)
            if start is None:
                state = init(k, X, hyper, model, config)
            else:
                state = init_from(k, X, start[0], start[1], hyper, model, config)
            best = state._replace(log_lik=jnp.asarray(-jnp.inf, state.log_lik.dtype))
            return BHMCKernelState(state, _no_moves(X.shape[0]), best, k_run, jnp.asarray(chain, jnp.int32),
                                   jnp.zeros((), jnp.int32), jnp.asarray(num_warmup, jnp.int32))

        def program(key, chain, start, args, kwargs):
            X, model, hyper = args
            if batched:
                return jax.vmap(init_one, in_axes=(0, 0, 0, None, None, None))(key, chain, start, X, model, hyper)
            return init_one(key, chain, start, X, model, hyper)

        # one compiled program, kept on the kernel: a second MCMC.run of the same shape
        # compiles nothing
        static = (config, batched, num_warmup)
        return call_cached(self, "init", static, program, run_key, chain, start,
                           model_args=model_args, model_kwargs=model_kwargs)

    def sample(self, state, model_args, model_kwargs):
        X, model, _ = model_args
        if jnp.ndim(state.iteration) == 0:
            return self._sample_one(state, X, model)
        return lax.map(lambda s: self._sample_one(s, X, model), state)

    def _sample_one(self, ks: BHMCKernelState, X, model) -> BHMCKernelState:
        key = jax.random.fold_in(jax.random.fold_in(ks.rng_key, ks.iteration), ks.chain)
        sample, info = lax.cond(
            ks.sample.overflow,
            lambda s: (s, _no_moves(X.shape[0])),
            lambda s: step(key, s, X, model, self.config),
            ks.sample)
        better = (ks.iteration >= ks.num_warmup) & (sample.log_lik > ks.best.log_lik)
        best = jax.tree.map(lambda a, b: jnp.where(better, a, b), sample, ks.best)
        return ks._replace(sample=sample, info=info, best=best, iteration=ks.iteration + 1)

    def overflowed(self, state: BHMCKernelState) -> bool:
        """Whether a chain of ``state`` ran out of node or component slots (host side)."""
        return bool(np.any(np.asarray(state.sample.overflow)))

    def get_diagnostics_str(self, state: BHMCKernelState) -> str:
        rate = np.asarray(state.info.num_accepted) / np.maximum(np.asarray(state.info.num_proposed), 1)
        return f"path acceptance {float(np.mean(rate)):.2f}"


class _GrowingNodes(BHMCKernel):
    """:func:`fit_bhmc`'s kernel: tells the runner it overflowed only when the node slots
    ran out (so that the runner doubles them); running out of component slots is raised by
    :func:`fit_bhmc` itself, since more node slots would not help."""

    def overflowed(self, state: BHMCKernelState) -> bool:
        s = state.sample  # a step stops where it overflowed: fewer than L free node slots then
        live = np.sum(np.asarray(s.count) > 0, axis=-1)
        nodes_full = live > self.config.node_capacity - 1 - self.config.depth
        return bool(np.any(np.asarray(s.overflow) & nodes_full))


def _no_moves(n: int) -> BHMCInfo:
    return BHMCInfo(jnp.zeros((), jnp.int32), jnp.asarray(n, jnp.int32), jnp.zeros(3, bool),
                    jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32))


# ------------------------------------------------------------------------------ labels and fit_bhmc
def labels_at_level(paths: Any, level: int) -> np.ndarray:
    """Compact labels ``0..k−1`` of the nodes at depth ``level`` (``1..L``) of paths ``(N, L)``."""
    paths = np.asarray(paths)
    if not 1 <= int(level) <= paths.shape[-1]:
        raise ValueError(f"level must be in 1..{paths.shape[-1]}, got {level}.")
    return np.unique(paths[:, int(level) - 1], return_inverse=True)[1].reshape(-1).astype(np.int32)


class BHMCFit(NamedTuple):
    """Result of :func:`fit_bhmc` (docs/mathematics.md §6; the best sample = the highest complete-data
    log likelihood).

    paths: ``(N, L)`` node ids of the best sample. tree: ``(node_capacity,)``
    parent array of the best sample (``−1`` at the root and unused slots; use
    ``count > 0`` of ``best`` to find the nodes). labels_per_level: ``(L, N)``
    compact labels per depth. components: ``(N,)`` compact component labels.
    log_lik: ``(num_chains, num_samples)`` trace. best: the best
    :class:`BHMCState`. samples: ``{"paths": (C, S, N, L), "c": (C, S, N),
    "num_leaves", "num_components", "accept_rate", "num_regrafted": (C, S), "timing": {...}}``
    (``accept_rate``: the fraction of points whose path changed in the sweep;
    ``num_regrafted``: the subtrees the sweep's :func:`regraft` moved).
    summary_labels_per_level: ``(L, N)`` the posterior summary of every level: the
    partition minimising the expected variation of information over all chains' draws of
    that level's nodes (:func:`jaxbnp.metrics.point_estimate`); ``None`` with
    ``store_samples=False``.
    """

    paths: np.ndarray
    tree: np.ndarray
    labels_per_level: np.ndarray
    components: np.ndarray
    log_lik: np.ndarray
    best: BHMCState
    samples: dict
    hyper: NestedHDP
    summary_labels_per_level: np.ndarray | None = None

    def level_labels(self, level: int) -> np.ndarray:
        """Compact labels of the best sample's nodes at depth ``level`` (``1..L``)."""
        return labels_at_level(self.paths, level)


def fit_bhmc(
    key: jax.Array,
    X: Any,
    *,
    depth: int = 2,
    alpha: float = 1.0,
    gamma0: float = 1.0,
    gamma: float = 1.0,
    Sigma: Any = None,
    Sigma0: Any = None,
    mu0: Any = None,
    num_samples: int = 200,
    num_warmup: int = 100,
    num_chains: int = 1,
    node_capacity: int | None = None,
    component_capacity: int | None = None,
    update_beta: bool = True,
    update_hyper: bool = False,
    paper_split: bool = False,
    path_update: str = "gibbs",
    beta_rule: str = "exact",
    regraft: bool = True,
    split_merge: int = 1,
    init: str | tuple = "ward",
    store_samples: bool = True,
    compiler_options: dict | str | None = "auto",
    heartbeat: Any = None,
    chain_method: str = "auto",
) -> BHMCFit:
    """Fit BHMC to ``X`` with ``num_chains`` chains of Algorithm 2 (docs/mathematics.md §6).

    ``init="ward"`` (default) starts every chain from Ward's tree cut to the depth
    (:func:`ward_start`, ``k = round(sqrt(N / 2))`` components, one per leaf); ``"prior"``
    from a draw of the prior (:func:`init`); a pair ``(paths, c)`` from those root-to-leaf
    paths ``(N, depth)`` (a node is its path prefix: ids need only tell siblings apart) and
    components ``(N,)`` (integers), e.g. a previous fit's ``best.paths`` and ``best.c``.
    ``path_update``: ``"gibbs"`` (default,
    :func:`path_gibbs`) or ``"mh"`` (the paper's). ``beta_rule``: ``"exact"`` (default,
    :func:`update_beta_exact`) or ``"paper"`` (eqs. 3–4, :func:`update_beta`, not exact).
    ``regraft=True`` (default) adds the subtree moves of :func:`regraft` to every sweep (whole
    leaves and subtrees change parent) and ``split_merge=1`` (default) one component
    split-or-merge move (:func:`split_merge`); ``regraft=False, split_merge=0`` is the paper's
    sampler, which moves points only.
    Only the burn-in depends on the start; with the defaults every update is exact.

    Defaults from the data: ``mu0`` the mean of ``X``, ``Sigma0`` the diagonal
    of its variances, ``Sigma = Sigma0 / 20``. ``node_capacity=None`` (default) starts with
    64 node slots (more with Ward's start: four times its nodes) and doubles them, running
    again from the start, whenever a chain runs out, up to ``N L + L + 1`` (which cannot run out: a step
    scores every slot, so a small capacity is faster); an integer fixes it.
    ``component_capacity`` defaults to ``min(N, 64)``; running out of a fixed capacity
    raises :class:`CapacityError` naming the option. Validation
    happens before anything is compiled. The chains are :class:`BHMCKernel`'s,
    run by :func:`jaxbnp.inference.runner.run`. Same key, same draws; chain
    ``c`` draws exactly what a one-chain run would with the same ``key``
    folded the same way (:class:`BHMCKernel`'s keys). ``compiler_options``
    go to ``jax.jit``; ``"auto"`` (default) uses :data:`FAST_COMPILE` (XLA
    backend optimisation off: compiles about 4x faster, runs about 5x slower)
    when ``N · (num_warmup + num_samples) · num_chains <= 20000`` point updates,
    where compile time dominates, and XLA's defaults otherwise. ``heartbeat``: a
    ``jaxbnp._progress.Heartbeat`` ticked by ``num_chains`` per sweep after
    each compiled block of sweeps (the CLI's progress lines); it changes no draw.
    ``chain_method``: how the chains run (:func:`jaxbnp.inference.runner.run`): ``"auto"``
    (default: one chain per device where there is a device per chain, else on a CPU with
    several cores the chains cut into one group per core, each run from its own thread),
    ``"vectorized"``, ``"parallel"`` or ``"threads"``; the same draws whichever.

    ``samples["timing"]``: ``first_sweep_s`` the seconds to the end of the first
    block of ``num_first_sweeps`` sweeps (one when there are at most
    ``jaxbnp.inference.runner.PROGRESS_BLOCKS`` sweeps), compilation and
    initialisation included; ``other_sweeps_s`` the seconds of the other
    ``num_other_sweeps`` sweeps (the sampler's speed); ``num_chains``.
    """
    Xn = check_data(X)
    n, dim = Xn.shape
    depth = check_int("depth", depth, 1)
    num_samples = check_int("num_samples", num_samples, 1)
    num_warmup = check_int("num_warmup", num_warmup, 0)
    num_chains = check_int("num_chains", num_chains, 1)
    var = np.var(Xn, axis=0)
    var = np.where(var > 0, var, 1.0)
    Sigma0 = np.diag(var) if Sigma0 is None else check_covariance(Sigma0, "Sigma0", dim)
    Sigma = Sigma0 / 20.0 if Sigma is None else check_covariance(Sigma, "Sigma", dim)
    mu0 = Xn.mean(axis=0) if mu0 is None else mu0
    hyper = NestedHDP(depth=depth, alpha=alpha, gamma0=gamma0, gamma=gamma, Sigma=Sigma, Sigma0=Sigma0, mu0=mu0)
    M_most = n * depth + depth + 1  # every point on its own path, and a move's new nodes
    if node_capacity is None:  # start small (a step scores every slot) and double when full
        M = min(M_most, 512 if init == "prior" else 64)  # a prior draw's ids reach N L
    else:
        M = M_most = check_int("node_capacity", node_capacity, depth + 2)
    K = min(n, 64) if component_capacity is None else check_int("component_capacity", component_capacity, 1)
    if path_update not in ("gibbs", "mh"):
        raise ValueError(f"path_update must be 'gibbs' or 'mh', got {path_update!r}.")
    if beta_rule not in ("exact", "paper"):
        raise ValueError(f"beta_rule must be 'exact' or 'paper', got {beta_rule!r}.")
    given = None
    if isinstance(init, str):
        if init not in ("ward", "prior"):
            raise ValueError(f"init must be 'ward', 'prior' or a (paths, c) pair, got {init!r}.")
    else:
        given = _given_start(init, n, depth)
        if len(np.unique(given[1])) > K:
            raise ValueError(f"init's c has {len(np.unique(given[1]))} components, more than "
                             f"component_capacity={K}; pass a larger component_capacity=.")
    split_merge = check_int("split_merge", split_merge, 0)
    config = BHMCConfig(depth, M, K, bool(update_beta), bool(update_hyper), bool(paper_split),
                        path_update=path_update, beta_rule=beta_rule, regraft=bool(regraft),
                        split_merge=split_merge)
    ftype = jnp.result_type(float)
    model_args = (jnp.asarray(Xn, ftype), make_model(hyper),
                  BHMCHyper(*(jnp.asarray(v, ftype) for v in (hyper.alpha, hyper.gamma0, hyper.gamma))))
    if compiler_options == "auto":
        small = n * (num_warmup + num_samples) * num_chains <= 20000
        compiler_options = FAST_COMPILE if small else None
    auto_enable()  # the persistent compilation cache (jaxbnp._cache)
    key = typed_key(key)  # jax.random.PRNGKey or jax.random.key: the same draws
    if num_chains > 1:  # BHMCKernel's keys: chains 0..C-1 of the run keyed `key`
        init_params = {"rng_key": jnp.broadcast_to(key, (num_chains,) + jnp.shape(key)),
                       "chain": jnp.arange(num_chains, dtype=jnp.int32)}
    else:
        init_params = {"rng_key": key, "chain": jnp.zeros((), jnp.int32)}
    if init != "prior":  # Ward's tree cut to the depth (fits the capacities), or the given start
        if given is None:
            k = min(K, max(2, int(round(math.sqrt(n / 2)))))
            while k > 1 and 1 + sum(round(k ** (lv / depth)) for lv in range(1, depth + 1)) > M_most:
                k -= 1
            paths0, c0 = ward_start(Xn, depth, k)
        else:
            paths0, c0 = given
        num_nodes = 1 + int(paths0.max())
        if num_nodes > M_most:
            raise ValueError(f"init's paths have {num_nodes} nodes, more than node_capacity={M_most}; "
                             "pass a larger node_capacity=.")
        while 4 * num_nodes > M < M_most:
            M = min(2 * M, M_most)  # room for the start's nodes and three times as many again
        start = (jnp.asarray(paths0), jnp.asarray(c0))
        if num_chains > 1:
            start = jax.tree.map(lambda a: jnp.broadcast_to(a, (num_chains,) + a.shape), start)
        init_params["start"] = start
    clock = _SweepClock(heartbeat, num_chains)
    t_start = time.perf_counter()
    try:
        result = run(
            lambda capacity: _GrowingNodes(config._replace(node_capacity=capacity)), key, model_args,
            num_warmup=num_warmup, num_samples=num_samples, num_chains=num_chains,
            collect=_collect_draws if store_samples else _collect_summary, init_params=init_params,
            capacity=M, max_capacity=M_most, progress_bar=False, heartbeat=clock,
            cache_key=("bhmc", config._replace(node_capacity=None)), compiler_options=compiler_options,
            chain_method=chain_method)
    except CapacityError:
        raise CapacityError(
            f"BHMC needs more slots than node_capacity={M_most} or component_capacity={K} (for its initial "
            "tree or partition, or for a move); pass a larger node_capacity= or component_capacity= "
            "to fit_bhmc.") from None
    if BHMCKernel.overflowed(None, result.last_state):  # out of component slots
        raise CapacityError(
            f"BHMC needs more than component_capacity={K} component slots; pass a larger "
            "component_capacity= to fit_bhmc.")
    samples = dict(result.samples)
    log_lik = samples.pop("log_lik")
    best = result.last_state.best
    if num_chains == 1:
        best = jax.tree.map(lambda a: a[None], best)
    best_chain = int(np.argmax(np.asarray(best.log_lik)))
    best = jax.tree.map(lambda a: a[best_chain], best)
    paths = np.asarray(best.paths)
    labels = np.stack([labels_at_level(paths, l) for l in range(1, depth + 1)])
    comps = np.unique(np.asarray(best.c), return_inverse=True)[1].reshape(-1).astype(np.int32)
    tree = np.where(np.asarray(best.count) > 0, np.asarray(best.parent), -1)
    first = clock.sweeps[0]
    samples["timing"] = {"first_sweep_s": clock.times[0] - t_start, "num_first_sweeps": first,
                         "other_sweeps_s": clock.times[-1] - clock.times[0],
                         "num_other_sweeps": num_warmup + num_samples - first, "num_chains": num_chains}
    summary = None
    if store_samples:
        from ...metrics import point_estimate

        draws = np.asarray(samples["paths"])
        summary = np.stack([point_estimate(draws[..., lv].reshape(-1, n)) for lv in range(depth)])
    return BHMCFit(paths, tree, labels, comps, log_lik, best, samples, hyper, summary)


def _given_start(init: Any, n: int, depth: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`fit_bhmc`'s ``init=(paths, c)``, checked and relabelled: a node is its path
    prefix (ids numbered level by level from 1), the components ``0 .. k − 1``."""
    try:
        paths, c = init
    except (TypeError, ValueError):
        raise ValueError("init must be 'ward', 'prior' or a (paths, c) pair of arrays.") from None
    paths, c = np.asarray(paths), np.asarray(c)
    if paths.shape != (n, depth) or c.shape != (n,):
        raise ValueError(f"init=(paths, c) needs paths of shape ({n}, {depth}) and c of shape ({n},), "
                         f"got {paths.shape} and {c.shape}.")
    for name, a in (("paths", paths), ("c", c)):
        whole = a.dtype.kind == "f" and np.all(np.isfinite(a)) and np.all(a == np.round(a))
        if a.dtype.kind not in "iu" and not whole:
            raise ValueError(f"init's {name} must hold integers.")
    out = np.zeros((n, depth), np.int32)
    offset = 1
    for level in range(depth):
        _, ids = np.unique(paths[:, : level + 1].astype(np.int64), axis=0, return_inverse=True)
        out[:, level] = offset + ids.reshape(-1)
        offset += int(ids.max()) + 1
    return out, np.unique(c, return_inverse=True)[1].reshape(-1).astype(np.int32)


def _collect_summary(ks: BHMCKernelState) -> dict:
    """What :func:`fit_bhmc` keeps of each post-warm-up state (module level: the runner caches by it)."""
    s, info = ks.sample, ks.info
    depth = s.paths.shape[-1]
    return {"log_lik": s.log_lik, "num_leaves": jnp.sum((s.count > 0) & (s.depth == depth), axis=-1),
            "num_components": jnp.sum(s.comp_active, axis=-1),
            "accept_rate": info.num_accepted / info.num_proposed, "num_regrafted": info.num_regrafted,
            "num_split_merge": info.num_split_merge}


def _collect_draws(ks: BHMCKernelState) -> dict:
    """:func:`_collect_summary` and the draws ``paths``, ``c``."""
    return {**_collect_summary(ks), "paths": ks.sample.paths, "c": ks.sample.c}


class _SweepClock:
    """The runner's heartbeat: the time after each compiled block, passed on to ``heartbeat``
    ticked by ``num_chains`` per sweep."""

    def __init__(self, heartbeat: Any, num_chains: int):
        self.heartbeat, self.num_chains = heartbeat, num_chains
        self.times: list = []
        self.sweeps: list = []

    def tick(self, n: int = 1) -> None:
        self.times.append(time.perf_counter())
        self.sweeps.append(int(n))
        if self.heartbeat is not None:
            self.heartbeat.tick(int(n) * self.num_chains)
