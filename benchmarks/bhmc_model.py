"""Benchmark: BHMC on data simulated from the BHMC program itself, with a known tree.

The NumPyro program ``jaxbnp.models.nested.nested_hdp_model`` is conditioned on a fixed
balanced tree (``--branching`` children per node, ``--per-leaf`` points per leaf), on weights
``β`` that make every level identifiable to the Bayes classifier (``identifiable_weights``:
one component per leaf with ``--own`` of its weight, ``--shared`` components per internal
node that its leaves share; an unconditioned draw with one ``γ`` for every level gives sibling
leaves the same dominant component, and then the levels cannot be told apart from the data)
and on the means (a grid), and run forward: the components and the points. Depth 2 and 3.
For each, ``fit_bhmc`` runs

* ``default``: the defaults (exact path Gibbs, subtree moves, exact ``β`` updates, Ward
  start);
* ``gibbs+ward``: the same without the subtree moves (``regraft=False``: points move one at
  a time);
* ``mh+prior``: the paper's path MH and eqs. 3-4 from a draw of the prior (the sampler
  before issue #22);
* ``from-truth``: the defaults started at the true paths and components (``init=(paths,
  c)``): where the posterior leaves the true tree, no sampler can be expected to find it,

with the true hyperparameters and covariances, ``--chains`` chains of ``--warmup`` +
``--samples`` sweeps. Reported per level: NMI and ARI against the true nodes of the
posterior summary (``summary_labels_per_level``: the partition minimising the expected
variation of information over the draws) and of the best draw, the number of clusters, and
the true state's complete-data log likelihood beside the chains' best and last.

Usage::

    python benchmarks/bhmc_model.py                 # a few minutes on 2 CPU cores
    python benchmarks/bhmc_model.py --samples 100 --warmup 100
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import RESULTS, cpu_seconds, machine_info, other_cpu_seconds, utc_now, write_json, write_lines  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from numpyro import handlers  # noqa: E402

from jaxbnp import metrics  # noqa: E402
from jaxbnp.inference.bhmc import sampler as S  # noqa: E402
from jaxbnp.models import nested  # noqa: E402


def tree_paths(depth, branching, per_leaf):
    rows, next_id, ids = [], 1, {}
    for leaf in itertools.product(range(branching), repeat=depth):
        row = []
        for level in range(1, depth + 1):
            prefix = leaf[:level]
            if prefix not in ids:
                ids[prefix] = next_id
                next_id += 1
            row.append(ids[prefix])
        rows += [row] * per_leaf
    return np.asarray(rows, np.int32)


def identifiable_weights(paths, K, cap, own=0.9, shared=1, floor=1e-9):
    """Conditioned weights that make every level identifiable: every leaf owns one component
    and every internal node below the root owns ``shared``; a leaf puts ``own`` on its
    component and the rest evenly on its ancestors' (below the root), so that a point's
    component names its leaf, or, for the few points in an ancestor's components, the subtree
    it is in, and the leaves under one node share that node's components (the more shared
    components, the more the posterior prefers the true grouping: each one that siblings
    share is one dish fewer in the Chinese-restaurant franchise); an internal node weights
    its descendant leaves' weights evenly, the root all of them; everything else ``floor``.
    Returns the program's latent values (root ``sticks`` and ``beta_gamma_<level>``) and the
    leaves' weights (node -> (K,))."""
    depth = paths.shape[1]
    parent = {int(paths[i, l]): (int(paths[i, l - 1]) if l > 0 else 0)
              for i in range(len(paths)) for l in range(depth)}
    nodes = sorted(parent)
    leaves = [int(v) for v in np.unique(paths[:, -1])]
    comps, nxt = {}, 0
    for v in nodes:
        m = 1 if v in leaves else shared
        comps[v] = list(range(nxt, nxt + m))
        nxt += m
    assert nxt <= K, (nxt, K)

    def ancestors(v):  # below the root, v excluded
        out = []
        while parent[v] != 0:
            v = parent[v]
            out.append(v)
        return out

    leaf_w = {}
    for leaf in leaves:
        w = np.full(K, floor)
        anc_comps = [j for v in ancestors(leaf) for j in comps[v]]
        w[comps[leaf]] = own if anc_comps else 1.0
        for j in anc_comps:
            w[j] = (1.0 - own) / len(anc_comps)
        leaf_w[leaf] = w / w.sum() * (1.0 - floor)

    def below(v):
        return [leaf for leaf in leaves if leaf == v or v in ancestors(leaf)]

    root = np.mean([leaf_w[leaf] for leaf in leaves], axis=0)
    rest_before = 1.0 - np.concatenate([[0.0], np.cumsum(root)[:-1]])
    sticks = np.clip(root / rest_before, 1e-12, 1 - 1e-12)
    values = {"sticks": sticks}
    for level in range(1, depth + 1):
        g = np.ones((cap, K + 1))
        for node in np.unique(paths[:, level - 1]):
            w = np.mean([leaf_w[leaf] for leaf in below(int(node))], axis=0)
            g[int(node)] = np.r_[w, max(1.0 - w.sum(), floor)]
        values[f"beta_gamma_{level}"] = g
    return values, leaf_w


def oracle_labels(paths, c, leaf_w):
    """The Bayes classifier of each level with the true tree and weights: a point goes to the
    node of the level whose leaves give its component the most weight (the leaves equally
    likely a priori, as in the balanced tree); what any sampler can reach at best."""
    depth = paths.shape[1]
    leaves = np.unique(paths[:, -1])
    leaf_path = {int(paths[np.flatnonzero(paths[:, -1] == v)[0], -1]): paths[np.flatnonzero(paths[:, -1] == v)[0]]
                 for v in leaves}
    out = []
    for level in range(depth):
        nodes = np.unique(paths[:, level])
        score = np.zeros((len(c), len(nodes)))
        for j, v in enumerate(nodes):
            under = [leaf for leaf in leaves if leaf_path[int(leaf)][level] == v]
            score[:, j] = np.sum([leaf_w[int(leaf)][c] for leaf in under], axis=0)
        out.append(nodes[np.argmax(score, axis=1)])
    return np.stack(out, axis=1)


def simulate(depth, branching, per_leaf, gamma, seed, gamma0=3.0, grid=True, alpha=1.0, own=0.9, shared=1):
    """Points from ``nested_hdp_model`` conditioned on a balanced tree and on weights that
    make every level identifiable (:func:`identifiable_weights`) and, with ``grid``, on the
    components' means (a grid 3 apart, so that no two components overlap: two components
    with close means merge, and so do the leaves they name); the components and points (and
    without ``grid`` the means) are drawn by the program."""
    paths = tree_paths(depth, branching, per_leaf)
    hyper = nested.NestedHDP(depth=depth, alpha=alpha, gamma0=gamma0, gamma=gamma, Sigma=0.05 * np.eye(2),
                             Sigma0=25.0 * np.eye(2), mu0=np.zeros(2))
    cap = int(paths.max()) + 1
    K = 64
    weights, leaf_w = identifiable_weights(paths, K, cap, own=own, shared=shared)
    data = {"paths": paths, **weights}
    if grid:  # the components' means on a grid 3 apart (Σ = 0.05 I): no two components overlap
        side = int(np.ceil(np.sqrt(K + 1)))
        g = 3.0 * (np.stack(np.meshgrid(np.arange(side), np.arange(side)), -1).reshape(-1, 2)[: K + 1]
                   - (side - 1) / 2)
        data["theta"] = np.random.default_rng(seed).permutation(g)
    model = handlers.condition(nested.nested_hdp_model, {k: jnp.asarray(v) for k, v in data.items()})
    tr = handlers.trace(handlers.seed(model, jax.random.key(seed))).get_trace(
        hyper=hyper, num_points=len(paths), component_capacity=K, node_capacity=cap)
    sim = {k: np.asarray(tr[k]["value"]) for k in ("paths", "c", "theta", "log_beta", "x")}
    sim["oracle"] = oracle_labels(paths, sim["c"], leaf_w)
    return sim, hyper, cap


def true_log_lik(sim, hyper, fit_config_depth):
    X = jnp.asarray(sim["x"], jnp.result_type(float))
    cap = sim["log_beta"].shape[0]
    config = S.BHMCConfig(fit_config_depth, cap, 64)
    model = S.make_model(hyper)
    state = S.state_from_simulation({k: jnp.asarray(v) for k, v in sim.items()}, hyper, X, model, config)
    return float(state.log_lik)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--depths", type=int, nargs="+", default=[2, 3])
    ap.add_argument("--branching", type=int, default=3)
    ap.add_argument("--per-leaf", type=int, default=30)
    ap.add_argument("--gamma", type=float, default=1.0)
    ap.add_argument("--gamma0", type=float, default=3.0)
    ap.add_argument("--alpha", type=float, default=1.0)
    ap.add_argument("--own", type=float, default=0.9, help="a leaf's weight on its own component")
    ap.add_argument("--shared", type=int, default=1, help="components of each internal node")
    ap.add_argument("--samplers", nargs="+", default=["default", "gibbs+ward"])
    ap.add_argument("--chains", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--samples", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--node-capacity", type=int, default=None, help="default: fit_bhmc's (grows)")
    ap.add_argument("--component-capacity", type=int, default=128)
    ap.add_argument("--out-name", default="bhmc_model")
    args = ap.parse_args()
    cpu0, t0 = cpu_seconds(), time.perf_counter()
    rows = []
    for depth in args.depths:
        sim, hyper, _ = simulate(depth, args.branching, args.per_leaf, args.gamma, args.seed,
                                 args.gamma0, alpha=args.alpha, own=args.own, shared=args.shared)
        X, truth = sim["x"], sim["paths"]
        ll_true = true_log_lik(sim, hyper, depth)
        samplers = {"default": {}, "gibbs+ward": dict(regraft=False),
                    "mh+prior": dict(path_update="mh", init="prior", beta_rule="paper", regraft=False),
                    "from-truth": dict(init=(truth, sim["c"]))}
        for name in args.samplers:
            opts = samplers[name]
            t = time.perf_counter()
            fit = S.fit_bhmc(X, key=jax.random.key(args.seed), depth=depth, alpha=hyper.alpha,
                             gamma0=hyper.gamma0, gamma=hyper.gamma, Sigma=hyper.Sigma,
                             Sigma0=hyper.Sigma0, mu0=hyper.mu0, num_warmup=args.warmup,
                             num_samples=args.samples, num_chains=args.chains,
                             node_capacity=args.node_capacity,
                             component_capacity=args.component_capacity, **opts)
            wall = time.perf_counter() - t
            for level in range(1, depth + 1):
                summ = fit.summary_labels_per_level[level - 1]
                best = fit.labels_per_level[level - 1]
                rows.append({
                    "depth": depth, "n": len(X), "sampler": name, "level": level,
                    "true_k": len(np.unique(truth[:, level - 1])),
                    "oracle_nmi": metrics.nmi(truth[:, level - 1], sim["oracle"][:, level - 1]),
                    "summary_k": len(np.unique(summ)), "summary_nmi": metrics.nmi(truth[:, level - 1], summ),
                    "summary_ari": metrics.ari(truth[:, level - 1], summ),
                    "best_k": len(np.unique(best)), "best_nmi": metrics.nmi(truth[:, level - 1], best),
                    "log_lik_true": ll_true, "log_lik_best": float(np.max(fit.log_lik)),
                    "log_lik_last": [float(v) for v in fit.log_lik[:, -1]], "wall_s": wall,
                    "path_change_rate": float(np.mean(fit.samples["accept_rate"])),
                    "regrafted": float(np.mean(fit.samples["num_regrafted"]))})
                print(rows[-1], flush=True)
    wall = time.perf_counter() - t0
    other = other_cpu_seconds(cpu0, cpu_seconds())
    info = machine_info()
    cmd = "python " + " ".join(["benchmarks/bhmc_model.py"] + sys.argv[1:])
    lines = ["# BHMC on data simulated from the BHMC program (known tree)", "",
             f"Command: `{cmd}`. {info['cpu_model']}, {info['cpu_count']} CPUs, {info['jax_backend']}, "
             f"{info['dtype']}. Run {utc_now()}. Balanced tree, {args.branching} children per node, "
             f"{args.per_leaf} points per leaf, a leaf's own component {args.own}, {args.shared} component(s) per internal node, γ = {args.gamma}, γ0 = {args.gamma0}, α = {args.alpha}, Σ = 0.05 I, Σ0 = 25 I "
             f"(the fits use the true values). {args.chains} chains x ({args.warmup} warm-up + "
             f"{args.samples}) sweeps, node capacity {args.node_capacity or 'fit_bhmc default (grows from 64)'}, component capacity "
             f"{args.component_capacity}. Summary: the partition of each level's nodes minimising the "
             f"expected VI over all draws. CPU seconds used by other processes: "
             f"{other if other is None else round(other)}; wall {wall:.0f} s.", "",
             "| depth | n | sampler | level | true k | Bayes classifier NMI | summary k | summary NMI | summary ARI | best-draw k | best-draw NMI | log lik: true / best / last | path changes per sweep | subtrees moved per sweep | wall s |",
             "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|"]
    for r in rows:
        last = ", ".join(f"{v:.0f}" for v in r["log_lik_last"])
        lines.append(f"| {r['depth']} | {r['n']} | {r['sampler']} | {r['level']} | {r['true_k']} "
                     f"| {r['oracle_nmi']:.3f} | {r['summary_k']} "
                     f"| {r['summary_nmi']:.3f} | {r['summary_ari']:.3f} | {r['best_k']} | {r['best_nmi']:.3f} "
                     f"| {r['log_lik_true']:.0f} / {r['log_lik_best']:.0f} / {last} | {r['path_change_rate']:.3f} "
                     f"| {r['regrafted']:.2f} | {r['wall_s']:.0f} |")
    write_lines(RESULTS / f"{args.out_name}.md", lines)
    write_json(RESULTS / f"{args.out_name}.json", {"command": cmd, "machine": info, "rows": rows,
                                                   "other_cpu_s": other, "wall_s": wall})
    print("\n".join(lines))


if __name__ == "__main__":
    main()
