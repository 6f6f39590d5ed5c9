"""Walker's slice sampler on stick-breaking weights: exact DP and Pitman-Yor mixtures of any
NumPyro likelihood, every label drawn at once (docs/mathematics.md §9).

The model is :mod:`~jaxbnp.inference.partition.auxiliary`'s: cluster parameters in a
``numpyro.plate`` over ``C`` slots, indexed by the partition. Each slot sits at a position
``p`` of the stick-breaking construction (``sticks``, a permutation of the slots kept in the
state); the weight of position ``p`` is ``w_p = v_p prod_{q<p} (1 - v_q)`` with
``v_p ~ Beta(1 - d, alpha + (p + 1) d)`` a priori (``d = 0`` for the DP). One iteration of
:func:`algorithm`'s ``step``:

1. the parameters of the empty slots are drawn afresh from their prior;
2. ``num_swap_passes`` passes of Metropolis-Hastings swaps of neighbouring positions (their
   clusters and parameters trade places), on the allocation's law with the sticks integrated
   out (:func:`swap_log_ratio`): a large cluster moves towards the front, where its weight is;
   then ``num_split_merge`` splits or merges on the same law (a split fills the first empty
   position; :func:`~jaxbnp.inference.partition.auxiliary.split_merge`);
3. the sticks given the allocation, ``v_p ~ Beta(1 - d + n_p, alpha + (p + 1) d + m_p)``
   (``m_p``: the points at later positions), and one slice variable per point,
   ``u_i ~ U(0, w_{z_i})`` (Walker 2007; Kalli, Griffin and Walker 2011 with ``xi = w``);
4. **every label at once**: ``P(z_i = k) ∝ 1{w_k > u_i} f(x_i | theta_k)``, one
   ``(n, C)`` computation with no sequential part;
5. the slots are renumbered in order of first appearance, their parameters and positions with
   them (when the kernel owns every parameter site);
6. every occupied slot's parameters take slice-sampling steps, as in ``AuxiliaryGibbs``.

The sticks beyond the plate carry weight ``R = prod_{p<C} (1 - v_p)``; a point could join one of
them only if ``R > u_i``. So the plate holds the exact conditional when ``R <= min_i u_i``,
and otherwise the state records ``overflow`` and the kernel raises ``CapacityError``: nothing
is truncated silently. ``log R`` falls by about ``C / alpha`` for the DP but only like
``((1 - d) / d) log(1 + C d / alpha)`` for Pitman-Yor, so Pitman-Yor needs a far larger plate.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.scipy.special import gammaln

from ..._random import log_beta_pair, log_uniform
from ..._ranks import inverse_permutation
from ..base import SamplingAlgorithm
from .auxiliary import (DEFAULT_SPLIT_MERGE, AuxiliaryGibbs, ClusterModel, ClusterModelSpec, refresh_empty_slots,
                        renumber_slots, slot_counts, split_choice_log_ratio, split_merge,
                        update_slot_params)
from .clusters import raise_capacity_error_if, raise_capacity_error_on_host

__all__ = ["SliceGibbs", "SliceGibbsState", "SliceState", "SliceInfo", "algorithm",
           "stick_log_weights", "position_log_prior", "swap_log_ratio", "swap_positions", "slice_labels"]


def _stick_params(measure):
    return measure.alpha, getattr(measure, "d", 0.0)


def _log_beta(a, b):
    return gammaln(a) + gammaln(b) - gammaln(a + b)


def stick_log_weights(key, counts, alpha, d, dtype):
    """Sticks given the allocation (module docstring, step 3): ``counts`` are the points at
    each position, ``(C,)``; returns ``(log w (C,), log R)``, ``R`` the weight left beyond
    position ``C - 1``. ``log v`` and ``log (1 - v)`` from two log-Gamma draws
    (:func:`jaxbnp._random.log_beta_pair`: finite where ``v`` rounds to 0 or 1)."""
    counts = counts.astype(dtype)
    c = counts.shape[0]
    later = jnp.sum(counts) - jnp.cumsum(counts)  # m_p
    a = 1.0 - d + counts
    b = alpha + jnp.arange(1, c + 1, dtype=dtype) * d + later
    log_v, log_rest = log_beta_pair(key, a, b)
    before = jnp.concatenate([jnp.zeros(1, dtype), jnp.cumsum(log_rest)[:-1]])
    return log_v + before, jnp.sum(log_rest)


def position_log_prior(counts, alpha, d):
    """``log p(z)`` of the allocation to positions with the sticks integrated out,
    ``sum_p log B(1 - d + n_p, alpha + (p + 1) d + m_p) - log B(1 - d, alpha + (p + 1) d)``
    (docs/mathematics.md §9); ``counts`` ``(C,)`` at each position, float."""
    c = counts.shape[0]
    later = jnp.sum(counts) - jnp.cumsum(counts)
    a = 1.0 - d
    b = alpha + jnp.arange(1, c + 1, dtype=counts.dtype) * d
    return jnp.sum(_log_beta(a + counts, b + later) - _log_beta(a, b))


def swap_log_ratio(n_p, n_q, later, p, alpha, d):
    """``log`` of the allocation's probability (sticks integrated out) after the clusters at
    positions ``p`` and ``q = p + 1`` trade places, over before: only the two positions'
    factors ``B(1 - d + n, alpha + (p + 1) d + m) / B(1 - d, alpha + (p + 1) d)`` change
    (``later``: the points beyond ``q``; docs/mathematics.md §9). Written out, eight of the
    twelve log-Gamma terms of the four Beta functions cancel:
    ``lgamma(b_p + n_p + m) - lgamma(a + b_q + n_p + m) - lgamma(b_p + n_q + m)
    + lgamma(a + b_q + n_q + m)`` with ``a = 1 - d``, ``b_p = alpha + (p + 1) d``,
    ``b_q = b_p + d``, ``m = later``."""
    a = 1.0 - d
    b_p, b_q = alpha + (p + 1) * d, alpha + (p + 2) * d
    return (gammaln(b_p + n_p + later) - gammaln(a + b_q + n_p + later)
            - gammaln(b_p + n_q + later) + gammaln(a + b_q + n_q + later))


def swap_positions(key, counts, slot_at, alpha, d, dtype):
    """One pass of Metropolis-Hastings swaps of neighbouring positions: the pairs ``(0, 1),
    (2, 3), ...`` at once, then ``(1, 2), (3, 4), ...``. Within a half the pairs are
    disjoint and each one's ratio depends on the points beyond it only through their number,
    which the others' swaps keep, so its swaps are independent reversible moves on the
    allocation's law. ``counts`` ``(C,)`` at each position, ``slot_at`` the slot at each
    position; returns the new ``slot_at`` and the number of accepted swaps that moved a
    cluster."""
    c = counts.shape[0]
    counts = counts.astype(dtype)
    total = jnp.sum(counts)
    accepted = jnp.zeros((), jnp.int32)
    for parity, k in zip((0, 1), jax.random.split(key, 2)):
        p = np.arange(parity, c - 1, 2)
        if p.size == 0:
            continue
        n_p, n_q = counts[p], counts[p + 1]
        later = total - jnp.cumsum(counts)[p + 1]
        log_u = jnp.log(jax.random.uniform(k, p.shape, dtype, minval=1e-30))
        ok = ((n_p + n_q) > 0) & (log_u < swap_log_ratio(n_p, n_q, later, jnp.asarray(p, dtype), alpha, d))
        counts = counts.at[p].set(jnp.where(ok, n_q, n_p)).at[p + 1].set(jnp.where(ok, n_p, n_q))
        s_p, s_q = slot_at[p], slot_at[p + 1]
        slot_at = slot_at.at[p].set(jnp.where(ok, s_q, s_p)).at[p + 1].set(jnp.where(ok, s_p, s_q))
        accepted = accepted + jnp.sum(ok).astype(jnp.int32)
    return slot_at, accepted


def slice_labels(key, labels, log_lik, log_w, log_rest):
    """Every label at once given the slot weights ``log_w`` ``(C,)`` (module docstring, steps
    3-4): ``u_i = w_{z_i} U_i``, then ``z_i`` from ``1{w_k > u_i} f(x_i | theta_k)`` by the
    Gumbel-max trick; ``overflow`` when the weight beyond the plate reaches a slice
    (``log R >= min_i log u_i``)."""
    n, c = log_lik.shape
    k_u, k_z = jax.random.split(key)
    log_u = log_w[labels] + log_uniform(k_u, (n,), log_lik.dtype)  # exact in float32's tail too
    allowed = log_w[None, :] > log_u[:, None]
    g = jax.random.gumbel(k_z, (n, c), log_lik.dtype)
    new = jnp.argmax(jnp.where(allowed, log_lik + g, -jnp.inf), axis=1).astype(jnp.int32)
    return new, log_rest >= jnp.min(log_u)


class SliceState(NamedTuple):
    """labels: ``(n,)`` slots; params: every param site's value; sticks: ``(C,)`` the
    stick-breaking position of each slot; overflow: sticky, the weight beyond the plate
    reached a slice variable."""

    labels: jax.Array
    params: dict
    sticks: jax.Array
    overflow: jax.Array


class SliceInfo(NamedTuple):
    num_clusters: jax.Array
    log_joint: jax.Array
    num_accepted: jax.Array  # neighbouring swaps, splits and merges accepted


def algorithm(model: Callable, spec: ClusterModelSpec, model_args=(), model_kwargs=None, *,
              num_swap_passes: int = 1, num_split_merge: int = 0, num_param_steps: int = 1,
              step_size: float = 1.0) -> SamplingAlgorithm:
    """Walker's slice sampler for ``model`` (module docstring) as ``init(key, labels, params)``,
    ``step(key, state)``; ``spec`` from :func:`~jaxbnp.inference.partition.auxiliary.find_cluster_spec`."""
    m = ClusterModel(model, spec, model_args, model_kwargs)
    capacity = spec.capacity

    def renumber(labels, params, sticks):  # each slot's position goes with it
        labels, params, order = renumber_slots(spec, labels, params)
        return labels, params, sticks if order is None else sticks[order]

    def init(key, labels, params):
        labels = jnp.asarray(labels, jnp.int32)
        labels, params, sticks = renumber(labels, params, jnp.arange(capacity, dtype=jnp.int32))
        return SliceState(labels, params, sticks, jnp.zeros((), bool))

    def step(key, state):
        k_fresh, k_swap, k_sticks, k_labels, k_params, k_moves = jax.random.split(key, 6)
        labels, params, sticks = state.labels, dict(state.params), state.sticks
        measure = m.trace(labels, params)[spec.partition_site]["fn"].measure
        alpha, d = _stick_params(measure)
        params = refresh_empty_slots(m, k_fresh, labels, params)  # 1.
        log_lik = m.log_lik_matrix(params)
        dtype = log_lik.dtype
        counts = slot_counts(labels, capacity)
        slot_at = inverse_permutation(sticks.astype(jnp.int32))  # position -> slot
        accepted = jnp.zeros((), jnp.int32)
        for k in jax.random.split(k_swap, num_swap_passes) if num_swap_passes else ():  # 2.
            slot_at, ok = swap_positions(k, counts[slot_at], slot_at, alpha, d, dtype)
            accepted = accepted + ok
        sticks = inverse_permutation(slot_at)
        if num_split_merge:  # 2b. splits and merges on the allocation's law over positions
            def prior(c):
                return position_log_prior(c[slot_at].astype(dtype), alpha, d)

            def first_empty(occupied_at):  # the first empty position
                return jnp.argmax(~occupied_at)

            def split_slot(key, occupied):  # a split fills the first empty position
                return slot_at[first_empty(occupied[slot_at])]

            def merge_ok(b, new_counts):  # ... so a merge must leave b's position the first empty one
                return first_empty(new_counts[slot_at] > 0) == sticks[b]

            def move(i, carry):
                labels, accepted = carry
                labels, ok = split_merge(jax.random.fold_in(k_moves, i), labels, log_lik, measure,
                                         capacity, prior, split_choice_log_ratio, split_slot, merge_ok)
                return labels, accepted + ok

            labels, accepted = lax.fori_loop(0, num_split_merge, move, (labels, accepted))
            counts = slot_counts(labels, capacity)
        log_w_pos, log_rest = stick_log_weights(k_sticks, counts[slot_at], alpha, d, dtype)  # 3.
        labels, overflow = slice_labels(k_labels, labels, log_lik, log_w_pos[sticks], log_rest)  # 4.
        labels, params, sticks = renumber(labels, params, sticks)  # 5.
        params = update_slot_params(m, k_params, labels, params, num_param_steps, step_size)  # 6.
        num_clusters = jnp.sum(slot_counts(labels, capacity) > 0).astype(jnp.int32)
        new = SliceState(labels, params, sticks, state.overflow | overflow)
        return new, SliceInfo(num_clusters, m.log_joint(labels, params), accepted)

    return SamplingAlgorithm(init, step)


class SliceGibbsState(NamedTuple):
    """``AuxiliaryGibbsState``'s fields and ``sticks``, each slot's stick-breaking position;
    num_accepted: neighbouring swaps, splits and merges accepted in the step."""

    z: dict
    log_joint: jax.Array
    num_clusters: jax.Array
    num_accepted: jax.Array
    overflow: jax.Array
    sticks: jax.Array
    rng_key: jax.Array
    overflow_on_host: tuple | None = None


class SliceGibbs(AuxiliaryGibbs):
    """Walker's slice sampler on the stick-breaking weights of a cluster plate: every label
    drawn at once, for any NumPyro likelihood (module docstring; docs/mathematics.md §9).

    The model is written as for :class:`~jaxbnp.AuxiliaryGibbs` (a ``Partition`` site with
    ``DP`` or ``PitmanYor``, the cluster parameters in one ``numpyro.plate``). The label step
    is one computation over all points and slots, with no sequential part: the path for many
    points and for accelerators. It mixes more slowly per iteration than ``AuxiliaryGibbs``
    (a point sees only the clusters whose weight exceeds its slice).

    :param num_swap_passes: passes of neighbouring-position swaps per iteration (0: none).
    :param num_split_merge: split or merge proposals per iteration (``AuxiliaryGibbs``'s move
        on this kernel's target: a split fills the first empty position), each one pass over
        the points, data-parallel like the label step. They change ``K`` in big steps where
        the slices let few points move: on ``benchmarks/nonconjugate.py``'s sets the max
        R-hat of ``K`` and the log joint fell from 2.6-3.0 to 1.1-1.8 with 10 (the default).
    :param num_param_steps: slice-sampling steps of the cluster parameters per iteration.
    :param step_size: the parameters' slice sampler's initial interval (unconstrained).
    :param init_strategy: ``"one"`` or ``"prior"``, as for ``AuxiliaryGibbs``.
    :param chain_batching: as for :class:`~jaxbnp.CollapsedGibbs`.

    The plate must hold every stick whose weight may exceed a point's slice: when the weight
    left beyond it reaches one, the kernel raises ``CapacityError`` (enlarge the plate). For
    ``DP(alpha)``, leave about ``log(100 n T) / log(1 + 1 / alpha)`` slots beyond the clusters
    for ``T`` iterations on ``n`` points (``DP(1)``: 27 at ``n = T = 1000``, 47 at ``n = 10^6``);
    Pitman-Yor needs far more (docs/mathematics.md §9). Extra fields
    ``"log_joint"``, ``"num_clusters"``, ``"num_accepted"`` (swaps, splits and merges accepted).
    """

    def __init__(self, model: Callable, *, num_swap_passes: int = 1,
                 num_split_merge: int = DEFAULT_SPLIT_MERGE,
                 num_param_steps: int = 1, step_size: float = 1.0, init_strategy: str = "one",
                 chain_batching: str = "auto"):
        if isinstance(num_swap_passes, bool) or not isinstance(num_swap_passes, (int, np.integer)) \
                or num_swap_passes < 0:
            raise ValueError(f"num_swap_passes must be an integer >= 0, got {num_swap_passes!r}.")
        # the model, the moves' counts, step_size, init_strategy, chain_batching: checked there
        super().__init__(model, num_sweeps=1, num_split_merge=num_split_merge, num_param_steps=num_param_steps,
                         step_size=step_size, init_strategy=init_strategy,
                         chain_batching=chain_batching)
        self._num_swap_passes = int(num_swap_passes)

    def _algorithm(self, spec, model_args, model_kwargs):
        return algorithm(self._model, spec, model_args, model_kwargs,
                         num_swap_passes=self._num_swap_passes,
                         num_split_merge=self._num_split_merge,
                         num_param_steps=self._num_param_steps, step_size=self._step_size)

    def _algorithm_state(self, spec, s, params):
        return SliceState(s.z[spec.partition_site], params, s.sticks, s.overflow)

    def _raise_on_overflow(self, spec, overflow, on_host=False):
        # the weight beyond the plate can reach a slice at any plate size: always checked
        if not self.host_overflow_check:  # the runner reads the flag after the run instead
            return
        (raise_capacity_error_on_host if on_host else raise_capacity_error_if)(
            overflow, spec.capacity,
            f"Enlarge the plate '{spec.plate}' (e.g. twice as many slots)",
            reason="the stick-breaking weight beyond the plate's {capacity} slots exceeds a "
                   "point's slice variable (the sampler would need a cluster the plate cannot hold).")

    def _kernel_state(self, spec, state: SliceState, key, args, kwargs, overflow, info=None):
        base = super()._kernel_state(spec, state, key, args, kwargs, overflow, info)
        return SliceGibbsState(base.z, base.log_joint, base.num_clusters, base.num_accepted,
                               base.overflow, state.sticks, key)
