"""ONNX's Tile, Expand, GatherND, ScatterND and Size come in as cellgraph's tile,
broadcast_to, gather_nd, a scatter (add, replace, or tensor_scatter_reduce) and size; what they cannot express is refused, naming why. (The array ops'
export cases are rows of test_onnx_export.py, from onnx_array_cases.py.)"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import cellgraph as cg
from cellgraph.onnx import OnnxError, conformance


def _model(
    node: onnx.NodeProto, inputs: list, initializers: list = (), out_type: int = TensorProto.FLOAT
) -> onnx.ModelProto:  # type: ignore[assignment]
    out = helper.make_tensor_value_info("y", out_type, None)
    graph = helper.make_graph([node], "g", inputs, [out], list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_the_array_rows_pass_every_onnx_conformance_case() -> None:
    results = conformance.run(["Tile", "Expand", "GatherND", "ScatterND", "Size"])
    for op, r in results.items():
        assert r.total and len(r.passed) == r.total, (op, r.failed, r.unsupported)


def test_gather_nd_counts_a_negative_index_from_the_end() -> None:
    node = helper.make_node("GatherND", ["x", "i"], ["y"])
    x_info = helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 2])
    i_info = helper.make_tensor_value_info("i", TensorProto.INT64, [2, 1])
    model = cg.onnx.import_model(_model(node, [x_info, i_info]))
    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    np.testing.assert_array_equal(model(x, np.array([[-1], [0]], np.int64)), x[[2, 0]])


def test_size_of_a_batch_unknown_until_run_time_is_computed_by_the_graph() -> None:
    node = helper.make_node("Size", ["x"], ["y"])
    x_info = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3])
    # Size makes INT64: an output declared FLOAT is refused (onnx.checker and onnxruntime refuse it too).
    model = cg.onnx.import_model(_model(node, [x_info], out_type=TensorProto.INT64))
    assert int(model(np.zeros((5, 3), np.float32))) == 15


def test_expand_of_an_input_of_unknown_shape_is_refused() -> None:
    node = helper.make_node("Expand", ["x", "s"], ["y"])
    x_info = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3])
    s_info = helper.make_tensor_value_info("s", TensorProto.INT64, [2])
    with pytest.raises(OnnxError, match="Expand of an input whose shape is unknown until the graph runs"):
        cg.onnx.import_model(_model(node, [x_info, s_info]), static_inputs={"s": np.array([4, 3], np.int64)})


def test_expand_to_a_shape_that_does_not_broadcast_is_refused() -> None:
    node = helper.make_node("Expand", ["x", "s"], ["y"])
    x_info = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    s_info = helper.make_tensor_value_info("s", TensorProto.INT64, [2])
    with pytest.raises(OnnxError, match="Expand to a shape that does not broadcast"):
        cg.onnx.import_model(_model(node, [x_info, s_info]), static_inputs={"s": np.array([4, 3], np.int64)})


def test_a_batch_gather_along_a_later_axis_is_not_exported(tmp_path: Path) -> None:
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((2, 3, 4), name="x")
        y = cg.gather(x, cg.constant(np.array([[1], [0]], np.int32)), axis=2, batch_dims=1, name="pick")
    with pytest.raises(OnnxError, match=r"BatchGather 'pick' .*: gather with axis 2 after batch_dims 1 has no ONNX"):
        cg.onnx.export(tmp_path / "m.onnx", [x], y, cg.Session(g))


def test_tensor_scatter_max_exports_at_opset_18_and_is_refused_before(tmp_path: Path) -> None:
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((3, 2), name="x")
        index = cg.constant(np.array([[1], [1], [0]], np.int32))  # row 1 twice: ONNX folds repeats in turn too
        y = cg.tensor_scatter_nd_max(x, index, x * 2.0, name="fold")
    session = cg.Session(g)
    with pytest.raises(OnnxError, match=r"TensorScatterReduce 'fold' .*: ScatterND's reduction 'max' needs opset 18"):
        cg.onnx.export(tmp_path / "m17.onnx", [x], y, session, opset=17)
    model = cg.onnx.export(tmp_path / "m18.onnx", [x], y, session, opset=18)
    data = np.array([[1.0, -2.0], [3.0, 0.5], [-1.0, 4.0]], np.float32)
    [got] = ort.InferenceSession(model.SerializeToString()).run(None, {"x": data})
    np.testing.assert_array_equal(got, session.run(y, {x: data}))


def test_a_reflect_pad_over_an_unknown_batch_imports_and_an_unknown_padded_axis_is_refused(tmp_path: Path) -> None:
    # cellgraph's own export of a REFLECT pad has a dynamic batch: only the padded axes' sizes are needed.
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((None, 5, 4, 2), name="x")
        y = cg.pad(x, [[0, 0], [1, 2], [2, 1], [0, 0]], mode="REFLECT")
    exported = cg.onnx.export(tmp_path / "pad.onnx", x, y, cg.Session(g))
    data = np.random.default_rng(5).normal(size=(3, 5, 4, 2)).astype(np.float32)
    np.testing.assert_array_equal(cg.onnx.import_model(exported)(data), cg.Session(g).run(y, {x: data}))
    node = helper.make_node("Pad", ["x", "p"], ["y"], mode="reflect")
    x_info = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", "t"])
    pads = helper.make_tensor("p", TensorProto.INT64, [4], [0, 1, 0, 1])
    with pytest.raises(OnnxError, match="Pad mode 'reflect' of axis 1, whose size is unknown until the graph runs"):
        cg.onnx.import_model(_model(node, [x_info], [pads]))


@pytest.mark.parametrize(
    "op, ishape, given, attrs, words",
    [
        ("Gather", [1], [-3], {"axis": 1}, r"index -3 \(at \(0,\) in indices\) is out of range \[0, 2\) for axis 1"),
        ("GatherND", [1, 2], [[0, -3]], {}, r"indices\[0\] = \[0, -3\] does not index into params \(2, 2\)"),
        ("GatherElements", [2, 1], [[-3], [0]], {"axis": 1}, r"indices\[0, 0\] = \[0, -3\] does not index"),
    ],
)
def test_an_index_below_minus_the_size_is_named_as_the_model_gave_it(op, ishape, given, attrs, words) -> None:  # type: ignore[no-untyped-def]
    # The importer added the size to every negative index, so -3 on an axis of 2 was reported as "index -1".
    node = helper.make_node(op, ["x", "i"], ["y"], **attrs)
    x_info = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2])
    i_info = helper.make_tensor_value_info("i", TensorProto.INT64, ishape)
    model = cg.onnx.import_model(_model(node, [x_info, i_info]))
    x = np.arange(4, dtype=np.float32).reshape(2, 2)
    with pytest.raises(cg.ExecutionError, match=words):
        model(x, np.array(given, np.int64))
    minus_size = np.where(np.array(given) == -3, -2, given).astype(np.int64)  # -2 is in range: the first row/column
    assert np.asarray(model(x, minus_size)).size
