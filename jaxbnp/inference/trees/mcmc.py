"""Within-chain MCMC for Dirichlet diffusion trees (Neal 2003), pure core + NumPyro kernel.

docs/mathematics.md §5. Target: ``p(tree | c) p(X | tree, σ, s) p(c) p(σ) p(s)`` with the
structure and data terms of :mod:`jaxbnp.models.ddt`. One :func:`step` is

1. ``num_subtree_moves`` subtree moves (Neal's move): pick a non-root node
   ``s`` uniformly, detach the subtree below it (its parent ``w`` is freed and
   its sibling ``u`` joins ``w``'s parent), then propose a new divergence
   point ``(u', t')`` by the prior process of a new path on the rest ``R``
   (:func:`~jaxbnp.models.ddt.sample_attachment`); proposals with
   ``t' >= t_s`` (above the subtree's own top) are rejected. Metropolis-Hastings
   with the exact ratio::

       log r = [log p(T'|c) + log p(X|T')] − [log p(T|c) + log p(X|T)]
               + log q(u, t_w | R) − log q(u', t' | R)

   The choice of ``s`` is symmetric and ``R`` is the same both ways. For a
   single leaf the structure terms and ``q`` cancel exactly, leaving MH on the
   data term (Neal's move); for a larger subtree the leftover structure
   ratio is kept, so the move is exact for subtrees of any size.
2. A divergence-time sweep: every internal node in turn gets a random-walk
   MH update of ``logit((t − lo)/(hi − lo))`` between its parent's time
   ``lo`` (``0`` at the root) and its earliest child's time ``hi``
   (symmetric logistic increments of scale ``time_step_size``), with the
   Jacobian in the ratio.
3. Hyperparameters that are model sites, each by slice sampling its log
   (any prior on ``(0, ∞)``): ``c`` with the closed form of the structure
   term, ``(n−1) log c − c S + const`` with
   ``S = Σ_v (ℓ(t_v) − ℓ(t_p(v))) H_{m_v−1}``, ``ℓ(t) = −log(1−t)`` (so a
   ``Gamma(α, β)`` prior is conjugate, ``c | tree ~ Gamma(α + n − 1, β + S)``;
   the slice update is used anyway: the Gamma sampler is slow to compile),
   ``σ`` and ``s`` with the data term by message passing.

Everything is jit-compiled with static shapes and vmaps over chains; a step's
randomness comes from three ``jax.random.uniform`` call sites (each costs compile
time): one batch for the moves' nodes, increments and acceptance tests, one for
the slice updates, and one inside the subtree moves' walk, which draws its
uniforms 32 steps at a time so that memory does not grow with n × depth.
Floating point: proposals whose times round onto a neighbour's (or onto 1) give
trees off the support and are rejected.

Kernel pattern (BlackJAX's): ``init(tree, X, c, sigma, noise) -> DDTState`` and
``step(key, state, X, hyperpriors) -> (DDTState, DDTInfo)``, NamedTuples of arrays.
:class:`DiffusionTreeMCMC` wraps it as a NumPyro ``MCMCKernel`` whose state
(:class:`DiffusionTreeMCMCState`) holds all it needs; the one-call entry point
used by the CLI is :func:`jaxbnp.inference.trees.fit.fit_ddt`.

Example
-------
>>> import jax, numpyro, numpyro.distributions as dist, jaxbnp as bnp
>>> from numpyro.infer import MCMC
>>> from jaxbnp.models.ddt import DiffusionTree, BrownianLeaves
>>> from jaxbnp.inference.trees.mcmc import DiffusionTreeMCMC
>>> def model(X):
...     c = numpyro.sample("c", dist.LogNormal(0.0, 1.0))
...     tree = numpyro.sample("tree", DiffusionTree(c, X.shape[0]))
...     numpyro.sample("X", BrownianLeaves(tree, 1.0, 0.1), obs=X)
>>> mcmc = MCMC(DiffusionTreeMCMC(model), num_warmup=5, num_samples=5, progress_bar=False)
>>> mcmc.run(jax.random.key(0), jax.numpy.zeros((4, 2)))
>>> mcmc.get_samples()["tree"].time.shape
(5, 7)
"""

from __future__ import annotations

from functools import partial
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from numpyro.util import is_prng_key

from ..._xla import mark_loop_program
from ..._cache import auto_enable
from ..._programs import call_cached
from ..._random import typed_key
from ..._validation import check_data
from ...models.distributions import ConjugateMixture
from ...models.ddt import (
    CUT_MESSAGE,
    BrownianLeaves,
    DiffusionTree,
    Messages,
    Tree,
    bottom_up_order,
    check_tree,
    comb_tree,
    log_joint_terms_and_sizes,
    log_likelihood,
    messages_log_likelihood,
    num_leaves,
    refresh_messages,
    root_of,
    sample_tree,
    structure_log_prior_from,
    tree_messages,
)
from ..adapter import DiscreteSiteKernel, sample_sites, trace_model
from ..base import SamplingAlgorithm, run_chains
from .moves import (
    SLICE_UNIFORMS, DDTInfo, select_state, slice_log, subtree_log_q_ratio, subtree_move, sweep_uniforms,
    time_proposal, update_c,
)

__all__ = [
    "Hyperpriors", "DDTState", "DDTInfo", "init", "step", "algorithm",
    "subtree_proposal", "subtree_log_q_ratio", "select_state",
    "DiffusionTreeMCMC", "DiffusionTreeMCMCState",
]


class Hyperpriors(NamedTuple):
    """Priors (NumPyro distributions on ``(0, ∞)``) of the hyperparameters to update; ``None`` = fixed."""

    c: Any = None
    sigma: Any = None
    noise: Any = None


class DDTState(NamedTuple):
    """One chain: the tree, the hyperparameters and the cached terms of docs/mathematics.md §5.

    log_prior: structure term ``log p(tree | c)``.
    log_likelihood: data term ``log p(X | tree, σ, s)``.
    sizes: leaves below each node ``(2n−1,)`` (cached: the moves need them).
    """

    tree: Tree
    c: jax.Array
    sigma: jax.Array
    noise: jax.Array
    log_prior: jax.Array
    log_likelihood: jax.Array
    sizes: jax.Array




def init(tree: Tree, X: Any, c: Any, sigma: Any, noise: Any = 0.0) -> DDTState:
    """State of one chain (computes both cached terms). ``X``: ``(n, D)``."""
    dtype = tree.time.dtype
    X = jnp.asarray(X, dtype)
    c, sigma, noise = (jnp.asarray(v, dtype) for v in (c, sigma, noise))
    lp, ll, sizes = log_joint_terms_and_sizes(tree, X, c, sigma, noise)
    return DDTState(tree, c, sigma, noise, lp, ll, sizes)




# ----------------------------------------------------------------------------- proposals


def subtree_proposal(unif: jax.Array, state: DDTState):
    """Detach a uniformly chosen non-root subtree and re-attach it where a new path
    would diverge from the rest (module docstring, step 1).

    ``unif``: ``(n+1, 2)`` uniforms (rows ``0..n−1`` drive the path, row ``n``
    the node). Returns ``(tree', log q ratio, valid)``.
    """
    n = num_leaves(state.tree)
    return _subtree_proposal(unif[n, 0], unif[:n], state)[:3]




def _subtree_proposal(u_node: jax.Array, walk, state, log_survival=None):
    """:func:`subtree_move`'s first six fields."""
    return tuple(subtree_move(u_node, walk, state, log_survival)[:6])






def _metropolis(state: DDTState, msg: Messages, log_surv, proposal: Tree, sizes, root, starts,
                log_q_ratio, valid, log_u, moved):
    """Accept or reject ``proposal`` (subtree sizes ``sizes``, root ``root``; node ``moved``
    the only one whose time changed) with the data term from the messages brought up to date
    from ``starts`` (O(depth D), not the O(n D) upward pass) and the structure term from the
    sizes and ``log_surv = log1p(−time)``, kept up to date one node per move (one
    vectorised sum without logarithms: :func:`~jaxbnp.models.ddt.structure_log_prior_from`)."""
    new_msg = refresh_messages(proposal, msg, starts, state.sigma)
    ll = messages_log_likelihood(proposal, new_msg, root, state.sigma)
    new_surv = log_surv.at[moved].set(jnp.log1p(-proposal.time[moved]))
    lp = structure_log_prior_from(proposal, state.c, sizes, new_surv)
    log_r = (lp + ll) - (state.log_prior + state.log_likelihood) + log_q_ratio
    ok = valid & (log_u < log_r)  # NaN -> reject
    new = state._replace(tree=proposal, log_prior=lp, log_likelihood=ll, sizes=sizes)
    return select_state(ok, (new, new_msg, new_surv), (state, msg, log_surv)), ok


def _tree_moves(key, state: DDTState, X, num_subtree_moves: int, step_size):
    """``num_subtree_moves`` subtree moves, then one time move per internal node, driven by
    ``key``. Returns ``(state, messages, subtree moves accepted, time moves accepted)``.

    Two loops, one per kind of move, so a time move does not pay for a subtree
    proposal it would discard. The time moves' increments are logistic
    (``step_size · logit(U)``): symmetric. A subtree move's new path draws its uniforms
    in blocks of steps from ``fold_in(walk key, move)`` (:func:`~jaxbnp.models.ddt.descend`),
    so memory does not grow with n × depth.
    The nodes' Gaussian messages (:class:`~jaxbnp.models.ddt.Messages`) are computed once by
    a full upward pass and then kept up to date along the root paths each move changes, so
    a move costs O(depth D) in the data term; the sweep's data term is recomputed in full at
    the next sweep's start.
    """
    n = num_leaves(state.tree)
    k_walk, u_node, steps, log_u = sweep_uniforms(key, n, num_subtree_moves, step_size, state.tree.time.dtype)
    msg, _ = tree_messages(state.tree, X, state.sigma, state.noise)
    surv = jnp.log1p(-state.tree.time)  # log1p(−t) per node, one entry updated per move

    def subtree_move(i, carry):
        state, msg, surv, acc = carry
        proposal, log_q, valid, sizes, root, starts = _subtree_proposal(
            u_node[i], jax.random.fold_in(k_walk, i), state, surv)
        # the re-attached node's new parent (starts[1], the freed node reused) has a new time
        (state, msg, surv), ok = _metropolis(state, msg, surv, proposal, sizes, root, starts, log_q,
                                             valid, log_u[i], starts[1])
        return state, msg, surv, acc + ok.astype(jnp.int32)

    def time_move(j, carry):
        state, msg, surv, acc = carry
        proposal, log_q, valid = time_proposal(steps[j], state, j)
        starts = jnp.stack([n + j, -1]).astype(jnp.int32)
        (state, msg, surv), ok = _metropolis(state, msg, surv, proposal, state.sizes, root_of(state.tree),
                                             starts, log_q, valid, log_u[num_subtree_moves + j], n + j)
        return state, msg, surv, acc + ok.astype(jnp.int32)

    zero = jnp.zeros((), jnp.int32)
    acc_sub = zero
    if num_subtree_moves > 0:
        state, msg, surv, acc_sub = lax.fori_loop(0, num_subtree_moves, subtree_move,
                                                  (state, msg, surv, zero))
    state, msg, surv, acc_time = lax.fori_loop(0, n - 1, time_move, (state, msg, surv, zero))
    return state, msg, acc_sub, acc_time




# ------------------------------------------------------------------------- hyperparameters










def _update_scale(unif, state, X, prior, name):
    """Slice update of ``log`` of the data term's ``sigma`` or ``noise`` (``name``)."""
    order = bottom_up_order(state.tree)

    def log_lik(v):
        scales = {"sigma": state.sigma, "noise": state.noise, name: v}
        return log_likelihood(state.tree, X, scales["sigma"], scales["noise"], order=order)

    value, ll = slice_log(unif, prior, getattr(state, name), state.log_likelihood, log_lik)
    return state._replace(**{name: value, "log_likelihood": ll})


# ------------------------------------------------------------------------------------ step
def step(
    key: jax.Array,
    state: DDTState,
    X: jax.Array,
    hyperpriors: Hyperpriors = Hyperpriors(),
    *,
    num_subtree_moves: int | None = None,
    time_step_size: float = 1.0,
) -> tuple[DDTState, DDTInfo]:
    """One sweep: subtree moves, a divergence-time move per internal node, then the hyperparameters.

    ``num_subtree_moves`` defaults to ``n``. ``hyperpriors`` (static structure,
    any ``None`` is held fixed) gives the priors of ``c``, ``σ`` and ``s``.
    """
    n = num_leaves(state.tree)
    dtype = state.tree.time.dtype
    X = jnp.asarray(X, dtype)
    num = n if num_subtree_moves is None else int(num_subtree_moves)
    if num < 0:
        raise ValueError(f"num_subtree_moves must be >= 0, got {num_subtree_moves}.")
    k_moves, k_slice = jax.random.split(key)
    slices = jax.random.uniform(k_slice, (3, SLICE_UNIFORMS), dtype)
    state, _, sub_acc, time_acc = _tree_moves(k_moves, state, X, num, time_step_size)
    if hyperpriors.c is not None:
        state = update_c(slices[0], state, hyperpriors.c)
    if hyperpriors.sigma is not None:
        state = _update_scale(slices[1], state, X, hyperpriors.sigma, "sigma")
    if hyperpriors.noise is not None:
        state = _update_scale(slices[2], state, X, hyperpriors.noise, "noise")
    info = DDTInfo(sub_acc, jnp.asarray(num, jnp.int32), time_acc, jnp.asarray(n - 1, jnp.int32))
    return state, info


def algorithm(X, hyperpriors: Hyperpriors = Hyperpriors(), *, num_subtree_moves: int | None = None,
              time_step_size: float = 1.0) -> SamplingAlgorithm:
    """One diffusion-tree chain in the one shape (:class:`~jaxbnp.inference.base.SamplingAlgorithm`):

    * ``init(key, tree=None, c=1.0, sigma=1.0, noise=0.0) -> DDTState``: :func:`init` at the
      given tree, or at a draw from the DDT prior with divergence ``c`` (from ``key``);
    * ``step(key, state) -> (DDTState, DDTInfo)``: :func:`step` with these settings."""
    X = jnp.asarray(X)

    def init_fn(key, tree=None, c=1.0, sigma=1.0, noise=0.0):
        if tree is None:
            tree = sample_tree(key, c, X.shape[0], jnp.result_type(X.dtype, float))
        return init(tree, X, c, sigma, noise)

    def step_fn(key, state):
        return step(key, state, X, hyperpriors, num_subtree_moves=num_subtree_moves,
                    time_step_size=time_step_size)

    return SamplingAlgorithm(init_fn, step_fn)


# ------------------------------------------------------------------------- NumPyro kernel
class ModelSpec(NamedTuple):
    """What the kernel reads off one trace of the model. ``kind``: ``"brownian"`` (an observed
    ``BrownianLeaves`` site) or ``"cut"`` (an observed ``ConjugateMixture`` of
    ``cut_tree(tree, t_stop)``: the seed's cut model, :mod:`jaxbnp.inference.trees.cut`)."""

    tree_site: str
    data_site: str
    c_site: str | None
    sigma_site: str | None
    noise_site: str | None
    num_points: int
    kind: str = "brownian"
    t_stop_site: str | None = None

    @property
    def owned_sites(self) -> tuple[str, ...]:
        """The sites the kernel updates: the tree and ``c``, ``σ``, ``s``, ``t_stop`` when they are sites."""
        names = (self.tree_site, self.c_site, self.sigma_site, self.noise_site, self.t_stop_site)
        return tuple(s for s in names if s)

    @property
    def hyper_sites(self) -> tuple[str, ...]:
        """The hyperparameters' sites among :attr:`owned_sites`."""
        return tuple(s for s in (self.c_site, self.sigma_site, self.noise_site, self.t_stop_site) if s)


class _Reading(NamedTuple):
    """The model read at one ``z`` (:meth:`DiffusionTreeMCMC._read`)."""

    spec: ModelSpec
    c: Any
    sigma: Any
    noise: Any
    X: jax.Array
    priors: Hyperpriors
    log_hyper: jax.Array
    family: Any = None  # the cut model's conjugate family
    t_stop: Any = None  # the cut model's stopping time
    t_stop_prior: Any = None


class DiffusionTreeMCMCState(NamedTuple):
    """State of :class:`DiffusionTreeMCMC` (one chain; a leading axis when vectorised).

    z: the sites the kernel owns (``tree`` and the hyperparameter sites).
    chain: the core :class:`DDTState`.
    log_joint: the model's log density at ``z``: structure + data terms plus
        the hyperparameters' prior log densities (the unnormalised log posterior).
    subtree_accepted: subtree moves accepted in the last iteration.
    rng_key: key for the next iteration.
    """

    z: dict
    chain: DDTState
    log_joint: jax.Array
    subtree_accepted: jax.Array
    rng_key: jax.Array


def _fill_tree(site):
    """A placeholder tree for the DiffusionTree site before the kernel has one."""
    if site["type"] == "sample" and isinstance(site["fn"], DiffusionTree) and not site["is_observed"]:
        return comb_tree(site["fn"].num_points)
    return None


def _check_positive_prior(fn, name: str, what: str) -> None:
    if getattr(fn, "event_shape", ()) != () or getattr(fn, "batch_shape", ()) != ():
        raise ValueError(f"The prior of {what} (site '{name}') must be a scalar distribution.")
    with jax.ensure_compile_time_eval():  # init may run inside pmap (chain_method="parallel")
        negative_allowed = fn.support(jnp.asarray(-1.0))
    if isinstance(negative_allowed, jax.core.Tracer):
        return  # a support that depends on traced parameters cannot be checked here
    if bool(negative_allowed):
        raise ValueError(
            f"The prior of {what} (site '{name}') must live on (0, inf), e.g. dist.Gamma or "
            f"dist.LogNormal; got {type(fn).__name__}."
        )


def _find_spec(tr, kernel_name: str) -> ModelSpec:
    trees = sample_sites(tr, DiffusionTree, observed=False)
    if len(trees) != 1:
        raise ValueError(
            f"{kernel_name} needs a model with exactly one latent DiffusionTree site, e.g. "
            "tree = numpyro.sample('tree', DiffusionTree(c, n)); "
            f"found {len(trees)} ({trees})."
        )
    datas = sample_sites(tr, BrownianLeaves, observed=True)
    mixtures = sample_sites(tr, ConjugateMixture, observed=True)
    if len(datas) + len(mixtures) != 1:
        raise ValueError(
            f"{kernel_name} needs exactly one observed data site: BrownianLeaves (Neal's diffusion "
            "tree), e.g. numpyro.sample('X', BrownianLeaves(tree, sigma, noise), obs=X), or a "
            "ConjugateMixture of the tree's cut (the seed's cut model), e.g. "
            "z = numpyro.deterministic('z', bnp.cut_tree(tree, t_stop)); "
            "numpyro.sample('X', bnp.ConjugateMixture(family, z), obs=X); "
            f"found {len(datas)} BrownianLeaves and {len(mixtures)} ConjugateMixture sites."
        )
    if mixtures:
        return _find_cut_spec(tr, trees[0], mixtures[0], kernel_name)
    tree_site, data_site = tr[trees[0]], tr[datas[0]]
    if data_site["fn"].tree is not tree_site["value"]:
        raise ValueError(
            f"The BrownianLeaves site '{datas[0]}' must take the DiffusionTree site's value "
            f"('{trees[0]}') unchanged as its tree."
        )
    owned = {trees[0]}
    found = _hyper_sites(tr, owned, (
        ("c", tree_site["fn"].c, partial(_check_positive_prior, what="c (the divergence parameter)")),
        ("sigma", data_site["fn"].sigma, partial(_check_positive_prior, what="sigma (the Brownian scale)")),
        ("noise", data_site["fn"].noise, partial(_check_positive_prior, what="noise (the observation noise)")),
    ))
    _check_others(tr, owned, kernel_name)
    return ModelSpec(trees[0], datas[0], found["c"], found["sigma"], found["noise"], tree_site["fn"].num_points)


def _hyper_sites(tr, owned: set, wanted) -> dict:
    """For each ``(key, value, check)`` of ``wanted``: the latent sample site whose value is
    ``value`` (passed unchanged to the distribution that takes it; ``check(prior, name)`` checks
    its prior), or ``None`` for a constant. Adds the names found to ``owned``."""
    found = {}
    for key, value, check in wanted:
        found[key] = None
        for name, s in tr.items():
            if s["type"] == "sample" and not s["is_observed"] and s["value"] is value:
                check(s["fn"], name)
                found[key] = name
                owned.add(name)
    return found


def _check_others(tr, owned, kernel_name: str) -> None:
    others = [name for name in sample_sites(tr, observed=False) if name not in owned]
    if others:
        raise ValueError(
            f"The model has latent sites {others} that {kernel_name} does not update: it updates "
            "the tree and c, sigma, noise (Brownian model) or c, t_stop (cut model) when they are "
            "sample sites passed unchanged to DiffusionTree / BrownianLeaves / cut_tree (priors on "
            "(0, inf), t_stop's on (0, 1)). Make the others constants or observed. (Composing with "
            "NUTS through numpyro.infer.Gibbs is not possible: NumPyro's model checks need "
            "array-valued sites, and a tree is a pytree.)"
        )


def _cut_message(tr, tree_site: str, mixture_site: str, kernel_name: str):
    """The :func:`~jaxbnp.models.ddt.cut_tree` call whose labels the ConjugateMixture site takes."""
    labels = tr[mixture_site]["fn"].labels
    cuts = [s for s in tr.values() if s["type"] == CUT_MESSAGE and s["value"] is labels]
    if len(cuts) != 1 or cuts[0]["tree"] is not tr[tree_site]["value"]:
        raise ValueError(
            f"{kernel_name}: the ConjugateMixture site '{mixture_site}' must take the labels "
            f"bnp.cut_tree(tree, t_stop) of the DiffusionTree site '{tree_site}' unchanged (directly "
            "or through numpyro.deterministic), e.g. z = numpyro.deterministic('z', "
            "bnp.cut_tree(tree, t_stop)); numpyro.sample('X', bnp.ConjugateMixture(family, z), obs=X)."
        )
    if cuts[0]["num_clusters"] is not None:
        raise ValueError(
            f"{kernel_name}: the cut model cuts the tree at a stopping time: write "
            "bnp.cut_tree(tree, t_stop), not num_clusters=K."
        )
    return cuts[0]


def _check_unit_prior(fn, name: str) -> None:
    if getattr(fn, "event_shape", ()) != () or getattr(fn, "batch_shape", ()) != ():
        raise ValueError(f"The prior of t_stop (site '{name}') must be a scalar distribution.")
    with jax.ensure_compile_time_eval():
        outside = fn.support(jnp.asarray(-0.5)) | fn.support(jnp.asarray(1.5))
    if isinstance(outside, jax.core.Tracer):
        return
    if bool(outside):
        raise ValueError(
            f"The prior of t_stop (site '{name}') must live on (0, 1), e.g. dist.Beta or "
            f"dist.Uniform(0, 1); got {type(fn).__name__}."
        )


def _find_cut_spec(tr, tree_name: str, mixture_name: str, kernel_name: str) -> ModelSpec:
    """The cut model: ``ConjugateMixture(family, cut_tree(tree, t_stop))`` observed."""
    cut = _cut_message(tr, tree_name, mixture_name, kernel_name)
    tree_site = tr[tree_name]
    owned = {tree_name}
    found = _hyper_sites(tr, owned, (
        ("c", tree_site["fn"].c, partial(_check_positive_prior, what="c (the divergence parameter)")),
        ("t_stop", cut["t_stop"], _check_unit_prior),
    ))
    if found["t_stop"] is None:
        t = cut["t_stop"]
        if not isinstance(t, jax.core.Tracer) and not (np.ndim(t) == 0 and 0.0 < float(t) < 1.0):
            raise ValueError(f"{kernel_name}: t_stop must be a number in (0, 1) or a sample site, got {t!r}.")
    _check_others(tr, owned, kernel_name)
    return ModelSpec(tree_name, mixture_name, found["c"], None, None, tree_site["fn"].num_points,
                     kind="cut", t_stop_site=found["t_stop"])


class DiffusionTreeMCMC(DiscreteSiteKernel):
    """MCMC over a Dirichlet diffusion tree (and ``c``, ``σ``, ``s`` when they are sites).

    :param model: a NumPyro model with one latent ``DiffusionTree`` site and one
        observed ``BrownianLeaves`` site taking the tree (module example).
        ``c``, ``sigma`` and ``noise`` may be constants or sample sites with
        priors on ``(0, ∞)`` (slice-sampled by the kernel); no other latent
        sites. Or the seed's cut model (:mod:`jaxbnp.inference.trees.cut`): an
        observed ``ConjugateMixture(family, z)`` with
        ``z = numpyro.deterministic("z", cut_tree(tree, t_stop))``, ``c`` and
        ``t_stop`` constants or sample sites (``t_stop``'s prior on ``(0, 1)``).
        Composition with ``NUTS`` through ``numpyro.infer.Gibbs`` /
        ``HMCGibbs`` does not work: NumPyro's model validation calls
        ``jnp.ndim`` on every site's value, and the tree is a pytree (the
        kernel still implements ``refresh``/``wrap_model``).
    :param num_subtree_moves: subtree moves per iteration (default ``n``).
    :param time_step_size: step of the logit-scale random walk on times.
    :param init_strategy: ``"prior"`` (a draw of the generative process, the
        hyperparameters from their priors; the caterpillar when the draw is
        off the support in floating point) or ``"comb"`` (a fixed caterpillar).

    Works under ``MCMC(..., chain_method="sequential" | "vectorized" | "parallel")``
    with equal draws for equal keys (vectorized = one ``jax.vmap`` program).
    The step is the pure :func:`step`.
    Extra fields: ``"log_joint"``, ``"subtree_accepted"``.
    """

    sample_field = "z"

    def __init__(
        self,
        model: Callable,
        *,
        num_subtree_moves: int | None = None,
        time_step_size: float = 1.0,
        init_strategy: str = "prior",
    ):
        if not callable(model):
            raise ValueError(f"{type(self).__name__}(model): model must be a NumPyro model function.")
        if init_strategy not in ("prior", "comb"):
            raise ValueError(f"init_strategy must be 'prior' or 'comb', got {init_strategy!r}.")
        if num_subtree_moves is not None and int(num_subtree_moves) < 0:
            raise ValueError(f"num_subtree_moves must be >= 0, got {num_subtree_moves}.")
        if not (np.isfinite(time_step_size) and time_step_size > 0):
            raise ValueError(f"time_step_size must be a positive number, got {time_step_size}.")
        self._model = model
        self._num_subtree_moves = num_subtree_moves
        self._time_step_size = float(time_step_size)
        self._init_strategy = init_strategy

    # -- reading the model --------------------------------------------------------------
    # Nothing is kept on ``self`` between calls: the sites' names are read off a trace of
    # the model at the state's ``z`` (``_read``) each time a program is traced.
    def _read(self, z, model_args, model_kwargs) -> _Reading:
        """The model at ``z`` (which holds the tree): its sites, scales, data and hyperpriors."""
        tr = trace_model(self._model, z, model_args, model_kwargs)
        spec = self.find_spec(tr)
        tree_fn, data = tr[spec.tree_site]["fn"], tr[spec.data_site]
        log_hyper = sum(
            (jnp.sum(tr[s]["fn"].log_prob(tr[s]["value"])) for s in spec.hyper_sites), jnp.zeros(())
        )
        if spec.kind == "cut":
            cut = _cut_message(tr, spec.tree_site, spec.data_site, self.owner)
            return _Reading(spec, tree_fn.c, None, None, jnp.asarray(data["value"]),
                            Hyperpriors(tr[spec.c_site]["fn"] if spec.c_site else None), log_hyper,
                            data["fn"].family, cut["t_stop"],
                            tr[spec.t_stop_site]["fn"] if spec.t_stop_site else None)
        hyper_sites = (spec.c_site, spec.sigma_site, spec.noise_site)
        priors = Hyperpriors(*(tr[s]["fn"] if s else None for s in hyper_sites))
        return _Reading(spec, tree_fn.c, data["fn"].sigma, data["fn"].noise, jnp.asarray(data["value"]),
                        priors, log_hyper)

    def fill_site(self, site):
        return _fill_tree(site)

    def postprocess_fn(self, model_args, model_kwargs):
        """The samples plus the model's ``numpyro.deterministic`` sites (the cut model's labels)."""
        def post(z):
            tr = trace_model(self._model, z, model_args, model_kwargs)
            out = dict(z)
            out.update({name: s["value"] for name, s in tr.items() if s["type"] == "deterministic"})
            return out

        return post

    def find_spec(self, model_trace) -> ModelSpec:
        return _find_spec(model_trace, self.owner)

    def _setup(self, init_params, model_args, model_kwargs) -> ModelSpec:
        z0 = dict(init_params or {})
        tr, spec = self.read_model(z0, model_args, model_kwargs)
        X = tr[spec.data_site]["value"]
        if not isinstance(X, jax.core.Tracer):
            X = check_data(X, name=f"observed site '{spec.data_site}'")
            if X.shape[0] != spec.num_points:
                raise ValueError(
                    f"The observed site '{spec.data_site}' has {X.shape[0]} rows but the "
                    f"DiffusionTree has num_points={spec.num_points}."
                )
        if spec.tree_site in z0 and not isinstance(z0[spec.tree_site].time, jax.core.Tracer):
            value = z0[spec.tree_site]
            if value.time.ndim == 1:
                check_tree(value, spec.num_points, f"init_params['{spec.tree_site}']")
            else:
                for i in range(value.time.shape[0]):
                    check_tree(jax.tree.map(lambda a, i=i: a[i], value), spec.num_points,
                               f"init_params['{spec.tree_site}'][{i}]")
        return spec

    def _init_one(self, spec, key, params, model_args, model_kwargs):
        k_trace, key = jax.random.split(key)
        params = dict(params)
        if self._init_strategy == "comb" and spec.tree_site not in params:
            params[spec.tree_site] = comb_tree(spec.num_points, jnp.result_type(float))
        tr = trace_model(self._model, params, model_args, model_kwargs, key=k_trace)
        z = {spec.tree_site: jax.tree.map(jnp.asarray, tr[spec.tree_site]["value"])}
        dtype = z[spec.tree_site].time.dtype
        for name in spec.hyper_sites:
            z[name] = jnp.asarray(tr[name]["value"], dtype)
        state = self._state_from_z(z, jnp.zeros((), jnp.int32), key, model_args, model_kwargs)
        # a prior draw off the support (ties from rounding, see ddt.sample_tree) or with a
        # zero-probability data term: start from the caterpillar instead
        bad = ~jnp.isfinite(state.log_joint)
        z[spec.tree_site] = select_state(bad, comb_tree(spec.num_points, dtype), z[spec.tree_site])
        return self._state_from_z(z, jnp.zeros((), jnp.int32), key, model_args, model_kwargs)

    def _state_from_z(self, z, accepted, key, model_args, model_kwargs):
        r = self._read(z, model_args, model_kwargs)
        if r.spec.kind == "cut":
            from . import cut

            chain = cut.init(z[r.spec.tree_site], r.X, r.family, r.c, r.t_stop)
        else:
            chain = init(z[r.spec.tree_site], r.X, r.c, r.sigma, r.noise)
        lj = chain.log_prior + chain.log_likelihood + r.log_hyper.astype(chain.log_prior.dtype)
        return DiffusionTreeMCMCState(z, chain, lj, accepted, key)

    def _init_chains(self, spec, rng_key, init_params, model_args, model_kwargs):
        """The initial state(s): one chain for one key, else a batch (leading chain axis)."""
        init_params = dict(init_params or {})

        def one(k, p, args, kwargs):
            return self._init_one(spec, k, p, args, kwargs)

        def many(ks, ps, args, kwargs):
            # map, not vmap: initialisation runs once, and the batched generative
            # process takes about twice as long to compile
            return run_chains(one, ks, ps, args, kwargs, in_axes=(0, 0, None, None), how="map")

        # one compiled program (op-by-op tracing of the generative process is slow to
        # compile), kept on the kernel: a second MCMC.run of the same shape compiles nothing
        batched = not is_prng_key(rng_key)
        static = (spec, batched, self._init_strategy, tuple(sorted(init_params)))
        return call_cached(self, "init", static, many if batched else one, rng_key, init_params,
                           model_args=model_args, model_kwargs=model_kwargs)

    def init(self, rng_key, num_warmup, init_params, model_args, model_kwargs):
        rng_key = typed_key(rng_key)  # jax.random.PRNGKey or jax.random.key: the same draws
        auto_enable()  # JAX's persistent compilation cache (jaxbnp.enable_compilation_cache)
        spec = self._setup(init_params, model_args, model_kwargs)
        return self._init_chains(spec, rng_key, init_params, model_args, model_kwargs)

    def _core_step(self, key, z, chain, model_args, model_kwargs):
        """Read the model at ``z``, then the pure core's step (:func:`algorithm` with the model's
        values); returns ``(z, chain, info)``."""
        r = self._read(z, model_args, model_kwargs)
        spec = r.spec
        # the cached terms are current: values set by other kernels arrive through refresh
        dtype = chain.log_prior.dtype
        if spec.kind == "cut":
            from . import cut

            chain = chain._replace(c=jnp.asarray(r.c, dtype), t_stop=jnp.asarray(r.t_stop, dtype))
            core = cut.algorithm(r.X, r.family, cut.CutHyperpriors(r.priors.c, r.t_stop_prior),
                                 num_subtree_moves=self._num_subtree_moves, time_step_size=self._time_step_size)
            chain, info = core.step(key, chain)
            z = dict(z)
            z[spec.tree_site] = chain.tree
            for name, value in ((spec.c_site, chain.c), (spec.t_stop_site, chain.t_stop)):
                if name:
                    z[name] = value
            return z, chain, info
        chain = chain._replace(
            c=jnp.asarray(r.c, dtype), sigma=jnp.asarray(r.sigma, dtype), noise=jnp.asarray(r.noise, dtype)
        )
        core = algorithm(r.X, r.priors, num_subtree_moves=self._num_subtree_moves,
                         time_step_size=self._time_step_size)
        chain, info = core.step(key, chain)
        z = dict(z)
        z[spec.tree_site] = chain.tree
        for name, value in ((spec.c_site, chain.c), (spec.sigma_site, chain.sigma), (spec.noise_site, chain.noise)):
            if name:
                z[name] = value
        return z, chain, info

    def _log_joint(self, z, chain, model_args, model_kwargs):
        """Structure + data terms (cached in ``chain``) plus the hyperpriors' log densities at ``z``."""
        log_hyper = self._read(z, model_args, model_kwargs).log_hyper
        return chain.log_prior + chain.log_likelihood + log_hyper.astype(chain.log_prior.dtype)

    def _sample_one(self, state, model_args, model_kwargs):
        key, sub = jax.random.split(state.rng_key)
        z, chain, info = self._core_step(sub, state.z, state.chain, model_args, model_kwargs)
        lj = mark_loop_program(self._log_joint(z, chain, model_args, model_kwargs))
        return DiffusionTreeMCMCState(z, chain, lj, info.subtree_accepted, key)

    def sample(self, state, model_args, model_kwargs):
        if jnp.ndim(state.log_joint):  # chains on a leading axis (chain_method="vectorized")
            return run_chains(self._sample_one, state, model_args, model_kwargs,
                              in_axes=(0, None, None), how="vmap")
        return self._sample_one(state, model_args, model_kwargs)

    def refresh(self, state, model_args, model_kwargs):
        """Recompute the cached terms against the current conditioning values (Gibbs composition)."""

        def one(s):
            return self._state_from_z(s.z, s.subtree_accepted, s.rng_key, model_args, model_kwargs)

        if jnp.ndim(state.log_joint):
            return run_chains(one, state, in_axes=(0,), how="vmap")
        return one(state)

    def get_diagnostics_str(self, state):
        n = (np.shape(state.chain.tree.time)[-1] + 1) // 2
        num = self._num_subtree_moves if self._num_subtree_moves is not None else n
        acc = float(np.mean(np.asarray(state.subtree_accepted))) / max(num, 1)
        return f"log_joint={float(np.max(np.asarray(state.log_joint))):.1f} subtree acc={acc:.2f}"
