"""Benchmark: collapsed Gibbs sweeps (Neal's algorithm 3) on the tgMCMC data sets.

Measures, for ``data/nrmm/toy`` (1300 x 2) and ``data/nrmm/10k`` (10000 x 6),
with ``DP(1.0)`` and ``NormalWishart.from_data(X)`` (the tgMCMC paper's prior,
docs/mathematics.md §2), in JAX's default float32:

1. jaxbnp, one chain: seconds per ``gibbs_sweep`` (jitted, compile excluded,
   median of several timed sweeps after warm-up sweeps from "all points in one
   cluster").
2. jaxbnp, ``jax.vmap`` over 16 and 64 chains: seconds per sweep of the whole
   batch, and ``t(C chains) / t(1 chain)``.
3. A plain NumPy collapsed Gibbs sweep (float64, written below): the reference
   baseline, same algorithm, per-cluster statistics and cached per-cluster
   Cholesky factors recomputed only for clusters that change. Its predictive
   is checked against ``family.log_predictive`` before timing.
4. Speed-ups: NumPy / jaxbnp one chain; per-chain throughput of 64 chains vs 1.
5. The end-to-end NumPyro path: ``MCMC(CollapsedGibbs(model, capacity=32),
   num_chains=16, chain_method="vectorized")`` on toy; time per iteration from
   the difference of two runs with different ``num_samples``, each less the
   tracing/compile time JAX reports.

Also recorded: whether the capacity-32 chain would overflow if run longer
(the 10k ground truth has 119 clusters), and the 10k sweep time at the
posterior's size (ground-truth start, capacity 128), for jaxbnp and NumPy
(issue #21: at most 50 ms and at least 10x NumPy); the sweep time against K
(synthetic 10,000 x 6 mixtures of K = 20, 60, 120 Gaussians, capacity near K);
8 chains against one through ``jaxbnp.inference.runner.run`` (vectorized, and
one group of chains per core from threads), with their draws checked equal;
CPU time used by other processes during the run (timings are only clean when
that is near zero).

Results go to ``benchmarks/results/gibbs.json`` and ``benchmarks/results/gibbs.md``.

Usage::

    python benchmarks/gibbs.py            # full run (about 4 minutes on 2 idle CPU cores)
    python benchmarks/gibbs.py --quick    # fewer repeats, no 64 chains on 10k
    python benchmarks/gibbs.py --data-dir /path/to/nrmm

Targets from the issue: one sweep over the 10k set under 0.1 s on a 2-core CPU
(the paper's C++ Gibbs: 10.7 s per sweep, different hardware), and 64
vectorised chains costing far less than 64 x one chain. The numbers are
reported as measured.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

import numpy as np

from harness import (  # noqa: E402  (puts the repository root on sys.path)
    cpu_seconds, load_average, machine_info, other_cpu_seconds, summarize, utc_now, write_json, write_lines,
)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpyro  # noqa: E402
from numpyro.infer import MCMC  # noqa: E402

import jaxbnp as bnp  # noqa: E402
from jaxbnp.inference.partition.clusters import init_clusters  # noqa: E402
from jaxbnp.inference.partition.gibbs import gibbs_sweep  # noqa: E402

DEFAULT_DATA_DIR = Path(__file__).resolve().parents[2] / "shared" / "data" / "nrmm"
CAPACITY = 32
ALPHA = 1.0
DATASETS = ("toy", "10k")
PAPER_CPP_SECONDS_PER_SWEEP_10K = 10.7
TARGET_10K_SECONDS = 0.1
#: issue #21: the ground-truth 10k sweep (K = 119) in at most 50 ms, at least 10x NumPy
TARGET_POSTERIOR_SECONDS = 0.05
TARGET_POSTERIOR_SPEEDUP = 10.0


# ----------------------------------------------------------------------------- helpers
def load_dataset(data_dir: Path, name: str) -> np.ndarray:
    path = data_dir / name / "X.txt"
    if not path.is_file():
        sys.exit(
            f"gibbs.py: data file not found: {path}\n"
            f"Expected the tgMCMC data under {data_dir} (subfolders toy/ and 10k/ with X.txt). "
            "Pass --data-dir /path/to/nrmm."
        )
    X = np.loadtxt(path, dtype=np.float64)
    if X.ndim != 2:
        sys.exit(f"gibbs.py: {path} should hold a 2-D whitespace-separated table, got shape {X.shape}.")
    return X


def load_labels(data_dir: Path, name: str) -> np.ndarray | None:
    path = data_dir / name / "gt_labels.txt"
    if not path.is_file():
        return None
    return np.loadtxt(path).astype(np.int64).reshape(-1)


def _num_clusters(state) -> np.ndarray:
    return np.asarray(jnp.sum(state.counts > 0, axis=-1))


# ----------------------------------------------------------------------------- NumPy baseline
class NumpyNormalWishart:
    """Normal-Wishart predictive in float64 NumPy (docs/mathematics.md §2).

    ``dof = nu_n - D + 1``, location ``m_n``, scale ``Psi_n (r_n + 1) / (r_n dof)``.
    Per cluster the parameters are ``(m_n, L^-1, dof, log_norm)`` with ``L`` the
    Cholesky factor of the scale; they depend on the statistics only.
    """

    def __init__(self, m0, r, nu, psi, max_n: int = 0):
        self.m0 = np.asarray(m0, dtype=np.float64)
        self.r = float(r)
        self.nu = float(nu)
        self.psi = np.asarray(psi, dtype=np.float64)
        self.D = self.m0.shape[0]
        self.r_m0 = self.r * self.m0
        self.psi_r_m0m0 = self.psi + self.r * np.outer(self.m0, self.m0)
        self._const = {}  # n -> lgamma((dof+D)/2) - lgamma(dof/2) - D/2 log(dof pi)
        for n in range(max_n + 1):
            self._const_for(n)

    def _const_for(self, n: float) -> float:
        c = self._const.get(n)
        if c is None:
            dof = self.nu + n - self.D + 1.0
            c = (math.lgamma(0.5 * (dof + self.D)) - math.lgamma(0.5 * dof)
                 - 0.5 * self.D * math.log(dof * math.pi))
            self._const[n] = c
        return c

    @classmethod
    def from_family(cls, family, max_n: int = 0) -> "NumpyNormalWishart":
        return cls(np.asarray(family.m0), float(family.r), float(family.nu),
                   np.asarray(family.psi), max_n)

    def params(self, n, sum_x, sum_xx):
        """``(m_n, L^-1, dof, log_norm)`` of the predictive t for one cluster."""
        D = self.D
        rn = self.r + n
        mn = (self.r_m0 + sum_x) / rn
        psin = self.psi_r_m0m0 + sum_xx - rn * (mn[:, None] * mn[None, :])
        dof = self.nu + n - D + 1.0
        coef = (rn + 1.0) / (rn * dof)  # scale = coef * psin
        chol = np.linalg.cholesky(psin)
        inv_chol = np.linalg.inv(chol) * (1.0 / math.sqrt(coef))
        half_logdet = float(np.log(np.diagonal(chol)).sum()) + 0.5 * D * math.log(coef)
        return mn, inv_chol, dof, self._const_for(n) - half_logdet

    def log_pred(self, x, mn, inv_chol, dof, log_norm):
        """``log p(x | X_c)`` for one point ``x`` and stacked clusters ``(K, ...)``."""
        y = np.matmul(inv_chol, (x - mn)[:, :, None])[:, :, 0]
        maha = (y * y).sum(1)
        return log_norm - 0.5 * (dof + self.D) * np.log1p(maha / dof)

    def log_pred_many(self, X, mn, inv_chol, dof, log_norm):
        """``log p(x_i | X_c)`` for many points and one cluster."""
        y = (X - mn) @ inv_chol.T
        maha = np.einsum("nd,nd->n", y, y)
        return log_norm - 0.5 * (dof + self.D) * np.log1p(maha / dof)


class NumpyCollapsedGibbs:
    """Neal's algorithm 3 for a DP(alpha) mixture, plain NumPy, one chain.

    Per slot: count (and its log), sum x, sum x x^T and the cached predictive
    parameters (mean, inverse Cholesky factor of the t scale, dof, log
    normaliser). A point's removal refreshes its old cluster; its addition
    refreshes the new one; if it returns to the cluster it left, the cached
    parameters from before the removal are put back (no Cholesky). Empty slots
    keep stale parameters but get log count -inf. A new cluster takes the
    first empty slot. Sampling: inverse CDF on the exponentiated log weights.
    """

    def __init__(self, model: NumpyNormalWishart, X: np.ndarray, labels: np.ndarray,
                 alpha: float, seed: int):
        X = np.ascontiguousarray(X, dtype=np.float64)
        n, D = X.shape
        self.model = model
        self.X = X
        self.XX = X[:, :, None] * X[:, None, :]
        self.log_alpha = math.log(alpha)
        self.rng = np.random.default_rng(seed)
        _, labels = np.unique(np.asarray(labels), return_inverse=True)
        self.labels = labels.astype(np.int64)
        slots = n + 1  # never needs to grow
        self.counts = np.zeros(slots, np.int64)
        self.sum_x = np.zeros((slots, D))
        self.sum_xx = np.zeros((slots, D, D))
        self.mn = np.zeros((slots, D))
        self.inv_chol = np.broadcast_to(np.eye(D), (slots, D, D)).copy()
        self.dof = np.ones(slots)
        self.log_norm = np.zeros(slots)
        self.logits = np.empty(slots + 1)
        np.add.at(self.counts, self.labels, 1)
        np.add.at(self.sum_x, self.labels, X)
        np.add.at(self.sum_xx, self.labels, self.XX)
        with np.errstate(divide="ignore"):
            self.log_counts = np.log(self.counts.astype(np.float64))  # -inf when empty
        self.high = int(self.labels.max()) + 1  # slots [0, high) may be in use
        for c in range(self.high):
            if self.counts[c] > 0:
                self._refresh(c)
        prior = model.params(0, np.zeros(D), np.zeros((D, D)))
        self.prior_log_pred = model.log_pred_many(X, *prior)

    def _refresh(self, c: int) -> None:
        mn, inv_chol, dof, log_norm = self.model.params(
            int(self.counts[c]), self.sum_x[c], self.sum_xx[c]
        )
        self.mn[c] = mn
        self.inv_chol[c] = inv_chol
        self.dof[c] = dof
        self.log_norm[c] = log_norm

    def sweep(self) -> None:
        X, XX, labels, counts = self.X, self.XX, self.labels, self.counts
        log_counts = self.log_counts
        sum_x, sum_xx = self.sum_x, self.sum_xx
        mn, inv_chol, dof, log_norm = self.mn, self.inv_chol, self.dof, self.log_norm
        log_pred = self.model.log_pred
        buf = self.logits
        prior_logits = self.log_alpha + self.prior_log_pred
        uniforms = self.rng.random(X.shape[0])
        log = math.log
        for i in range(X.shape[0]):
            x = X[i]
            old = int(labels[i])
            # remove point i from its cluster
            counts[old] -= 1
            c_old = int(counts[old])
            log_counts[old] = log(c_old) if c_old else -math.inf
            sum_x[old] -= x
            sum_xx[old] -= XX[i]
            saved = (mn[old].copy(), inv_chol[old].copy(), dof[old], log_norm[old])
            if c_old:
                self._refresh(old)
            # log n_c + log p(x | X_c) for existing clusters, log alpha + log p(x) for a new one
            h = self.high
            buf[:h] = log_counts[:h] + log_pred(x, mn[:h], inv_chol[:h], dof[:h], log_norm[:h])
            buf[h] = prior_logits[i]
            logits = buf[: h + 1]
            cw = np.cumsum(np.exp(logits - logits.max()))
            k = int(np.searchsorted(cw, uniforms[i] * cw[-1], side="right"))
            if k >= h:  # new cluster: first empty slot
                empty = np.flatnonzero(counts[:h] == 0)
                if empty.size:
                    new = int(empty[0])
                else:
                    new = h
                    self.high = h + 1
            else:
                new = k
            # add point i to its new cluster
            counts[new] += 1
            log_counts[new] = log(int(counts[new]))
            sum_x[new] += x
            sum_xx[new] += XX[i]
            if new == old:
                mn[old], inv_chol[old], dof[old], log_norm[old] = saved
            else:
                self._refresh(new)
            labels[i] = new

    @property
    def num_clusters(self) -> int:
        return int(np.sum(self.counts > 0))

    def check_statistics(self) -> float:
        """Max abs difference between the running statistics and a recount from the labels."""
        counts = np.bincount(self.labels, minlength=self.counts.shape[0])
        sx = np.zeros_like(self.sum_x)
        np.add.at(sx, self.labels, self.X)
        sxx = np.zeros_like(self.sum_xx)
        np.add.at(sxx, self.labels, self.XX)
        assert np.array_equal(counts, self.counts), "NumPy baseline: counts out of sync"
        return float(max(np.abs(sx - self.sum_x).max(), np.abs(sxx - self.sum_xx).max()))


def validate_numpy_predictive(family, X: np.ndarray) -> dict:
    """Check the NumPy predictive against ``family.log_predictive`` (library, float32)."""
    Xt = X[:12]
    labels = np.array([0, 0, 0, 0, 1, 1, 1, 2, 2, 2, 2, 0])
    capacity = 4  # slot 3 stays empty: the prior predictive
    stats = family.stats_from_labels(jnp.asarray(Xt, jnp.float32), jnp.asarray(labels), capacity)
    lib = np.stack([np.asarray(family.log_predictive(jnp.asarray(x, jnp.float32), stats)) for x in Xt])
    lib_prior = np.array([float(family.prior_log_predictive(jnp.asarray(x, jnp.float32))) for x in Xt])
    model = NumpyNormalWishart.from_family(family)
    ours = np.zeros((Xt.shape[0], capacity))
    for c in range(capacity):
        members = Xt[labels == c]
        params = model.params(
            int(members.shape[0]), members.sum(0), members.T @ members,
        )
        stacked = tuple(np.asarray(p)[None] for p in params)
        for i, x in enumerate(Xt):
            ours[i, c] = model.log_pred(x, *stacked)[0]
    np.testing.assert_allclose(ours, lib, rtol=1e-4, atol=1e-4,
                               err_msg="NumPy predictive != family.log_predictive")
    np.testing.assert_allclose(ours[:, 3], lib_prior, rtol=1e-4, atol=1e-4,
                               err_msg="NumPy prior predictive != family.prior_log_predictive")
    return {
        "points": int(Xt.shape[0]),
        "clusters_checked": capacity,
        "max_abs_diff": float(np.abs(ours - lib).max()),
        "max_abs_diff_prior": float(np.abs(ours[:, 3] - lib_prior).max()),
        "tolerance": "rtol=1e-4, atol=1e-4 (library float32 vs NumPy float64)",
        "passed": True,
    }


# ----------------------------------------------------------------------------- jaxbnp
def jax_state_check(state, family, X32, capacity: int = CAPACITY) -> dict:
    """Compare running float32 statistics with a fresh recount from the labels."""
    fresh = family.stats_from_labels(X32, state.labels, capacity)
    counts_ok = bool(
        np.array_equal(
            np.asarray(state.counts),
            np.asarray(jax.ops.segment_sum(jnp.ones_like(state.labels), state.labels, capacity)),
        )
    )
    diff = np.abs(np.asarray(state.stats.sum_xx) - np.asarray(fresh.sum_xx)).max()
    scale = np.abs(np.asarray(fresh.sum_xx)).max()
    return {
        "counts_consistent": counts_ok,
        "sum_xx_max_abs_drift": float(diff),
        "sum_xx_max_abs": float(scale),
        "overflow": bool(np.asarray(state.overflow)),
    }


def bench_single(X32, family, measure, key, warmup: int, repeats: int, capacity: int = CAPACITY,
                 labels=None, extra_sweeps: int = 0) -> tuple[dict, object]:
    """One chain. ``labels=None`` starts from one cluster. After timing, up to
    ``extra_sweeps`` more (untimed) sweeps record whether and when the chain
    would need more than ``capacity`` slots."""
    sweep = jax.jit(lambda k, s, X: gibbs_sweep(k, s, X, measure, family))
    if labels is None:
        labels = np.zeros(X32.shape[0], np.int64)
    state = init_clusters(family, X32, labels, capacity)
    keys = jax.random.split(key, 1 + warmup + repeats + extra_sweeps)
    t0 = time.perf_counter()
    state = jax.block_until_ready(sweep(keys[0], state, X32))
    first = time.perf_counter() - t0
    for j in range(warmup - 1):
        state = jax.block_until_ready(sweep(keys[1 + j], state, X32))
    k_warm = int(_num_clusters(state))
    times = []
    for j in range(repeats):
        k = keys[warmup + j]
        t0 = time.perf_counter()
        state = jax.block_until_ready(sweep(k, state, X32))
        times.append(time.perf_counter() - t0)
    out = summarize(times)
    out.update(
        capacity=capacity,
        num_clusters_start=int(np.unique(np.asarray(labels)).size),
        first_call_s=first,
        warmup_sweeps=warmup,
        num_clusters_after_warmup=k_warm,
        num_clusters_end=int(_num_clusters(state)),
        state_check=jax_state_check(state, family, X32, capacity),
    )
    if extra_sweeps:
        done = warmup + repeats
        extra, overflow_at = state, None
        for j in range(extra_sweeps):
            extra = sweep(keys[done + j], extra, X32)
            if bool(np.asarray(extra.overflow)):
                overflow_at = done + j + 1
                break
        out["overflow_check"] = {
            "max_sweeps": done + extra_sweeps,
            "overflow_at_sweep": overflow_at,
            "num_clusters_last": int(_num_clusters(extra)),
        }
    return out, state


def bench_vmap(X32, family, measure, key, chains: int, warmup: int, repeats: int) -> dict:
    sweep = jax.jit(
        jax.vmap(lambda k, s, X: gibbs_sweep(k, s, X, measure, family), in_axes=(0, 0, None))
    )
    one = init_clusters(family, X32, np.zeros(X32.shape[0], np.int64), CAPACITY)
    states = jax.tree.map(lambda a: jnp.stack([a] * chains), one)
    keys = jax.random.split(key, (1 + warmup + repeats, chains))
    t0 = time.perf_counter()
    states = jax.block_until_ready(sweep(keys[0], states, X32))
    first = time.perf_counter() - t0
    for j in range(warmup - 1):
        states = jax.block_until_ready(sweep(keys[1 + j], states, X32))
    k_warm = _num_clusters(states)
    times = []
    for j in range(repeats):
        k = keys[warmup + j]
        t0 = time.perf_counter()
        states = jax.block_until_ready(sweep(k, states, X32))
        times.append(time.perf_counter() - t0)
    k_end = _num_clusters(states)
    out = summarize(times)
    out.update(
        chains=chains,
        first_call_s=first,
        warmup_sweeps=warmup,
        num_clusters_after_warmup={"mean": float(k_warm.mean()), "min": int(k_warm.min()),
                                   "max": int(k_warm.max())},
        num_clusters_end={"mean": float(k_end.mean()), "min": int(k_end.min()),
                          "max": int(k_end.max())},
        any_overflow=bool(np.asarray(states.overflow).any()),
    )
    return out


def bench_numpy(X, family, labels, seed: int, max_repeats: int, budget_s: float) -> dict:
    model = NumpyNormalWishart.from_family(family, max_n=X.shape[0])
    sampler = NumpyCollapsedGibbs(model, X, labels, ALPHA, seed)
    k_start = sampler.num_clusters
    times = []
    while len(times) < max_repeats:
        t0 = time.perf_counter()
        sampler.sweep()
        times.append(time.perf_counter() - t0)
        if sum(times) > budget_s:
            break
    drift = sampler.check_statistics()
    out = summarize(times)
    out.update(
        start="labels of the jaxbnp single chain after its warm-up sweeps",
        num_clusters_start=k_start,
        num_clusters_end=sampler.num_clusters,
        stats_max_abs_drift_float64=drift,
    )
    return out


def synthetic_mixture(n: int, d: int, k: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` points from ``k`` unit-variance Gaussians in ``d`` dimensions whose centres are
    at least 8 apart (drawn in a box, redrawn when too close); labels in order."""
    rng = np.random.default_rng(seed)
    centres = []
    while len(centres) < k:
        c = rng.uniform(-4 * k ** (1 / d) * 2, 4 * k ** (1 / d) * 2, size=d)
        if all(np.linalg.norm(c - o) >= 8.0 for o in centres):
            centres.append(c)
    y = rng.integers(0, k, size=n)
    return (np.asarray(centres)[y] + rng.normal(size=(n, d))).astype(np.float64), y


def bench_chains(X, family, labels, cfg: dict, seed: int) -> dict:
    """``jaxbnp.inference.runner.run`` of ``CollapsedGibbs`` from the ground truth: seconds per
    iteration of ``num_chains`` chains for each chain method (the difference of compiled runs
    of ``its`` and ``2 its`` iterations, divided by ``its``), with the draws of every method
    checked equal."""
    from jaxbnp.inference.runner import resolve_chain_method, run

    def model(X):
        z = numpyro.sample("z", bnp.Partition(bnp.DP(ALPHA), X.shape[0]))
        numpyro.sample("X", bnp.ConjugateMixture(family, z), obs=X)

    def collect(state):
        return {"num_clusters": jnp.sum(state.clusters.counts > 0, -1)}

    Xj = jnp.asarray(X, jnp.float32)
    its = cfg["iterations"]
    out = {"iterations": its, "runs": {}}
    for chains in cfg["num_chains"]:
        methods = ["vectorized"] if chains == 1 else ["vectorized", "threads"]
        ref = None
        for method in methods:
            init = {"z": jnp.asarray(np.tile(labels, (chains, 1)) if chains > 1 else labels)}
            make = lambda capacity: bnp.CollapsedGibbs(model, capacity=capacity)  # noqa: E731

            def timed(samples):
                kw = dict(num_warmup=0, num_samples=samples, num_chains=chains, collect=collect,
                          init_params=init, capacity=128, chain_method=method,
                          cache_key=("bench-gibbs", chains, method))
                t0 = time.perf_counter()
                r = run(make, jax.random.key(seed), (Xj,), **kw)
                return r, time.perf_counter() - t0

            _, first = timed(its)  # compiles
            _, short = timed(its)
            timed(2 * its)  # compiles (the number of draws is part of the program)
            r, long = timed(2 * its)
            # the difference of two run lengths: start-up (validation, init, transfers) cancels
            wall = long - short
            k = np.asarray(r.samples["num_clusters"])[:, :its]
            if ref is None:
                ref = k
            out["runs"][f"{chains}/{method}"] = {
                "num_chains": chains, "method": resolve_chain_method(method, chains),
                "first_run_s": first, "seconds_per_iteration": wall / its,
                "same_draws_as_vectorized": bool(np.array_equal(k, ref)),
                "final_k_mean": float(k[:, -1].mean()),
            }
            print(f"[10k chains] {chains} chain(s), {method}: {wall / its * 1e3:.1f} ms/iteration "
                  f"(first run with compilation {first:.1f} s)", flush=True)
    one = out["runs"]["1/vectorized"]["seconds_per_iteration"]
    for v in out["runs"].values():
        v["ratio_vs_one_chain"] = v["seconds_per_iteration"] / one
        v["per_chain_throughput_vs_one"] = v["num_chains"] * one / v["seconds_per_iteration"]
    return out


class CompileTimer:
    """Sums JAX's tracing, lowering and XLA compile durations (``jax.monitoring`` events)."""

    def __init__(self):
        self.total = 0.0
        jax.monitoring.register_event_duration_secs_listener(self._listen)

    def _listen(self, event, duration, **kwargs):
        if event.startswith("/jax/core/compile/"):
            self.total += duration


COMPILE_TIMER: CompileTimer | None = None


def bench_numpyro(X32, family, warmup: int, samples: tuple[int, int], chains: int, seed: int) -> dict:
    def model(X):
        z = numpyro.sample("z", bnp.Partition(bnp.DP(ALPHA), X.shape[0]))
        numpyro.sample("X", bnp.ConjugateMixture(family, z), obs=X)

    runs = []
    kernel = bnp.CollapsedGibbs(model, capacity=CAPACITY)
    batching = getattr(kernel, "_chain_batching", None)
    for num_samples in samples:
        mcmc = MCMC(
            bnp.CollapsedGibbs(model, capacity=CAPACITY),
            num_warmup=warmup,
            num_samples=num_samples,
            num_chains=chains,
            chain_method="vectorized",
            progress_bar=False,
        )
        c0 = COMPILE_TIMER.total
        t0 = time.perf_counter()
        mcmc.run(jax.random.PRNGKey(seed), X32, extra_fields=("num_clusters",))
        jax.block_until_ready(mcmc.get_samples())
        wall = time.perf_counter() - t0
        compile_s = COMPILE_TIMER.total - c0
        k = np.asarray(mcmc.get_extra_fields(group_by_chain=True)["num_clusters"])[:, -1]
        runs.append({
            "num_warmup": warmup, "num_samples": num_samples, "wall_s": wall,
            "trace_lower_compile_s": compile_s, "wall_minus_compile_s": wall - compile_s,
            "num_clusters_last": {"mean": float(k.mean()), "min": int(k.min()), "max": int(k.max())},
        })
    d_iter = samples[1] - samples[0]
    per_iter = (runs[1]["wall_minus_compile_s"] - runs[0]["wall_minus_compile_s"]) / d_iter
    return {
        "chains": chains,
        "chain_method": "vectorized",
        "kernel_chain_batching": batching,
        "capacity": CAPACITY,
        "runs": runs,
        "seconds_per_iteration": per_iter,
        "seconds_per_iteration_raw_difference": (runs[1]["wall_s"] - runs[0]["wall_s"]) / d_iter,
        "seconds_per_iteration_long_run": runs[1]["wall_minus_compile_s"] / (warmup + samples[1]),
        "method": (
            "each run's wall time minus the tracing/lowering/XLA-compile time JAX reports "
            "(jax.monitoring '/jax/core/compile/*' events); seconds_per_iteration = difference of "
            f"those between num_samples={samples[1]} and num_samples={samples[0]}, divided by "
            f"{d_iter} (cancels the fixed per-run cost as well). Also given: the plain wall-time "
            "difference (compile-time noise included) and the long run's corrected time per "
            "iteration (fixed per-run costs included)."
        ),
    }


# ----------------------------------------------------------------------------- report
def fmt_s(x: float | None) -> str:
    if x is None:
        return "n/a"
    if x < 0:
        return "-" + fmt_s(-x)
    if x >= 1.0:
        return f"{x:.2f} s"
    if x >= 1e-3:
        return f"{x * 1e3:.1f} ms"
    return f"{x * 1e6:.0f} µs"


def fmt_x(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1f}×"


def make_markdown(res: dict) -> str:
    m = res["machine"]
    ds = res["datasets"]
    names = [n for n in DATASETS if n in ds]

    def cell(name, path, fmt):
        node = ds[name]
        for p in path:
            if node is None or p not in node:
                return "skipped"
            node = node[p]
        return fmt(node)

    header = "| | " + " | ".join(f"{n} ({ds[n]['n']}×{ds[n]['D']})" for n in names) + " |"
    sep = "|---|" + "---|" * len(names)
    rows = [
        ("clusters K, 1 chain (after warm-up → end)",
         lambda n: f"{ds[n]['jax_single']['num_clusters_after_warmup']} → "
                   f"{ds[n]['jax_single']['num_clusters_end']}"),
        ("NumPy collapsed Gibbs (float64), s/sweep",
         lambda n: cell(n, ["numpy", "median_s"], fmt_s)
         + f" (n={ds[n]['numpy']['repeats']})"),
        ("jaxbnp `gibbs_sweep`, 1 chain, s/sweep (min–max)",
         lambda n: cell(n, ["jax_single", "median_s"], fmt_s)
         + f" ({fmt_s(ds[n]['jax_single']['min_s'])}–{fmt_s(ds[n]['jax_single']['max_s'])}, "
           f"n={ds[n]['jax_single']['repeats']})"),
        ("**speed-up NumPy / jaxbnp 1 chain**", lambda n: fmt_x(ds[n]["speedup_numpy_over_jax"])),
        ("jaxbnp vmap 16 chains, s/sweep (whole batch)",
         lambda n: cell(n, ["jax_vmap", "16", "median_s"], fmt_s)),
        ("t(16 chains) / t(1 chain)", lambda n: cell(n, ["ratio_vs_single", "16"], lambda v: f"{v:.1f}")),
        ("jaxbnp vmap 64 chains, s/sweep (whole batch)",
         lambda n: cell(n, ["jax_vmap", "64", "median_s"], fmt_s)),
        ("t(64 chains) / t(1 chain)", lambda n: cell(n, ["ratio_vs_single", "64"], lambda v: f"{v:.1f}")),
        ("**per-chain throughput, 64 vmapped vs 1** (64·t1/t64)",
         lambda n: cell(n, ["throughput_64_vs_1"], fmt_x)),
        ("compile + first sweep, 1 chain", lambda n: cell(n, ["jax_single", "first_call_s"], fmt_s)),
        ("1 chain, capacity 32: first sweep needing > 32 clusters (CapacityError)",
         lambda n: cell(n, ["jax_single", "overflow_check"],
                        lambda v: (f"sweep {v['overflow_at_sweep']}" if v["overflow_at_sweep"]
                                   else f"none in {v['max_sweeps']} sweeps (K={v['num_clusters_last']})"))),
        ("jaxbnp vmap 8 chains, s/sweep (whole batch); t(8)/t(1)",
         lambda n: cell(n, ["jax_vmap", "8", "median_s"], fmt_s)
         + "; " + cell(n, ["ratio_vs_single", "8"], lambda v: f"{v:.1f}")),
        ("1 chain at the posterior's size: ground-truth start, capacity 128, s/sweep (K)",
         lambda n: cell(n, ["jax_single_posterior_k"],
                        lambda v: f"{fmt_s(v['median_s'])} (K={v['num_clusters_end']}, n={v['repeats']})")),
        ("NumPy from that state, s/sweep; speed-up",
         lambda n: cell(n, ["numpy_posterior_k"],
                        lambda v: f"{fmt_s(v['median_s'])} (n={v['repeats']}); "
                                  f"{fmt_x(ds[n]['speedup_numpy_over_jax_posterior_k'])}")),
    ]
    lines = [
        "# Collapsed Gibbs sweep benchmark (DP(1), NormalWishart.from_data)",
        "",
        f"Machine: {m['cpu_model']} ({m['cpu_count']} CPUs, affinity {m['cpu_affinity']}), "
        f"{m['platform']}; JAX {m['jax']} on {m['jax_backend']}, dtype {m['dtype']} "
        f"(x64 {'on' if m['jax_enable_x64'] else 'off'}); NumPy baseline float64. "
        f"Capacity {CAPACITY}. Mode: {'quick' if res['config']['quick'] else 'default'}. "
        + (f"jaxbnp at {m['jaxbnp_git']['commit'][:7]}"
           f"{' (+ uncommitted changes in jaxbnp/)' if m['jaxbnp_git']['jaxbnp_modified'] else ''}. "
           if m.get("jaxbnp_git") else "")
        + 
        f"Run {res['started']}.",
        "",
        "Times are medians over timed sweeps after warm-up (compile excluded).",
        "",
        header,
        sep,
    ]
    for label, fn in rows:
        lines.append(f"| {label} | " + " | ".join(fn(n) for n in names) + " |")
    ks = res.get("k_sweep")
    if ks:
        lines += ["", "Sweep time against the number of clusters: synthetic 10,000 × 6 mixtures of K "
                  "unit Gaussians (centres ≥ 8 apart), started at the truth, capacity the smallest power "
                  "of two from 32 holding K + 4 (what doubling reaches); 1 chain, median after "
                  f"{res['config']['warmup_sweeps']} warm-up sweeps:", "",
                  "| K at start → end | capacity | s/sweep |", "|---|---|---|"]
        for v in ks.values():
            lines.append(f"| {v['num_clusters_start']} → {v['num_clusters_end']} | {v['capacity']} | "
                         f"{fmt_s(v['median_s'])} |")
    ch = res.get("chains")
    if ch:
        lines += ["", f"Chains on this machine's {m['cpu_count']} cores: `runner.run(CollapsedGibbs)` on 10k "
                  f"from the ground truth; seconds per iteration from the difference of compiled runs of "
                  f"{ch['iterations']} and {2 * ch['iterations']} iterations:", "",
                  "| chains | chain method | s/iteration | t / t(1 chain) | per-chain throughput vs 1 | same draws |",
                  "|---|---|---|---|---|---|"]
        for v in ch["runs"].values():
            lines.append(f"| {v['num_chains']} | {v['method']} | {fmt_s(v['seconds_per_iteration'])} | "
                         f"{v['ratio_vs_one_chain']:.2f} | {v['per_chain_throughput_vs_one']:.2f}× | "
                         f"{'yes' if v['same_draws_as_vectorized'] else 'NO'} |")
    np_res = res.get("numpyro")
    lines.append("")
    if np_res:
        runs = np_res["runs"]
        raw16 = ds["toy"].get("jax_vmap", {}).get("16", {}).get("median_s")
        over = np_res["seconds_per_iteration"] / raw16 if raw16 else None
        lines += [
            f"NumPyro end-to-end (toy): `MCMC(CollapsedGibbs(model, capacity={CAPACITY}), "
            f"num_chains={np_res['chains']}, chain_method=\"vectorized\")`: "
            f"**{fmt_s(np_res['seconds_per_iteration'])} per iteration** for the 16 chains"
            + (f" ({over:.2f}× the raw 16-chain vmapped sweep above)" if over else "")
            + (f"; the kernel's `chain_batching` is {np_res['kernel_chain_batching']!r} (its "
               "docstring: 'auto' runs the chains with lax.map, one after another, on CPU)"
               if np_res.get("kernel_chain_batching") else "")
            + f". Runs of {runs[0]['num_warmup']}+{runs[0]['num_samples']} and "
            f"{runs[1]['num_warmup']}+{runs[1]['num_samples']} iterations took "
            f"{runs[0]['wall_s']:.2f} s and {runs[1]['wall_s']:.2f} s wall, of which "
            f"{runs[0]['trace_lower_compile_s']:.2f} s and {runs[1]['trace_lower_compile_s']:.2f} s "
            "tracing/compiling (JAX monitoring events); the per-iteration figure is the difference "
            "of the compile-free times (plain wall difference: "
            f"{fmt_s(np_res['seconds_per_iteration_raw_difference'])}/iteration).",
            "",
        ]
    t = res["targets"]
    lines += [
        "Targets:",
        "",
        f"- 10k, one sweep < {TARGET_10K_SECONDS} s, capacity {CAPACITY} (K ≤ 32, early in a run "
        f"started from one cluster): measured {fmt_s(t['jax_10k_single_s'])} → "
        f"**{'met' if t['target_10k_met'] else 'not met'}**"
        if t.get("jax_10k_single_s") is not None else "- 10k not run",
        (f"- the same target at the posterior's cluster count (10k ground truth has "
         f"{ds['10k']['jax_single_posterior_k']['num_clusters_start']} clusters, so capacity 32 "
         f"cannot hold the posterior; capacity {ds['10k']['jax_single_posterior_k']['capacity']}): "
         f"{fmt_s(ds['10k']['jax_single_posterior_k']['median_s'])} → "
         f"**{'met' if ds['10k']['jax_single_posterior_k']['median_s'] < TARGET_10K_SECONDS else 'not met'}**"
         if "10k" in ds and "jax_single_posterior_k" in ds["10k"] else "- posterior-size run: skipped"),
        f"- paper's C++ Gibbs: {PAPER_CPP_SECONDS_PER_SWEEP_10K} s/sweep on 10k (other hardware) → "
        f"jaxbnp 1 chain is {fmt_x(t.get('vs_paper_cpp'))} faster at capacity {CAPACITY}"
        + (f", {fmt_x(t['vs_paper_cpp_posterior_k'])} faster at the posterior's size (capacity "
           f"{ds['10k']['jax_single_posterior_k']['capacity']})"
           if t.get("vs_paper_cpp_posterior_k") else "")
        if t.get("vs_paper_cpp") else "- paper comparison: n/a",
        "- 64 chains far cheaper than 64 × one chain: t(64)/t(1) = "
        + ", ".join(f"{k}: {v:.1f}" for k, v in t["ratio_64"].items())
        + " (64 would mean no gain) → "
        + ", ".join(f"{k}: **{'met' if v <= 16 else 'not met'}**" for k, v in t["ratio_64"].items())
        + " (criterion used here: t(64)/t(1) ≤ 16, i.e. ≥ 4× per-chain throughput)",
        "",
        (f"- issue #21: the ground-truth 10k sweep in at most {TARGET_POSTERIOR_SECONDS * 1e3:.0f} ms "
         f"and at least {TARGET_POSTERIOR_SPEEDUP:.0f}x the NumPy sweep from the same state: "
         f"{fmt_s(ds['10k']['jax_single_posterior_k']['median_s'])}, "
         f"{fmt_x(ds['10k']['speedup_numpy_over_jax_posterior_k'])} → **"
         + ("met" if ds['10k']['jax_single_posterior_k']['median_s'] <= TARGET_POSTERIOR_SECONDS
            and ds['10k']['speedup_numpy_over_jax_posterior_k'] >= TARGET_POSTERIOR_SPEEDUP
            else "not met") + "**"
         if "10k" in ds and "jax_single_posterior_k" in ds["10k"] else "- issue #21 target: skipped"),
        "",
        "Checks: NumPy predictive equals `family.log_predictive` (12 points × 3 clusters + prior; "
        f"max |diff| {res['numpy_validation']['max_abs_diff']:.1e} on toy, "
        f"{res['numpy_validation_10k']['max_abs_diff']:.1e} on 10k; asserted). "
        "jaxbnp float32 running statistics vs a recount after the timed sweeps: "
        + "; ".join(
            f"{n}: max |ΔΣxxᵀ| {ds[n]['jax_single']['state_check']['sum_xx_max_abs_drift']:.2g} "
            f"(entries up to {ds[n]['jax_single']['state_check']['sum_xx_max_abs']:.3g})"
            for n in names)
        + ". Capacity overflow during the timed sweeps: "
        + ("none" if not any(
            ds[n]["jax_single"]["state_check"]["overflow"]
            or any(v["any_overflow"] for v in ds[n]["jax_vmap"].values()) for n in names)
           else "**YES, results invalid for that case**") + ".",
        "CPU used by other processes during the run: "
        + ("unknown" if res["other_processes_mean_cores"] is None
           else f"{res['other_processes_mean_cores']:.2f} cores on average (of {m['cpu_count']})")
        + f"; this benchmark: {res['this_process_mean_cores']:.2f} cores."
        + (" Other processes competed for the CPUs: timings are inflated and noisy."
           if (res["other_processes_mean_cores"] or 0) > 0.2 else ""),
        f"Total benchmark wall time: {res['total_wall_s']:.0f} s.",
    ]
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- main
def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR,
                    help=f"folder with toy/X.txt and 10k/X.txt (default {DEFAULT_DATA_DIR})")
    ap.add_argument("--out-dir", type=Path, default=Path(__file__).resolve().parent / "results")
    ap.add_argument("--quick", action="store_true",
                    help="fewer repeats, no 64 chains on 10k, shorter NumPyro runs")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    if jax.config.jax_enable_x64:
        sys.exit("gibbs.py benchmarks the library's default float32; unset JAX_ENABLE_X64.")
    data_dir = args.data_dir.expanduser().resolve()
    if not data_dir.is_dir():
        sys.exit(f"gibbs.py: data folder not found: {data_dir}. Pass --data-dir /path/to/nrmm.")

    quick = args.quick
    warmup = 5
    cfg = {
        "quick": quick,
        "capacity": CAPACITY,
        "alpha": ALPHA,
        "warmup_sweeps": warmup,
        "single_repeats": {"toy": 10 if quick else 30, "10k": 5 if quick else 15},
        "vmap_repeats": {"toy": 3 if quick else 10, "10k": 2 if quick else 5},
        "vmap_64_repeats": {"toy": 3 if quick else 5, "10k": 3},
        "vmap_chains": {"toy": [8, 16, 64], "10k": [8, 16] if quick else [8, 16, 64]},
        "overflow_check_sweeps": 20 if quick else 60,
        "posterior_capacity": 128,
        "k_sweep": [20, 60, 120],
        "chains": {"num_chains": [1, 8], "iterations": 10 if quick else 20},
        "posterior_repeats": 3 if quick else 9,
        "numpy_max_repeats": 2 if quick else 5,
        "numpy_budget_s": 5.0 if quick else 20.0,
        "numpyro": {"num_warmup": 10 if quick else 20,
                    "num_samples": [10, 40] if quick else [20, 120], "chains": 16},
        "data_dir": str(data_dir),
        "seed": args.seed,
    }
    started = utc_now()
    t_start = time.perf_counter()
    global COMPILE_TIMER
    COMPILE_TIMER = CompileTimer()
    res = {"started": started, "config": cfg, "machine": {**machine_info(), "numpy_baseline_dtype": "float64"},
           "datasets": {}}
    res["load_average_start"] = load_average()
    clock0 = cpu_seconds()
    if res["load_average_start"][0] > 0.5:
        print(f"warning: 1-minute load average is {res['load_average_start'][0]:.2f} on "
              f"{os.cpu_count()} CPUs; other processes may slow the timings.", flush=True)
    measure = bnp.DP(ALPHA)
    key = jax.random.key(args.seed)

    data = {name: load_dataset(data_dir, name) for name in DATASETS}
    families = {name: bnp.NormalWishart.from_data(X) for name, X in data.items()}

    print("validating the NumPy predictive against family.log_predictive ...", flush=True)
    res["numpy_validation"] = validate_numpy_predictive(families["toy"], data["toy"])
    res["numpy_validation_10k"] = validate_numpy_predictive(families["10k"], data["10k"])

    for d_idx, name in enumerate(DATASETS):
        X = data[name]
        family = families[name]
        X32 = jnp.asarray(X, jnp.float32)
        k_name = jax.random.fold_in(key, d_idx)
        out = {"n": int(X.shape[0]), "D": int(X.shape[1])}
        print(f"[{name}] jaxbnp single chain ...", flush=True)
        single, state = bench_single(
            X32, family, measure, jax.random.fold_in(k_name, 1), warmup, cfg["single_repeats"][name],
            extra_sweeps=cfg["overflow_check_sweeps"],
        )
        out["jax_single"] = single
        print(f"[{name}]   {fmt_s(single['median_s'])}/sweep, K={single['num_clusters_end']}", flush=True)

        print(f"[{name}] NumPy baseline ...", flush=True)
        out["numpy"] = bench_numpy(
            X, family, np.asarray(state.labels), args.seed, cfg["numpy_max_repeats"],
            cfg["numpy_budget_s"],
        )
        print(f"[{name}]   {fmt_s(out['numpy']['median_s'])}/sweep", flush=True)

        out["jax_vmap"] = {}
        for chains in cfg["vmap_chains"][name]:
            reps = cfg["vmap_64_repeats"][name] if chains == 64 else cfg["vmap_repeats"][name]
            print(f"[{name}] jaxbnp vmap {chains} chains ...", flush=True)
            r = bench_vmap(X32, family, measure, jax.random.fold_in(k_name, 100 + chains),
                           chains, warmup, reps)
            out["jax_vmap"][str(chains)] = r
            print(f"[{name}]   {fmt_s(r['median_s'])}/sweep of {chains} chains", flush=True)

        t1 = single["median_s"]
        out["speedup_numpy_over_jax"] = out["numpy"]["median_s"] / t1
        out["ratio_vs_single"] = {c: v["median_s"] / t1 for c, v in out["jax_vmap"].items()}
        if "64" in out["jax_vmap"]:
            out["throughput_64_vs_1"] = 64 * t1 / out["jax_vmap"]["64"]["median_s"]
        gt = load_labels(data_dir, name) if name == "10k" else None
        if gt is None and name == "10k":
            print(f"[{name}] no gt_labels.txt: skipping the posterior-size run", flush=True)
        if gt is not None:
            cap = cfg["posterior_capacity"]
            print(f"[{name}] jaxbnp single chain from the ground-truth partition "
                  f"(K={np.unique(gt).size}), capacity {cap} ...", flush=True)
            post, post_state = bench_single(X32, family, measure, jax.random.fold_in(k_name, 2),
                                            warmup, cfg["posterior_repeats"], capacity=cap, labels=gt)
            out["jax_single_posterior_k"] = post
            print(f"[{name}]   {fmt_s(post['median_s'])}/sweep, K={post['num_clusters_end']}", flush=True)
            print(f"[{name}] NumPy baseline from that state ...", flush=True)
            out["numpy_posterior_k"] = bench_numpy(
                X, family, np.asarray(post_state.labels), args.seed, 2, cfg["numpy_budget_s"] / 2
            )
            out["speedup_numpy_over_jax_posterior_k"] = (
                out["numpy_posterior_k"]["median_s"] / post["median_s"]
            )
            print(f"[{name}]   {fmt_s(out['numpy_posterior_k']['median_s'])}/sweep", flush=True)
        res["datasets"][name] = out

    res["k_sweep"] = {}
    for k in cfg["k_sweep"]:
        Xk, yk = synthetic_mixture(10_000, 6, k, seed=args.seed + k)
        cap_k = 1 << max(5, int(np.ceil(np.log2(k + 4))))
        fam_k = bnp.NormalWishart.from_data(Xk)
        print(f"[synthetic K={k}] 10000 x 6, capacity {cap_k} ...", flush=True)
        r, _ = bench_single(jnp.asarray(Xk, jnp.float32), fam_k, measure, jax.random.fold_in(key, 1000 + k),
                            warmup, cfg["posterior_repeats"], capacity=cap_k, labels=yk)
        res["k_sweep"][str(k)] = r
        print(f"[synthetic K={k}]   {fmt_s(r['median_s'])}/sweep (K {r['num_clusters_start']} -> "
              f"{r['num_clusters_end']})", flush=True)

    if "10k" in data and load_labels(data_dir, "10k") is not None:
        res["chains"] = bench_chains(data["10k"], families["10k"], load_labels(data_dir, "10k"),
                                     cfg["chains"], args.seed)

    print("[toy] NumPyro MCMC(CollapsedGibbs, 16 vectorized chains) ...", flush=True)
    npc = cfg["numpyro"]
    res["numpyro"] = bench_numpyro(
        jnp.asarray(data["toy"], jnp.float32), families["toy"], npc["num_warmup"],
        tuple(npc["num_samples"]), npc["chains"], args.seed,
    )
    res["numpyro"]["dataset"] = "toy"

    t10k = res["datasets"]["10k"]["jax_single"]["median_s"]
    post_s = res["datasets"]["10k"].get("jax_single_posterior_k", {}).get("median_s")
    res["targets"] = {
        "jax_10k_single_s": t10k,
        "target_10k_s": TARGET_10K_SECONDS,
        "target_10k_met": t10k < TARGET_10K_SECONDS,
        "paper_cpp_10k_s": PAPER_CPP_SECONDS_PER_SWEEP_10K,
        "vs_paper_cpp": PAPER_CPP_SECONDS_PER_SWEEP_10K / t10k,
        "jax_10k_single_posterior_k_s": post_s,
        "target_10k_met_posterior_k": None if post_s is None else post_s < TARGET_10K_SECONDS,
        "vs_paper_cpp_posterior_k": None if post_s is None else PAPER_CPP_SECONDS_PER_SWEEP_10K / post_s,
        "ratio_64": {n: res["datasets"][n]["ratio_vs_single"]["64"]
                     for n in DATASETS if "64" in res["datasets"][n]["ratio_vs_single"]},
    }
    res["load_average_end"] = load_average()
    res["total_wall_s"] = time.perf_counter() - t_start
    clock1 = cpu_seconds()
    other = other_cpu_seconds(clock0, clock1)
    res["other_processes_mean_cores"] = None if other is None else max(0.0, other / res["total_wall_s"])
    res["this_process_mean_cores"] = (clock1[1] - clock0[1]) / res["total_wall_s"]

    md = make_markdown(res)
    write_json(args.out_dir / "gibbs.json", res, indent=2)
    write_lines(args.out_dir / "gibbs.md", [md.rstrip("\n")])
    print()
    print(md)
    print(f"wrote {args.out_dir / 'gibbs.json'} and {args.out_dir / 'gibbs.md'}")


if __name__ == "__main__":
    main()
