"""Dendrogram plots of Dirichlet diffusion trees (MATH.md §5).

Needs the ``plot`` extra and SciPy (``pip install "jaxbnp[plot]" scipy``);
both are imported lazily.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from .models.ddt import Tree, cut_tree, to_linkage

__all__ = ["plot_dendrogram"]


def plot_dendrogram(
    tree: Tree,
    ax: Any = None,
    *,
    t_stop: float | None = None,
    labels: Sequence[str] | None = None,
    title: str | None = None,
    **dendrogram_kwargs: Any,
):
    """Draw a tree with ``scipy.cluster.hierarchy.dendrogram(to_linkage(tree))``; returns the axes.

    Heights are ``1 − t`` (leaves at 0, the root at ``1 − t_root``). With
    ``t_stop`` the clusters of :func:`~jaxbnp.models.ddt.cut_tree` are
    coloured and the cut is drawn as a dashed line at height ``1 − t_stop``.
    Extra keyword arguments go to ``dendrogram``.
    """
    try:
        from scipy.cluster.hierarchy import dendrogram
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("plot_dendrogram needs SciPy: pip install scipy.") from exc
    try:
        import os

        import matplotlib

        headless = not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))
        if headless and matplotlib.get_backend().lower() not in ("agg", "pdf", "svg", "ps"):
            matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError('plot_dendrogram needs matplotlib: pip install "jaxbnp[plot]".') from exc
    Z = to_linkage(tree)
    if ax is None:
        _, ax = plt.subplots(figsize=(8, 4))
    kwargs = dict(dendrogram_kwargs)
    if t_stop is not None:
        kwargs.setdefault("color_threshold", 1.0 - float(t_stop))
    dendrogram(Z, ax=ax, labels=None if labels is None else list(labels), **kwargs)
    if t_stop is not None:
        ax.axhline(1.0 - float(t_stop), color="0.4", linestyle="--", linewidth=1)
        k = len(np.unique(np.asarray(cut_tree(tree, float(t_stop)))))
        title = title or f"cut at t = {float(t_stop):.2f}: {k} clusters"
    ax.set_ylabel("1 - divergence time")
    if title:
        ax.set_title(title)
    return ax
