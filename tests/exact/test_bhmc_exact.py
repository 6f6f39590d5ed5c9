"""BHMC: exact checks of the path prior and a Geweke test of the sampler (docs/mathematics.md §6).

1. The path prior ``log p(V)`` of docs/mathematics.md §6 equals the sequential nCRP
   probability of every path configuration of 4 points at depth 2 (all
   configurations enumerated by seating the points one after the other) and
   sums to one; perturbed formulas (``lgamma(N_z' + 1)`` on the edges, or
   ``m_z + 1`` powers of ``α``) do not.
2. Geweke "getting it right" (N = 4, L = 2, D = 1): chains started from the
   NumPyro program's forward draws that alternate ``x ~ p(x | c, θ)`` and one
   sweep (path Gibbs or path MH, Gibbs on ``c``, eq. 5, and with every update on also the
   subtree moves, ``regraft``, and the exact ``β`` update, ``update_beta_exact``) stay at the
   prior.
   Each chain contributes its state after ``NUM_SWEEPS`` sweeps (independent
   draws), compared with forward draws disjoint from the starting states: numbers of occupied first-level nodes, leaves
   and components, whether points 0 and 1 share a leaf (chi-square), the mean
   of ``x``, ``θ_{c_0}`` and ``log β_{v_0L, c_0}`` (KS). Power: the same test
   rejects a sweep whose path acceptance drops the proposal ratio, a path Gibbs step with
   the new-branch weight tripled, subtree moves with the new-branch weight tripled, and the
   paper's eqs. 3-4 for ``β``.
3. The path Gibbs draw of one point against the enumerated conditional of a small tree.
4. The subtree moves' weights against the joint rebuilt from the paths for every place of
   a node in small trees, and the node tables after many moves against the paths.
"""

from __future__ import annotations

import math
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from numpyro import handlers
from scipy import stats

from jaxbnp.inference.bhmc import model as bhmc_model
from jaxbnp.inference.bhmc import paths as bhmc_paths
from jaxbnp.inference.bhmc import regraft as bhmc_regraft
from jaxbnp.inference.bhmc import sampler as bhmc
from jaxbnp.inference.bhmc import split_merge as bhmc_split_merge
from jaxbnp.inference.bhmc import start as bhmc_start
from jaxbnp.models import nested

FAST = {"xla_backend_optimization_level": 0, "xla_cpu_use_fusion_emitters": False}
#: the Geweke programs run for longer than they compile: LLVM at level 1 compiles the
#: all-updates chain (400 chains x 20 sweeps) in 19 s instead of 12 s and runs it in 8 s
#: instead of 25 s; the 2,400 forward draws, 5 + 2 s instead of 4 + 9 s. The p-values are
#: the same as at level 0 to the last digit
CHAINS = {"xla_backend_optimization_level": 1, "xla_cpu_use_fusion_emitters": False}
path_log_prior = jax.jit(nested.path_log_prior, static_argnums=2)


# ------------------------------------------------------------------------ 1. path prior
def enumerate_ncrp(num_points: int, depth: int, alpha: float) -> list:
    """All nCRP seatings: (paths with ids in creation order, sequential probability)."""
    out = []

    def rec(i, paths, counts, children, next_id, logp):
        if i == num_points:
            out.append((np.array(paths), math.exp(logp)))
            return

        def descend(level, node, row, counts, children, next_id, logp):
            if level == depth:
                new_counts = dict(counts)
                for z in [0] + row:
                    new_counts[z] = new_counts.get(z, 0) + 1
                rec(i + 1, paths + [row], new_counts, children, next_id, logp)
                return
            n_node = counts.get(node, 0)
            for child in children.get(node, []):
                lp = logp + math.log(counts[child]) - math.log(n_node + alpha)
                descend(level + 1, child, row + [child], counts, children, next_id, lp)
            ch = {k: list(v) for k, v in children.items()}
            ch.setdefault(node, []).append(next_id)
            lp = logp + math.log(alpha) - math.log(n_node + alpha)
            descend(level + 1, next_id, row + [next_id], counts, ch, next_id + 1, lp)

        descend(0, 0, [], counts, children, next_id, logp)

    rec(0, [], {}, {}, 1, 0.0)
    return out


@pytest.mark.parametrize("alpha", [0.5, 1.0, 2.5])
def test_path_prior_sums_to_one_over_all_configurations(alpha):
    configs = enumerate_ncrp(4, 2, alpha)
    seq = np.array([p for _, p in configs])
    assert len({tuple(map(tuple, paths)) for paths, _ in configs}) == len(configs)  # distinct
    assert seq.sum() == pytest.approx(1.0, abs=1e-12)  # the enumeration is complete
    formula = np.array([float(np.exp(path_log_prior(paths, alpha, 9))) for paths, _ in configs])
    np.testing.assert_allclose(formula, seq, rtol=1e-9)
    assert formula.sum() == pytest.approx(1.0, abs=1e-10)
    # a renaming of the nodes does not change it
    paths = configs[len(configs) // 2][0]
    renamed = np.where(paths > 0, 20 - paths, 0)
    assert float(path_log_prior(renamed, alpha, 21)) == pytest.approx(
        float(path_log_prior(paths, alpha, 9)), abs=1e-12)
    # power: perturbed formulas do not sum to one: lgamma(N_z' + 1) for lgamma(N_z') on the
    # edges (N! for (N-1)!), or m_z + 1 powers of α
    perturbed_edges, perturbed_alpha = [], []
    for paths, _ in configs:
        parent, depth, count = (np.asarray(a) for a in nested.tree_from_paths(paths, 9))
        exact = float(np.exp(path_log_prior(paths, alpha, 9)))
        edges = (count > 0) & (parent >= 0)
        internal = (count > 0) & (depth < 2)
        perturbed_edges.append(exact * np.prod(count[edges]))
        perturbed_alpha.append(exact * alpha ** int(internal.sum()))
    assert abs(sum(perturbed_edges) - 1.0) > 0.1
    if alpha != 1.0:
        assert abs(sum(perturbed_alpha) - 1.0) > 0.05


# ------------------------------------------------------------------------ 2. Geweke
N, L, D, K = 4, 2, 1, 16
M = nested.default_node_capacity(N, L)
HYPER = nested.NestedHDP(depth=L, alpha=1.0, gamma0=1.0, gamma=1.0, Sigma=[[0.3]], Sigma0=[[1.0]])
CONFIG = bhmc.BHMCConfig(L, M, K, update_beta=False, regraft=False, split_merge=0)  # path_update="gibbs"
CONFIG_MH = CONFIG._replace(path_update="mh")
CONFIG_BETA = CONFIG._replace(update_beta=True)  # beta_rule="exact", the default
CONFIG_SM = CONFIG._replace(split_merge=3)  # the points and component split-merge moves
CONFIG_ALL = CONFIG_BETA._replace(regraft=True, split_merge=1)  # every update on: the defaults
MODEL = bhmc.make_model(HYPER)
NUM_CHAINS, NUM_FORWARD = 400, 2000
NUM_SWEEPS = 20


def _forward_one(key):
    tr = handlers.trace(handlers.seed(nested.nested_hdp_model, key)).get_trace(
        hyper=HYPER, num_points=N, component_capacity=K, node_capacity=M)
    return {k: tr[k]["value"] for k in ("paths", "c", "theta", "log_beta", "x")}


@partial(jax.jit, compiler_options=CHAINS)
def forward_states(keys):
    def one(key):
        sim = _forward_one(key)
        return bhmc.state_from_simulation(sim, HYPER, sim["x"], MODEL, CONFIG), sim["x"]

    return jax.vmap(one)(keys)


def statistics(state: bhmc.BHMCState, X) -> dict:
    live = state.count > 0
    leaf0 = state.paths[..., 0, -1]
    c0 = state.c[..., 0]
    theta_c0 = jnp.take_along_axis(state.theta[..., 0], c0[..., None], axis=-1)[..., 0]
    lb = jnp.take_along_axis(state.log_beta, leaf0[..., None, None], axis=-2)[..., 0, :]
    return {
        "num_top": jnp.sum(live & (state.depth == 1), -1),
        "num_leaves": jnp.sum(live & (state.depth == L), -1),
        "num_components": jnp.sum(state.comp_active, -1),
        "share_leaf": (state.paths[..., 0, -1] == state.paths[..., 1, -1]).astype(jnp.int32),
        "x_mean": jnp.mean(X[..., 0], -1),
        "theta_c0": theta_c0,
        "log_beta_c0": jnp.take_along_axis(lb, c0[..., None], axis=-1)[..., 0],
    }


def make_geweke_run(config=CONFIG):
    """``jit(vmap(run))`` of the successive-conditional chain; traced anew (picks up monkeypatches)."""

    def run(key, state):
        def body(carry, k):
            s = carry
            kx, ks = jax.random.split(k)
            x = s.theta[s.c] + jnp.sqrt(0.3) * jax.random.normal(kx, (N, D), s.theta.dtype)
            s, _ = bhmc.step(ks, s, x, MODEL, config)
            return s, statistics(s, x)

        _, stats_trace = jax.lax.scan(body, state, jax.random.split(key, NUM_SWEEPS))
        return jax.tree.map(lambda a: a[-1], stats_trace)  # one state per chain: independent draws

    return jax.jit(jax.vmap(run), compiler_options=CHAINS)


def compare(forward: dict, chain: dict) -> dict:
    pvals = {}
    for name in ("num_top", "num_leaves", "num_components", "share_leaf"):
        a, b = np.asarray(forward[name]).ravel(), np.asarray(chain[name]).ravel()
        values = np.union1d(a, b)
        table = np.array([[np.sum(a == v) for v in values], [np.sum(b == v) for v in values]])
        table = table[:, table.sum(0) >= 5]
        pvals[name] = 1.0 if table.shape[1] < 2 else float(stats.chi2_contingency(table)[1])
    for name in ("x_mean", "theta_c0", "log_beta_c0"):
        pvals[name] = float(stats.ks_2samp(np.asarray(forward[name]).ravel(),
                                           np.asarray(chain[name]).ravel()).pvalue)
    return pvals


@pytest.fixture(scope="module")
def geweke_setup():
    states, X = forward_states(jax.random.split(jax.random.key(11), NUM_FORWARD + NUM_CHAINS))
    assert not bool(jnp.any(states.overflow))
    # disjoint sets: NUM_FORWARD draws to compare with, NUM_CHAINS draws to start the chains from
    forward = jax.tree.map(lambda a: a[NUM_CHAINS:], statistics(states, X))
    start = jax.tree.map(lambda a: a[:NUM_CHAINS], states)
    return forward, start


@pytest.mark.parametrize("config", [CONFIG, CONFIG_MH, CONFIG_SM, CONFIG_ALL],
                         ids=["gibbs", "mh", "split-merge", "all-updates"])
def test_geweke_successive_conditional(geweke_setup, config):
    forward, start = geweke_setup
    chain = make_geweke_run(config)(jax.random.split(jax.random.key(12), NUM_CHAINS), start)
    pvals = compare(forward, chain)
    print("Geweke p-values:", pvals)
    assert min(pvals.values()) > 1e-3, pvals
    # the chain did move: the path move is accepted and the tree changes
    assert np.mean(np.asarray(chain["num_leaves"])) > 1.0


def test_geweke_power_dropped_proposal_ratio(geweke_setup, monkeypatch):
    forward, start = geweke_setup

    def broken(lik_new, lik_old, prior_new, prior_old, q_fwd, q_back):
        return (lik_new + prior_new) - (lik_old + prior_old)  # the nCRP proposal ratio dropped

    monkeypatch.setattr(bhmc_paths, "log_acceptance", broken)
    chain = make_geweke_run(CONFIG_MH)(jax.random.split(jax.random.key(12), NUM_CHAINS), start)
    pvals = compare(forward, chain)
    print("Geweke p-values, broken kernel:", pvals)
    assert min(pvals.values()) < 1e-6, pvals


def test_geweke_power_path_gibbs_with_wrong_new_branch_weight(geweke_setup, monkeypatch):
    """Power of the Geweke test for the path Gibbs draw: a new branch weighted with 3α
    instead of α (the nCRP's new-table odds tripled) is rejected."""
    forward, start = geweke_setup
    exact = bhmc.path_gibbs

    def broken(key, parent, depth, old, count_minus, log_beta, logf, logf_star, alpha, gamma, config):
        return exact(key, parent, depth, old, count_minus, log_beta, logf, logf_star, 3.0 * alpha,
                     gamma, config)

    monkeypatch.setattr(bhmc_paths, "path_gibbs", broken)
    chain = make_geweke_run(CONFIG)(jax.random.split(jax.random.key(12), NUM_CHAINS), start)
    pvals = compare(forward, chain)
    print("Geweke p-values, broken path Gibbs:", pvals)
    assert min(pvals.values()) < 1e-6, pvals


def test_geweke_power_regraft_with_wrong_new_branch_weight(geweke_setup, monkeypatch):
    """Power of the Geweke test for the subtree moves (on in the all-updates run above; at
    depth 2 the leaves move inside the exact β update, :func:`regraft_leaves`): a move whose
    new branches are weighted with 3α instead of α is rejected."""
    forward, start = geweke_setup
    exact = bhmc.regraft_log_prior

    def broken(z, state, config):
        return exact(z, state._replace(alpha=3.0 * state.alpha), config)

    monkeypatch.setattr(bhmc_regraft, "regraft_log_prior", broken)
    config = CONFIG_ALL._replace(split_merge=0)  # the move under test and the updates it needs
    chain = make_geweke_run(config)(jax.random.split(jax.random.key(12), NUM_CHAINS), start)
    pvals = compare(forward, chain)
    print("Geweke p-values, broken subtree move:", pvals)
    assert min(pvals.values()) < 1e-4, pvals  # measured: 8e-6 (the number of first-level nodes)


def test_geweke_power_split_merge_with_wrong_ratio(geweke_setup, monkeypatch):
    """Power of the Geweke test for the component split-merge moves: a split ratio three times
    too large (as if ``γ0`` were tripled in the move alone; merges three times less likely)
    is rejected."""
    forward, start = geweke_setup
    exact = bhmc.split_merge_log_ratio

    def broken(*args):
        log_ratio, in_b = exact(*args)
        return log_ratio + jnp.log(3.0), in_b

    monkeypatch.setattr(bhmc_split_merge, "split_merge_log_ratio", broken)
    chain = make_geweke_run(CONFIG_SM)(jax.random.split(jax.random.key(12), NUM_CHAINS), start)
    pvals = compare(forward, chain)
    print("Geweke p-values, broken split-merge:", pvals)
    assert min(pvals.values()) < 1e-4, pvals


def test_geweke_power_paper_beta_rule(geweke_setup):
    """The paper's eqs. 3-4 (point counts instead of table counts, ``beta_rule="paper"``) are
    not the exact conditionals: with them on, the same Geweke test rejects (measured: the
    number of components p = 6e-5, the leaf weight of point 0's component p = 7e-6, where
    the exact rule gives p >= 0.08 on every statistic)."""
    forward, start = geweke_setup
    config = CONFIG_BETA._replace(beta_rule="paper")
    chain = make_geweke_run(config)(jax.random.split(jax.random.key(12), NUM_CHAINS), start)
    pvals = compare(forward, chain)
    print("Geweke p-values, paper's beta rule:", pvals)
    assert min(pvals.values()) < 1e-4, pvals


# ------------------------------------------------------------------------ 3. path Gibbs
def _path_gibbs_setup(seed=3):
    """A state of 6 points at depth 2 with three leaves under two top nodes, one point's removal."""
    hyper = nested.NestedHDP(depth=2, alpha=0.8, gamma0=1.5, gamma=1.2, Sigma=[[0.3]], Sigma0=[[1.0]])
    model = bhmc.make_model(hyper)
    config = bhmc.BHMCConfig(2, 12, 6)
    X = jnp.asarray([[-2.0], [-1.8], [0.1], [0.3], [2.0], [2.2]])
    paths = jnp.asarray([[1, 2], [1, 2], [1, 3], [1, 3], [4, 5], [4, 5]], jnp.int32)
    c = jnp.asarray([0, 0, 1, 1, 2, 2], jnp.int32)
    theta = jnp.asarray([[-1.9], [0.2], [2.1], [0.0], [0.0], [0.0]])
    log_beta = jnp.full((12, 7), -jnp.inf)
    state = bhmc_start._assemble(paths, c, theta, log_beta, hyper.alpha, hyper.gamma0, hyper.gamma, X, model,
                           config)
    state = bhmc.update_beta(jax.random.key(seed), state, config)
    return state, X, model, config, hyper


def test_path_gibbs_matches_enumeration():
    """The path Gibbs draw of point 2 (alone with point 3 under leaf 3) against the exact
    conditional: every existing leaf and a new branch under the root and under each top
    node, scored by the exchangeable path prior p(V') (docs/mathematics.md §6, independent of
    the sampler's nCRP walk) times p(x | β) with the new branch's weights integrated out
    (their mean is the parent's). TV < 0.02 over 40,000 draws. The new leaf's weights drawn
    under the root have the mean of the exact conditional."""
    state, X, model, config, hyper = _path_gibbs_setup()
    n, K = 2, 6
    x = X[n]
    old = bhmc_model.full_path(state.paths[n])
    count_minus = state.count.at[old].add(-1)
    logf = jnp.where(state.comp_active, bhmc_model.mvn_logpdf(x[None, :], state.theta, model.chol_sigma),
                     -jnp.inf)
    logf_star = bhmc_model.mvn_logpdf(x[None, :], model.mu0, model.chol_marginal)[0]
    lb = np.asarray(state.log_beta, np.float64)

    def lik(row):
        return float(np.logaddexp(np.logaddexp.reduce(row[:K] + np.asarray(logf)), row[K] + float(logf_star)))

    others = np.asarray(state.paths).copy()
    cands, logp = [], []
    for cand in ([1, 2], [1, 3], [4, 5], [1, 90], [4, 90], [90, 91]):
        paths = others.copy()
        paths[n] = cand
        where = cand[0] if cand[1] == 90 else 0 if cand[0] == 90 else cand[1]
        logp.append(float(path_log_prior(jnp.asarray(paths), hyper.alpha, 100)) + lik(lb[where]))
        cands.append(tuple(cand))
    p = np.exp(np.array(logp) - np.logaddexp.reduce(logp))

    draw = jax.jit(jax.vmap(lambda k: bhmc.path_gibbs(
        k, state.parent, state.depth, old, count_minus, state.log_beta, logf, logf_star,
        state.alpha, state.gamma, config)))
    keys = jax.random.split(jax.random.key(5), 40000)
    path, parent, depth, log_beta, over = draw(keys)
    assert not bool(jnp.any(over))
    path = np.asarray(path)
    live_before = np.asarray(count_minus) > 0
    freq = []
    for cand in cands:
        top_new, leaf_new = cand[0] == 90, cand[1] >= 90
        hit = np.ones(len(path), bool)
        hit &= ~live_before[path[:, 1]] if top_new else path[:, 1] == cand[0]
        hit &= ~live_before[path[:, 2]] if leaf_new else path[:, 2] == cand[1]
        freq.append(hit.mean())
    freq = np.array(freq)
    assert freq.sum() == pytest.approx(1.0)
    tv = 0.5 * np.abs(freq - p).sum()
    print("exact", p.round(4), "sampled", freq.round(4), "TV", tv)
    assert tv < 0.02
    assert p.min() > 0.01  # every kind of candidate has weight: the test can see each
    # the new leaf under the root: E[β_leaf] = Σ_j w_j E[Dir(γ E[β_1] + e_j)] with w_j ∝ β_0j f_j(x)
    g = float(state.gamma)
    w = np.exp(np.concatenate([lb[0, :K] + np.asarray(logf), [lb[0, K] + float(logf_star)]]))
    w = np.where(np.isfinite(w), w, 0.0)
    w /= w.sum()
    b0 = np.exp(np.where(np.isfinite(lb[0]), lb[0], -np.inf))
    expect = sum(w[j] * (g * (g * b0 + np.eye(K + 1)[j]) / (g + 1) + np.eye(K + 1)[j]) / (g + 1)
                 for j in range(K + 1))
    root_new = ~live_before[path[:, 1]]
    leaf_rows = np.asarray(log_beta)[np.arange(len(path)), path[:, 2]][root_new]
    got = np.exp(leaf_rows).mean(0)
    se = np.exp(leaf_rows).std(0) / np.sqrt(len(leaf_rows))
    print("new leaf weights: expected", expect.round(3), "sampled", got.round(3))
    np.testing.assert_allclose(got, expect, atol=5 * se.max() + 1e-3)


# ------------------------------------------------------------------------ 4. subtree moves
def _tree_state(paths, c, depth, seed=3, K=6, M=24):
    hyper = nested.NestedHDP(depth=depth, alpha=0.8, gamma0=1.5, gamma=1.2, Sigma=[[0.3]], Sigma0=[[1.0]])
    model = bhmc.make_model(hyper)
    config = bhmc.BHMCConfig(depth, M, K)
    n = len(paths)
    X = jnp.asarray(np.linspace(-2.0, 2.0, n)[:, None])
    theta = jnp.zeros((K, 1))
    log_beta = jnp.full((M, K + 1), -jnp.inf)
    state = bhmc_start._assemble(jnp.asarray(paths, jnp.int32), jnp.asarray(c, jnp.int32), theta, log_beta,
                           hyper.alpha, hyper.gamma0, hyper.gamma, X, model, config)
    state = bhmc.update_beta(jax.random.key(seed), state, config)
    return state, config, hyper


def _places(state, z, config):
    """Every place of ``z``'s subtree, rebuilt from the paths: ``(u, d_u, new_paths, new
    branch ids)`` with ``u`` the candidate slot (below ``u``, or a new branch from ``u``; new
    node ids from 900)."""
    paths = np.asarray(state.paths)
    count, depth_arr = np.asarray(state.count), np.asarray(state.depth)
    ell = int(depth_arr[z])
    in_sub = paths[:, ell - 1] == z
    others = paths[~in_sub]
    for u in range(config.node_capacity):
        if u != 0 and (count[u] == 0 or depth_arr[u] > ell - 1):
            continue
        d_u = 0 if u == 0 else int(depth_arr[u])
        if u != 0 and not np.any(others[:, d_u - 1] == u):
            continue  # only the subtree's own points pass through u
        prefix = [] if u == 0 else list(paths[np.flatnonzero(paths[:, d_u - 1] == u)[0], :d_u])
        branch = [900 + j for j in range(ell - 1 - d_u)]  # a new branch
        new = paths.copy()
        new[in_sub, : ell - 1] = prefix + branch
        yield u, d_u, new, branch


def _brute_regraft_log_weights(state, z, rows, hyper, config):
    """Every place of ``z``'s subtree by rebuilding the paths: log p(V') by the path prior of
    docs/mathematics.md §6 (not the sampler's block formula) plus the subtree's factor given
    the parent's weights (a leaf: Dirichlet-multinomial of its component counts; an internal
    node: the Dirichlet density of its weights), both in float64 NumPy/SciPy."""
    from scipy.special import gammaln

    L = config.depth
    ell = int(np.asarray(state.depth)[z])
    rows = np.asarray(rows, np.float64)
    active = np.asarray(state.comp_active)
    cols = np.r_[active, True]
    n_z = np.r_[np.asarray(state.node_comp)[z], 0][cols].astype(float)
    floor = np.log(np.finfo(np.asarray(state.log_beta).dtype).tiny)  # an underflowed weight: tiny
    log_beta_z = np.maximum(np.asarray(state.log_beta, np.float64)[z], floor)[cols]
    out = {}
    for u, _, new, _ in _places(state, z, config):
        log_v = float(path_log_prior(jnp.asarray(new), hyper.alpha, 1000))
        a = hyper.gamma * np.exp(np.maximum(rows[u], floor))[cols]
        if ell == L:
            lik = gammaln(a.sum()) - gammaln(a.sum() + n_z.sum()) + np.sum(gammaln(a + n_z) - gammaln(a))
        else:
            lik = gammaln(a.sum()) + np.sum((a - 1.0) * log_beta_z - gammaln(a))  # log Dir(β_z; a)
        out[u] = log_v + lik
    return out


@pytest.mark.parametrize("case", [
    # depth 2: a leaf whose parent keeps other points, and one whose parent would vanish
    ([[1, 2], [1, 2], [1, 3], [1, 3], [4, 5], [4, 5]], [0, 0, 1, 1, 2, 2], 3),
    ([[1, 2], [1, 2], [1, 3], [1, 3], [4, 5], [4, 5]], [0, 0, 1, 1, 2, 2], 5),
    # depth 3: a leaf (new branches of one and two levels), an internal node, a vanishing one
    ([[1, 2, 3], [1, 2, 3], [1, 2, 6], [1, 7, 8], [9, 10, 11], [9, 10, 11]], [0, 0, 1, 1, 2, 2], 3),
    ([[1, 2, 3], [1, 2, 3], [1, 2, 6], [1, 7, 8], [9, 10, 11], [9, 10, 11]], [0, 0, 1, 1, 2, 2], 7),
    ([[1, 2, 3], [1, 2, 3], [1, 2, 6], [1, 7, 8], [9, 10, 11], [9, 10, 11]], [0, 0, 1, 1, 2, 2], 10),
    ([[1, 2, 3], [1, 2, 3], [1, 2, 6], [1, 7, 8], [9, 10, 11], [9, 10, 11]], [0, 0, 1, 1, 2, 2], 11),
], ids=["d2-leaf", "d2-vanishing-leaf", "d3-leaf", "d3-internal", "d3-vanishing-internal",
        "d3-vanishing-leaf"])
def test_regraft_log_weights_match_the_joint(case):
    """The subtree move's weights over every place equal, up to one constant, the joint
    rebuilt from the paths (enumeration of the places of a small tree); the auxiliary rows
    of new branches are arbitrary weights here."""
    paths, c, z = case
    depth = len(paths[0])
    state, config, hyper = _tree_state(paths, c, depth)
    M, K = config.node_capacity, config.component_capacity
    rng = np.random.default_rng(0)
    aux = rng.dirichlet(np.ones(K + 1), size=M)
    rows = np.where(np.asarray(state.depth)[:, None] == np.asarray(state.depth)[z] - 1,
                    np.asarray(state.log_beta, np.float64), np.log(aux))
    rows = np.where(np.isfinite(rows), rows, np.log(aux))
    got = np.asarray(bhmc.regraft_log_weights(z, state, jnp.asarray(rows), config), np.float64)
    want = _brute_regraft_log_weights(state, z, rows, hyper, config)
    cand = sorted(want)
    assert len(cand) >= 2  # the present place and another
    assert np.all(np.isfinite(got[cand]))
    others = np.setdiff1d(np.arange(M), cand)
    assert np.all(np.isneginf(got[others]))
    g = got[cand] - got[cand[0]]
    w = np.array([want[u] for u in cand]) - want[cand[0]]
    print("places", cand, "weights", g.round(4), "joint", w.round(4))
    np.testing.assert_allclose(g, w, atol=1e-4)
    # the present place is among the candidates
    _, _, cur = bhmc_regraft._subtree_place(z, state, config)
    assert int(cur) in cand


def test_regraft_keeps_the_tables_consistent_with_the_paths():
    """After passes of the subtree moves over a depth-3 tree (α large, so that subtrees move
    and new branches open), the node table, the per-node component counts and the weights
    agree with the paths: ``count``, ``parent``, ``depth`` rebuilt by ``tree_from_paths``,
    ``node_comp`` recounted, live rows normalised. Some subtrees moved."""
    paths = [[1, 2, 3], [1, 2, 3], [1, 2, 6], [1, 7, 8], [9, 10, 11], [9, 10, 11], [9, 12, 13], [1, 7, 14]]
    c = [0, 0, 1, 1, 2, 2, 3, 1]
    state, config, _ = _tree_state(paths, c, 3, M=40)
    state = state._replace(alpha=jnp.asarray(3.0, state.alpha.dtype))
    run = jax.jit(lambda k, s: bhmc.regraft(k, s, config))
    total = 0
    for i in range(30):
        state, moved = run(jax.random.key(i), state)
        total += int(moved)
        assert not bool(state.overflow)
        parent, depth, count = (np.asarray(a) for a in nested.tree_from_paths(state.paths, config.node_capacity))
        live = count > 0
        np.testing.assert_array_equal(np.asarray(state.count), count)
        np.testing.assert_array_equal(np.asarray(state.parent)[live], parent[live])
        np.testing.assert_array_equal(np.asarray(state.depth)[live], depth[live])
        full = np.c_[np.zeros(len(paths), int), np.asarray(state.paths)]
        node_comp = np.zeros((config.node_capacity, config.component_capacity), int)
        np.add.at(node_comp, (full, np.asarray(state.c)[:, None]), 1)
        np.testing.assert_array_equal(np.asarray(state.node_comp), node_comp)
        w = np.exp(np.asarray(state.log_beta, np.float64)[live]).sum(1)
        np.testing.assert_allclose(w, 1.0, rtol=1e-4)
    assert total > 10


def _brute_leaf_table_log_weights(state, z, tables, rows, hyper, config):
    """Every place of leaf ``z`` by rebuilding the paths: log p(V') (the path prior) plus, for
    every parent of leaves in the new tree, the Dirichlet-multinomial of its children's table
    counts under ``γβ_g`` (its parent's weights, or ``rows`` for the place's own parent)."""
    from scipy.special import gammaln

    parent = np.asarray(state.parent)
    L = config.depth
    rows = np.asarray(rows, np.float64)
    lb = np.asarray(state.log_beta, np.float64)
    floor = np.log(np.finfo(np.asarray(state.log_beta).dtype).tiny)
    active = np.asarray(state.comp_active)
    tables = np.asarray(tables)
    out = {}
    for u, d_u, new, branch in _places(state, z, config):
        total = float(path_log_prior(jnp.asarray(new), hyper.alpha, 1000))
        for par in np.unique(new[:, L - 2]):  # every parent of leaves in the new tree
            kids = np.unique(new[new[:, L - 2] == par, L - 1])
            T = sum(tables[k] for k in kids)[active].astype(float)
            if (branch and par == branch[-1]) or (not branch and par == u):
                g = rows[u]  # the place's parent: the weights above it are the place's row
            else:
                g = lb[parent[par]] if L > 1 else lb[0]
            a = hyper.gamma * np.exp(np.maximum(g, floor))[:-1][active]
            A = hyper.gamma * np.exp(np.maximum(g, floor))[np.r_[active, True]].sum()
            total += gammaln(A) - gammaln(A + T.sum()) + np.sum(gammaln(a + T) - gammaln(a))
        out[u] = total
    return out


@pytest.mark.parametrize("case", [
    ([[1, 2], [1, 2], [1, 3], [1, 3], [4, 5], [4, 5], [4, 6]], [0, 0, 1, 1, 2, 2, 1], 3),
    ([[1, 2], [1, 2], [1, 3], [1, 3], [4, 5], [4, 5], [4, 6]], [0, 0, 1, 1, 2, 2, 1], 6),
    ([[1, 2], [1, 2], [1, 3], [1, 3], [4, 5], [4, 5]], [0, 0, 1, 1, 2, 2], 5),
    ([[1, 2, 3], [1, 2, 3], [1, 2, 6], [1, 7, 8], [9, 10, 11], [9, 10, 11]], [0, 0, 1, 1, 2, 2], 3),
    ([[1, 2, 3], [1, 2, 3], [1, 2, 6], [1, 7, 8], [9, 10, 11], [9, 10, 11]], [0, 0, 1, 1, 2, 2], 11),
], ids=["d2-leaf", "d2-leaf-shared", "d2-vanishing", "d3-leaf", "d3-vanishing"])
def test_leaf_table_log_weights_match_the_joint(case):
    """The leaves' moves inside the exact β update (parents' weights integrated out given the
    leaves' table counts): the weights of every place equal, up to one constant, the joint
    rebuilt from the paths: the path prior and, for every parent of leaves, the
    Dirichlet-multinomial of its children's tables."""
    paths, c, z = case
    depth = len(paths[0])
    state, config, hyper = _tree_state(paths, c, depth)
    M, K = config.node_capacity, config.component_capacity
    n_leaf = np.where((np.asarray(state.depth) == depth)[:, None], np.asarray(state.node_comp), 0)
    tables = np.minimum(n_leaf, 1 + np.arange(M)[:, None] % 2)  # any table counts with 1 <= m <= n
    rng = np.random.default_rng(1)
    lb = np.asarray(state.log_beta, np.float64)
    d = np.where(np.arange(M) == 0, 0, np.asarray(state.depth))
    aux = np.log(rng.dirichlet(np.ones(K + 1), size=M))
    p = np.maximum(np.asarray(state.parent), 0)
    rows = np.where((d == depth - 1)[:, None], lb[p], np.where((d == depth - 2)[:, None], lb, aux))
    rows = np.where(np.isfinite(rows), rows, aux)
    got = np.asarray(bhmc.leaf_table_log_weights(z, state, jnp.asarray(tables), jnp.asarray(rows), config),
                     np.float64)
    want = _brute_leaf_table_log_weights(state, z, tables, rows, hyper, config)
    cand = sorted(want)
    assert len(cand) >= 2
    assert np.all(np.isfinite(got[cand]))
    assert np.all(np.isneginf(got[np.setdiff1d(np.arange(M), cand)]))
    g = got[cand] - got[cand[0]]
    w = np.array([want[u] for u in cand]) - want[cand[0]]
    print("places", cand, "weights", g.round(4), "joint", w.round(4))
    np.testing.assert_allclose(g, w, atol=1e-4)
