"""Benchmark: Dirichlet diffusion trees, vectorised chains and population MCMC (issue #5, docs/mathematics.md §5).

0. Sweep time against n (issue #23): one chain's ``step`` (``n`` subtree moves,
   ``n − 1`` time moves, slice updates of ``c`` and ``σ``) with the moves' data
   term kept up to date along the two root paths a move changes (the library's
   sampler, O(depth D) per move) against the same sweep with the data term
   recomputed by a full upward pass per move (the sampler before, O(n D) per
   move; swapped in here). The full-pass sweep is timed where it takes under a
   minute and otherwise extrapolated from the time of its moves (a timed batch of
   subtree moves, times 2n − 1), marked as such. Beside it the tree's depth.
1. Throughput of the within-chain sampler (``jaxbnp.inference.trees.mcmc.step``:
   ``n`` subtree moves, ``n − 1`` time moves, slice updates of ``c`` and ``σ``)
   for 1, 2, 4, …, 256 chains (64 at most for n > 32), the chains' sweeps vmapped
   (one batched program) and mapped (``lax.map``), as ``population.run_chains``
   runs them: chain-steps per second and the ratio to one chain, at the n of
   ``--throughput-points``. Compile excluded (reported separately); median over
   timed repeats.
2. Population MCMC (``jaxbnp.inference.trees.population.step``: the same sweeps
   plus the exchange move on ``K/2`` random pairs) against the same number of
   independent chains (the sweeps alone, run the same way: ``population.run_chains``)
   at **equal wall time**, on synthetic data with four well separated groups
   arranged as two pairs (A, B close; C, D close; the pairs far apart), so the
   right top-level split is {A ∪ B | C ∪ D}; or (``--pop-groups 8``) eight groups
   as pairs of pairs of pairs. Default: 50 points per group, 24 chains, 40 s per
   run, 5 repeats; three exchange settings (subset size 8; 32; 8 with the
   approximate tempering τ = 4). Each method runs for the same number of seconds
   per repeat (compile excluded), from the same prior draws. Reported per method:
   the best log posterior reached (structure + data terms + the priors of
   ``c`` and ``σ``), how often the best tree's top-level split is the right
   one, and the fraction of chains whose final tree has the right split.

Everything runs in JAX's default dtype (float32), on the default device
(the CPU here; the script is the same on a GPU).

Results go to ``benchmarks/results/ddt.json`` and ``benchmarks/results/ddt.md``
(``--only-sweeps``: ``ddt_sweeps.*``; ``--only-throughput``: ``ddt_throughput.*``; ``--only-population``: ``ddt_population.*``, or
``ddt_population_8groups.*`` with ``--pop-groups 8``).

Usage::

    python benchmarks/ddt.py                    # everything (about 30 minutes on 2 idle CPU cores)
    python benchmarks/ddt.py --quick            # fewer sizes and chain counts, shorter runs
    python benchmarks/ddt.py --only-population  # part 2 alone (about 15 minutes)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from functools import partial
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import RESULTS, machine_info, utc_now, write_json, write_lines  # noqa: E402  (the benchmarks' harness)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpyro.distributions as dist  # noqa: E402

from jaxbnp.inference.trees import mcmc as ddt_mcmc, population  # noqa: E402
from jaxbnp.models import ddt  # noqa: E402

C_PRIOR = dist.LogNormal(0.0, 1.0)
NOISE_FRACTION = 0.1


# ----------------------------------------------------------------------------------- data
def grouped_data(seed: int, per_group: int, groups: int = 4) -> tuple[np.ndarray, np.ndarray]:
    """Four groups in 2-D: A, B around (−6, ∓1.5), C, D around (+6, ∓1.5), sd 0.3.

    ``groups=8``: a three-level hierarchy, the four groups above at y = −6 and a copy at
    y = +6 shifted by 24 in x; the right top split then puts groups 0-3 against 4-7.
    """
    rng = np.random.default_rng(seed)
    centers = np.array([[-6.0, -1.5], [-6.0, 1.5], [6.0, -1.5], [6.0, 1.5]])
    if groups == 8:
        centers = np.concatenate([centers + [-12.0, -6.0], centers + [12.0, 6.0]])
    elif groups != 4:
        raise ValueError("groups must be 4 or 8")
    X = np.concatenate([c + 0.3 * rng.normal(size=(per_group, 2)) for c in centers])
    return X, np.repeat(np.arange(groups), per_group)


def hyperpriors(X: np.ndarray) -> ddt_mcmc.Hyperpriors:
    return ddt_mcmc.Hyperpriors(c=C_PRIOR, sigma=dist.LogNormal(float(np.log(X.std())), 1.0))


def prior_states(key, X, num_chains, hyper, noise):
    """``num_chains`` starting states: ``c``, ``σ`` and the tree drawn from the prior."""
    n = X.shape[0]
    Xj = jnp.asarray(X, jnp.result_type(float))

    @jax.jit
    def draw(key):
        def one(k):
            k_c, k_s, k_t = jax.random.split(k, 3)
            c, sigma = hyper.c.sample(k_c), hyper.sigma.sample(k_s)
            state = ddt_mcmc.init(ddt.sample_tree(k_t, c, n), Xj, c, sigma, noise)
            # float32 can round a prior draw's late divergence times into ties: start those
            # chains from the caterpillar (as the NumPyro kernels do)
            comb = ddt_mcmc.init(ddt.comb_tree(n), Xj, c, sigma, noise)
            bad = ~jnp.isfinite(state.log_prior + state.log_likelihood)
            return jax.tree.map(lambda a, b: jnp.where(bad, a, b), comb, state)

        return jax.lax.map(one, jax.random.split(key, num_chains))

    return draw(key)


def log_posterior(states, hyper):
    """The kernel's ``log_joint``: a density in the divergence times ``t``."""
    return (states.log_prior + states.log_likelihood + hyper.c.log_prob(states.c)
            + hyper.sigma.log_prob(states.sigma))


def log_posterior_log_time(states, hyper):
    """The same density in ``x = −log(1 − t)`` (adds ``Σ_v log(1 − t_v)``).

    In ``t`` the structure term is unbounded as times approach 1 whenever
    ``c H_{m−1} < 1`` (``a(t) = c/(1 − t)``), so the highest density seen
    rewards states pushed towards ``t = 1``; in ``x`` each node contributes
    ``log c − c (x_v − x_p) H_{m_v−1}`` and the density is bounded.
    """
    n = (states.tree.parent.shape[-1] + 1) // 2
    return log_posterior(states, hyper) + jnp.sum(jnp.log1p(-states.tree.time[..., n:]), axis=-1)


def independent_sweeps(Xj, hyper, how="auto"):
    """``(keys, states) -> states``: one within-chain sweep on every chain, the chains run as
    ``population.run_chains`` runs them (``how``)."""
    return lambda keys, states: population.run_chains(
        lambda k, s, x: ddt_mcmc.step(k, s, x, hyper)[0], keys, states, Xj, in_axes=(0, 0, None), how=how)


def top_split_is_right(tree, truth) -> bool:
    """Whether the root's two clades are {A ∪ B} and {C ∪ D} (``truth`` in 0..3)."""
    parent, children = np.asarray(tree.parent), np.asarray(tree.children)
    n = truth.shape[0]
    root = int(np.argmax(parent < 0))
    pair = truth // ((int(truth.max()) + 1) // 2)

    def leaves(v):
        if v < n:
            return [v]
        a, b = children[v - n]
        return leaves(a) + leaves(b)

    sides = [set(pair[leaves(int(ch))]) for ch in children[root - n]]
    return all(len(s) == 1 for s in sides) and sides[0] != sides[1]


# ------------------------------------------------------------------------------ part 0
def _full_pass_metropolis(X):
    """The moves' acceptance step as it was before issue #23: the proposal's data term and
    subtree sizes from a full upward pass (O(n D), n sequential steps)."""
    def metropolis(state, msg, proposal, sizes, root, starts, log_q_ratio, valid, log_u):
        new_msg, sizes = ddt.tree_messages(proposal, X, state.sigma, state.noise)
        ll = ddt.messages_log_likelihood(proposal, new_msg, ddt.root_of(proposal), state.sigma)
        lp = ddt.structure_log_prior(proposal, state.c, sizes)
        log_r = (lp + ll) - (state.log_prior + state.log_likelihood) + log_q_ratio
        ok = valid & (log_u < log_r)
        new = state._replace(tree=proposal, log_prior=lp, log_likelihood=ll, sizes=sizes)
        return ddt_mcmc.select_state(ok, (new, new_msg), (state, msg)), ok

    return metropolis


def _tree_depth(tree) -> tuple[int, float]:
    """The deepest leaf's number of ancestors and the leaves' mean."""
    parent = np.asarray(tree.parent)
    n = (parent.shape[0] + 1) // 2
    depth = np.zeros(parent.shape[0], int)
    order = np.argsort(np.asarray(tree.time))  # parents (earlier times) first
    for v in order:
        if parent[v] >= 0:
            depth[v] = depth[parent[v]] + 1
    return int(depth[:n].max()), float(depth[:n].mean())


def _subtree_moves(X, count, key, state):
    """``count`` subtree moves alone, through the sampler's own acceptance step."""

    def body(i, carry):
        k_u, k_a, k_w = jax.random.split(jax.random.fold_in(key, i), 3)
        tree, log_q, valid, sizes, root, starts = ddt_mcmc._subtree_proposal(
            jax.random.uniform(k_u, (), X.dtype), k_w, carry[0])
        log_u = jnp.log(jax.random.uniform(k_a, (), X.dtype))
        return ddt_mcmc._metropolis(carry[0], carry[1], tree, sizes, root, starts, log_q, valid, log_u)[0]

    msg, _ = ddt.tree_messages(state.tree, X, state.sigma, state.noise)
    return jax.lax.fori_loop(0, count, body, (state, msg))[0]


def sweep_time(sizes, full_limit_s=60.0, warm_sweeps=3, seed=0):
    """One chain, float32, D = 2, the four-group data; the tree after ``warm_sweeps``
    sweeps from the prior (so the depth is a fitted tree's)."""
    rows = []
    for n in sizes:
        X, _ = grouped_data(seed, n // 4)
        hyper = hyperpriors(X)
        noise = NOISE_FRACTION * float(X.std())
        Xj = jnp.asarray(X, jnp.result_type(float))
        state = jax.tree.map(lambda a: a[0], prior_states(jax.random.key(seed), X, 1, hyper, noise))
        row = {"n": int(X.shape[0])}
        original = ddt_mcmc._metropolis
        for name in ("incremental", "full_pass"):
            if name == "full_pass":
                ddt_mcmc._metropolis = _full_pass_metropolis(Xj)
            try:
                run = jax.jit(lambda k, s: ddt_mcmc.step(k, s, Xj, hyper)[0])
                moves = jax.jit(partial(_subtree_moves, Xj, 64))
                t0 = time.perf_counter()
                jax.block_until_ready(moves(jax.random.key(2), state))
                row[f"{name}_moves_compile_s"] = time.perf_counter() - t0
                t0 = time.perf_counter()
                jax.block_until_ready(moves(jax.random.key(3), state))
                per_move = (time.perf_counter() - t0) / 64
                row[f"{name}_ms_per_subtree_move"] = 1e3 * per_move
                estimate = (2 * X.shape[0] - 1) * per_move
                if name == "full_pass" and estimate > full_limit_s:
                    row[f"{name}_sweep_s"] = estimate
                    row[f"{name}_sweep_extrapolated"] = True
                    continue
                t0 = time.perf_counter()
                s = jax.block_until_ready(run(jax.random.key(1), state))
                row[f"{name}_compile_and_first_sweep_s"] = time.perf_counter() - t0
                if name == "incremental":
                    for i in range(warm_sweeps):
                        s = run(jax.random.key(10 + i), s)
                    state = jax.block_until_ready(s)
                    row["max_depth"], row["mean_depth"] = _tree_depth(state.tree)
                t0 = time.perf_counter()
                jax.block_until_ready(run(jax.random.key(99), state))
                row[f"{name}_sweep_s"] = time.perf_counter() - t0
                row[f"{name}_sweep_extrapolated"] = False
            finally:
                ddt_mcmc._metropolis = original
        row["speedup"] = row["full_pass_sweep_s"] / row["incremental_sweep_s"]
        rows.append(row)
        print(f"  n {row['n']:6d}: incremental {row['incremental_sweep_s']:8.3f} s/sweep "
              f"({row['incremental_ms_per_subtree_move']:.3f} ms/move), full pass "
              f"{row['full_pass_sweep_s']:8.2f} s/sweep{' (extrapolated)' if row['full_pass_sweep_extrapolated'] else ''} "
              f"({row['full_pass_ms_per_subtree_move']:.3f} ms/move), {row['speedup']:.0f}x; depth max "
              f"{row['max_depth']}, mean {row['mean_depth']:.1f}", flush=True)
    return {"dim": 2, "dtype": str(jnp.result_type(float)), "rows": rows}


# ------------------------------------------------------------------------------ part 1
def throughput(chain_counts, n_points, repeats, seed=0):
    """Chain-steps per second with the chains' sweeps vmapped (one batched program) and
    mapped (``lax.map``: one after another in one program), as ``population.run_chains``."""
    X, _ = grouped_data(seed, n_points // 4)
    hyper = hyperpriors(X)
    noise = NOISE_FRACTION * float(X.std())
    Xj = jnp.asarray(X, jnp.result_type(float))
    rows = []
    for num in chain_counts:
        row = {"chains": num, "repeats": repeats}
        for how in ("vmap", "map"):
            states = prior_states(jax.random.key(seed), X, num, hyper, noise)
            run = jax.jit(independent_sweeps(Xj, hyper, how))
            keys = jax.random.split(jax.random.key(1), num)
            t0 = time.perf_counter()
            states = jax.block_until_ready(run(keys, states))
            compile_s = time.perf_counter() - t0
            steps = max(2, int(64 / num) + 1)  # enough work per timing at small batch sizes
            times = []
            for r in range(repeats):
                t0 = time.perf_counter()
                for i in range(steps):
                    states = run(jax.random.split(jax.random.key(100 * r + i), num), states)
                jax.block_until_ready(states)
                times.append((time.perf_counter() - t0) / steps)
            sec = statistics.median(times)
            row[how] = {"seconds_per_step": sec, "chain_steps_per_second": num / sec,
                        "compile_and_first_step_s": compile_s, "steps_per_repeat": steps}
            print(f"  n = {n_points}, {num:4d} chains, {how:4s}: {num / sec:9.1f} chain-steps/s "
                  f"({1e3 * sec:.2f} ms/step)", flush=True)
        rows.append(row)
    for how in ("vmap", "map"):
        base = rows[0][how]["chain_steps_per_second"]
        for row in rows:
            row[how]["ratio_to_one_chain"] = row[how]["chain_steps_per_second"] / base
    return {"num_points": n_points, "dim": 2, "rows": rows}


# ------------------------------------------------------------------------------ part 2
def population_vs_independent(num_chains, per_group, configs, seconds, repeats, chunk=5, groups=4):
    """``configs``: ``{name: (subset_size, temperature)}`` for the population runs."""
    X, truth = grouped_data(123, per_group, groups)
    hyper = hyperpriors(X)
    noise = NOISE_FRACTION * float(X.std())
    Xj = jnp.asarray(X, jnp.result_type(float))

    metrics = {"t": log_posterior, "x": log_posterior_log_time}

    def tracker(step_fn):
        @jax.jit
        def run(key, states, bests):
            def body(i, carry):
                states, bests = carry
                states = step_fn(jax.random.fold_in(key, i), states)
                new = {}
                for name, f in metrics.items():
                    best_lp, best = bests[name]
                    lp = f(states, hyper)
                    j = jnp.argmax(lp)
                    better = lp[j] > best_lp
                    state_j = jax.tree.map(lambda a: a[j], states)
                    best = jax.tree.map(lambda a, b: jnp.where(better, a, b), state_j, best)
                    new[name] = (jnp.maximum(best_lp, lp[j]), best)
                return states, new

            return jax.lax.fori_loop(0, chunk, body, (states, bests))

        return run

    @jax.jit
    def recompute(state):  # the best state's log posterior from scratch (checks the cached terms)
        lp, ll = ddt.log_joint_terms(state.tree, Xj, state.c, state.sigma, state.noise)
        return lp + ll + hyper.c.log_prob(state.c) + hyper.sigma.log_prob(state.sigma)

    def pop(subset_size, temperature):
        return tracker(lambda k, s: population.step(
            k, s, Xj, subset_size=subset_size, temperature=temperature, hyperpriors=hyper)[0])

    # the independent chains run their sweeps as the population does (population.run_chains:
    # lax.map on CPU, vmap on an accelerator), so the comparison isolates the exchange move
    sweeps = independent_sweeps(Xj, hyper)
    ind_step = tracker(lambda k, s: sweeps(jax.random.split(k, num_chains), s))
    methods = {"independent": ind_step, **{name: pop(*cfg) for name, cfg in configs.items()}}
    out = {name: {"best_log_posterior": [], "best_log_posterior_recomputed": [], "best_tree_right_split": [],
                  "best_root_split_sizes": [], "best_c": [], "best_sigma": [],
                  "best_log_posterior_log_time": [], "best_log_time_tree_right_split": [],
                  "final_chains_right_split": [], "iterations": [], "compile_and_first_chunk_s": None}
           for name in methods}
    for r in range(repeats):
        start = prior_states(jax.random.key(1000 + r), X, num_chains, hyper, noise)
        for name, run in methods.items():
            states = start
            bests = {}
            for metric, f in metrics.items():
                v = f(start, hyper)
                bests[metric] = (jnp.max(v), jax.tree.map(lambda a: a[jnp.argmax(v)], start))
            key = jax.random.key(2000 + r)
            if out[name]["compile_and_first_chunk_s"] is None:
                t0 = time.perf_counter()
                jax.block_until_ready(run(key, states, bests))
                out[name]["compile_and_first_chunk_s"] = time.perf_counter() - t0
            iterations, t0 = 0, time.perf_counter()
            while time.perf_counter() - t0 < seconds:
                states, bests = jax.block_until_ready(run(jax.random.fold_in(key, iterations), states, bests))
                iterations += chunk
            best_lp, best = bests["t"]
            out[name]["best_log_posterior_log_time"].append(float(bests["x"][0]))
            out[name]["best_log_time_tree_right_split"].append(bool(top_split_is_right(bests["x"][1].tree, truth)))
            final = [top_split_is_right(jax.tree.map(lambda a: a[i], states.tree), truth) for i in range(num_chains)]
            sizes = np.asarray(ddt.subtree_sizes(best.tree))
            root = int(np.argmax(np.asarray(best.tree.parent) < 0))
            out[name]["best_log_posterior"].append(float(best_lp))
            out[name]["best_log_posterior_recomputed"].append(float(recompute(best)))
            out[name]["best_root_split_sizes"].append(sorted(int(v) for v in sizes[np.asarray(best.tree.children)[root - X.shape[0]]]))
            out[name]["best_c"].append(float(best.c))
            out[name]["best_sigma"].append(float(best.sigma))
            out[name]["best_tree_right_split"].append(bool(top_split_is_right(best.tree, truth)))
            out[name]["final_chains_right_split"].append(float(np.mean(final)))
            out[name]["iterations"].append(iterations)
            print(f"  repeat {r}: {name:18s} {iterations:5d} iterations, best log posterior "
                  f"{float(best_lp):9.2f} (recomputed {out[name]['best_log_posterior_recomputed'][-1]:.2f}; "
                  f"c {float(best.c):.3f}, sigma {float(best.sigma):.2f}, root split "
                  f"{out[name]['best_root_split_sizes'][-1]}), best tree right split: "
                  f"{out[name]['best_tree_right_split'][-1]}; in log-time coordinates "
                  f"{float(bests['x'][0]):.2f}, right split {out[name]['best_log_time_tree_right_split'][-1]}; "
                  f"chains with the right split at the end: {np.mean(final):.2f}", flush=True)
    return {"num_points": X.shape[0], "num_chains": num_chains, "groups": groups,
            "configs": {name: {"subset_size": k, "temperature": t} for name, (k, t) in configs.items()},
            "seconds_per_run": seconds, "repeats": repeats, "results": out}


# ----------------------------------------------------------------------------------- report
def write_throughput_markdown(res: dict, lines: list) -> None:
    for part in res["throughput"]:
        lines += [
            "",
            f"## 1. Within-chain sampler over many chains, n = {part['num_points']} points, D = 2",
            "",
            "One step = n subtree moves + (n − 1) time moves + slice updates of c and σ on every "
            "chain. vmap: the chains' sweeps as one batched program (`jit(vmap(step))`); map: one "
            "after another in one program (`lax.map`); `population.run_chains` picks map on CPU. "
            "Compile excluded (reported separately); median over repeats.",
            "",
            "| chains | vmap: ms per step | chain-steps / s | ratio to 1 chain | map: ms per step | chain-steps / s | ratio to 1 chain | compile + first step, vmap / map (s) |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for row in part["rows"]:
            v, m = row["vmap"], row["map"]
            lines.append(f"| {row['chains']} | {1e3 * v['seconds_per_step']:.2f} | {v['chain_steps_per_second']:.1f} | "
                         f"{v['ratio_to_one_chain']:.1f}× | {1e3 * m['seconds_per_step']:.2f} | "
                         f"{m['chain_steps_per_second']:.1f} | {m['ratio_to_one_chain']:.1f}× | "
                         f"{v['compile_and_first_step_s']:.1f} / {m['compile_and_first_step_s']:.1f} |")


def write_population_markdown(res: dict, lines: list) -> None:
    p = res["population"]
    cfg = p["configs"]
    lines += [
        "",
        f"## 2. Population MCMC vs independent chains at equal wall time ({p['num_points']} points in {p.get('groups', 4)} groups, "
        f"{p['num_chains']} chains, {p['seconds_per_run']:g} s per run, {p['repeats']} repeats)",
        "",
        "Every method starts from the same prior draws in each repeat and runs for the same number of "
        "seconds (compile excluded). Independent: the within-chain sweeps alone. Population: the same "
        "sweeps, then the exchange move on K/2 random pairs of chains, with the subset size k and "
        "temperature τ given (τ = 1 is exact; τ > 1 tempers the proposal ratio and is approximate). "
        "Best log posterior: highest log p(tree | c) + log p(X | tree, σ) + log p(c) + log p(σ) seen in any chain.",
        "",
        "| method | iterations per run (mean) | best log posterior in t: mean (min–max) | its tree has the right top split | best log posterior in x = −log(1−t): mean (min–max) | its tree has the right top split | chains with the right top split at the end (mean; per repeat) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in p["results"].items():
        blp, blx = r["best_log_posterior"], r["best_log_posterior_log_time"]
        label = name if name not in cfg else f"{name} (k = {cfg[name]['subset_size']}, τ = {cfg[name]['temperature']:g})"
        lines.append(
            f"| {label} | {np.mean(r['iterations']):.0f} | {np.mean(blp):.2f} ({min(blp):.2f}–{max(blp):.2f}) | "
            f"{sum(r['best_tree_right_split'])}/{len(r['best_tree_right_split'])} | "
            f"{np.mean(blx):.2f} ({min(blx):.2f}–{max(blx):.2f}) | "
            f"{sum(r['best_log_time_tree_right_split'])}/{len(r['best_log_time_tree_right_split'])} | "
            f"{np.mean(r['final_chains_right_split']):.2f}; "
            + ", ".join(f"{v:.2f}" for v in r["final_chains_right_split"]) + " |")
    res_i = p["results"]["independent"]
    lines.append("")
    for name, r in p["results"].items():
        if name == "independent":
            continue
        lines.append(f"- {name} − independent, best log posterior per repeat: in t " + ", ".join(
            f"{a - b:+.2f}" for a, b in zip(r["best_log_posterior"], res_i["best_log_posterior"]))
            + "; in x " + ", ".join(f"{a - b:+.2f}" for a, b in zip(
                r["best_log_posterior_log_time"], res_i["best_log_posterior_log_time"])))
    lines.append("")
    for name, r in p["results"].items():
        lines.append(f"- {name}: best state's root split sizes {r['best_root_split_sizes']}, c "
                     f"{[round(v, 3) for v in r['best_c']]}, σ {[round(v, 2) for v in r['best_sigma']]}; "
                     f"largest |tracked − recomputed| log posterior "
                     f"{max(abs(a - b) for a, b in zip(r['best_log_posterior'], r['best_log_posterior_recomputed'])):.2e}")
    g = p["num_points"] // p.get("groups", 4)
    split = (f"A∪B and C∪D ({g} + {g} | {g} + {g} points)" if p.get("groups", 4) == 4 else
             f"groups 0-3 and groups 4-7 ({4 * g} | {4 * g} points)")
    lines += ["", f"The right top split means the root's two clades are {split}. \"Best log posterior\" is a highest density seen, and densities depend on "
              "coordinates: in the divergence times t (the kernel's `log_joint`) the structure term "
              "is unbounded as times approach 1 when c H_{m−1} < 1, so the highest-t-density "
              "state can be an odd one (e.g. a huge σ with every divergence late and a lopsided root "
              "split); in x = −log(1 − t) the density is bounded and its maximiser is the more "
              "meaningful \"best tree\". The fraction of chains with the right split at the end is "
              "the most stable of the three measures.", ""]


def write_markdown(res: dict, path: Path) -> None:
    m = res["machine"]
    lines = [
        "# Dirichlet diffusion trees: vectorised chains and population MCMC",
        "",
        f"Machine: {m['cpu_model']} ({m['cpu_count']} CPUs), {m['platform']}; JAX {m['jax']} on "
        f"{m['jax_backend']}, dtype {m['dtype']}; load average at start {m['load_average']}. "
        f"Mode: {res['mode']}. Run {res['date']}. No GPU was lent to this task, so there are no GPU rows.",
    ]
    if "sweeps" not in res:
        if "throughput" in res:
            write_throughput_markdown(res, lines)
        if "population" in res:
            write_population_markdown(res, lines)
        write_lines(path, lines)
        return
    lines += [
        "",
        "## 0. Sweep time against n: moves that update the data term along two root paths vs a full pass",
        "",
        "One chain, one sweep = n subtree moves + (n − 1) time moves + slice updates of c and σ "
        f"(dtype {res['sweeps']['dtype']}, D = 2, four groups; tree after three sweeps from a prior draw). "
        "Full pass: the same sampler with each move's data term recomputed by an upward pass over "
        "the whole tree (how every move was scored before issue #23, here with the current upward pass, which no longer copies its arrays at each node and is about 50× faster than the old one). Compile excluded.",
        "",
        "| n | sweep, incremental (s) | sweep, full pass (s) | ratio | ms per subtree move, incremental | ms per subtree move, full pass | tree depth (max / mean) |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in res["sweeps"]["rows"]:
        mark = " (extrapolated)" if row["full_pass_sweep_extrapolated"] else ""
        lines.append(f"| {row['n']} | {row['incremental_sweep_s']:.3f} | {row['full_pass_sweep_s']:.3f}{mark} | "
                     f"{row['speedup']:.0f}× | {row['incremental_ms_per_subtree_move']:.3f} | "
                     f"{row['full_pass_ms_per_subtree_move']:.3f} | {row['max_depth']} / {row['mean_depth']:.1f} |")
    lines += [
        "",
        "Extrapolated: 2n − 1 moves at the timed cost of a full-pass subtree move (a time move costs "
        "the same pass).",
    ]
    if "throughput" in res:
        write_throughput_markdown(res, lines)
    if "population" in res:
        write_population_markdown(res, lines)
    write_lines(path, lines)
    write_throughput_markdown(res, lines)
    write_population_markdown(res, lines)
    write_lines(path, lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer chain counts and shorter runs")
    parser.add_argument("--out", default=str(RESULTS), help="folder for ddt.json and ddt.md")
    parser.add_argument("--sweep-sizes", type=int, nargs="*", default=None,
                        help="n for part 0 (default 32 128 512 1300 4096 10000; --quick 32 128 512)")
    parser.add_argument("--only-sweeps", action="store_true",
                        help="run part 0 alone (writes ddt_sweeps.json and ddt_sweeps.md)")
    parser.add_argument("--only-throughput", action="store_true",
                        help="run part 1 alone (writes ddt_throughput.json and ddt_throughput.md)")
    parser.add_argument("--throughput-points", type=int, nargs="+", default=[32],
                        help="part 1: n (default 32); the chain counts stop at 64 for n > 32")
    parser.add_argument("--only-population", action="store_true",
                        help="run part 2 alone (writes ddt_population.json and ddt_population.md)")
    parser.add_argument("--pop-points-per-group", type=int, default=None,
                        help="part 2: points in each group (default 50; --quick 8)")
    parser.add_argument("--pop-groups", type=int, choices=(4, 8), default=4,
                        help="part 2: 4 groups (two pairs) or 8 (pairs of pairs of pairs)")
    parser.add_argument("--pop-chains", type=int, default=None, help="part 2: chains (default 24; --quick 8)")
    parser.add_argument("--pop-seconds", type=float, default=None,
                        help="part 2: seconds per run (default 40; --quick 4)")
    parser.add_argument("--pop-repeats", type=int, default=None, help="part 2: repeats (default 5; --quick 2)")
    args = parser.parse_args(argv)
    if args.quick:
        counts, repeats, seconds, runs, per_group, chains = [1, 4, 16, 64], 2, 4.0, 2, 8, 8
    else:
        counts, repeats, seconds, runs, per_group, chains = [1, 2, 4, 8, 16, 32, 64, 128, 256], 3, 40.0, 5, 50, 24
    seconds = args.pop_seconds or seconds
    runs = args.pop_repeats or runs
    per_group = args.pop_points_per_group or per_group
    chains = args.pop_chains or chains
    n_pop = args.pop_groups * per_group
    configs = {"population": (min(8, n_pop - 1), 1.0), "population, large k": (min(32, n_pop - 1), 1.0),
               "population, tempered": (min(8, n_pop - 1), 4.0)}
    res = {"mode": "quick" if args.quick else "default", "machine": machine_info(),
           "date": utc_now()}
    sizes = args.sweep_sizes or ([32, 128, 512] if args.quick else [32, 128, 512, 1300, 4096, 10000])
    only = args.only_sweeps or args.only_throughput or args.only_population
    if args.only_sweeps or not only:
        print("0. sweep time against n", flush=True)
        res["sweeps"] = sweep_time(sizes)
    if args.only_throughput or not only:
        print("1. throughput of many chains", flush=True)
        res["throughput"] = [throughput(counts if n <= 32 else [c for c in counts if c <= 64], n_points=n,
                                        repeats=repeats) for n in args.throughput_points]
    if args.only_population or not only:
        print("2. population vs independent chains at equal wall time", flush=True)
        res["population"] = population_vs_independent(num_chains=chains, per_group=per_group, configs=configs,
                                                       seconds=seconds, repeats=runs, groups=args.pop_groups)
    out = Path(args.out)
    stem = ("ddt_sweeps" if args.only_sweeps else "ddt_throughput" if args.only_throughput else
            "ddt" if not args.only_population else
            "ddt_population" if args.pop_groups == 4 else f"ddt_population_{args.pop_groups}groups")
    write_json(out / f"{stem}.json", res, indent=2)
    write_markdown(res, out / f"{stem}.md")
    print(f"wrote {out / (stem + '.json')} and {out / (stem + '.md')}")


if __name__ == "__main__":
    main()
