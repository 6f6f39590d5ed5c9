"""DirichletProcessMixture: fitting, the posterior predictive, scikit-learn compatibility, errors.

Compilation dominates the cost (one sampler program per data shape and
settings), so the tests share ``SETTINGS`` and the ``(50, 2)`` shape that
scikit-learn's ``check_clustering`` also uses.
"""

from __future__ import annotations

import functools
import re

import jax
import numpy as np
import pandas as pd
import pytest
from sklearn.metrics import adjusted_rand_score
from sklearn.utils.estimator_checks import estimator_checks_generator

import jaxbnp as bnp
from jaxbnp import metrics
from jaxbnp.estimators import DirichletProcessMixture, NotFittedError

SETTINGS = dict(num_warmup=10, num_samples=10, random_state=0)


def _blobs(n=50, seed=0):
    rng = np.random.default_rng(seed)
    centres = np.array([[-6.0, 0.0], [6.0, 0.0], [0.0, 8.0]])
    y = np.arange(n) % 3
    return centres[y] + 0.7 * rng.normal(size=(n, 2)), y


@pytest.fixture(scope="module")
def fitted():
    X, y = _blobs()
    return X, y, DirichletProcessMixture(**SETTINGS).fit(X)


# ----------------------------------------------------------------------------- fitting
def test_fit_recovers_the_blobs_and_sets_attributes(fitted):
    X, y, dpm = fitted
    assert adjusted_rand_score(y, dpm.labels_) == 1.0
    assert dpm.n_clusters_ == 3 and dpm.labels_.dtype == np.int64
    post = dpm.posterior_samples_
    assert post["labels"].shape == (2, 10, 50) and post["log_joint"].shape == (2, 10)
    np.testing.assert_array_equal(post["num_clusters"], metrics.count_clusters(post["labels"]))
    np.testing.assert_array_equal(dpm.labels_, metrics.point_estimate(post["labels"]))
    assert dpm.n_features_in_ == 2 and dpm.capacity_ == 50
    assert isinstance(dpm.family_, bnp.NormalWishart) and isinstance(dpm.measure_, bnp.DP)


def test_same_seed_same_draws_and_dataframe_input(fitted):
    X, _, dpm = fitted
    frame = pd.DataFrame(X, columns=["a", "b"])
    again = DirichletProcessMixture(**SETTINGS).fit(frame)
    for key in ("labels", "log_joint"):
        np.testing.assert_array_equal(again.posterior_samples_[key], dpm.posterior_samples_[key])
    assert list(again.feature_names_in_) == ["a", "b"]
    with pytest.warns(UserWarning, match="feature names"):  # scikit-learn's warning
        np.testing.assert_array_equal(again.predict(frame), again.predict(X))
    with pytest.raises(ValueError, match="feature names"):
        again.predict(frame[["b", "a"]])


def test_progress_bar_reports_without_changing_the_draws(fitted, capsys, monkeypatch):
    """With a bar the run is cut into compiled blocks (the tqdm bar advances between them);
    the draws equal those of the one-block run without a bar."""
    X, _, dpm = fitted
    shown = DirichletProcessMixture(**SETTINGS, progress_bar=True).fit(X)
    err = capsys.readouterr().err
    assert "splitmerge (capacity 50)" in err and "/20" in err, err
    for key in ("labels", "log_joint", "num_clusters"):
        np.testing.assert_array_equal(shown.posterior_samples_[key], dpm.posterior_samples_[key])
    # auto: quiet when CI is set or standard error is not a terminal (as under pytest)
    from jaxbnp._progress import resolve

    monkeypatch.delenv("JAXBNP_PROGRESS", raising=False)
    monkeypatch.setenv("CI", "true")
    assert resolve(None) is False
    monkeypatch.delenv("CI")
    assert resolve(None) is False  # pytest captures stderr: not a terminal
    monkeypatch.setenv("JAXBNP_PROGRESS", "1")
    assert resolve(None) is True
    DirichletProcessMixture(**SETTINGS, progress_bar=None).fit(X)  # compiled runners reused
    assert "splitmerge" in capsys.readouterr().err
    monkeypatch.setenv("JAXBNP_PROGRESS", "0")
    DirichletProcessMixture(**SETTINGS).fit(X)
    assert capsys.readouterr().err == ""


def test_default_family_does_not_depend_on_the_units_and_takes_constant_columns(fitted):
    """The default fits in standardised coordinates (``jaxbnp._defaults``): the blobs in other
    units (a column times 1e-3 with an offset of 1e3, the other times 1e3) give the same draws,
    ``family_`` is the prior in those units, densities carry the Jacobian; a constant column
    (singular sample covariance) fits too (Ledoit-Wolf covariance)."""
    X, y, dpm = fitted
    scale, offset = np.array([1e-3, 1e3]), np.array([1e3, 0.0])
    moved = DirichletProcessMixture(**SETTINGS).fit(X * scale + offset)
    np.testing.assert_array_equal(moved.posterior_samples_["labels"], dpm.posterior_samples_["labels"])
    np.testing.assert_allclose(np.asarray(moved.family_.m0), np.asarray(dpm.family_.m0) * scale + offset)
    np.testing.assert_allclose(np.asarray(moved.family_.psi),
                               np.asarray(dpm.family_.psi) * np.outer(scale, scale), rtol=1e-9)
    points = np.array([[-6.0, 0.5], [30.0, -30.0]])
    np.testing.assert_allclose(moved.score_samples(points * scale + offset),
                               dpm.score_samples(points) - np.log(scale).sum(), rtol=1e-9)
    np.testing.assert_allclose(moved.predict_proba(points * scale + offset), dpm.predict_proba(points),
                               rtol=1e-7, atol=1e-12)
    flat = np.column_stack([X[:, 0], np.full(len(X), 5.0)])
    with pytest.raises(ValueError, match="singular"):
        bnp.NormalWishart.from_data(flat)
    one_column = DirichletProcessMixture(**SETTINGS).fit(flat)
    assert np.isfinite(one_column.score(flat))
    assert adjusted_rand_score(y, one_column.labels_) == 1.0  # x alone (-6, 0, 6) tells them apart


def test_default_full_prior_is_the_papers_with_a_vague_prior_on_the_means():
    """The default full prior (``jaxbnp._defaults.full_prior``, also ``jaxbnp cluster
    --family normal-wishart``) is the tgMCMC paper's Normal-Wishart on standardised columns
    with ``r = 1/n`` instead of 0.1 (docs/mathematics.md §2)."""
    from jaxbnp import _defaults
    from jaxbnp.cli import _make_family

    rng = np.random.default_rng(5)
    Z = rng.normal(size=(40, 3))
    paper = bnp.NormalWishart.from_data(Z, shrinkage="ledoit-wolf")
    for family in (_defaults.default_family(Z), _make_family("normal-wishart", Z)):
        assert isinstance(family, bnp.NormalWishart)
        assert float(family.r) == pytest.approx(1.0 / 40) and float(paper.r) == pytest.approx(0.1)
        assert float(family.nu) == float(paper.nu)
        np.testing.assert_allclose(np.asarray(family.psi), np.asarray(paper.psi))
        np.testing.assert_allclose(np.asarray(family.m0), np.asarray(paper.m0))


def test_default_family_is_diagonal_with_fewer_points_than_covariance_entries():
    """Below ``n = D (D + 1) / 2`` points the default prior is the diagonal NormalGamma
    (``jaxbnp._defaults.default_family``, MAPDP()'s rule), at or above it the full
    NormalWishart; the diagonal prior in the data's units (``family_``) is the same model:
    the clusters' log marginals of ``X`` are those of the standardised ``Z`` minus
    ``n_c Σ log s``, and moved units give the same draws."""
    from jaxbnp import _defaults

    rng = np.random.default_rng(3)
    y = np.arange(20) % 2
    X = rng.normal(size=(20, 6)) + 6.0 * y[:, None]  # 20 points, 21 covariance entries
    assert isinstance(_defaults.default_family(X), bnp.NormalGamma)
    assert isinstance(_defaults.default_family(X[:, :5]), bnp.NormalWishart)  # 15 entries
    assert isinstance(_defaults.default_family(np.r_[X, X[:1]]), bnp.NormalWishart)  # 21 points
    dpm = DirichletProcessMixture(**SETTINGS).fit(X)
    assert isinstance(dpm.family_, bnp.NormalGamma) and adjusted_rand_score(y, dpm.labels_) == 1.0
    shift, scale = _defaults.standardisation(X)
    Z = (X - shift) / scale
    on_z = _defaults.default_family(Z)
    np.testing.assert_allclose(np.asarray(dpm.family_.m0), shift + scale * np.asarray(on_z.m0))
    np.testing.assert_allclose(np.asarray(dpm.family_.b0), scale**2 * np.asarray(on_z.b0))
    for members in (y == 0, y == 1, np.arange(20) < 3):
        stats_x = jax.tree.map(lambda a: a[members].sum(0), dpm.family_.host_point_stats(X))
        stats_z = jax.tree.map(lambda a: a[members].sum(0), on_z.host_point_stats(Z))
        np.testing.assert_allclose(dpm.family_.host_log_marginal(stats_x),
                                   on_z.host_log_marginal(stats_z) - members.sum() * np.log(scale).sum(),
                                   rtol=1e-10)
    units = np.array([1e-3, 1e3, 1.0, 2.0, 5.0, 1e2])
    moved = DirichletProcessMixture(**SETTINGS).fit(X * units + 1e3)
    np.testing.assert_array_equal(moved.posterior_samples_["labels"], dpm.posterior_samples_["labels"])
    np.testing.assert_allclose(moved.score_samples(X[:3] * units + 1e3),
                               dpm.score_samples(X[:3]) - np.log(units).sum(), rtol=1e-8)


# ----------------------------------------------------------------------------- prediction
def _predictive_by_marginal_ratios(X, dpm, x):
    """Per draw and option (each cluster, then a new one): ``log p(x, option | X, Π_t)`` as a
    ratio of marginal likelihoods times the DP's prior predictive weight (docs/mathematics.md §1-2):
    ``log(n_j / (n + α)) + log P(X_j ∪ x) − log P(X_j)`` and ``log(α / (n + α)) + log P(x)``,
    in NumPy (the family's host formulas), not through the predictive t densities."""
    family, alpha, n = dpm.family_, float(dpm.measure_.alpha), X.shape[0]
    draws = dpm.posterior_samples_["labels"].reshape(-1, n)
    k_max = int(draws.max()) + 1
    points = family.host_point_stats(X)
    new = family.host_point_stats(x[None])
    total = lambda stats, mask: jax.tree.map(lambda a: a[mask].sum(0), stats)  # noqa: E731
    plus = lambda a, b: jax.tree.map(np.add, a, b)  # noqa: E731
    out = np.full((len(draws), k_max + 1), -np.inf)
    for t, d in enumerate(draws):
        for j in range(d.max() + 1):
            stats = total(points, d == j)
            gain = family.host_log_marginal(plus(stats, total(new, [True]))) - family.host_log_marginal(stats)
            out[t, j] = np.log((d == j).sum() / (n + alpha)) + gain
        out[t, k_max] = np.log(alpha / (n + alpha)) + family.host_log_marginal(total(new, [True]))
    return draws, out


def test_predictive_equals_marginal_likelihood_ratios(fitted):
    X, _, dpm = fitted
    points = np.array([[-6.0, 0.5], [1.0, 4.0], [30.0, -30.0]])
    log_density = dpm.score_samples(points)
    proba = dpm.predict_proba(points)
    for m, x in enumerate(points):
        draws, terms = _predictive_by_marginal_ratios(X, dpm, x)
        total = np.logaddexp.reduce(terms.ravel())
        assert log_density[m] == pytest.approx(total - np.log(len(draws)), rel=1e-9)
        expected = np.zeros(dpm.n_clusters_ + 1)
        for t, d in enumerate(draws):
            for j in range(d.max() + 1):  # draw cluster j -> estimate clusters by overlap
                members = dpm.labels_[d == j]
                expected[:-1] += np.exp(terms[t, j] - total) * np.bincount(members, minlength=dpm.n_clusters_) / len(members)
        expected[-1] = np.exp(np.logaddexp.reduce(terms[:, -1]) - total)
        np.testing.assert_allclose(proba[m], expected, rtol=1e-9, atol=1e-12)


def test_predict_predict_proba_score(fitted):
    X, _, dpm = fitted
    proba = dpm.predict_proba(X)
    assert proba.shape == (50, 4)
    np.testing.assert_allclose(proba.sum(1), 1.0, rtol=1e-12)
    np.testing.assert_array_equal(dpm.predict(X), dpm.labels_)
    far = np.array([[40.0, 40.0]])
    assert dpm.predict(far, allow_new=True)[0] == -1 and dpm.predict(far)[0] in range(3)
    centre = X[dpm.labels_ == dpm.labels_[0]].mean(0, keepdims=True)
    assert dpm.predict(centre, allow_new=True)[0] == dpm.labels_[0]
    assert dpm.score_samples(centre)[0] > dpm.score_samples(far)[0]
    assert dpm.score(X[:7]) == pytest.approx(dpm.score_samples(X[:7]).mean())
    # blocks of 8 and 64 points give the same values as one point at a time
    one_by_one = np.concatenate([dpm.score_samples(X[i:i + 1]) for i in range(10)])
    np.testing.assert_allclose(dpm.score_samples(X[:10]), one_by_one, rtol=1e-12)


# ----------------------------------------------------------------------------- errors
@pytest.mark.parametrize(
    "params, X, error, match",
    [
        ({"method": "nuts"}, None, ValueError, "method must be one of"),
        ({"measure": 1.0}, None, ValueError, "measure must be"),
        ({"family": "normal"}, None, ValueError, "family must be"),
        ({"num_samples": 0}, None, ValueError, "num_samples must be an integer >= 1"),
        ({"num_chains": 1.5}, None, ValueError, "num_chains must be an integer"),
        ({"thinning": True}, None, ValueError, "thinning"),
        ({"capacity": 0}, None, ValueError, "capacity"),
        ({"point_estimate": "map"}, None, ValueError, "point_estimate"),
        ({"method": "gibbs", "method_options": {"num_split_merge": 2}}, None, ValueError,
         "not options of method='gibbs'"),
        ({"method": "mapdp", "measure": bnp.NGGP(1.0, 0.5)}, None, ValueError, "DP and PitmanYor"),
        ({"method": "tgmcmc", "measure": bnp.PitmanYor(1.0, 0.2)}, None, ValueError, "DP and NGGP"),
        ({"random_state": "seed"}, None, ValueError, "random_state"),
        ({"progress_bar": "yes"}, None, ValueError, "progress_bar must be True, False or None"),
        ({}, np.array([[0.0, np.nan], [1.0, 2.0]]), ValueError, "contains (NaN|infinity)"),
        ({}, np.array([[0.0, np.inf], [1.0, 2.0]]), ValueError, "contains (NaN|infinity)"),
        ({}, np.zeros(5), ValueError, "Reshape your data"),
        ({"init": "kmeans"}, None, ValueError, "init must be 'kmeans\\+\\+', 'prior', 'one' or None"),
        ({"init_clusters": 0}, None, ValueError, "init_clusters must be"),
        ({"num_warmup": -1}, None, ValueError, "num_warmup must be"),
        ({}, np.zeros((0, 2)), ValueError, "0 sample"),
        ({}, np.zeros((4, 0)), ValueError, "0 feature"),
        ({}, np.ones((1, 2)), ValueError, "1 sample"),
        ({}, np.ones((3, 2), complex), ValueError, "Complex data not supported"),
        ({}, np.array([["a", "b"], ["c", "d"]], dtype=object), ValueError, "could not convert"),
        ({"family": bnp.NormalWishart(np.zeros(3), 1.0, 5.0, np.eye(3))}, None, ValueError,
         "psi is 3 x 3 but the data have 2 columns"),
    ],
)
def test_bad_parameters_and_data_raise_before_sampling(params, X, error, match):
    X = np.random.default_rng(0).normal(size=(6, 2)) if X is None else X
    with pytest.raises(error, match=match):
        DirichletProcessMixture(**params).fit(X)


def test_sparse_input_and_unfitted_use_raise():
    from scipy import sparse

    with pytest.raises(TypeError, match="(?i)sparse"):  # scikit-learn's message
        DirichletProcessMixture().fit(sparse.csr_matrix(np.eye(3)))
    for method in ("predict", "predict_proba", "score_samples"):
        with pytest.raises(NotFittedError, match="not fitted"):
            getattr(DirichletProcessMixture(), method)(np.zeros((2, 2)))


def test_wrong_number_of_features_after_fit(fitted):
    _, _, dpm = fitted
    for method in ("predict", "predict_proba", "score_samples", "score"):
        with pytest.raises(ValueError, match=re.escape("X has 3 features, but DirichletProcessMixture is expecting 2")):
            getattr(dpm, method)(np.zeros((4, 3)))


# ----------------------------------------------------------------------------- scikit-learn
#: scikit-learn's checks that fit on data of shapes this file already compiled for
#: ((50, 2) and check_clustering's (55, 2)) or that need no fit. The other checks each
#: compile the sampler for another data shape (about 13 shapes, ~150 s on a 2-core CPU);
#: they pass too (run ``check_estimator`` by hand to see), but do not fit the suite's time budget.
_CHEAP_CHECKS = {
    "check_estimator_cloneable", "check_estimator_tags_renamed", "check_valid_tag_types",
    "check_estimator_repr", "check_no_attributes_set_in_init", "check_estimators_unfitted",
    "check_do_not_raise_errors_in_init_or_set_params", "check_mixin_order", "check_complex_data",
    "check_estimators_empty_data_messages", "check_estimator_sparse_tag",
    "check_estimator_sparse_array", "check_estimator_sparse_matrix",
    "check_clusterer_compute_labels_predict", "check_clustering",
    "check_estimators_partial_fit_n_features", "check_non_transformer_estimators_n_iter",
    "check_parameters_default_constructible", "check_fit2d_1sample", "check_get_params_invariance",
    "check_set_params", "check_fit1d",
}


def _check_name(check):
    return check.func.__name__ if isinstance(check, functools.partial) else check.__name__


def _sklearn_checks():
    estimator = DirichletProcessMixture(**SETTINGS)
    out = []
    for est, check in estimator_checks_generator(estimator, legacy=True, mark=None):
        name = _check_name(check)
        if name in _CHEAP_CHECKS:
            out.append(pytest.param(est, check, id=name + ("-readonly" if "readonly" in str(check) else "")))
    return out


@pytest.mark.parametrize("estimator, check", _sklearn_checks())
def test_scikit_learn_checks(estimator, check):
    check(estimator)


def test_the_cheap_checks_are_all_found():
    names = {p.id.split("-")[0] for p in _sklearn_checks()}
    assert names == _CHEAP_CHECKS
