"""IBHC host trees (docs/mathematics.md §4): potentials against direct computation, BHC/IBHC on
separated groups, SampleSub/StocInsert probabilities by enumeration, tree edits, errors."""

from __future__ import annotations

import itertools
import math

import jax
import numpy as np
import pytest
from scipy.special import logsumexp

from jaxbnp.inference.tgmcmc import ibhc as ib
from jaxbnp.inference.tgmcmc import proposals as prop
from jaxbnp.models.families import NormalGamma, NormalWishart
from jaxbnp.models.measures import DP, NGGP, PitmanYor

FAMILY = NormalGamma(m0=0.0, k0=0.1, a0=2.0, b0=0.5)
MEASURES = {
    "dp_u0": (DP(1.0), None),
    "dp_u2": (DP(0.7), 2.0),
    "nggp": (NGGP(1.0, 0.4), 0.8),
}

RNG = np.random.default_rng(0)
X_SMALL = RNG.normal(size=(6, 2))
# two well-separated groups of 4 points each
X_GROUPS = np.concatenate([RNG.normal(0.0, 0.3, (4, 2)), RNG.normal(8.0, 0.3, (4, 2))])
GROUP_LABELS = np.array([0, 0, 0, 0, 1, 1, 1, 1])


# ----------------------------------------------------------------------------- helpers
@jax.jit
def _direct_potentials(family, measure, u, X, labels, size):
    """Statistics, ``log P(X_c)`` and ``log κ(|c|, u)`` of the points with label 0."""
    stats = jax.tree.map(lambda s: s[0], family.stats_from_labels(X, labels, 2))
    log_lik = family.log_marginal(jax.tree.map(lambda s: s[None], stats))[0]
    return stats, log_lik, measure.log_kappa(size, u)


def _direct(model, points):
    labels = np.ones(model.num_points, dtype=np.int32)
    labels[np.asarray(points, dtype=np.int64)] = 0
    stats, log_lik, log_kappa = _direct_potentials(
        model.family, model.measure, model.u, model.X, labels, float(len(points))
    )
    return stats, float(log_lik), float(log_lik) + float(log_kappa)


def _direct_log_h(model, points):
    """``log P(X_c)`` and ``log κ(|c|, u) + log P(X_c)`` from the family and the measure."""
    return _direct(model, points)[1:]


def _direct_log_t(model, node):
    _, log_h = _direct_log_h(model, node.points())
    if node.is_leaf:
        return log_h
    return float(np.logaddexp(log_h, _direct_log_t(model, node.left) + _direct_log_t(model, node.right)))


def _assert_consistent(model, root):
    """Links, sizes, statistics and potentials of every node equal a fresh computation."""
    assert root.parent is None
    log_t = {}
    for v in root.nodes()[::-1]:  # children before parents
        stats, log_lik, log_h = _direct(model, v.points())
        assert v.size == len(v.points())
        for got, want in zip(jax.tree.leaves(model.stats_of(v)), jax.tree.leaves(stats)):
            np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-10, atol=1e-10)
        if v.is_leaf:
            log_t[id(v)] = log_h
        else:
            assert v.left.parent is v and v.right.parent is v
            log_t[id(v)] = float(np.logaddexp(log_h, log_t[id(v.left)] + log_t[id(v.right)]))
        np.testing.assert_allclose([v.log_lik, v.log_h, v.log_t], [log_lik, log_h, log_t[id(v)]], rtol=1e-10)


def _tree_consistent_partitions(node):
    """Every partition of a node's points that the tree can express (its cuts)."""
    if node.is_leaf:
        return [[node.points()]]
    parts = [[node.points()]]
    for p in _tree_consistent_partitions(node.left):
        for q in _tree_consistent_partitions(node.right):
            parts.append(p + q)
    return parts


def _set_partitions(items):
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for p in _set_partitions(rest):
        yield [[first]] + p
        for k in range(len(p)):
            yield p[:k] + [[first] + p[k]] + p[k + 1:]


def _structure(node):
    """Nested tuples of leaf indices."""
    if node.is_leaf:
        return node.index
    return (_structure(node.left), _structure(node.right))


def _example_tree(model):
    """((0, 1), (2, (3, 4))) plus point 5 by SeqInsert."""
    lf = model.leaves()
    a = model.merge(lf[0], lf[1])
    b = model.merge(lf[2], model.merge(lf[3], lf[4]))
    return ib.seq_insert(model, model.merge(a, b), lf[5])


# ----------------------------------------------------------------------------- potentials
@pytest.mark.parametrize("name", list(MEASURES))
def test_potentials_match_direct_computation(name):
    measure, u = MEASURES[name]
    model = ib.TreeModel(X_SMALL, measure, FAMILY, u)
    root = _example_tree(model)
    for v in root.nodes():
        log_lik, log_h = _direct_log_h(model, v.points())
        np.testing.assert_allclose([v.log_lik, v.log_h], [log_lik, log_h], rtol=1e-12)
        np.testing.assert_allclose(v.log_t, _direct_log_t(model, v), rtol=1e-12)
        if v.is_leaf:
            assert v.log_d == -math.inf and v.log_prob_h == 0.0
        else:
            log_d = _direct_log_t(model, v.left) + _direct_log_t(model, v.right) - log_h
            np.testing.assert_allclose(v.log_d, log_d, rtol=1e-12, atol=1e-12)
            np.testing.assert_allclose(np.exp(v.log_prob_h), 1.0 / (1.0 + np.exp(log_d)), rtol=1e-12)
    _assert_consistent(model, root)


def test_normal_wishart_potentials_and_pair_dissimilarity():
    fam = NormalWishart.from_data(X_SMALL)
    model = ib.TreeModel(X_SMALL, NGGP(1.0, 0.4), fam, 0.8)
    lf = model.leaves()
    a, b = model.merge(lf[0], lf[1]), model.merge(lf[2], lf[3])
    log_d = model.log_dissimilarity(a, b)
    _, log_h_ab = _direct_log_h(model, [0, 1, 2, 3])
    np.testing.assert_allclose(log_d, a.log_t + b.log_t - log_h_ab, rtol=1e-12)
    root = model.merge(a, b)
    np.testing.assert_allclose(root.log_d, log_d, rtol=1e-12)
    _assert_consistent(model, root)


def test_dp_dissimilarities_do_not_depend_on_u():
    """DP: κ(m, u) = α Γ(m) (u+1)^−m, so (u+1) cancels in every d (and in every probability)."""
    model = ib.TreeModel(X_SMALL, DP(1.0), FAMILY)
    root = _example_tree(model)
    log_d0 = [v.log_d for v in root.nodes()]
    log_t0 = root.log_t
    model.set_u(5.0, [root])
    np.testing.assert_allclose([v.log_d for v in root.nodes()], log_d0, rtol=1e-12)
    np.testing.assert_allclose(root.log_t, log_t0 - 6 * np.log1p(5.0), rtol=1e-12)


@pytest.mark.parametrize("name", ["dp_u0", "nggp"])
def test_root_potential_sums_tree_consistent_partitions(name):
    """φ(X|t) = Σ_{Π expressible by t} Π_c φ(X_c|h_c), a lower bound of the full sum (paper eq. 10)."""
    measure, u = MEASURES[name]
    model = ib.TreeModel(X_SMALL[:5], measure, FAMILY, u)
    lf = model.leaves()
    root = model.merge(model.merge(lf[0], lf[3]), model.merge(lf[1], model.merge(lf[2], lf[4])))
    subsets = [s for k in range(1, 6) for s in itertools.combinations(range(5), k)]
    ps = [np.sum(model._point_stats[list(s)], 0) for s in subsets]
    _, log_h = model._evaluate(ps, [len(s) for s in subsets])
    log_h = dict(zip(subsets, log_h))
    tree_parts = _tree_consistent_partitions(root)
    assert len(tree_parts) == 1 + 2 * (1 + 1 * 2)
    tree_sum = logsumexp([sum(log_h[tuple(c.tolist())] for c in p) for p in tree_parts])
    np.testing.assert_allclose(root.log_t, tree_sum, rtol=1e-12)
    full_sum = logsumexp([sum(log_h[tuple(sorted(c))] for c in p) for p in _set_partitions(list(range(5)))])
    assert root.log_t < full_sum


# ----------------------------------------------------------------------------- SeqInsert
def test_seq_insert_cases():
    X = np.array([[0.0, 0.0], [0.2, 0.1], [6.0, 6.0], [6.1, 5.9], [0.1, -0.1], [60.0, -60.0]])
    model = ib.TreeModel(X, DP(1.0), FAMILY)
    lf = model.leaves()
    root = model.merge(model.merge(lf[0], lf[1]), lf[2])
    root = ib.seq_insert(model, root, lf[3])  # near 2: case 3, sibling of leaf 2
    assert _structure(root) == ((0, 1), (2, 3))
    root = ib.seq_insert(model, root, lf[4])  # near 0 and 1: into the left subtree
    assert _structure(root)[1] == (2, 3) and sorted(root.left.points().tolist()) == [0, 1, 4]
    _assert_consistent(model, root)
    pair = model.merge(model.leaf(0), model.leaf(1))
    top = ib.seq_insert(model, pair, lf[5])  # far from both: case 1, on top
    assert top.left is pair and top.right is lf[5] and top.parent is None
    _assert_consistent(model, top)


# ----------------------------------------------------------------------------- BHC and IBHC
def _assert_forest(forest):
    model = forest.model
    np.testing.assert_array_equal(forest.labels, ib.forest_labels(forest.trees, model.num_points))
    seen = np.concatenate([t.points() for t in forest.trees])
    assert sorted(seen.tolist()) == list(range(model.num_points))
    for k, t in enumerate(forest.trees):
        assert np.all(forest.labels[t.points()] == k)
        _assert_consistent(model, t)


def _shape(v):
    return v.index if v.is_leaf else (_shape(v.left), _shape(v.right))


@pytest.mark.parametrize("name", ["nggp", "normal_wishart"])
def test_sequential_tree_jax_equals_host_seq_insert(name):
    """The jitted SeqInsert builder makes the same tree (shape, masks, potentials) as the host."""
    rng = np.random.default_rng(3)
    X = np.concatenate([rng.normal(0.0, 1.0, (20, 2)), rng.normal(4.0, 1.0, (20, 2))])
    if name == "nggp":
        model = ib.TreeModel(X, NGGP(1.0, 0.4), FAMILY, 0.8)
    else:
        model = ib.TreeModel(X, DP(1.0), NormalWishart.from_data(X))
    for size in (1, 2, 9, 40):
        points = rng.permutation(40)[:size]
        fast = ib.sequential_tree_jax(model, points)
        slow = model.leaf(points[0])
        for i in points[1:]:
            slow = ib.seq_insert(model, slow, model.leaf(i))
        assert _shape(fast) == _shape(slow)
        for a, b in zip(fast.nodes(), slow.nodes()):
            assert a.mask == b.mask and a.size == b.size
            np.testing.assert_allclose([a.log_lik, a.log_h, a.log_t], [b.log_lik, b.log_h, b.log_t],
                                       rtol=1e-10, atol=1e-10)
            np.testing.assert_allclose(a.stats, b.stats, rtol=1e-12, atol=1e-12)
        _assert_consistent(model, fast)


@pytest.mark.parametrize("name", ["dp_u0", "nggp"])
def test_bhc_recovers_two_groups(name):
    measure, u = MEASURES[name]
    forest = ib.bhc(X_GROUPS, measure, FAMILY, u)
    np.testing.assert_array_equal(forest.labels, GROUP_LABELS)
    assert all(v.log_d <= 0 for t in forest.trees for v in t.nodes())
    _assert_forest(forest)


@pytest.mark.parametrize("name", ["dp_u0", "nggp"])
def test_ibhc_recovers_two_groups_for_any_order(name):
    measure, u = MEASURES[name]
    rng = np.random.default_rng(1)
    orders = [np.arange(8), np.array([0, 4, 1, 5, 2, 6, 3, 7]), np.arange(8)[::-1]]
    orders += [rng.permutation(8) for _ in range(3)]
    for order in orders:
        forest = ib.ibhc(X_GROUPS, measure, FAMILY, u, order=order)
        np.testing.assert_array_equal(forest.labels, GROUP_LABELS)
        _assert_forest(forest)
    single = ib.ibhc(X_GROUPS, measure, FAMILY, u, order=orders[1], single_tree=True)
    np.testing.assert_array_equal(single.labels, GROUP_LABELS)
    _assert_forest(single)


def test_ibhc_step3_splits_keep_every_dissimilarity_below_one():
    rng = np.random.default_rng(0)  # an order found to trigger a Step-3 split
    X = np.concatenate([rng.normal(c, 0.5, (5, 1)) for c in [0, 3, 6]])
    order = rng.permutation(15)
    forest = ib.ibhc(X, DP(1.0), FAMILY, order=order)
    assert forest.num_splits >= 1
    assert all(v.log_d <= 0 for t in forest.trees for v in t.nodes())
    np.testing.assert_array_equal(forest.labels, np.repeat([0, 1, 2], 5))
    _assert_forest(forest)
    no_split = ib.ibhc(X, DP(1.0), FAMILY, order=order, max_splits=0)
    assert no_split.num_splits == 0
    _assert_forest(no_split)


# ----------------------------------------------------------------------------- SampleSub
def test_sample_sub_probabilities_enumerate_and_match_draws():
    model = ib.TreeModel(X_SMALL, NGGP(1.0, 0.4), FAMILY, 0.8)
    root = _example_tree(model)
    nodes = root.nodes()
    log_d = np.array([v.log_d for v in nodes])
    eps = np.exp(np.max(log_d))
    for internal_only in (False, True):
        log_p = np.array([prop.sample_sub_log_prob(root, v, internal_only=internal_only) for v in nodes])
        np.testing.assert_allclose(np.sum(np.exp(log_p)), 1.0, rtol=1e-12)
        weights = np.exp(log_d) + eps  # leaves: d = 0, weight ε
        if internal_only:
            weights = np.where([not v.is_leaf for v in nodes], weights, 0.0)
        np.testing.assert_allclose(np.exp(log_p), weights / weights.sum(), rtol=1e-10, atol=1e-300)
        rng = np.random.default_rng(3)
        counts = np.zeros(len(nodes))
        for _ in range(400):
            draw = prop.sample_sub(rng, root, internal_only=internal_only)
            assert draw.log_prob == prop.sample_sub_log_prob(root, draw.node, internal_only=internal_only)
            counts[[k for k, v in enumerate(nodes) if v is draw.node][0]] += 1
            if internal_only:
                assert not draw.node.is_leaf
        assert np.max(np.abs(counts / 400 - np.exp(log_p))) < 0.08
    # a subtree can be the root of a further draw (local moves); a leaf is drawn with probability 1
    sub = root.right
    assert _contains_all(sub, prop.sample_sub(0, sub).node)
    leaf = [v for v in root.nodes() if v.is_leaf][0]
    assert prop.sample_sub(0, leaf) == (leaf, 0.0)
    with pytest.raises(ValueError):
        prop.sample_sub(0, leaf, internal_only=True)
    assert prop.sample_sub_log_prob(root, leaf, internal_only=True) == -math.inf
    with pytest.raises(ValueError):
        prop.sample_sub_log_prob(sub, root.left)


def _contains_all(root, node):
    return any(v is node for v in root.nodes())


# ----------------------------------------------------------------------------- StocInsert
def _stoc_setup(model):
    lf = model.leaves()
    S = [model.merge(lf[0], lf[1]), lf[2], model.merge(lf[3], lf[4])]
    return S, lf[5]


@pytest.mark.parametrize("name", ["dp_u2", "nggp"])
def test_stoc_insert_probabilities_enumerate_and_match_draws(name):
    measure, u = MEASURES[name]
    model = ib.TreeModel(X_SMALL, measure, FAMILY, u)
    S, c = _stoc_setup(model)
    choices = [0, 1, 2, None]
    log_p = np.array([prop.stoc_insert_log_prob(model, S, c, j) for j in choices])
    np.testing.assert_allclose(np.sum(np.exp(log_p)), 1.0, rtol=1e-12)
    inv_d = np.exp(-np.array([model.log_dissimilarity(t, c) for t in S]))
    np.testing.assert_allclose(np.exp(log_p), np.append(inv_d, 1.0) / (1.0 + inv_d.sum()), rtol=1e-10)
    seen = set()
    for seed in range(12):
        S_copy, c_copy = [ib.copy_tree(t) for t in S], ib.copy_tree(c)
        out = prop.stoc_insert(model, seed, S_copy, c_copy)
        seen.add(out.choice)
        assert out.log_prob == pytest.approx(log_p[choices.index(out.choice)], rel=1e-12)
        assert len(out.trees) == (4 if out.choice is None else 3)
        points = sorted(np.concatenate([t.points() for t in out.trees]).tolist())
        assert points == list(range(6))
        if out.choice is not None:
            assert 5 in out.trees[out.choice].points()
        for t in out.trees:
            _assert_consistent(model, t)
    assert len(seen) >= 2
    # the originals were not touched by the draws on copies
    assert [t.size for t in S] == [2, 1, 2] and c.parent is None


def test_merge_reverse_probability_eq12():
    """cut_at on a cascaded tree gives S = {c, c1}, Q = (c2, ..., cm); StocInsert of each
    ``c_i`` into a new tree has the probability of eq. 12."""
    model = ib.TreeModel(X_SMALL, NGGP(1.0, 0.4), FAMILY, 0.8)
    lf = model.leaves()
    trees = [model.merge(lf[0], lf[1]), lf[2], model.merge(lf[3], lf[4]), lf[5]]
    ordered = sorted(trees, key=lambda t: t.index)
    merged = ib.cascade(model, [trees[3], trees[0], trees[2], trees[1]])
    assert merged.left.left.left is ordered[0] and merged.left.left.right is ordered[1]
    assert merged.left.right is ordered[2] and merged.right is ordered[3]
    _assert_consistent(model, merged)
    c_star = ordered[0].parent
    assert prop.sample_sub_log_prob(merged, c_star, internal_only=True) < 0
    S, Q = ib.cut_at(c_star)
    assert S == ordered[:2] and Q == ordered[2:]
    log_q = 0.0
    expected = 0.0
    for i, ci in enumerate(Q):
        log_q += prop.stoc_insert_log_prob(model, S, ci, None)
        inv_d = sum(np.exp(-model.log_dissimilarity(t, ci)) for t in S)
        expected += -np.log1p(inv_d)
        S = S + [ci]
    np.testing.assert_allclose(log_q, expected, rtol=1e-12)


# ----------------------------------------------------------------------------- edits
def test_detach_copy_set_u_and_cut_host_tree():
    model = ib.TreeModel(X_SMALL, NGGP(1.0, 0.4), FAMILY, 0.8)
    root = _example_tree(model)
    copy = ib.copy_tree(root)
    assert _structure(copy) == _structure(root) and copy is not root
    leaf = [v for v in root.nodes() if v.is_leaf and v.index == 3][0]
    rest = ib.detach(model, leaf)
    assert leaf.parent is None and 3 not in rest.points() and rest.size == 5
    _assert_consistent(model, rest)
    _assert_consistent(model, copy)  # the copy is independent
    assert ib.detach(model, rest) is None
    model.set_u(3.0, [rest, copy])
    assert model.u == 3.0
    _assert_consistent(model, rest)
    _assert_consistent(model, copy)
    _assert_consistent(model, model.leaf(2))  # new leaves use the new u too
    clusters = ib.cut_host_tree(copy)
    assert sorted(np.concatenate([t.points() for t in clusters]).tolist()) == list(range(6))
    for t in clusters:
        assert t.parent is None and (t.is_leaf or t.log_d <= 0)


# ----------------------------------------------------------------------------- errors
class _JaxOnlyNormalGamma(NormalGamma):
    """A family that defines only ``log_marginal`` (no host form): the JAX fallback path."""

    def log_marginal(self, stats):
        return super().log_marginal(stats)


def test_tree_math_runs_in_numpy_and_a_jax_only_family_falls_back(monkeypatch):
    """The host trees make no JAX call for the library's families (JAX inside tgMCMC's
    io_callback can deadlock); a family with only ``log_marginal`` uses batched JAX
    calls and gives the same trees."""
    measure, u = MEASURES["nggp"]
    family = _JaxOnlyNormalGamma(m0=0.0, k0=0.1, a0=2.0, b0=0.5)
    jax_forest = ib.ibhc(X_GROUPS, measure, family, u=u)
    assert not jax_forest.model._host_math

    def fail(*args, **kwargs):
        raise AssertionError("JAX called by the host tree code")

    monkeypatch.setattr(ib, "_log_marginal_batch", fail)
    monkeypatch.setattr(ib, "_log_kappa_batch", fail)
    forest = ib.ibhc(X_GROUPS, measure, FAMILY, u=u)
    assert forest.model._host_math
    np.testing.assert_array_equal(forest.labels, jax_forest.labels)
    for a, b in zip(forest.trees, jax_forest.trees):
        assert abs(a.log_t - b.log_t) < 1e-9
    ib.bhc(X_GROUPS, measure, FAMILY, u=u)
    with pytest.raises(AssertionError, match="JAX called"):
        ib.ibhc(X_GROUPS, measure, family, u=u)  # the fallback is what was patched out


def test_bad_input_raises_value_error():
    with pytest.raises(ValueError, match="log_kappa"):
        ib.ibhc(X_SMALL, PitmanYor(1.0, 0.5), FAMILY)
    with pytest.raises(ValueError, match="auxiliary"):
        ib.ibhc(X_SMALL, NGGP(1.0, 0.4), FAMILY)
    with pytest.raises(ValueError, match="u must"):
        ib.bhc(X_SMALL, DP(1.0), FAMILY, u=-1.0)
    with pytest.raises(ValueError, match="Family"):
        ib.ibhc(X_SMALL, DP(1.0), "normal")
    with pytest.raises(ValueError, match="NaN"):
        ib.ibhc(np.array([[0.0], [np.nan]]), DP(1.0), FAMILY)
    with pytest.raises(ValueError, match="2-D"):
        ib.ibhc(np.zeros(4), DP(1.0), FAMILY)
    with pytest.raises(ValueError, match="permutation"):
        ib.ibhc(X_SMALL, DP(1.0), FAMILY, order=[0, 0, 1, 2, 3, 4])
    with pytest.raises(ValueError, match="shape"):
        ib.ibhc(X_SMALL, DP(1.0), FAMILY, order=[0, 1])
    with pytest.raises(ValueError, match="max_splits"):
        ib.ibhc(X_SMALL, DP(1.0), FAMILY, max_splits=-1)
    model = ib.TreeModel(X_SMALL, DP(1.0), FAMILY)
    lf = model.leaves()
    pair = model.merge(lf[0], lf[1])
    with pytest.raises(ValueError, match="root"):
        ib.seq_insert(model, pair, lf[0])
    with pytest.raises(ValueError, match="itself"):
        model.merge(lf[2], lf[2])
    with pytest.raises(ValueError, match="out of range"):
        model.leaf(6)
    with pytest.raises(ValueError, match="leaf"):
        ib.cut_at(lf[2])
    with pytest.raises(ValueError):
        ib.cascade(model, [])
    with pytest.raises(ValueError, match="out of range"):
        prop.stoc_insert_log_prob(model, [pair], lf[2], 1)
    with pytest.raises(ValueError, match="already"):
        prop.stoc_insert(model, 0, [pair, lf[2]], lf[2])
    with pytest.raises(ValueError, match="cover"):
        ib.forest_labels([pair], 6)
    with pytest.raises(ValueError, match="repeated"):
        ib.forest_labels([pair, lf[0]], 6)
