"""tgMCMC's global moves compiled in JAX: IBHC trees as fixed-size arrays (docs/mathematics.md §4).

The same exact chain as :class:`~jaxbnp.inference.tgmcmc.host.TreeGuidedHost`
(its module docstring: canonical trees, the total probability of a split
summed over every cut node that yields it, early rejection), with the trees
held in arrays instead of host ``Node`` objects, so that a whole iteration's
``num_global_moves`` moves run in one compiled program, vmapped over chains,
with no host callback.

Arrays
------
One node pool per chain of ``2n`` nodes: node ``i < n`` is the leaf of point
``i``; node ``n + i`` is the internal node that SeqInsert creates when point
``i`` is inserted into its cluster's canonical tree (the tree of a cluster is
SeqInsert of its points in increasing index order, so every point but the
first of its cluster creates exactly one node). The trees of all clusters
therefore share one pool without any allocation, and a cluster's tree can be
rebuilt in place without touching the others. Fields per node: ``left``,
``right``, ``parent`` (``-1``: none), packed statistics, ``size``,
``log_lik = log P(X_c)``, ``log_h = log κ(|c|, u) + log P(X_c)``, ``log_t``.

Between iterations the kernel keeps the forest in its state (:class:`Forest`,
:func:`global_moves_forest`): only the trees of clusters whose points changed
are rebuilt, all of them when ``u`` or a hyperparameter changed. The loops
hold no ``scatter`` or ``sort``, so that under :func:`jaxbnp.set_cpu_loop_kernels`
XLA:CPU compiles each of them as one kernel, and their writes are arranged so that
XLA updates the node arrays in place rather than copying them each step (a write
must not read the array it writes, and must depend on any loop that reads that
array: :func:`seq_insert`, :func:`_inherit_parts`).

Differences from the host version (both exact)
-----------------------------------------------
* The tree shapes are built under the current measure, family and ``u``
  (the host builds shapes under the chain's first parameters and caches them);
  within one global move both directions use the same trees, which is all the
  Metropolis-Hastings ratio needs.
* A split that would make more than ``max_parts`` clusters proposes nothing
  (the chain stays), and so a merge of more than ``max_parts`` clusters has
  ``q(Π|Π*) = 0`` and is rejected: the same restriction in both directions
  keeps detailed balance. ``max_parts = 16`` by default; the number of parts
  a split produces is reported.
* The random draws differ (JAX keys instead of NumPy generators).
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from ..partition.moves import MHInfo

__all__ = [
    "Pool",
    "TreeContext",
    "Unpack",
    "GlobalMovesInfo",
    "preorder",
    "draw_index",
    "cluster_arrays",
    "log_d_row",
    "log_select_alone",
    "empty_pool",
    "make_context",
    "build_forest",
    "build_tree",
    "split_log_prob",
    "merge_log_q",
    "global_moves",
    "global_moves_forest",
    "Forest",
    "empty_forest",
    "refresh_forest",
]


class Pool(NamedTuple):
    """Node arrays of the canonical trees of one chain (module docstring)."""

    left: jax.Array
    right: jax.Array
    parent: jax.Array
    stats: jax.Array
    size: jax.Array
    log_lik: jax.Array
    log_h: jax.Array
    log_t: jax.Array


class TreeContext(NamedTuple):
    """What the tree operations need besides the pool: per-point packed statistics,
    ``log κ(m, u)`` for ``m = 0..n+1`` and the batched ``log P`` of packed rows."""

    points: jax.Array  # (n, P)
    log_kappa: jax.Array  # (n + 2,)
    lik: Callable  # packed (B, P) -> (B,)


class Unpack(NamedTuple):
    """Static description of packed statistics: ``(B, P)`` rows back to the family's pytree
    (the layout of both the device trees and the host trees of :mod:`.ibhc`)."""

    treedef: Any
    shapes: tuple

    def __call__(self, packed):
        out, start = [], 0
        for shape in self.shapes:
            size = math.prod(shape)
            out.append(packed[..., start:start + size].reshape(packed.shape[:-1] + shape))
            start += size
        return self.treedef.unflatten(out)


def _flat_stats(family, X):
    """Per-point statistics as one ``(n, P)`` array and the :class:`Unpack` back to the pytree."""
    leaves, treedef = jax.tree.flatten(family.point_stats(X))
    n = X.shape[0]
    packed = jnp.concatenate([x.reshape(n, -1) for x in leaves], axis=1)
    return packed, Unpack(treedef, tuple(x.shape[1:] for x in leaves))


def make_context(X, measure, family, u) -> TreeContext:
    """The :class:`TreeContext` of data ``X`` under ``measure``, ``family`` and ``u`` (traceable)."""
    packed, unpack = _flat_stats(family, X)
    n = X.shape[0]
    sizes = jnp.arange(n + 2, dtype=X.dtype).at[0].set(1.0)
    u_value = jnp.asarray(0.0 if u is None else u, X.dtype)
    log_kappa = jnp.asarray(measure.log_kappa(sizes, u_value), X.dtype)

    # the count-only terms from a table where the family offers one (NormalWishart)
    tabulated = getattr(family, "tabulated_log_marginal", None)
    marginal = family.log_marginal if tabulated is None else tabulated(n + 1)

    def lik(rows):
        return marginal(unpack(rows)).astype(X.dtype)

    return TreeContext(packed, log_kappa, lik)


def empty_pool(ctx: TreeContext) -> Pool:
    """All points as separate leaves; internal slots unused."""
    points = ctx.points
    n = points.shape[0]
    leaf_lik = ctx.lik(points)
    leaf_h = ctx.log_kappa[1] + leaf_lik
    zeros = jnp.zeros(n, points.dtype)
    minus = -jnp.ones(2 * n, jnp.int32)
    return Pool(
        left=minus, right=minus, parent=minus,
        stats=jnp.concatenate([points, jnp.zeros_like(points)]),
        size=jnp.concatenate([jnp.ones(n, jnp.int32), jnp.zeros(n, jnp.int32)]),
        log_lik=jnp.concatenate([leaf_lik, zeros]),
        log_h=jnp.concatenate([leaf_h, zeros]),
        log_t=jnp.concatenate([leaf_h, zeros]),
    )


def _nonzero(mask, size: int):
    """``jnp.nonzero(mask, size=size, fill_value=0)[0]`` without a scatter.

    The moves contain no ``scatter`` or ``sort``, so that XLA:CPU's small
    while-loop pass can compile their loops as single kernels (README, "Faster
    loops on CPU"): ``jnp.nonzero`` ends in a scatter, a binary search does not.
    """
    c = jnp.cumsum(mask.astype(jnp.int32))
    idx = jnp.searchsorted(c, jnp.arange(1, size + 1, dtype=jnp.int32), side="left", method="scan")
    return jnp.where(idx < mask.shape[0], idx, 0).astype(jnp.int32)


# ----------------------------------------------------------------------------- SeqInsert
def _union_h1(ctx, pool, a, s):
    """``(log P, log φ(h))`` of ``a ∪ s`` for one node ``a`` (scalar indexing)."""
    lik = ctx.lik((pool.stats[a] + pool.stats[s])[None])[0]
    return lik, ctx.log_kappa[pool.size[a] + pool.size[s]] + lik


def seq_insert(ctx: TreeContext, pool: Pool, root, s, top_lik, top_h, slot, do=True):
    """SeqInsert(root, s) (``ibhc.seq_insert``: the same comparisons and ties) creating node ``slot``.

    ``root`` is the root of a tree and ``s`` that of another (or a leaf); ``top_lik``,
    ``top_h``: the potentials of ``root ∪ s``. Returns ``(pool, new_root)``.
    ``do = False`` (traced) inserts nothing and returns ``(pool, s)``; it writes only
    into node ``slot``'s own fields, which must then be unused (no node points to it).

    Written so that XLA:CPU updates the pool in place: the writes never read the
    arrays they write (the parent of the node ``s`` goes on top of, and which child
    it is, come from the descent), and each depends on the descent's result, so it
    is ordered after the loop that reads the arrays. Otherwise XLA copies the pool's
    arrays on every insertion (most of an insertion's time).
    """
    n = ctx.points.shape[0]
    dtype = pool.log_t.dtype
    root, s = jnp.asarray(root, jnp.int32), jnp.asarray(s, jnp.int32)
    do = jnp.asarray(do, bool)
    s_t = pool.log_t[s]
    s_stats, s_size = pool.stats[s], pool.size[s]
    p_root = pool.parent[root]
    root_is_left = pool.left[jnp.maximum(p_root, 0)] == root

    def cond(c):
        node, done = c[0], c[-1]
        return (~done) & (pool.left[node] >= 0)

    def body(c):
        node, cur_lik, cur_h, depth, path, path_lik, path_h, up, is_left, _ = c
        l, r = pool.left[node], pool.right[node]
        # scalar indexing: a gather with an index vector is several times slower on CPU
        liks = ctx.lik(jnp.stack([pool.stats[l] + s_stats, pool.stats[r] + s_stats]))
        hs = jnp.stack([ctx.log_kappa[pool.size[l] + s_size], ctx.log_kappa[pool.size[r] + s_size]]) + liks
        d_lr = pool.log_t[l] + pool.log_t[r] - pool.log_h[node]
        d_ls = pool.log_t[l] + s_t - hs[0]
        d_rs = pool.log_t[r] + s_t - hs[1]
        stop = d_lr <= jnp.minimum(d_ls, d_rs)  # case 1: s goes on top of node
        go_left = d_ls <= d_rs
        slot_d = jnp.where(stop, n, depth)  # index n: a dummy slot past the path
        path = path.at[slot_d].set(node)
        path_lik = path_lik.at[slot_d].set(cur_lik)
        path_h = path_h.at[slot_d].set(cur_h)
        return (
            jnp.where(stop, node, jnp.where(go_left, l, r)),
            jnp.where(stop, cur_lik, jnp.where(go_left, liks[0], liks[1])),
            jnp.where(stop, cur_h, jnp.where(go_left, hs[0], hs[1])),
            jnp.where(stop, depth, depth + 1),
            path, path_lik, path_h,
            jnp.where(stop, up, node),  # the parent of the next node
            jnp.where(stop, is_left, go_left),  # whether the next node is its left child
            stop,
        )

    init = (root, top_lik, top_h, jnp.int32(0), jnp.zeros(n + 1, jnp.int32),
            jnp.zeros(n + 1, dtype), jnp.zeros(n + 1, dtype), p_root, root_is_left, ~do)
    node, cur_lik, cur_h, depth, path, path_lik, path_h, p, is_left, _ = lax.while_loop(cond, body, init)
    depth = jnp.where(do, depth, 0)
    j = jnp.asarray(slot, jnp.int32)
    # with do = False every write below goes to slot j
    hook = do & (p >= 0)
    left = pool.left.at[jnp.where(hook & is_left, p, j)].set(j).at[j].set(node)
    right = pool.right.at[jnp.where(hook & ~is_left, p, j)].set(j).at[j].set(s)
    parent = pool.parent.at[j].set(p).at[jnp.where(do, node, j)].set(j).at[jnp.where(do, s, j)].set(j)
    stats = pool.stats.at[j].set(pool.stats[node] + s_stats)
    size = pool.size.at[j].set(pool.size[node] + s_size)
    log_lik = pool.log_lik.at[j].set(cur_lik)
    log_h = pool.log_h.at[j].set(cur_h)
    log_t = pool.log_t.at[j].set(jnp.logaddexp(cur_h, pool.log_t[node] + s_t))

    def update(i, c):
        stats, size, log_lik, log_h, log_t = c
        k = depth - 1 - i
        v = path[k]
        stats = stats.at[v].add(s_stats)
        size = size.at[v].add(s_size)
        log_lik = log_lik.at[v].set(path_lik[k])
        log_h = log_h.at[v].set(path_h[k])
        log_t = log_t.at[v].set(jnp.logaddexp(path_h[k], log_t[left[v]] + log_t[right[v]]))
        return stats, size, log_lik, log_h, log_t

    stats, size, log_lik, log_h, log_t = lax.fori_loop(0, depth, update, (stats, size, log_lik, log_h, log_t))
    new_root = jnp.where(do, jnp.where(depth > 0, path[0], j), s)
    return Pool(left, right, parent, stats, size, log_lik, log_h, log_t), new_root


# ----------------------------------------------------------------------------- canonical trees
def build_tree(ctx: TreeContext, pool: Pool, members):
    """The canonical tree of the points ``members`` (bool ``(n,)``), built in place in ``pool``.

    SeqInsert of the members in increasing index order; point ``i`` creates node
    ``n + i``. Returns ``(pool, root)`` (``root = -1`` for an empty set).
    """
    n = ctx.points.shape[0]
    count = jnp.sum(members).astype(jnp.int32)
    order = _nonzero(members, n)
    parent = jnp.where(jnp.concatenate([members, jnp.zeros(n, bool)]), -1, pool.parent)
    pool = pool._replace(parent=parent)

    def insert(k, carry):
        pool, root = carry
        i = order[k]
        top_lik, top_h = _union_h1(ctx, pool, root, i)
        return seq_insert(ctx, pool, root, i, top_lik, top_h, n + i)

    pool, root = lax.fori_loop(1, count, insert, (pool, order[0]))
    return pool, jnp.where(count > 0, root, -1)


def _rebuild_slots(ctx: TreeContext, pool: Pool, roots, labels, which):
    """Rebuild in ``pool`` the canonical trees of the slots ``k`` with ``which[k]`` (the
    clusters ``labels == k``; root ``-1`` if empty); the other slots' trees are kept."""

    def body(k, carry):
        def rebuild(carry):
            pool, roots = carry
            pool, root = build_tree(ctx, pool, labels == k)
            return pool, roots.at[k].set(root)

        return lax.cond(which[k], rebuild, lambda c: c, carry)

    return lax.fori_loop(0, which.shape[0], body, (pool, roots))


def build_forest(ctx: TreeContext, labels, capacity: int):
    """Canonical trees of every cluster of slot labels ``labels``: ``(pool, roots)``,
    ``roots[k]`` the root of slot ``k`` (``-1``: empty). ``n`` insertions in all."""
    occupied = jnp.any(labels[:, None] == jnp.arange(capacity), axis=0)
    return _rebuild_slots(ctx, empty_pool(ctx), -jnp.ones(capacity, jnp.int32), labels, occupied)


def preorder(pool: Pool, root):
    """Nodes of the tree at ``root`` in pre-order (parents first, left before right):
    ``(order, count, log_d)``, with ``log_d`` the ``log d`` of each internal node of
    ``order`` (``-inf`` for leaves and padding), SampleSub's weights.

    Stackless: from a leaf it climbs to the first ancestor it reached from the
    left and goes right. The loop writes only its outputs, so XLA:CPU runs it
    without copying anything (a stack array was copied twice a node).
    """
    num = pool.parent.shape[0]
    dtype = pool.log_t.dtype

    def cond(c):
        return c[2] >= 0

    def body(c):
        order, log_d, v, count = c
        l, r = pool.left[v], pool.right[v]
        internal = l >= 0
        order = order.at[count].set(v)
        d = pool.log_t[jnp.maximum(l, 0)] + pool.log_t[jnp.maximum(r, 0)] - pool.log_h[v]
        log_d = log_d.at[count].set(jnp.where(internal, d, -jnp.inf))

        def up_cond(u):
            return (~internal) & (u != root) & (pool.right[pool.parent[u]] == u)

        u = lax.while_loop(up_cond, lambda u: pool.parent[u], v)
        after_leaf = jnp.where(u == root, -1, pool.right[jnp.maximum(pool.parent[u], 0)])
        return order, log_d, jnp.where(internal, l, after_leaf), count + 1

    init = (jnp.zeros(num, jnp.int32), jnp.full(num, -jnp.inf, dtype), jnp.asarray(root, jnp.int32),
            jnp.int32(0))
    order, log_d, _, count = lax.while_loop(cond, body, init)
    return order, count, log_d


def _sample_sub_log_probs(log_d):
    """SampleSub over the internal nodes of a tree (``proposals.sample_sub(internal_only=True)``):
    ``log`` probability per entry of ``preorder``'s order, from its ``log_d``
    (``-inf`` for leaves and padding)."""
    valid = log_d > -jnp.inf
    log_eps = jnp.max(log_d)
    log_w = jnp.where(valid, jnp.logaddexp(log_d, log_eps), -jnp.inf)
    return log_w - jax.nn.logsumexp(log_w)


def draw_index(key, log_p):
    """An index drawn with probabilities ``exp(log_p)`` (``-inf``: never) by inverting
    their cumulative sum at one uniform, as ``jax.random.choice`` does. For long
    arrays it is much cheaper than ``jax.random.categorical``, which draws a Gumbel
    variate per entry (0.13 ms for SampleSub's ``2n`` entries on toy)."""
    cdf = jnp.cumsum(jnp.exp(log_p))
    u = jax.random.uniform(key, dtype=cdf.dtype) * cdf[-1]
    j = jnp.sum(cdf <= u).astype(jnp.int32)  # the first entry with cdf > u: p > 0 there
    last = log_p.shape[0] - 1 - jnp.argmax(jnp.flip(log_p > -jnp.inf)).astype(jnp.int32)
    return jnp.minimum(j, last)  # u rounded up to the total


def _inherit_parts(pool: Pool, order, count, part_of_node):
    """``part_of_node`` (``-1``: unset) passed down the tree in ``order`` (pre-order,
    ``order[0]`` its root) to every node below a node that has a part."""

    def body(i, part):
        # each node takes its parent's part (one write per step: XLA:CPU then writes
        # in place; two writes per step made it copy the array)
        v = order[i]
        return part.at[v].set(jnp.where(part[v] < 0, part[pool.parent[v]], part[v]))

    return lax.fori_loop(1, count, body, part_of_node)


# ----------------------------------------------------------------------------- cut + StocInsert
def _cut_and_insert(ctx, pool, v, key, part_of_node, max_parts: int):
    """Cut the tree at internal node ``v`` and StocInsert the cut-off subtrees, nearest first.

    ``part_of_node``: ``None`` draws every choice (the proposal); otherwise an
    ``(2n,)`` array giving each subtree's part, and the choices are forced (a
    subtree joins the tree of its part or starts it). Node slots of the destroyed
    nodes (``v`` and its ancestors) are reused for the insertions.
    Returns ``(pool, S, num_parts, log_prob, overflow, part_of_root)``; ``S``
    ``(max_parts,)`` roots; ``part_of_root`` ``(2n,)``: the part (index into ``S``) of
    each subtree the cut made (``-1`` elsewhere; :func:`_inherit_parts` passes it down).
    """
    n = ctx.points.shape[0]
    dtype = pool.log_t.dtype

    # walk up: Q (siblings, nearest first) and the destroyed nodes
    def up_cond(c):
        return pool.parent[c[0]] >= 0

    def up_body(c):
        child, Q, destroyed, nq, parent = c
        p = pool.parent[child]
        sib = jnp.where(pool.left[p] == child, pool.right[p], pool.left[p])
        return p, Q.at[nq].set(sib), destroyed.at[nq + 1].set(p), nq + 1, parent.at[sib].set(-1)

    Q0 = jnp.zeros(n, jnp.int32)
    _, Q, destroyed, nq, parent = lax.while_loop(
        up_cond, up_body, (v, Q0, jnp.zeros(n + 1, jnp.int32).at[0].set(v), jnp.int32(0), pool.parent)
    )
    l, r = pool.left[v], pool.right[v]
    pool = pool._replace(parent=parent.at[l].set(-1).at[r].set(-1))
    S = jnp.zeros(max_parts, jnp.int32).at[0].set(l).at[1].set(r)
    if part_of_node is None:
        S_part = jnp.zeros(max_parts, jnp.int32)
    else:
        S_part = jnp.full(max_parts, -2, jnp.int32).at[0].set(part_of_node[l]).at[1].set(part_of_node[r])

    # statistics, sizes and log_t of the trees of S, kept beside S (no gathers in the loop)
    S_stats = jnp.zeros((max_parts,) + pool.stats.shape[1:], dtype).at[0].set(pool.stats[l]).at[1].set(
        pool.stats[r])
    S_size = jnp.zeros(max_parts, jnp.int32).at[0].set(pool.size[l]).at[1].set(pool.size[r])
    S_t = jnp.zeros(max_parts, dtype).at[0].set(pool.log_t[l]).at[1].set(pool.log_t[r])

    def insert(k, c):
        pool, S, S_part, S_stats, S_size, S_t, num, log_p, overflow, key, part_of_root = c
        q = Q[k]
        in_s = jnp.arange(max_parts) < num

        def weights(pool):
            """Potentials of ``q`` joined to each tree of ``S``, and StocInsert's ``log`` weights."""
            liks = ctx.lik(S_stats + pool.stats[q])
            hs = ctx.log_kappa[jnp.minimum(S_size + pool.size[q], ctx.log_kappa.shape[0] - 1)] + liks
            log_d = pool.log_t[q] + S_t - hs
            log_w = jnp.concatenate([jnp.where(in_s, -log_d, -jnp.inf), jnp.zeros(1, dtype)])
            return liks, hs, log_w - jax.nn.logsumexp(log_w)

        liks, hs, log_w = weights(pool)
        key, sub = jax.random.split(key)
        if part_of_node is None:
            choice = jax.random.categorical(sub, log_w)
        else:
            match = in_s & (S_part == part_of_node[q])
            choice = jnp.where(jnp.any(match), jnp.argmax(match), max_parts)
        new = choice == max_parts
        overflow = overflow | (new & (num >= max_parts))
        target = jnp.minimum(choice, max_parts - 1)

        pool, new_root = seq_insert(ctx, pool, S[target], q, liks[target], hs[target], destroyed[k], ~new)
        if part_of_node is not None:
            # A forced choice does not depend on the weights, so XLA could read the old
            # pool for them after seq_insert's writes and would copy the pool every step;
            # they are read from the new pool instead (``q``'s own row is unchanged).
            log_w = weights(pool)[2]
        log_p = log_p + log_w[choice]
        slot = jnp.where(new, jnp.minimum(num, max_parts - 1), target)
        keep = new & overflow
        S = S.at[slot].set(jnp.where(keep, S[slot], new_root))
        # read back from the pool after the insertion (``q``'s own row was read before
        # it; reading it again here would keep XLA from updating the pool in place)
        S_stats = S_stats.at[slot].set(jnp.where(keep, S_stats[slot], pool.stats[new_root]))
        S_size = S_size.at[slot].set(jnp.where(keep, S_size[slot], pool.size[new_root]))
        S_t = S_t.at[slot].set(jnp.where(keep, S_t[slot], pool.log_t[new_root]))
        if part_of_node is not None:
            S_part = S_part.at[slot].set(jnp.where(new & ~overflow, part_of_node[q], S_part[slot]))
        num = jnp.where(new & ~overflow, num + 1, num)
        part_of_root = part_of_root.at[q].set(slot.astype(jnp.int32))
        return pool, S, S_part, S_stats, S_size, S_t, num, log_p, overflow, key, part_of_root

    part_of_root = jnp.full(2 * n, -1, jnp.int32).at[l].set(0).at[r].set(1)
    init = (pool, S, S_part, S_stats, S_size, S_t, jnp.int32(2), jnp.zeros((), dtype), jnp.bool_(False), key,
            part_of_root)
    pool, S, S_part, _, _, _, num, log_p, overflow, _, part_of_root = lax.fori_loop(0, nq, insert, init)
    return pool, S, num, log_p, overflow, part_of_root


def _subtree_parts(pool, order, count, part_of_leaf):
    """Part of every node of a tree: the part of its leaves if they share one, else ``-1``."""
    num = pool.parent.shape[0]
    n = part_of_leaf.shape[0]
    lo = jnp.concatenate([part_of_leaf, jnp.zeros(num - n, jnp.int32)])
    hi = lo

    def body(i, c):
        lo, hi = c
        v = order[count - 1 - i]  # reverse pre-order: children before parents
        internal = pool.left[v] >= 0
        a, b = jnp.maximum(pool.left[v], 0), jnp.maximum(pool.right[v], 0)
        lo = lo.at[v].set(jnp.where(internal, jnp.minimum(lo[a], lo[b]), lo[v]))
        hi = hi.at[v].set(jnp.where(internal, jnp.maximum(hi[a], hi[b]), hi[v]))
        return lo, hi

    lo, hi = lax.fori_loop(0, count, body, (lo, hi))
    return jnp.where(lo == hi, lo, -1)


def split_log_prob(ctx: TreeContext, pool: Pool, root, part_of_leaf, max_parts: int,
                   known_node=-1, known_log_prob=0.0):
    """``log`` probability that SampleSub + cut + StocInsert on the tree at ``root`` gives
    the partition ``part_of_leaf`` (``(n,)`` part per point; ``TreeGuidedHost.log_split_prob``).

    Summed over every internal node whose cut, with forced insertions, yields
    it; ``known_node``'s term is ``known_log_prob`` (the proposal's own path).
    """
    order, count, log_d = preorder(pool, root)
    log_p = _sample_sub_log_probs(log_d)
    part = _subtree_parts(pool, order, count, part_of_leaf)
    num = order.shape[0]

    # ok[v]: every subtree hanging off v's ancestors lies in one part (pre-order pass;
    # each node reads its parent's, one write a step so that XLA writes in place)
    def ok_body(i, ok):
        v = order[i]
        p = pool.parent[v]
        sib = jnp.where(pool.left[p] == v, pool.right[p], pool.left[p])
        return ok.at[v].set(ok[p] & (part[sib] >= 0))

    ok = lax.fori_loop(1, count, ok_body, jnp.zeros(num, bool).at[root].set(True))
    v = order
    pl, pr = part[jnp.maximum(pool.left[v], 0)], part[jnp.maximum(pool.right[v], 0)]
    valid = ((jnp.arange(num) < count) & (pool.left[v] >= 0) & ok[v] & (pl >= 0) & (pr >= 0)
             & (pl != pr) & jnp.isfinite(log_p))
    idx = _nonzero(valid, num)
    num_valid = jnp.sum(valid)

    def term(k, acc):
        node = order[idx[k]]

        def replay(_):
            log_ins = _cut_and_insert(ctx, pool, node, jax.random.key(0), part, max_parts)[3]
            return log_p[idx[k]] + log_ins

        t = lax.cond(node == known_node, lambda _: jnp.asarray(known_log_prob, acc.dtype), replay, None)
        return jnp.logaddexp(acc, t)

    return lax.fori_loop(0, num_valid, term, jnp.asarray(-jnp.inf, pool.log_t.dtype))


# ----------------------------------------------------------------------------- merges
def merge_log_q(ctx, stats, size, log_t, active, picked, max_rows: int):
    """``log q`` of merging the ``picked`` clusters (paper eq. 11): summed over which of
    them was picked first, each other cluster in ``M`` with probability ``1/(1+d)``.

    Clusters are given by their statistics, sizes and root ``log_t`` per slot; only
    the dissimilarities of the (at most ``max_rows``) picked rows are evaluated.
    """
    capacity = active.shape[0]
    rows = _nonzero(picked, max_rows)
    row_ok = jnp.arange(max_rows) < jnp.sum(picked)
    lik = ctx.lik(stats[rows][:, None, :] + stats[None, :, :])
    h = ctx.log_kappa[jnp.minimum(size[rows][:, None] + size[None, :], ctx.log_kappa.shape[0] - 1)] + lik
    log_d = log_t[rows][:, None] + log_t[None, :] - h
    k = jnp.sum(active)
    other = active[None, :] & (jnp.arange(capacity)[None, :] != rows[:, None])
    into = jnp.where(picked[None, :], -jnp.logaddexp(0.0, log_d), -jnp.logaddexp(0.0, -log_d))
    terms = -jnp.log(k.astype(log_d.dtype)) + jnp.sum(jnp.where(other, into, 0.0), axis=1)
    return jax.nn.logsumexp(jnp.where(row_ok, terms, -jnp.inf))


def log_d_row(ctx, stats, size, log_t, c):
    """``log d(c, j)`` of cluster ``c`` to every slot ``j`` (statistics, sizes, root ``log_t``)."""
    h = (ctx.log_kappa[jnp.minimum(size + size[c], ctx.log_kappa.shape[0] - 1)]
         + ctx.lik(stats + stats[c]))
    return log_t[c] + log_t - h


def log_select_alone(log_d_row, active, c):
    """``log`` of picking cluster ``c`` and leaving every other cluster out of ``M``."""
    k = jnp.sum(active)
    keep = -jnp.logaddexp(0.0, -log_d_row)
    mask = active & (jnp.arange(active.shape[0]) != c)
    return -jnp.log(k.astype(log_d_row.dtype)) + jnp.sum(jnp.where(mask, keep, 0.0))


# ----------------------------------------------------------------------------- the global moves
def cluster_arrays(pool, roots):
    ok = roots >= 0
    r = jnp.maximum(roots, 0)
    stats = jnp.where(ok[:, None], pool.stats[r], 0.0)
    size = jnp.where(ok, pool.size[r], 0)
    return ok, stats, size, pool.log_t[r], pool.log_h[r]


class _Proposal(NamedTuple):
    """What a proposed split or merge hands to the shared full evaluation of its ratio."""

    ok: jax.Array  # the ratio can be non-zero (merge: not too many parts; split: no overflow)
    bound: jax.Array  # an upper bound on log r (early rejection)
    delta: jax.Array  # log p(X, Π*) - log p(X, Π)
    log_fwd: jax.Array  # merge: log q(Π*|Π); split: the selection term of q(Π*|Π)
    lane: jax.Array  # (n,) which new cluster each point goes to (-1: unchanged)
    num_lanes: jax.Array
    slot_of_lane: jax.Array  # (max_parts,) the slot of each new cluster
    clear: jax.Array  # (capacity,) slots emptied before the new clusters are written
    part_of_leaf: jax.Array  # (n,) the parts the split probability is evaluated for
    known_node: jax.Array  # split: the proposal's cut node (its term is known)
    known_log_prob: jax.Array
    no_room: jax.Array  # split: more new clusters than free slots
    overflow: jax.Array  # split: more than max_parts parts


def _one_move(ctx, key, labels, pool, roots, max_parts, early_rejection):
    """One global move. A ``lax.switch`` proposes (split, merge or nothing) and
    bounds ``log r``; one shared full evaluation then builds the new canonical
    trees and the probabilities of both directions (``split_log_prob`` and the
    tree builder appear once in the program, which halves its compile time)."""
    n = ctx.points.shape[0]
    capacity = roots.shape[0]
    dtype = pool.log_t.dtype
    k_pick, k_m, k_sub, k_ins, k_u = jax.random.split(key, 5)
    active, stats, size, log_t, log_h = cluster_arrays(pool, roots)
    c = jax.random.categorical(k_pick, jnp.where(active, 0.0, -jnp.inf))
    log_d_c = log_d_row(ctx, stats, size, log_t, c)
    others = active & (jnp.arange(capacity) != c)
    into_m = others & (jnp.log(jax.random.uniform(k_m, (capacity,))) < -jnp.logaddexp(0.0, log_d_c))
    is_merge = jnp.any(into_m)
    is_split = ~is_merge & (size[c] > 1)
    log_u = jnp.log(jax.random.uniform(k_u, dtype=dtype))
    tiny = jnp.finfo(dtype).tiny
    log_u = jnp.maximum(log_u, jnp.log(tiny))
    f0, i0, no = jnp.zeros((), dtype), jnp.int32(0), jnp.bool_(False)
    parts = jnp.arange(max_parts)

    def merge(_):
        picked = into_m.at[c].set(True)
        u_stats = jnp.sum(jnp.where(picked[:, None], stats, 0.0), axis=0)
        u_size = jnp.sum(jnp.where(picked, size, 0))
        u_h = ctx.log_kappa[u_size] + ctx.lik(u_stats[None])[0]
        delta = u_h - jnp.sum(jnp.where(picked, log_h, 0.0))
        too_many = jnp.sum(picked) > max_parts  # its reverse split is not proposed: r = 0
        log_q_fwd = merge_log_q(ctx, stats, size, log_t, active, picked, max_parts)
        members = picked[labels]
        return _Proposal(
            ok=~too_many, bound=jnp.where(too_many, -jnp.inf, delta - log_q_fwd), delta=delta,
            log_fwd=log_q_fwd, lane=jnp.where(members, 0, -1).astype(jnp.int32), num_lanes=jnp.int32(1),
            slot_of_lane=jnp.full(max_parts, c, jnp.int32), clear=picked,
            part_of_leaf=jnp.where(members, labels, 0).astype(jnp.int32), known_node=jnp.int32(-1),
            known_log_prob=f0, no_room=no, overflow=no)

    def split(_):
        root = roots[c]
        order, count, log_d = preorder(pool, root)
        log_p = _sample_sub_log_probs(log_d)
        j = draw_index(k_sub, log_p)
        v = order[j]
        pool1, S, num, log_ins, overflow, part_of_root = _cut_and_insert(ctx, pool, v, k_ins, None, max_parts)
        log_path = log_p[j] + log_ins
        select = log_select_alone(log_d_c, active, c)
        delta = jnp.sum(jnp.where(parts < num, pool1.log_h[S], 0.0)) - log_h[c]
        # the part of every point of c: the part of the cut-off subtree above it
        in_c = labels == c
        part = _inherit_parts(pool, order, count, part_of_root)
        part_of_leaf = jnp.where(in_c, part[:n], 0).astype(jnp.int32)
        free = ~active
        # new slots: part 0 keeps c's slot, parts 1.. take the first free slots
        free_slots = _nonzero(free, capacity)
        slot_of_part = jnp.where(parts == 0, c, free_slots[jnp.clip(parts - 1, 0, capacity - 1)])
        return _Proposal(
            ok=~overflow, bound=delta - (select + log_path), delta=delta, log_fwd=select,
            lane=jnp.where(in_c, part_of_leaf, -1).astype(jnp.int32), num_lanes=num.astype(jnp.int32),
            slot_of_lane=slot_of_part.astype(jnp.int32), clear=jnp.zeros(capacity, bool),
            part_of_leaf=part_of_leaf, known_node=v.astype(jnp.int32), known_log_prob=log_path.astype(dtype),
            no_room=num - 1 > jnp.sum(free), overflow=overflow)

    def none(_):
        return _Proposal(
            ok=no, bound=jnp.asarray(jnp.nan, dtype), delta=f0, log_fwd=f0,
            lane=-jnp.ones(n, jnp.int32), num_lanes=i0, slot_of_lane=jnp.zeros(max_parts, jnp.int32),
            clear=jnp.zeros(capacity, bool), part_of_leaf=jnp.zeros(n, jnp.int32), known_node=jnp.int32(-1),
            known_log_prob=f0, no_room=no, overflow=no)

    kind = jnp.where(is_merge, 2, jnp.where(is_split, 1, 0))
    prop = lax.switch(kind, [none, split, merge], None)

    def full(_):
        def build(k, carry):
            pool2, roots2 = carry
            pool2, r = build_tree(ctx, pool2, prop.lane == k)
            return pool2, roots2.at[prop.slot_of_lane[k]].set(r)

        pool2, roots2 = lax.fori_loop(0, prop.num_lanes, build, (pool, jnp.where(prop.clear, -1, roots)))
        # the split probability: of the merged tree (merge), of c's tree before the move (split)
        tree_pool = jax.tree.map(lambda a, b: jnp.where(is_merge, a, b), pool2, pool)
        log_split = split_log_prob(ctx, tree_pool, jnp.where(is_merge, roots2[c], roots[c]), prop.part_of_leaf,
                                   max_parts, prop.known_node, prop.known_log_prob)
        act2, st2, sz2, lt2, _ = cluster_arrays(pool2, roots2)
        used = parts < prop.num_lanes
        new_slots = jnp.any((jnp.arange(capacity)[:, None] == prop.slot_of_lane[None, :]) & used[None, :], axis=1)
        log_merge_rev = merge_log_q(ctx, st2, sz2, lt2, act2, new_slots, max_parts)  # split's reverse
        select_rev = log_select_alone(log_d_row(ctx, st2, sz2, lt2, c), act2, c)  # merge's reverse
        log_r = jnp.where(is_merge, prop.delta + select_rev + log_split - prop.log_fwd,
                          prop.delta + log_merge_rev - (prop.log_fwd + log_split))
        new_labels = jnp.where(prop.lane >= 0, prop.slot_of_lane[jnp.maximum(prop.lane, 0)], labels)
        return log_u < log_r, log_r, pool2, roots2, new_labels.astype(jnp.int32)

    def early(_):
        return jnp.bool_(False), prop.bound, pool, roots, labels

    go = prop.ok & (log_u < prop.bound) if early_rejection else prop.ok
    accept, log_r, pool2, roots2, new_labels = lax.cond(go, full, early, None)
    log_r = jnp.where(prop.overflow, -jnp.inf, log_r)
    # an accepted split with no free slot: the state stays and the kernel raises CapacityError
    no_room = prop.no_room & accept
    return accept & ~no_room, log_r, kind, pool2, roots2, new_labels, no_room


def _run_moves(ctx, key, labels, pool, roots, num_moves, max_parts, early_rejection):
    """``num_moves`` moves from a canonical forest; the pool and roots returned are the
    canonical forest of the labels returned."""
    dtype = pool.log_t.dtype

    def body(i, c):
        labels, pool, roots, acc, prop, s, m, no_room, key = c
        key, sub = jax.random.split(key)
        accept, log_r, kind, pool2, roots2, labels2, full = _one_move(
            ctx, sub, labels, pool, roots, max_parts, early_rejection)
        take = accept & ~full
        labels = jnp.where(take, labels2, labels)
        pool = jax.tree.map(lambda a, b: jnp.where(take, a, b), pool2, pool)
        roots = jnp.where(take, roots2, roots)
        proposed = kind > 0
        finite = proposed & jnp.isfinite(log_r)
        s = s + jnp.minimum(0.0, jnp.where(finite, log_r, 0.0))
        return (labels, pool, roots, acc + take.astype(jnp.int32), prop + proposed.astype(jnp.int32),
                s, m + finite.astype(jnp.int32), no_room | full, key)

    init = (labels.astype(jnp.int32), pool, roots, jnp.int32(0), jnp.int32(0), jnp.zeros((), dtype),
            jnp.int32(0), jnp.bool_(False), key)
    labels, pool, roots, acc, prop, s, m, no_room, _ = lax.fori_loop(0, num_moves, body, init)
    return labels, GlobalMovesInfo(acc, prop, s, m, no_room), pool, roots


class GlobalMovesInfo(NamedTuple):
    """What an iteration's global moves did.

    num_accepted, num_proposed: int32 counts (a one-point cluster picked with
        nothing to merge proposes nothing).
    sum_log_accept: sum of ``min(0, log r)`` (an upper bound where a move was
        rejected early) over the ``num_log_accept`` proposals with ``r > 0``.
    no_room: an accepted split found no free slot (the kernel raises ``CapacityError``).
    """

    num_accepted: jax.Array
    num_proposed: jax.Array
    sum_log_accept: jax.Array
    num_log_accept: jax.Array
    no_room: jax.Array

    @property
    def mh(self) -> MHInfo:
        """The move statistics as the partition moves report them."""
        return MHInfo(self.num_accepted, self.num_proposed, self.sum_log_accept, self.num_log_accept)

    @property
    def mean_log_accept(self) -> jax.Array:
        """Mean ``min(0, log r)`` over the counted proposals (0 when none)."""
        return self.mh.mean_log_accept


@functools.partial(jax.jit, static_argnames=("capacity", "num_moves", "max_parts", "early_rejection"))
def global_moves(key, labels, X, measure, family, u, *, capacity: int, num_moves: int,
                 max_parts: int = 16, early_rejection: bool = True):
    """``num_moves`` global moves from slot labels ``labels`` (``TreeGuidedHost.run``, in JAX).

    Returns ``(labels, info)``, ``info`` a :class:`GlobalMovesInfo`. The canonical
    trees are built from scratch; :func:`global_moves_forest` carries them between calls.
    """
    ctx = make_context(X, measure, family, u)
    pool, roots = build_forest(ctx, labels, capacity)
    return _run_moves(ctx, key, labels, pool, roots, num_moves, max_parts, early_rejection)[:2]


# ----------------------------------------------------------------------------- forests kept between calls
class Forest(NamedTuple):
    """The canonical trees of the partition ``labels`` under the tree parameters ``params``
    (``log κ(·, u)`` and the family's parameters), carried from one call of
    :func:`global_moves_forest` to the next in the kernel's state."""

    pool: Pool
    roots: jax.Array  # (capacity,)
    labels: jax.Array  # (n,) the slot labels the trees are of
    params: jax.Array


def _tree_params(ctx: TreeContext, family):
    """Everything but the data that a canonical tree depends on: ``log κ(m, u)`` and the family."""
    leaves = [jnp.ravel(jnp.asarray(x)).astype(ctx.log_kappa.dtype) for x in jax.tree.leaves(family)]
    return jnp.concatenate([ctx.log_kappa] + leaves)


def empty_forest(X, measure, family, u, capacity: int) -> Forest:
    """A :class:`Forest` that the next :func:`global_moves_forest` rebuilds in full."""
    ctx = make_context(X, measure, family, u)
    params = _tree_params(ctx, family)
    return Forest(empty_pool(ctx), -jnp.ones(capacity, jnp.int32), -jnp.ones(X.shape[0], jnp.int32),
                  jnp.full_like(params, jnp.nan))


def refresh_forest(ctx: TreeContext, forest: Forest, labels, params):
    """The canonical forest of ``labels`` under ``params``, from ``forest``: the trees of
    the clusters whose points changed are rebuilt, the others are kept; all of them
    are rebuilt if ``params`` differ from the forest's. Returns ``(pool, roots)``,
    the same arrays as ``build_forest(ctx, labels, capacity)`` on every node reachable
    from a root."""
    capacity = forest.roots.shape[0]
    same = jnp.all(forest.params == params)
    slots = jnp.arange(capacity)
    moved = labels != forest.labels
    changed = jnp.any(moved[:, None] & ((labels[:, None] == slots) | (forest.labels[:, None] == slots)), axis=0)
    # new parameters: the leaves' potentials change too, so start from fresh leaves
    pool = lax.cond(same, lambda: forest.pool, lambda: empty_pool(ctx))
    return _rebuild_slots(ctx, pool, forest.roots, labels, changed | ~same)


@functools.partial(jax.jit, static_argnames=("num_moves", "max_parts", "early_rejection"))
def global_moves_forest(key, forest: Forest, labels, X, measure, family, u, *, num_moves: int,
                        max_parts: int = 16, early_rejection: bool = True):
    """:func:`global_moves` from a :class:`Forest` kept from the previous call (the
    kernel's state): the trees are rebuilt only for the clusters whose points changed
    since (all of them when ``u`` or a hyperparameter changed). The same draws as
    :func:`global_moves` with the same key. Returns ``(forest, info)``: the canonical
    trees of the new partition (``forest.labels``) and a :class:`GlobalMovesInfo`.
    """
    ctx = make_context(X, measure, family, u)
    params = _tree_params(ctx, family)
    labels = labels.astype(jnp.int32)
    pool, roots = refresh_forest(ctx, forest, labels, params)
    labels, info, pool, roots = _run_moves(
        ctx, key, labels, pool, roots, num_moves, max_parts, early_rejection)
    return Forest(pool, roots, labels, params), info
