"""The inference graph fixes a training switch to False: batch norm and dropout export as they evaluate."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort

import cellgraph as cg
from cellgraph.inference import inference_graph

RNG = np.random.default_rng(3)


def _model() -> tuple[cg.Graph, cg.Tensor, cg.Tensor, cg.Tensor]:
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((None, 4), name="x")
        training = cg.layers.training_switch()
        h = cg.layers.batch_norm(cg.layers.dense(x, 3, name="dense"), training, momentum=0.5, name="bn")
        # A reader of the switch itself (not a Where) sees the constant False.
        y = cg.layers.dropout(h, 0.5, training=training) + cg.cast(training, "float32") * 100.0
    return g, x, training, y


def test_the_switch_becomes_false_and_the_batch_statistics_are_left_out(tmp_path: Path) -> None:
    g, x, training, y = _model()
    session = cg.Session(g)
    feed = RNG.normal(size=(16, 4)).astype(np.float32)
    session.run(y, {x: feed})  # a training step: the moving statistics move off their initial values
    model = inference_graph(x, y)
    ops = {n.op for n in model.graph}
    assert "FusedBatchNorm" not in ops and "PlaceholderWithDefault" not in ops and "Dropout" not in ops
    assert model.graph.node("training").op == "Const"
    trained_mode = session.run(y, {x: feed[:5]})  # (another training step)
    want = session.run(y, {x: feed[:5], training: False})
    assert not np.allclose(want, trained_mode)
    onnx_model = cg.onnx.export(tmp_path / "m.onnx", x, y, session)
    assert [i.name for i in onnx_model.graph.input] == ["x"]
    got = ort.InferenceSession(onnx_model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": feed[:5]}
    )[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    loaded = cg.load_model(cg.save_model(tmp_path / "saved", x, y, session))
    np.testing.assert_allclose(loaded(feed[:5]), want, rtol=1e-5, atol=1e-5)
