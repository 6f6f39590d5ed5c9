"""Fixed-capacity cluster state shared by every sampler (docs/design.md).

Clusters live in ``capacity`` slots: per-slot ``counts`` and additive
sufficient ``stats`` (a pytree whose leaves have leading axis ``capacity``);
a slot is active when its count is positive. ``labels[i]`` is the slot of
point ``i``. A new cluster takes the first free slot; when none is free the
state records ``overflow`` and the caller raises (or grows the capacity on
the host and starts again): nothing is dropped silently.

Example
-------
>>> import jax.numpy as jnp
>>> from jaxbnp.models.families import NormalGamma
>>> from jaxbnp.inference.partition.clusters import init_clusters
>>> st = init_clusters(NormalGamma(), jnp.zeros((4, 1)), jnp.array([0, 0, 5, 5]), capacity=4)
>>> st.counts.tolist()
[2, 2, 0, 0]
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ..._ranks import inverse_permutation, stable_rank
from ..._validation import check_labels
from ...errors import CapacityError

__all__ = [
    "ClusterState",
    "init_clusters",
    "clusters_from_labels",
    "compact_labels",
    "PartitionState",
    "canonical_labels",
    "slot_order",
    "first_free_slot",
    "cluster_log_joint",
    "log_joint_of_sums",
    "tree_index",
    "CapacityError",
    "raise_if_overflow",
    "raise_capacity_error_if",
    "raise_capacity_error_on_host",
    "start_labels",
]


class ClusterState(NamedTuple):
    """Cluster assignments in fixed-capacity arrays.

    labels: ``(n,)`` int32 slot of each point.
    counts: ``(capacity,)`` int32 points per slot.
    stats: family statistics, leaves ``(capacity, ...)``.
    overflow: bool, a new cluster was needed while every slot was used.
    """

    labels: jax.Array
    counts: jax.Array
    stats: Any
    overflow: jax.Array

    @property
    def active(self) -> jax.Array:
        """``(capacity,)`` mask of occupied slots."""
        return self.counts > 0

    @property
    def num_clusters(self) -> jax.Array:
        return jnp.sum(self.counts > 0)

    @property
    def capacity(self) -> int:
        return self.counts.shape[-1]


class PartitionState(NamedTuple):
    """A partition and the measure's auxiliary variable: what every partition move updates.

    clusters: the fixed-capacity :class:`ClusterState`.
    u: NGGP's auxiliary ``u`` (docs/mathematics.md §1); ``1.0`` for measures without it.
    """

    clusters: ClusterState
    u: jax.Array


def compact_labels(labels: np.ndarray) -> np.ndarray:
    """Relabel to ``0..K-1`` in order of first appearance (host side)."""
    _, first_idx, inverse = np.unique(labels, return_index=True, return_inverse=True)
    order = np.argsort(np.argsort(first_idx))
    return order[inverse].astype(np.int32)


def init_clusters(family, X, labels, capacity: int) -> ClusterState:
    """Build the state from data and any integer labels (host side, validated).

    Raises ``ValueError`` when the labels use more clusters than ``capacity``.
    """
    X = jnp.asarray(X)
    if isinstance(labels, jax.core.Tracer):  # traced (a compiled init): the slots as given
        lab_j = labels.astype(jnp.int32)
    else:
        lab_j = jnp.asarray(start_labels(labels, X.shape[0], capacity))
    return clusters_from_labels(family, X, lab_j, capacity)


def start_labels(labels, n: int, capacity: int) -> np.ndarray:
    """Host labels of a start: checked, relabelled ``0..K-1`` in first-appearance order, and
    ``ValueError`` when they use more clusters than ``capacity``."""
    lab = compact_labels(check_labels(np.asarray(labels), n))
    k = int(lab.max()) + 1
    if k > capacity:
        raise ValueError(
            f"The initial partition has {k} clusters but capacity is {capacity}; "
            f"pass capacity >= {k}."
        )
    return lab


def clusters_from_labels(family, X, labels, capacity: int, overflow=False) -> ClusterState:
    """The state of slot labels ``labels`` (``0 <= labels < capacity``): counts and statistics
    summed from the points. Pure JAX (no validation): use it inside jitted code."""
    labels = labels.astype(jnp.int32)
    counts = jax.ops.segment_sum(jnp.ones(labels.shape[0], jnp.int32), labels, num_segments=capacity)
    stats = family.stats_from_labels(X, labels, capacity)
    return ClusterState(labels, counts, stats, jnp.asarray(overflow))


def cluster_log_joint(clusters: ClusterState, measure, family, u=None) -> jax.Array:
    """``log p(X, Π[, u]) = Σ_c log P(X_c) + log p(Π[, u])`` from the state (docs/mathematics.md §2).

    ``u`` is used only by measures that carry it (NGGP).
    """
    lm = jnp.where(clusters.counts > 0, family.log_marginal(clusters.stats), 0.0)
    return jnp.sum(lm) + measure.log_eppf(clusters.counts, u if measure.has_auxiliary else None)


@jax.jit
def log_joint_of_sums(counts, stats, measure, family) -> jax.Array:
    """:func:`cluster_log_joint` from per-slot counts and statistics alone, compiled: the
    chunked fits hold the sums, not the labels."""
    return cluster_log_joint(ClusterState(None, counts, stats, None), measure, family)


def tree_index(tree, i):
    """``tree`` with every leaf indexed by ``i`` along its leading (slot or batch) axis."""
    return jax.tree.map(lambda a: a[i], tree)


def first_free_slot(counts: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Index of the first empty slot and whether one exists."""
    free = counts == 0
    return jnp.argmax(free), jnp.any(free)


def slot_order(labels: jax.Array, capacity: int) -> tuple[jax.Array, jax.Array]:
    """``(order, new_labels)``: the slots in order of first appearance (empty slots after, in
    their own order: their first appearance is the largest integer, and the ranking is stable)
    and the labels renumbered to match (jit-compatible; without a sort up to
    :data:`jaxbnp._ranks.RANK_BY_COMPARISON_MAX` slots)."""
    n = labels.shape[-1]
    first = jax.ops.segment_min(jnp.arange(n), labels, num_segments=capacity)
    rank = stable_rank(first)
    return inverse_permutation(rank), rank[labels]


def canonical_labels(labels: jax.Array, capacity: int) -> jax.Array:
    """Relabel slots to ``0..K-1`` in order of first appearance (jit-compatible)."""
    return slot_order(labels, capacity)[1]


def raise_capacity_error_on_host(flag, capacity, hint=None, reason=None) -> None:
    """On the host: raise ``CapacityError`` if ``flag`` (array-like) is set anywhere (the message
    of :func:`raise_capacity_error_if`)."""
    if np.any(np.asarray(flag)):
        capacity = int(np.asarray(capacity).reshape(-1)[0])
        reason = (reason or "all {capacity} cluster slots are in use and the sampler needed a new "
                  "cluster.").format(capacity=capacity)
        raise CapacityError(
            "jaxbnp: " + reason + " " + (hint or "Pass a larger capacity (e.g. twice as large) to the kernel")
            + "; no draw was returned from the overflowing step."
        )


def raise_capacity_error_if(flag: jax.Array, capacity: int, hint: str | None = None,
                            reason: str | None = None) -> None:
    """Inside jit: raise ``CapacityError`` on the host if ``flag`` is set (one host callback);
    ``hint`` says what to enlarge (default: the kernel's capacity); ``reason`` replaces the
    message's first sentence (``{capacity}`` is filled in)."""
    from functools import partial

    from jax.experimental import io_callback

    io_callback(partial(raise_capacity_error_on_host, hint=hint, reason=reason), None, flag,
                jnp.asarray(capacity, jnp.int32), ordered=False)


def raise_if_overflow(state: ClusterState) -> None:
    """Inside jit: raise ``CapacityError`` on the host if ``state.overflow`` is set.

    One host callback per call (about 0.1-0.3 ms), so call it once per sweep.
    """
    raise_capacity_error_if(state.overflow, state.capacity)
