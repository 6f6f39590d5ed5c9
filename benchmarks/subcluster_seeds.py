"""Benchmark: how the sub-cluster chain's NMI after 100 iterations varies over data sets and
keys on the dpmmpython README setting (``benchmarks/subcluster.py``'s ``dpmm_dp1``: 10,000 x 2
points from 10 Gaussians with full covariances, ``DP(1)``, ``NormalWishart.from_data``,
capacity 32, from one cluster).

``benchmarks/subcluster.py`` reports one data set and one key; this script runs 5 data sets
(``make_data`` seeds 0-4) x 4 chain keys with ``num_launch_sweeps`` 3 (the default) and 6,
100 iterations of ``subcluster.step`` (the kernel's iteration) in one jitted ``lax.scan``,
and reports the NMI after 25, 50 and 100 iterations (median, minimum, how many runs reach
0.97), the median time of 100 iterations after compilation, and per data set the NMI of
the Bayes classifier with the true parameters (what overlapping components leave to find)
beside the chains' median NMI after 100 iterations.

    python benchmarks/subcluster_seeds.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import RESULTS, machine_info, utc_now, write_json, write_lines  # noqa: E402
from subcluster import make_data, nmi  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import jaxbnp as bnp  # noqa: E402
from jaxbnp.inference.partition import subcluster  # noqa: E402

DATA_SEEDS = range(5)
KEYS = range(4)
CHECKPOINTS = (25, 50, 100)
TARGET = 0.97


def chain(X, family, T):
    @jax.jit
    def run(key):
        def body(labels, k):
            labels = subcluster.step(k, labels, X, bnp.DP(1.0), family, 32, T)[0]
            return labels, labels

        _, trace = jax.lax.scan(body, jnp.zeros(X.shape[0], jnp.int32), jax.random.split(key, 100))
        return trace[jnp.asarray(CHECKPOINTS) - 1]

    return run


def main():
    bnp.enable_compilation_cache(False)
    started = utc_now()
    rows, oracle, per_data = [], {}, {}
    for T in (3, 6):
        nmis = {c: [] for c in CHECKPOINTS}
        times = []
        for ds in DATA_SEEDS:
            X, y, best = make_data(10_000, 2, 10, "full", "dirichlet", seed=ds)
            oracle[ds] = nmi(y, best)
            run = chain(jnp.asarray(X), bnp.NormalWishart.from_data(X), T)
            run(jax.random.key(0)).block_until_ready()
            for k in KEYS:
                t0 = time.perf_counter()
                out = np.asarray(run(jax.random.key(k)))
                times.append(time.perf_counter() - t0)
                for c, labels in zip(CHECKPOINTS, out):
                    nmis[c].append(nmi(y, labels))
                per_data.setdefault((T, ds), []).append(nmis[100][-1])
        row = dict(T=T, median_s=float(np.median(times)), runs=len(times))
        for c in CHECKPOINTS:
            v = np.asarray(nmis[c])
            row[f"nmi_{c}"] = dict(median=float(np.median(v)), min=float(v.min()),
                                   reached=int(np.sum(v >= TARGET)), values=v.round(4).tolist())
        rows.append(row)
        print(row, flush=True)
    out = dict(command="python benchmarks/subcluster_seeds.py", started=started,
               machine=machine_info(), rows=rows, oracle_nmi=oracle,
               median_nmi_100={f"T{T}_data{ds}": float(np.median(v)) for (T, ds), v in per_data.items()})
    write_json(RESULTS / "subcluster_seeds.json", out)
    m = out["machine"]
    lines = [
        "# SubClusterMCMC on the dpmmpython README setting: NMI over data sets and keys",
        "",
        f"Command: `{out['command']}`. Run {started}. {m.get('cpu_model')}, {m.get('cpu_affinity')} "
        f"CPUs; float32; jax {m.get('jax')}; jaxbnp at "
        f"{(m.get('jaxbnp_git') or {}).get('commit', '?')[:7]}.",
        "",
        f"10,000 x 2 points from 10 Gaussians (full covariances), {len(DATA_SEEDS)} data sets x "
        f"{len(KEYS)} keys, DP(1), NormalWishart.from_data, capacity 32, from one cluster. "
        f"Cells: median NMI (minimum; runs with NMI >= {TARGET} of {len(DATA_SEEDS) * len(KEYS)}).",
        "",
        "| num_launch_sweeps | 100 iterations, median s | NMI after 25 | after 50 | after 100 |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        cells = [f"{r[f'nmi_{c}']['median']:.3f} ({r[f'nmi_{c}']['min']:.3f}; {r[f'nmi_{c}']['reached']})"
                 for c in CHECKPOINTS]
        lines.append(f"| {r['T']} | {r['median_s']:.2f} | " + " | ".join(cells) + " |")
    lines += ["", "Per data set: the Bayes classifier's NMI and the chains' median NMI after 100 "
                  "iterations.", "", "| data seed | Bayes classifier | T = 3 | T = 6 |", "|---|---|---|---|"]
    for ds in DATA_SEEDS:
        lines.append(f"| {ds} | {oracle[ds]:.3f} | {np.median(per_data[(3, ds)]):.3f} | "
                     f"{np.median(per_data[(6, ds)]):.3f} |")
    write_lines(RESULTS / "subcluster_seeds.md", lines)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
