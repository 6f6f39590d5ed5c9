"""JAX's persistent compilation cache (``jaxbnp._cache``): where it goes, the switches that turn
it off, and that the estimators turn it on by default (in subprocesses: the suite itself runs
with ``JAXBNP_COMPILATION_CACHE=0``, tests/conftest.py). The CLI's first and second runs are in
tests/test_cli.py."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from jaxbnp import _cache

from .conftest import TEST_XLA_FLAGS, assert_loaded_from_cache, cache_stamps


def test_cache_dir_from_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("JAXBNP_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert _cache.cache_dir() == tmp_path / "xdg" / "jaxbnp" / "jax"
    monkeypatch.setenv("JAXBNP_CACHE_DIR", str(tmp_path / "mine"))
    assert _cache.cache_dir() == tmp_path / "mine"
    for value, off in (("0", True), ("off", True), ("False", True), ("1", False), ("", False)):
        monkeypatch.setenv("JAXBNP_COMPILATION_CACHE", value)
        assert _cache.cache_disabled_by_env() is off


def test_enable_takes_a_bool():
    with pytest.raises(TypeError, match="a bool"):
        _cache.enable_compilation_cache("yes")


_SCRIPT = textwrap.dedent(
    """
    import sys
    import numpy as np
    import jaxbnp as bnp
    if sys.argv[1] == "off":
        bnp.enable_compilation_cache(False)
    X = np.r_[np.random.default_rng(0).normal(-3, 1, (40, 2)), np.random.default_rng(1).normal(3, 1, (40, 2))]
    print(bnp.MAPDP.paper().fit(X).n_clusters_)  # the smallest MAP-DP program: compiles in about 3 s
    """
)


def _fit_in_subprocess(mode: str, cache: Path, switch: str | None = None):
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAXBNP_COMPILATION_CACHE")}
    env.update(XLA_FLAGS=TEST_XLA_FLAGS, JAXBNP_CACHE_DIR=str(cache))
    if switch is not None:
        env["JAXBNP_COMPILATION_CACHE"] = switch
    out = subprocess.run([sys.executable, "-c", _SCRIPT, mode], env=env, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return cache_stamps(cache)


def test_estimators_fill_the_cache_unless_turned_off(tmp_path):
    first = _fit_in_subprocess("on", tmp_path / "on")
    assert any(name.startswith("jit_fit-") for name in first), f"MAP-DP's program was not cached: {first}"
    assert_loaded_from_cache(first, _fit_in_subprocess("on", tmp_path / "on"))
    assert _fit_in_subprocess("off", tmp_path / "off") == {}
    assert _fit_in_subprocess("on", tmp_path / "env", switch="0") == {}
