"""BHMC's containers: settings (:class:`BHMCConfig`), the sampler's state and per-sweep
information, and the small helpers every move shares (docs/mathematics.md §6). The model's
constants (:class:`BHMCModel`, :func:`make_model`) and the nCRP and Gaussian pieces
(:func:`full_path`, :func:`ncrp_log_prob`, :func:`mvn_logpdf`) are the model's:
:mod:`jaxbnp.models.nested`, re-exported here."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from ..._math import LOG_2PI
from ..._random import log_dirichlet
from ...models.nested import (  # the model's constants and nCRP pieces, re-exported here
    BHMCModel,
    full_path,
    make_model,
    mvn_logpdf,
    ncrp_log_prob,
)

__all__ = [
    "FAST_COMPILE",
    "PATH_UPDATES",
    "BETA_RULES",
    "BHMCConfig",
    "BHMCState",
    "BHMCHyper",
    "PointInfo",
    "HyperInfo",
    "BHMCInfo",
    "log_dirichlet_logc",
    "log_acceptance",
    "LOG_2PI",
    "BHMCModel",
    "full_path",
    "make_model",
    "mvn_logpdf",
    "ncrp_log_prob",
]

FAST_COMPILE = {"xla_backend_optimization_level": 0, "xla_cpu_use_fusion_emitters": False}
#: the values of BHMCConfig's path_update and beta_rule
PATH_UPDATES = ("gibbs", "mh")
BETA_RULES = ("exact", "paper")


class BHMCConfig(NamedTuple):
    """Static settings (hashable; bound by closure or passed as a static argument).

    depth: ``L``. node_capacity, component_capacity: slots. update_beta: run
    eqs. 3–4 after each sweep. update_hyper: MH on ``α, γ0, γ``.
    paper_split: the paper's new-component split (no ``+1``, module docstring).
    hyper_step: random-walk scale on the log of each hyperparameter.
    path_update: ``"gibbs"`` (default: every existing path and a new branch at
    every node scored at once, :func:`path_gibbs`) or ``"mh"`` (the paper's
    Algorithm 2: one nCRP proposal, accepted by its likelihood ratio).
    beta_rule: ``"exact"`` (default: :func:`update_beta_exact`) or ``"paper"`` (eqs. 3–4
    with point counts, :func:`update_beta`; not the exact conditionals).
    beta_mh_steps, beta_mh_scale: the random-walk MH steps of ``"exact"`` on the nodes
    above the leaves' parents, and their scale in additive log-ratio coordinates.
    regraft: after the points, a Gibbs draw of the place of every subtree below the first
    level (:func:`regraft`: whole leaves and subtrees move to another parent or a new branch;
    with ``beta_rule="exact"`` the leaves move inside the ``β`` update, :func:`regraft_leaves`).
    split_merge: Metropolis-Hastings split-or-merge moves of the components per sweep, after
    the points (:func:`split_merge`; ``0``: none).
    """

    depth: int
    node_capacity: int
    component_capacity: int
    update_beta: bool = True
    update_hyper: bool = False
    paper_split: bool = False
    hyper_step: float = 0.3
    path_update: str = "gibbs"
    beta_rule: str = "exact"
    beta_mh_steps: int = 20
    beta_mh_scale: float = 0.3
    regraft: bool = True
    split_merge: int = 1


class BHMCState(NamedTuple):
    """One chain of BHMC (module docstring).

    paths: ``(N, L)`` int32 node ids (root ``0`` implicit). parent, depth,
    count: ``(M,)`` int32 node table (``count = N_z``, ``count > 0`` = in the
    tree). log_beta: ``(M, K + 1)`` log weights (last column the rest).
    node_comp: ``(M, K)`` int32 ``N_zk``. c: ``(N,)`` component slots.
    comp_active: ``(K,)``. theta: ``(K, D)``. alpha, gamma0, gamma: the
    hyperparameters. overflow: a slot was needed while all were used (sticky).
    log_lik: the complete-data log likelihood ``log p(X, c, V | B, θ)`` of
    this state (:func:`complete_log_likelihood`).
    """

    paths: jax.Array
    parent: jax.Array
    depth: jax.Array
    count: jax.Array
    log_beta: jax.Array
    node_comp: jax.Array
    c: jax.Array
    comp_active: jax.Array
    theta: jax.Array
    alpha: jax.Array
    gamma0: jax.Array
    gamma: jax.Array
    overflow: jax.Array
    log_lik: jax.Array


class BHMCHyper(NamedTuple):
    """The starting hyperparameters ``α, γ0, γ`` as arrays (what :func:`init` reads of a
    :class:`~jaxbnp.models.nested.NestedHDP`; a pytree, so it can be a traced argument)."""

    alpha: jax.Array
    gamma0: jax.Array
    gamma: jax.Array


class PointInfo(NamedTuple):
    """What :func:`point_update` did. accepted: ``()`` bool, the point's path changed (with
    ``path_update="mh"``: a proposal was accepted and differs from the current path)."""

    accepted: jax.Array


class HyperInfo(NamedTuple):
    """What :func:`update_hyperparameters` did. accepted: ``(3,)`` bool, the MH moves of
    ``α, γ0, γ`` were accepted."""

    accepted: jax.Array


class BHMCInfo(NamedTuple):
    """What one :func:`step` did (docs/mathematics.md §6).

    num_accepted: ``()`` int32 points whose path changed (a proposal equal to
    the current path does not count). num_proposed: ``()`` int32 path updates
    made (one per point, ``N``). hyper_accepted: ``(3,)``
    bool, the MH moves of ``α, γ0, γ`` accepted (all ``False`` when
    ``update_hyper`` is off). num_regrafted: ``()`` int32 subtrees that :func:`regraft`
    moved to another place. num_split_merge: ``()`` int32 component splits and merges
    accepted (:func:`split_merge`).
    """

    num_accepted: jax.Array
    num_proposed: jax.Array
    hyper_accepted: jax.Array
    num_regrafted: jax.Array
    num_split_merge: jax.Array


def log_dirichlet_logc(key, log_conc):
    """``log`` of ``Dir(exp(log_conc))`` along the last axis; ``−inf`` entries stay zero weight."""
    return log_dirichlet(key, jnp.exp(log_conc))


def log_acceptance(lik_new, lik_old, prior_new, prior_old, q_fwd, q_back):
    """Paper §4.1: ``log A = [log p(x|v') + log p(V')] − [log p(x|v) + log p(V)] + log q(v|·) − log q(v'|·)``."""
    return (lik_new + prior_new) - (lik_old + prior_old) + (q_back - q_fwd)
