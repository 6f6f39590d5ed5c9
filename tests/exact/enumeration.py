"""Exact posteriors over set partitions by enumeration (restricted growth strings)."""

from __future__ import annotations

from collections import Counter

import numpy as np


def set_partitions(n: int) -> np.ndarray:
    """All partitions of ``{0..n-1}`` as label vectors in first-appearance order, ``(B_n, n)``."""
    out = []

    def rec(prefix, k):
        if len(prefix) == n:
            out.append(list(prefix))
            return
        for label in range(k + 1):
            rec(prefix + [label], max(k, label + 1))

    rec([0], 1)
    return np.array(out, dtype=np.int32)


def canonical(labels: np.ndarray) -> tuple:
    """First-appearance relabelling of one label vector, as a hashable tuple."""
    mapping: dict = {}
    return tuple(mapping.setdefault(int(x), len(mapping)) for x in labels)


def normalise(log_weights: np.ndarray) -> np.ndarray:
    log_weights = np.asarray(log_weights, dtype=float)
    w = np.exp(log_weights - log_weights.max())
    return w / w.sum()


def total_variation(draws: np.ndarray, partitions: np.ndarray, probs: np.ndarray) -> float:
    """TV distance between the empirical law of ``draws`` and ``probs`` over ``partitions``."""
    index = {tuple(p): i for i, p in enumerate(partitions.tolist())}
    counts = Counter(canonical(d) for d in np.asarray(draws))
    emp = np.zeros(len(partitions))
    for key, c in counts.items():
        emp[index[key]] += c
    emp /= emp.sum()
    return 0.5 * float(np.abs(emp - probs).sum())
