"""Benchmark: Gibbs vs split-merge vs tree-guided MCMC on the tgMCMC paper's data sets.

Reproduces the experiments of Lee & Choi (2015), "Tree-guided MCMC inference
for normalized random measure mixture models", section 4.1 (toy, 1300 x 2,
13 clusters) and 4.2 (10k, 10000 x 6), with jaxbnp's three NumPyro kernels on
the same model function:

* ``Gibbs``:  ``bnp.CollapsedGibbs(model, capacity=...)`` (one sweep per iteration);
* ``SM``:     ``bnp.SplitMerge(model, num_split_merge=G_SM, gibbs_sweeps=1, capacity=...)``,
  ``G_SM = 20`` split-merge moves per iteration by default (``--sm-moves``), to
  match tgMCMC's ``G = 20`` global moves. (The authors' C++ SM makes 1 move
  with 10 intermediate restricted scans, then 1 Gibbs sweep, per iteration;
  jaxbnp's default is 5 restricted scans, ``--sm-restricted-scans``.)
* ``tgMCMC``: ``bnp.TreeGuidedMCMC(model, num_global_moves=20, depth=2,
  init="noisy", capacity=...)`` (the paper's ``G = 20``, ``D = 2``).

Model (docs/mathematics.md §1-2): ``NormalWishart.from_data(X)`` (the paper's r = 0.1,
nu = D + 6, m0 = sample mean, det Psi = 0.1) under

* ``DP(1.0)`` on toy (its ground truth has log p(X, Pi) = -1577.57, checked);
* ``NGGP(alpha, sigma, tau)`` with the auxiliary ``u`` on toy and on 10k.
  The paper's text gives no values for alpha, sigma, tau; its Lévy intensity
  is ``alpha sigma / Gamma(1 - sigma) w^(-sigma-1) e^(-w)`` (tau = 1), and the
  authors' C++ code (juho-lee/nrmm.cpp, ``nggp.cpp``) draws alpha ~ Gamma(1, 1)
  and sigma ~ Beta(1.5, 1.5) and resamples them every sweep. Default here:
  ``NGGP(1.0, 0.5, 1.0)`` (tau = 1 as in the paper; alpha and sigma at the
  means of those hyperpriors), fixed on toy, so that the ground-truth log
  joint is a well-defined level; on 10k alpha and sigma start there and are
  resampled as in the C++ code (``alpha ~ Gamma(1, 1)``, ``sigma ~ Beta(1.5,
  1.5)``, the kernels' ``update_hyperparameters=True``), because the paper's
  10k level -73,364 is a log joint under those sampled values: with alpha and
  sigma fixed at (1, 0.5) the ground truth itself has only about -73,456, and
  its log joint (maximised over u) ranges from -73,321 to -75,105 over alpha
  in [0.5, 100], sigma in [0.1, 0.9]. ``--nggp-hyperparameters {auto,fixed,sampled}``
  (default auto: the above) chooses for all NGGP cells.

Initialisation: all three samplers start from the paper's noisy initial
partition (section 4.1), ``TreeGuidedHost(X, measure, family,
u=1.0).noisy_labels(rng)``, the same labels for the three samplers of one
repeat, passed as ``init_params={"z": labels}``. The time it takes (Python)
is reported as ``noisy_init_s`` and is not on the time axis.

How it is timed: each kernel is driven by hand. ``state = kernel.init(...)``,
then ``kernel.sample`` is jit-compiled ahead of time once per (data set,
measure, sampler) (``jax.jit(...).lower(state, X).compile()``; the compile
time is reported separately), then ``--warmup-steps`` (1) untimed steps run
on a throwaway chain (another key, same start; e.g. tgMCMC's host-side tree
functions are jit-compiled on first use), and every call of the compiled step
of the measured chains is timed with ``jax.block_until_ready``. The trace of a run is (cumulative seconds of
the timed steps, K, log joint) per iteration, starting with the initial state
at t = 0, and the run stops at the first iteration that ends past the wall-time
budget (``--budget-toy`` 10 s like the paper, ``--budget-10k`` 300 s; the
paper ran 10k for 1,000 s). Each (data set, measure, sampler) is repeated
``--repeats`` times (5) with different seeds (repeat ``r`` uses the same noisy
partition for the three samplers).

Statistics per sampler, mean (std over repeats), as in the paper's Fig. 3/4
tables (whose numbers are not in the text; the same statistics are computed
from the authors' reference traces ``reference_traces/{dp,nggp}_{gibbs,sm,
tgmcmc}_{0..4}.log.txt`` beside ours, toy only):

* max log joint;
* ESS of the number of clusters, ``numpyro.diagnostics.effective_sample_size``
  on the second half of the iterations;
* mean log acceptance ratio (SM, tgMCMC): the mean of ``min(0, log r)`` over
  all proposals of the run (from the states' ``mean_log_accept`` weighted by
  ``num_proposed``), and the acceptance rate; NaN where the kernel's state has
  no such fields;
* time per iteration (mean of the per-iteration times; for the reference,
  the mean difference of its seconds column, as the authors' compute_stats.m);
* time to first reach the ground truth's log joint (toy) or the paper's
  tgMCMC value -73,364 (10k, NGGP; target: well inside 1,000 s). For DP the
  ground-truth level is log p(X, Pi_gt). For NGGP the traces show
  log p(X, Pi, u) at the current u, so the level is E[log p(X, Pi_gt, u)]
  under p(u | Pi_gt) (what a chain sitting on the ground truth shows on
  average); the maximum over u and the u-marginal value are recorded too.
  The reference NGGP traces use their own (sampled) alpha and sigma, so that
  column compares levels only loosely. A level counts as reached at
  ``log joint >= level - --level-tolerance`` (1 nat by default: the DP
  ground truth is about the posterior mode, and the authors' tgMCMC runs top
  out at -1577.68 (0.24) against -1577.57; use 0 for the strict test).

Usage::

    python benchmarks/tgmcmc.py                       # 5 repeats, toy 10 s and 10k 300 s per run
    python benchmarks/tgmcmc.py --quick --only toy    # 1 repeat, 2 s per toy run (-> tgmcmc_quick.*)
    python benchmarks/tgmcmc.py --only 10k --budget-10k 1000 --samplers tgmcmc
    python benchmarks/tgmcmc.py --data-dir /path/to/nrmm --out-name tgmcmc_gpu

The full run takes about (2 x 3 x 5 x 10 s) + (3 x 5 x 300 s) plus compile
and initialisation time, i.e. well over an hour; ``--quick`` uses 1 repeat and
2 s / 20 s budgets.

Results: ``benchmarks/results/tgmcmc.json`` (traces, statistics, environment),
``benchmarks/results/tgmcmc.md`` (tables and the exact command) and
``benchmarks/results/tgmcmc_toy.png`` (log joint against seconds, one panel per
measure; ``tgmcmc_10k.png`` when 10k ran). ``--out-name`` changes the stem
(default ``tgmcmc``, or ``tgmcmc_quick`` with ``--quick``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import REPO_ROOT, RESULTS, cpu_seconds, git_state, machine_info  # noqa: E402  (the benchmarks' harness)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpyro  # noqa: E402
import numpyro.distributions as dist  # noqa: E402
from numpyro.diagnostics import effective_sample_size  # noqa: E402

import jaxbnp as bnp  # noqa: E402
from jaxbnp.inference.partition.clusters import CapacityError  # noqa: E402

DEFAULT_DATA_DIR = REPO_ROOT.parent / "shared" / "data" / "nrmm"
SAMPLERS = ("gibbs", "sm", "tgmcmc")
SAMPLER_NAMES = {"gibbs": "Gibbs", "sm": "SM", "tgmcmc": "tgMCMC"}
COLORS = {"gibbs": "tab:red", "sm": "tab:green", "tgmcmc": "tab:blue"}
# (data set, measure) cells, in the paper's order
CELLS = (("toy", "dp"), ("toy", "nggp"), ("10k", "nggp"))
DP_ALPHA = 1.0
DP_TOY_GT_LOG_JOINT = -1577.57  # docs/mathematics.md §2
PAPER_TGMCMC_10K = -73364.0  # the paper's tgMCMC max log joint on 10k (Fig. 4)
TARGET_10K_SECONDS = 1000.0


# ----------------------------------------------------------------------------- data
def load_dataset(data_dir: Path, name: str) -> tuple[np.ndarray, np.ndarray]:
    """``(X float32 (n, D), ground-truth labels 0..K-1)`` of ``data_dir/name``."""
    x_path, y_path = data_dir / name / "X.txt", data_dir / name / "gt_labels.txt"
    for path in (x_path, y_path):
        if not path.is_file():
            sys.exit(
                f"tgmcmc.py: data file not found: {path}\n"
                f"Expected the tgMCMC data under {data_dir} (subfolders toy/ and 10k/ with X.txt "
                "and gt_labels.txt). Pass --data-dir /path/to/nrmm."
            )
    X = np.loadtxt(x_path, dtype=np.float64)
    y = np.loadtxt(y_path).astype(np.int64).reshape(-1)
    if X.ndim != 2 or X.shape[0] != y.shape[0]:
        sys.exit(f"tgmcmc.py: {x_path} {X.shape} and {y_path} {y.shape} do not match.")
    _, y = np.unique(y, return_inverse=True)
    return X.astype(np.float32), y.astype(np.int32)


def load_reference(data_dir: Path, measure: str, sampler: str) -> list[dict]:
    """The authors' C++ traces ``reference_traces/{measure}_{sampler}_{r}.log.txt`` (toy)."""
    out = []
    for path in sorted((data_dir / "reference_traces").glob(f"{measure}_{sampler}_*.log.txt")):
        table = np.loadtxt(path, ndmin=2)
        out.append({
            "file": path.name,
            "seconds": table[:, 0].tolist(),
            "num_clusters": table[:, 1].astype(int).tolist(),
            "log_joint": table[:, 2].tolist(),
        })
    return out


# ----------------------------------------------------------------------------- model
def make_measure(kind: str, args) -> object:
    if kind == "dp":
        return bnp.DP(DP_ALPHA)
    return bnp.NGGP(args.nggp_alpha, args.nggp_sigma, args.nggp_tau)


def hyperparameter_mode(data: str, measure_kind: str, args) -> str:
    """``"fixed"`` or ``"sampled"`` NGGP hyperparameters for one cell (``auto``: sampled on 10k)."""
    if measure_kind != "nggp":
        return "fixed"
    if args.nggp_hyperparameters != "auto":
        return args.nggp_hyperparameters
    return "sampled" if data == "10k" else "fixed"


def make_model(kind: str, family, args, mode: str = "fixed"):
    """The NumPyro model shared by the three kernels, and its extra ``init_params``."""
    if kind == "dp":
        measure = make_measure(kind, args)

        def model(X):
            z = numpyro.sample("z", bnp.Partition(measure, X.shape[0]))
            numpyro.sample("X", bnp.ConjugateMixture(family, z), obs=X)

        return model, {}

    if mode == "fixed":
        measure = make_measure(kind, args)

        def model(X):
            u = numpyro.sample("u", bnp.AuxiliaryU())
            z = numpyro.sample("z", bnp.Partition(measure, X.shape[0], u=u))
            numpyro.sample("X", bnp.ConjugateMixture(family, z), obs=X)

        return model, {}

    tau = args.nggp_tau

    def model(X):  # the authors' C++ hyperpriors (nggp.cpp)
        alpha = numpyro.sample("alpha", dist.Gamma(1.0, 1.0))
        sigma = numpyro.sample("sigma", dist.Beta(1.5, 1.5))
        u = numpyro.sample("u", bnp.AuxiliaryU())
        z = numpyro.sample("z", bnp.Partition(bnp.NGGP(alpha, sigma, tau), X.shape[0], u=u))
        numpyro.sample("X", bnp.ConjugateMixture(family, z), obs=X)

    extra = {"alpha": jnp.asarray(args.nggp_alpha, jnp.float32),
             "sigma": jnp.asarray(args.nggp_sigma, jnp.float32)}
    return model, extra


def make_kernel(sampler: str, model, capacity: int, args, mode: str = "fixed"):
    update = mode == "sampled"
    if sampler == "gibbs":
        return bnp.CollapsedGibbs(model, capacity=capacity, update_hyperparameters=update)
    if sampler == "sm":
        return bnp.SplitMerge(model, num_split_merge=args.sm_moves, gibbs_sweeps=1,
                              num_restricted_scans=args.sm_restricted_scans, capacity=capacity,
                              update_hyperparameters=update)
    tg = getattr(bnp, "TreeGuidedMCMC", None)
    if tg is None:
        raise RuntimeError("jaxbnp has no TreeGuidedMCMC (jaxbnp/inference/tgmcmc.py not importable)")
    return tg(model, num_global_moves=args.global_moves, depth=args.depth, init="noisy", trees=args.tg_trees,
              capacity=capacity, update_hyperparameters=update)


def noisy_labels(X: np.ndarray, measure, family, seed: int) -> np.ndarray:
    """The paper's noisy initial partition (section 4.1), via jaxbnp's tgMCMC host."""
    try:
        from jaxbnp.inference.tgmcmc.host import TreeGuidedHost
    except ImportError as exc:  # pragma: no cover - while tgmcmc.py is being written
        raise RuntimeError(f"noisy initialisation needs jaxbnp.inference.tgmcmc.host.TreeGuidedHost: {exc}")
    host = TreeGuidedHost(X, measure, family, u=1.0)
    return np.asarray(host.noisy_labels(np.random.default_rng(seed)), dtype=np.int32)


# ----------------------------------------------------------------------------- ground truth
def ground_truth_levels(X: np.ndarray, labels: np.ndarray, measure, family) -> dict:
    """Log joint of the ground-truth partition (docs/mathematics.md §2).

    DP: ``log p(X, Pi_gt)``. NGGP: the traces show ``log p(X, Pi, u)`` at the
    current ``u``; the level used is its mean under ``p(u | Pi_gt)`` (a chain on
    the ground truth shows that on average), computed on a grid in ``log u``;
    also the maximum over ``u`` and the ``u``-marginal ``log p(X, Pi_gt)``.
    """
    Xj = jnp.asarray(X)
    if not measure.has_auxiliary:
        value = float(bnp.log_joint(Xj, labels, measure, family))
        return {"level": value, "log_joint": value, "kind": "log p(X, Pi_gt)"}
    counts = jnp.asarray(np.bincount(labels), jnp.float32)
    lik = float(bnp.log_joint(Xj, labels, measure, family, u=1.0)) - float(measure.log_eppf(counts, 1.0))
    marginal = lik + float(measure.log_eppf(counts))
    t = np.linspace(-15.0, 25.0, 8001)
    eppf = np.asarray(jax.vmap(lambda lu: measure.log_eppf(counts, jnp.exp(lu)))(jnp.asarray(t, jnp.float32)),
                      dtype=np.float64)
    ok = np.isfinite(eppf)
    t, eppf = t[ok], eppf[ok]
    log_post = eppf + t  # density of log u given Pi_gt, unnormalised
    w = np.exp(log_post - log_post.max())
    w /= w.sum()
    k = int(np.argmax(eppf))
    return {
        "level": lik + float(np.sum(w * eppf)),
        "kind": "E[log p(X, Pi_gt, u) | Pi_gt]",
        "max_over_u": lik + float(eppf[k]),
        "u_at_max": float(np.exp(t[k])),
        "posterior_mean_log_u": float(np.sum(w * t)),
        "u_marginal_log_joint": marginal,
    }


# ----------------------------------------------------------------------------- one run
def _field(state, name):
    value = getattr(state, name, None)
    return math.nan if value is None else float(value)


def run_chain(kernel, step, key, init_params, X, budget_s: float, max_iterations: int | None,
              warmup_steps: int = 1) -> dict:
    """Drive one chain for ``budget_s`` seconds of timed steps; returns its trace.

    ``step`` caches the compiled step of this kernel (``compiled``, ``compile_s``,
    ``warmup_s``); the first call fills it.
    """
    Xj = jnp.asarray(X)
    t0 = time.perf_counter()
    state = kernel.init(key, 0, init_params, (Xj,), {})
    state = jax.block_until_ready(state)
    init_s = time.perf_counter() - t0
    if step["compiled"] is None:
        t0 = time.perf_counter()
        step["compiled"] = jax.jit(lambda s, x: kernel.sample(s, (x,), {})).lower(state, Xj).compile()
        step["compile_s"] = time.perf_counter() - t0
        # untimed warm-up steps on a throwaway chain (other key, same start): one-time costs
        # such as the jit compilation of tgMCMC's host-side tree functions stay off the axis
        t0 = time.perf_counter()
        if warmup_steps:
            scratch = kernel.init(jax.random.fold_in(key, 0x5EED), 0, init_params, (Xj,), {})
            for _ in range(warmup_steps):
                scratch = jax.block_until_ready(step["compiled"](scratch, Xj))
            del scratch
            _drop_tree_stores()
        step["warmup_s"] = time.perf_counter() - t0
    compiled = step["compiled"]
    seconds, ks, ljs = [0.0], [int(state.num_clusters)], [float(state.log_joint)]
    accepted, proposed, mean_log = [], [], []
    elapsed = 0.0
    while elapsed < budget_s and (max_iterations is None or len(seconds) <= max_iterations):
        t0 = time.perf_counter()
        state = jax.block_until_ready(compiled(state, Xj))
        elapsed += time.perf_counter() - t0
        if bool(state.clusters.overflow):  # the kernel raises first; never let it pass silently
            raise CapacityError("cluster capacity exceeded (state.clusters.overflow is set)")
        seconds.append(elapsed)
        ks.append(int(state.num_clusters))
        ljs.append(float(state.log_joint))
        accepted.append(_field(state, "num_accepted"))
        proposed.append(_field(state, "num_proposed"))
        mean_log.append(_field(state, "mean_log_accept"))
    out = {
        "init_s": init_s,
        "seconds": seconds,
        "num_clusters": ks,
        "log_joint": ljs,
        "num_accepted": accepted,
        "num_proposed": proposed,
        "mean_log_accept": mean_log,
    }
    z = getattr(state, "z", {})
    for name in ("u", "alpha", "sigma"):
        if name in z:
            out[f"final_{name}"] = float(z[name])
    return out


# ----------------------------------------------------------------------------- statistics
def _ess(k: np.ndarray) -> float:
    half = np.asarray(k[len(k) // 2:], dtype=np.float64)
    if half.size < 4 or np.ptp(half) == 0:
        return math.nan  # undefined for a constant (or too short) series
    return float(effective_sample_size(half[None, :]))


def trace_stats(trace: dict, level: float | None, reference: bool = False) -> dict:
    """The paper's statistics of one trace (row 0 is the initial state).

    ``level`` is the threshold already lowered by the tolerance.
    """
    sec = np.asarray(trace["seconds"], dtype=np.float64)
    k = np.asarray(trace["num_clusters"])
    lj = np.asarray(trace["log_joint"], dtype=np.float64)
    out = {
        "iterations": int(sec.size - 1),
        "time_per_iteration_s": float(np.mean(np.diff(sec))) if sec.size > 1 else math.nan,
        "max_log_joint": float(np.max(lj)),
        "final_log_joint": float(lj[-1]),
        "final_num_clusters": int(k[-1]),
        "ess_num_clusters": _ess(k[1:]),
    }
    hit = np.flatnonzero(lj >= level) if level is not None else np.array([], int)
    out["time_to_level_s"] = float(sec[hit[0]]) if hit.size else None
    if not reference:
        prop = np.asarray(trace["num_proposed"], dtype=np.float64)
        acc = np.asarray(trace["num_accepted"], dtype=np.float64)
        mla = np.asarray(trace["mean_log_accept"], dtype=np.float64)
        has = prop > 0
        if np.all(np.isnan(prop)) or not np.any(has):
            out.update(mean_log_accept=math.nan, acceptance_rate=math.nan, iterations_log_accept_neg_inf=0,
                       mean_log_accept_finite=math.nan)
        else:
            with np.errstate(invalid="ignore"):
                out["mean_log_accept"] = float(np.sum(mla[has] * prop[has]) / np.sum(prop[has]))
            out["acceptance_rate"] = float(np.sum(acc[has]) / np.sum(prop[has]))
            out["iterations_log_accept_neg_inf"] = int(np.sum(np.isneginf(mla[has])))
            fin = has & np.isfinite(mla)  # the same, leaving out iterations with a -inf log r
            out["mean_log_accept_finite"] = (float(np.sum(mla[fin] * prop[fin]) / np.sum(prop[fin]))
                                             if np.any(fin) else math.nan)
    return out


def aggregate(stats: list[dict]) -> dict:
    """Mean and std (ddof 1, as MATLAB's std in the authors' compute_stats.m) over repeats."""
    out = {"repeats": len(stats)}
    keys = [k for k in stats[0] if k != "time_to_level_s"]
    for key in keys:
        v = np.asarray([s[key] for s in stats], dtype=np.float64)
        fin = v[np.isfinite(v)] if not np.any(np.isneginf(v)) else v
        if fin.size == 0 or np.all(np.isnan(fin)):
            out[key] = {"mean": math.nan, "std": math.nan}
            continue
        mean = float(np.mean(fin))
        std = float(np.std(fin, ddof=1)) if fin.size > 1 and np.all(np.isfinite(fin)) else math.nan
        out[key] = {"mean": mean, "std": std}
    hits = [s["time_to_level_s"] for s in stats if s["time_to_level_s"] is not None]
    out["time_to_level_s"] = {
        "mean": float(np.mean(hits)) if hits else math.nan,
        "std": float(np.std(hits, ddof=1)) if len(hits) > 1 else math.nan,
        "reached": len(hits),
    }
    return out


# ----------------------------------------------------------------------------- output
def _clean(obj):
    """JSON-safe: NaN and infinities as None (strict JSON)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if isinstance(obj, np.generic):
        return _clean(obj.item())
    return obj


def _num(v, spec: str) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return format(v, spec)


def _ms(d: dict | None, spec: str = ".1f") -> str:
    """``mean (std)``, '-' when missing or NaN."""
    if not d or _num(d.get("mean"), spec) == "-":
        return "-"
    return f"{_num(d['mean'], spec)} ({_num(d.get('std'), spec)})"


def _git_label(git: dict | None) -> str:
    if not git:
        return "unknown"
    return git["commit"][:10] + (" + uncommitted changes in jaxbnp/" if git["jaxbnp_modified"] else "")


def write_markdown(res: dict, path: Path) -> None:
    env = res["environment"]
    lines = [
        "# Gibbs vs split-merge vs tgMCMC (Lee & Choi 2015, section 4)",
        "",
        f"Command: `{res['command']}`",
        "",
        f"Device: {env['jax_backend']} ({env.get('cpu_model')}), {env['cpu_count']} CPUs; "
        f"dtype {env['dtype']}; jax {env['jax']}, numpyro {env['numpyro']}, jaxbnp {env['jaxbnp']}; "
        f"git {_git_label(res['git'])}. CPU seconds used by other processes during the run: "
        f"{_num(res.get('other_cpu_s'), '.0f')}.",
        "",
        "Settings: " + "; ".join(f"{k} = {v}" for k, v in res["settings"].items()) + ".",
        "",
        "Each cell: mean (std) over repeats. ESS of K on the second half of the iterations "
        "(numpyro `effective_sample_size`; '-' where K is constant there). log r: mean of "
        "min(0, log r) over all proposals (acceptance rate in brackets). Time/it: seconds per "
        "iteration, compile excluded (and the untimed warm-up steps of a throwaway chain, "
        "run once per row after compiling). Level: first time the log joint reaches the level named "
        "under each table (count of repeats that reached it in brackets). Reference rows: the "
        "authors' C++ traces (`reference_traces/`, 5 runs, their hardware; their NGGP runs "
        "resample alpha and sigma, so their NGGP log joints are not on exactly our scale).",
    ]
    for cell in res["cells"]:
        gt = cell["ground_truth"]
        lines += ["", f"## {cell['data']} ({cell['n']} x {cell['d']}), {cell['measure_label']}", ""]
        lvl = cell["level"]
        lines.append(
            f"Level: {lvl:.2f} ({cell['level_kind']}); reached when the log joint is >= "
            f"{lvl - cell['level_tolerance']:.2f} (tolerance {cell['level_tolerance']:g}). Ground truth "
            f"(under {cell['measure_label'].split(' started')[0]}): K = {cell['gt_clusters']}, "
            + ", ".join(f"{k} = {_num(v, '.2f')}" if isinstance(v, float) else f"{k} = {v}"
                        for k, v in gt.items()
                        if k != "kind" and not (k == "level" and v == cell["level"]))
            + ". Noisy initial partitions: K = "
            + ", ".join(str(k) for k in cell["init_clusters"])
            + f"; {np.mean(cell['noisy_init_s']):.1f} s each (Python, not on the time axis)."
        )
        lines += [
            "",
            "| sampler | its | time/it s | max log joint | ESS(K) | log r (acc.) | time to level s "
            "| final K | compile s (+ warm-up s) |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for name, entry in cell["samplers"].items():
            if "error" in entry:
                lines.append(f"| {SAMPLER_NAMES[name]} | FAILED: {entry['error']} |||||||| ")
                continue
            a = entry["summary"]
            lr = "-"
            if _num(a["mean_log_accept"]["mean"], ".2f") != "-":
                lr = f"{_ms(a['mean_log_accept'], '.2f')} ({_num(a['acceptance_rate']['mean'], '.3f')})"
                ninf = sum(s["iterations_log_accept_neg_inf"] for s in entry["stats"])
                if ninf:
                    lr += (f" [{ninf} its with a -inf log r; without them "
                           f"{_ms(a['mean_log_accept_finite'], '.2f')}]")
            elif name != "gibbs":
                lr = "n/a (no fields)"
            t = a["time_to_level_s"]
            tl = f"{_ms(t, '.2f')} [{t['reached']}/{a['repeats']}]" if t["reached"] else f"never [0/{a['repeats']}]"
            lines.append(
                f"| {SAMPLER_NAMES[name]} | {_ms(a['iterations'], '.0f')} | "
                f"{_ms(a['time_per_iteration_s'], '.4f')} | {_ms(a['max_log_joint'], '.2f')} | "
                f"{_ms(a['ess_num_clusters'], '.1f')} | {lr} | {tl} | "
                f"{_ms(a['final_num_clusters'], '.1f')} | {_num(entry['compile_s'], '.1f')} "
                f"(+ {_num(entry.get('warmup_s'), '.1f')}) |"
            )
        for name, entry in cell.get("reference", {}).items():
            a = entry["summary"]
            t = a["time_to_level_s"]
            tl = f"{_ms(t, '.2f')} [{t['reached']}/{a['repeats']}]" if t["reached"] else f"never [0/{a['repeats']}]"
            lines.append(
                f"| {SAMPLER_NAMES[name]} (C++ ref.) | {_ms(a['iterations'], '.0f')} | "
                f"{_ms(a['time_per_iteration_s'], '.4f')} | {_ms(a['max_log_joint'], '.2f')} | "
                f"{_ms(a['ess_num_clusters'], '.1f')} | - | {tl} | "
                f"{_ms(a['final_num_clusters'], '.1f')} | - |"
            )
    if res.get("figures"):
        lines += ["", "Figures: " + ", ".join(f"`{f}`" for f in res["figures"]) + "."]
    if res.get("notes"):
        lines += ["", "Notes:", ""] + [f"- {n}" for n in res["notes"]]
    path.write_text("\n".join(lines) + "\n")


def plot_cells(res: dict, data: str, path: Path) -> bool:
    """Log joint against seconds, one panel per measure, our runs solid, reference dashed."""
    cells = [c for c in res["cells"] if c["data"] == data]
    if not cells:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(cells), figsize=(6.5 * len(cells), 4.5), squeeze=False)
    for ax, cell in zip(axes[0], cells):
        top, xmax = -math.inf, cell["budget_s"]
        for name, entry in cell["samplers"].items():
            for r, run in enumerate(entry.get("runs", [])):
                ax.plot(run["seconds"], run["log_joint"], color=COLORS[name], lw=1.2, alpha=0.8,
                        label=f"{SAMPLER_NAMES[name]} (jaxbnp)" if r == 0 else None)
                top = max(top, max(run["log_joint"]))
        for name, entry in cell.get("reference", {}).items():
            for r, run in enumerate(entry["runs"]):
                ax.plot(run["seconds"], run["log_joint"], color=COLORS[name], lw=1.0, ls="--", alpha=0.45,
                        label=f"{SAMPLER_NAMES[name]} (C++ ref.)" if r == 0 else None)
                top = max(top, max(run["log_joint"]))
                xmax = max(xmax, run["seconds"][-1])
        ax.axhline(cell["level"], color="k", ls=":", lw=1.0, label=f"level {cell['level']:.1f}")
        top = max(top, cell["level"])
        span = max(50.0, 0.25 * abs(cell["level"])) if data == "toy" else max(500.0, 0.02 * abs(cell["level"]))
        ax.set_ylim(cell["level"] - span, top + 0.05 * span)
        ax.set_xlim(0, xmax)
        ax.set_xlabel("seconds (compile excluded)")
        ax.set_ylabel("log joint")
        ax.set_title(f"{data}, {cell['measure_label']}")
        ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


# ----------------------------------------------------------------------------- main
def run_cell(data: str, measure_kind: str, X, y, args, data_dir: Path, res: dict) -> dict:
    n, d = X.shape
    family = bnp.NormalWishart.from_data(X)
    measure = make_measure(measure_kind, args)
    mode = hyperparameter_mode(data, measure_kind, args)
    model, extra_init = make_model(measure_kind, family, args, mode)
    budget = args.budget_toy if data == "toy" else args.budget_10k
    capacity = args.capacity_toy if data == "toy" else args.capacity_10k
    gt = ground_truth_levels(X, y, measure, family)
    tol = args.level_tolerance
    if data == "toy" and measure_kind == "dp" and abs(gt["level"] - DP_TOY_GT_LOG_JOINT) > 0.05:
        res["notes"].append(f"toy DP(1) ground-truth log joint {gt['level']:.3f} != docs/mathematics.md's "
                            f"{DP_TOY_GT_LOG_JOINT} (check the prior).")
    if data == "10k":
        level, level_kind = args.target_10k, "the paper's tgMCMC log joint on 10k"
    else:
        level, level_kind = gt["level"], gt["kind"]
    label = (f"DP({DP_ALPHA:g})" if measure_kind == "dp" else
             f"NGGP({args.nggp_alpha:g}, {args.nggp_sigma:g}, {args.nggp_tau:g})"
             + (" started at, then alpha ~ Gamma(1, 1), sigma ~ Beta(1.5, 1.5) resampled"
                if mode == "sampled" else ""))
    cell = {
        "data": data, "measure": measure_kind, "measure_label": label, "n": int(n), "d": int(d),
        "gt_clusters": int(y.max() + 1), "ground_truth": gt, "level": float(level), "level_kind": level_kind,
        "level_tolerance": tol, "nggp_hyperparameters": mode if measure_kind == "nggp" else None,
        "budget_s": budget, "capacity": capacity, "samplers": {}, "init_clusters": [], "noisy_init_s": [],
    }
    print(f"== {data} {label}: level {level:.2f} ({level_kind}), tolerance {tol:g}", flush=True)
    # one noisy initial partition per repeat, shared by the three samplers
    inits = []
    for r in range(args.repeats):
        seed = args.seed + r
        t0 = time.perf_counter()
        labels = noisy_labels(X, measure, family, seed)
        cell["noisy_init_s"].append(time.perf_counter() - t0)
        cell["init_clusters"].append(int(labels.max() + 1))
        if labels.max() + 1 > capacity:
            raise CapacityError(f"{data}: the noisy initial partition has {labels.max() + 1} clusters, "
                                f"more than the capacity {capacity}; raise --capacity-{data}.")
        inits.append(labels)
    cell_index = CELLS.index((data, measure_kind))
    for name in args.samplers:
        entry = {"runs": [], "stats": []}
        cell["samplers"][name] = entry
        try:
            kernel = make_kernel(name, model, capacity, args, mode)
            step = {"compiled": None, "compile_s": math.nan, "warmup_s": math.nan}
            for r, labels in enumerate(inits):
                # distinct keys per (cell, repeat): tgMCMC keys its host tree store by the key
                key = jax.random.fold_in(jax.random.key(args.seed + r), cell_index)
                init_params = {"z": jnp.asarray(labels), **extra_init}
                run = run_chain(kernel, step, key, init_params, X, budget, args.max_iterations,
                                args.warmup_steps)
                _drop_tree_stores()
                stats = trace_stats(run, level - tol)
                entry["runs"].append(run)
                entry["stats"].append(stats)
                print(f"   {SAMPLER_NAMES[name]:7s} rep {r}: {stats['iterations']} its, "
                      f"{stats['time_per_iteration_s']:.4f} s/it, max lj {stats['max_log_joint']:.2f}, "
                      f"final K {stats['final_num_clusters']}, ESS(K) {stats['ess_num_clusters']:.1f}, "
                      f"log r {stats.get('mean_log_accept', math.nan):.2f}, "
                      f"level at {stats['time_to_level_s']} s", flush=True)
            entry["compile_s"] = step["compile_s"]
            entry["warmup_s"] = step["warmup_s"]
            entry["summary"] = aggregate(entry["stats"])
        except Exception as exc:  # noqa: BLE001 - recorded, reported loudly, exit code 1
            msg = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            if "CapacityError" in repr(exc) or "capacity" in str(exc).lower():
                msg += f" (raise --capacity-{data})"
            entry["error"] = msg
            res["errors"].append(f"{data} {measure_kind} {name}: {msg}")
            print(f"!! {data} {measure_kind} {name} FAILED: {msg}", file=sys.stderr, flush=True)
    if data == "toy":
        cell["reference"] = {}
        for name in args.samplers:
            runs = load_reference(data_dir, measure_kind, name)
            if runs:
                stats = [trace_stats(run, level - tol, reference=True) for run in runs]
                cell["reference"][name] = {"runs": runs, "stats": stats, "summary": aggregate(stats)}
    return cell


def _drop_tree_stores() -> None:
    """Free memory between runs: each kernel owns its host trees (``HostTrees``), which go
    with it; collect them now rather than later."""
    import gc

    gc.collect()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="1 repeat, 2 s (toy) / 20 s (10k) budgets")
    ap.add_argument("--only", choices=("toy", "10k"), help="run one data set only")
    ap.add_argument("--samplers", nargs="+", choices=SAMPLERS, default=list(SAMPLERS))
    ap.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
    ap.add_argument("--repeats", type=int, help="repeats per cell (default 5, --quick 1)")
    ap.add_argument("--budget-toy", type=float, help="seconds per toy run (default 10, --quick 2)")
    ap.add_argument("--budget-10k", type=float, help="seconds per 10k run (default 300, --quick 20)")
    ap.add_argument("--max-iterations", type=int, help="also stop a run after this many iterations")
    ap.add_argument("--warmup-steps", type=int, default=1,
                    help="untimed steps on a throwaway chain after compiling (per data set, measure, sampler)")
    ap.add_argument("--capacity-toy", type=int, default=64,
                    help="cluster slots on toy (the most clusters any toy run has used is 34)")
    ap.add_argument("--capacity-10k", type=int, default=256)
    ap.add_argument("--sm-moves", type=int, default=20, help="split-merge moves per SM iteration")
    ap.add_argument("--sm-restricted-scans", type=int, default=5)
    ap.add_argument("--global-moves", type=int, default=20, help="tgMCMC's G")
    ap.add_argument("--tg-trees", choices=("device", "host"), default="device",
                    help="tgMCMC's trees: compiled arrays (default) or host NumPy trees via io_callback")
    ap.add_argument("--depth", type=int, default=2, help="tgMCMC's D")
    ap.add_argument("--nggp-alpha", type=float, default=1.0)
    ap.add_argument("--nggp-sigma", type=float, default=0.5)
    ap.add_argument("--nggp-tau", type=float, default=1.0)
    ap.add_argument("--nggp-hyperparameters", choices=("auto", "fixed", "sampled"), default="auto",
                    help="sampled: alpha ~ Gamma(1,1), sigma ~ Beta(1.5,1.5) resampled each iteration, as "
                         "in the authors' C++ code; auto: fixed on toy, sampled on 10k")
    ap.add_argument("--target-10k", type=float, default=PAPER_TGMCMC_10K)
    ap.add_argument("--level-tolerance", type=float, default=1.0,
                    help="a level counts as reached at log joint >= level - this (nats; 0: strict)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out-name", help="file stem under benchmarks/results (default tgmcmc / tgmcmc_quick)")
    ap.add_argument("--loop-kernels", choices=("library", "process", "off"), default="library",
                    help="XLA:CPU's whole-loop kernels: 'library' (the default a user gets: jaxbnp's "
                         "sampler programs only, jaxbnp._xla.mark_loop_program), 'process' "
                         "(bnp.set_cpu_loop_kernels(): every program of the process) or 'off' "
                         "(JAXBNP_CPU_LOOP_KERNELS=0: XLA's default 1 kB threshold everywhere)")
    ap.add_argument("--no-cpu-loop-kernels", action="store_const", const="off", dest="loop_kernels",
                    help="the same as --loop-kernels off")
    args = ap.parse_args(argv)
    if args.loop_kernels == "process":
        bnp.set_cpu_loop_kernels()  # before JAX starts (machine_info below lists the devices)
    elif args.loop_kernels == "off":
        os.environ["JAXBNP_CPU_LOOP_KERNELS"] = "0"
    args.repeats = args.repeats or (1 if args.quick else 5)
    args.budget_toy = args.budget_toy or (2.0 if args.quick else 10.0)
    args.budget_10k = args.budget_10k or (20.0 if args.quick else 300.0)
    stem = args.out_name or ("tgmcmc_quick" if args.quick else "tgmcmc")
    data_dir = args.data_dir.resolve()

    res = {
        "command": "python benchmarks/tgmcmc.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "environment": machine_info(),
        "git": git_state(),
        "settings": {
            "repeats": args.repeats, "budget_toy_s": args.budget_toy, "budget_10k_s": args.budget_10k,
            "capacity_toy": args.capacity_toy, "capacity_10k": args.capacity_10k,
            "family": "NormalWishart.from_data(X) (r=0.1, nu=D+6, m0=mean, det Psi=0.1)",
            "dp": f"DP({DP_ALPHA:g})",
            "nggp": f"NGGP(alpha={args.nggp_alpha:g}, sigma={args.nggp_sigma:g}, tau={args.nggp_tau:g}), "
                    f"hyperparameters {args.nggp_hyperparameters} (auto: fixed on toy, sampled on 10k)",
            "gibbs": "CollapsedGibbs, 1 sweep per iteration",
            "sm": f"SplitMerge(num_split_merge={args.sm_moves}, num_restricted_scans="
                  f"{args.sm_restricted_scans}, gibbs_sweeps=1)",
            "tgmcmc": f"TreeGuidedMCMC(num_global_moves={args.global_moves}, depth={args.depth}, init='noisy', trees='{args.tg_trees}')",
            "init": "the paper's noisy partition (TreeGuidedHost.noisy_labels), same for the three samplers",
            "seed": args.seed,
            "warmup_steps": args.warmup_steps,
            "cpu_loop_kernels": {
                "library": "jaxbnp's default (64 MiB for the sampler programs only)",
                "process": "bnp.set_cpu_loop_kernels() (64 MiB for every program)",
                "off": "XLA's default (1 kB; JAXBNP_CPU_LOOP_KERNELS=0)"}[args.loop_kernels],
            "level_tolerance": args.level_tolerance,
        },
        "cells": [],
        "errors": [],
        "notes": [],
        "figures": [],
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    busy0, own0 = cpu_seconds()
    t_start = time.perf_counter()
    loaded = {}
    for data, measure_kind in CELLS:
        if args.only and data != args.only:
            continue
        if data not in loaded:
            loaded[data] = load_dataset(data_dir, data)
        X, y = loaded[data]
        res["cells"].append(run_cell(data, measure_kind, X, y, args, data_dir, res))
        (RESULTS / f"{stem}.json").write_text(json.dumps(_clean(res), indent=1))
    busy1, own1 = cpu_seconds()
    res["wall_s"] = time.perf_counter() - t_start
    if busy0 is not None:
        res["other_cpu_s"] = (busy1 - busy0) - (own1 - own0)
    for data in ("toy", "10k"):
        name = f"{stem}_{data}.png"
        if plot_cells(res, data, RESULTS / name):
            res["figures"].append(f"benchmarks/results/{name}")
    for cell in res["cells"]:
        if cell["data"] == "10k":
            for name, entry in cell["samplers"].items():
                t = entry.get("summary", {}).get("time_to_level_s", {})
                ok = t.get("reached", 0) == entry.get("summary", {}).get("repeats", -1) and \
                    t.get("mean", math.inf) < TARGET_10K_SECONDS
                res["notes"].append(
                    f"10k {SAMPLER_NAMES[name]}: level {cell['level']:.0f} reached in "
                    f"{t.get('reached', 0)}/{len(entry.get('runs', []))} runs"
                    + (f", mean {t['mean']:.1f} s" if t.get("reached") else "")
                    + f"; target (all runs well inside {TARGET_10K_SECONDS:.0f} s): {'met' if ok else 'not met'}."
                )
    (RESULTS / f"{stem}.json").write_text(json.dumps(_clean(res), indent=1))
    write_markdown(res, RESULTS / f"{stem}.md")
    print((RESULTS / f"{stem}.md").read_text())
    if res["errors"]:
        print("Errors:\n  " + "\n  ".join(res["errors"]), file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
