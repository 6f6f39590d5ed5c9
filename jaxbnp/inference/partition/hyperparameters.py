"""Hyperparameter updates of the partition samplers and of MAP-DP.

The measure's, inside a partition kernel (``update_hyperparameters=True``; docs/mathematics.md §1):

* :func:`escobar_west_alpha`: DP ``alpha`` under a Gamma prior (Escobar & West, 1995);
* :func:`nggp_alpha_update`: NGGP ``alpha``, conjugate given ``u``;
* :func:`nggp_sigma_update`: NGGP ``sigma`` by slice sampling on the logit;
* :func:`measure_updates`: those that apply to a measure, given the priors: the new
  measure and the new values (no argument is changed).

The family's, for a fixed partition:

* :func:`family_type2_ml`: the family's hyperparameters by type-II maximum likelihood:
  maximise ``Σ_c log P(X_c)`` for the given labels with optax (Adam) in the family's
  unconstrained coordinates (``Family.unconstrained`` / ``Family.constrained``). MAP-DP's concentration is chosen by :func:`jaxbnp.estimators.select_alpha`
  (``method="nll"`` or ``"heldout"``: it refits MAP-DP for each alpha).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ...models.measures import NGGP
from ..slice import slice_sample

__all__ = ["escobar_west_alpha", "nggp_alpha_update", "nggp_sigma_update", "measure_updates",
           "family_type2_ml"]


def escobar_west_alpha(
    key: jax.Array, alpha: jax.Array, num_clusters: jax.Array, num_points: int,
    shape: float, rate: float,
) -> jax.Array:
    """Escobar & West (1995) update of DP ``alpha`` under a ``Gamma(shape, rate)`` prior.

    ``η ~ Beta(α+1, n)``; with odds ``(a+K−1)/(n(b−log η))`` draw
    ``α ~ Gamma(a+K, b−log η)``, else ``α ~ Gamma(a+K−1, b−log η)``.
    """
    k_eta, k_mix, k_gamma = jax.random.split(key, 3)
    eta = jax.random.beta(k_eta, alpha + 1.0, jnp.asarray(num_points, alpha.dtype))
    eta = jnp.maximum(eta, jnp.finfo(alpha.dtype).tiny)
    post_rate = rate - jnp.log(eta)
    odds = (shape + num_clusters - 1.0) / (num_points * post_rate)
    use_k = jax.random.uniform(k_mix) < odds / (1.0 + odds)
    post_shape = shape + num_clusters - jnp.where(use_k, 0.0, 1.0)
    return jax.random.gamma(k_gamma, post_shape, dtype=alpha.dtype) / post_rate


def nggp_alpha_update(
    key: jax.Array, measure: NGGP, u: jax.Array, num_clusters: jax.Array,
    shape: float, rate: float,
) -> jax.Array:
    """Conjugate NGGP ``alpha | Π, u, σ ~ Gamma(a + K, b + (u+τ)^σ − τ^σ)`` (docs/mathematics.md §1)."""
    post_rate = rate + (u + measure.tau) ** measure.sigma - measure.tau**measure.sigma
    return jax.random.gamma(key, shape + num_clusters, dtype=u.dtype) / post_rate


def nggp_sigma_update(
    key: jax.Array, measure: NGGP, u: jax.Array, counts: jax.Array,
    beta_a: float, beta_b: float,
) -> jax.Array:
    """Slice update of NGGP ``sigma`` on the logit scale under a ``Beta(a, b)`` prior."""

    def log_density(t):
        sigma = jax.nn.sigmoid(t)
        m = measure.replace(sigma=sigma)
        log_prior = (beta_a - 1.0) * jnp.log(sigma) + (beta_b - 1.0) * jnp.log1p(-sigma)
        log_jac = jnp.log(sigma) + jnp.log1p(-sigma)
        return log_prior + log_jac + m.log_eppf(counts, u)

    t0 = jnp.log(measure.sigma) - jnp.log1p(-measure.sigma)
    return jax.nn.sigmoid(slice_sample(key, log_density, t0))


def measure_updates(measure, u, counts, num_clusters, num_points: int, alpha_prior, sigma_prior,
                    k_alpha, k_sigma):
    """One iteration's updates of the measure's hyperparameters: ``alpha`` when
    ``alpha_prior`` (a ``Gamma``) is given, by :func:`nggp_alpha_update` for an NGGP and
    :func:`escobar_west_alpha` otherwise, with ``k_alpha``; then NGGP ``sigma`` when
    ``sigma_prior`` (a ``Beta``) is given, by :func:`nggp_sigma_update` with ``k_sigma``.

    Returns ``(measure, values)``: the updated measure and a dict of the new values
    (``"alpha"``, ``"sigma"``) for the priors given."""
    values = {}
    if alpha_prior is not None:
        if isinstance(measure, NGGP):
            alpha = nggp_alpha_update(k_alpha, measure, u, num_clusters, alpha_prior.concentration,
                                      alpha_prior.rate)
        else:
            alpha = escobar_west_alpha(k_alpha, measure.alpha, num_clusters, num_points,
                                       alpha_prior.concentration, alpha_prior.rate)
        measure = measure.replace(alpha=alpha)
        values["alpha"] = alpha
    if sigma_prior is not None:
        sigma = nggp_sigma_update(k_sigma, measure, u, counts, sigma_prior.concentration1,
                                  sigma_prior.concentration0)
        measure = measure.replace(sigma=sigma)
        values["sigma"] = sigma
    return measure, values


# ----------------------------------------------------------------------------- family (type-II ML)
def family_type2_ml(X, labels, family, steps: int = 300, learning_rate: float = 0.05):
    """Maximise ``Σ_c log P(X_c)`` over the family's hyperparameters for fixed ``labels``.

    Returns ``(family, history)`` with ``history`` the objective (log marginal
    likelihood) at each step. Uses ``optax.adam`` on unconstrained parameters
    (logs of positive parameters, a Cholesky factor for ``psi``): needs the
    ``optax`` extra (``pip install "jaxbnp[optax]"``).
    """
    try:
        import optax
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError('family_type2_ml needs optax: pip install "jaxbnp[optax]".') from exc
    X = jnp.asarray(X)
    labels = jnp.asarray(np.asarray(labels), jnp.int32)
    capacity = int(labels.max()) + 1
    stats = family.stats_from_labels(X, labels, capacity)
    params = family.unconstrained()

    def loss(p):
        return -jnp.sum(family.constrained(p).log_marginal(stats))

    opt = optax.adam(learning_rate)

    @jax.jit
    def run(params):
        def step(carry, _):
            p, s = carry
            value, grads = jax.value_and_grad(loss)(p)
            updates, s = opt.update(grads, s, p)
            return (optax.apply_updates(p, updates), s), -value

        (p, _), hist = jax.lax.scan(step, (params, opt.init(params)), None, length=steps)
        return p, hist

    params, history = run(params)
    return family.constrained(params), np.asarray(history)
