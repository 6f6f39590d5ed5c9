"""``SliceGibbs`` (Walker's slice sampler on the stick-breaking weights of a cluster plate)
against the exact posterior of non-conjugate mixtures, by enumerating every partition of 6
points, the cluster marginals by quadrature (``test_auxiliary_exact.py``'s targets).

Cases: Poisson counts with log-normal rates under DP(1) (32 slots) and under
PitmanYor(0.3, 0.1) (64 slots: the sticks beyond the plate must weigh less than the smallest
slice variable, and Pitman-Yor sticks shrink slowly), and Normal clusters with two parameter
sites (mean and scale). Power checks (measured at 2,000 draws per chain: the right sampler
about 0.025): the stick update without the points at later positions in its Beta (TV 0.10),
the neighbouring swaps' ratio without them (0.063), and a chain on DP(0.3) against DP(1)'s
posterior, all detected.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

import jaxbnp as bnp
from jaxbnp._random import log_beta_pair
from jaxbnp.inference.partition import slice_gibbs

from .enumeration import total_variation
from .test_auxiliary_exact import (POISSON_X, _exact, _poisson_marginals, _poisson_model,
                                   _subset_log_marginals, _trapezoid_log_weights)
from .test_gibbs_exact import TV_TOLERANCE, _run


def _tv(model, X, parts, probs, num_samples, **kwargs):
    draws = _run(model, jnp.asarray(X), num_samples, kernel_cls=bnp.SliceGibbs, **kwargs)["z"]
    return total_variation(np.asarray(draws), parts, probs)


@pytest.mark.parametrize("measure, slots", [(bnp.DP(1.0), 32), (bnp.PitmanYor(0.3, 0.1), 64)],
                         ids=["DP", "PitmanYor"])
def test_poisson_lognormal_matches_enumeration(measure, slots):
    parts, probs = _exact(POISSON_X, measure, _poisson_marginals())
    tv = _tv(_poisson_model(measure, slots=slots), POISSON_X, parts, probs, 4000)
    assert tv < TV_TOLERANCE, tv


def _normal_model(X):
    import numpyro
    import numpyro.distributions as dist

    z = numpyro.sample("z", bnp.Partition(bnp.DP(1.0), X.shape[0]))
    with numpyro.plate("clusters", 32):
        loc = numpyro.sample("loc", dist.Normal(0.0, 3.0))
        scale = numpyro.sample("scale", dist.LogNormal(0.0, 0.5))
    numpyro.sample("X", dist.Normal(loc[z], scale[z]), obs=X)


def test_two_parameter_sites_match_enumeration():
    X = np.array([-3.1, -2.4, -2.9, 0.2, 2.8, 3.5])
    loc = np.linspace(-15.0, 15.0, 1201)
    log_scale = np.linspace(-3.5, 3.5, 701)
    L, S = np.meshgrid(loc, log_scale, indexing="ij")
    L, S = L.ravel(), S.ravel()
    ll = stats.norm.logpdf(X[:, None], L[None], np.exp(S)[None])
    prior = stats.norm.logpdf(L, 0.0, 3.0) + stats.norm.logpdf(S, 0.0, 0.5)
    log_cell = (_trapezoid_log_weights(loc)[:, None] + _trapezoid_log_weights(log_scale)[None]).ravel()
    parts, probs = _exact(X, bnp.DP(1.0), _subset_log_marginals(ll, prior, log_cell))
    tv = _tv(_normal_model, X, parts, probs, 4000)
    assert tv < TV_TOLERANCE, tv


def _sticks_without_later_points(key, counts, alpha, d, dtype):
    counts = counts.astype(dtype)
    c = counts.shape[0]
    b = jnp.broadcast_to(alpha + jnp.arange(1, c + 1, dtype=dtype) * d, (c,))
    log_v, log_rest = log_beta_pair(key, 1.0 - d + counts, b)
    before = jnp.concatenate([jnp.zeros(1, dtype), jnp.cumsum(log_rest)[:-1]])
    return log_v + before, jnp.sum(log_rest)


def test_power_wrong_sticks_wrong_swaps_wrong_concentration(monkeypatch):
    """The test detects sticks drawn without the points at later positions
    (``Beta(1 - d + n_p, alpha + (p + 1) d)``), swaps whose ratio forgets them, and a chain
    on DP(0.3) against DP(1)'s posterior."""
    parts, probs = _exact(POISSON_X, bnp.DP(1.0), _poisson_marginals())
    model = _poisson_model(bnp.DP(1.0), slots=32)
    with monkeypatch.context() as patch:
        patch.setattr(slice_gibbs, "stick_log_weights", _sticks_without_later_points)
        tv = _tv(model, POISSON_X, parts, probs, 2000)
    assert tv > TV_TOLERANCE, tv
    right = slice_gibbs.swap_log_ratio
    with monkeypatch.context() as patch:
        patch.setattr(slice_gibbs, "swap_log_ratio",
                      lambda n_p, n_q, later, p, alpha, d: right(n_p, n_q, 0.0 * later, p, alpha, d))
        tv = _tv(model, POISSON_X, parts, probs, 2000)
    assert tv > TV_TOLERANCE, tv
    tv = _tv(_poisson_model(bnp.DP(0.3), slots=32), POISSON_X, parts, probs, 2000)
    assert tv > TV_TOLERANCE, tv
