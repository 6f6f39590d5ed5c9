"""Benchmark: the Cholesky factor written out or as a loop, by dimension (``jaxbnp._math``).

``jaxbnp._math.UNROLLED_CHOLESKY_MAX_DIM`` sets the largest dimension whose Cholesky factor,
log-determinant and triangular solves are written out in array ops; above it they are loops
over the columns. For each dimension ``D`` this runs, in a fresh process per setting (the
library's default and ``--other``), with the persistent compilation cache off and XLA's
default flags, float32:

- ``MAPDP()`` on 10^5 points (``make_blobs``, 10 centres, through a random linear map): the
  first fit (compilation included) and a second fit of the same shape;
- ``DirichletProcessMixture(method="gibbs")`` on the first 2,000 of them (20 + 10
  iterations), first and second fit;
- ``DirichletProcessMixture(method="subcluster")`` on the first 20,000 (200 + 50
  iterations), first fit and the median of two more.

The two settings of a dimension run one after the other, so their ratio is from one
stretch of the machine's time. Results: ``benchmarks/results/cholesky_dims.md`` and ``.json``.

Usage::

    python benchmarks/cholesky_dims.py [--dims 2 3 4 5 8] [--other 8]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

from harness import RESULTS, machine_info, utc_now, write_json, write_lines

CHILD = r"""
import json, statistics, sys, time
import jaxbnp._math as mm
mm.UNROLLED_CHOLESKY_MAX_DIM = int(sys.argv[1])
import numpy as np
import jaxbnp as bnp
from sklearn.datasets import make_blobs
bnp.enable_compilation_cache(False)
D = int(sys.argv[2])
X, _ = make_blobs(100000, n_features=D, centers=10, random_state=0)
X = X @ np.random.default_rng(0).normal(size=(D, D))
out = {}
def timed(make):
    t = time.perf_counter(); make(); return time.perf_counter() - t
fam = bnp.NormalWishart.from_data(X[:2000])
for name, make, runs in [
    ("MAPDP 10^5", lambda: bnp.MAPDP().fit(X), 2),
    ("gibbs 2,000", lambda: bnp.DirichletProcessMixture(
        method="gibbs", family=fam, num_samples=20, num_warmup=10, progress_bar=False).fit(X[:2000]), 2),
    ("subcluster 20,000", lambda: bnp.DirichletProcessMixture(
        method="subcluster", family=bnp.NormalWishart.from_data(X[:20000]), num_samples=200,
        num_warmup=50, progress_bar=False).fit(X[:20000]), 3),
]:
    times = [timed(make) for _ in range(runs)]
    out[name] = {"first": times[0], "later": statistics.median(times[1:])}
print(json.dumps(out))
"""


def run(threshold: int, d: int) -> dict:
    proc = subprocess.run([sys.executable, "-c", CHILD, str(threshold), str(d)], capture_output=True,
                          text=True, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dims", type=int, nargs="+", default=[2, 3, 4, 5, 8])
    ap.add_argument("--other", type=int, default=8, help="the threshold to compare with")
    args = ap.parse_args()
    sys.path.insert(0, str(RESULTS.parents[1]))
    from jaxbnp import _math

    default = _math.UNROLLED_CHOLESKY_MAX_DIM
    res = {"machine": machine_info(), "when": utc_now(), "default": default, "other": args.other,
           "rows": []}
    for d in args.dims:
        for threshold in (default, args.other):
            row = {"D": d, "threshold": threshold, **run(threshold, d)}
            res["rows"].append(row)
            print(json.dumps(row), flush=True)
    write_json(RESULTS / "cholesky_dims.json", res)
    names = [k for k in res["rows"][0] if k not in ("D", "threshold")]
    m = res["machine"]
    lines = [
        "# The Cholesky factor written out or as a loop, by dimension",
        "",
        f"Command: `python benchmarks/cholesky_dims.py --dims {' '.join(map(str, args.dims))} "
        f"--other {args.other}`. {res['when']}; {m.get('cpu_model')}, {m.get('cpu_count')} CPUs; "
        f"JAX {m.get('jax')}; float32, XLA's default flags, no persistent compilation cache.",
        "",
        f"`written out up to`: `jaxbnp._math.UNROLLED_CHOLESKY_MAX_DIM` (the library's default is "
        f"{default}). Seconds of the first fit (compilation included) and of a later fit of the same "
        "shape (the module docstring says what each entry runs); `ratio`: this default's "
        f"seconds over those with {args.other}, in the same run.",
        "",
        "| D | written out up to | " + " | ".join(f"{n} first | later" for n in names) + " |",
        "|---|---|" + "---|---|" * len(names),
    ]
    rows = res["rows"]
    for i in range(0, len(rows), 2):
        mine, other = rows[i], rows[i + 1]
        for row in (mine, other):
            lines.append(f"| {row['D']} | {row['threshold']} | " + " | ".join(
                f"{row[n]['first']:.2f} | {row[n]['later']:.2f}" for n in names) + " |")
        lines.append(f"| {mine['D']} | ratio | " + " | ".join(
            f"{mine[n]['first'] / other[n]['first']:.2f} | {mine[n]['later'] / other[n]['later']:.2f}"
            for n in names) + " |")
    write_lines(RESULTS / "cholesky_dims.md", lines)


if __name__ == "__main__":
    main()
