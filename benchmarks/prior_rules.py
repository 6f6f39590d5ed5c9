"""Benchmark (issue #38): the diagonal default prior chosen on 2026-12-08.

``--part diag`` (``results/diag_prior_digits.md``): the diagonal prior of the estimators and
the CLI where ``n < D (D + 1) / 2`` (digits, 1,797 x 64; the 1,000 x 50 full-covariance
set of ``benchmarks/ordinary.py``), on the standardised columns ``Z``, three ways:

* ``from_data``: ``NormalGamma.from_data(Z)`` (``b0`` the whole variance, ``a0 = 2``: each
  cluster a priori as wide as the data), the samplers' diagonal default before;
* ``2 groups``: ``mapdp.default_prior(Z, covariance="diag", groups=2, weight=2)``,
  ``MAPDP()``'s diagonal default before (``b0`` the within-group variance of 2 groups, ``a0 = 1``);
* ``default``: ``mapdp.default_prior(Z, covariance="diag")``, now the default of both: the
  within-group variance of 32 groups, worth ``D + 1`` points (``a0 = (D + 1) / 2``).

Each with ``MAPDP`` and ``DirichletProcessMixture`` (``splitmerge``, ``gibbs``, ``subcluster``),
every other setting at its default, ``random_state`` 0 .. seeds-1; NMI against the truth, K,
the largest cluster, and ``log p(Z, Π)`` of the partition under the prior it was fitted with
(the same model for the methods of one prior: a higher value is a more probable partition),
beside ``BayesianGaussianMixture(covariance_type="full")`` on the raw data.

``--part small`` (``results/diag_prior_small.md``): the same priors, and the default's rule
without its cap on the groups (``32 groups``: ``groups=32`` whatever ``n``; the default takes
``max(2, min(32, n // 20))``), on blobs with 40-200 points in 10-25 dimensions, where the
prior's ``D + 1`` points weigh as much as a cluster's own; ARI and K, one seed.

Usage: ``python benchmarks/prior_rules.py --part diag [--seeds 3]`` and
``python benchmarks/prior_rules.py --part small``.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from harness import RESULTS, fit_bgm, machine_info, machine_line, utc_now, write_json, write_lines

PRIORS = ("from_data", "2 groups", "default")
METHODS = ("mapdp", "splitmerge", "gibbs", "subcluster")


def _prior(name: str, Z):
    import jaxbnp as bnp
    from jaxbnp.inference.partition import mapdp

    if name == "from_data":
        return bnp.NormalGamma.from_data(Z)
    if name == "2 groups":
        return mapdp.default_prior(Z, covariance="diag", groups=2, weight=2)
    if name == "32 groups":
        return mapdp.default_prior(Z, covariance="diag", groups=32)
    return mapdp.default_prior(Z, covariance="diag")


def _fit_labels(method: str, family, Z, seed: int):
    """The labels of ``MAPDP`` (``method="mapdp"``) or ``DirichletProcessMixture(method=...)``
    with ``family``, every other setting at its default."""
    import jaxbnp as bnp

    if method == "mapdp":
        return bnp.MAPDP(family=family, random_state=seed).fit(Z).labels_
    return bnp.DirichletProcessMixture(method=method, family=family, random_state=seed,
                                       progress_bar=False).fit(Z).labels_


def _diag_sets():
    from sklearn.datasets import load_digits

    from ordinary import panel

    out = [s for s in panel([1000]) if s["name"].startswith("fullcov-D50")]
    X, y = load_digits(return_X_y=True)
    return out + [dict(name="digits", X=X, y=y)]


def diag_part(seeds: int, out_name: str) -> None:
    import jax.numpy as jnp
    from sklearn.metrics import normalized_mutual_info_score

    import jaxbnp as bnp
    from jaxbnp import _defaults
    from jaxbnp.models.distributions import log_joint

    start, machine, rows = utc_now(), machine_info(), []
    for s in _diag_sets():
        X, y = np.asarray(s["X"], float), np.asarray(s["y"])
        shift, scale = _defaults.standardisation(X)
        Z = (X - shift) / scale
        bgm = fit_bgm(X, y, 50, "full")
        rows.append(dict(set=s["name"], prior="BGM full", method="-", seed=0, nmi=round(bgm["nmi"], 3),
                         k=bgm["clusters"], largest=None, log_joint=None, seconds=round(bgm["time_s"], 1)))
        for prior in PRIORS:
            family = _prior(prior, Z)
            for method in METHODS:
                for seed in range(seeds):
                    t0 = time.perf_counter()
                    z = np.unique(_fit_labels(method, family, Z, seed), return_inverse=True)[1]
                    lj = float(log_joint(jnp.asarray(Z, jnp.float32), jnp.asarray(z), bnp.DP(1.0), family))
                    row = dict(set=s["name"], prior=prior, method=method, seed=seed,
                               nmi=round(float(normalized_mutual_info_score(y, z)), 3), k=int(z.max() + 1),
                               largest=int(np.bincount(z).max()), log_joint=round(lj, 1),
                               seconds=round(time.perf_counter() - t0, 1))
                    print(row, flush=True)
                    rows.append(row)
    lines = [
        "# The diagonal default prior (n < D (D + 1) / 2)",
        "",
        f"`python benchmarks/prior_rules.py --part diag --seeds {seeds}` (module docstring); {start}; "
        f"{machine_line(machine)}. Fits on the standardised columns; "
        f"seeds 0-{seeds - 1}. Cells: NMI min-max (K min-max; largest cluster max) and the median "
        "log p(Z, Π) of the partitions under the prior they were fitted with.",
        "",
        "| set | prior | " + " | ".join(METHODS) + " |",
        "|---|---|" + "---|" * len(METHODS),
    ]
    for s in dict.fromkeys(r["set"] for r in rows):
        b = [r for r in rows if r["set"] == s and r["prior"] == "BGM full"][0]
        lines.append(f"| {s} | BGM full (raw data) | {b['nmi']:.3f} (K {b['k']}) |" + " |" * (len(METHODS) - 1))
        for prior in PRIORS:
            cells = []
            for m in METHODS:
                rs = [r for r in rows if r["set"] == s and r["prior"] == prior and r["method"] == m]
                nm, ks = [r["nmi"] for r in rs], [r["k"] for r in rs]
                cells.append(f"{min(nm):.3f}-{max(nm):.3f} (K {min(ks)}-{max(ks)}; "
                             f"{max(r['largest'] for r in rs)}) {np.median([r['log_joint'] for r in rs]):.0f}")
            lines.append(f"| {s} | {prior} | " + " | ".join(cells) + " |")
    write_lines(RESULTS / f"{out_name}.md", lines)
    write_json(RESULTS / f"{out_name}.json", dict(start=start, machine=machine, rows=rows))


def _small_sets():
    """Blobs with few points for their dimension (``n < D (D + 1) / 2``: the diagonal prior),
    spreads 0.5-2.5 and columns on scales 0.1-10."""
    from sklearn.datasets import make_blobs

    out = []
    for n, d, k, seed in ((40, 10, 2, 0), (60, 12, 3, 0), (60, 12, 4, 1), (100, 20, 8, 2), (200, 25, 5, 0)):
        rng = np.random.default_rng(seed)
        X, y = make_blobs(n, d, centers=k, random_state=seed, cluster_std=rng.uniform(0.5, 2.5, k))
        out.append(dict(name=f"blobs-n{n}-D{d}-K{k}", X=X * rng.uniform(0.1, 10.0, d), y=y))
    return out


def small_part(out_name: str) -> None:
    from sklearn.metrics import adjusted_rand_score

    from jaxbnp import _defaults
    from jaxbnp.inference.partition import mapdp

    priors = PRIORS + ("32 groups",)
    start, machine, rows = utc_now(), machine_info(), []
    for s in _small_sets():
        X, y = np.asarray(s["X"], float), np.asarray(s["y"])
        shift, scale = _defaults.standardisation(X)
        Z = (X - shift) / scale
        row = dict(set=s["name"], groups_now=max(2, min(mapdp.PRIOR_GROUPS, len(Z) // mapdp.PRIOR_POINTS_PER_GROUP)))
        for prior in priors:
            family = _prior(prior, Z)
            for method in METHODS:
                labels = _fit_labels(method, family, Z, 0)
                row[f"{prior}/{method}"] = dict(ari=round(float(adjusted_rand_score(y, labels)), 2),
                                                k=int(np.unique(labels).size))
        print(row, flush=True)
        rows.append(row)
    lines = [
        "# The diagonal default prior on few points: k-means groups behind the within-group variances",
        "",
        f"`python benchmarks/prior_rules.py --part small` (module docstring); {start}; "
        f"{machine_line(machine)}. Each method with the prior of "
        "the row (`32 groups`: the default's rule without its cap of one group per 20 points; "
        "`default`: with it), `random_state=0`, on the standardised columns; ARI against the truth "
        "(K found).",
        "",
        "| set (groups now) | prior | " + " | ".join(METHODS) + " |",
        "|---|---|" + "---|" * len(METHODS),
    ]
    for r in rows:
        for prior in priors:
            cells = [f"{r[f'{prior}/{m}']['ari']:.2f} ({r[f'{prior}/{m}']['k']})" for m in METHODS]
            lines.append(f"| {r['set']} ({r['groups_now']}) | {prior} | " + " | ".join(cells) + " |")
    write_lines(RESULTS / f"{out_name}.md", lines)
    write_json(RESULTS / f"{out_name}.json", dict(start=start, machine=machine, rows=rows))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", choices=("diag", "small"), required=True)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--out-name", default=None)
    args = ap.parse_args()
    if args.part == "diag":
        diag_part(args.seeds, args.out_name or "diag_prior_digits")
    else:
        small_part(args.out_name or "diag_prior_small")


if __name__ == "__main__":
    main()
