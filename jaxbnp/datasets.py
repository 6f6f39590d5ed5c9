"""Data sets that ship with jaxbnp (made from a seed: nothing is downloaded).

``toy_ring`` imitates the tgMCMC paper's ``toy`` set: 13 Gaussian clusters of
100 points in 2-D, one at the origin and twelve on a ring of radius 1.3, each
with its own small anisotropic covariance.
"""

from __future__ import annotations

import numpy as np

__all__ = ["toy_ring", "load_default"]


def toy_ring(num_per_cluster: int = 100, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """13-cluster 2-D mixture like the tgMCMC toy set.

    Returns ``(X, labels)`` with ``X`` of shape ``(13 * num_per_cluster, 2)``.
    """
    rng = np.random.default_rng(seed)
    angles = np.pi / 2 - np.arange(12) * (2 * np.pi / 12)
    centres = np.vstack([[0.0, 0.0], 1.3 * np.c_[np.cos(angles), np.sin(angles)]])
    X, y = [], []
    for k, c in enumerate(centres):
        # radial spread small, tangential spread larger, like the paper's set
        theta = np.arctan2(c[1], c[0]) if k else rng.uniform(0, np.pi)
        rot = np.array([[np.cos(theta), -np.sin(theta)], [np.sin(theta), np.cos(theta)]])
        sd = np.array([0.065, 0.13]) if k else np.array([0.11, 0.12])
        cov = rot @ np.diag(sd**2) @ rot.T
        X.append(rng.multivariate_normal(c, cov, size=num_per_cluster))
        y.append(np.full(num_per_cluster, k))
    return np.concatenate(X), np.concatenate(y).astype(np.int32)


def load_default() -> tuple[np.ndarray, np.ndarray]:
    """The main job's default data set: ``toy_ring()`` (1,300 x 2, 13 clusters)."""
    return toy_ring()
