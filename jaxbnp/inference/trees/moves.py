"""The moves that the diffusion-tree samplers share (Neal's Brownian model and the seed's cut
model, docs/mathematics.md §5): the subtree and time proposals, the slice update of ``c``,
and the exchange move's detach / re-insert machinery between pairs of chains.

The model-specific parts (the data term, and the branch weights of the exchange's
re-insertion) are in :mod:`jaxbnp.inference.trees.mcmc` and
:mod:`jaxbnp.inference.trees.population` (Brownian) and :mod:`jaxbnp.inference.trees.cut`.
Functions that tests break on purpose to check the tests' power
(:func:`subtree_log_q_ratio`, :func:`proposal_log_ratio`) are called through this module.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.scipy.special import logsumexp

from ..._ranks import argsort
from ...models.ddt import (
    Tree, ancestor_mask, attach, bottom_up_order, descend, detach, harmonic_numbers, log_attachment_density,
    num_leaves, root_of, structure_log_prior,
)

__all__ = [
    "DDTInfo", "select_state", "subtree_log_q_ratio", "SubtreeMove", "subtree_move", "time_proposal",
    "num_tree_uniforms", "log_prior_positive", "MAX_STEPS_OUT", "MAX_SHRINKS", "SLICE_UNIFORMS",
    "slice_log", "c_statistic", "update_c",
    "ExchangeInfo", "PopulationInfo", "Detached", "detach_leaves", "insert_with", "check_subset_size",
    "proposal_log_ratio", "exchange_pair", "pair_exchanges", "sweep_uniforms",
]


# -------------------------------------------------------------------- within-chain moves
class DDTInfo(NamedTuple):
    """Acceptance counts of one :func:`step`."""

    subtree_accepted: jax.Array
    subtree_proposed: jax.Array
    time_accepted: jax.Array
    time_proposed: jax.Array


def select_state(pred, new, old):
    return jax.tree.map(lambda a, b: jnp.where(pred, a, b), new, old)


def subtree_log_q_ratio(log_q_back, log_q_fwd):
    """``log q(T | T') − log q(T' | T)`` of the subtree move (a function so tests can break it)."""
    return log_q_back - log_q_fwd


class SubtreeMove(NamedTuple):
    """Everything a subtree proposal changed (:func:`subtree_move`): the moved node ``s``, the
    freed node ``w`` (reused as the new divergence node), ``s``'s old sibling ``u``, the edge
    ``u_new`` it now hangs above, the masks of ``s``'s old ancestors ``anc`` (``w`` included)
    and of ``w``'s new ancestors ``path``."""

    tree: Tree
    log_q_ratio: jax.Array
    valid: jax.Array
    sizes: jax.Array
    root: jax.Array
    starts: jax.Array
    s: jax.Array
    w: jax.Array
    u: jax.Array
    u_new: jax.Array
    anc: jax.Array
    path: jax.Array


def subtree_move(u_node: jax.Array, walk, state, log_survival=None) -> SubtreeMove:
    """:func:`subtree_proposal` with the node chosen by the uniform ``u_node`` and the new
    path driven by ``walk`` (uniforms or a key, as :func:`~jaxbnp.models.ddt.descend`),
    then ``(sizes', root', starts)``: the new tree's subtree sizes and root, and the two
    nodes from which :func:`~jaxbnp.models.ddt.refresh_messages` brings the messages up
    to date (the detached node's old sibling's new parent and the new divergence node).
    ``log_survival``: ``log1p(−time)`` per node when the caller keeps it (the proposal
    densities then take no logarithm over the nodes; the same values)."""
    tree, sizes, c = state.tree, state.sizes, state.c
    n = num_leaves(tree)
    root = root_of(tree)
    r = jnp.minimum(jnp.floor(u_node * (2 * n - 2)).astype(jnp.int32), 2 * n - 3)
    s = jnp.where(r < root, r, r + 1)  # uniform over the 2n-2 non-root nodes
    t_old = tree.time[tree.parent[s]]
    anc = ancestor_mask(tree.parent, s)  # includes the parent w that is freed
    rest, root_rest, w, u = detach(tree, root, s)
    sizes_rest = sizes - sizes[s] * anc.astype(jnp.int32)
    anc_u = anc.at[w].set(False)  # u's ancestors in the rest are w's ancestors
    u_new, t_new, path = descend(walk, rest, sizes_rest, root_rest, c)
    log_q_back = log_attachment_density(rest, sizes_rest, root_rest, u, t_old, c, anc_u, log_survival)
    log_q_fwd = log_attachment_density(rest, sizes_rest, root_rest, u_new, t_new, c, path, log_survival)
    new_tree, new_root = attach(rest, root_rest, s, u_new, t_new, w)
    # w and the new ancestors (the path down to u_new) hold s's leaves again
    new_sizes = (sizes_rest + sizes[s] * path.astype(jnp.int32)).at[w].set(sizes_rest[u_new] + sizes[s])
    starts = jnp.stack([new_tree.parent[u], w])
    return SubtreeMove(new_tree, subtree_log_q_ratio(log_q_back, log_q_fwd), t_new < tree.time[s],
                       new_sizes, new_root, starts, s, w, u, u_new, anc, path)


def time_proposal(step: jax.Array, state, j: jax.Array):
    """Random walk of ``logit((t − lo)/(hi − lo))`` by ``step`` for internal node ``n+j``;
    returns ``(tree', log Jacobian ratio, valid)``."""
    tree = state.tree
    n = num_leaves(tree)
    v = n + j
    p = tree.parent[v]
    lo = jnp.where(p >= 0, tree.time[jnp.maximum(p, 0)], 0.0)
    hi = jnp.minimum(tree.time[tree.children[j, 0]], tree.time[tree.children[j, 1]])
    width = hi - lo
    t = tree.time[v]
    z_new = jnp.log(t - lo) - jnp.log(hi - t) + step
    t_new = lo + width * jax.nn.sigmoid(z_new)
    log_jac = (jax.nn.log_sigmoid(z_new) + jax.nn.log_sigmoid(-z_new)) - (
        jnp.log(t - lo) + jnp.log(hi - t) - 2.0 * jnp.log(width)
    )
    new_tree = tree._replace(time=tree.time.at[v].set(t_new))
    return new_tree, log_jac, (t_new > lo) & (t_new < hi)


def num_tree_uniforms(n: int, num_subtree_moves: int) -> int:
    """Uniforms of :func:`_tree_moves` besides the walks': a node and an acceptance test per
    subtree move, an increment and an acceptance test per time move."""
    return 2 * num_subtree_moves + 2 * (n - 1)


def sweep_uniforms(key, n: int, num_subtree_moves: int, step_size, dtype):
    """A within-chain sweep's random numbers (one uniform call): ``(walk key, the subtree
    moves' node uniforms, the time moves' logistic increments, the acceptance tests' log
    uniforms)`` (``num_subtree_moves`` subtree tests first, then ``n − 1`` time tests)."""
    k_walk, k_unif = jax.random.split(key)
    unif = jax.random.uniform(k_unif, (num_tree_uniforms(n, num_subtree_moves),), dtype)
    u_node = unif[:num_subtree_moves]
    u_time = unif[num_subtree_moves: num_subtree_moves + n - 1]
    steps = step_size * (jnp.log(u_time) - jnp.log1p(-u_time))
    log_u = jnp.log(unif[num_subtree_moves + n - 1:])
    return k_walk, u_node, steps, log_u


def log_prior_positive(prior, x):
    return jnp.where(prior.support(x), prior.log_prob(x), -jnp.inf)


MAX_STEPS_OUT = 16


MAX_SHRINKS = 64


SLICE_UNIFORMS = 3 + MAX_SHRINKS


def slice_log(unif, prior, x0, term0, log_term, width=1.0):
    """Slice update of ``y = log x`` targeting ``p(x) exp(log_term(x)) x`` (Neal 2003, Fig. 3
    stepping out with a random split of ``MAX_STEPS_OUT``, then shrinkage).

    Written as one ``while_loop`` with a single call of ``log_term`` per
    iteration (stepping out left, then right, then shrinking), so the compiled
    program holds one copy of the density (the data term is a loop itself).
    ``unif``: ``3 + MAX_SHRINKS`` uniforms. ``term0 = log_term(x0)`` is known
    from the cached state; returns ``(x, log_term(x))``. If shrinkage has not
    accepted after ``MAX_SHRINKS`` tries the chain stays at ``x0`` (never
    seen: it needs a degenerate density).
    """
    dtype = x0.dtype
    y0 = jnp.log(x0)
    log_level = log_prior_positive(prior, x0) + y0 + term0 + jnp.log(unif[0])
    left = y0 - width * unif[1]
    j = jnp.floor(MAX_STEPS_OUT * unif[2]).astype(jnp.int32)
    shrink_unif = unif[3:]

    def density(y):
        x = jnp.exp(y)
        term = log_term(x)
        return log_prior_positive(prior, x) + y + term, term

    def cond(c):
        return (~c[6]) & (c[7] < MAX_SHRINKS)

    def body(c):
        phase, left, right, j, k, y, done, i, term = c
        phase = jnp.where((phase == 0) & (j <= 0), 1, phase)
        phase = jnp.where((phase == 1) & (k <= 0), 2, phase)
        cand = left + (right - left) * shrink_unif[jnp.minimum(i, MAX_SHRINKS - 1)]
        point = jnp.where(phase == 0, left, jnp.where(phase == 1, right, cand))
        f, t = density(point)
        above = f > log_level
        out_left = (phase == 0) & above
        out_right = (phase == 1) & above
        shrinking = phase == 2
        accept = shrinking & above
        left = jnp.where(out_left, left - width, jnp.where(shrinking & ~above & (cand < y0), cand, left))
        right = jnp.where(out_right, right + width, jnp.where(shrinking & ~above & (cand >= y0), cand, right))
        j = jnp.where(out_left, j - 1, j)
        k = jnp.where(out_right, k - 1, k)
        phase = jnp.where((phase == 0) & ~above, 1, jnp.where((phase == 1) & ~above, 2, phase))
        return (phase, left, right, j, k, jnp.where(accept, cand, y), accept,
                i + shrinking.astype(jnp.int32), jnp.where(accept, t, term))

    init_c = (jnp.int32(0), left, left + width, j, MAX_STEPS_OUT - 1 - j, y0, jnp.array(False),
              jnp.int32(0), jnp.asarray(term0, dtype))
    _, _, _, _, _, y, _, _, term = lax.while_loop(cond, body, init_c)
    return jnp.exp(y).astype(dtype), term


def c_statistic(tree: Tree, sizes: jax.Array) -> jax.Array:
    """``S = Σ_v (ℓ(t_v) − ℓ(t_p(v))) H_{m_v−1}``, ``ℓ(t) = −log(1−t)``: the structure
    term is ``(n−1) log c − c S + const``."""
    n = num_leaves(tree)
    t = tree.time[n:]
    p = tree.parent[n:]
    tp = jnp.where(p >= 0, tree.time[jnp.maximum(p, 0)], 0.0)
    harm = harmonic_numbers(n, t.dtype)[jnp.clip(sizes[n:] - 1, 0, n - 1)]
    return jnp.sum((jnp.log1p(-tp) - jnp.log1p(-t)) * harm)


def update_c(unif, state, prior):
    tree, sizes = state.tree, state.sizes
    n = num_leaves(tree)
    stat = c_statistic(tree, sizes)
    rel = lambda v: (n - 1) * jnp.log(v) - v * stat  # noqa: E731
    c, _ = slice_log(unif, prior, state.c, rel(state.c), rel)
    return state._replace(c=c, log_prior=structure_log_prior(tree, c, sizes))


# ------------------------------------------------------------------------ exchange move
class ExchangeInfo(NamedTuple):
    """Exchange outcomes: whether accepted and the log acceptance ratio (per pair from
    :func:`exchange`, per chain from :func:`exchange_step`)."""

    accepted: jax.Array
    log_ratio: jax.Array


class PopulationInfo(NamedTuple):
    """One population step: per-chain within-chain counts and exchange outcomes ``(K,)``."""

    within: DDTInfo
    exchange_accepted: jax.Array


class Detached(NamedTuple):
    """A tree with some leaves detached (:func:`detach_leaves`)."""

    tree: Tree
    root: jax.Array
    in_tree: jax.Array  # (2n-1,) nodes in the partial tree
    times: jax.Array  # (k,) divergence times d_j, in generation order
    freed: jax.Array  # (k,) node freed when leaf j was detached
    siblings: jax.Array  # (k,) the branch (edge above this node) leaf j hung from


def detach_leaves(tree: Tree, leaves: jax.Array) -> Detached:
    """Detach ``leaves[k−1], …, leaves[0]`` (reverse generation order); step 2."""
    n = num_leaves(tree)
    k = leaves.shape[0]
    dtype = tree.time.dtype

    def body(j, carry):
        tree, root, in_tree, times, freed, sibs = carry
        idx = k - 1 - j
        i = leaves[idx]
        t = tree.time[tree.parent[i]]
        tree, root, w, u = detach(tree, root, i)
        in_tree = in_tree.at[i].set(False).at[w].set(False)
        return tree, root, in_tree, times.at[idx].set(t), freed.at[idx].set(w), sibs.at[idx].set(u)

    init = (
        tree, root_of(tree), jnp.ones(2 * n - 1, bool), jnp.zeros(k, dtype),
        jnp.zeros(k, jnp.int32), jnp.zeros(k, jnp.int32),
    )
    return Detached(*lax.fori_loop(0, k, body, init))


def insert_with(score, gumbel, det: Detached, leaves, times, forced, use_forced):
    """:func:`insert_leaves` with the branches' log weights from
    ``score(tree, root, in_tree, leaf, d, order)`` (``(2n−1,)``, any constant shared by the
    edges; edges that do not span ``d`` are masked here)."""
    tree, root, in_tree = det.tree, det.root, det.in_tree
    k = leaves.shape[0]
    dtype = tree.time.dtype
    # one order for every insertion: by the times the nodes have once all leaves are back, a
    # valid children-first order of each partial tree on the way (sorting costs as much as a
    # message pass on XLA:CPU)
    order = bottom_up_order(tree._replace(time=tree.time.at[det.freed].set(times)))

    def body(j, carry):
        tree, root, in_tree, log_q = carry
        i, d, w = leaves[j], times[j], det.freed[j]
        p = tree.parent
        tp = jnp.where(p >= 0, tree.time[jnp.maximum(p, 0)], 0.0)
        valid = in_tree & (tp < d) & (d < tree.time)
        cand = score(tree, root, in_tree, i, d, order)
        log_w = jnp.where(valid, cand, -jnp.inf)
        total = logsumexp(log_w)
        ok = jnp.isfinite(total)
        x = jnp.where(use_forced, forced[j], jnp.argmax(log_w + gumbel[j]).astype(jnp.int32))
        log_q = log_q + jnp.where(ok, log_w[x] - total, -jnp.inf)
        tree, root = attach(tree, root, i, x, d, w)
        in_tree = in_tree.at[i].set(True).at[w].set(True)
        return tree, root, in_tree, log_q

    tree, _, _, log_q = lax.fori_loop(0, k, body, (tree, root, in_tree, jnp.zeros((), dtype)))
    return tree, log_q


def check_subset_size(subset_size: Any, n: int) -> int:
    if isinstance(subset_size, bool) or not isinstance(subset_size, (int, np.integer)) or not 1 <= subset_size <= n - 1:
        raise ValueError(
            f"subset_size must be an integer between 1 and n - 1 = {n - 1} (at least one leaf stays), "
            f"got {subset_size!r}."
        )
    return int(subset_size)


def proposal_log_ratio(log_q_back, log_q_fwd, temperature):
    """``(log Q(T1,T2 | T1',T2') − log Q(T1',T2' | T1,T2)) / τ`` (a function so tests can break it)."""
    return (log_q_back - log_q_fwd) / temperature


def exchange_pair(key, pair, subset_size: int, temperature, per_chain, insert, log_terms):
    """The exchange move between two chains (docs/mathematics.md §5), whatever the model:

    ``pair``: the two chains' states on a leading axis of size 2 (fields ``tree``,
    ``log_prior``, ``log_likelihood``, ``sizes``); ``per_chain``: a pytree of each chain's
    model quantities (leading axis 2), handed to ``insert`` for the chain whose tree a row
    rebuilds; ``insert(gumbel, det, leaves, times, chain, forced, use_forced) -> (tree, log Q)``
    re-attaches the leaves (:func:`insert_with` with the model's branch weights);
    ``log_terms(trees) -> (structure terms, data terms, sizes)`` scores the two new trees.
    The two detachments, the four re-attachments (two proposals, two reverse replays) and the
    two evaluations each run as one batched loop, so the program holds one copy of each.
    """
    n = num_leaves(pair.tree)
    k = check_subset_size(subset_size, n)
    dtype = pair.tree.time.dtype
    # one random call: the leaves' order, Gumbel noise for the 4 insertions, the acceptance
    unif = jax.random.uniform(key, (n + 4 * k * (2 * n - 1) + 1,), dtype, minval=jnp.finfo(dtype).tiny)
    leaves = argsort(unif[:n])[:k]
    gumbel = -jnp.log(-jnp.log(unif[n:-1])).reshape(4, k, 2 * n - 1)
    dets = jax.vmap(detach_leaves, in_axes=(0, None))(pair.tree, leaves)
    # rows: proposal for chain 1 (chain 2's times), for chain 2, replay of chain 1, of chain 2
    mine = jnp.array([0, 1, 0, 1])
    times_from = jnp.array([1, 0, 0, 1])
    tasks = (gumbel, jax.tree.map(lambda a: a[mine], dets), dets.times[times_from],
             jax.tree.map(lambda a: a[mine], per_chain), dets.siblings[mine], jnp.array([False, False, True, True]))
    # lax.map, not vmap: one unbatched copy of the insertion loop compiles much faster
    trees4, log_q4 = lax.map(lambda a: insert(a[0], a[1], leaves, *a[2:]), tasks)
    new_trees = jax.tree.map(lambda a: a[:2], trees4)
    lp, ll, sizes = log_terms(new_trees)
    ll = ll.astype(pair.log_likelihood.dtype)
    log_target = jnp.sum(lp + ll) - jnp.sum(pair.log_prior + pair.log_likelihood)
    log_r = log_target + proposal_log_ratio(
        log_q4[2] + log_q4[3], log_q4[0] + log_q4[1], jnp.asarray(temperature, log_target.dtype)
    )
    ok = jnp.log(unif[-1]) < log_r
    new = pair._replace(tree=new_trees, log_prior=lp, log_likelihood=ll, sizes=sizes)
    return select_state(ok, new, pair), ExchangeInfo(ok, log_r)


def pair_exchanges(move, key, chains, X, subset_size: int, pair_batching: str = "vmap"):
    """:func:`exchange_step` with the pair move ``move(key, pair, X_pair)`` (any chain state
    with ``tree`` and ``log_prior`` fields)."""
    num = chains.log_prior.shape[0]
    subset_size = check_subset_size(subset_size, num_leaves(chains.tree))
    pairs = num // 2
    dtype = chains.log_prior.dtype
    if pairs == 0:
        return chains, ExchangeInfo(jnp.zeros(num, bool), jnp.full(num, -jnp.inf, dtype))
    k_pair, k_ex = jax.random.split(key)
    perm = argsort(jax.random.uniform(k_pair, (num,)))
    a, b = perm[:pairs], perm[pairs:2 * pairs]
    pair_states = jax.tree.map(lambda x: jnp.stack([x[a], x[b]], 1), chains)  # (pairs, 2, ...)
    per_chain = X.ndim == 3
    X_pairs = jnp.stack([X[a], X[b]], 1) if per_chain else jnp.stack([X, X])
    axis = 0 if per_chain else None
    keys = jax.random.split(k_ex, pairs)
    if pair_batching not in ("vmap", "map"):
        raise ValueError(f"pair_batching must be 'vmap' or 'map', got {pair_batching!r}.")

    if pair_batching == "vmap":
        new, info = jax.vmap(move, in_axes=(0, 0, axis))(keys, pair_states, X_pairs)
    elif per_chain:
        new, info = lax.map(lambda q: move(*q), (keys, pair_states, X_pairs))
    else:
        new, info = lax.map(lambda q: move(q[0], q[1], X_pairs), (keys, pair_states))
    chains = jax.tree.map(lambda full, u: full.at[a].set(u[:, 0]).at[b].set(u[:, 1]), chains, new)
    accepted = jnp.zeros(num, bool).at[a].set(info.accepted).at[b].set(info.accepted)
    log_ratio = jnp.full(num, -jnp.inf, info.log_ratio.dtype).at[a].set(info.log_ratio).at[b].set(info.log_ratio)
    return chains, ExchangeInfo(accepted, log_ratio)
