"""The ``jaxbnp`` command line.

``jaxbnp cluster`` clusters the embedded default data set (``toy_ring``:
1,300 points in 2-D, 13 clusters) or a ``.csv``/``.npy`` file, prints a
summary and writes labels, a JSON summary and plots to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

__all__ = ["main"]

METHODS = ("gibbs", "splitmerge", "tgmcmc", "mapdp", "ddt", "bhmc")


def _load(path: str | None, labels_path: str | None):
    """``(X, y, source)``: a finite 2-D float array and integer labels (or ``None``); a file
    that cannot be read or checked ends the program with a message (``SystemExit``)."""
    import warnings

    from ._validation import check_data
    from .datasets import load_default

    if path is None:
        X, y = load_default()
        return X, y, "toy_ring (embedded default, 1300 x 2, 13 clusters)"
    p = Path(path)
    if not p.is_file():
        raise SystemExit(f"jaxbnp: data file {p} does not exist.")
    if p.suffix not in (".npy", ".csv", ".txt", ".tsv"):
        raise SystemExit(f"jaxbnp: cannot read {p.suffix!r} files; pass a .csv, .txt or .npy file.")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # numpy's "Empty input file" and the like
            if p.suffix == ".npy":
                X = np.load(p, allow_pickle=False)
            else:
                delimiter = "," if p.suffix == ".csv" else None
                X = np.loadtxt(p, delimiter=delimiter, ndmin=2)
        X = check_data(X, name=f"the data in {p}")
    except (ValueError, TypeError, OSError, EOFError, UserWarning) as exc:
        raise SystemExit(f"jaxbnp: cannot use {p}: {exc}") from None
    big = float(np.max(np.abs(X)))
    if big * big * X.shape[0] > float(np.finfo(np.float32).max) / 16:
        raise SystemExit(
            f"jaxbnp: {p} has values up to {big:.3g}; the command line computes in float32, "
            "where their squared sums overflow. Rescale the data (e.g. standardise the columns)."
        )
    y = None
    if labels_path is not None:
        lp = Path(labels_path)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                y = np.loadtxt(lp, ndmin=1)
        except (ValueError, OSError, UserWarning) as exc:
            raise SystemExit(f"jaxbnp: cannot read the labels in {lp}: {exc}") from None
        y = y.ravel()
        if len(y) != len(X):
            raise SystemExit(f"jaxbnp: {labels_path} has {len(y)} labels for {len(X)} points.")
        if not (np.all(np.isfinite(y)) and np.all(np.round(y) == y)):
            raise SystemExit(f"jaxbnp: {labels_path} must hold integer labels, one per line.")
        y = y.astype(int)
    return X, y, str(p)


def _make_family(name: str, X: np.ndarray):
    from . import models

    if name == "normal-wishart":
        return models.NormalWishart.from_data(X)
    if name == "normal-gamma":
        return models.NormalGamma.from_data(X)
    if name == "beta-bernoulli":
        return models.BetaBernoulli.from_data(X)
    if name == "dirichlet-multinomial":
        return models.DirichletMultinomial.from_data(X)
    raise SystemExit(f"jaxbnp: unknown family {name!r}.")


def _run_gibbs(X, family, alpha, args):
    import jax
    import numpyro
    from numpyro.infer import MCMC

    from . import checkpoint as checkpointing
    from . import models
    from ._progress import resolve as resolve_progress
    from .inference import CollapsedGibbs, SplitMerge, TreeGuidedMCMC

    def model(X):
        z = numpyro.sample("z", models.Partition(models.DP(alpha), X.shape[0]))
        numpyro.sample("X", models.ConjugateMixture(family, z), obs=X)

    capacity = args.capacity
    checkpoint = Path(args.out) / "checkpoint.pkl"
    settings_file = Path(args.out) / "checkpoint_settings.json"
    if args.resume:
        if not checkpoint.exists():
            raise SystemExit(f"jaxbnp: --resume: no checkpoint at {checkpoint}; run with "
                             "--checkpoint-every N first.")
        saved = json.loads(settings_file.read_text())
        for name in ("method", "family", "alpha", "chains", "seed"):
            if saved[name] != getattr(args, name):
                raise SystemExit(f"jaxbnp: --resume: the checkpoint was made with --{name} "
                                 f"{saved[name]}, not {getattr(args, name)}; pass the same options.")
        capacity = saved["capacity"]  # the saved state has this many cluster slots
    while True:
        if args.method == "splitmerge":  # the tgMCMC paper's SM baseline: moves + a Gibbs sweep
            kernel = SplitMerge(model, num_split_merge=args.split_merge_moves, capacity=capacity)
        elif args.method == "tgmcmc":  # the paper's G and D; trees on the host
            kernel = TreeGuidedMCMC(model, num_global_moves=args.global_moves, depth=args.depth,
                                    init=args.tgmcmc_init, capacity=capacity)
        else:
            kernel = CollapsedGibbs(model, capacity=capacity)
        mcmc = MCMC(
            kernel,
            num_warmup=args.warmup,
            num_samples=args.samples,
            num_chains=args.chains,
            chain_method="vectorized",
            progress_bar=resolve_progress(args.progress),
        )
        fields = ("log_joint", "num_clusters")
        try:
            if args.resume:
                source = checkpointing.resume(mcmc, checkpoint, X, num_samples=args.samples,
                                              every=args.checkpoint_every or None)
            elif args.checkpoint_every:
                settings = {k: getattr(args, k) for k in ("method", "family", "alpha", "chains", "seed")}
                settings_file.write_text(json.dumps({**settings, "capacity": capacity}) + "\n")
                source = checkpointing.run_with_checkpoints(
                    mcmc, jax.random.key(args.seed), X, path=checkpoint,
                    every=args.checkpoint_every, extra_fields=fields,
                )
            else:
                mcmc.run(jax.random.key(args.seed), X, extra_fields=fields)
                source = mcmc
            break
        except Exception as exc:  # grow the capacity on the host and start again
            if "cluster slots are in use" not in str(exc) or capacity >= len(X) or args.resume:
                raise
            capacity = min(2 * capacity, len(X))
            print(f"jaxbnp: all cluster slots used; restarting with capacity={capacity}", file=sys.stderr)
    z = np.asarray(source.get_samples(group_by_chain=True)["z"])
    extra = source.get_extra_fields(group_by_chain=True)
    return z, np.asarray(extra["log_joint"]), np.asarray(extra["num_clusters"]), capacity


def _cluster(args) -> int:
    import jax

    from ._validation import check_data

    X_raw, y, source = _load(args.data, args.labels)
    X = check_data(X_raw)
    family = _make_family(args.family, X)
    X = check_data(X, family=family).astype(np.float32)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    t0 = time.perf_counter()
    tree = None  # the fitted diffusion tree (--method ddt)
    bhmc_fit = None  # the BHMC fit (--method bhmc)
    if args.method == "mapdp":
        from .estimators import MAPDP

        est = MAPDP(alpha=args.alpha, family=family, n_restarts=args.chains,
                    mode=args.mapdp_mode, random_state=args.seed,
                    split_moves=not args.no_split_moves).fit(X)
        best = est.labels_
        log_joint = -est.nll_trace_[None, :]
        num_clusters = np.array([[est.n_clusters_]])
        capacity = None
        z = None
    elif args.method == "ddt":  # Dirichlet diffusion tree by population MCMC, cut into clusters
        from .inference.ddt_mcmc import fit_ddt

        fit = fit_ddt(X, num_chains=max(2, args.chains), num_samples=args.samples,
                      key=jax.random.key(args.seed), num_warmup=args.warmup,
                      t_stop=args.t_stop, num_clusters=args.ddt_clusters, progress_bar=args.progress)
        best = np.asarray(fit.labels)
        if args.t_stop is None and args.ddt_clusters is None:
            best = _cut_at_largest_gap(fit.tree)
        log_joint = np.asarray(fit.log_joint)
        num_clusters = np.array([[len(np.unique(best))]])
        capacity = None
        z = None
        tree = fit.tree
    elif args.method == "bhmc":  # nCRP + multilevel HDP mixture (Huang et al.), labels per level
        from .inference.bhmc import fit_bhmc

        bhmc_fit = fit_bhmc(jax.random.key(args.seed), X, depth=args.depth, alpha=args.alpha,
                            num_samples=args.samples, num_warmup=args.warmup, num_chains=args.chains)
        best = np.asarray(bhmc_fit.labels_per_level[-1])
        log_joint = np.asarray(bhmc_fit.log_lik)
        num_clusters = np.asarray(bhmc_fit.samples["num_leaves"])
        capacity = None
        z = None
    else:
        z, log_joint, num_clusters, capacity = _run_gibbs(X, family, args.alpha, args)
    seconds = time.perf_counter() - t0

    diagnostics = None
    if z is not None:
        from . import diagnostics as diag
        from .metrics import point_estimate

        chain, draw = np.unravel_index(np.argmax(log_joint), log_joint.shape)
        best_draw = z[chain, draw]
        draws = z.reshape(-1, z.shape[-1])
        best = point_estimate(draws, loss="vi")  # minimises the posterior expected VI
        diagnostics = diag.summary({"num_clusters": num_clusters, "log_joint": log_joint, "labels": z})
    else:
        best_draw = best
    summary = {
        "data": source,
        "num_points": int(X.shape[0]),
        "num_features": int(X.shape[1]),
        "method": args.method,
        "family": args.family,
        "alpha": args.alpha,
        "chains": args.chains,
        "warmup": args.warmup,
        "samples": args.samples,
        "capacity": capacity,
        "seconds": round(seconds, 3),
        "clusters_point_estimate": int(len(np.unique(best))),
        "point_estimate": "min expected variation of information over the draws"
        if z is not None else {"ddt": "best tree, cut", "bhmc": "leaves of the sample with the highest "
                               "complete-data log likelihood"}.get(args.method, "MAP-DP"),
        "clusters_best_draw": int(len(np.unique(best_draw))),
        "clusters_posterior_mean": float(num_clusters.mean()),
        "clusters_posterior_range": [int(num_clusters.min()), int(num_clusters.max())],
        "log_joint_best": float(np.nanmax(log_joint)),
        "log_joint_last_mean": float(log_joint[:, -1].mean()),
        "dtype": str(jax.numpy.asarray(X).dtype),
    }
    if diagnostics is not None:
        summary["diagnostics"] = _jsonable(diagnostics)
    if y is not None:
        try:
            from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score

            summary["nmi"] = float(normalized_mutual_info_score(y, best))
            summary["ari"] = float(adjusted_rand_score(y, best))
            summary["nmi_best_draw"] = float(normalized_mutual_info_score(y, best_draw))
            summary["ari_best_draw"] = float(adjusted_rand_score(y, best_draw))
        except ImportError:
            summary["nmi"] = None
            print('jaxbnp: install scikit-learn ("jaxbnp[plot]") for NMI/ARI.', file=sys.stderr)

    if bhmc_fit is not None:
        summary["depth"] = int(args.depth)
        summary["clusters_per_level"] = [int(len(np.unique(row))) for row in bhmc_fit.labels_per_level]
        for level, row in enumerate(bhmc_fit.labels_per_level, start=1):
            np.savetxt(out / f"labels_level{level}.csv", row, fmt="%d", header="cluster", comments="")
            if y is not None:
                from .metrics import level_scores

                summary[f"level{level}"] = level_scores(y[:, None], bhmc_fit.paths, level)
    np.savetxt(out / "labels.csv", best, fmt="%d", header="cluster", comments="")
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    plots = []
    try:
        from .plot import _pyplot, plot_clusters, plot_trace

        plt = _pyplot()
        title = (f"{summary['clusters_point_estimate']} clusters "
                 + ("(point estimate)" if z is not None else f"({args.method})"))
        ax = plot_clusters(X, best, title=title)
        ax.figure.savefig(out / "clusters.png", dpi=120, bbox_inches="tight")
        plt.close(ax.figure)
        plots = ["clusters.png"]
        if z is not None:
            from .metrics import posterior_similarity
            from .plot import plot_coclustering

            axes = plot_trace(log_joint, num_clusters)
            axes[0].figure.savefig(out / "trace.png", dpi=120, bbox_inches="tight")
            plt.close(axes[0].figure)
            ax = plot_coclustering(posterior_similarity(z.reshape(-1, z.shape[-1])), labels=best)
            ax.figure.savefig(out / "coclustering.png", dpi=120, bbox_inches="tight")
            plt.close(ax.figure)
            plots += ["trace.png", "coclustering.png"]
        if bhmc_fit is not None:
            from .plot_trees import plot_bhmc_tree

            ax = plot_bhmc_tree(bhmc_fit.paths, labels_true=y)
            ax.figure.savefig(out / "bhmc_tree.png", dpi=120, bbox_inches="tight")
            plt.close(ax.figure)
            plots.append("bhmc_tree.png")
        if tree is not None:
            from .plot_trees import plot_dendrogram

            ax = plot_dendrogram(tree)
            ax.figure.savefig(out / "dendrogram.png", dpi=120, bbox_inches="tight")
            plt.close(ax.figure)
            plots.append("dendrogram.png")
    except ImportError as exc:
        print(f"jaxbnp: no plots ({exc})", file=sys.stderr)

    print(f"data      {source}")
    if args.method == "ddt":
        print(f"method    ddt: Dirichlet diffusion tree, population MCMC over {max(2, args.chains)} chains, "
              f"{args.warmup} warm-up + {args.samples} draws; best tree cut "
              + (f"into {args.ddt_clusters} clusters" if args.ddt_clusters else
                 f"at t = {args.t_stop}" if args.t_stop else "at the largest gap between divergence times"))
    elif args.method == "bhmc":
        print(f"method    bhmc: nCRP(alpha={args.alpha}) + multilevel HDP mixture, depth {args.depth}, "
              f"{args.chains} chain(s), {args.warmup} warm-up + {args.samples} sweeps; the sample with "
              "the highest complete-data log likelihood")
        print("levels    " + ", ".join(f"level {l}: {k} clusters"
                                       for l, k in enumerate(summary["clusters_per_level"], start=1)))
    elif args.method != "mapdp":
        moves = {
            "splitmerge": f" ({args.split_merge_moves} split-merge moves + 1 Gibbs sweep per iteration)",
            "tgmcmc": f" ({args.global_moves} tree-guided global moves + local moves on n/2^{args.depth} "
                      f"points per iteration, init {args.tgmcmc_init})",
        }.get(args.method, "")
        print(f"method    {args.method}{moves}: {args.chains} chain(s), {args.warmup} warm-up + "
              f"{args.samples} draws, DP(alpha={args.alpha}), {args.family}")
    else:
        splits = "without" if args.no_split_moves else "with"
        print(f"method    mapdp ({args.mapdp_mode}, {splits} split moves): {args.chains} restart(s), "
              f"DP(alpha={args.alpha}), {args.family}, {est.n_iter_} iterations")
    if z is not None:
        k = diagnostics["num_clusters"]
        print(f"clusters  {summary['clusters_point_estimate']} in the point estimate (min expected VI); "
              f"posterior mean {k['mean']:.2f}, {100 * 0.95:.0f}% HPD {list(k['hpd'])}, "
              f"{summary['clusters_best_draw']} in the best draw")
        lj = diagnostics["log_joint"]
        print(f"converge  ESS of K {k['ess']:.0f}, split R-hat {k['r_hat']:.3f}; "
              f"log joint ESS {lj['ess']:.0f}, R-hat {lj['r_hat']:.3f}")
    else:
        print(f"clusters  {summary['clusters_point_estimate']}")
    print(f"log joint {summary['log_joint_best']:.2f} (best draw)")
    if summary.get("nmi") is not None:
        print(f"NMI       {summary['nmi']:.3f}   ARI {summary['ari']:.3f} (point estimate against known labels)")
    print(f"time      {seconds:.2f} s (compilation included)")
    print(f"wrote     {out / 'labels.csv'}, {out / 'summary.json'}"
          + "".join(f", {out / p}" for p in plots))
    return 0


def _cut_at_largest_gap(tree) -> np.ndarray:
    """Labels of a diffusion tree cut at the largest gap between consecutive divergence times
    (the dendrogram's longest vertical stretch): ``K`` clusters after the ``K − 1`` earliest."""
    from .models.ddt import cut_tree

    n = (np.asarray(tree.time).shape[0] + 1) // 2
    times = np.sort(np.asarray(tree.time, dtype=np.float64)[n:])
    if times.size < 2:
        return np.asarray(cut_tree(tree, num_clusters=min(2, n)))
    k = int(np.argmax(np.diff(times))) + 1  # divergences before the largest gap
    return np.asarray(cut_tree(tree, num_clusters=k + 1))


def _jsonable(obj):
    """Diagnostics as plain JSON values (NumPy scalars, tuples, int keys, NaN as null)."""
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, (np.integer, int)) and not isinstance(obj, bool):
        return int(obj)
    if isinstance(obj, (np.floating, float)):
        return float(obj) if np.isfinite(obj) else None
    return obj


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="jaxbnp", description="Bayesian nonparametric clustering.")
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser(
        "cluster",
        help="cluster a data set (default: the embedded toy_ring set)",
        description="Cluster DATA (a .csv, .txt or .npy file of shape points x features; "
        "default: the embedded 2-D toy_ring set with 13 known clusters) with a DP mixture, "
        "print a summary and write labels.csv (the point estimate), summary.json (with "
        "convergence diagnostics), clusters.png, trace.png and coclustering.png to --out.",
    )
    c.add_argument("data", nargs="?", help="data file (.csv/.txt/.npy); omitted = embedded toy_ring")
    c.add_argument("--labels", help="file of known labels, one per line, to report NMI/ARI")
    c.add_argument("--method", choices=METHODS, default="gibbs",
                   help="gibbs: collapsed Gibbs posterior draws; splitmerge: Jain-Neal split-merge "
                   "moves + Gibbs sweeps; tgmcmc: tree-guided MCMC (Lee & Choi 2015); "
                   "mapdp: MAP-DP point estimate; ddt: Dirichlet diffusion tree by population "
                   "MCMC, cut into clusters; bhmc: nested CRP + multilevel HDP mixture (Huang et al.), "
                   "writes labels_level{l}.csv per level and bhmc_tree.png (default gibbs)")
    c.add_argument("--family", default="normal-wishart",
                   choices=["normal-wishart", "normal-gamma", "beta-bernoulli", "dirichlet-multinomial"],
                   help="likelihood; priors from the data (tgMCMC settings for normal-wishart)")
    c.add_argument("--alpha", type=float, default=1.0, help="DP concentration (default 1.0)")
    c.add_argument("--chains", type=int, default=4,
                   help="vectorised chains for gibbs, random-order restarts for mapdp (default 4)")
    c.add_argument("--mapdp-mode", choices=["sequential", "batched"], default="sequential",
                   help="MAP-DP mode (default sequential, the paper's algorithm)")
    c.add_argument("--no-split-moves", action="store_true",
                   help="MAP-DP without split moves: the paper's algorithm exactly (often one cluster)")
    c.add_argument("--split-merge-moves", type=int, default=10,
                   help="split-merge moves per iteration for --method splitmerge (default 10)")
    c.add_argument("--global-moves", type=int, default=20,
                   help="tree-guided global moves per iteration for --method tgmcmc (default 20, the paper's G)")
    c.add_argument("--depth", type=int, default=2,
                   help="--method tgmcmc local moves resample n/2^DEPTH points per iteration; "
                   "--method bhmc: the tree depth L (default 2)")
    c.add_argument("--tgmcmc-init", choices=["ibhc", "noisy"], default="ibhc",
                   help="--method tgmcmc initial partition: IBHC or the paper's noisy trees (default ibhc)")
    c.add_argument("--warmup", type=int, default=100, help="warm-up sweeps per chain (default 100)")
    c.add_argument("--samples", type=int, default=200, help="kept sweeps per chain (default 200)")
    c.add_argument("--capacity", type=int, default=64,
                   help="cluster slots per chain; doubled automatically if full (default 64)")
    c.add_argument("--seed", type=int, default=0, help="PRNG seed (default 0)")
    c.add_argument("--out", default="jaxbnp-out", help="output folder (default ./jaxbnp-out)")
    c.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress bars (NumPyro's for the samplers); default: shown when "
                   "standard error is a terminal and the CI environment variable is unset")
    c.add_argument("--t-stop", type=float, default=None,
                   help="--method ddt: cut the tree at this divergence time in (0, 1) (default: at the "
                   "largest gap between consecutive divergence times)")
    c.add_argument("--ddt-clusters", type=int, default=None,
                   help="--method ddt: cut the tree into this many clusters instead of at --t-stop")
    c.add_argument("--checkpoint-every", type=int, default=0, metavar="N",
                   help="save the chains' state and draws to OUT/checkpoint.pkl every N draws "
                   "(default 0: no checkpoints); an interrupted run keeps what was saved")
    c.add_argument("--resume", action="store_true",
                   help="continue the run saved in OUT/checkpoint.pkl: --samples more draws per "
                   "chain (same --method, --family, --alpha, --chains, --seed as the saved run); "
                   "the draws equal those of one uninterrupted run")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "cluster":
        non_negative = ("warmup", "global_moves", "checkpoint_every")
        for name in ("chains", "warmup", "samples", "capacity", "split_merge_moves",
                     "global_moves", "depth", "checkpoint_every"):
            if getattr(args, name) < (0 if name in non_negative else 1):
                bound = "non-negative" if name in non_negative else "positive"
                raise SystemExit(f"jaxbnp: --{name.replace('_', '-')} must be {bound}.")
        if not args.alpha > 0:
            raise SystemExit("jaxbnp: --alpha must be > 0.")
        if (args.resume or args.checkpoint_every) and args.method in ("mapdp", "ddt", "bhmc"):
            raise SystemExit("jaxbnp: --resume and --checkpoint-every apply to gibbs, splitmerge "
                             "and tgmcmc.")
        try:
            return _cluster(args)
        except ValueError as exc:  # data the --family cannot model (check_data, from_data)
            raise SystemExit(f"jaxbnp: {exc}") from None
    return 1  # pragma: no cover


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
