"""SplitMerge (Jain & Neal 2004) against the exact posterior over all set partitions.

Split-merge moves alone (``gibbs_sweeps=0``) are irreducible on partitions,
so they alone must reproduce ``p(Π | X)`` over all 877 partitions of 7
points (NGGP: ``u`` slice-sampled by the kernel, integrated out in the
reference by scipy quadrature), within the total variation 0.03 of
``test_gibbs_exact.py``, whose data and families are reused. The NGGP test
uses the DP test's data scaled by 1.2 (sum of sqrt p 7.8, DP test 7.0): the
Gibbs test's NGGP data spread the posterior so far (sum of sqrt p 13.6) that
40,000 exact draws alone have TV 0.028.

Split-merge alone moves whole clusters and mixes more slowly per move than a
Gibbs sweep, so each draw is 8 moves with one intermediate restricted scan;
with 8 x 3,000 draws the Monte Carlo TV is about that of 16,000-24,000
independent draws (0.018-0.020). A ratio that forgets the proposal
probabilities ``q`` lands at TV 0.25 on the DP test (checked by hand).

The acceptance ratio is also checked move by move: the restricted-scan
proposal probabilities of all splits of a pair of clusters sum to one, a
merge's ``log r`` equals ``log p(X, Π*) − log p(X, Π) + log q(Π|Π*)`` with the
joint computed by the model's distributions, and a split's ``log r`` is minus
that of the merge that undoes it.
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import pytest

import jaxbnp as bnp
from jaxbnp.inference.partition.clusters import canonical_labels, init_clusters
from jaxbnp.inference.partition.kernels import SplitMerge
from jaxbnp.inference.partition.split_merge import split_merge_move_info

from .enumeration import set_partitions, total_variation
from .test_gibbs_exact import NG, TV_TOLERANCE, _exact, _gaussian_data, _model, _nggp_log_eppf_quad
from .test_gibbs_exact import _run as _run_kernel

N = 7


def _run(model, X, num_samples, num_warmup=100, **kernel_kwargs):
    return _run_kernel(model, X, num_samples, num_warmup=num_warmup, kernel_cls=SplitMerge,
                       **kernel_kwargs)


# split-merge alone, 8 moves per draw (module docstring)
SM_ALONE = dict(num_split_merge=8, num_restricted_scans=1, gibbs_sweeps=0)


def test_split_merge_alone_dp_normal_gamma_matches_enumeration():
    X = _gaussian_data(N)
    parts = set_partitions(N)
    probs = _exact(X, bnp.DP(1.0), NG, parts)
    tv = total_variation(_run(_model(bnp.DP(1.0), NG), X, 3000, **SM_ALONE)["z"], parts, probs)
    assert tv < TV_TOLERANCE, tv


def test_split_merge_alone_nggp_u_marginalised_matches_enumeration():
    measure = bnp.NGGP(1.0, 0.4, 1.0)
    X = _gaussian_data(N) * 1.2
    parts = set_partitions(N)
    log_prior = np.array([
        _nggp_log_eppf_quad(1.0, 0.4, 1.0, tuple(sorted(np.bincount(p).tolist())))
        for p in parts
    ])
    probs = _exact(X, measure, NG, parts, log_prior=log_prior)

    def model(X):
        u = numpyro.sample("u", bnp.AuxiliaryU())
        z = numpyro.sample("z", bnp.Partition(measure, X.shape[0], u=u))
        numpyro.sample("X", bnp.ConjugateMixture(NG, z), obs=X)

    samples = _run(model, X, 3000, **SM_ALONE)
    assert np.all(np.asarray(samples["u"]) > 0)
    tv = total_variation(samples["z"], parts, probs)
    assert tv < TV_TOLERANCE, tv


def test_split_merge_alone_dp_normal_wishart_matches_enumeration():
    X = _gaussian_data(N, dim=2, seed=5)
    family = bnp.NormalWishart(m0=np.zeros(2), r=0.3, nu=4.0, psi=np.eye(2))
    parts = set_partitions(N)
    probs = _exact(X, bnp.DP(1.0), family, parts)
    # a more concentrated posterior (sum of sqrt p 4.6): half the draws give TV about 0.02
    tv = total_variation(_run(_model(bnp.DP(1.0), family), X, 1500, **SM_ALONE)["z"], parts, probs)
    assert tv < TV_TOLERANCE, tv


def test_split_merge_with_gibbs_pitman_yor_matches_enumeration():
    """The default kernel (one move, then one Gibbs sweep) with a third measure."""
    measure = bnp.PitmanYor(0.5, 0.4)
    X = _gaussian_data(N)
    parts = set_partitions(N)
    probs = _exact(X, measure, NG, parts)
    tv = total_variation(_run(_model(measure, NG), X, 4000)["z"], parts, probs)
    assert tv < TV_TOLERANCE, tv


# ----------------------------------------------------------------------------- one move
def _log_joint(X, measure, family, labels, u=None):
    """``log p(X, Π[, u])`` from the model's distributions (not the sampler's state)."""
    labels = jnp.asarray(labels)
    lik = bnp.ConjugateMixture(family, labels).log_prob(X)
    counts = jnp.zeros(labels.shape[0], jnp.int32).at[labels].add(1)
    return float(lik + measure.log_eppf(counts, u))


@pytest.mark.parametrize(
    "measure, u",
    [(bnp.DP(1.3), None), (bnp.NGGP(1.0, 0.4, 1.0), 2.5)],
    ids=["DP", "NGGP"],
)
def test_proposal_probabilities_and_acceptance_ratio(measure, u):
    """For a fixed key the launch state is the same for every split of the pair's clusters.

    Then (a) the final restricted scan's probabilities of the 2^|S| splits sum
    to one, (b) a merge's log r is the exact log joint difference plus log q,
    and (c) the split drawn from the merged state has the opposite log r of
    the merge that undoes it.
    """
    X = jnp.asarray(_gaussian_data(N, seed=11))
    family = NG
    u_arr = jnp.asarray(1.0 if u is None else u)
    i, j = 0, 3  # the union of their clusters is {0, 1, 2, 3, 4}; S = {1, 2, 4}; 5, 6 apart
    others = [1, 2, 4]
    move = jax.jit(lambda key, state: split_merge_move_info(
        key, state, X, measure, family, u_arr, num_restricted_scans=2, pair=(i, j)
    ))
    key = jax.random.key(7)
    merged_labels = np.array([0, 0, 0, 0, 0, 1, 2])
    log_merged = _log_joint(X, measure, family, merged_labels, u)
    merge_log_ratios, log_qs = {}, []
    for bits in itertools.product([0, 1], repeat=len(others)):
        labels = merged_labels.copy()
        labels[j] = 3
        for k, b in zip(others, bits):
            labels[k] = 3 if b else 0
        state = init_clusters(family, X, labels, capacity=N)
        new, info = move(key, state)
        assert not bool(info.is_split)
        log_split = _log_joint(X, measure, family, labels, u)
        np.testing.assert_allclose(
            float(info.log_ratio), log_merged - log_split + float(info.log_proposal), atol=1e-9
        )
        merge_log_ratios[bits] = float(info.log_ratio)
        log_qs.append(float(info.log_proposal))
        if bool(info.accepted):
            assert np.array_equal(np.asarray(canonical_labels(new.labels, N)), merged_labels)
    np.testing.assert_allclose(np.exp(log_qs).sum(), 1.0, atol=1e-9)
    # the split proposed from the merged state with the same key
    state = init_clusters(family, X, merged_labels, capacity=N)
    new, info = move(key, state)
    assert bool(info.is_split)
    gaps = [abs(float(info.log_ratio) + r) for r in merge_log_ratios.values()]
    assert min(gaps) < 1e-9, gaps


def test_rank_one_scans_follow_the_restricted_gibbs_conditionals(monkeypatch):
    """NormalWishart's restricted scans carry the two clusters' predictive parameters,
    score a point against its own cluster by ``log_predictive_removed`` and update the
    parameters only when the point changes side. Any proposal computed consistently is
    exact, so the enumeration tests cannot see a wrong conditional (only slower mixing):
    here the moves, with their ``log q`` and ``log r``, equal those of the statistics path
    (the family without rank-one updates: both predictives recomputed from the sums at
    every step), over splits and merges of 3-D clusters whose points change side."""
    rng = np.random.default_rng(5)
    X = jnp.asarray(np.concatenate([rng.normal(size=(12, 3)) - 1.0, rng.normal(size=(12, 3)) + 1.0]))
    family = bnp.NormalWishart(np.zeros(3), 0.3, 5.0, np.eye(3))
    labels = np.arange(24) % 3  # three mixed clusters: the scans move points between sides

    def moves():
        move = jax.jit(lambda key, state, pair: split_merge_move_info(
            key, state, X, bnp.DP(1.0), family, pair=pair, num_restricted_scans=3))
        state = init_clusters(family, X, labels, capacity=8)
        out = []
        for t, pair in enumerate([(0, 3), (0, 1), (1, 2), (4, 5), (2, 8), (0, 13)] * 2):
            state, info = move(jax.random.key(t), state, pair)
            out.append((np.asarray(state.labels), bool(info.is_split), float(info.log_proposal),
                        float(info.log_ratio)))
        return out

    rank_one = moves()
    monkeypatch.delattr(bnp.NormalWishart, "params_add")
    stats_path = moves()
    assert {is_split for _, is_split, _, _ in rank_one} == {True, False}
    for (la, sa, qa, ra), (lb, sb, qb, rb) in zip(rank_one, stats_path):
        assert sa == sb and np.array_equal(la, lb)
        np.testing.assert_allclose([qa, ra], [qb, rb], rtol=1e-9, atol=1e-9)


def test_statistics_stay_consistent_and_overflow_is_flagged():
    n, capacity = 12, 6
    X = jnp.asarray(_gaussian_data(n, seed=2) * 4.0)  # even points near -10, odd near +10
    move = jax.jit(lambda key, state, pair: split_merge_move_info(
        key, state, X, bnp.DP(1.0), NG, jnp.ones(()), pair=pair
    ))
    rng = np.random.default_rng(0)
    state = init_clusters(NG, X, np.zeros(n, int), capacity=capacity)
    for t in range(30):
        state, _ = move(jax.random.key(t), state, tuple(rng.choice(n, 2, replace=False)))
    fresh = NG.stats_from_labels(X, state.labels, capacity)
    for a, b in zip(jax.tree.leaves(state.stats), jax.tree.leaves(fresh)):
        np.testing.assert_allclose(a, b, atol=1e-9)
    assert np.array_equal(np.bincount(np.asarray(state.labels), minlength=capacity), np.asarray(state.counts))
    assert int(state.num_clusters) >= 2 and not bool(state.overflow)
    # every slot used by a pair {2m, 2m+1} spanning both groups: splitting {0, 1} has
    # log r > 0 (always accepted) but finds no free slot: overflow is set, nothing moves
    full = init_clusters(NG, X, np.arange(n) // 2, capacity=capacity)
    new, info = move(jax.random.key(0), full, (0, 1))
    assert bool(info.is_split) and float(info.log_ratio) > 0.0 and not bool(info.accepted)
    assert bool(new.overflow) and np.array_equal(np.asarray(new.labels), np.asarray(full.labels))
    # a merge needs no slot
    new, info = move(jax.random.key(0), full, (0, 2))
    assert not bool(info.is_split) and not bool(new.overflow)


def test_bad_arguments():
    model = _model(bnp.DP(1.0), NG)
    for kwargs in (
        dict(num_split_merge=-1),
        dict(num_restricted_scans=-2),
        dict(gibbs_sweeps=-1),
        dict(num_split_merge=1.5),
        dict(num_split_merge=True),
        dict(num_split_merge=0, gibbs_sweeps=0),
        dict(capacity=0),
        dict(init_strategy="random"),
    ):
        with pytest.raises(ValueError):
            SplitMerge(model, **kwargs)
    with pytest.raises(ValueError, match="num_split_merge >= 1"):
        SplitMerge(model, num_split_merge=0, gibbs_sweeps=0)
    X = jnp.asarray(_gaussian_data(4))
    state = init_clusters(NG, X, np.zeros(4, int), capacity=4)
    with pytest.raises(ValueError, match="num_restricted_scans"):
        split_merge_move_info(jax.random.key(0), state, X, bnp.DP(1.0), NG, num_restricted_scans=-1)
    # Gibbs sweeps alone are allowed
    SplitMerge(model, num_split_merge=0, gibbs_sweeps=1)
