"""Exact checks of the seed's cut model (docs/mathematics.md §5, "The cut model").

Target over the partitions ``Π`` of 5 points::

    p(Π | X) ∝ P_DDT(Π at t_s) Π_C P(X_C)

``P_DDT(Π at t_s)`` (the law of the partition that cutting a DDT prior draw at ``t_s`` gives,
integrated over the priors of ``c`` and ``t_s`` when they have them) is computed here by
simulating the prior: 400,000 trees, pooled over the partitions with the same block sizes
(the law is exchangeable). ``P(X_C)`` is the family's marginal (``ConjugateMixture``).
The samplers run through NumPyro's ``MCMC`` on the model as users write it; the
partition law must be within total variation 0.03 of the target. Power checks: the same
draws are far from the posterior at a wrong ``t_s``, and an exchange move with a wrong
proposal ratio is detected.
"""

from __future__ import annotations

from collections import Counter

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.infer import MCMC

import jaxbnp as bnp
from jaxbnp.inference.trees import cut, moves
from jaxbnp.models import ddt

from .enumeration import normalise, set_partitions, total_variation

N = 5
X = np.array([[-1.2], [-0.9], [0.1], [1.0], [1.3]], np.float32)
FAMILY = bnp.NormalGamma(0.0, 0.5, 2.0, 1.0)
C, T_STOP = 1.0, 0.5
C_PRIOR, T_PRIOR = dist.Gamma(2.0, 2.0), dist.Beta(2.0, 2.0)
PRIOR_DRAWS = 400_000
TOL = 0.03


def fixed_model(X):
    tree = numpyro.sample("tree", bnp.DiffusionTree(C, X.shape[0]))
    z = numpyro.deterministic("z", bnp.cut_tree(tree, T_STOP))
    numpyro.sample("X", bnp.ConjugateMixture(FAMILY, z), obs=X)


def hyper_model(X):
    c = numpyro.sample("c", C_PRIOR)
    t_stop = numpyro.sample("t_stop", T_PRIOR)
    tree = numpyro.sample("tree", bnp.DiffusionTree(c, X.shape[0]))
    z = numpyro.deterministic("z", bnp.cut_tree(tree, t_stop))
    numpyro.sample("X", bnp.ConjugateMixture(FAMILY, z), obs=X)


def _shape(labels) -> tuple:
    return tuple(sorted(Counter(labels.tolist()).values()))


def prior_laws(priors: bool, t_stops=(T_STOP,)) -> list:
    """``P_DDT(Π at t_s)`` over :func:`set_partitions` for each ``t_s`` in ``t_stops`` (one
    simulation, the same trees cut at each), or with ``c`` and ``t_s`` from their priors."""
    def draw(key):
        k_u, k_tree = jax.random.split(key)
        # Gamma(2, ·) draws as sums of two exponentials (JAX's Gamma sampler is slow to compile)
        g = -jnp.log(jax.random.uniform(k_u, (3, 2), minval=1e-12)).sum(1)
        tree = ddt.sample_tree(k_tree, g[0] / 2.0 if priors else C, N)  # c ~ Gamma(2, 2)
        if priors:
            return ddt.cut_tree(tree, g[1] / (g[1] + g[2]))[None]  # t_s ~ Beta(2, 2)
        return jnp.stack([ddt.cut_tree(tree, t) for t in t_stops])

    # optimised code: the suite compiles at backend level 0, where this simulation runs 2x slower
    sim = jax.jit(jax.vmap(draw), compiler_options={"xla_backend_optimization_level": 2})
    labels = np.asarray(sim(jax.random.split(jax.random.key(123), PRIOR_DRAWS)))
    parts = set_partitions(N)
    per_shape = Counter(_shape(p) for p in parts)
    laws = []
    for j in range(labels.shape[1]):
        shapes = Counter(_shape(row) for row in labels[:, j])
        laws.append(np.array([shapes[_shape(p)] / PRIOR_DRAWS / per_shape[_shape(p)] for p in parts]))
    return laws


def posterior(prior_law) -> np.ndarray:
    """The target over :func:`set_partitions` (module docstring)."""
    marg = np.array([float(bnp.ConjugateMixture(FAMILY, jnp.asarray(p)).log_prob(X)) for p in set_partitions(N)])
    return normalise(np.log(prior_law) + marg)


@pytest.fixture(scope="module")
def targets():
    fixed, wrong_t = prior_laws(False, (T_STOP, 0.3))
    (with_priors,) = prior_laws(True)
    return {"fixed": posterior(fixed), "wrong_t": posterior(wrong_t), "priors": posterior(with_priors)}


def test_diffusion_tree_mcmc_on_the_cut_model(targets):
    """``DiffusionTreeMCMC`` (subtree and time moves, the data term by the touched clusters):
    8 vectorised chains x 5,000 draws. At 3,000 draws the TV was 0.022 and at 12,000 0.008
    (a scratch run of the pure core), so the chain converges to the target."""
    mcmc = MCMC(bnp.DiffusionTreeMCMC(fixed_model), num_warmup=200, num_samples=5000, num_chains=8,
                chain_method="vectorized", progress_bar=False)
    mcmc.run(jax.random.PRNGKey(0), X)
    z = np.asarray(mcmc.get_samples()["z"])
    parts = set_partitions(N)
    tv = total_variation(z, parts, targets["fixed"])
    assert tv < TOL, tv
    # power: the same draws against the posterior at a wrong stopping time
    wrong = total_variation(z, parts, targets["wrong_t"])
    assert wrong > 0.1, wrong
    print(f"cut model, DiffusionTreeMCMC: TV {tv:.4f}; against t_s = 0.3: {wrong:.3f}")


def _population_run(key, steps, num_subtree_moves):
    """The pure population core (fixed ``c`` and ``t_s``), 8 chains; labels of every step."""
    k0, k1 = jax.random.split(key)
    trees = jax.vmap(lambda k: ddt.sample_tree(k, C, N))(jax.random.split(k0, 8))
    chains = jax.vmap(lambda t: cut.init(t, X, FAMILY, C, T_STOP))(trees)

    def body(state, k):
        state, info = cut.population_step(k, state, X, FAMILY, subset_size=2,
                                          num_subtree_moves=num_subtree_moves)
        return state, (jax.vmap(lambda t: ddt.cut_tree(t, T_STOP))(state.tree), info.exchange_accepted)

    _, (labels, accepted) = jax.lax.scan(body, chains, jax.random.split(k1, steps))
    return labels, accepted


def test_population_on_the_cut_model_with_hyperpriors(targets):
    """``PopulationDDT`` (the seed's exchange move, branches chosen by the partition
    likelihood) with ``c`` and ``t_s`` sampled, one subtree move per sweep so that the exchange
    does much of the mixing: 8 chains x 6,000 draws."""
    kernel = bnp.PopulationDDT(hyper_model, 8, 2, num_subtree_moves=1)
    mcmc = MCMC(kernel, num_warmup=200, num_samples=6000, num_chains=8, chain_method="vectorized",
                progress_bar=False)
    mcmc.run(jax.random.key(1), X, extra_fields=("exchange_accepted",))
    z = np.asarray(mcmc.get_samples()["z"])
    tv = total_variation(z, set_partitions(N), targets["priors"])
    accepted = float(np.mean(mcmc.get_extra_fields()["exchange_accepted"]))
    assert tv < TOL, tv
    assert 0.05 < accepted < 0.95, accepted  # the exchange does move trees
    print(f"cut model, PopulationDDT with hyperpriors: TV {tv:.4f}, exchange acceptance {accepted:.2f}")


def test_a_wrong_exchange_ratio_is_detected(targets, monkeypatch):
    """Power: the population with the exchange's proposal ratio dropped (the move accepted on
    the targets alone) at one subtree move per sweep, 8 chains x 3,000 steps: TV about 0.23
    (the right ratio: 0.024 at the same length, a scratch run)."""
    monkeypatch.setattr(moves, "proposal_log_ratio", lambda back, fwd, temperature: 0.0 * back)
    labels, _ = jax.jit(_population_run, static_argnums=(1, 2))(jax.random.key(2), 3000, 1)
    tv = total_variation(np.asarray(labels[200:]).reshape(-1, N), set_partitions(N), targets["fixed"])
    assert tv > 0.1, tv
