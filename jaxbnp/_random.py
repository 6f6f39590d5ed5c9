"""Gamma, Dirichlet, Beta and normal variates from one uniform draw per call
(docs/mathematics.md §2, "How the variates are drawn").

On a CPU, every ``jax.random`` call is a threefry hash that XLA runs as a rolled
loop of small operations, and ``jax.random.gamma`` adds a rejection ``while``
loop on top; each small operation costs about a microsecond however small its
arrays. Samplers that draw a few per-cluster parameters many times per
iteration (the sub-cluster sampler, BHMC) spent most of their time there.

The helpers here make one ``jax.random.uniform`` call per draw and transform it:

* :func:`normal_from_uniform`: ``√2 · erfinv(2u − 1)`` (what ``jax.random.normal``
  does with its own uniforms).
* :func:`loggamma`: Marsaglia-Tsang with ``ROUNDS`` candidates per entry drawn at
  once, the first accepted one kept; an entry with none accepted (probability
  below ``0.05 ** rounds``) is redrawn by Cheng's algorithm from fresh uniforms in a
  ``while`` loop that runs no trip otherwise, so the law is exact. ``a < 1`` is boosted:
  ``log G = log G' + log(U) / a`` with ``G' ~ Gamma(a + 1)``.
* :func:`log_uniform`: ``log U`` from the leading zero bits of 64 random bits and a
  mantissa, exact far below ``log 2^-23`` (where a float32 uniform's ``log`` stops).
* :func:`split_uniform` / :func:`cut`: one uniform draw cut into several arrays, so a
  caller can draw the uniforms of many variates at once and pass them to the
  ``*_from_uniform`` functions.
* :func:`uniform_rows`: any rows of an ``(n, width)`` array of uniforms, each entry a
  threefry hash of the key and its (row, column) counter, so a shard or a chunk of
  the rows is drawn alone and equals the same rows of the whole array.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax import lax

#: candidates per Gamma entry drawn at once
ROUNDS = 2


def typed_key(key):
    """``key`` as a typed key array (``jax.random.key``): a typed key is returned as it is,
    legacy key data (``jax.random.PRNGKey(seed)``: ``uint32`` with a trailing axis of the
    default implementation's size, any leading batch axes) is wrapped with
    ``jax.random.wrap_key_data``. The two hold the same bits, so they give the same draws;
    works on traced keys too. Anything else raises ``TypeError``."""
    dtype = getattr(key, "dtype", None)
    if dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
        return key
    arr = key if isinstance(key, jax.Array) else jnp.asarray(key)
    if arr.dtype != jnp.uint32 or arr.ndim < 1:
        raise TypeError(
            "expected a random key: jax.random.key(seed) or jax.random.PRNGKey(seed), got "
            f"{type(key).__name__} of dtype {arr.dtype} and shape {arr.shape}."
        )
    return jax.random.wrap_key_data(arr)


def uniform(key, shape, dtype):
    """Uniforms in ``(0, 1)`` (never 0, so ``log u`` is finite)."""
    return jax.random.uniform(key, shape, dtype, minval=jnp.finfo(dtype).tiny, maxval=1.0)


def log_uniform(key, shape, dtype):
    """``log U`` for ``U ~ U(0, 1)``, exact far into the tail in any float dtype:
    ``U = 2^-(G+1) (1 + M)`` with ``G`` the leading zero bits of 64 random bits (geometric,
    ``P(G = g) = 2^-(g+1)``) and ``M`` a uniform mantissa. A float32 uniform is a multiple of
    ``2^-23``, so ``log`` of one is never below ``-16`` but for the draws that round to 0;
    here ``log U`` reaches ``-44`` (``G = 63``) with its right probability."""
    k_bits, k_m = jax.random.split(key)
    bits = jax.random.bits(k_bits, (2, *shape), jnp.uint32)
    g = lax.clz(bits[0]) + jnp.where(bits[0] == 0, lax.clz(bits[1]), 0)
    g = jnp.minimum(g, 63).astype(dtype)
    m = jax.random.uniform(k_m, shape, dtype)
    return -(g + 1.0) * math.log(2.0) + jnp.log1p(m)


def _rotl(x, d: int):
    return (x << jnp.uint32(d)) | (x >> jnp.uint32(32 - d))


def threefry2x32(k1, k2, x0, x1):
    """Threefry-2x32 with 20 rounds (Salmon et al. 2011) of the key ``(k1, k2)`` and the
    counters ``(x0, x1)`` (uint32 arrays that broadcast), bit for bit what JAX's
    ``jax.extend.random.threefry2x32_p`` computes, written out in elementwise operations. On
    a CPU JAX lowers the primitive to a loop over the rounds, each trip of which reads and
    writes whole arrays; written out, XLA fuses the 20 rounds into one pass over the
    counters (10^4 x 7 counters: 0.21 ms against 0.57 ms on a 2-core CPU)."""
    ks = (k1, k2, k1 ^ k2 ^ jnp.uint32(0x1BD11BDA))
    rotations = ((13, 15, 26, 6), (17, 29, 16, 24))
    x0, x1 = x0 + ks[0], x1 + ks[1]
    for i in range(5):
        for r in rotations[i % 2]:
            x0 = x0 + x1
            x1 = x0 ^ _rotl(x1, r)
        x0, x1 = x0 + ks[(i + 1) % 3], x1 + ks[(i + 2) % 3] + jnp.uint32(i + 1)
    return x0, x1


def _counter_uniforms(k1, k2, rows, cols, dtype):
    """Entry ``(r, c)`` of an array of uniforms in ``[0, 1)``: threefry-2x32 of the key words
    ``(k1, k2)`` and the counter ``(r, c)`` (``rows``, ``cols``: uint32 arrays of one shape),
    turned into a float as ``jax.random.uniform`` does; float32 or float64."""
    b1, b2 = threefry2x32(k1, k2, rows, cols)
    dtype = jnp.dtype(dtype)
    if dtype == jnp.float64:
        bits = (b1.astype(jnp.uint64) << 32) | b2.astype(jnp.uint64)
        one = lax.bitcast_convert_type((bits >> 12) | jnp.uint64(0x3FF0000000000000), jnp.float64)
    elif dtype == jnp.float32:
        one = lax.bitcast_convert_type(((b1 ^ b2) >> 9) | jnp.uint32(0x3F800000), jnp.float32)
    else:
        raise ValueError(f"uniform_rows draws float32 or float64, not {dtype}.")
    return one - jnp.asarray(1.0, dtype)


def uniform_rows(key, start, num_rows: int, width: int, dtype):
    """Rows ``start .. start + num_rows`` of an ``(n, width)`` array of uniforms in ``[0, 1)``
    (``n`` unbounded, below ``2**32``): entry ``(r, c)`` is threefry-2x32 of the key's
    two words (``jax.random.bits(key, (2,))``, whatever the key's implementation) and the
    counter ``(r, c)``, turned into a float as ``jax.random.uniform`` does. The cost is
    that of ``jax.random.uniform`` of the same size; ``start`` may be traced."""
    k1, k2 = jax.random.bits(key, (2,), jnp.uint32)
    rows = (jnp.asarray(start, jnp.uint32) + jnp.arange(num_rows, dtype=jnp.uint32))[:, None]
    cols = jnp.arange(width, dtype=jnp.uint32)[None, :]
    return _counter_uniforms(k1, k2, *jnp.broadcast_arrays(rows, cols), dtype)


def normal_from_uniform(u):
    """Standard normals from uniforms in ``(0, 1)``."""
    return jnp.sqrt(2.0).astype(u.dtype) * lax.erf_inv(2.0 * u - 1.0)


def sizes(shapes) -> list:
    """The number of entries of each shape."""
    return [math.prod(s) for s in shapes]


def cut(flat, shapes):
    """A flat vector cut into arrays of the given ``shapes`` (in order)."""
    out, start = [], 0
    for s, size in zip(shapes, sizes(shapes)):
        out.append(lax.slice_in_dim(flat, start, start + size).reshape(s))
        start += size
    return out


def split_uniform(key, shapes, dtype):
    """One uniform draw in ``(0, 1)``, cut into arrays of the given ``shapes``."""
    return cut(uniform(key, (sum(sizes(shapes)),), dtype), shapes)


def loggamma_uniforms(shape) -> tuple:
    """The shape of the uniforms :func:`loggamma_from_uniform` takes for Gamma variates of
    ``shape``."""
    return (2 * ROUNDS + 1,) + tuple(shape)


def _trip_uniforms(key, trip, shape, dtype):
    """Uniforms in ``(0, 1)`` of ``shape`` for redraw trip ``trip``: rows ``trip · shape[0]``
    onward of a :func:`uniform_rows`-style array whose counter hash takes the key's own first
    and last words (no ``jax.random.bits`` of the key first), so each trip is one threefry
    hash and the redraw loop stays small to compile."""
    data = jax.random.key_data(key) if jnp.issubdtype(key.dtype, jax.dtypes.prng_key) else key
    words = jnp.ravel(data).astype(jnp.uint32)
    num_rows, width = shape[0], math.prod(shape[1:])
    rows = (trip.astype(jnp.uint32) * jnp.uint32(num_rows)
            + jnp.arange(num_rows, dtype=jnp.uint32))[:, None]
    cols = jnp.arange(width, dtype=jnp.uint32)[None, :]
    work = dtype if jnp.dtype(dtype) in (jnp.float32, jnp.float64) else jnp.float32
    u = _counter_uniforms(words[0], words[-1], *jnp.broadcast_arrays(rows, cols), work)
    return jnp.maximum(u.astype(dtype), jnp.finfo(dtype).tiny).reshape(shape)


def loggamma_from_uniform(u, a, key):
    """``log G`` for ``G ~ Gamma(a, 1)`` elementwise from uniforms ``u`` of shape
    :func:`loggamma_uniforms`; ``key`` (independent of ``u``) only feeds the redraws of
    entries whose ``ROUNDS`` candidates were all rejected.

    The candidates are Marsaglia and Tsang's; a redrawn entry takes Cheng's (1977)
    algorithm GB instead (shape ``≥ 1`` after the boost, two uniforms and no normal per
    trial, acceptance above 0.88), which keeps the loop small to compile. Either is an
    exact Gamma draw, and the redraws are independent of the rejected candidates, so the
    law of every entry is Gamma (docs/mathematics.md §2)."""
    a = jnp.asarray(a, u.dtype)
    dtype = u.dtype
    boost = a < 1.0
    shape_ = jnp.where(boost, a + 1.0, a)
    d = shape_ - 1.0 / 3.0
    cc = 1.0 / jnp.sqrt(9.0 * d)

    def candidates(z, w):
        v = (1.0 + cc * z) ** 3
        logv = jnp.log(jnp.where(v > 0, v, 1.0))
        ok = (v > 0) & (jnp.log(w) < 0.5 * z * z + d - d * v + d * logv)
        first = jnp.argmax(ok, axis=0)
        return jnp.any(ok, axis=0), jnp.take_along_axis(logv, first[None], axis=0)[0]

    done, logv = candidates(normal_from_uniform(u[:ROUNDS]), u[ROUNDS:2 * ROUNDS])
    # a NaN or infinite shape (a NaN upstream) is no draw: it stays NaN (or inf) and is not
    # redrawn, where the loop below would never accept it and never end
    done = done | ~jnp.isfinite(a)
    out = jnp.log(d) + logv
    # Cheng's GB for the shape s >= 1: V = log(u1 / (1 - u1)) / sqrt(2s - 1), X = s e^V,
    # accepted when s - log 4 + (s + sqrt(2s - 1)) V - X >= log(u1^2 u2)
    lam = jnp.sqrt(2.0 * shape_ - 1.0)
    b = shape_ - jnp.log(jnp.asarray(4.0, dtype))
    c = shape_ + lam
    log_s = jnp.log(shape_)

    def cond(carry):
        return ~jnp.all(carry[0])

    def body(carry):
        done, out, i = carry
        r = _trip_uniforms(key, i, (2,) + a.shape, dtype)
        log_u1 = jnp.log(r[0])
        v = (log_u1 - jnp.log1p(-r[0])) / lam
        log_x = log_s + v
        ok = b + c * v - jnp.exp(log_x) >= 2.0 * log_u1 + jnp.log(r[1])
        return done | ok, jnp.where(done, out, log_x), i + 1

    done, out, _ = lax.while_loop(cond, body, (done, out, jnp.int32(0)))
    return jnp.where(boost, out + jnp.log(u[2 * ROUNDS]) / jnp.where(a > 0, a, 1.0), out)


def loggamma(key, a):
    """``log G`` for ``G ~ Gamma(a, 1)``, elementwise and exact, in ``a``'s (float) dtype."""
    a = jnp.asarray(a)
    if not jnp.issubdtype(a.dtype, jnp.floating):
        a = a.astype(jnp.result_type(float))
    k_u, k_redraw = jax.random.split(key)
    return loggamma_from_uniform(uniform(k_u, loggamma_uniforms(a.shape), a.dtype), a, k_redraw)


def log_dirichlet_from_uniform(u, alpha, key):
    """:func:`log_dirichlet` from uniforms ``u`` of shape ``loggamma_uniforms(alpha.shape)``
    (``key``: the redraws, as in :func:`loggamma_from_uniform`)."""
    alpha = jnp.asarray(alpha, u.dtype)
    g = loggamma_from_uniform(u, jnp.where(alpha > 0, alpha, 1.0), key)
    g = jnp.where(alpha > 0, g, -jnp.inf)
    return g - jax.nn.logsumexp(g, axis=-1, keepdims=True)


def log_dirichlet(key, alpha):
    """``log θ`` for ``θ ~ Dir(alpha)`` along the last axis (normalised log-Gamma draws:
    stable for tiny concentrations); an entry with ``alpha = 0`` gets ``θ = 0``."""
    alpha = jnp.asarray(alpha)
    if not jnp.issubdtype(alpha.dtype, jnp.floating):
        alpha = alpha.astype(jnp.result_type(float))
    k_u, k_redraw = jax.random.split(key)
    return log_dirichlet_from_uniform(uniform(k_u, loggamma_uniforms(alpha.shape), alpha.dtype), alpha,
                                      k_redraw)


def log_beta_pair_from_uniform(u, a, b, key):
    """:func:`log_beta_pair` from uniforms ``u`` of shape ``loggamma_uniforms((2,) + shape)``."""
    ab = jnp.stack(jnp.broadcast_arrays(jnp.asarray(a, u.dtype), jnp.asarray(b, u.dtype)))
    g = loggamma_from_uniform(u, jnp.where(ab > 0, ab, 1.0), key)
    g = jnp.where(ab > 0, g, -jnp.inf)
    tot = jnp.logaddexp(g[0], g[1])
    return g[0] - tot, g[1] - tot


def log_beta_pair(key, a, b):
    """``(log u, log(1 − u))`` for ``u ~ Beta(a, b)`` elementwise (log-Gamma draws: stable
    for tiny ``a``, ``b``); ``a = 0`` gives ``u = 0`` and ``b = 0`` gives ``u = 1``."""
    a, b = jnp.asarray(a), jnp.asarray(b)
    dtype = jnp.result_type(a, b, float)
    shape = (2,) + jnp.broadcast_shapes(a.shape, b.shape)
    k_u, k_redraw = jax.random.split(key)
    return log_beta_pair_from_uniform(uniform(k_u, loggamma_uniforms(shape), dtype), a, b,
                                      k_redraw)
