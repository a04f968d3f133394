"""shape, size and range: run-time dims as tensors, TensorFlow's range, and every
error they raise (values on every device are checked by the op table,
op_cases/array_shape.py)."""

from __future__ import annotations

import numpy as np
import pytest

import cellgraph as cg

from .errors_helpers import ph, raises

pytestmark = pytest.mark.usefixtures("fresh_graph")


def _run(fetches: object, feeds: dict | None = None) -> object:
    return cg.Session(cg.get_default_graph()).run(fetches, feeds or {})


def test_shape_and_size_give_the_dims_fed_at_run_time() -> None:
    x = ph(None, 3, None)
    s, n = cg.shape(x), cg.size(x, out_type="int64")
    assert (s.shape, s.dtype, n.shape, n.dtype) == ((3,), "int32", (), "int64")
    got_s, got_n = _run([s, n], {x: np.zeros((4, 3, 2), np.float32)})
    np.testing.assert_array_equal(got_s, [4, 3, 2])
    assert int(got_n) == 24


def test_range_of_constants_has_a_known_length_and_follows_tensorflow() -> None:
    cases = {
        cg.range(5): np.arange(5),
        cg.range(2, 11, 3): np.arange(2, 11, 3),
        cg.range(5, -4, -2): np.arange(5, -4, -2),
        cg.range(0.0, 1.0, 0.25): np.arange(0.0, 1.0, 0.25),
        cg.range(3, 3): np.zeros(0),
    }
    for r, want in cases.items():
        assert r.shape == want.shape
        np.testing.assert_array_equal(_run(r), want)
    assert cg.range(4).dtype == "int32" and cg.range(1.5).dtype == "float32"
    assert cg.range(0, 4, dtype="float64").dtype == "float64"


def test_range_up_to_a_run_time_size_counts_each_row() -> None:
    x = ph(None, 2)
    r = cg.range(cg.size(x) // 2)
    assert r.shape == (None,)
    np.testing.assert_array_equal(_run(r, {x: np.zeros((3, 2), np.float32)}), [0, 1, 2])


def test_range_errors_when_building() -> None:
    with raises(cg.ShapeError, "Range 'range' (test_array_more_shape.py"):
        cg.range(0, 5, 0)
    with raises(cg.ShapeError, "range from 0 to 5: delta must not be 0"):
        cg.range(0, 5, 0)
    with raises(cg.ShapeError, "range from 5 to 0 by 1: start must be <= limit when delta is positive"):
        cg.range(5, 0)
    with raises(cg.ShapeError, "range from 0 to 5 by -1: start must be >= limit when delta is negative"):
        cg.range(0, 5, -1)
    with raises(cg.DTypeError, "start, limit and delta have different dtypes: int32, int64, int32"):
        cg.range(ph(dtype="int32", name="a"), ph(dtype="int64", name="b"), ph(dtype="int32", name="c"))
    with raises(cg.DTypeError, "start, limit and delta must be ints or floats, got bool"):
        cg.range(ph(dtype="bool", name="a"), ph(dtype="bool", name="b"), ph(dtype="bool", name="c"))
    with raises(cg.ShapeError, "limit must be a scalar, got shape (2,)"):
        cg.range(0, ph(2, dtype="int32", name="n"))
    with raises(cg.DTypeError, "range: cannot use 2.5 as an int32 value: it is not a whole number"):
        cg.range(0, 2.5, dtype="int32")


def test_range_bad_operands_at_run_time_fail_at_the_node() -> None:
    d = ph(dtype="int32", name="d")
    r = cg.range(0, 4, d, name="steps")
    with pytest.raises(cg.ExecutionError, match=r"^Range 'steps' .* failed while running: .*delta must not be 0"):
        _run(r, {d: np.int32(0)})


def test_shape_and_size_out_type_must_be_an_int() -> None:
    with raises(cg.DTypeError, "shape: out_type must be int32 or int64, got float32"):
        cg.shape(ph(2), out_type="float32")
    with raises(cg.DTypeError, "size: out_type must be int32 or int64, got bool"):
        cg.size(ph(2), out_type="bool")
