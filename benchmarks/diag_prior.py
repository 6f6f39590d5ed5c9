"""Benchmark (issue #38): ``DirichletProcessMixture`` with a diagonal prior on the panel's
high-dimensional sets.

The estimators' default prior is a full-covariance Normal-Wishart for every D; ``MAPDP()``
switches to a diagonal one when n < D(D+1)/2. This fits ``DirichletProcessMixture(method=m,
family=NormalGamma.from_data(Z), random_state=0)`` (methods ``splitmerge`` and
``subcluster``) on the standardised columns ``Z`` of ``benchmarks/ordinary.py``'s
``fullcov-D50``, wine, breast cancer and digits, twice, and prints NMI, K and the seconds of
each fit (``ordinary.fit_twice``, the panel's own). Compare with ``results/ordinary.md`` and
``ordinary_highdim.md`` (the defaults).

Usage: ``python benchmarks/diag_prior.py`` (prints; ``results/diag_prior.md`` holds a run).
"""

from __future__ import annotations

import numpy as np

import jaxbnp as bnp
from jaxbnp import _defaults
from ordinary import fit_twice, panel


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
            row = fit_twice(lambda: bnp.DirichletProcessMixture(method=method, family=family, random_state=0,
                                                                progress_bar=False), Z, y)
            if "error" in row:
                print(f"| {s['name']} {X.shape[0]} x {X.shape[1]} | {method} | {row['error']} |", flush=True)
                continue
            print(f"| {s['name']} {X.shape[0]} x {X.shape[1]} | {method} | {row['nmi']:.3f} | "
                  f"{row['k']} / {len(np.unique(y))} | {row['first_s']:.1f} | {row['second_s']:.1f} |", flush=True)


if __name__ == "__main__":
    main()
