"""Input checks run on the host before anything is compiled."""

from __future__ import annotations

import math
import operator
from typing import Any

import numpy as np

__all__ = ["check_data", "check_labels", "check_int", "check_real"]


def constant_columns(mean: np.ndarray, sd: np.ndarray) -> np.ndarray:
    """Which columns count as constant, from their means and standard deviations: an sd at
    most ``1e-12`` times ``max(1, |mean|)`` (rounding, not spread). One rule for the default
    family's standardisation and ``NormalWishart.from_data``'s determinant."""
    return np.asarray(sd) <= 1e-12 * np.maximum(1.0, np.abs(mean))


def check_data(X: Any, name: str = "X", family=None) -> np.ndarray:
    """Return ``X`` as a 2-D float NumPy array, or raise ``ValueError`` saying what to fix.

    Rejects: non-numeric dtypes, 1-D or >2-D arrays, empty data, NaN or inf.
    A family, if given, checks its own constraints (counts, binary, width).
    """
    if hasattr(X, "to_numpy"):  # pandas
        X = X.to_numpy()
    try:
        arr = np.asarray(X)
    except Exception as exc:  # pragma: no cover - exotic inputs
        raise ValueError(f"{name} could not be converted to an array: {exc}") from exc
    if arr.dtype == object or not (
        np.issubdtype(arr.dtype, np.number) or np.issubdtype(arr.dtype, np.bool_)
    ):
        raise ValueError(
            f"{name} must be numeric, got dtype {arr.dtype}. Convert it with "
            f"np.asarray({name}, dtype=float)."
        )
    if np.issubdtype(arr.dtype, np.complexfloating):
        raise ValueError(f"{name} must be real, got complex dtype {arr.dtype}.")
    if arr.ndim != 2:
        raise ValueError(
            f"{name} must be a 2-D array of shape (num_points, num_features), got shape "
            f"{arr.shape}. Reshape a single feature with {name}.reshape(-1, 1)."
        )
    if arr.shape[0] == 0 or arr.shape[1] == 0:
        raise ValueError(f"{name} is empty (shape {arr.shape}); pass at least one point and one feature.")
    arr = arr.astype(float)
    bad = ~np.isfinite(arr)
    if bad.any():
        rows = np.unique(np.nonzero(bad)[0])[:5].tolist()
        raise ValueError(
            f"{name} contains NaN or inf ({int(bad.sum())} entries, first rows {rows}); "
            "remove or impute them before fitting."
        )
    if family is not None:
        family.validate_data(arr)
    return arr


def check_host_array(X: Any) -> Any:
    """``X`` as a non-empty ``(n, D)`` array left where it is (a NumPy array or a
    ``np.memmap`` is not read; anything else goes through ``np.asarray``), or raise. The
    chunked fits validate the values chunk by chunk (:func:`check_data`)."""
    if not hasattr(X, "shape") or not hasattr(X, "__getitem__"):
        X = np.asarray(X)
    if len(X.shape) != 2 or X.shape[0] == 0 or X.shape[1] == 0:
        raise ValueError(
            f"X must be a non-empty 2-D array (num_points, num_features), got shape {tuple(X.shape)}."
        )
    return X


def check_labels(labels: Any, num_points: int, name: str = "labels") -> np.ndarray:
    """Return integer labels of length ``num_points`` (any non-negative ids), or raise."""
    arr = np.asarray(labels)
    if arr.shape != (num_points,):
        raise ValueError(f"{name} must have shape ({num_points},), got {arr.shape}.")
    if not np.issubdtype(arr.dtype, np.integer):
        if np.issubdtype(arr.dtype, np.floating) and np.all(np.round(arr) == arr):
            arr = arr.astype(np.int64)
        else:
            raise ValueError(f"{name} must be integers, got dtype {arr.dtype}.")
    if arr.size and arr.min() < 0:
        raise ValueError(f"{name} must be non-negative cluster ids.")
    return arr.astype(np.int32)


def check_int(name: str, value: Any, minimum: int = 0) -> int:
    """``value`` as a Python ``int >= minimum``, else a ``ValueError`` naming ``name``
    (``bool`` and non-integral numbers are refused)."""
    if isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}.")
    try:
        out = operator.index(value)
    except TypeError:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}.") from None
    if out < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {out!r}.")
    return int(out)


def check_real(name: str, value: Any, minimum: float) -> float:
    """``value`` as a finite Python ``float >= minimum``, else a ``ValueError`` naming ``name``."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(
            value, (int, float, np.integer, np.floating)):
        raise ValueError(f"{name} must be a real number >= {minimum}, got {value!r}.")
    if not (math.isfinite(float(value)) and float(value) >= minimum):
        raise ValueError(f"{name} must be a finite number >= {minimum}, got {value}.")
    return float(value)
