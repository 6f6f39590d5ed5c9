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

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from numpyro.util import is_prng_key

from ..._cache import auto_enable
from ..._programs import call_cached
from ..._random import typed_key
from ..._validation import check_data
from ...models.ddt import (
    BrownianLeaves,
    DiffusionTree,
    Messages,
    Tree,
    ancestor_mask,
    attach,
    bottom_up_order,
    check_tree,
    comb_tree,
    descend,
    detach,
    harmonic_numbers,
    log_attachment_density,
    log_joint_terms_and_sizes,
    log_likelihood,
    messages_log_likelihood,
    num_leaves,
    refresh_messages,
    root_of,
    sample_tree,
    structure_log_prior,
    structure_log_prior_from,
    tree_messages,
)
from ..adapter import DiscreteSiteKernel, sample_sites, trace_model
from ..base import SamplingAlgorithm, run_chains

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


class DDTInfo(NamedTuple):
    """Acceptance counts of one :func:`step`."""

    subtree_accepted: jax.Array
    subtree_proposed: jax.Array
    time_accepted: jax.Array
    time_proposed: jax.Array


def init(tree: Tree, X: Any, c: Any, sigma: Any, noise: Any = 0.0) -> DDTState:
    """State of one chain (computes both cached terms). ``X``: ``(n, D)``."""
    dtype = tree.time.dtype
    X = jnp.asarray(X, dtype)
    c, sigma, noise = (jnp.asarray(v, dtype) for v in (c, sigma, noise))
    lp, ll, sizes = log_joint_terms_and_sizes(tree, X, c, sigma, noise)
    return DDTState(tree, c, sigma, noise, lp, ll, sizes)


def select_state(pred, new, old):
    return jax.tree.map(lambda a, b: jnp.where(pred, a, b), new, old)


# ----------------------------------------------------------------------------- proposals
def subtree_log_q_ratio(log_q_back, log_q_fwd):
    """``log q(T | T') − log q(T' | T)`` of the subtree move (a function so tests can break it)."""
    return log_q_back - log_q_fwd


def subtree_proposal(unif: jax.Array, state: DDTState):
    """Detach a uniformly chosen non-root subtree and re-attach it where a new path
    would diverge from the rest (module docstring, step 1).

    ``unif``: ``(n+1, 2)`` uniforms (rows ``0..n−1`` drive the path, row ``n``
    the node). Returns ``(tree', log q ratio, valid)``.
    """
    n = num_leaves(state.tree)
    return _subtree_proposal(unif[n, 0], unif[:n], state)[:3]


def _subtree_proposal(u_node: jax.Array, walk, state: DDTState, log_survival=None):
    """:func:`subtree_proposal` with the node chosen by the uniform ``u_node`` and the new
    path driven by ``walk`` (uniforms or a key, as :func:`~jaxbnp.models.ddt.descend`),
    then ``(sizes', root', starts)``: the new tree's subtree sizes and root, and the two
    nodes from which :func:`~jaxbnp.models.ddt.refresh_messages` brings the messages up
    to date (the detached node's old sibling's new parent and the new divergence node).
    ``log_survival``: ``log1p(−time)`` per node when the caller keeps it (the proposal
    densities then take no logarithm over the nodes; the same values)."""
    tree, sizes, c = state.tree, state.sizes, state.c
    n = num_leaves(tree)
    root = root_of(tree)
    r = jnp.minimum(jnp.floor(u_node * (2 * n - 2)).astype(jnp.int32), 2 * n - 3)
    s = jnp.where(r < root, r, r + 1)  # uniform over the 2n-2 non-root nodes
    t_old = tree.time[tree.parent[s]]
    anc = ancestor_mask(tree.parent, s)  # includes the parent w that is freed
    rest, root_rest, w, u = detach(tree, root, s)
    sizes_rest = sizes - sizes[s] * anc.astype(jnp.int32)
    anc_u = anc.at[w].set(False)  # u's ancestors in the rest are w's ancestors
    u_new, t_new, path = descend(walk, rest, sizes_rest, root_rest, c)
    log_q_back = log_attachment_density(rest, sizes_rest, root_rest, u, t_old, c, anc_u, log_survival)
    log_q_fwd = log_attachment_density(rest, sizes_rest, root_rest, u_new, t_new, c, path, log_survival)
    new_tree, new_root = attach(rest, root_rest, s, u_new, t_new, w)
    # w and the new ancestors (the path down to u_new) hold s's leaves again
    new_sizes = (sizes_rest + sizes[s] * path.astype(jnp.int32)).at[w].set(sizes_rest[u_new] + sizes[s])
    starts = jnp.stack([new_tree.parent[u], w])
    return (new_tree, subtree_log_q_ratio(log_q_back, log_q_fwd), t_new < tree.time[s],
            new_sizes, new_root, starts)


def _time_proposal(step: jax.Array, state: DDTState, j: jax.Array):
    """Random walk of ``logit((t − lo)/(hi − lo))`` by ``step`` for internal node ``n+j``;
    returns ``(tree', log Jacobian ratio, valid)``."""
    tree = state.tree
    n = num_leaves(tree)
    v = n + j
    p = tree.parent[v]
    lo = jnp.where(p >= 0, tree.time[jnp.maximum(p, 0)], 0.0)
    hi = jnp.minimum(tree.time[tree.children[j, 0]], tree.time[tree.children[j, 1]])
    width = hi - lo
    t = tree.time[v]
    z_new = jnp.log(t - lo) - jnp.log(hi - t) + step
    t_new = lo + width * jax.nn.sigmoid(z_new)
    log_jac = (jax.nn.log_sigmoid(z_new) + jax.nn.log_sigmoid(-z_new)) - (
        jnp.log(t - lo) + jnp.log(hi - t) - 2.0 * jnp.log(width)
    )
    new_tree = tree._replace(time=tree.time.at[v].set(t_new))
    return new_tree, log_jac, (t_new > lo) & (t_new < hi)


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
    k_walk, k_unif = jax.random.split(key)
    unif = jax.random.uniform(k_unif, (_num_tree_uniforms(n, num_subtree_moves),), state.tree.time.dtype)
    u_node = unif[:num_subtree_moves]
    u_time = unif[num_subtree_moves: num_subtree_moves + n - 1]
    steps = step_size * (jnp.log(u_time) - jnp.log1p(-u_time))
    log_u = jnp.log(unif[num_subtree_moves + n - 1:])
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
        proposal, log_q, valid = _time_proposal(steps[j], state, j)
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


def _num_tree_uniforms(n: int, num_subtree_moves: int) -> int:
    """Uniforms of :func:`_tree_moves` besides the walks': a node and an acceptance test per
    subtree move, an increment and an acceptance test per time move."""
    return 2 * num_subtree_moves + 2 * (n - 1)


# ------------------------------------------------------------------------- hyperparameters
def _log_prior_positive(prior, x):
    return jnp.where(prior.support(x), prior.log_prob(x), -jnp.inf)


MAX_STEPS_OUT = 16
MAX_SHRINKS = 64
_SLICE_UNIFORMS = 3 + MAX_SHRINKS


def _slice_log(unif, prior, x0, term0, log_term, width=1.0):
    """Slice update of ``y = log x`` targeting ``p(x) exp(log_term(x)) x`` (Neal 2003, Fig. 3
    stepping out with a random split of ``MAX_STEPS_OUT``, then shrinkage).

    Written as one ``while_loop`` with a single call of ``log_term`` per
    iteration (stepping out left, then right, then shrinking), so the compiled
    program holds one copy of the density (the data term is a loop itself).
    ``unif``: ``3 + MAX_SHRINKS`` uniforms. ``term0 = log_term(x0)`` is known
    from the cached state; returns ``(x, log_term(x))``. If shrinkage has not
    accepted after ``MAX_SHRINKS`` tries the chain stays at ``x0`` (never
    seen: it needs a degenerate density).
    """
    dtype = x0.dtype
    y0 = jnp.log(x0)
    log_level = _log_prior_positive(prior, x0) + y0 + term0 + jnp.log(unif[0])
    left = y0 - width * unif[1]
    j = jnp.floor(MAX_STEPS_OUT * unif[2]).astype(jnp.int32)
    shrink_unif = unif[3:]

    def density(y):
        x = jnp.exp(y)
        term = log_term(x)
        return _log_prior_positive(prior, x) + y + term, term

    def cond(c):
        return (~c[6]) & (c[7] < MAX_SHRINKS)

    def body(c):
        phase, left, right, j, k, y, done, i, term = c
        phase = jnp.where((phase == 0) & (j <= 0), 1, phase)
        phase = jnp.where((phase == 1) & (k <= 0), 2, phase)
        cand = left + (right - left) * shrink_unif[jnp.minimum(i, MAX_SHRINKS - 1)]
        point = jnp.where(phase == 0, left, jnp.where(phase == 1, right, cand))
        f, t = density(point)
        above = f > log_level
        out_left = (phase == 0) & above
        out_right = (phase == 1) & above
        shrinking = phase == 2
        accept = shrinking & above
        left = jnp.where(out_left, left - width, jnp.where(shrinking & ~above & (cand < y0), cand, left))
        right = jnp.where(out_right, right + width, jnp.where(shrinking & ~above & (cand >= y0), cand, right))
        j = jnp.where(out_left, j - 1, j)
        k = jnp.where(out_right, k - 1, k)
        phase = jnp.where((phase == 0) & ~above, 1, jnp.where((phase == 1) & ~above, 2, phase))
        return (phase, left, right, j, k, jnp.where(accept, cand, y), accept,
                i + shrinking.astype(jnp.int32), jnp.where(accept, t, term))

    init_c = (jnp.int32(0), left, left + width, j, MAX_STEPS_OUT - 1 - j, y0, jnp.array(False),
              jnp.int32(0), jnp.asarray(term0, dtype))
    _, _, _, _, _, y, _, _, term = lax.while_loop(cond, body, init_c)
    return jnp.exp(y).astype(dtype), term


def _c_statistic(tree: Tree, sizes: jax.Array) -> jax.Array:
    """``S = Σ_v (ℓ(t_v) − ℓ(t_p(v))) H_{m_v−1}``, ``ℓ(t) = −log(1−t)``: the structure
    term is ``(n−1) log c − c S + const``."""
    n = num_leaves(tree)
    t = tree.time[n:]
    p = tree.parent[n:]
    tp = jnp.where(p >= 0, tree.time[jnp.maximum(p, 0)], 0.0)
    harm = harmonic_numbers(n, t.dtype)[jnp.clip(sizes[n:] - 1, 0, n - 1)]
    return jnp.sum((jnp.log1p(-tp) - jnp.log1p(-t)) * harm)


def _update_c(unif, state, prior):
    tree, sizes = state.tree, state.sizes
    n = num_leaves(tree)
    stat = _c_statistic(tree, sizes)
    rel = lambda v: (n - 1) * jnp.log(v) - v * stat  # noqa: E731
    c, _ = _slice_log(unif, prior, state.c, rel(state.c), rel)
    return state._replace(c=c, log_prior=structure_log_prior(tree, c, sizes))


def _update_scale(unif, state, X, prior, name):
    """Slice update of ``log`` of the data term's ``sigma`` or ``noise`` (``name``)."""
    order = bottom_up_order(state.tree)

    def log_lik(v):
        scales = {"sigma": state.sigma, "noise": state.noise, name: v}
        return log_likelihood(state.tree, X, scales["sigma"], scales["noise"], order=order)

    value, ll = _slice_log(unif, prior, getattr(state, name), state.log_likelihood, log_lik)
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
    slices = jax.random.uniform(k_slice, (3, _SLICE_UNIFORMS), dtype)
    state, _, sub_acc, time_acc = _tree_moves(k_moves, state, X, num, time_step_size)
    if hyperpriors.c is not None:
        state = _update_c(slices[0], state, hyperpriors.c)
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
    """What the kernel reads off one trace of the model."""

    tree_site: str
    data_site: str
    c_site: str | None
    sigma_site: str | None
    noise_site: str | None
    num_points: int

    @property
    def owned_sites(self) -> tuple[str, ...]:
        """The sites the kernel updates: the tree and ``c``, ``σ``, ``s`` when they are sites."""
        return tuple(s for s in (self.tree_site, self.c_site, self.sigma_site, self.noise_site) if s)


class _Reading(NamedTuple):
    """The model read at one ``z`` (:meth:`DiffusionTreeMCMC._read`)."""

    spec: ModelSpec
    c: Any
    sigma: Any
    noise: Any
    X: jax.Array
    priors: Hyperpriors
    log_hyper: jax.Array


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
    if isinstance(site["fn"], DiffusionTree) and not site["is_observed"]:
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
    if len(datas) != 1:
        raise ValueError(
            f"{kernel_name} needs exactly one observed BrownianLeaves site, e.g. "
            "numpyro.sample('X', BrownianLeaves(tree, sigma, noise), obs=X); "
            f"found {len(datas)}."
        )
    tree_site, data_site = tr[trees[0]], tr[datas[0]]
    if data_site["fn"].tree is not tree_site["value"]:
        raise ValueError(
            f"The BrownianLeaves site '{datas[0]}' must take the DiffusionTree site's value "
            f"('{trees[0]}') unchanged as its tree."
        )
    owned = {trees[0]}
    found = {}
    for key, value, what in (
        ("c", tree_site["fn"].c, "c (the divergence parameter)"),
        ("sigma", data_site["fn"].sigma, "sigma (the Brownian scale)"),
        ("noise", data_site["fn"].noise, "noise (the observation noise)"),
    ):
        found[key] = None
        for name, s in tr.items():
            if s["type"] == "sample" and not s["is_observed"] and s["value"] is value:
                _check_positive_prior(s["fn"], name, what)
                found[key] = name
                owned.add(name)
    others = [name for name in sample_sites(tr, observed=False) if name not in owned]
    if others:
        raise ValueError(
            f"The model has latent sites {others} that {kernel_name} does not update: it updates "
            "the tree and c, sigma, noise when they are sample sites passed unchanged to "
            "DiffusionTree / BrownianLeaves (priors on (0, inf)). Make the others constants or "
            "observed. (Composing with NUTS through numpyro.infer.Gibbs is not possible: NumPyro's "
            "model checks need array-valued sites, and a tree is a pytree.)"
        )
    return ModelSpec(trees[0], datas[0], found["c"], found["sigma"], found["noise"], tree_site["fn"].num_points)


class DiffusionTreeMCMC(DiscreteSiteKernel):
    """MCMC over a Dirichlet diffusion tree (and ``c``, ``σ``, ``s`` when they are sites).

    :param model: a NumPyro model with one latent ``DiffusionTree`` site and one
        observed ``BrownianLeaves`` site taking the tree (module example).
        ``c``, ``sigma`` and ``noise`` may be constants or sample sites with
        priors on ``(0, ∞)`` (slice-sampled by the kernel); no other latent
        sites. Composition with ``NUTS`` through ``numpyro.infer.Gibbs`` /
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
        hyper_sites = (spec.c_site, spec.sigma_site, spec.noise_site)
        priors = Hyperpriors(*(tr[s]["fn"] if s else None for s in hyper_sites))
        log_hyper = sum(
            (jnp.sum(tr[s]["fn"].log_prob(tr[s]["value"])) for s in hyper_sites if s), jnp.zeros(())
        )
        return _Reading(spec, tree_fn.c, data["fn"].sigma, data["fn"].noise, jnp.asarray(data["value"]),
                        priors, log_hyper)

    def fill_site(self, site):
        return _fill_tree(site)

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
        for name in (spec.c_site, spec.sigma_site, spec.noise_site):
            if name:
                z[name] = jnp.asarray(tr[name]["value"], dtype)
        state = self._state_from_z(z, jnp.zeros((), jnp.int32), key, model_args, model_kwargs)
        # a prior draw off the support (ties from rounding, see ddt.sample_tree) or with a
        # zero-probability data term: start from the caterpillar instead
        bad = ~jnp.isfinite(state.log_joint)
        z[spec.tree_site] = select_state(bad, comb_tree(spec.num_points, dtype), z[spec.tree_site])
        return self._state_from_z(z, jnp.zeros((), jnp.int32), key, model_args, model_kwargs)

    def _state_from_z(self, z, accepted, key, model_args, model_kwargs):
        r = self._read(z, model_args, model_kwargs)
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
        lj = self._log_joint(z, chain, model_args, model_kwargs)
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
