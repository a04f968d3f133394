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
        match=r"a Reshape to \[x.shape\[0\], x.shape\[1\], 2, 8\] has more than one dim unknown until run time "
        r"\(a run-time dim, or -1\): cellgraph reshapes with at most one \(Reshape node 'Reshape->x4', opset 17\)",
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
        r"known only in part when the graph is built \(\[x.shape\[0\]\]; a tensor's dim, or None, is known only "
        r"when it runs\)",
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


def test_a_fill_and_a_reshape_that_keep_a_dynamic_batch_in_place_run_as_onnx_runtime_does(tmp_path: Path) -> None:
    # zeros(1, batch, 6) from ConstantOfShape of [1, Shape(x)[0], 6] (an RNN's initial state), an Expand of
    # a row to (batch, 6), and Reshape(x, [0, -1]) whose -1 is static once the batch is copied in place.
    fill = numpy_helper.from_array(np.array([0.5], np.float32))
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        _const("at0", [0]),
        _const("one", [1]),
        _const("six", [6]),
        helper.make_node("Gather", ["shape", "at0"], ["batch"], axis=0),
        helper.make_node("Concat", ["one", "batch", "six"], ["state_shape"], axis=0),
        helper.make_node("ConstantOfShape", ["state_shape"], ["state"], value=fill),
        helper.make_node("Concat", ["batch", "six"], ["rows_shape"], axis=0),
        helper.make_node("Expand", ["row", "rows_shape"], ["rows"]),
        _const("keep_flat", [0, -1]),
        helper.make_node("Reshape", ["x", "keep_flat"], ["flat"]),  # (batch, 12)
        helper.make_node("Concat", ["flat", "rows"], ["joined"], axis=1),  # (batch, 18)
        helper.make_node("Add", ["joined", "joined"], ["y"]),
    ]
    row = numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(1, 6), "row")
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 4])],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in ("y", "state")],
        [row],
    )
    path = tmp_path / "fills.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    imported = import_model(path)
    runtime = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for rows in (1, 5):
        x = np.random.default_rng(rows).normal(size=(rows, 3, 4)).astype(np.float32)
        want = runtime.run(None, {"x": x})
        got = imported(x)
        for g, w in zip(got, want, strict=True):
            assert g.shape == w.shape
            np.testing.assert_array_equal(g, w)
    assert want[1].shape == (1, 5, 6)


def test_a_fill_of_a_dim_computed_from_a_run_time_shape_is_refused_naming_it() -> None:
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        _const("at0", [0]),
        _const("two", [2]),
        helper.make_node("Gather", ["shape", "at0"], ["batch"], axis=0),
        helper.make_node("Mul", ["batch", "two"], ["doubled"]),
        helper.make_node("ConstantOfShape", ["doubled"], ["y"], name="zeros"),
    ]
    with pytest.raises(
        OnnxError,
        match=r"ConstantOfShape node 'zeros', opset 17 fills a shape known only when the graph runs: dims \[0\] of "
        r"\[None\] are computed from a run-time shape, not read from one tensor",
    ):
        import_model(_model(nodes, ["batch", 3]))


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_pytorchs_recurrent_layers_with_a_dynamic_batch_import_and_match_pytorch(tmp_path: Path, kind: str) -> None:
    torch = pytest.importorskip("torch")
    torch.manual_seed(1)
    # Two stacked bidirectional layers, batch first: each ONNX node, its zero initial state made from the
    # batch at run time (ConstantOfShape of Shape), and Reshape [0, 0, -1] between the layers.
    layer = getattr(torch.nn, kind)(8, 6, num_layers=2, bidirectional=True, batch_first=True).eval()
    path = tmp_path / f"{kind}.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            layer, (torch.zeros(2, 5, 8),), str(path), input_names=["x"], dynamic_axes={"x": {0: "batch"}},
            opset_version=17, dynamo=False,
        )  # fmt: skip
    ops = {n.op_type for n in onnx.load(str(path)).graph.node}
    assert {kind, "ConstantOfShape", "Shape"} <= ops
    imported = import_model(path)
    for rows in (1, 3):
        x = torch.randn(rows, 5, 8)
        with torch.no_grad():
            output, state = layer(x)
        states = state if isinstance(state, tuple) else (state,)
        got = imported(x.numpy())
        for g, w in zip(got, (output, *states), strict=True):
            np.testing.assert_allclose(g, w.numpy(), rtol=0, atol=1e-6)
