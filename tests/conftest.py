"""Test configuration: float64 everywhere, 4 host devices for chain_method="parallel".

Both settings must happen before JAX initialises its backend, hence here. XLA's
backend optimisation level 0 and no CPU fusion emitters (``TEST_XLA_FLAGS``, also
given to the tests' subprocesses) cut the suite's CPU time by about half: the suite
is dominated by compiling many small programs that each run briefly (measured on
tests/test_kernel.py: 109 -> 57 CPU-s). Speed is measured in benchmarks/, with
XLA's defaults.
The library's own default dtype is JAX's default (float32); the main job's
subprocess test runs in float32. The persistent compilation cache is off
(``JAXBNP_COMPILATION_CACHE=0``) except in the tests of the cache itself.

After a test file, JAX's compiled programs are dropped (``jax.clear_caches``) once the
worker holds more than ``MAX_MAPPED_REGIONS`` memory regions: XLA:CPU maps about 19 regions
per compiled program and frees them only with the program, so a worker that kept every
file's programs grew by some 7,000 regions a minute and, late in the suite, reached Linux's
limit of 65,530 (``vm.max_map_count``), where the next compilation crashed the worker
(segmentation fault in ``backend_compile_and_load``). Below the threshold the programs stay,
for the next files that run the same functions.
"""

import gc
import os

TEST_XLA_FLAGS = "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false"
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4 " + TEST_XLA_FLAGS)
# the CLI and the estimators turn on JAX's persistent compilation cache in ~/.cache by
# default: not in the suite (and its subprocesses), except where a test asks for it
os.environ["JAXBNP_COMPILATION_CACHE"] = "0"

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_enable_x64", True)


MAX_MAPPED_REGIONS = 15_000


def _mapped_regions() -> int | None:
    try:
        with open("/proc/self/maps", "rb") as f:
            return sum(1 for _ in f)
    except OSError:  # not Linux: no count, and no such limit to fear
        return None


@pytest.fixture(autouse=True, scope="module")
def _drop_compiled_programs():
    """Once a file's tests and module fixtures are done, free the compiled programs (and the
    memory regions XLA holds for them) if the worker holds too many regions."""
    yield
    regions = _mapped_regions()
    if regions is not None and regions > MAX_MAPPED_REGIONS:
        jax.clear_caches()
        gc.collect()
