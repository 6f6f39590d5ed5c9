"""One-call fitting of a Dirichlet diffusion tree (the CLI's ``--method ddt``): :func:`fit_ddt`.

docs/mathematics.md §5. The model is the DDT prior on the tree with Brownian
leaves (``model="brownian"``), or the seed's cut model (``model="cut"``: the tree cut at a
stopping time over a conjugate family's partition marginals); the sampler is :class:`~jaxbnp.inference.trees.population.PopulationDDT`
(population MCMC) or vectorised independent
:class:`~jaxbnp.inference.trees.mcmc.DiffusionTreeMCMC` chains, run through the
one driver :func:`jaxbnp.inference.runner.run`.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist

from ..._cache import auto_enable
from ..._validation import check_data
from ...models.ddt import BrownianLeaves, DiffusionTree, Tree, cut_tree, from_linkage
from ...models.distributions import ConjugateMixture
from ...models.families import Family
from ..runner import run
from .mcmc import DiffusionTreeMCMC
from .population import PopulationDDT

__all__ = ["DDTFit", "fit_ddt"]


class DDTFit(NamedTuple):
    """Result of :func:`fit_ddt`.

    tree: the highest-``log_joint`` tree seen (a single :class:`Tree`).
    labels: ``cut_tree(tree, t_stop)`` (or ``num_clusters``), ``(n,)`` int32.
    log_joint: trace ``(num_chains, num_samples)`` of the unnormalised log posterior.
    c, sigma: the hyperparameters at the best draw (``sigma`` is ``None`` for the cut model).
    t_stop: the cut used (``None`` when ``num_clusters`` was given; the cut model: the best
        draw's stopping time).
    samples: all draws, ``{"tree", "c", "sigma"}`` (the cut model: ``{"tree", "c", "t_stop"}``,
        ``"t_stop"`` only when it has a prior) grouped by chain ``(num_chains, num_samples, …)``.
    """

    tree: Tree
    labels: np.ndarray
    log_joint: np.ndarray
    c: float
    sigma: float | None
    t_stop: float | None
    samples: dict


#: the most points ``init="ward"`` takes (SciPy's Ward linkage holds n(n−1)/2 distances: 3.6 GB here)
_MAX_WARD_POINTS = 30_000


def _ddt_model(X, c_params, sigma_params, noise, *, c_tree, sigma_tree):
    """:func:`fit_ddt`'s model: ``c ~ c_prior``, ``σ ~ sigma_prior``, ``tree ~ DiffusionTree(c, n)``,
    ``X ~ BrownianLeaves(tree, σ, noise)``; the priors come as their pytree structure and
    parameters (``jax.tree.flatten``), so that the parameters are traced arguments."""
    c = numpyro.sample("c", jax.tree.unflatten(c_tree, c_params))
    sigma = numpyro.sample("sigma", jax.tree.unflatten(sigma_tree, sigma_params))
    tree = numpyro.sample("tree", DiffusionTree(c, X.shape[0]))
    numpyro.sample("X", BrownianLeaves(tree, sigma, noise), obs=X)


def _cut_model(X, c_params, t_params, family, *, c_tree, t_tree):
    """:func:`fit_ddt`'s cut model: ``c ~ c_prior``, ``t_stop ~ t_stop_prior`` (or the fixed
    ``t_params`` when ``t_tree`` is ``None``), ``tree ~ DiffusionTree(c, n)``,
    ``z = cut_tree(tree, t_stop)``, ``X ~ ConjugateMixture(family, z)``."""
    c = numpyro.sample("c", jax.tree.unflatten(c_tree, c_params))
    t_stop = t_params if t_tree is None else numpyro.sample("t_stop", jax.tree.unflatten(t_tree, t_params))
    tree = numpyro.sample("tree", DiffusionTree(c, X.shape[0]))
    z = numpyro.deterministic("z", cut_tree(tree, t_stop))
    numpyro.sample("X", ConjugateMixture(family, z), obs=X)


def _collect(state) -> dict:
    """What :func:`fit_ddt` keeps of a kernel state at each draw: the sites and ``log_joint``."""
    return {"z": state.z, "log_joint": state.log_joint}


def fit_ddt(
    X: Any,
    num_chains: int = 8,
    num_samples: int = 200,
    key: jax.Array | None = None,
    *,
    num_warmup: int | None = None,
    population: bool = True,
    init: str = "ward",
    subset_size: int | None = None,
    temperature: float = 1.0,
    c_prior: Any = None,
    sigma_prior: Any = None,
    noise: float | None = None,
    t_stop: float | None = None,
    num_clusters: int | None = None,
    progress_bar: bool | None = None,
    heartbeat: Any = None,
    model: str = "brownian",
    family: Family | None = None,
    t_stop_prior: Any = None,
) -> DDTFit:
    """Fit a Dirichlet diffusion tree to ``X`` and cut it into clusters (docs/mathematics.md §5).

    Model: ``c ~ c_prior`` (default ``LogNormal(0, 1)``), ``σ ~ sigma_prior``
    (default ``LogNormal(log sd(X), 1)``, sd over all entries),
    ``tree ~ DiffusionTree(c, n)``, ``X ~ BrownianLeaves(tree, σ, noise)``
    with fixed ``noise`` (default ``0.1 · sd(X)``). Runs :class:`PopulationDDT`
    (``population=True``, needs ``num_chains >= 2``) or vectorised independent
    :class:`DiffusionTreeMCMC` chains through :func:`jaxbnp.inference.runner.run`
    (the draws of ``numpyro.infer.MCMC(..., chain_method="vectorized")``);
    returns the best tree seen, its labels
    from :func:`~jaxbnp.models.ddt.cut_tree` at ``t_stop`` (default 0.5) or at
    ``num_clusters``, the ``log_joint`` trace and all draws. ``subset_size``
    defaults to ``max(1, min(n − 1, n // 4, 8))`` (each exchanged leaf costs
    four O(n D) re-attachments, so the exchange stays cheaper than the sweep). ``progress_bar``: a bar
    (``None``: auto, shown only on a terminal outside CI; ``jaxbnp._progress``).
    ``heartbeat``: an object with ``tick(n)``, advanced as the run goes (``runner.run``).

    ``model="cut"``: the seed's cut model (docs/mathematics.md §5, "The cut model"):
    ``tree ~ DiffusionTree(c, n)`` cut at ``t_stop`` over ``ConjugateMixture(family, ·)``,
    ``family`` default ``NormalWishart.from_data(X)``. The stopping time has a prior,
    ``t_stop_prior`` (default ``Beta(2, 2)``), unless ``t_stop`` fixes it; ``labels`` are the
    best draw's partition (``num_clusters`` does not apply). ``sigma_prior`` and ``noise``
    do not apply either.

    ``init``: where every chain's tree starts. ``"ward"`` (default): the Ward
    linkage tree of ``X`` (SciPy; O(n²) memory) with times from its merge
    heights (:func:`~jaxbnp.models.ddt.from_linkage`), so that a short run at
    thousands of points starts near the trees the posterior favours; ``c`` and
    ``σ`` start from their priors. ``"prior"``: the tree too is a prior draw per
    chain (the kernels' own ``init_strategy="prior"``). Either way the chains
    target the same posterior; only the start differs.
    """
    Xn = check_data(X)
    n = Xn.shape[0]
    if n < 2:
        raise ValueError(f"fit_ddt needs at least 2 points, got {n}.")
    if model not in ("brownian", "cut"):
        raise ValueError(f"model must be 'brownian' or 'cut', got {model!r}.")
    if model == "cut":
        if num_clusters is not None:
            raise ValueError("model='cut' labels by the model's own cut at t_stop: num_clusters does not apply.")
        if t_stop is not None and t_stop_prior is not None:
            raise ValueError("Pass t_stop (fixed) or t_stop_prior, not both.")
        if t_stop is not None and not 0.0 < float(t_stop) < 1.0:
            raise ValueError(f"t_stop must be in (0, 1) for model='cut', got {t_stop}.")
        if family is not None and not isinstance(family, Family):
            raise ValueError(f"family must be a conjugate family (bnp.NormalWishart, ...), got {family!r}.")
    elif family is not None or t_stop_prior is not None:
        raise ValueError("family and t_stop_prior are options of model='cut'.")
    if init not in ("ward", "prior"):
        raise ValueError(f"init must be 'ward' or 'prior', got {init!r}.")
    if init == "ward" and n > _MAX_WARD_POINTS:
        raise ValueError(
            f"init='ward' computes all {n * (n - 1) // 2:,} pairwise distances ({n} points; at most "
            f"{_MAX_WARD_POINTS:,}): pass init='prior' or fit a subsample."
        )
    for name, value in (("num_chains", num_chains), ("num_samples", num_samples)):
        if int(value) < 1:
            raise ValueError(f"{name} must be >= 1, got {value}.")
    if population and int(num_chains) < 2:
        raise ValueError("population=True needs num_chains >= 2 (or pass population=False).")
    if t_stop is not None and num_clusters is not None:
        raise ValueError("Pass t_stop or num_clusters, not both.")
    if t_stop is not None and not 0.0 < float(t_stop) <= 1.0:
        raise ValueError(f"t_stop must be in (0, 1], got {t_stop}.")
    if num_clusters is not None and not 1 <= int(num_clusters) <= n:
        raise ValueError(f"num_clusters must be in 1..{n}, got {num_clusters}.")
    scale = float(np.std(Xn)) or 1.0
    noise = 0.1 * scale if noise is None else float(noise)
    if noise < 0 or not np.isfinite(noise):
        raise ValueError(f"noise must be >= 0, got {noise}.")
    c_prior = dist.LogNormal(0.0, 1.0) if c_prior is None else c_prior
    sigma_prior = dist.LogNormal(float(np.log(scale)), 1.0) if sigma_prior is None else sigma_prior
    if subset_size is None:
        subset_size = max(1, min(n - 1, n // 4, 8))
    Xj = jnp.asarray(Xn, jnp.result_type(float))
    num_chains, num_samples = int(num_chains), int(num_samples)

    # the priors' parameters and the noise are arguments of the compiled program, their
    # structure is its cache key: a second fit with the same settings compiles nothing
    c_leaves, c_tree = jax.tree.flatten(c_prior)
    c_args = [jnp.asarray(v, Xj.dtype) for v in c_leaves]
    if model == "cut":
        from ...models.families import NormalWishart

        family = NormalWishart.from_data(Xn) if family is None else family
        if t_stop is None:
            t_leaves, t_tree = jax.tree.flatten(dist.Beta(2.0, 2.0) if t_stop_prior is None else t_stop_prior)
            t_args = [jnp.asarray(v, Xj.dtype) for v in t_leaves]
        else:
            t_tree, t_args = None, jnp.asarray(t_stop, Xj.dtype)
        s_tree = t_tree
        kernel_model = functools.partial(_cut_model, c_tree=c_tree, t_tree=t_tree)
        args = (Xj, c_args, t_args, family)
    else:
        s_leaves, s_tree = jax.tree.flatten(sigma_prior)
        kernel_model = functools.partial(_ddt_model, c_tree=c_tree, sigma_tree=s_tree)
        args = (Xj, c_args, [jnp.asarray(v, Xj.dtype) for v in s_leaves], jnp.asarray(noise, Xj.dtype))
    try:
        cache_key = ("fit_ddt", model, population, num_chains, int(subset_size), float(temperature),
                     c_tree, s_tree, jax.tree.structure(family) if model == "cut" else None)
        hash(cache_key)
    except TypeError:  # a prior whose structure is not hashable: compile afresh
        cache_key = None

    def make_kernel(capacity):  # no cluster capacity: capacity is None
        if population:
            return PopulationDDT(kernel_model, num_chains, int(subset_size), temperature)
        return DiffusionTreeMCMC(kernel_model)

    init_params = None
    if init == "ward":
        from scipy.cluster.hierarchy import ward

        tree0 = from_linkage(ward(Xn), dtype=Xj.dtype)
        if num_chains > 1:
            tree0 = jax.tree.map(lambda a: jnp.broadcast_to(a, (num_chains, *a.shape)), tree0)
        init_params = {"tree": tree0}
    auto_enable()  # the persistent compilation cache (jaxbnp._cache)
    result = run(
        make_kernel, jax.random.key(0) if key is None else key, args,
        num_warmup=num_samples // 2 if num_warmup is None else int(num_warmup),
        num_samples=num_samples, num_chains=num_chains, collect=_collect, init_params=init_params,
        progress_bar=progress_bar, description="ddt", heartbeat=heartbeat,
        cache_key=cache_key,
    )
    samples = result.samples["z"]
    lj = np.asarray(result.samples["log_joint"]).reshape(num_chains, -1)
    ci, si = np.unravel_index(np.nanargmax(lj), lj.shape)
    best = jax.tree.map(lambda a: a[ci, si], samples["tree"])
    c_best = float(np.asarray(samples["c"])[ci, si])
    if model == "cut":
        used = float(np.asarray(samples["t_stop"])[ci, si]) if t_stop is None else float(t_stop)
        labels = cut_tree(best, jnp.asarray(used, best.time.dtype))
        return DDTFit(best, np.asarray(labels), lj, c_best, None, used, samples)
    if num_clusters is not None:
        labels = cut_tree(best, num_clusters=int(num_clusters))
        used = None
    else:
        used = 0.5 if t_stop is None else float(t_stop)
        labels = cut_tree(best, used)
    s_best = float(np.asarray(samples["sigma"])[ci, si])
    return DDTFit(best, np.asarray(labels), lj, c_best, s_best, used, samples)
