"""The defaults that :class:`jaxbnp.DirichletProcessMixture` and ``jaxbnp cluster`` share.

One table, read by both, so that the estimator a user fits from Python and the command
line give the same kind of run: split-merge MCMC (the tgMCMC paper's SM baseline: five
Jain-Neal moves and a Gibbs sweep per iteration), two chains, each started from its own
k-means++ partition into ``INIT_CLUSTERS`` clusters (an over-segmentation the sampler
merges: it merges more easily than it splits; sub-cluster MCMC starts from one cluster),
with the run length of each method below.

Measured on the panel of ``benchmarks/ordinary.py`` (docs/benchmarks.md): collapsed Gibbs
from a prior draw, one chain (the estimator's earlier default) stayed with merged groups
on full-covariance clusters (NMI 0.70 against 1.00 at n = 1,000, D = 10, K = 10), where
this start and split-merge moves found them.
"""

from __future__ import annotations

import functools

import numpy as np

from ._validation import constant_columns

__all__ = ["METHOD", "NUM_CHAINS", "INIT_CLUSTERS", "ITERATIONS", "PLATE_CAPACITY", "PLATE_METHODS",
           "KERNEL_OPTIONS", "INIT",
           "KMEANS_START", "FREE_SLOTS", "capacity_for_start", "kmeans_starts", "cli_defaults",
           "standardisation", "default_family", "full_prior", "in_data_units"]

#: the default method
METHOD = "splitmerge"
#: chains per run
NUM_CHAINS = 2
#: clusters of each chain's k-means++ start
INIT_CLUSTERS = 20
#: (warm-up, kept draws) per chain of each MCMC method
ITERATIONS = {"splitmerge": (50, 100), "gibbs": (100, 200), "tgmcmc": (30, 70), "subcluster": (50, 100),
              "auxiliary": (100, 100), "slice": (100, 100)}
#: the methods for a likelihood whose cluster parameters are sampled (``likelihood=``,
#: ``--likelihood``), and their first cluster slots (at most n): Algorithm 8 needs one free
#: slot per new cluster; the slice sampler needs room for the sticks beyond the clusters
#: (docs/mathematics.md §9: about 27 beyond them for DP(1) at n = T = 1,000)
PLATE_CAPACITY = {"auxiliary": 32, "slice": 64}
PLATE_METHODS = tuple(PLATE_CAPACITY)
#: each method's kernel options that differ from the kernel's own defaults
KERNEL_OPTIONS = {"splitmerge": {"num_split_merge": 5}, "gibbs": {}, "tgmcmc": {}, "subcluster": {},
                  "auxiliary": {}, "slice": {}}
#: each method's start: k-means++ partitions, or one cluster for sub-cluster MCMC, whose split
#: proposals leave it in a few iterations while its merges rarely join the pieces of a
#: group that an over-segmented start cut (``random_state=0``, the defaults otherwise: 5
#: clusters in 50-D scored NMI 1.000 from one cluster and 0.712, K 12, from k-means++; wine
#: 0.654 and 0.485, K 45; digits is the exception, 0.398 and 0.686; docs/benchmarks.md)
INIT = {"gibbs": "kmeans++", "splitmerge": "kmeans++", "subcluster": "one"}
#: the methods that can start from k-means++ partitions
KMEANS_START = tuple(INIT)
#: free cluster slots beside a start's clusters (room to split into)
FREE_SLOTS = 12


def capacity_for_start(capacity: int, start_clusters: int, n: int) -> int:
    """The cluster capacity of a run from a start with ``start_clusters`` clusters: at least
    ``capacity``, and room for the start's clusters and :data:`FREE_SLOTS` free slots (at
    most ``n``)."""
    return max(int(capacity), min(int(start_clusters) + FREE_SLOTS, int(n)))


@functools.lru_cache(maxsize=None)
def _jitted(fn):
    import jax

    return jax.jit(fn, static_argnums=2)


def kmeans_starts(X, seed: int, num_clusters: int, num_chains: int) -> np.ndarray:
    """Each chain's start: a k-means++ partition (``mapdp.kmeanspp_labels``, standardised
    coordinates) of ``X`` into ``min(num_clusters, n)`` clusters, ``(num_chains, n)`` int32
    (``(n,)`` for one chain). The keys are ``fold_in(fold_in(key(seed), 1), chain)``: not the
    sampler's own, so the start and the chain are independent."""
    import jax
    import jax.numpy as jnp

    from .inference.partition.mapdp import kmeanspp_labels

    X = np.asarray(X)
    k = min(int(num_clusters), len(X))
    sd = X.std(axis=0)
    Xs = jnp.asarray(X / np.where(sd > 0, sd, 1.0))
    labels = _jitted(kmeanspp_labels)
    key = jax.random.fold_in(jax.random.key(int(seed)), 1)
    z = np.stack([np.asarray(labels(jax.random.fold_in(key, c), Xs, k))
                  for c in range(int(num_chains))]).astype(np.int32)
    return z if num_chains > 1 else z[0]


def cli_defaults(method: str) -> dict:
    """The command line's defaults of an MCMC method (``jaxbnp cluster``'s option names):
    chains, run length, split-merge moves and start."""
    out = dict(chains=NUM_CHAINS, warmup=ITERATIONS[method][0], samples=ITERATIONS[method][1])
    if "num_split_merge" in KERNEL_OPTIONS[method]:
        out["split_merge_moves"] = KERNEL_OPTIONS[method]["num_split_merge"]
    if method in INIT:
        out["init"] = {"kmeans++": "kmeans"}.get(INIT[method], INIT[method])
    return out


def standardisation(X) -> tuple[np.ndarray, np.ndarray]:
    """``(shift, scale)`` of the default family's coordinates ``(X − shift) / scale``: each
    column's mean and standard deviation (a constant column is only centred: scale 1).

    Why: ``NormalWishart.from_data`` fixes ``det Ψ = 0.1`` whatever the data's units, so on
    raw data its prior depends on them, and features on scales from 1e-3 to 1e3 (or offsets
    like wine's 1e3) leave float32 sums of ``x xᵀ`` unable to resolve ``Ψ``; in standardised
    coordinates neither happens (docs/benchmarks.md, "Data nobody here designed")."""
    X = np.asarray(X, np.float64)
    shift = X.mean(axis=0)
    scale = X.std(axis=0)
    constant = constant_columns(shift, scale)
    if len(X):  # a constant column becomes exactly 0
        shift = np.where(constant, X[0], shift)
    return shift, np.where(constant, 1.0, scale)


def full_prior(Z):
    """The full-covariance prior of :func:`default_family` (and of ``jaxbnp cluster --family
    normal-wishart``, whatever ``n``) on standardised ``Z``:
    ``NormalWishart.from_data(Z, r=1/n, shrinkage="ledoit-wolf")``, the tgMCMC paper's
    ``ν = D + 6`` and ``Ψ`` (the Ledoit-Wolf covariance scaled to ``det Ψ = 0.1``; positive
    definite where columns are constant or collinear) with a vague prior on the means,
    ``r = 1/n`` (MAP-DP's empirical ``k0``, as in ``MAPDP()``'s prior) instead of ``0.1``.

    Why ``r = 1/n``: a cluster's mean ``μ ~ N(m0, Σ/r)``, and each cluster pays about
    ``(D/2) log(r_n / r)`` for its mean (docs/mathematics.md §2). With ``r = 0.1`` a cluster
    is cheap in many dimensions and the samplers cut real groups into many small clusters
    (split-merge on wine, 178 x 13: K 31 of 3; breast cancer K 22 of 2; Student-t noise K 19
    of 6); with ``r = 1/n`` they find K 9, 10 and 8 and the same partitions on the sets with
    well separated clusters (``benchmarks/results/default_prior_r.md``)."""
    from .models import NormalWishart

    return NormalWishart.from_data(Z, r=1.0 / len(Z), shrinkage="ledoit-wolf")


def default_family(Z):
    """The default family of :class:`jaxbnp.DirichletProcessMixture` and ``jaxbnp cluster``
    on standardised data ``Z`` (:func:`standardisation`), chosen by ``MAPDP()``'s rule
    (``jaxbnp.inference.partition.mapdp.default_covariance``):

    - ``n >= D (D + 1) / 2`` points (at least as many as a covariance has free entries):
      :func:`full_prior`, the tgMCMC paper's Normal-Wishart prior with the Ledoit-Wolf
      covariance and ``r = 1/n``;
    - fewer (``n < D (D + 1) / 2``): ``MAPDP()``'s diagonal prior,
      ``mapdp.default_prior(Z, covariance="diag")`` (a ``NormalGamma``: per column ``m0``
      the mean, ``k0 = 1/n``, and precisions whose mean is the inverse of the within-group
      variance of a k-means clustering, worth ``D + 1`` points). No cluster's covariance
      is then identified by its own points, and on the panel of ``benchmarks/ordinary.py``
      the full prior's collapsed Gibbs fit of 1,000 x 50 points did not finish in 10
      minutes, where the diagonal one found the 5 clusters (NMI 1.000;
      ``benchmarks/results/diag_prior.md``). Where the full prior has the points it does
      better (breast cancer, 569 x 30: NMI 0.436 full, 0.308 diagonal). The diagonal prior
      before, ``NormalGamma.from_data(Z)`` (``b0`` the whole variance: every cluster a
      priori as wide as the data, worth 4 points), scored NMI 0.681-0.688 on digits with
      split-merge against 0.690-0.729 now, and under it sub-cluster MCMC found partitions
      with one cluster of up to 1,031 of the 1,797 digits, of higher posterior than
      split-merge's (NMI 0.418-0.618, now 0.560-0.679; three seeds,
      ``benchmarks/results/diag_prior_digits.md``)."""
    from .inference.partition.mapdp import default_covariance, default_prior

    if default_covariance(*np.shape(Z)) == "diag":
        return default_prior(Z, covariance="diag")
    return full_prior(Z)


def in_data_units(family, shift, scale):
    """The default ``family`` (:func:`default_family`) of standardised coordinates written in
    the data's own units; a model on ``Z = (X − shift) / scale`` is this model on ``X``: the
    same partition posterior, densities divided by ``∏ scale``.

    - ``NormalWishart``: ``m0 → shift + scale ⊙ m0``, ``Ψ → diag(scale) Ψ diag(scale)``
      (``r``, ``ν`` kept);
    - ``NormalGamma``: ``m0 → shift + scale ⊙ m0``, ``b0 → scale² ⊙ b0`` (``k0``, ``a0``
      kept): a precision ``λ`` of ``z_d`` is ``λ / scale_d²`` of ``x_d``, and
      ``Gamma(a0, rate b0)`` scaled by ``1 / scale_d²`` is ``Gamma(a0, rate b0 scale_d²)``."""
    from .models import NormalGamma, NormalWishart

    m0 = shift + scale * np.asarray(family.m0, np.float64)
    if isinstance(family, NormalGamma):
        b0 = np.broadcast_to(np.asarray(family.b0, np.float64), scale.shape)
        return NormalGamma(m0=m0, k0=family.k0, a0=family.a0, b0=scale * scale * b0)
    if not isinstance(family, NormalWishart):
        raise TypeError(f"in_data_units: a NormalWishart or NormalGamma, not {type(family).__name__}.")
    psi = np.asarray(family.psi, np.float64)
    psi = scale[:, None] * psi * scale[None, :]
    return NormalWishart(m0=m0, r=family.r, nu=family.nu, psi=0.5 * (psi + psi.T))
