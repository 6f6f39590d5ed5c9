"""Orderings without a sort: ranks, inverse permutations, a stable ``argsort`` and
``jax.random.permutation``, each giving exactly what JAX's sort-based function gives.

XLA:CPU runs a sort as a call of its own (a runtime thunk), not inside the fused kernels
around it. A sampler's iteration that sorts a few dozen entries (cluster slots in order of
first appearance, a random order of a tree's nodes) pays that call's dispatch at every
step, and the ``while`` loop around it is likely no longer compiled whole
(``jaxbnp.set_cpu_loop_kernels``, which the test suite turns on; inferred from the timings
below, not read from the compiled program). Up to
:data:`RANK_BY_COMPARISON_MAX` entries the functions here compare every pair instead
(``O(m^2)`` comparisons, one fused kernel); above, they sort. The values are the same
either way, so the draws are too.

Measured (8 vectorised chains, compile excluded, the test suite's flags): ``SliceGibbs`` on
6 points and 32 slots, 5.5 -> 4.0 ms per iteration; ``CollapsedGibbs`` on 7 points, 0.33 ->
0.19 ms; ``SplitMerge``, 0.71 -> 0.51 ms.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["RANK_BY_COMPARISON_MAX", "stable_rank", "inverse_permutation", "argsort", "permutation"]

#: the most entries ranked by comparing every pair (a ``(m, m)`` boolean array); above, a sort
RANK_BY_COMPARISON_MAX = 512


def stable_rank(x: jax.Array) -> jax.Array:
    """Each entry's position in a stable ascending sort of the last axis of ``x``
    (``argsort(argsort(x, stable=True))``), ``int32``."""
    m = x.shape[-1]
    if x.dtype == jnp.bool_:
        x = x.astype(jnp.int8)
    if m > RANK_BY_COMPARISON_MAX:
        order = jnp.argsort(x, axis=-1, stable=True)
        return jnp.argsort(order, axis=-1, stable=True).astype(jnp.int32)
    i = jnp.arange(m)
    a, b = x[..., None, :], x[..., :, None]  # [..., j, i]: x_i against x_j
    before = (a < b) | ((a == b) & (i[None, :] < i[:, None]))
    return jnp.sum(before, axis=-1, dtype=jnp.int32)


def inverse_permutation(p: jax.Array) -> jax.Array:
    """``q`` with ``q[p[j]] = j`` for a permutation ``p`` of ``0..m-1``, one-dimensional
    (``argsort(p)``), by one scatter."""
    return jnp.zeros_like(p).at[p].set(jnp.arange(p.shape[-1], dtype=p.dtype))


def argsort(x: jax.Array) -> jax.Array:
    """``jnp.argsort(x, stable=True)`` of a one-dimensional ``x``, ``int32``."""
    if x.shape[-1] > RANK_BY_COMPARISON_MAX:  # one sort, not the ranks' two
        return jnp.argsort(x, stable=True).astype(jnp.int32)
    return inverse_permutation(stable_rank(x))


def permutation(key: jax.Array, n: int) -> jax.Array:
    """``jax.random.permutation(key, n)``, the same values: JAX's rounds of random 32-bit
    sort keys, each round's stable sort replaced by :func:`argsort`."""
    if n > RANK_BY_COMPARISON_MAX:
        return jax.random.permutation(key, n)
    x = jnp.arange(n)
    # JAX's number of rounds (jax._src.random, _shuffle): enough that all keys differ
    rounds = int(math.ceil(3 * math.log(max(1, n)) / math.log(np.iinfo(np.uint32).max)))
    for _ in range(rounds):
        key, subkey = jax.random.split(key)
        x = x[argsort(jax.random.bits(subkey, (n,), jnp.uint32))]
    return x
