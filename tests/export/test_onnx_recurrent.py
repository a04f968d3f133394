"""ONNX's RNN, GRU and LSTM import unrolled: checked against ONNX Runtime with every option combined that
ONNX's own node cases test one at a time, and each refusal names what it refuses."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from cellgraph import ExecutionError
from cellgraph.onnx import OnnxError, import_model

onnxruntime = pytest.importorskip("onnxruntime")
GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
HIDDEN, FEATURES, STEPS = 3, 4, 5


def _model(kind: str, layout: int = 0, dims: list[Any] | None = None, inputs: int = 8, **attrs: Any) -> onnx.ModelProto:
    """One ``kind`` node, bidirectional, with random bias, initial states and (LSTM) peepholes as initializers."""
    rng = np.random.default_rng(GATES[kind])
    gates, directions = GATES[kind], 2
    arrays = {
        "w": rng.normal(0, 0.5, (directions, gates * HIDDEN, FEATURES)),
        "r": rng.normal(0, 0.5, (directions, gates * HIDDEN, HIDDEN)),
        "b": rng.normal(0, 0.5, (directions, 2 * gates * HIDDEN)),
        "h0": rng.normal(0, 0.5, (2, directions, HIDDEN) if layout else (directions, 2, HIDDEN)),
        "c0": rng.normal(0, 0.5, (2, directions, HIDDEN) if layout else (directions, 2, HIDDEN)),
        "p": rng.normal(0, 0.5, (directions, 3 * HIDDEN)),
    }
    names = ["x", "w", "r", "b", "", "h0", "c0", "p"][: inputs if kind == "LSTM" else min(inputs, 6)]
    outputs = ["y", "y_h", "y_c"][: 3 if kind == "LSTM" else 2]
    node = helper.make_node(
        kind, names, outputs, name="cell", hidden_size=HIDDEN, direction="bidirectional", layout=layout, **attrs
    )
    x_dims = dims or (["batch", STEPS, FEATURES] if layout else [STEPS, "batch", FEATURES])
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_dims)],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in outputs],
        [numpy_helper.from_array(a.astype(np.float32), name) for name, a in arrays.items() if name in names],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize(
    ("kind", "layout", "attrs"),
    [("LSTM", 0, {}), ("LSTM", 1, {}), ("GRU", 0, {"linear_before_reset": 1}), ("GRU", 1, {}), ("RNN", 1, {})],
)
def test_a_bidirectional_recurrent_node_with_every_input_matches_onnx_runtime_or_onnxs_reference(
    tmp_path: Path, kind: str, layout: int, attrs: dict[str, Any]
) -> None:
    path = tmp_path / f"{kind}.onnx"
    onnx.save(_model(kind, layout, **attrs), str(path))
    imported = import_model(path)
    # The initial states are for a batch of 2; the batch is dynamic only in x's type.
    x = np.random.default_rng(7).normal(size=(2, STEPS, FEATURES) if layout else (STEPS, 2, FEATURES))
    if layout:  # ONNX Runtime 1.32's CPU kernels refuse layout=1: ONNX's reference implementation checks it
        want = ReferenceEvaluator(str(path)).run(None, {"x": x.astype(np.float32)})
    else:
        runtime = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        want = runtime.run(None, {"x": x.astype(np.float32)})
    got = imported(x.astype(np.float32))
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("model", "words"),
    [
        (
            lambda: _model("LSTM", activations=["Sigmoid", "Relu", "Tanh"] * 2),
            "LSTM with activations ['Sigmoid', 'Relu', 'Tanh', 'Sigmoid', 'Relu', 'Tanh'] (cellgraph imports the "
            "defaults, ['Sigmoid', 'Tanh', 'Tanh']) has no cellgraph equivalent (LSTM node 'cell', opset 17)",
        ),
        (
            lambda: _model("GRU", dims=[None, 2, FEATURES]),
            "GRU over a sequence whose length is unknown until the graph runs (it is unrolled when built)",
        ),
        (lambda: _model("RNN", clip=1.0), "RNN with attribute 'clip' has no cellgraph equivalent (RNN node 'cell'"),
        (lambda: _model("LSTM", input_forget=1), "LSTM with input_forget=1 (coupled input and forget gates)"),
    ],
)
def test_a_recurrent_option_cellgraph_does_not_import_is_refused_naming_it(model: Any, words: str) -> None:
    with pytest.raises(OnnxError) as info:
        import_model(model())
    assert words in str(info.value)


def _with_lengths(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with its node's sequence_lens fed as an int32 graph input, ``lens`` (batch,)."""
    node = model.graph.node[0]
    while len(node.input) < 5:
        node.input.append("")
    node.input[4] = "lens"
    model.graph.input.append(helper.make_tensor_value_info("lens", TensorProto.INT32, ["batch"]))
    return model


@pytest.mark.parametrize("kind", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("lengths", [[5, 2], [1, 0], [3, 5]])
def test_a_bidirectional_node_with_ragged_sequence_lens_matches_onnx_runtime(
    tmp_path: Path, kind: str, lengths: list[int]
) -> None:
    """Every input given (initial states, peepholes) and a run-time sequence_lens: Y is zero past each row's
    length, Y_h (and Y_c) are each row's state at its last valid step, the reverse direction's after step 0
    having started at that row's last valid step; a zero length's Y_h and Y_c are zeros there."""
    path = tmp_path / f"{kind}.onnx"
    onnx.save(_with_lengths(_model(kind, linear_before_reset=1) if kind == "GRU" else _model(kind)), str(path))
    imported = import_model(path)
    x = np.random.default_rng(8).normal(size=(STEPS, 2, FEATURES)).astype(np.float32)
    x[np.arange(STEPS)[:, None] >= np.array(lengths)[None, :]] = 1e3  # padding ONNX Runtime never reads
    feeds = {"x": x, "lens": np.array(lengths, np.int32)}
    runtime = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    want = runtime.run(None, feeds)
    got = imported(x, feeds["lens"])
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    padded = np.arange(STEPS)[:, None] >= np.array(lengths)[None, :]  # (seq, batch)
    assert np.all(got[0].transpose(0, 2, 1, 3)[padded] == 0)  # Y is (seq, num_directions, batch, hidden)


def test_a_known_sequence_lens_outside_the_sequence_is_refused_naming_the_range() -> None:
    model = _model("RNN", inputs=5)
    model.graph.node[0].input[4] = "lens"
    model.graph.initializer.append(numpy_helper.from_array(np.array([STEPS + 1, 2], np.int32), "lens"))
    with pytest.raises(OnnxError) as info:
        import_model(model)
    assert (
        f"input 4 ('sequence_lens') is [6, 2]: ONNX's RNN needs each in [0, {STEPS}], the input's sequence length"
        in (str(info.value))
    )
    # A known ragged one imports as a fed one does.
    model.graph.initializer[-1].CopyFrom(numpy_helper.from_array(np.array([STEPS, 2], np.int32), "lens"))
    y = import_model(model)(np.ones((STEPS, 2, FEATURES), np.float32))[0]
    assert y.shape == (STEPS, 2, 2, HIDDEN) and np.all(y[2:, :, 1] == 0) and np.all(y[:2, :, 1] != 0)


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_sequence_lens_in_the_batchwise_layout_gives_the_time_major_layouts_outputs(kind: str) -> None:
    """ONNX Runtime's CPU kernels refuse layout=1 (and ONNX's reference reads no sequence_lens): the batchwise
    import with a ragged sequence_lens must give the time-major one's outputs, transposed."""
    lengths = np.array([2, 5], np.int32)
    x = np.random.default_rng(9).normal(size=(STEPS, 2, FEATURES)).astype(np.float32)
    # No initial states: their layouts differ too, and are checked without lengths above.
    time_major = import_model(_with_lengths(_model(kind, inputs=5)))(x, lengths)
    batchwise = import_model(_with_lengths(_model(kind, layout=1, inputs=5)))
    got = batchwise(x.transpose(1, 0, 2), lengths)
    np.testing.assert_allclose(got[0], time_major[0].transpose(2, 0, 1, 3), rtol=1e-6, atol=1e-6)
    for g, w in zip(got[1:], time_major[1:], strict=True):
        np.testing.assert_allclose(g, w.transpose(1, 0, 2), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    ("elem_type", "dims", "words"),
    [
        (
            TensorProto.FLOAT,
            ["batch"],
            "input 4 ('sequence_lens') is FLOAT: ONNX's RNN needs int32 lengths, one per row",
        ),
        (TensorProto.INT32, ["batch", 1], "input 4 ('sequence_lens') has shape (None, 1): ONNX's RNN needs shape"),
        (TensorProto.INT32, [], "input 4 ('sequence_lens') has shape (): ONNX's RNN needs shape (batch_size,)"),
        (TensorProto.INT32, [3], "input 4 ('sequence_lens') has shape (3,), but input 0 ('X') has shape (5, 2, 4)"),
    ],
)
def test_a_fed_sequence_lens_of_another_type_or_rank_is_refused_naming_input_4(
    elem_type: int, dims: list[Any], words: str
) -> None:
    """Before, these failed to build naming an op of the unrolled steps (a Gather, an ExpandDims, a Where)."""
    model = _with_lengths(_model("RNN", inputs=5, dims=[STEPS, 2, FEATURES]))
    model.graph.input[-1].CopyFrom(helper.make_tensor_value_info("lens", elem_type, dims))
    with pytest.raises(OnnxError) as info:
        import_model(model)
    assert words in str(info.value) and "RNN node 'cell'" in str(info.value)


@pytest.mark.parametrize("lengths", [[2], [2, 3, 1]])
def test_a_fed_sequence_lens_with_one_length_per_row_too_few_or_many_fails_the_run_naming_it(
    lengths: list[int],
) -> None:
    """One length for a batch of 2 ran, broadcast over both rows, without a word; three failed naming a Where."""
    imported = import_model(_with_lengths(_model("RNN", inputs=5)))
    x = np.ones((STEPS, 2, FEATURES), np.float32)
    with pytest.raises(ExecutionError) as info:
        imported(x, np.array(lengths, np.int32))
    assert "lengths_need_one_per_sequence'" in str(info.value)
    assert f"'lens:0' has shape ({len(lengths)},) but must have the shape of 'reduce_sum:0', (2,)" in str(info.value)
    assert imported(x, np.array([2, 3], np.int32))[0].shape == (STEPS, 2, 2, HIDDEN)  # the model still runs
