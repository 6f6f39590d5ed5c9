"""Benchmark: BHMC sweeps per second per chain, the default sampler against the paper's.

One chain, ``jax.jit`` of :func:`jaxbnp.inference.bhmc.sampler.step` (XLA's default
flags), timed over ``--sweeps`` sweeps after one compiled warm-up sweep, at

* n = 180: the simulated two-level data of ``benchmarks/bhmc.py`` (3 x 3 groups, 20 points each);
* n = 1,300: the CLI's embedded data (``jaxbnp.datasets.load_default()``).

Four samplers: ``paper`` (path MH, the ``β`` update of eqs. 3-4 with point counts: the
sampler before issue #22, from a prior draw, node capacity ``min(2n + 3, 512)`` as
``fit_bhmc`` had then), ``points-only`` (exact path Gibbs and exact ``β`` updates, no subtree
or component moves: ``regraft=False, split_merge=0``), ``+subtrees`` (the subtree moves on)
and ``default`` (the subtree moves and one component split-or-merge per sweep), the last three
from Ward's start with 128 node slots (what ``fit_bhmc``'s growing capacity reaches on
these data). Depth 2, component capacity ``min(n, 64)``. Beside the time: the fraction of
points whose path changes per sweep, the subtrees moved and the component splits and
merges accepted per sweep (over the timed sweeps) and the complete-data log likelihood at the end.

Usage::

    python benchmarks/bhmc_speed.py                # both sizes, both path updates
    python benchmarks/bhmc_speed.py --sweeps 5
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import RESULTS, machine_info, other_cpu_seconds, cpu_seconds, utc_now, write_json, write_lines  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import jaxbnp as bnp  # noqa: E402
from jaxbnp.inference.bhmc import sampler as S  # noqa: E402
from jaxbnp.models.nested import NestedHDP  # noqa: E402

from bhmc import tree_data  # noqa: E402


SAMPLERS = {"paper": dict(path_update="mh", beta_rule="paper", regraft=False, split_merge=0),
            "points-only": dict(regraft=False, split_merge=0), "+subtrees": dict(split_merge=0),
            "default": {}}


def one(X, sampler, sweeps, seed=0):
    X = np.asarray(X, float)
    n, d = X.shape
    var = X.var(0)
    hyper = NestedHDP(depth=2, alpha=1.0, gamma0=1.0, gamma=1.0, Sigma=np.diag(var) / 20,
                      Sigma0=np.diag(var), mu0=X.mean(0))
    model = S.make_model(hyper)
    capacity = min(n * 2 + 3, 512) if sampler == "paper" else 128
    config = S.BHMCConfig(2, capacity, min(n, 64), **SAMPLERS[sampler])
    Xj = jnp.asarray(X, jnp.result_type(float))
    if sampler == "paper":
        state = jax.jit(lambda k: S.init(k, Xj, hyper, model, config))(jax.random.key(seed))
    else:
        paths, c = S.ward_start(X, 2, min(n // 2, 64, max(2, round((n / 2) ** 0.5))))
        state = jax.jit(lambda k: S.init_from(k, Xj, paths, c, hyper, model, config))(jax.random.key(seed))
    step = jax.jit(lambda k, s: S.step(k, s, Xj, model, config))
    t = time.perf_counter()
    state, info = step(jax.random.key(1), state)
    jax.block_until_ready(state)
    first = time.perf_counter() - t
    moved = regrafted = split_merged = 0
    t = time.perf_counter()
    for i in range(sweeps):
        state, info = step(jax.random.key(2 + i), state)
        moved += int(info.num_accepted)
        regrafted += int(info.num_regrafted)
        split_merged += int(info.num_split_merge)
    jax.block_until_ready(state)
    dt = time.perf_counter() - t
    if bool(state.overflow):  # a chain that ran out of slots stops moving: its time means nothing
        raise SystemExit(f"{sampler} at n = {n} ran out of node or component slots; raise the capacity.")
    return {"n": n, "sampler": sampler, "node_capacity": capacity, "sweeps": sweeps, "first_sweep_s": first,
            "sweeps_per_s": sweeps / dt, "moved_fraction": moved / (sweeps * n),
            "regrafted_per_sweep": regrafted / sweeps, "split_merge_per_sweep": split_merged / sweeps,
            "log_lik": float(state.log_lik), "overflow": bool(state.overflow)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sweeps", type=int, default=20)
    ap.add_argument("--out-name", default="bhmc_speed")
    args = ap.parse_args()
    cpu0, t0 = cpu_seconds(), time.perf_counter()
    data = {180: tree_data(20)[0], 1300: bnp.datasets.load_default()[0]}
    rows = [one(X, pu, args.sweeps) for X in data.values() for pu in SAMPLERS]
    wall = time.perf_counter() - t0
    other = other_cpu_seconds(cpu0, cpu_seconds())
    info = machine_info()
    cmd = "python benchmarks/bhmc_speed.py" + ("" if args.sweeps == 20 else f" --sweeps {args.sweeps}")
    lines = ["# BHMC: sweeps per second per chain, the default sampler vs the paper's", "",
             f"Command: `{cmd}`. {info['cpu_model']}, {info['cpu_count']} CPUs, {info['jax_backend']}, "
             f"{info['dtype']}, jaxbnp {info['jaxbnp_git']}. Run {utc_now()}. One chain, `jit(step)`, XLA's "
             f"default flags, depth 2, {args.sweeps} timed sweeps after one compiled sweep. CPU seconds "
             f"used by other processes during the run: {other if other is None else round(other)}.", "",
             "| n | sampler | node slots | sweeps / s | first sweep incl. compile (s) | points whose path changed per sweep | subtrees moved per sweep | component splits + merges per sweep | log lik at the end |",
             "|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['n']:,} | {r['sampler']} | {r['node_capacity']} | {r['sweeps_per_s']:.2f} "
                     f"| {r['first_sweep_s']:.1f} | {r['moved_fraction']:.3f} | {r['regrafted_per_sweep']:.1f} "
                     f"| {r['split_merge_per_sweep']:.2f} | {r['log_lik']:.1f} |")
    lines += ["", f"Wall time of the run: {wall:.0f} s."]
    write_lines(RESULTS / f"{args.out_name}.md", lines)
    write_json(RESULTS / f"{args.out_name}.json", {"command": cmd, "machine": info, "rows": rows,
                                                   "other_cpu_s": other, "wall_s": wall})
    print("\n".join(lines))


if __name__ == "__main__":
    main()
