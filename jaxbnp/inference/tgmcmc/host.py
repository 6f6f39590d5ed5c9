"""tgMCMC's reference global moves on host trees (NumPy, float64): :class:`TreeGuidedHost`.

The canonical trees of one chain live in NumPy ``Node`` objects
(:mod:`jaxbnp.inference.tgmcmc.ibhc`), one host per chain in a :class:`HostTrees` store that the kernel owns; :func:`host_global_moves` is the body of the ``io_callback`` that
``TreeGuidedMCMC(trees="host")`` runs once per iteration. Exactness, the canonical
trees and early rejection are described in :mod:`jaxbnp.inference.tgmcmc.kernel`
(docs/mathematics.md §4).
"""

from __future__ import annotations

import math
import threading
import zlib
from collections import OrderedDict
from typing import Any, Callable, NamedTuple, Sequence

import jax
import numpy as np

from ...models.families import Family
from ...models.measures import DP, NGGP
from .ibhc import (
    Node,
    TreeModel,
    copy_tree,
    cut_at,
    ibhc,
    logsumexp,
    sample_index,
    seq_insert,
    sequential_tree_host,
    sequential_tree_jax,
)
from .proposals import sample_sub_distribution, stoc_insert, stoc_insert_log_prob

__all__ = [
    "TreeGuidedHost",
    "GlobalMoveInfo",
    "mask_of",
    "points_of",
    "masks_from_labels",
    "labels_from_masks",
    "host_global_moves",
    "host_init_labels",
    "inside_pmap",
    "HostTrees",
]


# ----------------------------------------------------------------------------- leaf sets
def mask_of(points: Any, n: int) -> int:
    """The bitmask (Python int) of a set of point indices in ``range(n)``."""
    flags = np.zeros(n, dtype=bool)
    flags[np.asarray(points, dtype=np.int64)] = True
    return int.from_bytes(np.packbits(flags, bitorder="little").tobytes(), "little")


def points_of(mask: int, n: int) -> np.ndarray:
    """Sorted point indices of a bitmask."""
    raw = np.frombuffer(mask.to_bytes((n + 7) // 8, "little"), dtype=np.uint8)
    return np.nonzero(np.unpackbits(raw, bitorder="little")[:n])[0]


def masks_from_labels(labels: np.ndarray) -> list[int]:
    """Cluster bitmasks in order of first appearance of the labels."""
    labels = np.asarray(labels)
    n = labels.shape[0]
    _, first = np.unique(labels, return_index=True)
    return [mask_of(np.nonzero(labels == labels[i])[0], n) for i in np.sort(first)]


def labels_from_masks(masks: Sequence[int], n: int) -> np.ndarray:
    """Canonical labels (order of first appearance) of a list of cluster bitmasks."""
    labels = np.empty(n, dtype=np.int32)
    for k, m in enumerate(masks):
        labels[points_of(m, n)] = k
    _, first, inverse = np.unique(labels, return_index=True, return_inverse=True)
    rank = np.empty(len(first), dtype=np.int32)
    rank[np.argsort(first)] = np.arange(len(first), dtype=np.int32)
    return rank[inverse].astype(np.int32)


def _log_merge_prob(log_d: np.ndarray) -> np.ndarray:
    """``log 1/(1 + d)``: the probability of putting a cluster into ``M``."""
    return -np.logaddexp(0.0, log_d)


def _log_keep_prob(log_d: np.ndarray) -> np.ndarray:
    """``log d/(1 + d)``: the probability of leaving it out."""
    return -np.logaddexp(0.0, -log_d)


def _log_pick_alone(num_clusters: int, log_d: np.ndarray) -> float:
    """``log`` probability of picking a cluster first (``1/K``) and leaving every other
    cluster out of ``M`` (dissimilarities ``log_d`` to them): the split branch (B.2)."""
    return -math.log(num_clusters) + float(np.sum(_log_keep_prob(log_d)))


def _param_key(obj: Any) -> tuple:
    leaves = jax.tree.leaves(obj)
    return (type(obj).__name__,) + tuple(np.asarray(x, dtype=np.float64).tobytes() for x in leaves)


class GlobalMoveInfo(NamedTuple):
    """What one global move did: ``kind`` is ``"split"``, ``"merge"`` or ``"none"``
    (a one-point cluster with nothing to merge: no proposal); ``log_ratio`` is
    ``log r`` (NaN for ``"none"``), or an upper bound of it when ``exact`` is
    ``False`` (the move was rejected early: ``TreeGuidedHost.global_move``)."""

    kind: str
    log_ratio: float
    accepted: bool
    log_q_forward: float
    log_q_reverse: float
    exact: bool = True


# ----------------------------------------------------------------------------- host state
class TreeGuidedHost:
    """Canonical trees of one chain and the global moves on them (NumPy, float64).

    :param X: ``(n, D)`` data.
    :param measure: ``DP`` or ``NGGP``.
    :param family: the conjugate family.
    :param u: the auxiliary variable (NGGP); ignored for DP, whose
        dissimilarities and acceptance ratios do not depend on it.
    :param cache_size: how many canonical trees are kept (least recently used
        ones are dropped and rebuilt when needed again).

    The tree shapes are built under the parameters given here; later
    ``set_params`` calls change the potentials only (module docstring).
    """

    def __init__(self, X: Any, measure, family: Family, u: Any = None, cache_size: int = 4096):
        if not isinstance(measure, (DP, NGGP)):
            raise ValueError(
                "tree-guided MCMC needs a normalised random measure with log_kappa: bnp.DP or "
                f"bnp.NGGP, got {type(measure).__name__} (use CollapsedGibbs or SplitMerge)."
            )
        self._uses_u = bool(measure.has_auxiliary)
        u0 = float(np.asarray(u)) if (self._uses_u and u is not None) else (1.0 if self._uses_u else 0.0)
        self.struct = TreeModel(X, measure, family, u0)
        self.model = self.struct
        self.n = self.struct.num_points
        self._family_key = _param_key(family)
        self._params_key = (_param_key(measure), self._family_key, u0)
        self._version = 0
        self._cache: OrderedDict[int, list] = OrderedDict()
        self._pair_memo: dict = {}
        self._cache_size = int(cache_size)
        # canonical trees by the jitted builder; False: by the host builder (same trees in
        # float64), for callbacks running on every device at once (chain_method="parallel"),
        # where a JAX call from the callback waits on a device that is itself in a callback
        self.jit_trees = True

    # -- parameters -----------------------------------------------------------------------
    def set_params(self, measure, family: Family, u: Any = None) -> None:
        """Evaluate potentials under new measure / family / ``u`` (tree shapes unchanged)."""
        u_eff = float(np.asarray(u)) if self._uses_u else 0.0
        family_key = _param_key(family)
        key = (_param_key(measure), family_key, u_eff)
        if key == self._params_key:
            return
        if self.model is self.struct or family_key != self._params_key[1]:
            model = TreeModel(self.struct.X, measure, family, u_eff)
            if family_key == self._family_key:
                model._lik_memo = self.struct._lik_memo
            self.model = model
        else:
            self.model.measure = measure
            self.model.set_u(u_eff)
        self._params_key = key
        self._version += 1

    # -- canonical trees ------------------------------------------------------------------
    def tree(self, mask: int) -> Node:
        """The canonical tree of a cluster (do not edit it: copy it first)."""
        entry = self._cache.get(mask)
        if entry is None:
            pts = points_of(mask, self.n)
            if pts.size == 0:
                raise ValueError("empty cluster")
            build = sequential_tree_jax if self.jit_trees else sequential_tree_host
            entry = [build(self.struct, pts), 0]
            self._cache[mask] = entry
            if len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(mask)
        if entry[1] != self._version:
            if self.model is not self.struct:
                if self.model._lik_memo is not self.struct._lik_memo:
                    self._relikelihood(entry[0])
                self.model.refresh([entry[0]])
            entry[1] = self._version
        return entry[0]

    def _relikelihood(self, root: Node) -> None:
        nodes = root.nodes()
        log_lik, _ = self.model._evaluate(
            [v.stats for v in nodes], [v.size for v in nodes], [v.mask for v in nodes]
        )
        for v, ll in zip(nodes, log_lik):
            v.log_lik = float(ll)

    def cluster_log_h(self, mask: int) -> float:
        """``log φ(X_c | h_c) = log κ(|c|, u) + log P(X_c)`` of one cluster (NumPy float64;
        ``log P`` from the leaf-set memo, or from the summed point statistics; no tree built)."""
        model = self.model
        log_lik = model._lik_memo.get(mask)
        size = mask.bit_count()
        if log_lik is None:
            pts = points_of(mask, self.n)
            log_lik = float(model._evaluate([model._point_stats[pts].sum(axis=0)], [size], [mask])[0][0])
        return float(model._log_kappa_table[size] + log_lik)

    def log_joint_terms(self, masks: Sequence[int]) -> float:
        """``Σ_c log φ(X_c | h_c) = Σ_c log κ(|c|, u) + log P(X_c)`` (the partition-dependent part)."""
        return float(sum(self.cluster_log_h(m) for m in masks))

    def _log_joint_change(self, masks: Sequence[int], proposal: Sequence[int]) -> float:
        """``log_joint_terms(proposal) - log_joint_terms(masks)`` over the clusters that change."""
        old, new = set(masks), set(proposal)
        return (sum(self.cluster_log_h(m) for m in proposal if m not in old)
                - sum(self.cluster_log_h(m) for m in masks if m not in new))

    # -- proposal probabilities -----------------------------------------------------------
    def _log_d(self, trees: Sequence[Node], i: int) -> np.ndarray:
        """``log d(t_i, t_j)`` for every ``j != i`` (pairs memoised per parameter version)."""
        memo = self._pair_memo
        if memo.get("version") != self._version or len(memo) > 200_000:
            memo.clear()
            memo["version"] = self._version
        a = trees[i]
        out = np.empty(len(trees) - 1)
        missing = []
        for k, t in enumerate(trees[:i] + trees[i + 1:]):
            v = memo.get((a.mask, t.mask))
            if v is None:
                missing.append((k, t))
            else:
                out[k] = v
        if missing:
            fresh = self.model.log_dissimilarities(a, [t for _, t in missing])
            for (k, t), v in zip(missing, fresh):
                out[k] = v
                memo[(a.mask, t.mask)] = memo[(t.mask, a.mask)] = float(v)
        return out

    def log_split_prob(self, tree: Node, parts: Sequence[int], known: tuple[int, float] | None = None) -> float:
        """``log`` probability that SampleSub + cut + StocInsert on ``tree`` yields ``parts``.

        Summed over every internal node ``c*`` that can produce the partition
        ``parts`` (bitmasks) of the tree's leaves; for each the insertions are
        forced (a cut-off subtree joins the tree of its part, or starts it).
        ``known = (j, log p)``: the term of node ``j`` (its index in SampleSub's
        node list) is already known (the path the proposal took): not recomputed.
        """
        nodes, log_p = sample_sub_distribution(tree, internal_only=True)

        def part(mask: int) -> int:
            for k, p in enumerate(parts):
                if mask & ~p == 0:
                    return k
            return -1

        part_of = {id(v): part(v.mask) for v in nodes}
        ok_above = {id(tree): True}  # every subtree hanging off the ancestors lies in one part
        terms = []
        for j, v in enumerate(nodes):
            if v.is_leaf:
                continue
            above = ok_above[id(v)]
            ok_above[id(v.left)] = above and part_of[id(v.right)] >= 0
            ok_above[id(v.right)] = above and part_of[id(v.left)] >= 0
            pl, pr = part_of[id(v.left)], part_of[id(v.right)]
            if not above or pl < 0 or pr < 0 or pl == pr or not math.isfinite(log_p[j]):
                continue
            if known is not None and known[0] == j:
                terms.append(known[1])
            else:
                terms.append(float(log_p[j]) + self._forced_inserts(tree, j, part))
        return logsumexp(np.array(terms)) if terms else -math.inf

    def _forced_inserts(self, tree: Node, j: int, part: Callable[[int], int]) -> float:
        node = copy_tree(tree).nodes()[j]
        S, Q = cut_at(node)
        S_parts = [part(S[0].mask), part(S[1].mask)]
        log_p = 0.0
        for q in Q:
            k = part(q.mask)
            choice = S_parts.index(k) if k in S_parts else None
            log_p += stoc_insert_log_prob(self.model, S, q, choice)
            if choice is None:
                S.append(q)
                S_parts.append(k)
            else:
                S[choice] = seq_insert(self.model, S[choice], q)
        return log_p

    def log_q(self, masks: Sequence[int], to_masks: Sequence[int],
              known: tuple[int, float] | None = None) -> float:
        """``log q(Π* | Π)`` of the global move, ``-inf`` if ``Π*`` is not one split or merge away.

        ``known``: for a split, the term of one cut node already computed (``log_split_prob``).
        """
        masks, to_masks = list(masks), list(to_masks)
        old, new = set(masks), set(to_masks)
        removed = [m for m in masks if m not in new]
        added = [m for m in to_masks if m not in old]
        K = len(masks)
        trees = [self.tree(m) for m in masks]
        if len(removed) == 1 and len(added) >= 2 and _union(added) == removed[0]:
            c = masks.index(removed[0])
            select = _log_pick_alone(K, self._log_d(trees, c))
            return select + self.log_split_prob(trees[c], added, known)
        if len(added) == 1 and len(removed) >= 2 and _union(removed) == added[0]:
            picked = {masks.index(m) for m in removed}
            terms = []
            for i in sorted(picked):
                log_d = self._log_d(trees, i)
                in_m = np.array([j in picked for j in range(K) if j != i])
                terms.append(
                    -math.log(K)
                    + float(np.sum(np.where(in_m, _log_merge_prob(log_d), _log_keep_prob(log_d))))
                )
            return logsumexp(np.array(terms))
        return -math.inf

    def log_stay_prob(self, masks: Sequence[int]) -> float:
        """``log`` probability that a global move proposes nothing (a one-point cluster picked, ``M`` empty)."""
        trees = [self.tree(m) for m in masks]
        K = len(masks)
        terms = [
            _log_pick_alone(K, self._log_d(trees, i))
            for i, t in enumerate(trees)
            if t.is_leaf
        ]
        return logsumexp(np.array(terms)) if terms else -math.inf

    # -- one global move ------------------------------------------------------------------
    def propose(self, rng: np.random.Generator, masks: Sequence[int]) -> tuple[list[int] | None, str]:
        """Draw ``Π*`` (supplement B.1-B.3); ``None`` when nothing is proposed."""
        proposal, kind, _ = self._propose(rng, masks)
        return proposal, kind

    def _propose(self, rng: np.random.Generator, masks: Sequence[int]):
        """``propose``, plus for a split the path taken: ``(j, log p, log s)`` with ``j`` the
        cut node's index in SampleSub's node list, ``p`` the probability of ``j`` and of every
        StocInsert choice made (one term of ``log_split_prob``) and ``s`` that of selecting
        the cluster with ``M`` empty."""
        masks = list(masks)
        K = len(masks)
        trees = [self.tree(m) for m in masks]
        c = int(rng.integers(K))
        log_d = self._log_d(trees, c)
        others = [j for j in range(K) if j != c]
        into_m = np.log(rng.random(len(others))) < _log_merge_prob(log_d)
        if into_m.any():
            merged = [c] + [others[k] for k in np.nonzero(into_m)[0]]
            rest = [m for j, m in enumerate(masks) if j not in set(merged)]
            return rest + [_union(masks[j] for j in merged)], "merge", None
        tree = trees[c]
        if tree.is_leaf:
            return None, "none", None
        nodes, log_p = sample_sub_distribution(tree, internal_only=True)
        j = sample_index(rng, log_p)
        S, Q = cut_at(copy_tree(tree).nodes()[j])
        log_path = float(log_p[j])
        for q in Q:
            result = stoc_insert(self.model, rng, S, q)
            S = result.trees
            log_path += result.log_prob
        log_select = _log_pick_alone(K, log_d)
        rest = [m for i, m in enumerate(masks) if i != c]
        return rest + [t.mask for t in S], "split", (j, log_path, log_select)

    def log_ratio(self, masks: Sequence[int], proposal: Sequence[int],
                  known: tuple[int, float] | None = None) -> tuple[float, float, float]:
        """``(log r, log q(Π*|Π), log q(Π|Π*))`` of moving from ``masks`` to ``proposal``
        (``known``: a split's path term from ``_propose``, see ``log_split_prob``)."""
        log_q_fwd = self.log_q(masks, proposal, known)
        log_q_rev = self.log_q(proposal, masks)
        log_joint = self._log_joint_change(masks, proposal)
        return log_joint + log_q_rev - log_q_fwd, log_q_fwd, log_q_rev

    def global_move(self, rng: np.random.Generator, masks: Sequence[int],
                    early_rejection: bool = True) -> tuple[list[int], GlobalMoveInfo]:
        """One MH global move; returns the new cluster masks and a :class:`GlobalMoveInfo`.

        With ``early_rejection`` the move is rejected as soon as a cheap upper bound
        of ``log r`` falls below ``log U``: ``log q(Π|Π*) ≤ 0``, and for a split
        ``q(Π*|Π)`` is at least the probability of the path the proposal took, so
        ``log r ≤ Δ log p − log(path)`` (split) or ``Δ log p − log q(Π*|Π)`` (merge).
        The decision, and so the chain, is the same as without it (same uniform
        draw); only the reverse probability and a split's other cut nodes are not
        computed. ``GlobalMoveInfo.log_ratio`` is then that upper bound and
        ``exact`` is ``False``.
        """
        masks = list(masks)
        proposal, kind, known = self._propose(rng, masks)
        if proposal is None:
            return masks, GlobalMoveInfo(kind, math.nan, False, math.nan, math.nan)
        log_u = math.log(rng.random())
        if early_rejection:
            log_joint = self._log_joint_change(masks, proposal)
            log_q_fwd = known[2] + known[1] if kind == "split" else self.log_q(masks, proposal)
            bound = log_joint - log_q_fwd
            if not log_u < bound:
                q_fwd = math.nan if kind == "split" else float(log_q_fwd)
                return masks, GlobalMoveInfo(kind, float(bound), False, q_fwd, math.nan, False)
        log_ratio, log_q_fwd, log_q_rev = self.log_ratio(masks, proposal, known and known[:2])
        accepted = bool(log_u < log_ratio)
        info = GlobalMoveInfo(kind, float(log_ratio), accepted, float(log_q_fwd), float(log_q_rev))
        return (proposal if accepted else masks), info

    def run(self, rng: np.random.Generator, labels: np.ndarray, num_moves: int,
            early_rejection: bool = True):
        """``num_moves`` global moves from ``labels``; returns labels and per-move infos."""
        masks = masks_from_labels(labels)
        infos = []
        for _ in range(int(num_moves)):
            masks, info = self.global_move(rng, masks, early_rejection)
            infos.append(info)
        return labels_from_masks(masks, self.n), infos

    # -- initial partitions ---------------------------------------------------------------
    def noisy_labels(self, rng: np.random.Generator) -> np.ndarray:
        """The paper's noisy initialisation (section 4.1): points in a random order, each
        put *on top of* the tree with the smallest dissimilarity (or a new tree if that exceeds 1)."""
        model = self.model
        trees: list[Node] = []
        for i in rng.permutation(self.n):
            leaf = model.leaf(int(i))
            if trees:
                log_d = model.log_dissimilarities(leaf, trees)
                k = int(np.argmin(log_d))
                if log_d[k] <= 0.0:
                    trees[k] = model.merge(trees[k], leaf)
                    continue
            trees.append(leaf)
        return labels_from_masks([t.mask for t in trees], self.n)

    def ibhc_labels(self) -> np.ndarray:
        """The partition of IBHC (points in row order)."""
        forest = ibhc(self.struct.X, self.model.measure, self.model.family, self.model.u
                      if self._uses_u else None)
        return np.asarray(forest.labels, dtype=np.int32)


def _union(masks) -> int:
    out = 0
    for m in masks:
        out |= m
    return out


# ----------------------------------------------------------------------------- host stores
def _fingerprint(X: np.ndarray) -> tuple:
    X = np.ascontiguousarray(X, dtype=np.float64)
    return X.shape, zlib.crc32(X.tobytes())


class HostTrees:
    """The host trees of one kernel's chains: a :class:`TreeGuidedHost` per chain id (and data
    set), created on first use with that call's parameters.

    Owned by the kernel that reads it (``TreeGuidedMCMC`` makes one and empties it when a run
    starts; the callbacks of its programs hold a reference to it): nothing is kept at module
    level. Thread-safe: under ``chain_method="parallel"`` the chains' callbacks run on several
    threads at once (each chain has its own host; the store is locked). At most
    ``max_hosts`` hosts are kept, the least recently used dropped first (they are rebuilt
    when needed: a host's trees are a function of its point sets and start parameters).
    """

    def __init__(self, max_hosts: int = 256):
        self._hosts: OrderedDict[tuple, TreeGuidedHost] = OrderedDict()
        self._lock = threading.Lock()
        self._max_hosts = int(max_hosts)

    def __len__(self) -> int:
        return len(self._hosts)

    def host_for(self, chain_id: int, X: np.ndarray, measure, family, u) -> TreeGuidedHost:
        """The host of chain ``chain_id`` on ``X``, with its parameters set to these."""
        key = (int(chain_id),) + _fingerprint(X)
        with self._lock:
            host = self._hosts.get(key)
            if host is not None:
                self._hosts.move_to_end(key)
        if host is None:
            fresh = TreeGuidedHost(np.asarray(X, dtype=np.float64), measure, family, u)
            with self._lock:
                host = self._hosts.setdefault(key, fresh)
                while len(self._hosts) > self._max_hosts:
                    self._hosts.popitem(last=False)
        host.set_params(measure, family, u)
        return host

    def clear(self) -> None:
        """Drop every host (a new run starts from fresh trees)."""
        with self._lock:
            self._hosts.clear()


def inside_pmap() -> bool:
    """Whether the kernel is being traced inside ``pmap`` (NumPyro's ``chain_method="parallel"``)."""
    try:
        from jax._src import core as jax_core

        return bool(jax_core.unsafe_get_axis_names())
    except Exception:  # pragma: no cover - a JAX without this internal: assume parallel (safe)
        return True


def _seed(key_data: np.ndarray) -> np.random.Generator:
    return np.random.default_rng(np.asarray(key_data, dtype=np.uint32).ravel().tolist())



def host_global_moves(store: HostTrees, num_moves, early_rejection, jit_trees, chain_id, key_data,
                      X, labels, measure, family, u):
    """``num_moves`` global moves of one chain on its host trees (the body of the kernel's
    ``io_callback``). Returns ``(labels, num_accepted, num_proposed, sum_log_accept,
    num_log_accept)``: the sum of ``min(0, log r)`` over the proposals with ``r > 0``
    (in the data's dtype) and their number."""
    host = store.host_for(chain_id, X, measure, family, u)
    host.jit_trees = jit_trees
    new_labels, infos = host.run(_seed(key_data), np.asarray(labels), num_moves, early_rejection)
    proposed = [i for i in infos if i.kind != "none"]
    accepted = sum(i.accepted for i in proposed)
    # a merge whose reverse split is impossible has r = 0: counted as proposed, not averaged
    log_accept = [min(0.0, i.log_ratio) for i in proposed if math.isfinite(i.log_ratio)]
    sum_log_accept = float(np.sum(log_accept)) if log_accept else 0.0
    return (
        new_labels.astype(np.int32),
        np.int32(accepted),
        np.int32(len(proposed)),
        np.asarray(sum_log_accept, np.asarray(X).dtype),
        np.int32(len(log_accept)),
    )


def host_init_labels(store: HostTrees | None, method, chain_id, key_data, X, measure, family, u):
    """Initial labels of one chain on the host: ``"ibhc"`` or ``"noisy"`` (paper, section 4.1),
    in ``0..K-1``. ``store``: where the chain's host is kept (``None``: a host for this call
    alone; the labels are the same)."""
    if store is None:
        host = TreeGuidedHost(np.asarray(X, dtype=np.float64), measure, family, u)
    else:
        host = store.host_for(chain_id, X, measure, family, u)
    if method == "ibhc":
        return host.ibhc_labels()
    return host.noisy_labels(_seed(key_data))
