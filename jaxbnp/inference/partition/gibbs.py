"""Collapsed Gibbs sampling for conjugate BNP mixtures (Neal's algorithm 3), pure core.

A sweep visits every point once in index order: the point leaves its
cluster, then joins an existing cluster ``c`` with weight
``w_c · p(x_i | X_c)`` or a new one with weight ``w_new · p(x_i)``, where the
measure gives the weights ``w`` (docs/mathematics.md §1) and the family the predictive
(docs/mathematics.md §2). Everything is in log space and runs inside one ``fori_loop``.

Kernel pattern (BlackJAX style): ``init(...) -> GibbsState`` and
``step(key, state, X, measure, family) -> (GibbsState, GibbsInfo)``; many chains
are a ``jax.vmap`` over both. Composable moves over a partition (a sweep, ``u``,
split-merge, ...) are in :mod:`jaxbnp.inference.partition.moves`.

NGGP measures also carry ``u``, updated after each sweep by slice sampling
on ``log u`` (docs/mathematics.md §1). Optional conjugate hyperparameter updates:
``escobar_west_alpha`` (DP), ``nggp_alpha_update`` and ``nggp_sigma_update``.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ...models.measures import Measure, NGGP
from .clusters import ClusterState, PartitionState, init_clusters
from ..slice import slice_sample

__all__ = [
    "GibbsState",
    "GibbsInfo",
    "packer",
    "init",
    "gibbs_sweep",
    "assignment_sweep",
    "update_u",
    "step",
    "escobar_west_alpha",
    "nggp_alpha_update",
    "nggp_sigma_update",
]


#: State of one collapsed-Gibbs chain: clusters and the auxiliary ``u`` (1.0 if unused).
GibbsState = PartitionState


class GibbsInfo(NamedTuple):
    """What one :func:`step` did: ``num_clusters`` after it."""

    num_clusters: jax.Array


def init(family, X, labels, capacity: int, u: float = 1.0) -> GibbsState:
    """Initial state from data and labels (host side)."""
    X = jnp.asarray(X)
    return GibbsState(init_clusters(family, X, labels, capacity), jnp.asarray(u, X.dtype))


def packer(tree):
    """Pack a pytree with leading axis ``m`` into one ``(m, P)`` array, and its inverse.

    One scatter then updates a slot's whole statistics (or cached predictive
    parameters), which keeps the per-point loop body small.
    """
    leaves, treedef = jax.tree.flatten(tree)
    shapes = [leaf.shape[1:] for leaf in leaves]
    sizes = [int(np.prod(shape)) for shape in shapes]
    dtype = jnp.result_type(*leaves)

    def pack(t):
        ls = jax.tree.leaves(t)
        lead = ls[0].shape[:-len(shapes[0])] if shapes[0] else ls[0].shape
        return jnp.concatenate(
            [leaf.reshape(lead + (-1,)).astype(dtype) for leaf in ls], axis=-1
        )

    def unpack(a):
        out, start = [], 0
        for shape, size in zip(shapes, sizes):
            out.append(a[..., start:start + size].reshape(a.shape[:-1] + shape))
            start += size
        return jax.tree.unflatten(treedef, out)

    return pack, unpack


def gibbs_sweep(
    key: jax.Array,
    clusters: ClusterState,
    X: jax.Array,
    measure: Measure,
    family,
    u: jax.Array | None = None,
    order: jax.Array | None = None,
) -> ClusterState:
    """One systematic-scan collapsed Gibbs sweep over all points (or over ``order``).

    Shapes: ``X`` ``(n, D)``; ``clusters`` with ``capacity`` slots; ``order``
    optional point indices to visit, in that order (tgMCMC's local moves pass
    a random subset; chosen independently of the state, each update is exact). If a new
    cluster is drawn while every slot is taken the point stays put and
    ``overflow`` is set (the caller must raise; see ``raise_if_overflow``).
    """
    capacity = clusters.counts.shape[0]
    # rebuild the statistics from the labels once per sweep: no rounding drift
    # accumulates from add/remove updates over long runs (O(n), cheap next to the sweep)
    clusters = clusters._replace(stats=family.stats_from_labels(X, clusters.labels, capacity))
    # Gumbel-max: one draw of noise per sweep, argmax inside the loop
    steps = X.shape[0] if order is None else order.shape[0]
    gumbels = jax.random.gumbel(key, (steps, capacity + 1), dtype=X.dtype)
    return assignment_sweep(clusters, X, measure, family, u, noise=gumbels, order=order)


def assignment_sweep(
    clusters: ClusterState,
    X: jax.Array,
    measure: Measure,
    family,
    u: jax.Array | None = None,
    noise: jax.Array | None = None,
    order: jax.Array | None = None,
) -> ClusterState:
    """Visit the points listed in ``order`` (default ``0..n-1``; repeats allowed); each leaves its cluster and joins
    ``argmax_k(log w_k + log p(x_i | X_k) + noise[step, k])``.

    With Gumbel ``noise`` this is a collapsed Gibbs sweep; with ``noise=None`` it
    is MAP-DP's iterated conditional modes step (docs/mathematics.md §3: the argmax of
    the conditional is the argmin of ``d_ik``). ``noise`` has shape
    ``(len(order), capacity + 1)``; its last column belongs to "a new cluster when no
    slot is free", which sets ``overflow``.
    """
    n = X.shape[0]
    capacity = clusters.counts.shape[0]
    order = jnp.arange(n) if order is None else order
    params = family.predictive_params(clusters.stats)
    pack_stats, unpack_stats = packer(clusters.stats)
    pack_params, unpack_params = packer(params)
    prior_params = family.prior_predictive_params(X.shape[1], X.dtype)
    # log p(x_i) under the prior does not depend on the state: all points at once
    prior_log_pred = jax.vmap(lambda x: family.log_predictive_from_params(x, prior_params)[0])(X)
    slots = jnp.arange(capacity)
    # families with O(D²) rank-one updates of their cached predictive (NormalWishart)
    # avoid factorisations inside the loop; the others refresh two slots per point
    rank_one = hasattr(family, "params_add") and hasattr(family, "params_remove")
    prior_packed = pack_params(prior_params)[0]

    def body(step, carry):
        labels, counts, stats, params, overflow, pending = carry
        i = order[step]
        x = X[i]
        ps = pack_stats(family.point_stats(x[None]))[0]
        old = labels[i]
        # remove point i
        counts = counts.at[old].add(-1)
        stats = stats.at[old].add(-ps)
        params_with_i = params[old]
        if rank_one:
            # O(D²) downdate; an emptied slot goes back to the prior exactly
            down = pack_params(family.params_remove(unpack_params(params_with_i[None]), x))[0]
            params = params.at[old].set(jnp.where(counts[old] > 0, down, prior_packed))
        else:
            # refresh, in one batch, the slot point i-1 joined and the slot point i left
            touched = jnp.stack([pending, old])
            fresh = family.predictive_params(unpack_stats(stats[touched]))
            params = params.at[touched].set(pack_params(fresh))
        # weights (docs/mathematics.md §1) times predictive (docs/mathematics.md §2)
        log_existing, log_new = measure.gibbs_log_weights(counts, u)
        log_pred = family.log_predictive_from_params(x, unpack_params(params))
        new_logit = log_new + prior_log_pred[i]
        free = counts == 0
        free_slot = jnp.argmax(free)
        has_free = jnp.any(free)
        logits = jnp.where(free, -jnp.inf, log_existing + log_pred)
        logits = jnp.where((slots == free_slot) & has_free, new_logit, logits)
        logits = jnp.append(logits, jnp.where(has_free, -jnp.inf, new_logit))
        choice = jnp.argmax(logits if noise is None else logits + noise[step])
        overflow = overflow | (choice == capacity)
        new = jnp.where(choice == capacity, old, choice).astype(labels.dtype)
        # add point i
        counts = counts.at[new].add(1)
        stats = stats.at[new].add(ps)
        labels = labels.at[i].set(new)
        if rank_one:
            # back where it was: restore the cached parameters (no rounding drift)
            up = pack_params(family.params_add(unpack_params(params[new][None]), x))[0]
            params = params.at[new].set(jnp.where(new == old, params_with_i, up))
        return labels, counts, stats, params, overflow, new

    carry = (
        clusters.labels, clusters.counts, pack_stats(clusters.stats), pack_params(params),
        clusters.overflow, clusters.labels[order[0]],
    )
    labels, counts, stats, _, overflow, _ = lax.fori_loop(0, order.shape[0], body, carry)
    stats = unpack_stats(stats)
    return ClusterState(labels, counts, stats, overflow)


def update_u(key: jax.Array, u: jax.Array, counts: jax.Array, measure: NGGP) -> jax.Array:
    """Slice-sample ``log u`` from ``p(log u | Π)`` (docs/mathematics.md §1)."""
    log_u = slice_sample(key, lambda t: measure.log_u_conditional(t, counts), jnp.log(u))
    return jnp.exp(log_u)


def step(
    key: jax.Array, state: GibbsState, X: jax.Array, measure: Measure, family
) -> tuple[GibbsState, GibbsInfo]:
    """One Gibbs sweep, then (NGGP) one slice update of ``u``; returns ``(state, info)``."""
    k_sweep, k_u = jax.random.split(key)
    clusters = gibbs_sweep(k_sweep, state.clusters, X, measure, family, state.u)
    u = state.u
    if measure.has_auxiliary:
        u = update_u(k_u, u, clusters.counts, measure)
    return GibbsState(clusters, u), GibbsInfo(clusters.num_clusters)


# ----------------------------------------------------------------------------- hyperparameters
def escobar_west_alpha(
    key: jax.Array, alpha: jax.Array, num_clusters: jax.Array, num_points: int,
    shape: float, rate: float,
) -> jax.Array:
    """Escobar & West (1995) update of DP ``alpha`` under a ``Gamma(shape, rate)`` prior.

    ``η ~ Beta(α+1, n)``; with odds ``(a+K−1)/(n(b−log η))`` draw
    ``α ~ Gamma(a+K, b−log η)``, else ``α ~ Gamma(a+K−1, b−log η)``.
    """
    k_eta, k_mix, k_gamma = jax.random.split(key, 3)
    eta = jax.random.beta(k_eta, alpha + 1.0, jnp.asarray(num_points, alpha.dtype))
    eta = jnp.maximum(eta, jnp.finfo(alpha.dtype).tiny)
    post_rate = rate - jnp.log(eta)
    odds = (shape + num_clusters - 1.0) / (num_points * post_rate)
    use_k = jax.random.uniform(k_mix) < odds / (1.0 + odds)
    post_shape = shape + num_clusters - jnp.where(use_k, 0.0, 1.0)
    return jax.random.gamma(k_gamma, post_shape, dtype=alpha.dtype) / post_rate


def nggp_alpha_update(
    key: jax.Array, measure: NGGP, u: jax.Array, num_clusters: jax.Array,
    shape: float, rate: float,
) -> jax.Array:
    """Conjugate NGGP ``alpha | Π, u, σ ~ Gamma(a + K, b + (u+τ)^σ − τ^σ)`` (docs/mathematics.md §1)."""
    post_rate = rate + (u + measure.tau) ** measure.sigma - measure.tau**measure.sigma
    return jax.random.gamma(key, shape + num_clusters, dtype=u.dtype) / post_rate


def nggp_sigma_update(
    key: jax.Array, measure: NGGP, u: jax.Array, counts: jax.Array,
    beta_a: float, beta_b: float,
) -> jax.Array:
    """Slice update of NGGP ``sigma`` on the logit scale under a ``Beta(a, b)`` prior."""

    def log_density(t):
        sigma = jax.nn.sigmoid(t)
        m = measure.replace(sigma=sigma)
        log_prior = (beta_a - 1.0) * jnp.log(sigma) + (beta_b - 1.0) * jnp.log1p(-sigma)
        log_jac = jnp.log(sigma) + jnp.log1p(-sigma)
        return log_prior + log_jac + m.log_eppf(counts, u)

    t0 = jnp.log(measure.sigma) - jnp.log1p(-measure.sigma)
    return jax.nn.sigmoid(slice_sample(key, log_density, t0))
