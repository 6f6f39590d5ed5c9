"""NumPyro adapter plumbing shared by jaxbnp's kernels: reading a model's trace
(:func:`trace_model`, :func:`sample_sites`) and the :class:`DiscreteSiteKernel` base
of the kernels over discrete or structured sites (partitions, diffusion trees).

One protocol reads a model for every kernel (:meth:`DiscreteSiteKernel.read_model`): the
model is traced once, with ``init_params`` substituted and the kernel's own sites filled
with placeholders (the kernel's ``fill_site``); the kernel's ``find_spec(trace)`` finds the
sites it needs and returns a small spec (a named tuple of site names and sizes, with
``owned_sites``: the sites the kernel updates); ``init_params`` may only name sites of the
model; every error names the user's kernel (``type(kernel).__name__``)."""

from __future__ import annotations

import copy
import sys
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpyro.util
from numpyro.handlers import seed, substitute, trace
from numpyro.infer.mcmc import MCMC, MCMCKernel
from numpyro.util import is_prng_key

from .._pytree import is_concrete
from .._random import typed_key
from .base import CHAIN_BATCHING, SamplingAlgorithm, run_chains

__all__ = ["DiscreteSiteKernel", "sample_sites", "trace_model", "check_init_params",
           "AlgorithmKernel", "AlgorithmState", "numpyro_reads_every_step", "step_checks_overflow",
           "is_traced"]


def trace_model(model: Callable, z: dict, model_args, model_kwargs,
                fill: Callable | None = None, key: jax.Array | None = None):
    """The trace of ``model`` with the sites in ``z`` substituted; ``fill(site)`` gives
    placeholder values for other sites (``None``: sample them), ``key`` seeds the rest
    (``jax.random.key(0)`` by default)."""
    m = substitute(model, data=z)
    if fill is not None:
        m = substitute(m, substitute_fn=fill)
    key = jax.random.key(0) if key is None else key
    return trace(seed(m, key)).get_trace(*model_args, **(model_kwargs or {}))


def sample_sites(model_trace, fn_type: Any = object, observed: bool | None = None) -> list[str]:
    """Names of the trace's sample sites whose distribution is a ``fn_type``, in the
    model's order; only observed (``True``) or only latent (``False``) sites, or both."""
    return [
        name for name, s in model_trace.items()
        if s["type"] == "sample" and isinstance(s["fn"], fn_type)
        and (observed is None or s["is_observed"] == observed)
    ]


def check_init_params(init_params: dict, model_trace, owner: str) -> None:
    """Every name in ``init_params`` must be a site of the model: a misspelt name is an error
    (naming the kernel ``owner`` and the model's latent sites), never a value dropped."""
    unknown = sorted(set(init_params) - set(model_trace))
    if unknown:
        latent = sample_sites(model_trace, observed=False)
        raise ValueError(
            f"{owner}: init_params names {unknown}, which the model has no site for; its latent "
            f"sites are {latent}."
        )


#: the code objects of NumPyro's sampling loop and of the method that calls it, recognised on
#: the call stack by :func:`numpyro_reads_every_step` (constants, not state)
_LOOP_CODE = numpyro.util.fori_collect.__code__
_CHAIN_CODE = MCMC._single_chain_mcmc.__code__


def numpyro_reads_every_step(kernel, rng_key=None) -> bool:
    """Whether NumPyro's ``MCMC`` drives ``kernel`` in the mode where it calls
    ``kernel.get_diagnostics_str(state)`` on the host after every step: ``kernel`` is the
    ``MCMC``'s own sampler (not a block of ``numpyro.infer.Gibbs``), its progress bar is on,
    and its loop runs one chain at a time with a single key (one chain, or
    ``chain_method="sequential"``; vectorized and parallel chains are never shown).

    Then a kernel can check its state there (e.g. raise ``CapacityError`` on an overflow)
    instead of through a host callback inside the step, which would keep JAX's persistent
    compilation cache from writing NumPyro's loop. Called from the kernel's ``init``
    (``rng_key``: the key it got), or while its ``sample`` is traced (``rng_key=None``): then
    NumPyro's loop (``numpyro.util.fori_collect``) must be on the stack, building the program
    that its progress bar's Python loop calls, with a diagnostics function. Read from
    NumPyro's frames on the stack; anything else (another caller, another NumPyro) answers
    ``False``, so the caller keeps its callback."""
    frame, loop = sys._getframe(1), None
    for _ in range(500):  # JAX's tracing machinery lies between the loop and the kernel
        if frame is None:
            return False
        if frame.f_code is _LOOP_CODE and loop is None:
            loop = frame.f_locals
        elif frame.f_code is _CHAIN_CODE:
            chain = frame.f_locals
            break
        frame = frame.f_back
    else:
        return False
    mcmc = chain.get("self")
    if not isinstance(mcmc, MCMC) or mcmc.sampler is not kernel or not mcmc.progress_bar:
        return False
    key = chain.get("rng_key")
    if key is None or isinstance(key, jax.core.Tracer) or not is_prng_key(key):
        return False
    if rng_key is not None:  # from init: NumPyro's loop to come (fori_collect's num_chains)
        parallel = callable(mcmc.chain_method) or mcmc.chain_method == "parallel"
        return not (parallel and mcmc.num_chains > 1) and is_prng_key(rng_key)
    return (loop is not None and loop.get("progbar") is True and loop.get("num_chains") == 1
            and loop.get("diagnostics_fn") is not None)


def step_checks_overflow(kernel, state) -> bool:
    """Whether the step being traced from ``state`` must raise an overflow itself (through a
    host callback): unless ``kernel.init`` started the state for NumPyro's progress bar
    (``state.overflow_on_host``, e.g. :class:`~jaxbnp.inference.partition.kernels.PartitionKernelState`)
    and that bar reads this step (:func:`numpyro_reads_every_step`); then the kernel's
    ``get_diagnostics_str`` raises instead."""
    return state.overflow_on_host is None or not numpyro_reads_every_step(kernel)


def is_traced(*trees) -> bool:
    """Whether any leaf of ``trees`` is a JAX tracer (a call under ``jit``, ``vmap``, ...)."""
    return not all(is_concrete(x) for x in jax.tree.leaves(trees))


class DiscreteSiteKernel(MCMCKernel):
    """NumPyro adapter plumbing shared by jaxbnp's kernels over discrete / structured sites.

    The sites are used as they are (no constraint transform), a wrapped model
    gets a fresh kernel whose model spec and compiled sample function are
    rebuilt on first use, and pickling drops the compiled function. The
    partition kernels keep the model in ``_model``, the spec they read off its
    trace at ``init`` in ``_spec`` (public as :attr:`spec`) and the compiled
    sample function in ``_sample_fn``.
    """

    @property
    def model(self):
        return self._model

    @property
    def owner(self) -> str:
        """The user's kernel class, as every error names it."""
        return type(self).__name__

    # -- the one protocol for reading a model (module docstring) ---------------------------
    def fill_site(self, site):
        """A placeholder value for one of the kernel's own sites before it has one (``None``:
        the site is sampled or taken from ``init_params``)."""
        return None

    def find_spec(self, model_trace):
        """The sites this kernel needs, read off one trace: a named tuple of site names and
        sizes with an ``owned_sites`` property; raises ``ValueError`` naming :attr:`owner`
        for a model it cannot run."""
        raise NotImplementedError

    def read_model(self, init_params, model_args, model_kwargs):
        """``(trace, spec)``: the model traced once with ``init_params`` substituted and the
        kernel's sites filled (:meth:`fill_site`), the kernel's :meth:`find_spec` of it, and
        ``init_params`` checked against the model's sites (:func:`check_init_params`)."""
        z0 = dict(init_params or {})
        tr = trace_model(self._model, z0, model_args, model_kwargs, fill=self.fill_site)
        spec = self.find_spec(tr)
        check_init_params(z0, tr, self.owner)
        return tr, spec

    @property
    def spec(self):
        """What ``init`` read off the model's trace (:class:`ModelSpec`: its site
        names), or ``None`` before ``init`` and for kernels that keep none."""
        return getattr(self, "_spec", None)

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


# ----------------------------------------------------------------------------- pure cores
class AlgorithmState(NamedTuple):
    """State of an :class:`AlgorithmKernel`: the algorithm's state, the info of its last step
    (zeros before the first) and the key of the next step."""

    state: Any
    info: Any
    rng_key: jax.Array


class AlgorithmKernel(MCMCKernel):
    """Any :class:`~jaxbnp.inference.base.SamplingAlgorithm` as a NumPyro kernel: what
    :func:`jaxbnp.inference.runner.run` drives when it is given a pure core (and what
    ``numpyro.infer.MCMC`` runs as it is).

    :param make_algorithm: ``make_algorithm(*model_args, **model_kwargs) -> SamplingAlgorithm``
        with the data bound (e.g. ``lambda X: moves.algorithm(move, X, measure, family)``);
        called inside the compiled programs with the run's arguments, so the data are
        arguments of the programs, not constants in them.
    :param chain_batching: how NumPyro's vectorized chains run in one program
        (:func:`~jaxbnp.inference.base.run_chains`).
    :param overflowed: ``overflowed(state) -> bool array`` when the algorithm's state can run
        out of slots (the runner then grows the capacity its ``make_kernel`` gets).

    A chain with key ``k`` starts from ``algorithm.init(k_init, **init_params)`` and takes
    its ``t``-th step with the ``t``-th key of ``k_run``'s sequence ``key, k = split(key)``,
    where ``k_init, k_run = split(k)``. ``init_params`` are ``algorithm.init``'s keyword
    arguments (a leading chain axis for several chains). The sample field is ``"state"``.
    """

    sample_field = "state"
    #: a pure device program: the runner may run groups of chains from threads
    chains_in_threads = True

    def __init__(self, make_algorithm: Callable[..., SamplingAlgorithm], *,
                 chain_batching: str = "vmap", overflowed: Callable[[Any], Any] | None = None):
        if not callable(make_algorithm):
            raise ValueError("AlgorithmKernel(make_algorithm): make_algorithm must be callable.")
        if chain_batching not in CHAIN_BATCHING:
            raise ValueError(f"chain_batching must be one of {CHAIN_BATCHING}, got {chain_batching!r}.")
        self._make_algorithm = make_algorithm
        self._chain_batching = chain_batching
        self._overflowed = overflowed

    @property
    def model(self):
        return None

    @property
    def default_fields(self):
        return ("state",)

    def postprocess_fn(self, model_args, model_kwargs):
        return lambda z: z

    def init(self, rng_key, num_warmup, init_params, model_args, model_kwargs):
        keys = typed_key(rng_key)  # jax.random.PRNGKey or jax.random.key: the same draws
        params = dict(init_params or {})
        model_kwargs = dict(model_kwargs or {})

        def one(key, params):
            alg = self._make_algorithm(*model_args, **model_kwargs)
            k_init, k_run = jax.random.split(key)
            state = alg.init(k_init, **params)
            shape = jax.eval_shape(lambda k, s: alg.step(k, s)[1], k_run, state)
            info = jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype), shape)
            return AlgorithmState(state, info, k_run)

        if keys.ndim == 0:
            return one(keys, params)
        return run_chains(one, keys, params, in_axes=(0, 0), how="vmap")

    def sample(self, state, model_args, model_kwargs):
        model_kwargs = dict(model_kwargs or {})

        def one(s):
            alg = self._make_algorithm(*model_args, **model_kwargs)
            key, k_step = jax.random.split(s.rng_key)
            new, info = alg.step(k_step, s.state)
            return AlgorithmState(new, info, key)

        if jnp.ndim(state.rng_key) == 0:
            return one(state)
        return run_chains(one, state, in_axes=(0,), how=self._chain_batching)

    def overflowed(self, state) -> bool:
        """Whether a chain ran out of slots (``overflowed`` given at construction)."""
        if self._overflowed is None:
            return False
        return bool(jnp.any(jnp.asarray(self._overflowed(state.state))))
