"""Matplotlib plots: clusters in 2-D (PCA when D > 2), MCMC traces, co-clustering
heatmaps and dendrograms.

Needs the ``plot`` extra (``pip install "jaxbnp[plot]"``).

Example
-------
>>> from jaxbnp import metrics, plot
>>> psm = metrics.posterior_similarity(draws)                 # doctest: +SKIP
>>> plot.plot_coclustering(psm, labels=metrics.point_estimate(draws))  # doctest: +SKIP
>>> plot.plot_trace(mcmc)                                      # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["plot_clusters", "plot_trace", "plot_coclustering", "plot_dendrogram", "project_2d"]


def _pyplot():
    try:
        import matplotlib

        if matplotlib.get_backend().lower() not in ("agg", "pdf", "svg", "ps") and not _has_display():
            matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError('Plotting needs matplotlib: pip install "jaxbnp[plot]".') from exc
    return plt


def _has_display() -> bool:
    import os

    return bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))


def project_2d(X: np.ndarray) -> np.ndarray:
    """The first two principal components of ``X`` (``X`` itself when D <= 2)."""
    X = np.asarray(X, dtype=float)
    if X.shape[1] <= 2:
        return X if X.shape[1] == 2 else np.c_[X[:, 0], np.zeros(len(X))]
    Xc = X - X.mean(0)
    _, _, vt = np.linalg.svd(Xc, full_matrices=False)
    return Xc @ vt[:2].T


def plot_clusters(X: Any, labels: Any, ax=None, title: str | None = None):
    """Scatter plot of the points coloured by cluster; returns the axes."""
    plt = _pyplot()
    P = project_2d(np.asarray(X))
    labels = np.asarray(labels)
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 6))
    ax.scatter(P[:, 0], P[:, 1], c=labels, cmap="tab20", s=6, linewidths=0)
    ax.set_title(title or f"{len(np.unique(labels))} clusters")
    ax.set_aspect("equal", adjustable="datalim")
    if np.asarray(X).shape[1] > 2:
        ax.set_xlabel("PC 1")
        ax.set_ylabel("PC 2")
    return ax


def plot_trace(log_joint: Any, num_clusters: Any = None, axes=None):
    """Trace plots of the log joint and the number of clusters, one line per chain.

    Pass the two arrays (``(num_chains, num_draws)`` or ``(num_draws,)``), or
    one source of draws as the first argument: a NumPyro ``MCMC`` run with
    ``extra_fields=("log_joint", "num_clusters")``, a fitted
    ``DirichletProcessMixture`` or a ``CheckpointedRun``. Returns the two axes.
    """
    plt = _pyplot()
    if num_clusters is None:
        from .diagnostics import draws_by_chain

        draws = draws_by_chain(log_joint)
        log_joint, num_clusters = draws["log_joint"], draws["num_clusters"]
        if log_joint is None or num_clusters is None:
            raise ValueError(
                "plot_trace needs the log joint and the number of clusters; run the MCMC with "
                "extra_fields=('log_joint', 'num_clusters')."
            )
    lj = np.atleast_2d(np.asarray(log_joint))
    k = np.atleast_2d(np.asarray(num_clusters))
    if lj.shape != k.shape:
        raise ValueError(f"log_joint {lj.shape} and num_clusters {k.shape} must have the same shape.")
    if axes is None:
        _, axes = plt.subplots(2, 1, figsize=(7, 5), sharex=True)
    for chain in range(lj.shape[0]):
        axes[0].plot(lj[chain], lw=0.8)
        axes[1].plot(k[chain], lw=0.8)
    axes[0].set_ylabel("log p(X, Π)")
    axes[1].set_ylabel("clusters")
    axes[1].set_xlabel("iteration")
    return axes


def plot_coclustering(
    psm: Any, order: Any = None, ax=None, labels: Any = None, cmap: str = "Greys", colorbar: bool = True
):
    """Heatmap of a posterior similarity (co-clustering) matrix; returns the axes.

    :param psm: ``(n, n)`` matrix with entries in ``[0, 1]``
        (:func:`jaxbnp.metrics.posterior_similarity`).
    :param order: a permutation of ``0..n-1`` for the rows and columns.
    :param labels: a partition (e.g. :func:`jaxbnp.metrics.point_estimate`):
        rows are sorted by cluster and the clusters outlined. Give ``order``
        or ``labels``, not both; with neither, the original order is kept.
    """
    plt = _pyplot()
    psm = np.asarray(psm, dtype=float)
    if psm.ndim != 2 or psm.shape[0] != psm.shape[1] or psm.shape[0] == 0:
        raise ValueError(f"psm must be a square (n, n) matrix, got shape {psm.shape}.")
    if not np.all(np.isfinite(psm)) or psm.min() < -1e-12 or psm.max() > 1 + 1e-12:
        raise ValueError("psm entries must be probabilities in [0, 1].")
    n = psm.shape[0]
    if order is not None and labels is not None:
        raise ValueError("Pass order or labels, not both.")
    bounds = []
    if labels is not None:
        labels = np.asarray(labels)
        if labels.shape != (n,):
            raise ValueError(f"labels must have shape ({n},), got {labels.shape}.")
        order = np.argsort(labels, kind="stable")
        sorted_labels = labels[order]
        bounds = list(np.flatnonzero(sorted_labels[1:] != sorted_labels[:-1]) + 1)
    if order is None:
        order = np.arange(n)
    order = np.asarray(order)
    if order.shape != (n,) or not np.array_equal(np.sort(order), np.arange(n)):
        raise ValueError(f"order must be a permutation of 0..{n - 1}.")
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 5))
    image = ax.imshow(psm[np.ix_(order, order)], cmap=cmap, vmin=0.0, vmax=1.0,
                      interpolation="nearest")
    for b in bounds:
        ax.axhline(b - 0.5, color="tab:red", lw=0.6)
        ax.axvline(b - 0.5, color="tab:red", lw=0.6)
    if colorbar:
        ax.figure.colorbar(image, ax=ax, label="Pr(same cluster)")
    ax.set_xlabel("point")
    ax.set_ylabel("point")
    ax.set_title("posterior co-clustering")
    return ax


def plot_dendrogram(linkage_or_tree: Any, ax=None, **kw: Any):
    """Dendrogram of a SciPy linkage matrix or of a tree; returns the axes.

    :param linkage_or_tree: an ``(n − 1, 4)`` SciPy linkage matrix, or a tree
        that ``jaxbnp.models.ddt.to_linkage`` converts to one.
    :param kw: passed to ``scipy.cluster.hierarchy.dendrogram`` (e.g.
        ``labels``, ``color_threshold``, ``orientation``). Its return value
        (leaf order, colours) is stored as ``ax.dendrogram_``.
    """
    from scipy.cluster import hierarchy

    plt = _pyplot()
    Z = None
    if isinstance(linkage_or_tree, np.ndarray) or (
        isinstance(linkage_or_tree, list) and not hasattr(linkage_or_tree, "_fields")
    ):
        Z = np.asarray(linkage_or_tree, dtype=float)
    elif hasattr(linkage_or_tree, "shape") and np.ndim(linkage_or_tree) == 2:
        Z = np.asarray(linkage_or_tree, dtype=float)
    if Z is None:
        try:
            from .models.ddt import to_linkage
        except ImportError as exc:
            raise ValueError(
                "plot_dendrogram takes a SciPy linkage matrix (n - 1, 4); converting a tree needs "
                "jaxbnp.models.ddt.to_linkage, which this installation does not have."
            ) from exc
        Z = np.asarray(to_linkage(linkage_or_tree), dtype=float)
    if Z.ndim != 2 or Z.shape[1] != 4 or Z.shape[0] < 1:
        raise ValueError(f"a linkage matrix has shape (n - 1, 4) with n >= 2, got {Z.shape}.")
    try:
        hierarchy.is_valid_linkage(Z, throw=True, name="linkage")
    except (ValueError, TypeError) as exc:
        raise ValueError(f"not a valid SciPy linkage matrix: {exc}") from exc
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 4))
    ax.dendrogram_ = hierarchy.dendrogram(Z, ax=ax, **kw)
    ax.set_ylabel("height")
    return ax
