"""The one driver of every jaxbnp sampler: warm-up, draws, progress, checkpoints,
capacity growth.

:func:`run` takes a NumPyro ``MCMCKernel`` (a jaxbnp kernel, any kernel
whose ``init``/``sample`` follow NumPyro's protocol, or a pure core, a
:class:`~jaxbnp.inference.base.SamplingAlgorithm`, through
:class:`~jaxbnp.inference.adapter.AlgorithmKernel`) and does what
``numpyro.infer.MCMC(kernel, num_warmup=W, num_samples=N * thinning,
thinning=thinning, num_chains=C, chain_method=...).run(key, *args)``
does: the same key splitting, the same kernel calls, the same kept iterations,
so the draws are the same. Unlike ``MCMC`` it keeps its compiled programs
between calls with the same settings (``MCMC`` traces its loop again on every
``run``), cuts the iterations into compiled blocks to report progress (a tqdm
bar, or a :class:`~jaxbnp._progress.Heartbeat`), saves checkpoints and resumes
them (:mod:`jaxbnp.checkpoint`'s file format), and grows a full cluster
capacity: a kernel built with ``capacity`` slots that ran out (it raised
:class:`~jaxbnp.errors.CapacityError`, or its ``overflowed`` method says so of
the last state) is rebuilt with twice as many and the run starts again from
the same key. Nothing is truncated.

Chains run ``"vectorized"`` (one program, a leading chain axis in the state),
``"parallel"`` (``jax.pmap``: one chain per device, e.g. per CPU core with
``numpyro.set_host_device_count``) or ``"threads"`` (on a CPU: the chains cut into
one group per core, each group a vectorized program run from its own thread; XLA
runs the programs side by side). ``"auto"`` (the default) takes ``"parallel"`` when
there is a device per chain, else ``"threads"`` on a CPU with several cores, else
``"vectorized"``, for kernels that declare ``chains_in_threads`` (the partition
kernels and BHMC's); others run ``"vectorized"``. All give the same draws.

``"threads"`` runs the groups side by side only when their compiled program calls no
library kernel (an XLA custom call, such as LAPACK's Cholesky or triangular solve):
jaxlib's CPU kernels of that kind split a batch over XLA's intra-op thread pool and
wait for the pieces inside a pool thread, so two programs each holding a thread of a
two-thread pool both wait for ever (seen: ``DirichletProcessMixture`` with two chains
and a ``NormalWishart`` family hung in ``TriMatrixEquationSolver`` on a 2-core CPU).
Such programs run their groups one after another from the calling thread.

The estimators (:class:`~jaxbnp.estimators.DirichletProcessMixture`), the
``jaxbnp`` command line and the ``fit_*`` functions all sample through it and
get a :class:`RunResult`.
"""

from __future__ import annotations

import os
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .._progress import bar as progress_bar_context
from .._progress import resolve as resolve_progress
from ..checkpoint import CheckpointedRun, check_resumable, load_checkpoint, save_checkpoint
from .._random import typed_key
from ..errors import CapacityError

__all__ = ["RunResult", "run", "PROGRESS_BLOCKS", "CHAIN_METHODS"]

#: compiled blocks a run is cut into when it reports progress
PROGRESS_BLOCKS = 50

#: how chains run: in one batched program, one per device, or one batched program per
#: CPU core run from threads (the same draws); "auto" picks one (module docstring)
CHAIN_METHODS = ("auto", "vectorized", "parallel", "threads")


def cpu_cores() -> int:
    """The CPU cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def resolve_chain_method(chain_method: str, num_chains: int) -> str:
    """The chain method :func:`run` uses for ``chain_method`` (module docstring)."""
    if chain_method not in CHAIN_METHODS:
        raise ValueError(f"chain_method must be one of {CHAIN_METHODS}, got {chain_method!r}.")
    if num_chains < 2:
        return "vectorized"
    if chain_method == "auto":
        if num_chains <= jax.local_device_count():
            return "parallel"
        chain_method = "threads"
    if chain_method == "parallel" and num_chains > jax.local_device_count():
        return "vectorized"  # the same draws
    if chain_method == "threads" and (jax.default_backend() != "cpu" or cpu_cores() < 2):
        return "vectorized"
    return chain_method


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


def _compile(kernel, collect, compiler_options, chain_method, num_chains, num_warmup, num_samples,
             thinning):
    """``(start, resume, advance)`` programs for one kernel and one set of settings.

    ``start`` initialises the chains, ``resume`` sets the kernel up (as NumPyro does for a
    ``post_warmup_state``) and starts from a saved state, ``advance(carry, first, count)``
    runs iterations ``first .. first + count - 1`` and keeps the draws among them.
    """
    parallel = chain_method == "parallel"

    def buffers_for(state):
        return jax.tree.map(
            lambda a: jnp.zeros((num_samples,) + jnp.shape(a), jnp.result_type(a)), collect(state))

    def start(key, init_params, model_args, model_kwargs):
        state = kernel.init(key, num_warmup, init_params, model_args, model_kwargs)
        return state, buffers_for(state)

    def resume(state, model_args, model_kwargs):
        kernel.init(state.rng_key, num_warmup, None, model_args, model_kwargs)
        return state, buffers_for(state)

    def advance(carry, first, count, model_args, model_kwargs):
        def body(i, carry):
            s, buf = carry
            s = kernel.sample(s, model_args, model_kwargs)
            j = i - num_warmup
            # NumPyro's fori_collect keeps the last iteration of each block of `thinning`
            keep = (j >= 0) & (j % thinning == thinning - 1)
            idx = jnp.clip(j // thinning, 0, num_samples - 1)
            buf = jax.tree.map(lambda b, v: b.at[idx].set(jnp.where(keep, v, b[idx])), buf, collect(s))
            return s, buf

        return jax.lax.fori_loop(first, first + count, body, carry)

    opts = {} if compiler_options is None else {"compiler_options": dict(compiler_options)}
    if parallel:  # one chain per device; model arguments and loop bounds are broadcast
        # (pmap takes no compiler options: a jit around it carries them to XLA)
        wrap = (lambda f: jax.jit(f, **opts)) if opts else (lambda f: f)
        return (wrap(jax.pmap(start, in_axes=(0, 0, None, None))),
                wrap(jax.pmap(resume, in_axes=(0, None, None))),
                wrap(jax.pmap(advance, in_axes=(0, None, None, None, None))))
    # vectorized: the kernel batches the chains itself, from the keys' leading axis
    return jax.jit(start, **opts), jax.jit(resume, **opts), jax.jit(advance, **opts)


_PROGRAMS: "OrderedDict[Any, tuple]" = OrderedDict()  # most recently used last
_COMPILED: "OrderedDict[Any, Any]" = OrderedDict()  # chain_method="threads": compiled programs
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


def _by_chain(tree, num_chains, chain_method):
    """Leaves ``(num_samples, C, ...)`` (vectorized) or ``(C, num_samples, ...)`` (parallel)
    as host arrays ``(C, num_samples, ...)``."""
    def one(a):
        a = np.asarray(a)
        if chain_method == "parallel":
            return a
        return np.swapaxes(a, 0, 1) if num_chains > 1 else a[None]

    return jax.tree.map(one, jax.device_get(tree))


def _split(samples, extra_fields):
    """A checkpoint's ``(samples, extra_fields)``: ``collect``'s entries split by name."""
    if samples is None:
        return None, None
    return ({k: v for k, v in samples.items() if k not in extra_fields},
            {k: v for k, v in samples.items() if k in extra_fields})


def _joined(saved: CheckpointedRun | None, new):
    """The saved run's draws (samples and extra fields) followed by ``new``."""
    if saved is None or saved.samples is None:
        return new
    old = {**saved.samples, **(saved.extra_fields or {})}
    return {k: np.concatenate([np.asarray(old[k]), v], axis=1) for k, v in new.items()}


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
    chain_method: str = "auto",
    progress_bar: bool | None = False,
    description: str = "sampling",
    heartbeat: Any = None,
    cache_key: Any = None,
    compiler_options: dict | None = None,
    checkpoint: str | Path | None = None,
    checkpoint_every: int = 0,
    resume: bool = False,
    extra_fields: tuple = (),
    on_restart: Callable[[int], None] | None = None,
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
    :param chain_method: ``"auto"``, ``"vectorized"``, ``"parallel"`` (one chain per
        device, ``jax.pmap``; vectorized when there are fewer devices than chains) or
        ``"threads"`` (one group of chains per CPU core; vectorized for kernels that do
        not declare ``chains_in_threads``, and when ``checkpoint`` is set). The same draws
        whichever runs (module docstring).
    :param progress_bar: ``True``/``False``, or ``None`` for a bar only on a terminal
        outside CI (``jaxbnp._progress.resolve``).
    :param heartbeat: an object with ``tick(n)`` (``jaxbnp._progress.Heartbeat``),
        advanced after every compiled block (its ``count`` is reset when the run
        restarts with a larger capacity).
    :param cache_key: a hashable description of the kernel's settings; programs with
        the same ``cache_key``, capacity and settings are compiled once per process.
        ``None`` compiles afresh.
    :param compiler_options: XLA options for the compiled programs (``jax.jit``'s).
    :param checkpoint: a file (:mod:`jaxbnp.checkpoint`'s format, readable by
        :func:`~jaxbnp.checkpoint.load_checkpoint`) written atomically after the
        warm-up, after every ``checkpoint_every`` draws and at the end; ``None``: none.
        Its ``samples`` are ``collect``'s entries other than ``extra_fields``.
    :param resume: continue the run saved in ``checkpoint`` with ``num_samples`` more
        draws per chain (no warm-up; the capacity must be the saved state's). The
        result holds the saved draws and the new ones, equal to those of one
        uninterrupted run.
    :param on_restart: called with the new capacity before a run that ran out of
        cluster slots starts again.
    """
    model_kwargs = dict(model_kwargs or {})
    num_warmup, num_samples, num_chains, thinning = (
        int(num_warmup), int(num_samples), int(num_chains), int(thinning))
    if resume and checkpoint is None:
        raise ValueError("resume=True needs the checkpoint file to continue.")
    chain_method = _chain_method(make_kernel, capacity, chain_method, num_chains, checkpoint)
    saved = load_checkpoint(checkpoint) if resume else None
    if saved is not None:
        check_resumable(saved, num_chains, thinning)
        num_warmup = 0
    show = resolve_progress(progress_bar)
    blocks = _blocks(num_warmup, num_samples, thinning, show or heartbeat is not None,
                     checkpoint, int(checkpoint_every or 0), saved is None)
    settings = _Settings(chain_method, num_chains, num_warmup, num_samples, thinning, collect,
                         cache_key, compiler_options, checkpoint, extra_fields, description, show,
                         heartbeat)
    key = typed_key(key)  # jax.random.PRNGKey or jax.random.key: the same draws
    while True:
        t0 = time.perf_counter()
        try:
            samples, state = _attempt(make_kernel, capacity, key, model_args, model_kwargs,
                                      init_params, saved, blocks, settings)
            break
        except CapacityError:
            grown = _grown(capacity, max_capacity, saved)
            if grown is None:
                raise
            capacity = grown
            if heartbeat is not None and hasattr(heartbeat, "count"):
                heartbeat.count = 0
            if on_restart is not None:
                on_restart(capacity)
    seconds = time.perf_counter() - t0
    return RunResult(_joined(saved, samples), state, capacity, seconds)


class _Settings(NamedTuple):
    """What one attempt of :func:`run` needs besides the capacity, the key and the data."""

    chain_method: str
    num_chains: int
    num_warmup: int
    num_samples: int
    thinning: int
    collect: Callable
    cache_key: Any
    compiler_options: dict | None
    checkpoint: Any
    extra_fields: tuple
    description: str
    show: bool
    heartbeat: Any


class _Blocks(NamedTuple):
    """The iterations cut into compiled blocks: ``bounds`` (``0 = b0 < b1 < ... = total``),
    after which iterations a checkpoint is written (``saves``), and whether each block is
    waited for (progress)."""

    bounds: list
    saves: set
    wait: bool
    total: int


def _chain_method(make_kernel, capacity, chain_method, num_chains, checkpoint) -> str:
    """The chain method a run uses: :func:`resolve_chain_method`'s, ``"vectorized"`` for
    kernels that do not declare ``chains_in_threads`` (they couple chains or keep host-side
    state) and for a checkpointed run (one program to save from); the same draws."""
    if chain_method in ("auto", "threads") and num_chains > 1 and not getattr(
            make_kernel(capacity), "chains_in_threads", False):
        chain_method = "vectorized"
    chain_method = resolve_chain_method(chain_method, num_chains)
    if chain_method == "threads" and checkpoint is not None:
        chain_method = "vectorized"
    return chain_method


def _blocks(num_warmup, num_samples, thinning, wait, checkpoint, checkpoint_every, fresh) -> _Blocks:
    """Where the run stops between compiled blocks: every ``1/PROGRESS_BLOCKS`` of it when
    progress is reported (``wait``), and where checkpoints are written (after the warm-up
    of a fresh run, every ``checkpoint_every`` draws, at the end)."""
    total = num_warmup + num_samples * thinning
    chunk = max(1, -(-total // PROGRESS_BLOCKS)) if wait else max(total, 1)
    stops = {total} | set(range(chunk, total, chunk))
    saves = set()
    if checkpoint is not None:
        saves = {total} | ({num_warmup} if fresh else set())
        if checkpoint_every:
            saves |= set(range(num_warmup + checkpoint_every * thinning, total,
                               checkpoint_every * thinning))
        stops |= saves
    return _Blocks([0, *sorted(b for b in stops if b > 0)], saves, wait, total)


def _grown(capacity, max_capacity, saved) -> int | None:
    """The next capacity after a run ran out of slots (doubled, at most ``max_capacity``);
    ``None`` when there is none (no capacity, the largest already, or a resumed run)."""
    if saved is not None or capacity is None or (max_capacity is not None and capacity >= max_capacity):
        return None
    return 2 * capacity if max_capacity is None else min(2 * capacity, max_capacity)


def _attempt(make_kernel, capacity, key, model_args, model_kwargs, init_params, saved,
             blocks: _Blocks, s: _Settings):
    """One run at one capacity: ``(samples by chain, last state)``; ``CapacityError`` when a
    chain ran out of slots (raised by the kernel, or its ``overflowed`` says so)."""
    if s.chain_method == "threads":
        threaded = _Threaded(make_kernel, capacity, s.cache_key, s.collect, s.compiler_options,
                             s.num_chains, s.num_warmup, s.num_samples, s.thinning)
        kernel, start, advance = threaded.kernel, threaded.start, threaded.advance
    else:
        settings = (s.chain_method, s.num_chains, s.num_warmup, s.num_samples, s.thinning)
        kernel, start, restart, advance = _programs(
            make_kernel, capacity, s.cache_key, s.collect, s.compiler_options, settings)
    label = s.description if capacity is None else f"{s.description} (capacity {capacity})"

    def save(carry, draws, buffers):
        _save(s.checkpoint, saved, buffers, carry[0], draws, s.num_samples, s.num_warmup,
              s.num_chains, s.thinning, s.extra_fields, s.chain_method)

    with progress_bar_context(blocks.total, label, s.show) as bar:
        if saved is not None:
            carry = restart(saved.last_state, model_args, model_kwargs)
        else:
            keys = jax.random.split(key, s.num_chains) if s.num_chains > 1 else key
            carry = start(keys, init_params, model_args, model_kwargs)
        if 0 in blocks.saves:
            save(carry, 0, None)
        for first, last in zip(blocks.bounds[:-1], blocks.bounds[1:]):
            carry = advance(carry, first, last - first, model_args, model_kwargs)
            if blocks.wait:
                jax.block_until_ready(carry)
                if not bar.disable:
                    bar.update(last - first)
                if s.heartbeat is not None:
                    s.heartbeat.tick(last - first)
            if last in blocks.saves:
                save(carry, max(0, (last - s.num_warmup) // s.thinning), carry[1])
        state, buffers = threaded.join(carry) if s.chain_method == "threads" else carry
        overflowed = getattr(kernel, "overflowed", None)
        if overflowed is not None and overflowed(state):
            raise CapacityError(f"all {capacity} cluster slots are in use; the run is discarded")
        return _by_chain(buffers, s.num_chains, s.chain_method), state


def calls_library_kernels(compiled) -> bool:
    """Whether a compiled program calls a library kernel (an XLA custom call: LAPACK's on a
    CPU), read off its optimised HLO."""
    try:
        text = compiled.as_text()
    except Exception:  # no text: assume the worst
        return True
    return text is None or "custom-call(" in text or "custom_call_target" in text


class _Threaded:
    """``chain_method="threads"``: the chains cut into one contiguous group per core, each
    group run by its own vectorized programs from a thread (module docstring). ``start``
    and ``advance`` take and return a list of per-group carries; ``join`` makes the
    vectorized carry of all the chains. Each group size is traced and compiled once, in
    the calling thread, before the threads run. :func:`run` uses it only for kernels that
    declare ``chains_in_threads``."""

    def __init__(self, make_kernel, capacity, cache_key, collect, compiler_options, num_chains,
                 num_warmup, num_samples, thinning):
        # groups of one size (one program to compile); a short last group is padded with
        # copies of its last chain, whose draws are dropped (chains do not interact)
        self.size = -(-num_chains // min(cpu_cores(), num_chains))
        self.groups = [(a, min(a + self.size, num_chains)) for a in range(0, num_chains, self.size)]
        settings = ("vectorized", self.size, num_warmup, num_samples, thinning)
        self.kernel, self._start, _, self._advance = _programs(
            make_kernel, capacity, cache_key, collect, compiler_options, settings)

    @staticmethod
    def _map(compiled, fn, per_group):
        program, side_by_side = compiled
        if not side_by_side:  # library kernels inside: one group after another (class docstring)
            return [jax.block_until_ready(fn(program, arg)) for arg in per_group]
        with ThreadPoolExecutor(len(per_group)) as pool:
            return list(pool.map(lambda arg: jax.block_until_ready(fn(program, arg)), per_group))

    @staticmethod
    def _compiled(program, args):
        """``(compiled program, whether groups may run it side by side)``: traced and
        compiled in the calling thread (tracing sets the kernel up: not thread-safe), once
        per process for each program and argument shapes."""
        leaves, treedef = jax.tree.flatten(args)
        sig = (program, treedef, tuple((jnp.shape(x), jnp.result_type(x)) for x in leaves))
        if sig not in _COMPILED:
            compiled = program.lower(*args).compile()
            _COMPILED[sig] = (compiled, not calls_library_kernels(compiled))
            while len(_COMPILED) > 4 * _MAX_PROGRAMS:
                _COMPILED.popitem(last=False)
        _COMPILED.move_to_end(sig)
        return _COMPILED[sig]

    def _part(self, tree, a, b):
        if tree is None:
            return None

        def one(x):
            x = x[a:b]
            pad = self.size - (b - a)
            if pad:
                x = jnp.concatenate([x, jnp.repeat(x[-1:], pad, axis=0)], 0)
            return x[0] if self.size == 1 else x

        return jax.tree.map(one, tree)

    def start(self, keys, init_params, model_args, model_kwargs):
        args = [(self._part(keys, a, b), self._part(init_params, a, b), model_args, model_kwargs)
                for a, b in self.groups]
        compiled = self._compiled(self._start, args[0])
        return self._map(compiled, lambda fn, arg: fn(*arg), args)

    def advance(self, carries, first, count, model_args, model_kwargs):
        compiled = self._compiled(self._advance, (carries[0], first, count, model_args, model_kwargs))
        return self._map(compiled, lambda fn, c: fn(c, first, count, model_args, model_kwargs),
                         carries)

    def join(self, carries):
        """The carry of all the chains (padding dropped), laid out as ``"vectorized"``'s."""
        states, buffers = [], []
        for (a, b), (state, buf) in zip(self.groups, carries):
            n = b - a
            if self.size == 1:
                state, buf = jax.tree.map(lambda x: x[None], state), jax.tree.map(lambda x: x[:, None], buf)
            states.append(jax.tree.map(lambda x: x[:n], state))
            buffers.append(jax.tree.map(lambda x: x[:, :n], buf))
        return (jax.tree.map(lambda *xs: jnp.concatenate(xs, 0), *states),
                jax.tree.map(lambda *xs: jnp.concatenate(xs, 1), *buffers))


def _save(path, saved, buffers, state, draws, num_samples, num_warmup, num_chains, thinning,
          extra_fields, chain_method) -> None:
    """Write the checkpoint of a run ``draws`` draws in (after a saved run's, if any)."""
    new = None
    if buffers is not None:
        new = {k: v[:, :draws] for k, v in _by_chain(buffers, num_chains, chain_method).items()}
    if new is not None:
        new = _joined(saved, new)
    elif saved is not None and saved.samples is not None:
        new = {**saved.samples, **(saved.extra_fields or {})}
    samples, extra = _split(new, extra_fields)
    done = (0 if saved is None else saved.num_samples) + draws * thinning
    planned = (0 if saved is None else saved.num_samples) + num_samples * thinning
    warmup = num_warmup if saved is None else saved.num_warmup
    save_checkpoint(path, CheckpointedRun(samples, extra, state, done, planned, warmup, num_chains,
                                          thinning, tuple(extra_fields)))
