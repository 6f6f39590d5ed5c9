"""``jaxbnp cluster --method bhmc`` in a subprocess (float32 default): labels per level and a tree plot."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np

from .conftest import TEST_XLA_FLAGS


def test_cluster_bhmc_writes_levels_and_tree(tmp_path):
    rng = np.random.default_rng(0)
    centers = np.array([[-6.0, -2.0], [-6.0, 2.0], [6.0, -2.0], [6.0, 2.0]])
    X = np.concatenate([c + 0.3 * rng.normal(size=(8, 2)) for c in centers])
    y = np.repeat(np.arange(4), 8)
    np.savetxt(tmp_path / "x.csv", X, delimiter=",")
    np.savetxt(tmp_path / "y.txt", y, fmt="%d")
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["XLA_FLAGS"] = TEST_XLA_FLAGS  # faster compilation only (tests/conftest.py)
    r = subprocess.run(
        [sys.executable, "-m", "jaxbnp.cli", "cluster", "x.csv", "--labels", "y.txt", "--method", "bhmc",
         "--depth", "2", "--chains", "1", "--warmup", "10", "--samples", "10", "--out", "o"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )
    assert r.returncode == 0, r.stderr
    assert "bhmc" in r.stdout and "level 1" in r.stdout
    out = tmp_path / "o"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["method"] == "bhmc" and summary["depth"] == 2 and summary["dtype"] == "float32"
    assert len(summary["clusters_per_level"]) == 2
    assert set(summary["level1"]) == {"purity", "nmi", "ari", "f_measure", "num_clusters"}
    for level in (1, 2):
        labels = np.loadtxt(out / f"labels_level{level}.csv", skiprows=1)
        assert labels.shape == (32,)
    np.testing.assert_array_equal(np.loadtxt(out / "labels.csv", skiprows=1),
                                  np.loadtxt(out / "labels_level2.csv", skiprows=1))
    assert (out / "bhmc_tree.png").stat().st_size > 1000
    r = subprocess.run([sys.executable, "-m", "jaxbnp.cli", "cluster", "x.csv", "--method", "bhmc",
                        "--depth", "0", "--out", "o2"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert r.returncode != 0 and "depth" in r.stderr
