"""Dirichlet diffusion trees on data that scikit-learn ships, beside Ward linkage (issue #23, item 4).

For each data set (iris: 150 x 4; a random subset of digits: 64 pixels), standardised:

* ``fit_ddt`` (population MCMC from the Ward tree: default settings but for the run length given here): the
  best tree's top splits (the clades below the root and below its children), each with
  its species/digit composition and its **posterior probability**: the share of the
  retained draws (all chains) in which that set of points is a clade;
* Ward linkage (``scipy.cluster.hierarchy.ward``) on the same data: its top splits and
  their composition;
* both trees cut into as many clusters as there are classes: NMI and ARI against them.

``python benchmarks/ddt_real.py`` writes ``benchmarks/results/ddt_real.{json,md}``.
"""

from __future__ import annotations

import argparse
import time
from collections import Counter

import numpy as np
from harness import RESULTS, machine_info, utc_now, write_json, write_lines


def clades_of(parent: np.ndarray, children: np.ndarray, n: int) -> dict[int, frozenset]:
    """Every internal node's set of leaves."""
    out: dict[int, frozenset] = {}

    def leaves(v: int) -> frozenset:
        if v < n:
            return frozenset([v])
        if v not in out:
            a, b = children[v - n]
            out[v] = leaves(int(a)) | leaves(int(b))
        return out[v]

    root = int(np.argmax(parent < 0))
    leaves(root)
    return out


def top_splits(parent, children, n, levels=2):
    """The clades below the root, level by level (``levels`` levels): a list of (level, clade)."""
    parent, children = np.asarray(parent), np.asarray(children)
    root = int(np.argmax(parent < 0))
    frontier, out = [root], []
    for level in range(1, levels + 1):
        nxt = []
        for v in frontier:
            if v < n:
                continue
            for ch in children[v - n]:
                ch = int(ch)
                out.append((level, ch))
                nxt.append(ch)
        frontier = nxt
    every = clades_of(parent, children, n)
    return [(lvl, every.get(v, frozenset([v]))) for lvl, v in out]


def ward_top_splits(Z: np.ndarray, n: int, levels=2):
    """The same for a SciPy linkage matrix (cluster ``n + i`` made at row ``i``)."""
    members: dict[int, frozenset] = {i: frozenset([i]) for i in range(n)}
    kids: dict[int, tuple[int, int]] = {}
    for i, (a, b, _, _) in enumerate(Z):
        members[n + i] = members[int(a)] | members[int(b)]
        kids[n + i] = (int(a), int(b))
    frontier, out = [2 * n - 2], []
    for level in range(1, levels + 1):
        nxt = []
        for v in frontier:
            if v in kids:
                for ch in kids[v]:
                    out.append((level, members[ch]))
                    nxt.append(ch)
        frontier = nxt
    return out


def composition(clade, y, names):
    counts = Counter(int(y[i]) for i in clade)
    return ", ".join(f"{names[k]} {counts[k]}" for k in sorted(counts))


def run(name, X, y, names, num_chains, num_samples, num_warmup, seed):
    import jax
    from scipy.cluster.hierarchy import fcluster, ward
    from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score

    from jaxbnp.inference.trees.fit import fit_ddt
    from jaxbnp.models.ddt import cut_tree

    X = (X - X.mean(0)) / X.std(0)
    n, k = X.shape[0], len(np.unique(y))
    t0 = time.perf_counter()
    fit = fit_ddt(X, num_chains=num_chains, num_samples=num_samples, num_warmup=num_warmup,
                  key=jax.random.key(seed), num_clusters=k, progress_bar=False)
    seconds = time.perf_counter() - t0
    trees = fit.samples["tree"]
    parents = np.asarray(trees.parent).reshape(-1, 2 * n - 1)
    childs = np.asarray(trees.children).reshape(-1, n - 1, 2)
    draws = [set(clades_of(p, c, n).values()) for p, c in zip(parents, childs)]

    def prob(clade):
        if len(clade) == 1:
            return 1.0
        return float(np.mean([clade in d for d in draws]))

    ddt_splits = [{"level": lvl, "size": len(cl), "composition": composition(cl, y, names),
                   "posterior_probability": prob(cl)}
                  for lvl, cl in top_splits(fit.tree.parent, fit.tree.children, n)]
    ddt_labels = np.asarray(cut_tree(fit.tree, num_clusters=k))
    Z = ward(X)
    ward_splits = [{"level": lvl, "size": len(cl), "composition": composition(cl, y, names),
                    "posterior_probability_under_ddt": prob(cl)}
                   for lvl, cl in ward_top_splits(Z, n)]
    ward_labels = fcluster(Z, k, criterion="maxclust")
    res = {
        "name": name, "n": n, "dim": X.shape[1], "classes": k, "num_chains": num_chains,
        "num_warmup": num_warmup, "num_samples": num_samples, "draws": len(draws),
        "fit_seconds": seconds, "c": fit.c, "sigma": fit.sigma,
        "ddt": {"splits": ddt_splits, "nmi": normalized_mutual_info_score(y, ddt_labels),
                "ari": adjusted_rand_score(y, ddt_labels)},
        "ward": {"splits": ward_splits, "nmi": normalized_mutual_info_score(y, ward_labels),
                 "ari": adjusted_rand_score(y, ward_labels)},
    }
    print(f"{name}: fit {seconds:.1f} s; DDT NMI {res['ddt']['nmi']:.3f}, Ward NMI {res['ward']['nmi']:.3f}",
          flush=True)
    for s in ddt_splits:
        print(f"   DDT  level {s['level']}: {s['size']:4d} points ({s['composition']}), "
              f"posterior probability {s['posterior_probability']:.2f}")
    for s in ward_splits:
        print(f"   Ward level {s['level']}: {s['size']:4d} points ({s['composition']}), "
              f"DDT posterior probability {s['posterior_probability_under_ddt']:.2f}")
    return res


def write_markdown(res, path):
    lines = ["# Dirichlet diffusion trees and Ward linkage on scikit-learn's data", "",
             f"Machine: {res['machine']['cpu_model']} ({res['machine']['cpu_count']} CPUs); run {res['date']}. `python benchmarks/ddt_real.py"
             f"{' ' + res['args'] if res['args'] else ''}`.", "",
             "Data standardised per column. DDT: `fit_ddt` (population MCMC from the Ward tree, its default; `c` and `σ` sampled, "
             "noise 0.1 × sd), best tree of the retained draws. A clade's posterior probability is "
             "the share of retained draws (all chains) in which exactly that set of points hangs "
             "below one node. Level 1: the root's two subtrees; level 2: theirs.", ""]
    for r in res["sets"]:
        lines += [f"## {r['name']} ({r['n']} × {r['dim']}, {r['classes']} classes)", "",
                  f"{r['num_chains']} chains × ({r['num_warmup']} warm-up + {r['num_samples']} draws), "
                  f"{r['fit_seconds']:.0f} s; best tree's c = {r['c']:.2f}, σ = {r['sigma']:.2f}.", "",
                  "| | cut into classes: NMI | ARI |", "|---|---:|---:|",
                  f"| DDT (best tree) | {r['ddt']['nmi']:.3f} | {r['ddt']['ari']:.3f} |",
                  f"| Ward | {r['ward']['nmi']:.3f} | {r['ward']['ari']:.3f} |", "",
                  "| tree | level | points | composition | DDT posterior probability |",
                  "|---|---:|---:|---|---:|"]
        for s in r["ddt"]["splits"]:
            lines.append(f"| DDT | {s['level']} | {s['size']} | {s['composition']} | {s['posterior_probability']:.2f} |")
        for s in r["ward"]["splits"]:
            lines.append(f"| Ward | {s['level']} | {s['size']} | {s['composition']} | "
                         f"{s['posterior_probability_under_ddt']:.2f} |")
        lines.append("")
    write_lines(path, lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--chains", type=int, default=8)
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--digits", type=int, default=300, help="digits subset size (0: skip digits)")
    parser.add_argument("--out", default=str(RESULTS))
    args = parser.parse_args(argv)
    from sklearn.datasets import load_digits, load_iris

    sets = []
    iris = load_iris()
    sets.append(run("iris", iris.data, iris.target, list(iris.target_names), args.chains, args.samples,
                    args.warmup, seed=0))
    if args.digits:
        digits = load_digits()
        idx = np.sort(np.random.default_rng(0).choice(len(digits.target), args.digits, replace=False))
        X = digits.data[idx]
        X = X[:, X.std(0) > 0]  # drop the always-blank pixels of the subset
        sets.append(run(f"digits ({args.digits} of {len(digits.target)})", X, digits.target[idx],
                        [str(i) for i in range(10)], args.chains, args.samples, args.warmup, seed=1))
    shown = " ".join(a for a in (argv if argv is not None else __import__("sys").argv[1:]))
    res = {"date": utc_now(), "machine": machine_info(), "args": shown, "sets": sets}
    from pathlib import Path
    out = Path(args.out)
    write_json(out / "ddt_real.json", res, indent=2)
    write_markdown(res, out / "ddt_real.md")
    print(f"wrote {out / 'ddt_real.json'} and {out / 'ddt_real.md'}")


if __name__ == "__main__":
    main()
