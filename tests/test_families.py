"""Conjugate families (docs/mathematics.md §2): marginals, predictives, prior settings, checks.

The references are computed without the library: numerical integrals over the
cluster parameters (``scipy.integrate``), Monte Carlo over Dirichlet draws,
chain-rule sums of ``scipy.stats.multivariate_t`` predictives, and closed forms
written in NumPy/SciPy.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import integrate, stats
from scipy.special import betaln, gammaln

import jaxbnp as bnp

LOG_2PI = math.log(2.0 * math.pi)


# The family is a pytree argument of these jitted helpers: one compilation per
# family class and shape, whatever the hyperparameters.
@jax.jit
def _log_marginal(family, cluster_stats):
    return family.log_marginal(cluster_stats)


@jax.jit
def _log_predictive(family, x, cluster_stats):
    return family.log_predictive(x, cluster_stats)


@jax.jit
def _prior_log_predictive(family, x):
    return family.prior_log_predictive(x)


def _single_point_stats(family, x):
    return family.point_stats(jnp.asarray(x)[None, :])


# ----------------------------------------------------------------------------- 1. NormalGamma


def _normal_gamma_marginal_by_dblquad(x, m0, k0, a0, b0):
    """log ∫∫ Π N(x_i|μ, 1/λ) N(μ|m0, 1/(k0 λ)) Gamma(λ|a0, rate b0) dμ dλ."""
    x = np.asarray(x, dtype=float)
    n = x.size
    s1, s2 = float(x.sum()), float((x**2).sum())
    const = (
        -0.5 * (n + 1) * LOG_2PI + 0.5 * math.log(k0) + a0 * math.log(b0) - math.lgamma(a0)
    )

    def log_f(mu, lam):
        # Σ_i (x_i − μ)² = Σx² − 2μΣx + nμ², written out for speed on scalars
        sq = s2 - 2.0 * mu * s1 + n * mu * mu
        return (
            const
            + (0.5 * (n + 1) + a0 - 1.0) * math.log(lam)
            - 0.5 * lam * (sq + k0 * (mu - m0) ** 2)
            - b0 * lam
        )

    # shift by the log integrand's maximum over a grid, so the integral is O(1)
    top = max(
        log_f(mu, lam)
        for mu in np.linspace(x.min() - 3.0, x.max() + 3.0, 61)
        for lam in np.exp(np.linspace(-6.0, 4.0, 61))
    )
    value, err = integrate.dblquad(
        lambda mu, lam: math.exp(log_f(mu, lam) - top),
        0.0,
        np.inf,
        -np.inf,
        np.inf,
        epsabs=0.0,
        epsrel=1e-10,
    )
    assert err < 1e-7 * value
    return math.log(value) + top


@pytest.mark.parametrize(
    "x,m0,k0,a0,b0",
    [
        ([0.3, -0.5, 1.2], 0.2, 0.5, 2.0, 1.5),
        ([2.1, 1.7, 2.6, 1.9], 0.0, 1.3, 1.2, 0.4),
        ([-1.0, 0.4, 0.1], -0.3, 0.1, 3.0, 2.5),
    ],
)
def test_normal_gamma_marginal_matches_double_integral(x, m0, k0, a0, b0):
    family = bnp.NormalGamma(m0=m0, k0=k0, a0=a0, b0=b0)
    X = np.asarray(x)[:, None]
    cluster = family.stats_from_labels(jnp.asarray(X), jnp.zeros(len(x), jnp.int32), 1)
    got = float(_log_marginal(family, cluster)[0])
    expected = _normal_gamma_marginal_by_dblquad(x, m0, k0, a0, b0)
    # rel tol 1e-5 on the marginal likelihood itself = abs tol ~1e-5 on its log
    assert math.exp(got - expected) == pytest.approx(1.0, rel=1e-5)


def test_normal_gamma_multivariate_is_sum_of_univariate():
    rng = np.random.default_rng(3)
    X = rng.normal(size=(9, 3)) * np.array([1.0, 3.0, 0.2]) + np.array([0.0, -2.0, 5.0])
    labels = jnp.asarray(rng.integers(0, 3, size=9))
    m0 = np.array([0.1, -1.5, 4.8])
    b0 = np.array([0.7, 4.0, 0.05])
    family = bnp.NormalGamma(m0=m0, k0=0.4, a0=1.7, b0=b0)
    got = np.asarray(_log_marginal(family, family.stats_from_labels(jnp.asarray(X), labels, 4)))
    expected = np.zeros(4)
    for d in range(3):
        fam_d = bnp.NormalGamma(m0=m0[d], k0=0.4, a0=1.7, b0=b0[d])
        st = fam_d.stats_from_labels(jnp.asarray(X[:, d : d + 1]), labels, 4)
        expected += np.asarray(_log_marginal(fam_d, st))
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)
    # and the 1-D marginal of one cluster against docs/mathematics.md's closed form
    sel = np.asarray(labels) == 0
    xs = X[sel, 1]
    n, k0, a0 = xs.size, 0.4, 1.7
    kn = k0 + n
    mn = (k0 * m0[1] + xs.sum()) / kn
    an = a0 + n / 2
    bn = b0[1] + 0.5 * (np.sum(xs**2) + k0 * m0[1] ** 2 - kn * mn**2)
    closed = (
        gammaln(an) - gammaln(a0) + a0 * np.log(b0[1]) - an * np.log(bn)
        + 0.5 * (np.log(k0) - np.log(kn)) - 0.5 * n * LOG_2PI
    )
    fam_1 = bnp.NormalGamma(m0=m0[1], k0=k0, a0=a0, b0=b0[1])
    st = fam_1.stats_from_labels(jnp.asarray(xs[:, None]), jnp.zeros(n, jnp.int32), 1)
    assert float(_log_marginal(fam_1, st)[0]) == pytest.approx(closed, rel=1e-12)


def test_normal_gamma_predictive_is_student_t():
    """Predictive per dimension: Student-t, 2an dof, location mn, squared scale bn(kn+1)/(an kn)."""
    rng = np.random.default_rng(5)
    X = rng.normal(size=(6, 2))
    m0, k0, a0, b0 = np.array([0.2, -0.1]), 0.8, 2.5, np.array([1.1, 0.6])
    family = bnp.NormalGamma(m0=m0, k0=k0, a0=a0, b0=b0)
    st = family.stats_from_labels(jnp.asarray(X), jnp.zeros(6, jnp.int32), 1)
    x_new = np.array([0.9, -1.4])
    n = 6
    kn = k0 + n
    mn = (k0 * m0 + X.sum(0)) / kn
    an = a0 + n / 2
    bn = b0 + 0.5 * ((X**2).sum(0) + k0 * m0**2 - kn * mn**2)
    scale = np.sqrt(bn * (kn + 1) / (an * kn))
    expected = stats.t.logpdf(x_new, df=2 * an, loc=mn, scale=scale).sum()
    got = float(_log_predictive(family, jnp.asarray(x_new), st)[0])
    assert got == pytest.approx(expected, rel=1e-10)


# ----------------------------------------------------------------------------- 2. NormalWishart


def _nw_predictive_params(X_seen, m0, r, nu, psi):
    """docs/mathematics.md §2 predictive (multivariate t) after the points ``X_seen``."""
    d = psi.shape[0]
    n = X_seen.shape[0]
    sx = X_seen.sum(axis=0)
    sxx = X_seen.T @ X_seen
    rn = r + n
    nun = nu + n
    mn = (r * m0 + sx) / rn
    psin = psi + sxx + r * np.outer(m0, m0) - rn * np.outer(mn, mn)
    dof = nun - d + 1
    shape = psin * (rn + 1) / (rn * dof)
    return mn, shape, dof


NW_SETTINGS = [
    (np.array([0.5, -0.3]), 0.7, 4.5, np.array([[1.5, 0.3], [0.3, 0.8]])),
    (np.array([0.0, 0.0]), 0.1, 8.0, np.array([[0.4, -0.25], [-0.25, 0.3]])),
    (np.array([2.0, 1.0]), 3.0, 1.2, np.array([[2.0, 0.0], [0.0, 0.5]])),  # nu just above D-1
]


@pytest.mark.parametrize("m0,r,nu,psi", NW_SETTINGS)
def test_normal_wishart_marginal_is_chain_of_t_predictives(m0, r, nu, psi):
    rng = np.random.default_rng(7)
    X = rng.normal(size=(6, 2)) @ np.array([[1.0, 0.4], [0.0, 0.7]]) + np.array([0.3, -0.2])
    family = bnp.NormalWishart(m0=m0, r=r, nu=nu, psi=psi)
    expected = 0.0
    for i in range(X.shape[0]):
        mn, shape, dof = _nw_predictive_params(X[:i], m0, r, nu, psi)
        expected += stats.multivariate_t(loc=mn, shape=shape, df=dof).logpdf(X[i])
    st = family.stats_from_labels(jnp.asarray(X), jnp.zeros(6, jnp.int32), 1)
    got = float(_log_marginal(family, st)[0])
    assert got == pytest.approx(expected, rel=1e-9, abs=1e-9)

    # a single point: the prior predictive
    x = X[0]
    mn, shape, dof = _nw_predictive_params(X[:0], m0, r, nu, psi)
    prior = stats.multivariate_t(loc=mn, shape=shape, df=dof).logpdf(x)
    got1 = float(_log_marginal(family, _single_point_stats(family, x))[0])
    assert got1 == pytest.approx(prior, rel=1e-10, abs=1e-10)
    assert float(_prior_log_predictive(family, jnp.asarray(x))) == pytest.approx(prior, rel=1e-10)

    # the predictive after 4 points, against scipy
    st4 = family.stats_from_labels(jnp.asarray(X[:4]), jnp.zeros(4, jnp.int32), 1)
    mn, shape, dof = _nw_predictive_params(X[:4], m0, r, nu, psi)
    ref = stats.multivariate_t(loc=mn, shape=shape, df=dof).logpdf(X[5])
    assert float(_log_predictive(family, jnp.asarray(X[5]), st4)[0]) == pytest.approx(ref, rel=1e-10)


def test_normal_wishart_empty_cluster_marginal_is_zero():
    family = bnp.NormalWishart(*[s for s in NW_SETTINGS[0]])
    empty = family.empty_stats(3, 2)
    np.testing.assert_allclose(np.asarray(_log_marginal(family, empty)), 0.0, atol=1e-12)


def test_normal_wishart_tabulated_marginal_equals_the_formula():
    """tgMCMC's trees look the count-only terms up in a table (``tabulated_log_marginal``):
    the same values as ``log_marginal`` for every count 0..max_count, empty clusters included."""
    rng = np.random.default_rng(4)
    X = rng.normal(size=(40, 3))
    family = bnp.NormalWishart.from_data(X)
    stats = family.point_stats(jnp.asarray(X))
    members = np.concatenate([np.zeros((1, 40)), np.tril(np.ones((40, 40))), rng.random((10, 40)) < 0.4])
    unions = jax.tree.map(lambda a: jnp.einsum("kn,n...->k...", jnp.asarray(members, a.dtype), a), stats)
    want = np.asarray(family.log_marginal(unions))
    got = np.asarray(family.tabulated_log_marginal(40)(unions))
    assert sorted(set(members.sum(1).astype(int))) == list(range(41))
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


# ----------------------------------------------------------------------------- 3. DirichletMultinomial


def _dirichlet_multinomial_closed_form(counts, beta):
    counts = np.asarray(counts, dtype=float)
    beta = np.broadcast_to(np.asarray(beta, dtype=float), counts.shape)
    log_b_post = gammaln(beta + counts).sum() - gammaln((beta + counts).sum())
    log_b_prior = gammaln(beta).sum() - gammaln(beta.sum())
    return log_b_post - log_b_prior


@pytest.mark.parametrize("beta", [np.array([0.5, 1.0, 2.0]), 0.8])
def test_dirichlet_multinomial_marginal_monte_carlo_and_closed_form(beta):
    X = np.array([[2.0, 0.0, 1.0], [0.0, 1.0, 1.0], [1.0, 0.0, 0.0], [0.0, 0.0, 2.0]])
    labels = np.array([0, 0, 0, 2])
    family = bnp.DirichletMultinomial(beta=beta)
    st = family.stats_from_labels(jnp.asarray(X), jnp.asarray(labels), 3)
    got = np.asarray(_log_marginal(family, st))

    rng = np.random.default_rng(2024)
    theta = rng.dirichlet(np.broadcast_to(beta, (3,)), size=200_000)
    for slot in (0, 2):
        docs = X[labels == slot]
        # P(X_c) = E_θ[Π_i Π_w θ_w^{x_iw}] (the multinomial coefficient is dropped)
        mc = np.log(np.mean(np.prod(theta[:, None, :] ** docs[None, :, :], axis=(1, 2))))
        assert got[slot] == pytest.approx(mc, abs=0.02)
        closed = _dirichlet_multinomial_closed_form(docs.sum(axis=0), beta)
        assert got[slot] == pytest.approx(closed, rel=1e-12, abs=1e-12)
    assert got[1] == pytest.approx(0.0, abs=1e-12)  # empty slot


# ----------------------------------------------------------------------------- 4. BetaBernoulli


def _beta_bernoulli_check(X, a, b):
    family = bnp.BetaBernoulli(a=a, b=b)
    n = X.shape[0]
    prior_norm = math.exp(betaln(a, b))
    total = 0.0
    for d in range(X.shape[1]):
        s = X[:, d].sum()
        value, err = integrate.quad(
            lambda p: p**s * (1.0 - p) ** (n - s) * p ** (a - 1.0) * (1.0 - p) ** (b - 1.0),
            0.0,
            1.0,
            epsabs=0.0,
            epsrel=1e-12,
            limit=200,
        )
        assert err < 1e-9 * value
        expected_d = value / prior_norm
        st_d = family.stats_from_labels(jnp.asarray(X[:, d : d + 1]), jnp.zeros(n, jnp.int32), 1)
        got_d = math.exp(float(_log_marginal(family, st_d)[0]))
        assert got_d == pytest.approx(expected_d, rel=1e-7), (a, b, d)
        total += math.log(expected_d)
    st = family.stats_from_labels(jnp.asarray(X), jnp.zeros(n, jnp.int32), 1)
    assert float(_log_marginal(family, st)[0]) == pytest.approx(total, rel=1e-7)


BB_DATA = np.array(
    [[1, 0, 1, 0], [1, 0, 0, 0], [0, 0, 1, 0], [1, 0, 1, 0], [1, 0, 1, 0], [0, 0, 1, 1]],
    dtype=float,
)


@pytest.mark.parametrize("a,b", [(0.7, 1.8), (1.0, 1.0), (2.5, 0.4)])
def test_beta_bernoulli_marginal_matches_quadrature(a, b):
    _beta_bernoulli_check(BB_DATA, a, b)


@pytest.mark.parametrize("a,b", [(3.0, 0.5), (1.0, 1.0)])
def test_beta_bernoulli_marginal_precision_with_an_argument_of_8_or_more(a, b):
    # column sums reach a + s >= 8 or b + n - s >= 8
    X = np.zeros((9, 3))
    X[:5, 0] = 1.0  # a + s = a + 5
    X[:7, 1] = 1.0  # a + 7 = 8 for a = 1
    _beta_bernoulli_check(X, a, b)


def test_beta_bernoulli_predictive_equals_marginal_ratio_for_larger_clusters():
    family = bnp.BetaBernoulli(a=1.0, b=1.0)
    X = np.zeros((10, 1))
    X[:2] = 1.0
    st = family.stats_from_labels(jnp.asarray(X[1:]), jnp.zeros(9, jnp.int32), 1)
    full = family.stats_from_labels(jnp.asarray(X), jnp.zeros(10, jnp.int32), 1)
    ratio = float(_log_marginal(family, full)[0] - _log_marginal(family, st)[0])
    # Laplace's rule of succession: p(x=1 | 1 one in 9) = (1 + 1) / (2 + 9)
    assert ratio == pytest.approx(math.log(2.0 / 11.0), abs=1e-10)
    assert float(_log_predictive(family, jnp.asarray(X[0]), st)[0]) == pytest.approx(ratio, abs=1e-8)


# ----------------------------------------------------------------------------- 5. predictive = marginal ratio


def _family_cases():
    rng = np.random.default_rng(42)
    n = 12
    Xg = rng.normal(size=(n, 3)) @ np.array([[1.0, 0.3, 0.0], [0.0, 0.8, 0.2], [0.0, 0.0, 0.5]])
    Xg += np.array([1.0, -2.0, 0.5])
    Xc = rng.poisson(2.0, size=(n, 4)).astype(float)
    Xb = (rng.random((n, 5)) < 0.4).astype(float)
    return [
        pytest.param(
            bnp.NormalGamma(m0=np.array([0.8, -1.5, 0.0]), k0=0.3, a0=1.5, b0=np.array([1.0, 0.4, 2.0])),
            Xg,
            id="NormalGamma",
        ),
        pytest.param(
            bnp.NormalWishart(
                m0=np.array([1.0, -2.0, 0.5]),
                r=0.4,
                nu=5.0,
                psi=np.array([[1.0, 0.2, 0.0], [0.2, 0.9, 0.1], [0.0, 0.1, 0.6]]),
            ),
            Xg,
            id="NormalWishart",
        ),
        pytest.param(
            bnp.DirichletMultinomial(beta=np.array([0.3, 1.0, 2.5, 0.7])), Xc, id="DirichletMultinomial"
        ),
        pytest.param(bnp.BetaBernoulli(a=0.6, b=1.4), Xb, id="BetaBernoulli"),
    ]


CAPACITY = 8


@jax.jit
def _ratio_quantities(family, X, labels, xs):
    """Everything the ratio test compares, in one compilation per family class."""
    st = family.stats_from_labels(X, labels, CAPACITY)
    base = family.log_marginal(st)
    params = family.predictive_params(st)

    def per_point(x):
        plus = jax.tree.map(lambda s, p: s + p, st, family.point_stats(x[None, :]))
        return dict(
            predictive=family.log_predictive(x, st),
            ratio=family.log_marginal(plus) - base,
            prior=family.prior_log_predictive(x),
            single=family.log_marginal(family.point_stats(x[None, :]))[0],
            cached=family.log_predictive_from_params(x, params),
        )

    return st.n, base, jax.vmap(per_point)(xs)


@pytest.mark.parametrize("family,X", _family_cases())
def test_log_predictive_is_ratio_of_marginals(family, X):
    labels = np.random.default_rng(0).choice([0, 2, 3, 5], size=X.shape[0])
    labels[:4] = [0, 2, 3, 5]  # every listed slot occupied, slots 1, 4, 6, 7 empty
    xs = np.stack([X[0], X[5], X[-1], X[0] + X[1]])  # seen points and a new one
    if isinstance(family, bnp.BetaBernoulli):
        xs[-1] = 1.0 - X[0]
    n, base, out = _ratio_quantities(family, jnp.asarray(X), jnp.asarray(labels), jnp.asarray(xs))
    out = {k: np.asarray(v) for k, v in out.items()}
    assert np.array_equal(np.asarray(n), np.bincount(labels, minlength=CAPACITY))
    np.testing.assert_allclose(np.asarray(base)[[1, 4, 6, 7]], 0.0, atol=1e-12)  # empty slots

    assert out["predictive"].shape == (len(xs), CAPACITY)
    np.testing.assert_allclose(out["predictive"], out["ratio"], rtol=0, atol=1e-8)
    # prior predictive = marginal of the single point = predictive of an empty slot
    np.testing.assert_allclose(out["prior"], out["single"], rtol=0, atol=1e-8)
    np.testing.assert_allclose(out["predictive"][:, 1], out["single"], rtol=0, atol=1e-8)
    # the cached form used by the samplers agrees with log_predictive
    np.testing.assert_allclose(out["cached"], out["predictive"], rtol=0, atol=1e-12)
    assert np.all(np.isfinite(out["predictive"]))


@pytest.mark.parametrize("family,X", _family_cases())
def test_host_numpy_forms_equal_the_jax_forms(family, X):
    """``host_point_stats`` / ``host_log_marginal`` (NumPy, used by the host tree code) are
    the JAX ``point_stats`` / ``log_marginal`` evaluated without JAX (float64)."""
    labels = np.random.default_rng(1).integers(0, 4, size=X.shape[0])
    host_points = family.host_point_stats(X)
    jax.tree.map(
        lambda h, j: np.testing.assert_allclose(h, np.asarray(j), rtol=0, atol=1e-12),
        host_points, family.point_stats(jnp.asarray(X)),
    )
    stats = family.stats_from_labels(jnp.asarray(X), jnp.asarray(labels), 4)
    host = family.host_log_marginal(jax.tree.map(np.asarray, stats))
    assert isinstance(host, np.ndarray) and host.dtype == np.float64
    np.testing.assert_allclose(host, np.asarray(family.log_marginal(stats)), rtol=1e-12, atol=1e-9)


# ----------------------------------------------------------------------------- 6. from_data


def test_normal_wishart_from_data():
    rng = np.random.default_rng(9)
    for d in (1, 2, 4):
        X = rng.normal(size=(50, d)) @ rng.normal(size=(d, d)) * 3.0 + rng.normal(size=d) * 10
        fam = bnp.NormalWishart.from_data(X)
        assert float(fam.r) == pytest.approx(0.1, rel=1e-12)
        assert float(fam.nu) == pytest.approx(d + 6, rel=1e-12)
        np.testing.assert_allclose(np.asarray(fam.m0), X.mean(axis=0), rtol=1e-12, atol=1e-12)
        psi = np.asarray(fam.psi)
        assert psi.shape == (d, d)
        assert np.linalg.det(psi) == pytest.approx(0.1, rel=1e-8)
        # Ψ is proportional to the sample covariance
        S = np.atleast_2d(np.cov(X, rowvar=False))
        ratio = psi / S
        np.testing.assert_allclose(ratio, ratio.flat[0], rtol=1e-8)
        assert np.isfinite(float(_log_marginal(fam, fam.stats_from_labels(
            jnp.asarray(X), jnp.zeros(50, jnp.int32), 1))[0]))


def test_normal_wishart_from_data_rejects_singular_covariance():
    X = np.column_stack([np.arange(10.0), 2 * np.arange(10.0)])
    with pytest.raises(ValueError, match="singular"):
        bnp.NormalWishart.from_data(X)


def test_normal_wishart_from_data_shrinkage():
    """``shrinkage="ledoit-wolf"``: Ψ ∝ scikit-learn's Ledoit-Wolf covariance, positive definite
    with a constant and a collinear column; a number δ: ``(1 − δ) S + δ tr(S)/D I``."""
    from sklearn.covariance import ledoit_wolf

    rng = np.random.default_rng(3)
    X = rng.normal(size=(40, 4)) @ rng.normal(size=(4, 4))
    X[:, 2] = 7.0
    X[:, 3] = 2.0 * X[:, 0] - X[:, 1]
    with pytest.raises(ValueError, match="singular.*ledoit-wolf"):
        bnp.NormalWishart.from_data(X)
    fam = bnp.NormalWishart.from_data(X, shrinkage="ledoit-wolf")
    psi = np.asarray(fam.psi)
    assert np.linalg.eigvalsh(psi).min() > 0
    lw = ledoit_wolf(X)[0]  # Ψ = c · lw (entries of a constant column's row: 0 beside 0)
    np.testing.assert_allclose(psi * (lw[0, 0] / psi[0, 0]), lw, rtol=1e-8, atol=1e-12 * abs(lw).max())
    # the determinant over the columns that vary (not the constant column 2)
    live = [0, 1, 3]
    assert np.linalg.det(psi[np.ix_(live, live)]) == pytest.approx(0.1, rel=1e-8)
    Y = rng.normal(size=(30, 3))
    S = np.cov(Y, rowvar=False)
    ratio = np.asarray(bnp.NormalWishart.from_data(Y, shrinkage=0.25).psi) / (
        0.75 * S + 0.25 * np.trace(S) / 3 * np.eye(3))
    np.testing.assert_allclose(ratio, ratio.flat[0], rtol=1e-8)
    for bad in ("oas", 1.5, -0.1):
        with pytest.raises(ValueError, match="shrinkage"):
            bnp.NormalWishart.from_data(Y, shrinkage=bad)
    with pytest.raises(ValueError, match="every column is constant"):
        bnp.NormalWishart.from_data(np.ones((5, 2)), shrinkage="ledoit-wolf")


def test_normal_gamma_from_data():
    rng = np.random.default_rng(1)
    X = rng.normal(size=(40, 3)) * np.array([0.01, 1.0, 100.0])
    X[:, 0] = 3.0  # a constant column
    fam = bnp.NormalGamma.from_data(X)
    for name in ("k0", "a0", "b0"):
        v = np.asarray(getattr(fam, name))
        assert np.all(np.isfinite(v)) and np.all(v > 0), name
    m0 = np.asarray(fam.m0)
    assert np.all(np.isfinite(m0))
    np.testing.assert_allclose(m0, X.mean(axis=0), rtol=1e-12)
    # prior mean of the variance b0/(a0-1) is the data variance (1 for constant columns)
    var = X.var(axis=0)
    var[0] = 1.0
    np.testing.assert_allclose(np.asarray(fam.b0) / (float(fam.a0) - 1.0), var, rtol=1e-12)


# ----------------------------------------------------------------------------- 7. invalid parameters

PSI2 = np.array([[1.0, 0.2], [0.2, 0.5]])


@pytest.mark.parametrize(
    "make,match",
    [
        (lambda: bnp.NormalWishart(np.zeros(2), 1.0, 4.0, np.array([[1.0, 2.0], [2.0, 1.0]])), "positive definite"),
        (lambda: bnp.NormalWishart(np.zeros(2), 1.0, 4.0, np.zeros((2, 2))), "positive definite"),
        (lambda: bnp.NormalWishart(np.zeros(2), 1.0, 4.0, np.ones((2, 3))), "square"),
        (lambda: bnp.NormalWishart(np.zeros(2), 1.0, 4.0, np.ones(2)), "square"),
        (lambda: bnp.NormalWishart(np.zeros(2), 1.0, 4.0, np.array([[1.0, 0.3], [0.1, 1.0]])), "symmetric"),
        (lambda: bnp.NormalWishart(np.zeros(2), 1.0, 1.0, PSI2), r"nu must be > D - 1"),
        (lambda: bnp.NormalWishart(np.zeros(2), 1.0, 0.5, PSI2), r"nu must be > D - 1"),
        (lambda: bnp.NormalWishart(np.zeros(3), 1.0, 4.0, PSI2), r"m0 must have shape \(2,\)"),
        (lambda: bnp.NormalWishart(np.zeros(2), 0.0, 4.0, PSI2), r"r must be > 0"),
        (lambda: bnp.NormalWishart(np.array([0.0, np.nan]), 1.0, 4.0, PSI2), r"m0 must be finite"),
        (lambda: bnp.NormalGamma(k0=0.0), r"k0 must be > 0"),
        (lambda: bnp.NormalGamma(k0=-1.0), r"k0 must be > 0"),
        (lambda: bnp.NormalGamma(a0=0.0), r"a0 must be > 0"),
        (lambda: bnp.NormalGamma(b0=0.0), r"b0 must be > 0"),
        (lambda: bnp.NormalGamma(b0=np.array([1.0, -0.5])), r"b0 must be > 0"),
        (lambda: bnp.NormalGamma(m0=np.inf), r"m0 must be finite"),
        (lambda: bnp.BetaBernoulli(a=0.0), r"BetaBernoulli: a must be > 0"),
        (lambda: bnp.BetaBernoulli(b=-2.0), r"BetaBernoulli: b must be > 0"),
        (lambda: bnp.DirichletMultinomial(beta=-1.0), r"DirichletMultinomial: beta must be > 0"),
        (lambda: bnp.DirichletMultinomial(beta=np.array([1.0, 0.0])), r"beta must be > 0"),
    ],
)
def test_invalid_family_parameters_raise(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_validate_data():
    dm = bnp.DirichletMultinomial(beta=1.0)
    dm.validate_data(np.array([[0.0, 2.0, 5.0], [1.0, 0.0, 0.0]]))  # fine
    with pytest.raises(ValueError, match="non-negative integer counts"):
        dm.validate_data(np.array([[0.0, -1.0, 5.0]]))
    with pytest.raises(ValueError, match="non-negative integer counts"):
        dm.validate_data(np.array([[0.0, 1.5, 5.0]]))
    with pytest.raises(ValueError, match="beta has length 2"):
        bnp.DirichletMultinomial(beta=np.ones(2)).validate_data(np.ones((2, 3)))

    bb = bnp.BetaBernoulli()
    bb.validate_data(np.array([[0.0, 1.0], [1.0, 1.0]]))  # fine
    with pytest.raises(ValueError, match="binary"):
        bb.validate_data(np.array([[0.0, 2.0]]))
    with pytest.raises(ValueError, match="binary"):
        bb.validate_data(np.array([[0.5, 1.0]]))

    with pytest.raises(ValueError, match="2 x 2 but the data have 3 columns"):
        bnp.NormalWishart(np.zeros(2), 1.0, 4.0, PSI2).validate_data(np.ones((4, 3)))
    with pytest.raises(ValueError, match="m0 has length 2"):
        bnp.NormalGamma(m0=np.zeros(2)).validate_data(np.ones((4, 3)))


# ----------------------------------------------------------------------------- 8. float32


def test_normal_wishart_log_predictive_float32():
    rng = np.random.default_rng(12)
    X = rng.normal(size=(30, 3)) @ np.array([[1.0, 0.3, 0.0], [0.0, 0.8, 0.2], [0.0, 0.0, 0.5]])
    labels = rng.integers(0, 3, size=30)
    m0 = X.mean(axis=0)
    psi = np.array([[1.0, 0.2, 0.0], [0.2, 0.9, 0.1], [0.0, 0.1, 0.6]])
    r, nu = 0.5, 6.0

    fam64 = bnp.NormalWishart(m0=m0, r=r, nu=nu, psi=psi)
    st64 = fam64.stats_from_labels(jnp.asarray(X), jnp.asarray(labels), 4)

    f32 = jnp.float32
    fam32 = bnp.NormalWishart(
        m0=jnp.asarray(m0, f32), r=jnp.asarray(r, f32), nu=jnp.asarray(nu, f32), psi=jnp.asarray(psi, f32)
    )
    st32 = fam32.stats_from_labels(jnp.asarray(X, f32), jnp.asarray(labels, jnp.int32), 4)
    assert st32.sum_xx.dtype == f32

    for x in (X[0], X[7], np.array([0.5, -1.0, 2.0])):
        v64 = np.asarray(_log_predictive(fam64, jnp.asarray(x), st64))
        v32 = _log_predictive(fam32, jnp.asarray(x, f32), st32)
        assert v32.dtype == f32  # computed in float32, not silently promoted
        np.testing.assert_allclose(np.asarray(v32, dtype=float), v64, rtol=1e-4)
        assert np.all(np.isfinite(np.asarray(v32)))


def test_normal_wishart_rank_one_updates_match_recomputation():
    """params_add / params_remove (Sherman-Morrison) equal predictive_params from statistics."""
    rng = np.random.default_rng(3)
    d = 3
    family = bnp.NormalWishart(np.zeros(d), 0.4, d + 2.0, np.eye(d) * 0.5)
    X = rng.normal(size=(6, d))
    x = rng.normal(size=d)
    labels = jnp.zeros(6, jnp.int32)
    base = family.stats_from_labels(jnp.asarray(X), labels, 1)
    plus = family.stats_from_labels(jnp.asarray(np.vstack([X, x])), jnp.zeros(7, jnp.int32), 1)
    p_base = family.predictive_params(base)
    p_plus = family.predictive_params(plus)
    for got, want in zip(family.params_add(p_base, jnp.asarray(x)), p_plus):
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)
    for got, want in zip(family.params_remove(p_plus, jnp.asarray(x)), p_base):
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)
    # removing the only point gives back the prior
    one = family.stats_from_labels(jnp.asarray(x[None]), jnp.zeros(1, jnp.int32), 1)
    prior = family.predictive_params(family.empty_stats(1, d))
    for got, want in zip(family.params_remove(family.predictive_params(one), jnp.asarray(x)), prior):
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("d", [1, 3, 8, 10])
def test_normal_wishart_pairwise_predictive_equals_one_point_at_a_time(d):
    """log_predictive_pairwise (written-out quadratic form for d <= 8; above, x − m_n times
    Ψ_n⁻¹ for a block of at most PAIRWISE_DIRECT_ROWS_PER_DIM * d points, a product with the
    clusters' Cholesky factors of Ψ_n⁻¹ for a bigger one) equals
    log_predictive_from_params point by point, and the generic Family default agrees."""
    from jaxbnp.models.families import PAIRWISE_DIRECT_ROWS_PER_DIM

    rng = np.random.default_rng(d)
    family = bnp.NormalWishart(np.zeros(d), 0.4, d + 2.0, np.eye(d) * 0.5)
    labels = jnp.asarray(rng.integers(0, 4, 40), jnp.int32)
    params = family.predictive_params(
        family.stats_from_labels(jnp.asarray(rng.normal(size=(40, d))), labels, 5))  # slot 4 empty
    for rows in (7, PAIRWISE_DIRECT_ROWS_PER_DIM * d + 1):
        X = jnp.asarray(rng.normal(size=(rows, d)) * 2.0)
        want = np.asarray(jax.vmap(lambda x: family.log_predictive_from_params(x, params))(X))
        np.testing.assert_allclose(family.log_predictive_pairwise(X, params), want, rtol=1e-10)
        np.testing.assert_allclose(bnp.Family.log_predictive_pairwise(family, X, params), want,
                                   rtol=1e-10)


@pytest.mark.parametrize("d", [1, 3, 6])
def test_normal_wishart_removed_predictive_equals_predictive_of_the_cluster_without_the_point(d):
    """log_predictive_removed (one quadratic form, no new parameters) equals the predictive of
    x under the cluster's statistics with x taken out, for clusters of 2 to 6 points, with
    and without the tabulated count terms; it is what the Gibbs sweep scores a point's own
    cluster with."""
    rng = np.random.default_rng(d)
    family = bnp.NormalWishart(rng.normal(size=d), 0.3, d + 1.5, np.eye(d) * 0.7)
    norms = family.removed_norms(jnp.arange(8))
    for size in range(2, 7):
        X = jnp.asarray(rng.normal(size=(size, d)) * 1.5)
        x = X[0]
        full = family.predictive_params(family.stats_from_labels(X, jnp.zeros(size, jnp.int32), 1))
        rest = family.predictive_params(
            family.stats_from_labels(X[1:], jnp.zeros(size - 1, jnp.int32), 1))
        want = family.log_predictive_from_params(x, rest)
        np.testing.assert_allclose(family.log_predictive_removed(full, x), want, rtol=1e-9)
        np.testing.assert_allclose(family.log_predictive_removed(full, x, norms[size]), want, rtol=1e-9)
    # batched as MAP-DP's block step calls it: every point of several clusters at once, with
    # its own cluster's parameters gathered
    X = jnp.asarray(rng.normal(size=(30, d)) * 1.5)
    labels = jnp.asarray(rng.integers(0, 4, 30), jnp.int32)
    stats = family.stats_from_labels(X, labels, 4)
    params = family.predictive_params(stats)
    got = family.log_predictive_removed(jax.tree.map(lambda p: p[labels], params), X,
                                        family.removed_norms(jnp.round(stats.n[labels]).astype(jnp.int32)))
    own = jax.tree.map(lambda s, p: s[labels] - p, stats, family.point_stats(X))
    want = jax.vmap(family.log_predictive_from_params)(X, family.predictive_params(own))
    np.testing.assert_allclose(got, want, rtol=1e-9)


@pytest.mark.parametrize("d", [1, 2, 3, 6, 8, 9])
def test_logdet_pd_matches_numpy_slogdet_and_flags_non_positive_definite(d):
    """``JAX_MATH.logdet_pd`` (unrolled Cholesky up to d = 8, LAPACK above) equals
    ``numpy.linalg.slogdet`` on SPD batches and is NaN for indefinite matrices."""
    from jaxbnp._math import JAX_MATH

    rng = np.random.default_rng(d)
    A = rng.normal(size=(5, d, d + 3))
    spd = A @ np.swapaxes(A, -1, -2) + 0.1 * np.eye(d)
    got = np.asarray(jax.jit(JAX_MATH.logdet_pd)(jnp.asarray(spd)))  # float64 (tests run in x64)
    sign, want = np.linalg.slogdet(spd)
    assert np.all(sign > 0)
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)
    indefinite = spd.copy()
    indefinite[:, -1, -1] = -1.0  # a negative diagonal entry: not positive definite
    assert np.all(np.isnan(np.asarray(jax.jit(JAX_MATH.logdet_pd)(jnp.asarray(indefinite)))))


@pytest.mark.parametrize("d", [3, 9, 30])
def test_cholesky_and_triangular_solves_without_lapack_match_numpy(d):
    """``jaxbnp._math``'s Cholesky and triangular solves (written out for d <= 3, loops above:
    no LAPACK call, which can deadlock XLA's CPU pool) agree with NumPy; a matrix that is not
    positive definite, from its first pivot or only at its last, gives an all-NaN factor, as
    LAPACK's does; the compiled program holds no custom call."""
    from jaxbnp import _math
    from jaxbnp.inference.runner import calls_library_kernels

    rng = np.random.default_rng(d)
    G = rng.normal(size=(4, d, d))
    A = G @ np.swapaxes(G, -1, -2) + d * np.eye(d)
    B = rng.normal(size=(4, d, 2))
    L = np.asarray(jax.jit(_math.cholesky)(jnp.asarray(A)))
    np.testing.assert_allclose(L, np.linalg.cholesky(A), rtol=1e-10, atol=1e-10)
    for lower, T in ((True, L), (False, np.swapaxes(L, -1, -2))):
        x = np.asarray(jax.jit(_math.solve_triangular, static_argnums=2)(jnp.asarray(T), jnp.asarray(B), lower))
        np.testing.assert_allclose(T @ x, B, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(np.asarray(_math.cho_solve(jnp.asarray(L), jnp.asarray(B))),
                               np.linalg.solve(A, B), rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(np.asarray(_math.JAX_MATH.logdet_pd(jnp.asarray(A))),
                               np.linalg.slogdet(A)[1], rtol=1e-12)
    bad = A.copy()
    bad[1] = -np.eye(d)
    bad[2, -1, -1] = -1.0  # positive definite but for the last pivot
    out = np.asarray(_math.cholesky(jnp.asarray(bad)))
    assert np.isnan(out[[1, 2]]).all() and np.isfinite(out[[0, 3]]).all()
    compiled = jax.jit(lambda a, b: _math.cho_solve(_math.cholesky(a), b)).lower(A, B).compile()
    assert not calls_library_kernels(compiled)


@pytest.mark.parametrize("d", [3, 10])
def test_normal_wishart_predictive_vmapped_under_jit_in_float32(d):
    """``log_predictive_from_params`` vmapped over 600 points and jitted in float32 (what
    MAP-DP's batched step and ``predict`` run) equals the float64 values. Its former
    multiply-and-sum quadratic form, ``sum(sum(Ψ⁻¹ * diff[..., None, :], -1) * diff, -1)``, came
    out of XLA:CPU (jax 0.10.2) wrong beyond the first hundred points, NaN or tens of nats
    off, while eager and float64 runs were right: MAP-DP then moved most points of every
    block of 10^5 full-covariance points and redid each block point by point. The power
    check: the assertion fails on that former form (43 % of the entries, checked by hand);
    the form is also run here, jitted the same way, and whether XLA still gets it wrong is
    printed, so the day XLA is fixed shows in the log."""
    rng = np.random.default_rng(d)
    X = rng.normal(size=(600, d))
    labels = np.arange(600) % 32
    fam64 = bnp.NormalWishart.from_data(X)
    fam32 = jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), fam64)
    stats = fam64.stats_from_labels(jnp.asarray(X), jnp.asarray(labels), 32)
    p64 = fam64.predictive_params(stats)
    p32 = jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), p64)
    X32 = jnp.asarray(X, jnp.float32)
    want = np.asarray(jax.vmap(lambda x: fam64.log_predictive_from_params(x, p64))(jnp.asarray(X)))
    got = jax.jit(jax.vmap(lambda x: fam32.log_predictive_from_params(x, p32)))(X32)
    assert got.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-3)

    def old_q(x):
        diff = x - p32.mean
        return jnp.sum(jnp.sum(p32.psi_inv * diff[..., None, :], -1) * diff, -1)

    diff = X[:, None, :] - np.asarray(p64.mean)[None]
    q = np.einsum("bkd,kde,bke->bk", diff, np.asarray(p64.psi_inv), diff)
    old = np.asarray(jax.jit(jax.vmap(old_q))(X32))
    print("XLA's float32 miscompilation of the old form:",
          "present" if not np.allclose(old, q, rtol=1e-3, atol=1e-2) else "absent (fixed in this XLA?)")
