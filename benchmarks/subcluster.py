"""Benchmark: SubClusterMCMC (sub-cluster split/merge MCMC, issue #20) against scikit-learn's
BayesianGaussianMixture, jaxbnp's collapsed Gibbs and MAP-DP, on simulated Gaussian mixtures.

Settings (``--full`` runs the issue's sizes; the default, ``--quick``, shrinks the two
large ones and caps each method at 20 s so that the script takes a few minutes on a
2-core CPU):

* ``dpmm``: the dpmmpython README's example, ``DPMMPython.generate_gaussian_data(10000, 2,
  10, 100.0)`` then ``DPMMPython.fit(data, 100, prior=niw(1, zeros(2), 4, eye(2)))``,
  emulated in NumPy: mixture weights ~ Dirichlet(1, ..., 1), cluster sizes multinomial,
  means ~ N(0, 100 I), covariances ~ inverse-Wishart(D + 2, I), 10,000 x 2 points;
  ``DP(100)`` and ``NormalWishart(m0=0, r=1, nu=4, psi=I)``. 100 iterations from one
  cluster (collapsed Gibbs: 100 sweeps), through
  :func:`jaxbnp.inference.runner.run` with a ``cache_key``: the first call compiles (and
  doubles a capacity that runs out), then up to five calls with the same shapes are timed
  (fewer once they add up to 30 s) and the median is reported (the runner keeps its compiled programs; ``numpyro.infer.MCMC`` traces and compiles its loop
  again on every ``run``, measured in the row "NumPyro MCMC, second run"). NMI of the
  last draw against the truth. The issue's targets: <= 0.3 s and NMI >= 0.97.
* ``dpmm_dp1``: the same data with ``DP(1)`` and ``NormalWishart.from_data`` (the
  library's default prior); as ``dpmm``.
* ``d10``: 30 Gaussians in 10-D (the same generator with equal weights and diagonal
  covariances, per-dimension standard deviations ~ U(0.5, 1.5)), 10^6 points
  (``--quick``: 10^5); ``DP(1)`` and ``NormalGamma.from_data`` (diagonal). Wall time until
  the draw's NMI reaches 0.95 (a trace of NMI against iteration and time; stops there or
  at the time cap).
* ``d128``: 100 Gaussians in 128-D, diagonal as above, 10^5 points (``--quick``: 10^4);
  ``DP(1)`` and ``NormalGamma.from_data``; as ``d10``.

Each setting also reports the NMI of the Bayes classifier with the true parameters (what
overlapping components leave to find) and how many components drew points.

Methods, on the same data in the same process:

* ``SubClusterMCMC(capacity=C)`` with the default ``num_launch_sweeps`` (3): C = 32, 64
  and 256 for 10, 30 and 100 true clusters; started from one cluster.
* ``CollapsedGibbs(capacity=C)`` (Neal's algorithm 3), the same capacity, started from a
  draw of the prior partition (a CRP(alpha) draw made in NumPy and passed as
  ``init_params``: what ``DirichletProcessMixture(method="gibbs")`` starts from, since from
  one cluster single-point moves rarely split well separated groups), except under
  ``DP(100)``, whose prior draw (about 460 clusters) does not fit the capacity: from one
  cluster there.
  A capacity that runs out is doubled by the runner (``dpmm``) or ends the run
  ("capacity overflow", ``d10``/``d128``); the tables give the capacity used.
* ``MAPDP()`` with its defaults (its own prior rule, alpha = 1): second fit (compiled).
* ``BayesianGaussianMixture(weight_concentration_prior_type="dirichlet_process",
  n_components=2 K, random_state=0)`` with scikit-learn's defaults otherwise
  (``max_iter=100``, one k-means start); covariance ``full`` for ``dpmm``, ``diag`` for
  the diagonal settings (the jaxbnp families' shapes). It runs in a child process killed
  at the time cap ("cap").
* the PyTorch ``dpgmm`` package's collapsed Gibbs sampler (``pip install dpgmm``: it brings
  PyTorch and wandb, so it may live in another environment: set ``DPGMM_PYTHON`` to that
  interpreter), in a child process: ``Full``/``DiagCovarianceCollapsedGibbsSampler`` (the
  BGM's covariance type), ``batch_size=1``, ``init_strategy="init_data_stats"`` with 2 K
  initial clusters, its own Gamma(1, 1) prior on alpha (not a fixed DP alpha). A one-sweep
  probe sets how many sweeps fit in the cap; "not installed" when the import fails.

For ``d10``/``d128`` each MCMC chain is compiled first (one iteration, ahead of time), then
run iteration by iteration; the clock counts the iterations only (the NMI of each draw is
computed between iterations, off the clock), and the run stops when the NMI reaches the
target or the clock passes the cap (``--cap``). Gibbs also stops at the cap; MAP-DP
cannot be stopped: its second, timed fit is marked "cap" when it took longer. Speed-up =
BGM's time / the method's time, both measured in this run. JAX's persistent compilation
cache is off here (``jaxbnp.enable_compilation_cache(False)``; ``MAPDP`` would turn it
on), so every first call compiles.

Cost of a SubClusterMCMC iteration (``subcluster_cost``): with ``T = num_launch_sweeps``
an iteration scores the label step's ``(n, C)`` log-likelihood matrix and, for the launch
(anchors, ``T`` sweeps, the final step), ``T + 2`` more: full ``(n, C)`` matrices for
NormalWishart (its ``log_likelihood_at`` takes columns of the full matrix) and ``(n, 2)``
gathered ones for NormalGamma. It sums per-point statistics by slot ``S = T + 5`` times
(current and proposed labels, ``T + 1`` launches, the split parts, the new labels). Per
matrix entry ``f = 2 (D^2 + D + 1) + 8`` flops for NormalWishart (one product
``[x x^T, x, 1] @ [-Λ/2, Λμ, c]^T``) and ``f = 2 (2 D + 1) + 8`` for NormalGamma
(``[x^2, x, 1]``), 8 for the weights, the exponential and the inverse-CDF draw; a gathered
NormalGamma entry costs ``3 D + 2``. Statistics per point ``s = 1 + D + D^2``
(NormalWishart) or ``1 + 2 D`` (NormalGamma).

    flops/iteration ~ L n C f + G n 2 g + S n s
    bytes/iteration ~ (L + G) n b_x + 8 n (L C + 2 G) + S * 4 n (s + 1)

with ``L = T + 3, G = 0`` (NormalWishart) or ``L = 1, G = T + 2, g = 3 D + 2``
(NormalGamma), ``b_x = 4 (D + 2 D^2)`` (NormalWishart: X read, the ``x x^T`` features
written and read) or ``4 (D + 2 D)`` (NormalGamma), float32, each likelihood matrix written
and read once. An estimate of the work, not a measurement; "achieved" rates are these
figures over the measured seconds per iteration.

Usage::

    python benchmarks/subcluster.py              # quick sizes (a few minutes on 2 cores)
    python benchmarks/subcluster.py --full       # 10^6 x 10 and 10^5 x 128 (much longer)
    python benchmarks/subcluster.py --only dpmm  # one setting (dpmm, dpmm_dp1, d10, d128)

Results: ``benchmarks/results/subcluster.json`` and ``benchmarks/results/subcluster.md``
(``--out-name`` changes the file name; ``--full`` defaults to ``subcluster_full``).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import queue as queue_module
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import (  # noqa: E402  (puts the repository root on sys.path)
    RESULTS, cpu_seconds, fit_bgm, machine_info, other_cpu_seconds, utc_now, write_json,
    write_lines,
)

TARGET_DPMM_S = 0.3
TARGET_DPMM_NMI = 0.97
TARGET_NMI = 0.95
DEFAULT_CAP_S = 120.0
QUICK_CAP_S = 20.0
REPEATS = 5  # timed calls of a fixed-iteration run (median reported)
REPEAT_BUDGET_S = 30.0  # stop repeating once the timed calls took this long

SETTINGS = {
    # n (full and quick), D, K, covariances, mixture weights, jaxbnp family and prior, DP
    # alpha, capacity, iterations (None: until the NMI target or the cap), Gibbs's start
    "dpmm": dict(n_full=10_000, n_quick=10_000, d=2, k=10, cov="full", weights="dirichlet",
                 family="NormalWishart", prior="readme", alpha=100.0, capacity=32, iterations=100,
                 gibbs_init="one"),
    "dpmm_dp1": dict(n_full=10_000, n_quick=10_000, d=2, k=10, cov="full", weights="dirichlet",
                     family="NormalWishart", prior="from_data", alpha=1.0, capacity=32,
                     iterations=100, gibbs_init="prior"),
    "d10": dict(n_full=1_000_000, n_quick=100_000, d=10, k=30, cov="diag", weights="uniform",
                family="NormalGamma", prior="from_data", alpha=1.0, capacity=64, iterations=None,
                gibbs_init="prior"),
    "d128": dict(n_full=100_000, n_quick=10_000, d=128, k=100, cov="diag", weights="uniform",
                 family="NormalGamma", prior="from_data", alpha=1.0, capacity=256, iterations=None,
                 gibbs_init="prior"),
}


# ----------------------------------------------------------------------------- data
def make_data(n: int, d: int, k: int, cov: str, weights: str = "dirichlet", seed: int = 0,
              responsibilities: bool = False):
    """``generate_gaussian_data(n, d, k, 100.0)`` of DPMMSubClusters.jl in NumPy: weights
    ~ Dirichlet(1) (``weights="uniform"``: all ``1/k``), sizes ~ Multinomial(n, weights),
    means ~ N(0, 100 I); covariances ~ inverse-Wishart(d + 2, I) (``cov="full"``) or
    diagonal with standard deviations ~ U(0.5, 1.5) (``cov="diag"``). Points shuffled;
    float32. Returns ``(X, y, oracle)``: ``oracle`` are the labels of the Bayes classifier
    with the true weights, means and covariances (the NMI a clustering can hope for).
    ``responsibilities=True``: also the ``(n, k)`` true posterior probabilities of each
    point's component (a draw from them is the partition a posterior draw can hope for)."""
    from scipy.stats import invwishart

    rng = np.random.default_rng(seed)
    w = rng.dirichlet(np.ones(k)) if weights == "dirichlet" else np.full(k, 1.0 / k)
    sizes = rng.multinomial(n, w)
    y = np.repeat(np.arange(k), sizes)
    means = rng.normal(0.0, 10.0, (k, d))
    X = np.empty((n, d))
    chols = []
    start = 0
    for j in range(k):
        m = sizes[j]
        if cov == "full":
            S = np.atleast_2d(invwishart.rvs(df=d + 2, scale=np.eye(d), random_state=rng))
            L = np.linalg.cholesky(S)
        else:
            L = np.diag(rng.uniform(0.5, 1.5, d))
        chols.append(L)
        X[start:start + m] = means[j] + rng.normal(size=(m, d)) @ L.T
        start += m
    perm = rng.permutation(n)
    X, y = X[perm], y[perm]
    logp = np.empty((n, k))
    for j, L in enumerate(chols):
        if cov == "full":
            r = np.linalg.solve(L, (X - means[j]).T).T
        else:
            r = (X - means[j]) / np.diag(L)
        logp[:, j] = np.log(w[j] + 1e-300) - np.log(np.diag(L)).sum() - 0.5 * np.einsum("nd,nd->n", r, r)
    if responsibilities:
        p = np.exp(logp - logp.max(1, keepdims=True))
        return X.astype(np.float32), y, logp.argmax(1), p / p.sum(1, keepdims=True)
    return X.astype(np.float32), y, logp.argmax(1)


def nmi(y, labels) -> float:
    """Normalised mutual information (arithmetic mean of the entropies, scikit-learn's
    default) from the contingency table: ``bincount`` only, fast at 10^6 points."""
    _, a = np.unique(y, return_inverse=True)
    _, b = np.unique(np.asarray(labels), return_inverse=True)
    ka, kb = a.max() + 1, b.max() + 1
    if ka == 1 and kb == 1:
        return 1.0
    c = np.bincount(a * kb + b, minlength=ka * kb).reshape(ka, kb).astype(np.float64)
    n = c.sum()
    pa, pb = c.sum(1) / n, c.sum(0) / n
    nz = c > 0
    pij = c[nz] / n
    mi = float(np.sum(pij * (np.log(pij) - np.log(np.outer(pa, pb)[nz]))))
    ha = -float(np.sum(pa[pa > 0] * np.log(pa[pa > 0])))
    hb = -float(np.sum(pb[pb > 0] * np.log(pb[pb > 0])))
    if ha == 0.0 or hb == 0.0:
        return 0.0
    return max(mi, 0.0) / (0.5 * (ha + hb))


def crp_labels(n: int, alpha: float, seed: int) -> np.ndarray:
    """A draw of the Chinese restaurant process CRP(alpha) for ``n`` points (the DP's prior
    partition): point ``i`` opens a cluster with probability ``alpha / (i + alpha)``, else
    joins the cluster of a uniformly chosen earlier point. Host NumPy, O(n)."""
    rng = np.random.default_rng(seed)
    new = rng.random(n) * (np.arange(n) + alpha) < alpha
    pick = (rng.random(n) * np.arange(n)).astype(np.int64)
    labels = np.empty(n, np.int32)
    k = 0
    for i in range(n):
        if new[i]:
            labels[i] = k
            k += 1
        else:
            labels[i] = labels[pick[i]]
    return labels


def subcluster_cost(n: int, C: int, D: int, T: int, family: str) -> dict:
    """Estimated flops and bytes of one SubClusterMCMC iteration (module docstring)."""
    S = T + 5
    if family == "NormalWishart":
        L, G, g = T + 3, 0, 0
        f, s, bx = 2 * (D * D + D + 1) + 8, 1 + D + D * D, 4 * (D + 2 * D * D)
    else:
        L, G, g = 1, T + 2, 3 * D + 2
        f, s, bx = 2 * (2 * D + 1) + 8, 1 + 2 * D, 4 * (D + 2 * D)
    return {
        "likelihood_matrices": L, "gathered_matrices": G, "statistics_passes": S,
        "flops_per_entry": f,
        "flops": float(L * n * C * f + G * n * 2 * g + S * n * s),
        "bytes": float((L + G) * n * bx + 8 * n * (L * C + 2 * G) + S * 4 * n * (s + 1)),
        "formula": "flops = L n C f + 2 G n g + S n s; bytes = (L + G) n b_x + 8 n (L C + 2 G) "
                   "+ 4 S n (s + 1); S = T + 5; NormalWishart L = T + 3, G = 0; NormalGamma "
                   "L = 1, G = T + 2",
    }


# ----------------------------------------------------------------------------- jaxbnp
def _collect(state):
    return {"labels": state.z["z"], "num_clusters": state.num_clusters}


def _make_family(name: str, X: np.ndarray, prior: str):
    import jaxbnp as bnp

    if name == "NormalWishart" and prior == "readme":
        d = X.shape[1]
        return bnp.NormalWishart(m0=np.zeros(d), r=1.0, nu=4.0, psi=np.eye(d))
    return getattr(bnp, name).from_data(X)


def _kernel_factory(method: str):
    import jaxbnp as bnp

    cls = {"subcluster": bnp.SubClusterMCMC, "gibbs": bnp.CollapsedGibbs}[method]
    return lambda capacity: cls(bnp.mixture_model, capacity=capacity)


def _init_params(init: str, n: int, measure, seed: int):
    """``None`` (the kernels' default start: one cluster) or a CRP draw as ``init_params``
    (what ``init_strategy="prior"`` draws, but on the host: the kernel's own draw is a
    sequential scan that takes longer than the sampling at 10^5 points)."""
    if init == "one":
        return None
    return {"z": crp_labels(n, float(np.asarray(measure.alpha)), seed)}


def fixed_iterations(method, X, y, measure, family, capacity, iterations, seed, init="one", tag=""):
    """``runner.run`` with the same ``cache_key`` (``tag`` keeps settings of the same shapes
    from sharing programs, so each first call compiles): the first call compiles, then up to
    ``REPEATS`` calls are timed (fewer when they take long) and the median is the time. NMI
    and K of every draw (a trace) and of the last."""
    import jax
    import jax.numpy as jnp

    from jaxbnp.inference.runner import run

    args = (jnp.asarray(X), measure, family)
    out, times = {}, []
    while len(times) < 1 + REPEATS and (len(times) < 2 or sum(times[1:]) < REPEAT_BUDGET_S):
        t0 = time.perf_counter()
        res = run(_kernel_factory(method), jax.random.key(seed), args, num_warmup=0,
                  num_samples=iterations, collect=_collect, capacity=capacity,
                  max_capacity=X.shape[0], cache_key=("bench-subcluster", tag, method, init),
                  init_params=_init_params(init, X.shape[0], measure, seed))
        jax.block_until_ready(res.samples)
        times.append(time.perf_counter() - t0)
    out["time_first_call_s"] = times[0]
    out["timed_calls_s"] = times[1:]
    out["time_second_call_s"] = float(np.median(times[1:]))
    labels = np.asarray(res.samples["labels"])[0]  # (iterations, n)
    trace_nmi = [nmi(y, lab) for lab in labels]
    trace_k = [int(np.unique(lab).size) for lab in labels]
    from sklearn.metrics import normalized_mutual_info_score

    final = float(normalized_mutual_info_score(y, labels[-1]))
    assert abs(final - trace_nmi[-1]) < 1e-6, (final, trace_nmi[-1])
    t = out["time_second_call_s"]
    reached = next((i + 1 for i, v in enumerate(trace_nmi) if v >= TARGET_DPMM_NMI), None)
    out.update(
        time_s=t, compile_s=out["time_first_call_s"] - t, iterations=iterations,
        seconds_per_iteration=t / iterations, capacity=res.capacity, nmi=final,
        clusters=trace_k[-1], trace_nmi=trace_nmi, trace_clusters=trace_k,
        first_iteration_at_target=reached,
        time_to_target_s=None if reached is None else t * reached / iterations, init=init,
    )
    return out


def numpyro_mcmc(X, y, measure, family, capacity, iterations, seed):
    """``numpyro.infer.MCMC(SubClusterMCMC).run`` twice with the same shapes (a new MCMC
    object each time, and the same object again): whether NumPyro reuses the program."""
    import jax
    import jax.numpy as jnp
    from numpyro.infer import MCMC

    import jaxbnp as bnp

    def one(mcmc):
        t0 = time.perf_counter()
        mcmc.run(jax.random.key(seed), jnp.asarray(X), measure, family)
        z = jax.block_until_ready(mcmc.get_samples()["z"])
        return time.perf_counter() - t0, np.asarray(z)[-1]

    mcmc = MCMC(bnp.SubClusterMCMC(bnp.mixture_model, capacity=capacity), num_warmup=0,
                num_samples=iterations, progress_bar=False)
    try:
        t1, _ = one(mcmc)
        t2, last = one(mcmc)
    except Exception as e:  # noqa: BLE001  (a CapacityError raised through XLA's callback)
        return {"status": f"failed: {type(e).__name__}", "time_s": None, "capacity": capacity}
    return {"status": f"first run {t1:.1f} s", "time_first_run_s": t1, "time_s": t2,
            "capacity": capacity, "same_object": True, "nmi": nmi(y, last),
            "clusters": int(np.unique(last).size), "iterations": iterations,
            "note": "second .run of the same MCMC object; the difference to the runner's "
                    "compiled time is NumPyro's tracing and compiling again"}


def run_to_target(method, X, y, measure, family, capacity, target, cap_s, seed, init="one",
                  max_iterations=100_000):
    """Compile one iteration ahead of time, then iterate until the draw's NMI reaches
    ``target`` or the sampling clock passes ``cap_s`` (NMI off the clock)."""
    import jax
    import jax.numpy as jnp

    kernel = _kernel_factory(method)(capacity)
    kernel.host_overflow_check = False
    args = (jnp.asarray(X), measure, family)
    params = _init_params(init, X.shape[0], measure, seed)
    t0 = time.perf_counter()
    start = jax.jit(lambda k, a, p: kernel.init(k, 0, p, a, {}))
    start = start.lower(jax.random.key(seed), args, params).compile()
    state = jax.block_until_ready(start(jax.random.key(seed), args, params))
    step = jax.jit(lambda s, a: kernel.sample(s, a, {})).lower(state, args).compile()
    compile_s = time.perf_counter() - t0
    clock, it = 0.0, 0
    trace = []  # (iteration, seconds, nmi, K)
    status = "cap"
    while it < max_iterations:
        t = time.perf_counter()
        state = jax.block_until_ready(step(state, args))
        clock += time.perf_counter() - t
        it += 1
        labels = np.asarray(state.z["z"])
        v = nmi(y, labels)
        trace.append((it, clock, v, int(np.unique(labels).size)))
        if kernel.overflowed(state):
            status = "capacity overflow"
            break
        if v >= target:
            status = "reached"
            break
        if clock >= cap_s:
            break
    from sklearn.metrics import normalized_mutual_info_score

    final = float(normalized_mutual_info_score(y, labels))
    assert abs(final - trace[-1][2]) < 1e-6, (final, trace[-1][2])
    return {
        "status": status, "time_s": clock, "compile_s": compile_s, "iterations": it,
        "seconds_per_iteration": clock / it, "capacity": capacity, "nmi": final,
        "clusters": trace[-1][3], "time_to_target_s": clock if status == "reached" else None,
        "init": init,
        "trace": [{"iteration": a, "seconds": b, "nmi": c, "clusters": d} for a, b, c, d in trace],
    }


def run_mapdp(X, y, cap_s, seed):
    """``MAPDP()`` fitted twice: the first fit compiles, the second is timed ("cap" when it
    took longer than ``cap_s``; a fit cannot be stopped)."""
    from jaxbnp.estimators import MAPDP, SingleClusterWarning

    est = MAPDP(random_state=seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SingleClusterWarning)
        t0 = time.perf_counter()
        est.fit(X)
        first = time.perf_counter() - t0
        t0 = time.perf_counter()
        est.fit(X)
        t = time.perf_counter() - t0
    return {"status": "cap" if t > cap_s else "done", "time_first_fit_s": first, "time_s": t,
            "compile_s": first - t, "iterations": int(est.n_iter_), "clusters": int(est.n_clusters_),
            "nmi": nmi(y, est.labels_)}


# ----------------------------------------------------------------------------- scikit-learn
def _bgm_worker(X, y, n_components, covariance_type, queue):
    import sklearn.mixture  # noqa: F401  (imported before "started": the cap times the fit only)

    queue.put("started")
    queue.put({"status": "done", **fit_bgm(X, y, n_components, covariance_type)})


def run_bgm(X, y, n_components, covariance_type, cap_s):
    """scikit-learn's fit in a child process (spawned), killed at ``cap_s`` seconds."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_bgm_worker, args=(X, y, n_components, covariance_type, queue))
    proc.start()
    queue.get(timeout=300.0)  # the child has started and imported scikit-learn
    t0 = time.perf_counter()
    try:
        res = queue.get(timeout=cap_s + 1.0)
    except queue_module.Empty:  # still fitting at the cap
        res = None
    wall = time.perf_counter() - t0
    if res is None or res["time_s"] > cap_s:
        if proc.is_alive():
            proc.terminate()
        proc.join()
        return {"status": "cap", "time_s": None, "wall_s": wall, "cap_s": cap_s,
                "n_components": n_components, "covariance_type": covariance_type,
                **({} if res is None else {"finished_after_cap_s": res["time_s"]})}
    proc.join()
    res.update(n_components=n_components, covariance_type=covariance_type)
    return res


_DPGMM_CHILD = r"""
import json, os, sys, time
os.environ.setdefault("WANDB_MODE", "disabled")
import numpy as np, torch
if not hasattr(torch, "cholesky"):  # removed from recent torch; dpgmm may still call it
    torch.cholesky = torch.linalg.cholesky
from dpgmm.samplers import DiagCovarianceCollapsedGibbsSampler, FullCovarianceCollapsedGibbsSampler
X = torch.as_tensor(np.load(sys.argv[1]), dtype=torch.float32)
cov, iterations, max_clusters, cap = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
cls = FullCovarianceCollapsedGibbsSampler if cov == "full" else DiagCovarianceCollapsedGibbsSampler
torch.manual_seed(0)

def fit(m):
    s = cls(init_strategy="init_data_stats", max_clusters_num=max_clusters, batch_size=1, verbose=False)
    t0 = time.perf_counter()
    res = s.fit(iterations_num=m, data=X)
    return time.perf_counter() - t0, s.get_examples_assignment(res["cluster_assignment"])

probe, labels = fit(1)  # start-up and one sweep: how many sweeps fit in the cap
m = min(iterations, max(1, int(cap / probe)))
t = probe
if m > 1:
    t, labels = fit(m)
print("JSON" + json.dumps(dict(probe_s=probe, iterations=m, time_s=t, labels=list(map(int, labels)))))
"""


def dpgmm_python() -> str:
    """The interpreter that has ``dpgmm`` (and PyTorch): ``$DPGMM_PYTHON``, else this one."""
    return os.environ.get("DPGMM_PYTHON") or sys.executable


def dpgmm_status() -> dict:
    py = dpgmm_python()
    code = "import dpgmm, torch, importlib.metadata as m; print(m.version('dpgmm'), torch.__version__)"
    try:
        out = subprocess.run([py, "-c", code], capture_output=True, text=True, timeout=300, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        return {"status": "not installed", "error": f"{type(e).__name__}: {e}"}
    if out.returncode != 0:
        return {"status": "not installed", "error": out.stderr.strip().splitlines()[-1:]}
    version, torch_version = out.stdout.split()
    return {"status": "installed", "version": version, "torch": torch_version, "python": py}


def run_dpgmm(X, y, covariance_type, max_clusters, iterations, cap_s) -> dict:
    """dpgmm's collapsed Gibbs sampler (PyTorch, CPU, one point per step: ``batch_size=1``,
    ``init_strategy="init_data_stats"``, its Gamma(1, 1) prior on alpha) in a child process
    (``$DPGMM_PYTHON``): a one-sweep probe, then ``iterations`` sweeps or as many as the
    probe says fit in ``cap_s`` (killed at ``2 cap_s + 60`` s). NMI of the final assignment."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "X.npy")
        np.save(path, X)
        try:
            out = subprocess.run(
                [dpgmm_python(), "-c", _DPGMM_CHILD, path, covariance_type, str(iterations),
                 str(max_clusters), str(cap_s)],
                capture_output=True, text=True, timeout=2 * cap_s + 60, check=False)
        except subprocess.TimeoutExpired:  # the one-sweep probe alone ran past the cap
            return {"status": "cap (not one sweep)", "time_s": None, "cap_s": cap_s}
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("JSON")]
    if out.returncode != 0 or not lines:
        return {"status": "failed", "time_s": None, "error": out.stderr.strip()[-500:]}
    r = json.loads(lines[-1][4:])
    labels = np.asarray(r.pop("labels"))
    status = "done" if r["iterations"] == iterations else f"sweeps in the cap: {r['iterations']}"
    return {"status": status, **r, "clusters": int(np.unique(labels).size), "nmi": nmi(y, labels),
            "seconds_per_sweep": r["time_s"] / r["iterations"]}


# ----------------------------------------------------------------------------- report
def _t(v, spec=".2f"):
    return "-" if v is None else format(v, spec)


def _ratio(bgm, t):
    if t is None or t <= 0:
        return "-"
    if bgm.get("status") == "cap":
        return f"> {bgm['cap_s'] / t:.1f}x"
    return f"{bgm['time_s'] / t:.1f}x"


def write_markdown(res, path):
    m = res["machine"]
    git = m.get("jaxbnp_git") or {}
    lines = [
        "# SubClusterMCMC vs collapsed Gibbs, MAP-DP and scikit-learn's BayesianGaussianMixture",
        "",
        f"Command: `{res['command']}` (mode: {res['mode']}). Run {res['date']}. Device: "
        f"{m['jax_devices'][0]} ({m['cpu_model']}); {m['cpu_count']} CPUs; dtype {m['dtype']}; "
        f"jax {m['jax']}, scikit-learn {res['sklearn']}; jaxbnp at {str(git.get('commit'))[:7]}"
        f"{' (modified)' if git.get('jaxbnp_modified') else ''}. CPU seconds used by other "
        f"processes during the run: {_t(res.get('other_cpu_s'), '.0f')} of "
        f"{res['wall_s']:.0f} s wall (timings are only clean when that is near zero).",
        "",
        "Times exclude compilation; compile = the first call's extra time (compilation, and "
        "the runs discarded when a capacity ran out: the runner then doubles it; \"reused\": "
        "programs of the same shapes compiled for an earlier setting). Speed-up = BGM's time / the method's "
        "time, this run. `SubClusterMCMC`: default `num_launch_sweeps` (3), started from one "
        "cluster; Gibbs: the same capacity, started from a prior draw (from one cluster under "
        "DP(100)). MAP-DP: `MAPDP()` defaults, second fit. "
        "BGM: `weight_concentration_prior_type=\"dirichlet_process\"`, 2 K components, "
        "`max_iter=100` (default), child process killed at the cap. dpgmm (PyTorch): "
        f"{res['dpgmm']['status']}" + (f" ({res['dpgmm']['version']}, torch {res['dpgmm']['torch']}): "
        "its collapsed Gibbs sampler, one point per step, 2 K initial clusters from the data, its "
        "Gamma(1, 1) prior on alpha; sweeps = iterations, or as many as fit in the cap after a "
        "one-sweep probe" if res['dpgmm']['status'] == "installed" else "") + ".",
    ]
    for name, s in res["settings"].items():
        cfg = s["config"]
        lines += ["", f"## {name}: {cfg['n']:,} x {cfg['d']}, {cfg['k']} Gaussians ({cfg['cov']} covariances)", ""]
        lines.append(f"{cfg['clusters_with_points']} of the {cfg['k']} components drew points; the Bayes "
                     f"classifier with the true parameters has NMI {cfg['oracle_nmi']:.3f}. "
                     f"Family {cfg['family']} ({cfg['prior']}), DP({cfg['alpha']:g}); starting capacity "
                     f"{cfg['capacity']}; BGM covariance `{cfg['bgm_covariance']}`, "
                     f"{cfg['bgm_components']} components. " + cfg["protocol"])
        lines += ["", "| method | time (s) | compile (s) | iterations | capacity | NMI | K | status "
                  "| speed-up vs BGM |", "|---|---|---|---|---|---|---|---|---|"]
        b = s["bgm"]
        for key, label in (("subcluster", "jaxbnp `SubClusterMCMC`"), ("numpyro_mcmc", "NumPyro `MCMC(SubClusterMCMC)`, second run"),
                           ("gibbs", "jaxbnp `CollapsedGibbs`"), ("mapdp", "jaxbnp `MAPDP()`"),
                           ("bgm", "scikit-learn BGM"), ("dpgmm", "PyTorch `dpgmm` (collapsed Gibbs)")):
            r = s.get(key)
            if r is None:
                continue
            if key == "gibbs":
                label = ("jaxbnp `CollapsedGibbs`, from one cluster" if r.get("init") == "one"
                         else "jaxbnp `CollapsedGibbs`, from a prior draw")
            comp = r.get("compile_s")
            comp = "reused" if comp is not None and comp < 0.05 else _t(comp, ".1f")
            it = r.get("iterations")
            status = r.get("status", "done")
            if key in ("subcluster", "gibbs") and cfg["iterations"] is not None:
                first = r.get("first_iteration_at_target")
                status = (f"NMI < {TARGET_DPMM_NMI} at every iteration" if first is None
                          else f"first NMI >= {TARGET_DPMM_NMI} at iteration {first}")
            if key == "bgm" and status == "done":
                status = "converged" if r.get("converged") else "not converged"
            if key == "dpgmm" and r.get("seconds_per_sweep") is not None:
                status = f"{status}; {r['seconds_per_sweep']:.1f} s per sweep"
            lines.append(
                f"| {label} | {_t(r.get('time_s'))} | {comp} | {_t(it, 'd')} | "
                f"{_t(r.get('capacity'), 'd')} | "
                f"{_t(r.get('nmi'), '.3f')} | {_t(r.get('clusters'), 'd')} | {status} | "
                f"{'' if key == 'bgm' or (key == 'dpgmm' and r.get('status') != 'done') else _ratio(b, r.get('time_s'))} |")
        if "dpgmm" not in s:
            lines.append(f"| PyTorch `dpgmm` | - | - | - | - | - | - | {res['dpgmm']['status']} | |")
        sc = s["subcluster"]
        c = s["subcluster_cost"]
        per = sc["seconds_per_iteration"]
        lines += ["", f"SubClusterMCMC cost per iteration (estimate, formula in the script; "
                  f"n = {cfg['n']:,}, C = {sc['capacity']}, D = {cfg['d']}, T = 3): "
                  f"{c['likelihood_matrices']} (n, C) and {c['gathered_matrices']} (n, 2) "
                  f"likelihood matrices, "
                  f"{c['flops'] / 1e9:.3g} GFLOP and {c['bytes'] / 1e9:.3g} GB; measured "
                  f"{per * 1e3:.1f} ms per iteration: {c['flops'] / per / 1e9:.1f} GFLOP/s, "
                  f"{c['bytes'] / per / 1e9:.1f} GB/s achieved."]
        if cfg["iterations"] is not None:
            tr = sc["trace_nmi"]
            pts = [i for i in (1, 2, 5, 10, 20, 50, 100, 200) if i <= len(tr)]
            lines += ["", "SubClusterMCMC NMI (K) by iteration: " + ", ".join(
                f"{i}: {tr[i - 1]:.3f} ({sc['trace_clusters'][i - 1]})" for i in pts) + "."]
            g = s.get("gibbs")
            if g is not None:
                tg = g["trace_nmi"]
                lines += ["", "Collapsed Gibbs NMI (K) by sweep: " + ", ".join(
                    f"{i}: {tg[i - 1]:.3f} ({g['trace_clusters'][i - 1]})" for i in pts) + "."]
            ok_t = sc["time_s"] <= TARGET_DPMM_S
            ok_n = sc["nmi"] >= TARGET_DPMM_NMI
            lines += ["", f"Issue targets: time <= {TARGET_DPMM_S} s: {sc['time_s']:.2f} s, "
                      f"**{'met' if ok_t else 'not met'}**; NMI >= {TARGET_DPMM_NMI}: "
                      f"{sc['nmi']:.3f}, **{'met' if ok_n else 'not met'}**."]
        else:
            for key in ("subcluster", "gibbs"):
                r = s.get(key)
                if r is None:
                    continue
                tr = r["trace"]
                idx = sorted({0, len(tr) - 1} | {i for i in range(len(tr)) if (i + 1) in (2, 5, 10, 20, 50, 100)})
                lines += ["", f"{'SubClusterMCMC' if key == 'subcluster' else 'Collapsed Gibbs'} trace, "
                          "iteration: seconds, NMI (K): " + "; ".join(
                              f"{tr[i]['iteration']}: {tr[i]['seconds']:.1f} s, {tr[i]['nmi']:.3f} ({tr[i]['clusters']})"
                              for i in idx) + "."]
    lines += ["", f"Total wall time of the run: {res['wall_s']:.0f} s."]
    write_lines(path, lines)


# ----------------------------------------------------------------------------- main
def run_setting(name, cfg, args):
    import jaxbnp as bnp

    n = cfg["n_full"] if args.full else cfg["n_quick"]
    X, y, oracle = make_data(n, cfg["d"], cfg["k"], cfg["cov"], cfg["weights"], seed=args.seed)
    family = _make_family(cfg["family"], X, cfg["prior"])
    alpha = cfg["alpha"]
    prior = ("m0 = 0, r = 1, nu = 4, psi = I: the README's niw(1, zeros(2), 4, eye(2))"
             if cfg["prior"] == "readme" else "`from_data`")
    measure = bnp.DP(alpha)
    C = cfg["capacity"]
    bgm_cov = "full" if cfg["family"] == "NormalWishart" else "diag"
    out = {"config": {
        "n": n, "d": cfg["d"], "k": cfg["k"], "cov": cfg["cov"], "family": cfg["family"],
        "prior": prior, "alpha": alpha, "capacity": C, "iterations": cfg["iterations"],
        "clusters_with_points": int(np.unique(y).size), "oracle_nmi": nmi(y, oracle),
        "bgm_covariance": bgm_cov, "bgm_components": 2 * cfg["k"], "cap_s": args.cap,
        "target_nmi": TARGET_DPMM_NMI if cfg["iterations"] else TARGET_NMI,
        "protocol": (f"{cfg['iterations']} iterations from one cluster; median of up to "
                     f"{REPEATS} compiled calls of `runner.run` after the first; NMI of the "
                     "last draw." if cfg["iterations"] else
                     f"Iterations until the draw's NMI >= {TARGET_NMI} or the clock passes "
                     f"{args.cap:g} s (NMI computed off the clock)."),
    }}
    clock0 = cpu_seconds()
    t0 = time.perf_counter()
    print(f"[{name}] n={n} d={cfg['d']} k={cfg['k']} (true K with points: {np.unique(y).size})", flush=True)
    if cfg["iterations"]:
        out["subcluster"] = fixed_iterations("subcluster", X, y, measure, family, C, cfg["iterations"],
                                             args.seed, tag=name)
    else:
        out["subcluster"] = run_to_target("subcluster", X, y, measure, family, C, TARGET_NMI, args.cap, args.seed)
    r = out["subcluster"]
    print(f"[{name}] subcluster {r['time_s']:.2f} s, NMI {r['nmi']:.3f}, K {r['clusters']}", flush=True)
    out["subcluster_cost"] = subcluster_cost(n, r["capacity"], cfg["d"], 3, cfg["family"])
    if name == "dpmm" and not args.no_numpyro:
        # the capacity the runner ended with (it doubles a full one; NumPyro's MCMC raises)
        out["numpyro_mcmc"] = numpyro_mcmc(X, y, measure, family, r["capacity"], cfg["iterations"],
                                           args.seed)
        print(f"[{name}] numpyro MCMC second run {out['numpyro_mcmc']['time_s']:.2f} s", flush=True)
    g_init = cfg["gibbs_init"]
    if cfg["iterations"]:
        out["gibbs"] = fixed_iterations("gibbs", X, y, measure, family, C, cfg["iterations"], args.seed,
                                        g_init, tag=name)
    else:
        out["gibbs"] = run_to_target("gibbs", X, y, measure, family, C, TARGET_NMI, args.cap, args.seed,
                                     g_init)
    print(f"[{name}] gibbs {out['gibbs']['time_s']:.2f} s, NMI {out['gibbs']['nmi']:.3f}", flush=True)
    out["mapdp"] = run_mapdp(X, y, args.cap, args.seed)
    print(f"[{name}] mapdp {out['mapdp']}", flush=True)
    out["bgm"] = run_bgm(X, y, 2 * cfg["k"], bgm_cov, args.cap)
    print(f"[{name}] bgm {out['bgm']}", flush=True)
    if args.dpgmm["status"] == "installed":
        out["dpgmm"] = run_dpgmm(X, y, bgm_cov, 2 * cfg["k"], cfg["iterations"] or 100, args.cap)
        print(f"[{name}] dpgmm {out['dpgmm']}", flush=True)
    other = other_cpu_seconds(clock0, cpu_seconds())
    out["wall_s"] = time.perf_counter() - t0
    out["other_cpu_s"] = other
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="smaller d10/d128 sizes (the default)")
    mode.add_argument("--full", action="store_true", help="the issue's sizes: 10^6 x 10, 10^5 x 128")
    ap.add_argument("--only", nargs="+", choices=list(SETTINGS), help="settings to run")
    ap.add_argument("--cap", type=float, default=None,
                    help=f"time cap per method, seconds (default {DEFAULT_CAP_S:g}; --quick: {QUICK_CAP_S:g})")
    ap.add_argument("--no-numpyro", action="store_true", help="skip the NumPyro MCMC row")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out-name", default=None)
    args = ap.parse_args(argv)
    if args.cap is None:
        args.cap = DEFAULT_CAP_S if args.full else QUICK_CAP_S
    out_name = args.out_name or ("subcluster_full" if args.full else "subcluster")
    args.dpgmm = dpgmm_status()
    import sklearn

    import jaxbnp

    # MAPDP turns JAX's persistent compilation cache on (jaxbnp._cache.auto_enable): off, so
    # that every first call compiles and the compile column does not depend on earlier runs
    jaxbnp.enable_compilation_cache(False)

    res = {
        "command": "python benchmarks/subcluster.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "mode": "full" if args.full else "quick",
        "date": utc_now(),
        "machine": machine_info(),
        "sklearn": sklearn.__version__,
        "dpgmm": args.dpgmm,
        "settings": {},
    }
    clock0 = cpu_seconds()
    t0 = time.perf_counter()
    for name in args.only or list(SETTINGS):
        res["settings"][name] = run_setting(name, SETTINGS[name], args)
        write_json(RESULTS / f"{out_name}.json", res)  # what is done so far
    res["wall_s"] = time.perf_counter() - t0
    res["other_cpu_s"] = other_cpu_seconds(clock0, cpu_seconds())
    write_json(RESULTS / f"{out_name}.json", res)
    write_markdown(res, RESULTS / f"{out_name}.md")
    print((RESULTS / f"{out_name}.md").read_text())


if __name__ == "__main__":
    main()
