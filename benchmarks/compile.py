"""Benchmark: compilation per kernel and estimator, on the embedded data (1,300 x 2).

Each entry runs 10 warm-up + 10 kept iterations (estimators: the same through ``num_warmup``
and ``num_samples``) three times:

- **cold, empty cache**: a fresh process with an empty ``JAXBNP_CACHE_DIR``, its first run;
- **same process, second run**: the same process, the same ``MCMC`` object with NumPyro's
  defaults (its progress bar on; estimators: a new estimator) on the same data, run again.
  (With ``progress_bar=False`` NumPyro wraps its loop in a fresh ``jax.jit`` on every run
  and compiles it again, for every kernel, NUTS included.)
- **cold, warm cache**: a fresh process reusing the cache the first process filled.

``MAPDP (new size)`` fits 7 points fewer on each run of a process (1,300, then 1,293 points):
its second run is a fit on data of another size, which compiles again unless the sizes
share a program (``MAPDP()`` pads to ``mapdp.padded_size(n)`` rows).

A run is timed as a whole (``init`` + compilation + sampling + reading the draws); beside it
the seconds JAX spent in XLA compilation (``backend_compile``, counted also when a program
comes from the persistent cache: then it is the loading), the number of programs compiled
and how many came from the persistent cache (``jax.monitoring`` events). Interpreter start
and imports are not in the times. XLA's default flags, float32.

The persistent cache cannot keep a program that holds a host callback (JAX refuses to
write those). The NumPyro kernels' overflow check (``host_overflow_check=True``: raise
``CapacityError`` at once when ``capacity < n`` runs out) is made on the host by
``get_diagnostics_str`` where NumPyro's progress bar reads every step (these runs: its
defaults, one chain), and through a host callback in the step otherwise (no progress bar,
vectorized or parallel chains); ``capacity=n`` (no check needed) or
``host_overflow_check=False`` (the estimators and the runner) need neither. tgMCMC's host
trees (``trees="host"``) hold a callback; its IBHC start is built on the host before the
program (``TreeGuidedMCMC.initial_params``). ``AuxiliaryGibbs`` runs a Normal likelihood
with its means in a plate of 32 slots.

Results: ``benchmarks/results/compile.json`` and ``compile.md`` (``--out-name`` to change).

Usage::

    python benchmarks/compile.py                         # every entry (about 15 minutes)
    python benchmarks/compile.py --only SubClusterMCMC   # one entry
    PYTHONPATH=/path/to/old/checkout python benchmarks/compile.py --out-name compile_before
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

from harness import RESULTS, machine_info, write_json, write_lines

ENTRIES = ("CollapsedGibbs", "SplitMerge", "TreeGuidedMCMC", "SubClusterMCMC",
           "SubClusterMCMC (capacity=n)", "AuxiliaryGibbs", "DPM gibbs", "DPM subcluster", "DPM tgmcmc", "MAPDP",
           "MAPDP (new size)")

_CHILD = r"""
import json, sys, time
from collections import Counter
import jax, jax.monitoring as monitoring, numpyro
import numpyro.distributions as dist
import jaxbnp as bnp
from numpyro.infer import MCMC

events, seconds = Counter(), Counter()
monitoring.register_event_listener(lambda e, **k: events.update([e]))
def _duration(e, d, **k):
    events.update([e]); seconds[e] += d
monitoring.register_event_duration_secs_listener(_duration)
COMPILE = "/jax/core/compile/backend_compile_duration"
HITS = "/jax/compilation_cache/cache_hits"

X, y = bnp.datasets.toy_ring()
family = bnp.NormalWishart.from_data(X)
def model(X):
    z = numpyro.sample("z", bnp.Partition(bnp.DP(1.0), X.shape[0]))
    numpyro.sample("X", bnp.ConjugateMixture(family, z), obs=X)
def plate_model(X):
    z = numpyro.sample("z", bnp.Partition(bnp.DP(1.0), X.shape[0]))
    with numpyro.plate("clusters", 32):
        mu = numpyro.sample("mu", dist.Normal(0.0, 3.0).expand([X.shape[1]]).to_event(1))
    numpyro.sample("X", dist.Normal(mu[z], 0.5).to_event(1), obs=X)

name = sys.argv[1]
bnp.enable_compilation_cache(True)
def once():
    if name.startswith("DPM"):
        method = name.split()[1]
        est = bnp.DirichletProcessMixture(method=method, num_warmup=10, num_samples=10,
                                          random_state=0, progress_bar=False).fit(X)
        return est.labels_
    if name == "MAPDP":
        return bnp.MAPDP(random_state=0).fit(X).labels_
    if name == "MAPDP (new size)":  # each run 7 points fewer: a new shape every time
        return bnp.MAPDP(random_state=0).fit(X[: X.shape[0] - 7 * len(out)]).labels_
    kernel = {
        "CollapsedGibbs": lambda: bnp.CollapsedGibbs(model),
        "SplitMerge": lambda: bnp.SplitMerge(model),
        "TreeGuidedMCMC": lambda: bnp.TreeGuidedMCMC(model),
        "SubClusterMCMC": lambda: bnp.SubClusterMCMC(model),
        "SubClusterMCMC (capacity=n)": lambda: bnp.SubClusterMCMC(model, capacity=X.shape[0]),
        "AuxiliaryGibbs": lambda: bnp.AuxiliaryGibbs(plate_model),
    }[name]
    global mcmc
    if mcmc is None:  # one MCMC object, NumPyro's defaults (progress bar on): a second run reuses
        mcmc = MCMC(kernel(), num_warmup=10, num_samples=10)
    mcmc.run(jax.random.key(0), X)
    return mcmc.get_samples()["z"]

mcmc = None

out = []
for _ in range(int(sys.argv[2])):
    events.clear(); seconds.clear()
    t = time.perf_counter()
    jax.block_until_ready(once())
    out.append({"seconds": time.perf_counter() - t, "compile_seconds": seconds[COMPILE],
                "programs": events[COMPILE], "cache_hits": events[HITS]})
print("RESULT " + json.dumps(out))
"""


def _child(name: str, runs: int, cache: str) -> list:
    env = dict(os.environ, JAXBNP_CACHE_DIR=cache, JAXBNP_PROGRESS="0", JAX_PLATFORMS="cpu")
    # CI and PYTEST_XDIST_WORKER turn NumPyro's progress bar off: a user's defaults here
    for var in ("XLA_FLAGS", "JAX_ENABLE_X64", "JAXBNP_COMPILATION_CACHE", "CI", "PYTEST_XDIST_WORKER"):
        env.pop(var, None)
    # run outside the checkout, so that PYTHONPATH (another checkout) decides which jaxbnp
    with tempfile.TemporaryDirectory() as cwd:
        proc = subprocess.run([sys.executable, "-c", _CHILD, name, str(runs)], env=env, cwd=cwd,
                              capture_output=True, text=True, timeout=1800)
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not line:
        return [{"error": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "no output"}]
    return json.loads(line[-1][len("RESULT "):])


def measure(name: str) -> dict:
    with tempfile.TemporaryDirectory() as cache:
        first = _child(name, 2, cache)
        warm = _child(name, 1, cache)
    return {"cold_empty_cache": first[0], "same_process_second": first[1] if len(first) > 1 else first[0],
            "cold_warm_cache": warm[0]}


def _cell(r: dict) -> str:
    if "error" in r:
        return f"error: {r['error'][:60]}"
    return (f"{r['seconds']:.1f} s ({r['compile_seconds']:.1f} s XLA, {r['programs']} prog., "
            f"{r['cache_hits']} from cache)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", choices=ENTRIES, default=list(ENTRIES))
    parser.add_argument("--out-name", default="compile")
    args = parser.parse_args()
    rows = {}
    for name in args.only:
        rows[name] = measure(name)
        print(name, {k: _cell(v) for k, v in rows[name].items()}, flush=True)
    res = {"machine": machine_info(with_jax=False), "entries": rows,
           "library": os.environ.get("PYTHONPATH") or "this checkout"}
    write_json(RESULTS / f"{args.out_name}.json", res)
    lines = [f"# Compilation per kernel ({args.out_name})", "",
             "`python benchmarks/compile.py` (module docstring); toy_ring, 10 + 10 iterations, "
             "float32, XLA's default flags. Each cell: the run's wall time (XLA compilation "
             "seconds, programs compiled, of which loaded from the persistent cache).", "",
             "| entry | cold process, empty cache | same process, second run | cold process, warm cache |",
             "|---|---|---|---|"]
    for name, r in rows.items():
        lines.append(f"| {name} | {_cell(r['cold_empty_cache'])} | {_cell(r['same_process_second'])} | "
                     f"{_cell(r['cold_warm_cache'])} |")
    write_lines(RESULTS / f"{args.out_name}.md", lines)


if __name__ == "__main__":
    main()
