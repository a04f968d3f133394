"""Strings cross to and from ONNX (checked by ONNX Runtime), and ONNX sequences and optionals come in
as the tensors they hold, their structure fixed by an example; each refusal says what and where."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import cellgraph as cg
from cellgraph.onnx import OnnxError, import_model

onnxruntime = pytest.importorskip("onnxruntime")

WORDS = np.array(["cat", "cow", "eel", "ünïcode"], dtype=object)


def _string_model() -> tuple[cg.Session, cg.Tensor, list[cg.Tensor]]:
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder([None], "string", name="words")
        pairs = cg.reshape(x, [-1, 2])
        outputs = [
            cg.equal(x, "cow", name="is_cow"),
            cg.not_equal(pairs, cg.constant(["cat", "dog"]), name="differs"),
            cg.transpose(pairs, (1, 0), name="columns"),
            cg.concat([x, cg.constant(["tail"])], 0, name="longer"),
            cg.gather(x, cg.constant([3, 0]), name="picked"),
            cg.where(cg.equal(x, "eel"), cg.constant(["EEL"] * 4), x, name="renamed"),
        ]
    return cg.Session(g), x, outputs


def test_a_string_graph_runs_in_onnx_runtime_and_comes_back_the_same(tmp_path: Path) -> None:
    sess, x, outputs = _string_model()
    want = sess.run(outputs, {x: WORDS})
    path = tmp_path / "words.onnx"
    cg.onnx.export(path, [x], outputs, sess, opset=19)
    onnx.checker.check_model(onnx.load(str(path)), full_check=True)
    runtime = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = runtime.run(None, {runtime.get_inputs()[0].name: WORDS})
    again = import_model(path)(WORDS)
    for name, w, r, i in zip([t.name for t in outputs], want, got, again, strict=True):
        assert r.tolist() == w.tolist() == i.tolist(), name
        assert i.dtype == w.dtype, name


def test_a_string_comparison_below_opset_19_is_refused_naming_the_node(tmp_path: Path) -> None:
    sess, x, outputs = _string_model()
    with pytest.raises(
        OnnxError,
        match=r"Equal 'is_cow' .* compares strings, which ONNX's Equal does from opset 19; "
        r"export with opset=19 or newer \(this export is opset 17\)",
    ):
        cg.onnx.export(tmp_path / "old.onnx", [x], outputs[:1], sess, opset=17)
    assert not (tmp_path / "old.onnx").exists()


def test_an_onnx_op_that_takes_no_strings_is_refused_before_anything_is_built() -> None:
    x = helper.make_tensor_value_info("x", TensorProto.STRING, [2])
    y = helper.make_tensor_value_info("y", TensorProto.STRING, [2])
    node = helper.make_node("Add", ["x", "x"], ["y"], name="join")
    model = helper.make_model(helper.make_graph([node], "g", [x], [y]), opset_imports=[helper.make_opsetid("", 19)])
    with pytest.raises(
        OnnxError,
        match=r"value 'x' of Add node 'join', opset 19 is a STRING tensor; of the ONNX ops "
        r"cellgraph imports, these take strings: .*Equal",
    ):
        import_model(model)


def _identity_model(in_type: onnx.TypeProto, out_type: onnx.TypeProto) -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["mid"]), helper.make_node("Identity", ["mid"], ["y"])],
        "g",
        [helper.make_value_info("x", in_type)],
        [helper.make_value_info("y", out_type)],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def test_a_sequence_input_is_its_tensors_and_comes_out_as_a_list() -> None:
    seq = helper.make_sequence_type_proto(helper.make_tensor_type_proto(TensorProto.FLOAT, None))
    model = _identity_model(seq, seq)
    a, b = np.arange(6, dtype=np.float32).reshape(2, 3), np.ones((1, 3), np.float32)
    imported = import_model(model, examples={"x": [a, b]})
    assert [t.name for t in imported.inputs] == ["x/0:0", "x/1:0"]
    assert [t.shape for t in imported.inputs] == [(None, None), (None, None)]  # ranks from the example
    assert imported.signature["structure"]["inputs"] == {"x": "a sequence of 2 tensors"}
    # Other values of the same ranks run; the result is a list, as ONNX Runtime gives it.
    c = np.full((4, 2), 7.0, np.float32)
    got = imported([c, a])
    assert isinstance(got, list) and [g.tolist() for g in got] == [c.tolist(), a.tolist()]
    with pytest.raises(
        OnnxError,
        match=r"input 'x' is a sequence of 2 tensors \(its length was fixed at import\); "
        r"got 3 tensors",
    ):
        imported([a, b, c])
    with pytest.raises(
        OnnxError,
        match=r"graph input 'x' is a sequence or optional: give an example value, "
        r"import_model\(..., examples=\{'x': \[...\]\}\)",
    ):
        import_model(model)
    with pytest.raises(OnnxError, match="the example of sequence input 'x' is a float, not a list of arrays"):
        import_model(model, examples={"x": 3.0})


def test_an_optional_holding_a_value_or_none_passes_through() -> None:
    element = helper.make_tensor_type_proto(TensorProto.FLOAT, [3])
    optional = helper.make_optional_type_proto(element)
    model = _identity_model(optional, optional)
    present = import_model(model, examples={"x": np.zeros(3, np.float32)})
    assert present(np.array([1.0, 2.0, 3.0], np.float32)).tolist() == [1.0, 2.0, 3.0]
    empty = import_model(model, examples={"x": None})
    assert empty.inputs == [] and empty(None) is None
    with pytest.raises(OnnxError, match="input 'x' was imported as an empty optional; pass None"):
        empty(np.zeros(3, np.float32))


def test_an_op_other_than_identity_reading_a_sequence_is_refused_before_anything_is_built() -> None:
    seq = helper.make_sequence_type_proto(helper.make_tensor_type_proto(TensorProto.FLOAT, None))
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"], name="act")],
        "g",
        [helper.make_value_info("x", seq)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    with pytest.raises(
        OnnxError,
        match=r"value 'x' of Relu node 'act', opset 18 is a sequence: cellgraph holds it as "
        r"the tensors in it, which only Identity passes on",
    ):
        import_model(model, examples={"x": [np.zeros(2, np.float32)]})
