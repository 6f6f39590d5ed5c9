"""Benchmark (issue #38): ``DirichletProcessMixture`` with a diagonal prior on the panel's
high-dimensional sets.

The estimators' default prior is a full-covariance Normal-Wishart for every D; ``MAPDP()``
switches to a diagonal one when n < D(D+1)/2. This fits ``DirichletProcessMixture(method=m,
family=NormalGamma.from_data(Z), random_state=0)`` (methods ``splitmerge`` and
``subcluster``) on the standardised columns ``Z`` of ``benchmarks/ordinary.py``'s
``fullcov-D50``, wine, breast cancer and digits, twice, and prints NMI, K and the seconds of
each fit. Compare with ``results/ordinary.md`` and ``ordinary_highdim.md`` (the defaults).

Usage: ``python benchmarks/diag_prior.py`` (prints; ``results/diag_prior.md`` holds a run).
"""

from __future__ import annotations

import time

import numpy as np
from sklearn.metrics import normalized_mutual_info_score as nmi

import jaxbnp as bnp
from jaxbnp import _defaults
from ordinary import panel


def main() -> None:
    wanted = ("fullcov-D50", "wine", "breast", "digits")
    for s in panel([1000]):
        if not s["name"].startswith(wanted):
            continue
        X, y = s["X"], s["y"]
        shift, scale = _defaults.standardisation(X)
        Z = (X - shift) / scale
        family = bnp.NormalGamma.from_data(Z)
        for method in ("splitmerge", "subcluster"):
            est = bnp.DirichletProcessMixture(method=method, family=family, random_state=0, progress_bar=False)
            t = time.perf_counter()
            est.fit(Z)
            first = time.perf_counter() - t
            t = time.perf_counter()
            est.fit(Z)
            second = time.perf_counter() - t
            print(f"| {s['name']} {X.shape[0]} x {X.shape[1]} | {method} | {nmi(y, est.labels_):.3f} | "
                  f"{est.n_clusters_} / {len(np.unique(y))} | {first:.1f} | {second:.1f} |", flush=True)


if __name__ == "__main__":
    main()
