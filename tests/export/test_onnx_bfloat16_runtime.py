"""A model made under ``cg.layers.policy("mixed_bfloat16")`` exports so that ONNX Runtime's CPU provider runs it:
that provider has no bfloat16 kernel but Cast's, so by default every op that reads bfloat16 computes in float32
between Casts, as cellgraph computes it (``bfloat16="keep"`` keeps bfloat16 for runtimes that have such kernels)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto

import cellgraph as cg
from cellgraph.onnx import OnnxError

B, T, F = 3, 5, 4
LENGTHS = np.array([5, 2, 1], np.int32)


def _mixed_model() -> tuple[cg.Session, list[cg.Tensor], cg.Tensor]:
    """A bidirectional LSTM over ragged sequences and a dense layer in bfloat16, float32 logits out."""
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((None, T, F), name="x")
        n = cg.placeholder((None,), "int32", name="lengths")
        with cg.layers.policy("mixed_bfloat16"):
            _, (h, _) = cg.layers.lstm(x, 6, lengths=n, direction="bidirectional")
            hidden = cg.layers.dense(h, 8, activation=cg.relu, name="hidden")
        assert hidden.dtype == "bfloat16"
        logits = cg.cast(cg.layers.dense(cg.cast(hidden, "float32"), 3, name="logits"), "float32")
    return cg.Session(g), [x, n], logits


def _feeds() -> list[np.ndarray]:
    return [np.random.default_rng(4).normal(size=(B, T, F)).astype(np.float32), LENGTHS]


def test_a_mixed_bfloat16_model_runs_in_onnx_runtimes_cpu_provider_as_in_the_session(tmp_path: Path) -> None:
    session, inputs, logits = _mixed_model()
    model = cg.onnx.export(tmp_path / "m.onnx", inputs, logits, session)
    typed = onnx.shape_inference.infer_shapes(model)
    types = {v.name: v.type.tensor_type.elem_type for v in [*typed.graph.value_info, *typed.graph.input]}
    readers = {n.op_type for n in model.graph.node if any(types.get(i) == TensorProto.BFLOAT16 for i in n.input)}
    assert readers == {"Cast"}  # the one op the CPU provider has in bfloat16
    # ... yet the rounding stays: each op's float32 result is cast to bfloat16, as cellgraph rounds it.
    assert sum(n.op_type == "Cast" and n.attribute[0].i == TensorProto.BFLOAT16 for n in model.graph.node) > 50
    runtime = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    [got] = runtime.run(None, {"x": _feeds()[0], "lengths": LENGTHS})
    want = session.run(logits, dict(zip(inputs, _feeds())))
    np.testing.assert_allclose(got, want, rtol=0, atol=2.0**-7 * np.abs(want).max())


def test_bfloat16_keep_is_what_onnx_runtimes_cpu_provider_cannot_run(tmp_path: Path) -> None:
    session, inputs, logits = _mixed_model()
    model = cg.onnx.export(tmp_path / "m.onnx", inputs, logits, session, bfloat16="keep")
    with pytest.raises(Exception, match=r"NOT_IMPLEMENTED : Could not find an implementation for \w+\(\d+\) node"):
        ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def test_an_unknown_bfloat16_choice_is_refused_naming_the_choices(tmp_path: Path) -> None:
    session, inputs, logits = _mixed_model()
    with pytest.raises(OnnxError) as info:
        cg.onnx.export(tmp_path / "m.onnx", inputs, logits, session, bfloat16="bf16")
    assert str(info.value) == (
        "bfloat16='bf16' is not a choice: 'float32' computes each op that reads bfloat16 in float32 between Casts "
        "(ONNX Runtime's CPU provider has no bfloat16 kernels), 'keep' keeps bfloat16 where the opset has it (for a "
        "runtime with bfloat16 kernels)"
    )
    assert not (tmp_path / "m.onnx").exists()
