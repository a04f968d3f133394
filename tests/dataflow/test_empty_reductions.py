"""Reductions over an empty axis (issue 13): what an empty set reduces to.

max of nothing is the identity of max (-inf, the int's min, False), sum 0 and
mean NaN, as TensorFlow, ONNX and NumPy define them; argmax of nothing fails,
naming the node. The kernels used to start from the first element of the
reduced axis, which an empty axis does not have: max read whatever memory lay
there (a different value every run) and argmax said 0.
"""

from __future__ import annotations

import numpy as np
import pytest

import cellgraph as cg
from cellgraph.dataflow.opdef import KernelContext
from cellgraph.dataflow.variables import VariableStore

from .errors_helpers import raises

FUSE = pytest.mark.parametrize("fuse", [True, False], ids=["fused", "unfused"])
LOWEST = {"float32": -np.inf, "float64": -np.inf, "int32": np.iinfo(np.int32).min, "int64": np.iinfo(np.int64).min}


def _run(reduce: object, dtype: str, fuse: bool, runs: int = 3, **kwargs: object) -> list[np.ndarray]:
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((2, None, 4), dtype, name="x")
        y = reduce(x, **kwargs)  # type: ignore[operator]
    sess = cg.Session(g, fuse=fuse)
    return [sess.run(y, {x: np.zeros((2, 0, 4), dtype)}) for _ in range(runs)]


@FUSE
@pytest.mark.parametrize("dtype", sorted(LOWEST))
def test_reduce_max_over_an_empty_axis_is_the_lowest_value_every_run(dtype: str, fuse: bool) -> None:
    values = _run(cg.reduce_max, dtype, fuse, axis=1, keepdims=True)
    for value in values:
        assert value.shape == (2, 1, 4) and value.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(value, np.full((2, 1, 4), LOWEST[dtype], dtype))


@FUSE
def test_reduce_max_of_an_empty_bool_axis_is_false(fuse: bool) -> None:
    for value in _run(cg.reduce_max, "bool", fuse, axis=1):
        assert value.shape == (2, 4) and value.dtype == np.bool_
        assert not value.any()


@FUSE
def test_reduce_sum_over_an_empty_axis_is_zero(fuse: bool) -> None:
    value = _run(cg.reduce_sum, "float32", fuse, runs=1, axis=1, keepdims=True)[0]
    np.testing.assert_array_equal(value, np.zeros((2, 1, 4), np.float32))
    total = _run(cg.reduce_sum, "int32", fuse, runs=1)[0]
    assert total.shape == () and total == 0


@FUSE
def test_reduce_mean_over_an_empty_axis_is_nan(fuse: bool) -> None:
    value = _run(cg.reduce_mean, "float32", fuse, runs=1, axis=1)[0]
    assert value.shape == (2, 4) and value.dtype == np.float32
    assert np.isnan(value).all()


@FUSE
def test_argmax_over_an_empty_axis_fails_naming_the_node(fuse: bool) -> None:
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((2, None, 4), "float32", name="x")
        y = cg.argmax(x, axis=1, name="best")
    sess = cg.Session(g, fuse=fuse)
    with pytest.raises(
        cg.ExecutionError, match=r"^ArgMax 'best' \(test_empty_reductions\.py:\d+\) failed while running"
    ):
        sess.run(y, {x: np.zeros((2, 0, 4), np.float32)})
    with raises(
        cg.ExecutionError, "ValueError: argmax over an empty axis: axis 1 of (2, 0, 4) has no elements to pick from"
    ):
        sess.run(y, {x: np.zeros((2, 0, 4), np.float32)})
    # An empty kept axis is no error: there is nothing to pick for.
    assert sess.run(y, {x: np.zeros((2, 3, 4), np.float32)}).shape == (2, 4)


def test_the_references_follow_the_same_definitions() -> None:
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((2, 0, 4), "float32", name="x")
        nodes = {f: f(x, axis=1).node for f in (cg.reduce_max, cg.reduce_sum, cg.reduce_mean, cg.argmax)}
    empty = np.zeros((2, 0, 4), np.float32)
    ref = {f: node.opdef.reference for f, node in nodes.items()}
    np.testing.assert_array_equal(ref[cg.reduce_max](nodes[cg.reduce_max].attrs, empty), np.full((2, 4), -np.inf))
    np.testing.assert_array_equal(ref[cg.reduce_sum](nodes[cg.reduce_sum].attrs, empty), np.zeros((2, 4)))
    assert np.isnan(ref[cg.reduce_mean](nodes[cg.reduce_mean].attrs, empty)).all()
    with raises(ValueError, "argmax over an empty axis: axis 1 of (2, 0, 4) has no elements to pick from"):
        ref[cg.argmax](nodes[cg.argmax].attrs, empty)


def test_a_nan_still_wins_a_max_and_a_full_max_is_unchanged() -> None:
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((2, 3), "float32", name="x")
        y = cg.reduce_max(x, axis=1)
    value = cg.Session(g).run(y, {x: np.array([[np.nan, 1, 2], [-5, -7, -6]], np.float32)})
    np.testing.assert_array_equal(value, [np.nan, -5])


@FUSE
def test_gradients_through_empty_reductions_are_empty(fuse: bool) -> None:
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((2, None, 4), "float32", name="x")
        loss = cg.reduce_sum(cg.reduce_max(x, axis=1) + cg.reduce_mean(x, axis=1) + cg.reduce_sum(x, axis=1))
        (dx,) = cg.gradients(loss, [x])
    value = cg.Session(g, fuse=fuse).run(dx, {x: np.zeros((2, 0, 4), np.float32)})
    assert value.shape == (2, 0, 4) and value.dtype == np.float32


# ------------------------------------------------------------- on the GPU
def _cuda_reduce(reduce: object, x: np.ndarray, **kwargs: object) -> np.ndarray:
    from numba import cuda

    g = cg.Graph()
    with g.as_default():
        node = reduce(cg.placeholder(x.shape, x.dtype.name, name="x"), **kwargs).node  # type: ignore[operator]
    kernel = node.opdef.kernels["cuda"](node, KernelContext(VariableStore()))
    return kernel(cuda.to_device(x)).copy_to_host()


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [*sorted(LOWEST), "bool"])
def test_cuda_reduce_max_over_an_empty_axis(dtype: str) -> None:
    value = _cuda_reduce(cg.reduce_max, np.zeros((2, 0, 4), dtype), axis=1, keepdims=True)
    assert value.shape == (2, 1, 4) and value.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(value, np.full((2, 1, 4), LOWEST.get(dtype, False), dtype))


@pytest.mark.cuda
def test_cuda_sum_mean_and_argmax_over_an_empty_axis() -> None:
    empty = np.zeros((2, 0, 4), np.float32)
    np.testing.assert_array_equal(_cuda_reduce(cg.reduce_sum, empty, axis=1), np.zeros((2, 4), np.float32))
    assert np.isnan(_cuda_reduce(cg.reduce_mean, empty, axis=1)).all()
    with raises(ValueError, "argmax over an empty axis: axis 1 of (2, 0, 4) has no elements to pick from"):
        _cuda_reduce(cg.argmax, empty, axis=1)
