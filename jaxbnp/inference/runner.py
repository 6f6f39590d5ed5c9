"""The one driver of every jaxbnp sampler: warm-up, draws, progress, capacity growth.

:func:`run` takes a NumPyro ``MCMCKernel`` (a jaxbnp kernel, or any kernel
whose ``init``/``sample`` follow NumPyro's protocol) and does what
``numpyro.infer.MCMC(kernel, num_warmup=W, num_samples=N * thinning,
thinning=thinning, num_chains=C, chain_method="vectorized").run(key, *args)``
does: the same key splitting, the same kernel calls, the same kept iterations,
so the draws are the same. Unlike ``MCMC`` it keeps its compiled programs
between calls with the same settings (``MCMC`` traces its loop again on every
``run``), cuts the iterations into compiled blocks to report progress, and
grows a full cluster capacity: a kernel built with ``capacity`` slots that ran
out (it raised :class:`~jaxbnp.errors.CapacityError`, or its ``overflowed``
method says so of the last state) is rebuilt with twice as many and the run
starts again from the same key. Nothing is truncated.

The estimators (:class:`~jaxbnp.estimators.DirichletProcessMixture`), the
``jaxbnp`` command line and the ``fit_*`` functions all sample through it and
get a :class:`RunResult`.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .._progress import bar as progress_bar_context
from .._progress import resolve as resolve_progress
from ..errors import CapacityError

__all__ = ["RunResult", "run", "PROGRESS_BLOCKS"]

#: compiled blocks a run is cut into when it reports progress
PROGRESS_BLOCKS = 50


class RunResult(NamedTuple):
    """What :func:`run` returns.

    samples: ``collect(state)`` at every kept iteration, each leaf grouped by chain,
        ``(num_chains, num_samples, ...)`` (NumPy arrays on the host).
    last_state: the kernel's state after the last iteration (chains on the leading axis
        when ``num_chains > 1``).
    capacity: the capacity the kept run used (``None`` for kernels without one).
    seconds: wall-clock seconds of the kept run, compilation included.
    """

    samples: dict
    last_state: Any
    capacity: int | None
    seconds: float


def _compile(kernel, collect, compiler_options, num_chains, num_warmup, num_samples, thinning, chunk):
    """``(start, advance)`` programs for one kernel and one set of settings."""
    total = num_warmup + num_samples * thinning
    ragged = total % chunk != 0

    def start(key, init_params, model_args, model_kwargs):
        keys = jax.random.split(key, num_chains) if num_chains > 1 else key
        state = kernel.init(keys, num_warmup, init_params, model_args, model_kwargs)
        buffers = jax.tree.map(
            lambda a: jnp.zeros((num_samples,) + jnp.shape(a), jnp.result_type(a)), collect(state)
        )
        return state, buffers

    def advance(carry, first, model_args, model_kwargs):
        def body(i, carry):
            s, buf = carry
            s = kernel.sample(s, model_args, model_kwargs)
            j = i - num_warmup
            # NumPyro's fori_collect keeps the last iteration of each block of `thinning`
            keep = (j >= 0) & (j % thinning == thinning - 1)
            idx = jnp.clip(j // thinning, 0, num_samples - 1)
            buf = jax.tree.map(lambda b, v: b.at[idx].set(jnp.where(keep, v, b[idx])), buf, collect(s))
            return s, buf

        def step(k, carry):
            i = first + k
            if not ragged:
                return body(i, carry)
            return jax.lax.cond(i < total, lambda c: body(i, c), lambda c: c, carry)

        return jax.lax.fori_loop(0, chunk, step, carry)

    opts = {} if compiler_options is None else {"compiler_options": dict(compiler_options)}
    return jax.jit(start, **opts), jax.jit(advance, **opts)


_PROGRAMS: "OrderedDict[Any, tuple]" = OrderedDict()  # most recently used last
_MAX_PROGRAMS = 16


def _programs(make_kernel, capacity, cache_key, collect, compiler_options, settings):
    options_key = tuple(sorted((compiler_options or {}).items()))
    key = None if cache_key is None else (cache_key, capacity, collect, options_key, settings)
    if key is not None and key in _PROGRAMS:
        _PROGRAMS.move_to_end(key)
        return _PROGRAMS[key]
    kernel = make_kernel(capacity)
    if hasattr(kernel, "host_overflow_check"):
        # the overflow flag stays in the state and is checked after the last block: no
        # host callback in the programs, so JAX's persistent compilation cache keeps them
        kernel.host_overflow_check = False
    programs = (kernel, *_compile(kernel, collect, compiler_options, *settings))
    if key is not None:
        _PROGRAMS[key] = programs
        while len(_PROGRAMS) > _MAX_PROGRAMS:
            _PROGRAMS.popitem(last=False)
    return programs


def run(
    make_kernel: Callable[[int | None], Any],
    key: jax.Array,
    model_args: tuple = (),
    model_kwargs: dict | None = None,
    *,
    num_warmup: int,
    num_samples: int,
    num_chains: int = 1,
    thinning: int = 1,
    collect: Callable[[Any], dict],
    init_params: dict | None = None,
    capacity: int | None = None,
    max_capacity: int | None = None,
    progress_bar: bool | None = False,
    description: str = "sampling",
    heartbeat: Any = None,
    cache_key: Any = None,
    compiler_options: dict | None = None,
) -> RunResult:
    """Run ``num_chains`` chains of the kernel ``make_kernel(capacity)`` (module docstring).

    :param make_kernel: builds the kernel for a capacity (called again with a larger
        one when the capacity runs out; the argument is ``None`` when ``capacity`` is).
    :param key: the run's key; chains get ``jax.random.split(key, num_chains)`` as in
        ``numpyro.infer.MCMC``.
    :param collect: what to keep of a state at each kept iteration, a dict of arrays;
        a module-level function, so that compiled programs can be reused.
    :param init_params: passed to ``kernel.init`` (leading chain axis when
        ``num_chains > 1``).
    :param capacity: the first capacity to try.
    :param max_capacity: the largest capacity to try (``CapacityError`` when even
        that runs out).
    :param progress_bar: ``True``/``False``, or ``None`` for a bar only on a terminal
        outside CI (``jaxbnp._progress.resolve``).
    :param heartbeat: an object with ``tick(n)`` (``jaxbnp._progress.Heartbeat``),
        advanced after every compiled block.
    :param cache_key: a hashable description of the kernel's settings; programs with
        the same ``cache_key``, capacity and settings are compiled once per process.
        ``None`` compiles afresh.
    :param compiler_options: XLA options for the compiled programs (``jax.jit``'s).
    """
    model_kwargs = dict(model_kwargs or {})
    num_warmup, num_samples, num_chains, thinning = (
        int(num_warmup), int(num_samples), int(num_chains), int(thinning))
    show = resolve_progress(progress_bar)
    total = num_warmup + num_samples * thinning
    blocks = show or heartbeat is not None
    chunk = max(1, -(-total // PROGRESS_BLOCKS)) if blocks else max(total, 1)
    settings = (num_chains, num_warmup, num_samples, thinning, chunk)
    while True:
        t0 = time.perf_counter()
        kernel, start, advance = _programs(make_kernel, capacity, cache_key, collect, compiler_options, settings)
        try:
            label = description if capacity is None else f"{description} (capacity {capacity})"
            with progress_bar_context(total, label, show) as bar:
                carry = start(key, init_params, model_args, model_kwargs)
                for first in range(0, total, chunk):
                    carry = advance(carry, first, model_args, model_kwargs)
                    if blocks:
                        jax.block_until_ready(carry)
                        done = min(chunk, total - first)
                        if not bar.disable:
                            bar.update(done)
                        if heartbeat is not None:
                            heartbeat.tick(done)
                state, buffers = carry
                overflowed = getattr(kernel, "overflowed", None)
                if overflowed is not None and overflowed(state):
                    raise CapacityError(
                        f"all {capacity} cluster slots are in use; the run is discarded")
                samples = jax.device_get(buffers)
            break
        except CapacityError:
            if capacity is None or (max_capacity is not None and capacity >= max_capacity):
                raise
            capacity = 2 * capacity if max_capacity is None else min(2 * capacity, max_capacity)
    seconds = time.perf_counter() - t0

    def by_chain(a):
        a = np.asarray(a)
        return np.swapaxes(a, 0, 1) if num_chains > 1 else a[None]

    return RunResult(jax.tree.map(by_chain, samples), state, capacity, seconds)
