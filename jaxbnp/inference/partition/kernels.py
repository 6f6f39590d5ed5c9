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

Every partition kernel is a :class:`PartitionKernel` running a
:class:`~jaxbnp.inference.partition.moves.Move`: ``CollapsedGibbs``,
``SplitMerge`` and ``TreeGuidedMCMC`` are ready-made move sequences. A user
composes their own from :mod:`jaxbnp.inference.partition.moves` (the key of a
``chain`` is split once into one key per move, in order):

>>> from jaxbnp.inference.partition import moves
>>> from jaxbnp.inference.partition.kernels import PartitionKernel
>>> move = moves.chain(moves.split_merge(num_moves=3), moves.gibbs_sweeps(2), moves.update_u())
>>> mcmc = MCMC(PartitionKernel(model, move), num_warmup=5, num_samples=5, progress_bar=False)
>>> mcmc.run(jax.random.key(1), jax.numpy.zeros((5, 1)), extra_fields=("num_proposed",))
>>> mcmc.get_extra_fields()["num_proposed"].tolist()
[3, 3, 3, 3, 3]
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
from numpyro.util import is_prng_key

from ..._cache import auto_enable
from ..._programs import call_cached
from ..._random import typed_key
from ..._validation import check_data, check_int, check_labels
from ..._xla import mark_loop_program
from ...models.distributions import AuxiliaryU, ConjugateMixture, Partition
from ...models.measures import DP, NGGP
from ..adapter import (DiscreteSiteKernel, is_traced, numpyro_reads_every_step, sample_sites,
                       step_checks_overflow, trace_model)
from ..base import CHAIN_BATCHING, run_chains
from . import gibbs as gibbs_core
from . import hyperparameters, moves, subcluster
from .clusters import (
    ClusterState, PartitionState, canonical_labels, cluster_log_joint, clusters_from_labels,
    raise_capacity_error_if, raise_capacity_error_on_host, raise_if_overflow,
)
from .moves import Move

__all__ = [
    "PartitionKernel", "PartitionKernelState", "CollapsedGibbs", "CollapsedGibbsState", "SplitMerge",
    "SubClusterMCMC",
    "ModelSpec", "chain_id", "collapsed_gibbs_fn", "hyperparameter_updates", "fill_partition_site",
]

#: capacity used when ``capacity=None`` and the data have more points than this
DEFAULT_CAPACITY = 128
#: SubClusterMCMC's capacity when ``capacity=None`` and ``n`` is larger
SUBCLUSTER_DEFAULT_CAPACITY = 64


class ModelSpec(NamedTuple):
    """What the kernel reads off one trace of the model."""

    partition_site: str
    observation_site: str
    u_site: str | None
    alpha_site: str | None
    sigma_site: str | None
    num_points: int

    @property
    def owned_sites(self) -> tuple[str, ...]:
        """The sites the kernel updates: the partition, NGGP's ``u``, the hyperparameters."""
        return tuple(s for s in (self.partition_site, self.u_site, self.alpha_site, self.sigma_site) if s)


def fill_partition_site(site):
    """Placeholders for the sites a partition kernel owns, before it has values for them."""
    if isinstance(site["fn"], Partition) and not site["is_observed"]:
        return jnp.zeros(site["fn"].num_points, jnp.int32)
    if isinstance(site["fn"], AuxiliaryU) and not site["is_observed"]:
        return jnp.ones(())
    return None


def _find_spec(model_trace, update_hyperparameters: bool, owner: str) -> ModelSpec:
    """The sites a partition kernel reads; ``owner`` (the user's kernel class) names it in
    the errors."""
    partitions = sample_sites(model_trace, Partition, observed=False)
    if len(partitions) != 1:
        raise ValueError(
            f"{owner} needs a model with exactly one latent Partition site, e.g. "
            "z = numpyro.sample('z', bnp.Partition(bnp.DP(1.0), n)); "
            f"found {len(partitions)} ({partitions})."
        )
    observations = sample_sites(model_trace, ConjugateMixture, observed=True)
    if len(observations) != 1:
        raise ValueError(
            f"{owner} needs exactly one observed ConjugateMixture site, e.g. "
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
    others = [name for name in sample_sites(model_trace, observed=False) if name not in owned]
    if others:
        raise ValueError(
            f"The model has latent sites {others} that {owner} does not update. "
            f"Update them with NUTS: numpyro.infer.Gibbs([(bnp.{owner}(model), "
            f"['{partitions[0]}']), (NUTS(model), None)]), or, for the measure's alpha/sigma, "
            "pass update_hyperparameters=True."
        )
    return ModelSpec(
        partitions[0], observations[0], u_site, alpha_site, sigma_site, p_site["fn"].num_points
    )


class PartitionKernelState(NamedTuple):
    """State of a :class:`PartitionKernel` (``CollapsedGibbs``, ``SplitMerge``, ``TreeGuidedMCMC``).

    z: dict of the sites the kernel owns (labels in order of first appearance,
       ``u`` for NGGP, hyperparameters when ``update_hyperparameters=True``).
    clusters: the fixed-capacity ``ClusterState``.
    log_joint: ``log p(X, Π[, u])`` after the step (docs/mathematics.md §2).
    num_clusters: ``K`` after the step.
    rng_key: key for the next step.
    moves: the move's own state (``Move.init``; e.g. tgMCMC's device forest).
    chain_id: an id derived from the chain's initial key (keys host-side state per chain).
    num_accepted: MH moves accepted in the last iteration.
    num_proposed: MH moves proposed in the last iteration.
    mean_log_accept: mean of ``log min(1, r)`` over the last iteration's proposals
        (the tgMCMC paper's "average log acceptance ratio"; 0 when none; proposals
        with ``r = 0``, e.g. a tree-guided merge that cannot be split back, are
        counted in ``num_proposed`` but left out of the mean).
    overflow_on_host: ``()`` when ``CapacityError`` is raised on the host by
        ``get_diagnostics_str``, which NumPyro's ``MCMC`` calls after every step in the
        run that ``init`` started (its progress bar on, one chain at a time; see
        :func:`~jaxbnp.inference.adapter.numpyro_reads_every_step`), else ``None``: then
        the step raises it through a host callback. A pytree node without leaves: the two
        cases are two tree structures, so JAX never reuses the program of one for the other.
    """

    z: dict
    clusters: ClusterState
    log_joint: jax.Array
    num_clusters: jax.Array
    rng_key: jax.Array
    moves: Any
    chain_id: jax.Array
    num_accepted: jax.Array
    num_proposed: jax.Array
    mean_log_accept: jax.Array
    overflow_on_host: tuple | None = None


#: The state of :class:`CollapsedGibbs` (the same fields as every partition kernel).
CollapsedGibbsState = PartitionKernelState


def chain_id(key: jax.Array) -> jax.Array:
    """A chain's id: 31 bits derived from its initial key (distinct chains, distinct ids)."""
    bits = jax.random.bits(jax.random.fold_in(key, 0x7467), (), jnp.uint32)
    return (bits >> 1).astype(jnp.int32)


class PartitionKernel(DiscreteSiteKernel):
    """A NumPyro kernel running a :class:`~jaxbnp.inference.partition.moves.Move` on the
    partition of a ``Partition`` + ``ConjugateMixture`` model (module docstring).

    :param model: a NumPyro model with one latent ``Partition`` site and one
        observed ``ConjugateMixture`` site (see the module example).
    :param move: the partition update of one iteration, e.g.
        ``moves.chain(moves.split_merge(5), moves.gibbs_sweep(), moves.update_u())``;
        default: one Gibbs sweep, then (NGGP) ``u``.
    :param capacity: as for :class:`CollapsedGibbs`.
    :param init_strategy: as for :class:`CollapsedGibbs`.
    :param update_hyperparameters: as for :class:`CollapsedGibbs`.
    :param chain_batching: as for :class:`CollapsedGibbs`.

    Each iteration splits the chain's key into ``(next, step, alpha, sigma)``, runs
    the move with ``step``, then the hyperparameter updates. The state
    (:class:`PartitionKernelState`) holds everything the kernel needs: the move's
    state, the chain id and the MH statistics of the iteration (extra fields
    ``num_accepted``, ``num_proposed``, ``mean_log_accept``).
    """

    #: pure device programs: :func:`jaxbnp.inference.runner.run` may run groups of chains
    #: from several threads (``chain_method="threads"``)
    chains_in_threads = True

    sample_field = "z"
    host_overflow_check = True
    #: whether ``get_diagnostics_str`` reports the MH acceptance counts
    show_acceptance = True
    #: whether a program with this kernel's step gets XLA:CPU's whole-loop kernels
    #: (:func:`jaxbnp._xla.mark_loop_program`): the sequential moves are loops of tiny steps
    cpu_loop_kernels = True

    def __init__(
        self,
        model: Callable,
        move: Move | None = None,
        *,
        capacity: int | None = None,
        init_strategy: str = "one",
        update_hyperparameters: bool = False,
        chain_batching: str = "auto",
    ):
        if not callable(model):
            raise ValueError(f"{type(self).__name__}(model): model must be a NumPyro model function.")
        if init_strategy not in ("one", "singletons", "prior"):
            raise ValueError(
                f"init_strategy must be 'one', 'singletons' or 'prior', got {init_strategy!r}."
            )
        if chain_batching not in CHAIN_BATCHING:
            raise ValueError(f"chain_batching must be 'auto', 'vmap' or 'map', got {chain_batching!r}.")
        if capacity is not None and int(capacity) < 1:
            raise ValueError(f"capacity must be a positive integer, got {capacity}.")
        self._model = model
        self._move = moves.chain(moves.gibbs_sweep(), moves.update_u()) if move is None else move
        self._capacity = capacity
        self._init_strategy = init_strategy
        self._update_hyperparameters = update_hyperparameters
        self._chain_batching = chain_batching
        self._spec: ModelSpec | None = None
        self._sample_fn = None

    @property
    def move(self) -> Move:
        """The partition move of one iteration."""
        return self._move

    def capacity_for(self, num_points: int) -> int:
        if self._capacity is not None:
            return int(self._capacity)
        return num_points if num_points <= DEFAULT_CAPACITY else DEFAULT_CAPACITY

    # -- reading the model --------------------------------------------------------------
    def _read(self, z, model_args, model_kwargs):
        tr = trace_model(self._model, z, model_args, model_kwargs)
        p_fn = tr[self._spec.partition_site]["fn"]
        obs = tr[self._spec.observation_site]
        priors = {
            name: tr[name]["fn"]
            for name in (self._spec.alpha_site, self._spec.sigma_site)
            if name is not None
        }
        u = p_fn.u if p_fn.u is not None else jnp.ones(())
        return p_fn.measure, obs["fn"].family, jnp.asarray(obs["value"]), u, priors

    def fill_site(self, site):
        return fill_partition_site(site)

    def find_spec(self, model_trace) -> ModelSpec:
        spec = _find_spec(model_trace, self._update_hyperparameters, self.owner)
        self._validate_trace(model_trace, spec)
        return spec

    def _setup(self, init_params, model_args, model_kwargs):
        z0 = dict(init_params or {})
        tr, spec = self.read_model(z0, model_args, model_kwargs)
        obs = tr[spec.observation_site]
        X = obs["value"]
        if not isinstance(X, jax.core.Tracer):
            check_data(X, name=f"observed site '{spec.observation_site}'", family=obs["fn"].family)
        if spec.partition_site in z0 and not isinstance(z0[spec.partition_site], jax.core.Tracer):
            labels = np.asarray(z0[spec.partition_site])
            # NumPyro's vectorized chains pass every chain's start at once: (chains, n)
            for row in (labels if labels.ndim == 2 and labels.shape[-1] == spec.num_points else [labels]):
                check_labels(row, spec.num_points, "init_params['z']")
        fixed = {name: tr[name]["value"] for name in (spec.alpha_site, spec.sigma_site) if name}
        return spec, fixed

    # -- MCMCKernel API -----------------------------------------------------------------
    def init(self, rng_key, num_warmup, init_params, model_args, model_kwargs):
        # where an overflow is raised (NumPyro's progress bar, or a callback in the step)
        on_host = self.host_overflow_check and numpyro_reads_every_step(self, rng_key)
        rng_key = typed_key(rng_key)  # jax.random.PRNGKey or jax.random.key: the same draws
        auto_enable()  # JAX's persistent compilation cache (jaxbnp.enable_compilation_cache)
        self._spec, hyper0 = self._setup(init_params, model_args, model_kwargs)
        init_params = dict(init_params or {})
        batched = not is_prng_key(rng_key)
        spec, move = self._spec, self._move
        self._check_init_labels(init_params, spec)
        # an eager init checks its start on the host below: its program holds no callback
        # (JAX's persistent cache can keep it); a traced one (parallel chains) checks inside
        eager = not is_traced(rng_key, init_params, model_args, model_kwargs)

        def init_one(key, params, hyper, args, kwargs):
            return self._init_one(key, params, hyper, spec, move, args, kwargs, check=not eager)

        def sample_one(state, args, kwargs):
            return self._sample_one(state, spec, move, args, kwargs)

        # one compiled program (op by op, the start compiled a hundred small ones)
        # kept on the kernel: a second MCMC.run of the same shape compiles nothing
        static = (spec, move, batched, self.capacity_for(spec.num_points), self.host_overflow_check,
                  eager, self._init_strategy, tuple(sorted(init_params)))
        if batched:  # NumPyro's vectorized chains: a leading chain axis (base.run_chains)
            axes = {k: 0 for k in init_params}

            def init_many(keys, params, hyper, args, kwargs):
                return run_chains(init_one, keys, params, hyper, args, kwargs,
                                  in_axes=(0, axes, None, None, None), how="vmap")

            state = call_cached(self, "init", static, init_many, rng_key, init_params, hyper0,
                                model_args=model_args, model_kwargs=model_kwargs)
            how = self._chain_batching
            self._sample_fn = lambda state, args, kwargs: run_chains(
                sample_one, state, args, kwargs, in_axes=(0, None, None), how=how)
        else:
            state = call_cached(self, "init", static, init_one, rng_key, init_params, hyper0,
                                model_args=model_args, model_kwargs=model_kwargs)
            self._sample_fn = sample_one
        if eager:
            self._raise_on_overflow(spec, state.clusters, on_host=True)
        return state._replace(overflow_on_host=() if on_host else None)

    def _check_init_labels(self, init_params, spec):
        """Given initial labels must fit the capacity (checked on the host, before compiling)."""
        labels = init_params.get(spec.partition_site)
        if labels is None or isinstance(labels, jax.core.Tracer):
            return
        labels = np.asarray(labels)
        capacity = self.capacity_for(spec.num_points)
        for row in labels.reshape(-1, labels.shape[-1]):
            k = len(np.unique(row))
            if k > capacity:
                raise ValueError(
                    f"init_params['{spec.partition_site}'] has {k} clusters "
                    f"but capacity is {capacity}; pass capacity >= that."
                )

    def _init_one(self, key, params, hyper0, spec, move, model_args, model_kwargs, check=True):
        n = spec.num_points
        capacity = self.capacity_for(n)
        cid = chain_id(key)
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
            labels = canonical_labels(labels, n)  # fits the capacity (_check_init_labels)
        else:
            u0 = z.get(spec.u_site, jnp.ones(())) if spec.u_site is not None else jnp.ones(())
            labels = self._init_labels(k_labels, params, measure, family, X, u0, capacity, cid)
        # a prior draw with more clusters than slots is an error, not a truncation
        overflow = labels.max() >= capacity
        labels = jnp.where(labels < capacity, labels, 0)
        clusters = clusters_from_labels(family, X, labels, capacity, overflow)
        if check:
            self._raise_on_overflow(spec, clusters)
        z[spec.partition_site] = labels
        if spec.u_site is not None and spec.u_site not in params and measure.has_auxiliary:
            # u at its conditional mode given the initial partition (NGGP.u_mode)
            z[spec.u_site] = measure.u_mode(clusters.counts).astype(z[spec.u_site].dtype)
        u = z.get(spec.u_site, jnp.ones(()))
        lj = cluster_log_joint(clusters, measure, family, u)
        # the move's own state: the model read once above (the measure, family and data do
        # not depend on the partition or u; the Partition site takes the u site unchanged)
        kernel_state = moves.init(
            PartitionState(clusters, u), moves.Context(X, measure, family, cid), move
        )
        zero = jnp.zeros((), jnp.int32)
        return PartitionKernelState(
            z, clusters, lj, clusters.num_clusters, key, kernel_state.moves, cid, zero, zero,
            jnp.zeros((), lj.dtype),
        )

    def _init_labels(self, key, params, measure, family, X, u, capacity, chain_id):
        """Initial labels when ``init_params`` has none (subclasses add strategies;
        ``chain_id`` keys host-side state per chain)."""
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

    def _raise_on_overflow(self, spec, clusters, on_host=False):
        """``CapacityError`` if ``clusters`` (one chain's, or a batch's) ran out of slots, only
        when the capacity is below ``n`` (else a free slot always exists) and the runner has
        not turned the check off: at once on the host (``on_host``, concrete ``clusters``), or
        from inside a program through one host callback."""
        if clusters.capacity < spec.num_points and self.host_overflow_check:
            if on_host:
                raise_capacity_error_on_host(clusters.overflow, clusters.capacity)
            else:
                raise_capacity_error_if(jnp.any(clusters.overflow), clusters.capacity)

    def _sample_one(self, state, spec, move, model_args, model_kwargs):
        measure, family, X, u, priors = self._read(state.z, model_args, model_kwargs)
        key, k_step, k_alpha, k_sigma = jax.random.split(state.rng_key, 4)
        # partition moves, then (NGGP) u: the pure core's step, with the model's values now
        core = moves.algorithm(move, X, measure, family, state.clusters.capacity, state.chain_id)
        kernel_state, info = core.step(
            k_step, moves.KernelState(PartitionState(state.clusters, u), state.moves)
        )
        clusters, u = kernel_state.partition
        z = dict(state.z)
        k = clusters.num_clusters
        if spec.u_site is not None:
            z[spec.u_site] = u
        measure, updated = hyperparameter_updates(spec, priors, measure, u, clusters, k_alpha, k_sigma)
        z.update(updated)
        z[spec.partition_site] = canonical_labels(clusters.labels, clusters.capacity)
        lj = cluster_log_joint(clusters, measure, family, u)
        mh = info.mh
        if self.cpu_loop_kernels:  # whole-loop kernels on a CPU for this program (_xla)
            k = mark_loop_program(k)
        return PartitionKernelState(
            z, clusters, lj, k, key, kernel_state.moves, state.chain_id,
            jnp.asarray(mh.num_accepted, jnp.int32), jnp.asarray(mh.num_proposed, jnp.int32),
            mh.mean_log_accept.astype(jnp.float32).astype(lj.dtype),
        )

    def sample(self, state, model_args, model_kwargs):
        new = self._sample_fn(state, model_args, model_kwargs)
        # NumPyro's progress bar reads every step's state on the host: get_diagnostics_str
        # raises there, and the program holds no callback (JAX's persistent cache keeps it)
        if step_checks_overflow(self, state):
            # here, not per chain: one host callback per iteration for a batch of chains (on a
            # few points a callback costs about as much as a chain's iteration)
            self._raise_on_overflow(self._spec, new.clusters)
        return new._replace(overflow_on_host=state.overflow_on_host)

    def refresh(self, state, model_args, model_kwargs):
        """Recompute the cached log joint against the current conditioning values.

        The cluster statistics depend only on the data and the labels, so they
        stay; the log joint depends on sibling sites (e.g. ``alpha`` under NUTS).
        """

        def one(s):
            measure, family, _, u, _ = self._read(s.z, model_args, model_kwargs)
            return s._replace(log_joint=cluster_log_joint(s.clusters, measure, family, u))

        if jnp.ndim(state.log_joint):
            return run_chains(one, state, in_axes=(0,), how="vmap")
        return one(state)

    def get_diagnostics_str(self, state):
        """The progress bar's text; first, ``CapacityError`` if a chain ran out of slots (when
        NumPyro's progress bar calls this after every step, the step itself does not check:
        :attr:`PartitionKernelState.overflow_on_host`)."""
        self._raise_on_overflow(self._spec, state.clusters, on_host=True)
        text = f"K={int(np.max(np.asarray(state.num_clusters)))}"
        if not self.show_acceptance:
            return text
        acc = int(np.sum(np.asarray(state.num_accepted)))
        prop = int(np.sum(np.asarray(state.num_proposed)))
        return f"{text} acc={acc}/{prop}"

    def overflowed(self, state) -> bool:
        """Whether a chain ran out of cluster slots (the flag ``host_overflow_check=False``
        leaves in the state; :func:`jaxbnp.inference.runner.run` then grows the capacity)."""
        return bool(np.any(np.asarray(state.clusters.overflow)))


def hyperparameter_updates(spec: ModelSpec, priors: dict, measure, u, clusters, k_alpha, k_sigma):
    """The measure's hyperparameter updates of one iteration (``update_hyperparameters=True``;
    :func:`~jaxbnp.inference.partition.hyperparameters.measure_updates` for the model's
    sites): ``(measure, values)``, ``values`` the new value of each updated site by name."""
    measure, values = hyperparameters.measure_updates(
        measure, u, clusters.counts, clusters.num_clusters, spec.num_points,
        None if spec.alpha_site is None else priors[spec.alpha_site],
        None if spec.sigma_site is None else priors[spec.sigma_site], k_alpha, k_sigma)
    sites = {"alpha": spec.alpha_site, "sigma": spec.sigma_site}
    return measure, {sites[name]: value for name, value in values.items()}


class CollapsedGibbs(PartitionKernel):
    """Collapsed Gibbs sampler (Neal's algorithm 3) for ``Partition`` + ``ConjugateMixture`` models.

    The move ``moves.chain(moves.gibbs_sweep(), moves.update_u())``.

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
        after another) or ``"auto"`` (``"map"`` on a CPU, ``"vmap"`` on an
        accelerator). A sweep skips the updates of a point that stays where it
        was (a ``lax.cond``); batched, both branches run for every chain, so on a
        CPU one chain after another is faster (``benchmarks/gibbs.py`` measures 8
        vmapped chains against one). On a CPU with several cores the runner spreads
        chains over them (``chain_method="auto"``). Draws are identical.
    :param update_hyperparameters: also update the measure's hyperparameters
        when they are sample sites: DP ``alpha ~ Gamma`` by Escobar-West,
        NGGP ``alpha ~ Gamma`` (conjugate given ``u``) and ``sigma ~ Beta``
        (slice on the logit).

    State: :class:`CollapsedGibbsState`; extra fields ``"log_joint"`` and
    ``"num_clusters"`` can be collected with ``MCMC.run(..., extra_fields=...)``.

    Attribute ``host_overflow_check`` (default ``True``): a step that needs more
    than ``capacity`` clusters raises ``CapacityError`` at once. Under NumPyro's
    ``MCMC`` with its progress bar on and one chain at a time (its defaults, or
    ``chain_method="sequential"``), the progress bar reads every step's state on the
    host and ``get_diagnostics_str`` raises there, so the step holds no host callback
    and JAX's persistent compilation cache can keep the loop for the next process;
    otherwise (no progress bar, vectorized or parallel chains, a block of
    ``numpyro.infer.Gibbs``) the step raises through a host callback. Set it to
    ``False`` to leave that to the caller: the flag ``state.clusters.overflow`` is
    then sticky, and a run whose ``mcmc.last_state.clusters.overflow`` is set must
    be discarded and repeated with a larger capacity (what the ``jaxbnp`` CLI does).
    """

    show_acceptance = False

    def __init__(
        self,
        model: Callable,
        *,
        capacity: int | None = None,
        init_strategy: str = "one",
        update_hyperparameters: bool = False,
        chain_batching: str = "auto",
    ):
        super().__init__(
            model, moves.chain(moves.gibbs_sweep(), moves.update_u()), capacity=capacity,
            init_strategy=init_strategy, update_hyperparameters=update_hyperparameters,
            chain_batching=chain_batching,
        )


class SplitMerge(PartitionKernel):
    """Jain & Neal (2004) split-merge sampler (the tgMCMC paper's "SM") as a NumPyro kernel.

    Each iteration does ``num_split_merge`` split-merge moves
    (:func:`~jaxbnp.inference.partition.split_merge.split_merge_move_info`, each with
    ``num_restricted_scans`` intermediate restricted Gibbs scans), then
    ``gibbs_sweeps`` collapsed Gibbs sweeps (Neal's algorithm 3), then, for NGGP,
    a slice update of ``u``: the move ``moves.chain(moves.split_merge(num_split_merge,
    num_restricted_scans), moves.gibbs_sweeps(gibbs_sweeps), moves.update_u())``.
    With ``gibbs_sweeps=0`` it is split-merge alone, which is already an
    irreducible sampler of the partition.

    :param model: a NumPyro model with one latent ``Partition`` site and one
        observed ``ConjugateMixture`` site, as for :class:`CollapsedGibbs`.
    :param num_split_merge: split-merge moves per iteration (``>= 0``; at
        least 1 when ``gibbs_sweeps=0``).
    :param num_restricted_scans: intermediate restricted Gibbs scans that build
        the launch state (``>= 0``; Jain & Neal's ``t``).
    :param gibbs_sweeps: collapsed Gibbs sweeps per iteration (``>= 0``).
    :param capacity: as for :class:`CollapsedGibbs`. A split that needs a slot when
        all are used raises ``CapacityError``.
    :param init_strategy: as for :class:`CollapsedGibbs`.
    :param update_hyperparameters: as for :class:`CollapsedGibbs`.
    :param chain_batching: as for :class:`CollapsedGibbs`.

    Extra fields (``MCMC.run(..., extra_fields=...)``): ``log_joint``,
    ``num_clusters``, and per iteration ``num_accepted``, ``num_proposed``
    (= ``num_split_merge``) and ``mean_log_accept`` (mean ``log min(1, r)``
    over the iteration's moves).

    Example: ``MCMC(SplitMerge(model, num_split_merge=10), num_warmup=100,
    num_samples=1000).run(key, X)``; see the module docstring of
    :mod:`jaxbnp.inference.partition.split_merge`.
    """

    def __init__(
        self,
        model: Callable,
        *,
        num_split_merge: int = 1,
        num_restricted_scans: int = 5,
        gibbs_sweeps: int = 1,
        capacity: int | None = None,
        init_strategy: str = "one",
        update_hyperparameters: bool = False,
        chain_batching: str = "auto",
    ):
        num_split_merge = check_int("num_split_merge", num_split_merge)
        num_restricted_scans = check_int("num_restricted_scans", num_restricted_scans)
        gibbs_sweeps = check_int("gibbs_sweeps", gibbs_sweeps)
        if gibbs_sweeps == 0 and num_split_merge < 1:
            raise ValueError(
                "SplitMerge with gibbs_sweeps=0 needs num_split_merge >= 1 "
                f"(got {num_split_merge}); otherwise the partition never moves."
            )
        move = moves.chain(
            moves.split_merge(num_split_merge, num_restricted_scans),
            moves.gibbs_sweeps(gibbs_sweeps),
            moves.update_u(),
        )
        super().__init__(
            model, move, capacity=capacity, init_strategy=init_strategy,
            update_hyperparameters=update_hyperparameters, chain_batching=chain_batching,
        )


class SubClusterMCMC(PartitionKernel):
    """Sub-cluster split/merge MCMC (Chang & Fisher 2013), exact and data-parallel, as a
    NumPyro kernel (:mod:`jaxbnp.inference.partition.subcluster`, docs/mathematics.md §7).

    Each iteration draws the occupied clusters' weights and parameters, proposes every
    label at once (one ``(n, capacity)`` likelihood matrix), then fits two sub-clusters
    inside every pair of a random matching of the slots and proposes splits and merges
    from them, each accepted by Metropolis-Hastings. The chain's law, marginalised to the
    partition, is the posterior (checked against enumeration in
    ``tests/exact/test_subcluster_exact.py``). Every step is a computation over all
    points at once, so it uses every core and GPU lane; ``mesh=`` shards the points over
    devices with the same draws.

    :param model: a NumPyro model with one latent ``Partition`` site (``DP`` or
        ``PitmanYor``) and one observed ``ConjugateMixture`` site, as for
        :class:`CollapsedGibbs`.
    :param num_launch_sweeps: restricted Gibbs sweeps that fit the sub-clusters of each
        pair before a split or merge is proposed (``>= 0``; more sweeps, better-aimed
        splits, a longer iteration).
    :param sharpness: the power ``β`` of the sub-clusters' membership probabilities in the
        split proposal (docs/mathematics.md §7): ``β = 1`` proposes splits from the
        sub-cluster fit itself; the default 10 proposes crisp splits, which are accepted
        when the data support them and leave fewer spurious halves to merge. Every
        ``β > 0`` is exact.
    :param capacity: cluster slots; ``None`` means ``min(n, 64)``. When every slot is in
        use the chain cannot split any more: ``CapacityError`` (or, under
        :func:`jaxbnp.inference.runner.run` and the estimators, a restart with twice the
        slots). A larger capacity makes each split proposal less likely to be accepted
        (the matching's slot factor, §7), so it is kept near twice the number of clusters.
    :param init_strategy: as for :class:`CollapsedGibbs` (default ``"one"``: all points in
        one cluster).
    :param update_hyperparameters: as for :class:`CollapsedGibbs` (DP ``alpha``).
    :param chain_batching: as for :class:`CollapsedGibbs`.
    :param mesh: a ``jax.sharding.Mesh`` whose first axis shards the points
        (``jaxbnp.inference.sharded.make_mesh()``); ``None``: one device.
    :param num_absorb_moves: absorb moves per iteration (docs/mathematics.md §7): a cluster's
        parameters refitted beside a held neighbour, with the neighbour's points summed out,
        so that two components sharing one cluster can become one. ``0``: none.
    :param num_reassign_moves: reassign moves per iteration (§7): one point of a uniformly
        chosen cluster moved by its collapsed conditional, so that a stray cluster of a few
        points dissolves. ``0``: none.

    Extra fields: ``log_joint``, ``num_clusters``, ``num_accepted`` and ``num_proposed``
    (split and merge proposals of the iteration), ``mean_log_accept``.

    Example: ``MCMC(SubClusterMCMC(model), num_warmup=50, num_samples=200).run(key, X)``.
    """

    #: its steps are vectorised over the points: XLA's multithreaded operations are faster
    #: than one whole-loop kernel (10^4 and 10^5 points in 2 dimensions: 3.7 against 4.6 ms
    #: and 31 against 41 ms an iteration on a 2-core CPU)
    cpu_loop_kernels = False

    def __init__(
        self,
        model: Callable,
        *,
        num_launch_sweeps: int = 3,
        sharpness: float = subcluster.DEFAULT_SHARPNESS,
        capacity: int | None = None,
        init_strategy: str = "one",
        update_hyperparameters: bool = False,
        chain_batching: str = "auto",
        mesh=None,
        num_absorb_moves: int = subcluster.DEFAULT_ABSORB_MOVES,
        num_reassign_moves: int = subcluster.DEFAULT_REASSIGN_MOVES,
    ):
        num_launch_sweeps = check_int("num_launch_sweeps", num_launch_sweeps)
        super().__init__(
            model, subcluster.subcluster_move(num_launch_sweeps, mesh=mesh, sharpness=sharpness,
                                              num_absorb_moves=num_absorb_moves,
                                              num_reassign_moves=num_reassign_moves),
            capacity=capacity,
            init_strategy=init_strategy, update_hyperparameters=update_hyperparameters,
            chain_batching=chain_batching,
        )

    def capacity_for(self, num_points: int) -> int:
        if self._capacity is not None:
            return int(self._capacity)
        return min(num_points, SUBCLUSTER_DEFAULT_CAPACITY)

    def _validate_trace(self, model_trace, spec: ModelSpec) -> None:
        measure = model_trace[spec.partition_site]["fn"].measure
        subcluster.check_measure(measure)


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
        tr = trace_model(model, values, model_args, model_kwargs)
        p_name = sample_sites(tr, Partition)[0]
        obs = tr[sample_sites(tr, ConjugateMixture, observed=True)[0]]
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
