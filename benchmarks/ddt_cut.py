"""Benchmark: the seed's cut model (issue #42, docs/mathematics.md §5, "The cut model").

0. Sweep time against n: one chain's ``cut.step`` (``n`` subtree moves, ``n − 1`` time
   moves, slice updates of ``c`` and ``t_stop``), the data term changed only at the
   clusters each move touches (the library), against the same sweep with the data term
   evaluated in full after every move (all node statistics by an upward pass, every cluster
   root's marginal; swapped in here). Compile excluded; median of timed sweeps.
1. Population MCMC (``cut.population_step``: the sweeps plus the seed's exchange move on
   ``K/2`` random pairs) against as many independent chains (the sweeps alone) at **equal
   wall time**, on eight well separated 2-D groups arranged as pairs of pairs of pairs
   (``benchmarks/ddt.py``'s data), from the same prior draws, over repeats. Reported per
   method: how many runs reach the true partition in some chain, the fraction of chains at
   the true partition at the end, the chains' mean NMI at the end, the seconds to the
   first chain at the truth, and the best log posterior seen (in ``x = −log(1 − t)``, where
   the density is bounded; see ``benchmarks/ddt.py``).
2. What the DDT prior buys: the same data and family under a DP mixture
   (``SplitMerge`` with Gibbs sweeps, ``DP(1)``), and the cut model's draws pooled over
   the population's chains after the run: the fraction of draws at the true partition, the
   number of clusters and NMI.

3. (``--only-fixed-t``) Whether the true partition holds when ``t_stop`` is fixed: one chain
   from the Ward tree, ``t_stop`` fixed between the 7th and 8th earliest of the Ward tree's
   divergence times (where its cut is the 8 groups), ``c`` fixed at 0.3, 1 and 3, 150 sweeps:
   clusters and NMI every 30 sweeps. Writes ``ddt_cut_fixed_t.md``.

Family: ``NormalWishart.from_data(X)``; ``c ~ LogNormal(0, 1)``, ``t_stop ~ Beta(2, 2)``.
Everything in JAX's default dtype (float32), on the default device.

Results: ``benchmarks/results/ddt_cut.json`` and ``ddt_cut.md``.

Usage::

    python benchmarks/ddt_cut.py            # about 13 minutes on 2 CPU cores
    python benchmarks/ddt_cut.py --quick    # smaller, shorter (a dry run)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import RESULTS, machine_info, utc_now, write_json, write_lines  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpyro  # noqa: E402
import numpyro.distributions as dist  # noqa: E402
from numpyro.infer import MCMC  # noqa: E402
from sklearn.metrics import normalized_mutual_info_score  # noqa: E402

import jaxbnp as bnp  # noqa: E402
from jaxbnp.inference.base import run_chains  # noqa: E402
from jaxbnp.inference.trees import cut  # noqa: E402
from jaxbnp.models import ddt  # noqa: E402

from ddt import grouped_data  # noqa: E402  (the same data as the Brownian benchmark)

C_PRIOR = dist.LogNormal(0.0, 1.0)
T_PRIOR = dist.Beta(2.0, 2.0)
HYPER = cut.CutHyperpriors(C_PRIOR, T_PRIOR)


# ------------------------------------------------------------------------ 0. sweep time
def _full_change(family, roots_old, roots_new, stats_old, stats_new, touched):
    """The data term's change by a full evaluation: every cluster root's marginal, before and after."""
    m_new = jnp.sum(jnp.where(roots_new, family.log_marginal(stats_new), 0.0))
    m_old = jnp.sum(jnp.where(roots_old, family.log_marginal(stats_old), 0.0))
    return m_new - m_old


def sweep_times(sizes, repeats=3):
    rows = []
    for n in sizes:
        X, _ = grouped_data(5, max(n // 8, 1), 8)
        X = X[:n]
        family = bnp.NormalWishart.from_data(X)
        row = {"n": n}
        for name in ("touched", "full"):
            original = cut.data_term_change
            if name == "full":
                cut.data_term_change = _full_change
            try:
                alg = cut.algorithm(X, family, HYPER)
                step = jax.jit(alg.step)
                state = alg.init(jax.random.key(0), c=1.0, t_stop=0.5)
                t0 = time.perf_counter()
                state, _ = step(jax.random.key(1), state)
                jax.block_until_ready(state)
                row[f"{name}_first_s"] = time.perf_counter() - t0
                times = []
                for r in range(repeats):
                    t0 = time.perf_counter()
                    state, _ = step(jax.random.key(2 + r), state)
                    jax.block_until_ready(state)
                    times.append(time.perf_counter() - t0)
                row[f"{name}_sweep_s"] = statistics.median(times)
            finally:
                cut.data_term_change = original
            if name == "full" and row["full_sweep_s"] > 60:
                break
        row["ratio"] = row["full_sweep_s"] / row["touched_sweep_s"]
        rows.append(row)
        print(f"sweep n={n}: touched {row['touched_sweep_s']:.3f} s, full {row['full_sweep_s']:.3f} s", flush=True)
    return rows


# ------------------------------------------------------------- 1. population vs independent
def log_posterior_x(states):
    """``log_joint`` in ``x = −log(1 − t)`` (bounded; ``benchmarks/ddt.py``)."""
    n = (states.tree.parent.shape[-1] + 1) // 2
    return (states.log_prior + states.log_likelihood + C_PRIOR.log_prob(states.c) + T_PRIOR.log_prob(states.t_stop)
            + jnp.sum(jnp.log1p(-states.tree.time[..., n:]), axis=-1))


def prior_states(key, X, family, num_chains, start_tree=None):
    """``num_chains`` starting states: ``c`` and ``t_stop`` from their priors, the tree from the
    prior too, or ``start_tree`` (the Ward tree) for every chain."""
    n = X.shape[0]

    @jax.jit
    def draw(key):
        def one(k):
            k_c, k_t, k_tree = jax.random.split(k, 3)
            c, t_stop = C_PRIOR.sample(k_c), T_PRIOR.sample(k_t)
            tree = ddt.sample_tree(k_tree, c, n) if start_tree is None else start_tree
            state = cut.init(tree, X, family, c, t_stop)
            comb = cut.init(ddt.comb_tree(n), X, family, c, t_stop)
            bad = ~jnp.isfinite(state.log_prior + state.log_likelihood)
            return jax.tree.map(lambda a, b: jnp.where(bad, a, b), comb, state)

        return jax.lax.map(one, jax.random.split(key, num_chains))

    return draw(key)


def population_vs_independent(num_chains, per_group, seconds, repeats, subset_size, chunk=2, start="prior"):
    X, truth = grouped_data(123, per_group, 8)
    family = bnp.NormalWishart.from_data(X)
    Xj = jnp.asarray(X, jnp.result_type(float))
    start_tree = None
    if start == "ward":
        from scipy.cluster.hierarchy import ward

        start_tree = ddt.from_linkage(ward(X), dtype=Xj.dtype)

    def independent(key, states):
        keys = jax.random.split(key, states.log_prior.shape[0])
        return run_chains(lambda k, s: cut.step(k, s, Xj, family, HYPER)[0], keys, states, in_axes=(0, 0))

    def population(key, states):
        return cut.population_step(key, states, Xj, family, subset_size=subset_size, hyperpriors=HYPER)[0]

    def make(step_fn):
        @jax.jit
        def run(key, states):
            def body(i, carry):
                states, best = carry
                states = step_fn(jax.random.fold_in(key, i), states)
                return states, jnp.maximum(best, jnp.max(log_posterior_x(states)))

            return jax.lax.fori_loop(0, chunk, body, (states, jnp.asarray(-jnp.inf, Xj.dtype)))

        labels = jax.jit(jax.vmap(lambda s: ddt.cut_tree(s.tree, s.t_stop)))
        return run, labels

    methods = {"independent": make(independent), f"population (subset {subset_size})": make(population)}
    out = {name: {"reached_truth": [], "seconds_to_truth": [], "final_at_truth": [], "final_nmi": [],
                  "best_log_posterior_x": [], "iterations": [], "compile_s": None, "pooled": []}
           for name in methods}
    for rep in range(repeats):
        states0 = prior_states(jax.random.key(100 + rep), Xj, family, num_chains, start_tree)
        for name, (run, labels) in methods.items():
            r = out[name]
            if r["compile_s"] is None:
                t0 = time.perf_counter()
                jax.block_until_ready(run(jax.random.key(0), states0))
                r["compile_s"] = time.perf_counter() - t0
            states, best, its, hit_at = states0, -np.inf, 0, None
            pooled = []
            t0 = time.perf_counter()
            while time.perf_counter() - t0 < seconds:
                states, b = run(jax.random.fold_in(jax.random.key(7 + rep), its), states)
                lab = np.asarray(labels(states))
                its += chunk
                best = max(best, float(b))
                at_truth = [normalized_mutual_info_score(truth, row) > 1 - 1e-9 for row in lab]
                if hit_at is None and any(at_truth):
                    hit_at = time.perf_counter() - t0
                if time.perf_counter() - t0 > seconds / 2:
                    pooled.append(lab)
            lab = np.asarray(labels(states))
            nmis = [normalized_mutual_info_score(truth, row) for row in lab]
            r["reached_truth"].append(hit_at is not None)
            r["seconds_to_truth"].append(hit_at)
            r["final_at_truth"].append(float(np.mean([v > 1 - 1e-9 for v in nmis])))
            r["final_nmi"].append(float(np.mean(nmis)))
            r["best_log_posterior_x"].append(best)
            r["iterations"].append(its)
            if pooled:
                p = np.concatenate(pooled)
                r["pooled"].append({"at_truth": float(np.mean([normalized_mutual_info_score(truth, row) > 1 - 1e-9
                                                               for row in p])),
                                    "num_clusters": float(np.mean([len(set(row)) for row in p])),
                                    "nmi": float(np.mean([normalized_mutual_info_score(truth, row) for row in p]))})
            print(f"repeat {rep} {name}: {its} iterations, at truth {r['final_at_truth'][-1]:.2f}, "
                  f"NMI {r['final_nmi'][-1]:.3f}, best {best:.1f}, first at truth {hit_at}", flush=True)
    return {"num_points": int(X.shape[0]), "num_chains": num_chains, "seconds": seconds, "repeats": repeats,
            "subset_size": subset_size, "start": start, "results": out}


# ------------------------------------------------------------------------ 2. DP mixture
def dp_mixture(per_group, num_samples, chains=4):
    X, truth = grouped_data(123, per_group, 8)
    family = bnp.NormalWishart.from_data(X)

    def model(X):
        z = numpyro.sample("z", bnp.Partition(bnp.DP(1.0), X.shape[0]))
        numpyro.sample("X", bnp.ConjugateMixture(family, z), obs=X)

    t0 = time.perf_counter()
    mcmc = MCMC(bnp.SplitMerge(model), num_warmup=num_samples // 2, num_samples=num_samples, num_chains=chains,
                chain_method="vectorized", progress_bar=False)
    mcmc.run(jax.random.key(0), jnp.asarray(X))
    z = np.asarray(mcmc.get_samples()["z"])
    nmis = [normalized_mutual_info_score(truth, row) for row in z]
    return {"seconds": time.perf_counter() - t0, "at_truth": float(np.mean([v > 1 - 1e-9 for v in nmis])),
            "num_clusters": float(np.mean([len(set(row)) for row in z])), "nmi": float(np.mean(nmis)),
            "draws": int(z.shape[0])}


# ------------------------------------------------------------------ 3. fixed stopping time
def fixed_t_stop(per_group, sweeps=150, every=30):
    from scipy.cluster.hierarchy import ward

    X, truth = grouped_data(123, per_group, 8)
    family = bnp.NormalWishart.from_data(X)
    tree = ddt.from_linkage(ward(X), dtype=jnp.result_type(float))
    n = X.shape[0]
    times = np.sort(np.asarray(tree.time[n:]))
    t_stop = float((times[6] + times[7]) / 2)
    rows = []
    for c in (0.3, 1.0, 3.0):
        alg = cut.algorithm(X, family)  # c and t_stop fixed
        state = alg.init(None, tree=tree, c=c, t_stop=t_stop)
        step = jax.jit(alg.step)
        trace = []
        for i in range(sweeps):
            state, _ = step(jax.random.key(i), state)
            if (i + 1) % every == 0:
                lab = np.asarray(ddt.cut_tree(state.tree, t_stop))
                trace.append({"sweep": i + 1, "clusters": len(set(lab.tolist())),
                              "nmi": float(normalized_mutual_info_score(truth, lab))})
        rows.append({"c": c, "trace": trace})
        print(f"fixed t_stop {t_stop:.5f}, c {c}: {trace}", flush=True)
    return {"num_points": n, "t_stop": t_stop, "rows": rows}


def write_fixed_markdown(res: dict, path: Path) -> None:
    m, f = res["machine"], res["fixed_t"]
    lines = [
        "# The seed's cut model with the stopping time fixed",
        "",
        f"Machine: {m['cpu_model']} ({m['cpu_count']} CPUs); JAX {m['jax']} on {m['jax_backend']}, dtype "
        f"{m['dtype']}. Run {res['date']}. `python benchmarks/ddt_cut.py --only-fixed-t`.",
        "",
        f"{f['num_points']} points in eight groups; one chain from the Ward tree, t_stop fixed at "
        f"{f['t_stop']:.5f} (between the Ward tree's 7th and 8th earliest divergences, where its cut is "
        "the 8 groups), c fixed. Clusters (NMI against the truth) every 30 sweeps.",
        "",
        "| c | " + " | ".join(f"sweep {r['sweep']}" for r in f["rows"][0]["trace"]) + " |",
        "|---:|" + "---|" * len(f["rows"][0]["trace"]),
    ]
    for row in f["rows"]:
        lines.append(f"| {row['c']} | " + " | ".join(f"{r['clusters']} ({r['nmi']:.3f})" for r in row["trace"]) + " |")
    lines += ["", "With the stopping time on the tree's own time scale the chains keep the 8 groups. With "
              "t_stop ~ Beta(2, 2) from a prior draw (`ddt_cut.md`) they settle on 1 to 3 clusters. A likely "
              "reading, not tested further: while t_stop sits low, the tree below it is not constrained by the "
              "data and drifts towards the prior, so a later, higher cut no longer separates the groups.", ""]
    write_lines(path, lines)


# ---------------------------------------------------------------------------- report
def write_markdown(res: dict, path: Path) -> None:
    m = res["machine"]
    lines = [
        "# The seed's cut model: sweep time, population against independent chains, DP mixture",
        "",
        f"Machine: {m['cpu_model']} ({m['cpu_count']} CPUs), {m['platform']}; JAX {m['jax']} on "
        f"{m['jax_backend']}, dtype {m['dtype']}; load average at start {m['load_average']}. Mode: {res['mode']}. "
        f"Run {res['date']}. `python benchmarks/ddt_cut.py{' --quick' if res['mode'] == 'quick' else ''}`.",
        "",
        "## 0. Sweep time against n",
        "",
        "One chain; a sweep is n subtree moves, n − 1 time moves and slice updates of c and t_stop "
        "(NormalWishart, D = 2). Touched: the library (the marginals of at most 8 clusters per move). "
        "Full: every cluster root's marginal before and after each move. Compile (first sweep) apart.",
        "",
        "| n | sweep, touched (s) | sweep, full (s) | full / touched | first sweep with compile, touched (s) |",
        "|---:|---:|---:|---:|---:|",
    ]
    for row in res["sweeps"]:
        lines.append(f"| {row['n']} | {row['touched_sweep_s']:.3f} | {row['full_sweep_s']:.3f} | "
                     f"{row['ratio']:.1f}x | {row['touched_first_s']:.1f} |")
    lines += ["", "## 1. Population against independent chains at equal wall time"]
    for p in res["populations"]:
        start = ("the prior (c, t_stop and the tree)" if p["start"] == "prior" else
                 "the Ward tree of the data (c and t_stop from their priors)")
        lines += [
            "",
            f"### Chains started from {start}",
            "",
            f"{p['num_points']} points in eight groups (pairs of pairs of pairs), {p['num_chains']} chains, "
            f"{p['seconds']:.0f} s per run (compile excluded), {p['repeats']} repeats, each method from the same "
            f"starting states. The exchange moves {p['subset_size']} leaves.",
            "",
            "| method | iterations per run | compile (s) | runs reaching the truth | s to the first chain at the truth | chains at the truth at the end | mean NMI at the end | best log posterior (x), mean (min-max) |",
            "|---|---:|---:|---:|---|---:|---:|---:|",
        ]
        for name, r in p["results"].items():
            secs = ", ".join("-" if s is None else f"{s:.0f}" for s in r["seconds_to_truth"])
            b = r["best_log_posterior_x"]
            lines.append(f"| {name} | {int(np.mean(r['iterations']))} | {r['compile_s']:.1f} | "
                         f"{sum(r['reached_truth'])}/{len(r['reached_truth'])} | {secs} | "
                         f"{np.mean(r['final_at_truth']):.2f} | {np.mean(r['final_nmi']):.3f} | "
                         f"{np.mean(b):.1f} ({min(b):.1f}-{max(b):.1f}) |")
    d = res["dp"]
    lines += [
        "",
        "## 2. What the DDT prior buys: the same family under a DP mixture",
        "",
        "Draws pooled over the second half of each run's time (every chain) for the cut model; "
        f"`SplitMerge` under DP(1) ({d['draws']} draws over 4 chains, {d['seconds']:.0f} s with compile) for the DP mixture.",
        "",
        "| model | draws at the true partition | mean number of clusters (truth 8) | mean NMI |",
        "|---|---:|---:|---:|",
    ]
    for p in res["populations"]:
        for name, r in p["results"].items():
            if r["pooled"]:
                lines.append(f"| cut DDT, {name}, from {p['start']} | "
                             f"{np.mean([q['at_truth'] for q in r['pooled']]):.2f} | "
                             f"{np.mean([q['num_clusters'] for q in r['pooled']]):.1f} | "
                             f"{np.mean([q['nmi'] for q in r['pooled']]):.3f} |")
    lines.append(f"| DP(1) mixture | {d['at_truth']:.2f} | {d['num_clusters']:.1f} | {d['nmi']:.3f} |")
    lines += ["", "What the numbers say is in the commit that adds them and in issue #42's note.", ""]
    write_lines(path, lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", default=str(RESULTS))
    parser.add_argument("--only-fixed-t", action="store_true", help="part 3 alone (ddt_cut_fixed_t.md)")
    args = parser.parse_args(argv)
    if args.only_fixed_t:
        res = {"machine": machine_info(), "date": utc_now(), "mode": "fixed-t",
               "fixed_t": fixed_t_stop(4 if args.quick else 25, sweeps=4 if args.quick else 150,
                                       every=2 if args.quick else 30)}
        out = Path(args.out)
        write_json(out / "ddt_cut_fixed_t.json", res)
        write_fixed_markdown(res, out / "ddt_cut_fixed_t.md")
        print(f"wrote {out / 'ddt_cut_fixed_t.md'}")
        return
    if args.quick:
        sizes, per_group, chains, seconds, repeats, dp_samples = [32, 64], 4, 4, 3.0, 1, 20
    else:
        sizes, per_group, chains, seconds, repeats, dp_samples = [100, 300, 1000, 2000], 25, 16, 45.0, 3, 400
    res = {"machine": machine_info(), "date": utc_now(), "mode": "quick" if args.quick else "full"}
    res["sweeps"] = sweep_times(sizes)
    res["populations"] = [population_vs_independent(chains, per_group, seconds, repeats,
                                                    subset_size=8 if not args.quick else 2, start=start)
                          for start in ("prior", "ward")]
    res["dp"] = dp_mixture(per_group, dp_samples)
    out = Path(args.out)
    name = "ddt_cut_quick" if args.quick else "ddt_cut"
    write_json(out / f"{name}.json", res)
    write_markdown(res, out / f"{name}.md")
    print(f"wrote {out / name}.md")


if __name__ == "__main__":
    main()
