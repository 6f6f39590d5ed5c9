"""Benchmark: BHMC (nCRP + multilevel HDP mixture, issue #6, docs/mathematics.md §6) against Ward clustering.

For each data set, BHMC (``jaxbnp.inference.bhmc.sampler.fit_bhmc``, depth 2, its defaults;
the posterior summary of each level, and the sample with the highest complete-data log
likelihood, as in the paper) and SciPy's
Ward agglomerative clustering (``linkage(method="ward")`` cut by
``fcluster(maxclust=k)`` with ``k`` = the summary's number of clusters at that level)
are scored level by level against the known labels with purity, NMI, ARI and
F-measure (``jaxbnp.metrics.level_scores``; paths shorter than the evaluated
depth keep their last label, the paper's rule):

1. ``tree``: simulated hierarchical Gaussian data, 3 groups x 3 subgroups in 2-D
   (group centres 12 apart, subgroups 3 apart, sd 0.5): two true levels.
2. ``digits``: scikit-learn's digits, a stratified subsample, PCA to 10
   dimensions (scikit-learn), standardised; one true level (the digit),
   used at both levels.

Speed: sweeps (iterations of Algorithm 2) per second per chain, the first
sweep (with compilation) excluded. Also recorded: CPU seconds used by other
processes during the run (the machine is shared; timings are only clean when
that is near zero).

Results go to ``benchmarks/results/<--out-name>.{json,md}`` (default ``bhmc``).

Usage::

    python benchmarks/bhmc.py            # about 5 minutes on 2 idle CPU cores
    python benchmarks/bhmc.py --quick    # smaller data, fewer sweeps
    python benchmarks/bhmc.py --only digits --depth 4 --warmup 500 --samples 5000 --chains 1 \
        --out-name bhmc_digits_paper     # the paper's run length at depth 4
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import (  # noqa: E402  (the benchmarks' harness)
    RESULTS, cpu_seconds, load_average, machine_info, other_cpu_seconds, utc_now, write_json, write_lines,
)

import jax  # noqa: E402

from jaxbnp import metrics  # noqa: E402
from jaxbnp.inference.bhmc.sampler import fit_bhmc  # noqa: E402


def tree_data(per_leaf: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    X, paths = [], []
    for g in range(3):
        centre = 12.0 * np.array([np.cos(2 * np.pi * g / 3), np.sin(2 * np.pi * g / 3)])
        for s in range(3):
            sub = centre + 3.0 * np.array([np.cos(2 * np.pi * s / 3 + g), np.sin(2 * np.pi * s / 3 + g)])
            X.append(sub + 0.5 * rng.normal(size=(per_leaf, 2)))
            paths += [[g, 3 * g + s]] * per_leaf
    return np.concatenate(X), np.array(paths)


def digits_data(num_points: int, dim: int = 10, seed: int = 0):
    from sklearn.datasets import load_digits
    from sklearn.decomposition import PCA

    data = load_digits()
    rng = np.random.default_rng(seed)
    per_class = num_points // 10
    idx = np.concatenate([rng.choice(np.nonzero(data.target == d)[0], per_class, replace=False) for d in range(10)])
    Z = PCA(n_components=dim, random_state=seed).fit_transform(data.data[idx])
    Z = (Z - Z.mean(0)) / Z.std(0)
    y = data.target[idx]
    return Z, np.stack([y, y], axis=1)


def ward_paths(X, ks):
    from scipy.cluster.hierarchy import fcluster, linkage

    Z = linkage(X, method="ward")
    return np.stack([fcluster(Z, t=k, criterion="maxclust") for k in ks], axis=1)


def run_dataset(name, X, truth, args, hyper):
    depth = args.depth
    truth = np.concatenate([truth, np.repeat(truth[:, -1:], max(0, depth - truth.shape[1]), axis=1)], axis=1)
    fit = fit_bhmc(X, key=jax.random.key(args.seed), depth=depth, num_warmup=args.warmup,
                   num_samples=args.samples,
                   num_chains=args.chains, compiler_options=None, **hyper)
    t = fit.samples["timing"]
    summary = np.stack(fit.summary_labels_per_level, axis=1)  # the posterior summary per level
    ks = [int(len(np.unique(summary[:, l]))) for l in range(depth)]
    ks_best = [int(len(np.unique(fit.paths[:, l]))) for l in range(depth)]
    ward = ward_paths(X, ks)
    rows = []
    for level in range(1, depth + 1):
        rows.append({"level": level, "k": ks[level - 1], "k_best": ks_best[level - 1],
                     "bhmc": metrics.level_scores(truth, summary, level),
                     "bhmc_best": metrics.level_scores(truth, fit.paths, level),
                     "ward": metrics.level_scores(truth, ward, level)})
    desc = ", ".join(f"{k}={v}" for k, v in hyper.items() if not isinstance(v, np.ndarray))
    desc += ", " + ", ".join(f"{k}={float(v[0, 0]):g} I" for k, v in hyper.items()
                             if isinstance(v, np.ndarray) and v.ndim == 2)
    res = {
        "name": name, "num_points": int(X.shape[0]), "dim": int(X.shape[1]), "hyper": desc,
        "levels": rows,
        "sweeps_per_second_per_chain": t["num_other_sweeps"] / t["other_sweeps_s"],
        "chain_sweeps_per_second": t["num_other_sweeps"] * t["num_chains"] / t["other_sweeps_s"],
        "first_sweep_with_compile_s": t["first_sweep_s"],
        "sampling_s": t["other_sweeps_s"],
        "best_log_lik": float(np.max(fit.log_lik)),
        "mean_accept_rate": float(np.mean(fit.samples["accept_rate"])),
        "mean_regrafted": float(np.mean(fit.samples["num_regrafted"])),
        "mean_split_merge": float(np.mean(fit.samples["num_split_merge"])),
        "mean_num_leaves": float(np.mean(fit.samples["num_leaves"])),
        "mean_num_components": float(np.mean(fit.samples["num_components"])),
    }
    print(json.dumps(res, indent=1, default=float), flush=True)
    return res


def write_markdown(res: dict, path: Path) -> None:
    m = res["machine"]
    lines = [
        "# BHMC (nCRP + multilevel HDP mixture) vs Ward, level by level",
        "",
        f"Machine: {m['cpu_model']} ({m['cpu_count']} CPUs), {m['platform']}; JAX {m['jax']} on "
        f"{m['jax_backend']}, dtype {m['dtype']}. "
        f"Run {res['date']}. Command: `{res['command']}`. "
        f"CPU seconds used by other processes during the run: {res['other_cpu_s']:.0f} "
        f"(wall {res['wall_s']:.0f} s; the timings are only clean when this is near zero).",
        "",
        f"BHMC: depth {res['depth']}, {res['chains']} chain(s), {res['warmup']} warm-up + {res['samples']} sweeps, "
        "`fit_bhmc`'s defaults (path Gibbs, subtree moves, component split-merge, exact weights, Ward "
        "start). `BHMC`: the "
        "posterior summary of each level (the partition minimising the expected variation of "
        "information over all draws); `BHMC best draw`: the draw with the highest complete-data log "
        "likelihood (the paper's choice; its k in brackets). Ward: SciPy `linkage(method='ward')` + "
        "`fcluster(maxclust=k)` with k = the summary's number of clusters at the level. Scores against "
        "the known labels (digits: the digit at every level; tree: levels below its two keep the "
        "second); paths shorter than the level keep their last label.",
        "",
        "| data | n x d | level | k | method | purity | NMI | ARI | F-measure |",
        "|---|---|---:|---:|---|---:|---:|---:|---:|",
    ]
    names = {"bhmc": "BHMC", "bhmc_best": "BHMC best draw", "ward": "Ward"}
    for d in res["datasets"]:
        for row in d["levels"]:
            for method in ("bhmc", "ward", "bhmc_best"):
                s = row[method]
                k = f"({row['k_best']})" if method == "bhmc_best" else row["k"]
                lines.append(
                    f"| {d['name']} | {d['num_points']} x {d['dim']} | {row['level']} | {k} | "
                    f"{names[method]} | {s['purity']:.3f} | {s['nmi']:.3f} | "
                    f"{s['ari']:.3f} | {s['f_measure']:.3f} |")
    lines += ["", "| data | sweeps / s per chain | chain-sweeps / s | first sweep incl. compile (s) | "
                  "points whose path changed per sweep | subtrees moved per sweep | component splits + merges "
                  "per sweep | mean leaves | mean components | hyperparameters |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for d in res["datasets"]:
        lines.append(
            f"| {d['name']} | {d['sweeps_per_second_per_chain']:.2f} | {d['chain_sweeps_per_second']:.2f} | "
            f"{d['first_sweep_with_compile_s']:.1f} | {d['mean_accept_rate']:.2f} | {d['mean_regrafted']:.1f} | "
            f"{d['mean_split_merge']:.2f} | "
            f"{d['mean_num_leaves']:.1f} | "
            f"{d['mean_num_components']:.1f} | {d['hyper']} |")
    write_lines(path, lines)


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--chains", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--depth", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=None, help="default 150 (--quick: 50)")
    parser.add_argument("--samples", type=int, default=None, help="default 150 (--quick: 50)")
    parser.add_argument("--only", choices=["tree", "digits"], default=None)
    parser.add_argument("--out-name", default="bhmc")
    args = parser.parse_args(argv)
    argv = sys.argv[1:] if argv is None else argv
    quick = (50, 50) if args.quick else (150, 150)
    args.warmup = quick[0] if args.warmup is None else args.warmup
    args.samples = quick[1] if args.samples is None else args.samples
    per_leaf, n_digits = (10, 100) if args.quick else (20, 250)
    res = {
        "machine": machine_info(),
        "date": utc_now(),
        "command": " ".join(["python benchmarks/bhmc.py"] + list(argv)),
        "chains": args.chains, "warmup": args.warmup, "samples": args.samples, "depth": args.depth,
        "load_average_start": load_average(),
    }
    clock0 = cpu_seconds()
    t0 = time.perf_counter()
    X, truth = tree_data(per_leaf)
    tree_hyper = {"alpha": 0.5, "gamma0": 3.0, "gamma": 0.5, "Sigma": 0.25 * np.eye(2),
                  "Sigma0": 100.0 * np.eye(2), "mu0": np.zeros(2)}
    Xd, yd = digits_data(n_digits)
    digits_hyper = {"alpha": 0.5, "gamma0": 1.5, "gamma": 2.0, "Sigma": 0.3 * np.eye(Xd.shape[1]),
                    "Sigma0": np.eye(Xd.shape[1]), "mu0": np.zeros(Xd.shape[1])}
    datasets = ([] if args.only == "digits" else [run_dataset("tree", X, truth, args, tree_hyper)]) + \
               ([] if args.only == "tree" else [run_dataset("digits-pca10", Xd, yd, args, digits_hyper)])
    other = other_cpu_seconds(clock0, cpu_seconds())
    res["datasets"] = datasets
    res["wall_s"] = time.perf_counter() - t0
    res["other_cpu_s"] = float("nan") if other is None else other
    res["load_average_end"] = load_average()
    write_json(RESULTS / f"{args.out_name}.json", res)
    write_markdown(res, RESULTS / f"{args.out_name}.md")
    print((RESULTS / f"{args.out_name}.md").read_text())


if __name__ == "__main__":
    main()
