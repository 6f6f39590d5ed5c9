"""Full-covariance scores of small blocks, and what they cost the default estimator.

Two parts, each with its baseline in the same run:

1. ``NormalWishart.log_predictive_pairwise`` on a block of B points against K clusters:
   the factored form (Cholesky factors of every cluster's ``Ψ_n⁻¹``, then one matrix
   product; the library's path for blocks of more than ``PAIRWISE_DIRECT_ROWS_PER_DIM * D``
   points) against the direct form (``x − m_n`` for every pair times ``Ψ_n⁻¹``; its path for
   smaller blocks, such as the collapsed Gibbs sweep's 32). Microseconds per call (median of
   ``--repeats``), the flops of each form, and the ratio.
2. With ``--baseline PATH`` (a checkout of an earlier commit, e.g. made by ``git worktree add
   /tmp/base COMMIT``): one collapsed Gibbs sweep, one Jain-Neal split-merge move, and
   ``DirichletMultinomial()``'s default fit (second fit of the same estimator, compiled) on
   standardised scikit-learn sets, each in a subprocess that imports the library from this
   checkout or from PATH, the two alternating ``--rounds`` times. Times per call (medians)
   and the ratio baseline / this checkout.

float32, XLA's default flags (the samplers' own loop-kernel setting), persistent
compilation cache off. Writes ``benchmarks/results/<out-name>.{md,json}``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

from harness import (REPO_ROOT, RESULTS, git_state, machine_info, median_seconds, utc_now, write_json,
                     write_lines)

_CHILD = r"""
import json, sys, time
import numpy as np
import jax, jax.numpy as jnp
from sklearn import datasets
import jaxbnp as bnp
from jaxbnp import _defaults as d
from jaxbnp.inference.partition import clusters as cl, gibbs, split_merge
from jaxbnp._xla import mark_loop_program

name, reps = sys.argv[1], int(sys.argv[2])
X, y = getattr(datasets, "load_" + name)(return_X_y=True)
shift, scale = d.standardisation(X)
Z = jnp.asarray(((X - shift) / scale).astype(np.float32))
fam, m = d.default_family(np.asarray(Z)), bnp.DP(1.0)
start = cl.init_clusters(fam, Z, jnp.asarray(d.kmeans_starts(np.asarray(Z), 0, 20, 1)), 32)

def per_call(f, state):
    state = f(jax.random.key(0), state)
    for i in range(10):
        state = f(jax.random.key(1 + i), state)
    jax.block_until_ready(state)
    t = time.perf_counter()
    for i in range(reps):
        state = f(jax.random.key(100 + i), state)
    jax.block_until_ready(state)
    return (time.perf_counter() - t) / reps, state

def sm(key, s):
    out = split_merge.split_merge_move_info(key, s, Z, m, fam)[0]
    return out._replace(overflow=mark_loop_program(out.overflow))

out = {}
out["gibbs_sweep"], state = per_call(jax.jit(lambda k, s: gibbs.gibbs_sweep(k, s, Z, m, fam)), start)
out["clusters"] = int((state.counts > 0).sum())
out["split_merge_move"], _ = per_call(jax.jit(sm), state)
est = bnp.DirichletProcessMixture
fit = est(random_state=0, progress_bar=False)
t = time.perf_counter(); fit.fit(X); out["first_fit"] = time.perf_counter() - t
t = time.perf_counter(); fit.fit(X); out["second_fit"] = time.perf_counter() - t
from sklearn.metrics import normalized_mutual_info_score as nmi
out["nmi"] = float(nmi(y, fit.labels_))
out["K"] = int(len(np.unique(fit.labels_)))
print("RESULT " + json.dumps(out))
"""


def scores_table(dims, clusters, blocks, repeats):
    import jax
    import jax.numpy as jnp
    import numpy as np

    import jaxbnp as bnp
    from jaxbnp import _math

    def factored(X, p):  # the library's path for big blocks, written out for any block
        d = X.shape[1]
        chol = _math.cholesky(p.psi_inv)
        z = jnp.einsum("bd,kde->bke", X, chol) - jnp.einsum("kd,kde->ke", p.mean, chol)[None]
        q = jnp.sum(z * z, -1)
        return p.log_norm[None] - (0.5 * (p.nun - d + 1.0 + d))[None] * jnp.log1p(q * (p.rn / (p.rn + 1.0))[None])

    def direct(X, p):
        d = X.shape[1]
        diff = X[:, None, :] - p.mean[None]
        q = jnp.sum(jnp.einsum("bkd,kde->bke", diff, p.psi_inv) * diff, -1)
        return p.log_norm[None] - (0.5 * (p.nun - d + 1.0 + d))[None] * jnp.log1p(q * (p.rn / (p.rn + 1.0))[None])

    def timed(f, *args):
        return median_seconds(jax.jit(f), *args, repeats=repeats)

    rng = np.random.default_rng(0)
    rows = []
    for d in dims:
        X0 = rng.normal(size=(max(blocks) + 1000, d)).astype(np.float32)
        fam = bnp.NormalWishart.from_data(X0)
        for k in clusters:
            stats = fam.stats_from_labels(jnp.asarray(X0), jnp.asarray(rng.integers(0, k, len(X0))), k)
            params = fam.predictive_params(stats)
            for b in blocks:
                Xb = jnp.asarray(X0[:b])
                np.testing.assert_allclose(direct(Xb, params), factored(Xb, params), rtol=2e-3, atol=2e-3)
                tf, td = timed(factored, Xb, params), timed(direct, Xb, params)
                rows.append(dict(D=d, K=k, B=b, factored_us=tf * 1e6, direct_us=td * 1e6,
                                 factored_flops=k * d ** 3 / 3 + 2 * b * k * d * d,
                                 direct_flops=2 * b * k * d * d + b * k * d))
                print(rows[-1], flush=True)
    return rows


def child_run(src, name, reps):
    env = dict(os.environ, PYTHONPATH=str(src), JAXBNP_COMPILATION_CACHE="0", JAXBNP_PROGRESS="0")
    env.pop("XLA_FLAGS", None)
    out = subprocess.run([sys.executable, "-c", _CHILD, name, str(reps)], env=env, cwd="/",
                         capture_output=True, text=True, check=True).stdout
    return json.loads(next(ln for ln in out.splitlines() if ln.startswith("RESULT "))[7:])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dims", type=int, nargs="+", default=[10, 30, 64])
    ap.add_argument("--clusters", type=int, nargs="+", default=[2, 32])
    ap.add_argument("--blocks", type=int, nargs="+", default=[32, 256, 4096])
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--baseline", default=None, help="a checkout of an earlier commit")
    ap.add_argument("--sets", nargs="+", default=["breast_cancer", "wine"])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--out-name", default="pairwise_scores")
    args = ap.parse_args()

    res = dict(command="python benchmarks/pairwise_scores.py " + " ".join(sys.argv[1:]), date=utc_now(),
               machine=machine_info(with_jax=False), git=git_state(), args=vars(args))
    res["scores"] = scores_table(args.dims, args.clusters, args.blocks, args.repeats)
    lines = [f"# {__doc__.splitlines()[0]}", "", f"Command: `{res['command']}`. Run {res['date']}; "
             f"jaxbnp at {(res['git'] or {}).get('commit', '?')[:7]}.", "",
             "## 1. A block of B points against K clusters, float32 (median of "
             f"{args.repeats} calls)", "",
             "| D | K | B | factored, µs | direct, µs | factored / direct | flops, factored | flops, direct |",
             "|---|---|---|---|---|---|---|---|"]
    for r in res["scores"]:
        lines.append(f"| {r['D']} | {r['K']} | {r['B']} | {r['factored_us']:.0f} | {r['direct_us']:.0f} | "
                     f"{r['factored_us'] / r['direct_us']:.2f} | {r['factored_flops']:.2e} | {r['direct_flops']:.2e} |")
    if args.baseline:
        runs = {name: {"baseline": [], "current": []} for name in args.sets}
        for _ in range(args.rounds):
            for name in args.sets:
                for which, src in (("baseline", args.baseline), ("current", REPO_ROOT)):
                    runs[name][which].append(child_run(src, name, args.calls))
                    print(name, which, runs[name][which][-1], flush=True)
        res["baseline_commit"] = subprocess.run(["git", "rev-parse", "HEAD"], cwd=args.baseline,
                                                capture_output=True, text=True).stdout.strip()
        res["estimator"] = runs
        lines += ["", f"## 2. Against {res['baseline_commit'][:7]} (`--baseline`), alternating "
                  f"subprocesses, {args.rounds} rounds; medians", "",
                  "| set | quantity | baseline | this checkout | baseline / this |", "|---|---|---|---|---|"]
        for name, r in runs.items():
            for q, unit, f in (("gibbs_sweep", "ms", 1e3), ("split_merge_move", "ms", 1e3),
                               ("first_fit", "s", 1), ("second_fit", "s", 1)):
                b = statistics.median(x[q] for x in r["baseline"]) * f
                c = statistics.median(x[q] for x in r["current"]) * f
                lines.append(f"| {name} | {q.replace('_', ' ')} ({unit}) | {b:.2f} | {c:.2f} | {b / c:.2f} |")
            nb = sorted({(x["K"], round(x["nmi"], 3)) for x in r["baseline"]})
            nc = sorted({(x["K"], round(x["nmi"], 3)) for x in r["current"]})
            lines.append(f"| {name} | fit's (K, NMI) | {nb} | {nc} | |")
    write_json(RESULTS / f"{args.out_name}.json", res)
    write_lines(RESULTS / f"{args.out_name}.md", lines)


if __name__ == "__main__":
    main()
