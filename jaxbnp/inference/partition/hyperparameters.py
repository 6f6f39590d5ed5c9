"""Hyperparameter selection for MAP-DP (and any fixed partition).

* ``family_type2_ml(X, labels, family)``: the family's hyperparameters by
  type-II maximum likelihood: maximise ``Σ_c log P(X_c)`` for the given
  labels with optax (Adam) on unconstrained parameters.
* the DP concentration of MAP-DP is chosen by ``jaxbnp.estimators.select_alpha``
  (``method="nll"`` or ``"heldout"``: it refits MAP-DP for each alpha).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ...models.families import BetaBernoulli, DirichletMultinomial, NormalGamma, NormalWishart

__all__ = ["family_type2_ml"]


def _to_unconstrained(family):
    if isinstance(family, NormalGamma):
        return {"m0": family.m0, "log_k0": jnp.log(family.k0), "log_a0": jnp.log(family.a0),
                "log_b0": jnp.log(family.b0)}
    if isinstance(family, NormalWishart):
        d = family.psi.shape[-1]
        return {"m0": family.m0, "log_r": jnp.log(family.r),
                "log_nu_excess": jnp.log(family.nu - (d - 1.0)),
                "chol_psi": jnp.linalg.cholesky(family.psi)}
    if isinstance(family, BetaBernoulli):
        return {"log_a": jnp.log(family.a), "log_b": jnp.log(family.b)}
    if isinstance(family, DirichletMultinomial):
        return {"log_beta": jnp.log(family.beta)}
    raise ValueError(f"type-II ML is not implemented for {type(family).__name__}.")


def _to_family(family, p):
    if isinstance(family, NormalGamma):
        return family.replace(m0=p["m0"], k0=jnp.exp(p["log_k0"]), a0=jnp.exp(p["log_a0"]),
                              b0=jnp.exp(p["log_b0"]))
    if isinstance(family, NormalWishart):
        d = family.psi.shape[-1]
        L = jnp.tril(p["chol_psi"])
        return family.replace(m0=p["m0"], r=jnp.exp(p["log_r"]),
                              nu=(d - 1.0) + jnp.exp(p["log_nu_excess"]), psi=L @ L.T)
    if isinstance(family, BetaBernoulli):
        return family.replace(a=jnp.exp(p["log_a"]), b=jnp.exp(p["log_b"]))
    return family.replace(beta=jnp.exp(p["log_beta"]))


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
    params = _to_unconstrained(family)

    def loss(p):
        return -jnp.sum(_to_family(family, p).log_marginal(stats))

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
    return _to_family(family, params), np.asarray(history)
