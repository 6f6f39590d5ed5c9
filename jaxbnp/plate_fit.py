"""The plate path of :class:`jaxbnp.DirichletProcessMixture`: ``method="auxiliary"`` or
``"slice"`` with a ``likelihood`` whose cluster parameters are sampled beside the labels
(docs/mathematics.md §8-9).

:func:`fit` runs the kernel (``bnp.AuxiliaryGibbs`` or ``bnp.SliceGibbs``) on a built-in
likelihood (:mod:`jaxbnp.models.likelihoods`, standardised columns for ``"normal"`` and
``"student-t"``) or on the user's model, through :func:`jaxbnp.inference.runner.run` (which
grows a built-in plate that fills), and keeps per draw the labels and every slot's
parameters. :func:`terms` gives the posterior predictive of new points: in each draw, the
urn's weight of each cluster times its density, and the new-cluster weight times the prior
predictive, a mean over :data:`PRIOR_DRAWS` prior draws of a slot's parameters.
:func:`mixed_terms` and :func:`overlap_counts` are shared with the conjugate path.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from . import _defaults as defaults
from .inference.runner import run
from .models.likelihoods import LIKELIHOODS, STANDARDISED, check_likelihood_data, default_prior, plate_mixture
from .models.measures import DP, PitmanYor

__all__ = ["PLATE_METHODS", "PRIOR_DRAWS", "PLATE_CAPACITY", "SMALL_BLOCK", "BLOCK", "PlateCollect", "plate_kernel",
           "prior_slot_draws", "plate_block", "mixed_terms", "overlap_counts", "check_settings", "Settings", "fit", "terms", "blocked"]

#: points per block of prediction (inputs are padded to these sizes to reuse compiled code)
SMALL_BLOCK, BLOCK = 8, 64
PLATE_METHODS, PLATE_CAPACITY = defaults.PLATE_METHODS, defaults.PLATE_CAPACITY


def mixed_terms(lp, lp0, log_weight, log_weight_new, overlap):
    """One point's ``(log p(x | X), proba existing (K_hat,), proba new)`` from its log density
    in every draw's clusters ``lp`` ``(T, K)`` and in a new cluster ``lp0`` (``(T,)`` or
    scalar), averaged over the ``T`` draws."""
    existing = jnp.where(jnp.isfinite(log_weight), log_weight + lp, -jnp.inf)
    new = log_weight_new + lp0
    total = jnp.logaddexp(jax.nn.logsumexp(existing), jax.nn.logsumexp(new))
    proba = jnp.einsum("tj,tjk->k", jnp.exp(existing - total), overlap)
    proba_new = jnp.exp(jax.nn.logsumexp(new) - total)
    return total - jnp.log(log_weight.shape[0]), proba, proba_new


def overlap_counts(draws, estimate, k_max) -> np.ndarray:
    """``|C_tj ∩ Ĉ_k|``: points of draw ``t``'s cluster ``j`` in the estimate's cluster ``k``,
    ``(T, k_max, K_hat)``."""
    T = draws.shape[0]
    k_hat = int(estimate.max()) + 1
    codes = (np.arange(T)[:, None] * k_max + draws) * k_hat + estimate[None, :]
    return np.bincount(codes.ravel(), minlength=T * k_max * k_hat).reshape(T, k_max, k_hat)


#: prior draws of a slot's parameters behind the new-cluster density of the predictive
PRIOR_DRAWS = 256


class PlateCollect(NamedTuple):
    """What the estimator keeps of each draw of a plate kernel: the labels, the parameter sites
    (``"site:<name>"``), the log joint and ``K``."""

    partition_site: str
    param_sites: tuple

    def __call__(self, state):
        out = {"labels": state.z[self.partition_site], "log_joint": state.log_joint,
               "num_clusters": state.num_clusters}
        out.update({f"site:{name}": state.z[name] for name in self.param_sites})
        return out


def plate_kernel(method, model, options):
    from .inference import AuxiliaryGibbs, SliceGibbs

    return (AuxiliaryGibbs if method == "auxiliary" else SliceGibbs)(model, **dict(options))


def prior_slot_draws(model, spec, args, seed, num_slots):
    """``ceil(PRIOR_DRAWS / C)`` prior draws of every slot's parameters, leaves ``(R, ...)``."""
    reps = -(-PRIOR_DRAWS // num_slots)
    keys = jax.random.split(jax.random.fold_in(jax.random.key(seed), 2), reps)
    return jax.tree.map(np.asarray, _prior_draws(model, spec, args, keys))


@functools.partial(jax.jit, static_argnums=(0, 1))
def _prior_draws(model, spec, args, keys):
    """:func:`prior_slot_draws`' program: one per model, spec and shapes, reused by later fits."""
    from .inference.adapter import trace_model

    zeros = jnp.zeros(spec.num_points, jnp.int32)

    def one(key):
        tr = trace_model(model, {spec.partition_site: zeros}, args, None, key=key)
        return {name: tr[name]["value"] for name in spec.param_sites}

    return jax.vmap(one)(keys)


@functools.partial(jax.jit, static_argnums=(0, 1))
def plate_block(model, spec, X_block, extra, params, prior_params, log_weight, log_weight_new,
                 overlap):
    """Log posterior predictive density and assignment probabilities of a block of points
    under a plate model: every draw's slots (``params``, leaves ``(T, ...)``) and, for a new
    cluster, the mean density over the prior draws ``prior_params``."""
    from .inference.partition.auxiliary import ClusterModel

    m = ClusterModel(model, spec._replace(num_points=X_block.shape[0]), (X_block, *extra), None)
    lp = jax.vmap(m.log_lik_matrix)(params)  # (T, b, C)
    lp_prior = jax.vmap(m.log_lik_matrix)(prior_params)  # (R, b, C)
    size = lp_prior.shape[0] * lp_prior.shape[2]
    lp0 = jax.nn.logsumexp(lp_prior, axis=(0, 2)) - jnp.log(size)  # (b,)
    return jax.vmap(lambda l, l0: mixed_terms(l, l0, log_weight, log_weight_new, overlap),
                    in_axes=(1, 0))(lp, lp0)


def check_settings(method, likelihood, family, measure_given, measure, capacity, init) -> None:
    """``ValueError`` for ``DirichletProcessMixture`` settings that do not go together with a
    likelihood (``measure``: the one used, ``measure_given``: the parameter)."""
    lik = likelihood
    if lik is not None and not callable(lik) and not (isinstance(lik, str) and lik in LIKELIHOODS):
        raise ValueError(f"likelihood must be None, one of {LIKELIHOODS} or a NumPyro model with a "
                         f"cluster plate, got {lik!r}.")
    if method not in PLATE_METHODS:
        if lik is not None:
            raise ValueError(f"likelihood={lik!r} is fitted by method='auxiliary' (Neal's Algorithm "
                             f"8) or method='slice' (Walker's slice sampler), not method={method!r}; "
                             "a conjugate family goes in family=.")
        return
    if family is not None:
        raise ValueError(f"method={method!r} samples a likelihood with its cluster parameters "
                         "(likelihood=); family= is for the conjugate methods.")
    if callable(lik) and measure_given is not None:
        raise ValueError("With a model as likelihood=, its Partition site holds the measure; "
                         "leave measure=None.")
    if callable(lik) and capacity is not None:
        raise ValueError("With a model as likelihood=, its cluster plate's size is the capacity; "
                         "leave capacity=None.")
    if not isinstance(measure, (DP, PitmanYor)):
        raise ValueError(f"method={method!r} supports DP and PitmanYor measures, got "
                         f"{type(measure).__name__}.")
    if init == "kmeans++":
        raise ValueError(f"method={method!r} starts from init='one' or 'prior', not 'kmeans++' "
                         "(its cluster parameters would start from the prior, not from the k-means "
                         "clusters).")


class Settings(NamedTuple):
    """The estimator's settings that :func:`fit` reads (``DirichletProcessMixture``'s
    parameters, checked)."""

    method: str
    likelihood: object
    capacity: int | None
    init: str | None
    num_chains: int
    num_warmup: int
    num_samples: int
    thinning: int
    point_estimate: str
    progress_bar: bool | None


def fit(settings: Settings, X, measure, options: dict, seed: int) -> tuple[dict, dict]:
    """Run the plate kernel on ``X`` (validated, ``(n, D)``; ``measure`` and ``options``
    checked; module docstring): ``(attributes, state)``, the estimator's fitted attributes
    (``labels_``, ``n_clusters_``, ``posterior_samples_``, ``cluster_sites_``, ``measure_``,
    ``family_``, ``capacity_``) and what :func:`terms` needs."""
    from .metrics import point_estimate

    s = settings
    lik = "normal" if s.likelihood is None else s.likelihood
    builtin = isinstance(lik, str)
    n = X.shape[0]
    scaling = None
    dtype = jnp.result_type(float)
    if builtin:
        check_likelihood_data(lik, X)
        if lik in STANDARDISED:
            scaling = defaults.standardisation(X)
            X = (X - scaling[0]) / scaling[1]
        prior = {k: jnp.asarray(v, dtype) for k, v in default_prior(lik, X).items()}
        extra = (measure, prior)
        capacity = min(n, PLATE_CAPACITY[s.method]) if s.capacity is None else int(s.capacity)
        make_model = functools.partial(plate_mixture, lik)
    else:
        extra, capacity = (), None
        make_model = lambda _: lik  # noqa: E731  (the plate's own size)
    if s.init in ("one", "prior"):
        options.setdefault("init_strategy", s.init)
    options_key = tuple(sorted(options.items()))
    args = (jnp.asarray(X, dtype), *extra)
    tr, spec = plate_kernel(s.method, make_model(capacity), options_key).read_model({}, args, {})
    if not builtin:
        _check_likelihood_site(tr, spec, X.shape)
    result = run(
        lambda c: plate_kernel(s.method, make_model(c), options_key), jax.random.key(seed), args,
        num_warmup=s.num_warmup, num_samples=s.num_samples, num_chains=s.num_chains,
        thinning=s.thinning, collect=PlateCollect(spec.partition_site, spec.param_sites),
        capacity=capacity, max_capacity=(n if s.method == "auxiliary" else None) if builtin else None,
        progress_bar=s.progress_bar, description=s.method,
        cache_key=("plate", s.method, options_key, lik, type(measure).__name__),
    )
    model = make_model(result.capacity)
    if result.capacity != capacity:  # the plate grew: its spec has the new number of slots
        tr, spec = plate_kernel(s.method, model, options_key).read_model({}, args, {})
    measure = tr[spec.partition_site]["fn"].measure
    samples = dict(result.samples)
    labels = samples.pop("labels").astype(np.int32)
    chains, draws = labels.shape[:2]
    flat = labels.reshape(-1, n)
    estimate = point_estimate(flat, loss=s.point_estimate)
    C = spec.capacity
    overlap = overlap_counts(flat, estimate, C)
    counts = overlap.sum(axis=2)  # each draw's cluster sizes
    log_w, log_w_new = jax.vmap(measure.gibbs_log_weights)(jnp.asarray(counts, dtype))
    log_w_new = jnp.broadcast_to(log_w_new, (flat.shape[0],))
    norm = jnp.logaddexp(jax.nn.logsumexp(log_w, axis=1), log_w_new)
    params, sorted_params = {}, {}
    best = np.argmax(overlap, axis=1)  # (T, K_hat): each draw's slot of each cluster
    for name in spec.param_sites:
        raw = np.asarray(samples.pop(f"site:{name}"))
        params[name] = raw = raw.reshape(flat.shape[0], *raw.shape[2:])
        slot_first = np.moveaxis(raw, 1 + spec.slot_axis(name), 1)
        picked = np.take_along_axis(slot_first, best.reshape(best.shape + (1,) * (raw.ndim - 2)), axis=1)
        sorted_params[name] = picked.reshape(chains, draws, *picked.shape[1:])
    attributes = dict(
        labels_=estimate, n_clusters_=int(estimate.max()) + 1,
        posterior_samples_={"labels": labels, "log_joint": np.asarray(samples["log_joint"]),
                            "num_clusters": np.asarray(samples["num_clusters"]).astype(np.int64),
                            **sorted_params},
        cluster_sites_=tuple(spec.param_sites), measure_=measure, family_=None, capacity_=C)
    state = {
        "spec": spec, "likelihood": lik if builtin else None, "scaling": scaling,
        "extra": jax.tree.map(np.asarray, extra),
        "params": params, "prior_params": prior_slot_draws(model, spec, args, seed, C),
        "log_weight": np.asarray(log_w - norm[:, None]), "log_weight_new": np.asarray(log_w_new - norm),
        "overlap": overlap / np.maximum(counts, 1)[:, :, None],
    }
    return attributes, state


def _check_likelihood_site(tr, spec, shape_X) -> None:
    """A model of the user's must give one log density per row of the 2-D ``X``."""
    site = tr[spec.likelihood_site]
    shape = tuple(jnp.shape(site["fn"].log_prob(site["value"])))
    if shape[:1] != shape_X[:1] or math.prod(shape) > math.prod(np.shape(site["value"])):
        raise ValueError(
            f"The model's likelihood site '{spec.likelihood_site}' gives log densities of shape "
            f"{shape} for X of shape {shape_X}: it needs one log density per point. The estimator "
            "passes X as a 2-D array (n, D); write the likelihood over its columns, e.g. "
            "dist.Poisson(rate[z][:, None]).to_event(1) (or use X[:, 0] for one column).")


def terms(state: dict, model, X) -> tuple:
    """``(log density (m,), proba existing (m, K), proba new (m,))`` of new points ``X``
    (validated, in the data's units) under a fit's ``state``; ``model``: the user's model
    (``None`` for a built-in likelihood)."""
    t = state
    spec, lik, scaling = t["spec"], t["likelihood"], t["scaling"]
    if lik is not None:
        check_likelihood_data(lik, X)
        model = plate_mixture(lik, spec.capacity)
    if scaling is not None:
        X = (X - scaling[0]) / scaling[1]
    return blocked(X, scaling, lambda block: plate_block(
        model, spec, block, t["extra"], t["params"], t["prior_params"], t["log_weight"],
        t["log_weight_new"], t["overlap"]))


def blocked(Z, scaling, block_fn) -> tuple:
    """``block_fn`` over the rows of ``Z`` (new points in the fit's coordinates) in blocks of
    :data:`SMALL_BLOCK` or :data:`BLOCK` rows, the last padded (one compiled program per block
    size, whatever the number of points): ``(log density (m,), proba existing (m, K), proba
    new (m,))``, the density of ``x`` in the data's units when the fit was in standardised
    coordinates (``scaling``: ``(shift, scale)``)."""
    m = Z.shape[0]
    block = SMALL_BLOCK if m <= SMALL_BLOCK else BLOCK
    padded = -(-m // block) * block
    Zp = np.concatenate([Z, np.repeat(Z[:1], padded - m, axis=0)])  # valid rows, dropped below
    Zp = jnp.asarray(Zp, dtype=jnp.result_type(float))
    outs = [block_fn(Zp[i:i + block]) for i in range(0, padded, block)]
    log_density, proba, proba_new = (
        np.concatenate([np.asarray(o[k]) for o in outs])[:m] for k in range(3))
    if scaling is not None:  # the density of x, not of its standardised coordinates
        log_density = log_density - np.sum(np.log(scaling[1]))
    return log_density, proba, proba_new
