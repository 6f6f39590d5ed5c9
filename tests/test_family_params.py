"""Instantiated parameters of the conjugate families (docs/mathematics.md §2, "Instantiated
parameters"): ``sample_params`` and ``log_likelihood``.

* ``log_likelihood`` against ``scipy.stats`` densities evaluated point by point,
* ``sample_params``: the Monte Carlo means (and, for the Gaussians, second moments) of
  20,000 draws against the closed-form posterior moments, within a few Monte Carlo
  standard errors,
* power: the same assertion rejects draws from the prior, or with a wrong degree of
  freedom,
* shapes with batch axes.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats as sps
from scipy.special import gammaln

import jaxbnp as bnp
from jaxbnp.models.families import NormalGammaComponent, NormalWishartComponent

N_DRAWS = 20_000
Z = 5.0  # tolerance in Monte Carlo standard errors


def _mean_ok(draws, expected, z=Z):
    """Whether the sample mean of ``draws`` (leading axis = draws) matches ``expected``
    within ``z`` Monte Carlo standard errors in every entry."""
    draws = np.asarray(draws)
    se = draws.std(0, ddof=1) / np.sqrt(draws.shape[0])
    return bool(np.all(np.abs(draws.mean(0) - np.asarray(expected)) <= z * se + 1e-12))


def _cov_ok(draws, expected, rtol=0.08):
    """Whether the sample covariance of vector draws ``(N, D)`` matches ``expected``."""
    cov = np.cov(np.asarray(draws), rowvar=False)
    scale = np.sqrt(np.outer(np.diag(expected), np.diag(expected)))
    return bool(np.all(np.abs(cov - expected) <= rtol * scale))


def _draws(family, stats, n=N_DRAWS, seed=0):
    keys = jax.random.split(jax.random.key(seed), n)
    return jax.jit(jax.vmap(family.sample_params, in_axes=(0, None)))(keys, stats)


def _rng_data(seed=0):
    return np.random.default_rng(seed)


# ----------------------------------------------------------------------------- families and data
def _normal_gamma():
    return bnp.NormalGamma(m0=np.array([0.5, -1.0, 2.0]), k0=0.7, a0=2.5, b0=np.array([1.0, 2.0, 0.5]))


def _normal_wishart():
    psi = np.array([[2.0, 0.3, -0.2], [0.3, 1.0, 0.1], [-0.2, 0.1, 0.5]])
    return bnp.NormalWishart(m0=np.array([0.2, -0.3, 1.0]), r=0.5, nu=5.0, psi=psi)


def _stats_of(family, X):
    return family.stats_from_labels(jnp.asarray(X), jnp.zeros(len(X), jnp.int32), 1)


def _one(stats):
    """The single cluster of ``stats`` (leading axis 1) without its batch axis."""
    return jax.tree.map(lambda a: a[0], stats)


# ----------------------------------------------------------------------------- (a) log_likelihood
def test_normal_gamma_log_likelihood_matches_scipy():
    rng = _rng_data(1)
    X = rng.normal(size=(7, 3))
    mu = rng.normal(size=(4, 3))
    lam = rng.gamma(2.0, 1.0, size=(4, 3))
    got = np.asarray(_normal_gamma().log_likelihood(X, NormalGammaComponent(mu, lam)))
    ref = np.array([[sps.norm.logpdf(x, m, 1 / np.sqrt(l)).sum() for m, l in zip(mu, lam)] for x in X])
    assert got.shape == (7, 4)
    np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-12)


def test_normal_wishart_log_likelihood_matches_scipy():
    rng = _rng_data(2)
    X = rng.normal(size=(6, 3)) * 2
    fam = _normal_wishart()
    comp = fam.sample_params(jax.random.key(3), fam.empty_stats(5, 3))
    mu, P = np.asarray(comp.mean), np.asarray(comp.precision)
    got = np.asarray(fam.log_likelihood(X, comp))
    ref = np.array(
        [[sps.multivariate_normal.logpdf(x, m, np.linalg.inv(p)) for m, p in zip(mu, P)] for x in X]
    )
    assert got.shape == (6, 5)
    np.testing.assert_allclose(got, ref, rtol=1e-10, atol=1e-10)


def test_dirichlet_multinomial_log_likelihood_matches_scipy():
    rng = _rng_data(4)
    X = rng.poisson(2.0, size=(5, 6)).astype(float)
    theta = rng.dirichlet(np.ones(6), size=3)
    got = np.asarray(bnp.DirichletMultinomial(0.5).log_likelihood(X, theta))
    # the multinomial coefficient is dropped (as in log_marginal)
    coef = gammaln(X.sum(1) + 1) - gammaln(X + 1).sum(1)
    ref = np.array([[sps.multinomial.logpmf(x, x.sum(), t) for t in theta] for x in X]) - coef[:, None]
    assert got.shape == (5, 3)
    np.testing.assert_allclose(got, ref, rtol=1e-10, atol=1e-10)


def test_dirichlet_multinomial_log_likelihood_zero_probability():
    """An underflowed θ_w = 0 gives a finite value, exact for documents without word w."""
    theta = np.array([[0.0, 0.25, 0.75]])
    X = np.array([[0.0, 1.0, 2.0], [1.0, 0.0, 0.0]])
    got = np.asarray(bnp.DirichletMultinomial(0.5).log_likelihood(X, theta))
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got[0, 0], np.log(0.25) + 2 * np.log(0.75), rtol=1e-12)
    assert got[1, 0] < -700


def test_beta_bernoulli_log_likelihood_matches_scipy():
    rng = _rng_data(5)
    X = (rng.random(size=(8, 4)) < 0.4).astype(float)
    theta = rng.beta(1.0, 1.0, size=(3, 4))
    got = np.asarray(bnp.BetaBernoulli().log_likelihood(X, theta))
    ref = np.array([[sps.bernoulli.logpmf(x, t).sum() for t in theta] for x in X])
    assert got.shape == (8, 3)
    np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-12)


# ----------------------------------------------------------------------------- (b, c) posterior draws
def test_normal_gamma_posterior_moments():
    fam = _normal_gamma()
    X = _rng_data(6).normal(loc=[1.0, 0.0, -2.0], scale=[0.5, 2.0, 1.0], size=(15, 3))
    st = _one(_stats_of(fam, X))
    n, sx, sxx = 15.0, X.sum(0), (X * X).sum(0)
    m0, k0, a0, b0 = np.array([0.5, -1.0, 2.0]), 0.7, 2.5, np.array([1.0, 2.0, 0.5])
    kn, an = k0 + n, a0 + n / 2
    mn = (k0 * m0 + sx) / kn
    bn = b0 + 0.5 * (sxx + k0 * m0**2 - kn * mn**2)
    draws = _draws(fam, st)
    assert draws.mean.shape == (N_DRAWS, 3) and draws.precision.shape == (N_DRAWS, 3)
    assert _mean_ok(draws.precision, an / bn)  # E[λ] = a_n / b_n
    assert _mean_ok(draws.mean, mn)  # E[μ] = m_n
    # Var(μ) = E[1/(k_n λ)] = b_n / (k_n (a_n − 1))
    assert _mean_ok((np.asarray(draws.mean) - mn) ** 2, bn / (kn * (an - 1)))
    # power: draws from the prior (zero statistics) fail the same assertions
    prior = _draws(fam, jax.tree.map(jnp.zeros_like, st), seed=1)
    assert not _mean_ok(prior.precision, an / bn)
    assert not _mean_ok(prior.mean, mn)
    # power: a shape off by one half (one point fewer) is detected
    off = _draws(bnp.NormalGamma(m0=m0, k0=k0, a0=a0 - 0.5, b0=b0), st, seed=2)
    assert not _mean_ok(off.precision, an / bn)


def _nw_posterior(fam, X):
    m0, r, nu, psi = (np.asarray(v, float) for v in (fam.m0, fam.r, fam.nu, fam.psi))
    n = len(X)
    rn, nun = r + n, nu + n
    mn = (r * m0 + X.sum(0)) / rn
    psin = psi + X.T @ X + r * np.outer(m0, m0) - rn * np.outer(mn, mn)
    return rn, nun, mn, psin


def test_normal_wishart_posterior_moments():
    fam = _normal_wishart()
    X = _rng_data(7).multivariate_normal([1.0, 0.0, -1.0], [[1.0, 0.5, 0.0], [0.5, 2.0, 0.3], [0.0, 0.3, 0.7]], 12)
    st = _one(_stats_of(fam, X))
    rn, nun, mn, psin = _nw_posterior(fam, X)
    V = np.linalg.inv(psin)  # Wishart scale Ψ_n⁻¹
    draws = _draws(fam, st)
    P = np.asarray(draws.precision)
    assert draws.mean.shape == (N_DRAWS, 3) and P.shape == (N_DRAWS, 3, 3)
    np.testing.assert_array_equal(P, np.swapaxes(P, 1, 2))
    assert np.all(np.linalg.eigvalsh(P) > 0)
    assert _mean_ok(P, nun * V)  # E[Λ] = ν_n Ψ_n⁻¹
    # Var(Λ_ij) = ν_n (V_ij² + V_ii V_jj)
    assert _mean_ok((P - nun * V) ** 2, nun * (V**2 + np.outer(np.diag(V), np.diag(V))))
    assert _mean_ok(draws.mean, mn)  # E[μ] = m_n
    # Cov(μ) = E[(r_n Λ)⁻¹] = Ψ_n / (r_n (ν_n − D − 1))
    assert _cov_ok(draws.mean, psin / (rn * (nun - 3 - 1)))
    # μ given Λ: r_n (μ − m_n)ᵀ Λ (μ − m_n) ~ χ²(D), mean D, whatever Λ
    diff = np.asarray(draws.mean) - mn
    q = rn * np.einsum("ni,nij,nj->n", diff, P, diff)
    assert _mean_ok(q, 3.0)
    assert _mean_ok((q - 3.0) ** 2, 6.0)

    # power: prior draws, one degree of freedom too many, and a scale-matrix mix-up (Ψ_n for
    # Ψ_n⁻¹) all fail the precision-matrix assertion
    prior = _draws(fam, jax.tree.map(jnp.zeros_like, st), seed=1)
    assert not _mean_ok(prior.precision, nun * V)
    assert not _mean_ok(prior.mean, mn)
    wrong_dof = _draws(bnp.NormalWishart(m0=fam.m0, r=fam.r, nu=fam.nu + 1.0, psi=fam.psi), st, seed=2)
    assert not _mean_ok(wrong_dof.precision, nun * V)
    assert not _mean_ok(P, nun * psin)
    # power: a mean drawn with a wrong r (r + 5, so r_n 12.5 -> 17.5) fails the covariance check
    wrong_r = _draws(bnp.NormalWishart(m0=fam.m0, r=fam.r + 5.0, nu=fam.nu, psi=fam.psi), st, seed=3)
    assert not _cov_ok(wrong_r.mean, psin / (rn * (nun - 3 - 1)))


def test_dirichlet_multinomial_posterior_means():
    beta = np.array([0.5, 1.0, 2.0, 0.3])
    fam = bnp.DirichletMultinomial(beta)
    X = _rng_data(8).poisson([1.0, 3.0, 0.5, 2.0], size=(6, 4)).astype(float)
    st = _one(_stats_of(fam, X))
    alpha = beta + X.sum(0)
    draws = np.asarray(_draws(fam, st))
    assert draws.shape == (N_DRAWS, 4)
    np.testing.assert_allclose(draws.sum(1), 1.0, rtol=1e-12)
    assert _mean_ok(draws, alpha / alpha.sum())
    # Var(θ_w) = α_w (α_0 − α_w) / (α_0² (α_0 + 1))
    a0 = alpha.sum()
    assert _mean_ok((draws - alpha / a0) ** 2, alpha * (a0 - alpha) / (a0**2 * (a0 + 1)))
    prior = np.asarray(_draws(fam, jax.tree.map(jnp.zeros_like, st), seed=1))
    assert not _mean_ok(prior, alpha / alpha.sum())


def test_beta_bernoulli_posterior_means():
    a, b = np.array([1.0, 0.5, 2.0]), np.array([1.0, 2.0, 0.5])
    fam = bnp.BetaBernoulli(a, b)
    X = (_rng_data(9).random(size=(10, 3)) < [0.2, 0.8, 0.5]).astype(float)
    st = _one(_stats_of(fam, X))
    s, n = X.sum(0), 10.0
    expected = (a + s) / (a + b + n)
    draws = np.asarray(_draws(fam, st))
    assert draws.shape == (N_DRAWS, 3)
    assert _mean_ok(draws, expected)
    prior = np.asarray(_draws(fam, jax.tree.map(jnp.zeros_like, st), seed=1))
    assert not _mean_ok(prior, expected)
    # power: one point counted twice
    off = np.asarray(_draws(fam, st._replace(n=st.n + 1, ones=st.ones + X[0]), seed=2))
    assert not _mean_ok(off, expected)


# ----------------------------------------------------------------------------- (d) batch axes
@pytest.mark.parametrize(
    "family, X",
    [
        (_normal_gamma(), np.random.default_rng(10).normal(size=(9, 3))),
        (_normal_wishart(), np.random.default_rng(11).normal(size=(9, 3))),
        (bnp.DirichletMultinomial(0.5), np.random.default_rng(12).poisson(1.0, size=(9, 3)).astype(float)),
        (bnp.BetaBernoulli(), (np.random.default_rng(13).random(size=(9, 3)) < 0.5).astype(float)),
    ],
    ids=["NormalGamma", "NormalWishart", "DirichletMultinomial", "BetaBernoulli"],
)
def test_batch_shapes(family, X):
    K, (n, D) = 4, X.shape
    labels = jnp.asarray([0, 1, 1, 2, 0, 0, 2, 1, 0])  # cluster 3 is empty: prior draws
    stats = family.stats_from_labels(jnp.asarray(X), labels, K)
    params = jax.jit(family.sample_params)(jax.random.key(0), stats)
    leaves = jax.tree.leaves(params)
    assert all(leaf.shape[0] == K for leaf in leaves)
    assert all(np.all(np.isfinite(np.asarray(leaf))) for leaf in leaves)
    if isinstance(params, NormalWishartComponent):
        assert params.mean.shape == (K, D) and params.precision.shape == (K, D, D)
    elif isinstance(params, NormalGammaComponent):
        assert params.mean.shape == (K, D) and params.precision.shape == (K, D)
    else:
        assert params.shape == (K, D)
    ll = jax.jit(family.log_likelihood)(jnp.asarray(X), params)
    assert ll.shape == (n, K) and np.all(np.isfinite(np.asarray(ll)))
    # each column is the log-likelihood under that component alone
    for k in range(K):
        one = jax.tree.map(lambda a, k=k: a[k : k + 1], params)
        np.testing.assert_allclose(np.asarray(family.log_likelihood(X, one))[:, 0], np.asarray(ll)[:, k], rtol=1e-12)
    # draws differ between clusters and keys; two leading batch axes are kept
    stats2 = jax.tree.map(lambda s: jnp.stack([s, s]), stats)
    params2 = family.sample_params(jax.random.key(1), stats2)
    assert all(leaf.shape[:2] == (2, K) for leaf in jax.tree.leaves(params2))
    first = jax.tree.leaves(params2)[0]
    assert not np.allclose(np.asarray(first[0]), np.asarray(first[1]))


@pytest.mark.parametrize("family", [bnp.NormalGamma(m0=0.5, k0=0.3, a0=2.0, b0=1.5)], ids=["NormalGamma"])
def test_log_likelihood_at_equals_the_columns_of_log_likelihood(family):
    """A family's gathered per-point components (``log_likelihood_at``) give the matching
    columns of the full ``(n, K)`` matrix (docs/mathematics.md §2)."""
    X = jnp.asarray(np.random.default_rng(4).normal(size=(9, 3)))
    stats = family.stats_from_labels(X, jnp.arange(9) % 5, 5)
    params = family.sample_params(jax.random.key(2), stats)
    index = jnp.asarray(np.random.default_rng(5).integers(0, 5, (9, 2)))
    full = np.take_along_axis(np.asarray(family.log_likelihood(X, params)), np.asarray(index), -1)
    np.testing.assert_allclose(np.asarray(family.log_likelihood_at(X, params, index)), full,
                               rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------- (e) densities
def _scipy_log_params_density(family, params, X):
    """``log p(θ | X)`` written with SciPy's distributions and the conjugate updates."""
    n = len(X)
    if isinstance(family, bnp.NormalGamma):
        m0, k0, a0, b0 = (np.broadcast_to(np.asarray(v, float), (X.shape[1],))
                          for v in (family.m0, family.k0, family.a0, family.b0))
        kn, xbar = k0 + n, X.mean(0) if n else np.zeros(X.shape[1])
        mn = (k0 * m0 + X.sum(0)) / kn
        an = a0 + n / 2
        bn = b0 + 0.5 * (((X - xbar) ** 2).sum(0) + k0 * n * (xbar - m0) ** 2 / kn)
        mu, lam = np.asarray(params.mean), np.asarray(params.precision)
        return float(np.sum(sps.gamma.logpdf(lam, an, scale=1 / bn)
                            + sps.norm.logpdf(mu, mn, 1 / np.sqrt(kn * lam))))
    if isinstance(family, bnp.NormalWishart):
        m0, r, nu, psi = (np.asarray(v, float) for v in (family.m0, family.r, family.nu, family.psi))
        rn, nun = r + n, nu + n
        mn = (r * m0 + X.sum(0)) / rn
        psin = psi + X.T @ X + r * np.outer(m0, m0) - rn * np.outer(mn, mn)
        mu, P = np.asarray(params.mean), np.asarray(params.precision)
        return float(sps.wishart.logpdf(P, df=nun, scale=np.linalg.inv(psin))
                     + sps.multivariate_normal.logpdf(mu, mn, np.linalg.inv(rn * P)))
    if isinstance(family, bnp.DirichletMultinomial):
        alpha = np.broadcast_to(np.asarray(family.beta, float), (X.shape[1],)) + X.sum(0)
        return float(sps.dirichlet.logpdf(np.asarray(params, float), alpha))
    a, b = (np.broadcast_to(np.asarray(v, float), (X.shape[1],)) for v in (family.a, family.b))
    return float(np.sum(sps.beta.logpdf(np.asarray(params), a + X.sum(0), b + n - X.sum(0))))


@pytest.mark.parametrize(
    "family, X",
    [
        (_normal_gamma(), np.random.default_rng(20).normal(size=(7, 3))),
        (_normal_wishart(), np.random.default_rng(21).normal(size=(7, 3))),
        (bnp.DirichletMultinomial(np.array([0.5, 1.5, 2.0])),
         np.random.default_rng(22).poisson(2.0, size=(7, 3)).astype(float)),
        (bnp.BetaBernoulli(a=np.array([0.5, 1.0, 2.0]), b=2.0),
         (np.random.default_rng(23).random(size=(7, 3)) < 0.5).astype(float)),
    ],
    ids=["NormalGamma", "NormalWishart", "DirichletMultinomial", "BetaBernoulli"],
)
def test_log_params_density_matches_scipy(family, X):
    """``log_params_density`` (the sub-cluster sampler's absorb move reads it, §7) is the
    conjugate posterior's density: SciPy's at the family's own draws, given a cluster of
    points, given none (the prior) and batched over clusters; a draw under the wrong
    statistics gets another density."""
    stats = family.stats_from_labels(jnp.asarray(X), jnp.asarray([0, 0, 0, 0, 1, 1, 1]), 3)
    params = family.sample_params(jax.random.key(3), stats)
    got = np.asarray(family.log_params_density(params, stats))
    assert got.shape == (3,)
    for k, rows in enumerate([X[:4], X[4:], X[:0]]):
        one = jax.tree.map(lambda a, k=k: a[k], params)
        want = _scipy_log_params_density(family, one, rows)
        np.testing.assert_allclose(got[k], want, rtol=1e-9, atol=1e-9)
        assert float(family.log_params_density(one, _one(jax.tree.map(lambda s, k=k: s[k:k + 1], stats)))) == \
            pytest.approx(want, rel=1e-9, abs=1e-9)
    assert abs(got[0] - _scipy_log_params_density(family, jax.tree.map(lambda a: a[0], params), X[4:])) > 1e-3
