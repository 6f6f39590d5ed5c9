"""tgMCMC's compiled global moves (``trees="device"``, the default) against the host trees.

The device moves (``jaxbnp.inference.tgmcmc.device``) must be the same exact
chain as the host moves (``TreeGuidedHost``), whose detailed balance is checked
pair by pair in ``test_tgmcmc_exact.py``:

1. ``log q(Π*|Π)`` from the array trees equals the host's for every partition
   ``Π*`` of 7 points, from several ``Π`` (DP + NormalGamma and NGGP +
   NormalWishart with ``u``), to rounding; with the probability of proposing
   nothing they sum to one.
2. The device global moves alone, as a chain under ``numpyro.infer.MCMC``,
   match the enumerated posterior (this also checks the forward sampler, the
   joint difference and the state updates after accepted moves). The full
   kernel on device trees is checked in ``test_tgmcmc_exact.py``.
"""

from __future__ import annotations

import math

import jax
import numpy as np
import pytest
from numpyro.infer import MCMC

import jaxbnp as bnp
from jaxbnp.inference.tgmcmc import device as tgmcmc_device
from jaxbnp.inference.tgmcmc.host import TreeGuidedHost, masks_from_labels

from .enumeration import canonical, set_partitions, total_variation
from .test_gibbs_exact import NG, TV_TOLERANCE, _exact, _gaussian_data, _model
from .test_tgmcmc_exact import N, NGGP, NW, STATES
from .tgmcmc_device_q import proposal_log_prob


def _case(name):
    if name == "DP-NG":
        return _gaussian_data(N), bnp.DP(1.0), NG, None
    return _gaussian_data(N, dim=2, seed=5), NGGP, NW, 2.5


@pytest.mark.parametrize("name", ["DP-NG", "NGGP-NW"])
def test_device_proposal_probabilities_equal_the_host_ones(name):
    X, measure, family, u = _case(name)
    host = TreeGuidedHost(X, measure, family, u=u)
    parts = set_partitions(N)
    for labels in STATES[1:4]:
        masks = masks_from_labels(labels)
        total, compared = 0.0, 0
        for p in parts:
            want = host.log_q(masks, masks_from_labels(p))
            got = proposal_log_prob(X, measure, family, u, labels, np.asarray(p))
            if canonical(p) == canonical(labels):
                assert np.isneginf(got)
                continue
            if np.isneginf(want):
                assert np.isneginf(got), p
                continue
            np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)
            total += math.exp(got)
            compared += 1
        assert compared >= 10
        np.testing.assert_allclose(total + math.exp(host.log_stay_prob(masks)), 1.0, rtol=1e-9)


def test_device_global_moves_alone_match_enumeration():
    X = _gaussian_data(N)
    parts = set_partitions(N)
    probs = _exact(X, bnp.DP(1.0), NG, parts)
    mcmc = MCMC(
        bnp.TreeGuidedMCMC(_model(bnp.DP(1.0), NG), num_global_moves=4, local_moves=False),
        num_warmup=50, num_samples=2500, num_chains=8, chain_method="vectorized", progress_bar=False,
    )
    mcmc.run(jax.random.key(1), X, extra_fields=("num_accepted", "num_proposed"))
    extra = mcmc.get_extra_fields()
    assert 0.2 < float(extra["num_accepted"].sum() / extra["num_proposed"].sum()) < 0.95
    tv = total_variation(np.asarray(mcmc.get_samples()["z"]), parts, probs)
    assert tv < TV_TOLERANCE, tv


def test_trees_argument_is_checked():
    model = _model(bnp.DP(1.0), NG)
    with pytest.raises(ValueError, match="trees must be 'device'"):
        bnp.TreeGuidedMCMC(model, trees="gpu")
    with pytest.raises(ValueError, match="max_parts"):
        bnp.TreeGuidedMCMC(model, max_parts=1)


def test_device_split_without_a_free_slot_raises_instead_of_dropping():
    """Three far-apart groups, two slots: a global split that needs a third slot raises."""
    X = np.concatenate([_gaussian_data(4) - 30.0, _gaussian_data(4), _gaussian_data(4) + 30.0])
    kernel = bnp.TreeGuidedMCMC(_model(bnp.DP(1.0), NG), num_global_moves=10, local_moves=False,
                                init="one", capacity=2)
    mcmc = MCMC(kernel, num_warmup=20, num_samples=5, progress_bar=False)
    with pytest.raises(Exception, match="cluster slots are in use.*larger capacity"):
        mcmc.run(jax.random.key(0), X)


def _trees(pool, roots):
    """Every cluster's tree as (node, left, right, size, log_h, log_t) in pre-order."""
    out = {}
    for k, r in enumerate(np.asarray(roots)):
        if r < 0:
            continue
        order, count, _ = tgmcmc_device.preorder(pool, int(r))
        out[k] = [(int(v), int(pool.left[v]), int(pool.right[v]), int(pool.size[v]), float(pool.log_h[v]),
                   float(pool.log_t[v])) for v in np.asarray(order)[: int(count)]]
    return out


def test_kept_forest_gives_the_draws_and_trees_of_a_fresh_build():
    """``global_moves_forest`` (the kernel's default) from the trees of an earlier partition,
    with a few points moved, and again after ``u`` changed: the same draws as
    ``global_moves`` rebuilding every tree, and the forest it returns holds the
    canonical trees of the partition it returns."""
    n, capacity = 20, 20
    X = _gaussian_data(n, dim=2, seed=5)
    family = NW
    start = np.arange(n, dtype=np.int32) % 8  # 8 clusters that merges improve
    key = jax.random.key(3)
    forest = tgmcmc_device.empty_forest(X, NGGP, family, 2.5, capacity)
    forest, _ = tgmcmc_device.global_moves_forest(key, forest, start, X, NGGP, family, 2.5, num_moves=12)
    labels_a = np.asarray(forest.labels)  # the partition the kept trees are of
    labels_b = labels_a.copy()
    labels_b[[1, 7]] = labels_a[[2, 3]]  # moved to other clusters (or kept, if the same)
    labels_b[12] = int(np.setdiff1d(np.arange(capacity), labels_a)[0])  # into an empty slot
    assert not np.array_equal(labels_a, labels_b)
    key = jax.random.key(6)  # accepts moves from both states
    for labels, u in [(labels_b, 2.5), (labels_a, 3.0)]:
        new, kept = tgmcmc_device.global_moves_forest(key, forest, labels, X, NGGP, family, u, num_moves=12)
        fresh_labels, fresh = tgmcmc_device.global_moves(key, labels, X, NGGP, family, u, capacity=capacity,
                                                         num_moves=12)
        # labels, accepted, proposed, no_room: the same draws
        np.testing.assert_array_equal(np.asarray(new.labels), np.asarray(fresh_labels))
        for name in ("num_accepted", "num_proposed", "num_log_accept", "no_room"):
            np.testing.assert_array_equal(np.asarray(getattr(kept, name)), np.asarray(getattr(fresh, name)))
        np.testing.assert_allclose(float(kept.mean_log_accept), float(fresh.mean_log_accept),
                                   rtol=1e-12)  # mean log r, to rounding
        assert int(kept.num_accepted) > 0  # some moves were accepted, so the returned trees were edited
        ctx = tgmcmc_device.make_context(X, NGGP, family, u)
        pool, roots = tgmcmc_device.build_forest(ctx, new.labels, capacity)
        np.testing.assert_array_equal(np.asarray(new.roots), np.asarray(roots))
        got, want = _trees(new.pool, new.roots), _trees(pool, roots)
        assert got.keys() == want.keys()
        for k in want:  # the same shapes; potentials equal to rounding (separately compiled programs)
            assert [t[:4] for t in got[k]] == [t[:4] for t in want[k]]
            np.testing.assert_allclose([t[4:] for t in got[k]], [t[4:] for t in want[k]], rtol=1e-12)


def test_preorder_matches_a_recursive_walk():
    """The stackless ``preorder``: parents first, left before right, every node of the
    tree once, and SampleSub's ``log d`` beside each internal node (a one-point tree too)."""
    n = 30
    X = _gaussian_data(n, dim=2, seed=11)
    labels = np.array([0] * 12 + [1] * 9 + [2] * 8 + [3], np.int32)[np.random.default_rng(0).permutation(n)]
    ctx = tgmcmc_device.make_context(X, NGGP, NW, 2.5)
    pool, roots = tgmcmc_device.build_forest(ctx, labels, 6)
    left, right = np.asarray(pool.left), np.asarray(pool.right)
    log_t, log_h = np.asarray(pool.log_t), np.asarray(pool.log_h)

    def walk(v):
        return [v] + (walk(left[v]) + walk(right[v]) if left[v] >= 0 else [])

    for k in range(4):
        r = int(roots[k])
        order, count, log_d = tgmcmc_device.preorder(pool, r)
        want = walk(r)
        assert int(count) == len(want) == 2 * np.sum(labels == k) - 1
        np.testing.assert_array_equal(np.asarray(order)[: len(want)], want)
        d = np.asarray(log_d)
        for i, v in enumerate(want):
            if left[v] >= 0:
                np.testing.assert_allclose(d[i], log_t[left[v]] + log_t[right[v]] - log_h[v], rtol=1e-12)
            else:
                assert np.isneginf(d[i])
        assert np.all(np.isneginf(d[len(want):]))


def test_draw_index_follows_its_probabilities():
    """``draw_index`` (SampleSub's draw): frequencies over 40,000 draws within 0.02 in
    total variation of ``exp(log_p)``, and never an entry of probability zero."""
    rng = np.random.default_rng(2)
    w = rng.gamma(0.5, size=60)
    w[rng.random(60) < 0.3] = 0.0
    w[-5:] = 0.0  # zero tail: a draw rounded past the total must not land there
    with np.errstate(divide="ignore"):
        log_p = np.log(w / w.sum())
    keys = jax.random.split(jax.random.key(0), 40_000)
    draws = np.asarray(jax.vmap(lambda k: tgmcmc_device.draw_index(k, log_p))(keys))
    assert np.all(w[draws] > 0)
    freq = np.bincount(draws, minlength=60) / draws.size
    assert 0.5 * np.abs(freq - w / w.sum()).sum() < 0.02
