"""Conjugate families with collapsed marginal likelihoods (docs/mathematics.md §2).

A family turns data into additive sufficient statistics (one pytree per
point, summed per cluster), and gives

* ``log_marginal(stats)``: ``log P(X_c)`` for every cluster (leading axes are
  batch axes),
* ``log_predictive(x, stats)``: ``log p(x | X_c)`` for one point ``x`` and
  every cluster, equal to ``log_marginal(stats + s(x)) - log_marginal(stats)``.

The predictive is written once, split in two so samplers can cache it:
``predictive_params(stats)`` (per cluster, recomputed only for clusters that
change) and ``log_predictive_from_params(x, params)``.

For instantiated (uncollapsed) samplers every family also gives
``sample_params(key, stats)`` (a draw of the component parameters from their
conjugate posterior; the prior for zero statistics) and
``log_likelihood(X, params)`` (the ``(n, K)`` matrix of ``log p(x_i | θ_k)``),
docs/mathematics.md §2 "Instantiated parameters".

Families
--------
* ``NormalGamma(m0, k0, a0, b0)``: diagonal Gaussian, per-dimension
  Normal-Gamma prior; statistics ``(n, Σx, Σx²)``.
* ``NormalWishart(m0, r, nu, psi)``: full-covariance Gaussian,
  ``Λ ~ Wishart(ν, Ψ⁻¹)`` with ``psi`` the inverse scale Ψ; statistics
  ``(n, Σx, Σxxᵀ)``.
* ``DirichletMultinomial(beta)`` and ``BetaBernoulli(a, b)``: count vectors and binary
  features, in :mod:`jaxbnp.models.discrete`.

Example
-------
>>> import jax.numpy as jnp
>>> from jaxbnp.models.families import NormalGamma
>>> fam = NormalGamma(m0=0.0, k0=1.0, a0=1.0, b0=1.0)
>>> stats = fam.stats_from_labels(jnp.ones((3, 2)), jnp.array([0, 0, 1]), 2)
>>> fam.log_marginal(stats).shape
(2,)
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import gammaln

from .. import _math
from .._math import JAX_MATH as _JAX_MATH
from .._math import LOG_2PI
from .._math import NUMPY_MATH as _NUMPY_MATH

from .._pytree import (
    ParameterPytree, concrete_value, real_parameter, require_finite, require_positive, same_length,
)
from .._random import (
    loggamma_from_uniform, loggamma_uniforms,
    normal_from_uniform, split_uniform,
)
from .._validation import constant_columns

__all__ = [
    "Family",
    "NormalGamma",
    "NormalGammaComponent",
    "NormalWishart",
    "NormalWishartComponent",
    "log_beta",
    "safe_log",
    "from_data_array",
]

_LOG_PI = math.log(math.pi)
#: NormalWishart scores a block of at most this many points per dimension against every
#: cluster without factorising ``Ψ_n⁻¹`` (:meth:`NormalWishart.log_predictive_pairwise`)
PAIRWISE_DIRECT_ROWS_PER_DIM = 16


def log_beta(a, b, m=_JAX_MATH):
    """``log B(a, b)`` from ``gammaln``: full float64 precision.

    (``jax.scipy.special.betaln`` switches to an asymptotic branch for
    arguments >= 8 that is only accurate to about 1e-6.)
    """
    return m.gammaln(a) + m.gammaln(b) - m.gammaln(a + b)


def safe_log(p):
    """``log p`` with exact zeros (underflowed Dirichlet/Beta draws) sent to the log of the
    smallest positive normal number: finite, so that ``0 · log p`` in a matrix product is 0."""
    return jnp.log(jnp.maximum(p, jnp.finfo(jnp.result_type(p)).tiny))


def from_data_array(owner: str, X: Any, min_rows: int = 1) -> np.ndarray:
    """``X`` checked like the estimators check it (2-D, numeric, finite, non-empty)."""
    from .._validation import check_data

    X = check_data(X, name="X")
    if X.shape[0] < min_rows:
        raise ValueError(f"{owner}.from_data: X needs at least {min_rows} rows, got {X.shape[0]}.")
    return X


class Family(ParameterPytree):
    """Protocol shared by the conjugate families (docs/mathematics.md §2)."""

    #: name of the data kind, used in error messages
    data_kind: str = "real"

    def point_stats(self, X: jax.Array):
        """Sufficient statistics of each point: a pytree with leading axis ``n``."""
        return self._point_stats(jnp.asarray(X), jnp)

    def host_point_stats(self, X: Any):
        """``point_stats`` in NumPy float64 (no JAX call; host-side tree code)."""
        return self._point_stats(np.asarray(X, dtype=np.float64), np)

    @staticmethod
    def _point_stats(X, xp):
        """The statistics written once over the array namespace ``xp``."""
        raise NotImplementedError

    def empty_stats(self, capacity: int, dim: int, dtype=None):
        """Statistics of ``capacity`` empty clusters."""
        dtype = dtype or jnp.result_type(float)
        one = self.point_stats(jnp.zeros((1, dim), dtype))
        return jax.tree.map(lambda s: jnp.zeros((capacity,) + s.shape[1:], s.dtype), one)

    def stats_from_labels(self, X: jax.Array, labels: jax.Array, capacity: int):
        """Per-cluster statistics, shape ``(capacity, ...)``, summed by ``labels``."""
        ps = self.point_stats(X)
        return jax.tree.map(
            lambda s: jax.ops.segment_sum(s, labels, num_segments=capacity), ps
        )

    def log_marginal(self, stats) -> jax.Array:
        """``log P(X_c)`` of every cluster (leading axes of ``stats`` are batch axes)."""
        return self._log_marginal(self, stats, _JAX_MATH)

    def host_log_marginal(self, stats) -> np.ndarray:
        """``log P(X_c)`` in NumPy float64 from NumPy statistics (the same formula as
        ``log_marginal``; no JAX call). Used by the host-side tree code (IBHC, tgMCMC)."""
        stats = jax.tree.map(lambda a: np.asarray(a, dtype=np.float64), stats)
        return self.host_log_marginal_unchecked(stats)

    def host_log_marginal_unchecked(self, stats) -> np.ndarray:
        """``host_log_marginal`` for statistics that are already NumPy float64 (hot loops)."""
        return self._log_marginal(self.host_params(), stats, _NUMPY_MATH)

    @staticmethod
    def _log_marginal(p, stats, m):
        """The log marginal written once over parameters ``p`` and math namespace ``m``."""
        raise NotImplementedError

    def predictive_params(self, stats):
        raise NotImplementedError

    def log_predictive_from_params(self, x: jax.Array, params) -> jax.Array:
        raise NotImplementedError

    def log_predictive_pairwise(self, X: jax.Array, params) -> jax.Array:
        """``log p(x_b | X_k)`` of every point ``X`` ``(B, D)`` under every cluster of
        ``params`` (leading axis ``K``): shape ``(B, K)``. The collapsed Gibbs sweep scores a
        block of points against all clusters at once with it; families override it with
        a form that vectorises over the clusters."""
        return jax.vmap(lambda x: self.log_predictive_from_params(x, params))(X)

    def log_predictive(self, x: jax.Array, stats) -> jax.Array:
        """``log p(x | X_c)`` for one point ``x`` (shape ``(D,)``) and every cluster."""
        return self.log_predictive_from_params(x, self.predictive_params(stats))

    def prior_predictive_params(self, dim: int, dtype=None):
        """Predictive parameters of an empty cluster (the prior), leading axis of length 1."""
        return self.predictive_params(self.empty_stats(1, dim, dtype))

    def prior_log_predictive(self, x: jax.Array) -> jax.Array:
        """``log p(x)`` under the prior (a new cluster)."""
        return self.log_predictive_from_params(x, self.prior_predictive_params(x.shape[-1], x.dtype))[0]

    def sample_params(self, key: jax.Array, stats):
        """A draw of the component parameters from their conjugate posterior given the
        cluster statistics ``stats`` (the prior for zero statistics); leading axes of
        ``stats`` are batch axes and are kept (docs/mathematics.md §2, "Instantiated
        parameters"). One uniform draw, transformed by :meth:`sample_params_from_uniform`."""
        k_u, k_redraw = jax.random.split(key)
        shapes, dtype = self.param_uniforms(stats)
        return self.sample_params_from_uniform(split_uniform(k_u, shapes, dtype), stats, k_redraw)

    def param_uniforms(self, stats) -> tuple[list, Any]:
        """``(shapes, dtype)`` of the uniforms :meth:`sample_params_from_uniform` takes for
        ``stats``: a sampler that draws many parameter sets per step draws all their
        uniforms at once (on a CPU each ``jax.random`` call has a fixed cost)."""
        raise NotImplementedError

    def sample_params_from_uniform(self, u: list, stats, key: jax.Array):
        """:meth:`sample_params` from uniforms ``u`` in ``(0, 1)`` of the shapes
        :meth:`param_uniforms` gives; ``key`` (independent of ``u``) feeds only the rare
        redraws of the Gamma variates' rejection step."""
        raise NotImplementedError

    def log_params_density(self, params, stats) -> jax.Array:
        """``log p(θ | X_c)``: the density of instantiated parameters under the conjugate
        posterior given ``stats`` (the prior for zero statistics); batch axes are kept
        (docs/mathematics.md §2, "Instantiated parameters")."""
        raise NotImplementedError

    def log_likelihood(self, X: jax.Array, params) -> jax.Array:
        """``log p(x_i | θ_k)`` of every point ``X`` ``(n, D)`` under every component of
        ``params`` (leading axis ``K``): shape ``(n, K)`` (docs/mathematics.md §2,
        "Instantiated parameters")."""
        raise NotImplementedError

    def log_likelihood_at(self, X: jax.Array, params, index: jax.Array) -> jax.Array:
        """``log p(x_i | θ_{index[i, j]})``, shape ``(n, m)``: each point against its own
        ``m`` components (e.g. the two sub-clusters of its cluster). The default takes the
        columns of :meth:`log_likelihood`; families whose per-pair cost is small gather the
        parameters instead (docs/mathematics.md §2, "Instantiated parameters")."""
        return jnp.take_along_axis(self.log_likelihood(X, params), index, axis=-1)

    def validate_data(self, X: np.ndarray) -> None:
        """Raise ``ValueError`` if ``X`` cannot be modelled by this family."""

    def unconstrained(self) -> dict:
        """The hyperparameters as a dict of unconstrained arrays (logs of positive values, a
        Cholesky factor), which :meth:`constrained` maps back: the coordinates of type-II
        maximum likelihood (``partition.hyperparameters.family_type2_ml``)."""
        raise ValueError(f"type-II ML is not implemented for {type(self).__name__}.")

    def constrained(self, p: dict) -> "Family":
        """This family with the hyperparameters :meth:`unconstrained` coordinates ``p`` give."""
        raise ValueError(f"type-II ML is not implemented for {type(self).__name__}.")

    @classmethod
    def from_data(cls, X: Any) -> "Family":  # pragma: no cover - overridden
        raise NotImplementedError


# ----------------------------------------------------------------------------- Normal-Gamma
class NormalGammaStats(NamedTuple):
    n: jax.Array  # (..., )
    sum_x: jax.Array  # (..., D)
    sum_xx: jax.Array  # (..., D)


class NormalGammaComponent(NamedTuple):
    """Instantiated parameters of diagonal Gaussian components (leading axes = components)."""

    mean: jax.Array  # (..., D) μ
    precision: jax.Array  # (..., D) λ, one precision per dimension


class NormalGamma(Family):
    """Diagonal Gaussian with a Normal-Gamma prior per dimension (docs/mathematics.md §2).

    ``μ_d | λ_d ~ N(m0_d, 1/(k0 λ_d))``, ``λ_d ~ Gamma(a0, rate=b0_d)``.
    ``m0`` and ``b0`` may be scalars or length-``D`` vectors; ``k0`` and ``a0``
    are scalars. The predictive is a product of Student-t densities with
    ``2 a_n`` degrees of freedom, location ``m_n`` and squared scale
    ``b_n (k_n + 1) / (a_n k_n)``.
    """

    _fields = ("m0", "k0", "a0", "b0")

    def __init__(self, m0: Any = 0.0, k0: Any = 1.0, a0: Any = 1.0, b0: Any = 1.0):
        require_finite("NormalGamma", "m0", m0)
        require_positive("NormalGamma", "k0", k0, ndims=(0,))
        require_positive("NormalGamma", "a0", a0, ndims=(0,))
        require_positive("NormalGamma", "b0", b0)
        same_length("NormalGamma", ("m0", "b0"), (m0, b0))
        self._set(m0=m0, k0=k0, a0=a0, b0=b0)

    def unconstrained(self) -> dict:
        return {"m0": self.m0, "log_k0": jnp.log(self.k0), "log_a0": jnp.log(self.a0),
                "log_b0": jnp.log(self.b0)}

    def constrained(self, p: dict) -> "NormalGamma":
        return self.replace(m0=p["m0"], k0=jnp.exp(p["log_k0"]), a0=jnp.exp(p["log_a0"]),
                            b0=jnp.exp(p["log_b0"]))

    @classmethod
    def from_data(cls, X: Any, k0: float = 0.1, a0: float = 2.0) -> "NormalGamma":
        """Weakly informative prior from the data.

        ``m0`` = per-dimension mean, ``k0 = 0.1``, ``a0 = 2``, and ``b0`` =
        per-dimension variance × ``(a0 − 1)`` so that the prior mean of the
        variance ``b0/(a0−1)`` equals the data variance.
        """
        X = from_data_array("NormalGamma", X)
        var = np.var(X, axis=0)
        var = np.where(var > 0, var, 1.0)
        return cls(m0=X.mean(axis=0), k0=k0, a0=a0, b0=var * (a0 - 1.0))

    @staticmethod
    def _point_stats(X, xp):
        return NormalGammaStats(xp.ones(X.shape[:-1], X.dtype), X, X * X)

    def _posterior(self, stats):
        return self._posterior_of(self, stats)

    @staticmethod
    def _posterior_of(p, stats):
        n = stats.n[..., None]
        kn = p.k0 + n
        mn = (p.k0 * p.m0 + stats.sum_x) / kn
        an = p.a0 + 0.5 * n
        # the scatter term is >= 0, but raw sums cancel: at scale 1e29 the rounding error
        # (~1e42) exceeds b0 and made bn negative (NaN log marginal); clamp the rounding
        scatter = stats.sum_xx + p.k0 * p.m0**2 - kn * mn**2
        bn = p.b0 + 0.5 * (scatter * (scatter > 0))
        return kn, mn, an, bn

    @staticmethod
    def _log_marginal(p, stats, m):
        xp = m.xp
        kn, mn, an, bn = NormalGamma._posterior_of(p, stats)
        n = stats.n[..., None]
        prior = m.constant(  # the terms of the prior alone
            p, "log_marginal_prior",
            lambda: -m.gammaln(p.a0) + p.a0 * xp.log(p.b0) + 0.5 * xp.log(p.k0),
        )
        per_dim = prior + m.gammaln(an) - an * xp.log(bn) - 0.5 * xp.log(kn) - 0.5 * n * LOG_2PI
        return m.sum(per_dim, axis=-1)

    def predictive_params(self, stats):
        kn, mn, an, bn = self._posterior(stats)
        dof = 2.0 * an
        scale2 = bn * (kn + 1.0) / (an * kn)
        log_norm = (
            gammaln(0.5 * (dof + 1.0))
            - gammaln(0.5 * dof)
            - 0.5 * jnp.log(dof * jnp.pi * scale2)
        )
        # store dof as (..., D): all dimensions share it but this keeps shapes simple
        return (mn, 1.0 / (dof * scale2), 0.5 * (dof + 1.0), jnp.sum(log_norm, -1))

    def log_predictive_from_params(self, x, params):
        mn, inv_dof_scale2, half_dof1, log_norm = params
        z = (x - mn) ** 2 * inv_dof_scale2
        return log_norm - jnp.sum(half_dof1 * jnp.log1p(z), axis=-1)

    @staticmethod
    def _param_shape(posterior):
        kn, mn, an, bn = posterior
        shape = jnp.broadcast_shapes(jnp.shape(kn), jnp.shape(mn), jnp.shape(an), jnp.shape(bn))
        return shape, jnp.result_type(mn, bn)

    def param_uniforms(self, stats):
        shape, dtype = self._param_shape(self._posterior(stats))
        return [loggamma_uniforms(shape), shape], dtype

    def sample_params_from_uniform(self, u, stats, key):
        """``NormalGammaComponent`` drawn from the Normal-Gamma posterior (docs/mathematics.md §2,
        "Instantiated parameters"): per dimension ``λ ~ Gamma(a_n, rate=b_n)``, then
        ``μ | λ ~ N(m_n, 1/(k_n λ))``. ``stats`` with leading axes ``(...,)`` give
        parameters of shape ``(..., D)``."""
        posterior = self._posterior(stats)
        kn, mn, an, bn = posterior
        shape, dtype = self._param_shape(posterior)
        u_lam, u_mu = u
        lam = jnp.exp(loggamma_from_uniform(u_lam, jnp.broadcast_to(an, shape).astype(dtype), key)) / bn
        mu = mn + normal_from_uniform(u_mu) / jnp.sqrt(kn * lam)
        return NormalGammaComponent(mu, lam)

    def log_params_density(self, params, stats):
        kn, mn, an, bn = self._posterior(stats)
        mu, lam = params
        gamma = an * jnp.log(bn) - gammaln(an) + (an - 1.0) * jnp.log(lam) - bn * lam
        return jnp.sum(gamma + 0.5 * (jnp.log(kn * lam) - LOG_2PI - kn * lam * (mu - mn) ** 2), -1)

    def log_likelihood(self, X, params):
        """``log N(x_i | μ_k, diag(λ_k)⁻¹)``, shape ``(n, K)`` (docs/mathematics.md §2,
        "Instantiated parameters"). The quadratic form is expanded,
        ``Σ_d λ_d (x_d² − 2 x_d μ_d + μ_d²)``, so the whole matrix is one product of the
        features ``[x², x, 1]`` with the components' ``[−λ/2, λμ, const]``."""
        X = jnp.asarray(X)
        mu, lam = params.mean, params.precision
        d = X.shape[-1]
        const = 0.5 * jnp.sum(jnp.log(lam), -1) - 0.5 * jnp.sum(lam * mu * mu, -1) - 0.5 * d * LOG_2PI
        # one matrix product: [x², x, 1] against [−λ/2, λμ, const] (one pass over the output)
        feats = jnp.concatenate([X * X, X, jnp.ones(X.shape[:-1] + (1,), X.dtype)], -1)
        table = jnp.concatenate([-0.5 * lam, lam * mu, const[:, None]], -1)
        return feats @ table.T.astype(feats.dtype)

    def log_likelihood_at(self, X, params, index):
        """:meth:`Family.log_likelihood_at` by gathering each point's components:
        ``O(n m D)`` work instead of ``O(n K D)``."""
        X = jnp.asarray(X)
        mu, lam = params.mean[index], params.precision[index]  # (n, m, D)
        diff = X[:, None, :] - mu
        d = X.shape[-1]
        return 0.5 * jnp.sum(jnp.log(lam) - lam * diff * diff, -1) - 0.5 * d * LOG_2PI

    def validate_data(self, X):
        m0 = concrete_value(self.m0)
        if m0 is not None and m0.ndim == 1 and m0.shape[0] != X.shape[1]:
            raise ValueError(
                f"NormalGamma: m0 has length {m0.shape[0]} but the data have {X.shape[1]} columns."
            )
        b0 = concrete_value(self.b0)
        if b0 is not None and b0.ndim == 1 and b0.shape[0] != X.shape[1]:
            raise ValueError(
                f"NormalGamma: b0 has length {b0.shape[0]} but the data have {X.shape[1]} columns."
            )


# ----------------------------------------------------------------------------- Normal-Wishart
class NormalWishartStats(NamedTuple):
    n: jax.Array  # (...,)
    sum_x: jax.Array  # (..., D)
    sum_xx: jax.Array  # (..., D, D)


class NormalWishartParams(NamedTuple):
    """Cached multivariate-t predictive of each cluster (leading axes = clusters)."""

    mean: jax.Array  # (..., D) m_n
    psi_inv: jax.Array  # (..., D, D) Ψ_n⁻¹
    logdet_psi: jax.Array  # (...,) log|Ψ_n|
    rn: jax.Array  # (...,)
    nun: jax.Array  # (...,)
    log_norm: jax.Array  # (...,) log normaliser of the t density


class NormalWishartComponent(NamedTuple):
    """Instantiated parameters of full-covariance Gaussian components (leading axes = components)."""

    mean: jax.Array  # (..., D) μ
    precision: jax.Array  # (..., D, D) Λ


class NormalWishart(Family):
    """Full-covariance Gaussian with a Normal-Wishart prior (docs/mathematics.md §2).

    ``μ | Λ ~ N(m0, (r Λ)^−1)``, ``Λ ~ Wishart(ν, Ψ^−1)``; ``psi`` is the
    inverse scale ``Ψ`` (symmetric positive definite, ``D × D``), ``nu > D − 1``.
    The predictive is a multivariate t with ``ν_n − D + 1`` degrees of freedom,
    location ``m_n`` and scale ``Ψ_n (r_n + 1) / (r_n (ν_n − D + 1))``.
    """

    _fields = ("m0", "r", "nu", "psi")

    def __init__(self, m0: Any, r: Any, nu: Any, psi: Any):
        require_finite("NormalWishart", "m0", m0, ndims=(1,))
        require_positive("NormalWishart", "r", r, ndims=(0,))
        require_finite("NormalWishart", "nu", nu, ndims=(0,))
        psi_c = real_parameter("NormalWishart", "psi", psi, ndims=(0, 1, 2))
        m0_c = concrete_value(m0)
        if psi_c is not None:
            if psi_c.ndim != 2 or psi_c.shape[0] != psi_c.shape[1]:
                raise ValueError(
                    f"NormalWishart: psi must be a square D x D matrix, got shape {psi_c.shape}."
                )
            if not np.all(np.isfinite(psi_c)):
                raise ValueError("NormalWishart: psi must be finite.")
            if not np.allclose(psi_c, psi_c.T, rtol=1e-8, atol=1e-10):
                raise ValueError("NormalWishart: psi must be symmetric; pass (psi + psi.T) / 2.")
            if np.linalg.eigvalsh(psi_c).min() <= 0:
                raise ValueError(
                    "NormalWishart: psi (the inverse scale) must be positive definite; "
                    "its smallest eigenvalue is "
                    f"{np.linalg.eigvalsh(psi_c).min():.3g}. Add a multiple of the identity "
                    "or use NormalWishart.from_data(X)."
                )
            if m0_c is not None and m0_c.shape != (psi_c.shape[0],):
                raise ValueError(
                    f"NormalWishart: m0 must have shape ({psi_c.shape[0]},) to match psi, "
                    f"got {m0_c.shape}."
                )
            nu_c = concrete_value(nu)
            if nu_c is not None and not float(nu_c) > psi_c.shape[0] - 1:
                raise ValueError(
                    f"NormalWishart: nu must be > D - 1 = {psi_c.shape[0] - 1}, got {float(nu_c)}."
                )
        self._set(m0=m0, r=r, nu=nu, psi=psi)

    def unconstrained(self) -> dict:
        d = self.psi.shape[-1]
        return {"m0": self.m0, "log_r": jnp.log(self.r), "log_nu_excess": jnp.log(self.nu - (d - 1.0)),
                "chol_psi": jnp.linalg.cholesky(self.psi)}

    def constrained(self, p: dict) -> "NormalWishart":
        d = self.psi.shape[-1]
        L = jnp.tril(p["chol_psi"])
        return self.replace(m0=p["m0"], r=jnp.exp(p["log_r"]),
                            nu=(d - 1.0) + jnp.exp(p["log_nu_excess"]), psi=L @ L.T)

    @classmethod
    def from_data(cls, X: Any, r: float = 0.1, extra_dof: float = 6.0, det_psi: float = 0.1,
                  shrinkage: Any = None):
        """The tgMCMC paper's settings (docs/mathematics.md §2).

        ``r = 0.1``, ``ν = D + 6``, ``m0`` = sample mean and
        ``Ψ = S / (det(S)/0.1)^(1/D)`` with ``S`` the sample covariance, so
        that ``det Ψ = 0.1``.

        ``shrinkage``: ``None`` (default, the paper's): ``S`` is the sample covariance, which
        must be non-singular. ``"ledoit-wolf"``: ``S`` is scikit-learn's Ledoit-Wolf estimate
        (``sklearn.covariance.ledoit_wolf``), the sample covariance shrunk towards a multiple
        of the identity by a data-driven weight: positive definite with constant or collinear
        columns. A number ``δ`` in ``[0, 1]``: ``(1 − δ) S + δ tr(S)/D I``. With shrinkage,
        constant columns are left out of the determinant: ``Ψ = S / (det(S_v)/0.1)^(1/D_v)``
        over the ``D_v`` columns that vary, so that a constant column (whose shrunk variance is
        tiny) does not blow up the scale of the others.
        """
        X = from_data_array("NormalWishart", X, min_rows=2)
        d = X.shape[1]
        if shrinkage is None:
            S = np.atleast_2d(np.cov(X, rowvar=False))
        elif isinstance(shrinkage, str):
            if shrinkage != "ledoit-wolf":
                raise ValueError(
                    f"NormalWishart.from_data: shrinkage must be None, 'ledoit-wolf' or a number "
                    f"in [0, 1], got {shrinkage!r}."
                )
            from sklearn.covariance import ledoit_wolf

            S = np.atleast_2d(ledoit_wolf(X)[0])
        else:
            delta = float(shrinkage)
            if not 0.0 <= delta <= 1.0:
                raise ValueError(
                    f"NormalWishart.from_data: shrinkage must be in [0, 1], got {shrinkage!r}."
                )
            S = np.atleast_2d(np.cov(X, rowvar=False))
            S = (1.0 - delta) * S + delta * np.trace(S) / d * np.eye(d)
        varies = np.ones(d, bool)
        if shrinkage is not None:
            varies = ~constant_columns(X.mean(axis=0), X.std(axis=0))
        sign, logdet = np.linalg.slogdet(S[np.ix_(varies, varies)]) if varies.any() else (0.0, 0.0)
        if sign <= 0:
            raise ValueError(
                "NormalWishart.from_data: the sample covariance is singular "
                + ("(constant or collinear columns); drop them, pass shrinkage='ledoit-wolf' "
                   "or pass psi yourself." if shrinkage is None else "(every column is constant).")
            )
        psi = S / np.exp((logdet - np.log(det_psi)) / int(varies.sum()))
        return cls(m0=X.mean(axis=0), r=r, nu=d + extra_dof, psi=psi)

    @staticmethod
    def _point_stats(X, xp):
        return NormalWishartStats(
            xp.ones(X.shape[:-1], X.dtype), X, X[..., :, None] * X[..., None, :]
        )

    def _posterior(self, stats):
        return self._posterior_of(self, stats)

    @staticmethod
    def _posterior_of(p, stats):
        n = stats.n
        rn = p.r + n
        nun = p.nu + n
        mn = (p.r * p.m0 + stats.sum_x) / rn[..., None]
        psin = (
            p.psi
            + stats.sum_xx
            + p.r * (p.m0[:, None] * p.m0[None, :])
            - rn[..., None, None] * mn[..., :, None] * mn[..., None, :]
        )
        return rn, nun, mn, psin

    @staticmethod
    def _log_marginal(p, stats, m):
        return NormalWishart._count_terms(p, stats.n, m) + NormalWishart._data_terms(p, stats, m)

    @staticmethod
    def _count_terms(p, n, m):
        """The terms of ``log P(X_c)`` that depend on the data only through the count ``n``."""
        xp = m.xp
        d = p.psi.shape[-1]
        prior = m.constant(  # the terms of the prior alone
            p, "log_marginal_prior",
            lambda: 0.5 * d * xp.log(p.r) + 0.5 * p.nu * m.logdet_pd(p.psi)
            - m.multigammaln(0.5 * p.nu, d),
        )
        return prior - 0.5 * n * d * _LOG_PI - 0.5 * d * xp.log(p.r + n) + m.multigammaln(0.5 * (p.nu + n), d)

    @staticmethod
    def _data_terms(p, stats, m):
        """``-ν_n/2 log|Ψ_n|``, with Ψ_n = Ψ + r m0 m0ᵀ + Σxxᵀ − b bᵀ / r_n and b = r m0 + Σx
        (the posterior scale of _posterior_of, the terms of the prior alone gathered)."""
        n = stats.n
        rn = p.r + n
        b = p.r * p.m0 + stats.sum_x
        psi_prior = m.constant(p, "psi_plus_r_m0_m0", lambda: p.psi + p.r * (p.m0[:, None] * p.m0[None, :]))
        psin = psi_prior + stats.sum_xx - (b[..., :, None] * b[..., None, :]) / rn[..., None, None]
        return -0.5 * (p.nu + n) * m.logdet_pd(psin)

    def tabulated_log_marginal(self, max_count: int):
        """``log_marginal`` with its count-only terms (``log Γ_D(ν_n/2)``, ``log r_n``, ...)
        looked up in a table over counts ``0..max_count``. For tree code, which
        evaluates the marginal of many unions: ``gammaln`` is most of its cost on CPU."""
        m = _JAX_MATH
        dtype = jnp.result_type(float)
        table = self._count_terms(self, jnp.arange(max_count + 1, dtype=dtype), m)

        def log_marginal(stats):
            k = jnp.clip(jnp.round(stats.n), 0, max_count).astype(jnp.int32)
            return table[k] + self._data_terms(self, stats, m)

        return log_marginal

    def predictive_params(self, stats):
        """``NormalWishartParams``: ``m_n``, ``Ψ_n⁻¹``, ``log|Ψ_n|``, ``r_n``, ``ν_n`` and the t normaliser."""
        rn, nun, mn, psin = self._posterior(stats)
        # jaxbnp._math: no LAPACK call (two in one program can deadlock XLA's CPU thread pool)
        chol = _math.cholesky(psin)
        d = self.psi.shape[-1]
        eye = jnp.broadcast_to(jnp.eye(d, dtype=chol.dtype), chol.shape)
        psi_inv = _math.cho_solve(chol, eye)
        logdet = 2.0 * jnp.sum(jnp.log(jnp.diagonal(chol, axis1=-2, axis2=-1)), -1)
        return self._with_norm(mn, psi_inv, logdet, rn, nun)

    def _t_count_terms(self, rn, nun):
        """The terms of the t predictive's log normaliser that depend on the count only:
        ``log Γ((dof+D)/2) − log Γ(dof/2) − D/2 log(dof π)`` and ``D log((r_n+1)/(r_n dof))``,
        ``log|scale| − log|Ψ_n|`` (scale = Ψ_n (r_n+1) / (r_n dof), dof = ν_n − D + 1)."""
        d = self.psi.shape[-1]
        dof = nun - d + 1.0
        return (gammaln(0.5 * (dof + d)) - gammaln(0.5 * dof) - 0.5 * d * jnp.log(dof * jnp.pi),
                d * jnp.log((rn + 1.0) / (rn * dof)))

    def _with_norm(self, mn, psi_inv, logdet_psi, rn, nun):
        gamma_terms, scale_ratio = self._t_count_terms(rn, nun)
        log_norm = gamma_terms - 0.5 * (logdet_psi + scale_ratio)
        return NormalWishartParams(mn, psi_inv, logdet_psi, rn, nun, log_norm)

    def log_predictive_from_params(self, x, params):
        d = self.psi.shape[-1]
        diff = x - params.mean
        # an einsum, not the multiply-and-sum ``sum(sum(Ψ⁻¹ * diff[..., None, :], -1) * diff, -1)``:
        # vmapped over points and jitted in float32, XLA:CPU (jax 0.10.2) computed that one wrong
        # beyond the first hundred points (NaN or values off by tens of nats; eager and float64
        # right), which made MAP-DP's batched step move most points of every block
        q = jnp.einsum("...d,...de,...e->...", diff, params.psi_inv, diff)
        dof = params.nun - d + 1.0
        return params.log_norm - 0.5 * (dof + d) * jnp.log1p(q * params.rn / (params.rn + 1.0))

    def log_predictive_pairwise(self, X, params):
        """``(B, K)`` predictive log densities. For ``D <= 8`` the quadratic form is written
        out over the ``D(D+1)/2`` entries of ``Ψ_n⁻¹``: every term is a ``(B, K)`` array,
        so the whole score is one loop over the clusters that the compiler vectorises.
        Larger ``D``: with ``Ψ_n⁻¹ = L Lᵀ`` (Cholesky), ``q = |Lᵀ x − Lᵀ m_n|²``, where
        ``Lᵀ x`` of every point and cluster is one matrix product ``(B, D) × (D, K D)``
        (``B K D²`` multiply-adds, as the per-pair form, but at the speed of a matrix
        product: MAP-DP's block of 4,096 points against 64 clusters in 10-D, 12 -> 3 ms).
        A block of at most ``PAIRWISE_DIRECT_ROWS_PER_DIM * D`` points (the collapsed Gibbs
        sweep's 32) forms ``x − m_n`` for every pair and multiplies by ``Ψ_n⁻¹`` directly:
        the ``K`` factorisations, a loop over the ``D`` columns, would cost more than the
        block's scores (32 points against 32 clusters in 30-D: 1.6 ms factored, 0.16 ms
        direct; ``benchmarks/results/pairwise_scores.md``)."""
        d = self.psi.shape[-1]
        dof = params.nun - d + 1.0
        shrink = params.rn / (params.rn + 1.0)
        if d > 8 and X.shape[0] <= PAIRWISE_DIRECT_ROWS_PER_DIM * d:
            diff = X[:, None, :] - params.mean[None]  # (B, K, D)
            q = jnp.sum(jnp.einsum("bkd,kde->bke", diff, params.psi_inv) * diff, -1)
        elif d > 8:
            chol = _math.cholesky(params.psi_inv)  # (K, D, D)
            z = jnp.einsum("bd,kde->bke", X, chol) - jnp.einsum("kd,kde->ke", params.mean, chol)[None]
            q = jnp.sum(z * z, -1)
        else:
            diff = [X[:, a, None] - params.mean[None, :, a] for a in range(d)]
            q = 0.0
            for a in range(d):
                q = q + params.psi_inv[None, :, a, a] * diff[a] * diff[a]
                for b in range(a + 1, d):
                    q = q + (2.0 * params.psi_inv[None, :, a, b]) * diff[a] * diff[b]
        return params.log_norm[None] - (0.5 * (dof + d))[None] * jnp.log1p(q * shrink[None])

    def params_add(self, params, x):
        """Predictive parameters after adding ``x`` to a cluster: Sherman-Morrison, no factorisation.

        ``Ψ_{n+1} = Ψ_n + r_n/(r_n+1) (x − m_n)(x − m_n)ᵀ``.
        """
        return self._rank_one(params, x, +1.0)

    def params_remove(self, params, x):
        """Predictive parameters after removing ``x`` from a cluster that contains it.

        ``Ψ_{n−1} = Ψ_n − r_n/(r_n−1) (x − m_n)(x − m_n)ᵀ``.
        """
        return self._rank_one(params, x, -1.0)

    def removed_norms(self, counts):
        """The count terms of the t normaliser of a cluster of ``counts`` points after one
        is removed (``counts − 1`` points): :meth:`log_predictive_removed` adds
        ``−½ log|Ψ_{n−1}|``. The collapsed Gibbs sweep tabulates them once per sweep
        over ``counts = 1..n``; ``counts = 0`` gives a finite placeholder."""
        n = jnp.maximum(jnp.asarray(counts) - 1, 0).astype(jnp.result_type(self.r, float))
        gamma_terms, scale_ratio = self._t_count_terms(self.r + n, self.nu + n)
        return gamma_terms - 0.5 * scale_ratio

    def log_predictive_removed(self, params, x, norm=None):
        """``log p(x | X_c \\ {x})`` from the cached parameters of a cluster that contains
        ``x`` (leading axis 1), without forming the parameters of ``X_c \\ {x}``: with
        ``v = x − m_n``, ``q = vᵀ Ψ_n⁻¹ v`` and ``δ = 1 − r_n q / (r_n − 1)``,
        :meth:`params_remove` gives ``log|Ψ_{n−1}| = log|Ψ_n| + log δ`` and
        ``(x − m_{n−1})ᵀ Ψ_{n−1}⁻¹ (x − m_{n−1}) = (r_n / (r_n − 1))² q / δ`` (docs/mathematics.md §2). ``norm``: the
        count terms, :meth:`removed_norms` of the cluster's count (computed when omitted).
        One quadratic form per visited point: the collapsed Gibbs sweep scores each point
        against its own cluster this way. Shape ``(1,)``."""
        d = self.psi.shape[-1]
        rn = params.rn
        if norm is None:
            norm = self.removed_norms(jnp.round(rn - self.r).astype(jnp.int32))
        v = x - params.mean
        q = jnp.sum(params.psi_inv * (v[..., :, None] * v[..., None, :]), (-2, -1))
        denom = 1.0 - rn * q / (rn - 1.0)
        # r_{n-1} / (r_{n-1} + 1) = (r_n - 1) / r_n times the removed cluster's quadratic form
        q_shrunk = rn * q / ((rn - 1.0) * denom)
        dof = params.nun - d  # ν_{n-1} − D + 1
        return norm - 0.5 * (params.logdet_psi + jnp.log(denom)) - 0.5 * (dof + d) * jnp.log1p(q_shrunk)

    def _rank_one(self, p, x, sign):
        rn = p.rn
        v = x - p.mean
        w = jnp.sum(p.psi_inv * v[..., None, :], -1)
        q = jnp.sum(v * w, -1)
        c = sign * rn / (rn + sign)
        denom = 1.0 + c * q
        psi_inv = p.psi_inv - (c / denom)[..., None, None] * w[..., :, None] * w[..., None, :]
        mean = (rn[..., None] * p.mean + sign * x) / (rn + sign)[..., None]
        return self._with_norm(mean, psi_inv, p.logdet_psi + jnp.log(denom), rn + sign, p.nun + sign)

    def param_uniforms(self, stats):
        d = self.psi.shape[-1]
        batch = jnp.shape(stats.n)
        dtype = self._posterior(stats)[2].dtype  # m_n's
        return [loggamma_uniforms(batch + (d,)), batch + (d, d), batch + (d, 1)], dtype

    def sample_params_from_uniform(self, u, stats, key):
        """``NormalWishartComponent`` drawn from the Normal-Wishart posterior (docs/mathematics.md
        §2, "Instantiated parameters"): ``Λ ~ Wishart(ν_n, Ψ_n⁻¹)`` (``E[Λ] = ν_n Ψ_n⁻¹``), then
        ``μ | Λ ~ N(m_n, (r_n Λ)⁻¹)``.

        Bartlett decomposition with ``Ψ_n = U Uᵀ`` (Cholesky): ``A`` lower triangular with
        ``A_ii² ~ χ²(ν_n − i)`` (``i = 0..D−1``) and ``A_ij ~ N(0, 1)`` below the diagonal;
        ``B = U⁻ᵀ A``, ``Λ = B Bᵀ`` and ``μ = m_n + U A⁻ᵀ z / √r_n`` with ``z ~ N(0, I)``.
        Only triangular solves, no inverse. ``stats`` with leading axes ``(...,)`` give
        ``mean`` ``(..., D)`` and ``precision`` ``(..., D, D)``."""
        rn, nun, mn, psin = self._posterior(stats)
        d = self.psi.shape[-1]
        batch = mn.shape[:-1]
        dtype = mn.dtype
        u_diag, u_off, u_mu = u
        # χ²(k) = 2 Gamma(k/2)
        df = jnp.broadcast_to(nun, batch)[..., None] - jnp.arange(d, dtype=dtype)
        diag = jnp.sqrt(2.0 * jnp.exp(loggamma_from_uniform(u_diag, 0.5 * df, key)))
        off = jnp.tril(normal_from_uniform(u_off), -1)
        A = off + diag[..., :, None] * jnp.eye(d, dtype=dtype)
        U = _math.cholesky(psin)
        U = jnp.broadcast_to(U, batch + (d, d))
        Ut = jnp.swapaxes(U, -1, -2)
        B = _math.solve_triangular(Ut, A, lower=False)
        precision = B @ jnp.swapaxes(B, -1, -2)
        precision = 0.5 * (precision + jnp.swapaxes(precision, -1, -2))
        z = normal_from_uniform(u_mu)
        y = _math.solve_triangular(jnp.swapaxes(A, -1, -2), z, lower=False)  # A⁻ᵀ z
        mean = mn + (U @ y)[..., 0] / jnp.sqrt(jnp.broadcast_to(rn, batch))[..., None]
        return NormalWishartComponent(mean, precision)

    def log_params_density(self, params, stats):
        """``log Wishart(Λ | ν_n, Ψ_n⁻¹) + log N(μ | m_n, (r_n Λ)⁻¹)``."""
        m, (rn, nun, mn, psin), (mu, P) = _JAX_MATH, self._posterior(stats), params
        d, logdet = P.shape[-1], _JAX_MATH.logdet_pd(P)
        quad = jnp.einsum("...i,...ij,...j->...", mu - mn, P, mu - mn)
        wishart = (0.5 * (nun - d - 1.0) * logdet - 0.5 * jnp.sum(psin * P, (-2, -1)) - m.multigammaln(0.5 * nun, d)
                   + 0.5 * nun * (m.logdet_pd(psin) - d * jnp.log(2.0)))
        return wishart + 0.5 * (d * jnp.log(rn) + logdet - d * LOG_2PI - rn * quad)

    def log_likelihood(self, X, params):
        """``log N(x_i | μ_k, Λ_k⁻¹)``, shape ``(n, K)`` (docs/mathematics.md §2, "Instantiated
        parameters"). The quadratic form is expanded, ``xᵀΛx − 2 xᵀΛμ + μᵀΛμ``, so the whole
        matrix is one product of the ``(n, D² + D + 1)`` features ``[x xᵀ, x, 1]`` with the
        components' ``[−Λ/2, Λμ, const]``; ``log|Λ_k|`` by Cholesky."""
        X = jnp.asarray(X)
        mu, P = params.mean, params.precision
        n, d = X.shape
        k = P.shape[0]
        chol = _math.cholesky(P)
        logdet = 2.0 * jnp.sum(jnp.log(jnp.diagonal(chol, axis1=-2, axis2=-1)), -1)
        Pmu = jnp.sum(P * mu[:, None, :], -1)  # (K, D)
        const = 0.5 * logdet - 0.5 * jnp.sum(Pmu * mu, -1) - 0.5 * d * LOG_2PI
        xx = (X[:, :, None] * X[:, None, :]).reshape(n, d * d)
        # one matrix product: [x xᵀ, x, 1] against [−Λ/2, Λμ, const] (one pass over the output)
        feats = jnp.concatenate([xx, X, jnp.ones((n, 1), X.dtype)], -1)
        table = jnp.concatenate([-0.5 * P.reshape(k, d * d), Pmu, const[:, None]], -1)
        return feats @ table.T.astype(feats.dtype)

    def validate_data(self, X):
        d = self.psi.shape[-1]
        if X.shape[1] != d:
            raise ValueError(
                f"NormalWishart: psi is {d} x {d} but the data have {X.shape[1]} columns."
            )
        # The statistics are raw sums (Σx xᵀ); a cluster of at most D points has a rank-deficient
        # scatter, and psi must be resolved beside it. When the rounding error of x xᵀ in the
        # working precision exceeds psi's smallest eigenvalue, Ψ_n stops being positive definite
        # and the log marginal is NaN (float32 with data offset by 1e4, float64 by 1e9).
        psi_c, m0_c = concrete_value(self.psi), concrete_value(self.m0)
        if psi_c is None or m0_c is None or X.size == 0:
            return
        dtype = X.dtype if X.dtype in (np.float16, np.float32) else jnp.result_type(float)
        eps = float(np.finfo(dtype).eps)
        big = max(float(np.max(np.sum(np.square(X), axis=1))), float(np.sum(np.square(m0_c))))
        lam = float(np.linalg.eigvalsh(np.asarray(psi_c, np.float64)).min())
        if (d + 1) * eps * big > lam:
            raise ValueError(
                f"NormalWishart: the data reach |x| = {math.sqrt(big):.3g}, too large beside psi "
                f"(smallest eigenvalue {lam:.3g}) for {np.dtype(dtype).name}: the sums of x x^T "
                "cannot resolve psi and the posterior scale loses positive definiteness. Centre "
                "and scale the columns, e.g. (X - X.mean(0)) / X.std(0)"
                + (", or enable float64 (jax.config.update('jax_enable_x64', True))." if eps > 1e-10 else ".")
            )
