"""ONNX's convolutions and MaxPool's Indices, both ways: imported as cellgraph's own conv2d /
conv2d_transpose / max_pool_with_argmax (one op each, not a rewrite), checked by ONNX
Runtime; and what cannot cross, refused with the words a user reads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import cellgraph as cg
from cellgraph.onnx import OnnxError

RNG = np.random.default_rng(11)


def _model(
    node: onnx.NodeProto, x_shape: list[Any], inits: list[onnx.TensorProto], outputs: int = 1
) -> onnx.ModelProto:
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT if i == 0 else TensorProto.INT64, None)
         for i, name in enumerate(node.output[:outputs])],
        inits,
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _ort(model: onnx.ModelProto, x: np.ndarray) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return list(session.run(None, {"x": x}))


def _weights(*shape: int) -> list[onnx.TensorProto]:
    return [numpy_helper.from_array(RNG.normal(size=shape).astype(np.float32), "w")]


def test_a_grouped_dilated_padded_conv_imports_as_one_conv2d() -> None:
    node = helper.make_node("Conv", ["x", "w"], ["y"], group=2, dilations=[2, 1], pads=[1, 0, 2, 1], strides=[1, 2])
    model = _model(node, ["n", 4, 7, 6], _weights(6, 2, 3, 2))
    imported = cg.onnx.import_model(model)
    convs = [n for n in imported.graph if n.op == "Conv2D"]
    assert len(convs) == 1 and {n.op for n in imported.graph}.isdisjoint({"Concat", "Pad", "MatMul"})
    assert convs[0].attrs["groups"] == 2 and convs[0].attrs["dilations"] == (2, 1)
    assert convs[0].attrs["padding"] == ((1, 2), (0, 1))
    x = RNG.normal(size=(3, 4, 7, 6)).astype(np.float32)
    np.testing.assert_allclose(imported(x), _ort(model, x)[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    "attrs",
    [
        {"strides": [2, 2], "output_padding": [1, 0]},
        {"strides": [2, 1], "pads": [1, 0, 0, 1], "dilations": [1, 2]},
        {"strides": [2, 2], "output_shape": [9, 7]},
        {"strides": [2, 2], "auto_pad": "SAME_LOWER", "group": 2},
    ],
    ids=["output-padding", "pads-dilated", "output-shape", "same-lower-grouped"],
)
def test_conv_transpose_imports_and_matches_onnx_runtime(attrs: dict[str, Any]) -> None:
    group = attrs.get("group", 1)
    node = helper.make_node("ConvTranspose", ["x", "w"], ["y"], kernel_shape=[3, 3], **attrs)
    model = _model(node, ["n", 4, 4, 3], _weights(4, 3 // group if group == 1 else 1, 3, 3))
    imported = cg.onnx.import_model(model)
    assert [n.op for n in imported.graph].count("Conv2DTranspose") == 1
    x = RNG.normal(size=(2, 4, 4, 3)).astype(np.float32)
    want = _ort(model, x)[0]
    got = imported(x)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("storage_order", [0, 1])
@pytest.mark.parametrize("pads", [{"pads": [1, 0, 0, 1]}, {"auto_pad": "SAME_UPPER"}], ids=["pads", "same"])
def test_max_pool_indices_import_as_onnx_numbers_them(storage_order: int, pads: dict[str, Any]) -> None:
    node = helper.make_node("MaxPool", ["x"], ["y", "i"], kernel_shape=[2, 3], strides=[2, 1],
                            storage_order=storage_order, **pads)  # fmt: skip
    model = _model(node, ["n", 3, 5, 6], [], outputs=2)
    x = RNG.permutation(2 * 3 * 5 * 6).astype(np.float32).reshape(2, 3, 5, 6)  # no ties
    got_y, got_i = cg.onnx.import_model(model)(x)
    want_y, want_i = _ort(model, x)
    np.testing.assert_array_equal(got_y, want_y)
    np.testing.assert_array_equal(got_i, want_i)


def test_conv_transpose_over_an_unknown_width_is_refused() -> None:
    node = helper.make_node("ConvTranspose", ["x", "w"], ["y"], name="up", kernel_shape=[3, 3])
    with pytest.raises(OnnxError, match=r"ConvTranspose over an input whose height or width is unknown until the "
                       r"graph runs has no cellgraph equivalent \(ConvTranspose node 'up', opset 17\)"):  # fmt: skip
        cg.onnx.import_model(_model(node, ["n", 4, 4, "w"], _weights(4, 2, 3, 3)))


def test_conv_transpose_output_wider_than_the_full_convolution_is_refused() -> None:
    node = helper.make_node("ConvTranspose", ["x", "w"], ["y"], name="up", kernel_shape=[3, 3], output_shape=[12, 12])
    with pytest.raises(OnnxError, match=r"ConvTranspose whose output \(12\) starts before or is wider than the full "
                       r"transposed convolution has no cellgraph equivalent"):  # fmt: skip
        cg.onnx.import_model(_model(node, ["n", 4, 4, 4], _weights(4, 2, 3, 3)))


def test_max_pool_indices_over_unknown_channels_are_refused() -> None:
    node = helper.make_node("MaxPool", ["x"], ["y", "i"], name="pool", kernel_shape=[2, 2])
    with pytest.raises(OnnxError, match=r"MaxPool's Indices output over an input whose channels, height or width are "
                       r"unknown has no cellgraph equivalent \(MaxPool node 'pool', opset 17\)"):  # fmt: skip
        cg.onnx.import_model(_model(node, ["n", "c", 4, 4], [], outputs=2))


def test_exports_that_need_a_known_size_name_the_node(tmp_path: Path) -> None:
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((None, None, None, 3), name="x")
        up = cg.conv2d_transpose(x, cg.constant(np.ones((3, 3, 2, 3), np.float32)), strides=2, name="up")
        _, at = cg.nn.max_pool_with_argmax(x, name="pool")
    session = cg.Session(g)
    with pytest.raises(OnnxError, match=r"^Conv2DTranspose 'up' .*: a transposed convolution exports only with a "
                       r"known height and width"):  # fmt: skip
        cg.onnx.export(tmp_path / "up.onnx", [x], up, session)
    with pytest.raises(OnnxError, match=r"^MaxPoolWithArgmax 'pool' .*: max_pool_with_argmax exports only with a "
                       r"known height, width and channels"):  # fmt: skip
        cg.onnx.export(tmp_path / "pool.onnx", [x], cg.cast(at, "float32"), session)


@pytest.mark.parametrize("opset", [17, 19])
def test_dilated_pools_export_and_match_onnx_runtime(opset: int, tmp_path: Path) -> None:
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((None, 7, 8, 2), name="x")
        y = cg.max_pool(x, (2, 3), (1, 2), dilations=(2, 2))  # (N, 5, 2, 2)
        if opset >= 19:
            y = y + cg.avg_pool(x, 3, (1, 2), dilations=(1, 3))[:, :5, :2]  # (N, 5, 1, 2), broadcast
    model = cg.onnx.export(tmp_path / "m.onnx", [x], y, cg.Session(g), opset=opset)
    data = RNG.normal(size=(3, 7, 8, 2)).astype(np.float32)
    np.testing.assert_allclose(_ort(model, data)[0], cg.Session(g).run(y, {x: data}), rtol=1e-5, atol=1e-6)


def test_a_dilated_average_pool_needs_opset_19(tmp_path: Path) -> None:
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((None, 7, 8, 2), name="x")
        y = cg.avg_pool(x, 2, 1, dilations=2, name="pool")
    with pytest.raises(OnnxError, match=r"^AvgPool 'pool' .*: a dilated AveragePool needs opset 19 or newer, not 17"):
        cg.onnx.export(tmp_path / "m.onnx", [x], y, cg.Session(g), opset=17)


@pytest.mark.parametrize(("strides", "dilations"), [((1, 1), (2, 2)), ((2, 1), (2, 3))], ids=["d2", "s2-d23"])
def test_a_dilated_same_conv_exports_with_its_pads_and_matches_onnx_runtime(
    strides: tuple[int, int], dilations: tuple[int, int], tmp_path: Path
) -> None:
    # ONNX Runtime refuses a dilated Conv with auto_pad SAME_UPPER: the export writes the pads out.
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((None, 7, 8, 2), name="x")
        w = cg.constant(RNG.normal(size=(3, 2, 2, 4)).astype(np.float32))
        y = cg.conv2d(x, w, strides=strides, padding="SAME", dilations=dilations)
        z = cg.placeholder((None, None, None, 2), name="z")
        unknown = cg.conv2d(z, w, padding="SAME", dilations=dilations, name="unknown")
    model = cg.onnx.export(tmp_path / "m.onnx", [x], y, cg.Session(g))
    data = RNG.normal(size=(2, 7, 8, 2)).astype(np.float32)
    np.testing.assert_allclose(_ort(model, data)[0], cg.Session(g).run(y, {x: data}), rtol=1e-4, atol=1e-5)
    with pytest.raises(OnnxError, match=r"^Conv2D 'unknown' .*: a dilated convolution with SAME padding exports only "
                       r"with a known height and width"):  # fmt: skip
        cg.onnx.export(tmp_path / "u.onnx", [z], unknown, cg.Session(g))
