"""Partition priors (docs/mathematics.md §1): EPPFs, the NGGP joint in u, Gibbs weights, urn samplers.

Every reference value here is computed independently of the library: set
partitions are enumerated, the NGGP integral over ``u`` is done by
``scipy.integrate.quad`` on a NumPy integrand written from docs/mathematics.md, and the DP
closed form is written in NumPy/SciPy.
"""

from __future__ import annotations

import functools
from collections import Counter

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import integrate
from scipy.special import gammaln

import jaxbnp as bnp

from .exact.enumeration import set_partitions

MAX_N = 7

# ----------------------------------------------------------------------------- helpers


def _all_counts(max_n: int = MAX_N):
    """Count vectors (padded to ``max_n``) of every set partition of n = 1..max_n."""
    counts, sizes = [], []
    for n in range(1, max_n + 1):
        for p in set_partitions(n):
            counts.append(np.bincount(p, minlength=max_n))
            sizes.append(n)
    return np.stack(counts), np.array(sizes)


ALL_COUNTS, ALL_SIZES = _all_counts()


# The measure is a pytree argument of these jitted helpers, so each measure class
# compiles once per shape, whatever its hyperparameters.
@jax.jit
def _batched_log_eppf(measure, counts):
    return jax.vmap(measure.log_eppf)(counts)


@jax.jit
def _log_eppf(measure, counts):
    return measure.log_eppf(counts)


@jax.jit
def _log_joint(measure, counts, u):
    return measure.log_eppf(counts, u)


@functools.partial(jax.jit, static_argnums=2)
def _sample_partitions(measure, keys, num_points):
    return jax.vmap(lambda k: measure.sample_partition(k, num_points))(keys)


def _pad(counts, length=8):
    return jnp.asarray(np.pad(np.asarray(counts), (0, length - len(counts))))


def _nggp_log_joint_np(counts, log_u, alpha, sigma, tau):
    """``log p(Π, u)`` of docs/mathematics.md §1 written in NumPy, as a function of ``t = log u``.

    Works on arrays of ``log_u`` and never forms ``u`` itself (so large ``t``
    cannot overflow): ``log(u + τ) = logaddexp(t, log τ)``.
    """
    counts = np.asarray([c for c in counts if c > 0], dtype=float)
    t = np.asarray(log_u, dtype=float)
    n = counts.sum()
    log_ut = np.logaddexp(t, np.log(tau))
    psi = alpha * (np.exp(sigma * log_ut) - tau**sigma)
    log_kappa_sum = np.sum(
        np.log(alpha * sigma) + gammaln(counts - sigma) - gammaln(1.0 - sigma)
    ) + np.sum(sigma - counts) * log_ut
    return (n - 1.0) * t - gammaln(n) - psi + log_kappa_sum


def _nggp_eppf_by_quad(counts, alpha, sigma, tau):
    """``log ∫ p(Π, u) du`` by scipy quad on ``t = log u`` (integrand ``p(Π, e^t) e^t``)."""

    def log_f(t):
        return _nggp_log_joint_np(counts, t, alpha, sigma, tau) + t

    grid = np.linspace(-80.0, 80.0 / sigma + 80.0, 200_001)
    vals = log_f(grid)
    top = vals.max()
    t_mode = grid[np.argmax(vals)]
    inside = grid[vals > top - 60.0]
    step = grid[1] - grid[0]
    lo, hi = inside.min() - step, inside.max() + step
    value, err = integrate.quad(
        lambda t: np.exp(log_f(t) - top),
        lo,
        hi,
        points=[t_mode],
        epsabs=0.0,
        epsrel=1e-11,
        limit=500,
    )
    assert err < 1e-9 * value
    return np.log(value) + top


# ----------------------------------------------------------------------------- 1. EPPF sums to one

MEASURES_FOR_SUMS = [
    pytest.param(bnp.DP(1.0), id="DP(1)"),
    pytest.param(bnp.DP(0.2), id="DP(0.2)"),
    pytest.param(bnp.DP(7.5), id="DP(7.5)"),
    pytest.param(bnp.PitmanYor(1.0, 0.5), id="PY(1,0.5)"),
    pytest.param(bnp.PitmanYor(0.3, 0.0), id="PY(0.3,0)"),
    pytest.param(bnp.PitmanYor(-0.2, 0.6), id="PY(-0.2,0.6)"),
    pytest.param(bnp.PitmanYor(4.0, 0.9), id="PY(4,0.9)"),
    pytest.param(bnp.NGGP(1.0, 0.5), id="NGGP(1,0.5)"),
    pytest.param(bnp.NGGP(2.0, 0.05, tau=0.3), id="NGGP(2,0.05,tau=0.3)"),
    pytest.param(bnp.NGGP(0.5, 0.9, tau=3.0), id="NGGP(0.5,0.9,tau=3)"),
    pytest.param(bnp.NGGP(5.0, 0.3, tau=0.01), id="NGGP(5,0.3,tau=0.01)"),
]


@pytest.mark.parametrize("measure", MEASURES_FOR_SUMS)
def test_eppf_sums_to_one_over_all_partitions(measure):
    log_p = np.asarray(_batched_log_eppf(measure, jnp.asarray(ALL_COUNTS)))
    assert np.all(np.isfinite(log_p))
    for n in range(1, MAX_N + 1):
        total = np.exp(log_p[ALL_SIZES == n]).sum()
        assert total == pytest.approx(1.0, abs=1e-6), f"n={n}: sum of EPPF = {total}"


def test_eppf_ignores_empty_slots_and_order():
    for measure in (bnp.DP(1.3), bnp.PitmanYor(0.7, 0.4), bnp.NGGP(1.1, 0.4, tau=2.0)):
        a = float(_log_eppf(measure, _pad([3, 1, 2])))
        b = float(_log_eppf(measure, jnp.array([0, 2, 0, 3, 1, 0, 0, 0])))
        assert a == pytest.approx(b, rel=1e-10, abs=1e-10)


# Regression tests: counts are int32 throughout the library (Partition.counts,
# ClusterState.counts, the Gibbs sweep), and JAX evaluates gammaln/log of int32
# input in float32 even with x64 enabled.
def test_dp_log_eppf_full_precision_with_int32_counts():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 3, size=3000)
    sizes = np.bincount(labels).astype(float)
    alpha = 1.0
    expected = (
        len(sizes) * np.log(alpha) + gammaln(alpha) - gammaln(alpha + sizes.sum()) + gammaln(sizes).sum()
    )
    # the public path: Partition.log_prob builds int32 counts from the labels
    got = float(bnp.Partition(bnp.DP(alpha), labels.size).log_prob(jnp.asarray(labels)))
    assert got == pytest.approx(expected, rel=1e-12)
    direct = bnp.DP(alpha).log_eppf(jnp.asarray(sizes.astype(np.int32)))
    assert direct.dtype == jnp.float64
    assert float(direct) == pytest.approx(expected, rel=1e-12)


def test_dp_gibbs_weights_float64_with_int32_counts():
    counts = np.array([3, 0, 7, 1000003], dtype=np.int32)
    log_existing, _ = bnp.DP(1.0).gibbs_log_weights(jnp.asarray(counts))
    assert log_existing.dtype == jnp.float64
    np.testing.assert_allclose(
        np.asarray(log_existing)[[0, 2, 3]], np.log([3.0, 7.0, 1000003.0]), rtol=1e-13
    )


def test_py_and_nggp_log_eppf_full_precision_with_int32_counts():
    sizes = np.bincount(np.random.default_rng(0).integers(0, 3, size=3000))
    for measure in (bnp.PitmanYor(1.0, 0.25), bnp.NGGP(1.0, 0.25, tau=1.0)):
        u = jnp.asarray(2.0) if measure.has_auxiliary else None
        a = measure.log_eppf(jnp.asarray(sizes.astype(np.int32)), u)
        b = measure.log_eppf(jnp.asarray(sizes.astype(np.int64)), u)
        assert a.dtype == jnp.float64
        assert float(a) == pytest.approx(float(b), rel=1e-13)


# ----------------------------------------------------------------------------- 2. NGGP joint in u

NGGP_PARAMS = [
    (1.0, 0.5, 1.0),
    (2.0, 0.05, 0.3),
    (0.5, 0.9, 3.0),
    (3.0, 0.25, 0.5),
]
NGGP_COUNTS = [[1], [3, 1], [2, 2, 1], [5], [1, 1, 1, 1], [6, 0, 2, 1, 0]]


@pytest.mark.parametrize("alpha,sigma,tau", NGGP_PARAMS)
def test_nggp_joint_integrates_to_eppf(alpha, sigma, tau):
    measure = bnp.NGGP(alpha, sigma, tau=tau)
    for counts in NGGP_COUNTS:
        reference = _nggp_eppf_by_quad(counts, alpha, sigma, tau)
        library = float(_log_eppf(measure, _pad(counts)))
        # rel tol 1e-6 on the probability = abs tol 1e-6 on its log
        assert np.exp(library - reference) == pytest.approx(1.0, rel=1e-6), (
            f"counts={counts}: library {library}, quad {reference}"
        )


@pytest.mark.parametrize("alpha,sigma,tau", NGGP_PARAMS)
def test_nggp_joint_density_matches_formula(alpha, sigma, tau):
    measure = bnp.NGGP(alpha, sigma, tau=tau)
    for counts in NGGP_COUNTS:
        for u in (1e-3, 0.37, 1.0, 4.2, 250.0):
            c = np.asarray(counts, dtype=float)
            c = c[c > 0]
            n = c.sum()
            # the docs/mathematics.md formula in u directly (not via the helper in t)
            expected = (
                (n - 1) * np.log(u)
                - gammaln(n)
                - alpha * ((u + tau) ** sigma - tau**sigma)
                + np.sum(
                    np.log(alpha * sigma)
                    + gammaln(c - sigma)
                    - gammaln(1 - sigma)
                    + (sigma - c) * np.log(u + tau)
                )
            )
            got = float(_log_joint(measure, _pad(counts), jnp.asarray(u)))
            assert got == pytest.approx(expected, rel=1e-10, abs=1e-10), (counts, u)


def test_nggp_u_conditional_matches_joint_up_to_constant():
    measure = bnp.NGGP(1.5, 0.35, tau=0.7)
    counts = jnp.array([4, 0, 2, 1])
    ts = np.array([-3.0, -0.5, 0.0, 1.2, 4.0])
    joint = np.array([float(measure.log_eppf(counts, jnp.exp(t))) for t in ts]) + ts
    cond = np.array([float(measure.log_u_conditional(jnp.asarray(t), counts)) for t in ts])
    diff = joint - cond
    np.testing.assert_allclose(diff, diff[0], atol=1e-10)


@pytest.mark.parametrize("counts", [[4, 0, 2, 1], [118] * 11, [1300]])
def test_nggp_u_mode_is_the_maximiser_of_the_u_conditional(counts):
    measure = bnp.NGGP(1.0, 0.5, tau=1.0)
    counts = jnp.asarray(counts)
    t_star = float(np.log(measure.u_mode(counts)))
    ts = np.linspace(t_star - 3.0, t_star + 3.0, 6001)
    vals = np.array(jax.vmap(lambda t: measure.log_u_conditional(t, counts))(jnp.asarray(ts)))
    assert abs(ts[np.argmax(vals)] - t_star) < 2e-3
    assert float(measure.log_u_conditional(jnp.asarray(t_star), counts)) >= vals.max() - 1e-9


@pytest.mark.parametrize("measure", [bnp.DP(1.7), bnp.NGGP(2.0, 0.3, 1.5)], ids=["DP", "NGGP"])
def test_host_log_kappa_equals_log_kappa(measure):
    """``host_log_kappa`` (NumPy, for the host tree code) is ``log_kappa`` without JAX."""
    sizes = np.arange(1.0, 40.0)
    for u in (0.0, 0.7, 250.0):
        host = measure.host_log_kappa(sizes, u)
        assert isinstance(host, np.ndarray) and host.dtype == np.float64
        np.testing.assert_allclose(host, np.asarray(measure.log_kappa(jnp.asarray(sizes), u)),
                                   rtol=1e-13, atol=1e-10)


def test_dp_nrm_form_integrates_to_dp_eppf():
    """docs/mathematics.md §1: with κ(m,u) = α Γ(m) (u+1)^(−m), ψ(u) = α log(1+u), p(Π,u) integrates to the DP EPPF."""
    alpha = 1.7
    measure = bnp.DP(alpha)

    @jax.jit
    def log_integrand(t, sizes):
        # p(Π, u) u in t = log u, from the library's κ and ψ
        u = jnp.exp(t)
        n = jnp.sum(sizes)
        return n * t - jax.scipy.special.gammaln(n) - measure.psi(u) + jnp.sum(
            measure.log_kappa(sizes, u)
        )

    for counts in ([1], [3, 1], [2, 2, 1], [4, 1, 1, 1]):
        c = np.asarray(counts, dtype=float)
        n = c.sum()
        sizes = jnp.asarray(c)

        def f(t):
            return np.exp(float(log_integrand(t, sizes)))

        value, _ = integrate.quad(f, -60.0, 60.0, epsabs=0.0, epsrel=1e-10, limit=300)
        closed = len(c) * np.log(alpha) + gammaln(alpha) - gammaln(alpha + n) + gammaln(c).sum()
        assert np.log(value) == pytest.approx(closed, abs=1e-7)


# ----------------------------------------------------------------------------- 3. Gibbs weights

GIBBS_MEASURES = [
    pytest.param(bnp.DP(0.8), id="DP"),
    pytest.param(bnp.PitmanYor(1.5, 0.3), id="PY"),
    pytest.param(bnp.PitmanYor(-0.25, 0.5), id="PY-negative-alpha"),
    pytest.param(bnp.NGGP(1.2, 0.4, tau=2.0), id="NGGP"),
    pytest.param(bnp.NGGP(0.6, 0.85, tau=0.5), id="NGGP-large-sigma"),
]


@pytest.mark.parametrize("measure", GIBBS_MEASURES)
def test_gibbs_weights_are_eppf_ratios(measure):
    rng = np.random.default_rng(11)
    for trial in range(6):
        slots = 8
        counts = rng.integers(1, 6, size=slots)
        counts[rng.random(slots) < 0.4] = 0  # empty slots
        counts[trial % slots] = max(counts[trial % slots], 1)  # at least one occupied
        u_values = [0.3, 2.5] if measure.has_auxiliary else [None]
        for u in u_values:
            u_arg = None if u is None else jnp.asarray(u)
            log_existing, log_new = measure.gibbs_log_weights(jnp.asarray(counts), u_arg)
            log_existing = np.asarray(log_existing)
            log_new = float(log_new)
            assert log_existing.shape == (slots,)
            # a new singleton in an extra slot, so every comparison has the same length
            with_new = np.append(counts, 1)
            log_p_new = float(measure.log_eppf(jnp.asarray(with_new), u_arg))
            for c in range(slots):
                if counts[c] == 0:
                    assert log_existing[c] == -np.inf
                    continue
                joined = np.append(counts, 0)
                joined[c] += 1
                expected = float(measure.log_eppf(jnp.asarray(joined), u_arg)) - log_p_new
                assert log_existing[c] - log_new == pytest.approx(expected, abs=1e-9), (
                    counts,
                    c,
                    u,
                )


def test_nggp_gibbs_weights_require_u():
    with pytest.raises(ValueError, match="auxiliary variable u"):
        bnp.NGGP(1.0, 0.5).gibbs_log_weights(jnp.array([1, 2]))


# ----------------------------------------------------------------------------- 4. urn samplers


def _check_first_appearance(draws: np.ndarray) -> None:
    assert np.all(draws[:, 0] == 0)
    running_max = np.maximum.accumulate(draws, axis=1)
    # each label is either an old one (<= max so far) or exactly max so far + 1
    assert np.all(draws[:, 1:] <= running_max[:, :-1] + 1)
    assert np.all(draws >= 0)


@pytest.mark.parametrize(
    "measure,num_draws,tolerance",
    [
        pytest.param(bnp.DP(1.0), 20_000, 0.02, id="DP(1)"),
        pytest.param(bnp.DP(0.3), 20_000, 0.02, id="DP(0.3)"),
        pytest.param(bnp.PitmanYor(0.5, 0.5), 20_000, 0.02, id="PY(0.5,0.5)"),
        pytest.param(bnp.PitmanYor(-0.3, 0.7), 20_000, 0.02, id="PY(-0.3,0.7)"),
        # the NGGP urn integrates u out by quadrature at every step (~1 ms per draw);
        # at 5000 draws the Monte Carlo TV is 0.013 on average, 0.026 at its 99.9% quantile
        # (a DP(1) urn in its place would be at TV 0.64)
        pytest.param(bnp.NGGP(2.0, 0.8, tau=0.5), 5_000, 0.03, id="NGGP(2,0.8,tau=0.5)"),
    ],
)
def test_prior_sampler_matches_eppf(measure, num_draws, tolerance):
    n = 4
    partitions = set_partitions(n)
    assert len(partitions) == 15
    counts = np.stack([np.bincount(p, minlength=n) for p in partitions])
    log_p = np.asarray(jax.vmap(measure.log_eppf)(jnp.asarray(counts)))
    probs = np.exp(log_p)
    assert probs.sum() == pytest.approx(1.0, abs=1e-6)

    keys = jax.random.split(jax.random.PRNGKey(1234), num_draws)
    draws = np.asarray(_sample_partitions(measure, keys, n))
    assert draws.shape == (num_draws, n)
    assert np.issubdtype(draws.dtype, np.integer)
    _check_first_appearance(draws)

    # labels are already canonical (checked above), so each draw is one of the partitions
    index = {tuple(p): i for i, p in enumerate(partitions.tolist())}
    tally = Counter(tuple(row) for row in draws.tolist())
    assert set(tally) <= set(index)
    empirical = np.zeros(len(partitions))
    for key, count in tally.items():
        empirical[index[key]] = count
    empirical /= num_draws
    tv = 0.5 * np.abs(empirical - probs).sum()
    assert tv < tolerance, f"TV {tv:.4f}: empirical {empirical.round(3)}, exact {probs.round(3)}"


def test_partition_distribution_sample_under_jit():
    dist = bnp.Partition(bnp.DP(2.0), 9)
    draws = np.asarray(jax.jit(lambda k: dist.sample(k, (10, 20)))(jax.random.PRNGKey(0)))
    assert draws.shape == (10, 20, 9)
    draws = draws.reshape(200, 9)
    _check_first_appearance(draws)
    assert len({tuple(d) for d in draws.tolist()}) > 20  # not one repeated draw


# ----------------------------------------------------------------------------- 5. invalid hyperparameters


@pytest.mark.parametrize(
    "make,match",
    [
        (lambda: bnp.DP(0.0), r"DP: alpha must be > 0"),
        (lambda: bnp.DP(-1.0), r"DP: alpha must be > 0"),
        (lambda: bnp.DP(float("nan")), r"DP: alpha must be finite"),
        (lambda: bnp.DP(float("inf")), r"DP: alpha must be finite"),
        (lambda: bnp.PitmanYor(1.0, 1.0), r"PitmanYor: discount d must satisfy 0 <= d < 1"),
        (lambda: bnp.PitmanYor(1.0, -0.1), r"PitmanYor: discount d must satisfy 0 <= d < 1"),
        (lambda: bnp.PitmanYor(-0.5, 0.2), r"PitmanYor: alpha must be > -d"),
        (lambda: bnp.PitmanYor(-0.2, 0.2), r"PitmanYor: alpha must be > -d"),
        (lambda: bnp.NGGP(1.0, 0.0), r"NGGP: sigma must lie in \(0, 1\)"),
        (lambda: bnp.NGGP(1.0, 1.0), r"NGGP: sigma must lie in \(0, 1\)"),
        (lambda: bnp.NGGP(1.0, 1.5), r"NGGP: sigma must lie in \(0, 1\)"),
        (lambda: bnp.NGGP(0.0, 0.5), r"NGGP: alpha must be > 0"),
        (lambda: bnp.NGGP(1.0, 0.5, tau=0.0), r"NGGP: tau must be > 0"),
        (lambda: bnp.NGGP(1.0, 0.5, tau=-2.0), r"NGGP: tau must be > 0"),
    ],
)
def test_invalid_hyperparameters_raise(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_valid_edge_hyperparameters_accepted():
    bnp.DP(1e-6)
    bnp.PitmanYor(0.0, 0.0001)  # alpha = 0 > -d is allowed
    bnp.PitmanYor(-0.19, 0.2)
    bnp.NGGP(1e-3, 0.999, tau=1e-3)


# ----------------------------------------------------------------------------- 6. property test


@settings(max_examples=25, deadline=None, database=None)
@given(
    alpha=st.floats(min_value=0.1, max_value=10.0, allow_nan=False, allow_infinity=False),
    counts=st.lists(st.integers(min_value=0, max_value=30), min_size=1, max_size=12).filter(
        lambda c: sum(c) > 0
    ),
)
def test_dp_log_eppf_closed_form(alpha, counts):
    c = np.asarray(counts, dtype=float)
    occupied = c[c > 0]
    n = occupied.sum()
    expected = (
        len(occupied) * np.log(alpha)
        + gammaln(alpha)
        - gammaln(alpha + n)
        + gammaln(occupied).sum()
    )
    got = float(bnp.DP(alpha).log_eppf(jnp.asarray(counts)))
    assert got == pytest.approx(expected, rel=1e-10, abs=1e-9)
