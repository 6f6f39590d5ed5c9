"""One BHMC sweep (:func:`step`): the point updates, then the subtree moves, the component
split-merge and the global updates (docs/mathematics.md §6)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from ..base import SamplingAlgorithm
from .beta import (
    complete_log_likelihood,
    update_beta,
    update_beta_exact_and_leaves,
    update_hyperparameters,
    update_theta,
)
from .model import (
    BHMCConfig,
    BHMCInfo,
    BHMCModel,
    BHMCState,
    PointInfo,
)
from .paths import (
    point_update,
)
from .regraft import (
    regraft,
)
from .start import init as start_init
from .split_merge import (
    split_merge,
)


def step(key, state: BHMCState, X, model: BHMCModel, config: BHMCConfig) -> tuple[BHMCState, BHMCInfo]:
    """One sweep of Algorithm 2 (module docstring, docs/mathematics.md §6): every point in a
    random order (:func:`point_update`), ``split_merge`` component split-or-merge moves
    (:func:`split_merge`), with ``regraft`` every subtree below the first level
    (:func:`regraft`), then ``B`` (:func:`update_beta_exact` or :func:`update_beta`), ``θ``
    (:func:`update_theta`) and, with ``update_hyper``, the hyperparameters.

    Pure and jittable; returns the new state and a :class:`BHMCInfo`.
    """
    n = X.shape[0]
    k_perm, k_points, k_beta, k_theta, k_hyper = jax.random.split(key, 5)
    k_regraft = jax.random.fold_in(key, 5)
    k_sm = jax.random.fold_in(key, 6)
    order = jax.random.permutation(k_perm, n)
    point_keys = jax.random.split(k_points, n)

    def body(i, carry):  # after an overflow the state stays as it was (the run is discarded)
        s, num_accepted = carry
        s, info = lax.cond(s.overflow, lambda s: (s, PointInfo(jnp.bool_(False))),
                           lambda s: point_update(point_keys[i], s, order[i], X, model, config), s)
        return s, num_accepted + info.accepted.astype(jnp.int32)

    state, num_accepted = lax.fori_loop(0, n, body, (state, jnp.zeros((), jnp.int32)))
    num_split_merge = jnp.zeros((), jnp.int32)
    if config.split_merge > 0 and n >= 2:
        def sm(t, carry):
            s, total = carry
            s, moved = lax.cond(s.overflow, lambda s: (s, jnp.bool_(False)),
                                lambda s: split_merge(jax.random.fold_in(k_sm, t), s, X, model, config,
                                                      redraw=not config.update_beta), s)
            return s, total + moved.astype(jnp.int32)

        state, num_split_merge = lax.fori_loop(0, config.split_merge, sm, (state, num_split_merge))
    num_regrafted = jnp.zeros((), jnp.int32)
    leaves_in_beta = config.update_beta and config.beta_rule == "exact"  # moved there, collapsed
    if config.regraft and config.depth >= 2:
        state, num_regrafted = regraft(k_regraft, state, config,
                                       config.depth - 1 if leaves_in_beta else config.depth)
    if leaves_in_beta:
        state, num_leaves_moved = update_beta_exact_and_leaves(k_beta, state, config,
                                                               move_leaves=config.regraft)
        num_regrafted = num_regrafted + num_leaves_moved
    elif config.update_beta:
        state = update_beta(k_beta, state, config)
    state = update_theta(k_theta, state, X, model, config)
    hyper_accepted = jnp.zeros(3, bool)
    if config.update_hyper:
        state, hyper_info = update_hyperparameters(k_hyper, state, config)
        hyper_accepted = hyper_info.accepted
    state = state._replace(log_lik=complete_log_likelihood(state, X, model, config))
    return state, BHMCInfo(num_accepted, jnp.asarray(n, jnp.int32), hyper_accepted, num_regrafted,
                           num_split_merge)


def algorithm(X, hyper, model: BHMCModel, config: BHMCConfig) -> SamplingAlgorithm:
    """BHMC's Algorithm 2 in the one shape (:class:`~jaxbnp.inference.base.SamplingAlgorithm`):

    * ``init(key) -> BHMCState``: :func:`~jaxbnp.inference.bhmc.start.init` (paths from the
      nCRP prior, components from a CRP, ``hyper``'s ``alpha``, ``gamma0``, ``gamma``);
    * ``step(key, state) -> (BHMCState, BHMCInfo)``: one sweep (:func:`step`).

    A state whose trees outgrew the capacities in ``config`` has ``overflow`` set."""
    X = jnp.asarray(X)

    def init_fn(key):
        return start_init(key, X, hyper, model, config)

    def step_fn(key, state):
        return step(key, state, X, model, config)

    return SamplingAlgorithm(init_fn, step_fn)
