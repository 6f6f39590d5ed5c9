"""Device meshes and the layout of points over them: what every sharded driver shares.

:func:`make_mesh` builds a one-axis mesh over the devices (across hosts after
``jax.distributed.initialize``, :mod:`jaxbnp.inference.distributed`); a :class:`Layout` lays
``n`` points out block-cyclically over its shards (docs of :mod:`jaxbnp.inference.sharded`:
with ``S`` shards and a global block of ``block_size`` points, each shard takes ``B =
ceil(block_size / S)`` points of every global block; padded rows carry ``valid = False``);
:func:`shard_data` and :func:`shard_labels` place the rows of each device on it. The
sharded fits (:mod:`jaxbnp.inference.sharded`) and the sharded sub-cluster iteration use
them.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from .._validation import check_int

__all__ = ["AXIS_NAME", "Layout", "ShardedData", "make_mesh", "make_layout", "mesh_axis",
           "shard_data", "shard_labels"]

#: default name of the mesh axis the points are sharded over
AXIS_NAME = "points"


def make_mesh(num_devices: int | None = None, axis_name: str = AXIS_NAME, devices=None) -> Mesh:
    """A one-axis mesh over the first ``num_devices`` devices (default: all, every process).

    The axis type is ``AxisType.Auto`` (``jax.make_mesh`` now defaults to
    Explicit axes, which ``shard_map`` does not need here).
    """
    devices = list(jax.devices() if devices is None else devices)
    if num_devices is None:
        num_devices = len(devices)
    if not isinstance(num_devices, (int, np.integer)) or not 1 <= num_devices <= len(devices):
        raise ValueError(
            f"num_devices must be an integer between 1 and {len(devices)} (the devices "
            f"available), got {num_devices!r}. On CPU, more host devices come from "
            "XLA_FLAGS=--xla_force_host_platform_device_count=N set before JAX starts."
        )
    return Mesh(np.asarray(devices[:num_devices]), (axis_name,), axis_types=(AxisType.Auto,))


@dataclasses.dataclass(frozen=True)
class Layout:
    """Block-cyclic placement of ``num_points`` points on ``num_shards`` shards (module docstring).

    ``local_block`` points per shard and block, ``num_blocks`` blocks per shard.
    """

    num_points: int
    num_shards: int
    local_block: int
    num_blocks: int

    @property
    def global_block(self) -> int:
        return self.num_shards * self.local_block

    @property
    def local_size(self) -> int:
        return self.num_blocks * self.local_block

    @property
    def padded_size(self) -> int:
        return self.num_shards * self.local_size

    def global_index(self, rows: np.ndarray | None = None) -> np.ndarray:
        """Input index of each row of the sharded array (``>= num_points`` for padding)."""
        rows = np.arange(self.padded_size) if rows is None else np.asarray(rows)
        shard, rem = np.divmod(rows, self.local_size)
        block, j = np.divmod(rem, self.local_block)
        return block * self.global_block + shard * self.local_block + j

    def row_of_point(self) -> np.ndarray:
        """Row of the sharded array that holds each input point, ``(num_points,)``."""
        g = self.global_index()
        rows = np.empty(self.num_points, np.int64)
        keep = g < self.num_points
        rows[g[keep]] = np.nonzero(keep)[0]
        return rows


def make_layout(num_points: int, num_shards: int, block_size: int) -> Layout:
    """The layout of ``num_points`` points on ``num_shards`` shards with global blocks of
    about ``block_size`` points (rounded up to a multiple of ``num_shards``)."""
    num_points = check_int("num_points", num_points, 1)
    num_shards = check_int("num_shards", num_shards, 1)
    block_size = check_int("block_size", block_size, 1)
    local_block = -(-block_size // num_shards)
    num_blocks = -(-num_points // (local_block * num_shards))
    return Layout(num_points, num_shards, local_block, num_blocks)


class ShardedData(NamedTuple):
    """Points placed on the mesh: ``X`` ``(padded, D)`` and ``valid`` ``(padded,)``, both
    sharded over the mesh axis (rows in ``layout`` order)."""

    X: jax.Array
    valid: jax.Array


def mesh_axis(mesh: Mesh) -> str:
    if not isinstance(mesh, Mesh):
        raise ValueError(f"mesh must be a jax.sharding.Mesh (see make_mesh), got {type(mesh).__name__}.")
    if len(mesh.axis_names) != 1:
        raise ValueError(
            f"mesh must have exactly one axis (the points axis), got axes {mesh.axis_names}; "
            "use make_mesh(num_devices)."
        )
    return mesh.axis_names[0]


def shard_data(X: np.ndarray, mesh: Mesh, layout: Layout, dtype=None) -> ShardedData:
    """Place host data ``X`` (``(n, D)``) on ``mesh`` in ``layout`` order.

    Each device's rows are cut from ``X`` by a callback
    (``jax.make_array_from_callback``), so with several processes every process
    only materialises its own devices' rows (``X`` may be a ``np.memmap``).
    Padding rows repeat the last point and are masked out.
    """
    axis = mesh_axis(mesh)
    if X.shape[0] != layout.num_points:
        raise ValueError(f"X has {X.shape[0]} points but the layout is for {layout.num_points}.")
    if mesh.devices.size != layout.num_shards:
        raise ValueError(
            f"the mesh has {mesh.devices.size} devices but the layout has {layout.num_shards} shards."
        )
    dtype = dtype or jnp.result_type(float)
    sharding = NamedSharding(mesh, P(axis))
    n, D = X.shape

    def rows(index):
        r = np.arange(layout.padded_size)[index[0]]
        return layout.global_index(r)

    Xd = jax.make_array_from_callback(
        (layout.padded_size, D), sharding,
        lambda index: np.asarray(X[np.minimum(rows(index), n - 1)], dtype=dtype),
    )
    valid = jax.make_array_from_callback(
        (layout.padded_size,), sharding, lambda index: rows(index) < n
    )
    return ShardedData(Xd, valid)


def shard_labels(labels: np.ndarray, mesh: Mesh, layout: Layout) -> jax.Array:
    """Place host int labels (``(n,)``, slots ``< capacity``) on ``mesh`` in ``layout`` order
    (padding rows get slot 0; they are masked out of every count)."""
    axis = mesh_axis(mesh)
    labels = np.asarray(labels, np.int32)
    n = layout.num_points
    if labels.shape != (n,):
        raise ValueError(f"labels must have shape ({n},), got {labels.shape}.")

    def rows(index):
        g = layout.global_index(np.arange(layout.padded_size)[index[0]])
        return np.where(g < n, labels[np.minimum(g, n - 1)], 0).astype(np.int32)

    return jax.make_array_from_callback((layout.padded_size,), NamedSharding(mesh, P(axis)), rows)
