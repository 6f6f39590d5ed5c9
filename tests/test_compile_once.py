"""A second ``MCMC.run`` of the same kernel on data of the same shape compiles nothing
(issue #36): the kernels keep their compiled start on themselves
(:func:`jaxbnp._programs.call_cached`), and NumPyro keeps its loop; ``fit_ddt`` keeps its
programs keyed by its settings (the priors' parameters are arguments).

Counted with JAX's own monitoring events: an XLA compilation, or a program loaded from
the persistent compilation cache, counts as one. NumPyro's defaults (``progress_bar=True``) reuse the loop when the data are
the same array; ``jit_model_args=True`` reuses it for new data of the same shape. (With
``progress_bar=False`` NumPyro wraps its loop in a fresh ``jax.jit`` on every run and
compiles it again, NUTS included; ``test_nuts_recompiles_without_progress_bar`` pins that
down, so this file notices when NumPyro changes it.) The power check: a new shape compiles.

The counts come from a fresh process (one subprocess for the whole file, the suite's XLA
flags and float64) without the variables ``CI`` and ``PYTEST_XDIST_WORKER``: NumPyro turns
its progress bar off when either is set, and then compiles its loop on every run (which is
how this test first failed inside the suite's workers).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from .conftest import TEST_XLA_FLAGS

KERNELS = ("AuxiliaryGibbs", "BHMCKernel", "CollapsedGibbs", "DiffusionTreeMCMC", "SliceGibbs", "SubClusterMCMC")

_SCRIPT = """
import json
from collections import Counter

import jax
import jax.monitoring
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.infer import MCMC, NUTS

jax.config.update("jax_enable_x64", True)

import jaxbnp as bnp  # noqa: E402
from jaxbnp.inference.bhmc import sampler as bhmc  # noqa: E402
from jaxbnp.models.nested import NestedHDP, nested_hdp_model  # noqa: E402

EVENTS: Counter = Counter()
COMPILE = "/jax/core/compile/backend_compile_duration"
CACHE_HIT = "/jax/compilation_cache/cache_hits"  # a program loaded from the persistent cache
jax.monitoring.register_event_duration_secs_listener(lambda event, duration, **kw: EVENTS.update([event]))
jax.monitoring.register_event_listener(lambda event, **kw: EVENTS.update([event]))

X = np.r_[np.random.default_rng(0).normal(-3.0, 0.6, (5, 2)), np.random.default_rng(1).normal(3.0, 0.6, (5, 2))]
FAMILY = bnp.NormalWishart.from_data(X)


def dp_model(X):
    z = numpyro.sample("z", bnp.Partition(bnp.DP(1.0), X.shape[0]))
    numpyro.sample("X", bnp.ConjugateMixture(FAMILY, z), obs=X)


def student_model(X):
    z = numpyro.sample("z", bnp.Partition(bnp.DP(1.0), X.shape[0]))
    with numpyro.plate("clusters", 6):  # fewer slots than points: the overflow check's callback
        mu = numpyro.sample("mu", dist.Normal(0.0, 3.0).expand([2]).to_event(1))
    numpyro.sample("X", dist.StudentT(3.0, mu[z], 1.0).to_event(1), obs=X)


def slice_model(X):  # the sticks beyond 32 slots never reach a slice here
    z = numpyro.sample("z", bnp.Partition(bnp.DP(1.0), X.shape[0]))
    with numpyro.plate("clusters", 32):
        mu = numpyro.sample("mu", dist.Normal(0.0, 3.0).expand([2]).to_event(1))
    numpyro.sample("X", dist.StudentT(3.0, mu[z], 1.0).to_event(1), obs=X)


def tree_model(X):
    tree = numpyro.sample("tree", bnp.DiffusionTree(1.2, X.shape[0]))
    numpyro.sample("X", bnp.BrownianLeaves(tree, 0.9, 0.2), obs=X)


BHMC_HYPER = NestedHDP(2, 1.0, 1.0, 1.0, np.eye(2), 4.0 * np.eye(2))


def bhmc_model(X, hyper=BHMC_HYPER):
    nested_hdp_model(X, hyper=hyper, component_capacity=6)


KERNELS = {
    "AuxiliaryGibbs": (lambda: bnp.AuxiliaryGibbs(student_model), lambda X: (X,)),
    "CollapsedGibbs": (lambda: bnp.CollapsedGibbs(dp_model), lambda X: (X,)),
    "SliceGibbs": (lambda: bnp.SliceGibbs(slice_model), lambda X: (X,)),
    "SubClusterMCMC": (lambda: bnp.SubClusterMCMC(dp_model), lambda X: (X,)),
    "DiffusionTreeMCMC": (lambda: bnp.DiffusionTreeMCMC(tree_model), lambda X: (X,)),
    "BHMCKernel": (lambda: bhmc.BHMCKernel(bhmc_model, node_capacity=15), lambda X: (X,)),
}


def _compiles(mcmc, key, args):
    EVENTS.clear()
    mcmc.run(key, *args)
    jax.block_until_ready(mcmc.get_samples())
    return EVENTS[COMPILE] + EVENTS[CACHE_HIT]



def second_run_counts(name):
    make_kernel, make_args = KERNELS[name]
    X0 = jnp.asarray(X)
    mcmc = MCMC(make_kernel(), num_warmup=1, num_samples=2, jit_model_args=True)
    return [_compiles(mcmc, jax.random.PRNGKey(0), make_args(X0)),
            _compiles(mcmc, jax.random.PRNGKey(1), make_args(X0)),
            _compiles(mcmc, jax.random.key(2), make_args(X0 + 0.5))]


def defaults_counts():
    X0 = jnp.asarray(X)
    mcmc = MCMC(bnp.CollapsedGibbs(dp_model), num_warmup=1, num_samples=2)
    return [_compiles(mcmc, jax.random.PRNGKey(0), (X0,)), _compiles(mcmc, jax.random.PRNGKey(1), (X0,)),
            _compiles(mcmc, jax.random.PRNGKey(1), (X0[:-1],))]


def nuts_counts():
    def model(X):
        mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
        numpyro.sample("X", dist.Normal(mu, 1.0), obs=X)

    mcmc = MCMC(NUTS(model), num_warmup=2, num_samples=2, progress_bar=False)
    return [_compiles(mcmc, jax.random.PRNGKey(0), (jnp.ones(3),)),
            _compiles(mcmc, jax.random.PRNGKey(1), (jnp.ones(3),))]


def fit_ddt_counts():
    from jaxbnp.inference.trees.fit import fit_ddt

    def compiles(data, seed):
        EVENTS.clear()
        fit = fit_ddt(data, num_chains=2, num_samples=2, num_warmup=1, key=jax.random.key(seed),
                      progress_bar=False)
        jax.block_until_ready(fit.log_joint)
        return EVENTS[COMPILE] + EVENTS[CACHE_HIT]

    # new data of the same shape (another sigma prior and noise, both taken from the data)
    return [compiles(X, 0), compiles(X, 1), compiles(2.0 * X + 1.0, 2), compiles(X[:-1], 3)]


out = {name: second_run_counts(name) for name in sorted(KERNELS)}
out["fit_ddt"] = fit_ddt_counts()
out["defaults"] = defaults_counts()
out["nuts"] = nuts_counts()
print("COUNTS " + json.dumps(out), flush=True)
"""


@pytest.fixture(scope="module")
def counts():
    env = dict(os.environ, XLA_FLAGS=TEST_XLA_FLAGS, JAXBNP_COMPILATION_CACHE="0", JAXBNP_PROGRESS="0")
    # NumPyro turns its progress bar off when either is set (MCMC.__init__), and with it off
    # it compiles its loop on every run: a user's process has neither
    for name in ("CI", "PYTEST_XDIST_WORKER"):
        env.pop(name, None)
    proc = subprocess.run([sys.executable, "-c", _SCRIPT], env=env, capture_output=True, text=True,
                          timeout=900)
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("COUNTS ")]
    assert proc.returncode == 0 and line, proc.stderr[-4000:]
    return json.loads(line[-1][len("COUNTS "):])


@pytest.mark.parametrize("name", KERNELS)
def test_second_run_compiles_nothing(counts, name):
    """One compilation of the loop per kernel (the costly part): ``jit_model_args=True``
    covers a new key, the other kind of key and new data of the same shape."""
    first, second, new_data = counts[name]
    assert first > 0 and second == 0 and new_data == 0, counts[name]


def test_defaults_and_a_new_shape(counts):
    """NumPyro's defaults (loop keyed by the data array) and the power check: another
    shape is another program."""
    first, second, new_shape = counts["defaults"]
    assert first > 0 and second == 0 and new_shape > 0, counts["defaults"]


def test_fit_ddt_compiles_once_per_shape(counts):
    """``fit_ddt`` again on data of the same shape (its default priors and noise scale with
    the data, and are arguments of the compiled program) compiles nothing; another number
    of points does (the power check)."""
    first, second, new_data, new_shape = counts["fit_ddt"]
    assert first > 0 and second == 0 and new_data == 0 and new_shape > 0, counts["fit_ddt"]


def test_nuts_recompiles_without_progress_bar(counts):
    """NumPyro's own behaviour, which the kernels cannot change: with ``progress_bar=False``
    every ``run`` compiles its loop again (JAX's persistent cache can then serve it)."""
    assert counts["nuts"][1] > 0, counts["nuts"]
