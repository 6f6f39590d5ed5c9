"""``benchmarks/gpu.sh --dry-run``: the GPU script's code paths at tiny sizes on the CPU
(issue #37), so the script that a short GPU lease runs has run before."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from .conftest import TEST_XLA_FLAGS

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_script_dry_run(tmp_path):
    env = {**os.environ, "XLA_FLAGS": TEST_XLA_FLAGS, "PYTHON": sys.executable}
    proc = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu.sh"), "--dry-run", "--out", str(tmp_path)],
                          env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    log = (tmp_path / "gpu.log").read_text() if (tmp_path / "gpu.log").exists() else ""
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:] + log[-3000:]
    assert "stopped at its cap" not in log, log[-3000:]
    rows = json.loads((tmp_path / "gpu.json").read_text())
    assert rows["env"][0]["dry_run"] is True and rows["env"][0]["backend"] == "cpu"
    for part in ("gibbs", "mapdp", "subcluster", "chains", "ddt", "auxiliary"):
        assert rows[part], f"part {part} wrote no row"
        for row in rows[part]:
            assert row["first_s"] > 0 and row["second_s"] > 0
    assert {r["kernel"] for r in rows["chains"]} == {"CollapsedGibbs", "SplitMerge", "SubClusterMCMC", "SliceGibbs"}
    assert {r["kernel"] for r in rows["auxiliary"]} == {"AuxiliaryGibbs", "SliceGibbs"}
    table = (tmp_path / "gpu.md").read_text()
    assert "## subcluster" in table and "no row" not in table
