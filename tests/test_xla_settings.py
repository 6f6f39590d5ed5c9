"""``jaxbnp.set_cpu_loop_kernels``: the XLA_FLAGS it writes, its errors, and that XLA honours it."""

import os
import subprocess
import sys
import textwrap

import jax.numpy as jnp
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
