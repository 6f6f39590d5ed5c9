"""Benchmark: ``jaxbnp cluster`` on the embedded data, every method, float32 and float64,
first run (empty compilation cache) and second run (cache filled by the first).

Each run is a fresh process (``python -m jaxbnp.cli cluster --method M --dtype T``, the
method's default settings), timed as a whole: interpreter start, imports, compilation,
sampling, the point estimate and the plots. The first run of each (method, dtype) uses
an empty ``JAXBNP_CACHE_DIR``; the second reuses it. NMI/ARI are the CLI's own
(``summary.json``, point estimate against the embedded labels). The CPU time that other
processes used during the benchmark is recorded (the machine may be shared; the wall
times are clean only when it is near zero).

Results: ``benchmarks/results/cli.json`` and ``cli.md``.

Usage::

    python benchmarks/cli.py                      # every method, both dtypes (about 10 minutes)
    python benchmarks/cli.py --methods splitmerge --dtypes float32
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness import RESULTS, cpu_seconds, machine_info, other_cpu_seconds, write_json, write_lines
METHODS = ("splitmerge", "gibbs", "tgmcmc", "subcluster", "mapdp", "ddt", "bhmc", "auxiliary", "slice")


def run_once(method: str, dtype: str, cache: Path, out: Path) -> dict:
    env = dict(os.environ, JAXBNP_CACHE_DIR=str(cache), JAXBNP_PROGRESS="0")
    env.pop("XLA_FLAGS", None)
    env.pop("JAX_ENABLE_X64", None)
    cmd = [sys.executable, "-m", "jaxbnp.cli", "cluster", "--method", method, "--dtype", dtype,
           "--out", str(out)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        return {"wall_s": round(wall, 2), "error": proc.stderr[-1500:]}
    summary = json.loads((out / "summary.json").read_text())
    return {"wall_s": round(wall, 2), "method_s": summary["seconds"], "nmi": round(summary["nmi"], 3),
            "ari": round(summary["ari"], 3), "clusters": summary["clusters_point_estimate"],
            "fitted_points": summary.get("fitted_points")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--dtypes", nargs="+", default=["float32", "float64"],
                        choices=["float32", "float64"])
    parser.add_argument("--out-name", default="cli")
    args = parser.parse_args()

    rows = []
    clock0, t_start = cpu_seconds(children=True), time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for method in args.methods:
            for dtype in args.dtypes:
                cache = Path(tmp) / f"cache-{method}-{dtype}"
                out = Path(tmp) / f"out-{method}-{dtype}"
                first = run_once(method, dtype, cache, out)
                second = run_once(method, dtype, cache, out)
                row = {"method": method, "dtype": dtype, "first": first, "second": second}
                rows.append(row)
                print(json.dumps(row), flush=True)
    other = other_cpu_seconds(clock0, cpu_seconds(children=True))
    other = float("nan") if other is None else other
    result = {
        "command": "python benchmarks/cli.py " + " ".join(sys.argv[1:]),
        "date": _dt.date.today().isoformat(),
        "machine": machine_info(),
        "elapsed_s": round(time.perf_counter() - t_start, 1),
        "other_processes_cpu_s": round(other, 1),
        "rows": rows,
    }
    write_json(RESULTS / f"{args.out_name}.json", result, indent=2)
    m = result["machine"]
    lines = [
        "# `jaxbnp cluster` on the embedded data: every method, first and second run",
        "",
        f"Command: `{result['command'].strip()}`. Machine: {m['cpu_model']} ({m['cpu_count']} CPUs), "
        f"{m['platform']}, Python {m['python']}, JAX {m['jax']}; {result['date']}.",
        "",
        "Wall = the whole process (start, imports, compilation, sampling, point estimate, plots), "
        "each method with its CLI defaults (`jaxbnp cluster --method M --dtype T`). First run: empty "
        "compilation cache; second run: the cache the first one filled. Method = the CLI's own "
        "`time` (the fit, compilation included). NMI/ARI: the point estimate against the 13 "
        "embedded labels.",
        f"CPU seconds used by other processes during the run: {result['other_processes_cpu_s']}.",
        "",
        "| method | dtype | first run wall s | method s | second run wall s | method s | clusters | NMI | ARI | points fitted |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        f, s = r["first"], r["second"]
        if "error" in f or "error" in s:
            lines.append(f"| {r['method']} | {r['dtype']} | error | | | | | | | |")
            continue
        lines.append(f"| {r['method']} | {r['dtype']} | {f['wall_s']:.1f} | {f['method_s']:.1f} | "
                     f"{s['wall_s']:.1f} | {s['method_s']:.1f} | {s['clusters']} | {s['nmi']:.3f} | "
                     f"{s['ari']:.3f} | {s['fitted_points']} |")
    write_lines(RESULTS / f"{args.out_name}.md", lines)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
