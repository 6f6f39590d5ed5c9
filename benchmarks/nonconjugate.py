"""Non-conjugate DP mixtures: ``AuxiliaryGibbs`` and ``SliceGibbs`` beside NumPyro's truncated
stick-breaking mixture with the labels summed out and NUTS on everything (what NumPyro and PyMC
users write today), on the same data in the same run.

    python benchmarks/nonconjugate.py [--sets poisson student] [--kernels auxiliary slice]
        [--warmup 500] [--samples 500] [--numpyro-warmup 500] [--numpyro-samples 500]
        [--split-merge 10] [--skip-numpyro] [--out-name nonconjugate]

Data (seed 0): ``poisson``: 2,000 counts from 6 clusters with LogNormal(2, 1.5) rates;
``student``: 5,000 2-D points from 8 Student-t (nu = 3) clusters, means N(0, 5^2 I), unit
scale; ``regression``: 2,000 pairs ``(x, y)``, ``x ~ U(-3, 3)``, from 4 lines
``y = a_k + b_k x + N(0, s_k^2)`` with ``(a_k, b_k) ~ N(0, 2^2 I)``, ``s_k ~ LogNormal(log 0.5, 0.3)``
(a mixture of linear regressions: the clusters are lines, not blobs, so they cross).
Models: DP(1) over the clusters, the generating priors on the cluster parameters
(rate ~ LogNormal(2, 1.5); mean ~ N(0, 5^2 I), the likelihood Poisson / Student-t(3, mean, 1);
coefficients ~ N(0, 2^2 I) and noise scale ~ LogNormal(log 0.5, 0.3), the likelihood of ``y``
Normal(a + b x, s)). ``auxiliary-launch`` is ``AuxiliaryGibbs(split_merge="launch")`` with
``--launch-split-merge`` moves per iteration (Jain and Neal's kind: the parameters of the
clusters it makes drawn from launch states).
jaxbnp: a plate of 32 slots, ``--chains`` chains (2 by default) one after another, each kernel with its defaults
(``num_split_merge`` from ``--split-merge`` and ``--slice-split-merge``). NumPyro: truncation T = 20,
stick-breaking weights, ``MixtureSameFamily`` (labels summed out), NUTS, as many chains one after
another.

Columns: wall time of the whole run (first run, compilation included) and of a second run of
the same shapes (its compilation cached where the library caches it); NMI against the truth
of each point's most probable component: given the draw with the highest log joint (its
parameters, its cluster sizes as weights; jaxbnp; the draw's own labels in brackets in the
JSON) or given the posterior-mean weights and parameters (NumPyro), beside the classifier that
knows the true parameters; max R-hat and min bulk ESS over the chains (jaxbnp: of K and the log joint,
label-free; NumPyro: of every parameter, as a NumPyro user reads them, label switching
included).
"""

from __future__ import annotations

import argparse
import time

from harness import RESULTS, git_state, machine_info, utc_now, write_json, write_lines

import jax  # noqa: E402  (after harness: the repository's jaxbnp on sys.path)
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import numpyro  # noqa: E402
import numpyro.distributions as dist  # noqa: E402
from numpyro.diagnostics import effective_sample_size, split_gelman_rubin  # noqa: E402
from numpyro.infer import MCMC, NUTS  # noqa: E402
from scipy import stats  # noqa: E402
from sklearn.metrics import normalized_mutual_info_score as nmi  # noqa: E402

import jaxbnp as bnp  # noqa: E402

SLOTS, TRUNCATION = 32, 20


def make_data(name: str):
    rng = np.random.default_rng(0)
    if name == "poisson":
        k, n = 6, 2000
        rates = np.exp(rng.normal(2.0, 1.5, k))
        truth = rng.integers(0, k, n)
        X = rng.poisson(rates[truth]).astype(np.float32)
        w = np.bincount(truth, minlength=k) / n
        bayes = np.argmax(np.log(w) + stats.poisson.logpmf(X[:, None], rates[None]), 1)
        return X, truth, bayes
    if name == "regression":
        k, n = 4, 2000
        coef = rng.normal(0.0, 2.0, (k, 2))
        scale = np.exp(rng.normal(np.log(0.5), 0.3, k))
        truth = rng.integers(0, k, n)
        x = rng.uniform(-3.0, 3.0, n)
        y = coef[truth, 0] + coef[truth, 1] * x + scale[truth] * rng.normal(size=n)
        X = np.stack([x, y], 1).astype(np.float32)
        w = np.bincount(truth, minlength=k) / n
        return X, truth, classify(name, X, w, (coef, scale))
    k, n = 8, 5000
    means = rng.normal(0.0, 5.0, (k, 2))
    truth = rng.integers(0, k, n)
    X = (means[truth] + rng.standard_t(3.0, (n, 2))).astype(np.float32)
    w = np.bincount(truth, minlength=k) / n
    ll = stats.t.logpdf(X[:, None, :], 3.0, means[None]).sum(-1)
    return X, truth, np.argmax(np.log(w) + ll, 1)


def jaxbnp_model(name):
    def poisson(X):
        z = numpyro.sample("z", bnp.Partition(bnp.DP(1.0), X.shape[0]))
        with numpyro.plate("clusters", SLOTS):
            rate = numpyro.sample("rate", dist.LogNormal(2.0, 1.5))
        numpyro.sample("X", dist.Poisson(rate[z]), obs=X)

    def student(X):
        z = numpyro.sample("z", bnp.Partition(bnp.DP(1.0), X.shape[0]))
        with numpyro.plate("clusters", SLOTS):
            mu = numpyro.sample("mu", dist.Normal(0.0, 5.0).expand([2]).to_event(1))
        numpyro.sample("X", dist.StudentT(3.0, mu[z], 1.0).to_event(1), obs=X)

    def regression(X):
        z = numpyro.sample("z", bnp.Partition(bnp.DP(1.0), X.shape[0]))
        with numpyro.plate("clusters", SLOTS):
            coef = numpyro.sample("coef", dist.Normal(0.0, 2.0).expand([2]).to_event(1))
            scale = numpyro.sample("scale", dist.LogNormal(np.log(0.5), 0.3))
        numpyro.sample("y", dist.Normal(coef[z, 0] + coef[z, 1] * X[:, 0], scale[z]), obs=X[:, 1])

    return {"poisson": poisson, "student": student, "regression": regression}[name]


def truncated_model(name):
    def weights():
        with numpyro.plate("sticks", TRUNCATION - 1):
            v = numpyro.sample("v", dist.Beta(1.0, 1.0))  # DP(1): Beta(1, alpha)
        return jnp.concatenate([v, jnp.ones(1)]) * jnp.concatenate([jnp.ones(1), jnp.cumprod(1 - v)])

    def poisson(X):
        w = weights()
        with numpyro.plate("components", TRUNCATION):
            rate = numpyro.sample("rate", dist.LogNormal(2.0, 1.5))
        with numpyro.plate("data", X.shape[0]):
            numpyro.sample("X", dist.MixtureSameFamily(dist.Categorical(w), dist.Poisson(rate)), obs=X)

    def student(X):
        w = weights()
        with numpyro.plate("components", TRUNCATION):
            mu = numpyro.sample("mu", dist.Normal(0.0, 5.0).expand([2]).to_event(1))
        comp = dist.StudentT(3.0, mu, 1.0).to_event(1)
        with numpyro.plate("data", X.shape[0]):
            numpyro.sample("X", dist.MixtureSameFamily(dist.Categorical(w), comp), obs=X)

    def regression(X):
        w = weights()
        with numpyro.plate("components", TRUNCATION):
            coef = numpyro.sample("coef", dist.Normal(0.0, 2.0).expand([2]).to_event(1))
            scale = numpyro.sample("scale", dist.LogNormal(np.log(0.5), 0.3))
        comp = dist.Normal(coef[:, 0] + coef[:, 1] * X[:, :1], scale)  # batch (n, T)
        with numpyro.plate("data", X.shape[0]):
            numpyro.sample("y", dist.MixtureSameFamily(dist.Categorical(w), comp), obs=X[:, 1])

    return {"poisson": poisson, "student": student, "regression": regression}[name]


#: the cluster parameter sites each set's classifier reads
PARAM_SITES = {"poisson": ("rate",), "student": ("mu",), "regression": ("coef", "scale")}


def classify(name, X, weights, params):
    """Each point's most probable component given mixture weights and parameters."""
    if name == "poisson":
        ll = stats.poisson.logpmf(X[:, None], np.asarray(params)[None])
    elif name == "regression":
        coef, scale = (np.asarray(p) for p in params)
        ll = stats.norm.logpdf(X[:, 1:2], coef[None, :, 0] + coef[None, :, 1] * X[:, :1], scale[None])
    else:
        ll = stats.t.logpdf(X[:, None, :], 3.0, np.asarray(params)[None]).sum(-1)
    with np.errstate(divide="ignore"):
        return np.argmax(np.log(weights) + ll, 1)


def _diagnostics(chains: dict) -> tuple[float, float]:
    rhat, ess = [], []
    for a in chains.values():
        a = np.asarray(a, np.float64)
        a = a.reshape(a.shape[0], a.shape[1], -1)
        for j in range(a.shape[2]):
            rhat.append(float(split_gelman_rubin(a[:, :, j])))
            ess.append(float(effective_sample_size(a[:, :, j])))
    return float(np.nanmax(rhat)), float(np.nanmin(ess))


def _params(samples, name, index=None):
    got = tuple(np.asarray(samples[site] if index is None else samples[site][index]) for site in PARAM_SITES[name])
    return got[0] if len(got) == 1 else got


def run_jaxbnp(name, X, truth, warmup, samples, num_split_merge=10, kernel="auxiliary", num_chains=2):
    model = jaxbnp_model(name)
    walls = []
    for rep in range(2):
        start = time.perf_counter()
        if kernel == "slice":
            made = bnp.SliceGibbs(model, num_split_merge=num_split_merge)
        else:
            made = bnp.AuxiliaryGibbs(model, num_split_merge=num_split_merge,
                                      split_merge="launch" if kernel == "auxiliary-launch" else "given")
        mcmc = MCMC(made, num_warmup=warmup, num_samples=samples, num_chains=num_chains,
                    chain_method="sequential", progress_bar=False)
        mcmc.run(jax.random.key(rep), jnp.asarray(X),
                 extra_fields=("log_joint", "num_clusters", "num_accepted"))
        z = np.asarray(mcmc.get_samples()["z"])
        walls.append(time.perf_counter() - start)
    extra = mcmc.get_extra_fields(group_by_chain=True)
    best = np.argmax(np.asarray(mcmc.get_extra_fields()["log_joint"]))
    params = _params(mcmc.get_samples(), name, best)
    weights = np.bincount(z[best], minlength=SLOTS) / len(X)
    labels = classify(name, X, weights, params)
    rhat, ess = _diagnostics({"K": extra["num_clusters"], "log_joint": extra["log_joint"]})
    return {"wall_first_s": walls[0], "wall_second_s": walls[1], "nmi": nmi(truth, labels),
            "nmi_draw": nmi(truth, z[best]), "K": int(len(np.unique(z[best]))), "max_rhat": rhat,
            "min_ess": ess, "accepted_per_iteration": float(np.mean(np.asarray(extra["num_accepted"])))}


def run_numpyro(name, X, truth, warmup, samples, num_chains=2):
    model = truncated_model(name)
    walls = []
    for rep in range(2):
        start = time.perf_counter()
        mcmc = MCMC(NUTS(model), num_warmup=warmup, num_samples=samples, num_chains=num_chains,
                    chain_method="sequential", progress_bar=False)
        mcmc.run(jax.random.key(rep), jnp.asarray(X))
        post = mcmc.get_samples()
        jax.block_until_ready(post)
        walls.append(time.perf_counter() - start)
    v = np.asarray(post["v"]).mean(0)
    w = np.concatenate([v, [1.0]]) * np.concatenate([[1.0], np.cumprod(1 - v)])
    labels = classify(name, X, w, _params({k: np.asarray(v).mean(0) for k, v in post.items()}, name))
    rhat, ess = _diagnostics(mcmc.get_samples(group_by_chain=True))
    return {"wall_first_s": walls[0], "wall_second_s": walls[1], "nmi": nmi(truth, labels),
            "K": int(len(np.unique(labels))), "max_rhat": rhat, "min_ess": ess}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sets", nargs="+", default=["poisson", "student"])
    ap.add_argument("--warmup", type=int, default=500)
    ap.add_argument("--samples", type=int, default=500)
    ap.add_argument("--numpyro-warmup", type=int, default=500)
    ap.add_argument("--numpyro-samples", type=int, default=500)
    ap.add_argument("--kernels", nargs="+", default=["auxiliary", "slice"],
                    choices=["auxiliary", "auxiliary-launch", "slice"])
    ap.add_argument("--split-merge", type=int, default=10, help="AuxiliaryGibbs's num_split_merge")
    ap.add_argument("--launch-split-merge", type=int, default=2,
                    help="num_split_merge of AuxiliaryGibbs(split_merge='launch')")
    ap.add_argument("--slice-split-merge", type=int, default=10, help="SliceGibbs's num_split_merge")
    ap.add_argument("--skip-numpyro", action="store_true")
    ap.add_argument("--chains", type=int, default=2, help="chains per method (R-hat over them)")
    ap.add_argument("--out-name", default="nonconjugate")
    args = ap.parse_args()
    rows = []
    for name in args.sets:
        X, truth, bayes = make_data(name)
        runs = []
        if "auxiliary" in args.kernels:
            runs.append((f"jaxbnp AuxiliaryGibbs (num_split_merge={args.split_merge})",
                         lambda *a: run_jaxbnp(*a, num_split_merge=args.split_merge, num_chains=args.chains), args.warmup,
                         args.samples))
        if "auxiliary-launch" in args.kernels:
            runs.append((f"jaxbnp AuxiliaryGibbs (split_merge='launch', num_split_merge={args.launch_split_merge})",
                         lambda *a: run_jaxbnp(*a, num_split_merge=args.launch_split_merge,
                                               kernel="auxiliary-launch", num_chains=args.chains),
                         args.warmup, args.samples))
        if "slice" in args.kernels:
            runs.append((f"jaxbnp SliceGibbs (num_split_merge={args.slice_split_merge})",
                         lambda *a: run_jaxbnp(*a, num_split_merge=args.slice_split_merge, kernel="slice",
                                               num_chains=args.chains),
                         args.warmup, args.samples))
        if not args.skip_numpyro:
            runs.append(("NumPyro NUTS, truncated", lambda *a: run_numpyro(*a, num_chains=args.chains),
                         args.numpyro_warmup, args.numpyro_samples))
        for method, fn, w, s in runs:
            res = fn(name, X, truth, w, s)
            res.update(set=name, n=int(X.shape[0]), method=method, warmup=w, samples=s,
                       bayes_nmi=nmi(truth, bayes), chains=args.chains,
                       ess_per_s=res["min_ess"] / res["wall_second_s"])
            print(res, flush=True)
            rows.append(res)
    flags = [f"--{k.replace('_', '-')}" + ("" if v is True else f" {' '.join(v) if isinstance(v, list) else v}")
             for k, v in vars(args).items() if v is not False]
    out = {"command": "python benchmarks/nonconjugate.py " + " ".join(flags),
        "date": utc_now(), "git": git_state(), "machine": machine_info(), "rows": rows}
    write_json(RESULTS / f"{args.out_name}.json", out)
    lines = [f"# Non-conjugate DP mixtures (`{args.out_name}`)", "", f"`{out['command']}` (module docstring); "
             f"{utc_now()}, {args.chains} chains each, float32. ESS per second: min bulk ESS over the second run's wall time.", "",
             "| set | n | method | warm-up + draws | wall, first run | second run | NMI (true-parameter classifier) | K | max R-hat | min bulk ESS | ESS / s |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['set']} | {r['n']:,} | {r['method']} | {r['warmup']}+{r['samples']} | "
                     f"{r['wall_first_s']:.1f} s | {r['wall_second_s']:.1f} s | {r['nmi']:.3f} ({r['bayes_nmi']:.3f}) | "
                     f"{r['K']} | {r['max_rhat']:.2f} | {r['min_ess']:.0f} | {r['ess_per_s']:.2f} |")
    write_lines(RESULTS / f"{args.out_name}.md", lines)


if __name__ == "__main__":
    main()
