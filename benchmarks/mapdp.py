"""Benchmark: MAP-DP with its defaults against scikit-learn's BayesianGaussianMixture.

Data: 30 well separated diagonal Gaussians in D dimensions (labels uniform
over the 30 components, means ~ N(0, 10^2) per dimension, per-dimension
standard deviations ~ U(0.5, 1.5)), float32, N in {10^4, 10^5} by default
(``--sizes`` / ``--max-n`` change it), D = 10 (``--dims``).

Methods, on the same data in the same process:

* ``MAPDP()``: the defaults (k-means++ start with 32 clusters, batched
  sweeps, merge and split moves, the default prior rule, alpha = 1). Wall
  time of the first fit (with compilation) and of a second fit of the same
  shape (compiled), iterations (``n_iter_``: sweeps, merge and split rounds),
  clusters found K, NMI to the truth, NLL.
* ``MAPDP.paper(mode="batched")``: the paper's algorithm (one-cluster start,
  no split or merge moves), batched so that it is quick; same prior.
* ``BayesianGaussianMixture(covariance_type="diag",
  weight_concentration_prior_type="dirichlet_process", n_components=50,
  max_iter=100, random_state=0)`` (scikit-learn's defaults otherwise: one
  k-means initialisation): wall time, EM iterations, converged flag, K and
  NMI of ``predict``. 50 components: a truncation above the true 30.

Speed-up = BGM diag time / MAP-DP compiled time, both measured here.

Usage::

    python benchmarks/mapdp.py                 # 10^4 and 10^5 x 10 (a few minutes on 2 CPU cores)
    python benchmarks/mapdp.py --max-n 10000   # 10^4 only
    python benchmarks/mapdp.py --sizes 1000000 --out-name mapdp_1e6

Results: ``benchmarks/results/mapdp.json`` and ``benchmarks/results/mapdp.md``
(``--out-name`` changes the file name).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import (  # noqa: E402
    RESULTS, cpu_seconds, fit_bgm, machine_info, other_cpu_seconds, write_json, write_lines,
)

from sklearn.metrics import normalized_mutual_info_score  # noqa: E402

from jaxbnp.estimators import MAPDP, SingleClusterWarning  # noqa: E402

METHODS = ("mapdp", "mapdp_paper", "bgm_diag")
K_TRUE = 30
BGM_COMPONENTS = 50


def make_data(n: int, d: int, k: int = K_TRUE, seed: int = 0):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, k, n)
    means = rng.normal(0.0, 10.0, (k, d))
    sds = rng.uniform(0.5, 1.5, (k, d))
    X = means[y] + sds[y] * rng.normal(size=(n, d))
    return X.astype(np.float32), y


def run_mapdp(X, y, make, refit=True):
    """Fit twice: the first fit compiles, the second is timed compiled."""
    est = make()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SingleClusterWarning)
        t0 = time.perf_counter()
        est.fit(X)
        cold = warm = time.perf_counter() - t0
        if refit:
            t0 = time.perf_counter()
            est.fit(X)
            warm = time.perf_counter() - t0
    return {
        "time_first_fit_s": cold,
        "time_s": warm,
        "time_includes_compilation": not refit,
        "iterations": est.n_iter_,
        "clusters": est.n_clusters_,
        "nmi": float(normalized_mutual_info_score(y, est.labels_)),
        "nll": est.nll_,
    }


def run_bgm(X, y):
    return fit_bgm(X, y, BGM_COMPONENTS, "diag")


def fmt(v, spec):
    return "-" if v is None else format(v, spec)


def write_markdown(res, path):
    m = res["machine"]
    lines = [
        "# MAP-DP (defaults) vs scikit-learn BayesianGaussianMixture, 30 well separated Gaussians",
        "",
        f"Command: `{res['command']}`. Device: {m['jax_devices'][0]} "
        f"({m['cpu_model']}); {m['cpu_count']} CPUs; dtype {m['dtype']}; jax {m['jax']}, "
        f"scikit-learn {res['sklearn']}; git {m['jaxbnp_git']}.",
        f"True K = {K_TRUE}. MAP-DP: `MAPDP()` (defaults, alpha = 1); time = second fit "
        "(compiled), first fit (with compilation) in brackets. Paper: `MAPDP.paper(mode=\"batched\")`, "
        f"same prior. BGM: diag, DP weights, {BGM_COMPONENTS} components, max_iter 100. "
        "Speed-up = BGM diag time / MAP-DP compiled time.",
        "",
        "| N | D | MAP-DP s (first) | it | K | NMI | paper's algorithm s (first) | K | NMI "
        "| BGM diag s | it | K | NMI | speed-up |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in res["rows"]:
        m, p, b = row.get("mapdp"), row.get("mapdp_paper"), row.get("bgm_diag")

        def cell(r):
            if r is None:
                return "-"
            if r["time_includes_compilation"]:
                return f"{r['time_s']:.2f} (one fit, with compilation)"
            return f"{r['time_s']:.2f} ({r['time_first_fit_s']:.1f})"

        def get(r, key, spec):
            return "-" if r is None else format(r[key], spec)

        ratio = f"{b['time_s'] / m['time_s']:.1f}x" if m and b else "-"
        lines.append(
            f"| {row['n']:,} | {row['d']} | {cell(m)} | {get(m, 'iterations', 'd')} | "
            f"{get(m, 'clusters', 'd')} | {get(m, 'nmi', '.3f')} | {cell(p)} | "
            f"{get(p, 'clusters', 'd')} | {get(p, 'nmi', '.3f')} | "
            f"{get(b, 'time_s', '.2f')} | {get(b, 'iterations', 'd')} | {get(b, 'clusters', 'd')} | "
            f"{get(b, 'nmi', '.3f')} | {ratio} |"
        )
    lines.append("")
    lines.append(f"Wall time of the run: {res['wall_s']:.0f} s. CPU seconds used by other processes "
                 f"during the run: {fmt(res.get('other_cpu_s'), '.0f')}.")
    write_lines(path, lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--max-n", type=int, default=10**5, help="largest default N")
    ap.add_argument("--sizes", type=int, nargs="+", help="N values to run (default 10^4 10^5)")
    ap.add_argument("--dims", type=int, nargs="+", default=[10])
    ap.add_argument("--out-name", default="mapdp")
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS),
                    help="what to run (default all)")
    ap.add_argument("--no-refit", action="store_true",
                    help="fit MAP-DP once: the time includes compilation (what a user waits)")
    args = ap.parse_args(argv)
    sizes = args.sizes or [n for n in (10**4, 10**5) if n <= args.max_n]
    res = {
        "command": "python benchmarks/mapdp.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": machine_info(),
        "sklearn": __import__("sklearn").__version__,
        "k_true": K_TRUE,
        "rows": [],
    }
    clock0 = cpu_seconds()
    t_start = time.perf_counter()
    for n in sizes:
        for d in args.dims:
            X, y = make_data(n, d)
            row = {"n": n, "d": d}
            refit = not args.no_refit
            for method, fn in (
                ("mapdp", lambda: run_mapdp(X, y, MAPDP, refit)),
                ("mapdp_paper", lambda: run_mapdp(X, y, lambda: MAPDP.paper(mode="batched"), refit)),
                ("bgm_diag", lambda: run_bgm(X, y)),
            ):
                if method not in args.methods:
                    continue
                row[method] = fn()
                print(n, d, method, json.dumps(row[method]), flush=True)
            res["rows"].append(row)
    other = other_cpu_seconds(clock0, cpu_seconds())
    res["wall_s"] = time.perf_counter() - t_start
    if other is not None:
        res["other_cpu_s"] = other
    write_json(RESULTS / f"{args.out_name}.json", res)
    write_markdown(res, RESULTS / f"{args.out_name}.md")
    print((RESULTS / f"{args.out_name}.md").read_text())


if __name__ == "__main__":
    main()
