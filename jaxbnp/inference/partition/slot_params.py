"""The cluster parameters of a plate's slots in the unconstrained coordinates, and the small
pieces the moves on slots share (docs/mathematics.md §8): used by
:mod:`~jaxbnp.inference.partition.auxiliary` (Algorithm 8, its split-merge given the
parameters) and :mod:`~jaxbnp.inference.partition.launch` (the split-merge that draws them).

``spec`` is a :class:`~jaxbnp.inference.partition.auxiliary.ClusterModelSpec` and ``m`` a
:class:`~jaxbnp.inference.partition.auxiliary.ClusterModel` (read by their attributes)."""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from numpyro.distributions.transforms import biject_to

__all__ = ["FlatLayout", "flat_layout", "flatten_slots", "unflatten_slots", "slot_log_density",
           "slot_counts", "uniform_choice", "choose_slots", "split_choice_log_ratio", "to_front", "from_front"]


def to_front(x, axis):
    """``x`` with its slot axis ``axis`` first."""
    return jnp.moveaxis(x, axis, 0)


def from_front(x, axis):
    """The inverse of :func:`to_front`."""
    return jnp.moveaxis(x, 0, axis)


class FlatLayout(NamedTuple):
    """How the owned parameter sites lie in one row of the unconstrained ``(C, D)`` array."""

    names: tuple
    shapes: tuple  # constrained per-slot shapes
    ushapes: tuple  # unconstrained per-slot shapes
    transforms: tuple


def flat_layout(spec, tr) -> FlatLayout:
    """The layout of ``spec``'s owned sites in the trace ``tr`` (their supports' bijections)."""
    shapes, ushapes, transforms = [], [], []
    for name in spec.owned_params:
        s = tr[name]
        t = biject_to(s["fn"].support)
        slot_shape = tuple(np.delete(np.shape(s["value"]), spec.slot_axis(name)))
        shapes.append(slot_shape)
        ushapes.append(tuple(t.inverse_shape(slot_shape)))
        transforms.append(t)
    return FlatLayout(spec.owned_params, tuple(shapes), tuple(ushapes), tuple(transforms))


def flatten_slots(layout: FlatLayout, spec, params) -> jax.Array:
    """Owned parameters -> unconstrained ``(C, D)``."""
    parts = []
    for name, t in zip(layout.names, layout.transforms):
        v = to_front(params[name], spec.slot_axis(name))
        parts.append(jax.vmap(t.inv)(v).reshape(spec.capacity, -1))
    return jnp.concatenate(parts, axis=1)


def unflatten_slots(layout: FlatLayout, spec, x):
    """Unconstrained ``(C, D)`` -> (owned parameters, log |Jacobian| per slot ``(C,)``)."""
    params, ladj, start = {}, jnp.zeros(spec.capacity, x.dtype), 0
    for name, ushape, t in zip(layout.names, layout.ushapes, layout.transforms):
        size = int(np.prod(ushape, dtype=int))
        u = x[:, start:start + size].reshape((spec.capacity, *ushape))
        start += size
        v = jax.vmap(t)(u)
        j = jax.vmap(lambda a, b: jnp.sum(t.log_abs_det_jacobian(a, b)))(u, v)
        params[name] = from_front(v, spec.slot_axis(name))
        ladj = ladj + j
    return params, ladj


def slot_log_density(m, layout: FlatLayout, fixed: dict, labels) -> Callable:
    """``x -> (C,)``: slot ``k``'s ``log p(theta_k) + sum_{i: z_i = k} log f(x_i | theta_k)`` in
    the unconstrained coordinates ``x`` (``(C, D)``, the Jacobian included)."""
    spec = m.spec

    def log_density(x):
        owned, ladj = unflatten_slots(layout, spec, x)
        tr = m.trace(labels, {**fixed, **owned})
        ll = jax.ops.segment_sum(m.point_log_lik(tr), labels, num_segments=spec.capacity)
        return m.slot_log_prior(tr, spec.owned_params) + ladj + ll

    return log_density


def slot_counts(labels, capacity: int) -> jax.Array:
    """Points per slot, ``(capacity,)`` int32."""
    return jnp.zeros(capacity, jnp.int32).at[labels].add(1)


def uniform_choice(key, mask):
    """A uniformly chosen index among ``mask``'s true entries (any index if none)."""
    return jnp.argmax(jnp.where(mask, jax.random.gumbel(key, mask.shape), -jnp.inf))


def choose_slots(k_type, k_a, k_b, occupied, split_slot: Callable | None = None):
    """``(split, a, b)`` of a split or merge (probability 1/2 each): a split picks an occupied
    slot ``a`` and an empty ``b`` (uniformly, or ``split_slot(k_b, occupied)``), a merge an
    ordered pair of occupied slots, ``b`` into ``a`` (docs/mathematics.md §8)."""
    split = jax.random.uniform(k_type) < 0.5
    a = uniform_choice(k_a, occupied)
    empty = uniform_choice(k_b, ~occupied) if split_slot is None else split_slot(k_b, occupied)
    b = jnp.where(split, empty, uniform_choice(k_b, occupied & (jnp.arange(occupied.shape[0]) != a)))
    return split, a, b


def split_choice_log_ratio(k):
    """``log`` of (choosing the merge back) / (choosing this split), slot choices only, for a
    split of one of ``k`` clusters: ``log k - log((k + 1) k) = -log(k + 1)`` (the empty slot's
    ``1 / (C - k)`` cancels against the target's slot placement; docs/mathematics.md §8)."""
    return -jnp.log(k + 1.0)
