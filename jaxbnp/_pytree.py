"""Small helpers shared by the model classes: pytree registration and checks."""

from __future__ import annotations

import types
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "ParameterPytree", "is_concrete", "concrete_value", "real_parameter", "require_finite",
    "require_positive", "same_length", "tree_add",
]


def is_concrete(value: Any) -> bool:
    """True when ``value`` is a Python/NumPy number or a concrete JAX array (not a tracer)."""
    return not isinstance(value, jax.core.Tracer)


def concrete_value(value: Any) -> np.ndarray | None:
    """``value`` as a NumPy array if it is concrete, else ``None`` (it is being traced)."""
    if not is_concrete(value):
        return None
    try:
        return np.asarray(value)
    except Exception:  # pragma: no cover - exotic array types
        return None


def real_parameter(owner: str, name: str, value: Any, ndims=(0, 1)) -> np.ndarray | None:
    """A measure's or family's parameter ``value`` as a float NumPy array (``None`` while
    traced), or a ``TypeError``/``ValueError`` naming ``owner: name`` for ``None``,
    booleans, strings, complex numbers, a number of dimensions not in ``ndims``, and empty
    arrays."""
    if value is None:
        raise TypeError(f"{owner}: {name} must be a number, got None.")
    c = concrete_value(value)
    if c is None:
        return None
    if c.dtype == bool or c.dtype.kind in "OSUVc":
        kind = "boolean" if c.dtype == bool else "complex" if c.dtype.kind == "c" else "non-numeric"
        raise TypeError(f"{owner}: {name} must be a real number, got {kind} {value!r}.")
    c = c.astype(float)
    if c.ndim not in ndims:
        what = "a scalar" if ndims == (0,) else "a scalar or a 1-D vector" if ndims == (0, 1) else \
            f"an array with {ndims} dimensions"
        raise ValueError(f"{owner}: {name} must be {what}, got shape {c.shape}.")
    if c.size == 0:
        raise ValueError(f"{owner}: {name} is empty (shape {c.shape}).")
    return c


def require_positive(owner: str, name: str, value: Any, ndims=(0, 1)) -> None:
    """A positive real hyperparameter (or vector of them): a clear error otherwise."""
    c = real_parameter(owner, name, value, ndims)
    if c is None:
        return
    if not np.all(np.isfinite(c)):
        raise ValueError(f"{owner}: {name} must be finite, got {c}.")
    if not np.all(c > 0):
        raise ValueError(f"{owner}: {name} must be > 0, got {c}. Pass a positive value.")


def require_finite(owner: str, name: str, value: Any, ndims=(0, 1)) -> None:
    """A finite real hyperparameter (or vector of them)."""
    c = real_parameter(owner, name, value, ndims)
    if c is not None and not np.all(np.isfinite(c)):
        raise ValueError(f"{owner}: {name} must be finite, got {c}.")


def same_length(owner: str, names: tuple[str, str], values: tuple[Any, Any]) -> None:
    """Two per-column hyperparameter vectors of one length."""
    a, b = (concrete_value(v) for v in values)
    if a is not None and b is not None and a.ndim == 1 and b.ndim == 1 and a.shape != b.shape:
        raise ValueError(
            f"{owner}: {names[0]} and {names[1]} must have the same length (one per column), "
            f"got {a.shape[0]} and {b.shape[0]}."
        )


class ParameterPytree:
    """Base class for measures and families: their parameters are pytree leaves.

    Subclasses list their parameter names in ``_fields`` and validate concrete
    values in ``_validate``. Instances rebuilt by JAX (under ``jit``/``vmap``)
    skip validation because their leaves may be tracers or batching sentinels.
    """

    _fields: tuple[str, ...] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        jax.tree_util.register_pytree_node(cls, cls._flatten, cls._unflatten)

    def _flatten(self):
        return tuple(getattr(self, f) for f in self._fields), None

    @classmethod
    def _unflatten(cls, aux, leaves):
        obj = object.__new__(cls)
        for name, leaf in zip(cls._fields, leaves):
            object.__setattr__(obj, name, leaf)
        return obj

    def _set(self, **values: Any) -> None:
        for name in self._fields:
            value = values[name]
            if is_concrete(value) and not isinstance(value, jax.Array):
                value = jnp.asarray(value, dtype=jnp.result_type(float))
            object.__setattr__(self, name, value)

    def host_params(self) -> types.SimpleNamespace:
        """The parameters as NumPy float64 arrays, for host-side (NumPy) formulas.

        Only for concrete instances: raises ``ValueError`` under ``jit``. Cached
        (instances are immutable).
        """
        cached = self.__dict__.get("_host_params_cache")
        if cached is not None:
            return cached
        values = {}
        for name in self._fields:
            c = concrete_value(getattr(self, name))
            if c is None:
                raise ValueError(
                    f"{type(self).__name__}: host (NumPy) math needs concrete parameters; "
                    "it cannot run under jit or vmap."
                )
            values[name] = np.asarray(c, dtype=np.float64)
        out = types.SimpleNamespace(**values)
        object.__setattr__(self, "_host_params_cache", out)
        return out

    def replace(self, **changes: Any):
        """A copy with some parameters replaced (no validation: used inside samplers)."""
        leaves = [changes.get(f, getattr(self, f)) for f in self._fields]
        return self._unflatten(None, leaves)

    def __repr__(self) -> str:
        parts = []
        for f in self._fields:
            v = getattr(self, f)
            c = concrete_value(v)
            parts.append(f"{f}={c.tolist() if c is not None and c.size <= 4 else '...'}")
        return f"{type(self).__name__}({', '.join(parts)})"


@jax.jit
def tree_add(a: Any, b: Any) -> Any:
    """Two pytrees of the same structure added leaf by leaf (one compiled call): how the
    chunked fits add the chunks' sums."""
    return jax.tree.map(jnp.add, a, b)
