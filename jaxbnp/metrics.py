"""Clustering metrics and posterior summaries of partitions (host side, NumPy).

Comparing partitions:

* :func:`variation_of_information` (Meilă 2007) and :func:`binder_loss`
  (Binder 1978, unit costs): distances between two partitions;
* :func:`nmi`, :func:`ari` (thin wrappers of scikit-learn's scores) and
  :func:`purity` against known classes.

Summarising posterior draws of a partition (Wade & Ghahramani 2018):

* :func:`posterior_similarity`: the co-clustering matrix
  ``P[i, j] = Pr(z_i = z_j | X)`` estimated from the draws;
* :func:`expected_loss`: the posterior expected VI or Binder loss of a
  partition, exact with respect to the draws;
* :func:`point_estimate`: the partition minimising it, searched over the
  draws and then refined greedily by moving single points;
* :func:`credible_ball`: the credible ball around an estimate and its
  horizontal and vertical bounds;
* :func:`num_clusters_summary`: mean, spread, HPD interval and frequencies
  of the number of clusters.

Label draws are integer arrays of shape ``(num_draws, n)`` or
``(num_chains, num_draws, n)`` (chains are pooled); labels are only
identified up to renaming, and every function here is invariant to it.

Example
-------
>>> import numpy as np
>>> from jaxbnp import metrics
>>> draws = np.array([[0, 0, 1, 1], [0, 0, 1, 1], [0, 0, 0, 1]])
>>> float(metrics.posterior_similarity(draws)[0, 2])
0.3333333333333333
>>> metrics.point_estimate(draws).tolist()
[0, 0, 1, 1]
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

__all__ = [
    "variation_of_information",
    "binder_loss",
    "posterior_similarity",
    "expected_loss",
    "point_estimate",
    "credible_ball",
    "CredibleBall",
    "count_clusters",
    "num_clusters_summary",
    "nmi",
    "ari",
    "purity",
    "f_measure",
    "extend_paths",
    "level_scores",
]

_LOSSES = ("vi", "binder")


# ----------------------------------------------------------------------------- input checks
def _as_labels(labels: Any, name: str = "labels") -> np.ndarray:
    """One partition as compact int64 labels ``0..K-1`` (ids sorted by value)."""
    arr = np.asarray(labels)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be a 1-D array of cluster ids, got shape {arr.shape}.")
    if arr.size == 0:
        raise ValueError(f"{name} is empty; pass one cluster id per point.")
    arr = _check_integer(arr, name)
    return np.unique(arr, return_inverse=True)[1].reshape(-1).astype(np.int64)


def _check_integer(arr: np.ndarray, name: str) -> np.ndarray:
    if np.issubdtype(arr.dtype, np.integer) or arr.dtype == np.bool_:
        return arr.astype(np.int64)
    if np.issubdtype(arr.dtype, np.floating):
        if not np.all(np.isfinite(arr)) or np.any(np.round(arr) != arr):
            raise ValueError(f"{name} must hold integer cluster ids, got non-integer values.")
        return arr.astype(np.int64)
    raise ValueError(f"{name} must hold integer cluster ids, got dtype {arr.dtype}.")


def _as_draws(labels_draws: Any, name: str = "labels_draws") -> np.ndarray:
    """Label draws as ``(S, n)`` int64, each row relabelled to ``0..K_s-1``."""
    arr = np.asarray(labels_draws)
    if arr.ndim == 3:  # (chains, draws, n): pool the chains
        arr = arr.reshape(-1, arr.shape[-1])
    if arr.ndim != 2:
        raise ValueError(
            f"{name} must have shape (num_draws, n) or (num_chains, num_draws, n), got {arr.shape}."
        )
    if arr.shape[0] == 0 or arr.shape[1] == 0:
        raise ValueError(f"{name} is empty (shape {arr.shape}); pass at least one draw of one point.")
    arr = _check_integer(arr, name)
    s, n = arr.shape
    # compact every row at once: unique over (row, label) pairs, then subtract each row's start
    offset = arr - arr.min()
    width = int(offset.max()) + 1
    codes = np.arange(s, dtype=np.int64)[:, None] * width + offset
    _, inverse = np.unique(codes, return_inverse=True)
    inverse = inverse.reshape(s, n)
    return inverse - inverse.min(axis=1, keepdims=True)


def _check_loss(loss: str) -> str:
    if loss not in _LOSSES:
        raise ValueError(f"loss must be 'vi' or 'binder', got {loss!r}.")
    return loss


def _xlogx(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=float)
    return np.where(x > 0, x * np.log(np.where(x > 0, x, 1.0)), 0.0)


def _contingency(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Counts ``n_kj`` of the pairs (compact labels)."""
    ka, kb = int(a.max()) + 1, int(b.max()) + 1
    return np.bincount(a * kb + b, minlength=ka * kb).reshape(ka, kb)


# ----------------------------------------------------------------------------- two partitions
def variation_of_information(a: Any, b: Any, base: float = 2.0) -> float:
    """Variation of information ``VI(a, b) = H(a) + H(b) − 2 I(a, b)`` (Meilă 2007).

    A metric on partitions: 0 iff ``a`` and ``b`` are the same partition, at
    most ``log(n)``. In bits by default (``base=2``, as in Wade & Ghahramani
    2018); ``base=np.e`` gives nats.

    >>> round(variation_of_information([0, 0, 1, 1], [0, 0, 0, 0]), 12)
    1.0
    """
    a, b = _as_labels(a, "a"), _as_labels(b, "b")
    if a.shape != b.shape:
        raise ValueError(f"a and b must label the same points, got lengths {a.size} and {b.size}.")
    n = a.size
    table = _contingency(a, b)
    value = (
        _xlogx(table.sum(1)).sum() + _xlogx(table.sum(0)).sum() - 2.0 * _xlogx(table).sum()
    ) / n
    return float(max(value, 0.0) / np.log(base))


def binder_loss(a: Any, b: Any, normalize: bool = False) -> float:
    """Binder's loss with unit costs: the number of pairs ``i < j`` that one partition
    puts together and the other apart.

    ``normalize=True`` divides by the number of pairs ``n (n − 1) / 2`` (one
    minus the Rand index).

    >>> binder_loss([0, 0, 1, 1], [0, 0, 0, 0])
    4.0
    """
    a, b = _as_labels(a, "a"), _as_labels(b, "b")
    if a.shape != b.shape:
        raise ValueError(f"a and b must label the same points, got lengths {a.size} and {b.size}.")
    table = _contingency(a, b).astype(float)
    pairs = lambda c: float(np.sum(c * (c - 1.0)) / 2.0)  # noqa: E731
    value = pairs(table.sum(1)) + pairs(table.sum(0)) - 2.0 * pairs(table)
    if normalize:
        n = a.size
        value = value / (n * (n - 1) / 2.0) if n > 1 else 0.0
    return float(value)


# ----------------------------------------------------------------------------- draws
def posterior_similarity(labels_draws: Any, chunk_size: int = 256) -> np.ndarray:
    """Posterior similarity (co-clustering) matrix ``P[i, j] = Pr(z_i = z_j | X)`` from draws.

    :param labels_draws: ``(num_draws, n)`` or ``(num_chains, num_draws, n)`` labels.
    :param chunk_size: draws per matrix product (memory ``n × Σ_s K_s`` per chunk).
    :returns: ``(n, n)`` float array, ones on the diagonal.

    Computed as ``(1/S) Σ_s A_s A_sᵀ`` with ``A_s`` the ``n × K_s`` one-hot
    membership matrix of draw ``s`` (exact in float64).
    """
    draws = _as_draws(labels_draws)
    s, n = draws.shape
    psm = np.zeros((n, n))
    rows = np.arange(n)
    for start in range(0, s, max(int(chunk_size), 1)):
        block = draws[start:start + chunk_size]
        sizes = block.max(axis=1) + 1
        offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        onehot = np.zeros((n, int(sizes.sum())))
        for d in range(block.shape[0]):
            onehot[rows, offsets[d] + block[d]] = 1.0
        psm += onehot @ onehot.T
    return psm / s


def _xlogx_table(n: int) -> np.ndarray:
    """``f(m) = m log m`` for the integers ``m = 0..n+1`` (counts index it directly)."""
    return _xlogx(np.arange(n + 2))


def _joint_xlogx_sums(candidate: np.ndarray, draws: np.ndarray, f: np.ndarray) -> np.ndarray:
    """``Σ_kj f(n_kj)`` of the contingency table of ``candidate`` with every draw, ``(S,)``."""
    s, n = draws.shape
    width = int(draws.max()) + 1
    block = (int(candidate.max()) + 1) * width
    codes = (np.arange(s, dtype=np.int64)[:, None] * (int(candidate.max()) + 1) + candidate) * width + draws
    if s * block <= 1 << 24:  # dense tables: one linear pass
        tables = np.bincount(codes.ravel(), minlength=s * block).reshape(s, block)
        return f[tables].sum(1)
    values, counts = np.unique(codes, return_counts=True)  # sparse tables: sort
    return np.bincount(values // block, weights=f[counts], minlength=s)


def _size_xlogx_sums(draws: np.ndarray, f: np.ndarray) -> np.ndarray:
    """``Σ_j f(m_sj)`` of every draw's cluster sizes, ``(S,)``."""
    s, n = draws.shape
    width = int(draws.max()) + 1
    counts = np.bincount((np.arange(s)[:, None] * width + draws).ravel(), minlength=s * width)
    return f[counts.reshape(s, width)].sum(1)


def _expected_vi(candidate: np.ndarray, draws: np.ndarray, draw_terms: float, f: np.ndarray) -> float:
    n = candidate.size
    own = f[np.bincount(candidate)].sum()
    joint = _joint_xlogx_sums(candidate, draws, f).mean()
    return float((own + draw_terms - 2.0 * joint) / n / np.log(2.0))


def _expected_binder(candidate: np.ndarray, psm: np.ndarray, q: np.ndarray | None = None) -> float:
    """``Σ_{i<j} p_ij + Σ_{i<j, same cluster} (1 − 2 p_ij)``, by cluster sums of ``q = 1 − 2P``."""
    n = candidate.size
    q = 1.0 - 2.0 * psm if q is None else q
    onehot = np.zeros((n, int(candidate.max()) + 1))
    onehot[np.arange(n), candidate] = 1.0
    within = np.einsum("ik,ik->", q @ onehot, onehot) - n * (1.0 - 2.0)  # diagonal: q_ii = -1
    return float(((psm.sum() - n) + within) / 2.0)


def expected_loss(estimate: Any, labels_draws: Any, loss: str = "vi") -> float:
    """Posterior expected loss ``(1/S) Σ_s L(estimate, z_s)`` of a partition.

    ``loss="vi"``: variation of information in bits (exact: every draw's
    contingency table with ``estimate``). ``loss="binder"``: Binder's loss
    (pairs, unit costs), which depends on the draws only through
    :func:`posterior_similarity`.
    """
    _check_loss(loss)
    draws = _as_draws(labels_draws)
    est = _as_labels(estimate, "estimate")
    if est.size != draws.shape[1]:
        raise ValueError(f"estimate labels {est.size} points but the draws label {draws.shape[1]}.")
    if loss == "vi":
        f = _xlogx_table(draws.shape[1])
        return _expected_vi(est, draws, _size_xlogx_sums(draws, f).mean(), f)
    return _expected_binder(est, posterior_similarity(draws))


def _unique_rows(draws: np.ndarray) -> np.ndarray:
    """Distinct partitions among compact draws, in order of first appearance."""
    canon = np.array([_first_appearance(row) for row in draws])
    _, first = np.unique(canon, axis=0, return_index=True)
    return canon[np.sort(first)]


def _first_appearance(labels: np.ndarray) -> np.ndarray:
    _, first, inverse = np.unique(labels, return_index=True, return_inverse=True)
    return np.argsort(np.argsort(first))[inverse.reshape(-1)]


def point_estimate(
    labels_draws: Any,
    loss: str = "vi",
    max_candidates: int | None = 200,
    refine: bool = True,
    max_sweeps: int = 100,
) -> np.ndarray:
    """The partition minimising the posterior expected loss (Wade & Ghahramani 2018).

    1. Search: the expected loss of every distinct draw (at most
       ``max_candidates`` of them, evenly spaced over the distinct draws;
       ``None`` takes all) and keep the best.
    2. Refine (``refine=True``): sweep over the points, moving each to the
       existing or new cluster that lowers the expected loss most, until a
       sweep moves nothing (a local minimum for single-point moves; the
       result is never worse than the best draw).

    The expected loss is exact with respect to the draws: for VI the greedy
    moves update every draw's contingency table (``O(S K)`` per point), for
    Binder the cluster sums of ``1 − 2 P`` (``O(n)`` per move).

    :param labels_draws: ``(num_draws, n)`` or ``(num_chains, num_draws, n)`` labels.
    :param loss: ``"vi"`` (variation of information) or ``"binder"``.
    :returns: ``(n,)`` int64 labels ``0..K-1`` in order of first appearance.

    >>> point_estimate([[0, 0, 1], [0, 0, 1], [0, 1, 2]]).tolist()
    [0, 0, 1]
    """
    _check_loss(loss)
    draws = _as_draws(labels_draws)
    if max_candidates is not None and int(max_candidates) < 1:
        raise ValueError(f"max_candidates must be >= 1 or None, got {max_candidates}.")
    if int(max_sweeps) < 1:
        raise ValueError(f"max_sweeps must be >= 1, got {max_sweeps}.")
    candidates = _unique_rows(draws)
    if max_candidates is not None and len(candidates) > int(max_candidates):
        keep = np.unique(np.linspace(0, len(candidates) - 1, int(max_candidates)).round().astype(int))
        candidates = candidates[keep]
    if loss == "vi":
        f = _xlogx_table(draws.shape[1])
        draw_terms = _size_xlogx_sums(draws, f).mean()
        scores = [_expected_vi(c, draws, draw_terms, f) for c in candidates]
    else:
        psm = posterior_similarity(draws)
        q = 1.0 - 2.0 * psm
        scores = [_expected_binder(c, psm, q) for c in candidates]
    best = candidates[int(np.argmin(scores))].copy()
    if refine:
        if loss == "vi":
            best = _refine_vi(best, draws, int(max_sweeps))
        else:
            best = _refine_binder(best, psm, int(max_sweeps))
    return _first_appearance(best).astype(np.int64)


def _refine_vi(labels: np.ndarray, draws: np.ndarray, max_sweeps: int) -> np.ndarray:
    """Greedy single-point moves lowering the exact expected VI.

    Keeps every draw's contingency table with the estimate, ``n[s, k, j]``:
    moving point ``i`` from ``a`` to ``b`` changes ``n Σ VI`` by
    ``Δf(size_b) + Δf(size_a) − 2 mean_s[Δf(n[s, b, z_si]) + Δf(n[s, a, z_si])]``.
    """
    s, n = draws.shape
    f = _xlogx_table(n)
    labels = labels.copy()
    width = int(draws.max()) + 1
    capacity = int(labels.max()) + 2  # always one empty slot for a new cluster
    table = np.zeros((s, capacity, width), dtype=np.int64)
    np.add.at(table, (np.repeat(np.arange(s), n), np.tile(labels, s), draws.ravel()), 1)
    sizes = np.bincount(labels, minlength=capacity)
    rows = np.arange(s)
    tol = 1e-12 * n
    for _ in range(max_sweeps):
        moved = False
        for i in range(n):
            old = labels[i]
            j = draws[:, i]
            column = table[rows, :, j]  # (S, capacity): n[s, k, z_si]
            gain = (f[sizes + 1] - f[sizes]) - 2.0 * (f[column + 1] - f[column]).mean(0)
            c_old = column[:, old]
            loss = (f[sizes[old] - 1] - f[sizes[old]]) - 2.0 * (f[c_old - 1] - f[c_old]).mean()
            delta = gain + loss
            delta[old] = 0.0
            empty = np.flatnonzero(sizes == 0)
            delta[empty[1:]] = np.inf  # empty slots are all the same move: keep the first
            if sizes[old] == 1:  # a singleton moving to an empty slot changes nothing
                delta[empty] = np.inf
            new = int(np.argmin(delta))
            if delta[new] < -tol:
                moved = True
                table[rows, old, j] -= 1
                table[rows, new, j] += 1
                sizes[old] -= 1
                sizes[new] += 1
                labels[i] = new
                if not np.any(sizes == 0):  # keep a free slot
                    table = np.concatenate([table, np.zeros((s, 1, width), np.int64)], axis=1)
                    sizes = np.append(sizes, 0)
        if not moved:
            break
    return labels


def _refine_binder(labels: np.ndarray, psm: np.ndarray, max_sweeps: int) -> np.ndarray:
    """Greedy single-point moves lowering the expected Binder loss.

    Moving ``i`` from cluster ``a`` to ``b`` changes the loss by
    ``Σ_{j in b} q_ij − Σ_{j in a, j != i} q_ij`` with ``q = 1 − 2P``.
    """
    n = labels.size
    labels = labels.copy()
    q = 1.0 - 2.0 * psm
    capacity = int(labels.max()) + 2  # always one empty slot for a new cluster
    onehot = np.zeros((n, capacity))
    onehot[np.arange(n), labels] = 1.0
    sums = q @ onehot  # sums[i, k] = Σ_{j in k} q_ij (j = i included when i is in k)
    sizes = onehot.sum(0)
    del onehot
    tol = 1e-12 * n
    for _ in range(max_sweeps):
        moved = False
        for i in range(n):
            old = labels[i]
            delta = sums[i] - (sums[i, old] - q[i, i])  # empty slots: sums = 0, a new cluster
            delta[old] = 0.0
            empty = np.flatnonzero(sizes == 0)
            delta[empty[1:]] = np.inf
            new = int(np.argmin(delta))
            if delta[new] < -tol:
                moved = True
                sums[:, old] -= q[:, i]
                sums[:, new] += q[:, i]
                sizes[old] -= 1
                sizes[new] += 1
                labels[i] = new
                if not np.any(sizes == 0):
                    sums = np.concatenate([sums, np.zeros((n, 1))], axis=1)
                    sizes = np.append(sizes, 0.0)
        if not moved:
            break
    return labels


# ----------------------------------------------------------------------------- uncertainty
class CredibleBall(NamedTuple):
    """Credible ball around a point estimate (Wade & Ghahramani 2018, §3.2).

    radius: smallest ``ε`` with ``Pr(d(z, estimate) <= ε | X) >= level`` (from the draws).
    horizontal: the draws in the ball farthest from the estimate, ``(m, n)`` distinct partitions.
    upper_vertical: the draws in the ball with the fewest clusters, farthest among those.
    lower_vertical: the draws in the ball with the most clusters, farthest among those.
    *_distance: their distance to the estimate.
    loss: the distance used (``"vi"`` or ``"binder"``).
    """

    radius: float
    horizontal: np.ndarray
    upper_vertical: np.ndarray
    lower_vertical: np.ndarray
    horizontal_distance: float
    upper_vertical_distance: float
    lower_vertical_distance: float
    loss: str


def credible_ball(
    labels_draws: Any, estimate: Any, level: float = 0.95, loss: str = "vi"
) -> CredibleBall:
    """Credible ball of a partition estimate and its bounds (Wade & Ghahramani 2018).

    The ball ``{z : d(z, estimate) <= ε}`` with the smallest ``ε`` holding at
    least ``level`` of the draws; ``d`` is VI (bits) or Binder's loss. The
    horizontal bound is the draws in the ball farthest from the estimate; the
    upper (lower) vertical bound is the draws in the ball with the fewest
    (most) clusters, farthest among those.

    >>> ball = credible_ball([[0, 0, 1], [0, 0, 1], [0, 1, 1]], [0, 0, 1], level=0.6)
    >>> ball.radius
    0.0
    """
    _check_loss(loss)
    if not 0.0 < float(level) <= 1.0:
        raise ValueError(f"level must lie in (0, 1], got {level}.")
    draws = _as_draws(labels_draws)
    est = _as_labels(estimate, "estimate")
    if est.size != draws.shape[1]:
        raise ValueError(f"estimate labels {est.size} points but the draws label {draws.shape[1]}.")
    distance = variation_of_information if loss == "vi" else binder_loss
    uniq = _unique_rows(draws)
    canon = np.array([_first_appearance(row) for row in draws])
    index = {tuple(row): i for i, row in enumerate(uniq.tolist())}
    which = np.array([index[tuple(row)] for row in canon.tolist()])
    dist_unique = np.array([distance(est, row) for row in uniq])
    dist = dist_unique[which]
    s = len(dist)
    radius = float(np.sort(dist)[int(np.ceil(float(level) * s)) - 1])
    inside = np.flatnonzero(dist_unique <= radius + 1e-12)
    k_unique = uniq.max(axis=1) + 1

    def farthest(members):
        far = dist_unique[members].max()
        chosen = members[np.abs(dist_unique[members] - far) <= 1e-12]
        return uniq[chosen].astype(np.int64), float(far)

    horizontal, d_h = farthest(inside)
    fewest = inside[k_unique[inside] == k_unique[inside].min()]
    most = inside[k_unique[inside] == k_unique[inside].max()]
    upper, d_u = farthest(fewest)
    lower, d_l = farthest(most)
    return CredibleBall(radius, horizontal, upper, lower, d_h, d_u, d_l, loss)


def count_clusters(labels_draws: Any) -> np.ndarray:
    """Number of clusters of each draw: ``(S,)``, or ``(C, S)`` for ``(C, S, n)`` input."""
    arr = np.asarray(labels_draws)
    draws = _as_draws(arr)
    k = draws.max(axis=1) + 1
    return k.reshape(arr.shape[:-1])


def num_clusters_summary(num_clusters: Any, level: float = 0.95) -> dict:
    """Posterior summary of the number of clusters ``K`` from its draws (any shape).

    Returns a dict: ``mean``, ``sd``, ``median``, ``mode``, ``hpd`` (the
    shortest integer interval ``(lo, hi)`` holding at least ``level`` of the
    draws), ``quantiles`` (``(1 − level)/2`` and ``(1 + level)/2``),
    ``frequencies`` (``{k: fraction}``) and ``num_draws``.
    Pass :func:`count_clusters` of label draws when you have labels.

    >>> num_clusters_summary([2, 2, 3, 2])["hpd"]
    (2, 3)
    """
    k = np.asarray(num_clusters).reshape(-1)
    if k.size == 0:
        raise ValueError("num_clusters is empty; pass the number of clusters of each draw.")
    k = _check_integer(k, "num_clusters")
    if not 0.0 < float(level) <= 1.0:
        raise ValueError(f"level must lie in (0, 1], got {level}.")
    values, counts = np.unique(k, return_counts=True)
    freq = counts / k.size
    need = int(np.ceil(float(level) * k.size - 1e-9))
    cum = np.concatenate([[0], np.cumsum(counts)])
    best, best_key = (int(values[0]), int(values[-1])), (np.inf, 0)
    for lo in range(len(values)):  # shortest run of observed values holding `need`; ties: more mass
        hi = int(np.searchsorted(cum, cum[lo] + need, side="left")) - 1
        if hi < len(values) and cum[hi + 1] - cum[lo] >= need:
            key = (values[hi] - values[lo], -(cum[hi + 1] - cum[lo]))
            if key < best_key:
                best, best_key = (int(values[lo]), int(values[hi])), key
    q = np.quantile(k, [(1.0 - float(level)) / 2.0, (1.0 + float(level)) / 2.0])
    return {
        "mean": float(k.mean()),
        "sd": float(k.std()),
        "median": float(np.median(k)),
        "mode": int(values[np.argmax(counts)]),
        "hpd": best,
        "quantiles": (float(q[0]), float(q[1])),
        "frequencies": {int(v): float(f) for v, f in zip(values, freq)},
        "num_draws": int(k.size),
    }


# ----------------------------------------------------------------------------- known classes
def _sklearn_metrics():
    try:
        from sklearn import metrics as sk_metrics
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            'NMI and ARI use scikit-learn: pip install "jaxbnp[plot]" (or scikit-learn).'
        ) from exc
    return sk_metrics


def nmi(labels_true: Any, labels_pred: Any) -> float:
    """Normalised mutual information (scikit-learn's ``normalized_mutual_info_score``,
    arithmetic normalisation)."""
    a, b = _as_labels(labels_true, "labels_true"), _as_labels(labels_pred, "labels_pred")
    if a.shape != b.shape:
        raise ValueError(f"the two labelings have lengths {a.size} and {b.size}.")
    return float(_sklearn_metrics().normalized_mutual_info_score(a, b))


def ari(labels_true: Any, labels_pred: Any) -> float:
    """Adjusted Rand index (scikit-learn's ``adjusted_rand_score``)."""
    a, b = _as_labels(labels_true, "labels_true"), _as_labels(labels_pred, "labels_pred")
    if a.shape != b.shape:
        raise ValueError(f"the two labelings have lengths {a.size} and {b.size}.")
    return float(_sklearn_metrics().adjusted_rand_score(a, b))


def purity(labels_true: Any, labels_pred: Any) -> float:
    """Purity: the fraction of points in the majority true class of their cluster.

    >>> purity([0, 0, 1, 1], [0, 0, 0, 1])
    0.75
    """
    a, b = _as_labels(labels_true, "labels_true"), _as_labels(labels_pred, "labels_pred")
    if a.shape != b.shape:
        raise ValueError(f"the two labelings have lengths {a.size} and {b.size}.")
    return float(_contingency(b, a).max(axis=1).sum() / a.size)


# ----------------------------------------------------------------------------- per-level scores (BHMC)
def f_measure(labels_true: Any, labels_pred: Any) -> float:
    """F-measure of a clustering against classes (Steinbach, Karypis & Kumar 2000; BHMC paper ref. [13]).

    ``F = Σ_i (n_i / n) max_j F(i, j)``, ``F(i, j) = 2 P R / (P + R)`` with
    ``P = n_ij / n_j`` (precision of cluster ``j`` for class ``i``) and
    ``R = n_ij / n_i`` (recall); computed from scikit-learn's contingency matrix.

    >>> f_measure([0, 0, 1, 1], [0, 0, 1, 1])
    1.0
    """
    a, b = _as_labels(labels_true, "labels_true"), _as_labels(labels_pred, "labels_pred")
    if a.shape != b.shape:
        raise ValueError(f"the two labelings have lengths {a.size} and {b.size}.")
    table = _sklearn_metrics().cluster.contingency_matrix(a, b).astype(float)  # classes x clusters
    n_class = table.sum(axis=1, keepdims=True)
    n_clust = table.sum(axis=0, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        f = np.where(table > 0, 2.0 * table / (n_class + n_clust), 0.0)  # = 2PR/(P+R)
    return float(np.sum(n_class[:, 0] / a.size * f.max(axis=1)))


def extend_paths(paths: Any, depth: int) -> np.ndarray:
    """Paths ``(N, L)`` extended (or cut) to ``depth`` levels by the BHMC paper's rule (§5).

    A point whose path is shorter than ``depth`` keeps its last label at the
    remaining levels. Shorter paths are marked by negative entries (``−1``)
    after their end. Returns ``(N, depth)``.

    >>> extend_paths([[3, 5], [4, -1]], 3).tolist()
    [[3, 5, 5], [4, 4, 4]]
    """
    arr = _check_integer(np.asarray(paths), "paths")
    if arr.ndim != 2 or arr.shape[1] < 1:
        raise ValueError(f"paths must be a 2-D array (num_points, num_levels), got shape {arr.shape}.")
    if int(depth) < 1:
        raise ValueError(f"depth must be >= 1, got {depth}.")
    if np.any(arr[:, 0] < 0):
        raise ValueError("every path needs a label at its first level.")
    out = np.empty((arr.shape[0], int(depth)), np.int64)
    last = arr[:, 0].copy()
    for level in range(int(depth)):
        if level < arr.shape[1]:
            col = arr[:, level]
            last = np.where(col >= 0, col, last)
        out[:, level] = last
    return out


def level_scores(true_paths: Any, pred_paths: Any, level: int) -> dict:
    """Purity, NMI, ARI and F-measure at one level (``1`` = the first level below the root).

    ``true_paths`` and ``pred_paths`` are ``(N, L)`` label arrays (one column
    per level, labels need only be unique within a column; ``−1`` after the
    end of a shorter path); both are extended to ``level`` levels by the
    paper's rule (:func:`extend_paths`) so every point counts at every level.
    Returns ``{"purity", "nmi", "ari", "f_measure", "num_clusters"}``.
    Labels are made unique per path prefix, so equal ids under different
    parents are different clusters.
    """
    level = int(level)
    if level < 1:
        raise ValueError(f"level must be >= 1, got {level}.")
    t, p = extend_paths(true_paths, level), extend_paths(pred_paths, level)
    if t.shape[0] != p.shape[0]:
        raise ValueError(f"true_paths has {t.shape[0]} points but pred_paths has {p.shape[0]}.")

    def prefix_labels(a):
        return np.unique(a, axis=0, return_inverse=True)[1].reshape(-1)

    yt, yp = prefix_labels(t), prefix_labels(p)
    return {
        "purity": purity(yt, yp),
        "nmi": nmi(yt, yp),
        "ari": ari(yt, yp),
        "f_measure": f_measure(yt, yp),
        "num_clusters": int(len(np.unique(yp))),
    }
