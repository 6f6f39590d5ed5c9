"""Benchmark: IBHC's SeqInsert with its unions evaluated a level at a time or several at once.

tgMCMC's IBHC start (``jaxbnp.inference.tgmcmc.ibhc.ibhc``) is built on the host before every
run. Inserting a point walks down a tree; each level needs the unions of the point with the
node's two children, one batched NumPy evaluation of the family's marginal likelihood, which
costs about 100 µs whatever its length. With ``SEQ_INSERT_PREFETCH_LEVELS = L`` a level whose
children are not in the memo evaluates the unions with every node of the ``L`` levels below
in one call (``L = 1``: the children alone, as before). The values are the same either way
(the memo keeps exact values), so the forest is too: the script checks the labels.

For each data set and ``L``: seconds of two builds (one process, after a warm-up build),
K, and whether the labels equal those of ``L = 1``.

Results: ``benchmarks/results/ibhc_prefetch.json`` and ``ibhc_prefetch.md``.

Usage::

    python benchmarks/ibhc_prefetch.py
"""

from __future__ import annotations

import time

import numpy as np

from harness import RESULTS, machine_info, utc_now, write_json, write_lines

LEVELS = (1, 4, 6, 8)


def data_sets() -> dict:
    from sklearn.datasets import make_blobs

    import jaxbnp as bnp

    return {"toy_ring (1300 x 2)": bnp.datasets.toy_ring()[0],
            "make_blobs 3000 x 2, 12 centres": make_blobs(3000, 2, centers=12, random_state=0)[0],
            "make_blobs 2000 x 5, 8 centres": make_blobs(2000, 5, centers=8, random_state=1)[0]}


def main() -> None:
    import jaxbnp as bnp
    from jaxbnp.inference.tgmcmc import ibhc

    default = ibhc.SEQ_INSERT_PREFETCH_LEVELS
    rows = []
    for name, X in data_sets().items():
        family = bnp.NormalWishart.from_data(X)
        ibhc.ibhc(X, bnp.DP(1.0), family)  # warm-up: imports, NumPy's first calls
        ref = None
        for levels in LEVELS:
            ibhc.SEQ_INSERT_PREFETCH_LEVELS = levels
            seconds = []
            for _ in range(2):
                t0 = time.perf_counter()
                forest = ibhc.ibhc(X, bnp.DP(1.0), family)
                seconds.append(round(time.perf_counter() - t0, 2))
            labels = np.asarray(forest.labels)
            ref = labels if ref is None else ref
            row = dict(data=name, levels=levels, seconds=seconds, k=int(np.unique(labels).size),
                       same_labels=bool(np.array_equal(labels, ref)))
            print(row, flush=True)
            rows.append(row)
    ibhc.SEQ_INSERT_PREFETCH_LEVELS = default
    info = machine_info()
    write_json(RESULTS / "ibhc_prefetch.json", {"machine": info, "default": default, "rows": rows})
    lines = ["# IBHC's SeqInsert: unions a level at a time or several levels at once", "",
             f"`python benchmarks/ibhc_prefetch.py` (module docstring); {info.get('cpu_model')} "
             f"({info.get('cpu_count')} CPUs); {utc_now()[:10]}. The library's default: "
             f"`SEQ_INSERT_PREFETCH_LEVELS = {default}`; `1` is the evaluation before it.", "",
             "| data | levels | seconds (two builds) | K | labels as with 1 level |", "|---|---:|---|---:|---|"]
    for r in rows:
        lines.append(f"| {r['data']} | {r['levels']} | {r['seconds'][0]}, {r['seconds'][1]} | {r['k']} | "
                     f"{'yes' if r['same_labels'] else 'no'} |")
    write_lines(RESULTS / "ibhc_prefetch.md", lines)


if __name__ == "__main__":
    main()
