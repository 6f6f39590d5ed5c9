"""The GPU tables, one part at a time (driven by ``benchmarks/gpu.sh``, issue #37).

``python benchmarks/gpu.py --part NAME --out DIR [--dry-run]`` runs one part and appends
one JSON line per measured row to ``DIR/NAME.jsonl`` as soon as the row is measured, so a
part stopped at its time cap (``gpu.sh`` runs each under ``timeout``) keeps what it
reached. ``--report`` turns every ``DIR/*.jsonl`` into ``DIR/gpu.md`` and ``DIR/gpu.json``.

Parts (sizes grow, so the cap cuts the largest first; ``--dry-run``: the same code at tiny
sizes on whatever device JAX has, for the suite):

* ``env``: devices, versions, commit.
* ``gibbs``: one collapsed-Gibbs sweep at 10^4 points in 2-D (the ground-truth partition
  of 10 clusters is the start): seconds per sweep, first run (compilation) and second.
* ``mapdp``: ``MAPDP()`` on 30 full-covariance Gaussian clusters in 10-D, 10^5, 10^6 and
  10^7 points: first fit (compilation) and second fit, K and NMI.
* ``subcluster``: ``SubClusterMCMC`` on the same data, 10^5, 10^6 and 10^7 points, 20
  iterations through :func:`jaxbnp.inference.runner.run` (compiled once per shape).
* ``chains``: ``CollapsedGibbs``, ``SplitMerge`` and ``SubClusterMCMC`` (2-D Gaussian
  clusters) and ``SliceGibbs`` (Poisson counts, 64 slots) with 1, 64 and 1,024 vectorised
  chains on 500 points (``--chains`` for other counts): seconds per iteration and
  chain-iterations/s.
* ``ddt``: ``PopulationDDT`` with 2, 8 and 64 chains on 32 points.
* ``auxiliary``: ``AuxiliaryGibbs`` and ``SliceGibbs`` (issue #40) on Poisson counts from 6
  clusters, 20 iterations: ``AuxiliaryGibbs`` (32 slots) at 10^4 and 10^5 points
  (its label sweep is a scan over the points: the sequential part's cost on the device),
  ``SliceGibbs`` (64 slots) at 10^5 and 10^6 (every label at once: the data-parallel path).

Compilation is reported apart: "first" is the first run of a shape (trace + compile +
run), "second" a run of the same shape with the programs reused. The persistent cache is
pointed at an empty folder (``gpu.sh``), so "first" is a cold compilation.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from harness import REPO_ROOT, git_state, utc_now

PARTS = ("env", "gibbs", "mapdp", "subcluster", "chains", "ddt", "auxiliary")


def _emit(out: Path, part: str, row: dict) -> None:
    row = {"part": part, **row}
    with open(out / f"{part}.jsonl", "a") as fh:
        fh.write(json.dumps(row) + "\n")
    print(f"[{part}] {row}", flush=True)


def _blobs(n: int, d: int, k: int, seed: int = 0):
    """``k`` Gaussian clusters with random full covariances, unequal sizes (float32)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    weights = rng.dirichlet(np.full(k, 2.0))
    y = rng.choice(k, size=n, p=weights).astype(np.int32)
    means = rng.normal(0.0, 6.0, (k, d))
    chol = np.tril(rng.normal(0.0, 0.4, (k, d, d)), -1) + np.einsum(
        "kd,de->kde", rng.uniform(0.5, 1.5, (k, d)), np.eye(d))
    X = np.empty((n, d), np.float32)
    step = 1 << 20
    for s in range(0, n, step):
        e = min(n, s + step)
        z = rng.standard_normal((e - s, d)).astype(np.float32)
        X[s:e] = means[y[s:e]] + np.einsum("nde,ne->nd", chol[y[s:e]], z)
    return X, y


def _nmi(y, labels) -> float:
    from sklearn.metrics import normalized_mutual_info_score

    return float(normalized_mutual_info_score(y, labels))


def _timed(fn):
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


def part_env(out: Path, dry: bool) -> None:
    import jax
    import numpyro

    _emit(out, "env", {
        "date": utc_now(), "backend": jax.default_backend(),
        "devices": [str(d) for d in jax.devices()], "jax": jax.__version__,
        "numpyro": numpyro.__version__, "git": git_state(), "dry_run": dry,
    })


def _collect_labels(state):  # module level: the runner keys its programs by this function
    return {"k": state.num_clusters, "z": state.z["z"]}


def _collect_k(state):
    return {"k": state.num_clusters}


def _run_kernel(make_kernel, X, family, num_samples, num_chains, seed, cache_key):
    import jax
    import numpy as np

    import jaxbnp as bnp
    from jaxbnp.inference import runner

    def go():
        r = runner.run(make_kernel, jax.random.key(seed), (jax.numpy.asarray(X), bnp.DP(1.0), family),
                       num_warmup=0, num_samples=num_samples, num_chains=num_chains,
                       chain_method="vectorized" if num_chains > 1 else "auto",
                       collect=_collect_labels if num_chains == 1 else _collect_k,
                       cache_key=cache_key, capacity=64 if X.shape[0] > 64 else None,
                       max_capacity=X.shape[0])
        jax.block_until_ready(r.samples)
        return r

    first, t_first = _timed(go)
    second, t_second = _timed(go)
    return second, t_first, t_second, np.asarray(second.samples["k"])


def part_gibbs(out: Path, dry: bool) -> None:
    import jax
    import jax.numpy as jnp
    import numpyro
    from numpyro.infer import MCMC

    import jaxbnp as bnp

    n = 500 if dry else 10_000
    X, y = _blobs(n, 2, 10)
    family = bnp.NormalWishart.from_data(X)

    def model(X):
        z = numpyro.sample("z", bnp.Partition(bnp.DP(1.0), X.shape[0]))
        numpyro.sample("X", bnp.ConjugateMixture(family, z), obs=X)

    sweeps = 3 if dry else 20
    mcmc = MCMC(bnp.CollapsedGibbs(model, capacity=64), num_warmup=0, num_samples=sweeps,
                progress_bar=True, jit_model_args=True)

    def go(seed):
        mcmc.run(jax.random.key(seed), jnp.asarray(X), init_params={"z": jnp.asarray(y)})
        return jax.block_until_ready(mcmc.get_samples())

    _, t_first = _timed(lambda: go(0))
    z, t_second = _timed(lambda: go(1))
    z = z["z"]
    _emit(out, "gibbs", {"n": n, "d": 2, "sweeps": sweeps, "first_s": t_first,
                         "second_s": t_second, "s_per_sweep": t_second / sweeps,
                         "nmi": _nmi(y, jax.device_get(z)[-1])})


def part_mapdp(out: Path, dry: bool) -> None:
    import jaxbnp as bnp

    sizes = [1_000] if dry else [100_000, 1_000_000, 10_000_000]
    for n in sizes:
        X, y = _blobs(n, 10, 30)
        _, t_first = _timed(lambda: bnp.MAPDP().fit(X))
        est, t_second = _timed(lambda: bnp.MAPDP().fit(X))
        _emit(out, "mapdp", {"n": n, "d": 10, "first_s": t_first, "second_s": t_second,
                             "k": int(est.n_clusters_), "nmi": _nmi(y, est.labels_)})


def part_subcluster(out: Path, dry: bool) -> None:
    import jaxbnp as bnp

    sizes = [1_000] if dry else [100_000, 1_000_000, 10_000_000]
    iters = 3 if dry else 20
    for n in sizes:
        X, y = _blobs(n, 10, 30)
        family = bnp.NormalWishart.from_data(X)
        r, t_first, t_second, k = _run_kernel(
            lambda c: bnp.SubClusterMCMC(bnp.mixture_model, capacity=c), X, family, iters, 1, 0,
            ("gpu-subcluster", n))
        _emit(out, "subcluster", {"n": n, "d": 10, "iterations": iters, "first_s": t_first,
                                  "second_s": t_second, "s_per_iteration": t_second / iters,
                                  "k": int(k.reshape(-1)[-1]),
                                  "nmi": _nmi(y, r.samples["z"].reshape(-1, n)[-1])})


def _poisson_plate_model(slots: int):
    """DP(1) over Poisson counts with LogNormal(2, 1.5) rates in a plate of ``slots``."""
    import numpyro
    import numpyro.distributions as dist

    import jaxbnp as bnp

    def model(X):
        z = numpyro.sample("z", bnp.Partition(bnp.DP(1.0), X.shape[0]))
        with numpyro.plate("clusters", slots):
            rate = numpyro.sample("rate", dist.LogNormal(2.0, 1.5))
        numpyro.sample("X", dist.Poisson(rate[z]), obs=X)

    return model


def _poisson_counts(n: int):
    """``(X, y)``: ``n`` counts from 6 clusters with LogNormal(2, 1.5) rates (seed 0)."""
    import jax.numpy as jnp
    import numpy as np

    rng = np.random.default_rng(0)
    rates = np.exp(rng.normal(2.0, 1.5, 6))
    y = rng.integers(0, 6, n)
    return jnp.asarray(rng.poisson(rates[y]).astype(np.float32)), y


def _slice_chains(n: int, chains: int, iters: int):
    """``SliceGibbs`` (64 slots) on Poisson counts from 6 clusters, ``chains`` vectorised
    chains through NumPyro's ``MCMC``: (first run, second run) seconds."""
    import jax
    from numpyro.infer import MCMC

    import jaxbnp as bnp

    X, _ = _poisson_counts(n)
    mcmc = MCMC(bnp.SliceGibbs(_poisson_plate_model(64)), num_warmup=0, num_samples=iters, num_chains=chains,
                chain_method="vectorized", progress_bar=True, jit_model_args=True)

    def go(seed):
        mcmc.run(jax.random.key(seed), X)
        return jax.block_until_ready(mcmc.get_samples())

    return _timed(lambda: go(0))[1], _timed(lambda: go(1))[1]


def part_chains(out: Path, dry: bool, chain_counts=None) -> None:
    import jaxbnp as bnp

    n = 100 if dry else 500
    X, _ = _blobs(n, 2, 5)
    family = bnp.NormalWishart.from_data(X)
    kernels = {
        "CollapsedGibbs": lambda c: bnp.CollapsedGibbs(bnp.mixture_model, capacity=c),
        "SplitMerge": lambda c: bnp.SplitMerge(bnp.mixture_model, capacity=c),
        "SubClusterMCMC": lambda c: bnp.SubClusterMCMC(bnp.mixture_model, capacity=c),
    }
    iters = 3 if dry else 10
    for chains in chain_counts or ([2] if dry else [1, 64, 1024]):
        for name in (*kernels, "SliceGibbs"):
            if name == "SliceGibbs":
                t_first, t_second = _slice_chains(n, chains, iters)
            else:
                _, t_first, t_second, _ = _run_kernel(kernels[name], X, family, iters, chains, 0,
                                                      ("gpu-chains", name, chains))
            _emit(out, "chains", {"kernel": name, "n": n, "chains": chains, "iterations": iters,
                                  "first_s": t_first, "second_s": t_second,
                                  "s_per_iteration": t_second / iters,
                                  "chain_iterations_per_s": chains * iters / t_second})


def part_ddt(out: Path, dry: bool) -> None:
    import jax
    import jax.numpy as jnp
    import numpyro
    from numpyro.infer import MCMC

    import jaxbnp as bnp

    n = 12 if dry else 32
    X, _ = _blobs(n, 2, 4)

    def model(X):
        tree = numpyro.sample("tree", bnp.DiffusionTree(1.0, X.shape[0]))
        numpyro.sample("X", bnp.BrownianLeaves(tree, 1.0, 0.1), obs=X)

    iters = 3 if dry else 20
    for chains in ([2] if dry else [2, 8, 64]):
        mcmc = MCMC(bnp.PopulationDDT(model, chains, 2), num_warmup=0, num_samples=iters,
                    num_chains=chains, chain_method="vectorized", progress_bar=True,
                    jit_model_args=True)

        def go(seed):
            mcmc.run(jax.random.key(seed), jnp.asarray(X))
            return jax.block_until_ready(mcmc.get_samples())

        _, t_first = _timed(lambda: go(0))
        _, t_second = _timed(lambda: go(1))
        _emit(out, "ddt", {"n": n, "chains": chains, "iterations": iters, "first_s": t_first,
                           "second_s": t_second, "s_per_iteration": t_second / iters,
                           "chain_iterations_per_s": chains * iters / t_second})


def part_auxiliary(out: Path, dry: bool) -> None:
    import jax
    import numpy as np
    from numpyro.infer import MCMC

    import jaxbnp as bnp

    # SliceGibbs's plate must also hold the sticks that may exceed a slice: 64 at 10^6 points
    # (docs/mathematics.md §9); AuxiliaryGibbs needs only the clusters
    slots = {"AuxiliaryGibbs": 32, "SliceGibbs": 64}

    iters = 3 if dry else 20
    sizes = {"AuxiliaryGibbs": [500] if dry else [10_000, 100_000],
             "SliceGibbs": [500] if dry else [100_000, 1_000_000]}
    for name, n in [(k, n) for k in sizes for n in sizes[k]]:
        X, y = _poisson_counts(n)
        mcmc = MCMC(getattr(bnp, name)(_poisson_plate_model(slots[name])), num_warmup=0, num_samples=iters, progress_bar=True,
                    jit_model_args=True)

        def go(seed):
            mcmc.run(jax.random.key(seed), X)
            return jax.block_until_ready(mcmc.get_samples())

        _, t_first = _timed(lambda: go(0))
        samples, t_second = _timed(lambda: go(1))
        _emit(out, "auxiliary", {"kernel": name, "n": n, "slots": slots[name], "iterations": iters, "first_s": t_first,
                                 "second_s": t_second, "s_per_iteration": t_second / iters,
                                 "nmi": _nmi(y, np.asarray(samples["z"][-1]))})


def report(out: Path) -> None:
    rows = {}
    for part in PARTS:
        path = out / f"{part}.jsonl"
        rows[part] = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    (out / "gpu.json").write_text(json.dumps(rows, indent=1))
    lines = ["# GPU tables (benchmarks/gpu.sh)" if out.name == "gpu" else f"# benchmarks/gpu.py tables ({out.name})", ""]
    env = rows["env"][-1] if rows["env"] else {}
    lines += [f"- {k}: {v}" for k, v in env.items() if k != "part"]
    for part in PARTS[1:]:
        if not rows[part] and out.name != "gpu":  # a table of some parts (e.g. the CPU's chains)
            continue
        lines += ["", f"## {part}", ""]
        if not rows[part]:
            lines.append("(no row: the part did not reach its first size before its cap, or failed; see gpu.log)")
            continue
        cols = [c for c in rows[part][0] if c != "part"]
        lines.append("| " + " | ".join(cols) + " |")
        lines.append("|" + "---|" * len(cols))
        for r in rows[part]:
            lines.append("| " + " | ".join(
                f"{r.get(c):.4g}" if isinstance(r.get(c), float) else str(r.get(c)) for c in cols) + " |")
    (out / "gpu.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", choices=PARTS)
    ap.add_argument("--report", action="store_true")
    ap.add_argument("--out", default=str(REPO_ROOT / "benchmarks" / "results" / "gpu"))
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--chains", type=int, nargs="+", help="the chains part's chain counts")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.report:
        report(out)
        return
    if args.part is None:
        sys.exit("gpu.py: --part NAME or --report")
    if args.part == "chains":
        part_chains(out, args.dry_run, args.chains)
    else:
        globals()[f"part_{args.part}"](out, args.dry_run)


if __name__ == "__main__":
    main()
