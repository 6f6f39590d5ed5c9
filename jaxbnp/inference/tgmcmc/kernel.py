"""Tree-guided MCMC (tgMCMC, Lee & Choi 2015) for DP and NGGP mixtures (docs/mathematics.md §1, §2, §4).

Each iteration runs ``num_global_moves`` global moves (tree-guided split and
merge proposals, supplement B.1-B.5, accepted by Metropolis-Hastings), then
local moves (collapsed Gibbs updates of a random subset of points), then, for
NGGP, a slice update of ``u`` (and optionally ``alpha``/``sigma``).

By default (``trees="device"``) the global moves run compiled in JAX on array
trees (:mod:`jaxbnp.inference.tgmcmc.device`: the same moves and probabilities,
no callback). With ``trees="host"`` they run on the host: the IBHC trees live in NumPy
(:mod:`jaxbnp.inference.tgmcmc.ibhc`, :mod:`jaxbnp.inference.tgmcmc.host`), one host per
chain (keyed by its chain id) in a ``HostTrees`` store that the kernel owns, and
one ``jax.experimental.io_callback`` per iteration runs all
``num_global_moves`` moves of that chain. Their likelihood terms are
evaluated in vectorised NumPy float64 (``TreeModel``: the families' and
measures' ``host_*`` forms of the same formulas), memoised by leaf set: the
callback makes no JAX call except the jitted ``SeqInsert`` builder of a
cluster's tree (a JAX computation launched from inside a callback can
deadlock: seen on the 10k benchmark when the leaves were evaluated in JAX).
A move is rejected early when a cheap upper bound of its ``log r`` is below
the uniform draw (``host.TreeGuidedHost.global_move``; same chain). The local
moves, the ``u`` update and the log joint run in jitted JAX on the device.
The ``"ibhc"`` and ``"noisy"`` starts are built on the host before the program
(:meth:`TreeGuidedMCMC.initial_params`), so with device trees the programs hold no callback.

Exactness: the trees are a function of the partition
--------------------------------------------------------
The paper keeps trees as a part of the state that depends on the history
(the merge move builds a cascaded tree that the reverse split does not
restore), and selects the local-move points by ``SampleSub`` on those trees,
which depends on the points' own assignments. Neither leaves ``p(Π | X)``
exactly invariant. Here:

* every cluster ``c`` has a **canonical tree** ``t(c)``: ``SeqInsert`` of its
  points in increasing index order (IBHC without splits), with the tree
  *shape* built under the measure, family and ``u`` the chain started with
  and the potentials evaluated under the current ones. A cluster's tree is
  therefore a function of its point set only, cached by the point set.
* the proposal probability ``q(Π* | Π)`` is the **total** probability of
  reaching ``Π*``, summed over every internal node ``c*`` whose cut followed
  by ``StocInsert`` yields ``Π*`` (for each such ``c*`` the insertions are
  forced); a merge's probability sums over which of the merged clusters was
  picked first (paper eq. 11). ``q(Π | Π*)`` is computed the same way on
  the canonical trees of ``Π*``. With these the global moves are an exact MH
  chain on partitions (checked against enumeration in ``tests/exact``).
* the local moves update a uniformly random subset of ``ceil(n / 2**depth)``
  points by collapsed Gibbs (a subset drawn independently of the state keeps
  each update exact); the paper instead collects the leaves of ``depth``-fold
  ``SampleSub`` subtrees, which is not invariant.

The kernel is ``PartitionKernel(model, moves.chain(tree_guided_moves(...),
local_moves(depth), update_u()))`` (:mod:`jaxbnp.inference.partition.moves`);
:func:`tree_guided_moves` is the global moves as a composable move, its state
the device forest (``trees="device"``) or the chain id (``trees="host"``).

Everything else follows the paper and supplement: pick a cluster uniformly,
put each other cluster into ``M`` with probability ``1/(1 + d)``; split (B.2)
when ``M`` is empty by ``SampleSub`` on internal nodes, a cut, and
``StocInsert`` of the cut-off subtrees nearest first; merge (B.3) otherwise.

Example
-------
>>> import jax, numpyro, jaxbnp as bnp
>>> from numpyro.infer import MCMC
>>> def model(X):
...     z = numpyro.sample("z", bnp.Partition(bnp.DP(1.0), X.shape[0]))
...     numpyro.sample("X", bnp.ConjugateMixture(bnp.NormalGamma(), z), obs=X)
>>> X = jax.numpy.array([[-2.0], [-2.1], [2.0], [2.2], [2.1]])
>>> kernel = bnp.TreeGuidedMCMC(model, num_global_moves=5)
>>> mcmc = MCMC(kernel, num_warmup=5, num_samples=5, progress_bar=False)
>>> mcmc.run(jax.random.key(0), X)
>>> mcmc.get_samples()["z"].shape
(5, 5)
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import io_callback

from ..._random import typed_key
from ..._validation import check_int
from ...errors import CapacityError
from ...models.measures import DP, NGGP
from ..adapter import is_traced
from ..partition import moves
from ..partition.clusters import PartitionState, canonical_labels, clusters_from_labels, compact_labels
from ..partition.kernels import PartitionKernel, chain_id
from ..partition.moves import Context, MHInfo, Move
from . import host as host_trees
from .device import empty_forest, global_moves_forest

__all__ = ["TreeGuidedMCMC", "tree_guided_moves"]


def tree_guided_moves(num_moves: int, max_parts: int = 16, early_rejection: bool = True,
                      trees: str = "device", store: host_trees.HostTrees | None = None) -> Move:
    """tgMCMC's ``num_moves`` global moves as a composable move (module docstring); info
    :class:`~jaxbnp.inference.partition.moves.MHInfo`. ``num_moves=0`` is the identity.

    ``trees="device"``: the moves run compiled on array trees
    (:func:`jaxbnp.inference.tgmcmc.device.global_moves_forest`); the move's state is the
    device :class:`~jaxbnp.inference.tgmcmc.device.Forest`, kept between iterations.
    ``trees="host"``: one ``io_callback`` per iteration runs them on the host trees of the
    chain (:func:`jaxbnp.inference.tgmcmc.host.host_global_moves`); the move's state is the
    chain id (``Context.chain_id``); ``store`` (a :class:`~jaxbnp.inference.tgmcmc.host.HostTrees`,
    a new one when ``None``) holds the chains' host trees.
    """
    num_moves = check_int("num_moves", num_moves, 0)
    max_parts = check_int("max_parts", max_parts, 2)
    early_rejection = bool(early_rejection)
    if trees not in ("device", "host"):
        raise ValueError(f"trees must be 'device' or 'host', got {trees!r}.")
    if trees == "host" and store is None:
        store = host_trees.HostTrees()

    def init_fn(state: PartitionState, ctx: Context):
        if not num_moves:
            return ()
        if trees == "host":
            return jnp.asarray(0 if ctx.chain_id is None else ctx.chain_id, jnp.int32)
        return empty_forest(ctx.X, ctx.measure, ctx.family,
                            state.u if ctx.measure.has_auxiliary else None, state.clusters.capacity)

    def step_fn(key, state: PartitionState, move_state, ctx: Context):
        clusters, u = state
        X, measure, family = ctx.X, ctx.measure, ctx.family
        n, capacity = X.shape[0], clusters.capacity
        zero = jnp.zeros((), jnp.int32)
        if not num_moves:
            return state, move_state, MHInfo(zero, zero, jnp.zeros((), X.dtype), zero)
        if trees == "device":
            forest, info = global_moves_forest(
                key, move_state, clusters.labels, X, measure, family,
                u if measure.has_auxiliary else None,
                num_moves=num_moves, max_parts=max_parts, early_rejection=early_rejection,
            )
            clusters = clusters_from_labels(family, X, forest.labels, capacity, clusters.overflow | info.no_room)
            return PartitionState(clusters, u), forest, info.mh
        jit_trees = not host_trees.inside_pmap()
        labels, accepted, proposed, sum_log, num_log = io_callback(
            lambda *a: host_trees.host_global_moves(store, num_moves, early_rejection, jit_trees, *a),
            (
                jax.ShapeDtypeStruct((n,), jnp.int32),
                jax.ShapeDtypeStruct((), jnp.int32),
                jax.ShapeDtypeStruct((), jnp.int32),
                jax.ShapeDtypeStruct((), X.dtype),
                jax.ShapeDtypeStruct((), jnp.int32),
            ),
            move_state, jax.random.key_data(key), X,
            canonical_labels(clusters.labels, capacity), measure, family, u,
            ordered=False,
        )
        overflow = clusters.overflow | (labels.max() >= capacity)
        labels = jnp.where(labels < capacity, labels, 0)
        clusters = clusters_from_labels(family, X, labels, capacity, overflow)
        return PartitionState(clusters, u), move_state, MHInfo(accepted, proposed, sum_log, num_log)

    return Move(init_fn, step_fn)


# ----------------------------------------------------------------------------- the kernel
class TreeGuidedMCMC(PartitionKernel):
    """Tree-guided MCMC (Lee & Choi 2015) as a NumPyro kernel (module docstring).

    :param model: a NumPyro model with one latent ``Partition`` site whose
        measure is ``DP`` or ``NGGP`` and one observed ``ConjugateMixture``
        site (as for :class:`CollapsedGibbs`).
    :param num_global_moves: ``G``, global moves per iteration (``>= 0``;
        the paper uses 20).
    :param depth: ``D >= 1``; the local moves update ``ceil(n / 2**D)``
        randomly chosen points per iteration (the paper uses 2).
    :param init: initial partition when ``init_params`` has none:
        ``"ibhc"`` (IBHC in row order), ``"noisy"`` (the paper's noisy
        initialisation, random per chain), or ``"one"``, ``"singletons"``,
        ``"prior"`` as for ``CollapsedGibbs``.
    :param local_moves: set ``False`` to run the global moves alone (an
        irreducible, exact chain on its own; used by the tests).
    :param early_rejection: reject a global move as soon as a cheap upper bound
        of its ``log r`` is below the uniform draw (``host.TreeGuidedHost.global_move``):
        the same chain, faster; ``mean_log_accept`` then uses that bound for
        such moves (an upper bound of the statistic). ``False`` computes every
        ``log r`` in full.
    :param trees: ``"device"`` (default): the global moves run compiled in JAX on
        array trees (:mod:`jaxbnp.inference.tgmcmc.device`), vmapped over chains,
        with no host callback; ``"host"``: the trees live on the host as NumPy
        ``Node`` objects, one store per chain, edited through one ``io_callback``
        per iteration (:class:`~jaxbnp.inference.tgmcmc.host.TreeGuidedHost`). The same exact chain either way
        (equal ``log q`` on every move, tested); the random draws differ.
    :param max_parts: (``trees="device"``) a split proposal that would make more
        clusters than this proposes nothing, and a merge of more clusters than
        this is rejected (the same restriction both ways: still exact).
    :param capacity: as for :class:`CollapsedGibbs`. More clusters than ``capacity``
        raise ``CapacityError``.
    :param update_hyperparameters: as for :class:`CollapsedGibbs`.
    :param chain_batching: as for :class:`CollapsedGibbs`.

    Extra fields for ``MCMC.run(..., extra_fields=...)``: ``log_joint``,
    ``num_clusters``, ``num_accepted``, ``num_proposed``, ``mean_log_accept``
    (mean of ``min(0, log r)`` over the iteration's proposals).
    The same key gives the same draws under every ``chain_method``.
    """

    #: its host trees (``trees="host"``, or a start built inside a traced ``init``) are kept
    #: in one store per kernel, emptied when a run starts: groups of chains must not start
    #: side by side
    chains_in_threads = False

    def __init__(
        self,
        model: Callable,
        *,
        num_global_moves: int = 20,
        depth: int = 2,
        init: str = "ibhc",
        local_moves: bool = True,
        early_rejection: bool = True,
        capacity: int | None = None,
        update_hyperparameters: bool = False,
        chain_batching: str = "auto",
        trees: str = "device",
        max_parts: int = 16,
    ):
        if trees not in ("device", "host"):
            raise ValueError(
                f"trees must be 'device' (compiled array trees) or 'host' (NumPy trees edited "
                f"through io_callback), got {trees!r}."
            )
        self._trees = trees
        self._max_parts = check_int("max_parts", max_parts, 2)
        self._num_global_moves = check_int("num_global_moves", num_global_moves, 0)
        self._depth = check_int("depth", depth, 1)
        if init not in ("ibhc", "noisy", "one", "singletons", "prior"):
            raise ValueError(
                f"init must be 'ibhc', 'noisy', 'one', 'singletons' or 'prior', got {init!r}."
            )
        if not local_moves and self._num_global_moves < 1:
            raise ValueError(
                "TreeGuidedMCMC with local_moves=False needs num_global_moves >= 1 "
                f"(got {num_global_moves}); otherwise the partition never moves."
            )
        self._init = init
        self._local_moves = bool(local_moves)
        self._early_rejection = bool(early_rejection)
        # the host trees of this kernel's chains (trees="host"; a start built in a traced init)
        self._host_trees = host_trees.HostTrees()
        super().__init__(
            model,
            self._build_move(),
            capacity=capacity,
            init_strategy=init if init in ("one", "singletons", "prior") else "one",
            update_hyperparameters=update_hyperparameters,
            chain_batching=chain_batching,
        )

    def _build_move(self) -> Move:
        """Global moves, local moves (or nothing, keeping their two keys), then (NGGP) ``u``."""
        return moves.chain(
            tree_guided_moves(self._num_global_moves, self._max_parts, self._early_rejection,
                              self._trees, self._host_trees),
            moves.local_moves(self._depth) if self._local_moves else moves.identity(2),
            moves.update_u(),
        )

    def _validate_trace(self, model_trace, spec):
        measure = model_trace[spec.partition_site]["fn"].measure
        if not isinstance(measure, (DP, NGGP)):
            raise ValueError(
                "TreeGuidedMCMC needs a DP or NGGP partition prior (IBHC's potentials use the "
                f"measure's kappa), got {type(measure).__name__}; use bnp.CollapsedGibbs or "
                "bnp.SplitMerge for Pitman-Yor."
            )

    # -- runs and initial partition ----------------------------------------------------------
    def init(self, rng_key, num_warmup, init_params, model_args, model_kwargs):
        """Start a run from fresh host trees. The ``"ibhc"`` and ``"noisy"`` starts are built
        here on the host (:meth:`initial_params`) when the key and the data are concrete (NumPyro's
        ``"vectorized"`` and ``"sequential"`` chains), so the compiled programs hold no host
        callback; inside a traced ``init`` (``"parallel"`` chains, a ``jax.jit`` around it)
        they are built through one ``io_callback``: the same labels."""
        self._host_trees.clear()
        try:
            init_params = self.initial_params(rng_key, init_params, model_args, model_kwargs)
        except _Traced:
            pass
        return super().init(rng_key, num_warmup, init_params, model_args, model_kwargs)

    def initial_params(self, rng_key, init_params=None, model_args=(), model_kwargs=None) -> dict:
        """``init_params`` with this kernel's ``"ibhc"`` or ``"noisy"`` start of every chain
        (``rng_key``: one key, or one per chain as ``init`` gets them), built now on the host.

        The labels are in first-appearance order, ``(n,)`` or ``(chains, n)``; they are the
        ones ``init`` starts from with the same keys (the ``"noisy"`` start draws from each
        chain's key). Given ``init_params`` are returned unchanged when they hold the partition,
        and so is everything when the start is ``"one"``, ``"singletons"`` or ``"prior"``.
        More clusters than the capacity raise :class:`~jaxbnp.errors.CapacityError`.
        """
        params = dict(init_params or {})
        model_kwargs = dict(model_kwargs or {})
        if self._init not in ("ibhc", "noisy"):
            return params
        keys = typed_key(rng_key)
        if is_traced(keys, params, model_args, model_kwargs):
            raise _Traced
        self._spec, hyper0 = self._setup(params, model_args, model_kwargs)  # as init sets it
        spec = self._spec
        if spec.partition_site in params:
            return params
        batched = keys.ndim == 1
        if batched and params:  # per-chain hyperparameters: each chain's start in the program
            raise _Traced
        n = spec.num_points
        z = {name: jnp.asarray(params.get(name, value)) for name, value in hyper0.items()}
        if spec.u_site is not None:
            z[spec.u_site] = jnp.asarray(params.get(spec.u_site, 1.0), jnp.result_type(float))
        z[spec.partition_site] = jnp.zeros(n, jnp.int32)
        measure, family, X, _, _ = self._read(z, model_args, model_kwargs)
        u = z[spec.u_site] if spec.u_site is not None else jnp.ones(())
        to_host = lambda tree: jax.tree.map(np.asarray, tree)  # noqa: E731
        measure, family, X, u = to_host((measure, family, X, u))
        store = self._host_trees if self._trees == "host" else None
        rows = []
        for key in (keys if batched else [keys]):
            # the chain id and labels key of PartitionKernel._init_one
            cid = int(chain_id(key))
            k_labels = jax.random.split(key)[1]
            labels = host_trees.host_init_labels(
                store, self._init, cid, np.asarray(jax.random.key_data(k_labels)), X, measure,
                family, u)
            rows.append(compact_labels(labels))
        capacity = self.capacity_for(n)
        k = max(int(r.max()) + 1 for r in rows)
        if k > capacity:
            raise CapacityError(
                f"jaxbnp: TreeGuidedMCMC's init={self._init!r} start has {k} clusters but the "
                f"capacity is {capacity} cluster slots. Pass a larger capacity (e.g. "
                f"capacity={min(n, 2 * k)}).")
        params[spec.partition_site] = np.stack(rows) if batched else rows[0]
        return params

    def _init_labels(self, key, params, measure, family, X, u, capacity, chain_id):
        if self._init in ("one", "singletons", "prior"):
            return super()._init_labels(key, params, measure, family, X, u, capacity, chain_id)
        # a traced init (module docstring of init): the same start through a host callback
        n = X.shape[0]
        store = self._host_trees if self._trees == "host" else None
        method = self._init
        labels = io_callback(
            lambda *a: compact_labels(host_trees.host_init_labels(store, method, *a)),
            jax.ShapeDtypeStruct((n,), jnp.int32),
            chain_id, jax.random.key_data(key), X, measure, family, u,
            ordered=False,
        )
        return labels


class _Traced(Exception):
    """The start cannot be built on the host now (traced key or data)."""
