"""Matplotlib plots: clusters in 2-D (PCA when D > 2), MCMC traces, co-clustering
heatmaps, dendrograms (of a SciPy linkage matrix or a Dirichlet diffusion tree,
docs/mathematics.md §5) and BHMC trees (docs/mathematics.md §6).

Needs the ``plot`` extra (``pip install "jaxbnp[plot]"``); matplotlib is
imported on first use.

Example
-------
>>> from jaxbnp import metrics, plot
>>> psm = metrics.posterior_similarity(draws)                 # doctest: +SKIP
>>> plot.plot_coclustering(psm, labels=metrics.point_estimate(draws))  # doctest: +SKIP
>>> plot.plot_trace(mcmc)                                      # doctest: +SKIP
"""

from __future__ import annotations

import os
from typing import Any, Sequence

import numpy as np

from .models.ddt import cut_tree, to_linkage

__all__ = [
    "pyplot", "plot_clusters", "plot_trace", "plot_coclustering", "plot_dendrogram", "plot_bhmc_tree",
    "project_2d",
]


def pyplot():
    """``matplotlib.pyplot``, on the Agg backend when there is no display.

    Raises ``ImportError`` with the install command when matplotlib is missing.
    """
    try:
        import matplotlib

        has_display = os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")
        if matplotlib.get_backend().lower() not in ("agg", "pdf", "svg", "ps") and not has_display:
            matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError('Plotting needs matplotlib: pip install "jaxbnp[plot]".') from exc
    return plt


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
    plt = pyplot()
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
    plt = pyplot()
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
    plt = pyplot()
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


def plot_dendrogram(
    tree_or_linkage: Any,
    ax: Any = None,
    *,
    t_stop: float | None = None,
    labels: Sequence[str] | None = None,
    title: str | None = None,
    **dendrogram_kwargs: Any,
):
    """Dendrogram of a tree or of a SciPy linkage matrix; returns the axes.

    :param tree_or_linkage: a :class:`~jaxbnp.models.ddt.Tree` (a single
        tree), drawn from :func:`~jaxbnp.models.ddt.to_linkage`: heights
        ``1 − t``, leaves at 0, the root at ``1 − t_root``; or an
        ``(n − 1, 4)`` SciPy linkage matrix.
    :param t_stop: trees only: the clusters of
        :func:`~jaxbnp.models.ddt.cut_tree` at ``t_stop`` are coloured and the
        cut is drawn as a dashed line at height ``1 − t_stop``.
    :param labels: the leaves' labels.
    :param title: the axes' title (with ``t_stop``, by default the number of clusters).
    :param dendrogram_kwargs: passed to ``scipy.cluster.hierarchy.dendrogram``
        (e.g. ``color_threshold``, ``orientation``). Its return value (leaf
        order, colours) is stored as ``ax.dendrogram_``.
    """
    from scipy.cluster import hierarchy

    plt = pyplot()
    is_tree = isinstance(tree_or_linkage, tuple) and hasattr(tree_or_linkage, "_fields")
    if is_tree:
        Z = np.asarray(to_linkage(tree_or_linkage), dtype=float)
    else:
        if t_stop is not None:
            raise ValueError("t_stop needs a tree (jaxbnp.models.ddt.Tree), not a linkage matrix.")
        Z = np.asarray(tree_or_linkage, dtype=float)
        if Z.ndim != 2 or Z.shape[1] != 4 or Z.shape[0] < 1:
            raise ValueError(f"a linkage matrix has shape (n - 1, 4) with n >= 2, got {Z.shape}.")
        try:
            hierarchy.is_valid_linkage(Z, throw=True, name="linkage")
        except (ValueError, TypeError) as exc:
            raise ValueError(f"not a valid SciPy linkage matrix: {exc}") from exc
    if ax is None:
        _, ax = plt.subplots(figsize=(8, 4))
    kwargs = dict(dendrogram_kwargs)
    if t_stop is not None:
        kwargs.setdefault("color_threshold", 1.0 - float(t_stop))
    ax.dendrogram_ = hierarchy.dendrogram(Z, ax=ax, labels=None if labels is None else list(labels), **kwargs)
    if t_stop is not None:
        ax.axhline(1.0 - float(t_stop), color="0.4", linestyle="--", linewidth=1)
        k = len(np.unique(np.asarray(cut_tree(tree_or_linkage, float(t_stop)))))
        title = title or f"cut at t = {float(t_stop):.2f}: {k} clusters"
    ax.set_ylabel("1 - divergence time" if is_tree else "height")
    if title:
        ax.set_title(title)
    return ax


def plot_bhmc_tree(paths: Any, ax: Any = None, *, labels_true: Any = None, title: str | None = None):
    """Draw the tree of a BHMC sample from its paths ``(N, L)`` (root ``0`` implicit); returns the axes.

    Depth runs down the page; leaves are spread evenly, an internal node sits
    above the mean of its children. Each node shows its number of points (the
    marker area grows with it); with ``labels_true`` the leaves also show
    their majority class and its share.
    """
    plt = pyplot()
    paths = np.asarray(paths)
    if paths.ndim != 2:
        raise ValueError(f"paths must have shape (num_points, depth), got {paths.shape}.")
    n, depth = paths.shape
    full = np.concatenate([np.zeros((n, 1), paths.dtype), paths], axis=1)
    children: dict = {}
    count: dict = {0: n}
    for row in full:
        for level in range(1, depth + 1):
            parent, child = int(row[level - 1]), int(row[level])
            kids = children.setdefault(parent, [])
            if child not in kids:
                kids.append(child)
            count[child] = count.get(child, 0) + 1
    xpos: dict = {}
    next_leaf = [0]

    def place(node, level):
        kids = sorted(children.get(node, []), key=lambda c: -count[c])
        if level == depth or not kids:
            xpos[node] = float(next_leaf[0])
            next_leaf[0] += 1
        else:
            for kid in kids:
                place(kid, level + 1)
            xpos[node] = float(np.mean([xpos[k] for k in kids]))
        return node

    place(0, 0)
    level_of = {0: 0}
    for row in full:
        for level in range(1, depth + 1):
            level_of[int(row[level])] = level
    if ax is None:
        _, ax = plt.subplots(figsize=(max(6.0, 0.5 * next_leaf[0] + 2), 1.4 * depth + 1.5))
    for parent, kids in children.items():
        for kid in kids:
            ax.plot([xpos[parent], xpos[kid]], [-level_of[parent], -level_of[kid]], color="0.6", zorder=1)
    nodes = list(xpos)
    sizes = np.array([count[z] for z in nodes], float)
    ax.scatter([xpos[z] for z in nodes], [-level_of[z] for z in nodes], s=30 + 400 * sizes / n,
               c=[level_of[z] for z in nodes], cmap="viridis", zorder=2, edgecolors="k")
    true = None if labels_true is None else np.asarray(labels_true)
    for z in nodes:
        text = str(count[z])
        if true is not None and level_of[z] == depth:
            members = true[full[:, depth] == z]
            values, freq = np.unique(members, return_counts=True)
            text += f"\n{values[np.argmax(freq)]} ({freq.max() / len(members):.0%})"
        ax.annotate(text, (xpos[z], -level_of[z]), textcoords="offset points", xytext=(0, -14),
                    ha="center", va="top", fontsize=7)
    ax.set_yticks([-l for l in range(depth + 1)], ["root"] + [f"level {l}" for l in range(1, depth + 1)])
    ax.set_xticks([])
    ax.set_ylim(-depth - 0.8, 0.5)
    ax.set_title(title or f"BHMC tree: {sum(1 for z in nodes if level_of[z] == depth)} leaves, {n} points")
    return ax
