"""``log q(Π* | Π)`` of one device global move between two partitions, from the public
pieces of :mod:`jaxbnp.inference.tgmcmc.device` (test helper: compared with the host trees)."""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from jaxbnp.inference.tgmcmc import device


@functools.partial(jax.jit, static_argnames=("capacity", "max_parts"))
def split_q(X, measure, family, u, labels, c, part, *, capacity, max_parts):
    """``log q`` of splitting cluster ``c`` into the parts ``part`` (labels of its points)."""
    ctx = device.make_context(X, measure, family, u)
    pool, roots = device.build_forest(ctx, labels, capacity)
    active, stats, size, log_t, _ = device.cluster_arrays(pool, roots)
    select = device.log_select_alone(device.log_d_row(ctx, stats, size, log_t, c), active, c)
    return select + device.split_log_prob(ctx, pool, roots[c], part, max_parts)


@functools.partial(jax.jit, static_argnames=("capacity",))
def merge_q(X, measure, family, u, labels, picked, *, capacity):
    """``log q`` of merging the clusters ``picked`` (a ``(capacity,)`` mask)."""
    ctx = device.make_context(X, measure, family, u)
    pool, roots = device.build_forest(ctx, labels, capacity)
    active, stats, size, log_t, _ = device.cluster_arrays(pool, roots)
    return device.merge_log_q(ctx, stats, size, log_t, active, picked, capacity)


def proposal_log_prob(X, measure, family, u, labels, to_labels, max_parts: int = 16) -> float:
    """``log q(Π* | Π)`` of one global move between two partitions (labels ``0..K-1``),
    ``-inf`` when ``Π*`` is not one split or merge away."""
    labels = np.asarray(labels)
    to_labels = np.asarray(to_labels)
    n = labels.shape[0]
    capacity = n
    X = jnp.asarray(X)
    old = {tuple(np.nonzero(labels == k)[0]) for k in np.unique(labels)}
    new = {tuple(np.nonzero(to_labels == k)[0]) for k in np.unique(to_labels)}
    removed, added = old - new, new - old
    lab = jnp.asarray(labels, jnp.int32)
    if len(removed) == 1 and len(added) >= 2:
        (c_pts,) = removed
        if len(added) > max_parts:
            return -math.inf
        part = np.zeros(n, np.int32)
        for k, pts in enumerate(sorted(added)):
            part[list(pts)] = k
        return float(split_q(X, measure, family, u, lab, int(labels[c_pts[0]]), jnp.asarray(part),
                             capacity=capacity, max_parts=max_parts))
    if len(added) == 1 and len(removed) >= 2:
        picked = np.zeros(capacity, bool)
        for pts in removed:
            picked[labels[pts[0]]] = True
        return float(merge_q(X, measure, family, u, lab, jnp.asarray(picked), capacity=capacity))
    return -math.inf
