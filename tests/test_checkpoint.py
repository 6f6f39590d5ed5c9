"""Checkpoints: a resumed run gives the same draws as an uninterrupted one; an interrupted run
keeps what it had."""

from __future__ import annotations

import functools

import jax
import numpy as np
import numpyro
import pytest
from numpyro.infer import MCMC

import jaxbnp as bnp
from jaxbnp import diagnostics, plot
from jaxbnp.checkpoint import CheckpointedRun, load_checkpoint, resume, run_with_checkpoints, save_checkpoint

NG = bnp.NormalGamma(m0=0.0, k0=0.2, a0=2.0, b0=1.0)
X = np.r_[np.linspace(-3.0, -2.0, 6), np.linspace(2.0, 3.0, 6)][:, None]
EXTRA = ("log_joint", "num_clusters")
KEY = jax.random.key(7)


def model(X):
    z = numpyro.sample("z", bnp.Partition(bnp.DP(1.0), X.shape[0]))
    numpyro.sample("X", bnp.ConjugateMixture(NG, z), obs=X)


def _mcmc(num_chains=1, num_samples=6):
    kernel = bnp.CollapsedGibbs(model, init_strategy="prior")
    return MCMC(kernel, num_warmup=3, num_samples=num_samples, num_chains=num_chains,
                chain_method="vectorized", progress_bar=False)


@pytest.fixture(scope="module")
def reference():
    """The uninterrupted run: 2 chains, 3 warm-up iterations and 6 draws each."""
    mcmc = _mcmc(2)
    mcmc.run(KEY, X, extra_fields=EXTRA)
    return mcmc


def _assert_same_draws(run, reference, chains=slice(None), upto=None):
    z = np.asarray(reference.get_samples(group_by_chain=True)["z"])[chains]
    extra = reference.get_extra_fields(group_by_chain=True)
    sl = slice(None) if upto is None else slice(0, upto)
    np.testing.assert_array_equal(run.get_samples(group_by_chain=True)["z"], z[:, sl])
    for field in EXTRA:
        np.testing.assert_array_equal(run.get_extra_fields(group_by_chain=True)[field],
                                      np.asarray(extra[field])[chains][:, sl])


class Interrupt(Exception):
    pass


def test_interrupted_run_keeps_its_draws_and_resumes_to_the_uninterrupted_draws(tmp_path, reference):
    # one chain with the key of the reference's first chain draws that chain
    key = jax.random.split(KEY, 2)[0]
    path = tmp_path / "run.ckpt"
    seen = []

    def stop_after_first_segment(run):
        seen.append(run.num_samples)
        if run.num_samples == 3:
            raise Interrupt

    with pytest.raises(Interrupt):
        run_with_checkpoints(_mcmc(), key, X, path=path, every=3, extra_fields=EXTRA,
                             callback=stop_after_first_segment)
    assert seen == [0, 3]  # a checkpoint after warm-up, then after each segment
    saved = load_checkpoint(path)
    assert saved.num_samples == 3 and saved.num_samples_total == 6 and not saved.complete
    _assert_same_draws(saved, reference, chains=slice(0, 1), upto=3)
    assert saved.partition_site == "z"
    # a new MCMC object and kernel, as in a new process
    resumed = resume(_mcmc(), path, X)
    assert resumed.complete and resumed.num_samples == 6
    _assert_same_draws(resumed, reference, chains=slice(0, 1))
    _assert_same_draws(load_checkpoint(path), reference, chains=slice(0, 1))  # the file too
    assert diagnostics.summary(resumed)["num_draws"] == 6
    with pytest.raises(ValueError, match="complete"):
        resume(_mcmc(), path, X)


def test_vectorized_chains_save_then_resume_equals_uninterrupted(tmp_path, reference):
    first = _mcmc(2, num_samples=3)
    first.run(KEY, X, extra_fields=EXTRA)
    path = save_checkpoint(tmp_path / "chains.ckpt", first)
    resumed = resume(_mcmc(2), path, X, num_samples=3)
    assert resumed.get_samples()["z"].shape == (12, 12)  # chains pooled: 2 x 6 draws
    _assert_same_draws(resumed, reference)
    assert not np.array_equal(resumed.samples["z"][0], resumed.samples["z"][1])


def test_diagnostics_arviz_and_plots_of_an_mcmc_run(reference):
    import matplotlib.pyplot as plt

    extra = reference.get_extra_fields(group_by_chain=True)
    z = np.asarray(reference.get_samples(group_by_chain=True)["z"])
    s = diagnostics.summary(reference)
    assert s["num_chains"] == 2 and s["num_draws"] == 6
    assert s["log_joint"]["r_hat"] == pytest.approx(diagnostics.split_rhat(extra["log_joint"]))
    assert s["num_clusters"]["mean"] == pytest.approx(np.mean(extra["num_clusters"]))
    idata = diagnostics.to_arviz(reference)
    import arviz  # after to_arviz, which imports it without its once-a-day FutureWarning
    assert idata.posterior["z"].dims == ("chain", "draw", "point")
    np.testing.assert_array_equal(idata.posterior["z"].values, z)
    np.testing.assert_array_equal(idata.sample_stats["num_clusters"].values, extra["num_clusters"])
    rhat = arviz.rhat(idata.sample_stats, var_names=["log_joint"], method="split")["log_joint"].item()
    assert rhat == pytest.approx(diagnostics.split_rhat(extra["log_joint"]), rel=1e-12)
    axes = plot.plot_trace(reference)
    np.testing.assert_array_equal(axes[1].lines[1].get_ydata(), extra["num_clusters"][1])
    plt.close("all")


def test_checkpoint_errors(tmp_path):
    run = CheckpointedRun({"z": np.zeros((1, 2, 3), np.int32)}, {}, None, 2, 2, 0, 1, 1, ())
    path = save_checkpoint(tmp_path / "c.ckpt", run)
    assert load_checkpoint(path).num_samples == 2
    with pytest.raises(ValueError, match="num_chains=2"):
        resume(_mcmc(2), path, X, num_samples=2)
    with pytest.raises(ValueError, match="complete"):
        resume(_mcmc(), path, X)
    run.x64 = not run.x64
    with pytest.raises(ValueError, match="jax_enable_x64"):
        resume(_mcmc(), run, X, num_samples=2)
    with pytest.raises(ValueError, match="every"):
        run_with_checkpoints(_mcmc(), KEY, X, path=None, every=0)
    thinned = MCMC(bnp.CollapsedGibbs(model), num_warmup=1, num_samples=4, thinning=2, progress_bar=False)
    with pytest.raises(ValueError, match="multiple of the MCMC's thinning"):
        run_with_checkpoints(thinned, KEY, X, path=None, every=3)
    with pytest.raises(ValueError, match="has not run"):
        save_checkpoint(tmp_path / "d.ckpt", _mcmc())
    (tmp_path / "bad.ckpt").write_bytes(b"\x80\x04N.")  # a pickle of None
    with pytest.raises(ValueError, match="not a jaxbnp checkpoint"):
        load_checkpoint(tmp_path / "bad.ckpt")
    with pytest.raises(FileNotFoundError):
        load_checkpoint(tmp_path / "missing.ckpt")


# ---------------------------------------------------------------- the runner's checkpoints
def _collect(state):
    return {"z": state.z["z"], "log_joint": state.log_joint, "num_clusters": state.num_clusters}


def _run(**kwargs):
    from jaxbnp.inference.runner import run

    options = dict(num_warmup=3, num_samples=6, num_chains=2, collect=_collect, capacity=12,
                   extra_fields=EXTRA)
    options.update(kwargs)
    make = lambda capacity: bnp.CollapsedGibbs(model, init_strategy="prior", capacity=capacity)  # noqa: E731
    return run(make, KEY, (X,), **options)


def test_runner_gives_mcmcs_draws_parallel_or_vectorized(reference):
    """runner.run draws what numpyro's MCMC draws, with chains vectorized or one per device."""
    assert jax.local_device_count() >= 2  # tests/conftest.py: 4 host devices
    for chain_method in ("vectorized", "parallel", "threads", "auto"):
        result = _run(chain_method=chain_method)
        np.testing.assert_array_equal(result.samples["z"], reference.get_samples(group_by_chain=True)["z"])
        for field in EXTRA:
            np.testing.assert_array_equal(result.samples[field],
                                          reference.get_extra_fields(group_by_chain=True)[field])


@pytest.mark.parametrize("cores", [2, 3])
def test_runner_threads_give_the_vectorized_draws(monkeypatch, cores):
    """chain_method="threads": 3 chains cut into groups (2 cores: a group of 2 and one of 1
    padded to 2; 3 cores: three single chains) give the vectorized run's draws and state."""
    from jaxbnp.inference import runner

    monkeypatch.setattr(runner, "cpu_cores", lambda: cores)
    assert runner.resolve_chain_method("auto", 3) == "parallel"  # 4 host devices in the suite
    assert runner.resolve_chain_method("threads", 3) == "threads"
    ref = _run(num_chains=3, chain_method="vectorized")
    got = _run(num_chains=3, chain_method="threads")
    assert got.samples["z"].shape == (3, 6, X.shape[0])
    for name in ref.samples:
        np.testing.assert_array_equal(got.samples[name], ref.samples[name], err_msg=name)
    for a, b in zip(jax.tree.leaves(got.last_state), jax.tree.leaves(ref.last_state)):
        if jax.dtypes.issubdtype(a.dtype, jax.dtypes.prng_key):
            a, b = jax.random.key_data(a), jax.random.key_data(b)
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_threads_run_programs_with_library_kernels_one_group_after_another(monkeypatch):
    """jaxlib's CPU library kernels (LAPACK's Cholesky and triangular solves, custom calls)
    wait for pieces of their batch inside XLA's intra-op pool: two groups running such a
    program side by side on a two-thread pool hung for ever (``DirichletProcessMixture``
    with two chains and a ``NormalWishart`` family). The runner reads the compiled program
    and runs those groups one after another (the same draws); programs without custom
    calls still run side by side. The library's own families call none (``jaxbnp._math``
    writes Cholesky factors and triangular solves out): ``NormalWishart`` with LAPACK's
    Cholesky put back (a user's family may call LAPACK) runs one group after another, as it
    is side by side."""
    from jaxbnp import _math
    from jaxbnp.inference import runner
    from jaxbnp.models.distributions import mixture_model

    run = runner.run
    assert runner.calls_library_kernels(jax.jit(jax.numpy.linalg.cholesky).lower(np.eye(3)).compile())
    assert not runner.calls_library_kernels(jax.jit(jax.numpy.sin).lower(np.eye(3)).compile())
    monkeypatch.setattr(runner, "cpu_cores", lambda: 2)
    Y = np.c_[X, X[::-1] ** 2]
    seen = {}
    for name, family in (("NormalWishart+LAPACK", bnp.NormalWishart.from_data(Y)),
                         ("NormalWishart", bnp.NormalWishart.from_data(Y)), ("NormalGamma", bnp.NormalGamma())):
        model = functools.partial(mixture_model, measure=bnp.DP(1.0), family=family)
        make = lambda capacity: bnp.CollapsedGibbs(model, capacity=capacity)  # noqa: E731
        runner._COMPILED.clear()
        with monkeypatch.context() as patch:
            if name.endswith("LAPACK"):
                patch.setattr(_math, "cholesky", jax.numpy.linalg.cholesky)
            got = run(make, KEY, (Y,), num_warmup=2, num_samples=3, num_chains=2, collect=_collect,
                      chain_method="threads")
            seen[name] = {side_by_side for _, side_by_side in runner._COMPILED.values()}
            ref = run(make, KEY, (Y,), num_warmup=2, num_samples=3, num_chains=2, collect=_collect,
                      chain_method="vectorized")
        np.testing.assert_array_equal(got.samples["z"], ref.samples["z"])
    # with LAPACK, the sweep's Cholesky factors are custom calls: not side by side
    assert False in seen["NormalWishart+LAPACK"], seen
    assert seen["NormalWishart"] == {True} and seen["NormalGamma"] == {True}, seen


def test_runner_checkpoints_then_resumes_to_the_uninterrupted_draws(tmp_path, reference):
    path = tmp_path / "runner.ckpt"
    first = _run(num_samples=4, checkpoint=path, checkpoint_every=2, chain_method="parallel")
    saved = load_checkpoint(path)
    assert saved.num_samples == 4 and saved.complete and saved.extra_field_names == EXTRA
    np.testing.assert_array_equal(saved.samples["z"], first.samples["z"])
    resumed = _run(num_samples=2, checkpoint=path, resume=True)  # vectorized, from the file
    _assert_same_draws(load_checkpoint(path), reference)
    np.testing.assert_array_equal(resumed.samples["z"], reference.get_samples(group_by_chain=True)["z"])
    # a checkpointed MCMC run and a runner's file are one format: MCMC continues it too
    more = resume(_mcmc(2), path, X, num_samples=2)
    assert more.num_samples == 8
    with pytest.raises(ValueError, match="chain"):
        _run(num_chains=1, num_samples=2, checkpoint=path, resume=True)
