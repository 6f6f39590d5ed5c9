"""Checkpoints of NumPyro MCMC runs: save the kernel state and the draws, resume exactly.

A run is cut into segments of ``every`` draws. After each segment the
kernel's state (``mcmc.last_state``, a pytree of arrays with its PRNG key)
and every draw so far are written to one file, atomically (a crash while
writing leaves the previous checkpoint intact). Resuming sets
``mcmc.post_warmup_state`` to the saved state and calls
``mcmc.run(state.rng_key, ...)``, as NumPyro documents for drawing samples
sequentially, so a resumed run gives **the same draws** as an uninterrupted
run with the same key (checked bit for bit in ``tests/test_checkpoint.py``
for ``CollapsedGibbs``, one chain and vectorized chains). An interrupted run
keeps every segment completed before the interruption.

Each ``mcmc.run`` call compiles its sampling loop again (NumPyro traces a new
loop per call), so choose ``every`` large enough that a segment takes much
longer than a compilation.

:func:`jaxbnp.inference.runner.run` (the estimators' and the ``jaxbnp``
command line's driver) writes and resumes the same files (``checkpoint=``,
``checkpoint_every=``, ``resume=``), without recompiling per segment.

Files are Python pickles: load only checkpoints you wrote yourself.

Example
-------
>>> from jaxbnp.checkpoint import run_with_checkpoints, resume
>>> mcmc = MCMC(bnp.CollapsedGibbs(model), num_warmup=100, num_samples=1000)  # doctest: +SKIP
>>> run = run_with_checkpoints(mcmc, jax.random.key(0), X, path="run.ckpt", every=100,
...                            extra_fields=("log_joint", "num_clusters"))   # doctest: +SKIP
>>> # ... interrupted? In a new process, with the same model and MCMC settings:
>>> run = resume(mcmc, "run.ckpt", X)                                     # doctest: +SKIP
>>> run.get_samples()["z"].shape                                           # doctest: +SKIP
(1000, n)
"""

from __future__ import annotations

import json
import os
import pickle
import tempfile
from pathlib import Path
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "CheckpointedRun",
    "save_checkpoint",
    "load_checkpoint",
    "run_with_checkpoints",
    "resume",
    "check_resumable",
    "RunSettings",
]

_FORMAT = "jaxbnp-checkpoint"
_VERSION = 1


class _KeyData:
    """A typed PRNG key array on the host: its implementation name and raw data."""

    def __init__(self, impl: str, data: np.ndarray):
        self.impl = impl
        self.data = data


def _is_key(x) -> bool:
    return hasattr(x, "dtype") and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


def _to_host(tree):
    def leaf(x):
        if _is_key(x):
            return _KeyData(str(jax.random.key_impl(x)), np.asarray(jax.random.key_data(x)))
        return np.asarray(x)

    return jax.tree.map(leaf, tree)


def _to_device(tree):
    def leaf(x):
        if isinstance(x, _KeyData):
            return jax.random.wrap_key_data(jnp.asarray(x.data), impl=x.impl)
        return jnp.asarray(x)

    return jax.tree.map(leaf, tree, is_leaf=lambda x: isinstance(x, _KeyData))


def _flatten_chains(tree):
    return jax.tree.map(lambda a: np.reshape(a, (-1,) + np.shape(a)[2:]), tree)


class CheckpointedRun:
    """The draws of a run made in segments, and where it stands.

    Mirrors ``numpyro.infer.MCMC``: ``get_samples(group_by_chain=False)`` and
    ``get_extra_fields(group_by_chain=False)`` (so it can be passed to
    :mod:`jaxbnp.diagnostics`), ``last_state``.

    Attributes: ``samples`` and ``extra_fields`` (grouped by chain, NumPy),
    ``last_state`` (the kernel state after the last draw), ``num_samples``
    (iterations done after warm-up, per chain), ``num_samples_total`` (the
    run's plan), ``num_warmup``, ``num_chains``, ``thinning``,
    ``extra_field_names``, ``partition_site`` (the label site, when known),
    ``path`` (the file it was saved to or loaded from).
    """

    def __init__(self, samples, extra_fields, last_state, num_samples, num_samples_total,
                 num_warmup, num_chains, thinning, extra_field_names, partition_site=None,
                 x64=None, path=None):
        self.samples = samples
        self.extra_fields = extra_fields
        self.last_state = last_state
        self.num_samples = int(num_samples)
        self.num_samples_total = int(num_samples_total)
        self.num_warmup = int(num_warmup)
        self.num_chains = int(num_chains)
        self.thinning = int(thinning)
        self.extra_field_names = tuple(extra_field_names)
        self.partition_site = partition_site
        self.x64 = bool(jax.config.jax_enable_x64) if x64 is None else bool(x64)
        self.path = None if path is None else Path(path)

    @property
    def complete(self) -> bool:
        """Whether every planned draw has been made."""
        return self.num_samples >= self.num_samples_total

    def get_samples(self, group_by_chain: bool = False):
        return self.samples if group_by_chain else _flatten_chains(self.samples)

    def get_extra_fields(self, group_by_chain: bool = False) -> dict:
        extra = self.extra_fields or {}
        return extra if group_by_chain else _flatten_chains(extra)

    def __repr__(self) -> str:
        return (f"CheckpointedRun({self.num_samples}/{self.num_samples_total} iterations after "
                f"warm-up, {self.num_chains} chain(s), path={str(self.path) if self.path else None!r})")


def _partition_site(mcmc) -> str | None:
    spec = getattr(getattr(mcmc, "sampler", None), "spec", None)
    return getattr(spec, "partition_site", None)


def _write(path: Path, run: CheckpointedRun) -> None:
    payload = {
        "format": _FORMAT,
        "version": _VERSION,
        "state": _to_host(run.last_state),
        "samples": _to_host(run.samples),
        "extra_fields": _to_host(run.extra_fields),
        "num_samples": run.num_samples,
        "num_samples_total": run.num_samples_total,
        "num_warmup": run.num_warmup,
        "num_chains": run.num_chains,
        "thinning": run.thinning,
        "extra_field_names": run.extra_field_names,
        "partition_site": run.partition_site,
        "x64": run.x64,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            pickle.dump(payload, f, protocol=pickle.HIGHEST_PROTOCOL)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)  # atomic: the old checkpoint stays until the new one is whole
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def save_checkpoint(path: str | os.PathLike, source: Any) -> Path:
    """Write a checkpoint of ``source`` to ``path``; returns the path.

    ``source`` is a ``CheckpointedRun`` or a NumPyro ``MCMC`` after ``run``
    (its ``last_state`` and its draws; the run counts as complete, so
    :func:`resume` needs ``num_samples`` to continue it).
    """
    path = Path(path)
    if isinstance(source, CheckpointedRun):
        _write(path, source)
        source.path = path
        return path
    if not hasattr(source, "last_state") or not hasattr(source, "get_samples"):
        raise ValueError(
            f"save_checkpoint takes a numpyro.infer.MCMC or a CheckpointedRun, got {type(source).__name__}."
        )
    if source.last_state is None:
        raise ValueError("The MCMC object has not run yet; call mcmc.run(...) before saving.")
    samples = _to_host(source.get_samples(group_by_chain=True))
    extra = _to_host(source.get_extra_fields(group_by_chain=True))
    done = int(source.num_samples)
    run = CheckpointedRun(samples, extra, source.last_state, done, done, source.num_warmup,
                          source.num_chains, source.thinning, tuple(extra), _partition_site(source))
    _write(path, run)
    run.path = path
    return path


def load_checkpoint(path: str | os.PathLike) -> CheckpointedRun:
    """Read a checkpoint written by :func:`save_checkpoint` or :func:`run_with_checkpoints`."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"No checkpoint at {path}.")
    with open(path, "rb") as f:
        payload = pickle.load(f)
    if not isinstance(payload, dict) or payload.get("format") != _FORMAT:
        raise ValueError(f"{path} is not a jaxbnp checkpoint.")
    if payload["version"] > _VERSION:
        raise ValueError(
            f"{path} was written by a newer jaxbnp (checkpoint format {payload['version']}); upgrade jaxbnp."
        )
    return CheckpointedRun(
        payload["samples"], payload["extra_fields"], _to_device(payload["state"]),
        payload["num_samples"], payload["num_samples_total"], payload["num_warmup"],
        payload["num_chains"], payload["thinning"], payload["extra_field_names"],
        payload["partition_site"], payload["x64"], path,
    )


def _concat(a, b):
    return jax.tree.map(lambda x, y: np.concatenate([np.asarray(x), np.asarray(y)], axis=1), a, b)


def _check_every(every: int, thinning: int) -> int:
    if isinstance(every, bool) or not isinstance(every, (int, np.integer)) or every < 1:
        raise ValueError(f"every must be a positive integer, got {every!r}.")
    if every % thinning:
        raise ValueError(f"every ({every}) must be a multiple of the MCMC's thinning ({thinning}).")
    return int(every)


def _segment(mcmc, num, args, kwargs, extra_fields, state):
    """One ``mcmc.run`` of ``num`` iterations from ``state``, as NumPyro documents for
    drawing samples sequentially (``post_warmup_state``, then ``run(state.rng_key)``)."""
    saved = mcmc.num_samples, mcmc.post_warmup_state
    try:
        mcmc.num_samples = num
        mcmc.post_warmup_state = state
        mcmc.run(state.rng_key, *args, extra_fields=extra_fields, **kwargs)
    finally:
        mcmc.num_samples, mcmc.post_warmup_state = saved
    return (_to_host(mcmc.get_samples(group_by_chain=True)),
            _to_host(mcmc.get_extra_fields(group_by_chain=True)), mcmc.last_state)


def _save(run: CheckpointedRun, path, callback) -> None:
    if path is not None:
        _write(Path(path), run)
        run.path = Path(path)
    if callback is not None:
        callback(run)


def _continue(mcmc, run: CheckpointedRun, remaining: int, every: int, path, args, kwargs,
              callback) -> CheckpointedRun:
    while remaining > 0:
        num = min(every, remaining)
        samples, extra, last = _segment(mcmc, num, args, kwargs, run.extra_field_names,
                                        run.last_state)
        if run.samples is None:
            run.samples, run.extra_fields = samples, extra
        else:
            run.samples, run.extra_fields = _concat(run.samples, samples), _concat(run.extra_fields, extra)
        run.last_state = last
        run.num_samples += num
        remaining -= num
        if run.partition_site is None:
            run.partition_site = _partition_site(mcmc)
        _save(run, path, callback)
    return run


def run_with_checkpoints(
    mcmc: Any,
    rng_key: jax.Array,
    *args: Any,
    path: str | os.PathLike | None,
    every: int,
    extra_fields: tuple = (),
    init_params: Any = None,
    callback: Callable[[CheckpointedRun], None] | None = None,
    **kwargs: Any,
) -> CheckpointedRun:
    """``mcmc.run(rng_key, *args, ...)`` in segments of ``every`` draws, saving after each.

    ``mcmc.warmup`` runs first (checkpointed, with no draws yet), then
    segments of ``every`` iterations, ``mcmc.num_samples`` iterations per
    chain in all (both multiples of ``mcmc.thinning``; each segment is one
    ``mcmc.run``, which compiles again). After each segment the checkpoint at
    ``path`` (``None``: no file) holds the state and every draw so far, then
    ``callback(run)`` is called. If the run is interrupted (an exception,
    ``KeyboardInterrupt``), the file keeps the completed segments: continue
    with :func:`resume`. The draws equal those of the uninterrupted
    ``mcmc.run(rng_key, *args, ...)``.

    ``mcmc`` is left as after its last segment (``mcmc.get_samples()`` holds
    that segment's draws; the returned run holds them all).
    """
    thinning = int(mcmc.thinning)
    every = _check_every(every, thinning)
    total = int(mcmc.num_samples)
    if total % thinning:
        raise ValueError(
            f"num_samples ({total}) must be a multiple of thinning ({thinning}) for a checkpointed run."
        )
    if not isinstance(extra_fields, (tuple, list)):
        raise ValueError(f"extra_fields must be a tuple of field names, got {extra_fields!r}.")
    run = CheckpointedRun(None, None, None, 0, total, mcmc.num_warmup, mcmc.num_chains, thinning,
                          tuple(extra_fields), None, None, path)
    if mcmc.post_warmup_state is not None:
        raise ValueError(
            "mcmc.post_warmup_state is set; run_with_checkpoints starts from scratch. "
            "Set mcmc.post_warmup_state = None, or continue a saved run with resume()."
        )
    try:  # warm-up (also when num_warmup = 0: it initialises the kernel), then a checkpoint
        mcmc.warmup(rng_key, *args, extra_fields=tuple(extra_fields), init_params=init_params, **kwargs)
        run.last_state = mcmc.post_warmup_state
    finally:
        mcmc.post_warmup_state = None
    run.partition_site = _partition_site(mcmc)
    _save(run, path, callback)
    return _continue(mcmc, run, total, every, path, args, kwargs, callback)


def check_resumable(run: CheckpointedRun, num_chains: int, thinning: int) -> None:
    """``ValueError`` unless ``run`` can be continued by ``num_chains`` chains with this
    ``thinning`` in this process (same ``jax_enable_x64``, or the draws would differ)."""
    if num_chains != run.num_chains:
        raise ValueError(
            f"The checkpoint has {run.num_chains} chain(s) but the run has num_chains={num_chains}; "
            "build the run as the original one."
        )
    if thinning != run.thinning:
        raise ValueError(f"The checkpoint used thinning={run.thinning}, the run has {thinning}.")
    if run.x64 != bool(jax.config.jax_enable_x64):
        raise ValueError(
            f"The checkpoint was written with jax_enable_x64={run.x64}; set "
            f'jax.config.update("jax_enable_x64", {run.x64}) before resuming, or the draws would differ.'
        )


def resume(
    mcmc: Any,
    checkpoint: str | os.PathLike | CheckpointedRun,
    *args: Any,
    num_samples: int | None = None,
    every: int | None = None,
    path: str | os.PathLike | None = None,
    callback: Callable[[CheckpointedRun], None] | None = None,
    **kwargs: Any,
) -> CheckpointedRun:
    """Continue a checkpointed run (a path or a :class:`CheckpointedRun`) with ``mcmc``.

    ``mcmc`` must be built like the original (same model, kernel settings,
    ``num_chains`` and ``thinning``; ``num_warmup``/``num_samples`` are not
    used); ``args``/``kwargs`` are the model's arguments again. Makes
    ``num_samples`` more iterations per chain (default: what the plan has
    left), in segments of ``every`` (default: one segment), writing the
    checkpoint after each to ``path`` (default: the file it was loaded from).
    Returns the run with every draw, old and new.
    """
    run = load_checkpoint(checkpoint) if not isinstance(checkpoint, CheckpointedRun) else checkpoint
    check_resumable(run, int(mcmc.num_chains), int(mcmc.thinning))
    if num_samples is None:
        remaining = run.num_samples_total - run.num_samples
        if remaining <= 0:
            raise ValueError(
                f"The run is complete ({run.num_samples} iterations); pass num_samples=... to draw more."
            )
    else:
        if isinstance(num_samples, bool) or not isinstance(num_samples, (int, np.integer)) or num_samples < 1:
            raise ValueError(f"num_samples must be a positive integer, got {num_samples!r}.")
        if num_samples % run.thinning:
            raise ValueError(f"num_samples ({num_samples}) must be a multiple of thinning ({run.thinning}).")
        remaining = int(num_samples)
        run.num_samples_total = run.num_samples + remaining
    every = remaining if every is None else _check_every(every, run.thinning)
    if path is None:
        path = run.path
    return _continue(mcmc, run, remaining, every, path, args, kwargs, callback)


class RunSettings:
    """The settings a checkpointed run was started with, in a JSON file beside its checkpoint
    (the command line's ``checkpoint_settings.json``): a resumed run must be given the same
    ones, and takes the saved cluster ``capacity`` (the saved state has that many slots).

    ``settings``: option name -> value (JSON-serialisable)."""

    def __init__(self, path: str | os.PathLike, settings: dict):
        self.path, self.settings = Path(path), dict(settings)

    def write(self, capacity: int | None) -> None:
        """Record the settings and the capacity the run now uses."""
        self.path.write_text(json.dumps({**self.settings, "capacity": capacity}) + "\n")

    def check_resume(self) -> int | None:
        """The saved capacity, after checking every saved setting against this run's; a
        ``ValueError`` names the first that differs."""
        saved = json.loads(self.path.read_text())
        for name, value in self.settings.items():
            if saved[name] != value:
                raise ValueError(f"the checkpoint was made with --{name} {saved[name]}, not "
                                 f"{value}; pass the same options.")
        return saved["capacity"]
