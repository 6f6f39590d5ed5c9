"""The two array namespaces the model formulas are written over.

A formula written once as ``f(p, x, m)`` (parameters ``p``, inputs ``x``, math
namespace ``m``) runs traced in JAX with ``JAX_MATH`` and on the host in NumPy
float64 with ``NUMPY_MATH``. The host form serves tree code that runs inside an
``io_callback`` (IBHC, tgMCMC), where calling JAX again can deadlock.
"""

from __future__ import annotations

import math
import types

import jax
import jax.numpy as jnp
import numpy as np
import scipy.special as _scipy_special
from jax.scipy.special import gammaln, multigammaln

__all__ = ["JAX_MATH", "NUMPY_MATH", "LOG_2PI"]

_LOG_PI = float(np.log(np.pi))
#: log(2π), the Gaussian densities' constant
LOG_2PI = math.log(2.0 * math.pi)


def _numpy_multigammaln(a, d: int):
    """``log Γ_d(a)`` for an array ``a`` (SciPy's version validates per call: slow for tiny batches)."""
    a = np.asarray(a, dtype=np.float64)
    terms = _scipy_special.gammaln(a[..., None] - 0.5 * np.arange(d))
    return 0.25 * d * (d - 1) * _LOG_PI + np.sum(terms, axis=-1)


#: up to this dimension the Cholesky factor, ``logdet_pd`` and the triangular solves are written
#: out in plain array ops; above it they are loops over the columns. Each written-out copy is
#: some ``d^2 / 2`` kernels that XLA:CPU compiles one by one, and a program holds a copy per
#: call site: at ``d = 4..8`` the first ``MAPDP()`` fit of 10^5 points (2-core CPU, XLA's
#: defaults) took 12.3-14.0 s with the loops against 14.4-27.6 s written out, the collapsed
#: Gibbs and sub-cluster fits 0.59-0.99 of their time, and later fits of the same shape
#: 0.63-1.08 of theirs (0.96-1.07 between two runs of one setting; benchmarks/cholesky_dims.py)
UNROLLED_CHOLESKY_MAX_DIM = 3


def _unrolled_cholesky(a):
    """The Cholesky-Banachiewicz recursion written out in elementwise array ops (``d`` static):
    ``(lower, pivots)``, the rows of the lower factor as lists of ``(...)`` arrays (zeros
    above the diagonal) and the squared diagonal before its square root."""
    d = a.shape[-1]
    zero = jnp.zeros(a.shape[:-2], a.dtype)
    lower = [[zero] * d for _ in range(d)]
    pivots = []
    for j in range(d):
        pivot = a[..., j, j]
        for k in range(j):
            pivot = pivot - lower[j][k] * lower[j][k]
        pivots.append(pivot)
        root = jnp.sqrt(pivot)
        for i in range(j + 1, d):
            t = a[..., i, j]
            for k in range(j):
                t = t - lower[i][k] * lower[j][k]
            lower[i][j] = t / root
        lower[j][j] = root
    return lower, pivots


def cholesky_pivots(a):
    """Squared diagonal of the Cholesky factor of ``a`` (batched, small ``d``), unrolled.

    The Cholesky-Banachiewicz recursion written out in elementwise array ops
    (:func:`_unrolled_cholesky`): for the small matrices of a conjugate family, one LAPACK
    ``potrf`` call costs tens of µs on CPU inside a compiled loop (measured in tgMCMC's tree
    builder), the unrolled form about a µs, and it fuses. ``log det a`` is the
    sum of the logs of the pivots; a matrix that is not positive definite
    gives a non-positive pivot, hence NaN (as the LAPACK call does).
    """
    return jnp.stack(_unrolled_cholesky(a)[1], axis=-1)


def _loop_cholesky(a):
    """Lower Cholesky factors by the right-looking recursion in a ``fori_loop`` over the ``d``
    columns (batched ``(..., d, d)``; each step a rank-one update of the trailing block):
    ``(L, smallest pivot)``. No library call, for the same reason as :func:`cholesky`."""
    d = a.shape[-1]
    rows = jnp.arange(d)

    def body(j, carry):
        A, L, low = carry
        pivot = A[..., j, j]
        col = jnp.where(rows >= j, A[..., :, j], 0.0) / jnp.sqrt(pivot)[..., None]
        A = A - col[..., :, None] * col[..., None, :]
        L = jnp.where(rows == j, col[..., :, None], L)
        return A, L, jnp.minimum(low, pivot)

    init = (a, jnp.zeros_like(a), jnp.full(a.shape[:-2], jnp.inf, a.dtype))
    _, L, low = jax.lax.fori_loop(0, d, body, init)
    return L, low


def _loop_solve_triangular(t, b, lower: bool):
    """``t⁻¹ b`` by substitution in a ``fori_loop`` over the ``d`` rows (``b`` ``(..., d, k)``)."""
    d = t.shape[-1]

    def body(step, x):
        i = step if lower else d - 1 - step
        r = b[..., i, :] - jnp.einsum("...j,...jk->...k", t[..., i, :], x)  # rows not yet set are 0
        return x.at[..., i, :].set(r / t[..., i, i, None])

    return jax.lax.fori_loop(0, d, body, jnp.zeros(jnp.broadcast_shapes(t.shape[:-2], b.shape[:-2])
                                                   + b.shape[-2:], jnp.result_type(t, b)))


def cholesky(a):
    """Lower Cholesky factors of symmetric positive-definite matrices (batched ``(..., d, d)``).

    ``d ≤ UNROLLED_CHOLESKY_MAX_DIM``: :func:`_unrolled_cholesky` (no library call: about a
    µs inside a compiled loop, where LAPACK's ``potrf`` costs tens, and nothing that waits
    on XLA's thread pool, see ``jaxbnp.inference.runner``); larger: :func:`_loop_cholesky`,
    a loop over the columns, not ``jnp.linalg.cholesky``: jaxlib's LAPACK kernel splits a
    batch over XLA's intra-op pool and waits for the pieces, and XLA runs independent
    operations of one program side by side on that pool, so two such calls in one program
    held both threads of a 2-core CPU and waited for ever (sub-cluster MCMC on 30 columns).
    Not positive definite: NaN entries, as LAPACK's gives.
    """
    if a.shape[-1] > UNROLLED_CHOLESKY_MAX_DIM:
        L, low = _loop_cholesky(a)
        return jnp.where(~(low > 0)[..., None, None], jnp.nan, L)  # a pivot <= 0 or NaN
    lower, pivots = _unrolled_cholesky(a)
    bad = jnp.any(jnp.stack(pivots, axis=-1) <= 0, axis=-1)[..., None, None]
    L = jnp.stack([jnp.stack(row, axis=-1) for row in lower], axis=-2)
    return jnp.where(bad, jnp.nan, L)


def solve_triangular(t, b, lower: bool):
    """``t⁻¹ b`` for triangular ``t`` ``(..., d, d)`` and ``b`` ``(..., d, k)``: substitution
    written out for ``d ≤ UNROLLED_CHOLESKY_MAX_DIM``, a loop over the rows above (no library
    call, as :func:`cholesky`). A vector ``b`` ``(..., d)`` is one column."""
    if b.ndim == t.ndim - 1:
        return solve_triangular(t, b[..., None], lower)[..., 0]
    d = t.shape[-1]
    if d > UNROLLED_CHOLESKY_MAX_DIM:
        return _loop_solve_triangular(t, b, lower)
    rows = [None] * d
    for i in (range(d) if lower else range(d - 1, -1, -1)):
        r = b[..., i, :]
        for j in (range(i) if lower else range(i + 1, d)):
            r = r - t[..., i, j, None] * rows[j]
        rows[i] = r / t[..., i, i, None]
    return jnp.stack(rows, axis=-2)


def cho_solve(chol, b):
    """``a⁻¹ b`` from the lower Cholesky factor ``chol`` of ``a`` (:func:`solve_triangular` twice)."""
    y = solve_triangular(chol, b, lower=True)
    return solve_triangular(jnp.swapaxes(chol, -1, -2), y, lower=False)


def _jax_logdet_pd(a):
    """``log det`` of symmetric positive-definite matrices (batched) by Cholesky (NaN if not PD).

    ``d ≤ UNROLLED_CHOLESKY_MAX_DIM``: the unrolled recursion of :func:`cholesky_pivots`; larger:
    :func:`cholesky`'s loop.
    """
    if a.shape[-1] <= UNROLLED_CHOLESKY_MAX_DIM:
        pivots = cholesky_pivots(a)
        return jnp.sum(jnp.log(jnp.where(pivots > 0, pivots, jnp.nan)), -1)
    chol = cholesky(a)
    return 2.0 * jnp.sum(jnp.log(jnp.diagonal(chol, axis1=-2, axis2=-1)), -1)


def _numpy_logdet_pd(a):
    """``log det`` of symmetric positive-definite matrices (batched; NaN if not positive definite).

    ``D ≤ 2`` by the explicit determinant (``np.linalg`` costs ~8 µs a call on tiny batches).
    """
    a = np.asarray(a)
    d = a.shape[-1]
    if d == 1:
        det = a[..., 0, 0]
    elif d == 2:
        det = a[..., 0, 0] * a[..., 1, 1] - a[..., 0, 1] * a[..., 1, 0]
    else:
        sign, logdet = np.linalg.slogdet(a)
        return np.where(sign > 0, logdet, np.nan)
    positive = det > 0
    return np.where(positive, np.log(np.where(positive, det, 1.0)), np.nan)


def _jax_constant(p, name, fn):
    """A term of the parameters alone: computed inline under JAX (parameters may be traced)."""
    return fn()


def _numpy_constant(p, name, fn):
    """A term of the parameters alone: computed once per host parameter set and kept on it."""
    value = getattr(p, name, None)
    if value is None:
        value = fn()
        setattr(p, name, value)
    return value


JAX_MATH = types.SimpleNamespace(
    xp=jnp, gammaln=gammaln, multigammaln=multigammaln, sum=jnp.sum, logdet_pd=_jax_logdet_pd,
    constant=_jax_constant,
)
#: NumPy's ``np.sum`` wrapper costs ~5 µs per call on tiny arrays; ``add.reduce`` ~1 µs
NUMPY_MATH = types.SimpleNamespace(
    xp=np, gammaln=_scipy_special.gammaln, multigammaln=_numpy_multigammaln,
    sum=np.add.reduce, logdet_pd=_numpy_logdet_pd, constant=_numpy_constant,
)
