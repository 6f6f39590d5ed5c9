"""The ``jaxbnp`` command line.

``jaxbnp cluster`` clusters the embedded default data set (``toy_ring``:
1,300 points in 2-D, 13 clusters) or a ``.csv``/``.npy`` file, prints a
summary and writes labels, a JSON summary and plots to ``--out``.

Each method has its own default run length (:data:`METHOD_DEFAULTS`); the
options override them. Chains run on separate CPU cores when there are
several (``chain_method="parallel"`` over host devices, which gives the same
draws as vectorised chains). The methods whose cost grows fast with ``n``
(``ddt``: O(n × tree depth) per sweep, about 0.15 s per chain at 1,300 points, plus the
exchange moves) fits a random subsample of ``--max-points`` points (default
2,000) when the data are larger, says so before it starts, and labels the
other points by their nearest fitted point; ``bhmc`` fits every point unless
``--max-points`` is given. ``ddt`` starts its chains from the Ward tree
(``fit_ddt(init="ward")``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from . import _defaults as defaults

__all__ = ["main"]

#: the methods for a likelihood with its cluster parameters (``--likelihood``)
PLATE_METHODS = defaults.PLATE_METHODS
METHODS = ("splitmerge", "gibbs", "tgmcmc", "subcluster", "mapdp", "ddt", "bhmc", *PLATE_METHODS)
DEFAULT_METHOD = defaults.METHOD

#: each method's defaults for the options left unset (chosen so that every method runs on
#: the embedded 1,300 points in well under a minute on a 2-core CPU, compilation included)
METHOD_DEFAULTS = {
    **{m: dict(defaults.cli_defaults(m), capacity=32) for m in defaults.ITERATIONS},
    "mapdp": dict(chains=1, family=None),
    "ddt": dict(chains=4, warmup=20, samples=40, max_points=2000),
    "bhmc": dict(chains=2, warmup=40, samples=60, max_points=0),
    # DirichletProcessMixture(method=...)'s own slots (the estimator fits them)
    **{m: dict(defaults.cli_defaults(m), capacity=c, family=None, init="one", likelihood="normal")
       for m, c in defaults.PLATE_CAPACITY.items()},
}
_GENERIC_DEFAULTS = dict(chains=2, warmup=100, samples=200, capacity=32, split_merge_moves=10,
                         max_points=0, family="auto", init="kmeans")


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

    if name == "auto":  # on standardised X (_cluster): DirichletProcessMixture()'s default
        return defaults.default_family(X)
    if name == "normal-wishart":  # on standardised X (_cluster), full covariance whatever n
        return defaults.full_prior(X)
    if name == "normal-gamma":
        return models.NormalGamma.from_data(X)
    if name == "beta-bernoulli":
        return models.BetaBernoulli.from_data(X)
    if name == "dirichlet-multinomial":
        return models.DirichletMultinomial.from_data(X)
    raise SystemExit(f"jaxbnp: unknown family {name!r}.")


#: the MCMC methods (their kernels: :data:`jaxbnp.inference.PARTITION_KERNELS`) and the
#: kernel options each takes from the parsed arguments; every other option is the
#: runner's (:func:`jaxbnp.inference.runner.run`)
KERNELS = {
    # the tgMCMC paper's SM baseline: moves + a Gibbs sweep
    "splitmerge": lambda args: {"num_split_merge": args.split_merge_moves},
    "gibbs": lambda args: {},
    # the paper's G and D
    "tgmcmc": lambda args: {"num_global_moves": args.global_moves, "depth": args.depth,
                            "init": args.tgmcmc_init},
    "subcluster": lambda args: {"num_launch_sweeps": args.launch_sweeps},
}

#: the methods that start from a k-means++ partition with ``--init kmeans`` (the default)
KMEANS_START = defaults.KMEANS_START

#: what the command line keeps of a state: the labels and two traces (NumPyro's extra fields)
EXTRA_FIELDS = ("log_joint", "num_clusters")


def collect_draw(state) -> dict:
    """The labels ``z``, the log joint and the number of clusters of a kernel state."""
    return {"z": state.z["z"], "log_joint": state.log_joint, "num_clusters": state.num_clusters}


class Fit(NamedTuple):
    """What a method gives the summary: ``labels`` (the point estimate when ``z`` is
    ``None``), ``log_joint`` and ``num_clusters`` ``(chains, draws)``, ``z`` (label draws
    ``(chains, draws, n)``, MCMC methods), ``capacity``, and the method's own fit (``extra``:
    the MAPDP estimator, the diffusion tree, the BHMC fit)."""

    labels: Any
    log_joint: np.ndarray
    num_clusters: np.ndarray
    z: np.ndarray | None = None
    capacity: int | None = None
    extra: Any = None


def _fit_mcmc(args, X, X_fit, fit_idx, family) -> Fit:
    """gibbs, splitmerge, tgmcmc, subcluster: the method's kernel on
    :func:`~jaxbnp.models.mixture_model`, sampled by :func:`jaxbnp.inference.runner.run` (capacity growth and checkpoints are its)."""
    import functools

    import jax

    from .inference import PARTITION_KERNELS
    from .checkpoint import RunSettings
    from .inference.runner import run
    from .models import DP, mixture_model

    kernel_cls, options = PARTITION_KERNELS[args.method], KERNELS[args.method](args)
    capacity = args.capacity
    # the prior and the family are constants of the model (as XLA rounds them, bit for bit)
    model = functools.partial(mixture_model, measure=DP(args.alpha), family=family)
    init_params = None if args.resume else _initial_partition(args, X, family)
    if args.method == "tgmcmc" and not args.resume:
        # its IBHC or noisy start, built here on the host from the keys the run gives each
        # chain (TreeGuidedMCMC.initial_params): inside the program it would take a host
        # callback, which JAX's compilation cache cannot keep
        key = jax.random.key(args.seed)
        keys = jax.random.split(key, args.chains) if args.chains > 1 else key
        init_params = kernel_cls(model, capacity=len(X), **options).initial_params(keys, None, (X,)) or None
    if init_params is not None:
        planned = (args.init_clusters if args.method in KMEANS_START
                   else int(np.max(init_params["z"])) + 1)
        capacity = defaults.capacity_for_start(capacity, planned, len(X))
    checkpoint = Path(args.out) / "checkpoint.pkl"
    settings = RunSettings(Path(args.out) / "checkpoint_settings.json",
                           {k: getattr(args, k) for k in ("method", "family", "alpha", "chains", "seed")})
    if args.resume:
        if not checkpoint.exists():
            raise SystemExit(f"jaxbnp: --resume: no checkpoint at {checkpoint}; run with "
                             "--checkpoint-every N first.")
        try:
            capacity = settings.check_resume()  # the saved state has this many cluster slots
        except ValueError as exc:
            raise SystemExit(f"jaxbnp: --resume: {exc}") from None

    def write_settings(capacity):
        if args.checkpoint_every and not args.resume:
            settings.write(capacity)

    def restarting(capacity):
        print(f"jaxbnp: all cluster slots used; restarting with capacity={capacity}", file=sys.stderr)
        write_settings(capacity)

    write_settings(capacity)
    iterations = args.samples if args.resume else args.warmup + args.samples
    heartbeat = _heartbeat(args, f"{args.method}: compiling and sampling", iterations)
    try:
        result = run(
            lambda capacity: kernel_cls(model, capacity=capacity, **options),
            jax.random.key(args.seed), (X,),
            num_warmup=args.warmup, num_samples=args.samples, num_chains=args.chains,
            collect=collect_draw, init_params=init_params, capacity=capacity, max_capacity=len(X),
            chain_method="parallel", progress_bar=_bar(args), description=args.method,
            heartbeat=heartbeat, on_restart=restarting, extra_fields=EXTRA_FIELDS,
            checkpoint=checkpoint if (args.checkpoint_every or args.resume) else None,
            checkpoint_every=args.checkpoint_every, resume=args.resume,
        )
    except BaseException:
        _done(heartbeat, ok=False)
        raise
    _done(heartbeat)
    draws = result.samples
    return Fit(None, np.asarray(draws["log_joint"]), np.asarray(draws["num_clusters"]),
               np.asarray(draws["z"]), result.capacity)


def _fit_mapdp(args, X, X_fit, fit_idx, family) -> Fit:
    """MAP-DP (:class:`~jaxbnp.estimators.MAPDP`): ``--chains`` random-order restarts."""
    from .estimators import MAPDP

    options = {} if args.mapdp_mode is None else {"mode": args.mapdp_mode}
    make = MAPDP.paper if args.paper else MAPDP
    est = make(alpha=args.alpha, family=family, n_restarts=args.chains,
               random_state=args.seed, **options).fit(X)
    return Fit(est.labels_, -est.nll_trace_[None, :], np.array([[est.n_clusters_]]), extra=est)


def _fit_ddt(args, X, X_fit, fit_idx, family) -> Fit:
    """Dirichlet diffusion tree by population MCMC (``fit_ddt``), cut into clusters."""
    import jax

    from .inference.trees.fit import fit_ddt

    heartbeat = _heartbeat(args, "ddt: compiling and sampling")
    cut = args.ddt_model == "cut"
    options = dict(model="cut", family=family) if cut else dict(num_clusters=args.ddt_clusters)
    fit = fit_ddt(X_fit, num_chains=max(2, args.chains), num_samples=args.samples,
                  key=jax.random.key(args.seed), num_warmup=args.warmup,
                  t_stop=args.t_stop, progress_bar=_bar(args), **options)
    _done(heartbeat)
    best = np.asarray(fit.labels)
    if not cut and args.t_stop is None and args.ddt_clusters is None:
        best = _cut_by_silhouette(fit.tree, X_fit)
    best = _extend_labels(X, fit_idx, best)
    return Fit(best, np.asarray(fit.log_joint), np.array([[len(np.unique(best))]]), extra=fit.tree)


def _fit_bhmc(args, X, X_fit, fit_idx, family) -> Fit:
    """nCRP + multilevel HDP mixture (``fit_bhmc``, Huang et al.), labels per level."""
    import jax

    from .inference.bhmc.sampler import fit_bhmc

    heartbeat = _heartbeat(args, "bhmc: sweeps", args.chains * (args.warmup + args.samples),
                           unit="chain sweeps (the first includes compilation)")
    fit = fit_bhmc(X_fit, key=jax.random.key(args.seed), depth=args.depth, alpha=args.alpha,
                   num_samples=args.samples, num_warmup=args.warmup, num_chains=args.chains,
                   heartbeat=heartbeat)
    _done(heartbeat)
    if fit_idx is not None:
        fit = fit._replace(
            labels_per_level=np.stack([_extend_labels(X, fit_idx, row) for row in fit.labels_per_level]),
            paths=_extend_labels(X, fit_idx, np.asarray(fit.paths)))
    return Fit(np.asarray(fit.labels_per_level[-1]), np.asarray(fit.log_lik),
               np.asarray(fit.samples["num_leaves"]), extra=fit)


def _fit_plate(args, X, X_fit, fit_idx, family) -> Fit:
    """auxiliary, slice: ``DirichletProcessMixture(method=..., likelihood=--likelihood)``, whose
    cluster parameters are sampled beside the labels (standardised columns for normal and
    student-t, as the estimator does)."""
    from .estimators import DirichletProcessMixture
    from .models import DP
    from .models.likelihoods import STANDARDISED

    heartbeat = _heartbeat(args, f"{args.method}: compiling and sampling")
    try:
        est = DirichletProcessMixture(
            method=args.method, likelihood=args.likelihood, measure=DP(args.alpha),
            num_chains=args.chains, num_warmup=args.warmup, num_samples=args.samples,
            capacity=args.capacity, random_state=args.seed, progress_bar=_bar(args),
            init={"kmeans": "kmeans++"}.get(args.init, args.init),
            method_options={"num_split_merge": args.split_merge_moves}).fit(X)
    except BaseException:
        _done(heartbeat, ok=False)
        raise
    _done(heartbeat)
    post = est.posterior_samples_
    log_joint = np.asarray(post["log_joint"], np.float64)
    if args.likelihood in STANDARDISED:  # log p(X, Π, θ) of X in its own units
        log_joint = log_joint - len(X) * float(np.sum(np.log(defaults.standardisation(X)[1])))
    return Fit(None, log_joint, np.asarray(post["num_clusters"]), np.asarray(post["labels"]),
               est.capacity_, extra=est)


#: each method's fit (the command line is this table and the summary of what it returns)
FITS = {"mapdp": _fit_mapdp, "ddt": _fit_ddt, "bhmc": _fit_bhmc, **dict.fromkeys(KERNELS, _fit_mcmc),
        **dict.fromkeys(PLATE_METHODS, _fit_plate)}


def _family_name(name: str | None, family) -> str | None:
    """The ``--family`` given, with what ``auto`` chose (``family``, made by
    :func:`_make_family`)."""
    if name != "auto":
        return name
    from .models import NormalGamma

    return "auto (normal-gamma, diagonal)" if isinstance(family, NormalGamma) else "auto (normal-wishart)"


def _cluster(args) -> int:
    from ._validation import check_data

    X_raw, y, source = _load(args.data, args.labels)
    X = check_data(X_raw)
    dtype = np.float64 if args.dtype == "float64" else np.float32
    # auto and normal-wishart for a partition method: fitted in standardised coordinates, as
    # DirichletProcessMixture() does (jaxbnp._defaults.standardisation: the same model)
    X_model, log_jacobian = X, 0.0
    if args.family in ("auto", "normal-wishart") and args.method not in ("ddt", "bhmc"):
        shift, scale = defaults.standardisation(X)
        X_model = (X - shift) / scale
        log_jacobian = -len(X) * float(np.sum(np.log(scale)))  # log p(X, Π) = log p(Z, Π) + this
    # --method mapdp without --family: MAPDP's own default prior (its docstring)
    family = None if args.family is None else _make_family(args.family, X_model)
    args.family_used = _family_name(args.family, family)
    X_model = check_data(X_model, family=family).astype(dtype)
    X = X.astype(dtype)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    fit_idx = _subsample(args, X)
    _announce(args, X, fit_idx)
    X_fit = X_model if fit_idx is None else X_model[fit_idx]

    t0 = time.perf_counter()
    fit = FITS[args.method](args, X_model, X_fit, fit_idx, family)
    fit = fit._replace(log_joint=fit.log_joint + log_jacobian)  # of X, in its own units
    seconds = time.perf_counter() - t0
    summary, best, diagnostics = _summarise(args, X, y, source, fit, fit_idx, seconds)
    plots = _write_outputs(args, out, X, y, fit, best, summary)
    _report(args, X, fit, fit_idx, summary, diagnostics, seconds, out, plots)
    return 0


def _summarise(args, X, y, source, fit, fit_idx, seconds):
    """``(summary, point estimate, diagnostics)`` of a method's :class:`Fit`."""
    import jax

    z, log_joint, num_clusters = fit.z, fit.log_joint, fit.num_clusters
    diagnostics = None
    if z is not None:
        from . import diagnostics as diag
        from .metrics import point_estimate

        chain, draw = np.unravel_index(np.argmax(log_joint), log_joint.shape)
        best_draw = z[chain, draw]
        best = point_estimate(z.reshape(-1, z.shape[-1]), loss="vi")  # min posterior expected VI
        diagnostics = diag.summary({"num_clusters": num_clusters, "log_joint": log_joint, "labels": z})
    else:
        best = best_draw = fit.labels
    summary = {
        "data": source,
        "num_points": int(X.shape[0]),
        "num_features": int(X.shape[1]),
        "method": args.method,
        "family": args.family,
        "family_used": args.family_used,
        "likelihood": args.likelihood,
        "alpha": args.alpha,
        "chains": args.chains,
        "warmup": args.warmup,
        "samples": args.samples,
        "capacity": fit.capacity,
        "seconds": round(seconds, 3),
        "clusters_point_estimate": int(len(np.unique(best))),
        "point_estimate": "min expected variation of information over the draws"
        if z is not None else {"ddt": "best tree, cut", "bhmc": "leaves of the sample with the highest "
                               "complete-data log likelihood"}.get(args.method, "MAP-DP"),
        "fitted_points": int(X.shape[0] if fit_idx is None else len(fit_idx)),
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
    if args.method == "bhmc":
        summary["depth"] = int(args.depth)
        summary["clusters_per_level"] = [int(len(np.unique(row))) for row in fit.extra.labels_per_level]
        if y is not None:
            from .metrics import level_scores

            for level in range(1, len(fit.extra.labels_per_level) + 1):
                summary[f"level{level}"] = level_scores(y[:, None], fit.extra.paths, level)
    return summary, best, diagnostics


def _save_figure(fig, path: Path) -> None:
    from .plot import pyplot

    fig.savefig(path, dpi=120, bbox_inches="tight")
    pyplot().close(fig)


def _write_outputs(args, out: Path, X, y, fit, best, summary) -> list[str]:
    """labels.csv (and BHMC's labels per level), summary.json and the plots; the plots' names."""
    if args.method == "bhmc":
        for level, row in enumerate(fit.extra.labels_per_level, start=1):
            np.savetxt(out / f"labels_level{level}.csv", row, fmt="%d", header="cluster", comments="")
    np.savetxt(out / "labels.csv", best, fmt="%d", header="cluster", comments="")
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    plots = []
    try:
        from .plot import plot_clusters, plot_trace, pyplot

        pyplot()
        z = fit.z
        title = (f"{summary['clusters_point_estimate']} clusters "
                 + ("(point estimate)" if z is not None else f"({args.method})"))
        _save_figure(plot_clusters(X, best, title=title).figure, out / "clusters.png")
        plots = ["clusters.png"]
        if z is not None:
            from .metrics import posterior_similarity
            from .plot import plot_coclustering

            _save_figure(plot_trace(fit.log_joint, fit.num_clusters)[0].figure, out / "trace.png")
            ax = plot_coclustering(posterior_similarity(z.reshape(-1, z.shape[-1])), labels=best)
            _save_figure(ax.figure, out / "coclustering.png")
            plots += ["trace.png", "coclustering.png"]
        if args.method == "bhmc":
            from .plot import plot_bhmc_tree

            _save_figure(plot_bhmc_tree(fit.extra.paths, labels_true=y).figure, out / "bhmc_tree.png")
            plots.append("bhmc_tree.png")
        if args.method == "ddt":
            from .plot import plot_dendrogram

            _save_figure(plot_dendrogram(fit.extra).figure, out / "dendrogram.png")
            plots.append("dendrogram.png")
    except ImportError as exc:
        print(f"jaxbnp: no plots ({exc})", file=sys.stderr)
    return plots


def _describe_mcmc(args, X, fit_idx, fit) -> str:
    start = (f", k-means++ start ({args.init_clusters} clusters)" if args.init == "kmeans"
             else ", one-cluster start")
    moves = {
        "gibbs": f" (collapsed Gibbs sweeps{start})",
        "splitmerge": f" ({args.split_merge_moves} split-merge moves + 1 Gibbs sweep per iteration{start})",
        "tgmcmc": f" ({args.global_moves} tree-guided global moves + local moves on n/2^{args.depth} "
                  f"points per iteration, init {args.tgmcmc_init})",
        "subcluster": f" (all labels at once + sub-cluster splits and merges, {args.launch_sweeps} "
                      f"launch sweeps per iteration{start})",
    }.get(args.method, "")
    return (f"{args.method}{moves}: {args.chains} chain(s), {args.warmup} warm-up + "
            f"{args.samples} draws, DP(alpha={args.alpha}), {args.family_used}")


def _describe_mapdp(args, X, fit_idx, fit) -> str:
    variant = "the paper's algorithm" if args.paper else f"{fit.extra.mode} mode, defaults"
    return (f"mapdp ({variant}): {args.chains} restart(s), "
            f"DP(alpha={args.alpha}), {args.family or 'default prior'}, {fit.extra.n_iter_} iterations")


def _describe_ddt(args, X, fit_idx, fit) -> str:
    if args.ddt_model == "cut":
        return (f"ddt: the seed's cut model (a Dirichlet diffusion tree cut at t_stop over "
                f"{args.family_used} cluster marginals), population MCMC over {max(2, args.chains)} chains "
                f"started from the Ward tree, {args.warmup} warm-up + {args.samples} draws; the best draw's "
                + (f"partition at t_stop = {args.t_stop}" if args.t_stop else "partition (t_stop ~ Beta(2, 2))")
                + (f"; fitted on {args.max_points} of the {X.shape[0]} points" if fit_idx is not None else ""))
    return (f"ddt: Dirichlet diffusion tree, population MCMC over {max(2, args.chains)} chains "
            f"started from the Ward tree, {args.warmup} warm-up + {args.samples} draws; best tree cut "
            + (f"into {args.ddt_clusters} clusters" if args.ddt_clusters else
               f"at t = {args.t_stop}" if args.t_stop else "where the mean silhouette width is largest")
            + (f"; fitted on {args.max_points} of the {X.shape[0]} points" if fit_idx is not None else ""))


def _describe_bhmc(args, X, fit_idx, fit) -> str:
    return (f"bhmc: nCRP(alpha={args.alpha}) + multilevel HDP mixture, depth {args.depth}, "
            f"{args.chains} chain(s), {args.warmup} warm-up + {args.samples} sweeps; the sample with "
            "the highest complete-data log likelihood"
            + (f"; fitted on {args.max_points} of the {X.shape[0]} points" if fit_idx is not None else ""))


def _describe_plate(args, X, fit_idx, fit) -> str:
    labels = ("Neal's Algorithm 8 label sweeps" if args.method == "auxiliary"
              else "Walker's slice sampler, every label at once")
    return (f"{args.method} ({labels} + {args.split_merge_moves} split-merge moves + slice steps of "
            f"the cluster parameters per iteration, one-cluster start): {args.chains} chain(s), "
            f"{args.warmup} warm-up + {args.samples} draws, DP(alpha={args.alpha}), "
            f"{args.likelihood} likelihood, {fit.capacity} slots")


#: each method's line in the report
DESCRIBE = {"mapdp": _describe_mapdp, "ddt": _describe_ddt, "bhmc": _describe_bhmc,
            **dict.fromkeys(KERNELS, _describe_mcmc), **dict.fromkeys(PLATE_METHODS, _describe_plate)}


def _report(args, X, fit, fit_idx, summary, diagnostics, seconds, out: Path, plots) -> None:
    print(f"data      {summary['data']}")
    print(f"method    {DESCRIBE[args.method](args, X, fit_idx, fit)}")
    if args.method == "bhmc":
        print("levels    " + ", ".join(f"level {l}: {k} clusters"
                                       for l, k in enumerate(summary["clusters_per_level"], start=1)))
    if diagnostics is not None:
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


def _initial_partition(args, X: np.ndarray, family=None):
    """``init_params`` for gibbs/splitmerge/subcluster with ``--init kmeans``: each chain starts
    from its own k-means++ partition (``mapdp.kmeanspp_labels`` on standardised coordinates) into
    ``--init-clusters`` clusters (an over-segmentation that the
    sampler merges; the start affects only the burn-in, not the chain's target). ``None``
    otherwise (one cluster for ``--init one``; tgmcmc's IBHC or noisy start is the kernel's,
    built before the run by :func:`_fit_mcmc`)."""
    if args.method not in KMEANS_START or args.init != "kmeans":
        return None
    z = defaults.kmeans_starts(X, args.seed, args.init_clusters, args.chains)
    return {"z": z}


def _apply_method_defaults(args) -> None:
    """Fill the options left unset (``None``) from :data:`METHOD_DEFAULTS`."""
    table = {**_GENERIC_DEFAULTS, **METHOD_DEFAULTS[args.method]}
    for name, value in table.items():
        if getattr(args, name, None) is None:
            setattr(args, name, value)


def _spread_chains_over_cores(chains: int) -> None:
    """Before JAX starts: one host device per chain, up to the CPU count, so that
    ``chain_method="parallel"`` runs chains on separate cores (no-op once JAX has
    started, or when ``XLA_FLAGS`` already sets a host device count)."""
    import os

    from ._xla import backends_started

    if chains < 2 or backends_started() or "xla_force_host_platform_device_count" in os.environ.get(
            "XLA_FLAGS", ""):
        return
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if cores > 1:
        import numpyro

        numpyro.set_host_device_count(min(chains, cores))


def _bar(args) -> bool:
    """A progress bar (the runner's, tqdm): only when asked for with ``--progress`` on a
    terminal; otherwise :func:`_heartbeat` prints plain lines."""
    return bool(args.progress) and sys.stderr.isatty()


def _heartbeat(args, desc: str, total: int | None = None, unit: str = "iterations"):
    """Started :class:`~jaxbnp._progress.Heartbeat` (a line every few seconds) unless
    progress is off or the bar is shown; else ``None``."""
    from ._progress import Heartbeat, env_choice

    if args.progress is False or (args.progress is None and env_choice() is False) or _bar(args):
        return None
    return Heartbeat(desc, total, unit=unit).start()


def _done(heartbeat, ok: bool = True) -> None:
    if heartbeat is not None:
        heartbeat.done(ok)


def _announce(args, X: np.ndarray, fit_idx) -> None:
    """Say what will run, before anything compiles (and why a subsample, if one)."""
    n = X.shape[0]
    note = ""
    if fit_idx is not None:
        cost = "O(n x tree depth) per sweep" if args.method == "ddt" else "slow per point"
        note = (f"; {args.method} costs grow fast with n ({cost}): fitting a random subsample of "
                f"{args.max_points} of the {n} points (--max-points, 0 = all), the others labelled "
                "by their nearest fitted point")
    runs = (f"{args.chains} restart(s)" if args.method == "mapdp" else
            f"{args.chains} chain(s) x ({args.warmup} warm-up + {args.samples} draws)")
    print(f"jaxbnp: {args.method} on {n} x {X.shape[1]} points ({args.dtype}), {runs}{note}",
          file=sys.stderr, flush=True)


def _subsample(args, X: np.ndarray):
    """Sorted indices of the random subsample fitted by ddt/bhmc, or ``None`` (all points)."""
    n = X.shape[0]
    if args.method not in ("ddt", "bhmc") or not args.max_points or n <= args.max_points:
        return None
    rng = np.random.default_rng(args.seed)
    return np.sort(rng.choice(n, args.max_points, replace=False))


def _extend_labels(X: np.ndarray, fit_idx, labels: np.ndarray) -> np.ndarray:
    """Labels of every point: the fitted points keep theirs, each other point takes the
    label (row of ``labels``' last axis) of its nearest fitted point (Euclidean)."""
    if fit_idx is None:
        return labels
    labels = np.asarray(labels)
    fitted = X[fit_idx].astype(np.float64)
    out = np.empty((X.shape[0],) + labels.shape[1:], labels.dtype)
    sq = np.sum(fitted**2, axis=1)
    for start in range(0, X.shape[0], 65536):  # blocks bound the distance matrix's memory
        block = X[start:start + 65536].astype(np.float64)
        d2 = sq[None, :] - 2.0 * block @ fitted.T
        out[start:start + len(block)] = labels[np.argmin(d2, axis=1)]
    out[fit_idx] = labels
    return out


def _cut_by_silhouette(tree, X: np.ndarray, max_clusters: int = 30) -> np.ndarray:
    """The diffusion tree's cut into ``K`` clusters (``K − 1`` earliest divergences) whose
    mean silhouette width on ``X`` is largest, for ``K`` from 2 to ``max_clusters``."""
    from .models.ddt import cut_tree

    from sklearn.metrics import pairwise_distances, silhouette_score

    n = X.shape[0]
    D = pairwise_distances(X.astype(np.float64))
    best, best_score = None, -np.inf
    for k in range(2, min(max_clusters, n - 1) + 1):
        labels = np.asarray(cut_tree(tree, num_clusters=k))
        # scikit-learn's mean silhouette width; 0 for one cluster or all singletons
        score = (silhouette_score(D, labels, metric="precomputed")
                 if 2 <= len(np.unique(labels)) < n else 0.0)
        if score > best_score:
            best, best_score = labels, score
    return best if best is not None else np.zeros(n, np.int64)


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
    c.add_argument("--method", choices=METHODS, default=DEFAULT_METHOD,
                   help="splitmerge: Jain-Neal split-merge moves + collapsed Gibbs sweeps (default); "
                   "gibbs: collapsed Gibbs alone (can stay trapped with merged clusters); "
                   "tgmcmc: tree-guided MCMC (Lee & Choi 2015); "
                   "subcluster: sub-cluster split/merge MCMC (Chang & Fisher 2013, exact form), every "
                   "step over all points at once, for large data and GPUs; "
                   "mapdp: MAP-DP point estimate; ddt: Dirichlet diffusion tree by population "
                   "MCMC, cut into clusters; bhmc: nested CRP + multilevel HDP mixture (Huang et al.), "
                   "writes labels_level{l}.csv per level and bhmc_tree.png; auxiliary (Neal's "
                   "Algorithm 8) and slice (Walker's slice sampler, every label at once): a "
                   "--likelihood whose cluster parameters are sampled. Each method has its own "
                   "defaults for --chains, --warmup, --samples, --capacity and --max-points")
    c.add_argument("--family", default=None,
                   choices=["auto", "normal-wishart", "normal-gamma", "beta-bernoulli",
                            "dirichlet-multinomial"],
                   help="likelihood; priors from the data. auto (the default, DirichletProcessMixture()'s): "
                   "fitted on standardised columns, normal-wishart when there are at least D(D+1)/2 "
                   "points, else MAPDP's diagonal normal-gamma (within-group variances, worth D+1 "
                   "points); normal-wishart: auto's full prior (tgMCMC "
                   "settings, the Ledoit-Wolf covariance, a vague prior on the means: r = 1/n) on "
                   "standardised columns, whatever the number of points; "
                   "for mapdp the default is MAPDP's default prior (a full-covariance prior on "
                   "standardised columns, its covariance from a 32-means split of the data)")
    c.add_argument("--likelihood", default=None, choices=["normal", "student-t", "poisson"],
                   help="--method auxiliary or slice: the clusters' likelihood, its parameters sampled "
                   "(not integrated out): normal (diagonal Gaussian, the default) or student-t (3 "
                   "degrees of freedom), both on standardised columns; poisson (counts, log-normal "
                   "rates with a prior from the data)")
    c.add_argument("--alpha", type=float, default=1.0, help="DP concentration (default 1.0)")
    c.add_argument("--chains", type=int, default=None,
                   help="MCMC chains (one per CPU core when there are several), random-order restarts "
                   "for mapdp (default: 2; mapdp 1; ddt 4)")
    c.add_argument("--mapdp-mode", choices=["sequential", "batched"], default=None,
                   help="MAP-DP mode (default: MAPDP's own default)")
    c.add_argument("--paper", action="store_true",
                   help="--method mapdp: the paper's algorithm exactly (one-cluster start, point moves "
                   "only; often stays in one cluster)")
    c.add_argument("--split-merge-moves", type=int, default=None,
                   help="split-merge moves per iteration for --method splitmerge (default 5)")
    c.add_argument("--global-moves", type=int, default=20,
                   help="tree-guided global moves per iteration for --method tgmcmc (default 20, the paper's G)")
    c.add_argument("--launch-sweeps", type=int, default=3,
                   help="--method subcluster: restricted Gibbs sweeps that fit the sub-clusters of "
                   "each pair of slots before a split or merge is proposed (default 3)")
    c.add_argument("--depth", type=int, default=2,
                   help="--method tgmcmc local moves resample n/2^DEPTH points per iteration; "
                   "--method bhmc: the tree depth L (default 2)")
    c.add_argument("--init", choices=["kmeans", "one"], default=None,
                   help="gibbs, splitmerge and subcluster: start each chain from its own k-means++ "
                   "partition into --init-clusters clusters (default for gibbs and splitmerge), "
                   "or from one cluster (default for subcluster)")
    c.add_argument("--init-clusters", type=int, default=defaults.INIT_CLUSTERS,
                   help=f"clusters of the k-means++ start (default {defaults.INIT_CLUSTERS}; more than you expect: the "
                   "sampler merges more easily than it splits)")
    c.add_argument("--tgmcmc-init", choices=["ibhc", "noisy"], default="ibhc",
                   help="--method tgmcmc initial partition: IBHC or the paper's noisy trees (default ibhc)")
    c.add_argument("--warmup", type=int, default=None,
                   help="warm-up sweeps per chain (default: splitmerge 50, gibbs 100, tgmcmc 30, "
                   "subcluster 50, ddt 20, bhmc 40)")
    c.add_argument("--samples", type=int, default=None,
                   help="kept sweeps per chain (default: splitmerge 100, gibbs 200, tgmcmc 70, "
                   "subcluster 100, ddt 40, bhmc 60)")
    c.add_argument("--capacity", type=int, default=None,
                   help="cluster slots per chain; doubled automatically if full (default 32)")
    c.add_argument("--max-points", type=int, default=None,
                   help="ddt and bhmc: fit a random subsample of this many points when the data are "
                   "larger and label the others by their nearest fitted point (default: ddt 2000, "
                   "bhmc 0; 0 = all points)")
    c.add_argument("--dtype", choices=["float32", "float64"], default=None,
                   help="floating-point precision (default float32, or float64 when JAX_ENABLE_X64 is set)")
    c.add_argument("--no-compile-cache", action="store_true",
                   help="do not use the persistent compilation cache (also: JAXBNP_COMPILATION_CACHE=0); "
                   "by default compiled programs are kept in ~/.cache/jaxbnp (or $JAXBNP_CACHE_DIR) so "
                   "that a second run does not compile again")
    c.add_argument("--seed", type=int, default=0, help="PRNG seed (default 0)")
    c.add_argument("--out", default="jaxbnp-out", help="output folder (default ./jaxbnp-out)")
    c.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress: a bar on a terminal, a line every few seconds otherwise "
                   "(default on; --no-progress or JAXBNP_PROGRESS=0 for none)")
    c.add_argument("--t-stop", type=float, default=None,
                   help="--method ddt: cut the tree at this divergence time in (0, 1) (default: the cut "
                   "into 2 to 30 clusters with the largest mean silhouette width)")
    c.add_argument("--ddt-clusters", type=int, default=None,
                   help="--method ddt: cut the tree into this many clusters instead of at --t-stop")
    c.add_argument("--ddt-model", choices=("brownian", "cut"), default="brownian",
                   help="--method ddt: 'brownian' (default: Neal's diffusion tree, Brownian leaves) or "
                   "'cut' (the population-MCMC seed's model: the tree cut at t_stop over the --family's "
                   "cluster marginals; t_stop ~ Beta(2, 2) unless --t-stop fixes it)")
    c.add_argument("--checkpoint-every", type=int, default=0, metavar="N",
                   help="save the chains' state and draws to OUT/checkpoint.pkl every N draws "
                   "(default 0: no checkpoints); an interrupted run keeps what was saved")
    c.add_argument("--resume", action="store_true",
                   help="continue the run saved in OUT/checkpoint.pkl: --samples more draws per "
                   "chain (same --method, --family, --alpha, --chains, --seed as the saved run); "
                   "the draws equal those of one uninterrupted run")
    return parser


def main(argv: list[str] | None = None) -> int:
    import os

    args = build_parser().parse_args(argv)
    if args.command == "cluster":
        _apply_method_defaults(args)
        non_negative = ("warmup", "global_moves", "checkpoint_every", "max_points", "launch_sweeps")
        for name in ("chains", "warmup", "samples", "capacity", "split_merge_moves", "launch_sweeps",
                     "global_moves", "depth", "checkpoint_every", "max_points", "init_clusters"):
            if getattr(args, name) < (0 if name in non_negative else 1):
                bound = "non-negative" if name in non_negative else "positive"
                raise SystemExit(f"jaxbnp: --{name.replace('_', '-')} must be {bound}.")
        if not args.alpha > 0:
            raise SystemExit("jaxbnp: --alpha must be > 0.")
        if args.method in ("ddt", "bhmc") and 0 < args.max_points < 4:
            raise SystemExit("jaxbnp: --max-points must be 0 (all points) or at least 4.")
        if (args.resume or args.checkpoint_every) and args.method in ("mapdp", "ddt", "bhmc",
                                                                      *PLATE_METHODS):
            raise SystemExit("jaxbnp: --resume and --checkpoint-every apply to gibbs, splitmerge, "
                             "tgmcmc and subcluster.")
        if getattr(args, "likelihood", None) is not None and args.method not in PLATE_METHODS:
            raise SystemExit("jaxbnp: --likelihood applies to --method auxiliary and slice "
                             "(the other methods take --family).")
        if args.method in PLATE_METHODS and args.family is not None:
            raise SystemExit("jaxbnp: --family applies to the conjugate methods; --method "
                             f"{args.method} takes --likelihood.")
        if args.ddt_model == "cut" and (args.method != "ddt" or args.ddt_clusters is not None):
            raise SystemExit("jaxbnp: --ddt-model cut applies to --method ddt, which then labels by the "
                             "model's own cut at t_stop (not --ddt-clusters).")
        if args.paper and args.method != "mapdp":
            raise SystemExit("jaxbnp: --paper applies to --method mapdp.")
        env_x64 = os.environ.get("JAX_ENABLE_X64", "").strip().lower() in ("1", "true", "yes", "on")
        if args.dtype is None:
            args.dtype = "float64" if env_x64 else "float32"
        if args.method not in ("mapdp",):
            _spread_chains_over_cores(args.chains)
        import jax

        from ._cache import enable_compilation_cache

        if args.dtype == "float64":  # float32 data stay float32 where x64 is on (as in a test process)
            jax.config.update("jax_enable_x64", True)
        enable_compilation_cache(not args.no_compile_cache)
        try:
            return _cluster(args)
        except ValueError as exc:  # data the --family cannot model (check_data, from_data)
            raise SystemExit(f"jaxbnp: {exc}") from None
    return 1  # pragma: no cover


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
