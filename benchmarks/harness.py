"""The benchmarks' harness: paths, the machine record, CPU clocks, timing summaries, result files.

Every script in benchmarks/ takes these from here (``from harness import ...``:
``python benchmarks/X.py`` puts this folder on ``sys.path``). Importing this
module puts the repository root on ``sys.path`` (the library under test is the
checkout's ``jaxbnp``) and imports neither JAX nor the library: a script can
still configure JAX first (``jax_enable_x64``, XLA flags).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterable

REPO_ROOT = Path(__file__).resolve().parents[1]
RESULTS = REPO_ROOT / "benchmarks" / "results"
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

__all__ = [
    "REPO_ROOT", "RESULTS", "utc_now", "load_average", "git_state", "machine_info", "cpu_seconds",
    "other_cpu_seconds", "summarize", "median_seconds", "write_json", "write_lines", "fit_bgm",
    "compile_stats", "machine_line",
]


def utc_now() -> str:
    """The date and time in UTC, ISO 8601 to the second."""
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def load_average() -> list[float] | None:
    """The 1, 5 and 15 minute load averages (``None`` where the OS has none)."""
    return list(os.getloadavg()) if hasattr(os, "getloadavg") else None


def git_state() -> dict | None:
    """Commit of the library under test and whether jaxbnp/ differs from it."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "jaxbnp"], cwd=REPO_ROOT,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return {"commit": head, "jaxbnp_modified": bool(dirty)}


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo") as fh:
            return next((ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name")), None)
    except OSError:
        return None


def machine_info(with_jax: bool = True) -> dict:
    """The machine and software a result was measured on.

    ``with_jax=False`` leaves out what needs JAX started (versions, backend,
    devices, dtype): for a driver whose workers are separate processes.
    """
    try:
        affinity = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - non-Linux
        affinity = None
    import numpy as np

    info: dict[str, Any] = {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpu_affinity": affinity,
        "python": sys.version.split()[0],
        "numpy": np.__version__,
        "load_average": load_average(),
        "XLA_FLAGS": os.environ.get("XLA_FLAGS"),
        "jaxbnp_git": git_state(),
    }
    if with_jax:
        import jax
        import jax.numpy as jnp
        import jaxlib
        import numpyro

        import jaxbnp

        info.update({
            "jax": jax.__version__,
            "jaxlib": jaxlib.__version__,
            "numpyro": numpyro.__version__,
            "jaxbnp": jaxbnp.__version__,
            "jax_backend": jax.default_backend(),
            "jax_devices": [str(d) for d in jax.devices()],
            "jax_enable_x64": bool(jax.config.jax_enable_x64),
            "dtype": str(jnp.asarray(1.0).dtype),
        })
    return info


def cpu_seconds(children: bool = False) -> tuple[float | None, float]:
    """(CPU seconds all processes have used, from /proc/stat; CPU seconds this process used).

    ``children=True`` adds the CPU time of this process's finished children.
    """
    import resource

    who = (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN) if children else (resource.RUSAGE_SELF,)
    own = sum(getattr(resource.getrusage(w), f) for w in who for f in ("ru_utime", "ru_stime"))
    try:
        with open("/proc/stat") as fh:
            fields = [int(v) for v in fh.readline().split()[1:]]
        busy = sum(fields[:3]) + sum(fields[5:7])  # user nice system irq softirq
        return busy / os.sysconf("SC_CLK_TCK"), own
    except (OSError, ValueError, IndexError):  # pragma: no cover - non-Linux
        return None, own


def other_cpu_seconds(start: tuple[float | None, float], end: tuple[float | None, float]) -> float | None:
    """CPU seconds the other processes used between two :func:`cpu_seconds` readings."""
    (busy0, own0), (busy1, own1) = start, end
    if busy0 is None or busy1 is None:
        return None
    return (busy1 - busy0) - (own1 - own0)


def summarize(times: list[float]) -> dict:
    """Median, minimum and maximum of timed repeats (seconds)."""
    return {
        "median_s": statistics.median(times),
        "min_s": min(times),
        "max_s": max(times),
        "repeats": len(times),
        "times_s": times,
    }


def median_seconds(fn, *args, repeats: int = 5) -> float:
    """The median wall time of ``fn(*args)`` over ``repeats`` calls, each waited for
    (``jax.block_until_ready``), after one call that is not timed (compilation)."""
    import jax  # here: importing the harness imports no JAX (module docstring)

    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t)
    return float(statistics.median(times))


def machine_line(machine: dict) -> str:
    """A results file's one-line account of :func:`machine_info`: CPU, usable CPUs, JAX,
    dtype and jaxbnp's commit."""
    commit = (machine["jaxbnp_git"] or {}).get("commit", "?")[:7]
    return (f"{machine['cpu_model']} ({machine['cpu_affinity']} CPUs), JAX {machine['jax']}, "
            f"{machine['dtype']}; jaxbnp at {commit}")


def write_json(path: Path, res: Any, indent: int = 1) -> None:
    """Write a result as JSON (NumPy scalars as floats), creating the folder."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(res, indent=indent, default=float) + "\n")


def compile_stats(f, *args, repeats: int = 1) -> dict:
    """XLA's compilation of ``jax.jit(f)`` on ``args`` alone (traced and lowered first, JAX's
    caches cleared before each of ``repeats`` rounds): the best seconds, and the optimised HLO's
    lines, fusions and ``while`` loops."""
    import jax  # here: importing the harness imports no JAX (module docstring)

    best = None
    for _ in range(repeats):
        jax.clear_caches()
        lowered = jax.jit(f).lower(*args)
        t = time.perf_counter()
        compiled = lowered.compile()
        seconds = time.perf_counter() - t
        best = seconds if best is None else min(best, seconds)
    text = compiled.as_text()
    return {"seconds": round(best, 2), "hlo_lines": len(text.splitlines()),
            "fusions": text.count("fusion("), "whiles": text.count(" while(")}


def write_lines(path: Path, lines: Iterable[str]) -> None:
    """Write a Markdown report, one line per item, creating the folder."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")


def fit_bgm(X, y, n_components: int, covariance_type: str) -> dict:
    """scikit-learn's ``BayesianGaussianMixture`` with Dirichlet-process weights (defaults
    otherwise: ``max_iter=100``, one k-means start, ``random_state=0``), fitted and scored:
    fit time, iterations, convergence, clusters used and NMI against ``y``."""
    import warnings

    import numpy as np
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.metrics import normalized_mutual_info_score
    from sklearn.mixture import BayesianGaussianMixture

    bgm = BayesianGaussianMixture(n_components=n_components, covariance_type=covariance_type,
                                  weight_concentration_prior_type="dirichlet_process", random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        t0 = time.perf_counter()
        bgm.fit(X)
        elapsed = time.perf_counter() - t0
    labels = bgm.predict(X)
    return {"time_s": elapsed, "iterations": int(bgm.n_iter_), "converged": bool(bgm.converged_),
            "clusters": int(np.unique(labels).size),
            "nmi": float(normalized_mutual_info_score(y, labels))}
