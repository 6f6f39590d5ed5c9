"""``jaxbnp._random``: Gamma, Dirichlet, Beta and normal variates from one uniform draw.

Each law is checked by a Kolmogorov-Smirnov test against SciPy's distribution, with a
power check (the same test rejects a slightly different law), including the Gamma
sampler's redraw loop, which the usual draws almost never enter.
"""

import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from jaxbnp import _random

N = 20_000
P_MIN = 1e-3


def _ks(x, cdf):
    return stats.kstest(np.asarray(x, np.float64).ravel(), cdf).pvalue


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
@pytest.mark.parametrize("a", [0.05, 0.7, 1.0, 4.5, 200.0])
def test_loggamma_is_the_log_of_a_gamma_variate(a, dtype):
    g = _random.loggamma(jax.random.key(1), jnp.full((N,), a, dtype))
    assert g.dtype == dtype and g.shape == (N,)
    g = np.asarray(g, np.float64)
    assert np.all(np.isfinite(g))
    assert _ks(g, lambda x: stats.gamma(a).cdf(np.exp(x))) > P_MIN
    # power: a 5% larger shape is rejected
    assert _ks(g, lambda x: stats.gamma(1.05 * a).cdf(np.exp(x))) < P_MIN


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
@pytest.mark.parametrize("a", [0.3, 1.0, 2.5, 200.0])
def test_loggamma_redraws_entries_whose_candidates_were_all_rejected(a, dtype):
    """Uniforms that make every candidate fail (a normal of 1.28 and an acceptance uniform
    next to 1) leave every entry to the redraw loop (Cheng's algorithm; below shape 1, boosted,
    the last uniform then next to 1 too), whose draws must be Gamma too."""
    shape = jnp.full((N,), a, dtype)
    rounds = _random.ROUNDS
    near_one = 1.0 - (1e-7 if dtype == jnp.float32 else 1e-12)
    u = jnp.concatenate([jnp.full((rounds, N), 0.9, dtype), jnp.full((rounds, N), near_one, dtype),
                         jax.random.uniform(jax.random.key(7), (1, N), dtype, 1e-30, 1.0)])
    assert u.shape == _random.loggamma_uniforms(shape.shape)
    g = _random.loggamma_from_uniform(u, shape, jax.random.key(4))
    assert g.dtype == dtype
    g = np.asarray(g, np.float64)
    assert np.all(np.isfinite(g))
    assert np.unique(g).size > N // 2  # not the rejected candidate's value
    assert _ks(g, lambda x: stats.gamma(a).cdf(np.exp(x))) > P_MIN
    assert _ks(g, lambda x: stats.gamma(1.08 * a).cdf(np.exp(x))) < P_MIN
    # legacy key data gives the same draws as the typed key
    again = _random.loggamma_from_uniform(u, shape, jax.random.PRNGKey(4))
    np.testing.assert_array_equal(np.asarray(again, np.float64), g)
    # entries of two shapes, every one redrawn: the loop tries a few entries per trip, each
    # with its own shape's constants (the halves follow their own laws, not each other's)
    other = 3.0 * a + 1.0
    mixed = jnp.where(jnp.arange(N) % 2 == 0, jnp.asarray(a, dtype), jnp.asarray(other, dtype))
    g = np.asarray(_random.loggamma_from_uniform(u, mixed, jax.random.key(5)), np.float64)
    assert np.all(np.isfinite(g))
    assert _ks(g[0::2], lambda x: stats.gamma(a).cdf(np.exp(x))) > P_MIN
    assert _ks(g[1::2], lambda x: stats.gamma(other).cdf(np.exp(x))) > P_MIN
    assert _ks(g[1::2], lambda x: stats.gamma(a).cdf(np.exp(x))) < P_MIN


_NAN_SHAPES = """
import sys
import jax, jax.numpy as jnp, numpy as np
from jaxbnp import _random
a = jnp.array([2.5, jnp.nan, jnp.inf, 0.7], jnp.float32)
g = np.asarray(_random.loggamma(jax.random.key(3), a))
alone = np.asarray(_random.loggamma(jax.random.key(3), jnp.array([2.5, 1.0, 1.0, 0.7], jnp.float32)))
# the path that hung: the Wishart draw of a posterior whose statistics hold a NaN
import jaxbnp as bnp
fam = bnp.NormalWishart.from_data(np.random.default_rng(0).normal(size=(50, 3)))
stats = fam.point_stats(jnp.asarray(np.random.default_rng(1).normal(size=(2, 3)), jnp.float32))
stats = jax.tree.map(lambda s: s.sum(0).at[(0,) * (s.ndim - 1)].set(jnp.nan), stats)
theta = fam.sample_params(jax.random.key(2), stats)
print(np.isfinite(g).tolist(), bool(g[0] == alone[0] and g[3] == alone[3]),
      bool(np.all(np.isnan(np.asarray(theta.precision)))))
"""


def test_loggamma_of_a_nan_shape_ends_with_nan():
    """A NaN upstream (a posterior that lost positive definiteness in float32, breast-cancer
    data unscaled) reached the Gamma shapes of a Wishart draw and the redraw loop never
    ended: the sub-cluster estimator hung. Now the entry is NaN and the other entries are drawn as alone. In a
    subprocess with a timeout, so that a hang fails the test rather than the suite."""
    out = subprocess.run([sys.executable, "-c", _NAN_SHAPES], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["[True,", "False,", "False,", "True]", "True", "True"], out.stdout


def test_log_dirichlet_and_zero_concentrations():
    alpha = jnp.array([0.3, 0.0, 2.0, 5.0])
    lw = np.asarray(_random.log_dirichlet(jax.random.key(2), jnp.broadcast_to(alpha, (N, 4))))
    w = np.exp(lw)
    np.testing.assert_allclose(w.sum(-1), 1.0, rtol=1e-10)
    assert np.all(w[:, 1] == 0.0)
    # marginals are Beta(alpha_j, sum - alpha_j)
    for j in (0, 2, 3):
        assert _ks(w[:, j], stats.beta(alpha[j], 7.3 - alpha[j]).cdf) > P_MIN
    assert _ks(w[:, 3], stats.beta(5.3, 7.3 - 5.3).cdf) < P_MIN


def test_log_beta_pair():
    lu, l1mu = _random.log_beta_pair(jax.random.key(3), jnp.full((N,), 0.4), 1.7)
    u = np.exp(np.asarray(lu))
    np.testing.assert_allclose(u + np.exp(np.asarray(l1mu)), 1.0, rtol=1e-10)
    assert _ks(u, stats.beta(0.4, 1.7).cdf) > P_MIN
    assert _ks(u, stats.beta(0.45, 1.7).cdf) < P_MIN
    lu0, _ = _random.log_beta_pair(jax.random.key(3), jnp.zeros(3), 1.0)
    assert np.all(np.asarray(lu0) == -np.inf)


def test_normal_from_uniform_and_cut():
    z = _random.normal_from_uniform(_random.uniform(jax.random.key(5), (N,), jnp.float64))
    assert _ks(z, stats.norm.cdf) > P_MIN
    assert _ks(z, stats.norm(0.05).cdf) < P_MIN
    a, b = _random.cut(jnp.arange(10.0), [(2, 3), (4,)])
    np.testing.assert_array_equal(a, [[0, 1, 2], [3, 4, 5]])
    np.testing.assert_array_equal(b, [6, 7, 8, 9])


def test_threefry_written_out_is_jax_threefry_bit_for_bit():
    """``_random.threefry2x32`` (the rounds written out, fused by XLA) gives the bits of JAX's
    ``threefry2x32_p``, on random keys and counters, with broadcast counters as
    ``uniform_rows`` passes them, under ``jit`` and not; and so ``uniform_rows`` those of the
    primitive (the draws of every sampler built on it are unchanged)."""
    from jax.extend.random import threefry2x32_p

    rng = np.random.default_rng(0)
    for trial in range(5):
        k1, k2 = (jnp.uint32(v) for v in rng.integers(0, 2**32, 2))
        x0 = jnp.asarray(rng.integers(0, 2**32, (300, 1)), jnp.uint32)
        x1 = jnp.asarray(rng.integers(0, 2**32, (1, 7)), jnp.uint32)
        x0, x1 = jnp.broadcast_arrays(x0, x1)
        want = threefry2x32_p.bind(k1, k2, x0, x1)
        for got in (_random.threefry2x32(k1, k2, x0, x1), jax.jit(_random.threefry2x32)(k1, k2, x0, x1)):
            for g, w in zip(got, want):
                np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
    # the counters' edge: the largest words wrap as uint32 adds do
    top = jnp.full((4,), 2**32 - 1, jnp.uint32)
    for g, w in zip(_random.threefry2x32(top[0], top[1], top, top), threefry2x32_p.bind(top[0], top[1], top, top)):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_uniform_rows_are_uniform_and_any_rows_equal_the_whole(dtype):
    key = jax.random.key(7)
    whole = np.asarray(_random.uniform_rows(key, 0, 5000, 6, dtype))
    assert whole.dtype == dtype and whole.min() >= 0.0 and whole.max() < 1.0
    for start, m in ((0, 1), (1234, 700), (4999, 1)):
        np.testing.assert_array_equal(np.asarray(_random.uniform_rows(key, start, m, 6, dtype)),
                                      whole[start:start + m])
    assert stats.kstest(whole.ravel(), "uniform").pvalue > 1e-3
    # columns and rows are not copies of each other, and another key gives other numbers
    assert abs(np.corrcoef(whole[:, 0], whole[:, 1])[0, 1]) < 0.05
    assert not np.array_equal(whole, np.asarray(_random.uniform_rows(jax.random.key(8), 0, 5000, 6, dtype)))
    # power: the KS test rejects a skewed version of the same numbers
    assert stats.kstest(whole.ravel() ** 1.05, "uniform").pvalue < 1e-3


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_log_uniform_is_minus_an_exponential_into_the_tail(dtype):
    """``-log U`` is Exp(1); beyond 5 it is ``5 + Exp(1)`` again (memoryless), which a float32
    uniform's granularity near 0 would not give far out; never below ``-64 log 2``."""
    from scipy import stats

    from jaxbnp._random import log_uniform

    x = -np.asarray(log_uniform(jax.random.key(1), (2_000_000,), dtype), np.float64)
    assert x.dtype == np.float64 and np.all(np.isfinite(x)) and x.max() <= 64 * np.log(2.0) + 1e-6
    assert stats.kstest(x, "expon").pvalue > 1e-3
    tail = x[x > 5.0] - 5.0
    assert len(tail) > 10_000 and stats.kstest(tail, "expon").pvalue > 1e-3


def test_the_gibbs_sweeps_draw_by_inversion_is_the_flat_one():
    """``gibbs.draw_by_inversion`` (two-level sums) gives the index of the flat cumulative sum
    (``#{k : P_k < U P_K}``) for weights with zeros, lengths 1 to 300, in float64; every index
    it returns has positive weight, also at the ends of ``U``'s range in float32. A draw that
    stopped one index early (``P_k <= U P_K``) would differ on many of these."""
    from jaxbnp.inference.partition.gibbs import draw_by_inversion

    rng = np.random.default_rng(0)
    draw = jax.jit(jax.vmap(draw_by_inversion, in_axes=(None, 0)))
    for K in (1, 2, 3, 5, 16, 17, 33, 65, 129, 257, 300):
        for _ in range(5):
            p = rng.exponential(size=K) * (rng.random(K) < 0.6)
            p[rng.integers(K)] += 1.0
            u = rng.random(1000)
            got = np.asarray(draw(jnp.asarray(p, jnp.float64), jnp.asarray(u, jnp.float64)))
            cdf = np.cumsum(p)
            np.testing.assert_array_equal(got, np.sum(cdf[None] < (u * cdf[-1])[:, None], axis=1))
    p = jnp.asarray([0, 0, 1e-30, 0, 1, 0, 0], jnp.float32)
    got = np.asarray(draw(p, jnp.asarray([0.0, 1e-40, 0.5, 1 - 2 ** -24], jnp.float32)))
    np.testing.assert_array_equal(got, [2, 2, 4, 4])
