"""Benchmark: the sub-cluster chain on data in host memory (``fit_subcluster_chunked``, issue
#20) against the same chain with the data on the device (``subcluster.step`` in a jitted
loop), in the same script.

Data: ``benchmarks/subcluster.py``'s ``d10`` generator (30 Gaussians in 10-D, diagonal
covariances, equal weights), ``n`` points (default 10^6), float32, saved to a ``.npy`` file
in a temporary folder and read back as a ``np.memmap``; ``DP(1)``,
``NormalGamma.from_data`` on the first 10^5 points, capacity 64, 3 launch sweeps, the
same key for both runs, from one cluster.

* In memory: ``subcluster.step`` jitted; the first iteration (compilation) is off the
  clock; then each iteration is timed alone (``block_until_ready``).
* Streamed: ``fit_subcluster_chunked(memmap, ..., chunk_size)`` one iteration at a time
  would recompile, so it runs ``iterations`` iterations in one call and the time per
  iteration is (wall time - the one-iteration call's wall time) / (iterations - 1), which
  takes compilation and the validation pass out.

Columns: seconds per iteration, the bytes of ``X`` read per iteration (``(T + 5) n D 4``)
and the rate achieved, the NMI against the truth after the last iteration, and whether
the streamed chain's labels equal the in-memory chain's (float32: the statistics are
summed in another order, so draws differ by rounding and the two chains drift apart;
``--x64`` runs both in float64, where they stay equal).
``--no-memory`` skips the in-memory run (10^7 points: its ``(n, C)`` matrices take several
GB).

    python benchmarks/subcluster_stream.py                     # 10^6 x 10, 10 iterations
    python benchmarks/subcluster_stream.py --n 300000 --iterations 6 --x64
    python benchmarks/subcluster_stream.py --n 10000000 --iterations 3 --no-memory
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import (  # noqa: E402  (puts the repository root on sys.path)
    RESULTS, cpu_seconds, machine_info, other_cpu_seconds, utc_now, write_json, write_lines,
)
from subcluster import make_data, nmi  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import jaxbnp as bnp  # noqa: E402
from jaxbnp.inference.partition import subcluster  # noqa: E402
from jaxbnp.inference.partition.clusters import compact_labels  # noqa: E402

CAPACITY = 64
T = 3


def in_memory(X, family, key, iterations):
    step = jax.jit(subcluster.step, static_argnames=("capacity", "num_launch_sweeps"))
    Xd = jnp.asarray(X)
    labels = jnp.zeros(X.shape[0], jnp.int32)
    times = []
    for i, k in enumerate(jax.random.split(key, iterations)):
        t0 = time.perf_counter()
        labels = step(k, labels, Xd, bnp.DP(1.0), family, capacity=CAPACITY, num_launch_sweeps=T)[0]
        labels.block_until_ready()
        if i:
            times.append(time.perf_counter() - t0)
    return np.asarray(labels), float(np.median(times))


def streamed(X, family, key, iterations, chunk_size):
    def call(m):
        t0 = time.perf_counter()
        res = bnp.fit_subcluster_chunked(X, bnp.DP(1.0), family, m, key=key, capacity=CAPACITY,
                                         chunk_size=chunk_size, num_launch_sweeps=T)
        return res, time.perf_counter() - t0

    call(1)  # compiles
    _, one = call(1)
    res, many = call(iterations)
    return res, (many - one) / (iterations - 1)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--iterations", type=int, default=10)
    ap.add_argument("--chunk-size", type=int, default=1 << 18)
    ap.add_argument("--no-memory", action="store_true", help="skip the in-memory run")
    ap.add_argument("--x64", action="store_true", help="float64 (jax_enable_x64)")
    ap.add_argument("--out-name", default=None)
    args = ap.parse_args(argv)
    if args.x64:
        jax.config.update("jax_enable_x64", True)
    if args.iterations < 2:
        ap.error("--iterations must be >= 2")
    bnp.enable_compilation_cache(False)
    started, cpu0 = utc_now(), cpu_seconds()
    X, y, oracle = make_data(args.n, 10, 30, "diag", "uniform", seed=0)
    dtype = np.float64 if args.x64 else np.float32
    X = X.astype(dtype)
    family = bnp.NormalGamma.from_data(X[:100_000])
    key = jax.random.key(0)
    n, D = X.shape
    bytes_per_iteration = (T + 5) * n * D * X.itemsize
    rows = []
    mem_labels = None
    if not args.no_memory:
        mem_labels, s = in_memory(X, family, key, args.iterations)
        rows.append(dict(method="in memory (`subcluster.step`, jitted)", s_per_iteration=s,
                         nmi=nmi(y, mem_labels), num_clusters=len(np.unique(mem_labels))))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "X.npy"
        np.save(path, X)
        res, s = streamed(np.load(path, mmap_mode="r"), family, key, args.iterations, args.chunk_size)
    same = None
    if mem_labels is not None:
        same = float(np.mean(compact_labels(mem_labels) == res.labels))
    rows.append(dict(method=f"streamed from a memmap (`fit_subcluster_chunked`, chunks of "
                            f"{args.chunk_size:,})", s_per_iteration=s, nmi=nmi(y, res.labels),
                     num_clusters=int(res.num_clusters[-1]), gb_per_s=bytes_per_iteration / s / 1e9,
                     same_labels_fraction=same))
    out = dict(command="python benchmarks/subcluster_stream.py " + " ".join(argv or sys.argv[1:]),
               started=started, machine=machine_info(), n=n, d=D, capacity=CAPACITY, T=T,
               iterations=args.iterations, bytes_per_iteration=bytes_per_iteration,
               oracle_nmi=nmi(y, oracle), rows=rows,
               other_cpu_s=other_cpu_seconds(cpu0, cpu_seconds()))
    name = args.out_name or ("subcluster_stream" + ("" if args.n == 1_000_000 else f"_{n}")
                             + ("_x64" if args.x64 else ""))
    write_json(RESULTS / f"{name}.json", out)
    m = out["machine"]
    lines = [
        "# SubClusterMCMC's chain streamed from host memory vs on the device",
        "",
        f"Command: `{out['command'].strip()}`. Run {started}. {m.get('cpu_model')}, "
        f"{m.get('cpu_affinity')} CPUs; {m.get('jax_devices')}; {np.dtype(dtype).name}; jax {m.get('jax')}; "
        f"jaxbnp at {(m.get('jaxbnp_git') or {}).get('commit', '?')[:7]}. CPU seconds used by other "
        f"processes during the run: {out['other_cpu_s']:.0f}.",
        "",
        f"{n:,} x {D} points from 30 Gaussians (`subcluster.py`'s d10 generator), DP(1), "
        f"NormalGamma.from_data, capacity {CAPACITY}, {T} launch sweeps, {args.iterations} "
        f"iterations from one cluster, the same key. The Bayes classifier's NMI: "
        f"{out['oracle_nmi']:.3f}. Streaming reads X {T + 5} times per iteration "
        f"({bytes_per_iteration / 1e9:.2f} GB).",
        "",
        "| run | s / iteration | X read, GB/s | NMI after the last iteration | K | labels equal to in-memory |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        gbs = f"{r['gb_per_s']:.2f}" if "gb_per_s" in r else "-"
        eq = "-" if r.get("same_labels_fraction") is None else f"{100 * r['same_labels_fraction']:.2f} %"
        lines.append(f"| {r['method']} | {r['s_per_iteration']:.2f} | {gbs} | {r['nmi']:.3f} | "
                     f"{r['num_clusters']} | {eq} |")
    if len(rows) == 2:
        lines += ["", f"Streamed / in memory, time per iteration: "
                      f"{rows[1]['s_per_iteration'] / rows[0]['s_per_iteration']:.2f}x."]
    write_lines(RESULTS / f"{name}.md", lines)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
