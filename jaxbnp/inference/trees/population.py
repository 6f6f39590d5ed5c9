"""Population MCMC for Dirichlet diffusion trees (Wang, Laskey & Domeniconi), pure core + NumPyro kernel.

docs/mathematics.md §5. ``K`` chains, each targeting ``π_k(T) ∝ p(T | c_k) p(X_k | T, σ_k, s_k)``
(``X_k = X`` for a posterior; the core also accepts one data set per chain,
which the Geweke test uses). One population step runs the within-chain sweep
of :mod:`jaxbnp.inference.trees.mcmc` on every chain (:func:`run_chains`: one after
another on CPU, ``jax.vmap`` on an accelerator), then the
exchange move on ``K // 2`` disjoint random pairs of chains (``vmap`` again,
or ``lax.map``). The paper picks one pair per step; a random perfect matching
with independent exact moves on disjoint pairs is equally exact and uses the
batch.

Exchange move on chains ``(T1, T2)`` (seed paper, docs/mathematics.md §5):

1. Draw an ordered random subset ``S = (i_1, …, i_k)`` of ``k = subset_size``
   leaves, ``1 <= k <= n − 1``. The generation order puts the other leaves
   first and then ``S`` in this order (data from a DDT are exchangeable, so
   any order is a valid generation order).
2. In each chain, detach ``i_k, …, i_1`` (reverse order). Leaf ``i_j``'s
   divergence time ``d_j`` is the time of its parent when it is detached: the
   time at which its path leaves those of the leaves generated before it.
   Detaching frees the parent node ``f_j``; its sibling ``u_j`` marks the
   branch it came from. The rest is ``R``, the tree restricted to the other leaves.
3. Re-attach ``i_1, …, i_k`` in order to chain 1's ``R1`` at chain 2's times
   ``d'_j`` (and to ``R2`` at chain 1's times), reusing node ``f_j``: at time
   ``d`` the candidate branches are the edges of the current partial tree
   that span ``d``; branch ``x`` is chosen with probability proportional to
   the data term of the partial tree's leaves with ``i_j`` hung on it at
   ``d`` (the paper's "proportional to the likelihood").
   ``Q(T1' | T1, S, d')`` is the product of these choice probabilities.
4. Accept with ``π1(T1')π2(T2') Q(T1, T2 | T1', T2') / (π1(T1)π2(T2) Q(T1', T2' | T1, T2))``.
   The reverse move (same ``S``, order and freed nodes) reads ``d'`` off
   ``T1'`` and ``d`` off ``T2'``, swaps them back and re-attaches at the
   branches ``u_j`` recorded in step 2, which rebuilds ``T1`` and ``T2``
   exactly; ``Q(T1, T2 | T1', T2')`` is computed by replaying that insertion.
   The times move by a swap (unit Jacobian) and ``S`` has the same
   probability both ways, so the move is exact for any pair of targets.

``temperature = τ`` raises the ``Q`` ratio to ``1/τ`` (the paper's tempered
variant, docs/mathematics.md §5). Only ``τ = 1`` leaves the posterior invariant; any
other value gives an **approximate** sampler (a biased stationary law).

Cost: each re-attachment scores all ``2n − 1`` candidate edges with two
passes of Gaussian messages (up and down the partial tree, O(n D)); an
exchange does ``4 k`` re-attachments per pair (two proposals, two replays),
about 1.7 ms each at n = 1,300 on one CPU core, against about 0.15 s for a
within-chain sweep; ``fit_ddt`` takes ``k = min(n // 4, 8)`` by default.
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
from ..._math import LOG_2PI
from ..._random import typed_key
from ..._validation import check_int
from ...models.ddt import (
    Tree, bottom_up_order, log_joint_terms_and_sizes, num_leaves, sample_tree,
)
from ..base import CHAIN_BATCHING, SamplingAlgorithm, run_chains
from . import mcmc
from .mcmc import DDTInfo, DDTState, DiffusionTreeMCMC, Hyperpriors
from .moves import (
    Detached, ExchangeInfo, PopulationInfo, check_subset_size, detach_leaves, exchange_pair, insert_with,
    pair_exchanges,
)

__all__ = [
    "ExchangeInfo", "PopulationInfo", "Detached", "detach_leaves", "candidate_log_likelihoods",
    "insert_leaves", "insert_with", "exchange", "exchange_step", "pair_exchanges", "init", "step", "algorithm", "run_chains",
    "PopulationDDT",
    "PopulationDDTState",
]











def _log_normal(x, mean, var, d):
    """``log N(x; mean, var I_d)`` for ``d``-vectors and a scalar variance."""
    diff = x - mean
    return -0.5 * d * (LOG_2PI + jnp.log(var)) - 0.5 * jnp.sum(diff * diff, -1) / var


def candidate_log_likelihoods(tree: Tree, root, in_tree, X, sigma, noise, leaf, d, order=None):
    """Data term of the partial tree with ``leaf`` hung at time ``d`` on the edge above
    each node ``x``, for every ``x`` at once: ``(2n−1,)`` (garbage where the edge does not
    span ``d``; the caller masks those).

    Two passes of Gaussian messages (O(n D)): upward, ``U_x(z) = e^{κ_x} N(z; μ_x, V_x)``
    is the likelihood of the data below ``x`` given ``x``'s value; downward,
    ``O_x(z) = e^{k_x} N(z; m_x, W_x)`` is the likelihood of everything else
    (the root's Brownian prior from 0 included) given the value of ``x``'s
    parent (a point mass at 0 at time 0 for the root). With the new node at
    ``d`` on the edge above ``x``, ``log L = k_x + κ_x + log ∫ N(z; m_x, A) N(z; μ_x, B)
    N(y; z, E) dz`` with ``A = W_x + σ²(d − t_p(x))``, ``B = V_x + σ²(t_x − d)``,
    ``E = σ²(1 − d) + s²``.

    ``order``: the internal nodes children first (:func:`~jaxbnp.models.ddt.bottom_up_order`);
    any order that puts the partial tree's children before their parents will do (the
    detached nodes' rows are computed but never read).
    """
    n = num_leaves(tree)
    dtype = tree.time.dtype
    dim = X.shape[1]
    sig2 = sigma ** 2
    time = tree.time
    order = bottom_up_order(tree) if order is None else order
    active = in_tree[n:]
    # each pass keeps one array, a row [mean (D), variance, log scale] per node: with three
    # arrays, every update read the others and XLA copied them at every step (about 4 µs a
    # node at n = 1,300; 0.1 µs with one array)
    up_rows = jnp.zeros((2 * n - 1, dim + 2), dtype).at[:n, :dim].set(X).at[:, dim].set(noise ** 2)

    def up(j, rows):
        v = order[j]
        a, b = tree.children[v - n, 0], tree.children[v - n, 1]
        ra, rb = rows[a], rows[b]
        va = ra[dim] + sig2 * (time[a] - time[v])
        vb = rb[dim] + sig2 * (time[b] - time[v])
        s = va + vb
        pair = _log_normal(ra[:dim], rb[:dim], s, dim)
        kappa_v = ra[dim + 1] + rb[dim + 1] + jnp.where(active[v - n], pair, 0.0)
        return rows.at[v].set(jnp.concatenate([(ra[:dim] * vb + rb[:dim] * va) / s,
                                               (va * vb / s)[None], kappa_v[None]]))

    up_rows = lax.fori_loop(0, n - 1, up, up_rows)
    mu, var, kappa = up_rows[:, :dim], up_rows[:, dim], up_rows[:, dim + 1]
    parent_time = jnp.where(tree.parent >= 0, time[jnp.maximum(tree.parent, 0)], 0.0)

    def down(j, rows):
        p = order[n - 2 - j]  # parents before children
        a, b = tree.children[p - n, 0], tree.children[p - n, 1]
        rp = rows[p]
        reach = rp[dim] + sig2 * (time[p] - parent_time[p])  # the outside message at p's value
        kids = jnp.stack([a, b])
        sibs = jnp.stack([b, a])
        vs = var[sibs] + sig2 * (time[sibs] - time[p])
        tot = reach + vs
        k_new = rp[dim + 1] + kappa[sibs] + _log_normal(rp[None, :dim], mu[sibs], tot, dim)
        m_new = (rp[None, :dim] * vs[:, None] + mu[sibs] * reach) / tot[:, None]
        w_new = reach * vs / tot
        new = jnp.concatenate([m_new, w_new[:, None], k_new[:, None]], axis=1)
        live = active[p - n]  # a detached node's stale children must not be overwritten
        return rows.at[kids].set(jnp.where(live, new, rows[kids]))

    down_rows = lax.fori_loop(0, n - 1, down, jnp.zeros((2 * n - 1, dim + 2), dtype))
    m, w, k = down_rows[:, :dim], down_rows[:, dim], down_rows[:, dim + 1]
    # the root's outside message is the point mass at 0 at time 0. Written as a
    # scatter, not as ``where(arange(2n−1) == root, 0, ·)``: with float64, vmapped
    # pairs and 2n−1 = 7 (4 points), XLA:CPU's default pipeline fused that mask (an int32
    # per-row index against an iota) into the next elementwise loop, and LLVM's
    # x86 backend aborted the process on AVX-512 CPUs ("Cannot select
    # X86ISD::SUBV_BROADCAST_LOAD", tests/test_default_flags.py). Same values.
    m, w, k = m.at[root].set(0.0), w.at[root].set(0.0), k.at[root].set(0.0)
    big_a = w + sig2 * (d - parent_time)
    big_b = var + sig2 * (time - d)
    big_e = sig2 * (1.0 - d) + noise ** 2
    tot = big_a + big_b
    mean_ab = (m * big_b[:, None] + mu * big_a[:, None]) / tot[:, None]
    var_ab = big_a * big_b / tot
    return k + kappa + _log_normal(m, mu, tot, dim) + _log_normal(X[leaf][None, :], mean_ab, var_ab + big_e, dim)


def insert_leaves(gumbel, det: Detached, leaves, times, X, sigma, noise, forced, use_forced):
    """Re-attach ``leaves`` in order at ``times``; branches drawn ∝ likelihood (Gumbel-max
    with ``gumbel`` ``(k, 2n−1)``), or ``forced`` when ``use_forced`` (the reverse move's replay).

    Returns ``(tree, log Q)``; ``log Q = −inf`` when some leaf has no
    candidate branch (then the move is rejected).
    """
    def score(tree, root, in_tree, leaf, d, order):
        return candidate_log_likelihoods(tree, root, in_tree, X, sigma, noise, leaf, d, order)

    return insert_with(score, gumbel, det, leaves, times, forced, use_forced)








def exchange(
    key: jax.Array,
    pair: DDTState,
    X: jax.Array,
    subset_size: int,
    temperature: Any = 1.0,
) -> tuple[DDTState, ExchangeInfo]:
    """The exchange move between two chains (module docstring, docs/mathematics.md §5).

    ``pair``: the two chains' :class:`~jaxbnp.inference.trees.mcmc.DDTState` on a
    leading axis of size 2. ``X``: ``(2, n, D)``, the data of each chain's
    target (the same data twice for a posterior). ``subset_size`` (static):
    number of leaves exchanged. ``temperature`` may be traced. Returns the pair
    and an :class:`ExchangeInfo` of scalars: :func:`~jaxbnp.inference.trees.moves.exchange_pair`
    with the branches weighted by the Gaussian messages (:func:`candidate_log_likelihoods`).
    """
    Xs = jnp.asarray(X, pair.tree.time.dtype)

    def insert(gumbel, det, leaves, times, chain, forced, use_forced):
        return insert_leaves(gumbel, det, leaves, times, *chain, forced, use_forced)

    def log_terms(trees):
        return lax.map(lambda a: log_joint_terms_and_sizes(*a), (trees, Xs, pair.c, pair.sigma, pair.noise))

    return exchange_pair(key, pair, subset_size, temperature, (Xs, pair.sigma, pair.noise), insert, log_terms)


def exchange_step(
    key: jax.Array,
    chains: DDTState,
    X: jax.Array,
    subset_size: int,
    temperature: Any = 1.0,
    pair_batching: str = "vmap",
) -> tuple[DDTState, ExchangeInfo]:
    """Exchange moves on ``K // 2`` disjoint random pairs of the ``K`` chains.

    A random perfect matching followed by independent exact moves on disjoint
    pairs leaves the product of the chains' targets invariant. ``X``:
    ``(n, D)`` shared, or ``(K, n, D)`` one data set per chain. Returns the
    chains and an :class:`ExchangeInfo` of ``(K,)`` arrays: whether each
    chain's exchange was accepted and its pair's log ratio (``−inf`` for the
    chain left out when ``K`` is odd). ``pair_batching``:
    ``"vmap"`` (default: one batched program; on a 2-core CPU 1.5-2.5x faster
    than ``"map"`` for 8-32 chains) or ``"map"`` (``lax.map``, pairs one after
    another: about 25% quicker to compile). Draws are the same either way.
    """
    def move(k, pair, x):
        return exchange(k, pair, x, subset_size, temperature)

    return pair_exchanges(move, key, chains, X, subset_size, pair_batching)




def init(trees: Tree, X: Any, c: Any, sigma: Any, noise: Any = 0.0) -> DDTState:
    """States of ``K`` chains: :func:`jaxbnp.inference.trees.mcmc.init` on each, a leading axis ``K``.

    ``trees``: a :class:`~jaxbnp.models.ddt.Tree` batch ``(K, …)``; ``X``: ``(n, D)``
    shared or ``(K, n, D)``; ``c``, ``sigma``, ``noise``: scalars or ``(K,)``.
    """
    num, dtype = trees.time.shape[0], trees.time.dtype
    X = jnp.asarray(X, dtype)
    c, sigma, noise = (jnp.broadcast_to(jnp.asarray(v, dtype), (num,)) for v in (c, sigma, noise))
    return jax.vmap(mcmc.init, in_axes=(0, 0 if X.ndim == 3 else None, 0, 0, 0))(trees, X, c, sigma, noise)


def step(
    key: jax.Array,
    chains: DDTState,
    X: jax.Array,
    *,
    subset_size: int,
    temperature: Any = 1.0,
    hyperpriors: Hyperpriors = Hyperpriors(),
    within_chain: bool = True,
    num_subtree_moves: int | None = None,
    time_step_size: float = 1.0,
    pair_batching: str = "vmap",
    chain_batching: str = "auto",
) -> tuple[DDTState, PopulationInfo]:
    """One population step: the within-chain sweep on every chain, then :func:`exchange_step`.

    ``chains``: a :class:`~jaxbnp.inference.trees.mcmc.DDTState` with a leading
    chain axis ``K``; ``X``: ``(n, D)`` or ``(K, n, D)``. ``within_chain=False``
    runs the exchange moves alone (not irreducible on its own: for tests).
    ``chain_batching``: how the sweeps of the ``K`` chains run (:func:`run_chains`).
    """
    num = chains.log_prior.shape[0]
    X = jnp.asarray(X, chains.tree.time.dtype)
    k_within, k_ex = jax.random.split(key)
    if within_chain:
        sweep = partial(
            mcmc.step, hyperpriors=hyperpriors, num_subtree_moves=num_subtree_moves,
            time_step_size=time_step_size,
        )
        chains, within = run_chains(
            sweep, jax.random.split(k_within, num), chains, X,
            in_axes=(0, 0, 0 if X.ndim == 3 else None), how=chain_batching,
        )
    else:
        zero = jnp.zeros(num, jnp.int32)
        within = DDTInfo(zero, zero, zero, zero)
    chains, exchanged = exchange_step(k_ex, chains, X, subset_size, temperature, pair_batching)
    return chains, PopulationInfo(within, exchanged.accepted)


def algorithm(X, num_chains: int, *, subset_size: int, temperature: Any = 1.0,
              hyperpriors: Hyperpriors = Hyperpriors(), within_chain: bool = True,
              num_subtree_moves: int | None = None, time_step_size: float = 1.0,
              pair_batching: str = "vmap", chain_batching: str = "auto") -> SamplingAlgorithm:
    """Population MCMC over ``num_chains`` diffusion trees in the one shape
    (:class:`~jaxbnp.inference.base.SamplingAlgorithm`); the population is one state:

    * ``init(key, trees=None, c=1.0, sigma=1.0, noise=0.0) -> DDTState`` (leading axis
      ``num_chains``): :func:`init` at the given trees, or at ``num_chains`` draws from the
      DDT prior with divergence ``c`` (a scalar; keys ``jax.random.split(key, num_chains)``);
    * ``step(key, chains) -> (DDTState, PopulationInfo)``: :func:`step` with these settings."""
    X = jnp.asarray(X)
    num_chains = check_int("num_chains", num_chains, 1)
    n = X.shape[-2]

    def init_fn(key, trees=None, c=1.0, sigma=1.0, noise=0.0):
        if trees is None:
            dtype = jnp.result_type(X.dtype, float)
            trees = jax.vmap(lambda k: sample_tree(k, c, n, dtype))(jax.random.split(key, num_chains))
        return init(trees, X, c, sigma, noise)

    def step_fn(key, chains):
        return step(key, chains, X, subset_size=subset_size, temperature=temperature,
                    hyperpriors=hyperpriors, within_chain=within_chain,
                    num_subtree_moves=num_subtree_moves, time_step_size=time_step_size,
                    pair_batching=pair_batching, chain_batching=chain_batching)

    return SamplingAlgorithm(init_fn, step_fn)


# ------------------------------------------------------------------------- NumPyro kernel
class PopulationDDTState(NamedTuple):
    """State of :class:`PopulationDDT`: every field has a leading chain axis except ``rng_key``.

    exchange_accepted: whether each chain's last exchange was accepted.
    """

    z: dict
    chain: DDTState
    log_joint: jax.Array
    subtree_accepted: jax.Array
    exchange_accepted: jax.Array
    rng_key: jax.Array


class PopulationDDT(DiffusionTreeMCMC):
    """Population MCMC over Dirichlet diffusion trees: a NumPyro ensemble kernel.

    :param model: as for :class:`~jaxbnp.inference.trees.mcmc.DiffusionTreeMCMC`.
    :param num_chains: ``K >= 2``; must equal ``MCMC(..., num_chains=K)``.
    :param subset_size: leaves exchanged per move, ``1 <= k <= n − 1``.
    :param temperature: ``τ > 0``; ``1`` (default) is exact, any other value
        tempers the proposal ratio (``Q`` ratio to the power ``1/τ``) and makes
        the sampler **approximate** (docs/mathematics.md §5).

    :param pair_batching: ``"vmap"`` or ``"map"`` for the exchange pairs (:func:`exchange_step`).
    :param chain_batching: ``"auto"`` (default), ``"vmap"`` or ``"map"`` for the chains'
        sweeps (:func:`run_chains`: ``"auto"`` runs them one after another on CPU, vmapped
        on an accelerator; the same draws).

    Each iteration: the within-chain sweep on every chain, then
    exchanges between ``K // 2`` random disjoint pairs (module docstring).
    Run it with ``MCMC(PopulationDDT(model, K, k), num_chains=K,
    chain_method="vectorized")``; ``get_samples(group_by_chain=True)`` gives
    ``(K, num_samples, …)``. Extra fields: ``"log_joint"``,
    ``"subtree_accepted"``, ``"exchange_accepted"``.
    """

    def __init__(
        self,
        model: Callable,
        num_chains: int,
        subset_size: int,
        temperature: float = 1.0,
        *,
        num_subtree_moves: int | None = None,
        time_step_size: float = 1.0,
        init_strategy: str = "prior",
        pair_batching: str = "vmap",
        chain_batching: str = "auto",
    ):
        super().__init__(
            model, num_subtree_moves=num_subtree_moves, time_step_size=time_step_size,
            init_strategy=init_strategy,
        )
        if pair_batching not in ("vmap", "map"):
            raise ValueError(f"pair_batching must be 'vmap' or 'map', got {pair_batching!r}.")
        if chain_batching not in CHAIN_BATCHING:
            raise ValueError(f"chain_batching must be one of {CHAIN_BATCHING}, got {chain_batching!r}.")
        self._pair_batching = pair_batching
        self._chain_batching = chain_batching
        self._num_chains = check_int("num_chains", num_chains, 2)
        self._subset_size = check_int("subset_size", subset_size, 1)
        try:
            temperature = float(temperature)
        except (TypeError, ValueError):
            raise ValueError(f"temperature must be a positive number, got {temperature!r}.") from None
        if not (np.isfinite(temperature) and temperature > 0):
            raise ValueError(
                f"temperature must be a positive number (1.0 is exact), got {temperature}."
            )
        self._temperature = temperature

    @property
    def is_ensemble_kernel(self):
        return True

    @property
    def num_chains(self) -> int:
        return self._num_chains

    @property
    def subset_size(self) -> int:
        return self._subset_size

    @property
    def temperature(self) -> float:
        return self._temperature

    def init(self, rng_key, num_warmup, init_params, model_args, model_kwargs):
        rng_key = typed_key(rng_key)  # jax.random.PRNGKey or jax.random.key: the same draws
        auto_enable()  # JAX's persistent compilation cache (jaxbnp.enable_compilation_cache)
        if is_prng_key(rng_key) or jnp.shape(rng_key)[0] != self._num_chains:
            got = 1 if is_prng_key(rng_key) else jnp.shape(rng_key)[0]
            raise ValueError(
                f"PopulationDDT(num_chains={self._num_chains}) runs all chains in one program: use "
                f"MCMC(kernel, num_chains={self._num_chains}, chain_method='vectorized') "
                f"(got {got} chain keys)."
            )
        spec = self._setup(init_params, model_args, model_kwargs)
        check_subset_size(self._subset_size, spec.num_points)
        per_chain = self._init_chains(spec, rng_key, init_params, model_args, model_kwargs)
        pop_key = jax.random.fold_in(rng_key[0], 0x706F70)
        return PopulationDDTState(
            per_chain.z, per_chain.chain, per_chain.log_joint, per_chain.subtree_accepted,
            jnp.zeros(self._num_chains, bool), pop_key,
        )

    def sample(self, state, model_args, model_kwargs):
        """One population step (:func:`step`'s moves, with ``c``, ``σ``, ``s`` read off the model)."""
        key, k_within, k_ex = jax.random.split(state.rng_key, 3)

        def within(k, z, chain):
            z, chain, info = self._core_step(k, z, chain, model_args, model_kwargs)
            return z, chain, info.subtree_accepted

        z, chains, sub_acc = run_chains(
            within, jax.random.split(k_within, self._num_chains), state.z, state.chain,
            in_axes=(0, 0, 0), how=self._chain_batching,
        )
        reading = self._read(jax.tree.map(lambda a: a[0], z), model_args, model_kwargs)
        X = jnp.asarray(reading.X, chains.tree.time.dtype)
        if reading.spec.kind == "cut":
            from . import cut

            chains, exchanged = cut.exchange_step(
                k_ex, chains, X, reading.family, self._subset_size, self._temperature, self._pair_batching
            )
        else:
            chains, exchanged = exchange_step(
                k_ex, chains, X, self._subset_size, self._temperature, self._pair_batching
            )
        z = dict(z)
        z[reading.spec.tree_site] = chains.tree
        lj = run_chains(lambda zz, chain: self._log_joint(zz, chain, model_args, model_kwargs),
                        z, chains, in_axes=(0, 0), how="vmap")
        return PopulationDDTState(z, chains, mark_loop_program(lj), sub_acc, exchanged.accepted, key)

    def refresh(self, state, model_args, model_kwargs):
        def one(z):
            return self._state_from_z(z, jnp.zeros((), jnp.int32), jax.random.key(0), model_args, model_kwargs)

        fresh = run_chains(one, state.z, in_axes=(0,), how="vmap")
        return state._replace(chain=fresh.chain, log_joint=fresh.log_joint)

    def get_diagnostics_str(self, state):
        base = super().get_diagnostics_str(state)
        return f"{base} exchange acc={float(np.mean(np.asarray(state.exchange_accepted))):.2f}"
