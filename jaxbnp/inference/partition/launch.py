"""A split-merge for any likelihood that draws the parameters of the clusters it makes from
launch states, after Jain and Neal (2007) (docs/mathematics.md §8, "Splits and merges with
parameter draws"): ``AuxiliaryGibbs(model, split_merge="launch")``'s move."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax import lax

from .slot_params import (choose_slots, flat_layout, flatten_slots, slot_counts, slot_log_density,
                          split_choice_log_ratio, unflatten_slots)

__all__ = ["launch_split_merge", "LAUNCH_PRECISION_RANGE", "LAUNCH_MAX_STEP"]


#: the launch's Gaussian precisions: its curvature's absolute eigenvalues clamped to this range
#: (docs/mathematics.md §8), so a flat or convex direction still gets a proper proposal; and
#: the longest Newton step of a launch, in the unconstrained coordinates
LAUNCH_PRECISION_RANGE, LAUNCH_MAX_STEP = (1e-2, 1e6), 3.0


def _precision(log_density, v):
    """``(lam, vec)`` per row of ``v`` (``(R, D)``): the absolute eigenvalues (clamped) and the
    eigenvectors of minus the Hessian of row ``r``'s ``log_density(v)[r]`` (rows separable)."""
    r = jnp.arange(v.shape[0])
    h = jax.hessian(lambda u: jnp.sum(log_density(u)))(v)[r, :, r, :]
    lam, vec = jnp.linalg.eigh(-(h + jnp.swapaxes(h, 1, 2)) / 2)
    lam = jnp.where(jnp.isfinite(lam), jnp.abs(lam), LAUNCH_PRECISION_RANGE[0])
    return jnp.clip(lam, *LAUNCH_PRECISION_RANGE).astype(v.dtype), jnp.where(jnp.isfinite(vec), vec, 0.0)


def _newton(log_density, v, num_steps: int):
    """``num_steps`` Newton steps of every row of ``v`` uphill (the curvature of
    :func:`_precision`, steps no longer than :data:`LAUNCH_MAX_STEP`, each halved up to five
    times until the row's density rises; a row that cannot rise stays)."""
    halvings = 0.5 ** jnp.arange(6, dtype=v.dtype)
    rows = jnp.arange(v.shape[0])

    def one(_, v):
        f0 = log_density(v)
        g = jax.grad(lambda u: jnp.sum(log_density(u)))(v)
        lam, vec = _precision(log_density, v)
        step = jnp.einsum("rij,rj->ri", vec, jnp.einsum("rji,rj->ri", vec, g) / lam)
        norm = jnp.linalg.norm(step, axis=1, keepdims=True)
        step = jnp.where(jnp.isfinite(step), step * jnp.minimum(1.0, LAUNCH_MAX_STEP / jnp.maximum(norm, 1e-30)), 0.0)
        cand = v[None] + halvings[:, None, None] * step[None]
        up = jax.vmap(log_density)(cand) > f0[None]  # NaN: not up
        return jnp.where(jnp.any(up, 0)[:, None], cand[jnp.argmax(up, 0), rows], v)

    return lax.fori_loop(0, num_steps, one, v)


def _gauss_log_density(v, mean, lam, vec):
    z = vec.T @ (v - mean)
    return 0.5 * jnp.sum(jnp.log(lam) - math.log(2 * math.pi) - lam * z * z)


def _gauss_draw(key, mean, lam, vec):
    return mean + vec @ (jax.random.normal(key, mean.shape, mean.dtype) / jnp.sqrt(lam))


def launch_split_merge(m, key, labels, params, measure, num_launch_steps: int = 4):
    """One Metropolis-Hastings split or merge that draws the clusters' parameters, after Jain
    and Neal (2007) (docs/mathematics.md §8, "Splits and merges with parameter draws"):
    ``(labels, params, accepted)``.

    Slots are chosen as in :func:`split_merge` (split: an occupied ``a``, an empty ``b``;
    merge: an ordered pair, ``b`` into ``a``); ``S`` is the points of ``a`` and ``b``. Two
    launch states are built from ``S`` alone (and fresh randomness), so the same way in both
    directions:

    - the merge launch: ``theta_a`` from a prior draw by ``2 num_launch_steps`` Newton steps
      on ``S``'s conditional (towards its mode);
    - the split launch: ``S`` cut in two along its points' scores at the merge launch (the
      gradients of ``log f(x_i | theta)``, projected on their leading principal direction;
      which half goes to ``a`` by a coin), both slots started at the merge launch; then
      ``num_launch_steps`` rounds of two Newton steps of both slots and each point to its
      likelier slot (with the halves' sizes as weights).

    From a launch, each point of ``S`` goes to ``b`` with probability ``n_b f_b / (n_a f_a +
    n_b f_b)`` (the launch's parameters and sizes; split), and each slot's unconstrained
    parameters come from a Gaussian at the launch's with its clamped curvature as precision.
    The ratio holds the target, both proposal densities (the split's allocation and
    parameters; the merge's parameters), the slot choices' and the prior of the empty slot's
    parameters (drawn afresh for the slot a merge empties)."""
    spec, capacity = m.spec, m.spec.capacity
    layout = flat_layout(spec, m.trace(labels, params))
    fixed = {k: v for k, v in params.items() if k not in spec.owned_params}
    k_type, k_a, k_b, k_prior, k_coin, k_alloc, k_qa, k_qb, k_qm, k_acc = jax.random.split(key, 10)
    counts = slot_counts(labels, capacity)
    occupied = counts > 0
    k = jnp.sum(occupied)
    split, a, b = choose_slots(k_type, k_a, k_b, occupied)
    in_s = (labels == a) | (labels == b)
    x = flatten_slots(layout, spec, params)
    tr = m.trace(labels, fixed, key=k_prior)
    x_prior = flatten_slots(layout, spec, {name: tr[name]["value"] for name in spec.owned_params})

    def slot_lik(v, r):  # log f(x_i | v) of every point, v one slot's unconstrained parameters
        owned = unflatten_slots(layout, spec, x.at[r].set(v))[0]
        return m.point_log_lik(m.trace(jnp.full_like(labels, r), {**fixed, **owned}))

    def on_rows(lab, rows):  # the launch's slots alone, ``(R, D) -> (R,)``
        full = slot_log_density(m, layout, fixed, lab)
        return lambda v: full(x.at[rows].set(v))[rows]

    # the merge launch: slot a alone, fitted to S
    lab_m = jnp.where(in_s, a, labels)
    xm = _newton(on_rows(lab_m, a[None]), x_prior[a][None], 2 * num_launch_steps)
    lap_m = _precision(on_rows(lab_m, a[None]), xm)
    # the split launch: S cut along its scores at the merge launch, then refitted
    scores = jnp.where(in_s[:, None], jax.jacfwd(lambda v: slot_lik(v, a))(xm[0]), 0.0)  # (n, D)
    centred = jnp.where(in_s[:, None], scores - scores.sum(0) / jnp.maximum(in_s.sum(), 1), 0.0)
    direction = jnp.linalg.eigh(centred.T @ centred)[1][:, -1]
    side = (centred @ direction > 0) ^ jax.random.bernoulli(k_coin)
    ab = jnp.stack([a, b])

    def b_over_a(xs, lab):  # log (n_b f_b / n_a f_a) per point
        n_ab = jnp.stack([jnp.sum(in_s & (lab == a)), jnp.sum(in_s & (lab == b))]) + 0.5
        return slot_lik(xs[1], b) + jnp.log(n_ab[1]) - slot_lik(xs[0], a) - jnp.log(n_ab[0])

    def launch_round(_, carry):  # two Newton steps, then each point to its likelier slot
        xs, lab = carry
        xs = _newton(on_rows(lab, ab), xs, 2)
        return xs, jnp.where(in_s, jnp.where(b_over_a(xs, lab) > 0, b, a), labels)

    lab_s = jnp.where(in_s, jnp.where(side, b, a), labels)
    xs, lab_s = lax.fori_loop(0, num_launch_steps, launch_round, (jnp.concatenate([xm, xm]), lab_s))
    ratio = b_over_a(xs, lab_s)
    log_to_b, log_to_a = jax.nn.log_sigmoid(ratio), jax.nn.log_sigmoid(-ratio)
    lam_s, vec_s = _precision(on_rows(lab_s, ab), xs)

    def log_q_split(lab, xx):  # the split launch's proposal of (allocation of S, theta_a, theta_b)
        alloc = jnp.sum(jnp.where(in_s, jnp.where(lab == b, log_to_b, log_to_a), 0.0))
        return (alloc + _gauss_log_density(xx[a], xs[0], lam_s[0], vec_s[0])
                + _gauss_log_density(xx[b], xs[1], lam_s[1], vec_s[1]))

    def log_q_merge(v):
        return _gauss_log_density(v, xm[0], lap_m[0][0], lap_m[1][0])

    go_b = in_s & (jnp.log(jax.random.uniform(k_alloc, labels.shape, x.dtype, minval=1e-30)) < log_to_b)
    x_split = (x.at[a].set(_gauss_draw(k_qa, xs[0], lam_s[0], vec_s[0]))
               .at[b].set(_gauss_draw(k_qb, xs[1], lam_s[1], vec_s[1])))
    x_merge = x.at[a].set(_gauss_draw(k_qm, xm[0], lap_m[0][0], lap_m[1][0])).at[b].set(x_prior[b])
    new = jnp.where(split, jnp.where(go_b, b, labels), lab_m).astype(labels.dtype)
    x_new = jnp.where(split, x_split, x_merge)
    new_counts = slot_counts(new, capacity)
    old_d = slot_log_density(m, layout, fixed, labels)(x)
    new_d = slot_log_density(m, layout, fixed, new)(x_new)
    d_target = jnp.sum(new_d) - jnp.sum(old_d) + measure.log_eppf(new_counts) - measure.log_eppf(counts)
    log_r = jnp.where(
        split,
        d_target + log_q_merge(x[a]) + old_d[b] - log_q_split(new, x_new) + split_choice_log_ratio(k),
        d_target + log_q_split(labels, x) - log_q_merge(x_new[a]) - new_d[b] - split_choice_log_ratio(k - 1),
    )
    moved = jnp.sum(go_b)
    valid = jnp.where(split, (k < capacity) & (moved > 0) & (moved < counts[a]), k >= 2)
    accept = valid & (jnp.log(jax.random.uniform(k_acc, (), x.dtype, minval=1e-30)) < log_r)
    x_out = jnp.where(accept, x_new, x)
    return (jnp.where(accept, new, labels), {**params, **unflatten_slots(layout, spec, x_out)[0]}, accept)
