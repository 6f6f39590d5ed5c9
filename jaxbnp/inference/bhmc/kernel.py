"""The NumPyro kernel over BHMC's pure ``init``/``step`` (:class:`BHMCKernel`)."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from numpyro.infer.mcmc import MCMCKernel
from numpyro.util import is_prng_key

from ..._xla import mark_loop_program
from ..._cache import auto_enable
from ..._programs import call_cached
from ..._random import typed_key
from ..adapter import is_traced, numpyro_reads_every_step, step_checks_overflow
from ..base import run_chains
from ..partition.clusters import raise_capacity_error_if, raise_capacity_error_on_host
from .model import (
    BHMCConfig,
    BHMCInfo,
    BHMCState,
)
from .start import (
    init,
    init_from,
)
from .sweep import (
    algorithm,
)


class BHMCKernelState(NamedTuple):
    """State of :class:`BHMCKernel` (one chain, or chains on the leading axis).

    sample: the chain's :class:`BHMCState`. info: the :class:`BHMCInfo` of the
    last step (no moves after ``init``). best: the state with the highest
    ``log_lik`` among the post-warm-up iterations so far (``log_lik = −inf``
    before the first). rng_key: the chain's run key ``k_run``. chain: ``()``
    int32, the chain's index in its run. iteration: ``()`` int32, steps done.
    num_warmup: ``()`` int32. Step ``i`` uses the key
    ``fold_in(fold_in(rng_key, i), chain)``. overflow_on_host: ``()`` when ``CapacityError``
    is raised on the host by ``get_diagnostics_str`` (NumPyro's progress bar), else
    ``None`` (a callback in the step), as in
    :class:`~jaxbnp.inference.partition.kernels.PartitionKernelState`.
    """

    sample: BHMCState
    info: BHMCInfo
    best: BHMCState
    rng_key: jax.Array
    chain: jax.Array
    iteration: jax.Array
    num_warmup: jax.Array
    overflow_on_host: tuple | None = None


class BHMCKernel(MCMCKernel):
    """NumPyro ``MCMCKernel`` over the pure :func:`init` and :func:`step` (docs/mathematics.md §6).

    :param config: the static settings, a :class:`BHMCConfig`.

    ``model_args = (X, model, hyper)``: the data ``(N, D)``, the model
    constants (:func:`make_model`) and the starting ``α, γ0, γ``
    (:class:`BHMCHyper`); ``model_kwargs`` are not used.

    Keys: chain ``chain`` of the run keyed ``key`` starts from
    ``init(fold_in(k_init, chain), ...)`` and takes step ``i`` with
    ``fold_in(fold_in(k_run, i), chain)``, where ``k_init, k_run = split(key)``.
    By default ``key`` is the ``rng_key`` passed to :meth:`init` and ``chain``
    is ``0``; ``init_params={"rng_key": key, "chain": c}`` (a leading chain axis
    on both when chains are batched) sets them, so that chains ``0..C−1`` with
    the same ``key`` are the chains of :func:`fit_bhmc`. ``init_params["start"] = (paths, c)``
    (a leading chain axis on both when chains are batched) starts the chains from those
    paths and components (:func:`init_from`; e.g.
    :func:`ward_start`) instead of a draw from the prior (:func:`init`). A batch of keys (what
    ``MCMC(..., chain_method="vectorized")`` and
    :func:`jaxbnp.inference.runner.run` pass) initialises the chains under
    ``jax.vmap`` and steps them one after another (``lax.map``: under ``vmap``
    every ``lax.cond`` of the sweep would run both branches).

    A chain whose state has overflowed (a slot was needed while all were used)
    stops moving and raises :class:`~jaxbnp.errors.CapacityError` at once: on the host
    from ``get_diagnostics_str`` where NumPyro's progress bar reads every step (one chain
    at a time), else through a host callback in the step. With the attribute
    ``host_overflow_check = False`` (what :func:`jaxbnp.inference.runner.run` sets, for
    :func:`fit_bhmc`, which grows the node slots) nothing is raised, and
    :meth:`overflowed` says so of a state: the run must be discarded.
    Everything a step needs is in the state or the arguments.
    """

    sample_field = "sample"
    #: the chains are independent and keep no host-side state: :func:`jaxbnp.inference.runner.run`
    #: may cut them into groups run from threads (``chain_method="threads"``), the same draws
    chains_in_threads = True
    #: raise ``CapacityError`` when a chain runs out of slots (class docstring)
    host_overflow_check = True

    def __init__(self, config: BHMCConfig):
        if not isinstance(config, BHMCConfig):
            raise TypeError(f"BHMCKernel(config): config must be a BHMCConfig, got {type(config).__name__}.")
        self.config = config

    def init(self, rng_key, num_warmup, init_params, model_args, model_kwargs):
        # where an overflow is raised (NumPyro's progress bar, or a callback in the step)
        on_host = self.host_overflow_check and numpyro_reads_every_step(self, rng_key)
        X, model, hyper = model_args
        params = dict(init_params or {})
        rng_key = typed_key(rng_key)  # jax.random.PRNGKey or jax.random.key: the same draws
        auto_enable()  # JAX's persistent compilation cache (jaxbnp.enable_compilation_cache)
        batched = not is_prng_key(rng_key)
        run_key = typed_key(params.get("rng_key", rng_key))
        chain = params.get("chain", jnp.zeros(jnp.shape(rng_key)[:1] if batched else (), jnp.int32))
        start = params.get("start")
        config = self.config

        def init_one(key, chain, start, X, model, hyper):
            k_init, k_run = jax.random.split(key)
            k = jax.random.fold_in(k_init, chain)
            if start is None:
                state = init(k, X, hyper, model, config)
            else:
                state = init_from(k, X, start[0], start[1], hyper, model, config)
            best = state._replace(log_lik=jnp.asarray(-jnp.inf, state.log_lik.dtype))
            return BHMCKernelState(state, no_moves(X.shape[0]), best, k_run, jnp.asarray(chain, jnp.int32),
                                   jnp.zeros((), jnp.int32), jnp.asarray(num_warmup, jnp.int32))

        def program(key, chain, start, args, kwargs):
            X, model, hyper = args
            if batched:
                return run_chains(init_one, key, chain, start, X, model, hyper,
                                  in_axes=(0, 0, 0, None, None, None), how="vmap")
            return init_one(key, chain, start, X, model, hyper)

        # one compiled program, kept on the kernel: a second MCMC.run of the same shape
        # compiles nothing
        static = (config, batched, num_warmup)
        state = call_cached(self, "init", static, program, run_key, chain, start,
                            model_args=model_args, model_kwargs=model_kwargs)
        if not is_traced(state):  # a traced start (parallel chains): the first step raises
            self._raise_on_overflow(state, on_host=True)
        return state._replace(overflow_on_host=() if on_host else None)

    def sample(self, state, model_args, model_kwargs):
        X, model, hyper = model_args
        core = algorithm(X, hyper, model, self.config)  # the pure core, this run's values
        if jnp.ndim(state.iteration) == 0:
            new = self._sample_one(state, X, core)
        else:
            new = run_chains(self._sample_one, state, X, core, in_axes=(0, None, None), how="map")
        # NumPyro's progress bar reads every step's state on the host: get_diagnostics_str
        # raises there, and the program holds no callback (JAX's persistent cache keeps it)
        if step_checks_overflow(self, state):
            self._raise_on_overflow(new)
        return new._replace(overflow_on_host=state.overflow_on_host,
                            iteration=mark_loop_program(new.iteration))

    def _raise_on_overflow(self, state: BHMCKernelState, on_host: bool = False) -> None:
        """``CapacityError`` if a chain of ``state`` ran out of slots (unless the runner turned
        the check off): at once on the host (``on_host``), or through a host callback."""
        if not self.host_overflow_check:
            return
        config = self.config
        reason = ("a BHMC move needed a node or component slot while all were in use "
                  f"(node_capacity={config.node_capacity}, component_capacity={config.component_capacity}).")
        hint = "Pass a larger node_capacity or component_capacity in the BHMCConfig"
        flag = state.sample.overflow if on_host else jnp.any(state.sample.overflow)
        (raise_capacity_error_on_host if on_host else raise_capacity_error_if)(
            flag, config.node_capacity, hint, reason)

    def _sample_one(self, ks: BHMCKernelState, X, core) -> BHMCKernelState:
        key = jax.random.fold_in(jax.random.fold_in(ks.rng_key, ks.iteration), ks.chain)
        sample, info = lax.cond(
            ks.sample.overflow,
            lambda s: (s, no_moves(X.shape[0])),
            lambda s: core.step(key, s),
            ks.sample)
        better = (ks.iteration >= ks.num_warmup) & (sample.log_lik > ks.best.log_lik)
        best = jax.tree.map(lambda a, b: jnp.where(better, a, b), sample, ks.best)
        return ks._replace(sample=sample, info=info, best=best, iteration=ks.iteration + 1)

    def overflowed(self, state: BHMCKernelState) -> bool:
        """Whether a chain of ``state`` ran out of node or component slots (host side)."""
        return bool(np.any(np.asarray(state.sample.overflow)))

    def get_diagnostics_str(self, state: BHMCKernelState) -> str:
        """The progress bar's text; first, ``CapacityError`` if a chain ran out of slots (when
        NumPyro's progress bar calls this after every step, the step itself does not check)."""
        self._raise_on_overflow(state, on_host=True)
        rate = np.asarray(state.info.num_accepted) / np.maximum(np.asarray(state.info.num_proposed), 1)
        return f"path acceptance {float(np.mean(rate)):.2f}"


class GrowingNodes(BHMCKernel):
    """:func:`fit_bhmc`'s kernel: tells the runner it overflowed only when the node slots
    ran out (so that the runner doubles them); running out of component slots is raised by
    :func:`fit_bhmc` itself, since more node slots would not help."""

    def overflowed(self, state: BHMCKernelState) -> bool:
        s = state.sample  # a step stops where it overflowed: fewer than L free node slots then
        live = np.sum(np.asarray(s.count) > 0, axis=-1)
        nodes_full = live > self.config.node_capacity - 1 - self.config.depth
        return bool(np.any(np.asarray(s.overflow) & nodes_full))


def no_moves(n: int) -> BHMCInfo:
    return BHMCInfo(jnp.zeros((), jnp.int32), jnp.asarray(n, jnp.int32), jnp.zeros(3, bool),
                    jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32))
