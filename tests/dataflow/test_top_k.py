"""``cg.top_k``: its refusals' words, the run-time check of an unknown last axis,
and where the gradient of tied values goes."""

from __future__ import annotations

import numpy as np
import pytest

import cellgraph as cg


def test_top_k_refusals_name_what_is_wrong() -> None:
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((2, 3), name="x")
        before = len(g.nodes)
        with pytest.raises(cg.ShapeError, match=r"TopK 'top_k' .*k = 4 is outside \[0, 3\], the last axis of \(2, 3\)"):
            cg.top_k(x, 4)
        with pytest.raises(cg.ShapeError, match=r"k = -1 is outside \[0, 3\]"):
            cg.top_k(x, -1)
        with pytest.raises(cg.ShapeError, match="top_k: k must be an int, got 1.5"):
            cg.top_k(x, 1.5)  # type: ignore[arg-type]
        with pytest.raises(cg.ShapeError, match="top_k: sorted=False is not supported; the entries always come"):
            cg.top_k(x, 1, sorted=False)
        with pytest.raises(cg.ShapeError, match=r"needs a tensor of rank >= 1, got \(\)"):
            cg.top_k(cg.placeholder((), name="s"), 0)
        with pytest.raises(cg.DTypeError, match="expects a float or int tensor, got bool"):
            cg.top_k(cg.placeholder((2,), "bool", name="b"), 1)
        assert len(g.nodes) == before + 2  # the test's own placeholders s and b


def test_k_beyond_an_unknown_last_axis_fails_at_run_time_naming_the_node() -> None:
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((2, None), name="x")
        values, _ = cg.top_k(x, 3)
    sess = cg.Session(g)
    np.testing.assert_allclose(
        sess.run(values, {x: np.arange(8, dtype=np.float32).reshape(2, 4)}), [[3, 2, 1], [7, 6, 5]]
    )
    with pytest.raises(cg.ExecutionError, match=r"TopK 'top_k' .*k = 3 is more than the 2 entries of the last axis"):
        sess.run(values, {x: np.ones((2, 2), np.float32)})


def test_gradient_goes_to_the_picked_position_of_a_tie() -> None:
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((5,), "float64", name="x")
        values, indices = cg.top_k(x, 2)
        (dx,) = cg.gradients(cg.reduce_sum(values * cg.constant(np.array([10.0, 1.0]), dtype="float64")), [x])
    got_indices, got = cg.Session(g).run([indices, dx], {x: np.array([1.0, 3.0, 2.0, 3.0, 3.0])})
    np.testing.assert_array_equal(got_indices, [1, 3])  # ties: the lower index first
    np.testing.assert_allclose(got, [0.0, 10.0, 0.0, 1.0, 0.0])
