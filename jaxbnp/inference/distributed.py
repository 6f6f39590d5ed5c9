"""Scale-out helpers: multi-host start-up, meshes, and MAP-DP on data larger than device memory.

JAX is the distributed engine; this module only wires jaxbnp to it.

* :func:`initialize` is ``jax.distributed.initialize`` (one call per process,
  before any other JAX call), returning ``(process_index, process_count)``.
  After it, ``jax.devices()`` lists the devices of *all* processes, and
  :func:`make_mesh` / :func:`fit_mapdp_sharded` / :func:`gibbs_sharded`
  (:mod:`jaxbnp.inference.sharded`) run one SPMD program over all of them;
  every process calls them with the same arguments (each process cuts only
  its own devices' rows out of ``X``, so ``X`` may be a ``np.memmap``).
* :func:`fit_mapdp_chunked` and :func:`fit_subcluster_chunked` (MAP-DP and the sub-cluster
  chain on data larger than device memory, ``X`` on the host) are the streamed drivers of
  :mod:`jaxbnp.inference.streamed`, re-exported here.
"""

from __future__ import annotations

from typing import Any

import jax

from .streamed import (
    ChunkedMAPDPResult, ChunkedSubClusterResult, fit_mapdp_chunked, fit_subcluster_chunked,
)
from .sharded import (
    AXIS_NAME, Layout, ShardedData, ShardedGibbsResult, make_layout, make_mesh, shard_data,
)
from .sharded import fit_mapdp as fit_mapdp_sharded
from .sharded import gibbs as gibbs_sharded

__all__ = [
    "initialize",
    "make_mesh",
    "make_layout",
    "shard_data",
    "fit_mapdp_sharded",
    "gibbs_sharded",
    "fit_mapdp_chunked",
    "ChunkedMAPDPResult",
    "fit_subcluster_chunked",
    "ChunkedSubClusterResult",
    "AXIS_NAME",
    "Layout",
    "ShardedData",
    "ShardedGibbsResult",
]


def initialize(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    **kwargs: Any,
) -> tuple[int, int]:
    """Start multi-process JAX (``jax.distributed.initialize``) and return
    ``(process_index, process_count)``.

    Call it first thing in every process, e.g.
    ``initialize("10.0.0.1:1234", num_processes=2, process_id=i)``; on
    clusters that JAX detects (Slurm, TPU pods) the arguments can be left out.
    Extra keyword arguments go to ``jax.distributed.initialize``
    (``local_device_ids``, ``initialization_timeout``, ...). CPU processes talk
    through gloo (JAX's default CPU collectives), which the loopback test uses.
    """
    jax.distributed.initialize(
        coordinator_address=coordinator_address, num_processes=num_processes,
        process_id=process_id, **kwargs,
    )
    return jax.process_index(), jax.process_count()


# ----------------------------------------------------------------------------- chunked MAP-DP
