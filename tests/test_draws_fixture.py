"""The same key gives the same draws as the code did before it was reshaped.

``tests/fixtures/draws.npz`` holds draws of every public kernel and fitting
function, made by ``tests/fixtures/draws.py`` on the code before the layout by
capability (the commit is stored in the file). This recomputes them with the
code as it is now: labels, paths and trees exactly, the floats to 1e-9.

One deliberate change since: BHMC's Gamma draws now take their uniforms from one
``jax.random.uniform`` call (``jaxbnp._random``, issue #20's speed work), so the
``fit_bhmc/*`` entries were re-made then. The collapsed Gibbs sweep now draws each
point's cluster by inversion from one uniform instead of the argmax of Gumbel-perturbed
logits (issue #21: the random numbers no longer depend on the capacity, and a sweep
draws ``n`` of them, not ``n × (capacity + 1)``), so every entry whose kernel runs a
Gibbs sweep (``gibbs_*``, ``sm_dp``, ``sm_py_two_sweeps``, ``tg_*``, ``dpm_gibbs``) was
re-made then; the exact-posterior tests check the new sweep. ``mapdp/labels`` was re-made
when ``MAPDP()``'s k-means++ start began with merge and split rounds (the same partition,
its clusters numbered in another order). The ``fit_bhmc/*`` entries were re-made again
when BHMC's path step became an exact Gibbs draw by default (issue #22; the paper's MH
step is ``path_update="mh"``), and again when every BHMC sweep gained the subtree moves
(``regraft=True``) and ``fit_bhmc``'s node capacity began at 64 slots and grew. The
``ddt/*``, ``population/*`` and ``fit_ddt/*`` entries were re-made when the diffusion-tree
walks began drawing their uniforms 32 steps at a time from a key (issue #23: a batch of
``n`` rows per move made memory grow as n² per sweep), which also changed the prior draws of
``sample_tree``. ``fit_ddt`` now starts from the Ward tree by default; its entries are
computed with ``init="prior"``, the start they were made with. ``dpm_gibbs`` is computed with
``family=NormalWishart.from_data(X)``, the estimator's default when it was made (the default
now standardises the columns first). Every other entry is the original.

The draws are computed in a fresh subprocess with the suite's XLA flags and
float64 (what ``draws.py`` itself sets), so that they do not depend on what the
test worker compiled before, and so that a crash inside XLA's compiler fails
this test with its message instead of taking the worker down.
"""

import os
import subprocess
import sys

import numpy as np

from tests.conftest import TEST_XLA_FLAGS
from tests.fixtures.draws import PATH

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_SCRIPT = """
import sys
import jax
jax.config.update("jax_enable_x64", True)
import numpy as np
from tests.fixtures.draws import draws
np.savez(sys.argv[1], **draws())
"""


def test_same_draws_as_before_the_refactor(tmp_path):
    out = tmp_path / "now.npz"
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4 " + TEST_XLA_FLAGS,
               JAXBNP_COMPILATION_CACHE="0", JAXBNP_PROGRESS="0",
               PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("JAX_ENABLE_X64", None)
    proc = subprocess.run([sys.executable, "-c", _SCRIPT, str(out)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    now = dict(np.load(out))
    stored = dict(np.load(PATH))
    stored.pop("commit")
    assert sorted(now) == sorted(stored)
    for name, old in stored.items():
        new = now[name]
        assert new.shape == old.shape, name
        if np.issubdtype(old.dtype, np.floating):
            np.testing.assert_allclose(new, old, rtol=1e-9, atol=1e-12, err_msg=name)
        else:
            np.testing.assert_array_equal(new, old, err_msg=name)
