"""Built-in non-conjugate cluster likelihoods, written as NumPyro plate models
(docs/mathematics.md §8).

Each name is a model of the form that :class:`jaxbnp.AuxiliaryGibbs` and
:class:`jaxbnp.SliceGibbs` read: the partition site ``z``, the cluster parameters in one
``numpyro.plate("clusters", num_slots)`` and the likelihood site ``X``. The prior's
hyperparameters are arguments of the model (``model(X, measure, prior)``), not constants in
it, so that one compiled program serves every data set of a shape:

- ``"normal"``: diagonal Gaussian clusters, ``loc ~ Normal(prior["loc"], 1)``,
  ``scale ~ LogNormal(log 0.3, 1)`` per column (neither conjugate to the other: the means
  and scales are sampled, not integrated out). Meant for standardised columns, as
  :class:`jaxbnp.DirichletProcessMixture` gives it.
- ``"student-t"``: the same with Student-t clusters of 3 degrees of freedom (heavy tails).
- ``"poisson"``: counts, ``rate ~ LogNormal(m_j, s_j)`` per column, ``m_j`` and ``s_j`` the
  mean and standard deviation of ``log(x + 1/2)`` over the column (at least 0.5): the prior
  spans the data's own range of rates.

:func:`default_prior` gives the prior of a data set, :func:`plate_mixture` the model.
"""

from __future__ import annotations

import functools

import numpy as np
import numpyro
import numpyro.distributions as dist

from .distributions import Partition

__all__ = ["LIKELIHOODS", "STANDARDISED", "plate_mixture", "default_prior", "check_likelihood_data"]

#: the built-in likelihoods
LIKELIHOODS = ("normal", "student-t", "poisson")
#: those fitted in standardised coordinates (the estimator standardises the columns)
STANDARDISED = ("normal", "student-t")
#: the Student-t clusters' degrees of freedom
STUDENT_DF = 3.0
#: the prior median and log-sd of a cluster's scale in standardised coordinates
SCALE_MEDIAN, SCALE_LOG_SD = 0.3, 1.0


def check_likelihood_data(likelihood: str, X) -> None:
    """``ValueError`` for data the likelihood cannot score (counts must be integers >= 0)."""
    if likelihood not in LIKELIHOODS:
        raise ValueError(f"likelihood must be one of {LIKELIHOODS} or a NumPyro model, got {likelihood!r}.")
    if likelihood == "poisson":
        X = np.asarray(X)
        if np.any(X < 0) or np.any(X != np.round(X)):
            raise ValueError("likelihood='poisson' needs counts: integers >= 0 in every column.")


def default_prior(likelihood: str, X) -> dict:
    """The prior's hyperparameters of :func:`plate_mixture`'s model for data ``X`` ``(n, D)``
    (module docstring), float64 NumPy arrays ``(D,)``."""
    X = np.asarray(X, np.float64)
    D = X.shape[1]
    if likelihood == "poisson":
        logs = np.log(X + 0.5)
        return {"log_rate": logs.mean(axis=0), "log_rate_sd": np.maximum(logs.std(axis=0), 0.5)}
    return {"loc": np.zeros(D), "loc_sd": np.ones(D),
            "log_scale": np.full(D, np.log(SCALE_MEDIAN)), "log_scale_sd": np.full(D, SCALE_LOG_SD)}


@functools.lru_cache(maxsize=None)
def plate_mixture(likelihood: str, num_slots: int):
    """The model ``model(X, measure, prior)`` of a built-in likelihood with ``num_slots``
    cluster slots (module docstring); the same function object for the same arguments, so
    that compiled programs are reused."""
    if likelihood not in LIKELIHOODS:
        raise ValueError(f"likelihood must be one of {LIKELIHOODS}, got {likelihood!r}.")
    num_slots = int(num_slots)

    def model(X, measure, prior):
        z = numpyro.sample("z", Partition(measure, X.shape[0]))
        if likelihood == "poisson":
            with numpyro.plate("clusters", num_slots):
                rate = numpyro.sample("rate", dist.LogNormal(prior["log_rate"], prior["log_rate_sd"]).to_event(1))
            numpyro.sample("X", dist.Poisson(rate[z]).to_event(1), obs=X)
            return
        with numpyro.plate("clusters", num_slots):
            loc = numpyro.sample("loc", dist.Normal(prior["loc"], prior["loc_sd"]).to_event(1))
            scale = numpyro.sample("scale", dist.LogNormal(prior["log_scale"], prior["log_scale_sd"]).to_event(1))
        if likelihood == "normal":
            numpyro.sample("X", dist.Normal(loc[z], scale[z]).to_event(1), obs=X)
        else:
            numpyro.sample("X", dist.StudentT(STUDENT_DF, loc[z], scale[z]).to_event(1), obs=X)

    model.__name__ = model.__qualname__ = f"{likelihood.replace('-', '_')}_mixture_{num_slots}"
    return model

