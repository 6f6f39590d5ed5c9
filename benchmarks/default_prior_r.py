"""Benchmark (issue #38): the default full-covariance prior's ``r``, 0.1 (before) against 1/n (now).

``DirichletProcessMixture()``'s default prior on standardised columns, where
``n >= D (D + 1) / 2``, is ``NormalWishart.from_data(Z, r, shrinkage="ledoit-wolf")``
(``jaxbnp._defaults.full_prior``). Until 2026-12-07 ``r`` was the tgMCMC paper's 0.1; it is
now ``1/n`` (a vague prior on the cluster means, as in ``MAPDP()``'s prior). This fits both
priors with each MCMC method (``gibbs``, ``splitmerge``, ``subcluster``; every other setting
at its default, ``random_state=0``) on

* two small, clean sets nobody would call hard: 200 points in 4 unit-variance 2-D blobs
  (centres 12-16 apart) and 60 points in 2 (``N(±4, 1)`` in both columns);
* ``jaxbnp.datasets.toy_ring`` (the README's data);
* the full-covariance sets of ``benchmarks/ordinary.py`` at n = 1,000 and the UCI sets where
  the full prior applies (iris, wine, breast cancer);

and prints NMI against the truth and the K found, beside scikit-learn's
``BayesianGaussianMixture(covariance_type="full")`` (``harness.fit_bgm``, as in the panel).
One fit per cell, one seed; the panel's own tables are ``results/ordinary.md`` and
``ordinary_seeds.md``.

Usage: ``python benchmarks/default_prior_r.py [--sets NAME ...] [--out-name default_prior_r]``
(writes ``results/<out-name>.md`` and ``.json``).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from harness import RESULTS, fit_bgm, machine_info, machine_line, utc_now, write_json, write_lines

METHODS = ("gibbs", "splitmerge", "subcluster")


def sets() -> list[dict]:
    from jaxbnp.datasets import toy_ring
    from ordinary import panel

    rng = np.random.default_rng(0)
    centres = np.array([[-6.0, 0.0], [6.0, 0.0], [0.0, 8.0], [0.0, -8.0]])
    y4 = np.arange(200) % 4
    out = [dict(name="4blobs-n200", X=centres[y4] + rng.normal(size=(200, 2)), y=y4)]
    rng = np.random.default_rng(1)
    out.append(dict(name="2groups-n60", X=np.r_[rng.normal(-4, 1, (30, 2)), rng.normal(4, 1, (30, 2))],
                    y=np.repeat([0, 1], 30)))
    X, y = toy_ring()
    out.append(dict(name="toy_ring", X=X, y=y))
    wanted = ("fullcov-D2", "fullcov-D10", "blobs-linmap", "scales", "student-t", "iris", "wine", "breast")
    out += [s for s in panel([1000]) if s["name"].startswith(wanted)]
    return out


def fit(X, y, method: str, r_rule: str) -> dict:
    from sklearn.metrics import normalized_mutual_info_score

    import jaxbnp as bnp
    from jaxbnp import _defaults

    shift, scale = _defaults.standardisation(X)
    Z = (X - shift) / scale
    r = 0.1 if r_rule == "0.1" else 1.0 / len(Z)
    family = bnp.NormalWishart.from_data(Z, r=r, shrinkage="ledoit-wolf")
    t0 = time.perf_counter()
    est = bnp.DirichletProcessMixture(method=method, family=family, random_state=0, progress_bar=False).fit(Z)
    return dict(nmi=round(float(normalized_mutual_info_score(y, est.labels_)), 3), k=int(est.n_clusters_),
                seconds=round(time.perf_counter() - t0, 1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sets", nargs="*", default=None, help="names (prefixes) of the sets to run")
    ap.add_argument("--out-name", default="default_prior_r")
    args = ap.parse_args()
    start = utc_now()
    machine = machine_info()
    rows = []
    for s in sets():
        if args.sets and not s["name"].startswith(tuple(args.sets)):
            continue
        X, y = np.asarray(s["X"], float), np.asarray(s["y"])
        row = dict(set=s["name"], n=X.shape[0], d=X.shape[1], k_true=int(np.unique(y).size))
        bgm = fit_bgm(X, y, max(1, min(50, X.shape[0] // 2)), "full")
        row["BGM-full"] = dict(nmi=round(bgm["nmi"], 3), k=bgm["clusters"])
        for method in METHODS:
            for rule in ("0.1", "1/n"):
                row[f"{method} r={rule}"] = fit(X, y, method, rule)
        print(row, flush=True)
        rows.append(row)
    cols = ["BGM-full"] + [f"{m} r={rule}" for m in METHODS for rule in ("0.1", "1/n")]
    lines = [
        "# The default full-covariance prior: r = 0.1 (before) against r = 1/n (now)",
        "",
        f"`python benchmarks/default_prior_r.py` (module docstring); {start}; {machine_line(machine)}. "
        "`DirichletProcessMixture(method=m, family="
        "NormalWishart.from_data(Z, r, shrinkage=\"ledoit-wolf\"), random_state=0)` on the "
        "standardised columns Z, every other setting at its default; NMI against the truth (K "
        "found); one fit per cell.",
        "",
        "| set (n x D, true K) | " + " | ".join(cols) + " |",
        "|---|" + "---|" * len(cols),
    ]
    for row in rows:
        cells = [f"{row[c]['nmi']:.3f} ({row[c]['k']})" for c in cols]
        lines.append(f"| {row['set']} ({row['n']} x {row['d']}, {row['k_true']}) | " + " | ".join(cells) + " |")
    write_lines(RESULTS / f"{args.out_name}.md", lines)
    write_json(RESULTS / f"{args.out_name}.json", dict(start=start, machine=machine, rows=rows))


if __name__ == "__main__":
    main()
