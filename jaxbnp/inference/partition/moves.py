"""Composable moves over one partition (Optax style), and the kernel built from them.

A :class:`Move` (:mod:`jaxbnp.inference.base`: generic over its state; BHMC's sweep is a
``chain`` of its own moves) is a pair of pure functions and the number of keys it draws from:

* ``init(state, ctx) -> move_state``: the move's own state (:class:`EmptyState` if none;
  e.g. tgMCMC's device forest, kept between iterations);
* ``step(key, state, move_state, ctx) -> (state, move_state, info)``: one
  application, where ``state`` is a :class:`PartitionState` (clusters and NGGP's
  ``u``) and ``ctx`` a :class:`Context` (the model's data, measure and family at
  this step). A move with ``num_keys > 1`` receives an array of that many keys
  (independent streams, e.g. a random subset and the sweep's noise).

``chain(*moves)`` applies moves one after another: its state is the tuple of the
moves' states, its info the tuple of their infos; its key is split once into
``sum(num_keys)`` keys, handed out in order. ``repeat(move, n)`` applies a move
``n`` times (keys ``jax.random.split(key, n)``, one ``fori_loop``) and adds up
the infos; a move repeated 0 times is the identity but still takes its key slot.
Metropolis-Hastings moves report an :class:`MHInfo` (additive counts and sums).

Ready-made moves: :func:`gibbs_sweep`, :func:`gibbs_sweeps`, :func:`split_merge`,
:func:`update_u`, :func:`local_moves`, :func:`identity`; tgMCMC's global moves are
:func:`jaxbnp.inference.tgmcmc.kernel.tree_guided_moves`. The whole kernel
follows BlackJAX's contract: :func:`init` ``-> KernelState`` and :func:`step`
``-> (KernelState, KernelInfo)``, or with the data bound, :func:`algorithm` (the one shape
of every sampler, :class:`~jaxbnp.inference.base.SamplingAlgorithm`); the NumPyro adapter is
:class:`jaxbnp.inference.partition.kernels.PartitionKernel`.

Example
-------
>>> import jax, jax.numpy as jnp, jaxbnp as bnp
>>> from jaxbnp.inference.partition import moves
>>> from jaxbnp.inference.partition.clusters import init_clusters
>>> X = jnp.array([[-2.0], [-2.1], [2.0], [2.2]])
>>> family, measure = bnp.NormalGamma(), bnp.DP(1.0)
>>> move = moves.chain(moves.split_merge(3), moves.gibbs_sweep(), moves.update_u())
>>> ctx = moves.Context(X, measure, family)
>>> state = moves.init(moves.PartitionState(init_clusters(family, X, jnp.zeros(4, int), 4), jnp.ones(())),
...                    ctx, move)
>>> state, info = moves.step(jax.random.key(0), state, ctx, move)
>>> int(info.mh.num_proposed)
3
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from ..._ranks import permutation
from ..._validation import check_int
from ..base import EmptyState, Move, SamplingAlgorithm, chain, identity, no_state, repeat
from . import gibbs as gibbs_core
from .clusters import PartitionState, init_clusters
from .split_merge import split_merge_move_info

__all__ = [
    "PartitionState",
    "Context",
    "Move",
    "EmptyState",
    "no_state",
    "MHInfo",
    "KernelState",
    "KernelInfo",
    "chain",
    "repeat",
    "identity",
    "gibbs_sweep",
    "gibbs_sweeps",
    "split_merge",
    "update_u",
    "local_moves",
    "mh_summary",
    "init",
    "step",
    "algorithm",
]


class Context(NamedTuple):
    """The model's values at this step.

    X: ``(n, D)`` data. measure: the partition prior. family: the conjugate family.
    chain_id: an int32 id of the chain (keys host-side state, e.g. tgMCMC's host
    trees); ``None`` outside a NumPyro kernel.
    """

    X: jax.Array
    measure: Any
    family: Any
    chain_id: Any = None


class MHInfo(NamedTuple):
    """Metropolis-Hastings statistics of one or more moves (additive: repeats add up).

    num_accepted, num_proposed: int32 counts.
    sum_log_accept: sum of ``min(0, log r)`` over the proposals counted in
        ``num_log_accept`` (proposals with ``r = 0`` are proposed but not counted).
    """

    num_accepted: jax.Array
    num_proposed: jax.Array
    sum_log_accept: jax.Array
    num_log_accept: jax.Array

    @property
    def mean_log_accept(self) -> jax.Array:
        """Mean ``min(0, log r)`` (0 when nothing was counted), in ``sum_log_accept``'s dtype."""
        m = self.num_log_accept
        return jnp.where(m > 0, self.sum_log_accept / jnp.maximum(m, 1), 0.0)


def gibbs_sweep() -> Move:
    """One collapsed Gibbs sweep over all points (:func:`jaxbnp.inference.partition.gibbs.gibbs_sweep`)."""

    def step_fn(key, state, move_state, ctx):
        clusters = gibbs_core.gibbs_sweep(key, state.clusters, ctx.X, ctx.measure, ctx.family, state.u)
        return PartitionState(clusters, state.u), move_state, ()

    return Move(no_state, step_fn)


def gibbs_sweeps(n: int) -> Move:
    """``n`` collapsed Gibbs sweeps (``repeat(gibbs_sweep(), n)``)."""
    return repeat(gibbs_sweep(), n)


def split_merge(num_moves: int = 1, num_restricted_scans: int = 5) -> Move:
    """``num_moves`` Jain-Neal split-merge moves
    (:func:`jaxbnp.inference.partition.split_merge.split_merge_move_info`); info :class:`MHInfo`."""
    num_restricted_scans = check_int("num_restricted_scans", num_restricted_scans)
    num_moves = check_int("num_moves", num_moves)

    def step_fn(key, state, move_state, ctx):
        clusters, info = split_merge_move_info(
            key, state.clusters, ctx.X, ctx.measure, ctx.family, state.u, num_restricted_scans
        )
        one = jnp.ones((), jnp.int32)
        mh = MHInfo(info.accepted.astype(jnp.int32), one,
                    jnp.minimum(info.log_ratio, 0.0).astype(jnp.float32), one)
        return PartitionState(clusters, state.u), move_state, mh

    moves_ = repeat(Move(no_state, step_fn), num_moves)

    def counted_step(key, state, move_state, ctx):
        state, move_state, mh = moves_.step(key, state, move_state, ctx)
        # the counts are known: constants, so that the mean divides by a constant
        count = jnp.int32(num_moves)
        return state, move_state, mh._replace(num_proposed=count, num_log_accept=count)

    return Move(moves_.init, counted_step)


def update_u() -> Move:
    """Slice update of NGGP's ``u`` (docs/mathematics.md §1); the identity for other measures."""

    def step_fn(key, state, move_state, ctx):
        u = state.u
        if ctx.measure.has_auxiliary:
            u = gibbs_core.update_u(key, u, state.clusters.counts, ctx.measure)
        return PartitionState(state.clusters, u), move_state, ()

    return Move(no_state, step_fn)


def local_moves(depth: int) -> Move:
    """tgMCMC's local moves: collapsed Gibbs updates of ``ceil(n / 2**depth)`` points drawn
    uniformly without replacement (independent of the state, so each update is exact).
    Two keys: the subset, then the sweep."""
    depth = check_int("depth", depth, 1)

    def step_fn(keys, state, move_state, ctx):
        k_subset, k_noise = keys[0], keys[1]
        n = ctx.X.shape[0]
        m = -(-n // 2**depth)
        subset = permutation(k_subset, n)[:m]
        clusters = gibbs_core.gibbs_sweep(
            k_noise, state.clusters, ctx.X, ctx.measure, ctx.family, state.u, order=subset
        )
        return PartitionState(clusters, state.u), move_state, ()

    return Move(no_state, step_fn, 2)


# ----------------------------------------------------------------------------- the kernel
class KernelState(NamedTuple):
    """State of a partition kernel: the partition and the move's own state."""

    partition: PartitionState
    moves: Any


class KernelInfo(NamedTuple):
    """What one kernel step did: the move's info and its :class:`MHInfo` totals."""

    moves: Any
    mh: MHInfo


def mh_summary(info: Any) -> MHInfo:
    """The :class:`MHInfo` totals of an info tree (zeros when it holds none)."""
    found = [
        x for x in jax.tree.leaves(info, is_leaf=lambda x: isinstance(x, MHInfo))
        if isinstance(x, MHInfo)
    ]
    if not found:
        zero = jnp.zeros((), jnp.int32)
        return MHInfo(zero, zero, jnp.zeros((), jnp.float32), zero)
    total = found[0]
    for other in found[1:]:
        total = jax.tree.map(lambda a, b: a + b, total, other)
    return total


def init(state: PartitionState, ctx: Context, move: Move) -> KernelState:
    """The kernel's initial state: the partition and ``move.init``'s state."""
    return KernelState(state, move.init(state, ctx))


def step(key: jax.Array, state: KernelState, ctx: Context, move: Move) -> tuple[KernelState, KernelInfo]:
    """One application of ``move``: ``(KernelState, KernelInfo)``.

    ``move.num_keys > 1`` moves get ``jax.random.split(key, num_keys)``."""
    k = key if move.num_keys == 1 else jax.random.split(key, move.num_keys)
    partition, move_state, info = move.step(k, state.partition, state.moves, ctx)
    return KernelState(partition, move_state), KernelInfo(info, mh_summary(info))


def algorithm(move: Move, X, measure, family, capacity: int | None = None,
              chain_id=None) -> SamplingAlgorithm:
    """The kernel of ``move`` on the data ``X`` in the one shape
    (:class:`~jaxbnp.inference.base.SamplingAlgorithm`):

    * ``init(key, labels=None, u=None) -> KernelState``: the partition of ``labels``
      (``None``: one cluster) in ``capacity`` slots (``None``: ``n``), and NGGP's ``u``
      (``None``: its conditional mode given the partition; 1 for other measures);
      ``key`` is not used (the start is given);
    * ``step(key, state) -> (KernelState, KernelInfo)``: :func:`step`.

    ``chain_id`` (an int32 id) keys host-side state per chain (:class:`Context`); the
    NumPyro kernels pass theirs and run their steps through this function.

    >>> import jax, jax.numpy as jnp, jaxbnp as bnp
    >>> from jaxbnp.inference.partition import moves
    >>> X = jnp.array([[-2.0], [-2.1], [2.0], [2.2]])
    >>> alg = moves.algorithm(moves.chain(moves.split_merge(), moves.gibbs_sweep()), X,
    ...                       bnp.DP(1.0), bnp.NormalGamma())
    >>> state, info = alg.step(jax.random.key(0), alg.init(jax.random.key(1)))
    >>> int(info.mh.num_proposed)
    1
    """
    X = jnp.asarray(X)
    n = X.shape[0]
    capacity = n if capacity is None else check_int("capacity", capacity, 1)
    ctx = Context(X, measure, family, chain_id)

    def init_fn(key, labels=None, u=None):
        del key  # the start is given
        labels = jnp.zeros(n, jnp.int32) if labels is None else jnp.asarray(labels, jnp.int32)
        clusters = init_clusters(family, X, labels, capacity)
        dtype = jnp.result_type(X.dtype, float)
        if u is None:
            u = measure.u_mode(clusters.counts) if measure.has_auxiliary else 1.0
        return init(PartitionState(clusters, jnp.asarray(u, dtype)), ctx, move)

    def step_fn(key, state):
        return step(key, state, ctx, move)

    return SamplingAlgorithm(init_fn, step_fn)
