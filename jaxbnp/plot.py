"""Matplotlib plots: clusters in 2-D (PCA when D > 2) and MCMC traces.

Needs the ``plot`` extra (``pip install "jaxbnp[plot]"``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["plot_clusters", "plot_trace", "project_2d"]


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


def plot_trace(log_joint: Any, num_clusters: Any, axes=None):
    """Trace plots of the log joint and the number of clusters, one line per chain."""
    plt = _pyplot()
    lj = np.atleast_2d(np.asarray(log_joint))
    k = np.atleast_2d(np.asarray(num_clusters))
    if axes is None:
        _, axes = plt.subplots(2, 1, figsize=(7, 5), sharex=True)
    for chain in range(lj.shape[0]):
        axes[0].plot(lj[chain], lw=0.8)
        axes[1].plot(k[chain], lw=0.8)
    axes[0].set_ylabel("log p(X, Π)")
    axes[1].set_ylabel("clusters")
    axes[1].set_xlabel("iteration")
    return axes
