"""Neal's Algorithm 8 on cluster slots: exact DP and Pitman-Yor mixtures of any NumPyro
likelihood (docs/mathematics.md §8).

The model keeps its cluster parameters in an ordinary ``numpyro.plate`` over ``C`` slots and
indexes them by the partition::

    def model(X):
        z = numpyro.sample("z", bnp.Partition(bnp.DP(1.0), X.shape[0]))
        with numpyro.plate("clusters", 32):
            rate = numpyro.sample("rate", dist.LogNormal(0.0, 1.0))
        numpyro.sample("X", dist.Poisson(rate[z]), obs=X)

One iteration of :func:`algorithm`'s ``step``:

1. the parameters of the empty slots are drawn afresh from their prior (they are the
   auxiliary components);
2. every point is scored against every slot at once (an ``(n, C)`` matrix of
   ``log f(x_i | theta_k)``: the model's likelihood site evaluated ``C`` times);
3. the labels are drawn one point after another from Algorithm 8's weights on slots:
   ``(n_{-i,k} - d) f(x_i | theta_k)`` for an occupied slot, ``(alpha + d K_{-i}) / (C - K_{-i})
   f(x_i | theta_j)`` for each empty one (only the counts are sequential), ``num_sweeps``
   times; then ``num_split_merge`` Metropolis-Hastings splits or merges given the same
   parameters (:func:`split_merge`);
4. the slots are renumbered in order of first appearance, their parameters with them (when
   the kernel owns every parameter site; under ``numpyro.infer.Gibbs`` with the parameters in
   another block the labels are slot indices, so the plate may have at most ``n`` slots);
5. the parameters of every occupied slot take ``num_param_steps`` slice-sampling steps along a
   random direction in the unconstrained space (all slots at once, each its own slice).

A point that finds no empty slot (``K_{-i} = C``) would need a cluster the plate cannot hold:
the state records ``overflow`` and the kernel raises ``CapacityError`` (a larger plate is the
fix); nothing is truncated silently.

:class:`AuxiliaryGibbs` is the NumPyro kernel: alone in ``MCMC`` it updates the partition and
the cluster parameters; as a block of ``numpyro.infer.Gibbs`` whose other blocks own the
parameters (``Gibbs([(bnp.AuxiliaryGibbs(model), ["z"]), (NUTS(model), ["rate"])])``) it
updates the partition given them.
"""

from __future__ import annotations

import math
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from numpyro.util import is_prng_key

from ..._cache import auto_enable
from ..._programs import call_cached
from ..._random import typed_key
from ..._validation import check_labels
from ...models.distributions import ConjugateMixture, Partition
from ...models.measures import DP, PitmanYor
from ..adapter import (DiscreteSiteKernel, numpyro_reads_every_step, sample_sites, step_checks_overflow,
                       trace_model)
from ..base import CHAIN_BATCHING, SamplingAlgorithm, run_chains
from .clusters import canonical_labels, raise_capacity_error_if, raise_capacity_error_on_host, slot_order
from .kernels import fill_partition_site
from .launch import launch_split_merge
from .slot_params import (choose_slots, flat_layout, flatten_slots, slot_counts, slot_log_density,
                          split_choice_log_ratio, to_front, unflatten_slots)

__all__ = ["AuxiliaryGibbs", "AuxiliaryGibbsState", "ClusterModelSpec", "AuxiliaryState", "AuxiliaryInfo",
           "ClusterModel", "find_cluster_spec", "depends_on_partition", "algorithm", "label_sweep", "slot_counts", "split_merge",
           "launch_split_merge", "SPLIT_MERGE_PROPOSALS", "split_choice_log_ratio", "empty_slot_log_weight", "slice_slots",
           "refresh_empty_slots", "update_slot_params", "renumber_slots"]


# ----------------------------------------------------------------------------- reading the model
class ClusterModelSpec(NamedTuple):
    """What :func:`find_cluster_spec` reads off one trace of the model.

    param_sites: every site in the cluster plate; owned_params: those that are latent in
    the trace (the kernel updates them; the others are conditioned, e.g. owned by NUTS in a
    ``numpyro.infer.Gibbs`` block); slot_axes: the plate's axis in each param site's value.
    """

    partition_site: str
    likelihood_site: str
    plate: str
    capacity: int
    param_sites: tuple
    owned_params: tuple
    slot_axes: tuple
    num_points: int

    @property
    def owned_sites(self) -> tuple:
        return (self.partition_site, *self.owned_params)

    def slot_axis(self, name: str) -> int:
        return self.slot_axes[self.param_sites.index(name)]


_EXAMPLE = (
    "e.g.\n    z = numpyro.sample('z', bnp.Partition(bnp.DP(1.0), n))\n"
    "    with numpyro.plate('clusters', 32):\n"
    "        rate = numpyro.sample('rate', dist.LogNormal(0.0, 1.0))\n"
    "    numpyro.sample('X', dist.Poisson(rate[z]), obs=X)"
)


def _frames(site) -> dict:
    return {f.name: f for f in site.get("cond_indep_stack", ())}


def depends_on_partition(model, partition_site: str, site: str, num_points: int, model_args,
                         model_kwargs) -> bool:
    """Whether ``site``'s log density is computed from the partition's value (a walk over the
    program's jaxpr: any equation with a dependent input makes its outputs dependent)."""

    def log_density(z):
        s = trace_model(model, {partition_site: z}, model_args, model_kwargs)[site]
        return s["fn"].log_prob(s["value"])

    closed = jax.make_jaxpr(log_density)(jnp.zeros(num_points, jnp.int32))
    dependent = {id(v) for v in closed.jaxpr.invars}
    for eqn in closed.jaxpr.eqns:
        if any(id(v) in dependent for v in eqn.invars if type(v).__name__ != "Literal"):
            dependent.update(id(v) for v in eqn.outvars)
    return any(id(v) in dependent for v in closed.jaxpr.outvars)


def find_cluster_spec(model_trace, owner: str, depends: Callable | None = None) -> ClusterModelSpec:
    """The partition site, the likelihood site and the cluster plate of a model (module
    docstring); ``ValueError`` naming ``owner`` and saying what to write for any other model.
    ``depends(name) -> bool`` (:func:`depends_on_partition`) settles which of several observed
    sites with a density per point is the likelihood."""
    partitions = sample_sites(model_trace, Partition, observed=False)
    if len(partitions) != 1:
        raise ValueError(f"{owner} needs a model with exactly one latent Partition site, {_EXAMPLE}; "
                         f"found {len(partitions)} ({partitions}).")
    p_name = partitions[0]
    p_fn = model_trace[p_name]["fn"]
    n = p_fn.num_points
    if not isinstance(p_fn.measure, (DP, PitmanYor)):
        raise ValueError(f"{owner} supports DP and PitmanYor partitions, not "
                         f"{type(p_fn.measure).__name__}.")
    if sample_sites(model_trace, ConjugateMixture, observed=True):
        raise ValueError(f"{owner} is for likelihoods written with a cluster plate; a ConjugateMixture "
                         "model is fitted by the collapsed kernels (bnp.CollapsedGibbs, bnp.SplitMerge, "
                         "bnp.SubClusterMCMC).")
    sites = {name: s for name, s in model_trace.items() if s["type"] == "sample" and name != p_name}
    observed = [name for name, s in sites.items() if s["is_observed"]]
    # the likelihood: an observed site with one log density per point (leading batch axis n)
    per_point = [name for name in observed
                 if tuple(sites[name]["fn"].batch_shape)[:1] == (n,)]
    latent_frames = {f for s in sites.values() if not s["is_observed"] for f in _frames(s)}
    likely = [name for name in per_point if not set(_frames(sites[name])) & latent_frames] or per_point
    if len(likely) > 1 and depends is not None:  # e.g. n slots owned by another Gibbs block
        likely = [name for name in likely if depends(name)]
    if len(likely) != 1:
        raise ValueError(f"{owner} needs exactly one observed site with one log density per point "
                         f"(batch shape ({n}, ...)) indexed by the partition, {_EXAMPLE}; found "
                         f"{len(likely)} ({likely}). A likelihood over several columns is one site "
                         "(.to_event(1)).")
    lik = likely[0]
    lik_frames = set(_frames(sites[lik]))
    plates = {f for name, s in sites.items() if name != lik for f in _frames(s) if f not in lik_frames}
    if len(plates) != 1:
        raise ValueError(f"{owner} needs the cluster parameters in one numpyro.plate over the slots, "
                         f"{_EXAMPLE}; found plates {sorted(plates)}. A vector parameter is one site "
                         "with .to_event(1), not a second plate.")
    plate = plates.pop()
    params, axes = [], []
    for name, s in sites.items():
        frame = _frames(s).get(plate)
        if frame is None or name == lik:
            continue
        batch = tuple(s["fn"].batch_shape)
        if frame.dim is None or -frame.dim > len(batch):
            raise ValueError(f"{owner}: site '{name}' is in plate '{plate}' but has no axis for it.")
        params.append(name)
        axes.append(len(batch) + frame.dim)
    capacity = int(next(_frames(model_trace[p]) for p in params)[plate].size)
    owned = tuple(name for name in params if not sites[name]["is_observed"])
    if len(owned) < len(params) and capacity > n:
        raise ValueError(
            f"{owner}: with the cluster parameters {[p for p in params if p not in owned]} owned by "
            f"another block of numpyro.infer.Gibbs, the labels are slot indices, so plate '{plate}' "
            f"may have at most n = {n} slots (it has {capacity}).")
    others = [name for name, s in sites.items()
              if not s["is_observed"] and name not in params]
    if others:
        raise ValueError(
            f"The model has latent sites {others} outside the cluster plate that {owner} does not "
            f"update. Update them with NUTS: numpyro.infer.Gibbs([(bnp.{owner}(model), "
            f"{[p_name, *owned]}), (NUTS(model), {others})]).")
    for name in owned:
        if sites[name]["fn"].is_discrete:
            raise ValueError(f"{owner}: the cluster parameter '{name}' is discrete; the kernel samples "
                             "continuous parameters.")
    return ClusterModelSpec(p_name, lik, plate, capacity, tuple(params), owned, tuple(axes), n)


# ----------------------------------------------------------------------------- the model's densities
class ClusterModel:
    """The model's densities for one spec and one set of model arguments (a closure, free
    under tracing)."""

    def __init__(self, model, spec: ClusterModelSpec, model_args, model_kwargs):
        self.model, self.spec = model, spec
        self.args, self.kwargs = model_args, dict(model_kwargs or {})

    def trace(self, labels, params, key=None):
        data = {self.spec.partition_site: labels, **params}
        return trace_model(self.model, data, self.args, self.kwargs, key=key)

    def point_log_lik(self, tr) -> jax.Array:
        """``log f(x_i | theta_{z_i})`` of every point, ``(n,)``."""
        s = tr[self.spec.likelihood_site]
        lp = s["fn"].log_prob(s["value"])
        return lp.reshape(self.spec.num_points, -1).sum(-1)

    def slot_log_prior(self, tr, names) -> jax.Array:
        """``sum over names of log p(theta_k)`` per slot, ``(C,)``."""
        total = jnp.zeros(self.spec.capacity)
        for name in names:
            s = tr[name]
            lp = s["fn"].log_prob(s["value"])  # batch shape: the slot axis is where it is in the value
            total = total + to_front(lp, self.spec.slot_axis(name)).reshape(self.spec.capacity, -1).sum(-1)
        return total

    def slot_params(self, params, k):
        """Every slot holding slot ``k``'s parameters (scoring all points against slot ``k``)."""
        out = {}
        for name, v in params.items():
            axis = self.spec.slot_axis(name)
            out[name] = jnp.broadcast_to(jnp.take(v, jnp.array([k]), axis=axis), v.shape)
        return out

    def log_joint(self, labels, params) -> jax.Array:
        """``log p(X, Pi, theta)``: the likelihood, every slot's prior and the partition's."""
        tr = self.trace(labels, params)
        return (self.point_log_lik(tr).sum() + self.slot_log_prior(tr, self.spec.param_sites).sum()
                + tr[self.spec.partition_site]["fn"].log_prob(labels))

    def params(self, z) -> dict:
        """Every param site's value with the sites in ``z`` substituted (the others, e.g.
        conditioned by another ``numpyro.infer.Gibbs`` block, at their current values)."""
        tr = trace_model(self.model, z, self.args, self.kwargs)
        return {name: tr[name]["value"] for name in self.spec.param_sites}

    def log_lik_matrix(self, params) -> jax.Array:
        """``log f(x_i | theta_k)`` for every point and slot, ``(n, C)``: the likelihood site
        with every slot set to slot ``k``'s parameters and every label 0, for each ``k``."""
        zeros = jnp.zeros(self.spec.num_points, jnp.int32)

        def column(k):
            return self.point_log_lik(self.trace(zeros, self.slot_params(params, k)))

        return jax.vmap(column, out_axes=1)(jnp.arange(self.spec.capacity))


# ----------------------------------------------------------------------------- unconstrained slots
# ----------------------------------------------------------------------------- the moves
def empty_slot_log_weight(log_new, free):
    """Log weight of each of the ``free`` empty slots: the measure's new-cluster weight shared
    among them (docs/mathematics.md §8: the uniform placement of clusters in slots)."""
    return log_new - jnp.log(jnp.maximum(free, 1))


def label_sweep(key, labels, log_lik, measure, capacity: int):
    """Algorithm 8 on slots (module docstring, step 3), points in order: ``(labels, overflow)``.

    ``log_lik`` is ``(n, C)``; a point alone in its slot leaves it empty with its parameters
    (one of the auxiliary components); ``overflow`` is set when a point finds every other
    slot occupied (the plate would need one more)."""
    n = labels.shape[0]
    gumbel = jax.random.gumbel(key, (n, capacity), log_lik.dtype)
    counts = slot_counts(labels, capacity)

    def one(carry, xs):
        counts, overflow = carry
        own, ll, g = xs
        minus = counts.at[own].add(-1)
        log_existing, log_new = measure.gibbs_log_weights(minus)
        free = capacity - jnp.sum(minus > 0)
        log_w = jnp.where(minus > 0, log_existing, empty_slot_log_weight(log_new, free).astype(ll.dtype)) + ll
        new = jnp.argmax(log_w + g).astype(jnp.int32)
        return (minus.at[new].add(1), overflow | (free == 0)), new

    (_, overflow), new = lax.scan(one, (counts, jnp.zeros((), bool)), (labels, log_lik, gumbel))
    return new, overflow


def split_merge(key, labels, log_lik, measure, capacity: int, log_prior: Callable | None = None,
                choice_log_ratio: Callable | None = None, split_slot: Callable | None = None,
                merge_ok: Callable | None = None):
    """One Metropolis-Hastings split or merge of clusters given every slot's parameters
    (docs/mathematics.md §8, "Splits and merges"): ``(labels, accepted)``.

    Split (probability 1/2): an occupied slot ``a`` and an empty slot ``b``, each uniformly;
    each member of ``a`` moves to ``b`` with probability ``f_b / (f_a + f_b)`` (its
    likelihoods under the two slots' parameters, rows of ``log_lik``); a proposal that moves
    none or all of them is rejected. Merge: an ordered pair of occupied slots, uniformly; the
    members of ``b`` join ``a``. The parameters do not change (the empty slot's are a prior
    draw, part of the state), so the ratio is the EPPF's, the likelihood's and the proposal's:
    ``log r = Δ log p(Π) + Δ log f - log K_split - Σ log q_i`` for a split into ``K_split``
    clusters, its negative for the merge back.

    Another target of the labels (``SliceGibbs``: the allocation's law over stick-breaking
    positions) passes ``log_prior(counts)`` (default ``measure.log_eppf``), the slot choices'
    ``choice_log_ratio(k)`` for a split of one of ``k`` clusters (default
    :func:`split_choice_log_ratio`), ``split_slot(key, occupied)``, the empty slot a split
    fills (default: uniform), and ``merge_ok(b, new_counts)``, whether that split's rule would
    pick ``b`` after the merge (a merge whose reverse split is impossible is rejected)."""
    n = labels.shape[0]
    k_type, k_a, k_b, k_alloc, k_acc = jax.random.split(key, 5)
    counts = slot_counts(labels, capacity)
    occupied = counts > 0
    k = jnp.sum(occupied)
    split, a, b = choose_slots(k_type, k_a, k_b, occupied, split_slot)
    la, lb = log_lik[:, a], log_lik[:, b]
    norm = jnp.logaddexp(la, lb)
    log_qa, log_qb = la - norm, lb - norm
    in_a, in_b = labels == a, labels == b
    go_b = in_a & (jax.random.uniform(k_alloc, (n,), la.dtype) < jnp.exp(log_qb))
    moved = jnp.sum(go_b)
    # split: members of a that go to b; merge: members of b that join a
    new = jnp.where(split, jnp.where(go_b, b, labels), jnp.where(in_b, a, labels)).astype(labels.dtype)
    new_counts = slot_counts(new, capacity)
    log_prior = measure.log_eppf if log_prior is None else log_prior
    choice = split_choice_log_ratio if choice_log_ratio is None else choice_log_ratio
    d_eppf = log_prior(new_counts) - log_prior(counts)
    split_alloc = jnp.sum(jnp.where(in_a, jnp.where(go_b, log_qb, log_qa), 0.0))
    merge_alloc = jnp.sum(jnp.where(in_a | in_b, jnp.where(in_b, log_qb, log_qa), 0.0))
    log_r = jnp.where(
        split,
        d_eppf + jnp.sum(jnp.where(go_b, lb - la, 0.0)) + choice(k) - split_alloc,
        d_eppf + jnp.sum(jnp.where(in_b, la - lb, 0.0)) - choice(k - 1) + merge_alloc,
    )
    reverse = True if merge_ok is None else merge_ok(b, new_counts)
    valid = jnp.where(split, (k < capacity) & (moved > 0) & (moved < counts[a]), (k >= 2) & reverse)
    accept = valid & (jnp.log(jax.random.uniform(k_acc, (), la.dtype, minval=1e-30)) < log_r)
    return jnp.where(accept, new, labels), accept


def slice_slots(key, log_density: Callable, x0, lp0, width, max_steps_out: int = 8,
                max_shrinks: int = 200, active=None):
    """One slice-sampling step of every row of ``x0`` (``(C, D)``), each along its own random
    direction (hit and run; Neal 2003, stepping out with a random split of
    ``max_steps_out``, then shrinkage). ``log_density(x) -> (C,)`` must be separable: row
    ``k``'s density depends on row ``k`` only. ``lp0 = log_density(x0)``. All rows move in
    lockstep: one call of ``log_density`` per stepping or shrinking round. ``active``
    (``(C,)`` bool, default all): the rows that step; the others keep their value and hold
    no round back (each row's draws do not depend on the others', so the active rows move
    as they would with every row stepping)."""
    c, d = x0.shape
    active = jnp.ones(c, bool) if active is None else jnp.asarray(active, bool)
    k_dir, k_level, k_pos, k_split, k_shrink = jax.random.split(key, 5)
    u = jax.random.normal(k_dir, (c, d), x0.dtype)
    u = u / jnp.linalg.norm(u, axis=1, keepdims=True)
    log_y = lp0 + jnp.log(jax.random.uniform(k_level, (c,), x0.dtype, minval=1e-30))

    def at(t):
        return log_density(x0 + t[:, None] * u)

    left = -width * jax.random.uniform(k_pos, (c,), x0.dtype)
    right = left + width
    j = jnp.floor(max_steps_out * jax.random.uniform(k_split, (c,), x0.dtype)).astype(jnp.int32)
    k = max_steps_out - 1 - j

    def step_out(sign):
        def cond(carry):
            edge, steps, inside = carry
            return jnp.any(inside)

        def body(carry):
            edge, steps, inside = carry
            edge = jnp.where(inside, edge + sign * width, edge)
            steps = steps - inside
            inside = inside & (steps > 0) & (at(edge) > log_y)
            return edge, steps, inside

        return body, cond

    body, cond = step_out(-1.0)
    left, _, _ = lax.while_loop(cond, body, (left, j, active & (j > 0) & (at(left) > log_y)))
    body, cond = step_out(1.0)
    right, _, _ = lax.while_loop(cond, body, (right, k, active & (k > 0) & (at(right) > log_y)))

    def shrink_cond(carry):
        _, _, _, _, done, i, _ = carry
        return jnp.any(~done) & (i < max_shrinks)

    def shrink_body(carry):
        left, right, t, lp, done, i, key = carry
        key, sub = jax.random.split(key)
        t_new = left + (right - left) * jax.random.uniform(sub, (c,), x0.dtype)
        lp_new = at(t_new)
        accept = (~done) & (lp_new > log_y)
        left = jnp.where(done | accept | (t_new >= 0), left, t_new)
        right = jnp.where(done | accept | (t_new < 0), right, t_new)
        return (left, right, jnp.where(accept, t_new, t), jnp.where(accept, lp_new, lp),
                done | accept, i + 1, key)

    init = (left, right, jnp.zeros(c, x0.dtype), lp0, ~active, jnp.int32(0), k_shrink)
    _, _, t, lp, _, _, _ = lax.while_loop(shrink_cond, shrink_body, init)
    return x0 + t[:, None] * u, lp


def refresh_empty_slots(m: "ClusterModel", key, labels, params) -> dict:
    """The owned parameters of every empty slot drawn afresh from their prior (the model
    traced without their values); the occupied slots keep theirs."""
    spec = m.spec
    if not spec.owned_params:
        return params
    occupied = slot_counts(labels, spec.capacity) > 0
    others = {k: v for k, v in params.items() if k not in spec.owned_params}
    fresh = m.trace(labels, others, key=key)
    params = dict(params)
    for name in spec.owned_params:
        axis = spec.slot_axis(name)
        keep = occupied.reshape((-1,) + (1,) * (params[name].ndim - axis - 1))
        params[name] = jnp.where(keep, params[name], fresh[name]["value"])
    return params


def update_slot_params(m: "ClusterModel", key, labels, params, num_steps: int, step_size: float) -> dict:
    """``num_steps`` slice-sampling steps (:func:`slice_slots`) of every occupied slot's owned
    parameters given the labels, all slots at once, in the unconstrained coordinates: slot
    ``k`` targets ``p(theta_k) prod_{i: z_i = k} f(x_i | theta_k)``. Empty slots keep their
    values: the iteration's first step drew them from their prior, which is their
    conditional given the labels, so another move of them would leave the same law (and
    cost stepping rounds that every slot waits for)."""
    spec = m.spec
    if not spec.owned_params:
        return params
    layout = flat_layout(spec, m.trace(labels, params))
    fixed = {k: v for k, v in params.items() if k not in spec.owned_params}
    x, log_density = flatten_slots(layout, spec, params), slot_log_density(m, layout, fixed, labels)
    lp = log_density(x)
    occupied = slot_counts(labels, spec.capacity) > 0
    for k in jax.random.split(key, num_steps):
        x, lp = slice_slots(k, log_density, x, lp, step_size, active=occupied)
    return {**params, **unflatten_slots(layout, spec, x)[0]}


def renumber_slots(spec: ClusterModelSpec, labels, params):
    """``(labels, params, order)``: the slots in order of first appearance, each parameter with
    its slot (``order[j]``: the old slot now at ``j``), when the kernel owns every parameter
    site; otherwise (another ``numpyro.infer.Gibbs`` block owns some) the slots stay where
    they are and ``order`` is ``None``."""
    if set(spec.owned_params) != set(spec.param_sites):
        return labels, params, None
    order, labels = slot_order(labels, spec.capacity)
    params = {name: jnp.take(v, order, axis=spec.slot_axis(name)) for name, v in params.items()}
    return labels, params, order


# ----------------------------------------------------------------------------- the algorithm
class AuxiliaryState(NamedTuple):
    """labels: ``(n,)`` slots in order of first appearance; params: every param site's value
    (slots renumbered with the labels); overflow: sticky, a point found no empty slot."""

    labels: jax.Array
    params: dict
    overflow: jax.Array


class AuxiliaryInfo(NamedTuple):
    num_clusters: jax.Array
    log_joint: jax.Array
    num_accepted: jax.Array  # splits and merges accepted


def algorithm(model: Callable, spec: ClusterModelSpec, model_args=(), model_kwargs=None, *,
              num_sweeps: int = 1, num_split_merge: int = 0, num_param_steps: int = 1,
              step_size: float = 1.0, split_merge_kind: str = "given",
              num_launch_steps: int = 4) -> SamplingAlgorithm:
    """Algorithm 8 on slots for ``model`` (module docstring) as ``init(key, labels, params)``,
    ``step(key, state)``; ``spec`` from :func:`find_cluster_spec`, the model's values (data,
    conditioned sites) read from ``model_args``/``model_kwargs`` at every step.
    ``split_merge_kind``: ``"given"`` (:func:`split_merge`, the parameters kept) or ``"launch"``
    (:func:`launch_split_merge`, the parameters drawn; the kernel must own some)."""
    m = ClusterModel(model, spec, model_args, model_kwargs)
    capacity = spec.capacity

    def renumber(labels, params):
        return renumber_slots(spec, labels, params)[:2]

    def init(key, labels, params):
        labels, params = renumber(jnp.asarray(labels, jnp.int32), params)
        return AuxiliaryState(labels, params, jnp.zeros((), bool))

    def step(key, state):
        k_fresh, k_labels, k_params = jax.random.split(key, 3)
        labels, params = state.labels, dict(state.params)
        measure = m.trace(labels, params)[spec.partition_site]["fn"].measure
        params = refresh_empty_slots(m, k_fresh, labels, params)  # 1.
        # 2-3. every point against every slot, then the labels one point at a time, then
        # splits and merges given the same parameters
        log_lik = m.log_lik_matrix(params)
        overflow = jnp.zeros((), bool)
        k_sweeps, k_moves = jax.random.split(k_labels)
        for k in jax.random.split(k_sweeps, num_sweeps) if num_sweeps else ():
            labels, full = label_sweep(k, labels, log_lik, measure, capacity)
            overflow = overflow | full
        if num_split_merge:
            def move(i, carry):
                labels, params, accepted = carry
                key = jax.random.fold_in(k_moves, i)
                if split_merge_kind == "launch":
                    labels, params, ok = launch_split_merge(m, key, labels, params, measure,
                                                            num_launch_steps)
                else:
                    labels, ok = split_merge(key, labels, log_lik, measure, capacity)
                return labels, params, accepted + ok

            labels, params, accepted = lax.fori_loop(0, num_split_merge, move,
                                                     (labels, params, jnp.zeros((), jnp.int32)))
        else:
            accepted = jnp.zeros((), jnp.int32)
        # 4. slots in order of first appearance
        labels, params = renumber(labels, params)
        # 5. the parameters, all slots at once
        params = update_slot_params(m, k_params, labels, params, num_param_steps, step_size)
        num_clusters = jnp.sum(slot_counts(labels, capacity) > 0).astype(jnp.int32)
        new = AuxiliaryState(labels, params, state.overflow | overflow)
        return new, AuxiliaryInfo(num_clusters, m.log_joint(labels, params), accepted)

    return SamplingAlgorithm(init, step)


# ----------------------------------------------------------------------------- the NumPyro kernel
#: split or merge proposals per iteration by default (each is one pass over the points)
DEFAULT_SPLIT_MERGE = 10
#: the kernel's ``split_merge`` choices: the parameters kept, or drawn from launch states
SPLIT_MERGE_PROPOSALS = ("given", "launch")


class AuxiliaryGibbsState(NamedTuple):
    """z: the kernel's sites by name (the partition, the cluster parameters it owns);
    log_joint: ``log p(X, Pi, theta)`` after the step; num_clusters: ``K``; num_accepted: splits
    and merges accepted in the step; overflow: sticky; overflow_on_host: where ``CapacityError``
    is raised, as in :class:`~jaxbnp.inference.partition.kernels.PartitionKernelState`."""

    z: dict
    log_joint: jax.Array
    num_clusters: jax.Array
    num_accepted: jax.Array
    overflow: jax.Array
    rng_key: jax.Array
    overflow_on_host: tuple | None = None


class AuxiliaryGibbs(DiscreteSiteKernel):
    """Neal's Algorithm 8 on the slots of a cluster plate, for any NumPyro likelihood
    (module docstring; docs/mathematics.md §8).

    :param model: a NumPyro model with one latent ``Partition`` site (``DP`` or
        ``PitmanYor``), its cluster parameters in one ``numpyro.plate`` over slots, and one
        observed site with a log density per point that indexes them by the partition.
    :param num_sweeps: Gibbs sweeps of the labels per iteration (Algorithm 8; 0: none).
    :param num_split_merge: split or merge proposals per iteration, after the sweeps, given the
        same parameters (:func:`split_merge`): they move many points at once where single
        points cannot (a large cluster that holds two groups).
    :param split_merge: ``"given"`` (default): the splits and merges keep every slot's
        parameters (the new cluster takes the empty slot's prior draw; cheap, one pass over
        the points); ``"launch"``: Jain and Neal's (2007) kind, which draws the parameters of
        the clusters it makes from launch states fitted by Newton steps
        (:func:`launch_split_merge`; tens of passes over the points per proposal). It needs
        the kernel to own the cluster parameters.
    :param num_launch_steps: ``split_merge="launch"``'s rounds of parameter and allocation
        updates that build each launch state.
    :param num_param_steps: slice-sampling steps of the cluster parameters per iteration.
    :param step_size: the slice sampler's initial interval, in the parameters' unconstrained
        coordinates (stepped out up to 8 times, then shrunk: any value is exact).
    :param init_strategy: the first partition when ``init_params`` has none: ``"one"`` (one
        cluster) or ``"prior"`` (a draw from the partition prior; it must fit the plate).
    :param chain_batching: as for :class:`~jaxbnp.CollapsedGibbs`.

    The plate's size is the number of slots: a point that finds them all occupied raises
    ``CapacityError`` (enlarge the plate). Cluster parameters missing from ``init_params``
    start from a prior draw. Extra fields ``"log_joint"``, ``"num_clusters"`` and
    ``"num_accepted"`` (splits and merges accepted in the iteration).
    """

    sample_field = "z"
    chains_in_threads = True
    #: raise ``CapacityError`` from inside the step (a host callback); the runner turns it off
    #: and reads :meth:`overflowed` after the run instead, to grow the plate
    host_overflow_check = True

    def __init__(self, model: Callable, *, num_sweeps: int = 1, num_split_merge: int = DEFAULT_SPLIT_MERGE,
                 num_param_steps: int = 1, step_size: float = 1.0, init_strategy: str = "one",
                 chain_batching: str = "auto", split_merge: str = "given", num_launch_steps: int = 4):
        if not callable(model):
            raise ValueError(f"{type(self).__name__}(model): model must be a NumPyro model function.")
        for name, value, low in (("num_sweeps", num_sweeps, 0), ("num_split_merge", num_split_merge, 0),
                                 ("num_param_steps", num_param_steps, 1),
                                 ("num_launch_steps", num_launch_steps, 1)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {value!r}.")
        if num_sweeps == 0 and num_split_merge == 0:
            raise ValueError("num_sweeps and num_split_merge are both 0: the labels would never move.")
        if not (isinstance(step_size, (int, float)) and math.isfinite(step_size) and step_size > 0):
            raise ValueError(f"step_size must be a positive number, got {step_size!r}.")
        if split_merge not in SPLIT_MERGE_PROPOSALS:
            raise ValueError(f"split_merge must be one of {SPLIT_MERGE_PROPOSALS}, got {split_merge!r}.")
        if init_strategy not in ("one", "prior"):
            raise ValueError(f"init_strategy must be 'one' or 'prior', got {init_strategy!r}.")
        if chain_batching not in CHAIN_BATCHING:
            raise ValueError(f"chain_batching must be one of {CHAIN_BATCHING}, got {chain_batching!r}.")
        self._model = model
        self._num_sweeps, self._num_split_merge = int(num_sweeps), int(num_split_merge)
        self._num_param_steps = int(num_param_steps)
        self._step_size = float(step_size)
        self._init_strategy = init_strategy
        self._chain_batching = chain_batching
        self._split_merge, self._num_launch_steps = split_merge, int(num_launch_steps)
        self._spec = None
        self._sample_fn = None

    def fill_site(self, site):
        return fill_partition_site(site)

    def find_spec(self, model_trace) -> ClusterModelSpec:
        args, kwargs = getattr(self, "_reading", ((), {}))
        p = sample_sites(model_trace, Partition, observed=False)

        def depends(site):
            return depends_on_partition(self._model, p[0], site, model_trace[p[0]]["fn"].num_points,
                                        args, kwargs)

        return find_cluster_spec(model_trace, self.owner, depends if len(p) == 1 else None)

    def read_model(self, init_params, model_args, model_kwargs):
        self._reading = (model_args, model_kwargs)
        try:
            return super().read_model(init_params, model_args, model_kwargs)
        finally:
            del self._reading

    def _algorithm(self, spec, model_args, model_kwargs):
        return algorithm(self._model, spec, model_args, model_kwargs, num_sweeps=self._num_sweeps,
                         num_split_merge=self._num_split_merge, num_param_steps=self._num_param_steps,
                         step_size=self._step_size, split_merge_kind=self._split_merge,
                         num_launch_steps=self._num_launch_steps)

    def _check_init(self, init_params, spec):
        labels = init_params.get(spec.partition_site)
        if labels is None or isinstance(labels, jax.core.Tracer):
            return
        labels = np.asarray(labels)
        for row in labels.reshape(-1, labels.shape[-1]):
            check_labels(row, spec.num_points, f"init_params['{spec.partition_site}']")
            k = len(np.unique(row))
            if k > spec.capacity:
                raise ValueError(f"init_params['{spec.partition_site}'] has {k} clusters but plate "
                                 f"'{spec.plate}' has {spec.capacity} slots.")

    def init(self, rng_key, num_warmup, init_params, model_args, model_kwargs):
        # where an overflow is raised (NumPyro's progress bar, or a callback in the step)
        on_host = self.host_overflow_check and numpyro_reads_every_step(self, rng_key)
        rng_key = typed_key(rng_key)  # jax.random.PRNGKey or jax.random.key: the same draws
        auto_enable()  # JAX's persistent compilation cache (jaxbnp.enable_compilation_cache)
        init_params = dict(init_params or {})
        _, spec = self.read_model(init_params, model_args, model_kwargs)
        self._spec = spec
        if self._split_merge == "launch" and self._num_split_merge and not spec.owned_params:
            raise ValueError(f"{self.owner}: split_merge='launch' draws the cluster parameters, but "
                             "another block owns them all; use split_merge='given' in this block.")
        self._check_init(init_params, spec)
        batched = not is_prng_key(rng_key)
        strategy, owner = self._init_strategy, self.owner

        def init_one(key, params, args, kwargs):
            k_init, k_labels, k_params, key = jax.random.split(key, 4)
            if spec.partition_site in params:
                labels = jnp.asarray(params[spec.partition_site], jnp.int32)
            elif strategy == "prior":
                tr = trace_model(self._model, {}, args, kwargs, fill=None, key=k_labels)
                labels = tr[spec.partition_site]["value"].astype(jnp.int32)
            else:
                labels = jnp.zeros(spec.num_points, jnp.int32)
            given = {k: jnp.asarray(v) for k, v in params.items() if k in spec.owned_params}
            tr = trace_model(self._model, {spec.partition_site: labels, **given}, args, kwargs,
                             key=k_params)
            theta = {name: tr[name]["value"] for name in spec.param_sites}
            labels = canonical_labels(labels, spec.num_points)
            too_many = jnp.max(labels) >= spec.capacity  # more clusters than slots: an error
            labels = jnp.where(labels < spec.capacity, labels, 0)
            state = self._algorithm(spec, args, kwargs).init(k_init, labels, theta)
            return self._kernel_state(spec, state, key, args, kwargs, too_many)

        static = ("init", spec, batched, tuple(sorted(init_params)), strategy, owner)
        if batched:
            axes = {k: 0 for k in init_params}

            def init_many(keys, params, args, kwargs):
                return run_chains(init_one, keys, params, args, kwargs, in_axes=(0, axes, None, None),
                                  how="vmap")

            state = call_cached(self, "init", static, init_many, rng_key, init_params,
                                model_args=model_args, model_kwargs=model_kwargs)
        else:
            state = call_cached(self, "init", static, init_one, rng_key, init_params,
                                model_args=model_args, model_kwargs=model_kwargs)
        # traced (chain_method="parallel"): the flag is sticky, the first step raises on it
        if not isinstance(state.overflow, jax.core.Tracer) and bool(np.any(np.asarray(state.overflow))):
            raise ValueError(f"{owner}: the first partition has more clusters than plate "
                             f"'{spec.plate}' has slots ({spec.capacity}); enlarge the plate.")
        how = self._chain_batching

        def sample_one(state, args, kwargs):
            return self._sample_one(spec, state, args, kwargs)

        if batched:
            self._sample_fn = lambda state, args, kwargs: run_chains(
                sample_one, state, args, kwargs, in_axes=(0, None, None), how=how)
        else:
            self._sample_fn = sample_one
        return state._replace(overflow_on_host=() if on_host else None)

    def _kernel_state(self, spec, state: AuxiliaryState, key, args, kwargs, overflow, info=None):
        """The kernel's state from the algorithm's; ``info`` (after a step) holds the log
        joint, ``K`` and the accepted moves, else they are computed (none accepted)."""
        if info is None:
            lj = ClusterModel(self._model, spec, args, kwargs).log_joint(state.labels, state.params)
            k = jnp.sum(slot_counts(state.labels, spec.capacity) > 0).astype(jnp.int32)
            accepted = jnp.zeros((), jnp.int32)
        else:
            lj, k, accepted = info.log_joint, info.num_clusters, info.num_accepted
        z = {spec.partition_site: state.labels, **{n: state.params[n] for n in spec.owned_params}}
        return AuxiliaryGibbsState(z, lj, k, accepted, state.overflow | overflow, key)

    def _algorithm_state(self, spec, s, params):
        """The algorithm's state from the kernel's ``s`` and every param site's value."""
        return AuxiliaryState(s.z[spec.partition_site], params, s.overflow)

    def overflowed(self, state) -> bool:
        """Whether a chain ran out of slots (the sticky flag ``host_overflow_check=False``
        leaves in the state; :func:`jaxbnp.inference.runner.run` then grows the plate)."""
        return bool(np.any(np.asarray(state.overflow)))

    def _raise_on_overflow(self, spec, overflow, on_host=False):
        """``CapacityError`` if ``overflow`` is set: at once on the host (``on_host``, a concrete
        flag), or from inside a program through one host callback."""
        if not self.host_overflow_check:
            return
        if spec.capacity < spec.num_points:  # else a free slot always exists: no host callback
            raise_ = raise_capacity_error_on_host if on_host else raise_capacity_error_if
            raise_(overflow, spec.capacity, f"Enlarge the plate '{spec.plate}' (e.g. twice as many slots)")

    def _sample_one(self, spec, s: AuxiliaryGibbsState, args, kwargs):
        key, k_step = jax.random.split(s.rng_key)
        # the conditioned sites (NUTS's parameters in a Gibbs block) at their current values
        params = ClusterModel(self._model, spec, args, kwargs).params(s.z)
        alg = self._algorithm(spec, args, kwargs)
        new, info = alg.step(k_step, self._algorithm_state(spec, s, params))
        return self._kernel_state(spec, new, key, args, kwargs, new.overflow, info)

    def sample(self, state, model_args, model_kwargs):
        new = self._sample_fn(state, model_args, model_kwargs)
        # NumPyro's progress bar reads every step's state on the host: get_diagnostics_str
        # raises there, and the program holds no callback (JAX's persistent cache keeps it)
        if step_checks_overflow(self, state):
            # here, not per chain: one host callback per iteration for a batch of chains (on a
            # few points a callback costs about as much as a chain's iteration: SliceGibbs, 6
            # points, 32 slots, 8 chains, 9.3 -> 5.5 ms per iteration)
            self._raise_on_overflow(self._spec, jnp.any(new.overflow))
        return new._replace(overflow_on_host=state.overflow_on_host)

    def refresh(self, state, model_args, model_kwargs):
        """The cached log joint and parameters against the current conditioning values (the
        sites other blocks of ``numpyro.infer.Gibbs`` own)."""
        spec = self._spec

        def one(s):
            params = ClusterModel(self._model, spec, model_args, model_kwargs).params(s.z)
            state = self._algorithm_state(spec, s, params)
            return self._kernel_state(spec, state, s.rng_key, model_args, model_kwargs,
                                      s.overflow)._replace(num_accepted=s.num_accepted,
                                                           overflow_on_host=s.overflow_on_host)

        if jnp.ndim(state.log_joint):
            return run_chains(one, state, in_axes=(0,), how="vmap")
        return one(state)

    @property
    def default_fields(self):
        return ("z",)

    def get_diagnostics_str(self, state):
        """The progress bar's text; first, ``CapacityError`` if a chain ran out of slots (when
        NumPyro's progress bar calls this after every step, the step itself does not check)."""
        self._raise_on_overflow(self._spec, state.overflow, on_host=True)
        return f"K={int(np.max(np.asarray(state.num_clusters)))}"
