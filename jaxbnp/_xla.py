"""XLA settings: process-wide ones (set before JAX starts, like
``numpyro.set_host_device_count``), and whole-loop kernels for jaxbnp's own programs."""

from __future__ import annotations

import os

import jax

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

    Reproducibility: the same key still gives the same draws run after run, and
    whatever the chain method for the samplers whose tests check it (the suite runs
    with this threshold; ``tests/test_xla_settings.py`` also checks NGGP split-merge
    under XLA's defaults with the samplers' own per-program threshold). The chain
    methods are compiled into different programs, whose rounding may differ in
    general; with XLA's default threshold that was seen for NGGP Gibbs and the
    diffusion-tree kernel in an earlier version.

    jaxbnp's sequential samplers get this threshold without it, for their own programs
    only (:func:`mark_loop_program`; ``JAXBNP_CPU_LOOP_KERNELS=0`` turns that off); this
    function gives it to every program of the process, e.g. a user's own loops.

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


# --------------------------------------------------------------------------------------
# Whole-loop kernels for jaxbnp's own programs only (no process-wide flag)
#
# XLA reads its small-while-loop threshold from the compilation's DebugOptions, whose
# ``xla_backend_extra_options`` map ``XLA_FLAGS`` fills for every program of the process.
# ``jax.jit(compiler_options=...)`` cannot set a map entry (benchmarks/results/
# loop_kernels_per_program.md), so a program that holds the marker below gets the entry in
# its own compile options, through a wrapper around JAX's compile call; other programs of
# the process compile as before. Where that call is missing or has changed (another JAX),
# nothing is wrapped and the samplers run as they would without it, only slower.
#
# Marked: the steps of CollapsedGibbs, SplitMerge and TreeGuidedMCMC, gibbs_sweep, the
# diffusion-tree kernels and BHMC's kernel (loops of tiny steps). Not marked: SubClusterMCMC,
# AuxiliaryGibbs and SliceGibbs, measured no faster or slower with it, and MAP-DP, not
# measured; their steps are vectorised over the points (benchmarks/loop_kernels.py).

#: the name of the marker function in a program's StableHLO module
MARKER = "jaxbnp_cpu_loop_kernels"
#: ``JAXBNP_CPU_LOOP_KERNELS=0`` (or false/no/off) turns the per-program option off
ENV_SWITCH = "JAXBNP_CPU_LOOP_KERNELS"
#: the threshold given to a marked program: loops that touch up to 64 MiB become one kernel
LOOP_BYTES = 1 << 26

_hook: bool | None = None  # None: not tried yet; True: installed; False: not available


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field (wire type 2)."""
    return _varint((number << 3) | 2) + _varint(len(payload)) + payload


#: CompileOptionsProto.executable_build_options (3) > ExecutableBuildOptionsProto.
#: debug_options (3) > DebugOptions.xla_backend_extra_options (500, map<string, string>):
#: appended to a serialised message, protobuf merges it into the existing fields
def _extra_option(key: str, value: str) -> bytes:
    entry = _field(1, key.encode()) + _field(2, value.encode())
    return _field(3, _field(3, _field(500, entry)))


def _user_threshold() -> bool:
    """Whether XLA_FLAGS already sets the threshold (``set_cpu_loop_kernels``): it wins."""
    return _KEY + "=" in os.environ.get("XLA_FLAGS", "")


def loop_kernels_enabled() -> bool:
    """Whether jaxbnp's marked programs get whole-loop kernels on a CPU (module comment)."""
    value = os.environ.get(ENV_SWITCH)
    if value is not None and value.strip().lower() in ("0", "false", "no", "off"):
        return False
    return not _user_threshold() and _install()


def _marked(module) -> bool:
    try:
        from jax._src.lib.mlir import ir

        for op in module.body.operations:
            attrs = op.attributes
            if "sym_name" in attrs and ir.StringAttr(attrs["sym_name"]).value == MARKER:
                return True
    except Exception:  # pragma: no cover - another MLIR API: leave the program alone
        return False
    return False


def _install() -> bool:
    """Wrap JAX's compile call once (module comment); ``False`` where it cannot be."""
    global _hook
    if _hook is not None:
        return _hook
    _hook = False
    try:
        import inspect

        from jax._src import compiler
        from jax._src.lib import xla_client

        original = compiler.backend_compile_and_load
        names = list(inspect.signature(original).parameters)[:5]
        if names != ["backend", "module", "executable_devices", "options", "host_callbacks"]:
            return False
        extra = _extra_option(_KEY, str(LOOP_BYTES))
        probe = xla_client.CompileOptions.ParseFromString(
            xla_client.CompileOptions().SerializeAsString() + extra)
        if _KEY.encode() not in probe.SerializeAsString():
            return False
    except Exception:  # pragma: no cover - another JAX: run without it
        return False

    def backend_compile_and_load(backend, module, executable_devices, options, host_callbacks,
                                 *args, **kwargs):
        if getattr(backend, "platform", None) == "cpu" and _marked(module):
            options = xla_client.CompileOptions.ParseFromString(options.SerializeAsString() + extra)
        return original(backend, module, executable_devices, options, host_callbacks,
                        *args, **kwargs)

    backend_compile_and_load.__wrapped__ = original
    compiler.backend_compile_and_load = backend_compile_and_load
    _hook = True
    return True


def mark_loop_program(x):
    """``x`` unchanged, and the program that computes it marked for whole-loop kernels on a
    CPU (module comment); plain ``x`` where that is off or unavailable. Call it inside a
    traced sampler step on a value the step returns."""
    if not loop_kernels_enabled():
        return x
    return _marker(x)


def _marker_fn(x):
    # an op of its own (JAX drops a jitted function that returns its argument unchanged)
    return jax.lax.optimization_barrier(x)


_marker_fn.__name__ = _marker_fn.__qualname__ = MARKER
_marker = jax.jit(_marker_fn)
