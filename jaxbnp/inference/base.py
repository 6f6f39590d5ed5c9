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
* :func:`jaxbnp.inference.trees.mcmc.algorithm`: one diffusion-tree chain;
* :func:`jaxbnp.inference.trees.population.algorithm`: population MCMC over trees;
* :func:`jaxbnp.inference.bhmc.sweep.algorithm`: BHMC's Algorithm 2.

The NumPyro kernels are thin wrappers for users of ``numpyro.infer.MCMC`` and
``numpyro.infer.Gibbs``: at each step they read the model's current values (data,
measure, family, hyperparameters that NUTS may have moved), build the sampler's
algorithm with them (free under tracing: a closure) and take its ``step``. The partition
kernels (``CollapsedGibbs``, ``SplitMerge``, ``TreeGuidedMCMC``, ``SubClusterMCMC``,
``PartitionKernel``) through :func:`~jaxbnp.inference.partition.moves.algorithm`,
``DiffusionTreeMCMC`` and ``PopulationDDT``'s within-chain sweeps through
:func:`~jaxbnp.inference.trees.mcmc.algorithm`, ``BHMCKernel`` through
:func:`~jaxbnp.inference.bhmc.sweep.algorithm`.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax

__all__ = ["SamplingAlgorithm", "run_steps"]


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
