"""Benchmark: data nobody here designed. jaxbnp's defaults beside scikit-learn's mixtures.

A panel of data sets a user would bring, none tuned for jaxbnp:

* ``fullcov``: Gaussian clusters with random full covariances (random rotations, variances
  spread over a factor of 10 within each cluster, so elongated clusters), unequal sizes
  (Dirichlet(2) weights) and centres drawn close enough that some clusters overlap;
  D = 2, 10 and 50.
* ``blobs-linmap``: scikit-learn's ``make_blobs`` passed through a random linear map (and
  from 10^4 points ``blobs30-linmap``: 30 centres in D = 10).
* ``scales``: full-covariance clusters whose features are then multiplied by 10^-3 .. 10^3.
* ``student-t``: clusters with Student-t (4 degrees of freedom) noise and full covariances.
* the UCI sets scikit-learn ships: iris, wine, breast cancer, digits (class labels as truth).

For each set, every method with its defaults, in the same run: ``MAPDP()`` (and
``MAPDP-diag``: its former diagonal default prior, ``default_prior(X, covariance="diag", groups=2, weight=2)``),
``DirichletProcessMixture()`` (collapsed Gibbs) and its ``method="splitmerge"`` and
``"subcluster"``, the command line's default (``jaxbnp cluster FILE``, a subprocess
with its own compilation cache), and scikit-learn's ``BayesianGaussianMixture``
(``covariance_type="full"`` and ``"diag"``, ``n_components = min(50, n // 2)``,
Dirichlet-process weights, otherwise its defaults) and ``KMeans`` told the true K; and
``DirichletProcessMixture(method="auxiliary")`` with its cluster parameters sampled, with the
default diagonal Gaussian likelihood (``DPM-auxiliary``) and with Student-t clusters
(``DPM-auxiliary-t``, ``likelihood="student-t"``); on request, sub-cluster MCMC from the
others' k-means++ start (``DPM-subcluster-kmeans``) and ``MAPDP`` with the alpha that
``select_alpha`` picks from ``SELECT_ALPHAS`` (``MAPDP-select-alpha``, both fits timed).
Columns: NMI and ARI against the truth, the K found against the true K, and wall seconds
of the first fit (compilation included for jaxbnp: the run starts with an empty persistent
compilation cache, ``JAXBNP_CACHE_DIR``) and of a second fit of the same
estimator on the same data (the compiled program reused). A method that raises gets its
error in the table: that is a row where jaxbnp loses.

Results: ``benchmarks/results/ordinary.json`` and ``ordinary.md``; the table is copied
into ``docs/benchmarks.md``.

Usage::

    python benchmarks/ordinary.py                    # n = 1,000 and the UCI sets
    python benchmarks/ordinary.py --sizes 1000 10000 --methods MAPDP BGM-full
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
import warnings

import numpy as np

from harness import RESULTS, cpu_seconds, utc_now, machine_info, other_cpu_seconds, write_json, write_lines

METHODS = ("MAPDP", "MAPDP-diag", "DPM-gibbs", "DPM-splitmerge", "DPM-subcluster", "CLI", "BGM-full",
           "BGM-diag", "KMeans-trueK", "DPM-auxiliary", "DPM-auxiliary-t",
           "DPM-subcluster-kmeans", "MAPDP-select-alpha")
#: the concentrations ``MAPDP-select-alpha`` chooses from (``select_alpha``'s NLL rule)
SELECT_ALPHAS = (0.01, 0.1, 1.0, 10.0, 100.0)


class _SelectedAlphaMAPDP:
    """``select_alpha(X, SELECT_ALPHAS)`` (lowest NLL, ``MAPDP``'s defaults otherwise), then
    ``MAPDP(alpha=best)`` on ``X``: what a user who tunes alpha gets."""

    def fit(self, X):
        import jaxbnp as bnp

        self.alpha_, _ = bnp.select_alpha(X, SELECT_ALPHAS, random_state=0, progress_bar=False)
        self.labels_ = bnp.MAPDP(alpha=self.alpha_, random_state=0).fit(X).labels_
        return self


def _random_covariances(rng, k: int, d: int, spread: float = 10.0) -> np.ndarray:
    """``k`` random ``d x d`` covariances: a random rotation, variances log-uniform over a
    factor ``spread``, overall scale log-uniform over a factor 4."""
    covs = []
    for _ in range(k):
        q, _ = np.linalg.qr(rng.normal(size=(d, d)))
        var = np.exp(rng.uniform(0.0, np.log(spread), d)) / spread * np.exp(rng.uniform(0, np.log(4)))
        covs.append((q * var) @ q.T)
    return np.array(covs)


def _sizes(rng, n: int, k: int, minimum: int = 5) -> np.ndarray:
    w = rng.dirichlet(np.full(k, 2.0))
    counts = np.maximum(np.round(w * (n - minimum * k)).astype(int), 0) + minimum
    counts[np.argmax(counts)] += n - counts.sum()
    return counts


def gaussian_clusters(n: int, k: int, d: int, seed: int, separation: float,
                      noise: str = "normal") -> tuple[np.ndarray, np.ndarray]:
    """``n`` points in ``k`` full-covariance clusters; ``separation`` scales the spread of the
    centres (``N(0, separation^2 I)``) against within-cluster standard deviations of 0.3-2."""
    rng = np.random.default_rng(seed)
    counts = _sizes(rng, n, k)
    centres = rng.normal(0.0, separation, (k, d))
    covs = _random_covariances(rng, k, d)
    X, y = [], []
    for j, (m, c) in enumerate(zip(counts, covs)):
        L = np.linalg.cholesky(c)
        z = rng.normal(size=(m, d))
        if noise == "t4":
            z = z / np.sqrt(rng.chisquare(4, (m, 1)) / 4)
        X.append(centres[j] + z @ L.T)
        y.append(np.full(m, j))
    X, y = np.concatenate(X), np.concatenate(y)
    perm = rng.permutation(n)
    return X[perm], y[perm]


def panel(sizes: list[int]) -> list[dict]:
    """The data sets: name, X, y and a short description."""
    from sklearn import datasets as skd

    sets = []
    for n in sizes:
        sets.append(dict(name=f"fullcov-D2-K8-n{n}", X=gaussian_clusters(n, 8, 2, 1, 4.0),
                         what="8 full-covariance clusters, D=2, unequal sizes, some overlap"))
        k10 = 10 if n < 10_000 else 30
        sets.append(dict(name=f"fullcov-D10-K{k10}-n{n}", X=gaussian_clusters(n, k10, 10, 2, 2.5),
                         what=f"{k10} full-covariance clusters, D=10"))
        if n <= 10_000:
            sets.append(dict(name=f"fullcov-D50-K5-n{n}", X=gaussian_clusters(n, 5, 50, 3, 1.5),
                             what="5 full-covariance clusters, D=50"))
        Xb, yb = skd.make_blobs(n_samples=n, centers=6, n_features=5, random_state=4)
        A = np.random.default_rng(4).normal(size=(5, 5))
        sets.append(dict(name=f"blobs-linmap-n{n}", X=(Xb @ A, yb),
                         what="make_blobs (6 centres, D=5) through a random linear map"))
        if n >= 10_000:  # the data of the issue that made MAPDP()'s prior full-covariance
            Xb, yb = skd.make_blobs(n_samples=n, centers=30, n_features=10, random_state=0)
            A = np.random.default_rng(0).normal(size=(10, 10)) * 0.3
            sets.append(dict(name=f"blobs30-linmap-n{n}", X=(Xb @ A, yb),
                             what="make_blobs (30 centres, D=10) through a random linear map"))
        Xs, ys = gaussian_clusters(n, 6, 5, 5, 3.0)
        sets.append(dict(name=f"scales-n{n}", X=(Xs * 10.0 ** np.linspace(-3, 3, 5), ys),
                         what="6 full-covariance clusters, D=5, features scaled by 1e-3 .. 1e3"))
        sets.append(dict(name=f"student-t-n{n}", X=gaussian_clusters(n, 6, 3, 6, 5.0, noise="t4"),
                         what="6 clusters with Student-t(4) noise, D=3"))
    for name, load in (("iris", skd.load_iris), ("wine", skd.load_wine),
                       ("breast-cancer", skd.load_breast_cancer), ("digits", skd.load_digits)):
        data = load()
        sets.append(dict(name=name, X=(data.data.astype(float), data.target),
                         what=f"UCI {name} (scikit-learn's copy), class labels as truth"))
    for s in sets:
        s["X"], s["y"] = s.pop("X")
    return sets


def _estimator(method: str, n: int, k_true: int, X=None):
    from sklearn.cluster import KMeans
    from sklearn.mixture import BayesianGaussianMixture

    import jaxbnp as bnp

    if method == "MAPDP":
        return bnp.MAPDP(random_state=0)
    if method == "MAPDP-diag":  # MAPDP()'s former default prior (computed before the clock)
        from jaxbnp.inference.partition.mapdp import default_prior

        return bnp.MAPDP(random_state=0, family=default_prior(X, covariance="diag", groups=2, weight=2))
    if method == "DPM-auxiliary-t":  # Student-t clusters, their parameters sampled
        return bnp.DirichletProcessMixture(method="auxiliary", likelihood="student-t", random_state=0,
                                           progress_bar=False)
    if method == "MAPDP-select-alpha":
        return _SelectedAlphaMAPDP()
    if method == "DPM-subcluster-kmeans":  # sub-cluster MCMC from the others' k-means++ start
        return bnp.DirichletProcessMixture(method="subcluster", init="kmeans++", random_state=0,
                                           progress_bar=False)
    if method.startswith("DPM-"):
        return bnp.DirichletProcessMixture(method=method[4:], random_state=0, progress_bar=False)
    if method.startswith("BGM-"):
        return BayesianGaussianMixture(n_components=max(1, min(50, n // 2)),
                                       covariance_type=method[4:], random_state=0,
                                       weight_concentration_prior_type="dirichlet_process")
    if method == "KMeans-trueK":
        return KMeans(n_clusters=k_true, n_init=10, random_state=0)
    raise ValueError(method)


def _labels(est, X):
    labels = getattr(est, "labels_", None)
    return np.asarray(labels if labels is not None else est.predict(X))


def run_method(method: str, X: np.ndarray, y: np.ndarray, workdir: str) -> dict:
    if method == "CLI":
        return _run_cli(X, y, workdir)
    k_true = int(np.unique(y).size)
    return fit_twice(lambda: _estimator(method, X.shape[0], k_true, X), X, y)


def fit_twice(make_estimator, X: np.ndarray, y: np.ndarray) -> dict:
    """A fresh ``make_estimator()`` fitted on ``X`` twice (the second fit reuses the first's
    compiled programs): the row's ``first_s``, ``second_s``, and NMI, ARI and K of the second
    fit's labels against ``y``; a fit that raises gives its error as the row."""
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score

    row: dict = {}
    try:
        times = []
        for _ in range(2):
            est = make_estimator()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ConvergenceWarning)
                t0 = time.perf_counter()
                est.fit(X)
                labels = _labels(est, X)
                times.append(time.perf_counter() - t0)
        row.update(first_s=round(times[0], 2), second_s=round(times[1], 2))
    except Exception as exc:  # a failure is a result: the row where jaxbnp loses
        return {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}",
                "trace": traceback.format_exc()[-1200:]}
    row.update(nmi=round(float(normalized_mutual_info_score(y, labels)), 3),
               ari=round(float(adjusted_rand_score(y, labels)), 3),
               k=int(np.unique(labels).size))
    return row


def _run_cli(X, y, workdir) -> dict:
    """``jaxbnp cluster FILE`` with its defaults, twice (the second run reuses the
    first's persistent compilation cache), as a user runs it."""
    from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score

    path = os.path.join(workdir, "data.csv")
    np.savetxt(path, X, delimiter=",")
    env = dict(os.environ, JAXBNP_CACHE_DIR=os.path.join(workdir, "cache"), JAXBNP_PROGRESS="0")
    env.pop("XLA_FLAGS", None)
    times = []
    for _ in range(2):
        out = os.path.join(workdir, "out")
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "jaxbnp.cli", "cluster", path,
                               "--out", out], env=env, capture_output=True, text=True, timeout=1800)
        times.append(time.perf_counter() - t0)
        if proc.returncode != 0:
            lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
            return {"error": lines[-1][:200] if lines else f"exit {proc.returncode}"}
    labels = np.loadtxt(os.path.join(out, "labels.csv"), skiprows=1, ndmin=1)
    return {"first_s": round(times[0], 2), "second_s": round(times[1], 2),
            "nmi": round(float(normalized_mutual_info_score(y, labels)), 3),
            "ari": round(float(adjusted_rand_score(y, labels)), 3), "k": int(np.unique(labels).size)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", nargs="+", type=int, default=[1000])
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--sets", nargs="*", default=None, help="only the sets whose name starts so")
    parser.add_argument("--out-name", default="ordinary")
    args = parser.parse_args()

    # an empty persistent compilation cache: the first fit of each estimator compiles
    cache = tempfile.mkdtemp(prefix="jaxbnp-ordinary-cache-")
    os.environ["JAXBNP_CACHE_DIR"] = cache
    sets = panel(args.sizes)
    if args.sets:
        sets = [s for s in sets if any(s["name"].startswith(p) for p in args.sets)]
    rows, start = [], cpu_seconds()
    with tempfile.TemporaryDirectory() as tmp:
        for s in sets:
            X, y = s["X"], s["y"]
            for method in args.methods:
                res = run_method(method, X, y, tmp)
                row = dict(set=s["name"], n=int(X.shape[0]), d=int(X.shape[1]),
                           k_true=int(np.unique(y).size), method=method, **res)
                print(json.dumps({k: v for k, v in row.items() if k != "trace"}), flush=True)
                rows.append(row)
            _write(args, rows, sets, start)  # after every set: a stopped run keeps what it had


def _write(args, rows, sets, start) -> None:
    other = other_cpu_seconds(start, cpu_seconds())
    info = machine_info()
    done = {r["set"] for r in rows}
    write_json(RESULTS / f"{args.out_name}.json",
               {"machine": info, "command": "python benchmarks/ordinary.py " + " ".join(sys.argv[1:]),
                "other_cpu_s": other, "sets": {s["name"]: s["what"] for s in sets}, "rows": rows})
    write_lines(RESULTS / f"{args.out_name}.md",
                report(rows, [s for s in sets if s["name"] in done], info, other, sys.argv[1:]))


def report(rows, sets, info, other, argv) -> list[str]:
    lines = [
        "# Data nobody here designed: jaxbnp's defaults beside scikit-learn",
        "",
        f"Command: `python benchmarks/ordinary.py {' '.join(argv)}`. Machine: {info.get('cpu_model')} "
        f"({info.get('cpu_count')} CPUs), JAX {info.get('jax')}; {utc_now()[:10]}. CPU seconds used by other processes "
        f"during the run: {other if other is None else round(other, 1)}.",
        "",
        "NMI/ARI against the true labels; K found / true K; seconds of the first fit "
        "(compilation included) and of a second fit of the same estimator on the same data. "
        "Bold NMI: more than 0.02 below `BGM-full` on that set (jaxbnp loses).",
        "",
        "| set | n x D | method | NMI | ARI | K / true | first s | second s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    ref = {r["set"]: r.get("nmi") for r in rows if r["method"] == "BGM-full"}
    for r in rows:
        shape = f"{r['n']} x {r['d']}"
        if "error" in r:
            lines.append(f"| {r['set']} | {shape} | {r['method']} | error: {r['error']} | | | | |")
            continue
        nmi = f"{r['nmi']:.3f}"
        if not r["method"].startswith(("BGM", "KMeans")) and ref.get(r["set"]) is not None \
                and r["nmi"] < ref[r["set"]] - 0.02:
            nmi = f"**{nmi}**"
        lines.append(f"| {r['set']} | {shape} | {r['method']} | {nmi} | {r['ari']:.3f} | "
                     f"{r['k']} / {r['k_true']} | {r['first_s']} | {r['second_s']} |")
    lines += ["", "Data sets:", ""] + [f"- `{s['name']}`: {s['what']}" for s in sets]
    return lines


if __name__ == "__main__":
    main()
