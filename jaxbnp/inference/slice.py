"""Univariate slice sampling (Neal 2003: stepping out, then shrinkage), jit- and vmap-safe."""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
from jax import lax

__all__ = ["slice_sample"]


def slice_sample(
    key: jax.Array,
    log_density: Callable[[jax.Array], jax.Array],
    x0: jax.Array,
    width: float = 1.0,
    max_steps_out: int = 32,
    max_shrinks: int = 100,
) -> jax.Array:
    """One slice-sampling update of the scalar ``x0`` targeting ``exp(log_density)``.

    Stepping out is bounded by ``max_steps_out`` steps each side (exact: the
    bound is applied as in Neal's Fig. 3 with a random split). Shrinkage stops
    after ``max_shrinks`` tries, returning ``x0`` (the chain stays put; this
    has never triggered in the tests and would need a degenerate density).
    """
    k_level, k_pos, k_split, k_shrink = jax.random.split(key, 4)
    log_y = log_density(x0) + jnp.log(jax.random.uniform(k_level, minval=1e-38))
    left = x0 - width * jax.random.uniform(k_pos)
    right = left + width
    j = jnp.floor(max_steps_out * jax.random.uniform(k_split)).astype(jnp.int32)
    k = max_steps_out - 1 - j

    def out_left(carry):
        left, j = carry
        return left - width, j - 1

    def cond_left(carry):
        left, j = carry
        return (j > 0) & (log_density(left) > log_y)

    def cond_right(carry):
        right, k = carry
        return (k > 0) & (log_density(right) > log_y)

    def out_right(carry):
        right, k = carry
        return right + width, k - 1

    left, _ = lax.while_loop(cond_left, out_left, (left, j))
    right, _ = lax.while_loop(cond_right, out_right, (right, k))

    def shrink_cond(carry):
        _, _, _, done, i, _ = carry
        return (~done) & (i < max_shrinks)

    def shrink_body(carry):
        left, right, x, done, i, key = carry
        key, sub = jax.random.split(key)
        x_new = left + (right - left) * jax.random.uniform(sub)
        accept = log_density(x_new) > log_y
        left = jnp.where(accept | (x_new >= x0), left, x_new)
        right = jnp.where(accept | (x_new < x0), right, x_new)
        return left, right, jnp.where(accept, x_new, x), accept, i + 1, key

    init = (left, right, x0, jnp.array(False), jnp.int32(0), k_shrink)
    _, _, x, _, _, _ = lax.while_loop(shrink_cond, shrink_body, init)
    return x
