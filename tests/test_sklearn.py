"""scikit-learn's contract, tested by scikit-learn's own suite.

``parametrize_with_checks`` runs every check of ``check_estimator`` on both estimators.
One entry is expected to fail, for a reason outside the estimators' code (``EXPECTED``).
The rest: what a user of scikit-learn does with an estimator (``Pipeline``,
``GridSearchCV`` on the default score, ``clone``, ``get_params``/``set_params``, ``repr``,
pickling).
"""

from __future__ import annotations

import functools
import pickle

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.model_selection import GridSearchCV, KFold
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.utils.estimator_checks import parametrize_with_checks

import jaxbnp as bnp

#: short chains: the checks fit dozens of times on small data
DPM = bnp.DirichletProcessMixture(num_warmup=5, num_samples=10, progress_bar=False)
#: a likelihood with its cluster parameters sampled (Neal's Algorithm 8; the default
#: likelihood, diagonal Gaussian clusters with a mean and a scale each)
PLATE = bnp.DirichletProcessMixture(method="auxiliary", num_warmup=5, num_samples=10, progress_bar=False)
ESTIMATORS = (bnp.MAPDP(), DPM, PLATE)

#: checks that cannot pass as they are: none
EXPECTED: dict = {}

_ARRAY_API = """
import sys, jax, numpy as np, jaxbnp as bnp
from sklearn.utils.estimator_checks import check_array_api_input
for spec in sys.argv[1:]:
    name, method = spec.split(":")
    est = bnp.MAPDP() if name == "MAPDP" else bnp.DirichletProcessMixture(
        method=method, num_warmup=5, num_samples=10, progress_bar=False)
    try:
        check_array_api_input(type(est).__name__, est, "numpy")
        print("RESULT", spec, "PASSED", flush=True)
    except ValueError as exc:
        print("RESULT", spec, "ValueError", exc, flush=True)
"""


def _spec(estimator) -> str:
    return f"{type(estimator).__name__}:{getattr(estimator, 'method', '')}"


@functools.lru_cache(maxsize=1)
def _array_api_results() -> dict:
    """``check_array_api_input`` of the three estimators, in one subprocess with
    ``SCIPY_ARRAY_API=1`` (scikit-learn skips it without that variable, which must be set
    before scipy is imported; setting it for the whole suite would change scipy for every
    test): ``{spec: "PASSED" or the error}``. All pass (DirichletProcessMixture since its
    default family standardises the columns and shrinks the covariance: before, on
    make_classification's collinear columns in float32, it raised)."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, SCIPY_ARRAY_API="1", JAX_PLATFORMS="cpu")
    env.pop("JAX_ENABLE_X64", None)
    specs = [_spec(e) for e in ESTIMATORS]
    out = subprocess.run([sys.executable, "-c", _ARRAY_API, *specs], env=env, capture_output=True,
                         text=True, timeout=600)
    results = {}
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            _, spec, result = line.split(" ", 2)
            results[spec] = result
    assert set(results) == set(specs), (out.stdout[-2000:], out.stderr[-3000:])
    return results


def _array_api_check(estimator):
    assert _array_api_results()[_spec(estimator)] == "PASSED", _array_api_results()


# the checks fit on random noise too, where one cluster is the right answer (and MAP-DP warns)
@pytest.mark.filterwarnings("ignore::jaxbnp.errors.SingleClusterWarning")
@parametrize_with_checks(list(ESTIMATORS), expected_failed_checks=lambda est: EXPECTED)
def test_check_estimator(estimator, check):
    if getattr(check, "func", check).__name__ == "check_array_api_input":
        return _array_api_check(estimator)
    check(estimator)


X = np.r_[np.random.default_rng(0).normal(-4.0, 1.0, (40, 2)), np.random.default_rng(1).normal(4.0, 1.0, (40, 2))]


@pytest.mark.parametrize("estimator", list(ESTIMATORS),
                         ids=["MAPDP", "DirichletProcessMixture", "DirichletProcessMixture-auxiliary"])
def test_pipeline_grid_search_clone_pickle(estimator):
    pipe = make_pipeline(StandardScaler(), clone(estimator)).fit(X)
    alone = clone(estimator).fit(StandardScaler().fit_transform(X))
    np.testing.assert_array_equal(pipe[-1].labels_, alone.labels_)
    np.testing.assert_array_equal(pipe.fit_predict(X), alone.labels_)
    assert pipe.score(X) == pytest.approx(alone.score(StandardScaler().fit_transform(X)))

    name = "alpha" if isinstance(estimator, bnp.MAPDP) else "measure"
    grid = [0.5, 2.0] if name == "alpha" else [bnp.DP(0.5), bnp.DP(2.0)]
    cv = KFold(2, shuffle=True, random_state=0)
    search = GridSearchCV(clone(estimator), {name: grid}, cv=cv).fit(X)
    # the default score is the mean held-out log predictive density
    fold = next(cv.split(X))
    best = clone(estimator).set_params(**{name: search.best_params_[name]})
    assert np.isfinite(search.best_score_)
    assert search.cv_results_["split0_test_score"][grid.index(search.best_params_[name])] == \
        pytest.approx(best.fit(X[fold[0]]).score(X[fold[1]]), rel=1e-6)

    copy = clone(estimator)
    assert copy.get_params() == estimator.get_params() and copy is not estimator
    assert repr(copy).startswith(type(estimator).__name__ + "(")
    fitted = clone(estimator).fit(X)
    restored = pickle.loads(pickle.dumps(fitted))
    np.testing.assert_array_equal(restored.labels_, fitted.labels_)
    np.testing.assert_allclose(restored.score_samples(X[:5]), fitted.score_samples(X[:5]))


def test_unknown_parameter_and_unfitted_errors():
    with pytest.raises(ValueError, match="Invalid parameter"):
        bnp.MAPDP().set_params(bogus=1)
    with pytest.raises(bnp.NotFittedError):
        bnp.MAPDP().predict(X)
    with pytest.raises(bnp.NotFittedError):
        DPM.predict(X)
