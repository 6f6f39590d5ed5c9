"""Metrics and posterior summaries of partitions against brute force and hand-computed values."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from sklearn.metrics import adjusted_rand_score, mutual_info_score, normalized_mutual_info_score, rand_score

from jaxbnp import metrics
from tests.exact.enumeration import set_partitions


# ----------------------------------------------------------------------------- brute force
def _coclustering(labels):
    labels = np.asarray(labels)
    return labels[..., :, None] == labels[..., None, :]


def _brute_binder(a, b):
    n = len(a)
    return sum(
        (a[i] == a[j]) != (b[i] == b[j]) for i, j in itertools.combinations(range(n), 2)
    )


def _entropy(labels):
    p = np.unique(labels, return_counts=True)[1] / len(labels)
    return -np.sum(p * np.log(p))


def _vi_via_sklearn(a, b):
    """VI in nats: H(a) + H(b) − 2 I(a, b), with scikit-learn's mutual information."""
    return _entropy(a) + _entropy(b) - 2 * mutual_info_score(a, b)


def _pairwise_losses(parts):
    """VI (bits) and Binder between every pair of partitions, by one-hot contingency tables."""
    n = parts.shape[1]
    onehot = (parts[:, :, None] == np.arange(n)).astype(float)  # (P, n, n): point i in cluster k
    table = np.einsum("pik,qil->pqkl", onehot, onehot)
    f = lambda x: np.where(x > 0, x * np.log2(np.where(x > 0, x, 1)), 0.0)  # noqa: E731
    rows, cols = table.sum(3), table.sum(2)
    vi = (f(rows).sum(2) + f(cols).sum(2) - 2 * f(table).sum((2, 3))) / n
    co = _coclustering(parts).astype(float)
    binder = np.abs(co[:, None] - co[None, :]).sum((2, 3)) / 2
    return vi, binder


PARTS6 = set_partitions(6)
LOSSES6 = dict(zip(("vi", "binder"), _pairwise_losses(PARTS6)))
INDEX6 = {tuple(p): i for i, p in enumerate(PARTS6.tolist())}


def _index(labels):
    mapping: dict = {}
    return INDEX6[tuple(mapping.setdefault(int(x), len(mapping)) for x in labels)]


def _neighbours(parts):
    """``N[p, q]``: q is p with one point moved to another (or a new) cluster."""
    P, n = parts.shape
    out = np.zeros((P, P), bool)
    for i in range(n):
        rest = np.delete(parts, i, axis=1)
        same_rest = np.all(_coclustering(rest)[:, None] == _coclustering(rest)[None, :], axis=(2, 3))
        out |= same_rest
    np.fill_diagonal(out, False)
    return out


NEIGHBOURS6 = _neighbours(PARTS6)


# ----------------------------------------------------------------------------- two partitions
def test_vi_and_binder_hand_values():
    assert metrics.variation_of_information([0, 0, 1, 1], [0, 0, 0, 0]) == pytest.approx(1.0)
    assert metrics.variation_of_information([0, 1, 2, 3], [0, 0, 0, 0]) == pytest.approx(2.0)
    assert metrics.variation_of_information([0, 0, 1, 1], [5, 5, 2, 2]) == 0.0
    assert metrics.binder_loss([0, 0, 1, 1], [0, 0, 0, 0]) == 4.0
    assert metrics.binder_loss([0, 0, 1, 1], [3, 3, 7, 7]) == 0.0
    assert metrics.binder_loss([0, 1, 2], [0, 0, 0], normalize=True) == 1.0


def test_vi_and_binder_match_independent_formulas():
    rng = np.random.default_rng(1)
    for _ in range(20):
        n = int(rng.integers(2, 25))
        a, b = rng.integers(0, 4, n), rng.integers(0, 6, n) * 3 - 1
        assert metrics.variation_of_information(a, b, base=np.e) == pytest.approx(_vi_via_sklearn(a, b), abs=1e-12)
        assert metrics.binder_loss(a, b) == _brute_binder(a, b)
        assert metrics.binder_loss(a, b, normalize=True) == pytest.approx(1 - rand_score(a, b))
        assert metrics.variation_of_information(a, b) == pytest.approx(metrics.variation_of_information(b, a))


def test_nmi_ari_purity():
    truth, pred = np.array([0, 0, 0, 1, 1, 2]), np.array([1, 1, 0, 0, 0, 0])
    assert metrics.nmi(truth, pred) == pytest.approx(normalized_mutual_info_score(truth, pred))
    assert metrics.ari(truth, pred) == pytest.approx(adjusted_rand_score(truth, pred))
    assert metrics.purity(truth, pred) == pytest.approx((2 + 2) / 6)  # clusters {0,1}: class 0; {2..5}: class 1
    assert metrics.purity(truth, truth) == 1.0


# ----------------------------------------------------------------------------- draws
def test_posterior_similarity_matches_brute_force_and_pools_chains():
    rng = np.random.default_rng(2)
    draws = rng.integers(0, 4, (2, 7, 9)) * 10  # (chains, draws, n), arbitrary ids
    psm = metrics.posterior_similarity(draws, chunk_size=3)
    expected = _coclustering(draws.reshape(-1, 9)).mean(0)
    np.testing.assert_allclose(psm, expected, atol=1e-15)
    np.testing.assert_array_equal(np.diag(psm), 1.0)
    # renaming the clusters of one draw changes nothing
    renamed = draws.copy()
    renamed[0, 0] = 99 - renamed[0, 0]
    np.testing.assert_allclose(metrics.posterior_similarity(renamed), psm, atol=1e-15)


@pytest.mark.parametrize("loss", ["vi", "binder"])
def test_expected_loss_equals_mean_pairwise_loss(loss):
    rng = np.random.default_rng(3)
    idx = rng.integers(0, len(PARTS6), 25)
    draws = PARTS6[idx] * 2 + 1  # ids need not be compact
    for p in rng.integers(0, len(PARTS6), 10):
        expected = LOSSES6[loss][p, idx].mean()
        assert metrics.expected_loss(PARTS6[p], draws, loss) == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize("loss", ["vi", "binder"])
def test_point_estimate_recovers_the_partition_the_draws_concentrate_on(loss):
    truth = np.repeat([0, 1, 2], [5, 4, 3])
    rng = np.random.default_rng(4)
    draws = []
    for _ in range(60):  # each draw: the truth with one or two points moved at random
        d = truth.copy()
        for i in rng.choice(12, size=int(rng.integers(1, 3)), replace=False):
            d[i] = rng.choice([k for k in range(4) if k != d[i]])
        draws.append(rng.permutation(5)[d])  # and its clusters renamed
    draws = np.array(draws)
    assert all(metrics.variation_of_information(d, truth) > 0 for d in draws)  # no draw is the truth
    est = metrics.point_estimate(draws, loss=loss)
    np.testing.assert_array_equal(est, truth)


@pytest.mark.parametrize("loss", ["vi", "binder"])
def test_point_estimate_is_the_global_minimum_for_posterior_draws(loss):
    """Draws from an exact posterior over the 203 partitions of 6 points: brute force agrees."""
    rng = np.random.default_rng(5)
    # a posterior-like law: mass concentrated on a few partitions near {0,1,2},{3,4},{5}
    centre = PARTS6[_index([0, 0, 0, 1, 1, 2])]
    dist = LOSSES6["binder"][_index(centre)]
    probs = np.exp(-1.5 * dist)
    probs /= probs.sum()
    for seed in range(3):
        idx = np.random.default_rng(seed).choice(len(PARTS6), size=200, p=probs)
        draws = rng.permutation(6)[PARTS6[idx]]
        est = metrics.point_estimate(draws, loss=loss)
        values = LOSSES6[loss][:, idx].mean(1)
        assert LOSSES6[loss][_index(est), idx].mean() == pytest.approx(values.min(), abs=1e-12)


@pytest.mark.parametrize("loss", ["vi", "binder"])
def test_greedy_refinement_reaches_a_local_minimum_no_worse_than_any_draw(loss):
    rng = np.random.default_rng(6)
    refined_better = 0
    for _ in range(40):
        idx = rng.integers(0, len(PARTS6), int(rng.integers(3, 30)))
        values = LOSSES6[loss][:, idx].mean(1)
        est = metrics.point_estimate(PARTS6[idx], loss=loss)
        searched = metrics.point_estimate(PARTS6[idx], loss=loss, refine=False)
        v = values[_index(est)]
        assert v <= values[idx].min() + 1e-12  # search over draws, then only improvements
        assert values[_index(searched)] == pytest.approx(values[idx].min(), abs=1e-12)
        assert np.all(values[NEIGHBOURS6[_index(est)]] >= v - 1e-12)  # no single move improves
        refined_better += v < values[idx].min() - 1e-12
    assert refined_better > 0  # the refinement does move points in some cases


def test_point_estimate_max_candidates_and_labels_in_first_appearance_order():
    draws = np.array([[2, 2, 0, 0, 1], [2, 2, 0, 0, 1], [1, 1, 1, 0, 0]])
    est = metrics.point_estimate(draws, max_candidates=1, refine=False)
    np.testing.assert_array_equal(est, [0, 0, 1, 1, 2])
    assert est.dtype == np.int64


def test_credible_ball_hand_example():
    estimate = [0, 0, 1, 1]
    draws = np.array([[0, 0, 1, 1]] * 6 + [[0, 0, 0, 1]] * 2 + [[0, 0, 0, 0], [0, 1, 2, 3]])
    # VI to the estimate: 0 (6 draws), 1 bit for one cluster and for singletons,
    # 2 H(a, b) - H(a) - H(b) = 3 - 1 - 0.811 = 1.189 bits for [0, 0, 0, 1] (2 draws)
    one_moved = metrics.variation_of_information(estimate, [0, 0, 0, 1])
    assert one_moved == pytest.approx(3.0 - 1.0 - (0.75 * np.log2(4 / 3) + 0.25 * 2))
    tight = metrics.credible_ball(draws, estimate, level=0.6)
    assert tight.radius == 0.0
    for bound in (tight.horizontal, tight.upper_vertical, tight.lower_vertical):
        np.testing.assert_array_equal(bound, [estimate])
    ball = metrics.credible_ball(draws, estimate, level=0.7)  # the 7th smallest distance: 1 bit
    assert ball.radius == pytest.approx(1.0)
    np.testing.assert_array_equal(ball.horizontal, [[0, 0, 0, 0], [0, 1, 2, 3]])
    np.testing.assert_array_equal(ball.upper_vertical, [[0, 0, 0, 0]])
    np.testing.assert_array_equal(ball.lower_vertical, [[0, 1, 2, 3]])
    assert ball.horizontal_distance == pytest.approx(1.0)
    assert ball.upper_vertical_distance == pytest.approx(1.0)
    wide = metrics.credible_ball(draws, estimate, level=1.0)
    assert wide.radius == pytest.approx(one_moved)
    np.testing.assert_array_equal(wide.horizontal, [[0, 0, 0, 1]])
    np.testing.assert_array_equal(wide.upper_vertical, [[0, 0, 0, 0]])
    # Binder distances 0 (x6), 3, 3, 4, 2: the 8th smallest is 3
    binder = metrics.credible_ball(draws, estimate, level=0.8, loss="binder")
    assert binder.radius == 3.0 and binder.loss == "binder"
    np.testing.assert_array_equal(binder.horizontal, [[0, 0, 0, 1]])
    np.testing.assert_array_equal(binder.lower_vertical, [[0, 1, 2, 3]])


def test_num_clusters_summary_and_count_clusters():
    k = np.array([[3, 3, 4, 3, 2], [3, 4, 3, 3, 3]])
    s = metrics.num_clusters_summary(k, level=0.8)
    assert s["mean"] == pytest.approx(k.mean()) and s["sd"] == pytest.approx(k.std())
    assert s["mode"] == 3 and s["num_draws"] == 10
    assert s["frequencies"] == {2: 0.1, 3: 0.7, 4: 0.2}
    assert s["hpd"] == (3, 4)  # 3 alone holds 70% < 80%; {3, 4} holds 90%
    assert metrics.num_clusters_summary(k, level=0.7)["hpd"] == (3, 3)
    draws = np.array([[[0, 0, 1], [0, 1, 2]], [[5, 5, 5], [1, 0, 1]]])
    np.testing.assert_array_equal(metrics.count_clusters(draws), [[2, 3], [1, 2]])


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: metrics.variation_of_information([0, 1], [0, 1, 2]), "same points"),
        (lambda: metrics.binder_loss([[0, 1]], [0, 1]), "1-D"),
        (lambda: metrics.variation_of_information([0.5, 1], [0, 1]), "integer"),
        (lambda: metrics.posterior_similarity(np.zeros(5, int)), "num_draws, n"),
        (lambda: metrics.posterior_similarity(np.zeros((0, 3), int)), "empty"),
        (lambda: metrics.point_estimate([[0, 1]], loss="l2"), "'vi' or 'binder'"),
        (lambda: metrics.point_estimate([[0, 1]], max_candidates=0), "max_candidates"),
        (lambda: metrics.expected_loss([0, 1, 1], [[0, 1]]), "labels 3 points"),
        (lambda: metrics.credible_ball([[0, 1]], [0, 1], level=0.0), "level"),
        (lambda: metrics.num_clusters_summary([]), "empty"),
        (lambda: metrics.posterior_similarity([["a", "b"]]), "integer"),
    ],
)
def test_bad_input_raises(call, match):
    with pytest.raises(ValueError, match=match):
        call()
