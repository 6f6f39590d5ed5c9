"""Random measures that induce partition priors (docs/mathematics.md §1).

Each measure gives the log EPPF of a partition described by its vector of
cluster sizes (``counts``; zeros mark empty slots and are ignored), the
collapsed-Gibbs weights, and an exact prior sampler (the CRP / NRM urn).

* ``DP(alpha)``: Dirichlet process.
* ``PitmanYor(alpha, d)``: Pitman-Yor process.
* ``NGGP(alpha, sigma, tau=1.0)``: normalised generalised gamma process, with
  the auxiliary variable ``u`` of docs/mathematics.md §1 (``log p(Π, u)`` is a density in
  ``u``; with ``u=None`` the EPPF integrates ``u`` out numerically).

All parameters are pytree leaves, so a measure can carry traced values (for
example ``alpha`` sampled by NUTS) through ``jit`` and ``vmap``.

Example
-------
>>> import jax.numpy as jnp
>>> from jaxbnp.models.measures import DP
>>> float(DP(1.0).log_eppf(jnp.array([2, 1])))  # doctest: +ELLIPSIS
-1.79...
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.scipy.special import gammaln

from .._math import JAX_MATH, NUMPY_MATH
from .._pytree import ParameterPytree, real_parameter

__all__ = ["Measure", "DP", "PitmanYor", "NGGP"]


def _float_counts(counts) -> jax.Array:
    """Cluster sizes as the default float dtype.

    Counts are stored as int32, and JAX promotes int32 to float32 even when
    x64 is enabled, which would cost ``gammaln``/``log`` their float64 precision.
    """
    return jnp.asarray(counts).astype(jnp.result_type(float))


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


def _check_scalar(name: str, value: Any, owner: str) -> float | None:
    c = real_parameter(owner, name, value, ndims=(0,))
    if c is None:
        return None
    _check(bool(math.isfinite(float(c))), f"{owner}: {name} must be finite, got {float(c)}.")
    return float(c)


class Measure(ParameterPytree):
    """Protocol shared by the partition priors.

    Subclasses implement ``log_eppf``, ``gibbs_log_weights`` and
    ``sample_partition``. ``has_auxiliary`` says whether the measure carries
    the auxiliary variable ``u`` (NGGP).
    """

    has_auxiliary: bool = False

    def num_clusters(self, counts: jax.Array) -> jax.Array:
        return jnp.sum(counts > 0)

    def log_eppf(self, counts: jax.Array, u: jax.Array | None = None) -> jax.Array:
        raise NotImplementedError

    def gibbs_log_weights(
        self, counts: jax.Array, u: jax.Array | None = None
    ) -> tuple[jax.Array, jax.Array]:
        """Unnormalised log weights of joining each slot and of opening a new cluster.

        ``counts`` are the slot sizes with the point being moved removed. Empty
        slots get ``-inf``. docs/mathematics.md §1, "Collapsed Gibbs weights".
        """
        raise NotImplementedError

    def sample_partition(self, key: jax.Array, num_points: int) -> jax.Array:
        """Labels ``(num_points,)`` in order of first appearance, drawn by the urn."""
        num_points = int(num_points)

        def step(carry, inputs):
            counts, k = carry
            m, uniform = inputs
            log_existing, log_new = self._urn_log_weights(counts, k, m)
            log_w = jnp.where(jnp.arange(num_points) == k, log_new, log_existing)
            log_w = jnp.where(jnp.arange(num_points) <= k, log_w, -jnp.inf)
            cdf = jnp.cumsum(jnp.exp(log_w - jnp.max(log_w)))
            label = jnp.minimum(jnp.searchsorted(cdf, uniform * cdf[-1]), k)
            counts = counts.at[label].add(1)
            return (counts, k + (label == k)), label

        counts0 = jnp.zeros(num_points, dtype=jnp.int32)
        uniforms = jax.random.uniform(key, (num_points,))
        _, labels = lax.scan(
            step, (counts0, jnp.int32(0)), (jnp.arange(num_points), uniforms)
        )
        return labels.astype(jnp.int32)

    def _urn_log_weights(self, counts, num_clusters, num_seated):
        """Prior predictive weights of the urn after ``num_seated`` points."""
        log_existing, log_new = self.gibbs_log_weights(counts)
        return log_existing, log_new


class DP(Measure):
    """Dirichlet process ``DP(alpha)``, ``alpha > 0`` (docs/mathematics.md §1).

    ``log p(Π) = K log α + lgamma(α) − lgamma(α+n) + Σ_c lgamma(|c|)``.
    In its NRM form (for tgMCMC) ``κ(m, u) = α Γ(m) (u+1)^(−m)`` and
    ``ψ(u) = α log(1+u)``.
    """

    _fields = ("alpha",)

    def __init__(self, alpha: Any = 1.0):
        a = _check_scalar("alpha", alpha, "DP")
        if a is not None:
            _check(a > 0, f"DP: alpha must be > 0, got {a}. Use a positive concentration, e.g. DP(1.0).")
        self._set(alpha=alpha)

    def log_eppf(self, counts, u=None):
        counts = _float_counts(counts)
        n = jnp.sum(counts)
        k = self.num_clusters(counts)
        alpha = self.alpha
        return (
            k * jnp.log(alpha)
            + gammaln(alpha)
            - gammaln(alpha + n)
            + jnp.sum(jnp.where(counts > 0, gammaln(jnp.maximum(counts, 1)), 0.0))
        )

    def log_kappa(self, m, u):
        return self._log_kappa(self, m, u, JAX_MATH)

    def host_log_kappa(self, m, u) -> np.ndarray:
        """``log κ(m, u)`` in NumPy float64 (the same formula; no JAX call)."""
        return self._log_kappa(self.host_params(), np.asarray(m, np.float64), float(u), NUMPY_MATH)

    @staticmethod
    def _log_kappa(p, m, u, mth):
        return mth.xp.log(p.alpha) + mth.gammaln(m) - m * mth.xp.log1p(u)

    def psi(self, u):
        return self.alpha * jnp.log1p(u)

    def gibbs_log_weights(self, counts, u=None):
        counts = _float_counts(counts)
        log_existing = jnp.where(counts > 0, jnp.log(jnp.maximum(counts, 1)), -jnp.inf)
        return log_existing, jnp.log(self.alpha)


class PitmanYor(Measure):
    """Pitman-Yor process ``PitmanYor(alpha, d)``, ``0 <= d < 1``, ``alpha > -d`` (docs/mathematics.md §1)."""

    _fields = ("alpha", "d")

    def __init__(self, alpha: Any = 1.0, d: Any = 0.5):
        a = _check_scalar("alpha", alpha, "PitmanYor")
        dd = _check_scalar("d", d, "PitmanYor")
        if dd is not None:
            _check(0.0 <= dd < 1.0, f"PitmanYor: discount d must satisfy 0 <= d < 1, got {dd}.")
        if a is not None and dd is not None:
            _check(a > -dd, f"PitmanYor: alpha must be > -d (= {-dd}), got alpha={a}.")
        self._set(alpha=alpha, d=d)

    def log_eppf(self, counts, u=None):
        counts = _float_counts(counts)
        n = jnp.sum(counts)
        k = self.num_clusters(counts)
        alpha, d = self.alpha, self.d
        idx = jnp.arange(1, counts.shape[-1] + 1)
        first = jnp.sum(jnp.where(idx <= k - 1, jnp.log(alpha + idx * d), 0.0))
        sizes = jnp.where(
            counts > 0, gammaln(jnp.maximum(counts, 1) - d) - gammaln(1.0 - d), 0.0
        )
        return first - (gammaln(alpha + n) - gammaln(alpha + 1.0)) + jnp.sum(sizes)

    def gibbs_log_weights(self, counts, u=None):
        counts = _float_counts(counts)
        k = self.num_clusters(counts)
        log_existing = jnp.where(
            counts > 0, jnp.log(jnp.maximum(counts - self.d, 1e-30)), -jnp.inf
        )
        return log_existing, jnp.log(self.alpha + k * self.d)


class NGGP(Measure):
    """Normalised generalised gamma process ``NGGP(alpha, sigma, tau=1.0)`` (docs/mathematics.md §1).

    ``alpha > 0``, ``0 < sigma < 1``, ``tau > 0``. Lévy intensity
    ``α σ / Γ(1−σ) w^(−1−σ) e^(−τ w)``; ``ψ(u) = α((u+τ)^σ − τ^σ)``;
    ``log κ(m, u) = log(ασ) + lgamma(m−σ) − lgamma(1−σ) + (σ−m) log(u+τ)``;
    ``log p(Π, u) = (n−1) log u − lgamma(n) − ψ(u) + Σ_c log κ(|c|, u)``.

    ``log_eppf(counts, u)`` returns the joint density ``log p(Π, u)``; with
    ``u=None`` it returns the EPPF ``log p(Π)`` with ``u`` integrated out by a
    Laplace-centred trapezoid rule on ``log u`` (the integrand is log-concave
    in ``log u``).
    """

    _fields = ("alpha", "sigma", "tau")
    has_auxiliary = True

    def __init__(self, alpha: Any = 1.0, sigma: Any = 0.5, tau: Any = 1.0):
        a = _check_scalar("alpha", alpha, "NGGP")
        s = _check_scalar("sigma", sigma, "NGGP")
        t = _check_scalar("tau", tau, "NGGP")
        if a is not None:
            _check(a > 0, f"NGGP: alpha must be > 0, got {a}.")
        if s is not None:
            _check(0.0 < s < 1.0, f"NGGP: sigma must lie in (0, 1), got {s}. (sigma -> 0 is the DP: use DP(alpha).)")
        if t is not None:
            _check(t > 0, f"NGGP: tau must be > 0, got {t}.")
        self._set(alpha=alpha, sigma=sigma, tau=tau)

    def psi(self, u):
        return self.alpha * ((u + self.tau) ** self.sigma - self.tau**self.sigma)

    def log_kappa(self, m, u):
        return self._log_kappa(self, m, u, JAX_MATH)

    def host_log_kappa(self, m, u) -> np.ndarray:
        """``log κ(m, u)`` in NumPy float64 (the same formula; no JAX call)."""
        return self._log_kappa(self.host_params(), np.asarray(m, np.float64), float(u), NUMPY_MATH)

    @staticmethod
    def _log_kappa(p, m, u, mth):
        s = p.sigma
        return (
            mth.xp.log(p.alpha * s)
            + mth.gammaln(m - s)
            - mth.gammaln(1.0 - s)
            + (s - m) * mth.xp.log(u + p.tau)
        )

    def _log_size_terms(self, counts):
        s = self.sigma
        return jnp.sum(
            jnp.where(counts > 0, gammaln(jnp.maximum(counts, 1) - s) - gammaln(1.0 - s), 0.0)
        )

    def log_eppf(self, counts, u=None):
        counts = _float_counts(counts)
        n = jnp.sum(counts)
        k = self.num_clusters(counts)
        if u is None:
            return self._log_size_terms(counts) + self.log_v(n, k)
        u = jnp.asarray(u)
        log_kappa = jnp.where(counts > 0, self.log_kappa(jnp.maximum(counts, 1), u), 0.0)
        return (n - 1) * jnp.log(u) - gammaln(n) - self.psi(u) + jnp.sum(log_kappa)

    def _log_u_plus_tau(self, log_u):
        """``log(u + τ)`` from ``t = log u`` without forming ``u`` (no overflow for large t)."""
        return jnp.logaddexp(log_u, jnp.log(self.tau))

    def _psi_from_log(self, log_ut):
        """``ψ(u)`` from ``log(u + τ)``."""
        return self.alpha * (jnp.exp(self.sigma * log_ut) - self.tau**self.sigma)

    def log_u_conditional(self, log_u, counts):
        """``log p(log u | Π)`` up to a constant (docs/mathematics.md §1), as a function of ``t = log u``."""
        counts = _float_counts(counts)
        n = jnp.sum(counts)
        k = self.num_clusters(counts)
        log_ut = self._log_u_plus_tau(log_u)
        return n * log_u - self._psi_from_log(log_ut) - (n - k * self.sigma) * log_ut

    def u_mode(self, counts):
        """The mode of ``p(u | Π)`` over ``t = log u`` (log-concave; Newton from the best
        point of a coarse scan), returned as ``u``. The samplers start ``u`` here when
        ``init_params`` gives none: from an arbitrary ``u`` the first slice updates can
        jump far into the tail (the slice at an improbable ``u`` is wide), and a partition
        step at such a ``u`` opens many clusters."""
        counts = _float_counts(counts)
        t_star, _, _ = self._log_u_mode(lambda t: self.log_u_conditional(t, counts), counts.dtype)
        return jnp.exp(t_star)

    def _log_u_mode(self, g, dtype=None):
        """The maximiser ``t*`` of a log-concave ``g(t)`` over ``t = log u``: Newton from the
        best point of a coarse scan. Returns ``(t*, coarse nodes, g at them)``."""
        dg, d2g = jax.grad(g), jax.grad(jax.grad(g))
        coarse = jnp.linspace(-40.0, 40.0 / self.sigma + 40.0, 1025, dtype=dtype)
        gc = jax.vmap(g)(coarse)
        t0 = coarse[jnp.argmax(gc)]
        t_star = lax.fori_loop(
            0, 60, lambda _, t: t - jnp.clip(dg(t) / jnp.minimum(d2g(t), -1e-8), -2.0, 2.0), t0
        )
        return t_star, coarse, gc

    # -- u integrated out ---------------------------------------------------------------
    def _log_v_integrand(self, t, n, k):
        # log of the integrand of V(n, K) in t = log u, without K log(ασ) − lgamma(n)
        log_ut = self._log_u_plus_tau(t)
        return n * t - self._psi_from_log(log_ut) + (k * self.sigma - n) * log_ut

    def _log_u_grid(self, g, num_nodes: int = 2001):
        """Nodes ``t`` and values ``g(t)`` covering the mass of a log-concave ``exp(g)``.

        The range is the union of a Laplace window (mode ± 45 widths, found by
        Newton from the best point of a coarse scan) and the coarse-scan region
        where ``g`` is within 60 of its maximum (heavy tails for small σ).
        """
        t_star, coarse, gc = self._log_u_mode(g)
        width = 1.0 / jnp.sqrt(jnp.maximum(-jax.grad(jax.grad(g))(t_star), 1e-10))
        step = coarse[1] - coarse[0]
        inside = gc > jnp.max(gc) - 60.0
        lo = jnp.min(jnp.where(inside, coarse, jnp.inf)) - step
        hi = jnp.max(jnp.where(inside, coarse, -jnp.inf)) + step
        lo = jnp.minimum(lo, t_star - 45.0 * width)
        hi = jnp.maximum(hi, t_star + 45.0 * width)
        ts = jnp.linspace(lo, hi, num_nodes)
        return ts, jax.vmap(g)(ts)

    def log_v(self, n, k):
        """``log V(n, K) = log ∫ p(Π, u) du / Π_c (1−σ)_{|c|−1}`` by quadrature on ``log u``."""
        n = jnp.asarray(n, dtype=jnp.result_type(float))
        k = jnp.asarray(k, dtype=jnp.result_type(float))
        ts, vals = self._log_u_grid(lambda t: self._log_v_integrand(t, n, k))
        # trapezoid rule; the end points are e^-40 or more below the peak
        log_int = jax.nn.logsumexp(vals) + jnp.log(ts[1] - ts[0])
        return log_int + k * jnp.log(self.alpha * self.sigma) - gammaln(n)

    def gibbs_log_weights(self, counts, u=None):
        if u is None:
            raise ValueError("NGGP Gibbs weights need the auxiliary variable u.")
        counts = _float_counts(counts)
        log_ut = jnp.log(u + self.tau)
        log_existing = jnp.where(
            counts > 0, jnp.log(jnp.maximum(counts - self.sigma, 1e-30)) - log_ut, -jnp.inf
        )
        log_new = jnp.log(self.alpha * self.sigma) + (self.sigma - 1.0) * log_ut
        return log_existing, log_new

    def _urn_log_weights(self, counts, num_clusters, num_seated):
        # NRM urn with u integrated out: join c ∝ (n_c − σ) V(m+1, K),
        # new ∝ V(m+1, K+1) (docs/mathematics.md §1, Gibbs-type predictive rule).
        m = num_seated
        k = num_clusters
        log_v_mk = self.log_v(m + 1, k)
        log_v_new = self.log_v(m + 1, k + 1)
        log_existing = jnp.where(
            counts > 0, jnp.log(jnp.maximum(counts - self.sigma, 1e-30)) + log_v_mk, -jnp.inf
        )
        return log_existing, log_v_new
