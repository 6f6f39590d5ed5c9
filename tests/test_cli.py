"""The main job, as a user runs it: ``jaxbnp cluster`` in a subprocess (float32 default)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from .conftest import TEST_XLA_FLAGS


def _run_cli(*args, cwd):
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["XLA_FLAGS"] = TEST_XLA_FLAGS  # faster compilation only (tests/conftest.py)
    return subprocess.run(
        [sys.executable, "-m", "jaxbnp.cli", *args], cwd=cwd, env=env,
        capture_output=True, text=True, timeout=600,
    )


def test_cluster_default_data_set(tmp_path):
    out = tmp_path / "out"
    r = _run_cli("cluster", "--chains", "2", "--warmup", "30", "--samples", "30", "--out", str(out), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "clusters" in r.stdout and "NMI" in r.stdout and "log joint" in r.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["num_points"] == 1300 and summary["dtype"] == "float32"
    assert 5 <= summary["clusters_best_draw"] <= 20
    assert summary["nmi_best_draw"] > 0.7
    labels = np.loadtxt(out / "labels.csv", skiprows=1)
    assert labels.shape == (1300,)
    assert (out / "clusters.png").stat().st_size > 1000 and (out / "trace.png").exists()
    assert (out / "coclustering.png").exists() and "R-hat" in r.stdout
    assert 5 <= summary["clusters_point_estimate"] <= 20 and summary["nmi"] > 0.7
    assert summary["diagnostics"]["num_clusters"]["ess"] > 0


def test_cluster_csv_file_and_bad_file(tmp_path):
    rng = np.random.default_rng(0)
    X = np.r_[rng.normal(-3, 1, (40, 3)), rng.normal(3, 1, (40, 3))]
    np.savetxt(tmp_path / "x.csv", X, delimiter=",")
    r = _run_cli("cluster", "x.csv", "--family", "normal-gamma", "--chains", "1", "--warmup", "20",
                 "--samples", "20", "--out", "o", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "o" / "summary.json").read_text())["clusters_best_draw"] >= 2
    X[5, 1] = np.nan
    np.savetxt(tmp_path / "bad.csv", X, delimiter=",")
    r = _run_cli("cluster", "bad.csv", "--out", "o2", cwd=tmp_path)
    assert r.returncode != 0 and "NaN or inf" in r.stderr


def test_cluster_splitmerge_tgmcmc_and_mapdp(tmp_path, capsys, monkeypatch):
    """The other methods, in-process (the subprocess path is tested above)."""
    from jaxbnp.cli import main

    rng = np.random.default_rng(1)
    X = np.r_[rng.normal(-4, 1, (30, 2)), rng.normal(4, 1, (30, 2))]
    np.savetxt(tmp_path / "x.csv", X, delimiter=",")
    monkeypatch.chdir(tmp_path)
    # tgMCMC starts from IBHC's 11 clusters here and needs about 25 iterations to reach the 2
    for method, extra in (("splitmerge", ["--split-merge-moves", "3", "--warmup", "5"]),
                          ("mapdp", ["--mapdp-mode", "batched", "--warmup", "5"]),
                          ("tgmcmc", ["--global-moves", "10", "--depth", "1", "--warmup", "30"])):
        assert main(["cluster", "x.csv", "--method", method, *extra, "--chains", "1",
                     "--samples", "10", "--out", method]) == 0
        assert f"method    {method}" in capsys.readouterr().out
        assert json.loads((tmp_path / method / "summary.json").read_text())["clusters_best_draw"] == 2


def test_cluster_checkpoint_and_resume(tmp_path, capsys, monkeypatch):
    """--checkpoint-every saves the run; --resume continues it (same draws as one run: tests/test_checkpoint.py)."""
    from jaxbnp.checkpoint import load_checkpoint
    from jaxbnp.cli import main

    rng = np.random.default_rng(2)
    X = np.r_[rng.normal(-4, 1, (20, 2)), rng.normal(4, 1, (20, 2))]
    np.savetxt(tmp_path / "x.csv", X, delimiter=",")
    monkeypatch.chdir(tmp_path)
    common = ["cluster", "x.csv", "--family", "normal-gamma", "--chains", "2", "--warmup", "5", "--out", "o"]
    assert main([*common, "--samples", "6", "--checkpoint-every", "3"]) == 0
    assert load_checkpoint(tmp_path / "o" / "checkpoint.pkl").samples["z"].shape == (2, 6, 40)
    assert main([*common, "--samples", "4", "--resume"]) == 0
    run = load_checkpoint(tmp_path / "o" / "checkpoint.pkl")
    assert run.samples["z"].shape == (2, 10, 40) and run.complete
    capsys.readouterr()
    with pytest.raises(SystemExit, match="--seed"):
        main([*common, "--samples", "4", "--resume", "--seed", "5"])
    with pytest.raises(SystemExit, match="no checkpoint"):
        main([*common[:-1], "elsewhere", "--resume"])


def test_cluster_ddt_cuts_the_best_tree(tmp_path, capsys, monkeypatch):
    """--method ddt: population MCMC over diffusion trees, the best tree cut at its largest gap."""
    from jaxbnp.cli import main

    rng = np.random.default_rng(3)
    X = np.r_[rng.normal(-4, 0.5, (8, 2)), rng.normal(4, 0.5, (8, 2))]
    np.savetxt(tmp_path / "x.csv", X, delimiter=",")
    monkeypatch.chdir(tmp_path)
    assert main(["cluster", "x.csv", "--method", "ddt", "--chains", "2", "--warmup", "10",
                 "--samples", "20", "--out", "d"]) == 0
    assert "method    ddt" in capsys.readouterr().out
    labels = np.loadtxt(tmp_path / "d" / "labels.csv", skiprows=1)
    assert len(np.unique(labels)) == 2 and len(np.unique(labels[:8])) == 1
    assert (tmp_path / "d" / "dendrogram.png").stat().st_size > 1000
    with pytest.raises(SystemExit, match="--resume and --checkpoint-every"):
        main(["cluster", "x.csv", "--method", "ddt", "--resume", "--out", "d"])
