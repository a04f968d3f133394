"""``cg.layers.gru`` and ``cg.layers.lstm``, with and without variable lengths, exported to ONNX and run in ONNX
Runtime, in one direction or both. The layers are unrolled into the graph's own ops (the lengths into Less, Where and Gather), so the
export writes those ops, not ONNX's GRU/LSTM nodes with ``sequence_lens``; the lengths stay a graph input."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

import cellgraph as cg

B, T, F, U = 4, 5, 3, 6
LENGTHS = np.array([5, 1, 3, 0], np.int32)


def _model(kind: str, form: str, direction: str = "forward") -> tuple[cg.Graph, list[cg.Tensor], list[cg.Tensor]]:
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((None, T, F), name="x")
        inputs, given = [x], {}
        if form == "lengths":
            given = {"lengths": cg.placeholder((None,), "int32", name="lengths")}
        elif form == "mask":
            given = {"mask": cg.placeholder((None, T), "bool", name="mask")}
        inputs += list(given.values())
        if kind == "gru":
            outputs, h = cg.layers.gru(x, U, **given, direction=direction)
            states = [h]
        else:
            outputs, (h, c) = cg.layers.lstm(x, U, **given, direction=direction)
            states = [h, c]
        logits = cg.layers.dense(states[0], 2, name="logits")
    return g, inputs, [outputs, *states, logits]


def _feeds(form: str) -> list[np.ndarray]:
    x = np.random.default_rng(0).normal(size=(B, T, F)).astype(np.float32)
    if form == "lengths":
        return [x, LENGTHS]
    if form == "mask":
        return [x, np.arange(T)[None, :] < LENGTHS[:, None]]
    return [x]


@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
@pytest.mark.parametrize("form", ["plain", "lengths", "mask"])
@pytest.mark.parametrize("kind", ["gru", "lstm"])
def test_a_recurrent_layer_exports_and_runs_in_onnx_runtime_as_in_cellgraph(
    tmp_path: Path, kind: str, form: str, direction: str
) -> None:
    g, inputs, outputs = _model(kind, form, direction)
    sess = cg.Session(g)
    # Nonzero biases, so that the GRU's recurrent bias inside the reset product is exercised.
    for scope in [kind] + ([f"{kind}/backward"] if direction == "bidirectional" else []):
        bias = g.node(f"{scope}/bias").output(0)
        sess.variables.load(bias.node, np.random.default_rng(1).normal(size=bias.shape).astype(np.float32))
    path = tmp_path / f"{kind}.onnx"
    cg.onnx.export(path, inputs, outputs, sess)
    feeds = _feeds(form)
    want = sess.run(outputs, dict(zip(inputs, feeds)))
    runtime = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = runtime.run(None, {i.node.name: v for i, v in zip(inputs, feeds)})
    for w, o in zip(want, got, strict=True):
        np.testing.assert_allclose(o, w, rtol=1e-5, atol=1e-6)
    if form != "plain":  # the padded steps' outputs are zeros there too, and a zero-length row keeps zeros
        assert np.all(got[0][np.arange(T)[None, :] >= LENGTHS[:, None]] == 0) and np.all(got[1][3] == 0)


def test_an_exported_length_outside_the_sequence_fails_in_onnx_runtime(tmp_path: Path) -> None:
    g, inputs, outputs = _model("gru", "lengths")
    path = tmp_path / "gru.onnx"
    cg.onnx.export(path, inputs, outputs[1], cg.Session(g))
    runtime = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    x = _feeds("lengths")[0]
    # ONNX's Gather reads an index in [-n, -1] from the end: a negative length is refused all the same.
    for bad in (6, -1, -6):
        with pytest.raises(Exception, match="out of data bounds"):
            runtime.run(None, {"x": x, "lengths": np.array([bad, 1, 1, 1], np.int32)})
