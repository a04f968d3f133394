"""The inference graph fixes a training switch to False: batch norm and dropout export as they evaluate."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

import cellgraph as cg
from cellgraph.dataflow.ops.normalization import fused_batch_norm
from cellgraph.inference import ExportError, inference_graph

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


def _fixed_training_model(axis: int) -> tuple[cg.Graph, cg.Tensor, cg.Tensor]:
    # Batch norm built with training=True: no switch, so no inference branch in the graph itself.
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((None, 3, 4, 2), name="x")
        h = cg.layers.conv2d(x, 3, 3, padding="SAME", name="conv") if axis == -1 else x
        y = cg.layers.batch_norm(h, training=True, momentum=0.5, axis=axis, name="bn")
    return g, x, y


def test_a_batch_norm_built_for_training_saves_and_exports_with_its_moving_statistics(tmp_path: Path) -> None:
    # Exported, a model infers: every row is normalized by the moving statistics, whatever else is in its
    # batch (before, the saved model normalized each call by that call's own batch, without a word).
    for axis in (-1, 1):
        g, x, y = _fixed_training_model(axis)
        session = cg.Session(g)
        feed = RNG.normal(2.0, 3.0, size=(8, 3, 4, 2)).astype(np.float32)
        for _ in range(4):
            session.run(y, {x: feed})  # training steps: the moving statistics move towards the batch's
        nodes = len(g.nodes)
        values = session.variable_values()
        mean, variance = values["bn/moving_mean"], values["bn/moving_variance"]
        inputs = session.run(g.node("conv/conv2d").output(0), {x: feed}) if axis == -1 else feed
        col = (1, -1, 1, 1) if axis == 1 else (1, 1, 1, -1)
        want = (inputs - mean.reshape(col)) / np.sqrt(variance.reshape(col) + 1e-3)  # gamma 1, beta 0
        loaded = cg.load_model(cg.save_model(tmp_path / f"saved{axis}", x, y, session))
        np.testing.assert_allclose(loaded(feed), want, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(loaded(feed[:1]), want[:1], rtol=1e-4, atol=1e-4)  # a batch of one: the same
        onnx_model = cg.onnx.export(tmp_path / f"m{axis}.onnx", x, y, session)
        got = ort.InferenceSession(onnx_model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
            None, {"x": feed[:3]}
        )[0]
        np.testing.assert_allclose(got, want[:3], rtol=1e-4, atol=1e-4)
        assert len(g.nodes) == nodes  # the user's graph is left as it was
        assert "FusedBatchNorm" not in {n.op for n in inference_graph(x, y).graph}


def test_batch_statistics_with_nothing_to_infer_by_are_refused_by_name() -> None:
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((None, 4), name="x")
        y, mean, _ = fused_batch_norm(x, np.ones(4, np.float32), np.zeros(4, np.float32), name="plain")
        bn = cg.layers.batch_norm(x, training=True, name="bn")
        reads_mean = bn + cg.reduce_sum(g.node("bn/output_fused").output(1))
    with pytest.raises(ExportError, match=r"output needs FusedBatchNorm 'plain' .*, which normalizes each batch by "
                       r"its own statistics and keeps no moving statistics to use at inference"):  # fmt: skip
        inference_graph(x, y)
    with pytest.raises(ExportError, match=r"reads output 1 of FusedBatchNorm 'bn/output_fused' .*, a batch statistic, "
                       r"which exists only in training"):  # fmt: skip
        inference_graph(x, reads_mean)
    assert mean.shape == (4,)
