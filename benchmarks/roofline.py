"""Benchmark: the collapsed Gibbs sweep and the batched MAP-DP sweep against this CPU's limits.

For each sweep the script counts the arithmetic and the memory traffic of one sweep from
the algorithm's structure (the formulas are below, next to each count), times the sweep
(median of several, compiled), and compares with two ceilings measured in the same
script on the same machine:

* peak arithmetic: a float32 matrix product of two 2048 x 2048 matrices (``jnp.dot``),
  in flop/s;
* memory bandwidth: ``x + 1.0`` over a 256 MiB float32 array (read once, written once),
  in bytes/s.

The fraction of peak is ``(flops / time) / peak flop/s``; the bound the counts imply is
``max(flops / peak, bytes / bandwidth)``. A sweep whose time is far above both bounds is
limited by something else: on a CPU, the fixed cost of each of the many small operations of
a sequential loop (the Gibbs sweep visits its points one at a time).

Sweeps:

* Gibbs: ``gibbs_sweep`` on the tgMCMC paper's 10k data (10,000 x 6, NormalWishart, DP(1))
  started at the ground truth (119 clusters), capacity 128; float32.
* MAP-DP: ``batched_sweep`` (block size 4096) on 10^6 x 10 points from 30 Gaussians
  (``benchmarks/mapdp.py``'s data) at the true partition, capacity 64, with ``default_prior``'s
  full-covariance prior (``MAPDP()``'s default) and with its diagonal one.

Results: ``benchmarks/results/roofline.json`` and ``benchmarks/results/roofline.md``.

Usage::

    python benchmarks/roofline.py            # about a minute on 2 CPU cores
    python benchmarks/roofline.py --n-mapdp 100000
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import RESULTS, machine_info, median_seconds, utc_now, write_json, write_lines  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import jaxbnp as bnp  # noqa: E402
from jaxbnp.inference.partition import mapdp as mapdp_core  # noqa: E402
from jaxbnp.inference.partition.clusters import clusters_from_labels, init_clusters  # noqa: E402
from jaxbnp.inference.partition.gibbs import BLOCK_SIZE, gibbs_sweep  # noqa: E402

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "nrmm" / "10k"
F32 = 4


def peak_flops() -> float:
    a = jnp.ones((2048, 2048), jnp.float32)
    f = jax.jit(lambda a: a @ a)
    return 2 * 2048**3 / median_seconds(f, a)


def bandwidth() -> float:
    x = jnp.ones((64 * 2**20,), jnp.float32)
    f = jax.jit(lambda x: x + 1.0)
    return 2 * x.size * F32 / median_seconds(f, x)


def gibbs_counts(n, d, capacity, block=BLOCK_SIZE):
    """Flops and bytes of one blocked Gibbs sweep (``assignment_sweep``).

    Score of one point against one cluster (NormalWishart, written-out quadratic form):
    d differences, d(d+1)/2 terms of 3 flops, then ~6 flops and one log1p (counted as 20).
    Per block: ``block x (capacity + 1)`` scores. Per step: the point against its own cluster
    without it (1 score), the block against the two changed clusters (2 block scores),
    two rank-one updates (Sherman-Morrison: about 4 d^2 + 8 d flops each), the weights and the
    draw over the capacity (about 8 flops per slot: log of the count, add, exp, cumulative sum,
    compare). Bytes: the parameter table (capacity rows of d^2 + d + 5 floats) read once per
    block, each step's two rows read and written, the block's scores row read, the point read.
    """
    score = d + 3 * d * (d + 1) // 2 + 6 + 20
    row = d * d + d + 5
    flops = n * (capacity + 1) * score  # block scoring, amortised per point
    flops += n * ((1 + 2 * block) * score + 2 * (4 * d * d + 8 * d) + 8 * (capacity + 1))
    bytes_ = (n // block + 1) * (capacity + 1) * row * F32
    bytes_ += n * (4 * row + (capacity + 1) + 2 * block + d) * F32
    return float(flops), float(bytes_)


def mapdp_counts(n, d, capacity):
    """Flops and bytes of one batched MAP-DP sweep (``batched_sweep``, NormalGamma).

    Score of one point against one cluster: per dimension a difference, a square, a product
    and a log1p (20), times a weight, summed: about 25 d flops; plus the weights (3 per
    slot). Per point also its own cluster without it (about 30 d). Per block: the joint
    update's statistics (2(2d + 1) adds per point) and two NLLs over the capacity (small).
    Bytes: the data once, labels read and written, the statistics per block.
    """
    flops = n * capacity * (25 * d + 3) + n * 30 * d + n * 2 * (2 * d + 1)
    bytes_ = n * (d + 2) * F32 + (n // 4096 + 1) * capacity * (2 * d + 1) * F32 * 4
    return float(flops), float(bytes_)


def mapdp_counts_full(n, d, capacity):
    """Flops and bytes of one batched MAP-DP sweep with the full-covariance ``NormalWishart``
    prior (``MAPDP()``'s default; ``batched_sweep``).

    Score of one point against one cluster: ``Lᵀ x`` is one matrix product of the block
    with the clusters' Cholesky factors, 2 d² flops per pair; then d subtractions and d
    squares summed (3 d) and the t density's log1p and weights (about 25). Per point also
    its own cluster without it (a quadratic form with a gathered ``Ψ⁻¹``: 2 d² + 30) and its
    statistics ``x xᵀ`` (d²). Per block: the clusters' Cholesky factors and inverses (about
    2 d³ per cluster, amortised over the block) and the joint update's statistics (two
    segment sums of d² + d + 1 per point). Bytes: the data once, labels read and written, the
    statistics and factors of every cluster per block.
    """
    block = 4096
    flops = n * capacity * (2 * d * d + 3 * d + 25) + n * (2 * d * d + 30) + n * d * d
    flops += (n // block + 1) * capacity * 2 * d ** 3 + n * 2 * (d * d + d + 1)
    bytes_ = n * (d + 2) * F32 + (n // block + 1) * capacity * (2 * d * d + d + 1) * F32 * 4
    return float(flops), float(bytes_)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n-mapdp", type=int, default=10**6)
    ap.add_argument("--data-dir", type=Path, default=DATA)
    args = ap.parse_args(argv)
    res = {"started": utc_now(), "machine": machine_info(), "rows": []}
    peak, bw = peak_flops(), bandwidth()
    res["peak_flops"], res["bandwidth"] = peak, bw
    print(f"peak {peak / 1e9:.1f} GFLOP/s, bandwidth {bw / 1e9:.1f} GB/s", flush=True)

    X = np.loadtxt(args.data_dir / "X.txt", dtype=np.float32)
    y = np.loadtxt(args.data_dir / "gt_labels.txt").astype(int)
    fam = bnp.NormalWishart.from_data(X)
    Xj = jnp.asarray(X)
    st = init_clusters(fam, Xj, y, 128)
    sweep = jax.jit(lambda k, s: gibbs_sweep(k, s, Xj, bnp.DP(1.0), fam))
    t = median_seconds(sweep, jax.random.key(0), st, repeats=9)
    flops, bytes_ = gibbs_counts(X.shape[0], X.shape[1], 128)
    res["rows"].append(dict(sweep="Gibbs, 10k x 6, K = 119, capacity 128", time_s=t, flops=flops,
                            bytes=bytes_, steps=X.shape[0]))
    print(res["rows"][-1], flush=True)

    from mapdp import make_data  # benchmarks/mapdp.py's data

    Xm, ym = make_data(args.n_mapdp, 10)
    Xm = jnp.asarray(Xm)
    # MAPDP()'s default prior (full covariance), and the diagonal one it had before
    for covariance, counts, what in (("full", mapdp_counts_full, "NormalWishart (default)"),
                                      ("diag", mapdp_counts, "NormalGamma")):
        fam_m = mapdp_core.default_prior(np.asarray(Xm), covariance=covariance)
        st_m = clusters_from_labels(fam_m, Xm, jnp.asarray(ym, jnp.int32), 64)
        msweep = jax.jit(lambda s, f=fam_m: mapdp_core.batched_sweep(s, Xm, bnp.DP(1.0), f, 4096))
        t = median_seconds(msweep, st_m, repeats=3)
        flops, bytes_ = counts(args.n_mapdp, 10, 64)
        res["rows"].append(dict(
            sweep=f"MAP-DP batched, {what}, {args.n_mapdp:,} x 10, K = 30, capacity 64",
            time_s=t, flops=flops, bytes=bytes_, steps=args.n_mapdp // 4096 + 1))
        print(res["rows"][-1], flush=True)

    lines = [
        "# Roofline: the Gibbs and MAP-DP sweeps against this CPU's limits",
        "",
        f"{res['started']}; {res['machine']['cpu_model']}, {res['machine']['cpu_count']} CPUs; "
        f"JAX {res['machine']['jax']}, float32. Written by `benchmarks/roofline.py`.",
        "",
        f"Ceilings measured in the same script: peak {peak / 1e9:.1f} GFLOP/s (2048² float32 "
        f"matrix product), bandwidth {bw / 1e9:.1f} GB/s (`x + 1` over 256 MiB). Flops and bytes "
        "per sweep are counted from the algorithm (the script's docstrings give the formulas).",
        "",
        "| sweep | flops | bytes | time | achieved GFLOP/s | fraction of peak | bound from the counts "
        "| time / bound | time per loop step |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in res["rows"]:
        bound = max(r["flops"] / peak, r["bytes"] / bw)
        r["fraction_of_peak"] = r["flops"] / r["time_s"] / peak
        r["bound_s"] = bound
        lines.append(
            f"| {r['sweep']} | {r['flops']:.2e} | {r['bytes']:.2e} | {r['time_s'] * 1e3:.1f} ms | "
            f"{r['flops'] / r['time_s'] / 1e9:.2f} | {r['fraction_of_peak']:.1%} | "
            f"{bound * 1e3:.2f} ms | {r['time_s'] / bound:.0f}x | {r['time_s'] / r['steps'] * 1e6:.1f} µs |"
        )
    lines += [
        "",
        "The Gibbs sweep visits its 10,000 points one after another; a step whose point stays "
        "in its cluster (most of them) is about 24 small XLA operations, and their fixed cost, not arithmetic or memory, sets the time (the last "
        "column; the MAP-DP row's steps are its blocks of 4096 points).",
    ]
    write_json(RESULTS / "roofline.json", res)
    write_lines(RESULTS / "roofline.md", lines)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
