"""The same key gives the same draws as the code did before it was reshaped.

``tests/fixtures/draws.npz`` holds draws of every public kernel and fitting
function, made by ``tests/fixtures/draws.py`` on the code before the layout by
capability (the commit is stored in the file). This recomputes them with the
code as it is now: labels, paths and trees exactly, the floats to 1e-9.
"""

import numpy as np
import pytest

from tests.fixtures.draws import PATH, draws


@pytest.fixture(scope="module")
def now():
    return draws()


def test_same_draws_as_before_the_refactor(now):
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
