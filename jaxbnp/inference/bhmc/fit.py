""":func:`fit_bhmc`, the one-call entry, and the per-level labels of a draw."""

from __future__ import annotations

import functools
import math
import time
import warnings
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ..._cache import auto_enable
from ..._random import typed_key
from ..._validation import check_data, check_int
from ...errors import CapacityError
from ...models.nested import (
    NestedHDP,
    check_covariance,
    nested_hdp_model,
)
from ..runner import run
from .kernel import (
    BHMCKernel,
    BHMCKernelState,
    GrowingNodes,
)
from .model import (
    BETA_RULES,
    FAST_COMPILE,
    PATH_UPDATES,
    BHMCConfig,
    BHMCState,
)
from .start import (
    ward_start,
)


def labels_at_level(paths: Any, level: int) -> np.ndarray:
    """Compact labels ``0..k−1`` of the nodes at depth ``level`` (``1..L``) of paths ``(N, L)``."""
    paths = np.asarray(paths)
    if not 1 <= int(level) <= paths.shape[-1]:
        raise ValueError(f"level must be in 1..{paths.shape[-1]}, got {level}.")
    return np.unique(paths[:, int(level) - 1], return_inverse=True)[1].reshape(-1).astype(np.int32)


class BHMCFit(NamedTuple):
    """Result of :func:`fit_bhmc` (docs/mathematics.md §6; the best sample = the highest complete-data
    log likelihood).

    paths: ``(N, L)`` node ids of the best sample. tree: ``(node_capacity,)``
    parent array of the best sample (``−1`` at the root and unused slots; use
    ``count > 0`` of ``best`` to find the nodes). labels_per_level: ``(L, N)``
    compact labels per depth. components: ``(N,)`` compact component labels.
    log_lik: ``(num_chains, num_samples)`` trace. best: the best
    :class:`BHMCState`. samples: ``{"paths": (C, S, N, L), "c": (C, S, N),
    "num_leaves", "num_components", "accept_rate", "num_regrafted": (C, S), "timing": {...}}``
    (``accept_rate``: the fraction of points whose path changed in the sweep;
    ``num_regrafted``: the subtrees the sweep's :func:`regraft` moved).
    summary_labels_per_level: ``(L, N)`` the posterior summary of every level: the
    partition minimising the expected variation of information over all chains' draws of
    that level's nodes (:func:`jaxbnp.metrics.point_estimate`); ``None`` with
    ``store_samples=False``.
    """

    paths: np.ndarray
    tree: np.ndarray
    labels_per_level: np.ndarray
    components: np.ndarray
    log_lik: np.ndarray
    best: BHMCState
    samples: dict
    hyper: NestedHDP
    summary_labels_per_level: np.ndarray | None = None

    def level_labels(self, level: int) -> np.ndarray:
        """Compact labels of the best sample's nodes at depth ``level`` (``1..L``)."""
        return labels_at_level(self.paths, level)


def fit_bhmc(
    X: Any,
    legacy_X: Any = None,
    *,
    key: jax.Array | None = None,
    depth: int = 2,
    alpha: float = 1.0,
    gamma0: float = 1.0,
    gamma: float = 1.0,
    Sigma: Any = None,
    Sigma0: Any = None,
    mu0: Any = None,
    num_samples: int = 200,
    num_warmup: int = 100,
    num_chains: int = 1,
    node_capacity: int | None = None,
    component_capacity: int | None = None,
    update_beta: bool = True,
    update_hyper: bool = False,
    paper_split: bool = False,
    path_update: str = "gibbs",
    beta_rule: str = "exact",
    regraft: bool = True,
    split_merge: int = 1,
    init: str | tuple = "ward",
    store_samples: bool = True,
    compiler_options: dict | str | None = "auto",
    heartbeat: Any = None,
    chain_method: str = "auto",
) -> BHMCFit:
    """Fit BHMC to ``X`` with ``num_chains`` chains of Algorithm 2 (docs/mathematics.md §6).

    The arguments are in the order of every ``fit_*`` function: the data first, then
    keywords, the random key among them (``key=``; ``None``: ``jax.random.key(0)``). The
    order before, ``fit_bhmc(key, X, ...)``, still runs the same fit, with a
    ``FutureWarning`` (``legacy_X`` is that call's data; never pass it otherwise).

    ``init="ward"`` (default) starts every chain from Ward's tree cut to the depth
    (:func:`ward_start`, ``k = round(sqrt(N / 2))`` components, one per leaf); ``"prior"``
    from a draw of the prior (:func:`init`); a pair ``(paths, c)`` from those root-to-leaf
    paths ``(N, depth)`` (a node is its path prefix: ids need only tell siblings apart) and
    components ``(N,)`` (integers), e.g. a previous fit's ``best.paths`` and ``best.c``.
    ``path_update``: ``"gibbs"`` (default,
    :func:`path_gibbs`) or ``"mh"`` (the paper's). ``beta_rule``: ``"exact"`` (default,
    :func:`update_beta_exact`) or ``"paper"`` (eqs. 3–4, :func:`update_beta`, not exact).
    ``regraft=True`` (default) adds the subtree moves of :func:`regraft` to every sweep (whole
    leaves and subtrees change parent) and ``split_merge=1`` (default) one component
    split-or-merge move (:func:`split_merge`); ``regraft=False, split_merge=0`` is the paper's
    sampler, which moves points only.
    Only the burn-in depends on the start; with the defaults every update is exact.

    Defaults from the data: ``mu0`` the mean of ``X``, ``Sigma0`` the diagonal
    of its variances, ``Sigma = Sigma0 / 20``. ``node_capacity=None`` (default) starts with
    64 node slots (more with Ward's start: four times its nodes) and doubles them, running
    again from the start, whenever a chain runs out, up to ``N L + L + 1`` (which cannot run out: a step
    scores every slot, so a small capacity is faster); an integer fixes it.
    ``component_capacity`` defaults to ``min(N, 64)``; running out of a fixed capacity
    raises :class:`CapacityError` naming the option. Validation
    happens before anything is compiled. The chains are :class:`BHMCKernel`'s,
    run by :func:`jaxbnp.inference.runner.run`. Same key, same draws; chain
    ``c`` draws exactly what a one-chain run would with the same ``key``
    folded the same way (:class:`BHMCKernel`'s keys). ``compiler_options``
    go to ``jax.jit``; ``"auto"`` (default) uses :data:`FAST_COMPILE` (XLA
    backend optimisation off: compiles about 4x faster, runs about 5x slower)
    when ``N · (num_warmup + num_samples) · num_chains <= 20000`` point updates,
    where compile time dominates, and XLA's defaults otherwise. ``heartbeat``: a
    ``jaxbnp._progress.Heartbeat`` ticked by ``num_chains`` per sweep after
    each compiled block of sweeps (the CLI's progress lines); it changes no draw.
    ``chain_method``: how the chains run (:func:`jaxbnp.inference.runner.run`): ``"auto"``
    (default: one chain per device where there is a device per chain, else on a CPU with
    several cores the chains cut into one group per core, each run from its own thread),
    ``"vectorized"``, ``"parallel"`` or ``"threads"``; the same draws whichever.

    ``samples["timing"]``: ``first_sweep_s`` the seconds to the end of the first
    block of ``num_first_sweeps`` sweeps (one when there are at most
    ``jaxbnp.inference.runner.PROGRESS_BLOCKS`` sweeps), compilation and
    initialisation included; ``other_sweeps_s`` the seconds of the other
    ``num_other_sweeps`` sweeps (the sampler's speed); ``num_chains``.
    """
    if legacy_X is not None:  # fit_bhmc(key, X, ...): the order before
        if key is not None:
            raise TypeError("fit_bhmc(X, *, key=...): the key was given twice (positionally, in "
                            "the old order fit_bhmc(key, X), and as key=).")
        warnings.warn("fit_bhmc(key, X, ...) is the old argument order; write "
                      "fit_bhmc(X, key=key, ...), as for every fit_* function.", FutureWarning,
                      stacklevel=2)
        key, X = X, legacy_X
    key = jax.random.key(0) if key is None else key
    Xn = check_data(X)
    n, dim = Xn.shape
    depth = check_int("depth", depth, 1)
    num_samples = check_int("num_samples", num_samples, 1)
    num_warmup = check_int("num_warmup", num_warmup, 0)
    num_chains = check_int("num_chains", num_chains, 1)
    var = np.var(Xn, axis=0)
    var = np.where(var > 0, var, 1.0)
    Sigma0 = np.diag(var) if Sigma0 is None else check_covariance(Sigma0, "Sigma0", dim)
    Sigma = Sigma0 / 20.0 if Sigma is None else check_covariance(Sigma, "Sigma", dim)
    mu0 = Xn.mean(axis=0) if mu0 is None else mu0
    hyper = NestedHDP(depth=depth, alpha=alpha, gamma0=gamma0, gamma=gamma, Sigma=Sigma, Sigma0=Sigma0, mu0=mu0)
    M_most = n * depth + depth + 1  # every point on its own path, and a move's new nodes
    if node_capacity is None:  # start small (a step scores every slot) and double when full
        M = min(M_most, 512 if init == "prior" else 64)  # a prior draw's ids reach N L
    else:
        M = M_most = check_int("node_capacity", node_capacity, depth + 2)
    K = min(n, 64) if component_capacity is None else check_int("component_capacity", component_capacity, 1)
    if path_update not in PATH_UPDATES:
        raise ValueError(f"path_update must be 'gibbs' or 'mh', got {path_update!r}.")
    if beta_rule not in BETA_RULES:
        raise ValueError(f"beta_rule must be 'exact' or 'paper', got {beta_rule!r}.")
    given = None
    if isinstance(init, str):
        if init not in ("ward", "prior"):
            raise ValueError(f"init must be 'ward', 'prior' or a (paths, c) pair, got {init!r}.")
    else:
        given = _given_start(init, n, depth)
        if len(np.unique(given[1])) > K:
            raise ValueError(f"init's c has {len(np.unique(given[1]))} components, more than "
                             f"component_capacity={K}; pass a larger component_capacity=.")
    split_merge = check_int("split_merge", split_merge, 0)
    config = BHMCConfig(depth, M, K, bool(update_beta), bool(update_hyper), bool(paper_split),
                        path_update=path_update, beta_rule=beta_rule, regraft=bool(regraft),
                        split_merge=split_merge)
    ftype = jnp.result_type(float)
    # the program's arguments: the hyperparameters as arrays, so that one compiled program
    # serves every value (the runner traces them)
    program = functools.partial(nested_hdp_model, component_capacity=K)
    model_args = (jnp.asarray(Xn, ftype),)
    model_kwargs = {"hyper": jax.tree.map(lambda a: jnp.asarray(a, ftype), hyper)}
    if compiler_options == "auto":
        small = n * (num_warmup + num_samples) * num_chains <= 20000
        compiler_options = FAST_COMPILE if small else None
    auto_enable()  # the persistent compilation cache (jaxbnp._cache)
    key = typed_key(key)  # jax.random.PRNGKey or jax.random.key: the same draws
    if num_chains > 1:  # BHMCKernel's keys: chains 0..C-1 of the run keyed `key`
        init_params = {"rng_key": jnp.broadcast_to(key, (num_chains,) + jnp.shape(key)),
                       "chain": jnp.arange(num_chains, dtype=jnp.int32)}
    else:
        init_params = {"rng_key": key, "chain": jnp.zeros((), jnp.int32)}
    if init != "prior":  # Ward's tree cut to the depth (fits the capacities), or the given start
        if given is None:
            k = min(K, max(2, int(round(math.sqrt(n / 2)))))
            while k > 1 and 1 + sum(round(k ** (lv / depth)) for lv in range(1, depth + 1)) > M_most:
                k -= 1
            paths0, c0 = ward_start(Xn, depth, k)
        else:
            paths0, c0 = given
        num_nodes = 1 + int(paths0.max())
        if num_nodes > M_most:
            raise ValueError(f"init's paths have {num_nodes} nodes, more than node_capacity={M_most}; "
                             "pass a larger node_capacity=.")
        while 4 * num_nodes > M < M_most:
            M = min(2 * M, M_most)  # room for the start's nodes and three times as many again
        start = (jnp.asarray(paths0), jnp.asarray(c0))
        if num_chains > 1:
            start = jax.tree.map(lambda a: jnp.broadcast_to(a, (num_chains,) + a.shape), start)
        init_params["start"] = start
    clock = _SweepClock(heartbeat, num_chains)
    t_start = time.perf_counter()
    try:
        result = run(
            lambda capacity: GrowingNodes(program, config._replace(node_capacity=capacity)), key, model_args,
            model_kwargs,
            num_warmup=num_warmup, num_samples=num_samples, num_chains=num_chains,
            collect=_collect_draws if store_samples else _collect_summary, init_params=init_params,
            capacity=M, max_capacity=M_most, progress_bar=False, heartbeat=clock,
            cache_key=("bhmc", config._replace(node_capacity=None)), compiler_options=compiler_options,
            chain_method=chain_method)
    except CapacityError:
        raise CapacityError(
            f"BHMC needs more slots than node_capacity={M_most} or component_capacity={K} (for its initial "
            "tree or partition, or for a move); pass a larger node_capacity= or component_capacity= "
            "to fit_bhmc.") from None
    if BHMCKernel.overflowed(None, result.last_state):  # out of component slots
        raise CapacityError(
            f"BHMC needs more than component_capacity={K} component slots; pass a larger "
            "component_capacity= to fit_bhmc.")
    samples = dict(result.samples)
    log_lik = samples.pop("log_lik")
    best = result.last_state.best
    if num_chains == 1:
        best = jax.tree.map(lambda a: a[None], best)
    best_chain = int(np.argmax(np.asarray(best.log_lik)))
    best = jax.tree.map(lambda a: a[best_chain], best)
    paths = np.asarray(best.paths)
    labels = np.stack([labels_at_level(paths, l) for l in range(1, depth + 1)])
    comps = np.unique(np.asarray(best.c), return_inverse=True)[1].reshape(-1).astype(np.int32)
    tree = np.where(np.asarray(best.count) > 0, np.asarray(best.parent), -1)
    first = clock.sweeps[0]
    samples["timing"] = {"first_sweep_s": clock.times[0] - t_start, "num_first_sweeps": first,
                         "other_sweeps_s": clock.times[-1] - clock.times[0],
                         "num_other_sweeps": num_warmup + num_samples - first, "num_chains": num_chains}
    summary = None
    if store_samples:
        from ...metrics import point_estimate

        draws = np.asarray(samples["paths"])
        summary = np.stack([point_estimate(draws[..., lv].reshape(-1, n)) for lv in range(depth)])
    return BHMCFit(paths, tree, labels, comps, log_lik, best, samples, hyper, summary)


def _given_start(init: Any, n: int, depth: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`fit_bhmc`'s ``init=(paths, c)``, checked and relabelled: a node is its path
    prefix (ids numbered level by level from 1), the components ``0 .. k − 1``."""
    try:
        paths, c = init
    except (TypeError, ValueError):
        raise ValueError("init must be 'ward', 'prior' or a (paths, c) pair of arrays.") from None
    paths, c = np.asarray(paths), np.asarray(c)
    if paths.shape != (n, depth) or c.shape != (n,):
        raise ValueError(f"init=(paths, c) needs paths of shape ({n}, {depth}) and c of shape ({n},), "
                         f"got {paths.shape} and {c.shape}.")
    for name, a in (("paths", paths), ("c", c)):
        whole = a.dtype.kind == "f" and np.all(np.isfinite(a)) and np.all(a == np.round(a))
        if a.dtype.kind not in "iu" and not whole:
            raise ValueError(f"init's {name} must hold integers.")
    out = np.zeros((n, depth), np.int32)
    offset = 1
    for level in range(depth):
        _, ids = np.unique(paths[:, : level + 1].astype(np.int64), axis=0, return_inverse=True)
        out[:, level] = offset + ids.reshape(-1)
        offset += int(ids.max()) + 1
    return out, np.unique(c, return_inverse=True)[1].reshape(-1).astype(np.int32)


def _collect_summary(ks: BHMCKernelState) -> dict:
    """What :func:`fit_bhmc` keeps of each post-warm-up state (module level: the runner caches by it)."""
    s, info = ks.sample, ks.info
    depth = s.paths.shape[-1]
    return {"log_lik": s.log_lik, "num_leaves": jnp.sum((s.count > 0) & (s.depth == depth), axis=-1),
            "num_components": jnp.sum(s.comp_active, axis=-1),
            "accept_rate": info.num_accepted / info.num_proposed, "num_regrafted": info.num_regrafted,
            "num_split_merge": info.num_split_merge}


def _collect_draws(ks: BHMCKernelState) -> dict:
    """:func:`_collect_summary` and the draws ``paths``, ``c``."""
    return {**_collect_summary(ks), "paths": ks.sample.paths, "c": ks.sample.c}


class _SweepClock:
    """The runner's heartbeat: the time after each compiled block, passed on to ``heartbeat``
    ticked by ``num_chains`` per sweep."""

    def __init__(self, heartbeat: Any, num_chains: int):
        self.heartbeat, self.num_chains = heartbeat, num_chains
        self.times: list = []
        self.sweeps: list = []

    def tick(self, n: int = 1) -> None:
        self.times.append(time.perf_counter())
        self.sweeps.append(int(n))
        if self.heartbeat is not None:
            self.heartbeat.tick(int(n) * self.num_chains)
