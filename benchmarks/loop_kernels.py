"""Benchmark: the samplers' steps with and without XLA:CPU's whole-loop kernels per program.

jaxbnp gives the programs that run its sequential samplers' steps XLA:CPU's
small-while-loop threshold of 64 MiB (``jaxbnp._xla.mark_loop_program``; the
process's ``XLA_FLAGS`` and a user's other programs keep XLA's defaults).
``JAXBNP_CPU_LOOP_KERNELS=0`` turns it off. This script times one step of each
kernel both ways, each in its own subprocess (XLA reads its flags once per
process): ``kernel.init``, then ``jax.jit(kernel.sample).lower(...).compile()``
(compile seconds reported), 20 untimed steps, then the median of 10 timed
steps. The ratio is off / on (above 1: the per-program threshold is faster).

Cases: the tgMCMC paper's toy set (1,300 x 2, ``NormalWishart.from_data``,
DP(1), capacity 64) for ``CollapsedGibbs``, ``SplitMerge`` (20 moves, 5
restricted scans, 1 sweep), ``TreeGuidedMCMC`` (G = 20, D = 2, noisy start) and
``SubClusterMCMC``; 10^5 x 2 and 10^4 x 10 synthetic mixtures of 10 Gaussians
(capacity 32) for ``CollapsedGibbs`` and ``SubClusterMCMC``; and the Gibbs sweep
(``gibbs.gibbs_sweep``) at the 10k set's ground truth (119 clusters, capacity
128), the case of ``benchmarks/gibbs.py``. ``SubClusterMCMC``'s steps are
vectorised over the points and it is not marked (its rows show that both
modes run the same code).

Usage::

    python benchmarks/loop_kernels.py                 # -> results/loop_kernels.{json,md}
    python benchmarks/loop_kernels.py --cases toy-tgmcmc toy-sm
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from harness import RESULTS, machine_info, write_json, write_lines  # noqa: E402

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "nrmm"
CASES = ["toy-gibbs", "toy-sm", "toy-tgmcmc", "toy-subcluster", "1e5x2-gibbs", "1e5x2-subcluster",
         "1e4x10-gibbs", "10k-gt-sweep"]

def run_case(case: str, data_dir: Path, mode: str) -> dict:
    env = dict(os.environ)
    env.pop("XLA_FLAGS", None)  # XLA's defaults, as a user's process has them
    env["JAXBNP_CPU_LOOP_KERNELS"] = "1" if mode == "on" else "0"
    env["JAXBNP_COMPILATION_CACHE"] = "0"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", case, "--data-dir", str(data_dir)]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    if out.returncode != 0:
        return {"error": out.stderr[-2000:]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def _data(case: str, data_dir: Path):
    import numpy as np

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    if case.startswith("toy") or case.startswith("10k"):
        from tgmcmc import load_dataset

        X, y = load_dataset(data_dir, "toy" if case.startswith("toy") else "10k")
        return np.asarray(X, np.float32), np.asarray(y)
    n, d = {"1e5x2": (100_000, 2), "1e4x10": (10_000, 10)}[case.split("-")[0]]
    rng = np.random.default_rng(0)
    centres = rng.normal(0.0, 6.0, (10, d))
    truth = rng.integers(0, 10, n)
    return (centres[truth] + rng.normal(size=(n, d))).astype(np.float32), truth


def worker(case: str, data_dir: Path) -> None:
    import jax
    import jax.numpy as jnp
    import numpy as np
    import numpyro

    import jaxbnp as bnp
    from jaxbnp import _xla

    X, y = _data(case, data_dir)
    family = bnp.NormalWishart.from_data(X)
    Xj = jnp.asarray(X)
    sampler = case.split("-", 1)[1]
    if sampler == "gt-sweep":
        from jaxbnp.inference.partition.clusters import init_clusters
        from jaxbnp.inference.partition.gibbs import gibbs_sweep

        measure = bnp.DP(1.0)
        state = init_clusters(family, Xj, y, 128)
        fn = jax.jit(lambda k, s, X: gibbs_sweep(k, s, X, measure, family))
        keys = jax.random.split(jax.random.key(1), 31)
        t0 = time.perf_counter()
        step = fn.lower(keys[0], state, Xj).compile()
        compile_s = time.perf_counter() - t0
        for i in range(20):
            state = step(keys[i], state, Xj)
        jax.block_until_ready(state)
        times = []
        for i in range(20, 30):
            t0 = time.perf_counter()
            state = jax.block_until_ready(step(keys[i], state, Xj))
            times.append(time.perf_counter() - t0)
        k = int(np.sum(np.asarray(state.counts) > 0))
    else:
        capacity = 64 if case.startswith("toy") else 32

        def model(X):
            z = numpyro.sample("z", bnp.Partition(bnp.DP(1.0), X.shape[0]))
            numpyro.sample("X", bnp.ConjugateMixture(family, z), obs=X)

        kernel = {
            "gibbs": lambda: bnp.CollapsedGibbs(model, capacity=capacity),
            "sm": lambda: bnp.SplitMerge(model, num_split_merge=20, num_restricted_scans=5,
                                         gibbs_sweeps=1, capacity=capacity),
            "tgmcmc": lambda: bnp.TreeGuidedMCMC(model, num_global_moves=20, depth=2, init="noisy",
                                                 capacity=capacity),
            "subcluster": lambda: bnp.SubClusterMCMC(model, capacity=capacity),
        }[sampler]()
        state = kernel.init(jax.random.key(0), 0, None, (Xj,), {})
        t0 = time.perf_counter()
        step = jax.jit(lambda s, x: kernel.sample(s, (x,), {})).lower(state, Xj).compile()
        compile_s = time.perf_counter() - t0
        for _ in range(20):
            state = step(state, Xj)
        jax.block_until_ready(state)
        times = []
        for _ in range(10):
            t0 = time.perf_counter()
            state = jax.block_until_ready(step(state, Xj))
            times.append(time.perf_counter() - t0)
        k = int(state.num_clusters)
    print(json.dumps({"median_s": float(np.median(times)), "min_s": float(np.min(times)),
                      "compile_s": compile_s, "num_clusters": k,
                      "enabled": _xla.loop_kernels_enabled()}))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", nargs="+", choices=CASES, default=CASES)
    ap.add_argument("--data-dir", type=Path, default=DATA)
    ap.add_argument("--out-name", default="loop_kernels")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker(args.worker, args.data_dir)
        return
    res = {"command": "python benchmarks/loop_kernels.py " + " ".join(argv if argv is not None else sys.argv[1:]),
           "environment": machine_info(with_jax=False), "cases": {}}
    t_start = time.perf_counter()
    for case in args.cases:
        row = {}
        for mode in ("on", "off"):  # adjacent runs: the ratio is from one stretch of time
            row[mode] = run_case(case, args.data_dir, mode)
            print(case, mode, row[mode], flush=True)
        if "median_s" in row["on"] and "median_s" in row["off"]:
            row["ratio_off_over_on"] = row["off"]["median_s"] / row["on"]["median_s"]
        res["cases"][case] = row
    res["wall_s"] = time.perf_counter() - t_start
    RESULTS.mkdir(parents=True, exist_ok=True)
    write_json(RESULTS / f"{args.out_name}.json", res)
    env = res["environment"]
    lines = [
        "# Sampler steps with and without whole-loop kernels per program (XLA:CPU)", "",
        f"Command: `{res['command']}`", "",
        f"Machine: {env.get('cpu_model')} ({env.get('cpu_affinity')} CPUs usable), {env.get('platform')}; "
        f"jaxbnp at {(env.get('jaxbnp_git') or {}).get('commit', '?')}; float32; XLA's default flags in "
        f"each worker. 'on': jaxbnp's default (the sampler's program gets the 64 MiB small-while-loop "
        f"threshold); 'off': `JAXBNP_CPU_LOOP_KERNELS=0`. Median of 10 steps after 20 untimed ones, "
        f"each mode in its own process, the two modes of a row run one after the other.", "",
        "| case | step, on | step, off | off / on | compile s, on / off | K |",
        "|---|---|---|---|---|---|",
    ]
    for case, row in res["cases"].items():
        on, off = row["on"], row["off"]
        if "median_s" not in on or "median_s" not in off:
            lines.append(f"| {case} | error | error | | | |")
            continue
        lines.append(f"| {case} | {on['median_s'] * 1e3:.1f} ms | {off['median_s'] * 1e3:.1f} ms | "
                     f"{row['ratio_off_over_on']:.2f} | {on['compile_s']:.1f} / {off['compile_s']:.1f} | "
                     f"{on['num_clusters']} / {off['num_clusters']} |")
    lines += ["", f"Total wall time: {res['wall_s']:.0f} s."]
    write_lines(RESULTS / f"{args.out_name}.md", lines)


if __name__ == "__main__":
    main()
