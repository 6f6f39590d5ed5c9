"""Dirichlet diffusion trees: data term, move identities, outputs, NumPyro kernels, errors (docs/mathematics.md §5).

The distributional checks (prior normalisation, Geweke tests, the 4-point
posterior) are in ``tests/exact/test_ddt_exact.py``.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.infer import MCMC
from scipy import stats

from jaxbnp.inference.trees import mcmc as ddt_mcmc
from jaxbnp.inference.trees import population as pop
from jaxbnp.inference.trees.fit import fit_ddt
from jaxbnp.inference.trees.mcmc import DiffusionTreeMCMC
from jaxbnp.inference.trees.population import PopulationDDT
from jaxbnp.models import ddt
from jaxbnp.models.ddt import BrownianLeaves, DiffusionTree

FAST = {"xla_backend_optimization_level": 0, "xla_cpu_use_fusion_emitters": False}
jit = partial(jax.jit, compiler_options=FAST)  # these programs are tiny: compile fast, run slow
_sample_tree = jit(ddt.sample_tree, static_argnums=2)
_log_likelihood = jit(ddt.log_likelihood)
_log_prior = jit(ddt.structure_log_prior)
_init = jit(ddt_mcmc.init)


def _tree(n, seed, c=1.0):
    return _sample_tree(jax.random.key(seed), c, n)


def _lca_covariance(tree):
    """``C_ij`` from the parent pointers in plain Python (independent of the library's version)."""
    parent, time = np.asarray(tree.parent), np.asarray(tree.time)
    n = (len(parent) + 1) // 2

    def ancestors(i):
        out = []
        while parent[i] >= 0:
            i = parent[i]
            out.append(i)
        return out

    C = np.eye(n)
    for i in range(n):
        for j in range(i + 1, n):
            shared = set(ancestors(i)) & set(ancestors(j))
            C[i, j] = C[j, i] = max(time[v] for v in shared)
    return C


# ------------------------------------------------------------------------------- data term
def test_data_term_by_message_passing_matches_dense_gaussian():
    for seed in range(3):
        tree = _tree(6, seed)
        ddt.check_tree(tree, 6)
        C = _lca_covariance(tree)
        np.testing.assert_allclose(np.asarray(jit(ddt.divergence_covariance)(tree)), C)
        X = np.random.default_rng(seed).normal(size=(6, 3))
        for sigma, noise in ((1.0, 0.0), (0.7, 0.4)):
            cov = sigma**2 * C + noise**2 * np.eye(6)
            dense = stats.multivariate_normal(np.zeros(6), cov).logpdf(X.T).sum()
            np.testing.assert_allclose(_log_likelihood(tree, X, sigma, noise), dense, rtol=1e-10)
    leaves = BrownianLeaves(tree, 0.7, 0.4)
    np.testing.assert_allclose(leaves.log_prob(X), _log_likelihood(tree, X, 0.7, 0.4), rtol=1e-12)


def test_brownian_sampler_has_the_model_covariance():
    tree = _tree(5, 3)
    draws = jit(lambda k: BrownianLeaves(tree, 0.8, 0.3, dim=1).sample(k, (40000,)))(jax.random.key(0))
    assert draws.shape == (40000, 5, 1)
    target = 0.64 * _lca_covariance(tree) + 0.09 * np.eye(5)
    np.testing.assert_allclose(np.cov(np.asarray(draws)[..., 0].T), target, atol=0.02)


# ------------------------------------------------------------ the moves' incremental data term
_tree_messages = jit(ddt.tree_messages)
_refresh = jit(ddt.refresh_messages)
_tree_moves = jit(ddt_mcmc._tree_moves, static_argnums=3)


def _assert_same_messages(a, b):
    for field in ("mean", "var", "term"):
        np.testing.assert_allclose(getattr(a, field), getattr(b, field), rtol=1e-9, atol=1e-12)


def test_refreshed_messages_equal_a_full_pass():
    """Change one time, or move a subtree by hand: the messages brought up to date along the
    root paths from the changed nodes equal those of a full upward pass; starting elsewhere
    (a wrong start) leaves them stale, so the check can fail."""
    n = 9
    X = np.random.default_rng(0).normal(size=(n, 3))
    tree = _tree(n, 4)
    msg, _ = _tree_messages(tree, X, 0.8, 0.3)
    root = int(ddt.root_of(tree))
    v = int(np.asarray(tree.children)[root - n, 0])
    v = v if v >= n else int(np.asarray(tree.children)[root - n, 1])
    hi = float(min(tree.time[tree.children[v - n, 0]], tree.time[tree.children[v - n, 1]]))
    moved = tree._replace(time=tree.time.at[v].set(0.5 * (float(tree.time[root]) + hi)))
    want, _ = _tree_messages(moved, X, 0.8, 0.3)
    _assert_same_messages(_refresh(moved, msg, jnp.array([v, -1]), 0.8), want)
    stale = _refresh(moved, msg, jnp.array([root, -1]), 0.8)  # skips v: its own message is stale
    assert not np.allclose(stale.var, want.var)
    # a subtree move by hand: detach leaf 0, hang it above another node
    rest, root_rest, w, u = ddt.detach(tree, root, 0)
    target = int(np.flatnonzero(np.asarray(rest.parent) >= 0)[-1])
    lo = float(rest.time[rest.parent[target]])
    new, _ = ddt.attach(rest, root_rest, 0, target, 0.5 * (lo + float(min(rest.time[target], 1.0))), w)
    ddt.check_tree(new, n)
    want, _ = _tree_messages(new, X, 0.8, 0.3)
    _assert_same_messages(_refresh(new, msg, jnp.stack([new.parent[u], w]), 0.8), want)


def test_incremental_data_term_equals_a_full_recomputation_after_long_move_sequences():
    """A sweep carries the messages, subtree sizes and both terms from move to move; after
    hundreds of accepted subtree and time moves they equal a recomputation from scratch."""
    n, D = 12, 3
    tree = _tree(n, 0)
    X = np.asarray(jit(ddt.sample_leaves, static_argnames="dim")(jax.random.key(1), tree, 1.0, 0.3, dim=D))
    state = _init(tree, X, 1.0, 1.0, 0.3)
    moves = 400
    accepted = 0
    for r in range(4):
        state, msg, acc_sub, acc_time = _tree_moves(jax.random.key(10 + r), state, X, moves, 1.0)
        accepted += int(acc_sub) + int(acc_time)
        ddt.check_tree(state.tree, n)
        full, sizes = _tree_messages(state.tree, X, state.sigma, state.noise)
        _assert_same_messages(msg, full)
        np.testing.assert_array_equal(state.sizes, sizes)
        np.testing.assert_allclose(state.log_likelihood, _log_likelihood(state.tree, X, 1.0, 0.3), rtol=1e-12)
        np.testing.assert_allclose(state.log_prior, _log_prior(state.tree, 1.0), rtol=1e-12)
    assert accepted > 200  # the trees did change


def test_walks_vmapped_equal_the_walks_one_at_a_time():
    """The tree walks (ancestors, the prior's new path, the message refresh) run through
    ``chain_while``, whose batched form replaces JAX's own batching of a while loop: vmapped,
    and vmapped twice, they give what each walk gives on its own (nodes and masks exactly; the
    messages to the last bit, which batched arithmetic may round differently)."""

    def same(g, w):
        if jnp.issubdtype(g.dtype, jnp.floating):
            np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-15)
        else:
            np.testing.assert_array_equal(g, w)

    n = 14
    X = jnp.asarray(np.random.default_rng(3).normal(size=(n, 2)))
    trees = [_tree(n, s) for s in range(3)]
    batch = jax.tree.map(lambda *a: jnp.stack(a), *trees)
    sizes = jax.vmap(ddt.subtree_sizes)(batch)
    roots = jax.vmap(ddt.root_of)(batch)
    msgs = jax.vmap(lambda t: ddt.tree_messages(t, X, 0.8, 0.3)[0])(batch)
    nodes = jnp.array([0, 5, n + 2])
    keys = jax.random.split(jax.random.key(4), 3)
    unif = jax.random.uniform(jax.random.key(5), (3, n, 2))
    starts = jnp.array([[1, n + 3], [n + 1, -1], [7, 2]])

    def walks(tree, size, root, msg, node, key, u, start):
        tree = tree._replace(time=tree.time.at[ddt.root_of(tree)].multiply(0.9))  # messages stale
        return (ddt.ancestor_mask(tree.parent, node), ddt.descend(key, tree, size, root, 1.3),
                ddt.descend(u, tree, size, root, 1.3), ddt.refresh_messages(tree, msg, start, 0.8).rows)

    args = (batch, sizes, roots, msgs, nodes, keys, unif, starts)
    one_by_one = [jit(walks)(*jax.tree.map(lambda a: a[i], args)) for i in range(3)]
    want = jax.tree.map(lambda *a: jnp.stack(a), *one_by_one)
    got = jit(jax.vmap(walks))(*args)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        same(g, w)
    twice = jit(jax.vmap(jax.vmap(walks), in_axes=(None, None, None, None, 0, 0, 0, 0)))(
        *args[:4], *(jnp.stack([a, a[::-1]]) for a in args[4:]))
    for g, w in zip(jax.tree.leaves(twice), jax.tree.leaves(want)):
        same(g[0], w)
    assert int(jnp.sum(want[0])) > 0 and bool(jnp.any(want[1][2]))  # non-trivial walks


def test_population_step_same_draws_with_chains_vmapped_or_one_after_another():
    """``chain_batching``: the chains' sweeps vmapped or mapped give the same states."""
    n = 8
    X = jnp.asarray(np.random.default_rng(4).normal(size=(n, 2)))
    chains = pop.init(jax.vmap(lambda k: ddt.sample_tree(k, 1.0, n))(jax.random.split(jax.random.key(0), 4)),
                      X, 1.0, 1.0, 0.2)
    hyper = ddt_mcmc.Hyperpriors(c=dist.LogNormal(0.0, 1.0), sigma=dist.LogNormal(0.0, 1.0))
    out = {}
    for how in ("vmap", "map"):
        run = jit(lambda k, c, how=how: pop.step(k, c, X, subset_size=2, hyperpriors=hyper, chain_batching=how)[0])
        state = chains
        for i in range(3):
            state = run(jax.random.key(10 + i), state)
        out[how] = state
    np.testing.assert_array_equal(out["vmap"].tree.parent, out["map"].tree.parent)
    for a, b in zip(jax.tree.leaves(out["vmap"]), jax.tree.leaves(out["map"])):
        np.testing.assert_allclose(a, b, rtol=1e-12)
    assert not np.array_equal(out["map"].tree.parent, chains.tree.parent)  # the chains moved


# ---------------------------------------------------------------------------- move identities
def test_leaf_subtree_moves_are_metropolis_hastings_on_the_data_term():
    """For a single leaf the structure terms and the re-attachment density cancel exactly
    (docs/mathematics.md §5), so the subtree move is Neal's move: MH on the data term alone."""
    n = 6
    tree = _tree(n, 1)
    X = np.random.default_rng(1).normal(size=(n, 2))
    state = _init(tree, X, 1.3, 1.0, 0.2)
    proposal = jit(ddt_mcmc.subtree_proposal)
    checked = 0
    for seed in range(40):
        unif = jax.random.uniform(jax.random.key(seed), (n + 1, 2))
        new_tree, log_q, valid = proposal(unif, state)
        root = int(ddt.root_of(tree))
        r = min(int(np.floor(float(unif[n, 0]) * (2 * n - 2))), 2 * n - 3)
        s = r if r < root else r + 1
        if bool(valid):
            ddt.check_tree(new_tree, n)
        if s < n:
            assert bool(valid)
            lp_new = _log_prior(new_tree, 1.3)
            np.testing.assert_allclose(lp_new - state.log_prior + log_q, 0.0, atol=1e-10)
            checked += 1
    assert checked >= 10


def _same_tree(a, b):
    """Equal as trees: the order of a node's two children carries no meaning."""
    return (np.array_equal(a.parent, b.parent) and np.array_equal(a.time, b.time)
            and np.array_equal(np.sort(np.asarray(a.children), 1), np.sort(np.asarray(b.children), 1)))


_detach_leaves = jit(pop.detach_leaves)
_insert_leaves = jit(pop.insert_leaves)
_attach = jit(ddt.attach)
_partial_log_likelihood = jit(lambda t, X, r, a: ddt.log_likelihood(t, X, 1.1, 0.3, root=r, active=a))


def test_attachment_density_is_the_change_of_the_structure_term():
    """Growing a tree one leaf at a time: each step's density is the prior increment."""
    n = 5
    tree = _tree(n, 4, c=0.8)
    # the generative history: detach leaves n-1, ..., 1, then re-attach them in order
    det = _detach_leaves(tree, jnp.arange(1, n, dtype=jnp.int32))
    density = jit(ddt.log_attachment_density)
    total = 0.0
    current, root, in_tree = det.tree, det.root, det.in_tree
    for j, leaf in enumerate(range(1, n)):
        live = np.asarray(in_tree)
        sizes = np.zeros(2 * n - 1, int)
        sizes[:n] = live[:n]
        for v in np.argsort(-np.asarray(current.time)[n:]) + n:
            if live[v]:
                a, b = np.asarray(current.children)[v - n]
                sizes[v] = sizes[a] + sizes[b]
        step = density(current, jnp.asarray(sizes), root, det.siblings[j], det.times[j], 0.8)
        # the sampler's form, from the cached log1p(-time) of every node: the same value, exactly
        cached = density(current, jnp.asarray(sizes), root, det.siblings[j], det.times[j], 0.8,
                         log_survival=jnp.log1p(-current.time))
        assert float(cached) == float(step), (float(cached), float(step))
        total += float(step)
        current, root = _attach(current, root, leaf, det.siblings[j], det.times[j], det.freed[j])
        in_tree = in_tree.at[leaf].set(True).at[det.freed[j]].set(True)
    assert _same_tree(current, tree)
    np.testing.assert_allclose(total, _log_prior(tree, 0.8), rtol=1e-10)


def test_exchange_candidates_replay_and_reversibility():
    n = 6
    t1, t2 = _tree(n, 10), _tree(n, 11, c=2.0)
    X = jnp.asarray(np.random.default_rng(2).normal(size=(n, 2)))
    leaves = jnp.array([4, 1, 3], jnp.int32)
    det = _detach_leaves(t1, leaves)
    # the closed-form candidate data terms equal the data term of each attached tree
    candidates = jit(pop.candidate_log_likelihoods)
    i, w = int(leaves[0]), int(det.freed[0])
    for d in (0.1, 0.5, 0.93):
        cand = candidates(det.tree, det.root, det.in_tree, X, 1.1, 0.3, i, d)
        time, parent = np.asarray(det.tree.time), np.asarray(det.tree.parent)
        tp = np.where(parent >= 0, time[np.maximum(parent, 0)], 0)
        valid = np.asarray(det.in_tree) & (tp < d) & (d < time)
        assert valid.sum() >= 1
        for x in np.nonzero(valid)[0]:
            tree_x, root_x = _attach(det.tree, det.root, i, int(x), d, w)
            brute = _partial_log_likelihood(tree_x, X, root_x, det.in_tree[n:].at[w - n].set(True))
            np.testing.assert_allclose(cand[x], brute, rtol=1e-10)
    # replaying the recorded branches with the tree's own times rebuilds it exactly
    no_noise = jnp.zeros((3, 2 * n - 1))
    gumbel = lambda seed: jax.random.gumbel(jax.random.key(seed), (3, 2 * n - 1))  # noqa: E731
    rebuilt, _ = _insert_leaves(no_noise, det, leaves, det.times, X, 1.1, 0.3, det.siblings, True)
    assert _same_tree(rebuilt, t1)
    # the reverse of an exchange is an exchange with log r(reverse) = -log r(forward)
    init = _init
    s1, s2 = init(t1, X, 1.0, 1.1, 0.3), init(t2, X, 2.0, 1.1, 0.3)
    d1, d2 = det, _detach_leaves(t2, leaves)
    n1, q1f = _insert_leaves(gumbel(1), d1, leaves, d2.times, X, 1.1, 0.3, d1.siblings, False)
    n2, q2f = _insert_leaves(gumbel(2), d2, leaves, d1.times, X, 1.1, 0.3, d2.siblings, False)
    _, q1b = _insert_leaves(no_noise, d1, leaves, d1.times, X, 1.1, 0.3, d1.siblings, True)
    _, q2b = _insert_leaves(no_noise, d2, leaves, d2.times, X, 1.1, 0.3, d2.siblings, True)
    r1, r2 = _detach_leaves(n1, leaves), _detach_leaves(n2, leaves)
    np.testing.assert_allclose(r1.times, d2.times)  # the times were swapped
    np.testing.assert_allclose(r2.times, d1.times)
    np.testing.assert_array_equal(r1.freed, d1.freed)
    back1, q1b_rev = _insert_leaves(no_noise, r1, leaves, r2.times, X, 1.1, 0.3, d1.siblings, True)
    back2, q2b_rev = _insert_leaves(no_noise, r2, leaves, r1.times, X, 1.1, 0.3, d2.siblings, True)
    assert _same_tree(back1, t1) and _same_tree(back2, t2)
    _, q1f_rev = _insert_leaves(no_noise, r1, leaves, r1.times, X, 1.1, 0.3, r1.siblings, True)
    _, q2f_rev = _insert_leaves(no_noise, r2, leaves, r2.times, X, 1.1, 0.3, r2.siblings, True)
    # the reverse move's forward probability is this move's backward one, and vice versa
    np.testing.assert_allclose(q1b_rev + q2b_rev, q1b + q2b, rtol=1e-10)
    np.testing.assert_allclose(q1f_rev + q2f_rev, q1f + q2f, rtol=1e-10)
    n1s, n2s = init(n1, X, 1.0, 1.1, 0.3), init(n2, X, 2.0, 1.1, 0.3)
    target = lambda a, b: a.log_prior + a.log_likelihood + b.log_prior + b.log_likelihood  # noqa: E731
    forward = target(n1s, n2s) - target(s1, s2) + (q1b + q2b) - (q1f + q2f)
    reverse = target(s1, s2) - target(n1s, n2s) + (q1f_rev + q2f_rev) - (q1b_rev + q2b_rev)
    np.testing.assert_allclose(forward, -reverse, rtol=1e-10)


# ----------------------------------------------------------------------------------- outputs
def test_cut_tree_and_linkage():
    from scipy.cluster.hierarchy import dendrogram, fcluster, is_valid_linkage

    tree = ddt.comb_tree(5)  # ((((0,1),2),3),4), times 0.8, 0.6, 0.4, 0.2
    np.testing.assert_array_equal(ddt.cut_tree(tree, 0.1), [0, 0, 0, 0, 0])
    np.testing.assert_array_equal(ddt.cut_tree(tree, 0.5), [0, 0, 0, 1, 2])
    np.testing.assert_array_equal(ddt.cut_tree(tree, 0.9), [0, 1, 2, 3, 4])
    for k in range(1, 6):
        assert len(np.unique(np.asarray(ddt.cut_tree(tree, num_clusters=k)))) == k
    for seed in range(3):
        t = _tree(7, seed)
        Z = ddt.to_linkage(t)
        assert is_valid_linkage(Z) and Z.shape == (6, 4)
        np.testing.assert_allclose(np.sort(Z[:, 2]), np.sort(1 - np.asarray(t.time)[7:]))
        # scipy's own cut of the linkage gives the same clusters as cut_tree
        for t_stop in (0.3, 0.6):
            ours = np.asarray(ddt.cut_tree(t, t_stop))
            theirs = fcluster(Z, 1 - t_stop, criterion="distance")
            assert len(set(zip(ours, theirs))) == len(set(ours)) == len(set(theirs))
        assert sorted(dendrogram(Z, no_plot=True)["leaves"]) == list(range(7))


def test_from_linkage_keeps_the_clades_and_orders_the_times():
    from scipy.cluster.hierarchy import ward

    def clades(tree):
        children = np.asarray(tree.children)
        n = children.shape[0] + 1

        def leaves(v):
            return frozenset([v]) if v < n else leaves(children[v - n, 0]) | leaves(children[v - n, 1])

        return {leaves(v) for v in range(n, 2 * n - 1)}

    for seed in range(3):  # a tree's linkage and back: the same clades, the root first
        t = _tree(9, seed)
        back = ddt.from_linkage(ddt.to_linkage(t))
        assert clades(back) == clades(t)
        assert float(back.time[ddt.root_of(back)]) == pytest.approx(0.1)
    rng = np.random.default_rng(0)
    X = np.concatenate([rng.normal(size=(20, 2)), rng.normal(size=(20, 2)) + 8.0])
    X[5] = X[4]  # a zero merge height, and many near 1 in float32
    for dtype in (jnp.float32, jnp.float64):
        tree = ddt.from_linkage(ward(X), dtype=dtype)
        ddt.check_tree(tree, 40)  # times in (0, 1), rising from the root to the leaves
        assert tree.time.dtype == dtype
        labels = np.asarray(ddt.cut_tree(tree, num_clusters=2))
        top = set(labels[:20]), set(labels[20:])
        assert all(len(s) == 1 for s in top) and top[0] != top[1]
        lp, ll = ddt.log_joint_terms(tree, jnp.asarray(X, dtype), 1.0, 4.0, 0.1)
        assert np.isfinite(float(lp)) and np.isfinite(float(ll))
    _raises("shape \\(n-1, 4\\)", ddt.from_linkage, np.zeros((3, 3)))
    _raises("distinct clusters formed before it", ddt.from_linkage, np.array([[0, 0, 1.0, 2], [1, 2, 2.0, 3]]))
    _raises("t_root must be in", ddt.from_linkage, ward(X), t_root=1.0)


def test_fit_ddt_starts_from_the_ward_tree_or_the_prior():
    """``init="ward"`` hands every chain the Ward tree: with no warm-up and one draw the chains
    share the start's clades but for what one sweep changed; ``init="prior"`` starts elsewhere."""
    from scipy.cluster.hierarchy import ward

    rng = np.random.default_rng(1)
    X = np.concatenate([rng.normal(size=(12, 2)), rng.normal(size=(12, 2)) + 10.0])
    def root_clades(tree):
        labels = np.asarray(ddt.cut_tree(tree, num_clusters=2))
        return {frozenset(np.flatnonzero(labels == g)) for g in (0, 1)}

    start = root_clades(ddt.from_linkage(ward(X)))
    runs = {init: fit_ddt(X, num_chains=4, num_samples=1, num_warmup=0, key=jax.random.key(0), init=init,
                          num_clusters=2, progress_bar=False) for init in ("ward", "prior")}
    for init, fit in runs.items():
        assert fit.log_joint.shape == (4, 1) and np.isfinite(fit.log_joint).all()
    ward_run = runs["ward"].samples["tree"]
    for i in range(4):  # the far apart groups stay the root's clades after one sweep from the Ward tree
        assert root_clades(jax.tree.map(lambda a, i=i: a[i, 0], ward_run)) == start
    assert not np.array_equal(np.asarray(runs["prior"].samples["tree"].children), np.asarray(ward_run.children))


def test_plot_dendrogram():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from jaxbnp.plot import plot_dendrogram

    ax = plot_dendrogram(_tree(6, 0), t_stop=0.5, labels=list("abcdef"))
    assert "clusters" in ax.get_title()
    plt.close(ax.figure)


def test_distributions_sample_and_log_prob():
    d = DiffusionTree(1.5, 5)
    trees = d.sample(jax.random.key(0), (2, 3))
    assert trees.time.shape == (2, 3, 9) and trees.parent.shape == (2, 3, 9)
    lp = d.log_prob(trees)
    one = jax.tree.map(lambda a: a[1, 2], trees)
    np.testing.assert_allclose(lp[1, 2], ddt.structure_log_prior(one, 1.5))
    assert bool(d.support(one))
    leaves = BrownianLeaves(one, 1.0, 0.1, dim=3)
    X = leaves.sample(jax.random.key(1))
    assert X.shape == (5, 3) and leaves.event_shape == (5, 3)
    np.testing.assert_allclose(leaves.log_prob(X), ddt.log_likelihood(one, X, 1.0, 0.1))
    # off the support: a child older than its parent
    bad = one._replace(time=one.time.at[int(ddt.root_of(one))].set(0.999))
    assert not bool(d.support(bad)) and np.isneginf(d.log_prob(bad))


# -------------------------------------------------------------------------- NumPyro kernels
X6 = np.array([[-1.0, -0.8], [-1.2, -1.1], [-0.9, -1.3], [1.0, 0.9], [1.3, 1.1], [0.8, 1.2]])


def model(X):
    c = numpyro.sample("c", dist.LogNormal(0.0, 0.5))
    sigma = numpyro.sample("sigma", dist.LogNormal(0.0, 0.5))
    tree = numpyro.sample("tree", DiffusionTree(c, X.shape[0]))
    numpyro.sample("X", BrownianLeaves(tree, sigma, 0.2), obs=X)


def fixed_model(X):
    """Constants for c and sigma: a smaller program (the chain-method test compiles it 3 times)."""
    tree = numpyro.sample("tree", DiffusionTree(1.2, X.shape[0]))
    numpyro.sample("X", BrownianLeaves(tree, 0.9, 0.2), obs=X)


def _run(kernel, chain_method, num_chains=2, key=jax.random.key(0)):
    mcmc = MCMC(kernel, num_warmup=3, num_samples=6, num_chains=num_chains,
                chain_method=chain_method, progress_bar=False)
    mcmc.run(key, jnp.asarray(X6), extra_fields=("log_joint", "subtree_accepted"))
    return mcmc


def test_kernel_chain_methods_give_identical_draws():
    """Vectorised chains equal chains run one at a time. (``chain_method="sequential"`` runs
    each chain exactly like a single-chain run of its key, ``jax.random.split(key, K)[i]``,
    and numpyro compiles it once per chain, so the single-chain run stands in for it.) The
    trees' topologies are equal exactly; their times to rounding: XLA compiles the batched
    program with other fusions, which can change a time's last bit (seen: 1e-16)."""
    vec = _run(DiffusionTreeMCMC(fixed_model), "vectorized")
    one = _run(DiffusionTreeMCMC(fixed_model), "sequential", 1, jax.random.split(jax.random.key(0), 2)[1])
    ref = vec.get_samples(group_by_chain=True)
    other = one.get_samples(group_by_chain=True)
    assert ref["tree"].time.shape == (2, 6, 11) and set(ref) == {"tree"}
    for a, b in zip(jax.tree.leaves(ref), jax.tree.leaves(other)):
        if np.issubdtype(np.asarray(a).dtype, np.floating):
            np.testing.assert_allclose(np.asarray(a)[1:], np.asarray(b), rtol=1e-12)
        else:
            np.testing.assert_array_equal(np.asarray(a)[1:], np.asarray(b))
    assert not np.array_equal(np.asarray(ref["tree"].time[0]), np.asarray(ref["tree"].time[1]))  # keys split
    runs = {"vectorized": vec}
    # the log_joint field is the model's log density at the draw
    lj = np.asarray(runs["vectorized"].get_extra_fields(group_by_chain=True)["log_joint"])
    for chain, i in ((0, 5), (1, 2)):
        tree = jax.tree.map(lambda a: a[chain, i], ref["tree"])
        ddt.check_tree(tree, 6)
        expected = _log_prior(tree, 1.2) + _log_likelihood(tree, X6, 0.9, 0.2)
        np.testing.assert_allclose(lj[chain, i], expected, rtol=1e-9)


# ------------------------------------------------------------------------------------ errors
def _raises(match, fn, *args, **kwargs):
    with pytest.raises(ValueError, match=match):
        fn(*args, **kwargs)


def test_bad_inputs_raise_clear_errors():
    _raises("c must be a positive", DiffusionTree, 0.0, 5)
    _raises("c must be a positive", DiffusionTree, -1.0, 5)
    _raises("num_points must be >= 2", DiffusionTree, 1.0, 1)
    tree = ddt.comb_tree(4)
    _raises("sigma must be a positive", BrownianLeaves, tree, 0.0)
    _raises("noise must be a scalar >= 0", BrownianLeaves, tree, 1.0, -0.1)
    _raises("must be the value of a DiffusionTree", BrownianLeaves, np.zeros(7), 1.0)
    _raises("shape \\(4, D\\)", ddt.log_likelihood, tree, np.zeros((5, 2)), 1.0)
    _raises("num_points >= 2", ddt.sample_tree, jax.random.key(0), 1.0, 1)
    _raises("exactly one of t_stop or num_clusters", ddt.cut_tree, tree)
    _raises("num_clusters must be in 1..4", ddt.cut_tree, tree, num_clusters=5)
    _raises("increase from the root", ddt.check_tree, tree._replace(time=tree.time.at[4].set(0.1)))
    _raises("2 leaves but the data have 3", ddt.check_tree, ddt.comb_tree(2), 3)
    # kernels: checked before anything compiles
    X = X6.copy()
    X[2, 1] = np.nan
    with pytest.raises(ValueError, match="NaN or inf"):
        MCMC(DiffusionTreeMCMC(model), num_warmup=1, num_samples=1, progress_bar=False).run(jax.random.key(0), X)
    with pytest.raises(ValueError, match="rows but the DiffusionTree has num_points"):
        def wrong_rows(X):
            tree = numpyro.sample("tree", DiffusionTree(1.0, 5))
            numpyro.sample("X", BrownianLeaves(tree, 1.0), obs=X)
        MCMC(DiffusionTreeMCMC(wrong_rows), num_warmup=1, num_samples=1, progress_bar=False).run(
            jax.random.key(0), X6)
    with pytest.raises(ValueError, match="must live on \\(0, inf\\)"):
        def normal_c(X):
            c = numpyro.sample("c", dist.Normal(5.0, 0.1))
            tree = numpyro.sample("tree", DiffusionTree(c, 6))
            numpyro.sample("X", BrownianLeaves(tree, 1.0), obs=X)
        MCMC(DiffusionTreeMCMC(normal_c), num_warmup=1, num_samples=1, progress_bar=False).run(
            jax.random.key(0), X6)
    with pytest.raises(ValueError, match="does not update"):
        def extra_site(X):
            m = numpyro.sample("m", dist.Normal(0.0, 1.0))
            tree = numpyro.sample("tree", DiffusionTree(1.0, 6))
            numpyro.sample("X", BrownianLeaves(tree, 1.0), obs=X - m)
        MCMC(DiffusionTreeMCMC(extra_site), num_warmup=1, num_samples=1, progress_bar=False).run(
            jax.random.key(0), X6)
    with pytest.raises(ValueError, match="exactly one latent DiffusionTree"):
        MCMC(DiffusionTreeMCMC(lambda X: None), num_warmup=1, num_samples=1, progress_bar=False).run(
            jax.random.key(0), X6)

    class MyTrees(DiffusionTreeMCMC):  # the errors name the user's kernel
        pass

    with pytest.raises(ValueError, match="^MyTrees needs a model with exactly one latent DiffusionTree"):
        MCMC(MyTrees(lambda X: None), num_warmup=1, num_samples=1, progress_bar=False).run(
            jax.random.key(0), X6)
    # a misspelt init_params name is an error, not a value silently dropped
    with pytest.raises(ValueError, match=r"^PopulationDDT: init_params names \['sgima'\].*\['c', 'sigma', 'tree'\]"):
        PopulationDDT(model, 2, 2).init(jax.random.split(jax.random.key(0), 2), 0,
                                        {"sgima": jnp.ones(2)}, (X6,), {})
    _raises("time_step_size", DiffusionTreeMCMC, model, time_step_size=0.0)
    _raises("init_strategy", DiffusionTreeMCMC, model, init_strategy="random")
    # population kernel
    _raises("subset_size must be an integer >= 1", PopulationDDT, model, 4, 0)
    _raises("num_chains must be an integer >= 2", PopulationDDT, model, 1, 2)
    _raises("temperature must be a positive", PopulationDDT, model, 4, 2, temperature=0.0)
    _raises("temperature must be a positive", PopulationDDT, model, 4, 2, temperature=-1.0)
    with pytest.raises(ValueError, match="subset_size must be an integer between 1 and n - 1 = 5"):
        MCMC(PopulationDDT(model, 2, 6), num_warmup=1, num_samples=1, num_chains=2,
             chain_method="vectorized", progress_bar=False).run(jax.random.key(0), X6)
    with pytest.raises(ValueError, match="chain_method='vectorized'"):
        MCMC(PopulationDDT(model, 2, 2), num_warmup=1, num_samples=1, num_chains=2,
             chain_method="sequential", progress_bar=False).run(jax.random.key(0), X6)
    with pytest.raises(ValueError, match="num_chains=4"):
        MCMC(PopulationDDT(model, 4, 2), num_warmup=1, num_samples=1, num_chains=2,
             chain_method="vectorized", progress_bar=False).run(jax.random.key(0), X6)
    state = _init(_tree(6, 10), jnp.asarray(X6), 1.0, 1.1, 0.3)  # compiled already (same shapes)
    batch = jax.tree.map(lambda a: jnp.stack([a, a]), state)
    _raises("subset_size must be an integer between 1 and n - 1 = 5", pop.exchange_step,
            jax.random.key(0), batch, X6, 6)
    _raises("pair_batching", pop.exchange_step, jax.random.key(0), batch, X6, 2, 1.0, "pmap")
    _raises("chain_batching must be one of", pop.step, jax.random.key(0), batch, X6, subset_size=2,
            chain_batching="pmap")
    with pytest.raises(ValueError, match="chain_batching must be one of"):
        PopulationDDT(model, 2, 2, chain_batching="threads")
    _raises("num_subtree_moves must be >= 0", ddt_mcmc.step, jax.random.key(0), state, X6,
            num_subtree_moves=-1)
    # fit_ddt
    _raises("NaN or inf", fit_ddt, X)
    _raises("at least 2 points", fit_ddt, X6[:1])
    _raises("population=True needs num_chains >= 2", fit_ddt, X6, num_chains=1)
    _raises("t_stop must be in", fit_ddt, X6, t_stop=1.5)
    _raises("init must be 'ward' or 'prior'", fit_ddt, X6, init="kmeans")
    _raises("pass init='prior'", fit_ddt, np.zeros((30_001, 1)))
