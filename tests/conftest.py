"""Test configuration: float64 everywhere, 4 host devices for chain_method="parallel", and
each pytest-xdist worker's XLA threads on a core of its own (``_start_xla_on_one_core``).

Both settings must happen before JAX initialises its backend, hence here. XLA's
backend optimisation level 0 and no CPU fusion emitters (``TEST_XLA_FLAGS``, also
given to the tests' subprocesses) cut the suite's CPU time by about half: the suite
is dominated by compiling many small programs that each run briefly (measured on
tests/test_kernel.py: 109 -> 57 CPU-s). XLA:CPU's loop kernels
(``xla_cpu_small_while_loop_byte_threshold``, what ``jaxbnp.set_cpu_loop_kernels`` sets)
compile each small ``while`` loop whole: the exact tests' chains, whose iterations are loops
of tiny operations, run faster (the slice, auxiliary and sub-cluster enumeration files, one
core each, side by side: 601 -> 536 s; ``test_keys.py`` and ``test_mapdp.py``: 490 -> 472 s).
Speed is measured in benchmarks/, with XLA's defaults.
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


TEST_XLA_FLAGS = ("--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false "
                  "--xla_backend_extra_options=xla_cpu_small_while_loop_byte_threshold=67108864")
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4 " + TEST_XLA_FLAGS)
# the CLI and the estimators turn on JAX's persistent compilation cache in ~/.cache by
# default: not in the suite (and its subprocesses), except where a test asks for it
os.environ["JAXBNP_COMPILATION_CACHE"] = "0"

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_enable_x64", True)


def worker_core(cores: list) -> int | None:
    """The core of ``cores`` this pytest-xdist worker starts XLA on (``gw0`` the first, ``gw1``
    the second, ...), or ``None``: not an xdist worker, fewer cores than workers, no
    ``sched_setaffinity`` or ``JAXBNP_TEST_PIN_WORKERS=0``."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0)
    if (not worker.startswith("gw") or not hasattr(os, "sched_setaffinity")
            or os.environ.get("JAXBNP_TEST_PIN_WORKERS") == "0" or not 0 < workers <= len(cores)):
        return None
    return cores[int(worker[2:]) % len(cores)]


def _start_xla_on_one_core() -> set | None:
    """XLA's CPU client started on the worker's one core, then this thread on every core again.

    XLA:CPU sizes its thread pools to the cores a process may run on when its client starts,
    runs a program's independent operations side by side on them, and their idle threads spin
    while they look for work. With two workers on two cores, each worker's pools spun on both
    cores and took time from the other worker. Started on one core, a worker's pools are sized
    for one core and stay on it (threads keep the affinity they were created with); the
    main thread, and so the subprocesses the tests start, get every core back, so that code
    which counts the cores (``runner.cpu_cores``, the CLI's host devices) sees what it would
    see outside the suite. Measured (nothing else running, ``-n 2``): four files
    (``tests/exact/test_subcluster_exact.py``, ``tests/exact/test_gibbs_exact.py``,
    ``tests/test_kernel.py``, ``tests/test_mapdp.py``) took 443 s unpinned, 412 s so (CPU time
    767 s and 660 s; benchmarks/results/suite_durations.md, thirteenth session).
    ``JAXBNP_TEST_PIN_WORKERS=0`` turns it off."""
    cores = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set()
    core = worker_core(sorted(cores))
    if core is None:
        return None
    os.sched_setaffinity(0, {core})
    jax.devices()
    os.sched_setaffinity(0, cores)
    return cores


#: the cores this worker had before XLA started on one of them (``None``: nothing pinned)
_ALL_CORES = _start_xla_on_one_core()


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


# --------------------------------------------------- the persistent cache's tests (test_cache, test_cli)
def cache_stamps(folder):
    """Each file of a persistent compilation cache folder, by name, with its mtime."""
    return {p.name: p.stat().st_mtime_ns for p in folder.rglob("*") if p.is_file()} if folder.exists() else {}


def assert_loaded_from_cache(first, second):
    """The second run loaded every program the first wrote: none rewritten, and none of the
    same function written again under another key. A program new in the second run is
    allowed only if the first run did not write that function at all: its compilation took
    under the cache's 0.1 s threshold there and just over it on a loaded machine (seen in a
    fresh clone's suite for ``jit__threefry_fold_in`` and in CI for ``jit_broadcast_in_dim``)."""
    assert {name: second.get(name) for name in first} == first, "a program was written again"

    def function(name):  # jit_fit-<hash>-cache
        return name.rsplit("-", 2)[0]

    cached = {function(name) for name in first}
    again = [name for name in set(second) - set(first) if function(name) in cached]
    assert not again, f"the same functions compiled again under other keys: {again}"
