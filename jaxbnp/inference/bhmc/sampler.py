"""BHMC sampler (Huang et al., Algorithm 2): MH on paths, Gibbs on components, β and θ updates.

docs/mathematics.md §6, model in :mod:`jaxbnp.models.nested`. One :func:`step` (a sweep) visits the
points in a random order (paper: ``Shuffled(X)``) and for point ``n``

1. cleans up ``c_n`` and ``v_n``: removes ``n`` from its component (a
   component left empty is folded back into the rest mass, ``β*_z += β_zk`` at
   every node) and from its path (the counts without ``n``, ``V∖{v_n}``);
2. proposes a path ``v'_n`` from the nested CRP given ``V∖{v_n}``, drawing
   ``β_z' ~ Dir(γβ_z1, …, γβ_zK, γβ*_z)`` for new nodes, and accepts it with
   probability (paper §4.1)::

       A = min{1, p(x_n | β_{v'_nL}, θ) p(V') nCRP(v_n; V∖{v_n})
                  / [p(x_n | β_{v_nL}, θ) p(V) nCRP(v'_n; V∖{v_n})]}

   with ``c_n`` summed out, ``p(x | β, θ) = Σ_k β_k f(x; θ_k) + β* f*(x)``
   (eq. 1), ``f = N(θ_k, Σ)``, ``f* = N(μ0, Σ0 + Σ)``; ``p(V')/p(V)`` is the
   path prior of docs/mathematics.md §6 (by exchangeability it equals the nCRP ratio, so
   the prior and proposal terms cancel and ``A`` is the likelihood ratio);
   By default (``path_update="gibbs"``) step 2 is instead an exact Gibbs draw of the
   path (:func:`path_gibbs`): every existing leaf and a new branch under every node,
   scored at once, the new branch's weights integrated out.
3. draws ``c_n`` by eq. 2: ``∝ β_zk f(x_n; θ_k)`` for an existing component,
   ``∝ β*_z f*(x_n)`` for a new one; a new component takes a free slot, its
   ``θ`` is drawn from ``N(θ | x_n)`` and every node breaks its rest stick
   (paper §4.1): the root by ``u ~ Beta(1, γ0)``, a child ``z'`` of ``z`` by
   ``u ~ Beta(γβ_z,new + 1[z' on v_n], γβ*_z)``, top down.

After all points, with ``regraft`` (default), every subtree below the first level gets a
Gibbs draw of its place (:func:`regraft`; docs/mathematics.md §6, "Subtree moves"). Then
the weights by eqs. 3–4 (``β_root ~ Dir(N_1..N_K, γ0)``,
``β_z' ~ Dir(N_z'k + γβ_zk, γβ*_z)``, top down, ``N_z'k`` the points of
component ``k`` below ``z'``), the means by eq. 5 and, optionally, a random-walk
MH on ``log α``, ``log γ0`` and ``log γ`` under the paper's hyperpriors
(``α ~ Ga(3, 1)``, ``γ0 ~ Ga(3.5, 1)``, ``γ ~ Unif(0, 1.5)``).

Deviations and exactness (say so, docs/mathematics.md §0):

* The new-component split adds ``+1`` to the first Beta parameter at the
  nodes on the point's own path. Paper §4.1 uses ``Beta(γβ_z,new, γβ*_z)``
  at every non-root node, which is the prior of an unselected atom; the atom
  was selected by ``x_n`` at its leaf, and the Chinese-restaurant-franchise
  posterior (one new table per restaurant on the path) gives the ``+1`` — the
  same ``+1`` the paper's root rule ``Beta(1, γ0)`` already has. Pass
  ``paper_split=True`` for the paper's rule.
* Steps 1–3 and eq. 5 are exact conditionals (checked by the Geweke test in
  ``tests/exact/test_bhmc_exact.py``). Eqs. 3–4, as in the paper, are not the exact
  conditionals of ``β`` once two points share a non-root node (they use point counts
  where the HDP needs table counts); the default ``beta_rule="exact"`` replaces them by
  :func:`update_beta_exact` (table counts for the leaves' parents, Metropolis-Hastings
  above), and the Geweke test runs with every update on. ``beta_rule="paper"`` keeps
  eqs. 3–4.
* Empty components are removed (folded into the rest mass), which is what
  eq. 3 does anyway (a ``Dir`` parameter ``N_k = 0`` gives ``β_0k = 0``).

Arrays: ``node_capacity`` node slots (node ``0`` the root) and
``component_capacity`` component slots. Running out of either sets
``overflow`` (the move that needed the slot is not made) and
:func:`fit_bhmc` raises :class:`~jaxbnp.errors.CapacityError`
naming the option to raise: nothing is dropped silently.

Kernel contract (BlackJAX's): ``init(key, X, hyper, model, config) -> BHMCState`` and
``step(key, state, X, model, config) -> (BHMCState, BHMCInfo)`` are pure and
jittable, the per-sweep move counts in :class:`BHMCInfo`. :class:`BHMCKernel`
is the NumPyro ``MCMCKernel`` over them (its whole state in
:class:`BHMCKernelState`); :func:`fit_bhmc` is the one-call entry, sampling
through :func:`jaxbnp.inference.runner.run`.

Layout: this module gathers the public names of the modules that implement the sampler,
one room each: :mod:`~jaxbnp.inference.bhmc.model` (settings, state, model constants, shared
helpers), :mod:`~jaxbnp.inference.bhmc.paths` (the point update),
:mod:`~jaxbnp.inference.bhmc.regraft` (subtree moves), :mod:`~jaxbnp.inference.bhmc.beta`
(weights, means, hyperparameters), :mod:`~jaxbnp.inference.bhmc.split_merge`,
:mod:`~jaxbnp.inference.bhmc.sweep` (:func:`step`), :mod:`~jaxbnp.inference.bhmc.start`
(initial states), :mod:`~jaxbnp.inference.bhmc.kernel` (:class:`BHMCKernel`) and
:mod:`~jaxbnp.inference.bhmc.fit` (:func:`fit_bhmc`). A function is looked up in the module
that calls it: to replace one (a test's broken move), patch it there.

Example
-------
>>> import jax, numpy as np
>>> from jaxbnp.inference.bhmc.sampler import fit_bhmc
>>> X = np.r_[np.random.default_rng(0).normal(-3, 0.3, (10, 2)), np.random.default_rng(1).normal(3, 0.3, (10, 2))]
>>> fit = fit_bhmc(X, key=jax.random.key(0), depth=2, num_samples=20, num_warmup=20, num_chains=2)
>>> fit.labels_per_level.shape, fit.log_lik.shape
((2, 20), (2, 20))
"""

from __future__ import annotations

from .beta import (
    antoniak,
    complete_log_likelihood,
    update_beta,
    update_beta_exact,
    update_hyperparameters,
    update_theta,
)
from .fit import BHMCFit, fit_bhmc, labels_at_level
from .kernel import BHMCKernel, BHMCKernelState
from .model import (
    FAST_COMPILE,
    BHMCConfig,
    BHMCHyper,
    BHMCInfo,
    BHMCModel,
    BHMCState,
    HyperInfo,
    PointInfo,
    log_acceptance,
    make_model,
)
from .paths import path_gibbs, point_update
from .regraft import (
    leaf_table_log_weights,
    regraft,
    regraft_leaves,
    regraft_log_prior,
    regraft_log_weights,
    regraft_node,
)
from .split_merge import split_merge, split_merge_log_ratio
from .start import init, init_from, state_from_simulation, ward_start
from .sweep import algorithm, step

__all__ = [
    "algorithm",
    "FAST_COMPILE",
    "BHMCConfig",
    "BHMCFit",
    "BHMCHyper",
    "BHMCInfo",
    "BHMCKernel",
    "BHMCKernelState",
    "BHMCModel",
    "BHMCState",
    "HyperInfo",
    "PointInfo",
    "antoniak",
    "complete_log_likelihood",
    "fit_bhmc",
    "init",
    "init_from",
    "labels_at_level",
    "leaf_table_log_weights",
    "log_acceptance",
    "make_model",
    "path_gibbs",
    "point_update",
    "regraft",
    "regraft_leaves",
    "regraft_log_prior",
    "regraft_log_weights",
    "regraft_node",
    "split_merge",
    "split_merge_log_ratio",
    "state_from_simulation",
    "step",
    "update_beta",
    "update_beta_exact",
    "update_hyperparameters",
    "update_theta",
    "ward_start",
]
