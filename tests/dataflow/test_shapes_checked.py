"""A kernel's run-time shape check remembers the shapes that passed: it must still refuse new ones after them."""

from __future__ import annotations

import numpy as np
import pytest

import cellgraph as cg


def test_a_bias_of_other_channels_after_good_runs_still_fails_the_run() -> None:
    """The check compares the shapes with the last that passed; other shapes are checked again, every time."""
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((None, None), "float64", name="x")
        b = cg.placeholder((None,), "float64", name="b")
        y = cg.bias_add(x, b)
    sess = cg.Session(g)
    for _ in range(3):  # the same good shapes, then another good batch size
        np.testing.assert_array_equal(sess.run(y, {x: np.ones((2, 3)), b: np.arange(3.0)}), [[1, 2, 3]] * 2)
    np.testing.assert_array_equal(sess.run(y, {x: np.ones((4, 3)), b: np.arange(3.0)}), [[1, 2, 3]] * 4)
    for _ in range(2):  # refused each time, not only the first
        with pytest.raises(cg.ExecutionError) as err:
            sess.run(y, {x: np.ones((2, 3)), b: np.ones(1)})
        assert "bias has 1 elements but the input's last axis has 3: (2, 3) + (1,)" in str(err.value)
    # A good run after the refusals is computed as before.
    np.testing.assert_array_equal(sess.run(y, {x: np.ones((2, 3)), b: np.arange(3.0)}), [[1, 2, 3]] * 2)
