"""Diagnostics (ESS, split R-hat, summary, ArviZ) and plots."""

from __future__ import annotations

import types

import numpy as np
import pytest
from numpyro.diagnostics import effective_sample_size as numpyro_ess
from numpyro.diagnostics import split_gelman_rubin
from numpyro.infer import MCMC

import jaxbnp as bnp
from jaxbnp import diagnostics, metrics, plot
from jaxbnp.checkpoint import CheckpointedRun


def _draws():
    """Hand-made draws of 2 chains x 20 iterations of a partition of 6 points."""
    rng = np.random.default_rng(3)
    z = np.where(rng.random((2, 20, 6)) < 0.8, np.array([0, 0, 0, 1, 1, 1]), rng.integers(0, 3, (2, 20, 6)))
    return z, rng.normal(-30.0, 1.0, (2, 20))


# ----------------------------------------------------------------------------- ESS and R-hat
def test_ess_and_rhat_match_numpyro_and_behave():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(4, 200))
    assert diagnostics.effective_sample_size(x) == pytest.approx(float(numpyro_ess(x)))
    assert diagnostics.split_rhat(x) == pytest.approx(float(split_gelman_rubin(x)))
    assert diagnostics.split_rhat(x) < 1.02 and diagnostics.effective_sample_size(x) > 400
    sticky = np.cumsum(rng.normal(size=(4, 200)), axis=1)  # random walks: poorly mixed
    assert diagnostics.effective_sample_size(sticky) < 50 and diagnostics.split_rhat(sticky) > 1.1
    shifted = x + np.array([[0.0], [0.0], [0.0], [5.0]])  # one chain elsewhere
    assert diagnostics.split_rhat(shifted) > 1.5
    # constant quantities (K often is): ESS = number of draws, R-hat = 1; chains stuck apart: inf
    assert diagnostics.effective_sample_size(np.full((2, 10), 3.0)) == 20.0
    assert diagnostics.split_rhat(np.full((2, 10), 3.0)) == 1.0
    assert diagnostics.split_rhat(np.r_[np.full((1, 10), 3.0), np.full((1, 10), 4.0)]) == np.inf
    assert diagnostics.effective_sample_size(x[0]) == pytest.approx(float(numpyro_ess(x[:1])))


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: diagnostics.split_rhat(np.zeros((2, 3))), "at least 4 draws"),
        (lambda: diagnostics.effective_sample_size(np.zeros((2, 1))), "at least 2 draws"),
        (lambda: diagnostics.effective_sample_size(np.array([[1.0, np.nan]])), "NaN"),
        (lambda: diagnostics.summary(object()), "Pass a NumPyro MCMC"),
        (lambda: diagnostics.summary({"log_joint": None}), "neither"),
        (lambda: diagnostics.summary(MCMC(bnp.CollapsedGibbs(lambda X: None), num_warmup=1, num_samples=1)),
         "no draws"),
        (lambda: diagnostics.summary(types.SimpleNamespace(labels_=np.zeros(3))), "single partition"),
    ],
)
def test_bad_input_raises(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# ----------------------------------------------------------------------------- summaries
def test_summary_from_arrays_and_from_a_run_object():
    z, lj = _draws()
    k = metrics.count_clusters(z)
    s = diagnostics.summary({"labels": z, "log_joint": lj})
    assert s["num_chains"] == 2 and s["num_draws"] == 20
    assert s["num_clusters"]["mean"] == pytest.approx(k.mean())
    assert s["num_clusters"]["frequencies"] == metrics.num_clusters_summary(k)["frequencies"]
    assert s["num_clusters"]["r_hat"] == pytest.approx(diagnostics.split_rhat(k))
    assert s["log_joint"]["ess"] == pytest.approx(diagnostics.effective_sample_size(lj))
    # an object with MCMC's get_samples / get_extra_fields (here a CheckpointedRun)
    run = CheckpointedRun({"z": z}, {"log_joint": lj, "num_clusters": k}, None, 20, 20, 0, 2, 1,
                          ("log_joint", "num_clusters"), "z")
    assert diagnostics.summary(run) == s
    drawn = diagnostics.draws_by_chain(run)
    np.testing.assert_array_equal(drawn["labels"], z)
    assert drawn["labels_site"] == "z"


def test_to_arviz_from_arrays():
    z, lj = _draws()
    idata = diagnostics.to_arviz({"labels": z, "log_joint": lj})
    import arviz  # after to_arviz, which imports it without its once-a-day FutureWarning
    assert idata.posterior["z"].dims == ("chain", "draw", "point")
    np.testing.assert_array_equal(idata.posterior["z"].values, z)
    np.testing.assert_array_equal(idata.sample_stats["num_clusters"].values, metrics.count_clusters(z))
    assert idata.sample_stats["log_joint"].shape == (2, 20)
    rhat = arviz.rhat(idata.sample_stats, var_names=["log_joint"], method="split")["log_joint"].item()
    assert rhat == pytest.approx(diagnostics.split_rhat(lj), rel=1e-12)  # same draws, same estimator


# ----------------------------------------------------------------------------- plots
def test_plots():
    import matplotlib.pyplot as plt

    z, lj = _draws()
    k = metrics.count_clusters(z)
    axes = plot.plot_trace({"labels": z, "log_joint": lj})
    assert len(axes[0].lines) == 2
    np.testing.assert_array_equal(axes[1].lines[1].get_ydata(), k[1])
    psm = metrics.posterior_similarity(z)
    estimate = metrics.point_estimate(z)
    ax = plot.plot_coclustering(psm, labels=estimate)
    order = np.argsort(estimate, kind="stable")
    np.testing.assert_allclose(ax.images[0].get_array(), psm[np.ix_(order, order)])
    linkage = np.array([[0, 1, 0.5, 2], [2, 3, 1.0, 3]], dtype=float)
    ax = plot.plot_dendrogram(linkage, labels=["a", "b", "c"])
    assert ax.dendrogram_["ivl"] == ["c", "a", "b"]
    ax = plot.plot_clusters(np.random.default_rng(0).normal(size=(6, 3)), estimate)
    assert ax.get_xlabel() == "PC 1"
    with pytest.raises(ValueError, match="square"):
        plot.plot_coclustering(np.zeros((2, 3)))
    with pytest.raises(ValueError, match="permutation"):
        plot.plot_coclustering(psm, order=np.zeros(6, int))
    with pytest.raises(ValueError, match="linkage"):
        plot.plot_dendrogram(np.zeros((2, 3)))
    with pytest.raises(ValueError, match="linkage"):
        plot.plot_dendrogram(np.array([[0, 1, 0.5, 2], [0, 1, 1.0, 3]], dtype=float))
    with pytest.raises(ValueError, match="log_joint"):
        plot.plot_trace({"labels": z})
    plt.close("all")


def test_tree_plots():
    """One plot_dendrogram for a linkage matrix and a tree; plot_bhmc_tree; the public pyplot()."""
    from jaxbnp.models import ddt

    plt = plot.pyplot()
    tree = ddt.comb_tree(4)
    ax = plot.plot_dendrogram(tree, t_stop=0.5, labels=list("abcd"))
    k = len(set(np.asarray(ddt.cut_tree(tree, 0.5)).tolist()))
    assert ax.get_title() == f"cut at t = 0.50: {k} clusters"
    assert ax.get_ylabel() == "1 - divergence time"
    np.testing.assert_allclose(sorted(np.max(ax.dendrogram_["dcoord"], axis=1)),
                               sorted(ddt.to_linkage(tree)[:, 2]))
    with pytest.raises(ValueError, match="t_stop needs a tree"):
        plot.plot_dendrogram(ddt.to_linkage(tree), t_stop=0.5)
    paths = np.array([[1, 3], [1, 3], [1, 4], [2, 5]])
    ax = plot.plot_bhmc_tree(paths, labels_true=np.array([0, 0, 1, 2]))
    assert ax.get_title() == "BHMC tree: 3 leaves, 4 points"
    with pytest.raises(ValueError, match="paths"):
        plot.plot_bhmc_tree(np.zeros(3))
    plt.close("all")
