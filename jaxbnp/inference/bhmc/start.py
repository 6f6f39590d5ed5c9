"""BHMC's initial states: a nested-CRP prior draw, a given tree, a simulation's truth or
Ward's linkage cut at every level (docs/mathematics.md §6)."""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.scipy.special import logsumexp

from ...models.nested import (
    NestedHDP,
    sample_ncrp,
    tree_from_paths,
)
from .beta import (
    complete_log_likelihood,
    update_beta,
    update_theta,
)
from .model import (
    BHMCConfig,
    BHMCModel,
    BHMCState,
)


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
