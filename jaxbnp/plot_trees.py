"""Tree plots: dendrograms of Dirichlet diffusion trees (docs/mathematics.md §5) and BHMC trees (docs/mathematics.md §6).

Needs the ``plot`` extra and SciPy (``pip install "jaxbnp[plot]" scipy``);
both are imported lazily.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from .models.ddt import Tree, cut_tree, to_linkage

__all__ = ["plot_dendrogram", "plot_bhmc_tree"]


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


def _pyplot():
    import os

    import matplotlib

    headless = not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))
    if headless and matplotlib.get_backend().lower() not in ("agg", "pdf", "svg", "ps"):
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_bhmc_tree(paths: Any, ax: Any = None, *, labels_true: Any = None, title: str | None = None):
    """Draw the tree of a BHMC sample from its paths ``(N, L)`` (root ``0`` implicit); returns the axes.

    Depth runs down the page; leaves are spread evenly, an internal node sits
    above the mean of its children. Each node shows its number of points (the
    marker area grows with it); with ``labels_true`` the leaves also show
    their majority class and its share.
    """
    try:
        plt = _pyplot()
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError('plot_bhmc_tree needs matplotlib: pip install "jaxbnp[plot]".') from exc
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
