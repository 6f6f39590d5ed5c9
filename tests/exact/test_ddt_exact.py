"""Dirichlet diffusion trees: exact checks of the prior, the samplers and the posterior (docs/mathematics.md §5).

1. The structure term integrates to one over trees of 3 and 4 leaves: a sum
   over the 3 / 15 leaf-labelled topologies of a Gauss-Legendre quadrature
   over the ordered divergence times (``t_v = t_p + (1 − t_p) g(u_v)``,
   ``g(u) = 1 − (1 − u)³`` smooths the ``(1 − t)^{cH−1}`` endpoint).
2. The generative sampler's topology frequencies match those integrals
   (G-test) and its root times match ``P(t_root > t) = (1 − t)^{c H_{n−1}}``
   (KS); power: the same statistics reject a uniform law over topologies and
   the root-time law of another ``c``. (The topology law does not depend on
   ``c``: 2/33 per caterpillar, 1/11 per balanced tree for 4 leaves.)
3. Geweke "getting it right" (6 leaves) for the within-chain sampler
   (subtree moves, time moves, slice updates of ``c`` and ``σ``): chains
   started from the prior that alternate ``X ~ p(X | tree, σ)`` and one
   kernel step stay at the prior. Compared with independent draws of the
   joint prior on the number of cherries (G-test), the root, mean and last
   divergence times, the data term ``log p(X | tree, σ)`` (a function of
   parameters and data), ``c`` and ``σ`` (KS), and on the root balance
   against its exact law ``P(b = l) = n / (l (n − l) H_{n−1})`` (G-test). Power: the same
   statistics reject a kernel run with a perturbed prior on ``c`` and a
   subtree move that drops its proposal ratio.
4. Geweke for the population exchange move alone: each chain has its own
   data set (the core accepts ``(K, n, D)`` data), so the product of the
   chains' priors is the stationary law of "resample every ``X_k``, exchange".
   The temperature is a traced argument of the same compiled program: ``τ = 1``
   passes, ``τ → 0`` (the tempered ratio at its extreme) fails, so the test
   can fail and the tempered variant is not exact. (Dropping the ``Q`` ratio,
   ``τ → ∞``, biases this test only weakly: with data-driven branch choices
   ``Q`` is often close to 1 both ways.)
5. Four data points: ``PopulationDDT`` under ``numpyro.infer.MCMC`` (through
   ``fit_ddt``; ``c`` and ``σ`` sampled) gives posterior topology frequencies
   within total variation 0.03 of self-normalised importance sampling from
   the prior.

Compile time dominates: the test programs are compiled with
``xla_backend_optimization_level=0`` and without the CPU fusion emitters.
"""

from __future__ import annotations

from functools import partial

import chex
import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
import pytest
from scipy import stats

from jaxbnp.inference.trees import mcmc as ddt_mcmc
from jaxbnp.inference.trees.fit import fit_ddt
from jaxbnp.inference.trees import moves as tree_moves
from jaxbnp.inference.trees import population
from jaxbnp.inference.trees.mcmc import Hyperpriors
from jaxbnp.models import ddt

FAST = {"xla_backend_optimization_level": 0, "xla_cpu_use_fusion_emitters": False}  # compile 2-3x faster
N4 = 4
DIM = 2
NOISE = 0.3
C_PRIOR = dist.LogNormal(0.0, 0.4)
SIGMA_PRIOR = dist.LogNormal(0.0, 0.3)
P_MIN = 1e-3


# ------------------------------------------------------------------------ topology helpers
def topologies(n: int) -> list:
    """All leaf-labelled rooted binary trees on ``0..n−1`` as nested pairs (3 for n=3, 15 for n=4)."""

    def insert(t, leaf):
        out = [(t, leaf)]
        if isinstance(t, tuple):
            a, b = t
            out += [(x, b) for x in insert(a, leaf)] + [(a, x) for x in insert(b, leaf)]
        return out

    trees = [0]
    for leaf in range(1, n):
        trees = [x for t in trees for x in insert(t, leaf)]
    return trees


def template(top, n: int):
    """``(parent, children, internal nodes parents-first)`` of a nested-pair topology."""
    parent = -np.ones(2 * n - 1, np.int32)
    children = np.zeros((n - 1, 2), np.int32)
    pre, nxt = [], [n]

    def rec(t):
        if not isinstance(t, tuple):
            return t
        v = nxt[0]
        nxt[0] += 1
        pre.append(v)
        a, b = rec(t[0]), rec(t[1])
        children[v - n] = (a, b)
        parent[a] = parent[b] = v
        return v

    rec(top)
    return parent, children, pre


def topology_keys(children: np.ndarray, n: int) -> np.ndarray:
    """An integer key per tree (batch ``(B, n−1, 2)``): its sorted clade bitmasks."""
    children = np.asarray(children).reshape(-1, n - 1, 2)
    masks = np.zeros((children.shape[0], 2 * n - 1), np.int64)
    masks[:, :n] = 1 << np.arange(n)
    rows = np.arange(children.shape[0])[:, None]
    for _ in range(n - 1):
        masks[:, n:] = masks[rows, children[..., 0]] | masks[rows, children[..., 1]]
    clades = np.sort(masks[:, n:], axis=1)
    return (clades * (1 << n) ** np.arange(n - 1)).sum(1)


def topology_index(n: int) -> dict:
    keys = [topology_keys(template(t, n)[1][None], n)[0] for t in topologies(n)]
    assert len(set(keys)) == len(keys)
    return {k: i for i, k in enumerate(keys)}


def topology_ids(children, n: int) -> np.ndarray:
    index = topology_index(n)
    return np.array([index[k] for k in topology_keys(children, n)])


def counts(ids, k):  # noqa: D103
    return np.bincount(np.asarray(ids), minlength=k)


# -------------------------------------------------------------------------------- 1 and 2
@partial(jax.jit, compiler_options=FAST)
def _batch_log_prior(trees, c):
    return jax.vmap(ddt.structure_log_prior, in_axes=(0, None))(trees, c)


def quadrature_topology_probabilities(n: int, c: float, nodes: int = 24) -> np.ndarray:
    """``∫ p(topology, times | c) d times`` per topology of :func:`topologies`."""
    x, w = np.polynomial.legendre.leggauss(nodes)
    u, w = (x + 1) / 2, w / 2
    g, dg = 1 - (1 - u) ** 3, 3 * (1 - u) ** 2
    grid = np.stack([a.ravel() for a in np.meshgrid(*[np.arange(nodes)] * (n - 1), indexing="ij")], 1)
    size = grid.shape[0]
    out = []
    for top in topologies(n):
        parent, children, pre = template(top, n)
        time = np.ones((size, 2 * n - 1))
        weight = np.ones(size)
        for j, v in enumerate(pre):
            tp = time[:, parent[v]] if parent[v] >= 0 else np.zeros(size)
            time[:, v] = tp + (1 - tp) * g[grid[:, j]]
            weight *= w[grid[:, j]] * (1 - tp) * dg[grid[:, j]]
        trees = ddt.Tree(
            jnp.broadcast_to(parent, (size, 2 * n - 1)), jnp.broadcast_to(children, (size, n - 1, 2)),
            jnp.asarray(time),
        )
        out.append(np.sum(weight * np.exp(np.asarray(_batch_log_prior(trees, c)))))
    return np.array(out)


@pytest.mark.parametrize("n", [3, 4])
def test_structure_prior_integrates_to_one(n):
    for c in (0.7, 2.0):
        probs = quadrature_topology_probabilities(n, c)
        assert len(probs) == {3: 3, 4: 15}[n]
        np.testing.assert_allclose(probs.sum(), 1.0, atol=1e-6)
        # exchangeability: topologies of the same shape are equally likely
        if n == 4:
            shape = np.array([isinstance(t[0], tuple) and isinstance(t[1], tuple) for t in topologies(4)])
            assert shape.sum() == 3
            np.testing.assert_allclose(probs[shape], probs[shape][0], rtol=1e-6)
            np.testing.assert_allclose(probs[~shape], probs[~shape][0], rtol=1e-6)


def _g_test(observed, expected_probs):
    return stats.power_divergence(observed, expected_probs * observed.sum(), lambda_="log-likelihood").pvalue


def test_generative_sampler_matches_the_prior():
    c = 1.3
    num = 20000
    trees = jax.jit(lambda k: ddt.DiffusionTree(c, N4).sample(k, (num,)), compiler_options=FAST)(jax.random.key(0))
    for i in range(0, num, 4999):
        ddt.check_tree(jax.tree.map(lambda a: a[i], trees), N4)
    probs = quadrature_topology_probabilities(N4, c)
    observed = counts(topology_ids(trees.children, N4), 15)
    assert _g_test(observed, probs) > P_MIN
    assert _g_test(observed, np.full(15, 1 / 15)) < 1e-6  # power: a uniform law is rejected
    # root time: P(t_root > t) = (1 - t)^(c H_{n-1})
    t_root = np.asarray(trees.time).min(1)
    h = sum(1 / j for j in range(1, N4))
    assert stats.kstest(t_root, lambda t: 1 - (1 - t) ** (c * h)).pvalue > P_MIN
    assert stats.kstest(t_root, lambda t: 1 - (1 - t) ** (1.2 * c * h)).pvalue < 1e-6  # power
    # the distribution's log_prob is the structure term, batched
    lp = ddt.DiffusionTree(c, N4).log_prob(jax.tree.map(lambda a: a[:6].reshape((2, 3) + a.shape[1:]), trees))
    assert lp.shape == (2, 3) and np.all(np.isfinite(np.asarray(lp)))


# ---------------------------------------------------------------------------------- Geweke
NG = 6  # leaves in the Geweke tests: enough candidate branches for the exchange's Q to matter


def _shape_statistics(state, n):
    """Root balance (leaves on the smaller side of the root) and number of cherries, per tree."""
    sizes, children = np.asarray(state.sizes), np.asarray(state.tree.children)
    root = np.argmax(np.asarray(state.tree.parent) < 0, axis=1)
    rows = np.arange(root.shape[0])
    kids = children[rows, root - n]
    balance = np.minimum(sizes[rows, kids[:, 0]], sizes[rows, kids[:, 1]])
    cherries = ((children[..., 0] < n) & (children[..., 1] < n)).sum(1)
    return balance, cherries


def root_balance_law(n: int) -> np.ndarray:
    """Exact prior law of the root balance ``b = min(l, r)``, ``b = 1..n//2``.

    Each subtree below the root is itself a DDT (times rescale to ``(t_root, 1)``
    with unit mass) and ``∫ a(t) exp(−A(t) H_{n−1}) dt = 1/H_{n−1}``, so a split
    into given leaf sets of sizes ``(l, n − l)`` has probability
    ``Γ(l) Γ(n−l) / (Γ(n) H_{n−1})``; summed over the sets,
    ``P(b = l) = n / (l (n − l) H_{n−1})``, halved when ``l = n − l``.
    (For 4 leaves: 8/11 caterpillars, 3/11 balanced, as the quadrature gives.)
    """
    h = sum(1 / j for j in range(1, n))
    p = np.array([n / (l * (n - l) * h) * (0.5 if 2 * l == n else 1.0) for l in range(1, n // 2 + 1)])
    assert abs(p.sum() - 1) < 1e-12
    return p


def _compare_to_prior(sim, ref, ref_ll, n=NG):
    """Geweke p-values: root balance (G-test against its exact law), cherries (two-sample
    G-test), divergence times, the data term, c and σ (two-sample KS)."""
    out = {}
    balance = np.bincount(_shape_statistics(sim, n)[0], minlength=n // 2 + 1)[1:]
    out["balance"] = _g_test(balance, root_balance_law(n))
    a, b = _shape_statistics(sim, n)[1], _shape_statistics(ref, n)[1]
    table = np.stack([np.bincount(a, minlength=n), np.bincount(b, minlength=n)])
    out["cherries"] = stats.chi2_contingency(table[:, table.sum(0) > 0], lambda_="log-likelihood").pvalue
    t_sim, t_ref = np.asarray(sim.tree.time)[:, n:], np.asarray(ref.tree.time)[:, n:]
    for name, f in (("root time", np.min), ("mean time", np.mean), ("last time", np.max)):
        out[name] = stats.ks_2samp(f(t_sim, 1), f(t_ref, 1)).pvalue
    out["data term"] = stats.ks_2samp(np.asarray(sim.log_likelihood), ref_ll).pvalue
    for name in ("c", "sigma"):
        out[name] = stats.ks_2samp(np.asarray(getattr(sim, name)), np.asarray(getattr(ref, name))).pvalue
    return out


@partial(jax.jit, static_argnums=1, compiler_options=FAST)
def _prior_draws(key, num):
    """``num`` draws of ``(c, σ, tree, X)`` from the joint prior as chain states (``NG`` leaves):
    the chains' starts, or, for the reference, the marginal-conditional draws."""

    def one(key):
        k_c, k_s, k_t, k_x = jax.random.split(key, 4)
        c, sigma = C_PRIOR.sample(k_c), SIGMA_PRIOR.sample(k_s)
        tree = ddt.sample_tree(k_t, c, NG)
        return ddt_mcmc.init(tree, ddt.sample_leaves(k_x, tree, sigma, NOISE, DIM), c, sigma, NOISE)

    return jax.lax.map(one, jax.random.split(key, num))  # map: quicker to compile than vmap


@pytest.fixture(scope="module")
def prior_draws():
    num = 1500
    start, reference = _prior_draws(jax.random.key(1), num), _prior_draws(jax.random.key(2), num)
    for draws in (start, reference):  # the generative sampler at 6 leaves: the exact root-balance law
        balance = np.bincount(_shape_statistics(draws, NG)[0], minlength=NG // 2 + 1)[1:]
        assert _g_test(balance, root_balance_law(NG)) > P_MIN
    return start, reference


def _geweke_iteration(key, state, hyperpriors):
    """Successive-conditional Geweke: ``X ~ p(X | tree, σ)``, then one kernel step given ``X``."""
    k_x, k_step = jax.random.split(key)
    X = ddt.sample_leaves(k_x, state.tree, state.sigma, state.noise, DIM)
    state = ddt_mcmc.init(state.tree, X, state.c, state.sigma, state.noise)
    return ddt_mcmc.step(k_step, state, X, hyperpriors)[0]


_geweke_run = jax.jit(
    jax.vmap(chex.assert_max_traces(_geweke_iteration, n=1), in_axes=(0, 0, None)), compiler_options=FAST
)


def _within_chain_geweke(run, start, hyperpriors, num_iterations):
    state, num = start, start.c.shape[0]
    for i in range(num_iterations):  # the same compiled program every iteration
        state = run(jax.random.split(jax.random.fold_in(jax.random.key(3), i), num), state, hyperpriors)
    return state


def test_within_chain_sampler_geweke(prior_draws, monkeypatch):
    start, reference = prior_draws
    ref_ll = np.asarray(reference.log_likelihood)
    hyper = Hyperpriors(c=C_PRIOR, sigma=SIGMA_PRIOR)
    p = _compare_to_prior(_within_chain_geweke(_geweke_run, start, hyper, 8), reference, ref_ll)
    assert min(p.values()) > P_MIN, p
    # power 1: a chain run with a perturbed prior on c fails the same statistics (same program)
    wrong = Hyperpriors(c=dist.LogNormal(0.5, 0.4), sigma=SIGMA_PRIOR)
    p_wrong = _compare_to_prior(_within_chain_geweke(_geweke_run, start, wrong, 4), reference, ref_ll)
    assert p_wrong["c"] < 1e-6, p_wrong
    # power 2: a subtree move that drops log q(T|T') - log q(T'|T) fails on the tree statistics
    monkeypatch.setattr(tree_moves, "subtree_log_q_ratio", lambda back, fwd: jnp.zeros_like(back))
    broken = jax.jit(jax.vmap(lambda k, s, h: _geweke_iteration(k, s, h), in_axes=(0, 0, None)), compiler_options=FAST)
    p_broken = _compare_to_prior(_within_chain_geweke(broken, start, hyper, 4), reference, ref_ll)
    assert min(p_broken[k] for k in ("balance", "cherries", "root time", "mean time", "last time")) < 1e-6, p_broken


def test_population_exchange_geweke(prior_draws):
    """Exchange moves alone; each chain has its own data set, resampled every iteration."""
    start, reference = prior_draws
    ref_ll = np.asarray(reference.log_likelihood)
    chains = 4
    populations = start.c.shape[0] // chains
    group = lambda s: jax.tree.map(lambda a: a.reshape((populations, chains) + a.shape[1:]), s)  # noqa: E731

    @chex.assert_max_traces(n=1)
    def one_iteration(key, pop, temperature):
        k_x, k_ex = jax.random.split(key)
        X = jax.vmap(lambda k, s: ddt.sample_leaves(k, s.tree, s.sigma, s.noise, DIM))(
            jax.random.split(k_x, chains), pop
        )
        pop = jax.vmap(lambda s, x: ddt_mcmc.init(s.tree, x, s.c, s.sigma, s.noise))(pop, X)
        pop, info = population.step(
            k_ex, pop, X, subset_size=2, temperature=temperature, within_chain=False, pair_batching="map"
        )
        return pop, info.exchange_accepted

    run = jax.jit(jax.vmap(one_iteration, in_axes=(0, 0, None)), compiler_options=FAST)

    def simulate(temperature, iterations):
        pop, accepted = group(start), 0.0
        for i in range(iterations):
            keys = jax.random.split(jax.random.fold_in(jax.random.key(6), i), populations)
            pop, acc = run(keys, pop, jnp.asarray(temperature))
            accepted += float(np.mean(np.asarray(acc))) / iterations
        return jax.tree.map(lambda a: a.reshape((-1,) + a.shape[2:]), pop), accepted

    sim, rate = simulate(1.0, 8)
    assert 0.1 < rate < 0.9, rate  # the move does something
    p = _compare_to_prior(sim, reference, ref_ll)
    assert min(p.values()) > P_MIN, p
    # power: the same compiled move with tau -> 0 (the tempered ratio at its extreme) fails
    sim_bad, _ = simulate(1e-9, 12)
    p_bad = _compare_to_prior(sim_bad, reference, ref_ll)
    assert min(p_bad["balance"], p_bad["cherries"]) < 1e-6, p_bad


# -------------------------------------------------------------------------- 4-point posterior
X4 = np.array([[-0.7, -0.4], [-0.5, -0.8], [0.6, 0.5], [0.8, 0.3]])


#: the importance draws run far longer than they compile: LLVM at level 1 (the population
#: test, one core: 28 s -> 16 s; the Geweke programs stay at level 0, where level 1 lost)
@partial(jax.jit, static_argnums=1, compiler_options={**FAST, "xla_backend_optimization_level": 1})
def _importance_draws(key, num):
    k_c, k_s, k_t = jax.random.split(key, 3)
    c = C_PRIOR.sample(k_c, (num,))
    sigma = SIGMA_PRIOR.sample(k_s, (num,))
    trees = jax.vmap(lambda k, cc: ddt.sample_tree(k, cc, N4))(jax.random.split(k_t, num), c)
    log_w = jax.vmap(lambda t, s: ddt.log_likelihood(t, jnp.asarray(X4), s, NOISE))(trees, sigma)
    return trees.children, log_w


def importance_sampling_posterior(num=400_000, seed=7):
    """Self-normalised importance sampling from the prior: the topology posterior, its ESS,
    and the total variation between the estimates from the two halves of the draws."""
    children, log_w = _importance_draws(jax.random.key(seed), num)
    w = np.exp(np.asarray(log_w) - np.max(np.asarray(log_w)))
    ids = topology_ids(children, N4)

    def estimate(sl):
        return np.bincount(ids[sl], weights=w[sl], minlength=15) / w[sl].sum()

    halves = 0.5 * np.abs(estimate(slice(0, num // 2)) - estimate(slice(num // 2, num))).sum()
    return estimate(slice(None)), w.sum() ** 2 / (w**2).sum(), halves


def test_population_posterior_matches_importance_sampling():
    """``PopulationDDT`` (through ``fit_ddt``: ``runner.run``, 8 vectorised chains,
    ``c`` and ``σ`` sampled) against self-normalised importance sampling from the prior."""
    post, ess, halves = importance_sampling_posterior()
    assert ess > 30_000
    assert halves < 0.015  # the reference's own Monte Carlo error is far inside the tolerance
    assert post.max() < 0.6  # not a degenerate check: the mass is spread over several topologies
    chains, samples = 8, 1500
    fit = fit_ddt(
        X4, num_chains=chains, num_samples=samples, num_warmup=200, key=jax.random.key(8),
        subset_size=2, c_prior=C_PRIOR, sigma_prior=SIGMA_PRIOR, noise=NOISE, num_clusters=2,
    )
    tree = fit.samples["tree"]
    assert tree.time.shape == (chains, samples, 2 * N4 - 1)
    freq = counts(topology_ids(tree.children, N4), 15) / (chains * samples)
    tv = 0.5 * np.abs(freq - post).sum()
    assert tv < 0.03, (tv, np.round(freq, 3), np.round(post, 3))
    # the CLI's outputs: the best tree splits the two groups, the trace is finite
    np.testing.assert_array_equal(fit.labels, [0, 0, 1, 1])
    assert fit.log_joint.shape == (chains, samples) and np.isfinite(fit.log_joint).all()
    best = (ddt.structure_log_prior(fit.tree, fit.c) + ddt.log_likelihood(fit.tree, X4, fit.sigma, NOISE)
            + C_PRIOR.log_prob(fit.c) + SIGMA_PRIOR.log_prob(fit.sigma))
    assert fit.log_joint.max() == pytest.approx(float(best), rel=1e-9)
    print(f"4-point posterior: TV {tv:.4f}, IS ESS {ess:.0f}, IS halves TV {halves:.4f}")
