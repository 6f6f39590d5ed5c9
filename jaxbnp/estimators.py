"""scikit-learn style estimators.

``DirichletProcessMixture``: posterior sampling of a BNP mixture (collapsed
Gibbs, split-merge, tree-guided MCMC, sub-cluster split/merge MCMC, or MAP-DP),
summarised by a point estimate partition; ``fit`` / ``fit_predict`` / ``predict`` /
``predict_proba`` / ``score_samples`` / ``score``.

``MAPDP``: MAP-DP clustering (docs/mathematics.md §3), ``fit`` / ``fit_predict`` /
``predict`` / ``predict_proba`` / ``score_samples`` / ``score``.

Both are scikit-learn estimators (``BaseEstimator``, ``ClusterMixin``,
``DensityMixin``): they pass ``sklearn.utils.estimator_checks.check_estimator``
(``tests/test_sklearn.py``) and work in ``Pipeline``, ``GridSearchCV`` (whose default
score is ``score``: the mean held-out log predictive density), ``clone`` and pickle.
Inputs are checked by scikit-learn's ``validate_data`` (its messages, ``n_features_in_``,
``feature_names_in_``), then by the family's own constraints.

Example
-------
>>> import numpy as np
>>> from jaxbnp.estimators import MAPDP
>>> X = np.r_[np.random.default_rng(0).normal(-4, 1, (50, 2)), np.random.default_rng(1).normal(4, 1, (50, 2))]
>>> MAPDP(alpha=1.0).fit(X).n_clusters_
2
"""

from __future__ import annotations

import functools
import math
import warnings
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from sklearn.base import BaseEstimator, ClusterMixin, DensityMixin
from sklearn.exceptions import NotFittedError
from sklearn.utils.validation import check_is_fitted, validate_data

from . import _defaults as defaults
from ._cache import auto_enable
from ._progress import bar as _progress_bar
from ._progress import resolve as _resolve_progress
from ._validation import check_data, check_int, check_real
from .inference.partition import mapdp as mapdp_core
from .errors import CapacityError, SingleClusterWarning
from .inference.partition.clusters import ClusterState
from .inference.partition.kernels import SUBCLUSTER_DEFAULT_CAPACITY
from .inference.runner import run
from . import plate_fit
from .plate_fit import mixed_terms, overlap_counts
from .models.distributions import mixture_model
from .models.families import Family
from .models.measures import DP, Measure, PitmanYor

__all__ = ["MAPDP", "DirichletProcessMixture", "select_alpha", "SingleClusterWarning", "NotFittedError"]


def _validated(estimator, X, reset: bool) -> np.ndarray:
    """``X`` through scikit-learn's ``validate_data`` (dense, 2-D, non-empty, finite, numeric:
    its messages; ``n_features_in_`` and ``feature_names_in_`` set when ``reset``, compared
    otherwise), as float64 on the host. The callers then check the family's own constraints
    (:func:`check_data` with ``family``, or ``family.validate_data``)."""
    try:
        # "numeric": object arrays of numbers are converted, strings are refused
        arr = validate_data(estimator, X, reset=reset, dtype="numeric", accept_sparse=False,
                            ensure_min_samples=1)
    except ValueError as exc:
        if "could not convert" in str(exc):  # numpy's message names no input
            raise ValueError(
                f"X must be numeric; an entry could not be converted to float ({exc})."
            ) from exc
        raise
    return np.ascontiguousarray(arr, dtype=np.float64)  # the same sums whatever the layout


class MAPDP(ClusterMixin, DensityMixin, BaseEstimator):
    """MAP-DP clustering (Raykov et al. 2014), docs/mathematics.md §3.

    The defaults depart from the paper so that well separated clusters are
    found at every size: a k-means++ start with ``init_clusters`` clusters
    (the paper starts from one cluster), batched sweeps, merge and split
    moves between sweeps (exact NLL changes, kept only when they lower it)
    and a full-covariance prior whose cluster covariance is a within-group covariance
    (:func:`jaxbnp.inference.partition.mapdp.default_prior`). The NLL
    ``−log p(X, Π)`` never increases, whatever the options.

    **The paper's algorithm** is ``MAPDP.paper(alpha=...)``, i.e.
    ``init="one", mode="sequential", split_moves=False, merge_moves=False``
    (with ``family=None`` it still uses the default prior rule; pass the
    paper's ``NormalGamma.from_data(X)`` for its prior).

    :param alpha: DP concentration; ignored when ``measure`` is given.
    :param family: a conjugate family; ``None`` means a full-covariance Gaussian with
        ``jaxbnp.inference.partition.mapdp.default_prior``, set on standardised
        coordinates: the fit runs on ``(X − mean) / sd`` (per column; a constant column
        only centred) with a ``NormalWishart`` whose expected cluster covariance is the
        pooled covariance within the groups of a 32-means clustering (Ledoit-Wolf),
        worth ``D + 1`` points. ``family_`` is that prior written in the data's units
        (the same model), and ``nll_``, ``nll_trace_``, predictions and densities are of
        ``X`` itself. With fewer points than a covariance has entries, ``n < D (D + 1) / 2``
        (``mapdp.default_covariance``), it is the diagonal ``default_prior(X,
        covariance="diag")`` on ``X`` (a ``NormalGamma`` with within-group variances, worth
        ``D + 1`` points, which is the same model in any units; on elongated clusters a
        diagonal prior cuts each into diagonal pieces, docs/benchmarks.md).
    :param measure: ``DP(alpha)`` or ``PitmanYor(alpha, d)`` (MAP-PY);
        ``None`` means ``DP(alpha)``.
    :param n_restarts: random point orders (and k-means++ seeds) tried; the
        lowest NLL wins.
    :param mode: ``"batched"`` (default: blocks scored at once, never
        increasing the NLL, see ``jaxbnp.inference.partition.mapdp``) or
        ``"sequential"`` (the paper's point-by-point sweep).
    :param tol: stop sweeping when a sweep lowers the NLL by less than this.
    :param max_iter: maximum number of iterations (sweeps, merge and split rounds).
    :param random_state: seed for the restarts' orders and the k-means++ start.
    :param capacity: cluster slots; ``None`` starts at ``max(32, 2 * init_clusters)``
        (32 with ``init="one"``; at most the padded number of rows, below) and doubles
        (refitting, up to ``n``) whenever it runs out; clusters are never truncated.
    :param block_size: points per block in batched mode.
    :param split_moves: when the sweeps (and merges) have converged, propose
        splitting every cluster in two and keep splits that lower the NLL,
        then sweep again (``jaxbnp.inference.partition.mapdp.split_round``).
    :param merge_moves: when the sweeps have converged, merge pairs of
        clusters whose merge lowers the NLL (``merge_round``), so that an
        over-segmented start comes down to the right number of clusters.
    :param init: ``"kmeans++"`` (k-means++ seeding of ``init_clusters``
        clusters in standardised coordinates, then a few Lloyd iterations) or
        ``"one"`` (all points in one cluster: the paper).
    :param init_clusters: clusters of the k-means++ start.
    :param init_size: with ``init="kmeans++"`` and more than ``init_size`` points,
        the k-means++ start, the merge and split moves and the restarts run on
        ``init_size`` points drawn without replacement with ``random_state``;
        every point then goes to the cluster of that fit with the largest
        ``log N_k + log p(x | X_k)`` (``mapdp.seed_labels``), and sweeps over
        all points (no moves) run from there, one restart, in index order. The
        clusters are found on the subsample, the sweeps settle every point and
        may still open new clusters. ``None``: everything on all points.

    A fit that ends with all ``n > 1`` points in one cluster warns with
    :class:`SingleClusterWarning`, whatever the options.

    Compiled once per size class: the fit runs on ``mapdp.padded_size(n)`` rows (at least
    128, then eight sizes per doubling, so at most 1/8 of them padding), the data followed
    by copies of its first row that belong to no cluster and count in nothing
    (``mapdp.fit``'s ``num_points``). Data sets of nearby sizes (cross-validation folds,
    ``GridSearchCV``, new batches) reuse one compiled program. The fit is the same algorithm
    on the ``n`` points alone (from the same start and order, the same result; the random
    orders and k-means++ draws of a key depend on the padded size).

    Fitted attributes: ``labels_``, ``n_clusters_``, ``nll_`` (``−log p(X, Π)``),
    ``n_iter_`` and ``nll_trace_`` (of the run over all points; with a subsample
    start it starts at the NLL of the seeded partition), ``family_``, ``measure_``, ``cluster_sizes_``.
    """

    def __init__(
        self,
        alpha: float = 1.0,
        family: Family | None = None,
        measure: Measure | None = None,
        n_restarts: int = 1,
        mode: str = "batched",
        tol: float = 1e-6,
        max_iter: int = 1000,
        random_state: int | None = None,
        capacity: int | None = None,
        block_size: int = 4096,
        split_moves: bool = True,
        merge_moves: bool = True,
        init: str = "kmeans++",
        init_clusters: int = 32,
        init_size: int | None = 1 << 16,
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
        self.merge_moves = merge_moves
        self.init = init
        self.init_clusters = init_clusters
        self.init_size = init_size

    @classmethod
    def paper(cls, alpha: float = 1.0, **kwargs: Any) -> "MAPDP":
        """The paper's algorithm: one-cluster start, sequential sweeps, no split or merge moves."""
        options = dict(mode="sequential", init="one", split_moves=False, merge_moves=False)
        options.update(kwargs)
        return cls(alpha=alpha, **options)

    def _check_options(self):
        if not isinstance(self.mode, str) or self.mode not in ("sequential", "batched"):
            raise ValueError(f"mode must be 'sequential' or 'batched', got {self.mode!r}.")
        check_int("n_restarts", self.n_restarts, 1)
        check_int("max_iter", self.max_iter, 1)
        check_real("tol", self.tol, 0.0)
        check_int("block_size", self.block_size, 1)
        if self.capacity is not None:
            check_int("capacity", self.capacity, 1)
        if self.random_state is not None and (isinstance(self.random_state, bool)
                                              or not isinstance(self.random_state, (int, np.integer))):
            raise ValueError(f"random_state must be an integer seed or None, got {self.random_state!r}.")
        if self.family is not None and not isinstance(self.family, Family):
            raise TypeError(f"family must be a conjugate family (e.g. bnp.NormalGamma()) or None, "
                            f"got {self.family!r}.")
        if not isinstance(self.init, str) or self.init not in ("kmeans++", "one"):
            raise ValueError(f"init must be 'kmeans++' or 'one', got {self.init!r}.")
        check_int("init_clusters", self.init_clusters, 1)
        if self.init_size is not None:
            check_int("init_size", self.init_size, 2)
        for name in ("split_moves", "merge_moves"):
            if not isinstance(getattr(self, name), (bool, np.bool_)):
                raise TypeError(f"{name} must be True or False, got {getattr(self, name)!r}.")
        measure = self.measure if self.measure is not None else DP(self.alpha)
        if not isinstance(measure, (DP, PitmanYor)):
            raise ValueError(
                f"MAPDP supports DP and PitmanYor measures, got {type(measure).__name__}."
            )
        return measure

    def fit(self, X: Any, y: Any = None) -> "MAPDP":
        """Find the MAP partition of ``X`` ``(n, D)``; ``y`` is ignored."""
        measure = self._check_options()
        X = _validated(self, X, reset=True)
        auto_enable()  # JAX's persistent compilation cache (jaxbnp.enable_compilation_cache)
        n = X.shape[0]
        scaling = None
        if self.family is None:  # the default prior (docstring)
            covariance = mapdp_core.default_covariance(*X.shape)
            if covariance == "full":  # on standardised coordinates
                scaling = defaults.standardisation(X)
                X = (X - scaling[0]) / scaling[1]
            family = mapdp_core.default_prior(X, covariance=covariance)
        else:
            family = self.family
        X = check_data(X, family=family)
        # padded to one of a few sizes (copies of the first row, which are not points), so
        # that data sets of nearby sizes share one compiled program (mapdp.fit, num_points)
        rows = mapdp_core.padded_size(n)
        Xj = jnp.asarray(mapdp_core.pad_rows(X, rows), dtype=jnp.result_type(float))
        init_clusters = min(int(self.init_clusters), rows) if self.init == "kmeans++" else 1
        if self.capacity is not None:
            capacity = min(int(self.capacity), n)
        else:
            capacity = min(rows, max(32, 2 * init_clusters))
        seed = 0 if self.random_state is None else int(self.random_state)
        key = jax.random.key(seed)
        options = dict(mode=self.mode, n_restarts=int(self.n_restarts), tol=float(self.tol),
                       max_iter=int(self.max_iter), block_size=int(self.block_size))
        moves = dict(split_moves=bool(self.split_moves), merge_moves=bool(self.merge_moves))
        subsample = self.init == "kmeans++" and self.init_size is not None and n > self.init_size
        if subsample:
            sub = np.sort(np.random.default_rng(seed).choice(n, int(self.init_size), replace=False))
            # padded too (copies of its first point): the same program as a fit of that size
            sub = mapdp_core.pad_rows(sub, mapdp_core.padded_size(len(sub)))
            Xsub = Xj[jnp.asarray(sub)]
        while True:
            if subsample:
                # the start and the moves on a subsample; every point to its best cluster of
                # that fit; then sweeps over all points (docstring)
                start, runs = mapdp_core.fit(key, Xsub, measure, family, capacity, **options,
                                             **moves, init_clusters=min(init_clusters, capacity),
                                             num_points=int(self.init_size))
                if not bool(jnp.any(runs.clusters.overflow)):
                    labels0 = mapdp_core.seed_labels(Xj, start.clusters, measure, family,
                                                     int(self.block_size))
                    best, runs = mapdp_core.fit(key, Xj, measure, family, capacity,
                                                **dict(options, n_restarts=1), init_labels=labels0,
                                                num_points=n)
            else:
                best, runs = mapdp_core.fit(key, Xj, measure, family, capacity, **options, **moves,
                                            init_clusters=min(init_clusters, capacity),
                                            num_points=n)
            if not bool(jnp.any(runs.clusters.overflow)):
                break
            if capacity >= n:  # pragma: no cover - n slots can always hold n clusters
                raise CapacityError("MAP-DP needed more than n clusters.")
            capacity = min(2 * capacity, n)
        clusters = best.clusters
        slot_labels = np.asarray(clusters.labels)[:n]
        used = np.flatnonzero(np.asarray(clusters.counts) > 0)
        remap = np.full(capacity, -1)
        remap[used] = np.arange(len(used))
        self.labels_ = remap[slot_labels].astype(np.int64)
        self.n_clusters_ = int(len(used))
        self.cluster_sizes_ = np.asarray(clusters.counts)[used]
        # −log p(X, Π) = −log p(Z, Π) + n Σ log scale: of X in its own units
        jacobian = 0.0 if scaling is None else n * float(np.sum(np.log(scaling[1])))
        self.nll_ = float(best.nll) + jacobian
        self.n_iter_ = int(best.n_iter)
        trace = np.asarray(best.nll_trace, dtype=np.float64)
        self.nll_trace_ = trace[: self.n_iter_ + 1] + jacobian
        if self.n_clusters_ == 1 and n > 1:
            hint = (" Started from one cluster, point-by-point moves rarely split "
                    "well-separated groups: try the defaults (init='kmeans++', split_moves=True, "
                    "merge_moves=True)." if self.init == "one" or not self.split_moves else
                    " Try a larger alpha or a prior with narrower clusters (family=...).")
            warnings.warn(
                "MAP-DP kept all points in one cluster." + hint,
                SingleClusterWarning,
                stacklevel=2,
            )
        self.family_ = family if scaling is None else defaults.in_data_units(family, *scaling)
        self._family_fit, self._data_scaling = family, scaling
        self.measure_ = measure
        # compact statistics for prediction
        self._clusters = ClusterState(
            jnp.asarray(self.labels_, jnp.int32),
            jnp.asarray(self.cluster_sizes_),
            jax.tree.map(lambda s: s[jnp.asarray(used)], clusters.stats),
            jnp.array(False),
        )
        return self

    def fit_predict(self, X: Any, y: Any = None) -> np.ndarray:
        """``fit(X).labels_``."""
        return self.fit(X).labels_

    def _check_fitted(self, X):
        """``X`` in the fit's coordinates (standardised with the default prior)."""
        check_is_fitted(self, "labels_")
        X = _validated(self, X, reset=False)
        scaling = getattr(self, "_data_scaling", None)
        if scaling is not None:
            X = (X - scaling[0]) / scaling[1]
        getattr(self, "_family_fit", self.family_).validate_data(X)
        return jnp.asarray(X, dtype=jnp.result_type(float))

    def _log_weights(self, X):
        return mapdp_core.predict_log_weights(self._check_fitted(X), self._clusters,
                                              self.measure_, getattr(self, "_family_fit", self.family_))

    def predict(self, X: Any, allow_new: bool = False) -> np.ndarray:
        """Modal assignment of new points (docs/mathematics.md §3).

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
        out = np.asarray(total - jnp.log(n + self.measure_.alpha), dtype=np.float64)
        scaling = getattr(self, "_data_scaling", None)
        if scaling is not None:  # the density of x, not of its standardised coordinates
            out = out - np.sum(np.log(scaling[1]))
        return out

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
    progress_bar: bool | None = None,
    **mapdp_kwargs: Any,
) -> tuple[float, np.ndarray]:
    """Choose the DP concentration for MAP-DP.

    ``method="nll"``: fit on all data for each alpha, return the alpha with the
    lowest NLL ``−log p(X, Π̂ | α)`` (the fits use ``MAPDP``'s defaults; with
    ``family=None`` its default prior, the same for every alpha: a deterministic function
    of the data fitted). ``method="heldout"``: ``n_folds``-fold
    cross-validation of the mean log predictive density (``MAPDP.score``).
    Returns ``(best_alpha, scores)``, scores being NLL (lower is better) or
    held-out log density (higher is better) per alpha. ``progress_bar``: a tqdm
    bar over the fits (``None``: auto, see ``jaxbnp._progress``).
    """
    alphas = _check_select_alpha(alphas, method, n_folds)
    with warnings.catch_warnings():
        # one cluster is a legitimate answer for some alphas: compared, not warned about
        warnings.simplefilter("ignore", SingleClusterWarning)
        return _select_alpha(X, alphas, family, method, n_folds, random_state, progress_bar,
                             **mapdp_kwargs)


def _select_alpha(X, alphas, family, method, n_folds, random_state, progress_bar, **mapdp_kwargs):
    X = check_data(X)
    # family=None: each fit computes MAPDP's default prior, a deterministic function of its
    # data, so that every alpha is scored under the same prior (per fold with "heldout")
    alphas = [float(a) for a in alphas]
    if any(a <= 0 for a in alphas):
        raise ValueError("every alpha must be > 0.")
    if method not in ("nll", "heldout"):
        raise ValueError(f"method must be 'nll' or 'heldout', got {method!r}.")
    show = _resolve_progress(progress_bar)
    if method == "nll":
        scores = []
        with _progress_bar(len(alphas), "MAP-DP over alpha", show, unit="fit") as bar:
            for a in alphas:
                scores.append(MAPDP(alpha=a, family=family, **mapdp_kwargs).fit(X).nll_)
                bar.update()
        scores = np.array(scores)
        return alphas[int(np.argmin(scores))], scores
    if not 2 <= n_folds <= X.shape[0]:
        raise ValueError(f"n_folds must be in [2, n], got {n_folds}.")
    folds = np.array_split(np.random.default_rng(random_state).permutation(X.shape[0]), n_folds)
    scores = []
    with _progress_bar(len(alphas) * n_folds, "MAP-DP held-out", show, unit="fit") as bar:
        for a in alphas:
            fold_scores = []
            for f in folds:
                train = np.setdiff1d(np.arange(X.shape[0]), f)
                est = MAPDP(alpha=a, family=family, **mapdp_kwargs).fit(X[train])
                fold_scores.append(est.score(X[f]))
                bar.update()
            scores.append(np.mean(fold_scores))
    scores = np.array(scores)
    return alphas[int(np.argmax(scores))], scores


# ============================================================================= DP mixture (MCMC)
METHODS = ("gibbs", "splitmerge", "tgmcmc", "subcluster", "mapdp", "auxiliary", "slice")

#: keyword options each method accepts through ``method_options``
METHOD_OPTIONS = {
    "gibbs": ("init_strategy", "chain_batching"),
    "splitmerge": ("num_split_merge", "num_restricted_scans", "gibbs_sweeps", "init_strategy",
                   "chain_batching"),
    "tgmcmc": ("num_global_moves", "depth", "init", "local_moves", "chain_batching", "trees",
               "max_parts"),
    "subcluster": ("num_launch_sweeps", "sharpness", "init_strategy", "chain_batching", "mesh",
                   "num_absorb_moves", "num_reassign_moves"),
    "mapdp": ("n_restarts", "mode", "tol", "max_iter", "block_size", "split_moves", "merge_moves",
              "init", "init_clusters"),
    "auxiliary": ("num_sweeps", "num_split_merge", "num_param_steps", "step_size", "init_strategy",
                  "chain_batching", "split_merge", "num_launch_steps"),
    "slice": ("num_swap_passes", "num_split_merge", "num_param_steps", "step_size", "init_strategy",
              "chain_batching"),
}


def _collect(state):
    out = {"labels": state.z["z"], "log_joint": state.log_joint, "num_clusters": state.num_clusters}
    if "u" in state.z:
        out["u"] = state.z["u"]
    return out


def _make_kernel(method, options):
    from .inference import PARTITION_KERNELS

    kernel_cls = PARTITION_KERNELS[method]
    return lambda capacity: kernel_cls(mixture_model, capacity=capacity, **dict(options))


def _predictive_tables(X, draws, measure, family, u, estimate):
    """Per-draw quantities for the posterior predictive (host NumPy arrays).

    ``params``: the family's predictive parameters of every draw's clusters,
    leaves ``(T, K_max, ...)``; ``log_weight``: normalised log Gibbs weights of
    joining each cluster (``-inf`` for empty slots), ``(T, K_max)``;
    ``log_weight_new``: of a new cluster, ``(T,)``; ``overlap[t, j, k]``: the
    fraction of draw ``t``'s cluster ``j`` in the estimate's cluster ``k``.
    """
    k_max = int(draws.max()) + 1
    Xj = jnp.asarray(X)
    params, prior, log_w, log_w_new, counts = _tables(
        Xj, jnp.asarray(draws, jnp.int32), jnp.asarray(u, Xj.dtype), measure, family, k_max
    )
    overlap = overlap_counts(draws, estimate, k_max)
    counts = np.asarray(counts, dtype=float)
    overlap = overlap / np.maximum(counts, 1.0)[:, :, None]
    to_host = lambda tree: jax.tree.map(np.asarray, tree)  # noqa: E731
    return {
        "params": to_host(params),
        "prior_params": to_host(prior),
        "log_weight": np.asarray(log_w),
        "log_weight_new": np.asarray(log_w_new),
        "overlap": overlap,
    }


@functools.partial(jax.jit, static_argnames="k_max")
def _tables(X, labels, u, measure, family, k_max):
    """Statistics, predictive parameters and normalised Gibbs weights of every draw's clusters."""
    n = X.shape[0]
    stats = jax.vmap(lambda lab: family.stats_from_labels(X, lab, k_max))(labels)
    counts = jax.vmap(
        lambda lab: jax.ops.segment_sum(jnp.ones(n, jnp.int32), lab, num_segments=k_max)
    )(labels)
    params = jax.vmap(family.predictive_params)(stats)
    log_existing, log_new = jax.vmap(
        lambda c, uu: measure.gibbs_log_weights(c, uu if measure.has_auxiliary else None)
    )(counts, u)
    log_new = jnp.broadcast_to(log_new, (labels.shape[0],))
    norm = jnp.logaddexp(jax.nn.logsumexp(log_existing, axis=1), log_new)
    prior = family.prior_predictive_params(X.shape[1], X.dtype)
    return params, prior, log_existing - norm[:, None], log_new - norm, counts


@jax.jit
def _predictive_block(X_block, family, params, prior_params, log_weight, log_weight_new, overlap):
    """Log posterior predictive density and assignment probabilities of a block of points."""

    def one(x):
        lp = jax.vmap(lambda p: family.log_predictive_from_params(x, p))(params)  # (T, K)
        lp0 = family.log_predictive_from_params(x, prior_params)[0]
        return mixed_terms(lp, lp0, log_weight, log_weight_new, overlap)

    return jax.lax.map(one, X_block)


def _check_select_alpha(alphas: Any, method: Any, n_folds: Any) -> list:
    """``select_alpha``'s arguments checked before any fit: ``alphas`` as a non-empty list of
    positive finite floats; ``n_folds`` an integer >= 2 for ``method="heldout"``."""
    if isinstance(alphas, (str, bytes)) or not isinstance(alphas, (Sequence, np.ndarray)) or np.ndim(alphas) != 1:
        raise ValueError(f"alphas must be a 1-D sequence of positive numbers, got {alphas!r}.")
    if len(alphas) == 0:
        raise ValueError("alphas is empty; pass at least one concentration, e.g. [0.1, 1.0, 10.0].")
    out = []
    for a in alphas:
        if isinstance(a, (bool, np.bool_)) or not isinstance(a, (int, float, np.integer, np.floating)):
            raise ValueError(f"every alpha must be a positive number, got {a!r}.")
        if not (math.isfinite(float(a)) and float(a) > 0):
            raise ValueError(f"every alpha must be > 0 and finite, got {a}.")
        out.append(float(a))
    if method == "heldout":
        check_int("n_folds", n_folds, 2)
    return out


class DirichletProcessMixture(ClusterMixin, DensityMixin, BaseEstimator):
    """Bayesian nonparametric mixture clustering by MCMC (or MAP-DP), scikit-learn style.

    Samples the posterior over partitions ``p(Π | X)`` of a conjugate mixture
    with a ``DP`` (default), ``PitmanYor`` or ``NGGP`` partition prior
    (docs/mathematics.md §1-2), then summarises it: ``labels_`` is the partition
    minimising the posterior expected variation of information (or Binder's
    loss) over the draws (:func:`jaxbnp.metrics.point_estimate`).

    The defaults are the command line's (``jaxbnp cluster``; one table,
    ``jaxbnp._defaults``): split-merge MCMC with five moves and a Gibbs sweep per
    iteration, two chains of 50 warm-up iterations and 100 draws, each started from its
    own k-means++ partition into 20 clusters (sub-cluster MCMC: from one cluster).

    :param method: ``"splitmerge"`` (default: Jain-Neal split-merge + Gibbs,
        ``bnp.SplitMerge``, with ``num_split_merge=5``), ``"gibbs"`` (collapsed Gibbs,
        ``bnp.CollapsedGibbs``),
        ``"tgmcmc"`` (tree-guided MCMC, ``bnp.TreeGuidedMCMC``; DP or NGGP),
        ``"subcluster"`` (sub-cluster split/merge MCMC, ``bnp.SubClusterMCMC``: every step
        a computation over all points at once, for large ``n`` and GPUs; DP or Pitman-Yor) or
        ``"mapdp"`` (the MAP partition by :class:`MAPDP` with its defaults; DP or Pitman-Yor;
        no draws: ``num_chains``, ``num_warmup``, ``num_samples`` and
        ``thinning`` are ignored); for a ``likelihood`` with its cluster parameters sampled,
        ``"auxiliary"`` (Neal's Algorithm 8 on cluster slots, ``bnp.AuxiliaryGibbs``) or
        ``"slice"`` (Walker's slice sampler, every label at once, ``bnp.SliceGibbs``).
    :param measure: the partition prior; ``None`` means ``DP(1.0)``.
    :param family: a conjugate family; ``None`` (default) means a Gaussian with a prior set
        from the data in standardised coordinates: the fit runs on ``(X − mean) / sd`` (per
        column; a constant column only centred), so that the default does not depend on the
        data's units, with (``jaxbnp._defaults.default_family``) a full covariance,
        ``NormalWishart.from_data(·, r=1/n, shrinkage="ledoit-wolf")`` (the tgMCMC paper's
        prior with the Ledoit-Wolf covariance: positive definite on constant or collinear
        columns, and a vague prior on the means), when there are at least as many points as
        a covariance has entries,
        ``n >= D (D + 1) / 2``, and below that :class:`MAPDP`'s diagonal one,
        ``mapdp.default_prior(·, covariance="diag")`` (1,000 points in 50-D, digits).
        ``family_`` is that prior
        written in the data's units (the same model), and predictions and densities are of
        ``X`` itself. Needs at least 2 points. With ``method="mapdp"`` it means
        :class:`MAPDP`'s default prior.
    :param num_chains: independent chains, run vectorized in one program.
    :param num_warmup: iterations discarded per chain; ``None``: the method's default
        (splitmerge 50, gibbs 100, tgmcmc 30, subcluster 50).
    :param num_samples: draws kept per chain; ``None``: the method's default (splitmerge
        100, gibbs 200, tgmcmc 70, subcluster 100).
    :param thinning: keep every ``thinning``-th post-warm-up iteration (the
        last of each block of ``thinning``, as NumPyro does;
        ``num_samples * thinning`` iterations are run after warm-up).
    :param capacity: cluster slots; ``None`` means ``n`` (at most 128; at most 64 for
        ``"subcluster"``, whose split proposals are accepted less often when there are
        many more slots than clusters). When a chain needs more, the fit restarts with
        twice as many (up to ``n``).
    :param point_estimate: ``"vi"`` or ``"binder"``: the loss ``labels_`` minimises.
    :param method_options: extra keyword options of the method's kernel (see
        ``METHOD_OPTIONS``), e.g. ``{"num_split_merge": 5}`` or, for MAP-DP,
        ``{"init": "one", "n_restarts": 4}``; ``"subcluster"`` takes
        ``num_launch_sweeps``, ``sharpness``, ``init_strategy``, ``chain_batching``,
        ``num_absorb_moves``, ``num_reassign_moves`` and ``mesh`` (a
        ``jax.sharding.Mesh`` whose first axis shards the points). An
        ``init_strategy`` given here replaces ``init``. Split-merge's
        ``num_split_merge`` defaults to 5.
    :param random_state: integer seed of the ``jax.random.key``; ``None``
        means 0. The same seed gives the same draws.
    :param progress_bar: show a tqdm bar of the iterations; ``None`` (auto)
        shows it when standard error is a terminal and ``CI`` is unset
        (``jaxbnp._progress``). The draws are the same with or without it.
    :param init: where the chains of ``"gibbs"``, ``"splitmerge"`` and ``"subcluster"``
        start: ``"kmeans++"`` (each chain from its own k-means++ partition into
        ``init_clusters`` clusters in standardised coordinates, an over-segmentation
        the sampler merges), ``"prior"`` (a draw of the partition prior) or ``"one"``
        (one cluster, the kernels' own default, which single-point moves can take long to
        leave on well-separated groups); ``None`` (default): ``"kmeans++"`` for gibbs and
        splitmerge, ``"one"`` for subcluster (whose split proposals leave it at once, while
        its merges rarely join the pieces of a group that k-means++ cut). The start changes
        only the burn-in, not the posterior. ``"tgmcmc"`` and ``"mapdp"`` have their own starts.
    :param init_clusters: clusters of the k-means++ start (more than you expect: the
        sampler merges more easily than it splits).
    :param likelihood: ``method="auxiliary"`` / ``"slice"`` only: the clusters' likelihood,
        whose parameters are sampled with the labels (docs/mathematics.md §8-9).
        ``None`` or ``"normal"``: diagonal Gaussian clusters, a mean and a scale per
        column; ``"student-t"``: the same with 3 degrees of freedom; both fitted on
        standardised columns, as the default family is, with densities of ``X`` itself;
        ``"poisson"``: counts, log-normal rates whose prior spans the data's log counts
        (``jaxbnp.models.likelihoods``); or a NumPyro model ``model(X)`` with a
        ``Partition`` site and its cluster parameters in a ``numpyro.plate`` over slots
        (``X`` is passed 2-D, ``(n, D)``; the model holds the measure and the number of
        slots, so ``measure`` and ``capacity`` stay ``None``). A built-in likelihood starts
        with ``capacity`` slots (32, 64 for ``"slice"``, at most ``n``) and restarts with
        twice as many when a run fills them; a model's own plate raises ``CapacityError``.

    Fitted attributes: ``labels_`` (``(n,)`` point estimate, ``0..K-1``),
    ``n_clusters_``, ``posterior_samples_`` (dict of draws grouped by chain:
    ``labels`` ``(C, S, n)``, ``log_joint`` ``(C, S)``, ``num_clusters``
    ``(C, S)``, and ``u`` for NGGP; for MAP-DP a single "draw", the MAP
    partition, with ``log_joint = −NLL``), ``measure_``, ``family_``,
    ``capacity_``, ``n_features_in_`` (``feature_names_in_`` for DataFrames
    with string column names), ``mapdp_`` (the fitted :class:`MAPDP`, MAP-DP only).
    With a ``likelihood``, ``posterior_samples_`` also holds each cluster parameter site,
    ``(C, S, n_clusters_, ...)``: in every draw, the parameters of the draw's cluster that
    holds most of each cluster of ``labels_`` (free of label switching; their names are
    ``cluster_sites_``; :func:`jaxbnp.diagnostics.to_arviz` gives them a ``cluster``
    dimension), and ``family_`` is ``None``. The predictive's new-cluster density is then
    a mean over 256 prior draws of a slot's parameters (docs/mathematics.md §8).

    Prediction uses the posterior predictive averaged over the draws: a new
    point ``x`` joins draw ``t``'s cluster ``j`` with probability proportional
    to ``w_tj p(x | X_tj)`` and a new cluster with ``w_t,new p(x)`` (the
    measure's normalised Gibbs weights, docs/mathematics.md §1), jointly over all draws.
    ``predict_proba`` maps draw clusters onto the clusters of ``labels_`` by
    their overlap (``|C_tj ∩ Ĉ_k| / |C_tj|``) and adds a last column for a
    new cluster; ``predict`` takes the most probable existing cluster, or
    ``-1`` with ``allow_new=True`` when a new cluster is more probable than
    every existing one. ``score_samples`` is ``log p(x | X)``.

    The label draws equal those of ``numpyro.infer.MCMC(kernel, num_warmup=W,
    num_samples=S * thinning, thinning=thinning, num_chains=C,
    chain_method="vectorized").run(jax.random.key(random_state), X,
    init_params={"z": starts})`` for the kernel (with ``capacity`` and the
    ``method_options`` above; ``starts``: the k-means++ partitions, or no
    ``init_params`` with another ``init``) on the model
    ``z ~ Partition(measure, n)``,
    ``X ~ ConjugateMixture(family, z)`` (with an ``AuxiliaryU`` site ``u`` for
    NGGP), with log joints equal up to the last bit (the data are an argument
    of the estimator's compiled program and constants of NumPyro's, which XLA
    may round differently). The compiled sampler is reused by later fits with
    the same settings and data shape (a grid over ``alpha`` compiles once).

    Example
    -------
    >>> import numpy as np
    >>> from jaxbnp.estimators import DirichletProcessMixture
    >>> rng = np.random.default_rng(0)
    >>> X = np.r_[rng.normal(-5, 1, (30, 2)), rng.normal(5, 1, (30, 2))]
    >>> dpm = DirichletProcessMixture(random_state=0).fit(X)
    >>> dpm.n_clusters_
    2
    >>> dpm.predict(np.array([[-5.0, -5.0], [5.0, 5.0]])).tolist()
    [0, 1]
    >>> int(dpm.predict_proba(np.array([[40.0, 40.0]])).argmax())  # a new cluster: the last column
    2
    """

    def __init__(
        self,
        method: str = defaults.METHOD,
        measure: Measure | None = None,
        family: Family | None = None,
        num_chains: int = defaults.NUM_CHAINS,
        num_warmup: int | None = None,
        num_samples: int | None = None,
        thinning: int = 1,
        capacity: int | None = None,
        point_estimate: str = "vi",
        method_options: dict | None = None,
        random_state: int | None = None,
        progress_bar: bool | None = None,
        init: str | None = None,
        init_clusters: int = defaults.INIT_CLUSTERS,
        likelihood: Any = None,
    ):
        self.method = method
        self.measure = measure
        self.family = family
        self.num_chains = num_chains
        self.num_warmup = num_warmup
        self.num_samples = num_samples
        self.thinning = thinning
        self.capacity = capacity
        self.point_estimate = point_estimate
        self.method_options = method_options
        self.random_state = random_state
        self.progress_bar = progress_bar
        self.init = init
        self.init_clusters = init_clusters
        self.likelihood = likelihood

    # -- validation ------------------------------------------------------------------------
    def _check_params(self):
        from .models.measures import NGGP

        if not isinstance(self.method, str) or self.method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {self.method!r}.")
        measure = self.measure if self.measure is not None else DP(1.0)
        if not isinstance(measure, Measure):
            raise ValueError(
                "measure must be bnp.DP, bnp.PitmanYor or bnp.NGGP (e.g. DP(1.0)), "
                f"got {self.measure!r}."
            )
        if self.method == "mapdp" and not isinstance(measure, (DP, PitmanYor)):
            raise ValueError(f"method='mapdp' supports DP and PitmanYor measures, got {type(measure).__name__}.")
        if self.method == "tgmcmc" and not isinstance(measure, (DP, NGGP)):
            raise ValueError(
                f"method='tgmcmc' supports DP and NGGP measures, got {type(measure).__name__}; "
                "use method='gibbs' or 'splitmerge'."
            )
        plate_fit.check_settings(self.method, self.likelihood, self.family, self.measure, measure,
                                 self.capacity, self.init)
        if self.method == "subcluster" and measure.has_auxiliary:
            raise ValueError(
                f"method='subcluster' supports DP and PitmanYor measures, got {type(measure).__name__} "
                "(its weights given the partition are not Dirichlet, docs/mathematics.md §7); "
                "use method='gibbs', 'splitmerge' or 'tgmcmc'."
            )
        if self.family is not None and not isinstance(self.family, Family):
            raise ValueError(
                "family must be a conjugate family (bnp.NormalWishart, bnp.NormalGamma, "
                f"bnp.DirichletMultinomial, bnp.BetaBernoulli) or None, got {self.family!r}."
            )
        check_int("num_chains", self.num_chains, 1)
        if self.num_warmup is not None:
            check_int("num_warmup", self.num_warmup, 0)
        if self.num_samples is not None:
            check_int("num_samples", self.num_samples, 1)
        check_int("thinning", self.thinning, 1)
        if self.init is not None and (not isinstance(self.init, str)
                                      or self.init not in ("kmeans++", "prior", "one")):
            raise ValueError(f"init must be 'kmeans++', 'prior', 'one' or None, got {self.init!r}.")
        check_int("init_clusters", self.init_clusters, 1)
        if self.capacity is not None:
            check_int("capacity", self.capacity, 1)
        if not isinstance(self.point_estimate, str) or self.point_estimate not in ("vi", "binder"):
            raise ValueError(f"point_estimate must be 'vi' or 'binder', got {self.point_estimate!r}.")
        options = {} if self.method_options is None else self.method_options
        if not isinstance(options, dict):
            raise ValueError(f"method_options must be a dict or None, got {type(options).__name__}.")
        unknown = sorted(set(options) - set(METHOD_OPTIONS[self.method]))
        if unknown:
            raise ValueError(
                f"method_options {unknown} are not options of method={self.method!r}; "
                f"valid: {list(METHOD_OPTIONS[self.method])}."
            )
        if self.random_state is not None:
            if isinstance(self.random_state, bool) or not isinstance(self.random_state, (int, np.integer)):
                raise ValueError(f"random_state must be an integer seed or None, got {self.random_state!r}.")
        _resolve_progress(self.progress_bar)
        return measure, dict(options)

    def _check_fitted(self):
        check_is_fitted(self, "labels_")

    # -- fitting ---------------------------------------------------------------------------
    def fit(self, X: Any, y: Any = None) -> "DirichletProcessMixture":
        """Sample the posterior over partitions of ``X`` ``(n, D)`` (NumPy array or DataFrame)."""
        measure, options = self._check_params()
        for name in ("mapdp_", "_predictive", "_data_scaling", "_family_fit", "_plate",
                     "cluster_sites_"):  # a refit starts clean
            self.__dict__.pop(name, None)
        X = _validated(self, X, reset=True)
        auto_enable()  # JAX's persistent compilation cache (jaxbnp.enable_compilation_cache)
        n = X.shape[0]
        if self.method in defaults.PLATE_METHODS:  # a likelihood with its cluster parameters
            warmup, samples = self._iterations()
            settings = plate_fit.Settings(
                self.method, self.likelihood, self.capacity, self.init, int(self.num_chains), warmup,
                samples, int(self.thinning), self.point_estimate, self.progress_bar)
            attributes, self._plate = plate_fit.fit(
                settings, X, measure, options, 0 if self.random_state is None else int(self.random_state))
            self.__dict__.update(attributes)
            return self
        if self.family is None and n < 2 and self.method != "mapdp":
            raise ValueError(
                "The default family (a Gaussian prior set from standardised X) needs at least "
                f"2 samples (got {n} sample); pass more points or a family."
            )
        seed = 0 if self.random_state is None else int(self.random_state)
        if self.method == "mapdp":  # MAPDP's own defaults, its default prior included
            if self.family is not None:
                X = check_data(X, family=self.family)
            return self._fit_mapdp(X, measure, self.family, options, seed)
        scaling = None
        if self.family is None:  # the default: standardised coordinates (jaxbnp._defaults)
            scaling = defaults.standardisation(X)
            X = (X - scaling[0]) / scaling[1]
            family = defaults.default_family(X)
        else:
            family = self.family
        X = check_data(X, family=family)

        for name, value in defaults.KERNEL_OPTIONS.get(self.method, {}).items():
            options.setdefault(name, value)
        init_params = None
        init = defaults.INIT.get(self.method) if self.init is None else self.init
        if self.method in defaults.KMEANS_START and "init_strategy" not in options:
            if init == "kmeans++":
                init_params = {"z": defaults.kmeans_starts(X, seed, self.init_clusters,
                                                           int(self.num_chains))}
            elif init == "prior":
                options["init_strategy"] = "prior"
        Xj = jnp.asarray(X, dtype=jnp.result_type(float))
        if self.capacity is not None:
            capacity = int(self.capacity)
        else:
            capacity = min(n, SUBCLUSTER_DEFAULT_CAPACITY if self.method == "subcluster" else 128)
        options_key = tuple(sorted(options.items()))
        make_kernel = _make_kernel(self.method, options_key)
        num_chains = int(self.num_chains)
        if self.method == "tgmcmc":
            # its "ibhc" / "noisy" start, built here on the host from the keys the run gives
            # each chain: the kernel would build it inside the program through a host callback,
            # which JAX's compilation cache cannot keep
            keys = jax.random.key(seed)
            keys = jax.random.split(keys, num_chains) if num_chains > 1 else keys
            init_params = make_kernel(n).initial_params(keys, None, (Xj, measure, family)) or None
        if init_params is not None:
            capacity = defaults.capacity_for_start(capacity, int(np.max(init_params["z"])) + 1, n)
        num_warmup, num_samples = self._iterations()
        host_trees = self.method == "tgmcmc" and options.get("trees", "device") == "host"
        result = run(
            make_kernel, jax.random.key(seed), (Xj, measure, family),
            num_warmup=num_warmup, num_samples=num_samples,
            num_chains=num_chains, thinning=int(self.thinning), collect=_collect,
            init_params=init_params, capacity=capacity, max_capacity=n,
            progress_bar=self.progress_bar, description=self.method,
            # tgMCMC's host trees live in the kernel that a kept program's callbacks hold
            cache_key=None if host_trees else ("dpm", self.method, options_key),
        )
        capacity = result.capacity
        samples = dict(result.samples)
        samples["labels"] = samples["labels"].astype(np.int32)
        samples["num_clusters"] = samples["num_clusters"].astype(np.int64)
        from .metrics import point_estimate

        flat = samples["labels"].reshape(-1, n)
        self.labels_ = point_estimate(flat, loss=self.point_estimate)
        self.n_clusters_ = int(self.labels_.max()) + 1
        self.posterior_samples_ = samples
        self.measure_ = measure
        self.family_ = family if scaling is None else defaults.in_data_units(family, *scaling)
        self._family_fit, self._data_scaling = family, scaling
        self.capacity_ = capacity
        u = samples["u"].reshape(-1) if "u" in samples else np.ones(flat.shape[0])
        self._predictive = _predictive_tables(Xj, flat, measure, family, u, self.labels_)
        return self

    def _iterations(self) -> tuple[int, int]:
        """``(num_warmup, num_samples)``: the ones given, else the method's defaults
        (``jaxbnp._defaults.ITERATIONS``, the command line's)."""
        warmup, samples = defaults.ITERATIONS.get(self.method, (0, 1))
        return (int(warmup if self.num_warmup is None else self.num_warmup),
                int(samples if self.num_samples is None else self.num_samples))

    def _fit_mapdp(self, X, measure, family, options, seed):
        alpha = float(np.asarray(measure.alpha))
        est = MAPDP(alpha=alpha, family=family, measure=measure, random_state=seed, **options)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", SingleClusterWarning)
            est.fit(X)
        for w in caught:
            if issubclass(w.category, SingleClusterWarning):
                warnings.warn(str(w.message), SingleClusterWarning, stacklevel=3)
            else:
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        self.mapdp_ = est
        self.labels_ = est.labels_.astype(np.int64)
        self.n_clusters_ = int(est.n_clusters_)
        self.posterior_samples_ = {
            "labels": est.labels_.astype(np.int32)[None, None],
            "log_joint": np.array([[-est.nll_]]),
            "num_clusters": np.array([[est.n_clusters_]], dtype=np.int64),
        }
        self.measure_ = measure
        self.family_ = est.family_
        self.capacity_ = None
        return self

    def fit_predict(self, X: Any, y: Any = None) -> np.ndarray:
        """``fit(X).labels_``: the point estimate partition of ``X``."""
        return self.fit(X).labels_

    # -- prediction ------------------------------------------------------------------------
    def _predictive_terms(self, X: Any):
        """``(log density (m,), proba existing (m, K), proba new (m,))`` of new points."""
        self._check_fitted()
        X = _validated(self, X, reset=False)
        if hasattr(self, "mapdp_"):  # checked in MAPDP's own coordinates (standardised or not)
            proba = self.mapdp_.predict_proba(X)
            return self.mapdp_.score_samples(X), proba[:, :-1], proba[:, -1]
        if hasattr(self, "_plate"):
            return plate_fit.terms(self._plate, None if isinstance(self.likelihood, str) else self.likelihood, X)
        # the default family: computed in the fit's standardised coordinates
        family = getattr(self, "_family_fit", self.family_)
        scaling = getattr(self, "_data_scaling", None)
        if scaling is not None:
            X = (X - scaling[0]) / scaling[1]
        X = check_data(X, family=family)
        t = self._predictive
        return plate_fit.blocked(X, scaling, lambda block: _predictive_block(
            block, family, t["params"], t["prior_params"], t["log_weight"], t["log_weight_new"],
            t["overlap"]))

    def predict_proba(self, X: Any) -> np.ndarray:
        """Posterior predictive probabilities ``(m, n_clusters_ + 1)``: joining each cluster
        of ``labels_``, and (last column) a new cluster. Rows sum to 1."""
        _, proba, proba_new = self._predictive_terms(X)
        return np.concatenate([proba, proba_new[:, None]], axis=1)

    def predict(self, X: Any, allow_new: bool = False) -> np.ndarray:
        """Most probable cluster of ``labels_`` for each new point.

        With ``allow_new=True`` a point whose most probable option is a new
        cluster gets ``-1``; by default it gets the most probable existing one.
        """
        _, proba, proba_new = self._predictive_terms(X)
        labels = np.argmax(proba, axis=1).astype(np.int64)
        if allow_new:
            labels = np.where(proba_new > proba.max(axis=1), -1, labels)
        return labels

    def score_samples(self, X: Any) -> np.ndarray:
        """Log posterior predictive density ``log p(x | X)`` of each row (averaged over draws)."""
        return np.asarray(self._predictive_terms(X)[0], dtype=float)

    def score(self, X: Any, y: Any = None) -> float:
        """Mean log posterior predictive density per point."""
        return float(np.mean(self.score_samples(X)))
