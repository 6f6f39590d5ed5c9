"""NumPyro's contract on keys: every public kernel and fitting function takes
``jax.random.PRNGKey(seed)`` (legacy ``uint32`` key data, what NumPyro's examples use) as
well as ``jax.random.key(seed)`` (a typed key), and gives the same draws for the same seed.

Each entry runs on a few points for a few iterations with both kinds of key; the draws
(labels, trees, paths) must be equal exactly and the floats to the last bit. The
reference is computed once per entry with the typed key (``_typed`` cache), so a broken
entry fails for the legacy key alone. ``test_a_wrong_entry_is_caught`` is the power check:
an entry that ignores part of its key is found.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.infer import MCMC, NUTS, Gibbs, HMCGibbs

import jaxbnp as bnp
from jaxbnp.inference import runner
from jaxbnp.inference.partition import moves

SEED = 3
X = np.r_[np.random.default_rng(0).normal(-3.0, 0.6, (6, 2)), np.random.default_rng(1).normal(3.0, 0.6, (6, 2))]
FAMILY = bnp.NormalWishart.from_data(X)


def dp_model(X):
    z = numpyro.sample("z", bnp.Partition(bnp.DP(1.0), X.shape[0]))
    numpyro.sample("X", bnp.ConjugateMixture(FAMILY, z), obs=X)


def nggp_model(X):
    u = numpyro.sample("u", bnp.AuxiliaryU())
    z = numpyro.sample("z", bnp.Partition(bnp.NGGP(1.0, 0.3, 1.0), X.shape[0], u=u))
    numpyro.sample("X", bnp.ConjugateMixture(FAMILY, z), obs=X)


def alpha_model(X):
    alpha = numpyro.sample("alpha", dist.Gamma(2.0, 2.0))
    z = numpyro.sample("z", bnp.Partition(bnp.DP(alpha), X.shape[0]))
    numpyro.sample("X", bnp.ConjugateMixture(FAMILY, z), obs=X)


def student_model(X):  # any likelihood, its parameters in a cluster plate (AuxiliaryGibbs)
    z = numpyro.sample("z", bnp.Partition(bnp.DP(1.0), X.shape[0]))
    with numpyro.plate("clusters", 8):
        mu = numpyro.sample("mu", dist.Normal(0.0, 3.0).expand([2]).to_event(1))
    numpyro.sample("X", dist.StudentT(3.0, mu[z], 1.0).to_event(1), obs=X)


def slice_model(X):  # the same with room for the sticks (SliceGibbs)
    z = numpyro.sample("z", bnp.Partition(bnp.DP(1.0), X.shape[0]))
    with numpyro.plate("clusters", 32):
        mu = numpyro.sample("mu", dist.Normal(0.0, 3.0).expand([2]).to_event(1))
    numpyro.sample("X", dist.StudentT(3.0, mu[z], 1.0).to_event(1), obs=X)


def tree_model(X):
    tree = numpyro.sample("tree", bnp.DiffusionTree(1.2, X.shape[0]))
    numpyro.sample("X", bnp.BrownianLeaves(tree, 0.9, 0.2), obs=X)


class _MCMCEntry:
    """An entry that runs one ``MCMC`` object on one data array: the reference run (typed
    key) and the legacy key's run reuse the kernel and what it compiled for its start, as a
    user who reruns would (146 s for this file before, 102 s so, ``-n 0``). It runs with
    NumPyro's progress bar, a user's default: NumPyro 0.22 compiles its sampling loop again on
    each run without one (``fori_collect`` passes a fresh ``jit`` of its body as a static
    argument), and with one the legacy key's run compiles nothing (this file, ``-n 0``: 167 s
    without the bar, 112 s with it)."""

    def __init__(self, make_kernel, num_chains=1, extra=(), warmup_then_run=False):
        self.make_kernel, self.num_chains, self.extra = make_kernel, num_chains, extra
        self.warmup_then_run, self.mcmc = warmup_then_run, None

    def __call__(self, key):
        if self.mcmc is None:  # one data array too: NumPyro's cache knows arguments by id
            self.data = jnp.asarray(X)
            self.mcmc = MCMC(self.make_kernel(), num_warmup=2, num_samples=3,
                             num_chains=self.num_chains, chain_method="vectorized")
            # NumPyro's default, which it turns off under pytest-xdist and CI: with the bar its
            # loop is reused by the second run, without it compiled again
            self.mcmc.progress_bar = True
        mcmc = self.mcmc
        if self.warmup_then_run:  # NumPyro puts the user's key into the warmed-up state as it is
            mcmc.warmup(key, self.data)  # (warmup starts afresh: no state of the last run)
        mcmc.run(key, self.data, extra_fields=self.extra)
        return {"samples": mcmc.get_samples(), "extra": mcmc.get_extra_fields()}


def _partition(kernel_cls, model=dp_model, **kw):
    return _MCMCEntry(lambda: kernel_cls(model, **kw), extra=("log_joint",))


def _labels(state):
    return state.z["z"]


ENTRIES = {
    "CollapsedGibbs": _partition(bnp.CollapsedGibbs, init_strategy="prior"),
    "CollapsedGibbs/nggp": _partition(bnp.CollapsedGibbs, nggp_model),
    "CollapsedGibbs/alpha": _partition(bnp.CollapsedGibbs, alpha_model, update_hyperparameters=True),
    "SplitMerge": _partition(bnp.SplitMerge, num_split_merge=2),
    "TreeGuidedMCMC": _partition(bnp.TreeGuidedMCMC),
    "SubClusterMCMC": _partition(bnp.SubClusterMCMC, capacity=12),
    # NumPyro splits the key for the chains, then puts the split keys into the warmed-up state
    # as they are (legacy key data in the kernel's state): both paths in one entry
    "SubClusterMCMC/2 chains, warmup then run": _MCMCEntry(
        lambda: bnp.SubClusterMCMC(dp_model, capacity=12), num_chains=2, warmup_then_run=True),
    "AuxiliaryGibbs": _MCMCEntry(lambda: bnp.AuxiliaryGibbs(student_model), num_chains=2, extra=("log_joint",)),
    "SliceGibbs": _MCMCEntry(lambda: bnp.SliceGibbs(slice_model), num_chains=2, extra=("log_joint",)),
    "PartitionKernel": _MCMCEntry(lambda: bnp.PartitionKernel(
        dp_model, moves.chain(moves.split_merge(1), moves.gibbs_sweep()))),
    "Gibbs(NUTS, CollapsedGibbs)": _MCMCEntry(
        lambda: Gibbs([(bnp.CollapsedGibbs(alpha_model), ["z"]), (NUTS(alpha_model), None)])),
    "HMCGibbs(collapsed_gibbs_fn)": _MCMCEntry(lambda: HMCGibbs(
        NUTS(alpha_model), gibbs_fn=bnp.collapsed_gibbs_fn(alpha_model, jnp.asarray(X)),
        gibbs_sites=["z"])),
    "DiffusionTreeMCMC": _MCMCEntry(lambda: bnp.DiffusionTreeMCMC(tree_model)),
    "PopulationDDT": _MCMCEntry(lambda: bnp.PopulationDDT(tree_model, 2, 2), num_chains=2),
    "fit_ddt": lambda key: bnp.fit_ddt(X, num_chains=2, num_samples=2, num_warmup=1, key=key,
                                       progress_bar=False).samples,
    "fit_bhmc": lambda key: bnp.fit_bhmc(X, key=key, depth=2, num_samples=2,
                                         num_warmup=1).log_lik,
    "fit_subcluster_chunked": lambda key: bnp.fit_subcluster_chunked(
        X, bnp.DP(1.0), FAMILY, 3, key=key, capacity=6).labels,
    "runner.run": lambda key: runner.run(lambda c: bnp.SubClusterMCMC(bnp.mixture_model, capacity=c),
                                         key, (jnp.asarray(X), bnp.DP(1.0), FAMILY), num_warmup=1,
                                         num_samples=2, num_chains=2, capacity=6,
                                         collect=_labels, progress_bar=False,
                                         cache_key="test_keys").samples,
}

_typed: dict = {}


def _assert_same(a, b):
    leaves_a, leaves_b = jax.tree.leaves(a), jax.tree.leaves(b)
    assert len(leaves_a) == len(leaves_b) > 0
    for x, y in zip(leaves_a, leaves_b):
        x, y = np.asarray(x), np.asarray(y)
        assert x.shape == y.shape and x.dtype == y.dtype
        np.testing.assert_array_equal(x, y)


def _reference(name):
    if name not in _typed:
        _typed[name] = ENTRIES[name](jax.random.key(SEED))
    return _typed[name]


@pytest.mark.parametrize("name", sorted(ENTRIES))
def test_legacy_and_typed_keys_give_the_same_draws(name):
    legacy = ENTRIES[name](jax.random.PRNGKey(SEED))
    _assert_same(legacy, _reference(name))


def test_a_wrong_entry_is_caught():
    """Power: another seed (the same kernel and data) gives other draws, so the
    comparison above can fail."""
    other = ENTRIES["SubClusterMCMC"](jax.random.PRNGKey(SEED + 1))
    with pytest.raises(AssertionError):
        _assert_same(other, _reference("SubClusterMCMC"))


def test_anything_else_is_a_clear_error():
    from jaxbnp._random import typed_key

    with pytest.raises(TypeError, match="random key"):
        typed_key(np.float32(0.5))
    with pytest.raises(TypeError, match="random key"):
        typed_key(3)
