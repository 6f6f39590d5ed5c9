"""Benchmark: where the compilation of one sub-cluster iteration goes (issue #36).

``SubClusterMCMC``'s first run on ``toy_ring`` is mostly XLA compiling NumPyro's sampling
loop, whose body is one sub-cluster iteration (``subcluster.step``). This compiles the
iteration whole and some of its parts alone (``jax.jit(f).lower(...).compile()``, XLA's
default flags, float32, NormalWishart, DP, capacity 64, three launch sweeps) and reports
seconds, lines of optimised HLO, fusions and ``while`` loops for each, the best of
``--repeats`` compilations (``jax.clear_caches()`` between them).

``no-redraw`` rows compile the same functions with the Gamma variates' rejection redraw
loop (``jaxbnp._random.loggamma_from_uniform``; it runs no trip unless every candidate of
an entry was rejected) replaced by no loop: wrong draws, a measure of that loop's share only.

Results: ``benchmarks/results/compile_parts.md`` and ``.json``.

Usage::

    python benchmarks/compile_parts.py
"""

from __future__ import annotations

import argparse
import types

import jax
import jax.numpy as jnp
from harness import RESULTS, compile_stats, machine_info, write_json, write_lines
from jax import lax

import jaxbnp as bnp
import jaxbnp._random as R
from jaxbnp.inference.partition import subcluster as S

C, T = 64, 3


def parts(repeats: int) -> dict:
    X, _ = bnp.datasets.toy_ring()
    X = jnp.asarray(X, jnp.float32)
    family = bnp.NormalWishart.from_data(X)
    measure = bnp.DP(1.0)
    labels = jnp.zeros(X.shape[0], jnp.int32)
    counts, stats = S.segment_stats(family.point_stats(X), labels, C, None)
    key = jax.random.key(0)

    def rng(k):
        return S.IterationRandomness(k, family, stats, C, T, jnp.float32)

    cases = {
        "the iteration (subcluster.step)":
            (lambda k, z: S.step(k, z, X, measure, family, capacity=C)[0], (key, labels)),
        "label step's draws (weights, parameters)":
            (lambda k: S.label_draws(rng(k), measure, family, counts, stats, jnp.float32), (key,)),
        "NormalWishart parameters of every slot":
            (lambda k: family.sample_params_from_uniform(rng(k).theta, stats, rng(k).k_theta), (key,)),
        "Dirichlet weights of every slot":
            (lambda k: R.log_dirichlet_from_uniform(rng(k).w, (counts + 1.0).astype(jnp.float32),
                                                    rng(k).k_w), (key,)),
        "log-likelihood matrix (n x slots)":
            (lambda k: family.log_likelihood(X, family.sample_params_from_uniform(
                rng(k).theta, stats, rng(k).k_theta)), (key,)),
        "log marginal of every slot": (lambda s: family.log_marginal(s), (stats,)),
        "the iteration's uniforms": (lambda k: rng(k)._flat, (key,)),
    }
    out = {}
    for name, (f, args) in cases.items():
        out[name] = compile_stats(f, *args, repeats=repeats)
        print(name, out[name], flush=True)
    # the same, without the rejection redraw loop (a measure of its share; wrong draws)
    real = R.lax
    R.lax = types.SimpleNamespace(**{k: getattr(lax, k) for k in dir(lax) if not k.startswith("__")})
    R.lax.while_loop = lambda cond, body, init: init
    try:
        for name in ("the iteration (subcluster.step)", "Dirichlet weights of every slot"):
            f, args = cases[name]
            out[name + ", no-redraw"] = compile_stats(lambda *a, f=f: f(*a), *args, repeats=repeats)
            print(name + ", no-redraw", out[name + ", no-redraw"], flush=True)
    finally:
        R.lax = real
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    rows = parts(args.repeats)
    write_json(RESULTS / "compile_parts.json", {"machine": machine_info(), "rows": rows})
    lines = ["# Where one sub-cluster iteration's compilation goes", "",
             "`python benchmarks/compile_parts.py` (module docstring): toy_ring, NormalWishart, DP, "
             f"capacity {C}, {T} launch sweeps, float32, XLA's default flags; best of "
             f"{args.repeats} compilations.", "",
             "| compiled alone | seconds | HLO lines | fusions | while loops |", "|---|---|---|---|---|"]
    lines += [f"| {k} | {v['seconds']} | {v['hlo_lines']} | {v['fusions']} | {v['whiles']} |"
              for k, v in rows.items()]
    write_lines(RESULTS / "compile_parts.md", lines)


if __name__ == "__main__":
    main()
