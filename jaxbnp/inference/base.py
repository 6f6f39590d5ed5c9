"""The one shape of every jaxbnp sampler: a :class:`SamplingAlgorithm` (BlackJAX's).

Each sampler's module has an ``algorithm(...)`` function that binds the data and the
static settings (as BlackJAX binds the log density) and returns a pair of pure functions:

* ``init(key, *position) -> State``: the chain's state from a starting position (a
  partition's labels, a diffusion tree, ...; ``key`` feeds any random start);
* ``step(key, state) -> (State, Info)``: one iteration.

``State`` and ``Info`` are named tuples of arrays; ``step`` keeps ``State``'s structure,
shapes and dtypes, so chains are ``jax.vmap`` over both functions and a run is a
``lax.scan`` of ``step``. The samplers that have it:

* :func:`jaxbnp.inference.partition.moves.algorithm`: any composed partition move
  (collapsed Gibbs, split-merge, tgMCMC's moves, a user's ``chain``);
* :func:`jaxbnp.inference.partition.subcluster.algorithm`: sub-cluster split/merge;
* :func:`jaxbnp.inference.partition.auxiliary.algorithm`: Neal's Algorithm 8 on the slots of
  a cluster plate, for any NumPyro likelihood (``AuxiliaryGibbs``);
* :func:`jaxbnp.inference.trees.mcmc.algorithm`: one diffusion-tree chain;
* :func:`jaxbnp.inference.trees.population.algorithm`: population MCMC over trees;
* :func:`jaxbnp.inference.bhmc.sweep.algorithm`: BHMC's Algorithm 2;
* :func:`jaxbnp.inference.sharded.algorithm`: the data-parallel collapsed-Gibbs sweep over a
  device mesh (approximate with more than one device).

The NumPyro kernels are thin wrappers for users of ``numpyro.infer.MCMC`` and
``numpyro.infer.Gibbs``: at each step they read the model's current values (data,
measure, family, hyperparameters that NUTS may have moved), build the sampler's
algorithm with them (free under tracing: a closure) and take its ``step``. The partition
kernels (``CollapsedGibbs``, ``SplitMerge``, ``TreeGuidedMCMC``, ``SubClusterMCMC``,
``PartitionKernel``) through :func:`~jaxbnp.inference.partition.moves.algorithm`,
``AuxiliaryGibbs`` through :func:`~jaxbnp.inference.partition.auxiliary.algorithm`,
``DiffusionTreeMCMC`` and ``PopulationDDT``'s within-chain sweeps through
:func:`~jaxbnp.inference.trees.mcmc.algorithm`, ``BHMCKernel`` through
:func:`~jaxbnp.inference.bhmc.sweep.algorithm`; any other algorithm runs through
:class:`jaxbnp.inference.adapter.AlgorithmKernel`.

Two more things every sampler shares live here: :class:`Move` and its combinators
(:func:`chain`, :func:`repeat`, :func:`identity`; Optax's habits, generic over the state:
the partition moves and BHMC's sweep are chains of moves), and :func:`run_chains`, the one
place where a kernel batches its chains inside a program.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
from jax import lax

from .._validation import check_int

__all__ = ["SamplingAlgorithm", "run_steps", "run_chains", "CHAIN_BATCHING", "Move", "EmptyState",
           "no_state", "chain", "repeat", "identity"]


class SamplingAlgorithm(NamedTuple):
    """``init(key, *position) -> State`` and ``step(key, state) -> (State, Info)`` (module
    docstring)."""

    init: Callable[..., Any]
    step: Callable[[jax.Array, Any], tuple[Any, Any]]


def run_steps(algorithm: SamplingAlgorithm, key: jax.Array, state: Any, num_steps: int):
    """``num_steps`` iterations of ``algorithm.step`` from ``state`` in one ``lax.scan``
    (keys ``jax.random.split(key, num_steps)``): ``(last_state, infos)``, every leaf of
    ``infos`` with a leading axis ``num_steps``."""
    return jax.lax.scan(lambda s, k: algorithm.step(k, s), state, jax.random.split(key, num_steps))


#: how a kernel batches its chains inside one program (:func:`run_chains`)
CHAIN_BATCHING = ("auto", "vmap", "map")


def run_chains(fn: Callable, *args, in_axes, how: str = "auto"):
    """``fn`` on every chain of a batch (leading axis of the arguments whose ``in_axes`` is
    ``0``): ``jax.vmap`` (``how="vmap"``) or one chain after another in one program
    (``lax.map``, ``how="map"``); ``"auto"`` picks ``map`` on CPU and ``vmap`` on an
    accelerator. The draws are the same either way (to the last bit of a float, which the
    batched and one-chain programs may round differently).

    The one place where a kernel's chains are batched inside a program: every NumPyro kernel
    calls it for NumPyro's ``chain_method="vectorized"`` (its ``init`` and ``sample`` get the
    chains on a leading axis), and :func:`jaxbnp.inference.runner.run` decides everything
    across programs (devices, threads). Each kernel says which ``how`` it uses.

    Why ``map`` on CPU: a sweep's moves are walks (``while`` loops whose length differs from
    chain to chain: root paths of a diffusion tree, rejection loops). One chain's walk
    compiles on XLA:CPU into a tight loop; the batched walk runs every step through XLA's
    runtime: at 512 points 4 vmapped diffusion-tree chains took 1.6 times as long as the same
    4 chains one after another, 64 took 2.1 times (docs/benchmarks.md, diffusion trees). At a
    few dozen points vmap wins from about 16 chains on; ``how="vmap"`` picks it. An
    accelerator needs the batch.
    """
    if how not in CHAIN_BATCHING:
        raise ValueError(f"chain_batching must be one of {CHAIN_BATCHING}, got {how!r}.")
    if how == "auto":
        how = "map" if jax.default_backend() == "cpu" else "vmap"
    if how == "vmap":
        return jax.vmap(fn, in_axes=in_axes)(*args)
    mapped = tuple(a for a, ax in zip(args, in_axes) if ax is not None)
    fixed = {i: a for i, (a, ax) in enumerate(zip(args, in_axes)) if ax is None}

    def one(xs):
        it = iter(xs)
        return fn(*(fixed[i] if i in fixed else next(it) for i in range(len(args))))

    return lax.map(one, mapped)


# ----------------------------------------------------------------------------- composable moves
class Move(NamedTuple):
    """A composable move (Optax style), generic over the state it moves: a partition
    (:mod:`jaxbnp.inference.partition.moves`), BHMC's trees (:mod:`jaxbnp.inference.bhmc.sweep`).

    * ``init(state, ctx) -> move_state``: the move's own state (:class:`EmptyState` if none);
    * ``step(key, state, move_state, ctx) -> (state, move_state, info)``: one application;
      ``ctx`` holds what the move reads but does not change (data, model, settings).
      A move with ``num_keys > 1`` receives an array of that many keys.
    """

    init: Callable[[Any, Any], Any]
    step: Callable[[jax.Array, Any, Any, Any], tuple[Any, Any, Any]]
    num_keys: int = 1


class EmptyState(NamedTuple):
    """The state of a move that keeps none (Optax's ``EmptyState``)."""


def no_state(state: Any, ctx: Any) -> EmptyState:
    """``Move.init`` of a move that keeps no state."""
    return EmptyState()


def chain(*moves: Move, keys: Callable[[jax.Array], Sequence[Any]] | None = None) -> Move:
    """The moves one after another: state the tuple of the moves' states, info the tuple of
    their infos. The key is split into ``sum(num_keys)`` keys, handed out in order; or
    ``keys(key)`` gives each move its key (one entry per move: a key, or an array of
    ``num_keys`` keys), for a schedule of its own."""
    moves = tuple(moves)
    if not moves:
        raise ValueError("chain needs at least one move.")
    total = sum(int(m.num_keys) for m in moves)

    def init_fn(state, ctx):
        return tuple(m.init(state, ctx) for m in moves)

    def per_move(key):
        if keys is not None:
            given = tuple(keys(key))
            if len(given) != len(moves):
                raise ValueError(f"chain's keys(key) gave {len(given)} entries for {len(moves)} moves.")
            return given
        split, start, out = jax.random.split(key, total), 0, []
        for m in moves:
            out.append(split[start] if m.num_keys == 1 else split[start:start + m.num_keys])
            start += m.num_keys
        return tuple(out)

    def step_fn(key, state, move_state, ctx):
        new_states, infos = [], []
        for m, ms, k in zip(moves, move_state, per_move(key)):
            state, ms, info = m.step(k, state, ms, ctx)
            new_states.append(ms)
            infos.append(info)
        return state, tuple(new_states), tuple(infos)

    return Move(init_fn, step_fn)


def repeat(move: Move, n: int) -> Move:
    """``move`` applied ``n`` times (keys ``jax.random.split(key, n)``, a ``fori_loop``),
    infos summed; ``n = 0`` is the identity (its info zeros). Takes one key."""
    n = check_int("n", n)

    def keys_of(k):
        return k if move.num_keys == 1 else jax.random.split(k, move.num_keys)

    def step_fn(key, state, move_state, ctx):
        shape = jax.eval_shape(lambda k, s, ms: move.step(keys_of(k), s, ms, ctx)[2], key, state, move_state)
        zeros = jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype), shape)
        if n == 0:
            return state, move_state, zeros
        keys = jax.random.split(key, n)

        def body(t, carry):
            s, ms, total = carry
            s, ms, info = move.step(keys_of(keys[t]), s, ms, ctx)
            return s, ms, jax.tree.map(lambda a, b: a + b, total, info)

        return lax.fori_loop(0, n, body, (state, move_state, zeros))

    return Move(move.init, step_fn)


def identity(num_keys: int = 1) -> Move:
    """A move that changes nothing and takes ``num_keys`` key slots (keeps a schedule's keys)."""
    return Move(no_state, lambda key, state, move_state, ctx: (state, move_state, ()), int(num_keys))
