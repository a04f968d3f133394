"""PyTorch's ``nn.LSTM``/``nn.GRU``, one-way and bidirectional, exported by ``torch.onnx.export`` and imported:
with a ``sequence_lens`` added by hand (torch writes none: a packed sequence does not export), a ragged batch
gives what ONNX Runtime gives and what the module gives over ``pack_padded_sequence``."""

from __future__ import annotations

import io
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from cellgraph.onnx import import_model

B, T, F, H = 4, 6, 3, 5
LENGTHS = np.array([6, 1, 4, 2], np.int32)


def _exported(module: torch.nn.Module, kind: str, bidirectional: bool) -> onnx.ModelProto:
    outputs = ["y", "h", "c"] if kind == "LSTM" else ["y", "h"]
    buffer = io.BytesIO()
    with warnings.catch_warnings():  # torch's notes on the TorchScript exporter and on batch_first RNNs
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module, (torch.randn(B, T, F),), buffer, dynamo=False, opset_version=17, input_names=["x"],
            output_names=outputs, dynamic_axes={name: {0 if name in ("x", "y") else 1: "batch"} for name in
                                                ["x", *outputs]},
        )  # fmt: skip
    model = onnx.load_from_string(buffer.getvalue())
    [node] = [n for n in model.graph.node if n.op_type == kind]
    direction = [helper.get_attribute_value(a) for a in node.attribute if a.name == "direction"]
    assert direction == ([b"bidirectional"] if bidirectional else []), direction
    return model


def _with_sequence_lens(model: onnx.ModelProto, kind: str) -> onnx.ModelProto:
    """The recurrent node's input 4 (sequence_lens) fed by a new int32 graph input ``lens`` (batch,)."""
    [node] = [n for n in model.graph.node if n.op_type == kind]
    while len(node.input) < 5:
        node.input.append("")
    node.input[4] = "lens"
    model.graph.input.append(helper.make_tensor_value_info("lens", TensorProto.INT32, ["batch"]))
    onnx.checker.check_model(model)
    return model


@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_a_torch_exported_rnn_with_sequence_lens_matches_onnx_runtime_and_torchs_packed_sequences(
    kind: str, bidirectional: bool
) -> None:
    torch.manual_seed(0)
    module = getattr(torch.nn, kind)(F, H, batch_first=True, bidirectional=bidirectional).eval()
    model = _with_sequence_lens(_exported(module, kind, bidirectional), kind)
    imported = import_model(model)
    x = np.random.default_rng(1).normal(size=(B, T, F)).astype(np.float32)
    x[np.arange(T)[None, :] >= LENGTHS[:, None]] = 7.0  # padding that no one reads
    got = imported(x, LENGTHS)
    runtime = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = runtime.run(None, {"x": x, "lens": LENGTHS})
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    with torch.no_grad():
        packed = pack_padded_sequence(torch.tensor(x), torch.tensor(LENGTHS, dtype=torch.int64), batch_first=True,
                                      enforce_sorted=False)  # fmt: skip
        y, state = module(packed)
        y, _ = pad_packed_sequence(y, batch_first=True, total_length=T)
    states = state if kind == "LSTM" else (state,)
    for g, w in zip(got, [y, *states], strict=True):
        np.testing.assert_allclose(g, w.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_a_torch_exported_bidirectional_rnn_imports_as_torch_runs_it(kind: str) -> None:
    torch.manual_seed(2)
    module = getattr(torch.nn, kind)(F, H, batch_first=True, bidirectional=True).eval()
    imported = import_model(_exported(module, kind, True))
    x = np.random.default_rng(3).normal(size=(2, T, F)).astype(np.float32)  # a batch other than the export's
    with torch.no_grad():
        y, state = module(torch.tensor(x))
    for g, w in zip(imported(x), [y, *(state if kind == "LSTM" else (state,))], strict=True):
        np.testing.assert_allclose(g, w.numpy(), rtol=1e-5, atol=1e-6)
