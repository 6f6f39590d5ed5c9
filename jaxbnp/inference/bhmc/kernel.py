"""The NumPyro kernel over BHMC's pure ``init``/``step`` (:class:`BHMCKernel`)."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
import numpyro
import numpyro.distributions as dist
from numpyro.distributions.transforms import biject_to
from numpyro.infer.mcmc import MCMCKernel
from numpyro.util import is_prng_key

from ..._xla import mark_loop_program
from ..._cache import auto_enable
from ..._programs import call_cached
from ..._random import typed_key
from ...models.nested import NestedCRP, model_constants
from ..adapter import is_traced, numpyro_reads_every_step, step_checks_overflow, trace_model
from ..base import run_chains
from ..partition.clusters import raise_capacity_error_if, raise_capacity_error_on_host
from .model import (
    BETA_RULES,
    PATH_UPDATES,
    BHMCConfig,
    BHMCHyper,
    BHMCInfo,
    BHMCModel,
    BHMCState,
)
from .start import (
    init,
    init_from,
)
from .sweep import (
    algorithm,
)


class BHMCKernelState(NamedTuple):
    """State of :class:`BHMCKernel` (one chain, or chains on the leading axis).

    sample: the chain's :class:`BHMCState`. info: the :class:`BHMCInfo` of the
    last step (no moves after ``init``). best: the state with the highest
    ``log_lik`` among the post-warm-up iterations so far (``log_lik = −inf``
    before the first). rng_key: the chain's run key ``k_run``. chain: ``()``
    int32, the chain's index in its run. iteration: ``()`` int32, steps done.
    num_warmup: ``()`` int32. Step ``i`` uses the key
    ``fold_in(fold_in(rng_key, i), chain)``. overflow_on_host: ``()`` when ``CapacityError``
    is raised on the host by ``get_diagnostics_str`` (NumPyro's progress bar), else
    ``None`` (a callback in the step), as in
    :class:`~jaxbnp.inference.partition.kernels.PartitionKernelState`.
    """

    sample: BHMCState
    info: BHMCInfo
    best: BHMCState
    rng_key: jax.Array
    chain: jax.Array
    iteration: jax.Array
    num_warmup: jax.Array
    overflow_on_host: tuple | None = None


#: the sites BHMCKernel reads of a nested HDP program (:func:`~jaxbnp.models.nested.nested_hdp_model`)
_SITES = ("paths", "sticks", "beta_gamma_1", "theta", "x")


class _Reading(NamedTuple):
    """What :class:`BHMCKernel` reads of one trace of the model: the data, the constants
    and starting hyperparameters (arrays, traced where the model arguments are), and the
    static sizes (``depth``, ``component_capacity`` = the sticks ``K``, the model's
    ``node_capacity``)."""

    X: jax.Array
    mu0: jax.Array
    Sigma: jax.Array
    Sigma0: jax.Array
    hyper: BHMCHyper
    depth: int
    component_capacity: int
    node_capacity: int


def _placeholder(site):
    """A value in the support of each latent sample site (the kernel reads only constants)."""
    if site["type"] != "sample" or site["is_observed"]:
        return None
    fn = site["fn"]
    if fn.is_discrete:
        return jnp.zeros(fn.shape(), jnp.int32)
    to_support = biject_to(fn.support)
    return to_support(jnp.zeros(to_support.inverse_shape(fn.shape())))


def _base(fn):
    """``fn`` without its ``to_event``/``expand`` wrappers."""
    while isinstance(fn, (dist.Independent, dist.ExpandedDistribution)):
        fn = fn.base_dist
    return fn


class BHMCKernel(MCMCKernel):
    """NumPyro ``MCMCKernel`` of BHMC (docs/mathematics.md §6) over the nested HDP program
    :func:`~jaxbnp.models.nested.nested_hdp_model`; wraps the pure :func:`init` and :func:`step`.

    :param model: the NumPyro program, :func:`~jaxbnp.models.nested.nested_hdp_model` (or a
        program that calls it); ``MCMC.run``'s arguments are the program's, e.g.
        ``mcmc.run(key, X, hyper=hyper)``.
    :param config: the static settings, a :class:`BHMCConfig`; its ``depth`` and
        ``component_capacity`` must be the program's (the depth of ``paths`` and the number of
        ``sticks``), its ``node_capacity`` is the sampler's node slots.
    :param settings: instead of ``config``, the settings by name (``node_capacity=``,
        ``split_merge=``, ...: :class:`BHMCConfig`'s fields but ``depth`` and
        ``component_capacity``, which come from the program). ``node_capacity`` defaults to the
        program's (room for any tree); fewer slots make each step cheaper and raise
        :class:`~jaxbnp.errors.CapacityError` when full.

    The kernel traces the program once per ``init`` and once per compiled step, with every
    latent site held at a placeholder, and reads: the data (the observed ``x``), ``α`` (the
    :class:`~jaxbnp.models.nested.NestedCRP` of ``paths``), ``γ0`` (the ``Beta(1, γ0)`` of
    ``sticks``), ``γ`` (``beta_gamma_1``'s ``infer={"concentration": γ}``), ``μ0, Σ0`` (the
    normal of ``theta``) and ``Σ`` (the normal of ``x``, one covariance for every point). The
    covariances are factored on the host in float64 where they are concrete, else in the
    program. A program without these sites is an error that says which is missing.

    Keys: chain ``chain`` of the run keyed ``key`` starts from
    ``init(fold_in(k_init, chain), ...)`` and takes step ``i`` with
    ``fold_in(fold_in(k_run, i), chain)``, where ``k_init, k_run = split(key)``.
    By default ``key`` is the ``rng_key`` passed to :meth:`init` and ``chain``
    is ``0``; ``init_params={"rng_key": key, "chain": c}`` (a leading chain axis
    on both when chains are batched) sets them, so that chains ``0..C−1`` with
    the same ``key`` are the chains of :func:`fit_bhmc`. ``init_params["start"] = (paths, c)``
    (a leading chain axis on both when chains are batched) starts the chains from those
    paths and components (:func:`init_from`; e.g.
    :func:`ward_start`) instead of a draw from the prior (:func:`init`). A batch of keys (what
    ``MCMC(..., chain_method="vectorized")`` and
    :func:`jaxbnp.inference.runner.run` pass) initialises the chains under
    ``jax.vmap`` and steps them one after another (``lax.map``: under ``vmap``
    every ``lax.cond`` of the sweep would run both branches).

    A chain whose state has overflowed (a slot was needed while all were used)
    stops moving and raises :class:`~jaxbnp.errors.CapacityError` at once: on the host
    from ``get_diagnostics_str`` where NumPyro's progress bar reads every step (one chain
    at a time), else through a host callback in the step. With the attribute
    ``host_overflow_check = False`` (what :func:`jaxbnp.inference.runner.run` sets, for
    :func:`fit_bhmc`, which grows the node slots) nothing is raised, and
    :meth:`overflowed` says so of a state: the run must be discarded.
    Everything a step needs is in the state or the arguments.

    Example::

        from numpyro.infer import MCMC
        from jaxbnp.models.nested import NestedHDP, nested_hdp_model
        hyper = NestedHDP(depth=2, alpha=1.0, gamma0=1.0, gamma=1.0, Sigma=S, Sigma0=S0)
        mcmc = MCMC(BHMCKernel(nested_hdp_model, node_capacity=64), num_warmup=50, num_samples=100)
        mcmc.run(jax.random.key(0), X, hyper=hyper, component_capacity=16)
        mcmc.get_samples().paths
    """

    sample_field = "sample"
    #: the chains are independent and keep no host-side state: :func:`jaxbnp.inference.runner.run`
    #: may cut them into groups run from threads (``chain_method="threads"``), the same draws
    chains_in_threads = True
    #: raise ``CapacityError`` when a chain runs out of slots (class docstring)
    host_overflow_check = True

    def __init__(self, model, config: BHMCConfig | None = None, **settings):
        name = type(self).__name__
        if isinstance(model, BHMCConfig):
            raise TypeError(
                f"{name}(model, config): the first argument is the NumPyro program, e.g. "
                f"{name}(nested_hdp_model, config) run as mcmc.run(key, X, hyper=hyper); the data, "
                "constants and hyperparameters are read from the program, not passed as (X, model, hyper).")
        if not callable(model):
            raise TypeError(f"{name}(model): model must be a NumPyro program (a callable), got "
                            f"{type(model).__name__}.")
        if config is not None and not isinstance(config, BHMCConfig):
            raise TypeError(f"{name}(model, config): config must be a BHMCConfig, got {type(config).__name__}.")
        if config is not None and settings:
            raise TypeError(f"{name}: pass a BHMCConfig or settings by name, not both (got {sorted(settings)}).")
        allowed = set(BHMCConfig._fields) - {"depth", "component_capacity"}
        unknown = sorted(set(settings) - allowed)
        if unknown:
            raise TypeError(f"{name}: unknown settings {unknown}; the settings are {sorted(allowed)} (depth "
                            "and component_capacity are the program's).")
        given = config._asdict() if config is not None else settings
        for option, values in (("path_update", PATH_UPDATES), ("beta_rule", BETA_RULES)):
            if option in given and given[option] not in values:
                raise ValueError(f"{name}: {option} must be one of {values}, got {given[option]!r}.")
        self._model = model
        self._config = config
        self._settings = dict(settings)

    @property
    def model(self):
        return self._model

    def _read(self, model_args, model_kwargs) -> _Reading:
        """One trace of the program with its latent sites at placeholders (class docstring)."""
        name = type(self).__name__
        # NumPyro's argument checks off: the trace only reads constants (NestedHDP checked
        # them), and on concrete values each check is eager work before every compilation
        with numpyro.validation_enabled(False):
            tr = trace_model(self._model, {}, model_args, model_kwargs, fill=_placeholder)
        missing = [s for s in _SITES if s not in tr or tr[s]["type"] != "sample"]
        if missing:
            raise ValueError(
                f"{name}: the model has no sample site {missing}. {name} samples the nested HDP program "
                "jaxbnp.models.nested.nested_hdp_model (sites paths, sticks, beta_gamma_1.., c, theta, x).")
        paths, sticks, theta, x = (_base(tr[s]["fn"]) for s in ("paths", "sticks", "theta", "x"))
        kinds = {"paths": (paths, NestedCRP), "sticks": (sticks, dist.Beta),
                 "theta": (theta, dist.MultivariateNormal), "x": (x, dist.MultivariateNormal)}
        for site, (fn, kind) in kinds.items():
            if not isinstance(fn, kind):
                raise ValueError(f"{name}: site {site!r} must be a {kind.__name__}, got {type(fn).__name__}.")
        if not tr["x"]["is_observed"]:
            raise ValueError(f"{name}: site 'x' must be observed: run the program with its data, "
                             "mcmc.run(key, X, hyper=...).")
        gamma = tr["beta_gamma_1"].get("infer", {}).get("concentration")
        if gamma is None:
            raise ValueError(f"{name}: site 'beta_gamma_1' carries no infer={{'concentration': gamma}} "
                             "(what nested_hdp_model records of γ).")
        ftype = jnp.result_type(float)  # the program's float type
        X = jnp.asarray(tr["x"]["value"], ftype)
        dim = X.shape[-1]
        if X.ndim != 2 or X.shape[0] != paths.num_points:
            raise ValueError(f"{name}: the observed x has shape {X.shape}; it must be ({paths.num_points}, D).")
        cov = x.covariance_matrix.reshape(-1, dim, dim)
        if cov.shape[0] != 1:
            raise ValueError(f"{name}: the normal of 'x' must have one covariance Σ for every point, "
                             f"got {cov.shape[0]}.")
        hyper = BHMCHyper(*(jnp.asarray(v, ftype) for v in (paths.alpha, jnp.reshape(sticks.concentration0, -1)[0],
                                                             gamma)))
        return _Reading(X, jnp.reshape(theta.loc, (-1, dim))[0], cov[0],
                        theta.covariance_matrix.reshape(-1, dim, dim)[0], hyper, paths.depth,
                        int(sticks.batch_shape[-1]), paths.node_capacity)

    def _config_for(self, r: _Reading) -> BHMCConfig:
        """The settings for the program read in ``r``: the given config (checked against the
        program) or one built from the settings by name."""
        config = self._config
        if config is None:
            settings = {"node_capacity": r.node_capacity, **self._settings}
            return BHMCConfig(r.depth, component_capacity=r.component_capacity, **settings)
        if (config.depth, config.component_capacity) != (r.depth, r.component_capacity):
            raise ValueError(
                f"{type(self).__name__}: the BHMCConfig has depth={config.depth} and component_capacity="
                f"{config.component_capacity}; the program has depth={r.depth} (paths) and "
                f"{r.component_capacity} sticks: pass the program's.")
        return config

    @property
    def config(self) -> BHMCConfig | None:
        """The :class:`BHMCConfig` given, if any (else the settings are read from the program)."""
        return self._config

    def _setup(self, model_args, model_kwargs) -> tuple[_Reading, BHMCConfig, BHMCModel]:
        """What ``init`` and ``sample`` need of the program: the reading, the settings and the
        factored model constants."""
        reading = self._read(model_args, model_kwargs)
        model = model_constants(reading.mu0, reading.Sigma, reading.Sigma0, reading.X.dtype)
        return reading, self._config_for(reading), model

    def init(self, rng_key, num_warmup, init_params, model_args, model_kwargs):
        # where an overflow is raised (NumPyro's progress bar, or a callback in the step)
        on_host = self.host_overflow_check and numpyro_reads_every_step(self, rng_key)
        reading, config, model = self._setup(model_args, model_kwargs)
        X, hyper = reading.X, reading.hyper
        params = dict(init_params or {})
        unknown = sorted(set(params) - {"rng_key", "chain", "start"})
        if unknown:  # a misspelt name is an error, never a value dropped
            raise ValueError(f"{type(self).__name__}: init_params names {unknown}; it takes 'rng_key', "
                             "'chain' and 'start' (class docstring).")
        rng_key = typed_key(rng_key)  # jax.random.PRNGKey or jax.random.key: the same draws
        auto_enable()  # JAX's persistent compilation cache (jaxbnp.enable_compilation_cache)
        batched = not is_prng_key(rng_key)
        run_key = typed_key(params.get("rng_key", rng_key))
        chain = params.get("chain", jnp.zeros(jnp.shape(rng_key)[:1] if batched else (), jnp.int32))
        start = params.get("start")

        def init_one(key, chain, start, X, model, hyper):
            k_init, k_run = jax.random.split(key)
            k = jax.random.fold_in(k_init, chain)
            if start is None:
                state = init(k, X, hyper, model, config)
            else:
                state = init_from(k, X, start[0], start[1], hyper, model, config)
            best = state._replace(log_lik=jnp.asarray(-jnp.inf, state.log_lik.dtype))
            return BHMCKernelState(state, no_moves(X.shape[0]), best, k_run, jnp.asarray(chain, jnp.int32),
                                   jnp.zeros((), jnp.int32), jnp.asarray(num_warmup, jnp.int32))

        def program(key, chain, start, args, kwargs):
            X, model, hyper = args
            if batched:
                return run_chains(init_one, key, chain, start, X, model, hyper,
                                  in_axes=(0, 0, 0, None, None, None), how="vmap")
            return init_one(key, chain, start, X, model, hyper)

        # one compiled program, kept on the kernel: a second MCMC.run of the same shape
        # compiles nothing
        static = (config, batched, num_warmup)
        state = call_cached(self, "init", static, program, run_key, chain, start,
                            model_args=(X, model, hyper))
        if not is_traced(state):  # a traced start (parallel chains): the first step raises
            self._raise_on_overflow(state, on_host=True)
        return state._replace(overflow_on_host=() if on_host else None)

    def sample(self, state, model_args, model_kwargs):
        reading, config, model = self._setup(model_args, model_kwargs)
        X = reading.X
        core = algorithm(X, None, model, config)  # the pure core, this run's values
        if jnp.ndim(state.iteration) == 0:
            new = self._sample_one(state, X, core)
        else:
            new = run_chains(self._sample_one, state, X, core, in_axes=(0, None, None), how="map")
        # NumPyro's progress bar reads every step's state on the host: get_diagnostics_str
        # raises there, and the program holds no callback (JAX's persistent cache keeps it)
        if step_checks_overflow(self, state):
            self._raise_on_overflow(new)
        return new._replace(overflow_on_host=state.overflow_on_host,
                            iteration=mark_loop_program(new.iteration))

    def _raise_on_overflow(self, state: BHMCKernelState, on_host: bool = False) -> None:
        """``CapacityError`` if a chain of ``state`` ran out of slots (unless the runner turned
        the check off): at once on the host (``on_host``), or through a host callback."""
        if not self.host_overflow_check:
            return
        nodes, comps = state.sample.count.shape[-1], state.sample.comp_active.shape[-1]
        reason = ("a BHMC move needed a node or component slot while all were in use "
                  f"(node_capacity={nodes}, component_capacity={comps}).")
        hint = ("Pass a larger node_capacity to the kernel, or a larger component_capacity to the "
                "program (nested_hdp_model)")
        flag = state.sample.overflow if on_host else jnp.any(state.sample.overflow)
        (raise_capacity_error_on_host if on_host else raise_capacity_error_if)(flag, nodes, hint, reason)

    def _sample_one(self, ks: BHMCKernelState, X, core) -> BHMCKernelState:
        key = jax.random.fold_in(jax.random.fold_in(ks.rng_key, ks.iteration), ks.chain)
        sample, info = lax.cond(
            ks.sample.overflow,
            lambda s: (s, no_moves(X.shape[0])),
            lambda s: core.step(key, s),
            ks.sample)
        better = (ks.iteration >= ks.num_warmup) & (sample.log_lik > ks.best.log_lik)
        best = jax.tree.map(lambda a, b: jnp.where(better, a, b), sample, ks.best)
        return ks._replace(sample=sample, info=info, best=best, iteration=ks.iteration + 1)

    def overflowed(self, state: BHMCKernelState) -> bool:
        """Whether a chain of ``state`` ran out of node or component slots (host side)."""
        return bool(np.any(np.asarray(state.sample.overflow)))

    def get_diagnostics_str(self, state: BHMCKernelState) -> str:
        """The progress bar's text; first, ``CapacityError`` if a chain ran out of slots (when
        NumPyro's progress bar calls this after every step, the step itself does not check)."""
        self._raise_on_overflow(state, on_host=True)
        rate = np.asarray(state.info.num_accepted) / np.maximum(np.asarray(state.info.num_proposed), 1)
        return f"path acceptance {float(np.mean(rate)):.2f}"


class GrowingNodes(BHMCKernel):
    """:func:`fit_bhmc`'s kernel: tells the runner it overflowed only when the node slots
    ran out (so that the runner doubles them); running out of component slots is raised by
    :func:`fit_bhmc` itself, since more node slots would not help."""

    def overflowed(self, state: BHMCKernelState) -> bool:
        s = state.sample  # a step stops where it overflowed: fewer than L free node slots then
        live = np.sum(np.asarray(s.count) > 0, axis=-1)
        nodes_full = live > s.count.shape[-1] - 1 - s.paths.shape[-1]
        return bool(np.any(np.asarray(s.overflow) & nodes_full))


def no_moves(n: int) -> BHMCInfo:
    return BHMCInfo(jnp.zeros((), jnp.int32), jnp.asarray(n, jnp.int32), jnp.zeros(3, bool),
                    jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32))
