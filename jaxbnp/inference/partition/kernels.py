"""NumPyro ``MCMCKernel`` adapters over the pure jaxbnp cores.

``CollapsedGibbs(model)`` reads the model's trace to find its ``Partition``
site and its observed ``ConjugateMixture`` site, then runs collapsed Gibbs
sweeps (``jaxbnp.inference.partition.gibbs``). It works under
``MCMC(..., chain_method="sequential" | "vectorized" | "parallel")`` with the
same draws for the same key, and as a block of ``numpyro.infer.Gibbs`` next
to ``NUTS`` (hyperparameters by NUTS, the partition by jaxbnp).
``collapsed_gibbs_fn`` gives the same update as a ``gibbs_fn`` for
``numpyro.infer.HMCGibbs``.

Example
-------
>>> import jax, numpyro, jaxbnp as bnp
>>> from numpyro.infer import MCMC
>>> def model(X):
...     z = numpyro.sample("z", bnp.Partition(bnp.DP(1.0), X.shape[0]))
...     numpyro.sample("X", bnp.ConjugateMixture(bnp.NormalGamma(), z), obs=X)
>>> mcmc = MCMC(bnp.CollapsedGibbs(model), num_warmup=10, num_samples=10, progress_bar=False)
>>> mcmc.run(jax.random.key(0), jax.numpy.zeros((5, 1)))
>>> mcmc.get_samples()["z"].shape
(10, 5)
"""

from __future__ import annotations

import copy
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
from numpyro.handlers import seed, substitute, trace
from numpyro.infer.mcmc import MCMCKernel
from numpyro.util import is_prng_key

from ..._validation import check_data, check_labels
from ...models.distributions import AuxiliaryU, ConjugateMixture, Partition
from ...models.measures import DP, NGGP
from . import gibbs as gibbs_core
from .clusters import (
    ClusterState, canonical_labels, cluster_log_joint, clusters_from_labels, raise_if_overflow,
)

__all__ = [
    "CollapsedGibbs", "CollapsedGibbsState", "MoveStatsKernel", "MoveStatsState", "collapsed_gibbs_fn",
    "ModelSpec",
]

#: capacity used when ``capacity=None`` and the data have more points than this
DEFAULT_CAPACITY = 128


class CollapsedGibbsState(NamedTuple):
    """State of ``CollapsedGibbs``.

    z: dict of the sites the kernel owns (labels in order of first appearance,
       ``u`` for NGGP, hyperparameters when ``update_hyperparameters=True``).
    clusters: the fixed-capacity ``ClusterState``.
    log_joint: ``log p(X, Π[, u])`` after the step (docs/mathematics.md §2).
    num_clusters: ``K`` after the step.
    rng_key: key for the next step.
    """

    z: dict
    clusters: ClusterState
    log_joint: jax.Array
    num_clusters: jax.Array
    rng_key: jax.Array


class ModelSpec(NamedTuple):
    """What the kernel reads off one trace of the model."""

    partition_site: str
    observation_site: str
    u_site: str | None
    alpha_site: str | None
    sigma_site: str | None
    num_points: int


def _trace_model(model, z: dict, model_args, model_kwargs, fill_partition: bool = False):
    def fill(site):
        if isinstance(site["fn"], Partition) and not site["is_observed"]:
            return jnp.zeros(site["fn"].num_points, jnp.int32)
        if isinstance(site["fn"], AuxiliaryU) and not site["is_observed"]:
            return jnp.ones(())
        return None

    m = substitute(model, data=z)
    if fill_partition:
        m = substitute(m, substitute_fn=fill)
    return trace(seed(m, jax.random.key(0))).get_trace(*model_args, **(model_kwargs or {}))


def _find_spec(model_trace, update_hyperparameters: bool) -> ModelSpec:
    partitions = [
        name for name, s in model_trace.items()
        if s["type"] == "sample" and isinstance(s["fn"], Partition) and not s["is_observed"]
    ]
    if len(partitions) != 1:
        raise ValueError(
            "CollapsedGibbs needs a model with exactly one latent Partition site, e.g. "
            "z = numpyro.sample('z', bnp.Partition(bnp.DP(1.0), n)); "
            f"found {len(partitions)} ({partitions})."
        )
    observations = [
        name for name, s in model_trace.items()
        if s["type"] == "sample" and isinstance(s["fn"], ConjugateMixture) and s["is_observed"]
    ]
    if len(observations) != 1:
        raise ValueError(
            "CollapsedGibbs needs exactly one observed ConjugateMixture site, e.g. "
            "numpyro.sample('X', bnp.ConjugateMixture(family, z), obs=X); "
            f"found {len(observations)}."
        )
    p_site = model_trace[partitions[0]]
    obs_site = model_trace[observations[0]]
    if obs_site["fn"].labels.shape != (p_site["fn"].num_points,):
        raise ValueError(
            f"The ConjugateMixture site '{observations[0]}' must take the Partition site's "
            f"value ('{partitions[0]}') as its labels."
        )
    measure = p_site["fn"].measure
    u_site = None
    if measure.has_auxiliary:
        if p_site["fn"].u is None:
            raise ValueError(
                "NGGP needs its auxiliary variable as a model site: "
                "u = numpyro.sample('u', bnp.AuxiliaryU()); "
                "z = numpyro.sample('z', bnp.Partition(bnp.NGGP(...), n, u=u))."
            )
        for name, s in model_trace.items():
            if s["type"] == "sample" and s["value"] is p_site["fn"].u and not s["is_observed"]:
                u_site = name
    owned = {partitions[0]} | ({u_site} if u_site else set())
    alpha_site = sigma_site = None
    if update_hyperparameters:
        if not isinstance(measure, (DP, NGGP)):
            raise ValueError(
                "update_hyperparameters=True supports DP (Escobar-West alpha) and NGGP "
                "(conjugate alpha, slice sigma); compose NUTS through numpyro.infer.Gibbs "
                f"for {type(measure).__name__}."
            )
        for name, s in model_trace.items():
            if s["type"] != "sample" or s["is_observed"]:
                continue
            if s["value"] is measure.alpha:
                if not isinstance(s["fn"], dist.Gamma):
                    raise ValueError(
                        f"update_hyperparameters=True needs a Gamma prior on alpha (site '{name}'), "
                        f"got {type(s['fn']).__name__}."
                    )
                alpha_site = name
            if isinstance(measure, NGGP) and s["value"] is measure.sigma:
                if not isinstance(s["fn"], dist.Beta):
                    raise ValueError(
                        f"update_hyperparameters=True needs a Beta prior on sigma (site '{name}'), "
                        f"got {type(s['fn']).__name__}."
                    )
                sigma_site = name
        if alpha_site is None and sigma_site is None:
            raise ValueError(
                "update_hyperparameters=True but no hyperparameter of the measure is a sample "
                "site; declare e.g. alpha = numpyro.sample('alpha', dist.Gamma(1, 1)) and "
                "pass it to the measure unchanged."
            )
        owned |= {s for s in (alpha_site, sigma_site) if s}
    others = [
        name for name, s in model_trace.items()
        if s["type"] == "sample" and not s["is_observed"] and name not in owned
    ]
    if others:
        raise ValueError(
            f"The model has latent sites {others} that CollapsedGibbs does not update. "
            "Update them with NUTS: numpyro.infer.Gibbs([(bnp.CollapsedGibbs(model), "
            f"['{partitions[0]}']), (NUTS(model), None)]), or, for the measure's alpha/sigma, "
            "pass update_hyperparameters=True."
        )
    return ModelSpec(
        partitions[0], observations[0], u_site, alpha_site, sigma_site, p_site["fn"].num_points
    )


class DiscreteSiteKernel(MCMCKernel):
    """NumPyro adapter plumbing shared by jaxbnp's kernels over discrete / structured sites.

    The sites are used as they are (no constraint transform), a wrapped model
    gets a fresh kernel whose model spec and compiled sample function are
    rebuilt on first use, and pickling drops the compiled function. Subclasses
    keep the model in ``_model``, its parsed spec in ``_spec`` and the compiled
    sample function in ``_sample_fn``.
    """

    @property
    def model(self):
        return self._model

    @property
    def default_fields(self):
        return ("z",)

    def wrap_model(self, wrapper):
        kernel = copy.copy(self)
        kernel._model = wrapper(self._model)
        kernel._spec = None
        kernel._sample_fn = None
        return kernel

    def get_constrain_fn(self, model_args, model_kwargs):
        return lambda z: z

    def postprocess_fn(self, model_args, model_kwargs):
        return lambda z: z

    def __getstate__(self):
        d = self.__dict__.copy()
        d["_sample_fn"] = None
        return d


class CollapsedGibbs(DiscreteSiteKernel):
    """Collapsed Gibbs sampler (Neal's algorithm 3) for ``Partition`` + ``ConjugateMixture`` models.

    :param model: a NumPyro model with one latent ``Partition`` site and one
        observed ``ConjugateMixture`` site (see the module example).
    :param capacity: number of cluster slots; ``None`` means ``n`` when
        ``n <= 128``, else 128. A step that needs more raises ``CapacityError``
        (pass a larger value); nothing is truncated.
    :param init_strategy: initial partition when ``init_params`` has none:
        ``"one"`` (all points in one cluster), ``"singletons"`` or ``"prior"``
        (a draw from the partition prior, O(n²)).
    :param chain_batching: how ``chain_method="vectorized"`` runs the chains in
        one program: ``"vmap"`` (batched), ``"map"`` (``lax.map``, one chain
        after another) or ``"auto"``: ``"map"`` on CPU, ``"vmap"`` elsewhere.
        Measured on a 2-core CPU (``benchmarks/gibbs.py``): a sweep is a
        sequential loop over points, so batching chains cannot share work, and
        batched scatters copy the cluster state each step; 64 vmapped chains
        cost about 110x one chain, 64 mapped chains 63x. Draws are identical.
    :param update_hyperparameters: also update the measure's hyperparameters
        when they are sample sites: DP ``alpha ~ Gamma`` by Escobar-West,
        NGGP ``alpha ~ Gamma`` (conjugate given ``u``) and ``sigma ~ Beta``
        (slice on the logit).

    State: :class:`CollapsedGibbsState`; extra fields ``"log_joint"`` and
    ``"num_clusters"`` can be collected with ``MCMC.run(..., extra_fields=...)``.

    Attribute ``host_overflow_check`` (default ``True``): a step that needs more
    than ``capacity`` clusters raises ``CapacityError`` at once, through a host
    callback. Set it to ``False`` to leave that to the caller: the flag
    ``state.clusters.overflow`` is then sticky, and a run whose
    ``mcmc.last_state.clusters.overflow`` is set must be discarded and
    repeated with a larger capacity (what the ``jaxbnp`` CLI does). Programs
    without a host callback can be kept by JAX's persistent compilation cache.
    """

    sample_field = "z"
    host_overflow_check = True

    def __init__(
        self,
        model: Callable,
        *,
        capacity: int | None = None,
        init_strategy: str = "one",
        update_hyperparameters: bool = False,
        chain_batching: str = "auto",
    ):
        if not callable(model):
            raise ValueError("CollapsedGibbs(model): model must be a NumPyro model function.")
        if init_strategy not in ("one", "singletons", "prior"):
            raise ValueError(
                f"init_strategy must be 'one', 'singletons' or 'prior', got {init_strategy!r}."
            )
        if chain_batching not in ("auto", "vmap", "map"):
            raise ValueError(f"chain_batching must be 'auto', 'vmap' or 'map', got {chain_batching!r}.")
        if capacity is not None and int(capacity) < 1:
            raise ValueError(f"capacity must be a positive integer, got {capacity}.")
        self._model = model
        self._capacity = capacity
        self._init_strategy = init_strategy
        self._update_hyperparameters = update_hyperparameters
        self._chain_batching = chain_batching
        self._spec: ModelSpec | None = None
        self._sample_fn = None

    def capacity_for(self, num_points: int) -> int:
        if self._capacity is not None:
            return int(self._capacity)
        return num_points if num_points <= DEFAULT_CAPACITY else DEFAULT_CAPACITY

    # -- reading the model --------------------------------------------------------------
    def _read(self, z, model_args, model_kwargs):
        tr = _trace_model(self._model, z, model_args, model_kwargs)
        p_fn = tr[self._spec.partition_site]["fn"]
        obs = tr[self._spec.observation_site]
        priors = {
            name: tr[name]["fn"]
            for name in (self._spec.alpha_site, self._spec.sigma_site)
            if name is not None
        }
        u = p_fn.u if p_fn.u is not None else jnp.ones(())
        return p_fn.measure, obs["fn"].family, jnp.asarray(obs["value"]), u, priors

    def _setup(self, init_params, model_args, model_kwargs):
        z0 = dict(init_params or {})
        tr = _trace_model(self._model, z0, model_args, model_kwargs, fill_partition=True)
        spec = _find_spec(tr, self._update_hyperparameters)
        self._validate_trace(tr, spec)
        obs = tr[spec.observation_site]
        X = obs["value"]
        if not isinstance(X, jax.core.Tracer):
            check_data(X, name=f"observed site '{spec.observation_site}'", family=obs["fn"].family)
        if spec.partition_site in z0 and not isinstance(z0[spec.partition_site], jax.core.Tracer):
            check_labels(np.asarray(z0[spec.partition_site]), spec.num_points, "init_params['z']")
        fixed = {name: tr[name]["value"] for name in (spec.alpha_site, spec.sigma_site) if name}
        return spec, fixed

    # -- MCMCKernel API -----------------------------------------------------------------
    def init(self, rng_key, num_warmup, init_params, model_args, model_kwargs):
        self._spec, hyper0 = self._setup(init_params, model_args, model_kwargs)
        init_params = dict(init_params or {})
        batched = not is_prng_key(rng_key)

        def init_one(key, params):
            return self._init_one(key, params, hyper0, model_args, model_kwargs)

        if batched:
            axes = {k: 0 for k in init_params}
            state = jax.vmap(init_one, in_axes=(0, axes))(rng_key, init_params)
            batching = self._chain_batching
            if batching == "auto":
                batching = "map" if jax.default_backend() == "cpu" else "vmap"
            if batching == "vmap":
                self._sample_fn = jax.vmap(self._sample_one, in_axes=(0, None, None))
            else:
                self._sample_fn = lambda state, args, kwargs: jax.lax.map(
                    lambda s: self._sample_one(s, args, kwargs), state
                )
        else:
            state = init_one(rng_key, init_params)
            self._sample_fn = self._sample_one
        return state

    def _init_one(self, key, params, hyper0, model_args, model_kwargs):
        spec = self._spec
        n = spec.num_points
        capacity = self.capacity_for(n)
        key, k_labels = jax.random.split(key)
        z = {}
        for name, value in hyper0.items():
            z[name] = jnp.asarray(params.get(name, value))
        if spec.u_site is not None:
            z[spec.u_site] = jnp.asarray(params.get(spec.u_site, 1.0), jnp.result_type(float))
        # read the measure, family and data with placeholder labels
        z_read = {**z, spec.partition_site: jnp.zeros(n, jnp.int32)}
        measure, family, X, _, _ = self._read(z_read, model_args, model_kwargs)
        if spec.partition_site in params:
            labels = jnp.asarray(params[spec.partition_site]).astype(jnp.int32)
            labels = canonical_labels(labels, n)
            if not isinstance(labels, jax.core.Tracer) and int(labels.max()) + 1 > capacity:
                raise ValueError(
                    f"init_params['{spec.partition_site}'] has {int(labels.max()) + 1} clusters "
                    f"but capacity is {capacity}; pass capacity >= that."
                )
        else:
            u0 = z.get(spec.u_site, jnp.ones(())) if spec.u_site is not None else jnp.ones(())
            labels = self._init_labels(k_labels, params, measure, family, X, u0, capacity)
        # a prior draw with more clusters than slots is an error, not a truncation
        overflow = labels.max() >= capacity
        labels = jnp.where(labels < capacity, labels, 0)
        clusters = clusters_from_labels(family, X, labels, capacity, overflow)
        if capacity < n and self.host_overflow_check:
            raise_if_overflow(clusters)
        z[spec.partition_site] = labels
        if spec.u_site is not None and spec.u_site not in params and measure.has_auxiliary:
            # u at its conditional mode given the initial partition (NGGP.u_mode)
            z[spec.u_site] = measure.u_mode(clusters.counts).astype(z[spec.u_site].dtype)
        u = z.get(spec.u_site, jnp.ones(()))
        lj = cluster_log_joint(clusters, measure, family, u)
        return CollapsedGibbsState(z, clusters, lj, clusters.num_clusters, key)

    def _init_labels(self, key, params, measure, family, X, u, capacity):
        """Initial labels when ``init_params`` has none (subclasses add strategies)."""
        n = X.shape[0]
        if self._init_strategy == "one":
            return jnp.zeros(n, jnp.int32)
        if self._init_strategy == "singletons":
            if capacity < n:
                raise ValueError(f"init_strategy='singletons' needs capacity >= n = {n}.")
            return jnp.arange(n, dtype=jnp.int32)
        return measure.sample_partition(key, n)

    def _validate_trace(self, model_trace, spec: ModelSpec) -> None:
        """Hook: subclasses reject models they cannot handle (called before anything compiles)."""

    def _sample_one(self, state, model_args, model_kwargs):
        spec = self._spec
        measure, family, X, u, priors = self._read(state.z, model_args, model_kwargs)
        key, k_step, k_alpha, k_sigma = jax.random.split(state.rng_key, 4)
        # partition moves, then (NGGP) u: the pure core step
        core = self._core_step(k_step, gibbs_core.GibbsState(state.clusters, u), X, measure, family)
        clusters, u = core.clusters, core.u
        if clusters.capacity < spec.num_points and self.host_overflow_check:
            raise_if_overflow(clusters)
        z = dict(state.z)
        k = clusters.num_clusters
        if spec.u_site is not None:
            z[spec.u_site] = u
        if spec.alpha_site is not None:
            prior = priors[spec.alpha_site]
            if isinstance(measure, NGGP):
                alpha = gibbs_core.nggp_alpha_update(
                    k_alpha, measure, u, k, prior.concentration, prior.rate
                )
            else:
                alpha = gibbs_core.escobar_west_alpha(
                    k_alpha, measure.alpha, k, spec.num_points, prior.concentration, prior.rate
                )
            measure = measure.replace(alpha=alpha)
            z[spec.alpha_site] = alpha
        if spec.sigma_site is not None:
            prior = priors[spec.sigma_site]
            sigma = gibbs_core.nggp_sigma_update(
                k_sigma, measure, u, clusters.counts, prior.concentration1, prior.concentration0
            )
            measure = measure.replace(sigma=sigma)
            z[spec.sigma_site] = sigma
        z[spec.partition_site] = canonical_labels(clusters.labels, clusters.capacity)
        lj = cluster_log_joint(clusters, measure, family, u)
        return CollapsedGibbsState(z, clusters, lj, k, key)

    def _core_step(
        self, key: jax.Array, state: gibbs_core.GibbsState, X: jax.Array, measure, family
    ) -> gibbs_core.GibbsState:
        """The partition (and ``u``) update of one MCMC iteration: a pure JAX function.

        Subclasses (split-merge, tree-guided MCMC) override this; reading the
        model, hyperparameter updates and the NumPyro protocol are shared.
        """
        return gibbs_core.step(key, state, X, measure, family)

    def sample(self, state, model_args, model_kwargs):
        return self._sample_fn(state, model_args, model_kwargs)

    def refresh(self, state, model_args, model_kwargs):
        """Recompute the cached log joint against the current conditioning values.

        The cluster statistics depend only on the data and the labels, so they
        stay; the log joint depends on sibling sites (e.g. ``alpha`` under NUTS).
        """

        def one(s):
            measure, family, _, u, _ = self._read(s.z, model_args, model_kwargs)
            return s._replace(log_joint=cluster_log_joint(s.clusters, measure, family, u))

        return jax.vmap(one)(state) if jnp.ndim(state.log_joint) else one(state)

    def get_diagnostics_str(self, state):
        return f"K={int(np.max(np.asarray(state.num_clusters)))}"

    def overflowed(self, state) -> bool:
        """Whether a chain ran out of cluster slots (the flag ``host_overflow_check=False``
        leaves in the state; :func:`jaxbnp.inference.runner.run` then grows the capacity)."""
        return bool(np.any(np.asarray(state.clusters.overflow)))


class MoveStatsState(NamedTuple):
    """State of kernels with Metropolis-Hastings moves (``SplitMerge``, ``TreeGuidedMCMC``):
    the fields of :class:`CollapsedGibbsState` plus

    chain_id: an id derived from the chain's initial key (keys host-side state per chain).
    num_accepted: MH moves accepted in the last iteration.
    num_proposed: MH moves proposed in the last iteration.
    mean_log_accept: mean of ``log min(1, r)`` over the last iteration's proposals
        (the tgMCMC paper's "average log acceptance ratio"; 0 when none; proposals
        with ``r = 0``, e.g. a tree-guided merge that cannot be split back, are
        counted in ``num_proposed`` but left out of the mean).
    """

    z: dict
    clusters: ClusterState
    log_joint: jax.Array
    num_clusters: jax.Array
    rng_key: jax.Array
    chain_id: jax.Array
    num_accepted: jax.Array
    num_proposed: jax.Array
    mean_log_accept: jax.Array


def _chain_id(key: jax.Array) -> jax.Array:
    """A chain's id: 31 bits derived from its initial key (distinct chains, distinct ids)."""
    bits = jax.random.bits(jax.random.fold_in(key, 0x7467), (), jnp.uint32)
    return (bits >> 1).astype(jnp.int32)


class MoveStatsKernel(CollapsedGibbs):
    """``CollapsedGibbs`` whose state also carries MH move statistics (:class:`MoveStatsState`).

    Subclasses' ``_core_step`` reads ``self._chain_id`` and sets
    ``self._move_stats = (num_accepted, num_proposed, mean_log_accept)``
    while the step is traced.
    """

    def _init_one(self, key, params, hyper0, model_args, model_kwargs):
        base = super()._init_one(key, params, hyper0, model_args, model_kwargs)
        zero = jnp.zeros((), jnp.int32)
        return MoveStatsState(
            *base, chain_id=_chain_id(key), num_accepted=zero, num_proposed=zero,
            mean_log_accept=jnp.zeros((), base.log_joint.dtype),
        )

    def _sample_one(self, state, model_args, model_kwargs):
        self._chain_id = state.chain_id
        zero = jnp.zeros((), jnp.int32)
        self._move_stats = (zero, zero, jnp.zeros((), jnp.float32))
        out = super()._sample_one(CollapsedGibbsState(*state[:5]), model_args, model_kwargs)
        accepted, proposed, mean_log = self._move_stats
        self._chain_id = self._move_stats = None
        return MoveStatsState(
            *out, chain_id=state.chain_id, num_accepted=jnp.asarray(accepted, jnp.int32),
            num_proposed=jnp.asarray(proposed, jnp.int32),
            mean_log_accept=jnp.asarray(mean_log).astype(out.log_joint.dtype),
        )

    def refresh(self, state, model_args, model_kwargs):
        base = super().refresh(CollapsedGibbsState(*state[:5]), model_args, model_kwargs)
        return state._replace(log_joint=base.log_joint)

    def get_diagnostics_str(self, state):
        acc = int(np.sum(np.asarray(state.num_accepted)))
        prop = int(np.sum(np.asarray(state.num_proposed)))
        return f"K={int(np.max(np.asarray(state.num_clusters)))} acc={acc}/{prop}"


def collapsed_gibbs_fn(
    model: Callable, *model_args: Any, capacity: int | None = None, **model_kwargs: Any
) -> Callable:
    """A ``gibbs_fn`` for ``numpyro.infer.HMCGibbs`` doing one collapsed Gibbs sweep.

    ``HMCGibbs(NUTS(model), gibbs_fn=collapsed_gibbs_fn(model, X), gibbs_sites=["z"])``
    (add the NGGP ``u`` site to ``gibbs_sites`` to have it slice-sampled too).
    Statistics are rebuilt from the labels at each call (O(n)). ``capacity``
    defaults to ``n`` so it can never overflow.

    Note: ``HMCGibbs`` rejects ``chain_method="vectorized"``; use
    ``"sequential"``, ``"parallel"`` or ``jax.vmap`` over ``MCMC.run``.
    """

    def gibbs_fn(rng_key, gibbs_sites, hmc_sites):
        values = {**hmc_sites, **gibbs_sites}
        tr = _trace_model(model, values, model_args, model_kwargs)
        p_name = next(
            name for name, s in tr.items()
            if s["type"] == "sample" and isinstance(s["fn"], Partition)
        )
        obs = next(
            s for s in tr.values()
            if s["type"] == "sample" and isinstance(s["fn"], ConjugateMixture) and s["is_observed"]
        )
        p_fn = tr[p_name]["fn"]
        measure, family = p_fn.measure, obs["fn"].family
        X = jnp.asarray(obs["value"])
        n = p_fn.num_points
        cap = n if capacity is None else int(capacity)
        labels = jnp.asarray(gibbs_sites[p_name]).astype(jnp.int32)
        labels = canonical_labels(labels, n)
        clusters = clusters_from_labels(family, X, labels, cap, labels.max() >= cap)
        k_sweep, k_u = jax.random.split(rng_key)
        u = p_fn.u if p_fn.u is not None else jnp.ones(())
        clusters = gibbs_core.gibbs_sweep(k_sweep, clusters, X, measure, family, u)
        if cap < n:
            raise_if_overflow(clusters)
        out = {p_name: canonical_labels(clusters.labels, cap)}
        for name in gibbs_sites:
            if name != p_name:
                site = tr[name]
                if isinstance(site["fn"], AuxiliaryU) and measure.has_auxiliary:
                    out[name] = gibbs_core.update_u(k_u, u, clusters.counts, measure)
                else:
                    raise ValueError(
                        f"collapsed_gibbs_fn updates the Partition site and the NGGP u site; "
                        f"'{name}' is neither."
                    )
        return out

    return gibbs_fn
