"""Process-wide XLA settings (set before JAX starts, like ``numpyro.set_host_device_count``)."""

from __future__ import annotations

import os

_OPTION = "--xla_backend_extra_options="
_KEY = "xla_cpu_small_while_loop_byte_threshold"


def backends_started() -> bool:
    """Whether JAX's backends are up (after which XLA_FLAGS no longer take effect)."""
    try:
        from jax._src import xla_bridge
    except ImportError:  # pragma: no cover - a JAX without that module
        return False
    started = getattr(xla_bridge, "backends_are_initialized", None)
    return bool(started()) if callable(started) else False


def set_cpu_loop_kernels(byte_threshold: int = 1 << 26) -> None:
    """Let XLA:CPU compile each small ``while`` loop whole, as one kernel.

    The sequential samplers (tgMCMC's tree moves, Gibbs sweeps, split-merge's
    restricted scans) are loops of many tiny operations. XLA:CPU runs each
    operation of a loop body as its own task, which costs about a microsecond
    each; its small-while-loop pass compiles a loop that touches at most
    ``byte_threshold`` bytes into one function instead (1 kB by default in
    XLA, so almost never). On toy (``benchmarks/tgmcmc.py`` with and without
    ``--no-cpu-loop-kernels``, at commit 5e58e82) it cut a tgMCMC iteration from 0.094 to
    0.059 s and a split-merge one from 0.131 to 0.044 s. The algorithm is
    unchanged; rounding can differ from a run without it.

    Reproducibility: the same key still gives the same draws run after run,
    but the chain methods (``"vectorized"`` against ``"parallel"``) are
    compiled into different kernels whose rounding can differ, so their
    draws can part (the suite saw it for NGGP Gibbs and the diffusion-tree
    kernel). With XLA's default threshold they are identical (tested), so the
    test suite runs without this setting.

    This sets ``XLA_FLAGS`` for the whole process, so call it before JAX
    computes anything, as with ``numpyro.set_host_device_count``. Loops above
    the threshold keep their multithreaded operations; lower it if a large
    vectorised loop (MAP-DP on millions of points) gets slower. ``0`` turns
    the pass off. Raises ``RuntimeError`` once JAX's backends have started.
    """
    if isinstance(byte_threshold, bool) or not isinstance(byte_threshold, int) or byte_threshold < 0:
        raise ValueError(
            f"set_cpu_loop_kernels: byte_threshold must be an integer >= 0 (bytes; 0 turns the "
            f"pass off), got {byte_threshold!r}."
        )
    if backends_started():
        raise RuntimeError(
            "set_cpu_loop_kernels must run before JAX starts its backends (before the first "
            "computation); call it at the top of the script, right after the imports."
        )
    tokens = os.environ.get("XLA_FLAGS", "").split()
    extra: list[str] = []
    kept = []
    for token in tokens:
        if token.startswith(_OPTION):
            extra += [kv for kv in token[len(_OPTION):].split(",") if kv and not kv.startswith(_KEY + "=")]
        else:
            kept.append(token)
    extra.append(f"{_KEY}={byte_threshold}")
    os.environ["XLA_FLAGS"] = " ".join(kept + [_OPTION + ",".join(extra)])
