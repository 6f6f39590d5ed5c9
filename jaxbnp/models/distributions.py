"""NumPyro distributions for BNP mixtures (docs/mathematics.md §1-2).

* ``Partition(measure, num_points, u=None)``: a random partition of
  ``num_points`` items, as an integer label vector. ``log_prob`` is the
  measure's EPPF (labels are only identified up to renaming: any labelling
  of the same partition has the same density); for ``NGGP`` with ``u`` given
  it is the joint density ``log p(Π, u)``. ``sample`` draws from the prior by
  the CRP / NRM urn, labels in order of first appearance.
* ``ConjugateMixture(family, labels)``: the observations given the
  partition, with every cluster's parameters integrated out:
  ``log_prob(X) = Σ_c log P(X_c)``.
* ``AuxiliaryU()``: the improper flat "prior" of the NGGP auxiliary ``u``;
  the density of ``u`` is carried by ``Partition(..., u=u)``, so the model's
  joint is exactly ``p(Π, u)``.
* ``mixture_model(X, measure, family)``: the NumPyro model made of these
  (``z ~ Partition``, ``X ~ ConjugateMixture``, and ``u`` for NGGP), the one
  the estimators and the ``jaxbnp`` command line sample.

Example (NGGP)
--------------
>>> import numpyro, jaxbnp as bnp
>>> def model(X):
...     u = numpyro.sample("u", bnp.AuxiliaryU())
...     z = numpyro.sample("z", bnp.Partition(bnp.NGGP(1.0, 0.3), X.shape[0], u=u))
...     numpyro.sample("X", bnp.ConjugateMixture(bnp.NormalGamma(), z), obs=X)
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.distributions import constraints

from .. import _math
from .._validation import check_data
from .discrete import BetaBernoulli, DirichletMultinomial
from .families import Family, NormalGamma, NormalWishart
from .measures import Measure

__all__ = ["Partition", "ConjugateMixture", "AuxiliaryU", "log_joint", "mixture_model"]


def _concrete_array(value: Any, owner: str, name: str):
    """``value`` as a NumPy array when it is concrete (``None`` while traced), or a
    ``TypeError`` naming ``owner: name`` for ``None``, strings and other non-numeric values."""
    if isinstance(value, jax.core.Tracer):
        return None
    if value is None:
        raise TypeError(f"{owner}: {name} must be an array, got None.")
    try:
        arr = np.asarray(value)
    except Exception as exc:  # ragged lists, exotic objects
        raise TypeError(f"{owner}: {name} could not be converted to an array ({exc}).") from exc
    if arr.dtype.kind not in "biuf":
        raise TypeError(f"{owner}: {name} must be numeric, got dtype {arr.dtype}.")
    return arr


def _check_labels_value(value: Any, num_points: int, owner: str, name: str = "labels") -> None:
    """Concrete labels: integers (or integer-valued floats) in ``0..num_points-1``, last axis ``num_points``."""
    arr = _concrete_array(value, owner, name)
    if arr is None:
        return
    if arr.ndim == 0 or arr.shape[-1] != num_points:
        raise ValueError(f"{owner}: {name} must have shape (..., {num_points}), got {arr.shape}.")
    if arr.dtype.kind == "b":
        raise TypeError(f"{owner}: {name} must be integer cluster ids, got booleans.")
    if arr.dtype.kind == "f" and not (np.all(np.isfinite(arr)) and np.all(np.round(arr) == arr)):
        raise ValueError(f"{owner}: {name} must be integer cluster ids, got non-integer values.")
    if arr.size and (arr.min() < 0 or arr.max() > num_points - 1):
        raise ValueError(
            f"{owner}: {name} must lie in 0..{num_points - 1} (one id per point), "
            f"got values from {arr.min()} to {arr.max()}."
        )


class Partition(dist.Distribution):
    """Random partition of ``num_points`` items from a random measure (docs/mathematics.md §1).

    :param measure: ``DP``, ``PitmanYor`` or ``NGGP``.
    :param num_points: number of items ``n``.
    :param u: NGGP auxiliary variable; when given, ``log_prob`` is ``log p(Π, u)``.
    """

    arg_constraints: dict = {}
    is_discrete = True
    pytree_data_fields = ("measure", "u")
    pytree_aux_fields = ("num_points",)

    def __init__(self, measure: Measure, num_points: int, u: Any = None, *, validate_args=None):
        if not isinstance(measure, Measure):
            raise ValueError(
                f"Partition: measure must be bnp.DP, bnp.PitmanYor or bnp.NGGP, got {measure!r}."
            )
        if isinstance(num_points, (bool, np.bool_)) or not isinstance(num_points, (int, np.integer)):
            raise TypeError(f"Partition: num_points must be an integer, got {num_points!r}.")
        num_points = int(num_points)
        if num_points < 1:
            raise ValueError(f"Partition: num_points must be >= 1, got {num_points}.")
        if u is not None and not measure.has_auxiliary:
            raise ValueError(f"Partition: u is only used with NGGP, not {type(measure).__name__}.")
        if u is not None:
            uc = _concrete_array(u, "Partition", "u")
            if uc is not None and not (uc.dtype.kind in "iuf" and np.all(np.isfinite(uc)) and np.all(uc > 0)):
                raise ValueError(f"Partition: u must be finite and > 0 (the NGGP auxiliary variable), got {u!r}.")
        self.measure = measure
        self.num_points = num_points
        self.u = u
        super().__init__(batch_shape=(), event_shape=(num_points,), validate_args=validate_args)

    @constraints.dependent_property(is_discrete=True, event_dim=1)
    def support(self):
        return constraints.independent(
            constraints.integer_interval(0, self.num_points - 1), 1
        )

    def counts(self, labels: jax.Array) -> jax.Array:
        """Cluster sizes ``(num_points,)`` of a label vector (zeros for unused ids)."""
        labels = jnp.asarray(labels).astype(jnp.int32)
        return jax.ops.segment_sum(
            jnp.ones(labels.shape, jnp.int32), labels, num_segments=self.num_points
        )

    def log_prob(self, value):
        _check_labels_value(value, self.num_points, "Partition.log_prob", "value (labels)")
        value = jnp.asarray(value)
        if value.ndim > 1:
            return jax.vmap(self.log_prob)(value.reshape((-1, self.num_points))).reshape(
                value.shape[:-1]
            )
        return self.measure.log_eppf(self.counts(value), self.u)

    def sample(self, key, sample_shape=()):
        num = math.prod(sample_shape) if sample_shape else 1
        keys = jax.random.split(key, num)
        draws = jax.vmap(lambda k: self.measure.sample_partition(k, self.num_points))(keys)
        return draws.reshape(tuple(sample_shape) + (self.num_points,))

    def enumerate_support(self, expand=True):
        raise NotImplementedError("Partitions are not enumerated; use a jaxbnp kernel.")


def _family_dim(family: Family) -> int | None:
    if isinstance(family, NormalWishart):
        return int(family.psi.shape[-1])
    if isinstance(family, NormalGamma):
        for p in (family.m0, family.b0):
            if jnp.ndim(p) == 1:
                return int(jnp.shape(p)[0])
    if isinstance(family, DirichletMultinomial) and jnp.ndim(family.beta) == 1:
        return int(jnp.shape(family.beta)[0])
    if isinstance(family, BetaBernoulli):
        for p in (family.a, family.b):
            if jnp.ndim(p) == 1:
                return int(jnp.shape(p)[0])
    return None


class ConjugateMixture(dist.Distribution):
    """Observations given a partition, cluster parameters integrated out (docs/mathematics.md §2).

    :param family: a conjugate family (``NormalGamma``, ``NormalWishart``,
        ``DirichletMultinomial``, ``BetaBernoulli``).
    :param labels: ``(n,)`` integer labels (the ``Partition`` site's value).
    :param dim: number of features, needed only to ``sample`` when the family's
        parameters are scalars.
    """

    arg_constraints: dict = {}
    pytree_data_fields = ("family", "labels")
    pytree_aux_fields = ("dim",)

    def __init__(self, family: Family, labels: Any, dim: int | None = None, *, validate_args=None):
        if not isinstance(family, Family):
            raise ValueError(
                "ConjugateMixture: family must be bnp.NormalGamma, bnp.NormalWishart, "
                f"bnp.DirichletMultinomial or bnp.BetaBernoulli, got {family!r}."
            )
        if np.ndim(labels) == 1:
            _check_labels_value(labels, np.shape(labels)[0], "ConjugateMixture", "labels")
        elif labels is None or isinstance(labels, str):
            raise TypeError(f"ConjugateMixture: labels must be a 1-D integer array, got {labels!r}.")
        labels = jnp.asarray(labels)
        if labels.ndim != 1:
            raise ValueError(f"ConjugateMixture: labels must be 1-D, got shape {labels.shape}.")
        self.family = family
        self.labels = labels
        self.dim = dim if dim is not None else _family_dim(family)
        event = (labels.shape[0],) + ((self.dim,) if self.dim is not None else (1,))
        super().__init__(batch_shape=(), event_shape=event, validate_args=validate_args)

    @constraints.dependent_property(is_discrete=False, event_dim=2)
    def support(self):
        return constraints.independent(constraints.real, 2)

    def cluster_log_marginals(self, X):
        """``log P(X_c)`` per label id ``0..n-1`` (zero for unused ids)."""
        n = self.labels.shape[0]
        stats = self.family.stats_from_labels(X, self.labels.astype(jnp.int32), n)
        return jnp.where(stats.n > 0, self.family.log_marginal(stats), 0.0)

    def log_prob(self, value):
        arr = _concrete_array(value, "ConjugateMixture.log_prob", "value (X)")
        if arr is not None:
            n = self.labels.shape[0]
            if arr.ndim != 2 or arr.shape[0] != n:
                raise ValueError(
                    f"ConjugateMixture.log_prob: value (X) must have shape ({n}, D), one row per "
                    f"label, got {arr.shape}."
                )
            check_data(arr, name="ConjugateMixture.log_prob: value (X)", family=self.family)
        return jnp.sum(self.cluster_log_marginals(jnp.asarray(value)))

    def sample(self, key, sample_shape=()):
        """Draw data from the prior predictive given the labels (not for DirichletMultinomial)."""
        if sample_shape:
            keys = jax.random.split(key, math.prod(sample_shape))
            out = jax.vmap(lambda k: self.sample(k))(keys)
            return out.reshape(tuple(sample_shape) + self.event_shape)
        if self.dim is None:
            raise ValueError(
                "ConjugateMixture.sample needs the number of features: pass dim=D or give "
                "the family vector-valued parameters."
            )
        n, d = self.labels.shape[0], self.dim
        fam = self.family
        k1, k2, k3 = jax.random.split(key, 3)
        labels = self.labels.astype(jnp.int32)
        if isinstance(fam, NormalGamma):
            lam = dist.Gamma(jnp.broadcast_to(fam.a0, (n, d)), jnp.broadcast_to(fam.b0, (n, d))).sample(k1)
            mu = jnp.broadcast_to(fam.m0, (n, d)) + jax.random.normal(k2, (n, d)) / jnp.sqrt(fam.k0 * lam)
            return mu[labels] + jax.random.normal(k3, (n, d)) / jnp.sqrt(lam[labels])
        if isinstance(fam, NormalWishart):
            # one (μ, Λ) per slot from the prior (the family's own Bartlett draw), then
            # x = μ + L⁻ᵀ z with Λ = L Lᵀ, so Cov(x | μ, Λ) = Λ⁻¹: triangular solves only, no
            # LAPACK call (two in one program can deadlock XLA's CPU pool, jaxbnp._math)
            dtype = jnp.result_type(jnp.asarray(fam.psi).dtype, float)
            comp = fam.sample_params(k1, fam.empty_stats(n, d, dtype))
            chol = _math.cholesky(comp.precision[labels])
            z = jax.random.normal(k3, (n, d, 1), dtype)
            return comp.mean[labels] + _math.solve_triangular(jnp.swapaxes(chol, -1, -2), z,
                                                              lower=False)[..., 0]
        if isinstance(fam, BetaBernoulli):
            p = dist.Beta(jnp.broadcast_to(fam.a, (n, d)), jnp.broadcast_to(fam.b, (n, d))).sample(k1)
            return jax.random.bernoulli(k2, p[labels]).astype(jnp.result_type(float))
        raise NotImplementedError(
            f"ConjugateMixture.sample is not available for {type(fam).__name__} "
            "(document lengths are not modelled)."
        )


class AuxiliaryU(dist.ImproperUniform):
    """Improper flat density on ``u > 0`` for the NGGP auxiliary variable.

    Declare it as ``u = numpyro.sample("u", bnp.AuxiliaryU())`` and pass it to
    ``bnp.Partition(bnp.NGGP(...), n, u=u)``: the partition's ``log_prob`` is
    the joint ``log p(Π, u)`` of docs/mathematics.md §1, so the model's density in
    ``(Π, u)`` is exact. ``CollapsedGibbs`` updates ``u`` by slice sampling.
    """

    def __init__(self, *, validate_args=None):
        super().__init__(constraints.positive, (), (), validate_args=validate_args)

    def log_prob(self, value):
        arr = _concrete_array(value, "AuxiliaryU.log_prob", "u")
        if arr is not None and not (np.all(np.isfinite(arr)) and np.all(arr > 0)):
            raise ValueError(f"AuxiliaryU.log_prob: u must be finite and > 0, got {value!r}.")
        return super().log_prob(value)


def log_joint(X, labels, measure: Measure, family: Family, u=None) -> jax.Array:
    """``log p(X, Π[, u]) = Σ_c log P(X_c) + log p(Π[, u])`` (docs/mathematics.md §2, "log joint")."""
    X = jnp.asarray(X)
    labels = jnp.asarray(labels)
    return ConjugateMixture(family, labels).log_prob(X) + Partition(
        measure, labels.shape[0], u=u
    ).log_prob(labels)


def mixture_model(X, measure: Measure, family: Family) -> None:
    """The BNP mixture as a NumPyro model (docs/mathematics.md §2): an ``AuxiliaryU`` site
    ``u`` when the measure has one (NGGP), ``z ~ Partition(measure, n, u=u)`` and the
    observed ``X ~ ConjugateMixture(family, z)``.

    The model that :class:`~jaxbnp.estimators.DirichletProcessMixture` and ``jaxbnp
    cluster`` sample, with ``(X, measure, family)`` as its arguments.
    """
    u = numpyro.sample("u", AuxiliaryU()) if measure.has_auxiliary else None
    z = numpyro.sample("z", Partition(measure, X.shape[0], u=u))
    numpyro.sample("X", ConjugateMixture(family, z), obs=X)
