"""Benchmark: data-parallel MAP-DP and collapsed Gibbs throughput (points per second) versus the
number of devices and the number of points (issue #8).

Data: ``N`` points from 8 well-separated 2-D Gaussians, ``DP(1.0)``,
``NormalGamma.from_data``, capacity 32, JAX's default float32. Every timed
sweep starts from the generating labels (8 clusters), so it measures the
steady-state cost of a sweep, not the first sweeps out of one cluster.

* MAP-DP: one data-parallel batched sweep (``sharded.make_mapdp_sweep``,
  global blocks of ``--block-size`` points, the monotone block rule, statistics
  rebuilt from the labels before and after).
* Gibbs: one data-parallel collapsed-Gibbs sweep (``sharded.make_gibbs_sweeps``;
  approximate with more than one device, see ``jaxbnp.inference.sharded``).

Each configuration runs in its own subprocess (the device count is fixed
when JAX starts: ``XLA_FLAGS=--xla_force_host_platform_device_count=S`` on
CPU); the time is the median of ``--repeats`` sweeps after one compile+warm-up
sweep. Two tables: points/second versus ``S`` = 1, 2, 4, 8 devices at fixed
``N`` (ratio to the 1-device run of the same script), and versus ``N`` on one
device. On a 2-core CPU, host "devices" share the two cores: more than two
cannot be faster, and the ratios mostly show the cost of the collectives.
The CPU time used by other processes during the run is recorded (the machine
is shared; timings are clean only when it is near zero).

``--gpu``: the accelerators JAX finds (no XLA_FLAGS), device counts 1 ..
``jax.device_count()``, sizes up to 10^7 for both algorithms.

Results: ``benchmarks/results/scale.json`` and ``scale.md`` (``--gpu``:
``scale_gpu.json`` / ``scale_gpu.md``).

Usage::

    python benchmarks/scale.py                       # CPU, defaults below (several minutes)
    python benchmarks/scale.py --quick               # small sizes, 1 repeat
    python benchmarks/scale.py --gpu                 # on a GPU machine
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import (  # noqa: E402  (the benchmarks' harness)
    REPO_ROOT, RESULTS, cpu_seconds, load_average, machine_info, other_cpu_seconds, utc_now, write_json,
    write_lines,
)

CAPACITY = 32


def make_data(n: int, seed: int = 0):
    import numpy as np

    rng = np.random.default_rng(seed)
    centers = np.stack([np.cos(np.arange(8) * np.pi / 4), np.sin(np.arange(8) * np.pi / 4)], 1) * 10
    labels = rng.integers(0, 8, n).astype(np.int32)
    X = (centers[labels] + rng.normal(size=(n, 2))).astype(np.float32)
    return X, labels


# ----------------------------------------------------------------------------- worker
def worker(args) -> dict:
    import jax
    import numpy as np

    import jaxbnp as bnp
    from jaxbnp.inference import sharded

    n, S = args.n, args.devices
    X, labels = make_data(n)
    family = bnp.NormalGamma.from_data(X)
    measure = bnp.DP(1.0)
    mesh = sharded.make_mesh(S)
    block = args.block_size if args.algo == "mapdp" else args.gibbs_block_size
    layout = sharded.make_layout(n, S, block)
    t0 = time.perf_counter()
    data = sharded.shard_data(X, mesh, layout)
    lab = sharded.shard_labels(labels, mesh, layout)
    jax.block_until_ready((data, lab))
    t_place = time.perf_counter() - t0
    if args.algo == "mapdp":
        sweep = sharded.make_mapdp_sweep(mesh, layout, CAPACITY)
        run = lambda: sweep(data.X, data.valid, lab, measure, family)  # noqa: E731
    else:
        sweep = sharded.make_gibbs_sweeps(mesh, layout, CAPACITY, 1)
        u = jax.numpy.asarray(1.0, data.X.dtype)
        run = lambda: sweep(jax.random.key(0), data.X, data.valid, lab, measure, family, u)  # noqa: E731
    t0 = time.perf_counter()
    out = jax.block_until_ready(run())
    t_first = time.perf_counter() - t0
    times = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        out = jax.block_until_ready(run())
        times.append(time.perf_counter() - t0)
    counts = np.asarray(out[1])
    med = statistics.median(times)
    return {
        "algo": args.algo, "n": n, "devices": S, "platform": jax.devices()[0].platform,
        "device_kind": jax.devices()[0].device_kind, "global_block": layout.global_block,
        "seconds_per_sweep": med, "times_s": times, "points_per_second": n / med,
        "first_call_s": t_first, "placement_s": t_place,
        "num_clusters_after": int(np.sum(counts > 0)), "overflow": bool(np.asarray(out[3])),
    }


# ----------------------------------------------------------------------------- driver
def run_worker(args, algo: str, n: int, devices: int) -> dict:
    env = dict(os.environ)
    if not args.gpu:
        env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
        env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONPATH"] = str(REPO_ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [sys.executable, __file__, "--worker", "--algo", algo, "--n", str(n), "--devices", str(devices),
           "--repeats", str(args.repeats), "--block-size", str(args.block_size),
           "--gibbs-block-size", str(args.gibbs_block_size)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    if proc.returncode != 0:
        return {"algo": algo, "n": n, "devices": devices, "error": proc.stderr[-2000:],
                "wall_s": time.perf_counter() - t0}
    line = [x for x in proc.stdout.splitlines() if x.startswith("JSON")][-1]
    res = json.loads(line[4:])
    res["wall_s"] = time.perf_counter() - t0
    print(f"  {algo:6s} n={n:>9d} devices={devices}: {res['points_per_second']:.3g} points/s "
          f"({res['seconds_per_sweep']:.3g} s/sweep, wall {res['wall_s']:.0f} s)", flush=True)
    return res


def table(rows, ratio_to: str) -> list[str]:
    """Markdown rows; ``ratio_to`` = "devices" (to the 1-device run of the same N) or "n" (to the
    smallest N of the same algorithm)."""
    head = "ratio to 1 device" if ratio_to == "devices" else "ratio to smallest N"
    lines = [f"| algorithm | N | devices | global block | s / sweep | points / s | {head} |",
             "|---|---|---|---|---|---|---|"]
    ok = [r for r in rows if "error" not in r]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['algo']} | {r['n']:,} | {r['devices']} | | failed | | |")
            continue
        if ratio_to == "devices":
            ref = next((x for x in ok if x["algo"] == r["algo"] and x["n"] == r["n"]
                        and x["devices"] == 1), None)
        else:
            same = [x for x in ok if x["algo"] == r["algo"] and x["devices"] == r["devices"]]
            ref = min(same, key=lambda x: x["n"]) if same else None
        ratio = f"{r['points_per_second'] / ref['points_per_second']:.2f}" if ref else ""
        lines.append(f"| {r['algo']} | {r['n']:,} | {r['devices']} | {r['global_block']} | "
                     f"{r['seconds_per_sweep']:.3g} | {r['points_per_second']:.3g} | {ratio} |")
    return lines


def render(res: dict) -> str:
    gpu = res["machine"]["gpu_mode"]
    st = res["settings"]
    other = res["other_processes_mean_cores"]
    md = [f"# Data-parallel throughput ({'GPU' if gpu else 'CPU host devices'})", "",
          f"{res['date']}, {res['machine']['cpu_count']} CPUs; capacity {st['capacity']}, {st['dtype']}; "
          f"{st['data']}; one sweep from the generating 8-cluster partition, median of "
          f"{st['repeats']} after a compile+warm-up sweep. Written by `benchmarks/scale.py`.", "",
          f"## Versus devices (MAP-DP N = {res['scaling_n']['mapdp']:,}, "
          f"Gibbs N = {res['scaling_n']['gibbs']:,})", ""]
    md += table(res["by_devices"], "devices")
    md += ["", "## Versus N (one device)", ""]
    md += table(res["by_n"], "n")
    md += ["", f"Total wall time {res['total_wall_s']:.0f} s; CPU used by other processes during the "
           "run: " + ("unknown" if other is None else f"{other:.2f} cores on average")
           + f" (this run: {res['this_run_mean_cores']:.2f} cores); timings are clean only when the "
           "first number is near zero.", ""]
    if not gpu:
        md += ["On CPU the host devices share the machine's cores, so more devices than cores "
               "cannot be faster; the ratios mostly show the cost of the per-block collectives.", ""]
    md += ["The MAP-DP sweep on S devices is the same algorithm as on one device with the same "
           "global block; the Gibbs sweep with S > 1 is the approximate blocked sampler "
           "(`jaxbnp.inference.sharded`)."]
    return "\n".join(md) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--algo", default="mapdp")
    p.add_argument("--n", type=int, default=10_000)
    p.add_argument("--devices", type=int, default=1)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--block-size", type=int, default=4096, help="MAP-DP global block")
    p.add_argument("--gibbs-block-size", type=int, default=4096, help="Gibbs global block")
    p.add_argument("--gpu", action="store_true", help="use the accelerators JAX finds")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--device-counts", default=None, help="comma list (default 1,2,4,8 on CPU)")
    p.add_argument("--scaling-n", type=float, default=None, help="N of the device table (MAP-DP)")
    p.add_argument("--gibbs-scaling-n", type=float, default=None, help="N of the device table (Gibbs)")
    p.add_argument("--sizes", default=None, help="comma list of N for the size table")
    p.add_argument("--gibbs-max-n", type=float, default=None, help="largest N for Gibbs")
    p.add_argument("--timeout", type=int, default=1800)
    p.add_argument("--render-only", action="store_true", help="rewrite the .md from the .json")
    p.add_argument("--out-dir", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    stem = "scale_gpu" if args.gpu else "scale"
    if args.worker:
        print("JSON" + json.dumps(worker(args)), flush=True)
        return 0
    if args.render_only:
        res = json.loads((args.out_dir / f"{stem}.json").read_text())
        md = render(res)
        write_lines(args.out_dir / f"{stem}.md", [md.rstrip("\n")])
        print(md)
        return 0

    if args.gpu:
        import jax

        max_dev = jax.device_count()
        counts = [c for c in (1, 2, 4, 8, 16) if c <= max_dev]
        scaling_n, gibbs_scaling_n, sizes, gibbs_max = 10**7, 10**7, [10**5, 10**6, 10**7], 10**7
    elif args.quick:
        counts, scaling_n, gibbs_scaling_n, sizes, gibbs_max = [1, 2, 4, 8], 10**5, 10**4, [10**4, 10**5], 10**5
    else:
        counts, scaling_n, gibbs_scaling_n = [1, 2, 4, 8], 10**6, 10**5
        sizes, gibbs_max = [10**4, 10**5, 10**6, 10**7], 10**6
    if args.device_counts:
        counts = [int(c) for c in args.device_counts.split(",")]
    if args.scaling_n:
        scaling_n = int(args.scaling_n)
    if args.gibbs_scaling_n:
        gibbs_scaling_n = int(args.gibbs_scaling_n)
    if args.sizes:
        sizes = [int(float(s)) for s in args.sizes.split(",")]
    if args.gibbs_max_n:
        gibbs_max = int(args.gibbs_max_n)

    t_start = time.perf_counter()
    clock0 = cpu_seconds(children=True)
    print(f"scale benchmark: {'GPU' if args.gpu else 'CPU'}, {os.cpu_count()} CPUs, "
          f"load average {load_average()}", flush=True)
    by_devices = []
    for algo, n_dev in (("mapdp", scaling_n), ("gibbs", gibbs_scaling_n)):
        for c in counts:
            by_devices.append(run_worker(args, algo, n_dev, c))
    by_n = []
    for n in sizes:
        by_n.append(run_worker(args, "mapdp", n, 1))
    for n in sizes:
        if n <= gibbs_max:
            by_n.append(run_worker(args, "gibbs", n, 1))
    wall = time.perf_counter() - t_start
    clock1 = cpu_seconds(children=True)
    other = other_cpu_seconds(clock0, clock1)
    other = None if other is None else max(0.0, other / wall)
    res = {
        "date": utc_now(),
        # the workers are separate processes: the driver does not start JAX
        "machine": {**machine_info(with_jax=False), "gpu_mode": args.gpu},
        "settings": {"capacity": CAPACITY, "mapdp_global_block": args.block_size,
                     "gibbs_global_block": args.gibbs_block_size, "repeats": args.repeats,
                     "dtype": "float32", "data": "8 Gaussians in 2-D, DP(1), NormalGamma.from_data"},
        "scaling_n": {"mapdp": scaling_n, "gibbs": gibbs_scaling_n},
        "by_devices": by_devices, "by_n": by_n, "total_wall_s": wall,
        "other_processes_mean_cores": other, "this_run_mean_cores": (clock1[1] - clock0[1]) / wall,
        "load_average_end": load_average(),
    }
    write_json(args.out_dir / f"{stem}.json", res, indent=2)
    md = render(res)
    write_lines(args.out_dir / f"{stem}.md", [md.rstrip("\n")])
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
