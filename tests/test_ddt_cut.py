"""The seed's cut model (docs/mathematics.md §5, "The cut model"): the cached data term, model
reading and its errors, other families, keys. The exact checks are in
``tests/exact/test_ddt_cut_exact.py``."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.infer import MCMC

import jaxbnp as bnp
from jaxbnp.inference.trees import cut
from jaxbnp.models import ddt

RNG = np.random.default_rng(0)
X2 = np.concatenate([RNG.normal(-2, 0.5, (6, 2)), RNG.normal(2, 0.5, (6, 2))])


def cut_model(family, c=1.0, t_stop=0.5):
    def model(X):
        tree = numpyro.sample("tree", bnp.DiffusionTree(c, X.shape[0]))
        z = numpyro.deterministic("z", bnp.cut_tree(tree, t_stop))
        numpyro.sample("X", bnp.ConjugateMixture(family, z), obs=X)

    return model


def test_cached_data_term_matches_a_full_evaluation():
    """After every sweep, the data term kept by the touched clusters' changes equals
    ``ConjugateMixture(family, cut_tree(tree, t_s)).log_prob(X)``, and the structure term a
    full evaluation (NormalWishart, 12 points, ``c`` and ``t_s`` sampled)."""
    family = bnp.NormalWishart.from_data(X2)
    hyper = cut.CutHyperpriors(dist.Gamma(2.0, 2.0), dist.Beta(2.0, 2.0))
    alg = cut.algorithm(X2, family, hyper)
    state = alg.init(jax.random.key(0), c=1.0, t_stop=0.5)
    step = jax.jit(alg.step)
    t_stops = set()
    for i in range(30):
        state, info = step(jax.random.key(i), state)
        labels = ddt.cut_tree(state.tree, state.t_stop)
        full = bnp.ConjugateMixture(family, labels).log_prob(jnp.asarray(X2, state.tree.time.dtype))
        np.testing.assert_allclose(state.log_likelihood, full, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(state.log_prior, ddt.structure_log_prior(state.tree, state.c), rtol=1e-6)
        t_stops.add(float(state.t_stop))
    assert len(t_stops) > 10  # t_s moves
    assert int(info.subtree_accepted) > 0


def test_candidate_weights_are_the_partition_likelihood_change():
    """The exchange's branch weights: at ``d >= t_s`` the leaf joins the edge's cluster
    (the change of the partition's log likelihood), at ``d < t_s`` every edge weighs the same."""
    family = bnp.NormalGamma(0.0, 0.5, 2.0, 1.0)
    n = 6
    X = jnp.asarray(RNG.normal(size=(n, 1)))
    tree = ddt.sample_tree(jax.random.key(3), 1.0, n)
    from jaxbnp.inference.trees.moves import detach_leaves

    leaf = jnp.array([4], jnp.int32)
    det = detach_leaves(tree, leaf)
    stats = family.point_stats(X)
    t_stop = 0.5
    rest = np.delete(np.arange(n), 4)
    checked = 0
    for d in (0.3, 0.8):
        w = np.asarray(cut.candidate_log_weights(det.tree, det.in_tree, stats, family, t_stop, 4, d))
        p = det.tree.parent
        tp = np.where(p >= 0, np.asarray(det.tree.time)[np.maximum(p, 0)], 0.0)
        valid = np.asarray(det.in_tree) & (tp < d) & (d < np.asarray(det.tree.time))
        for x in np.flatnonzero(valid):
            new, _ = ddt.attach(det.tree, det.root, 4, x, d, det.freed[0])
            full = bnp.ConjugateMixture(family, ddt.cut_tree(new, t_stop)).log_prob(X)
            # the partial tree's own partition of the other leaves
            part = np.asarray(ddt.cut_tree(new, t_stop))
            before = bnp.ConjugateMixture(family, jnp.asarray(part[rest])).log_prob(X[rest])
            expected = (full - before) if d >= t_stop else 0.0
            checked += 1
            if d < t_stop:
                assert w[x] == 0.0
            else:
                np.testing.assert_allclose(w[x], expected, rtol=1e-5, atol=1e-5)
    assert checked >= 4, checked


@pytest.mark.parametrize("family, data", [
    (bnp.DirichletMultinomial(np.ones(3)), np.eye(3)[RNG.integers(0, 3, 8)] * 4),
    (bnp.BetaBernoulli(np.ones(4), np.ones(4)), (RNG.random((8, 4)) < 0.5).astype(float)),
])
def test_other_families_and_both_key_types(family, data):
    """Any conjugate family; ``jax.random.PRNGKey`` and ``jax.random.key`` give the same draws."""
    model = cut_model(family)
    out = []
    for key in (jax.random.PRNGKey(4), jax.random.key(4)):
        mcmc = MCMC(bnp.DiffusionTreeMCMC(model), num_warmup=5, num_samples=10, progress_bar=False)
        mcmc.run(key, jnp.asarray(data), extra_fields=("log_joint",))
        z = np.asarray(mcmc.get_samples()["z"])
        assert z.shape == (10, 8) and np.isfinite(mcmc.get_extra_fields()["log_joint"]).all()
        out.append(z)
    np.testing.assert_array_equal(out[0], out[1])


def _run(model, X=X2):
    MCMC(bnp.DiffusionTreeMCMC(model), num_warmup=1, num_samples=1, progress_bar=False).run(
        jax.random.key(0), jnp.asarray(X))


def test_models_the_kernel_cannot_read_get_clear_errors():
    family = bnp.NormalGamma(0.0, 1.0, 2.0, 1.0)

    def by_count(X):
        tree = numpyro.sample("tree", bnp.DiffusionTree(1.0, X.shape[0]))
        z = numpyro.deterministic("z", bnp.cut_tree(tree, num_clusters=2))
        numpyro.sample("X", bnp.ConjugateMixture(family, z), obs=X)

    with pytest.raises(ValueError, match="not num_clusters"):
        _run(by_count)

    def fixed_labels(X):
        numpyro.sample("tree", bnp.DiffusionTree(1.0, X.shape[0]))
        numpyro.sample("X", bnp.ConjugateMixture(family, jnp.zeros(X.shape[0], jnp.int32)), obs=X)

    with pytest.raises(ValueError, match="bnp.cut_tree\\(tree, t_stop\\)"):
        _run(fixed_labels)

    def positive_t_stop(X):
        t = numpyro.sample("t_stop", dist.Gamma(2.0, 2.0))
        tree = numpyro.sample("tree", bnp.DiffusionTree(1.0, X.shape[0]))
        numpyro.sample("X", bnp.ConjugateMixture(family, bnp.cut_tree(tree, t)), obs=X)

    with pytest.raises(ValueError, match=r"must live on \(0, 1\)"):
        _run(positive_t_stop)

    with pytest.raises(ValueError, match=r"t_stop must be a number in \(0, 1\)"):
        _run(cut_model(family, t_stop=1.5))

    def both(X):
        tree = numpyro.sample("tree", bnp.DiffusionTree(1.0, X.shape[0]))
        numpyro.sample("X", bnp.ConjugateMixture(family, bnp.cut_tree(tree, 0.5)), obs=X)
        numpyro.sample("Y", bnp.BrownianLeaves(tree, 1.0, 0.1), obs=X)

    with pytest.raises(ValueError, match="exactly one observed data site"):
        _run(both)

    def extra_latent(X):
        m0 = numpyro.sample("m0", dist.Normal(0.0, 1.0))
        tree = numpyro.sample("tree", bnp.DiffusionTree(1.0, X.shape[0]))
        numpyro.sample("X", bnp.ConjugateMixture(bnp.NormalGamma(m0, 1.0, 2.0, 1.0),
                                                 bnp.cut_tree(tree, 0.5)), obs=X)

    with pytest.raises(ValueError, match=r"latent sites \['m0'\]"):
        _run(extra_latent)


def test_cut_tree_outside_a_model_sends_nothing():
    """``cut_tree`` is a plain function outside NumPyro handlers; inside, the trace records
    the cut (the message the kernels read) next to the user's sites."""
    tree = ddt.sample_tree(jax.random.key(0), 1.0, 5)
    labels = bnp.cut_tree(tree, 0.5)
    assert labels.shape == (5,)
    tr = numpyro.handlers.trace(numpyro.handlers.seed(cut_model(bnp.NormalGamma(0.0, 1.0, 2.0, 1.0)), 0)).get_trace(
        jnp.zeros((5, 1)))
    cuts = [s for s in tr.values() if s["type"] == ddt.CUT_MESSAGE]
    assert len(cuts) == 1 and cuts[0]["value"] is tr["z"]["value"] and cuts[0]["t_stop"] == 0.5


def test_fit_ddt_offers_the_cut_model():
    """``fit_ddt(model="cut")``: the best draw's partition at its sampled ``t_stop`` (or a fixed
    one); from the Ward tree no cluster mixes two well separated groups."""
    from jaxbnp.inference.trees.fit import fit_ddt

    fit = fit_ddt(X2, num_chains=2, num_samples=20, num_warmup=10, key=jax.random.key(0), model="cut")
    assert fit.sigma is None and 0.0 < fit.t_stop < 1.0
    assert set(fit.samples) == {"tree", "c", "t_stop"}
    np.testing.assert_array_equal(fit.labels, ddt.cut_tree(fit.tree, jnp.asarray(fit.t_stop, fit.tree.time.dtype)))
    # from the Ward tree no cluster mixes the two groups (the best draw may split a group)
    assert not set(fit.labels[:6].tolist()) & set(fit.labels[6:].tolist()), fit.labels
    fixed = fit_ddt(X2, num_chains=2, num_samples=5, num_warmup=0, key=jax.random.key(0), model="cut",
                    t_stop=0.3, family=bnp.NormalGamma.from_data(X2))
    assert fixed.t_stop == 0.3 and set(fixed.samples) == {"tree", "c"}
    with pytest.raises(ValueError, match="num_clusters does not apply"):
        fit_ddt(X2, model="cut", num_clusters=2)
    with pytest.raises(ValueError, match="options of model='cut'"):
        fit_ddt(X2, family=bnp.NormalGamma.from_data(X2))
    with pytest.raises(ValueError, match="model must be"):
        fit_ddt(X2, model="gaussian")


def test_cli_ddt_model_cut(tmp_path, capsys, monkeypatch):
    from jaxbnp.cli import main

    np.savetxt(tmp_path / "x.csv", X2, delimiter=",")
    monkeypatch.chdir(tmp_path)
    assert main(["cluster", "x.csv", "--method", "ddt", "--ddt-model", "cut", "--chains", "2",
                 "--warmup", "10", "--samples", "20", "--out", "d"]) == 0
    out = capsys.readouterr().out
    assert "cut model" in out
    labels = np.loadtxt(tmp_path / "d" / "labels.csv", skiprows=1)
    assert labels.shape == (12,) and not set(labels[:6].tolist()) & set(labels[6:].tolist()), labels
    with pytest.raises(SystemExit, match="--ddt-model cut applies"):
        main(["cluster", "x.csv", "--method", "ddt", "--ddt-model", "cut", "--ddt-clusters", "3"])


def test_same_draws_whatever_the_chain_method():
    """``chain_method="sequential"`` and ``"vectorized"`` give the same draws on the cut model."""
    model = cut_model(bnp.NormalGamma(0.0, 1.0, 2.0, 1.0))
    draws = {}
    for method in ("sequential", "vectorized"):
        mcmc = MCMC(bnp.DiffusionTreeMCMC(model), num_warmup=3, num_samples=5, num_chains=2,
                    chain_method=method, progress_bar=False)
        mcmc.run(jax.random.key(5), jnp.asarray(X2[:8]))
        s = mcmc.get_samples(group_by_chain=True)
        draws[method] = (np.asarray(s["z"]), np.asarray(s["tree"].time))
    np.testing.assert_array_equal(draws["sequential"][0], draws["vectorized"][0])
    # the trees too (batched and one-chain programs may round the last bit differently)
    np.testing.assert_allclose(draws["sequential"][1], draws["vectorized"][1], rtol=1e-5)
    assert len(np.unique(draws["sequential"][1][:, :, -1])) > 2  # the chains move
