"""Conjugate families of discrete data (docs/mathematics.md §2): count vectors
(``DirichletMultinomial``) and binary features (``BetaBernoulli``). The protocol they
implement, and the Gaussian families, are in :mod:`jaxbnp.models.families`.

Example
-------
>>> import jax.numpy as jnp
>>> from jaxbnp.models.discrete import BetaBernoulli
>>> fam = BetaBernoulli(a=1.0, b=1.0)
>>> stats = fam.stats_from_labels(jnp.array([[1.0, 0.0], [1.0, 1.0], [0.0, 0.0]]), jnp.array([0, 0, 1]), 2)
>>> fam.log_marginal(stats).shape
(2,)
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import gammaln

from .._pytree import concrete_value, require_positive, same_length
from .._random import log_beta_pair_from_uniform, log_dirichlet_from_uniform, loggamma_uniforms
from .families import Family, from_data_array, log_beta, safe_log

__all__ = ["DirichletMultinomial", "BetaBernoulli"]


# ----------------------------------------------------------------------------- Dirichlet-multinomial
class CountStats(NamedTuple):
    n: jax.Array  # (...,) number of documents
    counts: jax.Array  # (..., V) summed counts


class DirichletMultinomial(Family):
    """Bags of words with a ``Dir(beta)`` prior on each cluster's word distribution (docs/mathematics.md §2).

    ``beta`` is a scalar (symmetric) or a length-``V`` vector. Data are
    non-negative integer count vectors. The multinomial coefficient is
    dropped (constant in the partition).
    """

    _fields = ("beta",)
    data_kind = "counts"

    def __init__(self, beta: Any = 1.0):
        require_positive("DirichletMultinomial", "beta", beta)
        self._set(beta=beta)

    def unconstrained(self) -> dict:
        return {"log_beta": jnp.log(self.beta)}

    def constrained(self, p: dict) -> "DirichletMultinomial":
        return self.replace(beta=jnp.exp(p["log_beta"]))

    @classmethod
    def from_data(cls, X: Any, beta: float = 0.5) -> "DirichletMultinomial":
        """Symmetric Jeffreys-like prior ``beta = 0.5`` for every word."""
        X = from_data_array("DirichletMultinomial", X)
        fam = cls(beta=np.full(X.shape[1], beta))
        fam.validate_data(X)
        return fam

    def _beta(self, vocab: int):
        return jnp.broadcast_to(self.beta, (vocab,))

    @staticmethod
    def _point_stats(X, xp):
        return CountStats(xp.ones(X.shape[:-1], X.dtype), X)

    @staticmethod
    def _log_marginal(p, stats, m):
        xp = m.xp
        beta = xp.broadcast_to(p.beta, (stats.counts.shape[-1],))
        total = m.sum(stats.counts, -1)
        sb = m.sum(beta)
        return (
            m.gammaln(sb)
            - m.gammaln(sb + total)
            + m.sum(m.gammaln(beta + stats.counts) - m.gammaln(beta), -1)
        )

    def predictive_params(self, stats):
        beta = self._beta(stats.counts.shape[-1])
        return (beta + stats.counts, jnp.sum(beta + stats.counts, -1))

    def log_predictive_from_params(self, x, params):
        post, post_total = params
        nx = jnp.sum(x)
        return (
            gammaln(post_total)
            - gammaln(post_total + nx)
            + jnp.sum(gammaln(post + x) - gammaln(post), -1)
        )

    def param_uniforms(self, stats):
        alpha = self._beta(stats.counts.shape[-1]) + stats.counts
        return [loggamma_uniforms(alpha.shape)], jnp.result_type(alpha, float)

    def sample_params_from_uniform(self, u, stats, key):
        """Word distributions ``θ ~ Dir(β + C_c)`` (docs/mathematics.md §2, "Instantiated
        parameters"): an array ``(..., V)`` for statistics with leading axes ``(...,)``."""
        alpha = self._beta(stats.counts.shape[-1]) + stats.counts
        return jnp.exp(log_dirichlet_from_uniform(u[0], alpha, key))

    def log_params_density(self, params, stats):
        alpha = self._beta(stats.counts.shape[-1]) + stats.counts
        lp = jnp.sum((alpha - 1.0) * safe_log(params) - gammaln(alpha), -1)
        return lp + gammaln(jnp.sum(alpha, -1))

    def log_likelihood(self, X, params):
        """``Σ_w x_w log θ_kw``, shape ``(n, K)``: one matrix product ``X (log θ)ᵀ``
        (docs/mathematics.md §2, "Instantiated parameters"). The multinomial coefficient is
        dropped, as in ``log_marginal``. ``θ = 0`` (an underflowed draw) counts as the
        smallest positive float, so a word absent from ``x`` contributes 0."""
        return jnp.asarray(X) @ safe_log(params).T

    def validate_data(self, X):
        if np.any(X < 0) or not np.all(np.equal(np.round(X), X)):
            raise ValueError(
                "DirichletMultinomial: data must be non-negative integer counts "
                "(one row per document, one column per word)."
            )
        b = concrete_value(self.beta)
        if b is not None and b.ndim == 1 and b.shape[0] != X.shape[1]:
            raise ValueError(
                f"DirichletMultinomial: beta has length {b.shape[0]} but the data have "
                f"{X.shape[1]} columns (words)."
            )


# ----------------------------------------------------------------------------- Beta-Bernoulli
class BinaryStats(NamedTuple):
    n: jax.Array  # (...,)
    ones: jax.Array  # (..., D)


class BetaBernoulli(Family):
    """Binary features, each with a ``Beta(a, b)`` prior on its probability (docs/mathematics.md §2)."""

    _fields = ("a", "b")
    data_kind = "binary"

    def __init__(self, a: Any = 1.0, b: Any = 1.0):
        require_positive("BetaBernoulli", "a", a)
        require_positive("BetaBernoulli", "b", b)
        same_length("BetaBernoulli", ("a", "b"), (a, b))
        self._set(a=a, b=b)

    def unconstrained(self) -> dict:
        return {"log_a": jnp.log(self.a), "log_b": jnp.log(self.b)}

    def constrained(self, p: dict) -> "BetaBernoulli":
        return self.replace(a=jnp.exp(p["log_a"]), b=jnp.exp(p["log_b"]))

    @classmethod
    def from_data(cls, X: Any) -> "BetaBernoulli":
        """Uniform ``Beta(1, 1)`` prior on every feature."""
        X = from_data_array("BetaBernoulli", X)
        fam = cls(a=1.0, b=1.0)
        fam.validate_data(X)
        return fam

    @staticmethod
    def _point_stats(X, xp):
        return BinaryStats(xp.ones(X.shape[:-1], X.dtype), X)

    @staticmethod
    def _log_marginal(p, stats, m):
        n = stats.n[..., None]
        return m.sum(
            log_beta(p.a + stats.ones, p.b + n - stats.ones, m) - log_beta(p.a, p.b, m), -1
        )

    def predictive_params(self, stats):
        n = stats.n[..., None]
        log_total = jnp.log(self.a + self.b + n)
        return (
            jnp.log(self.a + stats.ones) - log_total,
            jnp.log(self.b + n - stats.ones) - log_total,
        )

    def log_predictive_from_params(self, x, params):
        log_p1, log_p0 = params
        return jnp.sum(x * log_p1 + (1.0 - x) * log_p0, -1)

    def _beta_params(self, stats):
        n = stats.n[..., None]
        a = self.a + stats.ones
        b = self.b + n - stats.ones
        return a, b

    def param_uniforms(self, stats):
        a, b = self._beta_params(stats)
        shape = (2,) + jnp.broadcast_shapes(a.shape, b.shape)
        return [loggamma_uniforms(shape)], jnp.result_type(a, b, float)

    def sample_params_from_uniform(self, u, stats, key):
        """Feature probabilities ``θ_d ~ Beta(a + s_d, b + n − s_d)`` (docs/mathematics.md §2,
        "Instantiated parameters"): an array ``(..., D)`` for statistics with leading axes
        ``(...,)``."""
        a, b = self._beta_params(stats)
        log_p, _ = log_beta_pair_from_uniform(u[0], a, b, key)
        return jnp.exp(log_p)

    def log_params_density(self, params, stats):
        a, b = self._beta_params(stats)
        return jnp.sum((a - 1.0) * safe_log(params) + (b - 1.0) * safe_log(1.0 - params) - log_beta(a, b), -1)

    def log_likelihood(self, X, params):
        """``Σ_d [x_d log θ_kd + (1 − x_d) log(1 − θ_kd)]``, shape ``(n, K)``: two matrix
        products (docs/mathematics.md §2, "Instantiated parameters"). A draw of exactly 0 or 1
        counts as the nearest positive float away from it."""
        X = jnp.asarray(X)
        return X @ safe_log(params).T + (1.0 - X) @ safe_log(1.0 - params).T

    def validate_data(self, X):
        if not np.all((X == 0) | (X == 1)):
            raise ValueError("BetaBernoulli: data must be binary (0 or 1 in every entry).")
