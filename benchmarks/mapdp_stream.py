"""Benchmark: MAP-DP on data that stay in host memory (``fit_mapdp_chunked``), up to 10^7 points.

Data: ``benchmarks/mapdp.py``'s generator (30 well separated diagonal Gaussians in 10-D),
``n`` points per size (default 10^6 and 10^7), float32, saved to a ``.npy`` file in a
temporary folder and read back as a ``np.memmap``: the fit never holds ``X`` whole on the
device. Prior: ``default_prior`` (what ``MAPDP()`` uses) computed on the first 10^5 points,
with ``k0 = 1/n``; ``DP(1)``; capacity 64; chunks of 2^20 points, blocks of 4096.

``fit_mapdp_chunked`` with its defaults: a MAP-DP fit with ``MAPDP()``'s moves on a
subsample of 2^16 points, every point to its best cluster of that fit, then streamed
batched sweeps until the NLL stops falling. The time is the wall time of the whole call,
compilation, the validation pass and the subsample fit included (one call per size: a
user's wait). Beside it: sweeps run, K against the true 30, NMI against the truth, and
whether the NLL never rose. A second call with ``max_iter=1`` (programs compiled by then)
times the start plus one sweep.

    python benchmarks/mapdp_stream.py                       # 10^6 and 10^7 x 10
    python benchmarks/mapdp_stream.py --sizes 1000000

Results: ``benchmarks/results/mapdp_stream.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import (  # noqa: E402
    RESULTS, cpu_seconds, machine_info, other_cpu_seconds, write_json, write_lines,
)
from mapdp import K_TRUE, make_data  # noqa: E402

from sklearn.metrics import normalized_mutual_info_score  # noqa: E402

import jaxbnp as bnp  # noqa: E402
from jaxbnp.inference.distributed import fit_mapdp_chunked  # noqa: E402
from jaxbnp.inference.partition.mapdp import default_prior  # noqa: E402

CAPACITY = 64
CHUNK = 1 << 20
BLOCK = 4096


def run(n: int, d: int, folder: Path) -> dict:
    X, y = make_data(n, d)
    path = folder / f"X_{n}.npy"
    np.save(path, X)
    del X
    Xm = np.load(path, mmap_mode="r")
    p = default_prior(Xm[:100_000])
    family = bnp.NormalGamma(m0=p.m0, k0=1.0 / n, a0=p.a0, b0=p.b0)
    t0 = time.perf_counter()
    res = fit_mapdp_chunked(Xm, bnp.DP(1.0), family, CAPACITY, chunk_size=CHUNK, block_size=BLOCK)
    wall = time.perf_counter() - t0
    trace = np.asarray(res.nll_trace)
    labels = np.asarray(res.labels)
    out = {
        "n": n, "d": d, "time_s": wall, "sweeps": int(res.n_iter),
        "clusters": int(len(np.unique(labels))),
        "nmi": float(normalized_mutual_info_score(y, labels)),
        "nll_start": float(trace[0]), "nll": float(res.nll),
        "nll_monotone": bool(np.all(np.diff(trace) <= 1e-6 * np.abs(trace[:-1]))),
    }
    t0 = time.perf_counter()
    fit_mapdp_chunked(Xm, bnp.DP(1.0), family, CAPACITY, chunk_size=CHUNK, block_size=BLOCK, max_iter=1)
    out["time_one_sweep_call_s"] = time.perf_counter() - t0
    path.unlink()
    print(out, flush=True)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[10**6, 10**7])
    ap.add_argument("--dim", type=int, default=10)
    ap.add_argument("--out-name", default="mapdp_stream")
    args = ap.parse_args(argv)
    res = {
        "command": "python benchmarks/mapdp_stream.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": machine_info(), "k_true": K_TRUE, "rows": [],
    }
    clock0 = cpu_seconds()
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.sizes:
            res["rows"].append(run(n, args.dim, Path(tmp)))
    res["wall_s"] = time.perf_counter() - t_start
    res["other_cpu_s"] = other_cpu_seconds(clock0, cpu_seconds())
    write_json(RESULTS / f"{args.out_name}.json", res)
    m = res["machine"]
    lines = [
        "# MAP-DP streamed from host memory (`fit_mapdp_chunked`, defaults), 30 Gaussians in 10-D",
        "",
        f"Command: `{res['command']}`. Device: {m['jax_devices'][0]} ({m['cpu_model']}); "
        f"{m['cpu_count']} CPUs; dtype {m['dtype']}; jax {m['jax']}; git {m['jaxbnp_git']}.",
        f"Data as in `benchmarks/mapdp.py` (true K = {K_TRUE}), read from a `np.memmap`; "
        f"`default_prior` on the first 10^5 points with k0 = 1/n; DP(1); capacity {CAPACITY}; "
        f"chunks of {CHUNK:,} points, blocks of {BLOCK}. Time: the whole call (compilation, "
        "validation pass, subsample fit and sweeps); 'start + 1 sweep': a second call with "
        "`max_iter=1` (programs compiled).",
        "",
        "| N | D | s (whole call) | start + 1 sweep, s | sweeps | K | NMI | NLL never rises |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in res["rows"]:
        lines.append(f"| {r['n']:,} | {r['d']} | {r['time_s']:.1f} | {r['time_one_sweep_call_s']:.1f} | "
                     f"{r['sweeps']} | {r['clusters']} | {r['nmi']:.3f} | {'yes' if r['nll_monotone'] else 'NO'} |")
    lines += ["", f"Wall time of the run: {res['wall_s']:.0f} s. CPU seconds used by other processes "
              f"during the run: {res['other_cpu_s'] if res['other_cpu_s'] is None else round(res['other_cpu_s'])}."]
    write_lines(RESULTS / f"{args.out_name}.md", lines)
    print((RESULTS / f"{args.out_name}.md").read_text())


if __name__ == "__main__":
    main()
