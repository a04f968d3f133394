"""ONNX's CumSum and TopK come in as ``cg.cumsum`` and ``cg.top_k``
(``cellgraph/onnx/import_more.py``): ONNX's own conformance cases, agreement
with ONNX Runtime off the last axis and for ``largest=0``, and the refusals' words."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import cellgraph as cg
from cellgraph.onnx import OnnxError, conformance


def _model(node: onnx.NodeProto, x_type: int, x_shape: list, initializers: list, outputs: list[str]) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", x_type, x_shape)
    types = {"indices": TensorProto.INT64}
    outs = [helper.make_tensor_value_info(name, types.get(name, x_type), None) for name in outputs]
    graph = helper.make_graph([node], "g", [x], outs, initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_cumsum_and_top_k_pass_their_onnx_conformance_cases() -> None:
    results = conformance.run(["CumSum", "TopK"])
    assert len(results["CumSum"].passed) == results["CumSum"].total == 9
    top = results["TopK"]
    assert top.failed == {}
    # Every case but the one of an unsigned 64-bit type, which cellgraph has no tensors of.
    assert len(top.passed) == top.total - 1 and list(top.unsupported) == ["test_top_k_uint64"]


@pytest.mark.parametrize(("axis", "largest"), [(0, 1), (1, 0), (-1, 0)])
def test_top_k_off_the_last_axis_and_smallest_agree_with_onnx_runtime(axis: int, largest: int) -> None:
    node = helper.make_node("TopK", ["x", "k"], ["values", "indices"], axis=axis, largest=largest)
    k = helper.make_tensor("k", TensorProto.INT64, [1], [2])
    model = _model(node, TensorProto.FLOAT, [4, 3, 5], [k], ["values", "indices"])
    x = np.random.default_rng(axis + 5 * largest + 3).normal(size=(4, 3, 5)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})
    got = cg.onnx.import_model(model)(x)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-6)
    np.testing.assert_array_equal(got[1], want[1])
    assert got[1].dtype == np.int64


def test_reverse_exclusive_cumsum_on_axis_one_agrees_with_onnx_runtime() -> None:
    node = helper.make_node("CumSum", ["x", "axis"], ["y"], exclusive=1, reverse=1)
    axis = helper.make_tensor("axis", TensorProto.INT64, [], [-2])
    model = _model(node, TensorProto.DOUBLE, [2, 4, 3], [axis], ["y"])
    x = np.random.default_rng(0).normal(size=(2, 4, 3))
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    np.testing.assert_allclose(cg.onnx.import_model(model)(x), want, rtol=1e-12)


def test_what_the_rows_cannot_express_is_refused_with_why() -> None:
    # (TopK with largest=0 of integers imports since the ONNX sweep: test_onnx_import_sweep.py.)
    of_a_scalar = helper.make_node("TopK", ["x", "k"], ["values", "indices"], name="low")
    k = helper.make_tensor("k", TensorProto.INT64, [1], [1])
    with pytest.raises(
        OnnxError, match=r"input 0 \('X'\) is a scalar: ONNX's TopK needs rank at least 1 .*TopK node 'low'"
    ):
        cg.onnx.import_model(_model(of_a_scalar, TensorProto.INT32, [], [k], ["values", "indices"]))
    far = helper.make_node("CumSum", ["x", "axis"], ["y"], name="far")
    axis = helper.make_tensor("axis", TensorProto.INT64, [], [2])
    with pytest.raises(
        OnnxError, match=r"input 1 \('axis'\) is 2, outside \[-2, 1\], what ONNX's CumSum allows .*CumSum node 'far'"
    ):
        cg.onnx.import_model(_model(far, TensorProto.FLOAT, [2, 3], [axis], ["y"]))
