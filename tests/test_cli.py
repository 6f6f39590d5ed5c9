"""The main job, as a user runs it: ``jaxbnp cluster`` in a subprocess (float32 default)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from .conftest import TEST_XLA_FLAGS, assert_loaded_from_cache, cache_stamps


def _run_cli(*args, cwd, env=None):
    env = {**{k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}, **(env or {})}
    env["XLA_FLAGS"] = TEST_XLA_FLAGS  # faster compilation only (tests/conftest.py)
    return subprocess.run(
        [sys.executable, "-m", "jaxbnp.cli", *args], cwd=cwd, env=env,
        capture_output=True, text=True, timeout=600,
    )


def test_cluster_default_data_set(tmp_path):
    """The README's main job with shorter runs: the default method finds the 13 clusters."""
    out = tmp_path / "out"
    r = _run_cli("cluster", "--warmup", "30", "--samples", "30", "--out", str(out), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "clusters" in r.stdout and "NMI" in r.stdout and "log joint" in r.stdout
    # what will run is said before anything compiles, on standard error (not a terminal here)
    assert "jaxbnp: splitmerge on 1300 x 2 points (float32)" in r.stderr
    assert "compiling and sampling done after" in r.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["num_points"] == 1300 and summary["dtype"] == "float32"
    assert summary["method"] == "splitmerge" and summary["chains"] == 2
    labels = np.loadtxt(out / "labels.csv", skiprows=1)
    assert labels.shape == (1300,)
    assert (out / "clusters.png").stat().st_size > 1000 and (out / "trace.png").exists()
    assert (out / "coclustering.png").exists() and "R-hat" in r.stdout
    assert summary["clusters_point_estimate"] == 13 and summary["nmi"] > 0.95
    assert summary["diagnostics"]["num_clusters"]["ess"] > 0


def test_cluster_float64_and_no_progress(tmp_path):
    out = tmp_path / "out"
    r = _run_cli("cluster", "--method", "gibbs", "--dtype", "float64", "--no-progress", "--warmup", "20",
                 "--samples", "20", "--out", str(out), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads((out / "summary.json").read_text())["dtype"] == "float64"
    assert "elapsed" not in r.stderr and "done after" not in r.stderr


def test_compilation_cache_second_run_compiles_nothing_new(tmp_path):
    """With the cache on, the first run writes the compiled programs to JAXBNP_CACHE_DIR and
    the second run of the same command writes nothing new (it loaded them all); the CLI
    option and the environment variable turn it off."""
    cache = tmp_path / "cache"
    args = ("cluster", "x.csv", "--method", "gibbs", "--chains", "1", "--warmup", "3", "--samples", "3",
            "--family", "normal-gamma", "--out", "o")
    rng = np.random.default_rng(0)
    np.savetxt(tmp_path / "x.csv", np.r_[rng.normal(-3, 1, (30, 2)), rng.normal(3, 1, (30, 2))], delimiter=",")
    env = {"JAXBNP_CACHE_DIR": str(cache), "JAXBNP_COMPILATION_CACHE": "1"}
    assert _run_cli(*args, cwd=tmp_path, env=env).returncode == 0
    first = cache_stamps(cache)
    # the runner's sampling loop is among them: the CLI's kernels put no host callback in it
    assert any(name.startswith("jit_advance") for name in first), first
    assert _run_cli(*args, cwd=tmp_path, env=env).returncode == 0
    assert_loaded_from_cache(first, cache_stamps(cache))
    off = tmp_path / "off"
    assert _run_cli(*args, "--no-compile-cache", cwd=tmp_path, env={**env, "JAXBNP_CACHE_DIR": str(off)}).returncode == 0
    assert cache_stamps(off) == {}
    assert _run_cli(*args, cwd=tmp_path, env={"JAXBNP_CACHE_DIR": str(off), "JAXBNP_COMPILATION_CACHE": "0"}).returncode == 0
    assert cache_stamps(off) == {}


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
    # tgMCMC starts from IBHC's 11 clusters here and needs about 25 iterations to reach the 2;
    # split-merge merges the k-means++ start's 20 clusters three proposals at a time (30
    # warm-up iterations are not always enough: 3 to 5 clusters with one random stream)
    # tgMCMC's IBHC start is built before the run: no program of the run calls back to the host
    from jaxbnp.inference.tgmcmc import kernel as tg

    def no_callback(*args, **kwargs):
        raise AssertionError("a tgMCMC program holds a host callback")

    monkeypatch.setattr(tg, "io_callback", no_callback)
    for method, extra in (("splitmerge", ["--split-merge-moves", "3", "--warmup", "100"]),
                          ("mapdp", ["--mapdp-mode", "batched", "--warmup", "5"]),
                          ("tgmcmc", ["--global-moves", "10", "--depth", "1", "--warmup", "30"])):
        assert main(["cluster", "x.csv", "--method", method, *extra, "--chains", "1",
                     "--samples", "10", "--out", method]) == 0
        assert f"method    {method}" in capsys.readouterr().out
        assert json.loads((tmp_path / method / "summary.json").read_text())["clusters_best_draw"] == 2


def test_cluster_subcluster(tmp_path, capsys, monkeypatch):
    """--method subcluster with --launch-sweeps, from one cluster: the two groups share no
    cluster (a posterior property: a few-point cluster may split off); a negative
    --launch-sweeps is refused before anything runs."""
    from jaxbnp.cli import main

    rng = np.random.default_rng(1)
    X = np.r_[rng.normal(-4, 1, (30, 2)), rng.normal(4, 1, (30, 2))]
    np.savetxt(tmp_path / "x.csv", X, delimiter=",")
    monkeypatch.chdir(tmp_path)
    assert main(["cluster", "x.csv", "--method", "subcluster", "--launch-sweeps", "2", "--init", "one",
                 "--chains", "1", "--warmup", "30", "--samples", "10", "--out", "s"]) == 0
    assert ("method    subcluster (all labels at once + sub-cluster splits and merges, 2 launch "
            "sweeps per iteration, one-cluster start)") in capsys.readouterr().out
    labels = np.loadtxt(tmp_path / "s" / "labels.csv", skiprows=1)
    assert set(labels[:30]).isdisjoint(labels[30:])
    summary = json.loads((tmp_path / "s" / "summary.json").read_text())
    assert summary["method"] == "subcluster" and summary["capacity"] == 32
    with pytest.raises(SystemExit, match="--launch-sweeps must be non-negative"):
        main(["cluster", "x.csv", "--method", "subcluster", "--launch-sweeps", "-1", "--out", "s"])


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
    """--method ddt: population MCMC over diffusion trees, the best tree cut where the mean
    silhouette width is largest; --max-points fits a subsample and labels the rest."""
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
    # a subsample of 10 of the 16 points: every point labelled, the two groups apart
    assert main(["cluster", "x.csv", "--method", "ddt", "--chains", "2", "--warmup", "10",
                 "--samples", "20", "--max-points", "10", "--out", "s"]) == 0
    captured = capsys.readouterr()
    assert "fitting a random subsample of 10 of the 16 points" in captured.err
    labels = np.loadtxt(tmp_path / "s" / "labels.csv", skiprows=1)
    assert labels.shape == (16,) and len(np.unique(labels[:8])) == 1 and len(np.unique(labels[8:])) == 1
    assert labels[0] != labels[8]
    assert json.loads((tmp_path / "s" / "summary.json").read_text())["fitted_points"] == 10
    with pytest.raises(SystemExit, match="--resume and --checkpoint-every"):
        main(["cluster", "x.csv", "--method", "ddt", "--resume", "--out", "d"])
    with pytest.raises(SystemExit, match="--max-points"):
        main(["cluster", "x.csv", "--method", "ddt", "--max-points", "2", "--out", "d"])


def test_capacity_grows_when_the_chains_need_more_slots(tmp_path, capsys, monkeypatch):
    """The CLI's kernels leave the overflow flag in the state (no host callback): a run that
    filled its 2 slots is discarded and repeated with twice the capacity."""
    from jaxbnp.cli import main

    rng = np.random.default_rng(4)
    X = np.r_[rng.normal(-6, 0.5, (10, 2)), rng.normal(0, 0.5, (10, 2)), rng.normal(6, 0.5, (10, 2))]
    # centres (-6, -6), (0, 6), (6, 0), not on one line (on the line x = y, the default prior's
    # scale matrix, from the data's covariance, is nearly singular across it)
    X[10:20, 1] += 6.0
    X[20:, 1] -= 6.0
    np.savetxt(tmp_path / "x.csv", X, delimiter=",")
    monkeypatch.chdir(tmp_path)
    assert main(["cluster", "x.csv", "--method", "gibbs", "--init", "one", "--capacity", "2", "--chains", "1",
                 "--warmup", "20", "--samples", "10", "--out", "c"]) == 0
    assert "restarting with capacity=4" in capsys.readouterr().err
    summary = json.loads((tmp_path / "c" / "summary.json").read_text())
    assert summary["capacity"] >= 4 and summary["clusters_best_draw"] == 3


def test_helpers_start_silhouette_nearest_labels():
    from sklearn.metrics import silhouette_score

    from jaxbnp import cli

    rng = np.random.default_rng(5)
    X = np.r_[rng.normal(-5, 1, (20, 3)), rng.normal(5, 1, (25, 3)), rng.normal([5, -5, 0], 1, (15, 3))]
    labels = np.repeat([0, 1, 2], [20, 25, 15])
    args = cli.build_parser().parse_args(["cluster", "--method", "gibbs", "--chains", "2", "--init-clusters", "3"])
    cli._apply_method_defaults(args)  # as main() does: gibbs starts from k-means++
    start = cli._initial_partition(args, X)["z"]  # one k-means++ start per chain
    assert start.shape == (2, 60) and start.dtype == np.int32
    for z in start:
        assert sorted(np.bincount(z, minlength=3)) == [15, 20, 25]
    args.init = "one"
    assert cli._initial_partition(args, X) is None
    # the DDT's cut: the K (2..30) of largest scikit-learn silhouette on X
    import jax

    from jaxbnp.models.ddt import cut_tree, sample_tree

    tree = sample_tree(jax.random.key(3), 1.0, len(X))
    scores = {k: silhouette_score(X, np.asarray(cut_tree(tree, num_clusters=k))) for k in range(2, 31)}
    best = max(scores, key=scores.get)
    np.testing.assert_array_equal(cli._cut_by_silhouette(tree, X),
                                  np.asarray(cut_tree(tree, num_clusters=best)))
    idx = np.arange(0, 60, 3)
    out = cli._extend_labels(X, idx, labels[idx])
    np.testing.assert_array_equal(out, labels)  # well separated: each point's nearest fitted one agrees
    assert cli._extend_labels(X, None, labels) is labels


def test_default_family_is_the_estimators():
    """``--family auto`` (the partition methods' default) is DirichletProcessMixture()'s
    default prior on the standardised columns: diagonal with fewer than ``D (D + 1) / 2``
    points, full above; ``--family normal-wishart`` is full whatever the number of points."""
    import jaxbnp as bnp
    from jaxbnp import _defaults, cli

    args = cli.build_parser().parse_args(["cluster"])
    cli._apply_method_defaults(args)
    assert args.family == "auto"
    Z = np.random.default_rng(0).normal(size=(20, 6))  # 21 covariance entries
    for data, kind, name in ((Z, bnp.NormalGamma, "auto (normal-gamma, diagonal)"),
                             (Z[:, :5], bnp.NormalWishart, "auto (normal-wishart)")):
        family = cli._make_family("auto", data)
        assert type(family) is kind is type(_defaults.default_family(data))
        assert cli._family_name("auto", family) == name
    assert type(cli._make_family("normal-wishart", Z)) is bnp.NormalWishart
    assert cli._family_name("normal-gamma", cli._make_family("normal-gamma", Z)) == "normal-gamma"


def test_heartbeat_prints_lines_from_a_thread():
    import io
    import time

    from jaxbnp._progress import Heartbeat

    stream = io.StringIO()
    with Heartbeat("work", 10, every_s=0.05, stream=stream) as hb:
        time.sleep(0.2)
        hb.tick(4)
        time.sleep(0.2)
    lines = stream.getvalue().splitlines()
    assert lines[0] == "jaxbnp: work" and lines[-1].startswith("jaxbnp: work done after")
    assert any("elapsed" in line for line in lines) and any("4/10 iterations (40%)" in line for line in lines)


def test_tgmcmc_start_is_the_kernels_ibhc_partition():
    """The CLI starts tgMCMC from ``TreeGuidedMCMC.initial_params`` (built on the host, so the
    sampling program has no host callback and JAX's cache keeps it): with ``init="ibhc"``
    that is IBHC's partition (``ibhc.ibhc`` in row order) in first-appearance order, the same
    for every chain, and the kernel's eager ``init`` starts from it."""
    import functools

    import jax

    import jaxbnp as bnp
    from jaxbnp.inference.partition.clusters import compact_labels
    from jaxbnp.inference.tgmcmc.ibhc import ibhc

    rng = np.random.default_rng(6)
    X = np.r_[rng.normal(-4, 0.7, (15, 2)), rng.normal(0, 0.7, (15, 2)), rng.normal(4, 0.7, (15, 2))]
    family = bnp.NormalWishart.from_data(X)
    model = functools.partial(bnp.mixture_model, measure=bnp.DP(1.0), family=family)
    kernel = bnp.TreeGuidedMCMC(model, init="ibhc", capacity=45)
    keys = jax.random.split(jax.random.key(0), 2)
    start = kernel.initial_params(keys, None, (X,))["z"]
    expected = compact_labels(np.asarray(ibhc(X, bnp.DP(1.0), family).labels))
    np.testing.assert_array_equal(start, np.stack([expected, expected]))
    assert len(np.unique(expected)) >= 2
    state = kernel.init(keys[0], 0, None, (X,), {})
    np.testing.assert_array_equal(np.asarray(state.z["z"]), expected)

def test_cluster_a_likelihood_with_its_parameters(tmp_path, capsys, monkeypatch):
    """--method auxiliary --likelihood poisson on a CSV of counts, in-process: the draws are
    DirichletProcessMixture's (the same settings), the log joint is of X; --likelihood with a
    conjugate method and --family with a plate method are refused before anything runs."""
    from jaxbnp.cli import main

    rng = np.random.default_rng(2)
    X = rng.poisson(np.repeat([[3.0, 1.0], [30.0, 12.0]], 30, axis=0))
    np.savetxt(tmp_path / "c.csv", X, delimiter=",", fmt="%d")
    monkeypatch.chdir(tmp_path)
    assert main(["cluster", "c.csv", "--method", "auxiliary", "--likelihood", "poisson", "--chains", "1",
                 "--warmup", "20", "--samples", "10", "--out", "a"]) == 0
    assert "poisson likelihood, 32 slots" in capsys.readouterr().out
    labels = np.loadtxt(tmp_path / "a" / "labels.csv", skiprows=1)
    assert set(labels[:30]).isdisjoint(labels[30:])
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert summary["likelihood"] == "poisson" and summary["capacity"] == 32

    import jaxbnp as bnp

    est = bnp.DirichletProcessMixture(method="auxiliary", likelihood="poisson", num_chains=1,
                                      num_warmup=20, num_samples=10, capacity=32, random_state=0,
                                      init="one", method_options={"num_split_merge": 10}).fit(
        X.astype(np.float32))
    assert summary["log_joint_best"] == pytest.approx(float(est.posterior_samples_["log_joint"].max()),
                                                      rel=1e-6)
    for argv, match in ((["--likelihood", "poisson"], "--likelihood applies"),
                        (["--method", "slice", "--family", "normal-gamma"], "--family applies")):
        with pytest.raises(SystemExit, match=match):
            main(["cluster", "c.csv", *argv, "--out", "b"])
