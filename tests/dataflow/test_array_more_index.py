"""gather_nd and scatter_nd: TensorFlow's semantics and every error they raise
(values, gradients and kernels are checked by the op table, op_cases/array_index.py)."""

from __future__ import annotations

import numpy as np
import pytest

import cellgraph as cg

from .errors_helpers import ph, raises

pytestmark = pytest.mark.usefixtures("fresh_graph")

X = np.arange(24, dtype=np.float32).reshape(2, 3, 4)


def _run(fetches: object, feeds: dict) -> object:
    return cg.Session(cg.get_default_graph()).run(fetches, feeds)


def test_gather_nd_reads_slices_and_elements_like_tensorflow() -> None:
    x = ph(2, 3, 4)
    rows = cg.gather_nd(x, np.array([[1, 2], [0, 0]], np.int32))
    elements = cg.gather_nd(x, np.array([[[1, 2, 3]], [[0, 1, 0]]], np.int64))
    got_rows, got_elements = _run([rows, elements], {x: X})
    np.testing.assert_array_equal(got_rows, np.stack([X[1, 2], X[0, 0]]))
    np.testing.assert_array_equal(got_elements, np.array([[X[1, 2, 3]], [X[0, 1, 0]]]))


def test_scatter_nd_sums_repeated_rows_and_is_gather_nd_s_adjoint() -> None:
    u = ph(3, 4, name="u")
    idx = np.array([[1], [0], [1]], np.int32)
    out = cg.scatter_nd(idx, u, (2, 4))
    (du,) = cg.gradients(cg.reduce_sum(out * np.arange(8, dtype=np.float32).reshape(2, 4)), [u])
    updates = np.ones((3, 4), np.float32)
    got, got_du = _run([out, du], {u: updates})
    np.testing.assert_array_equal(got, [[1, 1, 1, 1], [2, 2, 2, 2]])
    np.testing.assert_array_equal(got_du, np.arange(8).reshape(2, 4)[[1, 0, 1]])


def test_gather_nd_gradient_scatters_back_into_params_of_unknown_batch() -> None:
    x = ph(None, 3, 4)
    (dx,) = cg.gradients(cg.reduce_sum(cg.gather_nd(x, np.array([[1, 2], [1, 2]], np.int32))), [x])
    want = np.zeros_like(X)
    want[1, 2] = 2.0
    np.testing.assert_array_equal(_run(dx, {x: X}), want)


def test_gather_nd_index_out_of_range_fails_at_the_node_naming_the_row() -> None:
    x = ph(None, 3)
    y = cg.gather_nd(x, np.array([[0, 1], [2, 0]], np.int32), name="pick")
    with pytest.raises(cg.ExecutionError, match=r"^GatherNd 'pick' .* failed while running: .*"
                       r"indices\[1\] = \[2, 0\] does not index into params \(2, 3\)"):  # fmt: skip
        _run(y, {x: np.zeros((2, 3), np.float32)})


def test_scatter_nd_negative_index_fails_at_the_node() -> None:
    u = ph(2, name="u")
    y = cg.scatter_nd(np.array([[1], [-1]], np.int32), u, (3,), name="put")
    with pytest.raises(cg.ExecutionError, match=r"^ScatterNd 'put' .* failed while running: .*"
                       r"indices\[1\] = \[-1\] does not index into output \(3,\)"):  # fmt: skip
        _run(y, {u: np.ones(2, np.float32)})


def test_gather_nd_errors() -> None:
    with raises(cg.ShapeError, "GatherNd 'gather_nd' (test_array_more_index.py"):
        cg.gather_nd(ph(2, 3), np.zeros((1, 3), np.int32))
    with raises(cg.ShapeError, "indices (1, 3) hold 3 coordinates, but params (2, 3) has 2 dims"):
        cg.gather_nd(ph(2, 3), np.zeros((1, 3), np.int32))
    with raises(cg.DTypeError, "indices must be int32 or int64, got float32"):
        cg.gather_nd(ph(2, 3), np.zeros((1, 2), np.float32))
    with raises(cg.ShapeError, "indices () need a last dim of known size: the number of coordinates per row"):
        cg.gather_nd(ph(2, 3), np.int32(1))
    with raises(cg.ShapeError, "indices (4, None) need a last dim of known size"):
        cg.gather_nd(ph(2, 3), ph(4, None, dtype="int32", name="i"))


def test_scatter_nd_errors_leave_the_graph_unchanged() -> None:
    g = cg.get_default_graph()
    u = ph(3, 2, name="u")
    before = len(g.nodes)
    with raises(cg.ShapeError, "updates (3, 2) do not fit indices (3, 1) into (4, 5): expected (3, 5)"):
        cg.scatter_nd(np.zeros((3, 1), np.int32), u, (4, 5))
    assert len(g.nodes) == before  # the constant made for the indices went again
    with raises(cg.ShapeError, "shape (4, -5) must be >= 0"):
        cg.scatter_nd(np.zeros((3, 1), np.int32), u, (4, -5))
    with raises(cg.ShapeError, "indices (3, 3) hold 3 coordinates, but the output (4, 2) has 2 dims"):
        cg.scatter_nd(np.zeros((3, 3), np.int32), u, (4, 2))
    with raises(cg.ShapeError, "scatter_nd: shape must be a sequence of ints, got (4.0, 2)"):
        cg.scatter_nd(np.zeros((3, 1), np.int32), u, (4.0, 2))  # type: ignore[arg-type]


# ------------------------------------------------------ gather with batch_dims
def test_gather_with_batch_dims_indexes_each_batch_by_its_own_indices() -> None:
    p = ph(None, 3, 4, name="p")
    ids = np.array([[2, 0], [1, 1]], np.int32)
    y = cg.gather(p, ids, batch_dims=1)  # axis defaults to batch_dims, as in TensorFlow
    z = cg.gather(p, ids[:, :1], axis=2, batch_dims=1)
    assert y.shape == (2, 2, 4) and z.shape == (2, 3, 1)
    (dp,) = cg.gradients(cg.reduce_sum(y), [p])
    got_y, got_z, got_dp = _run([y, z, dp], {p: X})
    np.testing.assert_array_equal(got_y, np.stack([X[0][[2, 0]], X[1][[1, 1]]]))
    np.testing.assert_array_equal(got_z, np.stack([X[0][:, [2]], X[1][:, [1]]]))
    want = np.zeros_like(X)
    want[0, [2, 0]] = 1.0
    want[1, 1] = 2.0  # a repeated index sums
    np.testing.assert_array_equal(got_dp, want)


def test_gather_batch_dims_errors() -> None:
    with raises(cg.ShapeError, "BatchGather 'gather' (test_array_more_index.py"):
        cg.gather(ph(2, 3), np.zeros((2, 1), np.int32), axis=0, batch_dims=1)
    with raises(cg.ShapeError, "axis 0 must be at least batch_dims 1 and a dim of params (2, 3)"):
        cg.gather(ph(2, 3), np.zeros((2, 1), np.int32), axis=0, batch_dims=1)
    with raises(cg.ShapeError, "params (2, 3) and indices (3, 1) differ in batch dim 0: 2 and 3"):
        cg.gather(ph(2, 3), np.zeros((3, 1), np.int32), batch_dims=1)
    with raises(cg.ShapeError, "batch_dims 3 is out of range for indices (2, 1)"):
        cg.gather(ph(2, 3, 4, 5), np.zeros((2, 1), np.int32), axis=3, batch_dims=3)
    with raises(cg.DTypeError, "indices must be int32 or int64, got float32"):
        cg.gather(ph(2, 3), np.zeros((2, 1), np.float32), batch_dims=1)


def test_gather_batch_dims_bad_index_and_batch_fail_at_the_node() -> None:
    p, i = ph(None, 3, name="p"), ph(None, 1, dtype="int32", name="i")
    y = cg.gather(p, i, batch_dims=1, name="pick")
    params = np.zeros((2, 3), np.float32)
    with pytest.raises(cg.ExecutionError, match=r"^BatchGather 'pick' .* failed while running: .*"
                       r"index 5 \(at \(1, 0\) in indices\) is out of range \[0, 3\) for axis 1 of params \(2, 3\)"):  # fmt: skip
        _run(y, {p: params, i: np.array([[0], [5]], np.int32)})
    with pytest.raises(cg.ExecutionError, match=r"batch dims of params \(2, 3\) and indices \(3, 1\) differ"):
        _run(y, {p: params, i: np.zeros((3, 1), np.int32)})


# ----------------------------------------- tensor_scatter_nd_max / min / reduce
def test_tensor_scatter_reductions_fold_repeated_rows_in_turn() -> None:
    t = ph(3, name="t")
    idx = np.array([[1], [1], [2]], np.int32)
    updates = np.array([5.0, 7.0, -4.0], np.float32)
    hi, lo = cg.tensor_scatter_nd_max(t, idx, updates), cg.tensor_scatter_nd_min(t, idx, updates)
    prod = cg.dataflow.ops.array_index.tensor_scatter_reduce(t, idx, updates, "mul")
    got = _run([hi, lo, prod], {t: np.array([1.0, 6.0, 2.0], np.float32)})
    np.testing.assert_array_equal(got[0], [1.0, 7.0, 2.0])
    np.testing.assert_array_equal(got[1], [1.0, 5.0, -4.0])
    np.testing.assert_array_equal(got[2], [1.0, 210.0, -8.0])


def test_tensor_scatter_reduce_errors() -> None:
    t = ph(3, 2, name="t")
    with raises(cg.GraphError, "tensor_scatter_reduce: reduction must be 'max', 'min' or 'mul', got 'sum'"):
        cg.dataflow.ops.array_index.tensor_scatter_reduce(t, np.zeros((1, 1), np.int32), np.ones((1, 2)), "sum")
    with raises(cg.DTypeError, "updates are int32, the tensor they go into is float32"):
        cg.tensor_scatter_nd_max(t, np.zeros((1, 1), np.int32), np.ones((1, 2), np.int32))
    with raises(cg.ShapeError, "updates (1, 3) do not fit indices (1, 1) into (3, 2): expected (1, 2)"):
        cg.tensor_scatter_nd_min(t, np.zeros((1, 1), np.int32), np.ones((1, 3), np.float32))
    y = cg.tensor_scatter_nd_max(t, np.array([[3]], np.int32), np.ones((1, 2), np.float32), name="fold")
    with pytest.raises(cg.ExecutionError, match=r"^TensorScatterReduce 'fold' .* failed while running: .*"
                       r"indices\[0\] = \[3\] does not index into tensor \(3, 2\)"):  # fmt: skip
        _run(y, {t: np.zeros((3, 2), np.float32)})
