"""scikit-learn style estimators.

``MAPDP``: MAP-DP clustering (MATH.md §3), ``fit`` / ``fit_predict`` /
``predict`` / ``score_samples`` / ``score``.

Example
-------
>>> import numpy as np
>>> from jaxbnp.estimators import MAPDP
>>> X = np.r_[np.random.default_rng(0).normal(-4, 1, (50, 2)), np.random.default_rng(1).normal(4, 1, (50, 2))]
>>> MAPDP(alpha=1.0).fit(X).n_clusters_
2
"""

from __future__ import annotations

import warnings
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from ._validation import check_data
from .inference import mapdp as mapdp_core
from .inference.clusters import ClusterState, CapacityError
from .models.families import Family, NormalGamma
from .models.measures import DP, Measure, PitmanYor

__all__ = ["MAPDP", "select_alpha", "SingleClusterWarning"]


class SingleClusterWarning(UserWarning):
    """MAP-DP without split moves ended with every point in one cluster."""


class MAPDP:
    """MAP-DP clustering (Raykov et al. 2014), MATH.md §3.

    :param alpha: DP concentration; ignored when ``measure`` is given.
    :param family: a conjugate family; ``None`` means ``NormalGamma.from_data(X)``
        (per-dimension mean, ``k0 = 0.1``, ``a0 = 2``, ``b0`` = per-dimension
        variance, so the prior mean variance equals the data variance).
    :param measure: ``DP(alpha)`` or ``PitmanYor(alpha, d)`` (MAP-PY);
        ``None`` means ``DP(alpha)``.
    :param n_restarts: random point orders tried; the lowest NLL wins.
    :param mode: ``"sequential"`` (the paper's algorithm) or ``"batched"``
        (blocks scored at once, never increasing the NLL: see
        ``jaxbnp.inference.mapdp``).
    :param tol: stop when a sweep lowers the NLL by less than this.
    :param max_iter: maximum number of sweeps.
    :param random_state: seed for the restarts' orders.
    :param capacity: cluster slots; ``None`` starts at ``min(n, 32)`` and
        doubles (refitting) whenever it runs out.
    :param block_size: points per block in batched mode.
    :param split_moves: after the sweeps converge, propose splitting every
        cluster in two and keep splits that lower the NLL, then sweep again
        (``jaxbnp.inference.mapdp``). The NLL still never increases. Off by
        default so that ``mode="sequential"`` is the paper's algorithm
        exactly; turn it on for large data, where starting from one cluster
        MAP-DP usually stays in one cluster.

    Fitted attributes: ``labels_``, ``n_clusters_``, ``nll_`` (``−log p(X, Π)``),
    ``n_iter_``, ``nll_trace_``, ``family_``, ``measure_``, ``cluster_sizes_``.
    """

    def __init__(
        self,
        alpha: float = 1.0,
        family: Family | None = None,
        measure: Measure | None = None,
        n_restarts: int = 1,
        mode: str = "sequential",
        tol: float = 1e-6,
        max_iter: int = 1000,
        random_state: int | None = None,
        capacity: int | None = None,
        block_size: int = 4096,
        split_moves: bool = False,
    ):
        self.alpha = alpha
        self.family = family
        self.measure = measure
        self.n_restarts = n_restarts
        self.mode = mode
        self.tol = tol
        self.max_iter = max_iter
        self.random_state = random_state
        self.capacity = capacity
        self.block_size = block_size
        self.split_moves = split_moves

    # scikit-learn protocol
    def get_params(self, deep: bool = True) -> dict:
        return {k: getattr(self, k) for k in (
            "alpha", "family", "measure", "n_restarts", "mode", "tol", "max_iter",
            "random_state", "capacity", "block_size", "split_moves")}

    def set_params(self, **params: Any) -> "MAPDP":
        for k, v in params.items():
            if k not in self.get_params():
                raise ValueError(f"MAPDP has no parameter {k!r}.")
            setattr(self, k, v)
        return self

    def _check_options(self):
        if self.mode not in ("sequential", "batched"):
            raise ValueError(f"mode must be 'sequential' or 'batched', got {self.mode!r}.")
        if int(self.n_restarts) < 1:
            raise ValueError(f"n_restarts must be >= 1, got {self.n_restarts}.")
        if int(self.max_iter) < 1:
            raise ValueError(f"max_iter must be >= 1, got {self.max_iter}.")
        if not self.tol >= 0:
            raise ValueError(f"tol must be >= 0, got {self.tol}.")
        if int(self.block_size) < 1:
            raise ValueError(f"block_size must be >= 1, got {self.block_size}.")
        measure = self.measure if self.measure is not None else DP(self.alpha)
        if not isinstance(measure, (DP, PitmanYor)):
            raise ValueError(
                f"MAPDP supports DP and PitmanYor measures, got {type(measure).__name__}."
            )
        return measure

    def fit(self, X: Any, y: Any = None) -> "MAPDP":
        measure = self._check_options()
        X = check_data(X)
        family = self.family if self.family is not None else NormalGamma.from_data(X)
        X = check_data(X, family=family)
        Xj = jnp.asarray(X, dtype=jnp.result_type(float))
        n = X.shape[0]
        capacity = int(self.capacity) if self.capacity is not None else min(n, 32)
        key = jax.random.key(0 if self.random_state is None else int(self.random_state))
        while True:
            best, runs = mapdp_core.fit(
                key, Xj, measure, family, capacity, mode=self.mode,
                n_restarts=int(self.n_restarts), tol=float(self.tol),
                max_iter=int(self.max_iter), block_size=int(self.block_size),
                split_moves=bool(self.split_moves),
            )
            if not bool(jnp.any(runs.clusters.overflow)):
                break
            if capacity >= n:  # pragma: no cover - n slots can always hold n clusters
                raise CapacityError("MAP-DP needed more than n clusters.")
            capacity = min(2 * capacity, n)
        clusters = best.clusters
        slot_labels = np.asarray(clusters.labels)
        used = np.flatnonzero(np.asarray(clusters.counts) > 0)
        remap = np.full(capacity, -1)
        remap[used] = np.arange(len(used))
        self.labels_ = remap[slot_labels].astype(np.int64)
        self.n_clusters_ = int(len(used))
        self.cluster_sizes_ = np.asarray(clusters.counts)[used]
        self.nll_ = float(best.nll)
        self.n_iter_ = int(best.n_iter)
        trace = np.asarray(best.nll_trace)
        self.nll_trace_ = trace[: self.n_iter_ + 1]
        if self.n_clusters_ == 1 and not self.split_moves and n > 1:
            warnings.warn(
                "MAP-DP kept all points in one cluster. Started from one cluster, its "
                "point-by-point moves rarely split well-separated groups; if you expected "
                "several clusters, pass split_moves=True (the NLL still never increases).",
                SingleClusterWarning,
                stacklevel=2,
            )
        self.family_ = family
        self.measure_ = measure
        self.n_features_in_ = X.shape[1]
        # compact statistics for prediction
        self._clusters = ClusterState(
            jnp.asarray(self.labels_, jnp.int32),
            jnp.asarray(self.cluster_sizes_),
            jax.tree.map(lambda s: s[jnp.asarray(used)], clusters.stats),
            jnp.array(False),
        )
        return self

    def fit_predict(self, X: Any, y: Any = None) -> np.ndarray:
        return self.fit(X).labels_

    def _check_fitted(self, X):
        if not hasattr(self, "labels_"):
            raise ValueError("This MAPDP instance is not fitted yet; call fit(X) first.")
        X = check_data(X)
        if X.shape[1] != self.n_features_in_:
            raise ValueError(
                f"X has {X.shape[1]} features, but MAPDP was fitted with {self.n_features_in_}."
            )
        self.family_.validate_data(X)
        return jnp.asarray(X, dtype=jnp.result_type(float))

    def _log_weights(self, X):
        return mapdp_core.predict_log_weights(self._check_fitted(X), self._clusters,
                                              self.measure_, self.family_)

    def predict(self, X: Any, allow_new: bool = False) -> np.ndarray:
        """Modal assignment of new points (MATH.md §3).

        Each point goes to ``argmax_k N_k p(x | X_k)``. With ``allow_new=True``,
        a point whose best option is a new cluster (``α p(x)``) gets ``-1``.
        """
        existing, new = self._log_weights(X)
        labels = np.asarray(jnp.argmax(existing, axis=1))
        if allow_new:
            labels = np.where(np.asarray(new) > np.asarray(existing.max(1)), -1, labels)
        return labels

    def predict_proba(self, X: Any) -> np.ndarray:
        """Posterior predictive responsibilities over the fitted clusters and a new one (last column)."""
        existing, new = self._log_weights(X)
        logits = jnp.concatenate([existing, new[:, None]], axis=1)
        return np.asarray(jax.nn.softmax(logits, axis=1))

    def score_samples(self, X: Any) -> np.ndarray:
        """Log mixture predictive density
        ``log[Σ_k N_k/(N+α) p(x|X_k) + α/(N+α) p(x)]`` (Pitman-Yor: ``N_k − d``, ``α + K d``)."""
        existing, new = self._log_weights(X)
        total = jax.nn.logsumexp(jnp.concatenate([existing, new[:, None]], axis=1), axis=1)
        n = float(self.cluster_sizes_.sum())
        return np.asarray(total - jnp.log(n + self.measure_.alpha))

    def score(self, X: Any, y: Any = None) -> float:
        """Mean log predictive density per point."""
        return float(np.mean(self.score_samples(X)))


def select_alpha(
    X: Any,
    alphas: Sequence[float],
    family: Family | None = None,
    method: str = "nll",
    n_folds: int = 5,
    random_state: int = 0,
    **mapdp_kwargs: Any,
) -> tuple[float, np.ndarray]:
    """Choose the DP concentration for MAP-DP.

    ``method="nll"``: fit on all data for each alpha, return the alpha with the
    lowest NLL ``−log p(X, Π̂ | α)``. ``method="heldout"``: ``n_folds``-fold
    cross-validation of the mean log predictive density (``MAPDP.score``).
    Returns ``(best_alpha, scores)``, scores being NLL (lower is better) or
    held-out log density (higher is better) per alpha.
    """
    with warnings.catch_warnings():
        # one cluster is a legitimate answer for some alphas: compared, not warned about
        warnings.simplefilter("ignore", SingleClusterWarning)
        return _select_alpha(X, alphas, family, method, n_folds, random_state, **mapdp_kwargs)


def _select_alpha(X, alphas, family, method, n_folds, random_state, **mapdp_kwargs):
    X = check_data(X)
    family = family if family is not None else NormalGamma.from_data(X)
    alphas = [float(a) for a in alphas]
    if any(a <= 0 for a in alphas):
        raise ValueError("every alpha must be > 0.")
    if method == "nll":
        scores = np.array([MAPDP(alpha=a, family=family, **mapdp_kwargs).fit(X).nll_ for a in alphas])
        return alphas[int(np.argmin(scores))], scores
    if method != "heldout":
        raise ValueError(f"method must be 'nll' or 'heldout', got {method!r}.")
    if not 2 <= n_folds <= X.shape[0]:
        raise ValueError(f"n_folds must be in [2, n], got {n_folds}.")
    folds = np.array_split(np.random.default_rng(random_state).permutation(X.shape[0]), n_folds)
    scores = []
    for a in alphas:
        fold_scores = []
        for f in folds:
            train = np.setdiff1d(np.arange(X.shape[0]), f)
            est = MAPDP(alpha=a, family=family, **mapdp_kwargs).fit(X[train])
            fold_scores.append(est.score(X[f]))
        scores.append(np.mean(fold_scores))
    scores = np.array(scores)
    return alphas[int(np.argmax(scores))], scores
