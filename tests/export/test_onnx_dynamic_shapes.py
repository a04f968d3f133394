"""Reshapes computed from a run-time shape (a dynamic batch) import: the chain Shape, Gather, arithmetic,
Unsqueeze, Concat is computed at import with the batch unknown, and the Reshape infers it at run time.
Checked against ONNX Runtime and, for PyTorch's own export of attention, against PyTorch."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from cellgraph.onnx import OnnxError, import_model

onnxruntime = pytest.importorskip("onnxruntime")


def _const(name: str, values: list[int]) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.array(values, np.int64)))


def _model(
    nodes: list[onnx.NodeProto], dims: list[int | str | None], extra_outputs: tuple[str, ...] = ()
) -> onnx.ModelProto:
    outputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in ("y", *extra_outputs)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)], outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _heads(dims: list[int | str | None]) -> list[onnx.NodeProto]:
    """x (batch, 5, 16) split into 2 heads of 8 and the heads merged into the batch, as attention does:
    every Reshape target computed from Shape(x), the batch times the heads included."""
    return [
        helper.make_node("Shape", ["x"], ["shape"]),
        _const("at0", [0]),
        _const("at1", [1]),
        _const("heads", [2]),
        _const("width", [8]),
        helper.make_node("Gather", ["shape", "at0"], ["batch"], axis=0),
        helper.make_node("Gather", ["shape", "at1"], ["length"], axis=0),
        helper.make_node("Concat", ["batch", "length", "heads", "width"], ["split"], axis=0),
        helper.make_node("Reshape", ["x", "split"], ["x4"]),  # (batch, 5, 2, 8)
        helper.make_node("Transpose", ["x4"], ["xt"], perm=[0, 2, 1, 3]),  # (batch, 2, 5, 8)
        helper.make_node("Mul", ["batch", "heads"], ["batch_heads"]),
        helper.make_node("Concat", ["batch_heads", "length", "width"], ["merged"], axis=0),
        helper.make_node("Reshape", ["xt", "merged"], ["y"]),  # (batch * 2, 5, 8)
    ]


@pytest.mark.parametrize("batch", ["batch", None])
def test_a_reshape_computed_from_a_dynamic_batch_runs_at_every_batch_as_onnx_runtime_does(
    tmp_path: Path, batch: str | None
) -> None:
    model = _model(_heads([batch, 5, 16]), [batch, 5, 16])
    path = tmp_path / "heads.onnx"
    onnx.save(model, str(path))
    imported = import_model(path)
    assert imported.inputs[0].shape == (None, 5, 16)
    runtime = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for rows in (1, 3, 8):
        x = np.random.default_rng(rows).normal(size=(rows, 5, 16)).astype(np.float32)
        (want,) = runtime.run(None, {"x": x})
        got = imported(x)
        assert got.shape == want.shape == (rows * 2, 5, 8)
        np.testing.assert_array_equal(got, want)


def test_a_shape_chain_whose_dims_are_all_static_is_a_constant() -> None:
    imported = import_model(_model(_heads([3, 5, 16]), [3, 5, 16]))
    assert [n.op for n in imported.graph if n.op == "Shape"] == []
    assert imported(np.zeros((3, 5, 16), np.float32)).shape == (6, 5, 8)


def test_a_reshape_with_two_dims_unknown_until_run_time_is_refused_naming_it() -> None:
    # Batch and length both dynamic: (batch, length, 2, 8) has two unknown dims.
    with pytest.raises(
        OnnxError,
        match=r"a Reshape to \[None, None, 2, 8\], whose dims unknown until run time \(None, -1\) are more than one: "
        r"cellgraph reshapes with at most one \(Reshape node 'Reshape->x4', opset 17\)",
    ):
        import_model(_model(_heads(["batch", "length", 16]), ["batch", "length", 16]))


def test_a_run_time_dim_read_as_a_tensor_is_refused_before_anything_is_built() -> None:
    nodes = _heads(["batch", 5, 16])
    # The batch size, known only at run time, scaled into the data: a tensor cellgraph cannot make at import.
    nodes += [
        helper.make_node("Cast", ["batch"], ["batch_f"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["y", "batch_f"], ["scaled"]),
    ]
    with pytest.raises(
        OnnxError,
        match=r"input 0 \('batch'\) of Cast node 'Cast->batch_f', opset 17 is computed from a run-time shape and "
        r"known only in part when the graph is built \(\[None\]; None is unknown until run time\)",
    ):
        import_model(_model(nodes, ["batch", 5, 16], extra_outputs=("scaled",)))


def test_pytorchs_export_of_attention_with_a_dynamic_batch_imports_and_matches_pytorch(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm = torch.nn.LayerNorm(16)
            self.attention = torch.nn.MultiheadAttention(16, 2, batch_first=True)
            self.head = torch.nn.Linear(16, 3)

        def forward(self, x: object) -> object:
            h = self.norm(x)
            a, _ = self.attention(h, h, h)
            return torch.softmax(self.head((h + a).mean(dim=1)), -1)

    block = Block().eval()
    path = tmp_path / "attention.onnx"
    with warnings.catch_warnings():  # the TorchScript exporter's deprecation notice
        warnings.simplefilter("ignore")
        torch.onnx.export(
            block, (torch.zeros(2, 5, 16),), str(path), input_names=["x"], output_names=["y"],
            dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}}, opset_version=17, dynamo=False,
        )  # fmt: skip
    assert "Shape" in {n.op_type for n in onnx.load(str(path)).graph.node}  # the reshapes read the batch
    imported = import_model(path)
    for rows in (1, 4, 7):
        x = torch.randn(rows, 5, 16)
        with torch.no_grad():
            want = block(x).numpy()
        np.testing.assert_allclose(imported(x.numpy()), want, rtol=0, atol=1e-6)
