"""Scripts run in a subprocess with several host devices (the main test process has 4):
the environment, the one JSON line a script prints, and a script started in the
background so that it compiles while the main-process tests run."""

from __future__ import annotations

import functools
import json
import os
import socket
import subprocess
import sys

import pytest

from .conftest import TEST_XLA_FLAGS

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def device_env(num_devices: int) -> dict:
    """The environment of a float64 CPU process with ``num_devices`` host devices and the
    suite's XLA flags, importing this checkout."""
    env = dict(os.environ)
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={num_devices} {TEST_XLA_FLAGS}"
    env["JAX_ENABLE_X64"] = "1"
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    return env


def free_port() -> int:
    """A free TCP port on the loopback interface (a ``jax.distributed`` coordinator's)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_processes(script: str, num_processes: int = 2, num_devices: int = 2) -> list[dict]:
    """``script`` in ``num_processes`` processes of ``num_devices`` host devices each, started
    with ``(process_id, port)`` as arguments (a loopback ``jax.distributed`` coordinator's
    port); the JSON object each printed, in process order."""
    port = free_port()
    procs = [subprocess.Popen([sys.executable, "-c", script, str(i), str(port)],
                              env=device_env(num_devices), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, cwd=REPO)
             for i in range(num_processes)]
    outs = []
    try:
        for p in procs:
            stdout, stderr = p.communicate(timeout=600)
            assert p.returncode == 0, stderr[-4000:]
            outs.append(last_json(stdout))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return outs


def last_json(stdout: str) -> dict:
    """The object of the last line printed as ``"JSON" + json.dumps(...)``."""
    lines = [line for line in stdout.splitlines() if line.startswith("JSON")]
    assert lines, stdout
    return json.loads(lines[-1][4:])


class BackgroundScript:
    """``python -c script`` with ``num_devices`` host devices, started at once; ``result``
    waits for it and returns its JSON object."""

    def __init__(self, script: str, num_devices: int = 8):
        self.proc = subprocess.Popen([sys.executable, "-c", script], env=device_env(num_devices),
                                     cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    @functools.cached_property
    def result(self) -> dict:
        stdout, stderr = self.proc.communicate(timeout=900)
        assert self.proc.returncode == 0, stderr[-4000:]
        return last_json(stdout)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()


def background_fixture(script: str, num_devices: int = 8):
    """A module-scoped autouse fixture starting ``script`` when the module's first test starts
    (it compiles in the background while the other tests run) and killing it at the end."""

    @pytest.fixture(scope="module", autouse=True)
    def fixture():
        run = BackgroundScript(script, num_devices)
        yield run
        run.close()

    return fixture
