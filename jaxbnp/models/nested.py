"""BHMC (Huang et al.): a nested CRP over root-to-leaf paths and a multilevel HDP mixture.

docs/mathematics.md §6. Depth ``L``; each point picks a root-to-leaf path by a nested
CRP(``α``); node ``z`` carries mixing weights ``β_z`` over a global list of
components (plus the rest mass ``β*_z``): the root ``β_0 ~ GEM(γ0)``, a child
``β_z' ~ DP(γ, β_z)``; a point draws its component ``c_n`` from the weights of
its leaf, ``θ_k ~ N(μ0, Σ0)`` and ``x_n ~ N(θ_{c_n}, Σ)``.

Path prior (the tree ``V`` with empty nodes removed, ``I`` its internal nodes,
``m_z`` children and ``N_z`` points of node ``z``)::

    log p(V) = |I| lgamma(α) + Σ_{z∈I} [m_z log α − lgamma(N_z + α)] + Σ_{edges (z,z')} lgamma(N_z')

(:func:`path_log_prior`; it sums to one over all path configurations, checked
by enumeration in ``tests/exact/test_bhmc_exact.py``).

Arrays. A tree lives in a fixed-capacity node table: node ``0`` is the root,
``paths`` is ``(N, L)`` int32 with ``paths[n, l−1]`` the node of point ``n``
at depth ``l`` (the root column is implicit). :func:`tree_from_paths` gives
each node's ``parent`` (``−1`` at the root and at free slots), ``depth`` and
``count`` (``N_z``). Weights are stored as ``log_beta`` of shape
``(node_capacity, K + 1)``: ``K`` component slots and the rest mass in the
last column.

Finite truncation (paper §3 and §4.1). :func:`nested_hdp_model` draws ``K``
(``component_capacity``) sticks of ``GEM(γ0)`` at the root; the paper stops
breaking sticks when the rest ``β*_0`` falls below ``truncation`` (``ε``),
so the program records ``num_sticks`` (the first ``k`` with rest ``< ε``) and
``truncation_ok`` (the rest after all ``K`` sticks is ``< ε``): with fixed
shapes the program keeps all ``K`` sticks (a finer truncation) and
:func:`simulate` raises :class:`~jaxbnp.errors.CapacityError`
when ``K`` sticks did not get the rest below ``ε`` (pass a larger
``component_capacity``) — nothing is dropped silently. A child's weights are
the finite projection of the DP, ``Dir(γβ_z1, …, γβ_zK, γβ*_z)`` (paper §3,
exact for a DP on that partition). A point whose component falls in the rest
(probability below ``ε`` per point) is drawn from ``f*`` = ``N(μ0, Σ0 + Σ)``
through an extra component row ``θ_K``.

Example
-------
>>> import jax, numpy as np
>>> from jaxbnp.models.nested import NestedHDP, simulate
>>> hyper = NestedHDP(depth=2, alpha=1.0, gamma0=1.0, gamma=1.0, Sigma=np.eye(2) * 0.1, Sigma0=np.eye(2))
>>> sim = simulate(jax.random.key(0), hyper, num_points=10)
>>> sim["paths"].shape, sim["X"].shape
((10, 2), (10, 2))
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from jax import lax
from numpyro import handlers
from numpyro.distributions import constraints

from .._math import LOG_2PI, solve_triangular
from .._pytree import is_concrete
from ..errors import CapacityError

__all__ = [
    "BHMCModel",
    "make_model",
    "model_constants",
    "mvn_logpdf",
    "full_path",
    "ncrp_log_prob",
    "NestedCRP",
    "NestedHDP",
    "check_covariance",
    "default_node_capacity",
    "nested_hdp_model",
    "path_log_prior",
    "path_log_prior_table",
    "sample_ncrp",
    "simulate",
    "tree_from_paths",
]


# ------------------------------------------------------------------------- hyperparameters
def check_covariance(S: Any, name: str, dim: int | None = None) -> np.ndarray:
    """Return ``S`` as a symmetric positive-definite ``(D, D)`` float array or raise ``ValueError``.

    A scalar ``s`` means ``s · I`` (needs ``dim``).
    """
    arr = np.asarray(S, dtype=float)
    if arr.ndim == 0:
        if dim is None:
            raise ValueError(f"{name} is a scalar; pass a (D, D) matrix.")
        arr = float(arr) * np.eye(dim)
    if arr.ndim != 2 or arr.shape[0] != arr.shape[1]:
        raise ValueError(f"{name} must be a square (D, D) matrix, got shape {arr.shape}.")
    if dim is not None and arr.shape[0] != dim:
        raise ValueError(f"{name} has shape {arr.shape} but the data have {dim} features.")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} contains NaN or inf; pass a symmetric positive-definite matrix.")
    if not np.allclose(arr, arr.T, rtol=1e-8, atol=1e-10):
        raise ValueError(f"{name} is not symmetric; pass a symmetric positive-definite matrix.")
    try:
        np.linalg.cholesky(arr)
    except np.linalg.LinAlgError:
        raise ValueError(f"{name} is not positive definite; pass a symmetric positive-definite matrix.") from None
    return arr


def _check_positive(value: Any, name: str) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a positive number, got {value!r}.") from None
    if not (np.isfinite(v) and v > 0):
        raise ValueError(f"{name} must be > 0 and finite, got {value!r}.")
    return v


@dataclass(frozen=True)
class NestedHDP:
    """Hyperparameters of BHMC (docs/mathematics.md §6), validated on construction (host side).

    depth: ``L >= 1`` levels below the root. alpha: nCRP concentration ``α``.
    gamma0: root concentration ``γ0`` (``β_0 ~ GEM(γ0)``). gamma: child
    concentration ``γ`` (``β_z' ~ DP(γ, β_z)``). Sigma: ``(D, D)`` covariance of
    ``x`` given its component. Sigma0, mu0: the base measure ``H = N(mu0, Sigma0)``
    (``mu0`` defaults to zeros).
    """

    depth: int
    alpha: float
    gamma0: float
    gamma: float
    Sigma: Any
    Sigma0: Any
    mu0: Any = None

    def __post_init__(self):
        if isinstance(self.depth, bool) or not isinstance(self.depth, (int, np.integer)) or self.depth < 1:
            raise ValueError(f"depth L must be an integer >= 1, got {self.depth!r}.")
        for name in ("alpha", "gamma0", "gamma"):
            object.__setattr__(self, name, _check_positive(getattr(self, name), name))
        S = np.asarray(self.Sigma, dtype=float)
        dim = S.shape[0] if S.ndim == 2 else (np.asarray(self.Sigma0).shape[0] if np.ndim(self.Sigma0) == 2 else None)
        if dim is None and self.mu0 is not None and np.ndim(self.mu0) == 1:
            dim = len(self.mu0)
        object.__setattr__(self, "Sigma", check_covariance(self.Sigma, "Sigma", dim))
        dim = self.Sigma.shape[0]
        object.__setattr__(self, "Sigma0", check_covariance(self.Sigma0, "Sigma0", dim))
        mu0 = np.zeros(dim) if self.mu0 is None else np.asarray(self.mu0, dtype=float).reshape(-1)
        if mu0.shape != (dim,) or not np.all(np.isfinite(mu0)):
            raise ValueError(f"mu0 must be a finite vector of length {dim}, got {np.asarray(self.mu0)!r}.")
        object.__setattr__(self, "mu0", mu0)
        object.__setattr__(self, "depth", int(self.depth))

    @property
    def dim(self) -> int:
        return int(self.Sigma.shape[0])


# a pytree (``depth`` static, the rest leaves), so that ``hyper`` can be a traced argument of a
# jitted program (``MCMC(..., jit_model_args=True)``, the runner's cached programs); rebuilt
# without the checks, which ran when the values were made
def _nested_hdp_flatten(h: NestedHDP):
    return (h.alpha, h.gamma0, h.gamma, h.Sigma, h.Sigma0, h.mu0), h.depth


def _nested_hdp_unflatten(depth, leaves) -> NestedHDP:
    h = object.__new__(NestedHDP)
    for name, value in zip(("depth", "alpha", "gamma0", "gamma", "Sigma", "Sigma0", "mu0"), (depth, *leaves)):
        object.__setattr__(h, name, value)
    return h


jax.tree_util.register_pytree_node(NestedHDP, _nested_hdp_flatten, _nested_hdp_unflatten)


# ------------------------------------------------------------------------- model constants
# What BHMC's moves evaluate of the model (docs/mathematics.md §6): the Gaussian base measure
# and kernel as factored arrays, and the nCRP's path probabilities.


class BHMCModel(NamedTuple):
    """Model constants as arrays: ``H = N(mu0, Sigma0)``, ``f = N(θ, Sigma)`` and their factors."""

    mu0: jax.Array
    chol_sigma: jax.Array        # chol(Σ)
    prec_sigma: jax.Array        # Σ⁻¹
    prec0: jax.Array             # Σ0⁻¹
    prec0_mu0: jax.Array         # Σ0⁻¹ μ0
    chol_marginal: jax.Array     # chol(Σ0 + Σ): f*
    chol_single: jax.Array       # chol((Σ0⁻¹ + Σ⁻¹)⁻¹): θ | one point


def make_model(hyper: NestedHDP, dtype=None) -> BHMCModel:
    """Factor the covariances of ``hyper`` into a :class:`BHMCModel` (:func:`model_constants`)."""
    return model_constants(hyper.mu0, hyper.Sigma, hyper.Sigma0, dtype)


def model_constants(mu0, Sigma, Sigma0, dtype=None) -> BHMCModel:
    """The :class:`BHMCModel` of ``H = N(mu0, Sigma0)`` and ``f = N(θ, Sigma)``: factored on the
    host (NumPy, float64) when the values are concrete, else in the program (they are traced,
    e.g. model arguments of a jitted run), in ``dtype``."""
    dtype = jnp.result_type(float) if dtype is None else dtype
    host = all(is_concrete(a) for a in (mu0, Sigma, Sigma0))
    xp = np if host else jnp
    S, S0, mu0 = ((np.asarray(a, dtype=float) for a in (Sigma, Sigma0, mu0)) if host
                  else (jnp.asarray(a, dtype) for a in (Sigma, Sigma0, mu0)))
    prec, prec0 = xp.linalg.inv(S), xp.linalg.inv(S0)
    single = xp.linalg.inv(prec0 + prec)
    arrs = (mu0, xp.linalg.cholesky(S), prec, prec0, prec0 @ mu0, xp.linalg.cholesky(S0 + S),
            xp.linalg.cholesky((single + single.T) / 2))
    return BHMCModel(*(jnp.asarray(a, dtype) for a in arrs))


def mvn_logpdf(x, mean, chol):
    """``log N(x | mean, L Lᵀ)`` of each row of ``x`` for the Cholesky factor ``chol = L``."""
    z = solve_triangular(chol, (x - mean).T, lower=True)
    return (-0.5 * jnp.sum(z * z, axis=0) - jnp.sum(jnp.log(jnp.diag(chol)))
            - 0.5 * chol.shape[0] * LOG_2PI)


def full_path(row):
    """A point's path ``(L,)`` with the root (node 0) in front: ``(L+1,)``."""
    return jnp.concatenate([jnp.zeros(1, row.dtype), row])


def ncrp_log_prob(full, count_minus, alpha):
    """``log nCRP(v; V∖{v_n})`` of a full path ``(L+1,)`` given counts without point ``n``."""
    cm = count_minus[full]
    here = cm[1:]
    log_num = jnp.where(here > 0, jnp.log(jnp.maximum(here, 1).astype(alpha.dtype)), jnp.log(alpha))
    return jnp.sum(log_num - jnp.log(cm[:-1] + alpha))


def default_node_capacity(num_points: int, depth: int) -> int:
    """Enough node slots for any tree on ``num_points`` paths plus one proposal: ``N L + L + 1``."""
    return int(num_points) * int(depth) + int(depth) + 1


# ------------------------------------------------------------------------- trees and the path prior
def tree_from_paths(paths: jax.Array, node_capacity: int):
    """Node table of a tree given by paths: ``(parent, depth, count)``, each ``(node_capacity,)`` int32.

    ``paths``: ``(N, L)`` node ids (root ``0`` implicit, ids ``< node_capacity``).
    ``count[z] = N_z`` (``N`` at the root), ``parent = −1`` at the root and free slots.
    """
    paths = jnp.asarray(paths, jnp.int32)
    n, depth_l = paths.shape
    full = jnp.concatenate([jnp.zeros((n, 1), jnp.int32), paths], axis=1)
    count = jnp.zeros(node_capacity, jnp.int32).at[full.reshape(-1)].add(1)
    parent = jnp.full(node_capacity, -1, jnp.int32).at[full[:, 1:].reshape(-1)].set(full[:, :-1].reshape(-1))
    levels = jnp.broadcast_to(jnp.arange(depth_l + 1, dtype=jnp.int32), full.shape)
    depth = jnp.zeros(node_capacity, jnp.int32).at[full.reshape(-1)].set(levels.reshape(-1))
    return parent, depth, count


def path_log_prior_table(parent, depth, count, alpha, depth_l: int) -> jax.Array:
    """``log p(V | α)`` of docs/mathematics.md §6 from a node table (:func:`tree_from_paths`).

    ``count > 0`` marks the nodes of the tree; ``depth_l`` is ``L``. Jittable;
    the form :func:`path_log_prior` and BHMC's sampler use.
    """
    alpha = jnp.asarray(alpha, jnp.result_type(float))
    active = count > 0
    nonroot = active & (parent >= 0)
    m = jnp.zeros(count.shape[0], jnp.int32).at[jnp.where(nonroot, parent, 0)].add(nonroot.astype(jnp.int32))
    internal = active & (depth < depth_l)
    cnt = count.astype(alpha.dtype)
    per_internal = lax.lgamma(alpha) + m * jnp.log(alpha) - lax.lgamma(cnt + alpha)
    per_edge = lax.lgamma(jnp.where(nonroot, cnt, 1.0))
    return jnp.sum(jnp.where(internal, per_internal, 0.0)) + jnp.sum(jnp.where(nonroot, per_edge, 0.0))


def path_log_prior(paths: Any, alpha: Any, node_capacity: int | None = None) -> jax.Array:
    """``log p(V | α)`` of docs/mathematics.md §6 for paths ``(N, L)`` (node ids, root ``0`` implicit).

    >>> import numpy as np
    >>> float(np.exp(path_log_prior(np.array([[1, 2]]), 1.0)))  # one point: one path for sure
    1.0
    """
    paths = jnp.asarray(paths, jnp.int32)
    n, depth_l = paths.shape
    cap = default_node_capacity(n, depth_l) if node_capacity is None else int(node_capacity)
    parent, depth, count = tree_from_paths(paths, cap)
    return path_log_prior_table(parent, depth, count, alpha, depth_l)


def sample_ncrp(key: jax.Array, alpha: Any, num_points: int, depth: int, node_capacity: int | None = None):
    """Paths ``(N, L)`` drawn by seating ``N`` points one after the other in a nested CRP(``α``).

    New nodes get the next free id (creation order), so the ids fit in
    ``N L + 1`` slots. Returns int32 paths.
    """
    n, depth_l = int(num_points), int(depth)
    cap = default_node_capacity(n, depth_l) if node_capacity is None else int(node_capacity)
    alpha = jnp.asarray(alpha, jnp.result_type(float))
    gumbel = jax.random.gumbel(key, (n, depth_l, cap + 1), alpha.dtype)

    def seat(carry, g_n):
        count, parent, next_id = carry

        def level(l, c):
            node, row, count, parent, next_id = c
            is_child = (parent == node) & (count > 0)
            logits = jnp.concatenate([jnp.where(is_child, jnp.log(jnp.maximum(count, 1)), -jnp.inf),
                                      jnp.log(alpha)[None]])
            choice = jnp.argmax(logits + g_n[l])
            new = choice == cap
            child = jnp.where(new, next_id, choice).astype(jnp.int32)
            parent = jnp.where(new, parent.at[child].set(node), parent)
            next_id = next_id + new.astype(jnp.int32)
            return child, row.at[l].set(child), count, parent, next_id

        _, row, count, parent, next_id = lax.fori_loop(
            0, depth_l, level, (jnp.int32(0), jnp.zeros(depth_l, jnp.int32), count, parent, next_id))
        count = count.at[0].add(1).at[row].add(1)
        return (count, parent, next_id), row

    init = (jnp.zeros(cap, jnp.int32), jnp.full(cap, -1, jnp.int32), jnp.int32(1))
    _, paths = lax.scan(seat, init, gumbel)
    return paths


class NestedCRP(dist.Distribution):
    """The nested CRP(``α``) over ``N`` root-to-leaf paths of depth ``L`` (docs/mathematics.md §6).

    Values are ``(N, L)`` int32 node ids (root ``0`` implicit); ``log_prob`` is
    :func:`path_log_prior` (invariant to renaming the nodes).
    """

    arg_constraints = {"alpha": constraints.positive}
    support = constraints.nonnegative_integer
    is_discrete = True
    pytree_data_fields = ("alpha",)
    pytree_aux_fields = ("num_points", "depth", "node_capacity")

    def __init__(self, alpha, num_points: int, depth: int, node_capacity: int | None = None, *, validate_args=None):
        self.alpha = alpha
        self.num_points, self.depth = int(num_points), int(depth)
        self.node_capacity = (default_node_capacity(num_points, depth) if node_capacity is None
                              else int(node_capacity))
        super().__init__(batch_shape=(), event_shape=(self.num_points, self.depth), validate_args=validate_args)

    def sample(self, key, sample_shape=()):
        draw = lambda k: sample_ncrp(k, self.alpha, self.num_points, self.depth, self.node_capacity)
        if not sample_shape:
            return draw(key)
        keys = jax.random.split(key, math.prod(sample_shape))
        return jax.vmap(draw)(keys).reshape(tuple(sample_shape) + self.event_shape)

    def log_prob(self, value):
        fn = lambda p: path_log_prior(p, self.alpha, self.node_capacity)
        value = jnp.asarray(value, jnp.int32)
        if value.ndim == 2:
            return fn(value)
        flat = value.reshape((-1,) + self.event_shape)
        return jax.vmap(fn)(flat).reshape(value.shape[:-2])


# ------------------------------------------------------------------------- the generative program
def nested_hdp_model(
    X: Any = None,
    *,
    hyper: NestedHDP,
    num_points: int | None = None,
    component_capacity: int = 32,
    node_capacity: int | None = None,
    truncation: float = 1e-3,
):
    """BHMC's Algorithm 1 as a NumPyro program (docs/mathematics.md §6, finite truncation of paper §4.1).

    Sites: ``paths`` (:class:`NestedCRP`, ``(N, L)``), ``sticks`` (``K`` draws of
    ``Beta(1, γ0)``), ``log_beta`` (a deterministic ``(node_capacity, K + 1)``
    table: the root's truncated GEM weights, then level by level
    ``β_z' ~ Dir(γβ_z1, …, γβ_zK, γβ*_z)`` from the latent sites ``beta_gamma_1`` to
    ``beta_gamma_L`` of Gamma variables, normalised per node; each carries
    ``infer={"concentration": γ}``), ``c`` (``(N,)``, ``K`` = the rest),
    ``theta`` (``(K + 1, D)`` from ``N(μ0, Σ0)``) and ``x`` (observed if ``X`` is given).
    Deterministic sites ``num_sticks`` (the paper's stopping point: the first
    ``k`` with rest ``< truncation``) and ``truncation_ok``.

    :class:`~jaxbnp.inference.bhmc.BHMCKernel` samples this program's posterior:
    ``MCMC(BHMCKernel(nested_hdp_model), ...).run(key, X, hyper=hyper)``.
    """
    if X is not None:
        num_points = int(np.shape(X)[0])
    if num_points is None:
        raise ValueError("pass X or num_points.")
    n, depth_l, K = int(num_points), hyper.depth, int(component_capacity)
    cap = default_node_capacity(n, depth_l) if node_capacity is None else int(node_capacity)
    ftype = jnp.result_type(float)
    alpha, gamma0, gamma = (jnp.asarray(v, ftype) for v in (hyper.alpha, hyper.gamma0, hyper.gamma))

    paths = numpyro.sample("paths", NestedCRP(alpha, n, depth_l, cap))
    parent, depth, count = tree_from_paths(paths, cap)
    sticks = numpyro.sample("sticks", dist.Beta(jnp.ones(K, ftype), gamma0).to_event(1))
    log_rest = jnp.concatenate([jnp.zeros(1, ftype), jnp.cumsum(jnp.log1p(-sticks))])  # rest before stick k
    log_root = jnp.concatenate([jnp.log(sticks) + log_rest[:-1], log_rest[-1:]])
    numpyro.deterministic("num_sticks", jnp.argmax(jnp.concatenate([log_rest[1:] < math.log(truncation),
                                                                     jnp.array([True])])) + 1)
    numpyro.deterministic("truncation_ok", log_rest[-1] < math.log(truncation))

    # child weights, level by level: Dir(γ β_parent) via normalised Gamma(γ β_parent, 1) draws
    log_beta = jnp.full((cap, K + 1), -jnp.inf, ftype).at[0].set(log_root)
    for level in range(1, depth_l + 1):
        at_level = (depth == level) & (count > 0) & (parent >= 0)
        conc = gamma * jnp.exp(log_beta[jnp.maximum(parent, 0)])
        # floor at the smallest normal float: a weight that underflowed stays (numerically) zero
        conc = jnp.where(at_level[:, None], jnp.maximum(conc, jnp.finfo(ftype).tiny), 1.0)
        # γ rides in the site's infer dict: the one constant of the program that no
        # distribution holds (BHMCKernel reads it there)
        g = numpyro.sample(f"beta_gamma_{level}", dist.Gamma(conc, 1.0).to_event(2),
                           infer={"concentration": gamma})
        log_b = jnp.log(g) - jnp.log(jnp.sum(g, axis=-1, keepdims=True))
        log_beta = jnp.where(at_level[:, None], log_b, log_beta)
    log_beta = numpyro.deterministic("log_beta", log_beta)

    leaf = paths[:, -1]
    c = numpyro.sample("c", dist.Categorical(probs=jnp.exp(log_beta[leaf])))
    mu0, S0, S = (jnp.asarray(a, ftype) for a in (hyper.mu0, hyper.Sigma0, hyper.Sigma))
    theta = numpyro.sample("theta", dist.MultivariateNormal(mu0, S0).expand([K + 1]).to_event(1))
    numpyro.sample("x", dist.MultivariateNormal(theta[c], S).to_event(1), obs=X)


def simulate(
    key: jax.Array,
    hyper: NestedHDP,
    num_points: int,
    *,
    component_capacity: int = 32,
    node_capacity: int | None = None,
    truncation: float = 1e-3,
) -> dict:
    """Run :func:`nested_hdp_model` forward; return its sites as NumPy arrays plus ``X`` and ``labels``.

    ``labels[l]`` (``l = 1..L``) are the node ids at depth ``l``. Raises
    :class:`~jaxbnp.errors.CapacityError` when ``component_capacity``
    sticks did not bring the root's rest below ``truncation`` (paper §4.1).
    """
    if int(num_points) < 1:
        raise ValueError(f"num_points must be >= 1, got {num_points}.")
    model = handlers.seed(nested_hdp_model, key)
    tr = handlers.trace(model).get_trace(
        hyper=hyper, num_points=int(num_points), component_capacity=component_capacity,
        node_capacity=node_capacity, truncation=truncation)
    out = {name: np.asarray(site["value"]) for name, site in tr.items()}
    if not bool(out["truncation_ok"]):
        raise CapacityError(
            f"{component_capacity} sticks of GEM(gamma0={hyper.gamma0}) left a rest above "
            f"truncation={truncation}; pass a larger component_capacity.")
    out["X"] = out.pop("x")
    out["labels"] = {l: out["paths"][:, l - 1] for l in range(1, hyper.depth + 1)}
    return out
