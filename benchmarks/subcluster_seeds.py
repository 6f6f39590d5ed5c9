"""Benchmark: how the sub-cluster chain's NMI after 100 iterations varies over data sets and
keys on the dpmmpython README setting (``benchmarks/subcluster.py``'s ``dpmm_dp1``: 10,000 x 2
points from 10 Gaussians with full covariances, ``DP(1)``, ``NormalWishart.from_data``,
capacity 32, from one cluster), with and without the absorb and reassign moves
(docs/mathematics.md §7); and the number of clusters at 10^5 and 10^6 points on
full-covariance data (``--k-table``).

5 data sets (``make_data`` seeds 0-4) x 4 chain keys, ``num_launch_sweeps`` 3, 100
iterations of ``subcluster.step`` (the kernel's iteration) in one jitted ``lax.scan``. For
each setting: the NMI after 25, 50 and 100 iterations (median, minimum, how many runs reach
the mark), the median time of 100 iterations after compilation. The mark of a run is NMI
>= 0.97, or within 0.01 of the Bayes classifier (true weights, means and covariances) where
that is below 0.97. A chain's state is a posterior draw, whose labels of points in the
overlap of two clusters are drawn, not the most probable ones: per data set the table also
gives the NMI of labels drawn from the true parameters' responsibilities (median of 20
draws), and the NMI of the chain's own classifier (each point's most probable cluster under
the weights and parameters of the last iteration's label step).

``--k-table``: ``ordinary.py``'s ``fullcov-D10-K30`` data (30 full-covariance clusters,
D = 10, unequal sizes) at 10^5 and 10^6 points, capacity 64, 200 iterations from one cluster,
with and without the cleanup moves: the number of clusters after 50, 100 and 200 iterations,
the NMI, the time per iteration and the compilation.

    python benchmarks/subcluster_seeds.py
    python benchmarks/subcluster_seeds.py --k-table
    python benchmarks/subcluster_seeds.py --settings 1,0 1,2 --out-name subcluster_seeds_moves
"""

from __future__ import annotations

import argparse
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
#: (absorb moves, reassign moves) per iteration: none, and the defaults
SETTINGS = ((0, 0), (subcluster.DEFAULT_ABSORB_MOVES, subcluster.DEFAULT_REASSIGN_MOVES))


def chain(X, family, capacity, iterations, checkpoints, absorb, reassign):
    @jax.jit
    def run(key):
        def body(labels, k):
            labels, state, _ = subcluster.step(k, labels, X, bnp.DP(1.0), family, capacity, 3,
                                               num_absorb_moves=absorb,
                                               num_reassign_moves=reassign)
            return labels, (labels, state.log_weights, state.params)

        _, (trace, log_w, params) = jax.lax.scan(body, jnp.zeros(X.shape[0], jnp.int32),
                                                 jax.random.split(key, iterations))
        last = jax.tree.map(lambda a: a[-1], params)
        classifier = jnp.argmax(family.log_likelihood(X, last) + log_w[-1], axis=-1)
        return trace[jnp.asarray(checkpoints) - 1], classifier

    return run


def marks(nmis, bayes):
    return [v >= TARGET or (bayes < TARGET and v >= bayes - 0.01) for v in nmis]


def seeds_table(settings=SETTINGS, out_name="subcluster_seeds"):
    bnp.enable_compilation_cache(False)
    started = utc_now()
    rows, oracle, per_data = [], {}, {}
    for absorb, reassign in settings:
        nmis = {c: [] for c in CHECKPOINTS}
        times, ok = [], []
        for ds in DATA_SEEDS:
            X, y, best, resp = make_data(10_000, 2, 10, "full", "dirichlet", seed=ds,
                                         responsibilities=True)
            rng = np.random.default_rng(ds)
            draws = [nmi(y, (rng.random((len(resp), 1)) > np.cumsum(resp, 1)).sum(1))
                     for _ in range(20)]
            oracle[ds] = dict(bayes=nmi(y, best), draw=float(np.median(draws)))
            run = chain(jnp.asarray(X), bnp.NormalWishart.from_data(X), 32, 100, CHECKPOINTS,
                        absorb, reassign)
            run(jax.random.key(0))[0].block_until_ready()
            for k in KEYS:
                t0 = time.perf_counter()
                out, classifier = run(jax.random.key(k))
                out = np.asarray(out)
                times.append(time.perf_counter() - t0)
                for c, labels in zip(CHECKPOINTS, out):
                    nmis[c].append(nmi(y, labels))
                c_nmi = nmi(y, np.asarray(classifier))
                ok.append((marks([nmis[100][-1]], oracle[ds]["bayes"])[0],
                           marks([c_nmi], oracle[ds]["bayes"])[0],
                           nmis[100][-1] >= oracle[ds]["draw"] - 0.01))
                per_data.setdefault((absorb, reassign, ds), []).append(
                    (nmis[100][-1], c_nmi, len(np.unique(out[-1]))))
        ok = np.asarray(ok)
        row = dict(absorb=absorb, reassign=reassign, median_s=float(np.median(times)),
                   runs=len(times), at_mark=int(ok[:, 0].sum()), classifier_at_mark=int(ok[:, 1].sum()),
                   near_draw=int(ok[:, 2].sum()))
        for c in CHECKPOINTS:
            v = np.asarray(nmis[c])
            row[f"nmi_{c}"] = dict(median=float(np.median(v)), min=float(v.min()),
                                   reached=int(np.sum(v >= TARGET)), values=v.round(4).tolist())
        rows.append(row)
        print(row, flush=True)
    command = "python benchmarks/subcluster_seeds.py" + (
        "" if settings == SETTINGS else " --settings " + " ".join(f"{a},{r}" for a, r in settings)
        + f" --out-name {out_name}")
    out = dict(command=command, started=started,
               machine=machine_info(), rows=rows, oracle=oracle,
               per_data={f"absorb{a}_reassign{r}_data{ds}": v for (a, r, ds), v in per_data.items()})
    write_json(RESULTS / f"{out_name}.json", out)
    m = out["machine"]
    n_runs = len(DATA_SEEDS) * len(KEYS)
    lines = [
        "# SubClusterMCMC on the dpmmpython README setting: NMI over data sets and keys",
        "",
        f"Command: `{out['command']}`. Run {started}. {m.get('cpu_model')}, {m.get('cpu_affinity')} "
        f"CPUs; float32; jax {m.get('jax')}; jaxbnp at "
        f"{(m.get('jaxbnp_git') or {}).get('commit', '?')[:7]}.",
        "",
        f"10,000 x 2 points from 10 Gaussians (full covariances), {len(DATA_SEEDS)} data sets x "
        f"{len(KEYS)} keys, DP(1), NormalWishart.from_data, capacity 32, `num_launch_sweeps` 3, "
        f"from one cluster. Cells: median NMI (minimum; runs with NMI >= {TARGET} of {n_runs}). "
        f"At the mark: NMI >= {TARGET}, or within 0.01 of the Bayes classifier where that is "
        f"below {TARGET}, after 100 iterations: the chain's draw, and the chain's classifier "
        "(each point's most probable cluster under the last label step's weights and "
        "parameters). Near a draw: the chain's NMI within 0.01 of labels drawn from the true "
        "parameters' responsibilities (the median of 20 such draws).",
        "",
        "| absorb, reassign moves | 100 iterations, median s | NMI after 25 | after 50 | after 100 "
        "| draw at the mark | classifier at the mark | near a draw |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        cells = [f"{r[f'nmi_{c}']['median']:.3f} ({r[f'nmi_{c}']['min']:.3f}; {r[f'nmi_{c}']['reached']})"
                 for c in CHECKPOINTS]
        lines.append(f"| {r['absorb']}, {r['reassign']} | {r['median_s']:.2f} | " + " | ".join(cells)
                     + f" | {r['at_mark']} of {r['runs']} | {r['classifier_at_mark']} of {r['runs']} "
                     f"| {r['near_draw']} of {r['runs']} |")
    lines += ["", "Per data set, after 100 iterations: the Bayes classifier's NMI, the median NMI "
                  "of labels drawn from the true responsibilities (what a posterior draw can hope "
                  "for), and over the 4 keys the chains' NMI (min-max), their classifiers' NMI "
                  "(min-max) and K.", ""]
    head = "| data seed | Bayes classifier | true-parameter draw |"
    for a, r in settings:
        head += f" chains ({a}, {r}) | classifiers ({a}, {r}) | K ({a}, {r}) |"
    lines += [head, "|" + "---|" * (3 + 3 * len(settings))]
    for ds in DATA_SEEDS:
        cells = f"| {ds} | {oracle[ds]['bayes']:.3f} | {oracle[ds]['draw']:.3f} |"
        for a, r in settings:
            v = np.asarray(per_data[(a, r, ds)])
            cells += (f" {v[:, 0].min():.3f}-{v[:, 0].max():.3f} | {v[:, 1].min():.3f}-{v[:, 1].max():.3f}"
                      f" | {', '.join(str(int(k)) for k in v[:, 2])} |")
        lines.append(cells)
    write_lines(RESULTS / f"{out_name}.md", lines)
    print("\n".join(lines))


def k_table(sizes):
    from ordinary import gaussian_clusters

    bnp.enable_compilation_cache(False)
    started = utc_now()
    rows = []
    checkpoints = (50, 100, 200)
    for n in sizes:
        X, y = gaussian_clusters(n, 30, 10, 2, 2.5)
        X = X.astype(np.float32)
        family = bnp.NormalWishart.from_data(X)
        for absorb, reassign in SETTINGS:
            run = chain(jnp.asarray(X), family, 64, 200, checkpoints, absorb, reassign)
            t0 = time.perf_counter()
            compiled = run.lower(jax.random.key(0)).compile()
            compile_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            out = np.asarray(compiled(jax.random.key(0))[0])
            seconds = time.perf_counter() - t0
            row = dict(n=n, absorb=absorb, reassign=reassign, compile_s=compile_s, seconds=seconds,
                       K=[int(len(np.unique(o))) for o in out], nmi=[nmi(y, o) for o in out])
            rows.append(row)
            print(row, flush=True)
    out = dict(command="python benchmarks/subcluster_seeds.py --k-table", started=started,
               machine=machine_info(), rows=rows)
    write_json(RESULTS / "subcluster_k.json", out)
    m = out["machine"]
    lines = [
        "# SubClusterMCMC: clusters found on full-covariance data at 10^5 and 10^6 points",
        "",
        f"Command: `{out['command']}`. Run {started}. {m.get('cpu_model')}, {m.get('cpu_affinity')} "
        f"CPUs; float32; jax {m.get('jax')}; jaxbnp at "
        f"{(m.get('jaxbnp_git') or {}).get('commit', '?')[:7]}.",
        "",
        "`ordinary.py`'s fullcov-D10-K30 data (30 clusters, random full covariances, unequal "
        "sizes, D = 10); DP(1), NormalWishart.from_data, capacity 64, `num_launch_sweeps` 3, "
        "from one cluster, key 0, 200 iterations in one compiled program (compilation timed "
        "apart). True K = 30.",
        "",
        "| n | absorb, reassign moves | K after 50 | 100 | 200 | NMI after 200 | s per iteration "
        "| compile s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['n']:,} | {r['absorb']}, {r['reassign']} | {r['K'][0]} | {r['K'][1]} | "
                     f"{r['K'][2]} | {r['nmi'][2]:.3f} | {r['seconds'] / 200:.3f} | "
                     f"{r['compile_s']:.1f} |")
    write_lines(RESULTS / "subcluster_k.md", lines)
    print("\n".join(lines))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--k-table", action="store_true")
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--settings", nargs="+", default=None, metavar="ABSORB,REASSIGN",
                        help="the seeds table's settings (default: 0,0 and the defaults)")
    parser.add_argument("--out-name", default="subcluster_seeds")
    args = parser.parse_args()
    if args.k_table:
        k_table(args.sizes)
    else:
        settings = SETTINGS if args.settings is None else tuple(
            tuple(int(v) for v in item.split(",")) for item in args.settings)
        seeds_table(settings, args.out_name)


if __name__ == "__main__":
    main()
