"""Incremental Bayesian hierarchical clustering (IBHC) for NRM mixtures (docs/mathematics.md §4).

Host-side trees (NumPy, float64) for Lee & Choi's IBHC and the tree operations
of tree-guided MCMC (tgMCMC, Lee & Choi 2015, section 3 and supplement A-B).
The per-cluster math, ``log P(X_c)`` and ``log κ(|c|, u)``, is evaluated for
many candidate nodes at once in NumPy float64 (``family.host_log_marginal``,
``measure.host_log_kappa``: the same formulas as the JAX ``log_marginal`` and
``log_kappa``), so the trees never call JAX, which matters inside tgMCMC's
``io_callback`` (a JAX call from a callback can deadlock). A family that only
defines ``log_marginal`` is evaluated by a jitted, batched JAX call instead.
``sequential_tree_jax`` builds whole trees in one jitted call; ``sequential_tree_host``
builds the same trees without JAX (for callbacks that run while every device is
busy, as under ``chain_method="parallel"``).

Potentials (docs/mathematics.md §4), all in log space; every ``Node`` stores

* ``log_lik = log P(X_c)`` and ``log_h = log φ(X_c|h_c) = log κ(|c|, u) + log P(X_c)``,
* ``log_t = log φ(X_c|t_c) = logaddexp(log_h, log_t(l) + log_t(r))`` (a leaf: ``log_h``),
* ``log_d = log d(l, r) = log_t(l) + log_t(r) − log_h`` (a leaf: ``−inf``, d = 0),
  so that ``P(h_c | X_c, t_c) = 1/(1 + d)``.

The dissimilarity of two separate trees ``a``, ``b`` is that of the node that
would merge them: ``log d(a, b) = log_t(a) + log_t(b) − log_h(a ∪ b)``.

Operations
----------
``TreeModel``
    The data, measure, family and ``u``; makes leaves and merged nodes.
``seq_insert``
    SeqInsert(c, s): insert tree ``s`` into tree ``c`` (paper, Step 2).
``ibhc``
    IBHC: points inserted one at a time in a given order (Steps 1-3).
``bhc``
    Deterministic greedy BHC (merge the pair with the smallest ``d`` while it is ≤ 1).
``sample_sub``, ``stoc_insert`` and their log probabilities
    SampleSub (supplement A, Fig. 6) and StocInsert (paper 3.1, supplement A, Fig. 7), in
    :mod:`jaxbnp.inference.tgmcmc.proposals`.
``cut_at``, ``cascade``, ``detach``, ``cut_host_tree``
    The tree edits of the global and local moves (supplement B, C).

Where the paper is ambiguous, the choices made here are stated in the
docstrings (``seq_insert``: ties; ``ibhc``: which node is split in Step 3;
``sample_sub``: ``ε`` with ``internal_only``).

Example
-------
>>> import numpy as np
>>> from jaxbnp.models.measures import DP
>>> from jaxbnp.models.families import NormalGamma
>>> from jaxbnp.inference.tgmcmc.ibhc import ibhc
>>> from jaxbnp.inference.tgmcmc.proposals import sample_sub
>>> X = np.array([[0.0], [0.1], [-0.1], [10.0], [10.1], [9.9]])
>>> forest = ibhc(X, DP(1.0), NormalGamma(0.0, 0.01, 1.0, 0.1))
>>> forest.labels.tolist()
[0, 0, 0, 1, 1, 1]
>>> [t.points().tolist() for t in forest.trees]
[[0, 1, 2], [3, 4, 5]]
>>> sub = sample_sub(np.random.default_rng(0), forest.trees[0])
>>> bool(0.0 < np.exp(sub.log_prob) <= 1.0)
True
"""

from __future__ import annotations

import functools
import math
from collections import deque
from dataclasses import dataclass
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from ..._validation import check_data
from ...models.families import Family
from ...models.measures import Measure
from .device import TreeContext, Unpack, build_tree, empty_pool

__all__ = [
    "Node",
    "TreeModel",
    "HostForest",
    "seq_insert",
    "sequential_tree",
    "sequential_tree_jax",
    "sequential_tree_host",
    "cut_host_tree",
    "logsumexp",
    "sample_index",
    "ibhc",
    "bhc",
    "cut_at",
    "cascade",
    "detach",
    "copy_tree",
    "forest_labels",
    "levels_below",
]

_MIN_BATCH = 4
#: levels below each tree of S whose unions with the inserted tree StocInsert evaluates at once
PREFETCH_LEVELS = 4
#: levels below a node (its children's included) whose unions with the inserted tree SeqInsert
#: evaluates at once, when its memo lacks the node's children (``benchmarks/results/ibhc_prefetch.md``)
SEQ_INSERT_PREFETCH_LEVELS = 8


# ----------------------------------------------------------------------------- batched JAX math
def _pack(stats) -> tuple[np.ndarray, Unpack]:
    """Family statistics with a leading point axis as one float64 ``(n, P)`` array."""
    leaves, treedef = jax.tree.flatten(stats)
    leaves = [np.asarray(x, dtype=np.float64) for x in leaves]
    n = leaves[0].shape[0]
    packed = np.concatenate([x.reshape(n, -1) for x in leaves], axis=1)
    return packed, Unpack(treedef, tuple(x.shape[1:] for x in leaves))


@functools.partial(jax.jit, static_argnums=0)
def _log_marginal_batch(unpack, family, packed):
    """``log P(X_c)`` for a batch of candidate clusters given as packed statistics."""
    return family.log_marginal(unpack(packed))


@jax.jit
def _log_kappa_batch(measure, u, sizes):
    return measure.log_kappa(sizes, u)


def _padded_length(k: int) -> int:
    """Batch length rounded up to a power of two (bounded number of compilations)."""
    return max(_MIN_BATCH, 1 << max(k - 1, 0).bit_length())


def _tree_add(a, b):
    """Statistics of a union (node statistics are packed float64 vectors)."""
    return a + b


def _tree_stack(items: Sequence[Any]):
    """Stack per-node statistics into one batch (leading axis = nodes)."""
    return np.stack(items)


def logsumexp(a: np.ndarray) -> float:
    if len(a) <= 32:  # plain floats: NumPy's per-call overhead dominates short vectors
        vals = [float(x) for x in a]
        m = max(vals)
        if not math.isfinite(m):
            return m
        return m + math.log(math.fsum(math.exp(v - m) for v in vals))
    m = float(np.max(a))
    if not math.isfinite(m):
        return m
    return m + math.log(float(np.sum(np.exp(a - m))))


def sample_index(rng: np.random.Generator, log_p: np.ndarray) -> int:
    """Index drawn with probabilities ``exp(log_p)`` (inverse CDF; zero weights never drawn)."""
    w = np.exp(log_p - np.max(log_p))
    cdf = np.cumsum(w)
    j = int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"))
    return min(j, len(log_p) - 1)


# ----------------------------------------------------------------------------- nodes
@dataclass(eq=False, repr=False)
class Node:
    """One node of a binary tree over a cluster (docs/mathematics.md §4).

    Attributes
    ----------
    index : int
        Unique id within a ``TreeModel``: a leaf's index is its data point's
        row; internal nodes get ``num_points, num_points + 1, ...`` in order of
        creation (the "unique indices" the merge move sorts by, supplement B.3).
    size : int
        Number of leaves ``|c|``.
    stats : pytree of NumPy arrays
        The family's sufficient statistics of ``X_c`` (sum over the leaves).
    log_lik, log_h, log_t : float
        ``log P(X_c)``, ``log φ(X_c|h_c)`` and ``log φ(X_c|t_c)``.
    left, right, parent : Node or None
        Children (both ``None`` for a leaf) and parent (``None`` for a root).
    mask : int
        The leaf set as a bitmask (bit ``i`` set iff point ``i`` is a leaf
        below): the key of ``TreeModel``'s memo of ``log P(X_c)`` and a cheap
        set test for the global moves.
    """

    index: int
    size: int
    stats: Any
    log_lik: float
    log_h: float
    log_t: float
    left: "Node | None" = None
    right: "Node | None" = None
    parent: "Node | None" = None
    mask: int = 0

    @property
    def is_leaf(self) -> bool:
        return self.left is None

    @property
    def log_d(self) -> float:
        """``log d(l(c), r(c))``; ``−inf`` for a leaf (d = 0 by the paper's convention)."""
        if self.is_leaf:
            return -math.inf
        return self.left.log_t + self.right.log_t - self.log_h

    @property
    def log_prob_h(self) -> float:
        """``log P(h_c | X_c, t_c) = log φ(h) − log φ(t) = −log(1 + d)`` (0 for a leaf)."""
        return self.log_h - self.log_t

    def nodes(self) -> list["Node"]:
        """All nodes of the subtree rooted here, in preorder (iterative, any depth)."""
        out, stack = [], [self]
        while stack:
            v = stack.pop()
            out.append(v)
            if not v.is_leaf:
                stack.append(v.right)
                stack.append(v.left)
        return out

    def points(self) -> np.ndarray:
        """Sorted data indices of the leaves below this node."""
        return np.sort(np.array([v.index for v in self.nodes() if v.is_leaf], dtype=np.int64))

    def root(self) -> "Node":
        v = self
        while v.parent is not None:
            v = v.parent
        return v

    def __repr__(self) -> str:
        kind = "Leaf" if self.is_leaf else "Node"
        return f"{kind}(index={self.index}, size={self.size}, log_d={self.log_d:.4g})"


def require_root(node: Node, name: str) -> None:
    if not isinstance(node, Node):
        raise ValueError(f"{name} must be a Node, got {type(node).__name__}.")
    if node.parent is not None:
        raise ValueError(
            f"{name} must be the root of its tree (parent is None); detach it first "
            "(ibhc.detach or ibhc.cut_at)."
        )


def contains(root: Node, node: Node) -> bool:
    v = node
    while v is not None:
        if v is root:
            return True
        v = v.parent
    return False


def _recompute_bottom_up(nodes: Sequence[Node]) -> None:
    """``log_t`` of ``nodes`` (children before parents) from their ``log_h`` and children."""
    for v in nodes:
        if v.is_leaf:
            v.log_t = v.log_h
        else:
            v.log_t = float(np.logaddexp(v.log_h, v.left.log_t + v.right.log_t))


# ----------------------------------------------------------------------------- model
class TreeModel:
    """Data, partition prior and likelihood family behind a forest of host trees.

    :param X: ``(n, D)`` data.
    :param measure: an NRM with ``log_kappa``: ``DP`` (κ(m, u) = α Γ(m) (u+1)^−m) or ``NGGP``.
        ``PitmanYor`` is not an NRM and is rejected.
    :param family: conjugate family (``NormalGamma``, ``NormalWishart``, ...).
    :param u: the auxiliary variable ``u ≥ 0``. Required for ``NGGP``. For ``DP``
        it defaults to 0 (then ``κ(m, 0) = α Γ(m)``: classic BHC); with the DP
        every dissimilarity and probability is independent of ``u`` because
        ``(u+1)^−m`` is multiplicative in ``m``.

    The math is one vectorised NumPy float64 call per batch of candidate
    nodes (``family.host_log_marginal``, ``measure.host_log_kappa``); a family
    without a host form (it defines only ``log_marginal``) falls back to one
    jitted JAX call per batch (lengths padded to powers of two; enable
    ``jax_enable_x64`` for full precision there). The trees are float64.
    """

    def __init__(self, X: Any, measure: Measure, family: Family, u: Any = None):
        if not isinstance(measure, Measure) or not hasattr(measure, "log_kappa"):
            raise ValueError(
                "IBHC needs a normalised random measure with log_kappa (bnp.DP or bnp.NGGP), "
                f"got {type(measure).__name__}."
            )
        if not isinstance(family, Family):
            raise ValueError(
                f"family must be a jaxbnp Family (NormalGamma, NormalWishart, ...), got {family!r}."
            )
        self.measure = measure
        self.family = family
        # NumPy float64 math when the family's formula has a host form (module docstring)
        self._host_math = (
            type(family).log_marginal is Family.log_marginal
            and type(family)._log_marginal is not Family._log_marginal
            and type(family).point_stats is Family.point_stats
            and type(family)._point_stats is not Family._point_stats
        )
        self.u = self._check_u(u)
        self.X = check_data(X, family=family)
        n = self.X.shape[0]
        # per-point statistics packed into one float64 (n, P) array (node statistics
        # are rows of that layout: a union is a vector sum)
        point_stats = (
            family.host_point_stats(self.X) if self._host_math else family.point_stats(self.X)
        )
        self._point_stats, self._unpack = _pack(point_stats)
        # log κ(m, u) for m = 0..n (entry 0 unused), refreshed by set_u
        self._log_kappa_table = self._kappa_table()
        self._leaf_log_lik = self._evaluate_stacked(self._point_stats, np.ones(n))[0]
        self._next_index = n
        # memo of log P(X_c) keyed by the leaf bitmask (independent of u); bounded
        # to about 64 MB of keys, then cleared
        self._lik_memo: dict[int, float] = {}
        self._memo_limit = max(10_000, int(5e8 // max(n, 1)))

    # -- validation -------------------------------------------------------------------
    def _check_u(self, u: Any) -> float:
        if u is None:
            if getattr(self.measure, "has_auxiliary", False):
                raise ValueError(
                    f"{type(self.measure).__name__} needs the auxiliary variable u: pass u > 0 "
                    "(e.g. u=n/alpha or the current value of a sampler)."
                )
            return 0.0
        try:
            value = float(np.asarray(u))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"u must be a non-negative scalar, got {u!r}.") from exc
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"u must be finite and >= 0, got {value}.")
        return value

    @property
    def num_points(self) -> int:
        return int(self.X.shape[0])

    def _kappa_table(self) -> np.ndarray:
        sizes = np.arange(self.num_points + 1, dtype=np.float64)
        sizes[0] = 1.0
        return self.log_kappa(sizes)

    # -- batched evaluation -------------------------------------------------------------
    def stats_of(self, node: "Node"):
        """A node's sufficient statistics as the family's pytree (nodes store them packed)."""
        return self._unpack(node.stats)

    def _evaluate_stacked(self, stats, sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(log P(X_c), log φ(X_c|h_c))`` for packed ``(k, P)`` statistics (NumPy; the JAX
        fallback pads the batch to a power of two)."""
        k = len(sizes)
        if self._host_math:
            log_lik = self.family.host_log_marginal_unchecked(self._unpack(stats))
        else:
            length = _padded_length(k)
            if length > k:
                stats = np.concatenate([stats, np.repeat(stats[:1], length - k, axis=0)])
            log_lik = np.asarray(
                _log_marginal_batch(self._unpack, self.family, stats), dtype=np.float64
            )[:k]
        sizes = np.asarray(sizes).astype(np.int64)
        return log_lik, self._log_kappa_table[sizes] + log_lik

    def _evaluate(self, stats_list: Sequence[Any], sizes: Sequence[int], masks=None):
        """``(log P, log φ(h))`` of a list of per-node statistics (at most one JAX call).

        With ``masks`` (the leaf bitmasks), ``log P`` is looked up in / stored
        into the memo and only the misses are evaluated.
        """
        if len(stats_list) == 0:
            return np.zeros(0), np.zeros(0)
        sizes = np.asarray(sizes, dtype=np.int64)
        if masks is None:
            return self._evaluate_stacked(_tree_stack(stats_list), sizes.astype(np.float64))
        memo = self._lik_memo
        log_lik = np.empty(len(sizes))
        missing = []
        for k, m in enumerate(masks):
            v = memo.get(m)
            if v is None:
                missing.append(k)
            else:
                log_lik[k] = v
        if missing:
            fresh, _ = self._evaluate_stacked(
                _tree_stack([stats_list[k] for k in missing]), sizes[missing].astype(np.float64)
            )
            if len(memo) + len(missing) > self._memo_limit:
                memo.clear()
            for k, v in zip(missing, fresh):
                log_lik[k] = v
                memo[masks[k]] = float(v)
        return log_lik, self._log_kappa_table[sizes] + log_lik

    def _union_potentials(self, s: Node, others: Sequence[Node], prefetch_levels: int = 0):
        """``(log P, log φ(h))`` of ``s ∪ o`` for every ``o`` in ``others`` (memo, then one JAX call).

        When the memo lacks one of them, the unions with the nodes of the ``prefetch_levels``
        levels below ``others`` (:func:`levels_below`) are evaluated in the same call: one
        NumPy call costs about 100 µs whatever its length, and they land in the memo, where
        a descent's next levels find them."""
        masks = [o.mask | s.mask for o in others]
        memo = self._lik_memo
        if all(m in memo for m in masks):
            log_lik = np.array([memo[m] for m in masks])
            sizes = np.array([o.size + s.size for o in others], dtype=np.int64)
            return log_lik, self._log_kappa_table[sizes] + log_lik
        nodes = list(others) + levels_below(others, prefetch_levels)
        log_lik, log_h = self._evaluate(
            [_tree_add(o.stats, s.stats) for o in nodes], [o.size + s.size for o in nodes],
            masks + [o.mask | s.mask for o in nodes[len(masks):]],
        )
        return log_lik[:len(masks)], log_h[:len(masks)]

    def log_kappa(self, sizes: Any) -> np.ndarray:
        """``log κ(m, u)`` for an array of cluster sizes (NumPy float64)."""
        sizes = np.atleast_1d(np.asarray(sizes, dtype=np.float64))
        host = getattr(self.measure, "host_log_kappa", None)
        if host is not None:
            return np.asarray(host(sizes, self.u), dtype=np.float64)
        k = len(sizes)
        padded = np.concatenate([sizes, np.ones(_padded_length(k) - k)])
        return np.asarray(_log_kappa_batch(self.measure, self.u, padded), dtype=np.float64)[:k]

    # -- node construction ----------------------------------------------------------------
    def leaf(self, i: int) -> Node:
        """A new leaf for data point ``i`` (a one-point tree)."""
        i = int(i)
        if not 0 <= i < self.num_points:
            raise ValueError(f"point index {i} out of range [0, {self.num_points}).")
        stats = self._point_stats[i]
        log_h = float(self._log_kappa_table[1] + self._leaf_log_lik[i])
        return Node(i, 1, stats, float(self._leaf_log_lik[i]), log_h, log_h, mask=1 << i)

    def leaves(self) -> list[Node]:
        """One leaf per data point, in row order."""
        return [self.leaf(i) for i in range(self.num_points)]

    def _join(self, a: Node, b: Node, log_lik: float, log_h: float) -> Node:
        node = Node(
            self._next_index,
            a.size + b.size,
            _tree_add(a.stats, b.stats),
            float(log_lik),
            float(log_h),
            float(np.logaddexp(log_h, a.log_t + b.log_t)),
            left=a,
            right=b,
            mask=a.mask | b.mask,
        )
        self._next_index += 1
        a.parent = node
        b.parent = node
        return node

    def merge(self, a: Node, b: Node) -> Node:
        """A new root with children ``a`` (left) and ``b`` (right); both must be roots."""
        require_root(a, "a")
        require_root(b, "b")
        if a is b:
            raise ValueError("cannot merge a tree with itself.")
        log_lik, log_h = self._union_potentials(a, [b])
        return self._join(a, b, log_lik[0], log_h[0])

    def log_dissimilarities(self, a: Node, others: Sequence[Node]) -> np.ndarray:
        """``log d(a, o) = log φ(t_a) + log φ(t_o) − log φ(h_{a∪o})`` for each ``o`` (one JAX call)."""
        if not others:
            return np.zeros(0)
        _, log_h = self._union_potentials(a, others)
        log_t = np.array([o.log_t for o in others])
        return a.log_t + log_t - log_h

    def log_dissimilarity(self, a: Node, b: Node) -> float:
        """``log d(a, b)`` of two trees (the dissimilarity of merging them on top)."""
        return float(self.log_dissimilarities(a, [b])[0])

    def set_u(self, u: Any, trees: Sequence[Node] = ()) -> None:
        """Change ``u`` and refresh ``log_h``/``log_t`` of every node of ``trees``.

        Only ``log κ`` depends on ``u``: no marginal likelihood is recomputed.
        Trees not passed keep potentials for the old ``u``.
        """
        self.u = self._check_u(u)
        self._log_kappa_table = self._kappa_table()
        self.refresh(trees)

    def refresh(self, trees: Sequence[Node]) -> None:
        """Recompute ``log_h``/``log_t`` of every node of ``trees`` under this model's ``log κ``
        (after ``u`` or the measure changed; the stored ``log P(X_c)`` are kept)."""
        nodes = [v for t in trees for v in t.nodes()]
        if not nodes:
            return
        log_kappa = self._log_kappa_table[np.array([v.size for v in nodes], dtype=np.int64)]
        for v, lk in zip(nodes, log_kappa):
            v.log_h = float(lk) + v.log_lik
        for t in trees:
            _recompute_bottom_up(t.nodes()[::-1])


# ----------------------------------------------------------------------------- SeqInsert
def levels_below(roots: Sequence[Node], levels: int) -> list[Node]:
    """The nodes of the ``levels`` levels below ``roots``, breadth first (their children
    first, in the order of ``roots``)."""
    out, level = [], list(roots)
    for _ in range(levels):
        level = [v for t in level if not t.is_leaf for v in (t.left, t.right)]
        out += level
    return out


def seq_insert_path(
    model: TreeModel, root: Node, s: Node, top: tuple[float, float] | None = None
) -> tuple[Node, list[Node]]:
    """SeqInsert; returns the new root and the nodes whose potentials changed (top-down).

    ``top`` optionally gives ``(log P, log φ(h))`` of ``root ∪ s`` when already known.
    The last element of the returned path is the new node joining ``s``.
    """
    require_root(root, "root")
    require_root(s, "s")
    if root is s:
        raise ValueError("cannot insert a tree into itself.")
    c = root
    chain: list[tuple[Node, tuple[float, float]]] = []
    pending = None
    if top is None or not root.is_leaf:
        # the top union and the first level's two in one call (IBHC trees are often
        # cascades, where s stops at the root: then this is the only call)
        first = [root] if root.is_leaf else [root, root.left, root.right]
        log_lik, log_h = model._union_potentials(s, first)
        if top is None:
            top = (float(log_lik[0]), float(log_h[0]))
        pending = None if root.is_leaf else (log_lik[1:], log_h[1:])
    current = top
    while not c.is_leaf:
        l, r = c.left, c.right
        if pending is not None:
            log_lik, log_h = pending
            pending = None
        else:
            # on a memo miss, the levels below the pair in the same call
            log_lik, log_h = model._union_potentials(s, [l, r], SEQ_INSERT_PREFETCH_LEVELS - 1)
        log_d_lr = c.log_d
        log_d_ls = l.log_t + s.log_t - log_h[0]
        log_d_rs = r.log_t + s.log_t - log_h[1]
        if log_d_lr <= min(log_d_ls, log_d_rs):
            break  # case 1: s goes on top of c
        chain.append((c, current))
        if log_d_ls <= log_d_rs:  # case 2: into the left subtree
            c, current = l, (float(log_lik[0]), float(log_h[0]))
        else:  # case 3: into the right subtree
            c, current = r, (float(log_lik[1]), float(log_h[1]))
    parent = c.parent
    c.parent = None
    joined = model._join(c, s, *current)
    if parent is not None:
        if parent.left is c:
            parent.left = joined
        else:
            parent.right = joined
        joined.parent = parent
    for node, (log_lik_new, log_h_new) in reversed(chain):
        node.stats = _tree_add(node.stats, s.stats)
        node.size += s.size
        node.mask |= s.mask
        node.log_lik = log_lik_new
        node.log_h = log_h_new
        node.log_t = float(np.logaddexp(log_h_new, node.left.log_t + node.right.log_t))
    new_root = chain[0][0] if chain else joined
    return new_root, [v for v, _ in chain] + [joined]


def seq_insert(model: TreeModel, root: Node, s: Node) -> Node:
    """SeqInsert(c, s): insert the tree ``s`` into the tree ``root`` and return the new root.

    Paper section 2.3, Step 2 (and supplement A, where ``s`` is a whole tree).
    At an internal node ``c`` with children ``l``, ``r`` the three pairs of
    ``{l, r, s}`` are compared: if ``d(l, r)`` is smallest, ``s`` is put on top
    of ``c`` (case 1, a new node with children ``(c, s)``); if ``d(l, s)`` is
    smallest, the insertion continues in ``l`` (case 2), otherwise in ``r``
    (case 3). At a leaf ``s`` becomes its sibling. Ties go to case 1, then to
    the left. Potentials of the nodes on the path are updated; the tree is
    never split here (splitting is IBHC's Step 3, see ``ibhc``).

    Both trees are modified in place (``s`` becomes a subtree). One batched
    JAX call per level visited.
    """
    return seq_insert_path(model, root, s)[0]


# ----------------------------------------------------------------------------- tree edits
def cut_at(node: Node) -> tuple[list[Node], list[Node]]:
    """Cut a tree at the internal node ``c*``: destroy ``c*`` and all its ancestors.

    Returns ``(S, Q)``: ``S = [l(c*), r(c*)]`` and ``Q`` the subtrees hanging off
    the destroyed ancestors, nearest to ``c*`` first (supplement B.2, Fig. 8;
    this is also the order in which B.5 / eq. 12 re-inserts ``c_2, ..., c_m``
    into a cascaded tree). All returned trees are roots; the destroyed nodes
    must not be used again.
    """
    if not isinstance(node, Node) or node.is_leaf:
        raise ValueError("cut_at needs an internal node (a leaf cannot be split).")
    S = [node.left, node.right]
    Q = []
    child, p = node, node.parent
    while p is not None:
        Q.append(p.right if p.left is child else p.left)
        child, p = p, p.parent
    for t in S + Q:
        t.parent = None
    node.parent = None
    return S, Q


def cascade(model: TreeModel, trees: Sequence[Node]) -> Node:
    """Merge trees into one cascaded tree in order of their ``index`` (supplement B.3, Fig. 9).

    ``[c1, c2, c3]`` becomes ``((c1, c2), c3)``. All prefix unions are evaluated
    in one JAX call.
    """
    if len(trees) == 0:
        raise ValueError("cascade needs at least one tree.")
    for t in trees:
        require_root(t, "every tree")
    if len({id(t) for t in trees}) != len(trees):
        raise ValueError("cascade: the same tree was passed twice.")
    ordered = sorted(trees, key=lambda t: t.index)
    if len(ordered) == 1:
        return ordered[0]
    prefix_stats, sizes, masks = [], [], []
    stats, size, mask = ordered[0].stats, ordered[0].size, ordered[0].mask
    for t in ordered[1:]:
        stats, size, mask = _tree_add(stats, t.stats), size + t.size, mask | t.mask
        prefix_stats.append(stats)
        sizes.append(size)
        masks.append(mask)
    log_lik, log_h = model._evaluate(prefix_stats, sizes, masks)
    tree = ordered[0]
    for k, t in enumerate(ordered[1:]):
        tree = model._join(tree, t, log_lik[k], log_h[k])
    return tree


def detach(model: TreeModel, node: Node) -> Node | None:
    """Remove the subtree ``node`` from its tree; return the root of what remains.

    The sibling of ``node`` takes its parent's place and the ancestors'
    statistics and potentials are recomputed (one JAX call). Returns ``None``
    if ``node`` was the root (nothing remains). ``node`` becomes a root.
    Used by the local moves (supplement C) to move a leaf to another tree.
    """
    if not isinstance(node, Node):
        raise ValueError(f"node must be a Node, got {type(node).__name__}.")
    p = node.parent
    if p is None:
        return None
    sibling = p.right if p.left is node else p.left
    g = p.parent
    node.parent = None
    sibling.parent = g
    if g is None:
        return sibling
    if g.left is p:
        g.left = sibling
    else:
        g.right = sibling
    ancestors = []
    v = g
    while v is not None:
        v.stats = _tree_add(v.left.stats, v.right.stats)
        v.size = v.left.size + v.right.size
        v.mask = v.left.mask | v.right.mask
        ancestors.append(v)
        v = v.parent
    log_lik, log_h = model._evaluate(
        [v.stats for v in ancestors], [v.size for v in ancestors], [v.mask for v in ancestors]
    )
    for v, ll, lh in zip(ancestors, log_lik, log_h):
        v.log_lik, v.log_h = float(ll), float(lh)
    _recompute_bottom_up(ancestors)
    return ancestors[-1]


def copy_tree(root: Node) -> Node:
    """Deep copy of the subtree at ``root`` (statistics arrays are shared: they are never edited in place)."""
    mapping: dict[int, Node] = {}
    for v in root.nodes():
        w = Node(v.index, v.size, v.stats, v.log_lik, v.log_h, v.log_t, mask=v.mask)
        mapping[id(v)] = w
        if v is not root and id(v.parent) in mapping:
            w.parent = mapping[id(v.parent)]
            if v.parent.left is v:
                w.parent.left = w
            else:
                w.parent.right = w
    return mapping[id(root)]


def cut_host_tree(root: Node) -> list[Node]:
    """Clusters of one tree: cut top-down at every node with ``d > 1`` (``P(h) < 1/2``).

    A node with ``d ≤ 1`` (or a leaf) is a cluster; a node with ``d > 1`` is
    destroyed and its children are examined. Returns the cluster trees (roots).
    """
    require_root(root, "root")
    clusters, stack = [], [root]
    while stack:
        v = stack.pop()
        if v.is_leaf or v.log_d <= 0.0:
            v.parent = None
            clusters.append(v)
        else:
            v.left.parent = v.right.parent = None
            stack.append(v.right)
            stack.append(v.left)
    return clusters


def forest_labels(trees: Sequence[Node], num_points: int) -> np.ndarray:
    """Labels ``(num_points,)``: ``labels[i] = k`` for the tree ``trees[k]`` holding point ``i``."""
    labels = np.full(int(num_points), -1, dtype=np.int32)
    for k, t in enumerate(trees):
        pts = t.points()
        if pts.size and (pts.max() >= num_points or np.any(labels[pts] >= 0)):
            raise ValueError(
                "the trees do not partition range(num_points): a point is repeated or out of range."
            )
        labels[pts] = k
    if np.any(labels < 0):
        missing = np.nonzero(labels < 0)[0][:5].tolist()
        raise ValueError(f"the trees do not cover every point (first missing: {missing}).")
    return labels


# ----------------------------------------------------------------------------- IBHC and BHC
@dataclass(repr=False)
class HostForest:
    """One binary tree per cluster, and the partition they define.

    ``trees`` are sorted by their smallest data index, so ``labels`` are in
    order of first appearance; ``labels[i] = k`` iff point ``i`` is a leaf of
    ``trees[k]``. ``num_splits`` counts IBHC Step-3 splits.
    """

    trees: list[Node]
    labels: np.ndarray
    model: TreeModel
    num_splits: int = 0

    def __repr__(self) -> str:
        return (
            f"HostForest(num_trees={len(self.trees)}, num_points={len(self.labels)}, "
            f"num_splits={self.num_splits})"
        )


def _make_forest(model: TreeModel, trees: list[Node], num_splits: int = 0) -> HostForest:
    trees = sorted(trees, key=lambda t: int(t.points()[0]))
    return HostForest(trees, forest_labels(trees, model.num_points), model, num_splits)


def _check_order(order: Any, n: int) -> np.ndarray:
    if order is None:
        return np.arange(n)
    arr = np.asarray(order)
    if arr.shape != (n,) or not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"order must be an integer array of shape ({n},), got {arr.dtype} {arr.shape}.")
    if not np.array_equal(np.sort(arr), np.arange(n)):
        raise ValueError(f"order must be a permutation of range({n}).")
    return arr.astype(np.int64)


def sequential_tree(model: TreeModel, order: Any = None) -> Node:
    """One tree over all points by SeqInsert of each point, in ``order``, without splits."""
    return sequential_tree_host(model, _check_order(order, model.num_points))


def sequential_tree_host(model: TreeModel, points: Any) -> Node:
    """``SeqInsert`` of ``points`` (data indices, in the given order) into one tree, on the host.

    The tree of :func:`sequential_tree_jax` (the same comparisons and ties, in
    float64), with no JAX call: 20 to 40 times slower, but safe where JAX cannot
    be called, e.g. in a callback while every device is busy in one.
    """
    pts = np.asarray(points, dtype=np.int64)
    if pts.size == 0:
        raise ValueError("sequential_tree_host needs at least one point.")
    root = model.leaf(int(pts[0]))
    for i in pts[1:]:
        root = seq_insert(model, root, model.leaf(int(i)))
    return root


@functools.partial(jax.jit, static_argnums=(0,))
def _sequential_tree_arrays(unpack, family, log_kappa_table, points, count):
    """SeqInsert of ``points[0], points[1], ...`` (the first ``count`` rows) into one tree, in JAX.

    ``points`` ``(cap, P)`` are packed per-point statistics. Node ``k < cap`` is
    the leaf of row ``k``; inserting row ``k >= 1`` creates node ``cap + k``. It is
    the array SeqInsert of tgMCMC's device trees (``tgmcmc_device.build_tree``):
    the same comparisons and ties as ``seq_insert`` (case 1, then left).
    Returns ``(left, right, root, log_lik, log_h, log_t)``.
    """
    def lik(rows):
        return family.log_marginal(unpack(rows)).astype(points.dtype)

    ctx = TreeContext(points, log_kappa_table.astype(points.dtype), lik)
    members = jnp.arange(points.shape[0]) < count
    pool, root = build_tree(ctx, empty_pool(ctx), members)
    return pool.left, pool.right, root, pool.log_lik, pool.log_h, pool.log_t


def sequential_tree_jax(model: TreeModel, points: Any) -> Node:
    """``SeqInsert`` of ``points`` (data indices, in the given order) into one tree, built in JAX.

    The same tree as ``seq_insert`` one point at a time on the host (same
    comparisons and ties), in one jitted call: the points are padded to a
    power-of-two capacity of at least 64 (one compilation per capacity). Potentials are
    those of ``model`` (its family, measure and ``u``); with float32 JAX the
    comparisons are made in float32. Returns the root of new host ``Node``s.
    """
    pts = np.asarray(points, dtype=np.int64)
    count = int(pts.size)
    if count == 0:
        raise ValueError("sequential_tree_jax needs at least one point.")
    if count == 1:
        return model.leaf(int(pts[0]))
    cap = max(64, 1 << (count - 1).bit_length())
    packed = model._point_stats[np.concatenate([pts, np.repeat(pts[:1], cap - count)])]
    out = _sequential_tree_arrays(
        model._unpack, model.family, model._log_kappa_table, packed, np.int32(count)
    )
    left, right, root, log_lik, log_h, log_t = (np.asarray(a) for a in out)
    nodes: dict[int, Node] = {}
    stack = [(int(root), False)]
    while stack:  # post-order: children before parents
        j, expanded = stack.pop()
        if j < cap:
            nodes[j] = model.leaf(int(pts[j]))
        elif not expanded:
            stack.append((j, True))
            stack.append((int(right[j]), False))
            stack.append((int(left[j]), False))
        else:
            a, b = nodes[int(left[j])], nodes[int(right[j])]
            node = Node(
                model._next_index, a.size + b.size, a.stats + b.stats, float(log_lik[j]),
                float(log_h[j]), float(log_t[j]), left=a, right=b, mask=a.mask | b.mask,
            )
            model._next_index += 1
            a.parent = b.parent = node
            nodes[j] = node
    return nodes[int(root)]


def ibhc(
    X: Any,
    measure: Measure,
    family: Family,
    u: Any = None,
    *,
    order: Any = None,
    single_tree: bool = False,
    max_splits: int | None = None,
) -> HostForest:
    """Incremental BHC (paper section 2.3, Steps 1-3): a forest, one tree per cluster.

    Points are inserted in ``order`` (default: row order).

    Step 1: point ``i`` goes to the tree ``c`` with the smallest ``d(i, c)``, or
    starts a new tree if that ``d > 1``. Step 2: ``seq_insert``. Step 3: if a
    dissimilarity on the updated path now exceeds 1, the tree is split there
    and the split nodes are re-inserted (Steps 1-3 again, through a queue).

    Step 3 is under-specified in the paper; here the **deepest** path node
    ``v`` with ``d > 1`` is cut with ``cut_at(v)``: ``v`` and all its ancestors
    are destroyed (their statistics contain ``X_v``, which ``d(v) > 1`` says is
    two clusters), and ``l(v)``, ``r(v)`` and the subtrees hanging off the
    destroyed ancestors are re-inserted, nearest first. This keeps every
    internal node of every tree at ``d ≤ 1``, as greedy BHC does. To rule out
    endless split/re-insert cycles at most ``max_splits`` splits are done
    (default ``10 n``); after that trees are no longer split (``num_splits``
    in the result tells).

    ``single_tree=True`` instead inserts every point into one growing tree
    (``sequential_tree``) and cuts it top-down where ``d > 1`` (``cut_host_tree``).

    :returns: ``HostForest`` (trees, labels, the ``TreeModel``, ``num_splits``).
    """
    model = TreeModel(X, measure, family, u)
    n = model.num_points
    order = _check_order(order, n)
    if single_tree:
        return _make_forest(model, cut_host_tree(sequential_tree(model, order)))
    if max_splits is None:
        max_splits = 10 * n
    if int(max_splits) < 0:
        raise ValueError(f"max_splits must be >= 0, got {max_splits}.")
    forest: list[Node] = []
    num_splits = 0
    for i in order:
        queue = deque([model.leaf(i)])
        while queue:
            s = queue.popleft()
            if not forest:
                forest.append(s)
                continue
            log_lik, log_h = model._union_potentials(s, forest)
            log_d = s.log_t + np.array([t.log_t for t in forest]) - log_h
            k = int(np.argmin(log_d))
            if log_d[k] > 0.0:
                forest.append(s)
                continue
            root, path = seq_insert_path(model, forest[k], s, (float(log_lik[k]), float(log_h[k])))
            forest[k] = root
            violating = [v for v in path if v.log_d > 0.0]
            if violating and num_splits < max_splits:
                S, Q = cut_at(violating[-1])
                forest.pop(k)
                queue.extend(S + Q)
                num_splits += 1
    return _make_forest(model, forest, num_splits)


def bhc(X: Any, measure: Measure, family: Family, u: Any = None) -> HostForest:
    """Deterministic greedy BHC: repeatedly merge the pair of trees with the smallest ``d``.

    Merging stops when the smallest dissimilarity exceeds 1 (``P(h) < 1/2``),
    so every internal node has ``d ≤ 1`` and each remaining tree is a cluster
    (paper section 2.3). Ties go to the first pair in index order. Keeps an
    ``O(n²)`` matrix of pair dissimilarities: meant for small data (hundreds
    of points). One JAX call for the initial pairs, then one per merge.
    """
    model = TreeModel(X, measure, family, u)
    n = model.num_points
    slots: list[Node | None] = model.leaves() + [None] * max(n - 1, 0)
    size = len(slots)
    log_d = np.full((size, size), np.inf)
    log_lik = np.zeros((size, size))
    log_h = np.zeros((size, size))

    def score(k: int, others: list[int]) -> None:
        if not others:
            return
        ll, lh = model._union_potentials(slots[k], [slots[j] for j in others])
        for j, a, b in zip(others, ll, lh):
            i, jj = min(j, k), max(j, k)
            log_lik[i, jj], log_h[i, jj] = a, b
            log_d[i, jj] = slots[i].log_t + slots[jj].log_t - b

    if n > 1:
        ii, jj = np.triu_indices(n, 1)
        ll, lh = model._evaluate(
            [_tree_add(slots[i].stats, slots[j].stats) for i, j in zip(ii, jj)], [2] * len(ii)
        )
        log_lik[ii, jj], log_h[ii, jj] = ll, lh
        log_d[ii, jj] = np.array([slots[i].log_t + slots[j].log_t for i, j in zip(ii, jj)]) - lh
    active = set(range(n))
    next_slot = n
    while len(active) > 1:
        flat = int(np.argmin(log_d))
        i, j = divmod(flat, size)
        if log_d[i, j] > 0.0:
            break
        slots[next_slot] = model._join(slots[i], slots[j], log_lik[i, j], log_h[i, j])
        for a in (i, j):
            log_d[a, :] = np.inf
            log_d[:, a] = np.inf
            active.discard(a)
        score(next_slot, sorted(active))
        active.add(next_slot)
        next_slot += 1
    return _make_forest(model, [slots[a] for a in active])
