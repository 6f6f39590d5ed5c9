"""Benchmark: where the compilation of MAP-DP's fit program goes (issues #36 and #37).

``MAPDP()`` compiles one program per size class (``jaxbnp.inference.partition.mapdp.fit``:
the start, then a ``while`` loop whose body switches between a sweep, a merge round and a
split round). That program is compiled in many of the suite's files, under many shapes and
settings, and in every user's first fit. This compiles it with ``MAPDP()``'s own settings
(batched sweeps, merge and split moves, a k-means++ start of up to 32 clusters, the default
full-covariance prior on standardised data) and with each phase left out, so that each
phase's share of the compile time shows: ``jax.jit(...).lower(...).compile()``, 20 points in
2-D padded to the fit's size class, float32, XLA's default flags, the best of ``--repeats``
rounds (the settings in a new order each round; ``harness.compile_stats``), and the optimised
HLO's lines, fusions and ``while`` loops beside the seconds.

Results: ``benchmarks/results/compile_mapdp_parts.md`` and ``.json``.

Usage::

    python benchmarks/compile_mapdp_parts.py [--repeats 2]
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np
from harness import RESULTS, compile_stats, machine_info, utc_now, write_json, write_lines

import jaxbnp as bnp
from jaxbnp.inference.partition import mapdp as M

#: name -> the phases' switches (MAPDP()'s defaults first)
SETTINGS = {
    "MAPDP() (sweeps, merges, splits, k-means++ start)": dict(split_moves=True, merge_moves=True, init_clusters=32),
    "no split rounds": dict(split_moves=False, merge_moves=True, init_clusters=32),
    "no merge rounds": dict(split_moves=True, merge_moves=False, init_clusters=32),
    "sweeps only, k-means++ start": dict(split_moves=False, merge_moves=False, init_clusters=32),
    "sweeps only, one-cluster start (the paper's)": dict(split_moves=False, merge_moves=False, init_clusters=1),
}


def _case(name: str):
    """``(f, args)``: ``mapdp.fit`` with ``name``'s switches and ``MAPDP()``'s other settings."""
    rng = np.random.default_rng(0)
    X = np.concatenate([rng.normal(-2.0, 0.5, (10, 2)), rng.normal(2.0, 0.5, (10, 2))]).astype(np.float32)
    X = (X - X.mean(0)) / X.std(0)
    family = M.default_prior(X, covariance="full")
    rows = M.padded_size(X.shape[0])
    capacity = min(rows, 64)
    kw = dict(SETTINGS[name])
    kw["init_clusters"] = min(kw["init_clusters"], capacity)

    def f(key, Xj, measure, family):
        return M.fit(key, Xj, measure, family, capacity, mode="batched", n_restarts=1, max_iter=1000,
                     block_size=4096, num_points=X.shape[0], **kw)

    return f, (jax.random.key(0), jnp.asarray(M.pad_rows(X, rows)), bnp.DP(1.0), family)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=2)
    args = p.parse_args()
    names = list(SETTINGS)
    best: dict[str, dict] = {}
    for r in range(args.repeats):  # the settings in a new order each round
        for name in (names if r % 2 == 0 else names[::-1]):
            f, f_args = _case(name)
            row = dict(setting=name, **compile_stats(f, *f_args))
            print(row, flush=True)
            if name not in best or row["seconds"] < best[name]["seconds"]:
                best[name] = row
    rows = [best[n] for n in names]
    info = machine_info()
    write_json(RESULTS / "compile_mapdp_parts.json", dict(machine=info, repeats=args.repeats, rows=rows))
    lines = ["# Where MAP-DP's fit program's compilation goes (compile_mapdp_parts)", "",
             f"`python benchmarks/compile_mapdp_parts.py --repeats {args.repeats}` (module docstring). "
             f"Machine: {info.get('cpu_model')} ({info.get('cpu_count')} CPUs), JAX {jax.__version__}; "
             f"{utc_now()[:10]}. Load average at the end: {info.get('load_average')}.", "",
             "| setting | compile s (best) | optimised HLO lines | fusions | `while` loops |", "|---|---|---|---|---|"]
    lines += [f"| {r['setting']} | {r['seconds']:.2f} | {r['hlo_lines']} | {r['fusions']} | {r['whiles']} |"
              for r in rows]
    write_lines(RESULTS / "compile_mapdp_parts.md", lines)


if __name__ == "__main__":
    main()
