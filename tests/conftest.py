"""Test configuration: float64 everywhere, 4 host devices for chain_method="parallel".

Both settings must happen before JAX initialises its backend, hence here. XLA's
backend optimisation level 0 cuts the suite's CPU time by about a quarter: the suite
is dominated by compiling many small programs that each run briefly (speed is
measured in benchmarks/, with the default level).
The library's own default dtype is JAX's default (float32); the main job's
subprocess test runs in float32.
"""

import os

os.environ.setdefault(
    "XLA_FLAGS", "--xla_force_host_platform_device_count=4 --xla_backend_optimization_level=0"
)

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)
