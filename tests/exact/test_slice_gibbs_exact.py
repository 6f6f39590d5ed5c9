"""``SliceGibbs`` (Walker's slice sampler on the stick-breaking weights of a cluster plate)
against the exact posterior of non-conjugate mixtures, by enumerating every partition of 6
points, the cluster marginals by quadrature (``test_auxiliary_exact.py``'s targets).

Cases: Poisson counts with log-normal rates under DP(1) (32 slots; the kernel's defaults, with
splits and merges) and under PitmanYor(0.3, 0.1) (64 slots: the sticks beyond the plate must
weigh less than the smallest slice variable, and Pitman-Yor sticks shrink slowly; the slice
step alone), and Normal clusters with two parameter sites (mean and scale; the slice step
alone). Power checks (at 2,000 draws per chain, where the right sampler is about 0.025): the
stick update without the points at later positions in its Beta (TV 0.10), the neighbouring
swaps' ratio without them (0.063), a chain on DP(0.3) against DP(1)'s posterior, and splits
and merges that accept a merge whose reverse split (into the first empty position) is
impossible (0.16), all detected.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

import jaxbnp as bnp
from jaxbnp._random import log_beta_pair
from jaxbnp.inference.partition import slice_gibbs

from .enumeration import total_variation
from .test_auxiliary_exact import (POISSON_X, _exact, _normal_model, _poisson_marginals, _poisson_model,
                                   _two_site_target)
from .test_gibbs_exact import TV_TOLERANCE, _run


def _tv(model, X, parts, probs, num_samples, **kwargs):
    draws = _run(model, jnp.asarray(X), num_samples, kernel_cls=bnp.SliceGibbs, **kwargs)["z"]
    return total_variation(np.asarray(draws), parts, probs)


@pytest.mark.parametrize("measure, slots, moves", [
    (bnp.DP(1.0), 32, {}),  # the defaults: swaps, splits and merges, the slice step
    (bnp.PitmanYor(0.3, 0.1), 64, {"num_split_merge": 0}),
], ids=["DP-default", "PitmanYor-slice-step"])
def test_poisson_lognormal_matches_enumeration(measure, slots, moves):
    parts, probs = _exact(POISSON_X, measure, _poisson_marginals())
    tv = _tv(_poisson_model(measure, slots=slots), POISSON_X, parts, probs, 4000, **moves)
    assert tv < TV_TOLERANCE, tv


def test_two_parameter_sites_match_enumeration():
    """``test_auxiliary_exact.py``'s two-site target (a mean and a scale), on 32 slots."""
    X, parts, probs = _two_site_target()
    tv = _tv(_normal_model(32), X, parts, probs, 4000, num_split_merge=0)
    assert tv < TV_TOLERANCE, tv


def _sticks_without_later_points(key, counts, alpha, d, dtype):
    counts = counts.astype(dtype)
    c = counts.shape[0]
    b = jnp.broadcast_to(alpha + jnp.arange(1, c + 1, dtype=dtype) * d, (c,))
    log_v, log_rest = log_beta_pair(key, 1.0 - d + counts, b)
    before = jnp.concatenate([jnp.zeros(1, dtype), jnp.cumsum(log_rest)[:-1]])
    return log_v + before, jnp.sum(log_rest)


def test_power_wrong_sticks_wrong_swaps_wrong_concentration_wrong_merges(monkeypatch):
    """The test detects sticks drawn without the points at later positions
    (``Beta(1 - d + n_p, alpha + (p + 1) d)``), swaps whose ratio forgets them, a chain on
    DP(0.3) against DP(1)'s posterior (the slice step alone), and merges accepted without
    ``merge_ok``."""
    parts, probs = _exact(POISSON_X, bnp.DP(1.0), _poisson_marginals())
    model = _poisson_model(bnp.DP(1.0), slots=32)
    alone = {"num_split_merge": 0}
    with monkeypatch.context() as patch:
        patch.setattr(slice_gibbs, "stick_log_weights", _sticks_without_later_points)
        tv = _tv(model, POISSON_X, parts, probs, 2000, **alone)
    assert tv > TV_TOLERANCE, tv
    right = slice_gibbs.swap_log_ratio
    with monkeypatch.context() as patch:
        patch.setattr(slice_gibbs, "swap_log_ratio",
                      lambda n_p, n_q, later, p, alpha, d: right(n_p, n_q, 0.0 * later, p, alpha, d))
        tv = _tv(model, POISSON_X, parts, probs, 2000, **alone)
    assert tv > TV_TOLERANCE, tv
    tv = _tv(_poisson_model(bnp.DP(0.3), slots=32), POISSON_X, parts, probs, 2000, **alone)
    assert tv > TV_TOLERANCE, tv
    moves = slice_gibbs.split_merge
    with monkeypatch.context() as patch:
        patch.setattr(slice_gibbs, "split_merge", lambda *args: moves(*args[:8]))  # no merge_ok
        tv = _tv(model, POISSON_X, parts, probs, 2000, num_split_merge=10)
    assert tv > TV_TOLERANCE, tv
