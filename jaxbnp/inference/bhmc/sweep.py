"""One BHMC sweep (:func:`step`): the point updates, then the subtree moves, the component
split-merge and the global updates (docs/mathematics.md §6), as a ``chain`` of moves
(:class:`~jaxbnp.inference.base.Move`, the partition moves' protocol)."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from ..._ranks import permutation
from ..base import Move, SamplingAlgorithm, chain, no_state
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


class SweepContext(NamedTuple):
    """What BHMC's moves read and do not change: the data, the model, the settings."""

    X: jax.Array
    model: BHMCModel
    config: BHMCConfig


def point_updates() -> Move:
    """Every point in a random order (:func:`point_update`); two keys: the order, then the
    points' own. Info: the number of accepted path moves. After an overflow the state
    stays as it was (the run is discarded)."""

    def step_fn(keys, state, move_state, ctx):
        X, model, config = ctx
        n = X.shape[0]
        order = permutation(keys[0], n)
        point_keys = jax.random.split(keys[1], n)

        def body(i, carry):
            s, num_accepted = carry
            s, info = lax.cond(s.overflow, lambda s: (s, PointInfo(jnp.bool_(False))),
                               lambda s: point_update(point_keys[i], s, order[i], X, model, config), s)
            return s, num_accepted + info.accepted.astype(jnp.int32)

        state, num_accepted = lax.fori_loop(0, n, body, (state, jnp.zeros((), jnp.int32)))
        return state, move_state, num_accepted

    return Move(no_state, step_fn, 2)


def component_split_merge() -> Move:
    """``config.split_merge`` component split-or-merge moves (:func:`split_merge`, each with
    the key ``fold_in(key, t)``). Info: how many moved."""

    def step_fn(key, state, move_state, ctx):
        X, model, config = ctx
        total = jnp.zeros((), jnp.int32)
        if config.split_merge > 0 and X.shape[0] >= 2:
            def sm(t, carry):
                s, total = carry
                s, moved = lax.cond(s.overflow, lambda s: (s, jnp.bool_(False)),
                                    lambda s: split_merge(jax.random.fold_in(key, t), s, X, model, config,
                                                          redraw=not config.update_beta), s)
                return s, total + moved.astype(jnp.int32)

            state, total = lax.fori_loop(0, config.split_merge, sm, (state, total))
        return state, move_state, total

    return Move(no_state, step_fn)


def _leaves_in_beta(config: BHMCConfig) -> bool:
    """Whether the leaves move inside the exact ``B`` update (collapsed) instead of in ``regraft``."""
    return config.update_beta and config.beta_rule == "exact"


def subtree_regraft() -> Move:
    """``regraft`` of every subtree below the first level (:func:`regraft`). Info: how many
    moved."""

    def step_fn(key, state, move_state, ctx):
        config = ctx.config
        moved = jnp.zeros((), jnp.int32)
        if config.regraft and config.depth >= 2:
            state, moved = regraft(key, state, config,
                                   config.depth - 1 if _leaves_in_beta(config) else config.depth)
        return state, move_state, moved

    return Move(no_state, step_fn)


def beta_update() -> Move:
    """``B``: :func:`update_beta_exact_and_leaves` (the exact rule, with the leaves when
    ``regraft``) or :func:`update_beta`; nothing without ``update_beta``. Info: the leaves
    moved."""

    def step_fn(key, state, move_state, ctx):
        config = ctx.config
        moved = jnp.zeros((), jnp.int32)
        if _leaves_in_beta(config):
            state, moved = update_beta_exact_and_leaves(key, state, config, move_leaves=config.regraft)
        elif config.update_beta:
            state = update_beta(key, state, config)
        return state, move_state, moved

    return Move(no_state, step_fn)


def theta_update() -> Move:
    """The components' parameters ``θ`` (:func:`update_theta`)."""

    def step_fn(key, state, move_state, ctx):
        return update_theta(key, state, ctx.X, ctx.model, ctx.config), move_state, ()

    return Move(no_state, step_fn)


def hyperparameter_update() -> Move:
    """With ``update_hyper``, the hyperparameters (:func:`update_hyperparameters`). Info:
    which of the three were accepted."""

    def step_fn(key, state, move_state, ctx):
        accepted = jnp.zeros(3, bool)
        if ctx.config.update_hyper:
            state, info = update_hyperparameters(key, state, ctx.config)
            accepted = info.accepted
        return state, move_state, accepted

    return Move(no_state, step_fn)


def log_likelihood_refresh() -> Move:
    """The state's complete-data log-likelihood, recomputed (no key used)."""

    def step_fn(key, state, move_state, ctx):
        return state._replace(log_lik=complete_log_likelihood(state, ctx.X, ctx.model, ctx.config)), \
            move_state, ()

    return Move(no_state, step_fn)


def _sweep_keys(key):
    """Each move's key in one sweep: ``split(key, 5)`` gives the order and points' keys,
    ``B``'s, ``θ``'s and the hyperparameters'; the split-merge and regraft moves fold in 6 and
    5 (what Algorithm 2's code drew before it was a chain of moves: the same draws)."""
    k = jax.random.split(key, 5)
    return (k[0:2], jax.random.fold_in(key, 6), jax.random.fold_in(key, 5), k[2], k[3], k[4], key)


#: one sweep of Algorithm 2 as a chain of moves (:func:`step`)
SWEEP = chain(point_updates(), component_split_merge(), subtree_regraft(), beta_update(),
              theta_update(), hyperparameter_update(), log_likelihood_refresh(), keys=_sweep_keys)


def step(key, state: BHMCState, X, model: BHMCModel, config: BHMCConfig) -> tuple[BHMCState, BHMCInfo]:
    """One sweep of Algorithm 2 (module docstring, docs/mathematics.md §6), the chain of moves
    :data:`SWEEP`: every point in a random order (:func:`point_updates`), ``split_merge``
    component split-or-merge moves (:func:`component_split_merge`), with ``regraft`` every
    subtree below the first level (:func:`subtree_regraft`), then ``B``
    (:func:`beta_update`), ``θ`` (:func:`theta_update`) and, with ``update_hyper``, the
    hyperparameters (:func:`hyperparameter_update`).

    Pure and jittable; returns the new state and a :class:`BHMCInfo`.
    """
    ctx = SweepContext(X, model, config)
    state, _, infos = SWEEP.step(key, state, SWEEP.init(state, ctx), ctx)
    num_accepted, num_split_merge, num_regrafted, num_leaves_moved, _, hyper_accepted, _ = infos
    return state, BHMCInfo(num_accepted, jnp.asarray(X.shape[0], jnp.int32), hyper_accepted,
                           num_regrafted + num_leaves_moved, num_split_merge)


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
