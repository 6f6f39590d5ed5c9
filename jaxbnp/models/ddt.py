"""Dirichlet diffusion trees (Neal 2001, 2003): tree arrays, structure prior, Brownian data term.

docs/mathematics.md §5. Divergence function ``a(t) = c/(1−t)``, ``A(t) = −c log(1−t)``.

A tree on ``n`` leaves is a :class:`Tree` of three fixed-size arrays, so a
batch of trees (one per chain) is a pytree that ``jax.vmap`` maps over:

* ``parent``   ``(2n−1,)`` int32: nodes ``0..n−1`` are the leaves (data points),
  ``n..2n−2`` the internal (divergence) nodes; ``−1`` at the root.
* ``children`` ``(n−1, 2)`` int32: row ``k`` holds the two children of internal
  node ``n+k`` (their order carries no meaning).
* ``time``     ``(2n−1,)`` float: divergence times of internal nodes, in
  ``(0, 1)`` and increasing from the root down; ``1`` at the leaves.

Structure term (docs/mathematics.md §5; ``m_v`` leaves below ``v``, ``l_v``, ``r_v`` in its
children, ``t_p(root) = 0``, ``H_k = Σ_{j≤k} 1/j``)::

    log p(tree | c) = Σ_v [ log a(t_v) + lgamma(l_v) + lgamma(r_v) − lgamma(m_v)
                            − (A(t_v) − A(t_p(v))) H_{m_v − 1} ]

This is a density with respect to counting measure on leaf-labelled binary
topologies (children unordered) times Lebesgue measure on the ``n−1``
ordered divergence times; it integrates to one (checked by quadrature in
``tests/exact/test_ddt_exact.py`` for 3 and 4 leaves).

Data term: each column of ``X`` is ``N(0, σ² C + s² I)`` with ``C_ij`` the
divergence time of leaves ``i`` and ``j`` and ``C_ii = 1`` (Brownian motion
from 0 at time 0, variance ``σ²`` per unit time, observation noise ``s²``).
:func:`log_likelihood` computes it by Gaussian message passing up the tree
(Felsenstein's pruning), O(n D); ``C`` is formed only by
:func:`divergence_covariance`, for tests.

The numerical functions are ``jax.jit``-compiled (once per shape and dtype).
Precision: float32, the library default, resolves times only to about
``6e−8`` below 1. Divergences that late are common under the prior with a
small ``c`` or many leaves (``1 − t`` falls like ``exp(−m E / c)``) and can
round onto each other, which puts a tree off the support
(``log_prob = −inf``; see :func:`sample_tree`); the samplers reject such
proposals. Data with observation noise keep the posterior's times well away
from 1; float64 (``jax_enable_x64``) avoids the issue.

Example
-------
>>> import jax, jaxbnp as bnp
>>> from jaxbnp.models import ddt
>>> tree = ddt.sample_tree(jax.random.key(0), c=1.0, num_points=5)
>>> X = ddt.sample_leaves(jax.random.key(1), tree, sigma=1.0, noise=0.1, dim=2)
>>> float(ddt.structure_log_prior(tree, 1.0)) < 10 and X.shape == (5, 2)
True
>>> ddt.cut_tree(tree, 0.5).shape
(5,)
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
from jax import lax
from numpyro.distributions import constraints
from numpyro.primitives import _PYRO_STACK, apply_stack

from .._loops import DROP, chain_while
from .._math import LOG_2PI
from .._ranks import argsort

__all__ = [
    "Tree", "DiffusionTree", "BrownianLeaves",
    "num_leaves", "root_of", "comb_tree", "check_tree",
    "log_divergence", "cumulative_divergence", "harmonic_numbers",
    "bottom_up_order", "subtree_sizes", "ancestor_mask",
    "structure_log_prior", "structure_log_prior_from", "log_likelihood", "log_joint_terms", "log_joint_terms_and_sizes",
    "Messages", "tree_messages", "messages_log_likelihood", "refresh_messages",
    "divergence_covariance", "sample_attachment", "descend", "log_attachment_density",
    "attach", "detach", "sample_tree", "sample_leaves",
    "cut_tree", "CUT_MESSAGE", "to_linkage", "from_linkage",
]



class Tree(NamedTuple):
    """A binary tree on ``n`` leaves as fixed-size arrays (module docstring, docs/mathematics.md §5).

    parent: ``(2n−1,)`` int32, ``−1`` at the root.
    children: ``(n−1, 2)`` int32, children of internal node ``n+k`` in row ``k``.
    time: ``(2n−1,)`` float, divergence times (``1`` at the leaves).
    """

    parent: jax.Array
    children: jax.Array
    time: jax.Array


# ------------------------------------------------------------------------------- basics
def num_leaves(tree: Tree) -> int:
    """``n`` (static): the number of leaves of ``tree``."""
    return (tree.parent.shape[-1] + 1) // 2


def root_of(tree: Tree) -> jax.Array:
    """Index of the root (the one node with parent ``−1``) of a complete tree."""
    return jnp.argmax(tree.parent < 0, axis=-1).astype(jnp.int32)


def _float_dtype(dtype=None):
    return jnp.dtype(dtype) if dtype is not None else jnp.result_type(float)


def comb_tree(num_points: int, dtype=None) -> Tree:
    """A deterministic caterpillar tree ``((((0,1),2),3)…)`` with evenly spaced times.

    Internal node ``n+k`` (``k = 0..n−2``) joins ``k+1`` to the subtree of leaves
    ``0..k``; its time is ``(n−1−k)/n``, so the root (``n+n−2``, joining the last
    leaf) diverges first at ``1/n``. Used as a placeholder and as a fixed start.
    """
    n = int(num_points)
    if n < 2:
        raise ValueError(f"A diffusion tree needs num_points >= 2, got {n}.")
    parent = np.full(2 * n - 1, -1, np.int32)
    children = np.zeros((n - 1, 2), np.int32)
    time = np.ones(2 * n - 1)
    for k in range(n - 1):
        left = 0 if k == 0 else n + k - 1
        children[k] = (left, k + 1)
        parent[left] = parent[k + 1] = n + k
        time[n + k] = (n - 1 - k) / n
    return Tree(jnp.asarray(parent), jnp.asarray(children), jnp.asarray(time, _float_dtype(dtype)))


def check_tree(tree: Any, num_points: int | None = None, name: str = "tree") -> Tree:
    """Validate a concrete tree on the host; return it as a :class:`Tree` or raise ``ValueError``."""
    if not isinstance(tree, Tree):
        raise ValueError(
            f"{name} must be a jaxbnp.models.ddt.Tree(parent, children, time), got {type(tree).__name__}."
        )
    parent, children, time = (np.asarray(a) for a in tree)
    if parent.ndim != 1 or parent.shape[0] < 3 or parent.shape[0] % 2 == 0:
        raise ValueError(f"{name}.parent must have shape (2n-1,) with n >= 2, got {parent.shape}.")
    n = (parent.shape[0] + 1) // 2
    if num_points is not None and n != num_points:
        raise ValueError(f"{name} has {n} leaves but the data have {num_points} points.")
    if children.shape != (n - 1, 2) or time.shape != (2 * n - 1,):
        raise ValueError(
            f"{name}: children must have shape ({n - 1}, 2) and time ({2 * n - 1},); got "
            f"{children.shape} and {time.shape}."
        )
    if not np.all(np.isfinite(time)):
        raise ValueError(f"{name}.time contains NaN or inf.")
    if np.sum(parent < 0) != 1 or parent[:n].min() < n:
        raise ValueError(f"{name}: exactly one root (an internal node) must have parent -1.")
    for k in range(n - 1):
        for ch in children[k]:
            if not 0 <= ch < 2 * n - 1 or parent[ch] != n + k:
                raise ValueError(f"{name}: children and parent arrays disagree at node {n + k}.")
    if not np.all(time[:n] == 1.0):
        raise ValueError(f"{name}.time must be 1 at the leaves (nodes 0..n-1).")
    t_int = time[n:]
    p = parent[n:]
    tp = np.where(p >= 0, time[np.maximum(p, 0)], 0.0)
    if not (np.all(t_int > tp) and np.all(t_int < 1.0)):
        raise ValueError(
            f"{name}: divergence times must lie in (0, 1) and increase from the root to the leaves."
        )
    return Tree(jnp.asarray(parent, jnp.int32), jnp.asarray(children, jnp.int32), jnp.asarray(time))


def log_divergence(t: jax.Array, c: jax.Array) -> jax.Array:
    """``log a(t) = log c − log(1−t)`` (docs/mathematics.md §5)."""
    return _log_divergence_from(jnp.log1p(-t), c)


def cumulative_divergence(t: jax.Array, c: jax.Array) -> jax.Array:
    """``A(t) = −c log(1−t)`` (docs/mathematics.md §5)."""
    return _cumulative_divergence_from(jnp.log1p(-t), c)


def _log_divergence_from(log_survival: jax.Array, c: jax.Array) -> jax.Array:
    """:func:`log_divergence` from ``log_survival = log1p(−t)``."""
    return jnp.log(c) - log_survival


def _cumulative_divergence_from(log_survival: jax.Array, c: jax.Array) -> jax.Array:
    """:func:`cumulative_divergence` from ``log_survival = log1p(−t)``."""
    return -c * log_survival


def harmonic_numbers(n: int, dtype=None) -> jax.Array:
    """``(H_0, …, H_{n−1})`` with ``H_k = Σ_{j≤k} 1/j``, a static table."""
    h = np.concatenate([[0.0], np.cumsum(1.0 / np.arange(1, max(n, 1)))])[:n]
    return jnp.asarray(h, _float_dtype(dtype))


def _log_gamma_table(n: int, dtype) -> jax.Array:
    """``lgamma(k)`` for ``k = 0..n`` (``k = 0`` unused): a static table, exact in float64."""
    return jnp.asarray([0.0] + [math.lgamma(k) for k in range(1, n + 1)], dtype)


def bottom_up_order(tree: Tree) -> jax.Array:
    """Internal nodes children-before-parents: sorted by decreasing divergence time.

    Valid for any tree whose times increase strictly from the root down (the
    support of the prior); ``(n−1,)`` int32.
    """
    n = num_leaves(tree)
    return n + argsort(-tree.time[n:])


@jax.jit
def subtree_sizes(tree: Tree, order: jax.Array | None = None) -> jax.Array:
    """``m_v``: number of leaves below each node, ``(2n−1,)`` int32 (1 at the leaves)."""
    n = num_leaves(tree)
    order = bottom_up_order(tree) if order is None else order
    sizes = jnp.zeros(2 * n - 1, jnp.int32).at[:n].set(1)

    def body(j, sizes):
        v = order[j]
        a, b = tree.children[v - n, 0], tree.children[v - n, 1]
        return sizes.at[v].set(sizes[a] + sizes[b])

    return lax.fori_loop(0, n - 1, body, sizes)


def ancestor_mask(parent: jax.Array, node: jax.Array) -> jax.Array:
    """Boolean mask of the strict ancestors of ``node`` (walks the parent pointers)."""
    return chain_while(_ancestors_pending, _ancestors_step, parent,
                       (parent[node], jnp.zeros(parent.shape, bool)))[1]


def _ancestors_pending(parent, carry):
    return carry[0] >= 0


def _ancestors_step(parent, carry, active):
    cur, mask = carry
    return (jnp.where(active, parent[jnp.maximum(cur, 0)], cur),
            mask.at[jnp.where(active, cur, DROP)].set(True, mode="drop"))


def _at_parent(tree: Tree, values: jax.Array) -> jax.Array:
    """``values`` of every node's parent (``0`` at the root and at detached nodes)."""
    p = tree.parent
    return jnp.where(p >= 0, values[jnp.maximum(p, 0)], jnp.zeros((), values.dtype))


def _parent_times(tree: Tree) -> jax.Array:
    """``t_p(v)`` for every node (``0`` at the root)."""
    return _at_parent(tree, tree.time)


# ------------------------------------------------------------------------- structure term
@jax.jit
def structure_log_prior(tree: Tree, c: jax.Array, sizes: jax.Array | None = None) -> jax.Array:
    """Structure term ``log p(tree | c)`` of docs/mathematics.md §5 (``−inf`` off the support).

    ``sizes`` (from :func:`subtree_sizes`) may be passed when already known.
    """
    sizes = subtree_sizes(tree) if sizes is None else sizes
    return structure_log_prior_from(tree, c, sizes, jnp.log1p(-tree.time))


def structure_log_prior_from(tree: Tree, c: jax.Array, sizes: jax.Array, log_survival: jax.Array) -> jax.Array:
    """:func:`structure_log_prior` from the subtree sizes and ``log_survival = log1p(−time)``
    of every node, ``(2n−1,)``: with ``log a(t) = log c − log1p(−t)`` and
    ``A(t) = −c log1p(−t)`` it takes no other transcendental function than ``log c``, so a
    sampler that keeps ``log_survival`` up to date (one node's entry per move) scores a
    proposal without the 2n − 1 logarithms of a full evaluation. The same value as
    :func:`structure_log_prior`, operation for operation."""
    n = num_leaves(tree)
    dtype = tree.time.dtype
    c = jnp.asarray(c, dtype)
    t = tree.time[n:]
    tp = _parent_times(tree)[n:]
    ls = log_survival[n:]
    ls_p = _at_parent(tree, log_survival)[n:]  # log1p(−0) = 0 at the root
    m = sizes[n:]
    left, right = sizes[tree.children[:, 0]], sizes[tree.children[:, 1]]
    harm = harmonic_numbers(n, dtype)[jnp.clip(m - 1, 0, n - 1)]
    log_gamma = _log_gamma_table(n, dtype)
    terms = (
        _log_divergence_from(ls, c)
        + log_gamma[left] + log_gamma[right] - log_gamma[m]
        - (_cumulative_divergence_from(ls, c) - _cumulative_divergence_from(ls_p, c)) * harm
    )
    valid = jnp.all((t > tp) & (t < 1.0)) & (c > 0)
    return jnp.where(valid, jnp.sum(terms), -jnp.inf)


# ------------------------------------------------------------------------------ data term
def _combine(mu_a, var_a, t_a, mu_b, var_b, t_b, t_v, sig2):
    """Message of a node at time ``t_v`` from its children's ``(mean, variance, time)``:
    ``(mean, variance, log term)``, the term the log density of the children's difference
    (docs/mathematics.md §5, "Data term")."""
    va = var_a + sig2 * (t_a - t_v)
    vb = var_b + sig2 * (t_b - t_v)
    s = va + vb
    diff = mu_a - mu_b
    term = -0.5 * mu_a.shape[-1] * (LOG_2PI + jnp.log(s)) - 0.5 * jnp.sum(diff * diff, -1) / s
    return (mu_a * vb + mu_b * va) / s, va * vb / s, term


def _node_row(rows, a, b, v, time, sig2):
    """Node ``v``'s message row ``[mean, var, term]`` (:class:`Messages`) from its children's."""
    d = rows.shape[1] - 2
    ra, rb = rows[a], rows[b]
    mean_v, var_v, term = _combine(ra[:d], ra[d], time[a], rb[:d], rb[d], time[b], time[v], sig2)
    return jnp.concatenate([mean_v, var_v[None], term[None]])


def _root_term(mu, var, t, sig2):
    """Log density of the root's message under the Brownian motion from 0 at time 0."""
    v = var + sig2 * t
    return -0.5 * mu.shape[-1] * (LOG_2PI + jnp.log(v)) - 0.5 * jnp.sum(mu * mu, -1) / v


class Messages(NamedTuple):
    """The Gaussian messages of a tree's nodes given the data below them (docs/mathematics.md
    §5, "Data term"), one row ``[mean (D), var, term]`` per node in ``rows`` ``(2n−1, D+2)``:
    the leaves' mean and variance are the data and the noise variance, and each internal
    node's ``term`` is its log term (``0`` at the leaves). The data term is ``Σ term`` plus
    the root's term (:func:`messages_log_likelihood`). One array rather than three: the
    moves update a node's row in one write, and XLA copies nothing in the loops that do."""

    rows: jax.Array

    @property
    def mean(self) -> jax.Array:
        """``(2n−1, D)``."""
        return self.rows[..., :-2]

    @property
    def var(self) -> jax.Array:
        """``(2n−1,)``."""
        return self.rows[..., -2]

    @property
    def term(self) -> jax.Array:
        """The internal nodes' log terms, ``(n−1,)``."""
        n = (self.rows.shape[-2] + 1) // 2
        return self.rows[..., n:, -1]


def _upward_pass(tree, X, sigma, noise, order, root, active):
    """Gaussian messages up the tree: ``(log p(X), sizes, messages)``; internal nodes with
    ``active = False`` (detached) are computed but not counted."""
    n = num_leaves(tree)
    dtype = jnp.result_type(tree.time.dtype, X.dtype)
    X = X.astype(dtype)
    d = X.shape[1]
    sig2 = jnp.asarray(sigma, dtype) ** 2
    var_leaf = jnp.asarray(noise, dtype) ** 2
    time = tree.time.astype(dtype)
    # one array, a row [mean, var, term] per node (see refresh_messages: with separate arrays
    # XLA copied them at every step, and the pass cost about 4 µs a node at n = 1,300)
    rows = jnp.zeros((2 * n - 1, d + 2), dtype).at[:n, :d].set(X).at[:, d].set(var_leaf)
    sizes = jnp.zeros(2 * n - 1, jnp.int32).at[:n].set(1)

    def body(j, carry):
        rows, sizes, ll = carry
        v = order[j]
        a, b = tree.children[v - n, 0], tree.children[v - n, 1]
        row = _node_row(rows, a, b, v, time, sig2)
        ll = ll + jnp.where(active[v - n], row[-1], 0.0)
        return rows.at[v].set(row), sizes.at[v].set(sizes[a] + sizes[b]), ll

    rows, sizes, ll = lax.fori_loop(0, n - 1, body, (rows, sizes, jnp.zeros((), dtype)))
    ll = ll + _root_term(rows[root, :d], rows[root, d], time[root], sig2)
    return ll, sizes, Messages(rows)


def tree_messages(tree: Tree, X, sigma, noise):
    """``(messages, sizes)`` of a complete tree by one upward pass (:class:`Messages`); not
    jitted: the samplers call it inside their own programs."""
    _, sizes, msg = _upward_pass(tree, X, sigma, noise, bottom_up_order(tree), root_of(tree),
                                 jnp.ones(num_leaves(tree) - 1, bool))
    return msg, sizes


def messages_log_likelihood(tree: Tree, msg: Messages, root, sigma):
    """The data term from a tree's messages: every internal node's term plus the root's."""
    dtype = msg.var.dtype
    sig2 = jnp.asarray(sigma, dtype) ** 2
    return jnp.sum(msg.term) + _root_term(msg.mean[root], msg.var[root], tree.time[root].astype(dtype), sig2)


def refresh_messages(tree: Tree, msg: Messages, starts, sigma):
    """Recompute the messages of the nodes at and above ``starts`` (``(k,)`` node indices,
    ``−1`` for none; leaves are skipped, as their messages are the data), each once and
    children first, by walking up ``k`` root paths together: the deepest pending node (latest
    time) goes next, so a node where two paths meet is recomputed after both. The other
    nodes' messages must already be those of ``tree`` (their subtrees unchanged). Costs
    O(k · depth · D), against O(n D) for :func:`tree_messages`."""
    n = num_leaves(tree)
    dtype = msg.rows.dtype
    sig2 = jnp.asarray(sigma, dtype) ** 2
    time = tree.time.astype(dtype)
    p = tree.parent
    starts = jnp.asarray(starts, jnp.int32)
    safe = jnp.maximum(starts, 0)
    starts = jnp.where((starts >= 0) & (starts < n), p[safe], starts)  # a leaf: its parent
    # the k walkers are k scalars in the loop's state: with one (k,) vector (gathered by
    # index, reduced by argmax) each step was about 20 times slower on XLA:CPU
    k = starts.shape[0]
    out = chain_while(_refresh_pending, _refresh_step, (tree.children, time, p, sig2),
                      (*(starts[i] for i in range(k)), msg.rows))
    return Messages(out[k])


def _refresh_pending(consts, carry):
    pending = carry[0] >= 0
    for w in carry[1:-1]:
        pending = pending | (w >= 0)
    return pending


def _refresh_step(consts, carry, active):
    """One node of :func:`refresh_messages`: the latest pending one, from its children's rows."""
    children, time, p, sig2 = consts
    cur, rows = carry[:-1], carry[-1]
    n = children.shape[0] + 1
    v, t_v = cur[0], jnp.where(cur[0] >= 0, time[jnp.maximum(cur[0], 0)], -jnp.inf)
    for w in cur[1:]:
        t_w = jnp.where(w >= 0, time[jnp.maximum(w, 0)], -jnp.inf)
        v, t_v = jnp.where(t_w > t_v, w, v), jnp.maximum(t_w, t_v)
    kv = jnp.clip(v - n, 0, n - 2)
    a, b = children[kv, 0], children[kv, 1]
    rows = rows.at[jnp.where(active, v, DROP)].set(_node_row(rows, a, b, v, time, sig2), mode="drop")
    pv = p[jnp.maximum(v, 0)]
    return (*(jnp.where(active & (w == v), pv, w) for w in cur), rows)


@jax.jit
def log_likelihood(
    tree: Tree,
    X: jax.Array,
    sigma: jax.Array,
    noise: jax.Array = 0.0,
    *,
    order: jax.Array | None = None,
    root: jax.Array | None = None,
    active: jax.Array | None = None,
) -> jax.Array:
    """Data term ``log N(X_{:,d}; 0, σ² C + s² I)`` summed over columns, by message passing.

    docs/mathematics.md §5. ``X``: ``(n, D)``; ``sigma``: Brownian scale ``σ``; ``noise``:
    observation noise standard deviation ``s``. O(n D), ``n−1`` sequential steps.
    ``root``/``active`` (``(n−1,)`` bool over internal nodes) evaluate a
    partial tree whose detached nodes are skipped (used by the population
    exchange move); ``order`` is :func:`bottom_up_order`.
    """
    n = num_leaves(tree)
    X = jnp.asarray(X)
    if X.ndim != 2 or X.shape[0] != n:
        raise ValueError(f"X must have shape ({n}, D) for a tree on {n} leaves, got {X.shape}.")
    order = bottom_up_order(tree) if order is None else order
    root = root_of(tree) if root is None else root
    active = jnp.ones(n - 1, bool) if active is None else active
    return _upward_pass(tree, X, sigma, noise, order, root, active)[0]


@jax.jit
def log_joint_terms(tree: Tree, X: jax.Array, c, sigma, noise=0.0) -> tuple[jax.Array, jax.Array]:
    """``(structure term, data term)`` with one ordering and one upward pass (docs/mathematics.md §5)."""
    lp, ll, _ = log_joint_terms_and_sizes(tree, jnp.asarray(X), c, sigma, noise)
    return lp, ll


def log_joint_terms_and_sizes(tree: Tree, X, c, sigma, noise):
    """``(structure term, data term, subtree sizes)`` of a complete tree, one upward pass
    (docs/mathematics.md §5). Not jitted: the samplers call it inside their own programs."""
    order = bottom_up_order(tree)
    ll, sizes, _ = _upward_pass(tree, X, sigma, noise, order, root_of(tree), jnp.ones(num_leaves(tree) - 1, bool))
    return structure_log_prior(tree, c, sizes), ll, sizes


@jax.jit
def divergence_covariance(tree: Tree) -> jax.Array:
    """Dense ``C`` (``C_ij`` = divergence time of leaves ``i, j``, ``C_ii = 1``); O(n² depth), tests only."""
    n = num_leaves(tree)
    anc = jax.vmap(lambda i: ancestor_mask(tree.parent, i))(jnp.arange(n))
    shared = anc[:, None, :] & anc[None, :, :]
    t = jnp.where(shared, tree.time[None, None, :], -jnp.inf).max(-1)
    return jnp.where(jnp.eye(n, dtype=bool), 1.0, t)


# --------------------------------------------------------------------- generative process
def _one_below_one(dtype) -> jax.Array:
    return jnp.nextafter(jnp.ones((), dtype), jnp.zeros((), dtype))


def sample_attachment(
    key: jax.Array, tree: Tree, sizes: jax.Array, root: jax.Array, c: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """Where a new path diverges from ``tree`` under the DDT prior: ``(u, t)``.

    docs/mathematics.md §5: the path follows a segment traversed by ``m`` paths and
    diverges with hazard ``a(t)/m`` (``1 − t = (1 − s) exp(−m E / c)``,
    ``E ~ Exp(1)``); at a branch point it takes a branch with probability
    (paths down it)/``m``. The new divergence node sits on the edge above ``u``
    at time ``t``. ``sizes`` are the subtree sizes of the nodes reachable from
    ``root`` (other nodes are ignored). Since ``A(1) = ∞`` a path always
    diverges before reaching a leaf, but in floating point ``t`` can round to
    1 (float32: ``1 − t < 6e−8``, reached with small ``c`` or many paths on a
    segment); the MCMC moves reject such proposals.
    """
    u, t, _ = descend(key, tree, sizes, root, c)
    return u, t


def descend(unif, tree, sizes, root, c, clamp: bool = False):
    """:func:`sample_attachment` driven by ``unif``: ``(n, 2)`` uniforms (row ``j`` at depth
    ``j``), or a PRNG key, from which the walk draws its uniforms ``_WALK_BLOCK`` steps at a
    time (block ``b`` from ``fold_in(key, b)``), so that memory and random numbers grow with
    the depth the walk reaches, not with ``n``.

    Returns ``(u, t, path)`` with ``path`` the mask of the nodes the path went
    through: the ancestors of ``u``. ``clamp`` keeps ``t`` below 1 (the
    generative sampler must return a tree; MCMC proposals are not clamped, a
    time that rounds to 1 is rejected instead)."""
    dtype = tree.time.dtype
    c = jnp.asarray(c, dtype)
    zero = jnp.zeros((), dtype)
    root = jnp.asarray(root, jnp.int32)
    init = (jnp.int32(0), (root, zero, jnp.array(False), root, zero, jnp.zeros(tree.parent.shape, bool)))
    consts = (tree, sizes, c, unif)
    if jax.dtypes.issubdtype(jnp.result_type(unif), jnp.floating):
        _, carry = chain_while(_walk_pending, partial(_walk_rows, clamp=clamp), consts, init)
    else:
        # a key: typed, or a legacy uint32 one (jax.random.PRNGKey). One random call per
        # block of steps: a draw at every step made the walk about 15 times slower on XLA:CPU
        key = unif if jax.dtypes.issubdtype(unif.dtype, jax.dtypes.prng_key) else jax.random.wrap_key_data(unif)
        _, carry = chain_while(_walk_pending, partial(_walk_block, clamp=clamp), (tree, sizes, c, key), init)
    _, _, _, u, t, path = carry
    return u, t, path


def _walk_pending(consts, carry):
    return ~carry[1][2]


def _walk_rows(consts, carry, active, clamp):
    """One step of :func:`descend` driven by the row of uniforms at its depth."""
    tree, sizes, c, unif = consts
    j, state = carry
    return j + 1, _walk_step(tree, sizes, c, unif[jnp.minimum(j, unif.shape[0] - 1)], state, clamp)


def _walk_block(consts, carry, active, clamp):
    """``_WALK_BLOCK`` steps of :func:`descend` from one draw of uniforms (block ``b`` from
    ``fold_in(key, b)``); steps after the path has diverged change nothing."""
    tree, sizes, c, key = consts
    b, state = carry
    ub = jax.random.uniform(jax.random.fold_in(key, b), (_WALK_BLOCK, 2), c.dtype)
    return b + 1, lax.fori_loop(0, _WALK_BLOCK, lambda k, st: _walk_step(tree, sizes, c, ub[k], st, clamp), state)


def _walk_step(tree, sizes, c, uj, carry, clamp):
    """One step down from ``v`` (:func:`descend`); a no-op once the path has diverged (so the
    batched loop of :func:`~jaxbnp._loops.chain_while` may run it on a finished chain)."""
    n = num_leaves(tree)
    dtype = c.dtype
    v, start, done, u, t, path = carry
    m = sizes[v].astype(dtype)
    e = -jnp.log1p(-uj[0])  # Exp(1)
    t_new = -jnp.expm1(jnp.log1p(-start) - m * e / c)
    leaf = v < n
    diverge = leaf | (t_new < tree.time[v])
    if clamp:
        t_new = jnp.where(leaf, jnp.minimum(t_new, _one_below_one(dtype)), t_new)
    kk = jnp.maximum(v - n, 0)
    a, b = tree.children[kk, 0], tree.children[kk, 1]
    nxt = jnp.where(uj[1] * m < sizes[a], a, b)
    path = path.at[jnp.where(done, DROP, v)].set(~diverge, mode="drop")
    return (jnp.where(done | diverge, v, nxt), jnp.where(done | diverge, start, tree.time[v]),
            done | diverge, jnp.where(done, u, v), jnp.where(done, t, t_new), path)


_WALK_BLOCK = 32


def log_attachment_density(
    tree: Tree, sizes: jax.Array, root: jax.Array, u: jax.Array, t: jax.Array, c: jax.Array,
    ancestors: jax.Array | None = None, log_survival: jax.Array | None = None,
) -> jax.Array:
    """Log density of :func:`sample_attachment` at ``(u, t)`` (edge above ``u``, time ``t``).

    ``log a(t) − log m_root − (A(t) − A(t_p(u)))/m_u − Σ_{v ancestor of u} (A(t_v) − A(t_p(v)))/m_v``
    (the branch probabilities telescope to ``m_u/m_root``). ``−inf`` when
    ``t`` is not on the edge. For a single leaf this equals the change of the
    structure term when the leaf is added (docs/mathematics.md §5), which the tests check.
    ``ancestors``: the mask of ``u``'s ancestors, when already known. ``log_survival``:
    ``log1p(−time)`` of every node, when already known (a sampler that keeps it up to date,
    as :func:`structure_log_prior_from`'s callers do): the sum over the ancestors then takes
    no logarithm, where it otherwise takes ``2 (2n − 1)``; the same value either way (the
    entries that differ, zeros' signs, are masked out).
    """
    dtype = tree.time.dtype
    c = jnp.asarray(c, dtype)
    t = jnp.asarray(t, dtype)
    anc = ancestor_mask(tree.parent, u) if ancestors is None else ancestors
    tp = _parent_times(tree)
    # internal ancestors only: leaves (A(1) = inf) are never ancestors
    if log_survival is None:
        seg = cumulative_divergence(jnp.where(anc, tree.time, 0.0), c) - cumulative_divergence(tp, c)
    else:
        seg = (_cumulative_divergence_from(jnp.where(anc, log_survival, 0.0), c)
               - _cumulative_divergence_from(_at_parent(tree, log_survival), c))
    m = jnp.maximum(sizes, 1).astype(dtype)
    above = jnp.sum(jnp.where(anc, seg / m, 0.0))
    m_u = m[u]
    tp_u = tp[u]
    out = (
        log_divergence(t, c) - jnp.log(m[root])
        - (cumulative_divergence(t, c) - cumulative_divergence(tp_u, c)) / m_u - above
    )
    return jnp.where((t > tp_u) & (t < tree.time[u]), out, -jnp.inf)


def attach(tree: Tree, root, s, u, t, w) -> tuple[Tree, jax.Array]:
    """Hang node ``s`` from a new node ``w`` at time ``t`` on the edge above ``u``; returns
    ``(tree, root)``. The inverse of :func:`detach` (docs/mathematics.md §5)."""
    n = num_leaves(tree)
    parent, children, time = tree
    g = parent[u]
    gk = jnp.maximum(g - n, 0)
    slot = (children[gk, 1] == u).astype(jnp.int32)
    children = jnp.where(g >= 0, children.at[gk, slot].set(w), children)
    children = children.at[w - n].set(jnp.stack([u, s]).astype(children.dtype))
    parent = parent.at[w].set(g).at[u].set(w).at[s].set(w)
    time = time.at[w].set(t)
    root = jnp.where(g < 0, w, root)
    return Tree(parent, children, time), root


def detach(tree: Tree, root, s) -> tuple[Tree, jax.Array, jax.Array, jax.Array]:
    """Cut the subtree at ``s`` off: its parent ``w`` is freed and its sibling ``u``
    joins ``w``'s parent. Returns ``(tree, root, w, u)``; ``s`` keeps its subtree
    (docs/mathematics.md §5)."""
    n = num_leaves(tree)
    parent, children, time = tree
    w = parent[s]
    wk = w - n
    u = jnp.where(children[wk, 0] == s, children[wk, 1], children[wk, 0])
    g = parent[w]
    gk = jnp.maximum(g - n, 0)
    slot = (children[gk, 1] == w).astype(jnp.int32)
    children = jnp.where(g >= 0, children.at[gk, slot].set(u), children)
    parent = parent.at[u].set(g).at[s].set(-1).at[w].set(-1)
    root = jnp.where(g < 0, u, root)
    return Tree(parent, children, time), root, w, u


@partial(jax.jit, static_argnames=("num_points", "dtype"))
def sample_tree(key: jax.Array, c: Any, num_points: int, dtype=None) -> Tree:
    """A draw from the DDT prior by the generative process (docs/mathematics.md §5).

    Leaf ``i`` (``i = 1..n−1``) follows the paths of leaves ``0..i−1`` and
    diverges as in :func:`sample_attachment`; its divergence node is ``n+i−1``.
    Floating point: a time that rounds to 1 is clamped to the largest float
    below 1, and late divergences can then tie (the tree is off the support,
    ``log_prob = −inf``). In float32 this happens for small ``c`` or a few
    dozen leaves (``1 − t`` falls like ``exp(−m E / c)``); the kernels then
    start from :func:`comb_tree` instead. float64 is safe in practice.
    """
    n = int(num_points)
    if n < 2:
        raise ValueError(f"A diffusion tree needs num_points >= 2, got {n}.")
    dtype = _float_dtype(dtype)
    c = jnp.asarray(c, dtype)
    tree = Tree(
        jnp.full(2 * n - 1, -1, jnp.int32), jnp.zeros((n - 1, 2), jnp.int32),
        jnp.ones(2 * n - 1, dtype).at[n:].set(0.5),
    )
    sizes = jnp.zeros(2 * n - 1, jnp.int32).at[0].set(1)

    def insert(i, carry):
        tree, sizes, root = carry
        u, t, _ = descend(jax.random.fold_in(key, i), tree, sizes, root, c, clamp=True)
        w = n + i - 1
        tree, root = attach(tree, root, i, u, t, w)
        sizes = sizes.at[w].set(sizes[u]).at[i].set(1)
        sizes = sizes + ancestor_mask(tree.parent, i).astype(jnp.int32)
        return tree, sizes, root

    tree, _, _ = lax.fori_loop(1, n, insert, (tree, sizes, jnp.int32(0)))
    return tree


@partial(jax.jit, static_argnames=("dim",))
def sample_leaves(
    key: jax.Array, tree: Tree, sigma: Any, noise: Any = 0.0, dim: int = 1
) -> jax.Array:
    """Brownian motion down ``tree`` (variance ``σ²`` per unit time) plus ``N(0, s²)`` noise: ``(n, dim)``."""
    n = num_leaves(tree)
    dtype = tree.time.dtype
    sigma = jnp.asarray(sigma, dtype)
    order = jnp.argsort(tree.time[n:]) + n  # parents before children
    normals = jax.random.normal(key, (4 * n - 1, dim), dtype)  # one random call
    z, z_leaf, z_noise = normals[: 2 * n - 1], normals[2 * n - 1: 3 * n - 1], normals[3 * n - 1:]
    tp = _parent_times(tree)

    def body(j, x):
        v = order[j]
        p = tree.parent[v]
        base = jnp.where(p >= 0, x[jnp.maximum(p, 0)], 0.0)
        return x.at[v].set(base + sigma * jnp.sqrt(tree.time[v] - tp[v]) * z[v])

    x = lax.fori_loop(0, n - 1, body, jnp.zeros((2 * n - 1, dim), dtype))
    leaf_parent = tree.parent[:n]
    y = x[leaf_parent] + sigma * jnp.sqrt(1.0 - tp[:n])[:, None] * z_leaf
    return y + jnp.asarray(noise, dtype) * z_noise


# -------------------------------------------------------------------------------- outputs
def cut_tree(tree: Tree, t_stop: Any = None, *, num_clusters: int | None = None) -> jax.Array:
    """Cluster labels from cutting the tree at time ``t_stop`` (docs/mathematics.md §5, "Clusters").

    Each subtree hanging below ``t_stop`` (its top node's parent diverged
    before ``t_stop``) is one cluster. Alternatively ``num_clusters=K`` cuts
    just after the ``K−1`` earliest divergences. Labels ``(n,)`` int32 in
    order of first appearance. ``tree`` must be a single tree.

    Inside a NumPyro model, ``ConjugateMixture(family, cut_tree(tree, t_stop))`` observed is
    the seed's cut model (docs/mathematics.md §5, "The cut model"), which
    ``DiffusionTreeMCMC`` and ``PopulationDDT`` sample: the call leaves a message
    (:data:`CUT_MESSAGE`) in the model's trace that tells them what was cut at which time.
    """
    n = num_leaves(tree)
    if (t_stop is None) == (num_clusters is None):
        raise ValueError("cut_tree needs exactly one of t_stop or num_clusters.")
    if num_clusters is not None:
        k = int(num_clusters)
        if not 1 <= k <= n:
            raise ValueError(f"num_clusters must be in 1..{n}, got {num_clusters}.")
        labels = _cut_tree(tree, jnp.zeros((), tree.time.dtype), k)
    else:
        labels = _cut_tree(tree, t_stop, 0)
    if _PYRO_STACK:  # inside a NumPyro model: tell the tree samplers what was cut (CUT_MESSAGE)
        apply_stack({"type": CUT_MESSAGE, "name": f"{CUT_MESSAGE}:{id(labels)}", "fn": lambda: labels,
                     "args": (), "kwargs": {}, "value": labels, "tree": tree, "t_stop": t_stop,
                     "num_clusters": num_clusters})
    return labels


#: type of :func:`cut_tree`'s message inside a NumPyro model (the trace keeps the tree, ``t_stop``
#: and the labels: how the tree samplers read ``ConjugateMixture(family, cut_tree(tree, t_stop))``)
CUT_MESSAGE = "jaxbnp_cut_tree"


@jax.jit
def _cut_tree(tree: Tree, t_stop, num_clusters):
    n = num_leaves(tree)
    t_sorted = tree.time[n:][argsort(tree.time[n:])]
    by_count = jnp.where(num_clusters <= n - 1, t_sorted[jnp.clip(num_clusters - 1, 0, n - 2)], 1.0)
    t_stop = jnp.where(num_clusters > 0, by_count, t_stop).astype(tree.time.dtype)
    nodes = jnp.arange(2 * n - 1, dtype=jnp.int32)
    p = tree.parent
    top = (p < 0) | (tree.time[jnp.maximum(p, 0)] < t_stop)
    rep = jnp.where(top, nodes, p)
    for _ in range(int(math.ceil(math.log2(2 * n))) + 1):  # pointer jumping
        rep = rep[rep]
    rep = rep[:n]
    first = jnp.full(2 * n - 1, n, jnp.int32).at[rep].min(jnp.arange(n, dtype=jnp.int32))
    is_first = first[rep] == jnp.arange(n)
    return (jnp.cumsum(is_first) - 1).astype(jnp.int32)[first[rep]]


def to_linkage(tree: Tree) -> np.ndarray:
    """SciPy linkage matrix ``(n−1, 4)`` of a tree: merge height ``1 − t_v``.

    Rows are internal nodes by increasing height (decreasing divergence time),
    so ``scipy.cluster.hierarchy.dendrogram(to_linkage(tree))`` draws the tree
    with leaves at height 0 and the root at ``1 − t_root``.
    """
    parent, children, time = (np.asarray(a) for a in tree)
    if parent.ndim != 1:
        raise ValueError("to_linkage takes a single tree (index a batch of trees first).")
    n = (parent.shape[0] + 1) // 2
    order = n + np.argsort(-time[n:], kind="stable")
    ids = np.arange(2 * n - 1)
    ids[order] = n + np.arange(n - 1)
    sizes = np.ones(2 * n - 1)
    Z = np.zeros((n - 1, 4))
    for row, v in enumerate(order):
        a, b = sorted(ids[children[v - n]])
        sizes[v] = sizes[children[v - n, 0]] + sizes[children[v - n, 1]]
        Z[row] = (a, b, 1.0 - float(time[v]), sizes[v])
    return Z


def from_linkage(Z: Any, *, t_root: float = 0.1, dtype=None) -> Tree:
    """A :class:`Tree` with the topology of a SciPy linkage matrix ``Z`` (``(n−1, 4)``).

    Row ``k`` of ``Z`` (SciPy's cluster ``n + k``) becomes internal node
    ``n + k``. Divergence times follow the merge heights ``h``: the root
    diverges at ``t_root`` and ``1 − t_v = (1 − t_root) (h_v / h_root)²``, since
    under the Brownian model a squared distance grows like ``1 − t``
    (docs/mathematics.md §5). Times are then raised where needed so that each
    node diverges after its parent and before ``1`` (``1 − t_v`` is at least ``10⁻⁴``; a node at or above its
    parent's time gets ``t_parent + (1 − t_parent)/100``). Used to start samplers
    from a Ward tree (:func:`~jaxbnp.inference.trees.fit.fit_ddt`).
    """
    Z = np.asarray(Z, np.float64)
    if Z.ndim != 2 or Z.shape[1] != 4 or Z.shape[0] < 1:
        raise ValueError(f"Z must be a SciPy linkage matrix of shape (n-1, 4) with n >= 2, got {Z.shape}.")
    if not np.all(np.isfinite(Z)) or np.any(Z[:, 2] < 0):
        raise ValueError("Z must be finite with non-negative merge heights.")
    if not 0.0 < float(t_root) < 1.0:
        raise ValueError(f"t_root must be in (0, 1), got {t_root}.")
    n = Z.shape[0] + 1
    children = Z[:, :2].astype(np.int64)
    if np.any(children[:, 0] == children[:, 1]) or np.any(children < 0) or np.any(
            children >= n + np.arange(n - 1)[:, None]):
        raise ValueError("Z: row k must merge two distinct clusters formed before it (ids < n + k).")
    parent = np.full(2 * n - 1, -1, np.int64)
    parent[children.ravel()] = n + np.repeat(np.arange(n - 1), 2)
    if np.sum(parent < 0) != 1 or parent[2 * n - 2] != -1:
        raise ValueError("Z: every cluster but the last must be merged exactly once.")
    h = Z[:, 2]
    top = h[-1] if h[-1] > 0 else 1.0
    dt = np.dtype(_float_dtype(dtype))  # the times are fixed up in the dtype they will have
    time = np.ones(2 * n - 1, dt)
    gap = np.maximum((1.0 - float(t_root)) * np.minimum(h / top, 1.0) ** 2, 1e-4)
    time[n:] = (1.0 - gap).astype(dt)
    time[2 * n - 2] = dt.type(t_root)
    for v in range(2 * n - 3, n - 1, -1):  # parents come after their children in Z
        tp = time[parent[v]]
        if not tp < time[v] < 1.0:
            time[v] = tp + (dt.type(1.0) - tp) / dt.type(100.0)
    tree = Tree(jnp.asarray(parent, jnp.int32), jnp.asarray(children, jnp.int32), jnp.asarray(time, dt))
    check_tree(tree, n, "from_linkage(Z)")
    return tree


# --------------------------------------------------------------------------- distributions
def _concrete(x) -> bool:
    return not isinstance(x, jax.core.Tracer)


class _TreeSupport(constraints.Constraint):
    """Valid trees: times in (0, 1), increasing from the root down.

    Marked discrete (the topology is): NumPyro's HMC/NUTS then refuse the site
    and its initialisation strategies draw it from the prior instead of
    looking for an unconstrained transform, which a tree does not have.
    """

    event_dim = 0
    is_discrete = True

    def __call__(self, x):
        n = num_leaves(x)
        t, tp = x.time[..., n:], jnp.where(
            x.parent[..., n:] >= 0,
            jnp.take_along_axis(x.time, jnp.maximum(x.parent[..., n:], 0), axis=-1), 0.0,
        )
        return jnp.all((t > tp) & (t < 1.0), axis=-1)

    def feasible_like(self, prototype):
        return prototype


tree_support = _TreeSupport()


def _check_positive(value, name: str, what: str) -> None:
    if value is None:
        raise ValueError(f"{name} must be given ({what}).")
    if _concrete(value):
        if isinstance(value, (bool, np.bool_, str, bytes)) or np.asarray(value).dtype.kind not in "iuf":
            raise TypeError(f"{name} must be a real number ({what}), got {value!r}.")
        arr = np.asarray(value, dtype=float)
        if arr.ndim != 0:
            raise ValueError(f"{name} must be a scalar, got shape {arr.shape}.")
        if not np.isfinite(arr) or arr <= 0:
            raise ValueError(f"{name} must be a positive finite number ({what}), got {float(arr)}.")


@partial(jax.jit, static_argnames=("num_points",))
def _sample_trees(keys, c, num_points):
    # lax.map: the batched generative process takes about twice as long to compile
    return lax.map(lambda k: sample_tree(k, c, num_points), keys)


class DiffusionTree(dist.Distribution):
    """Dirichlet diffusion tree prior over binary trees on ``num_points`` leaves (docs/mathematics.md §5).

    :param c: divergence parameter of ``a(t) = c/(1−t)`` (``c > 0``; small
        ``c`` diverges late, giving tight clusters).
    :param num_points: number of leaves ``n >= 2``.

    ``sample`` runs the generative process (:func:`sample_tree`) and returns
    a :class:`Tree`; ``log_prob(tree)`` is the structure term
    (:func:`structure_log_prior`).
    """

    arg_constraints: dict = {}
    pytree_data_fields = ("c",)
    pytree_aux_fields = ("num_points",)
    support = tree_support

    def __init__(self, c: Any, num_points: int, *, validate_args=None):
        _check_positive(c, "DiffusionTree: c", "the divergence parameter of a(t) = c/(1-t)")
        if isinstance(num_points, (bool, np.bool_)) or not isinstance(num_points, (int, np.integer)):
            raise TypeError(f"DiffusionTree: num_points must be an integer, got {num_points!r}.")
        num_points = int(num_points)
        if num_points < 2:
            raise ValueError(f"DiffusionTree: num_points must be >= 2, got {num_points}.")
        self.c = c
        self.num_points = num_points
        super().__init__(batch_shape=(), event_shape=(), validate_args=validate_args)

    def sample(self, key, sample_shape=()):
        if not sample_shape:
            return sample_tree(key, self.c, self.num_points)
        keys = jax.random.split(key, math.prod(sample_shape))
        trees = _sample_trees(keys, self.c, self.num_points)
        return jax.tree.map(lambda a: a.reshape(tuple(sample_shape) + a.shape[1:]), trees)

    def log_prob(self, value: Tree):
        if not isinstance(value, Tree):
            raise TypeError(
                f"DiffusionTree.log_prob: value must be a jaxbnp Tree (a DiffusionTree sample), "
                f"got {type(value).__name__}."
            )
        if value.parent.shape[-1] != 2 * self.num_points - 1:
            raise ValueError(
                f"DiffusionTree.log_prob: the tree has {num_leaves(value)} leaves, expected {self.num_points}."
            )
        if value.time.ndim > 1:
            batch = value.time.shape[:-1]
            flat = jax.tree.map(lambda a: a.reshape((-1,) + a.shape[len(batch):]), value)
            return jax.vmap(lambda t: structure_log_prior(t, self.c))(flat).reshape(batch)
        return structure_log_prior(value, self.c)


class BrownianLeaves(dist.Distribution):
    """Data at the leaves of a diffusion tree (docs/mathematics.md §5): each column ``N(0, σ² C + s² I)``.

    :param tree: the :class:`Tree` (the ``DiffusionTree`` site's value).
    :param sigma: Brownian scale ``σ > 0`` (variance ``σ²`` per unit time).
    :param noise: observation noise standard deviation ``s >= 0``.
    :param dim: number of columns; needed only to ``sample``.

    ``log_prob(X)`` is :func:`log_likelihood` (message passing, O(n D)).
    """

    arg_constraints: dict = {}
    pytree_data_fields = ("tree", "sigma", "noise")
    pytree_aux_fields = ("dim",)

    def __init__(self, tree: Tree, sigma: Any, noise: Any = 0.0, dim: int | None = None, *, validate_args=None):
        if not isinstance(tree, Tree):
            raise ValueError(
                "BrownianLeaves: tree must be the value of a DiffusionTree site (a jaxbnp Tree), "
                f"got {type(tree).__name__}."
            )
        _check_positive(sigma, "BrownianLeaves: sigma", "the Brownian scale")
        if noise is None:
            noise = 0.0
        if _concrete(noise):
            arr = np.asarray(noise, dtype=float)
            if arr.ndim != 0 or not np.isfinite(arr) or arr < 0:
                raise ValueError(f"BrownianLeaves: noise must be a scalar >= 0, got {noise!r}.")
        if dim is not None and int(dim) < 1:
            raise ValueError(f"BrownianLeaves: dim must be >= 1, got {dim}.")
        self.tree = tree
        self.sigma = sigma
        self.noise = noise
        self.dim = None if dim is None else int(dim)
        n = num_leaves(tree)
        super().__init__(batch_shape=(), event_shape=(n, self.dim or 1), validate_args=validate_args)

    @constraints.dependent_property(is_discrete=False, event_dim=2)
    def support(self):
        return constraints.independent(constraints.real, 2)

    def log_prob(self, value):
        if value is None or isinstance(value, str):
            raise TypeError(f"BrownianLeaves.log_prob: value (X) must be an (n, D) array, got {value!r}.")
        if _concrete(value):
            arr = np.asarray(value)
            if arr.dtype.kind not in "biuf":
                raise TypeError(f"BrownianLeaves.log_prob: value (X) must be numeric, got dtype {arr.dtype}.")
            if not np.all(np.isfinite(arr)):
                raise ValueError("BrownianLeaves.log_prob: value (X) contains NaN or inf.")
        return log_likelihood(self.tree, jnp.asarray(value), self.sigma, self.noise)

    def sample(self, key, sample_shape=()):
        if self.dim is None:
            raise ValueError("BrownianLeaves.sample needs the number of columns: pass dim=D.")
        if sample_shape:
            keys = jax.random.split(key, math.prod(sample_shape))
            out = jax.vmap(lambda k: sample_leaves(k, self.tree, self.sigma, self.noise, self.dim))(keys)
            return out.reshape(tuple(sample_shape) + out.shape[1:])
        return sample_leaves(key, self.tree, self.sigma, self.noise, self.dim)
