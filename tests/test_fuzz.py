"""Property tests (hypothesis) over the public surface: estimators, CLI, distributions, priors.

The contract: every call either returns finite results (valid labels: integers in range,
one per row; finite log densities; probabilities summing to 1) or raises ``ValueError`` /
``TypeError`` whose message names the offending argument or condition. Never NaN/inf in a
result, never another exception type, never a process abort. The CLI ends a bad file in
``SystemExit`` with a message and writes one valid label per row for a good one.

Inputs: random shapes, dtypes (int, bool, object, str, complex, float16/32/64), NaN, inf,
empty data, one point, constant columns, 1e30 and 1e-30 scales, duplicated points, more
columns than rows, wrong ndim, Python lists, strings, None; for constructors: negative,
zero, NaN, inf, bool, string, None and array-valued hyperparameters.

Cost: inputs that reach a compiled fit use a few fixed small shapes (n <= 30, d <= 4), so
each shape compiles once; inputs rejected on the host get hundreds of examples. Profiles are
``derandomize=True`` (reproducible) with ``deadline=None``. The last test prints the examples
run per test and the library calls made (``-s`` shows them).

Examples per test (``derandomize=True``, so every run draws the same ones):

====================================================  =====  ==========================
test                                                  runs   library calls (accepted)
====================================================  =====  ==========================
test_invalid_data_rejected_before_compiling            250   1606 (113)
test_mapdp_fit_predict                                  20     88 (51)
test_dpm_fit_predict                                    12     62 (10)
test_select_alpha                                        6      6 (6)
test_select_alpha_bad_args                             250    241 (0)
test_mapdp_bad_options                                 200    196 (10)
test_dpm_bad_options                                   209    200 (0)
test_measure_constructors                              250    250 (58)
test_family_constructors                               250    263 (26)
test_partition_log_prob                                156    208 (68)
test_conjugate_mixture_log_prob                        250    338 (111)
test_auxiliary_u_log_prob                               10     10 (4)
test_ddt_log_prob                                      150    170 (15)
test_cli_on_files                                       40     40 (9)
====================================================  =====  ==========================

About 60 s for the file on 2 shared cores (``-n 0``), most of it compiling the fits.
"""

from __future__ import annotations

import math
import warnings
from collections import Counter

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import jaxbnp as bnp
from jaxbnp.estimators import SingleClusterWarning

settings.register_profile(
    "fuzz-cheap", max_examples=250, deadline=None, derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "fuzz-fit", max_examples=25, deadline=None, derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
CHEAP = settings.get_profile("fuzz-cheap")
FIT = settings.get_profile("fuzz-fit")

EXAMPLES: Counter = Counter()  # examples run per test
COUNTS: Counter = Counter()  # library calls per group
OUTCOMES: Counter = Counter()

# ------------------------------------------------------------------------------ helpers
OK = (ValueError, TypeError)


def _assert_clear(exc: BaseException, *names: str) -> None:
    """A ValueError/TypeError whose message is non-empty and names one of ``names``."""
    assert isinstance(exc, OK), f"{type(exc).__name__}: {exc}"
    msg = str(exc)
    assert msg.strip(), f"empty {type(exc).__name__} message"
    low = msg.lower()
    assert any(n.lower() in low for n in names), f"message names none of {names}: {msg!r}"


def _call(test: str, fn, *names: str):
    """``(True, result)`` or ``(False, None)`` after checking a rejection's message."""
    COUNTS[test] += 1
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SingleClusterWarning)  # one cluster is legitimate
            out = fn()
    except OK as exc:
        _assert_clear(exc, *names)
        OUTCOMES[test, "rejected"] += 1
        return False, None
    OUTCOMES[test, "accepted"] += 1
    return True, out


DATA_WORDS = ("X", "data", "array", "shape", "feature", "sample", "numeric", "finite", "nan", "real",
              "complex", "empty", "dtype", "binary", "count", "covariance", "column")

# ------------------------------------------------------------------------------ data strategies
SCALES = (1.0, 1e30, 1e-30, 1e3)
SHAPES = ((1, 1), (2, 1), (5, 2), (12, 3), (7, 4), (3, 4))  # (3, 4): more columns than rows


@st.composite
def float_data(draw, shapes=SHAPES, scales=SCALES):
    """A valid-looking float array (maybe with constant columns / duplicated points)."""
    n, d = draw(st.sampled_from(shapes))
    seed = draw(st.integers(0, 2**16))
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    if n >= 4 and draw(st.booleans()):  # two groups
        X[: n // 2] += 6.0
    scale = draw(st.sampled_from(scales))
    X = X * scale
    tweak = draw(st.sampled_from(["none", "none", "constant_col", "duplicates", "all_same", "ints"]))
    if tweak == "constant_col":
        X[:, 0] = 3.0 * scale
    elif tweak == "duplicates":
        X[n // 2:] = X[0]
    elif tweak == "all_same":
        X[:] = X[0]
    elif tweak == "ints":
        X = np.round(X / scale * 3).astype(np.int64)
    if scale == 1.0 and tweak != "ints":
        X = X.astype(draw(st.sampled_from([np.float64, np.float32, np.float16, np.int32, bool])))
    elif draw(st.booleans()):
        X = X.tolist()  # a Python list
    return X


@st.composite
def bad_data(draw):
    """Anything a user may pass as X; most of it invalid."""
    kind = draw(st.sampled_from([
        "nan", "inf", "neg_inf", "empty_rows", "empty_cols", "empty_1d", "1d", "3d", "0d",
        "object", "object_mixed", "str", "str_array", "complex", "none", "list", "ragged_list",
        "bool", "int", "float16", "float32", "dict", "nested_none",
    ]))
    n, d = draw(st.sampled_from(SHAPES))
    rng = np.random.default_rng(draw(st.integers(0, 1000)))
    X = rng.normal(size=(n, d))
    if kind == "nan":
        X[rng.integers(n), rng.integers(d)] = np.nan
        return X
    if kind in ("inf", "neg_inf"):
        X[rng.integers(n), rng.integers(d)] = np.inf if kind == "inf" else -np.inf
        return X
    return {
        "empty_rows": lambda: np.zeros((0, d)),
        "empty_cols": lambda: np.zeros((n, 0)),
        "empty_1d": lambda: np.zeros(0),
        "1d": lambda: X[:, 0],
        "3d": lambda: X[None],
        "0d": lambda: np.float64(1.0),
        # numbers in an object array are valid X and get fitted: one shape, so that the fits
        # compile once (the other shapes are fitted in the tests of valid data below)
        "object": lambda: rng.normal(size=(5, 2)).astype(object),
        "object_mixed": lambda: np.array([[1.0, "a"], [2.0, None]], dtype=object),
        "str": lambda: "data.csv",
        "str_array": lambda: X.astype(str),
        "complex": lambda: X + 1j,
        "none": lambda: None,
        "list": lambda: X.tolist(),
        "ragged_list": lambda: [[1.0, 2.0], [3.0]],
        "bool": lambda: X > 0,
        "int": lambda: np.round(X * 3).astype(np.int32),
        "float16": lambda: X.astype(np.float16),
        "float32": lambda: X.astype(np.float32),
        "dict": lambda: {"a": 1},
        "nested_none": lambda: [[None, 1.0], [2.0, 3.0]],
    }[kind]()


def _check_labels(labels, n, k=None):
    labels = np.asarray(labels)
    assert labels.shape == (n,), labels.shape
    assert np.issubdtype(labels.dtype, np.integer), labels.dtype
    assert labels.min() >= 0
    if k is not None:
        assert labels.max() < k
        assert len(np.unique(labels)) == k


def _check_proba(P, m, k):
    P = np.asarray(P)
    assert P.shape == (m, k + 1), (P.shape, m, k)
    assert np.all(np.isfinite(P)) and np.all(P >= -1e-12)
    np.testing.assert_allclose(P.sum(axis=1), 1.0, rtol=1e-6, atol=1e-6)


# ------------------------------------------------------------------------------ check_data and invalid X
@CHEAP
@given(X=bad_data())
def test_invalid_data_rejected_before_compiling(X):
    """Bad X: MAPDP.fit, DirichletProcessMixture.fit, select_alpha and every from_data raise
    ValueError/TypeError naming X (rejected on the host: nothing compiles)."""
    EXAMPLES["test_invalid_data_rejected_before_compiling"] += 1
    fams = (bnp.NormalGamma, bnp.NormalWishart, bnp.BetaBernoulli, bnp.DirichletMultinomial)
    valid = False
    arr = None
    try:
        arr = np.asarray(X, dtype=float)
        valid = (arr.ndim == 2 and arr.size > 0 and np.all(np.isfinite(arr))
                 and not np.iscomplexobj(np.asarray(X)) and np.asarray(X).dtype.kind in "biuf")
    except Exception:
        pass
    for fam in fams:
        ok, f = _call("invalid_data", lambda: fam.from_data(X), *DATA_WORDS)
        if ok:
            assert isinstance(f, fam)
            assert valid, f"{fam.__name__}.from_data accepted {X!r}"
    if valid:
        return  # fitted in the tests below
    # the estimators take object arrays of numbers (scikit-learn's contract, check_dtype_object)
    dpm_valid = arr is not None and np.asarray(X).dtype == object and arr.ndim == 2 and arr.size > 0 \
        and bool(np.all(np.isfinite(arr)))
    for fit, may in ((lambda: bnp.MAPDP().fit(X), dpm_valid),
                     (lambda: bnp.DirichletProcessMixture(family=bnp.NormalGamma(), num_warmup=1,
                                                          num_samples=2).fit(X), dpm_valid),
                     (lambda: bnp.select_alpha(X, [1.0]), False)):
        ok, _ = _call("invalid_data", fit, *DATA_WORDS)
        assert may or not ok, f"accepted invalid X {X!r}"


# ------------------------------------------------------------------------------ estimators on real data
def _check_mapdp(est, X):
    n = len(X)
    _check_labels(est.labels_, n, est.n_clusters_)
    assert math.isfinite(est.nll_) and np.all(np.isfinite(est.nll_trace_))
    Xq = np.asarray(X, float)[: min(n, 3)]
    ok, pred = _call("mapdp", lambda: est.predict(Xq), *DATA_WORDS)
    assert ok
    assert pred.shape == (len(Xq),) and pred.min() >= 0 and pred.max() < est.n_clusters_
    _check_proba(est.predict_proba(Xq), len(Xq), est.n_clusters_)
    assert np.all(np.isfinite(est.score_samples(Xq)))


@pytest.mark.filterwarnings("ignore::jaxbnp.estimators.SingleClusterWarning")
@settings(FIT, max_examples=20)
@given(X=float_data(), alpha=st.sampled_from([1e-3, 1.0, 50.0]),
       family=st.sampled_from(["default", "ng", "nw"]), split=st.booleans())
def test_mapdp_fit_predict(X, alpha, family, split):
    EXAMPLES["test_mapdp_fit_predict"] += 1
    fam = {"default": lambda: None, "ng": lambda: bnp.NormalGamma.from_data(X),
           "nw": lambda: bnp.NormalWishart.from_data(X)}[family]
    ok, f = _call("mapdp", fam, *DATA_WORDS)
    if not ok:
        return
    ok, est = _call("mapdp", lambda: bnp.MAPDP(alpha=alpha, family=f, split_moves=split).fit(X),
                    *DATA_WORDS)
    if not ok:  # NormalWishart refuses data too large for the working precision
        assert family == "nw", "MAP-DP rejected valid data"
        return
    _check_mapdp(est, X)
    # a query with the wrong width or NaN is rejected
    d = np.asarray(X).shape[1]
    ok, _ = _call("mapdp", lambda: est.predict(np.zeros((2, d + 1))), "feature", "column", "X")
    assert not ok
    ok, _ = _call("mapdp", lambda: est.predict_proba(np.full((1, d), np.nan)), *DATA_WORDS)
    assert not ok


@pytest.mark.filterwarnings("ignore::jaxbnp.estimators.SingleClusterWarning")
@settings(FIT, max_examples=12)
@given(X=float_data(shapes=((2, 1), (5, 2), (12, 3)), scales=(1.0, 1e30, 1e-30)),
       measure=st.sampled_from(["dp", "py"]), method=st.sampled_from(["gibbs", "mapdp"]),
       family=st.sampled_from(["ng", "ng", "default"]))
def test_dpm_fit_predict(X, measure, method, family):
    EXAMPLES["test_dpm_fit_predict"] += 1
    m = bnp.DP(1.0) if measure == "dp" else bnp.PitmanYor(1.0, 0.3)
    est = bnp.DirichletProcessMixture(method=method, measure=m,
                                      family=bnp.NormalGamma.from_data(X) if family == "ng" else None,
                                      num_warmup=1, num_samples=2, random_state=0, progress_bar=False)
    Xa = np.asarray(X, float)
    ok, est = _call("dpm", lambda: est.fit(X), *DATA_WORDS)
    if not ok:  # only the default family may refuse: one point, or every column constant
        from jaxbnp import _defaults  # (it standardises the columns: no scale is too large)

        shift, scale = _defaults.standardisation(Xa)
        Z = (Xa - shift) / scale
        assert family == "default" and (len(Xa) < 2 or not np.any(Z.std(axis=0) > 0.5)), (X, m)
        return
    for bad in (np.full((1, Xa.shape[1]), np.nan), np.zeros((1, Xa.shape[1] + 1)), np.zeros(Xa.shape[1]),
                None, "x"):
        ok, _ = _call("dpm", lambda: est.predict(bad), *DATA_WORDS)
        assert not ok
    n = len(X)
    _check_labels(est.labels_, n, est.n_clusters_)
    assert np.all(np.isfinite(est.posterior_samples_["log_joint"]))
    Xq = np.asarray(X, float)[:2]
    _check_proba(est.predict_proba(Xq), len(Xq), est.n_clusters_)
    pred = est.predict(Xq)
    assert pred.shape == (len(Xq),) and pred.min() >= 0 and pred.max() < est.n_clusters_
    new = est.predict(Xq, allow_new=True)
    assert new.shape == (len(Xq),) and new.min() >= -1 and new.max() < est.n_clusters_
    assert np.all(np.isfinite(est.score_samples(Xq)))
    assert np.array_equal(est.fit_predict(X), est.labels_)


@pytest.mark.filterwarnings("ignore::jaxbnp.estimators.SingleClusterWarning")
@settings(FIT, max_examples=6)
@given(X=float_data(shapes=((5, 2), (12, 3))),
       alphas=st.lists(st.sampled_from([0.1, 1.0, 10.0]), min_size=1, max_size=2),
       method=st.sampled_from(["nll", "heldout"]))
def test_select_alpha(X, alphas, method):
    EXAMPLES["test_select_alpha"] += 1
    ok, out = _call("select_alpha", lambda: bnp.select_alpha(X, alphas, method=method, n_folds=2,
                                                             progress_bar=False), *DATA_WORDS)
    assert ok
    best, scores = out
    assert best in alphas and scores.shape == (len(alphas),) and np.all(np.isfinite(scores))


@CHEAP
@given(alphas=st.sampled_from([[], [1.0, -1.0], [0.0], [np.nan], [np.inf], "abc", None, 1.0, [True], [[1.0]],
                               [1.0], [1.0, 2.0]]),
       method=st.sampled_from(["nll", "heldout", "bogus", None, 1]),
       n_folds=st.sampled_from([2, 1, 0, 100, 2.5, "3", None, True]))
def test_select_alpha_bad_args(alphas, method, n_folds):
    EXAMPLES["test_select_alpha_bad_args"] += 1
    X = np.random.default_rng(0).normal(size=(6, 2))
    legal = isinstance(alphas, list) and len(alphas) > 0 and all(
        isinstance(a, float) and math.isfinite(a) and a > 0 for a in alphas) and method in ("nll", "heldout") \
        and (method == "nll" or isinstance(n_folds, int) and not isinstance(n_folds, bool) and 2 <= n_folds <= 6)
    if legal:
        return  # fits: covered by test_select_alpha
    ok, _ = _call("select_alpha_args", lambda: bnp.select_alpha(X, alphas, method=method, n_folds=n_folds,
                                                                progress_bar=False),
                  "alpha", "method", "n_folds")
    assert not ok, (alphas, method, n_folds)


BAD_SCALARS = [0, -1, 0.0, -1.5, np.nan, np.inf, -np.inf, True, False, None, "1.0", "a",
               [1.0, 2.0], np.array([1.0, 2.0]), np.array([[1.0]]), 1 + 2j, 1.5]


@CHEAP
@given(name=st.sampled_from(["alpha", "n_restarts", "max_iter", "tol", "block_size", "mode",
                             "capacity", "random_state", "measure", "family", "init_size"]),
       value=st.sampled_from(BAD_SCALARS + ["batched", bnp.NGGP(1.0, 0.5), bnp.DP(1.0)]))
def test_mapdp_bad_options(name, value):
    """Bad constructor options are rejected by fit before anything compiles."""
    EXAMPLES["test_mapdp_bad_options"] += 1
    if name == "measure" and isinstance(value, bnp.DP) or name == "mode" and isinstance(value, str):
        return
    X = np.arange(8.0).reshape(4, 2)
    est = bnp.MAPDP(**{"max_iter": 2, name: value})
    valid_int = (isinstance(value, (int, np.integer)) and not isinstance(value, bool))
    legal = {"alpha": isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0
             and math.isfinite(value),
             "n_restarts": valid_int and value >= 1, "max_iter": valid_int and value >= 1,
             "tol": isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0
             and math.isfinite(value),
             "block_size": valid_int and value >= 1, "capacity": valid_int and value >= 1 or value is None,
             "init_size": valid_int and value >= 2 or value is None,
             "random_state": valid_int or value is None,
             "mode": False, "measure": value is None, "family": value is None}[name]
    ok, _ = _call("mapdp_options", lambda: est.fit(X), name)
    assert ok == legal, (name, value)


@CHEAP
@given(name=st.sampled_from(["num_chains", "num_warmup", "num_samples", "thinning", "capacity",
                             "random_state", "method", "point_estimate", "measure", "family",
                             "method_options", "init", "init_clusters"]),
       value=st.sampled_from(BAD_SCALARS + ["gibbs", {"bogus": 1}]))
def test_dpm_bad_options(name, value):
    EXAMPLES["test_dpm_bad_options"] += 1
    X = np.random.default_rng(0).normal(size=(4, 2))
    is_int = isinstance(value, (int, np.integer)) and not isinstance(value, bool)
    # num_warmup, num_samples, init: None is the method's default
    legal = {"num_chains": is_int and value >= 1, "num_warmup": value is None or is_int and value >= 0,
             "num_samples": value is None or is_int and value >= 1, "thinning": is_int and value >= 1,
             "init": value is None or isinstance(value, str) and value in ("kmeans++", "prior", "one"),
             "init_clusters": is_int and value >= 1,
             "capacity": value is None or is_int and value >= 1,
             "random_state": value is None or is_int,
             "method": isinstance(value, str) and value in ("gibbs", "splitmerge", "tgmcmc", "mapdp"),
             "point_estimate": isinstance(value, str) and value in ("vi", "binder"),
             "measure": value is None or isinstance(value, bnp.DP), "family": value is None,
             "method_options": value is None}[name]
    if legal:
        return  # would compile a fit: the fit tests cover valid settings
    kwargs = {"num_warmup": 1, "num_samples": 2, name: value}
    ok, _ = _call("dpm_options", lambda: bnp.DirichletProcessMixture(**kwargs).fit(X),
                  name.replace("_", ""), name, name.replace("_", " "))
    assert not ok, (name, value)


# ------------------------------------------------------------------------------ measures and families
HYPER = st.sampled_from(BAD_SCALARS + [0.3, 2.0, 1e-30, 1e30, np.float32(0.5), np.int64(3),
                                       np.array(0.5), jnp.array(0.5), jnp.array([0.5, 0.2])])


def _scalar_ok(v, lo=0.0, hi=None, lo_open=True):
    if isinstance(v, (bool, np.bool_, str)) or v is None or isinstance(v, (list, complex)):
        return False
    a = np.asarray(v)
    if a.ndim != 0 or not np.isfinite(a):
        return False
    x = float(a)
    if lo is not None and (x <= lo if lo_open else x < lo):
        return False
    return hi is None or x < hi


@CHEAP
@given(a=HYPER, b=HYPER, c=HYPER, which=st.sampled_from(["DP", "PY", "NGGP"]))
def test_measure_constructors(a, b, c, which):
    EXAMPLES["test_measure_constructors"] += 1
    ctor = {"DP": lambda: bnp.DP(a), "PY": lambda: bnp.PitmanYor(a, b),
            "NGGP": lambda: bnp.NGGP(a, b, c)}[which]
    ok, m = _call("measures", ctor, "alpha", "d", "sigma", "tau", "discount")
    legal = {"DP": _scalar_ok(a),
             "PY": _scalar_ok(b, 0.0, 1.0, lo_open=False) and _scalar_ok(a, -float(np.asarray(b)) if _scalar_ok(b, None) else 0.0),
             "NGGP": _scalar_ok(a) and _scalar_ok(b, 0.0, 1.0) and _scalar_ok(c)}[which]
    assert ok == legal, (which, a, b, c)
    if ok:
        counts = jnp.array([3, 1, 0, 2])
        u = 1.0 if which == "NGGP" else None
        assert np.isfinite(float(m.log_eppf(counts, u)))
        ex, new = m.gibbs_log_weights(counts, u)
        assert np.isfinite(float(new)) and np.all(np.isfinite(np.asarray(ex)[[0, 1, 3]]))


VEC = st.sampled_from(BAD_SCALARS + [0.5, 2.0, 1e-30, 1e30, np.array([0.5, 2.0]), np.ones((2, 2)),
                                     np.eye(2), np.array([[1.0, 2.0], [2.0, 1.0]]), np.zeros(2)])


def _vec_ok(v, positive, ndims=(0, 1)):
    if isinstance(v, (bool, np.bool_, str, complex)) or v is None:
        return False
    try:
        a = np.asarray(v, dtype=float)
    except (TypeError, ValueError):
        return False
    if a.ndim not in ndims or not np.all(np.isfinite(a)) or a.size == 0:
        return False
    if isinstance(v, list) and any(isinstance(x, bool) for x in v):
        return False
    return bool(np.all(a > 0)) if positive else True


@CHEAP
@given(p=st.lists(VEC, min_size=4, max_size=4), which=st.sampled_from(["NG", "NW", "BB", "DM"]))
def test_family_constructors(p, which):
    EXAMPLES["test_family_constructors"] += 1
    names = ("m0", "k0", "a0", "b0", "r", "nu", "psi", "beta", "a", "b", "shape", "length")
    ctor = {"NG": lambda: bnp.NormalGamma(*p), "NW": lambda: bnp.NormalWishart(*p),
            "BB": lambda: bnp.BetaBernoulli(p[0], p[1]), "DM": lambda: bnp.DirichletMultinomial(p[0])}
    ok, fam = _call("families", ctor[which], *names)
    if which == "NG":
        legal = (_vec_ok(p[0], False) and _vec_ok(p[1], True, (0,)) and _vec_ok(p[2], True, (0,))
                 and _vec_ok(p[3], True))
        if legal and np.ndim(p[0]) == 1 and np.ndim(p[3]) == 1:
            legal = np.shape(p[0]) == np.shape(p[3])
    elif which == "NW":
        legal = None  # many conditions (PD psi, nu > D - 1, shapes): just the contract
    elif which == "BB":
        legal = _vec_ok(p[0], True) and _vec_ok(p[1], True)
        if legal and np.ndim(p[0]) == 1 and np.ndim(p[1]) == 1:
            legal = np.shape(p[0]) == np.shape(p[1])
    else:
        legal = _vec_ok(p[0], True)
    if legal is not None:
        assert ok == legal, (which, p)
    if ok:  # a marginal of a small data set is finite (when the widths agree)
        d = {"NW": lambda: fam.psi.shape[-1]}.get(which, lambda: 2)()
        X = np.array([[1.0, 0.0] * d, [0.0, 1.0] * d])[:, :d] if which in ("BB", "DM") else \
            np.arange(2.0 * d).reshape(2, d)
        ok2, _ = _call("families", lambda: bnp.models.ConjugateMixture(fam, jnp.array([0, 0])).log_prob(X),
                       *names)
        if ok2:
            lp = bnp.models.ConjugateMixture(fam, jnp.array([0, 0])).log_prob(X)
            assert np.isfinite(float(lp)), (which, p, float(lp))


# ------------------------------------------------------------------------------ distributions
LABELS = st.sampled_from([[0, 0, 1], [2, 0, 1], [0, 1, 5], [-1, 0, 0], [0.5, 0, 1], [True, False, True],
                          [[0, 1, 1]], [0, 1], [], None, "abc", [np.nan, 0, 0], [0, 0, 0]])


def _labels_ok(v, n):
    if v is None or isinstance(v, str):
        return False
    a = np.asarray(v)
    if a.ndim < 1 or a.shape[-1] != n or a.dtype.kind not in "iu":
        return False
    return bool(np.all((a >= 0) & (a < n)))


@CHEAP
@given(labels=LABELS, which=st.sampled_from(["DP", "PY", "NGGP"]), u=st.sampled_from([None, 1.0, -1.0, np.nan]))
def test_partition_log_prob(labels, which, u):
    EXAMPLES["test_partition_log_prob"] += 1
    m = {"DP": bnp.DP(1.0), "PY": bnp.PitmanYor(1.0, 0.3), "NGGP": bnp.NGGP(1.0, 0.5)}[which]
    names = ("labels", "value", "u", "partition", "measure", "num_points", "integer", "shape")
    ok, d = _call("partition", lambda: bnp.Partition(m, 3, u=u), *names)
    if not ok:
        assert u is not None
        return
    ok, lp = _call("partition", lambda: d.log_prob(labels), *names)
    legal = _labels_ok(labels, 3) and (which != "NGGP" or u is None or (u is not None and u > 0))
    assert ok == legal, (labels, which, u)
    if ok:
        assert np.all(np.isfinite(np.asarray(lp)))


@CHEAP
@given(labels=LABELS, X=st.sampled_from(["ok", "nan", "wide", "short", "1d", "str", "none", "list"]),
       fam=st.sampled_from(["NG", "NW", "BB"]))
def test_conjugate_mixture_log_prob(labels, X, fam):
    EXAMPLES["test_conjugate_mixture_log_prob"] += 1
    f = {"NG": bnp.NormalGamma(), "NW": bnp.NormalWishart(np.zeros(2), 1.0, 3.0, np.eye(2)),
         "BB": bnp.BetaBernoulli()}[fam]
    base = np.array([[0.0, 1.0], [1.0, 1.0], [1.0, 0.0]])
    value = {"ok": base, "nan": np.where(base > 0, np.nan, 0.0), "wide": np.zeros((3, 3)),
             "short": base[:2], "1d": base[:, 0], "str": "abc", "none": None, "list": base.tolist()}[X]
    names = ("labels", "value", "X", "data", "shape", "column", "finite", "nan", "numeric", "binary")
    ok, d = _call("conjugate_mixture", lambda: bnp.ConjugateMixture(f, labels), *names)
    if not ok:
        return
    ok, lp = _call("conjugate_mixture", lambda: d.log_prob(value), *names)
    n = len(labels) if isinstance(labels, list) else -1
    rows = {"ok": 3, "list": 3, "short": 2, "wide": 3}.get(X, -2)
    legal = n > 0 and _labels_ok(labels, n) and rows == n and (X != "wide" or fam in ("NG", "BB"))
    if np.ndim(labels) != 1:
        legal = False  # ConjugateMixture takes one label vector
    assert ok == legal, (labels, X, fam)
    if ok:
        assert np.isfinite(float(lp))


@CHEAP
@given(u=st.sampled_from([1.0, 0.0, -1.0, np.nan, np.inf, 1e-30, 1e30, "a", None, jnp.array([1.0, 2.0])]))
def test_auxiliary_u_log_prob(u):
    EXAMPLES["test_auxiliary_u_log_prob"] += 1
    ok, lp = _call("auxiliary_u", lambda: bnp.AuxiliaryU().log_prob(u), "u", "positive", "value", "finite")
    legal = not isinstance(u, str) and u is not None and np.all(np.isfinite(np.asarray(u, float))) \
        and np.all(np.asarray(u, float) > 0)
    assert ok == legal, u
    if ok:
        assert np.all(np.isfinite(np.asarray(lp)))


@settings(CHEAP, max_examples=150)
@given(c=st.sampled_from(BAD_SCALARS + [0.5, 2.0, 1e-3]), n=st.sampled_from([1, 2, 4, 0, -1, 2.5, "3"]),
       sigma=st.sampled_from([1.0, 0.0, -1.0, np.nan, None, 1e-30, 1e30]),
       noise=st.sampled_from([0.0, 0.1, -0.1, np.nan, None]),
       X=st.sampled_from(["ok", "nan", "short", "1d", "huge"]))
def test_ddt_log_prob(c, n, sigma, noise, X):
    EXAMPLES["test_ddt_log_prob"] += 1
    from jaxbnp.models import ddt

    names = ("c", "num_points", "sigma", "noise", "X", "tree", "shape", "finite", "leaves")
    ok, dist = _call("ddt", lambda: bnp.DiffusionTree(c, n), *names)
    legal = _scalar_ok(c) and isinstance(n, int) and n >= 2
    assert ok == legal, (c, n)
    if not ok:
        return
    tree = ddt.comb_tree(n)
    ok, lp = _call("ddt", lambda: dist.log_prob(tree), *names)
    assert ok and np.isfinite(float(lp))
    ok, _ = _call("ddt", lambda: dist.log_prob(np.zeros(3)), *names)
    assert not ok
    ok, leaves = _call("ddt", lambda: bnp.BrownianLeaves(tree, sigma, noise), *names)
    assert ok == (_scalar_ok(sigma) and (noise is None or _scalar_ok(noise, 0.0, lo_open=False))), (sigma, noise)
    if not ok:
        return
    value = {"ok": np.linspace(-1, 1, 2 * n).reshape(n, 2), "nan": np.full((n, 2), np.nan),
             "short": np.zeros((n - 1, 2)), "1d": np.zeros(n), "huge": np.full((n, 2), 1e30)}[X]
    ok, lp = _call("ddt", lambda: leaves.log_prob(value), *names)
    assert ok == (X in ("ok", "huge")), X
    if ok:
        assert np.isfinite(float(lp)), (sigma, noise, X, float(lp))


# ------------------------------------------------------------------------------ CLI
@st.composite
def data_file(draw):
    kind = draw(st.sampled_from(["good"] * 6 + [
        "tiny", "one_row", "1col", "nan", "text", "empty", "1col", "ragged", "npy_1d", "npy_3d", "npy_obj",
        "npy_bool", "npy_str", "corrupt_npy", "npy_complex", "huge", "tiny", "one_row", "bad_ext", "missing"]))
    rng = np.random.default_rng(draw(st.integers(0, 100)))
    X = np.r_[rng.normal(-4, 1, (6, 2)), rng.normal(4, 1, (6, 2))]
    labels = draw(st.sampled_from(["none"] * 4 + ["good"] * 2 + ["short", "float", "text", "nan", "negative",
                                                                 "missing"]))
    method = draw(st.sampled_from(["mapdp", "mapdp", "gibbs"]))
    family = draw(st.sampled_from(["normal-gamma"] * 3 + ["normal-wishart"] * 2 + ["beta-bernoulli"]))
    return kind, X, labels, method, family


def _write(tmp, kind, X):
    p = tmp / ("x.npy" if kind.startswith(("npy", "corrupt")) else "x.bin" if kind == "bad_ext" else "x.csv")
    if kind in ("good", "huge", "tiny", "one_row", "1col"):
        Y = {"huge": X * 1e30, "tiny": X * 1e-30, "one_row": X[:1], "1col": X[:, :1]}.get(kind, X)
        np.savetxt(p, Y, delimiter=",")
    elif kind == "nan":
        X = X.copy()
        X[3, 1] = np.nan
        np.savetxt(p, X, delimiter=",")
    elif kind == "text":
        p.write_text("a,b\n1,2\nx,y\n")
    elif kind == "empty":
        p.write_text("")
    elif kind == "ragged":
        p.write_text("1,2\n3\n")
    elif kind == "corrupt_npy":
        p.write_bytes(b"\x93NUMPY garbage")
    elif kind == "bad_ext":
        p.write_text("1,2\n")
    elif kind.startswith("npy"):
        arr = {"npy_1d": X[:, 0], "npy_3d": X[None], "npy_obj": X.astype(object), "npy_bool": X > 0,
               "npy_str": X.astype(str), "npy_complex": X + 1j}[kind]
        np.save(p, arr, allow_pickle=True)
    return p


@pytest.mark.filterwarnings("ignore::jaxbnp.estimators.SingleClusterWarning")
@settings(FIT, max_examples=40)
@given(case=data_file())
def test_cli_on_files(case, tmp_path_factory):
    EXAMPLES["test_cli_on_files"] += 1
    from jaxbnp.cli import main

    kind, X, labels, method, family = case
    tmp = tmp_path_factory.mktemp("cli")
    p = _write(tmp, kind, X) if kind != "missing" else tmp / "nothere.csv"
    n = {"one_row": 1}.get(kind, len(X))  # rows of the data file
    argv = ["cluster", str(p), "--out", str(tmp / "out"), "--method", method, "--chains", "1",
            "--warmup", "1", "--samples", "2", "--family", family, "--no-progress"]
    if labels != "none":
        lp = tmp / "y.txt"
        content = {"good": "\n".join(str(i % 2) for i in range(n)), "short": "0\n1\n",
                   "float": "\n".join("0.5" for _ in range(n)), "text": "a\nb\n",
                   "nan": "\n".join("nan" for _ in range(n)),
                   "negative": "\n".join("-1" for _ in range(n))}.get(labels)
        if content is not None:
            lp.write_text(content + "\n")
        argv += ["--labels", str(lp)]
    COUNTS["cli"] += 1
    good = kind in ("good", "tiny", "one_row", "1col", "huge", "npy_bool") and labels in ("none", "good", "negative")
    # the family's own conditions: binary data; a non-singular sample covariance (>= 2 rows)
    family_may_refuse = family == "beta-bernoulli" and kind != "npy_bool" or \
        family == "normal-wishart" and kind in ("one_row", "npy_bool")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SingleClusterWarning)
            rc = main(argv)
    except SystemExit as exc:
        OUTCOMES["cli", "rejected"] += 1
        msg = str(exc.code)
        assert exc.code not in (0, None) and isinstance(exc.code, str) and msg.startswith("jaxbnp"), msg
        assert not good or kind == "huge" or family_may_refuse, (kind, labels, family, msg)
        return
    OUTCOMES["cli", "accepted"] += 1
    assert rc == 0 and good, (kind, labels, family)
    out = np.loadtxt(tmp / "out" / "labels.csv", skiprows=1, ndmin=1)
    assert out.shape == (n,) and np.all(out == np.round(out)) and out.min() >= 0


# ------------------------------------------------------------------------------ report
def test_zz_example_counts():
    """Prints the examples each test ran (run the file with ``-s`` to see them)."""
    print("\nfuzz examples per test:")
    for name, k in sorted(EXAMPLES.items()):
        print(f"  {name:40s} {k:5d}")
    print("library calls per group:")
    for name, k in sorted(COUNTS.items()):
        acc, rej = OUTCOMES[name, "accepted"], OUTCOMES[name, "rejected"]
        print(f"  {name:22s} {k:5d} calls ({acc} accepted, {rej} rejected)")
