"""NumPyro adapter plumbing shared by jaxbnp's kernels: reading a model's trace
(:func:`trace_model`, :func:`sample_sites`) and the :class:`DiscreteSiteKernel` base
of the kernels over discrete or structured sites (partitions, diffusion trees)."""

from __future__ import annotations

import copy
from typing import Any, Callable

import jax
from numpyro.handlers import seed, substitute, trace
from numpyro.infer.mcmc import MCMCKernel

__all__ = ["DiscreteSiteKernel", "sample_sites", "trace_model"]


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
