"""MCMC diagnostics of partition samplers: ESS and split R-hat of ``K`` and the log joint.

Label draws cannot be compared across draws coordinate-wise (labels switch),
so convergence is judged on scalar functions of the partition: the number of
clusters ``K`` and the log joint ``log p(X, Π)`` (the kernels' extra fields
``num_clusters`` and ``log_joint``). The estimators are NumPyro's
(``numpyro.diagnostics.effective_sample_size`` and ``split_gelman_rubin``,
the rank-free versions of Gelman et al. BDA3 §11.4-11.5).

Every function takes a *source* of draws:

* a NumPyro ``MCMC`` after ``run(..., extra_fields=("log_joint", "num_clusters"))``
  (``K`` is counted from the label draws when ``num_clusters`` was not collected);
* a fitted :class:`jaxbnp.estimators.DirichletProcessMixture`;
* a :class:`jaxbnp.checkpoint.CheckpointedRun`;
* a dict of arrays grouped by chain: ``{"num_clusters": (C, S), "log_joint": (C, S),
  "labels": (C, S, n)}`` (any subset).

Example
-------
>>> import numpy as np
>>> from jaxbnp import diagnostics
>>> rng = np.random.default_rng(0)
>>> draws = {"num_clusters": rng.integers(2, 5, (2, 100)), "log_joint": rng.normal(size=(2, 100))}
>>> sorted(diagnostics.summary(draws))
['log_joint', 'num_chains', 'num_clusters', 'num_draws']
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

__all__ = ["effective_sample_size", "split_rhat", "summary", "to_arviz", "draws_by_chain"]

_EXTRA_FIELDS_HINT = (
    "collect them with mcmc.run(key, X, extra_fields=('log_joint', 'num_clusters'))"
)


# ----------------------------------------------------------------------------- draws
def _labels_site(source, samples: dict) -> str | None:
    spec = getattr(getattr(source, "sampler", None), "spec", None)
    name = getattr(spec, "partition_site", None) or getattr(source, "partition_site", None)
    if name in samples:
        return name
    integer_sites = [
        k for k, v in samples.items()
        if np.ndim(v) == 3 and np.issubdtype(np.asarray(v).dtype, np.integer)
    ]
    return integer_sites[0] if len(integer_sites) == 1 else ("z" if "z" in samples else None)


def draws_by_chain(source: Any) -> dict:
    """The draws of a source as NumPy arrays grouped by chain.

    Returns a dict with ``labels`` (``(C, S, n)`` or ``None``), ``labels_site``
    (its site name), ``num_clusters`` (``(C, S)`` or ``None``), ``log_joint``
    (``(C, S)`` or ``None``), ``sites`` (every sample site, ``(C, S, ...)``)
    and ``extra_fields`` (every collected extra field, ``(C, S, ...)``).
    """
    sites: dict = {}
    extra: dict = {}
    if isinstance(source, dict):
        known = {"labels", "z", "num_clusters", "log_joint"}
        labels = source.get("labels", source.get("z"))
        sites = {"z": labels} if labels is not None else {}
        sites.update({k: v for k, v in source.items() if k not in known})
        extra = {k: source[k] for k in ("num_clusters", "log_joint") if source.get(k) is not None}
        site = "z" if "z" in sites else None
    elif hasattr(source, "posterior_samples_"):  # a fitted DirichletProcessMixture
        post = source.posterior_samples_
        sites = {"z": post["labels"], **{k: v for k, v in post.items()
                                         if k not in ("labels", "num_clusters", "log_joint")}}
        extra = {k: post[k] for k in ("num_clusters", "log_joint") if k in post}
        site = "z"
    elif hasattr(source, "get_samples") and hasattr(source, "get_extra_fields"):
        try:
            got = source.get_samples(group_by_chain=True)
        except AssertionError as exc:  # NumPyro's "`run` must be called before `get_samples`."
            raise ValueError("The MCMC object has no draws yet; call mcmc.run(...) first.") from exc
        sites = dict(got) if isinstance(got, dict) else {"z": got}
        extra = dict(source.get_extra_fields(group_by_chain=True))
        site = _labels_site(source, sites)
    elif hasattr(source, "labels_") and not hasattr(source, "posterior_samples_"):
        raise ValueError(
            f"{type(source).__name__} has a single partition, not posterior draws; "
            "diagnostics need a sampler's draws."
        )
    else:
        raise ValueError(
            "Pass a NumPyro MCMC object, a fitted DirichletProcessMixture, a CheckpointedRun "
            f"or a dict of arrays grouped by chain; got {type(source).__name__}."
        )
    sites = {k: np.asarray(v) for k, v in sites.items()}
    extra = {k: np.asarray(v) for k, v in extra.items()}
    labels = sites.get(site) if site is not None else None
    num_clusters = extra.get("num_clusters")
    if num_clusters is None and labels is not None:
        from .metrics import count_clusters

        num_clusters = count_clusters(labels)
    out = {
        "labels": labels,
        "labels_site": site,
        "num_clusters": None if num_clusters is None else np.asarray(num_clusters),
        "log_joint": extra.get("log_joint"),
        "sites": sites,
        "extra_fields": extra,
    }
    for key in ("num_clusters", "log_joint"):
        value = out[key]
        if value is not None and value.ndim == 1:  # one chain given flat
            out[key] = value[None]
    return out


# ----------------------------------------------------------------------------- estimators
def _chains(x: Any, name: str, min_draws: int) -> np.ndarray:
    arr = np.asarray(x, dtype=float)
    if arr.ndim == 1:
        arr = arr[None]
    if arr.ndim < 2:
        raise ValueError(f"{name} must have shape (num_chains, num_draws[, ...]), got {arr.shape}.")
    if arr.shape[1] < min_draws:
        raise ValueError(f"{name} needs at least {min_draws} draws per chain, got {arr.shape[1]}.")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} contains NaN or inf; diagnostics need finite draws.")
    return arr


def effective_sample_size(x: Any) -> float | np.ndarray:
    """Effective sample size of draws ``x`` of shape ``(num_chains, num_draws[, ...])``
    (or ``(num_draws,)`` for one chain), pooled over chains.

    A quantity constant over every draw has ESS equal to the number of draws
    (its posterior mean is known exactly). Uses
    ``numpyro.diagnostics.effective_sample_size``.
    """
    from numpyro.diagnostics import effective_sample_size as ess

    arr = _chains(x, "x", 2)
    constant = np.ptp(arr.reshape(-1, *arr.shape[2:]), axis=0) == 0
    with np.errstate(divide="ignore", invalid="ignore"):
        value = np.asarray(ess(arr), dtype=float)
    value = np.where(constant, float(arr.shape[0] * arr.shape[1]), value)
    return float(value) if value.ndim == 0 else value


def split_rhat(x: Any) -> float | np.ndarray:
    """Split R-hat of draws ``x`` of shape ``(num_chains, num_draws[, ...])`` (at least 4 draws).

    Each chain is split in half and the halves compared (Gelman et al.,
    BDA3 §11.4); values near 1 (say below 1.01-1.05) suggest the chains
    agree. A quantity constant over every draw gives 1.0; chains constant at
    different values give ``inf``. Uses ``numpyro.diagnostics.split_gelman_rubin``.
    """
    from numpyro.diagnostics import split_gelman_rubin

    arr = _chains(x, "x", 4)
    half = arr.shape[1] // 2
    halves = np.concatenate([arr[:, :half], arr[:, -half:]], axis=0)
    flat = halves.reshape(-1, *arr.shape[2:])
    constant = np.ptp(flat, axis=0) == 0
    with np.errstate(divide="ignore", invalid="ignore"):
        value = np.asarray(split_gelman_rubin(arr), dtype=float)
    within_zero = np.all(np.ptp(halves, axis=1) == 0, axis=0)
    value = np.where(within_zero & ~constant, np.inf, value)
    value = np.where(constant, 1.0, value)
    return float(value) if value.ndim == 0 else value


def _describe(x: np.ndarray) -> dict:
    out = {"mean": float(x.mean()), "sd": float(x.std())}
    out["ess"] = effective_sample_size(x) if x.shape[1] >= 2 else float("nan")
    out["r_hat"] = split_rhat(x) if x.shape[1] >= 4 else float("nan")
    return out


def summary(source: Any, level: float = 0.95) -> dict:
    """Convergence summary of ``K`` and the log joint.

    Returns ``{"num_chains", "num_draws", "num_clusters": {...}, "log_joint": {...}}``
    where each inner dict has ``mean``, ``sd``, ``ess`` and ``r_hat`` (NaN
    when there are too few draws: ESS needs 2 per chain, R-hat 4), and
    ``num_clusters`` also the :func:`jaxbnp.metrics.num_clusters_summary`
    entries (``hpd``, ``frequencies``, ...). ``log_joint`` is left out when
    the source has none.
    """
    from .metrics import num_clusters_summary

    draws = draws_by_chain(source)
    k, lj = draws["num_clusters"], draws["log_joint"]
    if k is None and lj is None:
        raise ValueError(f"The source has neither label draws nor num_clusters/log_joint; {_EXTRA_FIELDS_HINT}.")
    ref = k if k is not None else lj
    out: dict = {"num_chains": int(ref.shape[0]), "num_draws": int(ref.shape[1])}
    if k is not None:
        out["num_clusters"] = {**num_clusters_summary(k, level), **_describe(np.asarray(k, float))}
    if lj is not None:
        out["log_joint"] = _describe(np.asarray(lj, float))
    return out


def _arviz():
    try:
        with warnings.catch_warnings():
            # arviz 0.2x announces its 1.0 refactor with a FutureWarning at import
            warnings.simplefilter("ignore", FutureWarning)
            import arviz
    except ImportError as exc:
        raise ImportError(
            'to_arviz needs ArviZ: pip install "jaxbnp[arviz]" (or arviz>=0.17).'
        ) from exc
    return arviz


def to_arviz(source: Any, coords: dict | None = None, dims: dict | None = None):
    """An ArviZ ``InferenceData`` of the draws, with ``chain`` and ``draw`` dimensions.

    ``posterior`` holds every sample site (the labels, with dimension
    ``point``; ``u``, ``alpha``, ... when present; a fitted ``DirichletProcessMixture`` with
    ``likelihood=``: its cluster parameters with dimension ``cluster``, the clusters of
    ``labels_``) and ``sample_stats`` the
    extra fields (``num_clusters``, ``log_joint``, move statistics).
    ``coords``/``dims`` are passed to ``arviz.from_dict``.

    >>> idata = to_arviz(mcmc)                         # doctest: +SKIP
    >>> arviz.ess(idata.sample_stats)["num_clusters"]  # doctest: +SKIP
    """
    az = _arviz()
    draws = draws_by_chain(source)
    posterior = dict(draws["sites"])
    stats = dict(draws["extra_fields"])
    if draws["num_clusters"] is not None:
        stats["num_clusters"] = draws["num_clusters"]
    if not posterior and not stats:
        raise ValueError("The source has no draws to convert.")
    all_dims = {}
    if draws["labels_site"] is not None:
        all_dims[draws["labels_site"]] = ["point"]
    for name in getattr(source, "cluster_sites_", ()):  # a plate fit's parameters, by cluster
        all_dims[name] = ["cluster"]
    all_dims.update(dims or {})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        return az.from_dict(
            posterior=posterior or None,
            sample_stats=stats or None,
            coords=coords,
            dims=all_dims,
        )
