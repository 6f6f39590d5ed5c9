"""Benchmark: MAP-DP (sequential and batched) against scikit-learn's BayesianGaussianMixture.

Data: a synthetic mixture of 10 diagonal Gaussians (weights ~ Dirichlet(2),
means ~ N(0, 3^2), per-dimension standard deviations ~ U(0.5, 1.5)), float32,
N in {10^4, 10^5, 10^6} and D in {2, 10, 50}. At D = 2 the components overlap
heavily, so no method can reach NMI 1 there.

Methods, on the same data in the same process:

* ``MAPDP(alpha=1, split_moves=True, mode=...)`` with the default prior
  ``NormalGamma.from_data(X)``, ``mode="sequential"`` and ``mode="batched"``
  (``block_size=4096``). Split moves are on because, started from one
  cluster, plain MAP-DP keeps all these points in one cluster (see
  ``jaxbnp.inference.mapdp``). Reported: wall time of the first fit (with
  compilation) and of a second fit of the same shape (compiled), sweeps
  (``n_iter_``, split rounds included), clusters found, NMI to the truth.
* ``BayesianGaussianMixture(weight_concentration_prior_type="dirichlet_process",
  n_components=20, covariance_type="diag" | "full", max_iter=100,
  random_state=0)`` (scikit-learn's defaults otherwise): wall time, EM
  iterations, converged flag, NMI of ``predict``.

Ratios are scikit-learn time / MAP-DP time (compiled), both measured here.
Large cells are skipped where one run would take many minutes on a 2-core
CPU; the table says which.

Usage::

    python benchmarks/mapdp.py                 # the grid below (about 25 minutes on 2 CPU cores)
    python benchmarks/mapdp.py --quick         # N = 10^4 only
    python benchmarks/mapdp.py --max-n 100000

Results: ``benchmarks/results/mapdp.json`` and ``benchmarks/results/mapdp.md``
(``--out-name`` changes the file name, e.g. for a GPU run).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import warnings
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import jax  # noqa: E402
from sklearn.exceptions import ConvergenceWarning  # noqa: E402
from sklearn.metrics import normalized_mutual_info_score  # noqa: E402
from sklearn.mixture import BayesianGaussianMixture  # noqa: E402

from gibbs import _git_state as git_state, cpu_seconds  # noqa: E402  (same helpers as the Gibbs benchmark)
from jaxbnp.estimators import MAPDP  # noqa: E402

RESULTS = REPO_ROOT / "benchmarks" / "results"


def make_data(n: int, d: int, k: int = 10, seed: int = 0):
    rng = np.random.default_rng(seed)
    weights = rng.dirichlet(np.full(k, 2.0))
    y = rng.choice(k, n, p=weights)
    means = rng.normal(0.0, 3.0, (k, d))
    sds = rng.uniform(0.5, 1.5, (k, d))
    X = means[y] + sds[y] * rng.normal(size=(n, d))
    return X.astype(np.float32), y


def run_mapdp(X, y, mode, refit=True):
    """Fit twice (first fit compiles); at 10^6 once, and then time = first fit."""
    est = MAPDP(alpha=1.0, split_moves=True, mode=mode, block_size=4096)
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


def run_bgm(X, y, cov):
    bgm = BayesianGaussianMixture(
        n_components=20, covariance_type=cov, max_iter=100, random_state=0,
        weight_concentration_prior_type="dirichlet_process",
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        t0 = time.perf_counter()
        bgm.fit(X)
        elapsed = time.perf_counter() - t0
    labels = bgm.predict(X)
    return {
        "time_s": elapsed,
        "iterations": int(bgm.n_iter_),
        "converged": bool(bgm.converged_),
        "clusters": int(len(np.unique(labels))),
        "nmi": float(normalized_mutual_info_score(y, labels)),
    }


def skip_reason(method: str, n: int, d: int) -> str | None:
    """Cells left out because one run would take many minutes on a 2-core CPU.

    Measured at 10^4 (``--quick``): full-covariance EM takes 9 s (D=2), 33 s
    (D=10) and 106 s (D=50), diag EM 1.6 to 13 s, for 100 iterations; both
    grow linearly in N.
    """
    if method == "mapdp_sequential" and n >= 10**6:
        return "sequential at 10^6: over 7 minutes per fit (10x the 10^5 time); see batched"
    if method == "bgm_full" and n > 10**4 and not (n == 10**5 and d == 2):
        return "full-covariance EM: over 5 minutes (10x the 10^4 time)"
    if method == "bgm_diag" and n >= 10**6:
        return "diag EM at 10^6: 3 to 20 minutes (10x the 10^5 time)"
    return None


def fmt(v, spec):
    return "-" if v is None else format(v, spec)


def write_markdown(res, path):
    lines = [
        "# MAP-DP vs scikit-learn BayesianGaussianMixture",
        "",
        f"Command: `{res['command']}`. Device: {res['device']}; {res['cpu_count']} CPUs; "
        f"dtype {res['dtype']}; jax {res['versions']['jax']}, scikit-learn {res['versions']['sklearn']}.",
        "MAP-DP: `MAPDP(alpha=1, split_moves=True)`, default prior; time = second fit (compiled), "
        "first fit (with compilation) in brackets; at N = 10^6 one fit only, compilation "
        "included. BGM: DP weights, 20 components, max_iter 100. "
        "Speed-up = BGM diag time / MAP-DP batched time.",
        "",
        "| N | D | MAP-DP seq s (first) | it | NMI | MAP-DP batched s (first) | it | K | NMI "
        "| BGM diag s | it | NMI | BGM full s | it | NMI | speed-up vs diag |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in res["rows"]:
        s, b = row.get("mapdp_sequential") or {}, row.get("mapdp_batched") or {}
        dg, fu = row.get("bgm_diag") or {}, row.get("bgm_full") or {}

        def cell(r, t="time_s"):
            if not r:
                return "skipped"
            if "time_first_fit_s" in r:
                return f"{r[t]:.2f} ({r['time_first_fit_s']:.1f})"
            return f"{r[t]:.2f}"

        ratio = dg["time_s"] / b["time_s"] if dg and b else None
        lines.append(
            f"| {row['n']:,} | {row['d']} | {cell(s)} | {s.get('iterations', '-')} | "
            f"{fmt(s.get('nmi'), '.3f')} | {cell(b)} | {b.get('iterations', '-')} | "
            f"{b.get('clusters', '-')} | {fmt(b.get('nmi'), '.3f')} | {cell(dg)} | "
            f"{dg.get('iterations', '-')} | {fmt(dg.get('nmi'), '.3f')} | {cell(fu)} | "
            f"{fu.get('iterations', '-')} | {fmt(fu.get('nmi'), '.3f')} | "
            f"{fmt(ratio, '.1f')}{'x' if ratio else ''} |"
        )
    lines += ["", "Skipped cells: " + "; ".join(sorted(set(res["skipped"]))) if res["skipped"] else ""]
    lines.append(f"CPU seconds used by other processes during the run: {fmt(res.get('other_cpu_s'), '.0f')}.")
    path.write_text("\n".join(lines) + "\n")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="N = 10^4 only")
    ap.add_argument("--max-n", type=int, default=10**6)
    ap.add_argument("--sizes", type=int, nargs="+", help="N values to run (default 10^4 10^5 10^6)")
    ap.add_argument("--dims", type=int, nargs="+", default=[2, 10, 50])
    ap.add_argument("--out-name", default="mapdp")
    args = ap.parse_args(argv)
    sizes = [n for n in (args.sizes or (10**4, 10**5, 10**6)) if n <= (10**4 if args.quick else args.max_n)]
    dev = jax.devices()[0]
    res = {
        "command": "python benchmarks/mapdp.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "device": f"{dev.platform}: {dev.device_kind}",
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "dtype": str(jax.numpy.result_type(float)),
        "versions": {"jax": jax.__version__, "sklearn": __import__("sklearn").__version__},
        "git": git_state(),
        "rows": [],
        "skipped": [],
    }
    busy0, own0 = cpu_seconds()
    t_start = time.perf_counter()
    for n in sizes:
        for d in args.dims:
            X, y = make_data(n, d)
            row = {"n": n, "d": d}
            for method, fn in (
                ("mapdp_batched", lambda: run_mapdp(X, y, "batched", n < 10**6)),
                ("mapdp_sequential", lambda: run_mapdp(X, y, "sequential", n < 10**6)),
                ("bgm_diag", lambda: run_bgm(X, y, "diag")),
                ("bgm_full", lambda: run_bgm(X, y, "full")),
            ):
                reason = skip_reason(method, n, d)
                if reason:
                    row[method] = None
                    res["skipped"].append(f"{method} at {n:,} x {d} ({reason})")
                    continue
                row[method] = fn()
                print(n, d, method, json.dumps(row[method]), flush=True)
            res["rows"].append(row)
            RESULTS.mkdir(parents=True, exist_ok=True)
            (RESULTS / f"{args.out_name}.json").write_text(json.dumps(res, indent=1))
    busy1, own1 = cpu_seconds()
    res["wall_s"] = time.perf_counter() - t_start
    if busy0 is not None:
        res["other_cpu_s"] = (busy1 - busy0) - (own1 - own0)
    (RESULTS / f"{args.out_name}.json").write_text(json.dumps(res, indent=1))
    write_markdown(res, RESULTS / f"{args.out_name}.md")
    print((RESULTS / f"{args.out_name}.md").read_text())


if __name__ == "__main__":
    main()
