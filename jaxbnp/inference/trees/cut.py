"""The seed's diffusion-tree clustering model: a DDT structure prior cut at a stopping time
over cluster likelihoods (docs/mathematics.md §5, "The cut model"), pure core.

The population-MCMC seed (Wang, Laskey & Domeniconi) uses the Dirichlet diffusion tree as a
prior over cluster *structure*: the tree is cut at a stopping time ``t_s`` (each subtree
hanging below ``t_s`` is a cluster, :func:`~jaxbnp.models.ddt.cut_tree`) and the data enter
only through a conjugate family's marginal likelihood of that partition::

    log π(T, c, t_s | X) = log p(T | c) + Σ_{clusters C of cut(T, t_s)} log P(X_C) + log p(c) + log p(t_s)

A node ``v`` is a **cluster root** when ``t_v >= t_s > t_p(v)`` (``t_p(root) = −∞``): its
leaves are one cluster. Every node carries the family's sufficient statistics ``S_v`` of the
leaves below it, so the data term is ``Σ_v [v cluster root] log P(S_v)``.

Moves (every one exact):

1. **Subtree moves** (Neal's, as :mod:`jaxbnp.inference.trees.mcmc`): the same proposal
   and structure term; the data term changes only at the cluster roots whose statistics or
   root status the move changes. The statistics change on two root paths (the moved
   subtree's old ancestors lose ``S_s``, its new ones gain it), each of which holds at most
   one cluster root, and the root status only at ``s``, its old sibling ``u``, the edge
   ``u'`` it moves to and the reused node ``w``: at most eight clusters, whose marginals are
   computed before and after (:func:`data_term_change`).
2. **Time moves**: the random walk of :mod:`~jaxbnp.inference.trees.mcmc`; statistics do not
   change, the root status only at the node and its two children.
3. ``c`` by slice sampling (structure term only, as for the Brownian model) and ``t_s`` by
   slice sampling ``log(t_s / (1 − t_s))`` under any prior on ``(0, 1)``: the data term is
   piecewise constant in ``t_s`` (it changes where ``t_s`` crosses a divergence time).

The statistics are recomputed by one upward pass at the start of every sweep (no drift in
float32) and kept up to date by masked adds along the two paths of each subtree move.

Exchange move between chains (the seed's, :func:`exchange`): as
:func:`jaxbnp.inference.trees.population.exchange`, with branches chosen proportional to the
partition likelihood: a leaf re-inserted at a time ``d >= t_s`` on the edge above ``x`` joins
``x``'s cluster (weight ``P(S_C + s_i) / P(S_C)``); at ``d < t_s`` it is a cluster alone
whatever the edge (equal weights).
"""

from __future__ import annotations

from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from ...models.ddt import (
    Tree, bottom_up_order, num_leaves, sample_tree, structure_log_prior,
    structure_log_prior_from, subtree_sizes,
)
from ..base import SamplingAlgorithm, run_chains
from .moves import (
    SLICE_UNIFORMS, DDTInfo, PopulationInfo, exchange_pair, insert_with, pair_exchanges, select_state, slice_log,
    subtree_move, sweep_uniforms, time_proposal, update_c,
)

__all__ = [
    "CutHyperpriors", "CutState", "cluster_roots", "node_stats", "data_term", "data_term_change",
    "log_joint_terms_and_sizes", "init", "step", "algorithm", "candidate_log_weights", "exchange",
    "exchange_step", "population_step",
]

#: the most cluster roots a move can touch (module docstring, item 1)
MAX_TOUCHED = 8


class CutHyperpriors(NamedTuple):
    """Priors of the cut model's hyperparameters; ``None`` = fixed. ``c`` on ``(0, ∞)``,
    ``t_stop`` on ``(0, 1)``."""

    c: Any = None
    t_stop: Any = None


class CutState(NamedTuple):
    """One chain of the cut model.

    log_prior: the structure term ``log p(tree | c)``.
    log_likelihood: the data term ``Σ_C log P(X_C)`` over the clusters of the cut.
    sizes: leaves below each node ``(2n−1,)``.
    """

    tree: Tree
    c: jax.Array
    t_stop: jax.Array
    log_prior: jax.Array
    log_likelihood: jax.Array
    sizes: jax.Array


# ---------------------------------------------------------------------------- data term
def cluster_roots(tree: Tree, t_stop) -> jax.Array:
    """``(2n−1,)`` bool: the nodes ``v`` with ``t_v >= t_s > t_p(v)`` (the root: ``t_v >= t_s``)."""
    p = tree.parent
    tp = jnp.where(p >= 0, tree.time[jnp.maximum(p, 0)], -jnp.inf)
    return (tree.time >= t_stop) & (tp < t_stop)


def node_stats(tree: Tree, point_stats, order=None):
    """The family's sufficient statistics of the leaves below every node (one upward pass)."""
    n = num_leaves(tree)
    order = bottom_up_order(tree) if order is None else order
    full = jax.tree.map(lambda s: jnp.zeros((2 * n - 1,) + s.shape[1:], s.dtype).at[:n].set(s), point_stats)

    def body(j, st):
        v = order[j]
        a, b = tree.children[v - n, 0], tree.children[v - n, 1]
        return jax.tree.map(lambda x: x.at[v].set(x[a] + x[b]), st)

    return lax.fori_loop(0, n - 1, body, full)


def data_term(tree: Tree, t_stop, family, stats) -> jax.Array:
    """``Σ_v [v cluster root] log P(S_v)`` from every node's statistics ``stats``."""
    return jnp.sum(jnp.where(cluster_roots(tree, t_stop), family.log_marginal(stats), 0.0))


def _take(stats, idx):
    return jax.tree.map(lambda x: x[idx], stats)


def data_term_change(family, roots_old, roots_new, stats_old, stats_new, touched) -> jax.Array:
    """The data term's change when the nodes in ``touched`` (a superset of those whose
    statistics or root status changed) go from ``(roots_old, stats_old)`` to
    ``(roots_new, stats_new)``: marginals of at most :data:`MAX_TOUCHED` clusters each way."""
    hit = (roots_old | roots_new) & touched
    idx = jnp.nonzero(hit, size=MAX_TOUCHED, fill_value=0)[0]
    live = jnp.arange(MAX_TOUCHED) < jnp.sum(hit)
    m_new = family.log_marginal(_take(stats_new, idx))
    m_old = family.log_marginal(_take(stats_old, idx))
    diff = jnp.where(roots_new[idx], m_new, 0.0) - jnp.where(roots_old[idx], m_old, 0.0)
    return jnp.sum(jnp.where(live, diff, 0.0))


def log_joint_terms_and_sizes(tree: Tree, point_stats, family, c, t_stop):
    """``(structure term, data term, subtree sizes)`` of a complete tree by one upward pass."""
    order = bottom_up_order(tree)
    sizes = subtree_sizes(tree, order)
    stats = node_stats(tree, point_stats, order)
    return structure_log_prior(tree, c, sizes), data_term(tree, t_stop, family, stats), sizes


def init(tree: Tree, X: Any, family, c: Any, t_stop: Any) -> CutState:
    """State of one chain (computes both terms). ``X``: ``(n, D)``; ``t_stop`` in ``(0, 1)``."""
    dtype = tree.time.dtype
    c, t_stop = jnp.asarray(c, dtype), jnp.asarray(t_stop, dtype)
    lp, ll, sizes = log_joint_terms_and_sizes(tree, family.point_stats(jnp.asarray(X, dtype)), family, c, t_stop)
    return CutState(tree, c, t_stop, lp, ll.astype(dtype), sizes)


# ------------------------------------------------------------------------------- moves
def _accept(state: CutState, stats, surv, proposal: Tree, sizes, new_stats, touched, family,
            log_q_ratio, valid, log_u, moved):
    """Metropolis-Hastings on the cut model (structure term from the sizes and ``surv``, data
    term by :func:`data_term_change`)."""
    new_surv = surv.at[moved].set(jnp.log1p(-proposal.time[moved]))
    lp = structure_log_prior_from(proposal, state.c, sizes, new_surv)
    change = data_term_change(family, cluster_roots(state.tree, state.t_stop),
                              cluster_roots(proposal, state.t_stop), stats, new_stats, touched)
    ll = state.log_likelihood + change.astype(state.log_likelihood.dtype)
    log_r = (lp + ll) - (state.log_prior + state.log_likelihood) + log_q_ratio
    ok = valid & (log_u < log_r)  # NaN -> reject
    new = state._replace(tree=proposal, log_prior=lp, log_likelihood=ll, sizes=sizes)
    return select_state(ok, (new, new_stats, new_surv), (state, stats, surv)), ok


def _moved_stats(stats, mv):
    """Node statistics after subtree move ``mv``: ``s``'s old ancestors lose ``S_s``, its new
    ones gain it, and the reused node ``w`` holds ``S_{u'} + S_s``."""
    def one(x):
        xs = x[mv.s]
        shape = (-1,) + (1,) * (x.ndim - 1)
        rest = x - mv.anc.reshape(shape).astype(x.dtype) * xs
        return (rest + mv.path.reshape(shape).astype(x.dtype) * xs).at[mv.w].set(rest[mv.u_new] + xs)

    return jax.tree.map(one, stats)


def _tree_moves(key, state: CutState, point_stats, family, num_subtree_moves: int, step_size):
    """The subtree moves then one time move per internal node (as
    :func:`jaxbnp.inference.trees.mcmc._tree_moves`, the same random numbers)."""
    n = num_leaves(state.tree)
    k_walk, u_node, steps, log_u = sweep_uniforms(key, n, num_subtree_moves, step_size, state.tree.time.dtype)
    order = bottom_up_order(state.tree)
    stats = node_stats(state.tree, point_stats, order)
    # the data term afresh at every sweep's start (no drift from the masked adds)
    state = state._replace(log_likelihood=data_term(state.tree, state.t_stop, family, stats).astype(
        state.log_likelihood.dtype))
    surv = jnp.log1p(-state.tree.time)
    nodes = jnp.arange(2 * n - 1)

    def subtree_step(i, carry):
        state, stats, surv, acc = carry
        mv = subtree_move(u_node[i], jax.random.fold_in(k_walk, i), state, surv)
        moved = (nodes == mv.s) | (nodes == mv.u) | (nodes == mv.u_new) | (nodes == mv.w)
        touched = mv.anc | mv.path | moved
        (state, stats, surv), ok = _accept(state, stats, surv, mv.tree, mv.sizes, _moved_stats(stats, mv),
                                           touched, family, mv.log_q_ratio, mv.valid, log_u[i], mv.w)
        return state, stats, surv, acc + ok.astype(jnp.int32)

    def time_move(j, carry):
        state, stats, surv, acc = carry
        proposal, log_q, valid = time_proposal(steps[j], state, j)
        v = n + j
        kids = state.tree.children[j]
        touched = (nodes == v) | (nodes == kids[0]) | (nodes == kids[1])
        (state, stats, surv), ok = _accept(state, stats, surv, proposal, state.sizes, stats, touched, family,
                                           log_q, valid, log_u[num_subtree_moves + j], v)
        return state, stats, surv, acc + ok.astype(jnp.int32)

    zero = jnp.zeros((), jnp.int32)
    acc_sub = zero
    if num_subtree_moves > 0:
        state, stats, surv, acc_sub = lax.fori_loop(0, num_subtree_moves, subtree_step, (state, stats, surv, zero))
    state, stats, surv, acc_time = lax.fori_loop(0, n - 1, time_move, (state, stats, surv, zero))
    return state, stats, acc_sub, acc_time


class _OddsPrior:
    """The prior of ``x = t / (1 − t)`` given one of ``t`` on ``(0, 1)`` (for :func:`slice_log`)."""

    def __init__(self, prior):
        self.prior = prior

    def _t(self, x):
        return x / (1.0 + x)

    def support(self, x):
        return (x > 0) & self.prior.support(self._t(x))

    def log_prob(self, x):
        return self.prior.log_prob(self._t(x)) - 2.0 * jnp.log1p(x)


def _update_t_stop(unif, state: CutState, prior, marginals):
    """Slice update of ``log(t_s / (1 − t_s))``; ``marginals``: ``log P(S_v)`` of every node."""
    tree = state.tree

    def term(x):
        roots = cluster_roots(tree, x / (1.0 + x))
        return jnp.sum(jnp.where(roots, marginals, 0.0)).astype(x.dtype)

    x0 = state.t_stop / (1.0 - state.t_stop)
    x, ll = slice_log(unif, _OddsPrior(prior), x0, state.log_likelihood, term)
    t = x / (1.0 + x)
    ok = (t > 0) & (t < 1)  # an odds that rounds onto 0 or 1 keeps the old value
    return state._replace(t_stop=jnp.where(ok, t, state.t_stop), log_likelihood=jnp.where(ok, ll, state.log_likelihood))


def step(
    key: jax.Array,
    state: CutState,
    X: jax.Array,
    family,
    hyperpriors: CutHyperpriors = CutHyperpriors(),
    *,
    num_subtree_moves: int | None = None,
    time_step_size: float = 1.0,
) -> tuple[CutState, DDTInfo]:
    """One sweep of the cut model: subtree moves, a time move per internal node, then ``c`` and
    ``t_stop`` when they have priors (module docstring)."""
    n = num_leaves(state.tree)
    dtype = state.tree.time.dtype
    point_stats = family.point_stats(jnp.asarray(X, dtype))
    num = n if num_subtree_moves is None else int(num_subtree_moves)
    if num < 0:
        raise ValueError(f"num_subtree_moves must be >= 0, got {num_subtree_moves}.")
    k_moves, k_slice = jax.random.split(key)
    slices = jax.random.uniform(k_slice, (2, SLICE_UNIFORMS), dtype)
    state, stats, sub_acc, time_acc = _tree_moves(k_moves, state, point_stats, family, num, time_step_size)
    if hyperpriors.c is not None:
        state = update_c(slices[0], state, hyperpriors.c)
    if hyperpriors.t_stop is not None:
        state = _update_t_stop(slices[1], state, hyperpriors.t_stop, family.log_marginal(stats).astype(dtype))
    info = DDTInfo(sub_acc, jnp.asarray(num, jnp.int32), time_acc, jnp.asarray(n - 1, jnp.int32))
    return state, info


def algorithm(X, family, hyperpriors: CutHyperpriors = CutHyperpriors(), *,
              num_subtree_moves: int | None = None, time_step_size: float = 1.0) -> SamplingAlgorithm:
    """One chain of the cut model in the one shape (:class:`~jaxbnp.inference.base.SamplingAlgorithm`):

    * ``init(key, tree=None, c=1.0, t_stop=0.5) -> CutState``: :func:`init` at the given
      tree, or at a draw from the DDT prior with divergence ``c`` (from ``key``);
    * ``step(key, state) -> (CutState, DDTInfo)``: :func:`step` with these settings."""
    X = jnp.asarray(X)

    def init_fn(key, tree=None, c=1.0, t_stop=0.5):
        if tree is None:
            tree = sample_tree(key, c, X.shape[0], jnp.result_type(X.dtype, float))
        return init(tree, X, family, c, t_stop)

    def step_fn(key, state):
        return step(key, state, X, family, hyperpriors, num_subtree_moves=num_subtree_moves,
                    time_step_size=time_step_size)

    return SamplingAlgorithm(init_fn, step_fn)


# ------------------------------------------------------------------------ exchange move
def candidate_log_weights(tree: Tree, in_tree, point_stats, family, t_stop, leaf, d):
    """Log weight of hanging ``leaf`` at time ``d`` on the edge above each node ``x`` of the
    partial tree (``in_tree``), up to a constant shared by all edges: the change of the
    partition's log likelihood. At ``d >= t_s`` the leaf joins ``x``'s cluster ``C``
    (``log P(S_C + s_i) − log P(S_C)``); at ``d < t_s`` it is a cluster alone (``0``).
    ``(2n−1,)``; garbage where the edge does not span ``d`` (the caller masks those)."""
    n = num_leaves(tree)
    nodes = jnp.arange(2 * n - 1, dtype=jnp.int32)
    p = tree.parent
    tp = jnp.where(p >= 0, tree.time[jnp.maximum(p, 0)], -jnp.inf)
    rep = jnp.where((p < 0) | (tp < t_stop), nodes, p)
    for _ in range(max(1, (2 * n).bit_length())):  # pointer jumping up to the cluster root
        rep = rep[rep]
    keep = in_tree[:n]
    stats = jax.tree.map(
        lambda s: jax.ops.segment_sum(jnp.where(keep.reshape((-1,) + (1,) * (s.ndim - 1)), s, 0),
                                      rep[:n], num_segments=2 * n - 1),
        point_stats,
    )
    s_i = jax.tree.map(lambda s: s[leaf], point_stats)
    joined = jax.tree.map(lambda a, b: a + b, stats, s_i)
    gain = family.log_marginal(joined) - family.log_marginal(stats)
    return jnp.where(d >= t_stop, gain[rep], 0.0)


def exchange(key: jax.Array, pair: CutState, X: jax.Array, family, subset_size: int,
             temperature: Any = 1.0):
    """The seed's exchange move between two chains of the cut model (module docstring): as
    :func:`jaxbnp.inference.trees.population.exchange` with :func:`candidate_log_weights`."""
    X = jnp.asarray(X, pair.tree.time.dtype)
    point_stats = family.point_stats(X[0] if X.ndim == 3 else X)  # the pair's shared data

    def insert(gumbel, det, leaves, times, t_stop, forced, use_forced):
        def score(tree, root, in_tree, leaf, d, order):
            return candidate_log_weights(tree, in_tree, point_stats, family, t_stop, leaf, d)

        return insert_with(score, gumbel, det, leaves, times, forced, use_forced)

    def log_terms(trees):
        return lax.map(lambda a: log_joint_terms_and_sizes(a[0], point_stats, family, a[1], a[2]),
                       (trees, pair.c, pair.t_stop))

    return exchange_pair(key, pair, subset_size, temperature, pair.t_stop, insert, log_terms)


def exchange_step(key: jax.Array, chains: CutState, X: jax.Array, family, subset_size: int,
                  temperature: Any = 1.0, pair_batching: str = "vmap"):
    """Exchange moves on ``K // 2`` disjoint random pairs (as
    :func:`jaxbnp.inference.trees.population.exchange_step`)."""
    if jnp.ndim(X) != 2:
        raise ValueError(f"The cut model's exchange takes the chains' shared data X (n, D), got shape {jnp.shape(X)}.")
    return pair_exchanges(partial(exchange, family=family, subset_size=subset_size, temperature=temperature),
                          key, chains, X, subset_size, pair_batching)


def population_step(key: jax.Array, chains: CutState, X: jax.Array, family, *, subset_size: int,
                    temperature: Any = 1.0, hyperpriors: CutHyperpriors = CutHyperpriors(),
                    num_subtree_moves: int | None = None, time_step_size: float = 1.0,
                    pair_batching: str = "vmap", chain_batching: str = "auto"):
    """One population step of the cut model (as :func:`jaxbnp.inference.trees.population.step`):
    the within-chain sweep on every chain, then :func:`exchange_step`."""
    num = chains.log_prior.shape[0]
    X = jnp.asarray(X, chains.tree.time.dtype)
    k_within, k_ex = jax.random.split(key)
    sweep = partial(step, family=family, hyperpriors=hyperpriors, num_subtree_moves=num_subtree_moves,
                    time_step_size=time_step_size)
    chains, within = run_chains(lambda k, s: sweep(k, s, X), jax.random.split(k_within, num), chains,
                                in_axes=(0, 0), how=chain_batching)
    chains, exchanged = exchange_step(k_ex, chains, X, family, subset_size, temperature, pair_batching)
    return chains, PopulationInfo(within, exchanged.accepted)
