"""MAP-DP against a plain NumPy implementation of docs/mathematics.md §3 written here, and its guarantees."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.special import gammaln
from sklearn.datasets import load_breast_cancer, load_iris, load_wine
from sklearn.metrics import adjusted_rand_score

import jaxbnp as bnp
from jaxbnp.estimators import MAPDP, SingleClusterWarning, select_alpha
from jaxbnp.inference.partition import mapdp as mapdp_core
from jaxbnp.inference.partition.clusters import init_clusters
from jaxbnp.inference.partition.hyperparameters import family_type2_ml


# ----------------------------------------------------------------------------- NumPy reference
def _ng_posterior(n, sx, sxx, m0, k0, a0, b0):
    kn = k0 + n
    mn = (k0 * m0 + sx) / kn
    an = a0 + n / 2
    bn = b0 + 0.5 * (sxx + k0 * m0**2 - kn * mn**2)
    return kn, mn, an, bn


def _ng_log_marginal(n, sx, sxx, m0, k0, a0, b0):
    kn, mn, an, bn = _ng_posterior(n, sx, sxx, m0, k0, a0, b0)
    return np.sum(
        gammaln(an) - gammaln(a0) + a0 * np.log(b0) - an * np.log(bn)
        + 0.5 * (np.log(k0) - np.log(kn)) - 0.5 * n * np.log(2 * np.pi)
    )


def _ng_log_predictive(x, n, sx, sxx, m0, k0, a0, b0):
    """Student-t, 2a_n dof, location m_n, squared scale b_n (k_n+1)/(a_n k_n) (docs/mathematics.md §2)."""
    kn, mn, an, bn = _ng_posterior(n, sx, sxx, m0, k0, a0, b0)
    nu = 2 * an
    s2 = bn * (kn + 1) / (an * kn)
    return np.sum(
        gammaln((nu + 1) / 2) - gammaln(nu / 2) - 0.5 * np.log(nu * np.pi * s2)
        - (nu + 1) / 2 * np.log1p((x - mn) ** 2 / (nu * s2))
    )


def numpy_mapdp(X, alpha, m0, k0, a0, b0, tol=1e-6, max_iter=1000):
    """The paper's algorithm, plainly: all points in one cluster, sweep, stop when the NLL drop < tol."""
    n, d = X.shape
    z = np.zeros(n, dtype=int)
    clusters = {0: [n, X.sum(0), (X**2).sum(0)]}

    def nll():  # from the labels directly, not from the running statistics
        groups = [X[z == k] for k in np.unique(z)]
        sizes = np.array([len(g) for g in groups])
        lm = sum(_ng_log_marginal(len(g), g.sum(0), (g**2).sum(0), m0, k0, a0, b0) for g in groups)
        log_prior = len(sizes) * np.log(alpha) + gammaln(alpha) - gammaln(alpha + n) + gammaln(sizes).sum()
        return -(lm + log_prior)

    history = [nll()]
    next_id = 1
    for it in range(max_iter):
        for i in range(n):
            x = X[i]
            c = clusters[z[i]]
            c[0] -= 1
            c[1] = c[1] - x
            c[2] = c[2] - x**2
            if c[0] == 0:
                del clusters[z[i]]
            ids = sorted(clusters)
            d_existing = [
                -_ng_log_predictive(x, *clusters[k], m0, k0, a0, b0) - np.log(clusters[k][0]) for k in ids
            ]
            d_new = -_ng_log_predictive(x, 0.0, 0.0, 0.0, m0, k0, a0, b0) - np.log(alpha)
            if ids and min(d_existing) <= d_new:
                k = ids[int(np.argmin(d_existing))]
            else:
                k = next_id
                next_id += 1
                clusters[k] = [0, np.zeros(d), np.zeros(d)]
            clusters[k][0] += 1
            clusters[k][1] = clusters[k][1] + x
            clusters[k][2] = clusters[k][2] + x**2
            z[i] = k
        history.append(nll())
        if history[-2] - history[-1] < tol:
            break
    return z, history[-1], len(history) - 1, np.array(history)


def _same_partition(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return all(len(set(b[a == k])) == 1 for k in np.unique(a)) and len(np.unique(a)) == len(np.unique(b))


@pytest.mark.parametrize(
    "loader, alpha",
    [(load_wine, 1.0), (load_iris, 100.0), (load_breast_cancer, 1.0)],
    ids=["wine", "iris", "breast_cancer"],
)
def test_sequential_matches_numpy_reference(loader, alpha):
    """Same partition, NLL trajectory (rel 1e-9, float64) and iterations as the NumPy reference.

    Fixed priors that never look at the labels; alpha is chosen per set so that
    the answer has several clusters (from one cluster, MAP-DP keeps iris whole
    at alpha = 1 under these priors, which would make the comparison trivial).
    """
    X = loader().data.astype(float)
    X = (X - X.mean(0)) / X.std(0)
    # fixed prior: prior mean variance 0.2 on standardised data
    prior = dict(m0=np.zeros(X.shape[1]), k0=0.1, a0=2.0, b0=np.full(X.shape[1], 0.2))
    z_ref, nll_ref, iters_ref, hist_ref = numpy_mapdp(X, alpha, **prior)
    est = MAPDP.paper(alpha=alpha, family=bnp.NormalGamma(**prior)).fit(X)
    assert _same_partition(est.labels_, z_ref)
    np.testing.assert_allclose(est.nll_, nll_ref, rtol=1e-9)
    assert est.n_iter_ == iters_ref
    np.testing.assert_allclose(est.nll_trace_, hist_ref, rtol=1e-9)
    assert est.n_clusters_ >= 2


def _uci(loader=load_breast_cancer):
    """Standardised UCI data and a fixed prior under which MAP-DP finds many clusters.

    (From one cluster, MAP-DP keeps well-separated groups together when the
    prior mean is vague: see the note in ``jaxbnp.inference.partition.mapdp``. These
    tests need partitions that actually move.)
    """
    data = loader()
    X = (data.data - data.data.mean(0)) / data.data.std(0)
    family = bnp.NormalGamma(np.zeros(X.shape[1]), 0.1, 2.0, np.full(X.shape[1], 0.2))
    return X, data.target, family


@pytest.mark.parametrize(
    "mode, family_name, split_moves, merge_moves",
    [("sequential", "NormalGamma", False, False), ("batched", "NormalGamma", False, False),
     ("sequential", "NormalWishart", False, False), ("batched", "NormalWishart", True, False),
     ("batched", "NormalWishart", True, True)],
)
def test_nll_never_increases(mode, family_name, split_moves, merge_moves):
    X, _, family = _uci(load_wine)
    if family_name == "NormalWishart":
        family = bnp.NormalWishart(np.zeros(X.shape[1]), 0.1, X.shape[1] + 2.0, 0.2 * np.eye(X.shape[1]))
    best, _ = mapdp_core.fit(jax.random.key(0), jnp.asarray(X), bnp.DP(1.0), family, capacity=64,
                             mode=mode, block_size=16, n_restarts=1, split_moves=split_moves,
                             merge_moves=merge_moves, init_clusters=16 if merge_moves else 1)
    trace = np.asarray(best.nll_trace)[: int(best.n_iter) + 1]
    assert int(best.n_iter) >= 2 and np.sum(np.asarray(best.clusters.counts) > 0) >= 2
    assert trace[-1] < trace[0]
    assert np.all(np.diff(trace) <= 1e-12 * np.abs(trace[:-1]))


def test_batched_with_blocks_of_one_is_the_sequential_algorithm():
    X, _, family = _uci()
    seq = MAPDP.paper(family=family).fit(X)
    one = MAPDP.paper(family=family, mode="batched", block_size=1).fit(X)
    assert _same_partition(seq.labels_, one.labels_)
    np.testing.assert_allclose(one.nll_trace_, seq.nll_trace_, rtol=1e-9)


def test_batched_blocks_reach_a_comparable_optimum():
    X, y, family = _uci()
    seq = MAPDP.paper(family=family).fit(X)
    bat = MAPDP.paper(family=family, mode="batched", block_size=64).fit(X)
    assert bat.nll_ < bat.nll_trace_[0]
    assert abs(bat.nll_ - seq.nll_) < 0.02 * abs(seq.nll_)


def test_restarts_keep_the_lowest_nll_and_reproduce():
    X, _, family = _uci()
    est = MAPDP.paper(family=family, n_restarts=4, random_state=0).fit(X)
    est2 = MAPDP.paper(family=family, n_restarts=4, random_state=0).fit(X)
    np.testing.assert_array_equal(est.labels_, est2.labels_)
    best, runs = mapdp_core.fit(jax.random.key(0), jnp.asarray(X), bnp.DP(1.0), family, 64, n_restarts=4)
    assert len(np.unique(np.asarray(runs.nll))) > 1  # the orders really differ
    np.testing.assert_allclose(float(best.nll), float(np.min(runs.nll)))
    np.testing.assert_allclose(est.nll_, float(best.nll), rtol=1e-12)


def test_pitman_yor_map():
    X, _, family = _uci()
    est = MAPDP.paper(measure=bnp.PitmanYor(1.0, 0.3), family=family).fit(X)
    assert est.n_clusters_ >= 2
    expected = -float(bnp.log_joint(X, jnp.asarray(est.labels_), bnp.PitmanYor(1.0, 0.3), family))
    np.testing.assert_allclose(est.nll_, expected, rtol=1e-9)


def test_predict_and_score_samples():
    X, _, family = _uci()
    est = MAPDP.paper(family=family).fit(X[:450])
    # training points are predicted into (almost always) their own cluster
    assert np.mean(est.predict(X[:450]) == est.labels_) > 0.9
    # mixture predictive density: direct formula from the fitted clusters
    x = jnp.asarray(X[500])
    stats = family.stats_from_labels(jnp.asarray(X[:450]), jnp.asarray(est.labels_), est.n_clusters_)
    terms = [np.log(est.cluster_sizes_[k]) + family.log_predictive(x, stats)[k] for k in range(est.n_clusters_)]
    terms.append(np.log(1.0) + family.prior_log_predictive(x))
    expected = np.logaddexp.reduce(terms) - np.log(450 + 1.0)
    np.testing.assert_allclose(est.score_samples(X[500:501])[0], expected, rtol=1e-10)
    proba = est.predict_proba(X[450:])
    np.testing.assert_allclose(proba.sum(1), 1.0, rtol=1e-10)
    far = np.full((1, X.shape[1]), 1e3)
    assert est.predict(far, allow_new=True)[0] == -1
    assert est.score(X[450:]) > est.score(X[450:] + 20.0)


def test_alpha_selection_and_type2_ml():
    X, _, _ = _uci(load_wine)
    alpha, scores = select_alpha(X, [0.01, 1.0, 100.0], method="nll")
    assert alpha in (0.01, 1.0, 100.0) and scores.shape == (3,)
    alpha_h, held = select_alpha(X, [0.1, 1.0], method="heldout", n_folds=2)
    assert np.all(np.isfinite(held))
    est = MAPDP().fit(X)
    family, hist = family_type2_ml(X, est.labels_, est.family_, steps=200)
    assert hist[-1] > hist[0]  # marginal likelihood went up
    stats = family.stats_from_labels(jnp.asarray(X), jnp.asarray(est.labels_), est.n_clusters_)
    stats0 = est.family_.stats_from_labels(jnp.asarray(X), jnp.asarray(est.labels_), est.n_clusters_)
    assert float(family.log_marginal(stats).sum()) > float(est.family_.log_marginal(stats0).sum())


def test_bad_input_and_options():
    X, _, _ = _uci(load_iris)
    bad = X.copy()
    bad[0, 0] = np.inf
    with pytest.raises(ValueError, match="contains infinity"):  # scikit-learn's message
        MAPDP().fit(bad)
    with pytest.raises(ValueError, match="alpha must be > 0"):
        MAPDP(alpha=0.0).fit(X)
    with pytest.raises(ValueError, match="mode"):
        MAPDP(mode="fast").fit(X)
    with pytest.raises(ValueError, match="DP and PitmanYor"):
        MAPDP(measure=bnp.NGGP(1.0, 0.5)).fit(X)
    with pytest.raises(ValueError, match="not fitted"):
        MAPDP().predict(X)
    with pytest.raises(ValueError, match="init"):
        MAPDP(init="random").fit(X)
    with pytest.raises(ValueError, match="init_clusters"):
        MAPDP(init_clusters=0).fit(X)
    with pytest.raises(TypeError, match="merge_moves"):
        MAPDP(merge_moves="yes").fit(X)
    with pytest.raises(ValueError, match="capacity"):
        MAPDP(capacity=0).fit(X)
    est = MAPDP().fit(X)
    with pytest.raises(ValueError, match="features"):
        est.predict(X[:, :2])


def test_capacity_grows_instead_of_truncating():
    X, _, family = _uci()
    reference = MAPDP.paper(family=family).fit(X)
    assert reference.n_clusters_ > 4
    small = MAPDP.paper(family=family, capacity=2).fit(X)
    assert small.n_clusters_ == reference.n_clusters_
    assert small.cluster_sizes_.sum() == X.shape[0]
    np.testing.assert_allclose(small.nll_, reference.nll_, rtol=1e-12)


def test_capacity_grows_with_the_defaults():
    """Split moves that need more slots than ``capacity`` grow it (refit), never truncate."""
    X, y = _separated_groups()
    est = MAPDP(capacity=2, init_clusters=2).fit(X)
    assert est.n_clusters_ == 4 and est.cluster_sizes_.sum() == X.shape[0]
    assert adjusted_rand_score(y, est.labels_) == 1.0


def _separated_groups(n_per=150, seed=0):
    rng = np.random.default_rng(seed)
    centres = np.array([[0, 0, 0], [8, 0, 0], [0, 8, 0], [0, 0, 8]], float)
    y = np.repeat(np.arange(4), n_per)
    return centres[y] + rng.normal(size=(4 * n_per, 3)), y


def test_split_moves_escape_the_one_cluster_start():
    """The paper's start keeps four separated groups together; split moves find them."""
    X, y = _separated_groups()
    with pytest.warns(SingleClusterWarning, match="init='kmeans\\+\\+'"):
        plain = MAPDP.paper(family=bnp.NormalGamma.from_data(X)).fit(X)
    assert plain.n_clusters_ == 1
    est = MAPDP(split_moves=True, init="one", merge_moves=False, mode="batched", block_size=64,
                family=bnp.NormalGamma.from_data(X)).fit(X)
    assert est.n_clusters_ == 4 and est.cluster_sizes_.sum() == X.shape[0]
    assert adjusted_rand_score(y, est.labels_) == 1.0
    assert est.nll_ < plain.nll_
    assert np.all(np.diff(est.nll_trace_) <= 1e-9 * np.abs(est.nll_trace_[:-1]))
    expected = -float(bnp.log_joint(X, jnp.asarray(est.labels_), bnp.DP(1.0), est.family_))
    np.testing.assert_allclose(est.nll_, expected, rtol=1e-9)


@pytest.mark.parametrize("measure", [bnp.DP(1.0), bnp.PitmanYor(1.0, 0.5)], ids=["DP", "PY"])
def test_split_round_exact_and_monotone(measure):
    """Any split round returns a partition whose exact NLL is no higher, for DP and PY."""
    X, _ = _separated_groups(40)
    X = jnp.asarray(X)
    family = bnp.NormalGamma.from_data(X)
    rng = np.random.default_rng(1)
    split_round = jax.jit(mapdp_core.split_round)
    for trial in range(4):
        labels = jnp.asarray(rng.integers(0, 3, X.shape[0]), jnp.int32)
        st = init_clusters(family, X, labels, capacity=8)
        new = split_round(jax.random.key(trial), st, X, measure, family, X.std(0))
        before = -float(bnp.log_joint(X, labels, measure, family))
        after = -float(bnp.log_joint(X, new.labels, measure, family))
        assert after <= before + 1e-9
        np.testing.assert_allclose(float(mapdp_core.negative_log_joint(new, measure, family)), after,
                                   rtol=1e-10)
        assert after < before  # random partitions of separated groups: some split must help
    # no free slot: nothing is split and the overflow flag asks for more capacity
    full = init_clusters(family, X, labels, capacity=3)
    new = split_round(jax.random.key(0), full, X, measure, family, X.std(0))
    assert bool(new.overflow)
    np.testing.assert_array_equal(np.asarray(new.labels), np.asarray(labels))



# ----------------------------------------------------------------------------- the defaults
def _thirty_gaussians(n=3000, d=10, k=30, seed=0):
    """``k`` well separated diagonal Gaussians (means ~ N(0, 10^2), sds ~ U(0.5, 1.5))."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, k, n)
    means = rng.normal(0.0, 10.0, (k, d))
    sds = rng.uniform(0.5, 1.5, (k, d))
    return means[y] + sds[y] * rng.normal(size=(n, d)), y


@pytest.mark.parametrize("data", ["thirty_gaussians", "toy_ring"])
def test_defaults_find_well_separated_clusters(data):
    """``MAPDP()`` as shipped: right K, NMI >= 0.95, a monotone exact NLL trace."""
    from sklearn.metrics import normalized_mutual_info_score

    X, y = _thirty_gaussians() if data == "thirty_gaussians" else bnp.datasets.toy_ring()
    k_true = len(np.unique(y))
    est = MAPDP().fit(X)
    assert normalized_mutual_info_score(y, est.labels_) >= 0.95
    assert abs(est.n_clusters_ - k_true) <= 2
    trace = est.nll_trace_
    assert len(trace) == est.n_iter_ + 1 and np.all(np.isfinite(trace))
    assert np.all(np.diff(trace) <= 1e-9 * np.abs(trace[:-1]))
    expected = -float(bnp.log_joint(X, jnp.asarray(est.labels_), bnp.DP(1.0), est.family_))
    np.testing.assert_allclose(est.nll_, expected, rtol=1e-9)
    # the paper's algorithm on the same data and prior stays in far fewer clusters
    if data == "toy_ring":
        paper = MAPDP.paper(family=est.family_)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SingleClusterWarning)
            paper.fit(X)
        assert paper.n_clusters_ < k_true - 2 and paper.nll_ > est.nll_


def _strips(n_per=200, seed=0):
    """Three parallel strips at 45 degrees: standard deviation 3 along the strip, 0.3 across,
    2.5 apart. Full-covariance clusters that no diagonal covariance describes."""
    rng = np.random.default_rng(seed)
    u, v = np.array([1.0, 1.0]) / np.sqrt(2), np.array([-1.0, 1.0]) / np.sqrt(2)
    X = [rng.normal(size=(n_per, 1)) * 3.0 * u + rng.normal(size=(n_per, 1)) * 0.3 * v + 2.5 * j * v
         for j in range(3)]
    return np.concatenate(X), np.repeat(np.arange(3), n_per)


def test_default_prior_is_full_covariance_and_free_of_units():
    """``MAPDP()``'s default prior is a Normal-Wishart on standardised columns: elongated,
    rotated clusters are found (the former diagonal default, ``covariance="diag", groups=2,
    weight=2``, cuts them into pieces: the power check that the data tell the two apart);
    and the fit does not depend on the data's units: rescaled and shifted columns give the
    same partition, and ``nll_`` and ``score_samples`` change by exactly the Jacobian."""
    from sklearn.metrics import normalized_mutual_info_score

    X, y = _strips()
    est = MAPDP(random_state=0).fit(X)
    assert isinstance(est.family_, bnp.NormalWishart)
    assert est.n_clusters_ == 3 and normalized_mutual_info_score(y, est.labels_) > 0.99
    diag = MAPDP(random_state=0, family=mapdp_core.default_prior(X, covariance="diag", groups=2,
                                                                 weight=2)).fit(X)
    assert isinstance(diag.family_, bnp.NormalGamma)
    assert diag.n_clusters_ >= 5 and normalized_mutual_info_score(y, diag.labels_) < 0.8
    # the reported prior is the model on X: its log joint of X is -nll_
    expected = -float(bnp.log_joint(X, jnp.asarray(est.labels_), bnp.DP(1.0), est.family_))
    np.testing.assert_allclose(est.nll_, expected, rtol=1e-9)
    a, b = np.array([1e-3, 1e2]), np.array([5.0, -7.0])
    moved = MAPDP(random_state=0).fit(X * a + b)
    np.testing.assert_array_equal(moved.labels_, est.labels_)
    np.testing.assert_allclose(moved.nll_ - est.nll_, len(X) * np.sum(np.log(a)), rtol=1e-9)
    np.testing.assert_allclose(moved.nll_trace_ - est.nll_trace_, len(X) * np.sum(np.log(a)),
                               rtol=1e-9)
    np.testing.assert_allclose(est.score_samples(X[:7]) - moved.score_samples(X[:7] * a + b),
                               np.sum(np.log(a)), rtol=1e-9)
    np.testing.assert_array_equal(moved.predict(X[:7] * a + b), est.predict(X[:7]))
    with pytest.raises(ValueError, match="covariance"):
        mapdp_core.default_prior(X, covariance="spherical")
    # fewer points than a covariance has entries: the diagonal prior, on X itself
    few = MAPDP(random_state=0).fit(X[:2])
    assert isinstance(few.family_, bnp.NormalGamma)
    assert [mapdp_core.default_covariance(n, d) for n, d in [(2, 2), (3, 2), (1797, 64), (569, 30)]] \
        == ["diag", "full", "diag", "full"]


def test_default_prior_groups_follow_the_points_and_the_diagonal_prior_has_the_full_weight():
    """``default_prior``'s k-means groups: 32 for the full prior; for the diagonal one at
    most one per 20 points and at least 2; ``weight`` is how many points the covariance
    prior is worth (``D + 1`` by default) for both variants, with the same expected
    covariance (full) or precisions (diagonal) whatever the weight; the diagonal variant's
    variances are within-group variances, and it is the samplers' default below
    ``n = D (D + 1) / 2`` (``jaxbnp._defaults.default_family``)."""
    from jaxbnp import _defaults

    rng = np.random.default_rng(0)
    small = rng.normal(size=(60, 3)) + 8.0 * (np.arange(60) % 3)[:, None]
    d = small.shape[1]
    assert mapdp_core.PRIOR_GROUPS == 32 and mapdp_core.PRIOR_POINTS_PER_GROUP == 20
    # 60 points: the diagonal prior from 3 groups, not 32 (the 3 clusters cut into pieces of
    # about 2 points, whose spread is a fraction of a cluster's: the power check)
    auto, three, many = (mapdp_core.default_prior(small, covariance="diag", groups=g) for g in (None, 3, 32))
    for a, b in zip(jax.tree.leaves(auto), jax.tree.leaves(three)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert np.all(np.asarray(many.b0) < 0.5 * np.asarray(auto.b0))
    # the full prior keeps 32 groups, and so does the diagonal one from 640 points on
    for a, b in zip(jax.tree.leaves(mapdp_core.default_prior(small)),
                    jax.tree.leaves(mapdp_core.default_prior(small, groups=32))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    big = np.concatenate([small] * 11)  # 660 points
    for a, b in zip(jax.tree.leaves(mapdp_core.default_prior(big, covariance="diag")),
                    jax.tree.leaves(mapdp_core.default_prior(big, covariance="diag", groups=32))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # the weight: nu - D - 1 = weight, psi = weight W, a0 = weight / 2, b0 = a0 diag(W)
    full = mapdp_core.default_prior(small)
    diag = mapdp_core.default_prior(small, covariance="diag")
    assert float(full.nu) == 2.0 * d + 2.0 and float(diag.a0) == (d + 1.0) / 2.0
    W = np.asarray(full.psi) / (d + 1.0)
    full5 = mapdp_core.default_prior(small, weight=5.0)
    assert float(full5.nu) == d + 6.0
    np.testing.assert_allclose(np.asarray(full5.psi) / 5.0, W, rtol=1e-12)
    diag5 = mapdp_core.default_prior(small, covariance="diag", weight=5.0)
    assert float(diag5.a0) == 2.5
    np.testing.assert_allclose(np.asarray(diag.b0) / float(diag.a0), np.asarray(diag5.b0) / 2.5, rtol=1e-12)
    # the diagonal variances: the within-group variances, as in W's diagonal up to the
    # Ledoit-Wolf shrinkage, and nothing like the whole data's (8 apart: variance ~ 43)
    within = np.asarray(diag.b0) / float(diag.a0)
    assert np.all(within < 3.0) and np.all(small.var(0) > 30.0)
    with pytest.raises(ValueError, match="weight"):
        mapdp_core.default_prior(small, weight=0.0)
    # the samplers' and the CLI's diagonal default is this prior (20 points in 6-D)
    Z = rng.normal(size=(20, 6))
    ours, mapdps = _defaults.default_family(Z), mapdp_core.default_prior(Z, covariance="diag")
    assert isinstance(ours, bnp.NormalGamma)
    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(mapdps)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_subsample_start_on_more_points_than_init_size():
    """More points than ``init_size``: the k-means++ start and the moves run on a subsample,
    every point goes to its best cluster of that fit, sweeps over all points follow. The
    groups are found, the trace over all points is monotone and exact, the same seed gives the
    same labels, and ``init_size=None`` (everything on all points) reaches the same partition."""
    from sklearn.metrics import normalized_mutual_info_score

    X, y = _thirty_gaussians()
    X, y = X[:3000], y[:3000]
    est = MAPDP(init_size=1000, random_state=1).fit(X)  # about 33 points per group
    assert normalized_mutual_info_score(y, est.labels_) >= 0.95
    trace = est.nll_trace_
    assert len(trace) == est.n_iter_ + 1 and est.n_iter_ >= 1
    assert np.all(np.diff(trace) <= 1e-9 * np.abs(trace[:-1]))
    expected = -float(bnp.log_joint(X, jnp.asarray(est.labels_), bnp.DP(1.0), est.family_))
    np.testing.assert_allclose(est.nll_, expected, rtol=1e-9)
    again = MAPDP(init_size=1000, random_state=1).fit(X)
    np.testing.assert_array_equal(again.labels_, est.labels_)
    full = MAPDP(init_size=None, random_state=1).fit(X)
    assert adjusted_rand_score(full.labels_, est.labels_) > 0.99
    # a subsample of about 7 points per group merges groups the sweeps cannot split again
    # (the sweeps have no moves); they still only lower the NLL
    tiny = MAPDP(init_size=200, random_state=1).fit(X)
    assert np.all(np.diff(tiny.nll_trace_) <= 1e-9 * np.abs(tiny.nll_trace_[:-1]))
    with pytest.raises(ValueError, match="init_size"):
        MAPDP(init_size=1).fit(X)


def test_single_cluster_warns_with_the_defaults():
    """One Gaussian: the k-means++ start is merged back into one cluster, and the fit warns."""
    X = np.random.default_rng(0).normal(size=(300, 3))
    with pytest.warns(SingleClusterWarning, match="one cluster"):
        est = MAPDP().fit(X)
    assert est.n_clusters_ == 1
    assert est.nll_trace_[-1] < est.nll_trace_[0]  # the 32-cluster start was worse


@pytest.mark.parametrize("measure", [bnp.DP(1.0), bnp.PitmanYor(1.0, 0.5)], ids=["DP", "PY"])
def test_merge_round_exact_and_monotone(measure):
    """A merge round never raises the exact NLL and merges an over-split partition."""
    X, y = _separated_groups(40)
    X = jnp.asarray(X)
    family = bnp.NormalGamma.from_data(X)
    merge_round = jax.jit(mapdp_core.merge_round)
    # each true group cut in two halves: merging the halves back must help
    labels = jnp.asarray(2 * y + (np.arange(len(y)) % 2), jnp.int32)
    st = init_clusters(family, X, labels, capacity=8)
    before = -float(bnp.log_joint(X, labels, measure, family))
    for _ in range(3):
        new = merge_round(st, X, measure, family, X.std(0))
        after = -float(bnp.log_joint(X, new.labels, measure, family))
        np.testing.assert_allclose(float(mapdp_core.negative_log_joint(new, measure, family)), after,
                                   rtol=1e-10)
        assert after <= -float(bnp.log_joint(X, st.labels, measure, family)) + 1e-9
        st = new
    assert after < before
    assert adjusted_rand_score(y, np.asarray(st.labels)) == 1.0


@pytest.mark.parametrize("n", [1, 2, 5])
def test_defaults_on_fewer_points_than_the_start_has_clusters(n):
    """With n <= init_clusters the k-means++ start puts every point in its own slot (the
    seeds beyond the n points repeat one and leave their slots empty); the fit runs and
    raises no CapacityError. (A point alone in its cluster that prefers a new one keeps its
    own slot when every slot is in use: test_block_proposal_lets_a_lone_point_keep_its_slot.)"""
    X = np.arange(2.0 * n).reshape(n, 2) * 10.0
    # the diagonal prior (the default for n < 3 here): each point stays in a cluster of its
    # own, no warning; the full prior, the default from n = 3, puts these collinear points in
    # one cluster
    family = mapdp_core.default_prior(X, covariance="diag")
    est = MAPDP(random_state=0, family=family).fit(X)
    assert est.labels_.shape == (n,) and 1 <= est.n_clusters_ <= n
    assert np.isfinite(est.nll_)


def test_block_proposal_lets_a_lone_point_keep_its_slot():
    family = bnp.NormalGamma(0.0, 0.1, 2.0, 1.0)
    X = jnp.asarray([[0.0], [50.0]])
    st = init_clusters(family, X, jnp.asarray([0, 1], jnp.int32), 2)  # both slots in use
    proposal, overflow = mapdp_core.block_proposal(
        st.counts, st.stats, X, st.labels, jnp.ones(2, bool), bnp.DP(1.0), family,
        family.prior_predictive_params(1, X.dtype))
    np.testing.assert_array_equal(proposal, [0, 1])
    assert not bool(overflow)


def _padded(X, rows):
    return jnp.asarray(mapdp_core.pad_rows(X, rows))


@pytest.mark.parametrize("mode", ["sequential", "batched"])
def test_padded_rows_change_nothing(mode):
    """``fit(..., num_points=n)`` on ``X`` plus padding rows is the fit of ``X`` alone: from
    the same start and in index order, the same labels, NLL trace and iterations; with the
    k-means++ start, restarts, merge and split moves, the padding rows end in no cluster
    (label ``capacity``), the counts add up to ``n`` and the NLL is that of the points'
    partition. A padded row that joined a cluster or a sweep would change the sums."""
    X, _, family = _uci(load_wine)
    X = X[:150]
    n, rows, capacity = X.shape[0], 208, 64
    start = jnp.asarray(np.random.default_rng(0).integers(0, 6, n), jnp.int32)
    key = jax.random.key(3)
    plain, _ = mapdp_core.fit(key, jnp.asarray(X), bnp.DP(1.0), family, capacity, mode=mode,
                              block_size=16, init_labels=start)
    pad, _ = mapdp_core.fit(key, _padded(X, rows), bnp.DP(1.0), family, capacity, mode=mode,
                            block_size=16, init_labels=jnp.zeros(rows, jnp.int32).at[:n].set(start),
                            num_points=n)
    assert int(plain.n_iter) >= 2  # the sweeps moved points
    labels = np.asarray(pad.clusters.labels)
    np.testing.assert_array_equal(labels[:n], np.asarray(plain.clusters.labels))
    np.testing.assert_array_equal(labels[n:], capacity)
    assert int(pad.n_iter) == int(plain.n_iter)
    np.testing.assert_allclose(np.asarray(pad.nll_trace), np.asarray(plain.nll_trace), rtol=1e-12)

    best, runs = mapdp_core.fit(key, _padded(X, rows), bnp.DP(1.0), family, capacity, mode=mode,
                                block_size=16, n_restarts=2, split_moves=True, merge_moves=True,
                                init_clusters=16, num_points=n)
    labels = np.asarray(best.clusters.labels)
    np.testing.assert_array_equal(np.asarray(runs.clusters.labels)[:, n:], capacity)
    assert int(np.sum(np.asarray(best.clusters.counts))) == n
    assert np.all(labels[:n] < capacity) and np.sum(np.asarray(best.clusters.counts) > 0) >= 2
    points = init_clusters(family, jnp.asarray(X), jnp.asarray(labels[:n]), capacity)
    np.testing.assert_allclose(
        float(best.nll), float(mapdp_core.negative_log_joint(points, bnp.DP(1.0), family)), rtol=1e-12)
    trace = np.asarray(best.nll_trace)[: int(best.n_iter) + 1]
    assert np.all(np.diff(trace) <= 1e-12 * np.abs(trace[:-1]))


def test_fits_of_nearby_sizes_share_one_program():
    """``MAPDP()`` pads the data to ``mapdp.padded_size(n)`` rows: fits of 150, 160 and 145
    points (one size class) compile the fit once; with ``init_size=145`` the subsample's fit
    is that program again (only the sweeps over all points compile); a new size class
    compiles the fit again."""
    X, _, _ = _uci(load_wine)
    sizes = [mapdp_core.padded_size(m) for m in (150, 160, 145, 170)]
    assert sizes[:3] == [160] * 3 and sizes[3] == 176
    before = mapdp_core.fit._cache_size()
    fits = [MAPDP(random_state=0).fit(X[:m]) for m in (150, 160, 145)]
    one = mapdp_core.fit._cache_size()
    assert one - before <= 1
    assert [f.labels_.shape for f in fits] == [(150,), (160,), (145,)]
    assert MAPDP(random_state=0, init_size=145).fit(X[:170]).labels_.shape == (170,)
    assert mapdp_core.fit._cache_size() - one == 1
    MAPDP(random_state=0).fit(X[:170])
    assert mapdp_core.fit._cache_size() - one == 2


def test_padded_size():
    assert [mapdp_core.padded_size(m) for m in (1, 128, 129, 144, 145, 1000, 10**6)] == [
        128, 128, 144, 144, 160, 1024, 1048576]
    for m in range(1, 5000):
        rows = mapdp_core.padded_size(m)
        assert m <= rows <= max(128, m + m // 8)
