"""``jaxbnp.set_cpu_loop_kernels`` (the XLA_FLAGS it writes, its errors, that XLA honours it) and
the samplers' per-program whole-loop kernels (``jaxbnp._xla.mark_loop_program``)."""

import json
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxbnp as bnp
from jaxbnp import _xla

KEY = "xla_cpu_small_while_loop_byte_threshold"


def test_writes_the_threshold_and_keeps_other_flags(monkeypatch):
    monkeypatch.setattr(_xla, "backends_started", lambda: False)
    monkeypatch.setenv("XLA_FLAGS", f"--foo=1 --xla_backend_extra_options=a=2,{KEY}=5 --bar")
    bnp.set_cpu_loop_kernels(123)
    tokens = os.environ["XLA_FLAGS"].split()
    assert "--foo=1" in tokens and "--bar" in tokens
    extra = [t for t in tokens if t.startswith("--xla_backend_extra_options=")]
    assert extra == [f"--xla_backend_extra_options=a=2,{KEY}=123"]
    monkeypatch.delenv("XLA_FLAGS")
    bnp.set_cpu_loop_kernels()
    assert os.environ["XLA_FLAGS"] == f"--xla_backend_extra_options={KEY}={1 << 26}"


@pytest.mark.parametrize("bad", [-1, 1.5, True, "64MB"])
def test_bad_threshold_raises(bad):
    with pytest.raises(ValueError, match="byte_threshold must be an integer >= 0"):
        bnp.set_cpu_loop_kernels(bad)


def test_raises_once_jax_has_started(monkeypatch):
    jnp.zeros(1).block_until_ready()  # the backends are up in this process
    before = os.environ.get("XLA_FLAGS")
    with pytest.raises(RuntimeError, match="before JAX starts"):
        bnp.set_cpu_loop_kernels()
    assert os.environ.get("XLA_FLAGS") == before


_PROBE = textwrap.dedent(
    """
    import sys, jax, jax.numpy as jnp
    import jaxbnp as bnp
    if sys.argv[1] == "set":
        bnp.set_cpu_loop_kernels()
    f = lambda a: jax.lax.fori_loop(0, 100, lambda i, a: jnp.sin(a) * 1.001, a)
    text = jax.jit(f).lower(jnp.zeros(1000)).compile().as_text()
    print(text.count('xla_cpu_small_call="true"'))
    """
)


@pytest.mark.parametrize("mode, expected", [("set", "1"), ("default", "0")])
def test_xla_compiles_the_loop_as_one_kernel_only_when_set(mode, expected):
    """A loop over a 4 kB array is above XLA's 1 kB default and below the setter's threshold."""
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # XLA's defaults (the suite sets the threshold)
    out = subprocess.run([sys.executable, "-c", _PROBE, mode], capture_output=True, text=True, timeout=300,
                         env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-1] == expected


def test_suite_workers_start_xla_on_one_core():
    """``tests/conftest.py``: under pytest-xdist (as many cores as workers), a worker's XLA
    threads were created on one core, and the main thread (and so every subprocess a test
    starts) has every core back; elsewhere nothing is pinned."""
    from . import conftest

    cores = os.sched_getaffinity(0)
    core = conftest.worker_core(sorted(cores))
    if core is None:
        assert conftest._ALL_CORES is None
        return
    assert conftest._ALL_CORES == cores and len(cores) >= 2
    threads = [os.sched_getaffinity(int(t)) for t in os.listdir("/proc/self/task")]
    assert sum(len(a) == 1 for a in threads) >= 1, threads  # XLA's pools, on one core
    assert {next(iter(a)) for a in threads if len(a) == 1} == {core}, threads
    child = subprocess.run([sys.executable, "-c", "import os; print(len(os.sched_getaffinity(0)))"],
                           capture_output=True, text=True, check=True)
    assert int(child.stdout) == len(cores)


# -- whole-loop kernels for jaxbnp's own programs (jaxbnp._xla.mark_loop_program) -----------
_PER_PROGRAM = textwrap.dedent(
    """
    import json, jax, jax.numpy as jnp, numpy as np, numpyro
    from numpyro.infer import MCMC
    import jaxbnp as bnp
    from jaxbnp import _xla

    def loop(a):
        return jax.lax.fori_loop(0, 100, lambda i, a: jnp.sin(a) * 0.5 + a[::-1], a)

    def small_calls(f, *args):
        return jax.jit(f).lower(*args).compile().as_text().count('xla_cpu_small_call="true"')

    a = jnp.zeros(4096)
    out = {"enabled": _xla.loop_kernels_enabled(),
           "marked": small_calls(lambda a: _xla.mark_loop_program(loop(a)), a),
           "plain": small_calls(loop, a)}
    X = jnp.asarray(np.random.default_rng(0).normal(size=(12, 2)), jnp.float32)
    def model(X):
        u = numpyro.sample("u", bnp.AuxiliaryU())
        z = numpyro.sample("z", bnp.Partition(bnp.NGGP(1.0, 0.3), X.shape[0], u=u))
        numpyro.sample("X", bnp.ConjugateMixture(bnp.NormalGamma(0.0, 1.0, 2.0, 1.0), z), obs=X)
    kernel = bnp.SplitMerge(model, num_split_merge=2)
    state = kernel.init(jax.random.key(0), 0, None, (X,), {})
    out["sampler"] = small_calls(lambda s: kernel.sample(s, (X,), {}), state)
    draws = {}
    for method in ("sequential", "vectorized", "parallel"):
        m = MCMC(bnp.SplitMerge(model, num_split_merge=2), num_warmup=3, num_samples=10, num_chains=2,
                 chain_method=method, progress_bar=False)
        m.run(jax.random.key(3), X)
        draws[method] = {k: np.asarray(v).tolist() for k, v in m.get_samples(group_by_chain=True).items()}
    out["same_draws"] = all(draws[m] == draws["vectorized"] for m in draws)
    # a diffusion tree: 2 vectorized chains against the second chain run alone
    from jaxbnp.inference.trees.mcmc import DiffusionTreeMCMC
    from jaxbnp.models.ddt import BrownianLeaves, DiffusionTree
    def tree_model(X):
        tree = numpyro.sample("tree", DiffusionTree(1.2, X.shape[0]))
        numpyro.sample("X", BrownianLeaves(tree, 0.9, 0.2), obs=X)
    X6 = jnp.asarray([[-1.0, -0.8], [-1.2, -1.1], [-0.9, -1.3], [1.0, 0.9], [1.3, 1.1], [0.8, 1.2]])
    trees = []
    for chains, key in ((2, jax.random.key(0)), (1, jax.random.split(jax.random.key(0), 2)[1])):
        m = MCMC(DiffusionTreeMCMC(tree_model), num_warmup=3, num_samples=6, num_chains=chains,
                 chain_method="vectorized", progress_bar=False)
        m.run(key, X6)
        trees.append(m.get_samples(group_by_chain=True)["tree"])
    pairs = list(zip(jax.tree.leaves(trees[0]), jax.tree.leaves(trees[1])))
    out["tree_topology_equal"] = all(np.array_equal(np.asarray(a)[1:], np.asarray(b)) for a, b in pairs
                                     if not np.issubdtype(np.asarray(a).dtype, np.floating))
    out["tree_time_err"] = max(float(np.max(np.abs(np.asarray(a)[1:] - np.asarray(b)))) for a, b in pairs
                               if np.issubdtype(np.asarray(a).dtype, np.floating))
    print(json.dumps(out))
    """
)


def _per_program(switch=None):
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", _xla.ENV_SWITCH)}
    env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"  # XLA's defaults otherwise
    if switch is not None:
        env[_xla.ENV_SWITCH] = switch
    out = subprocess.run([sys.executable, "-c", _PER_PROGRAM], capture_output=True, text=True,
                         timeout=600, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_only_jaxbnp_programs_get_whole_loop_kernels_and_chain_methods_agree():
    """Under XLA's default flags a program holding the marker (every sampler step of
    CollapsedGibbs, SplitMerge and TreeGuidedMCMC) compiles its loop as one kernel; a user's
    program in the same process keeps XLA's default; ``JAXBNP_CPU_LOOP_KERNELS=0`` turns it
    off. NGGP split-merge gives the same draws with each chain method either way, and a
    diffusion-tree chain the same tree vectorized beside another as alone."""
    on, off = _per_program(), _per_program("0")
    assert on["enabled"] and not off["enabled"]
    assert on["marked"] >= 1 and on["plain"] == 0
    assert off["marked"] == 0 and off["plain"] == 0
    assert on["sampler"] > off["sampler"]
    assert on["same_draws"] and off["same_draws"]
    # diffusion trees: vectorized chains against a chain run alone (as tests/test_ddt.py)
    for run in (on, off):
        assert run["tree_topology_equal"]
        assert run["tree_time_err"] < 1e-5


def test_a_threshold_in_xla_flags_wins(monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", f"--xla_backend_extra_options={KEY}=5")
    assert not _xla.loop_kernels_enabled()
    monkeypatch.setenv("XLA_FLAGS", "")
    monkeypatch.setenv(_xla.ENV_SWITCH, "off")
    assert not _xla.loop_kernels_enabled()


def test_the_marker_leaves_values_and_batching_alone():
    x = jnp.asarray([0.0, -0.0, 1.5, jnp.nan])
    y = jax.jit(jax.vmap(_xla._marker))(x)  # the suite's XLA_FLAGS turn mark_loop_program off
    np.testing.assert_array_equal(np.signbit(y), np.signbit(x))
    np.testing.assert_array_equal(np.asarray(y), np.asarray(x))
    assert _xla._marker(jnp.int32(3)).dtype == jnp.int32
