"""tgMCMC's randomised tree operations (Lee & Choi, supplement B-C), on the host trees of
:mod:`jaxbnp.inference.tgmcmc.ibhc`: SampleSub, which picks a subtree to cut, and
StocInsert, which puts a tree back into a forest at random, each with the log probability
of a given outcome (the Hastings ratios of the global and local moves).
"""

from __future__ import annotations

from typing import Any, NamedTuple, Sequence

import numpy as np

from .ibhc import (
    PREFETCH_LEVELS,
    Node,
    TreeModel,
    contains,
    logsumexp,
    require_root,
    sample_index,
    seq_insert_path,
)

__all__ = [
    "SampleSubResult",
    "StocInsertResult",
    "sample_sub_distribution",
    "sample_sub",
    "sample_sub_log_prob",
    "stoc_insert",
    "stoc_insert_log_prob",
]


# ----------------------------------------------------------------------------- SampleSub
class SampleSubResult(NamedTuple):
    """The drawn subtree and ``log`` of the probability of drawing it."""

    node: Node
    log_prob: float


def sample_sub_distribution(root: Node, internal_only: bool) -> tuple[list[Node], np.ndarray]:
    if not isinstance(root, Node):
        raise ValueError(f"root must be a Node, got {type(root).__name__}.")
    nodes = root.nodes()
    internal = np.array([not v.is_leaf for v in nodes])
    if not internal.any():
        if internal_only:
            raise ValueError(
                "SampleSub with internal_only=True needs a tree with an internal node (this is a leaf)."
            )
        return nodes, np.zeros(1)
    log_d = np.array([v.log_d for v in nodes])  # −inf (d = 0) for leaves
    log_eps = float(np.max(log_d[internal]))  # ε = max d over the internal nodes
    log_w = np.logaddexp(log_d, log_eps)  # log(d + ε); leaves: log ε
    if internal_only:
        log_w = np.where(internal, log_w, -np.inf)
    return nodes, log_w - logsumexp(log_w)


def sample_sub(
    rng: Any, root: Node, *, internal_only: bool = False
) -> SampleSubResult:
    """SampleSub(c): draw a subtree ``t_c'`` of ``t_c`` with probability ``∝ d(l(c'), r(c')) + ε``.

    Supplement A, Fig. 6: a categorical over **all** nodes of the tree rooted
    at ``root`` (``root`` may be any node, e.g. a previous draw, as in the
    local moves); ``ε`` is the largest ``d`` among the tree's internal nodes
    and leaves have ``d = 0``, so a leaf's weight is ``ε``. A one-leaf tree
    returns that leaf with probability 1.

    ``internal_only=True`` (the split move, paper footnote 1) restricts the
    draw to internal nodes, weights ``d + ε`` with the same ``ε``, renormalised
    (the paper does not say whether ``ε`` is kept there; it is).

    :param rng: ``numpy.random.Generator`` or seed.
    :returns: ``SampleSubResult(node, log_prob)``; ``log_prob`` equals
        ``sample_sub_log_prob(root, node, internal_only=...)``.
    """
    rng = np.random.default_rng(rng)
    nodes, log_p = sample_sub_distribution(root, internal_only)
    j = sample_index(rng, log_p)
    return SampleSubResult(nodes[j], float(log_p[j]))


def sample_sub_log_prob(root: Node, target: Node, *, internal_only: bool = False) -> float:
    """``log`` probability that ``sample_sub`` on ``root`` draws ``target``.

    The reverse-move form SampleSub(c, c', p) of supplement A.

    ``−inf`` for a leaf when ``internal_only``. Raises ``ValueError`` if
    ``target`` is not in the tree rooted at ``root``.
    """
    if not isinstance(target, Node) or not contains(root, target):
        raise ValueError("target is not a node of the tree rooted at root.")
    nodes, log_p = sample_sub_distribution(root, internal_only)
    for v, lp in zip(nodes, log_p):
        if v is target:
            return float(lp)
    raise AssertionError("unreachable")  # pragma: no cover


# ----------------------------------------------------------------------------- StocInsert
class StocInsertResult(NamedTuple):
    """Outcome of ``stoc_insert``.

    ``trees``: the new list of trees (the chosen entry replaced by its new
    root, or ``c`` appended); ``choice``: index into the input ``trees`` or
    ``None`` for "new tree"; ``log_prob``: ``log`` of the probability of that
    choice.
    """

    trees: list[Node]
    choice: int | None
    log_prob: float


def _stoc_insert_log_probs(model: TreeModel, trees: Sequence[Node], c: Node):
    require_root(c, "c")
    for t in trees:
        require_root(t, "every tree in S")
        if t is c:
            raise ValueError("c is already one of the trees in S.")
    if len({id(t) for t in trees}) != len(trees):
        raise ValueError("S contains the same tree twice.")
    # the unions with the nodes of each tree's top levels too, in the same call: they land
    # in the memo, where the levels of the SeqInsert that follows find them (a descent that
    # goes deeper evaluates the rest)
    log_lik, log_h = model._union_potentials(c, list(trees), PREFETCH_LEVELS)
    log_d = c.log_t + np.array([t.log_t for t in trees], dtype=np.float64) - log_h
    log_w = np.concatenate([-log_d, [0.0]])  # d^-1(c', c) for each c' ∈ S, then 1 for "new"
    return log_w - logsumexp(log_w), log_lik, log_h


def stoc_insert(model: TreeModel, rng: Any, trees: Sequence[Node], c: Node) -> StocInsertResult:
    """StocInsert(S, c): insert tree ``c`` into one of the trees of ``S``, or keep it apart.

    Paper section 3.1 and supplement A, Fig. 7: ``c`` goes into ``c' ∈ S`` (by
    ``seq_insert``) with probability ``d⁻¹(c', c) / (1 + Σ_{c''∈S} d⁻¹(c'', c))``,
    and becomes a new tree of ``S`` with probability ``1 / (1 + Σ d⁻¹)``.
    Trees are never split after the insertion, even if a dissimilarity
    exceeds 1 (needed for reversibility).

    The chosen tree is modified in place. One JAX call for the choice plus
    ``seq_insert``'s.

    :param rng: ``numpy.random.Generator`` or seed.
    :returns: ``StocInsertResult(trees, choice, log_prob)``; ``log_prob`` equals
        ``stoc_insert_log_prob(model, trees, c, choice)`` evaluated before the insertion.
    """
    rng = np.random.default_rng(rng)
    log_p, log_lik, log_h = _stoc_insert_log_probs(model, trees, c)
    j = sample_index(rng, log_p)
    out = list(trees)
    if j == len(trees):
        out.append(c)
        return StocInsertResult(out, None, float(log_p[j]))
    out[j] = seq_insert_path(model, out[j], c, (float(log_lik[j]), float(log_h[j])))[0]
    return StocInsertResult(out, j, float(log_p[j]))


def stoc_insert_log_prob(
    model: TreeModel, trees: Sequence[Node], c: Node, choice: int | None
) -> float:
    """``log`` probability that StocInsert(S, c) makes ``choice`` (StocInsert(S, c, c', p)).

    ``choice`` is an index into ``trees`` or ``None`` for "``c`` starts a new
    tree" (StocInsert(S, c, ∅, p)). Nothing is modified.
    """
    if choice is not None:
        if isinstance(choice, bool) or not isinstance(choice, (int, np.integer)):
            raise ValueError(f"choice must be an index into the trees or None, got {choice!r}.")
        if not 0 <= int(choice) < len(trees):
            raise ValueError(f"choice {choice} is out of range for {len(trees)} trees.")
    log_p = _stoc_insert_log_probs(model, trees, c)[0]
    return float(log_p[len(trees) if choice is None else int(choice)])
