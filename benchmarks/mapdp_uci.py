"""Benchmark: the MAP-DP paper's UCI comparison (Raykov et al. 2014, Tables 2 and 3).

On the UCI sets scikit-learn ships (wine, iris, breast cancer), NMI to the
class labels and iterations to convergence of

* **MAP-DP, the paper's algorithm** (``MAPDP.paper()``: all points start in
  one cluster, sequential sweeps, no split or merge moves; float64) with the
  paper's empirical normal-gamma prior, which never looks at the labels:
  ``m0`` = the sample mean, ``k0 = 1/N`` (the Kass-Wasserman
  unit-information value; the paper uses "a scaled version" without giving
  the scale), ``a0 = 1`` (not given in the paper) and ``b0`` = the
  per-dimension sample variance. ``alpha`` is chosen by the lowest NLL over
  a grid (paper, appendix A.3) with ``select_alpha``.
* **MAP-DP defaults, the paper's prior**: ``MAPDP()``'s algorithm (k-means++
  start, batched sweeps, merge and split moves) with the paper's prior.
* **MAP-DP defaults** (``MAPDP()`` and ``select_alpha`` as shipped: the
  default prior rule ``jaxbnp.inference.partition.mapdp.default_prior``, which is the
  paper's prior with ``b0`` = the within-group variance of a 2-means
  clustering), alpha by NLL.
* **DP-means** (Kulis & Jordan 2012, written below in NumPy) on the raw data,
  with ``lambda`` found by bisection so that it returns the true number of
  classes, as in the paper; iterations = passes until no label changes.
* **Collapsed Gibbs** (``jaxbnp.CollapsedGibbs`` through ``numpyro.infer.MCMC``)
  with the paper's prior and the alpha the defaults chose under it, started
  from singletons (from one cluster it stays there, like MAP-DP): NMI mean and two standard
  deviations over the kept draws (the paper's Table 2 convention);
  "iterations" = the first iteration at which the log joint reaches the
  median of the kept draws (the paper used the Raftery-Lewis diagnostic).

The paper's numbers are printed beside ours. Results:
``benchmarks/results/mapdp_uci.json`` and ``benchmarks/results/mapdp_uci.md``.

Usage::

    python benchmarks/mapdp_uci.py            # about 6 minutes on 2 CPU cores
    python benchmarks/mapdp_uci.py --quick    # shorter Gibbs runs
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import numpyro  # noqa: E402
from numpyro.infer import MCMC  # noqa: E402
from sklearn.datasets import load_breast_cancer, load_iris, load_wine  # noqa: E402
from sklearn.metrics import normalized_mutual_info_score as nmi  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import RESULTS, machine_info, write_json, write_lines  # noqa: E402  (the benchmarks' harness)

import jaxbnp as bnp  # noqa: E402
from jaxbnp.estimators import MAPDP, select_alpha  # noqa: E402

PAPER = {  # Table 2 (NMI) and Table 3 (iterations): DP-means, Gibbs, MAP-DP
    "wine": {"nmi": (0.42, "0.72 (0.06)", 0.86), "iterations": (19, 2365, 11)},
    "iris": {"nmi": (0.76, "0.75 (0.06)", 0.76), "iterations": (8, 1543, 5)},
    "breast_cancer": {"nmi": (0.75, "0.70 (0.01)", 0.71), "iterations": (8, 939, 8)},
}
LOADERS = {"wine": load_wine, "iris": load_iris, "breast_cancer": load_breast_cancer}
ALPHAS = [0.01, 0.1, 1.0, 10.0, 100.0, 1000.0]


def paper_prior(X: np.ndarray) -> bnp.NormalGamma:
    """The paper's empirical prior (see the module docstring); uses no labels."""
    return bnp.NormalGamma(m0=X.mean(0), k0=1.0 / X.shape[0], a0=1.0, b0=X.var(0))


def dp_means(X, lam, max_iter=1000):
    """Kulis & Jordan (2012) DP-means; returns labels and the number of passes."""
    centres = [X.mean(0)]
    z = np.zeros(len(X), int)
    for it in range(1, max_iter + 1):
        changed = False
        for i, x in enumerate(X):
            d2 = np.array([np.sum((x - c) ** 2) for c in centres])
            k = int(np.argmin(d2))
            if d2[k] > lam:
                centres.append(x.copy())
                k = len(centres) - 1
            if k != z[i]:
                z[i], changed = k, True
        used = np.unique(z)
        remap = {old: new for new, old in enumerate(used)}
        z = np.array([remap[v] for v in z])
        centres = [X[z == k].mean(0) for k in range(len(used))]
        if not changed:
            return z, it
    return z, max_iter


def dp_means_with_k(X, k_true):
    """Bisect lambda (on a log scale) until DP-means returns ``k_true`` clusters."""
    lo, hi = 1e-6, float(np.sum((X - X.mean(0)) ** 2, 1).max()) * 4
    best = None
    for _ in range(60):
        lam = np.sqrt(lo * hi)
        z, it = dp_means(X, lam)
        k = len(np.unique(z))
        if best is None or abs(k - k_true) < abs(best[2] - k_true):
            best = (z, it, k, lam)
        if k == k_true:
            return z, it, k, lam
        lo, hi = (lam, hi) if k > k_true else (lo, lam)
    return best


PAPER_OPTIONS = dict(mode="sequential", init="one", split_moves=False, merge_moves=False)


def run_mapdp(X, y, family, paper):
    options = PAPER_OPTIONS if paper else {}
    alpha, nlls = select_alpha(X, ALPHAS, family=family, method="nll", **options)
    est = MAPDP(alpha=alpha, family=family, **options).fit(X)
    return {
        "alpha": alpha, "nll_by_alpha": dict(zip(map(str, ALPHAS), map(float, nlls))),
        "nmi": float(nmi(y, est.labels_)), "iterations": est.n_iter_,
        "clusters": est.n_clusters_, "nll": est.nll_,
    }


def run_gibbs(X, y, family, alpha, num_warmup, num_samples):
    def model(X):
        z = numpyro.sample("z", bnp.Partition(bnp.DP(alpha), X.shape[0]))
        numpyro.sample("X", bnp.ConjugateMixture(family, z), obs=X)

    kernel = bnp.CollapsedGibbs(model, capacity=X.shape[0], init_strategy="singletons")
    mcmc = MCMC(kernel, num_warmup=0, num_samples=num_warmup + num_samples,
                progress_bar=False)
    t0 = time.perf_counter()
    mcmc.run(jax.random.key(0), jnp.asarray(X), extra_fields=("log_joint",))
    elapsed = time.perf_counter() - t0
    z = np.asarray(mcmc.get_samples()["z"])
    lj = np.asarray(mcmc.get_extra_fields()["log_joint"])
    kept = slice(num_warmup, None)
    scores = np.array([nmi(y, zz) for zz in z[kept]])
    target = np.median(lj[kept])
    return {
        "nmi_mean": float(scores.mean()), "nmi_2sd": float(2 * scores.std()),
        "iterations": int(np.argmax(lj >= target)) + 1, "total_iterations": num_warmup + num_samples,
        "clusters_mean": float(np.mean([len(np.unique(zz)) for zz in z[kept]])),
        "seconds": elapsed,
    }


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    num_warmup, num_samples = (200, 300) if args.quick else (1000, 2000)
    res = {"command": "python benchmarks/mapdp_uci.py " + " ".join(argv if argv is not None else sys.argv[1:]),
           "machine": machine_info(), "alphas": ALPHAS, "sets": {}}
    for name, loader in LOADERS.items():
        data = loader()
        X, y = data.data.astype(float), data.target
        prior = paper_prior(X)
        out = {"n": X.shape[0], "d": X.shape[1], "classes": int(len(np.unique(y)))}
        out["mapdp_paper"] = run_mapdp(X, y, prior, paper=True)
        out["mapdp_defaults_paper_prior"] = run_mapdp(X, y, prior, paper=False)
        out["mapdp_defaults"] = run_mapdp(X, y, None, paper=False)
        z, it, k, lam = dp_means_with_k(X, out["classes"])
        out["dp_means"] = {"nmi": float(nmi(y, z)), "iterations": it, "clusters": k, "lambda": lam}
        # the paper reuses MAP-DP's alpha; ours from the defaults under the paper's prior
        alpha = out["mapdp_defaults_paper_prior"]["alpha"]
        out["gibbs"] = run_gibbs(X, y, prior, alpha, num_warmup, num_samples)
        res["sets"][name] = out
        print(name, json.dumps(out), flush=True)
    write_json(RESULTS / "mapdp_uci.json", res)
    lines = [
        "# MAP-DP paper, Tables 2 and 3, on scikit-learn's UCI sets",
        "",
        f"Command: `{res['command']}`. NMI to the class labels (iterations in brackets). "
        "Paper prior: m0 = mean, k0 = 1/N, a0 = 1, b0 = per-dimension variance; alpha by lowest "
        f"NLL over {ALPHAS}. Gibbs: {num_warmup} burn-in + {num_samples} kept iterations, "
        "from singletons, alpha from the MAP-DP defaults under the paper's prior; NMI mean (2 sd); "
        "its iterations = first to reach the median kept log joint. MAP-DP defaults: `MAPDP()` "
        "(k-means++ start, batched sweeps, merge and split moves); default prior: "
        "`jaxbnp.inference.partition.mapdp.default_prior` (the paper's prior with b0 = within-group variance of 2-means).",
        "",
        "| data | DP-means (paper) | DP-means (ours) | Gibbs (paper) | Gibbs (ours) | MAP-DP (paper) "
        "| MAP-DP, paper's algorithm (ours) | defaults, paper's prior | **defaults** (default prior) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, o in res["sets"].items():
        p = PAPER[name]
        g = o["gibbs"]

        def m(r):
            return f"{r['nmi']:.2f} ({r['iterations']}; K={r['clusters']}, alpha={r['alpha']:g})"

        lines.append(
            f"| {name} | {p['nmi'][0]:.2f} ({p['iterations'][0]}) | {o['dp_means']['nmi']:.2f} "
            f"({o['dp_means']['iterations']}) | {p['nmi'][1]} ({p['iterations'][1]}) | "
            f"{g['nmi_mean']:.2f} ({g['nmi_2sd']:.2f}) ({g['iterations']}) | "
            f"{p['nmi'][2]:.2f} ({p['iterations'][2]}) | {m(o['mapdp_paper'])} | "
            f"{m(o['mapdp_defaults_paper_prior'])} | **{m(o['mapdp_defaults'])}** |"
        )
    write_lines(RESULTS / "mapdp_uci.md", lines)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
