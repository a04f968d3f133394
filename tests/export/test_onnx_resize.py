"""ONNX Resize and Upsample come in, checked against ONNX Runtime and PyTorch rather than our own reading.

ONNX's own node cases run in test_onnx_import.py's conformance; here each mode
is swept against ONNX Runtime on random data, PyTorch's exports of
``interpolate`` are checked against PyTorch with a dynamic batch, an imported
upsampling trains (its gradient is PyTorch's), and every refusal says why.
"""

from __future__ import annotations

import io
import itertools
import math
import warnings
from fractions import Fraction

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import cellgraph as cg
from cellgraph.onnx import OnnxError, conformance, import_model

ort = pytest.importorskip("onnxruntime")
X = np.random.default_rng(0).standard_normal((2, 3, 5, 7)).astype(np.float32)


def resize_model(
    opset: int,
    attrs: dict[str, object],
    scales: list[float] | None = None,
    sizes: list[int] | None = None,
    roi: list[float] | None = None,
    shape: tuple[int | str, ...] = X.shape,
) -> onnx.ModelProto:
    inits = []
    names = ["x", "", "", ""]
    if opset == 11:  # Resize-11 takes roi and scales always, empty when unused
        roi = [] if roi is None else roi
        scales = [] if scales is None else scales
    for position, name, kind, value in ((1, "roi", TensorProto.FLOAT, roi), (2, "scales", TensorProto.FLOAT, scales),
                                        (3, "sizes", TensorProto.INT64, sizes)):  # fmt: skip
        if value is not None:
            names[position] = name
            inits.append(helper.make_tensor(name, kind, [len(value)], value))
    inputs = ["x", "scales"] if opset == 10 else names[: max(i for i, n in enumerate(names) if n) + 1]
    node = helper.make_node("Resize", inputs, ["y"], **attrs)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits,
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def onnx_runtime(model: onnx.ModelProto, *feeds: np.ndarray) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, dict(zip([i.name for i in session.get_inputs()], feeds, strict=True)))


SCALES = [[1, 1, 1.6, 0.6], [1, 1, 2, 3], [1, 1, 0.5, 0.4]]
# half_pixel_symmetric is left out: ONNX Runtime 1.32 rounds it differently from ONNX's text and reference, which
# cellgraph follows (its node cases pass).
COORDINATES = ["half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric"]
SWEEP = [
    (opset, mode, coordinate, rounding)
    for opset, mode, coordinate in itertools.product((11, 13, 19), ("nearest", "linear", "cubic"), COORDINATES)
    for rounding in (("round_prefer_floor", "round_prefer_ceil", "floor", "ceil") if mode == "nearest" else ("-",))
]


@pytest.mark.parametrize(("opset", "mode", "coordinate", "rounding"), SWEEP)
def test_each_mode_resizes_as_onnx_runtime_does(opset: int, mode: str, coordinate: str, rounding: str) -> None:
    attrs: dict[str, object] = {"mode": mode, "coordinate_transformation_mode": coordinate}
    if mode == "nearest":
        attrs["nearest_mode"] = rounding
    for given in [{"scales": s} for s in SCALES] + [{"sizes": [2, 3, 8, 3]}]:
        for exclude in (0, 1) if mode == "cubic" else (0,):
            model = resize_model(opset, {**attrs, "exclude_outside": exclude}, **given)  # type: ignore[arg-type]
            np.testing.assert_allclose(import_model(model)(X), onnx_runtime(model, X)[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("opset", [11, 19])
def test_tf_crop_and_resize_extrapolates_as_onnx_runtime_does(opset: int) -> None:
    for mode in ("linear", "cubic"):
        attrs = {"mode": mode, "coordinate_transformation_mode": "tf_crop_and_resize", "extrapolation_value": 7.0}
        model = resize_model(opset, attrs, sizes=[2, 3, 6, 4], roi=[0, 0, 0.2, -0.3, 1, 1, 0.9, 1.4])
        got = import_model(model)(X)
        np.testing.assert_allclose(got, onnx_runtime(model, X)[0], rtol=1e-5, atol=1e-5)
        assert (got == 7.0).any()  # the region reaches past the input: those outputs are the extrapolation value


def test_antialias_axes_and_aspect_policies_resize_as_onnx_runtime_does() -> None:
    models = [resize_model(19, {"mode": m, "antialias": 1}, sizes=s) for m in ("linear", "cubic")
              for s in ([2, 3, 3, 4], [2, 3, 2, 2], [2, 3, 9, 11])]  # fmt: skip
    models += [resize_model(19, {"mode": "nearest", "axes": [2, 3], "keep_aspect_ratio_policy": p}, sizes=[8, 9])
               for p in ("not_larger", "not_smaller")]  # fmt: skip
    models.append(resize_model(19, {"mode": "linear", "axes": [3, 2]}, scales=[1.5, 0.7]))
    for model in models:
        np.testing.assert_allclose(import_model(model)(X), onnx_runtime(model, X)[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("scales", [[1, 1, 1.6, 0.6], [1, 1, 2, 3], [1, 1, 0.5, 0.4], [1, 1, 0.7, 1.0]])
def test_resize_10_samples_as_onnx_runtime_does(scales: list[float]) -> None:
    for mode in ("nearest", "linear"):
        model = resize_model(10, {"mode": mode}, scales=scales)
        np.testing.assert_allclose(import_model(model)(X), onnx_runtime(model, X)[0], rtol=1e-5, atol=1e-5)


def test_the_cases_against_onnxs_text_are_what_onnx_runtime_computes() -> None:
    cases = {case.name: case for case in conformance.node_cases() if case.name in conformance.AGAINST_THE_SPEC}
    assert set(cases) == set(conformance.AGAINST_THE_SPEC)
    for case in cases.values():
        [(inputs, expected)] = case.data_sets
        names = [i.name for i in case.model.graph.input]
        static = {name: value for name, value in zip(names, inputs, strict=True) if name != "X"}
        ours = import_model(case.model, static_inputs=static)(inputs[0])
        theirs = onnx_runtime(case.model, *inputs)[0]
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)
        assert not np.allclose(theirs, expected[0], rtol=case.rtol, atol=case.atol)


GRID_COORDINATES = ["half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric"]
GRID = [
    (mode, coordinate, rounding)
    for mode, coordinate in itertools.product(("nearest", "linear", "cubic"), GRID_COORDINATES)
    for rounding in (("round_prefer_floor", "round_prefer_ceil", "floor", "ceil") if mode == "nearest" else ("-",))
]
GRID_SIZES = [(w, out) for w in range(2, 9) for out in range(1, 10)]


def sizes_grid_model(mode: str, coordinate: str, rounding: str) -> onnx.ModelProto:
    """One Resize of the width per (width, output width) of GRID_SIZES, sizes given: input x{w}, output y{w}_{out}."""
    attrs: dict[str, object] = {"mode": mode, "coordinate_transformation_mode": coordinate}
    if mode == "nearest":
        attrs["nearest_mode"] = rounding
    nodes, inits = [], []
    for w, out in GRID_SIZES:
        inits.append(helper.make_tensor(f"s{w}_{out}", TensorProto.INT64, [4], [1, 1, 1, out]))
        nodes.append(helper.make_node("Resize", [f"x{w}", "", "", f"s{w}_{out}"], [f"y{w}_{out}"], **attrs))
    widths = sorted({w for w, _ in GRID_SIZES})
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info(f"x{w}", TensorProto.FLOAT, [1, 1, 1, w]) for w in widths],
        [helper.make_tensor_value_info(f"y{w}_{out}", TensorProto.FLOAT, None) for w, out in GRID_SIZES], inits,
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)], ir_version=8)


def exact_nearest(w: int, out: int, coordinate: str, rounding: str) -> list[int]:
    """The input index ONNX's formulas pick for each output, in exact fractions (the scale is out / w)."""
    picked = []
    for j in range(out):
        if coordinate == "align_corners":
            x = Fraction(j * (w - 1), out - 1) if out > 1 else Fraction(0)
        elif coordinate == "asymmetric":
            x = Fraction(j * w, out)
        elif coordinate == "pytorch_half_pixel" and out == 1:
            x = Fraction(0)
        else:  # half_pixel; half_pixel_symmetric's shift is 0 when out / w is the scale exactly
            x = (j + Fraction(1, 2)) * Fraction(w, out) - Fraction(1, 2)
        below = math.floor(x)
        up = {"round_prefer_floor": x - below > Fraction(1, 2), "round_prefer_ceil": x - below >= Fraction(1, 2),
              "floor": False, "ceil": x > below}[rounding]  # fmt: skip
        picked.append(min(max(below + up, 0), w - 1))
    return picked


@pytest.mark.parametrize(("mode", "coordinate", "rounding"), GRID)
def test_a_resize_to_sizes_samples_as_onnx_runtime_and_onnxs_reference_agree(
    mode: str, coordinate: str, rounding: str
) -> None:
    """Where ONNX Runtime and onnx's reference implementation agree, cellgraph gives their values; nearest picks
    the index of the exact formula everywhere, where one of them rounds a position off its exact tie or integer
    (ONNX Runtime in float32: half_pixel_symmetric floor 5 to 3 reads index 1 for output 1, which sits at exactly
    2; the reference in float64: half_pixel floor 7 to 9 reads index 2 for output 4, at exactly 3)."""
    from onnx.reference import ReferenceEvaluator

    model = sizes_grid_model(mode, coordinate, rounding)
    widths = sorted({w for w, _ in GRID_SIZES})
    feeds = {f"x{w}": np.random.default_rng(w).standard_normal((1, 1, 1, w)).astype(np.float32) for w in widths}
    ours = import_model(model)(*feeds.values())
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    theirs, reference = session.run(None, feeds), ReferenceEvaluator(model).run(None, feeds)
    for (w, out), got, runtime, ref in zip(GRID_SIZES, ours, theirs, reference, strict=True):
        where = f"{mode} {coordinate} {rounding} {w} -> {out}"
        if np.allclose(runtime, ref, rtol=1e-5, atol=1e-5):
            np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5, err_msg=where)
        if mode == "nearest":
            np.testing.assert_array_equal(got, feeds[f"x{w}"][..., exact_nearest(w, out, coordinate, rounding)], where)


def test_the_two_nearest_ties_of_the_brief_pick_the_exact_formulas_index() -> None:
    x = np.arange(7, dtype=np.float32).reshape(1, 1, 1, 7)
    attrs = {"mode": "nearest", "coordinate_transformation_mode": "asymmetric", "nearest_mode": "round_prefer_ceil"}
    # Output 2 sits at 2 * 7 / 4 = 3.5, a tie that goes up (float32 of the scale put it at 3.4999998, read 3).
    assert import_model(resize_model(19, attrs, sizes=[1, 1, 1, 4], shape=x.shape))(x).ravel().tolist() == [0, 2, 4, 5]
    attrs = {"mode": "nearest", "coordinate_transformation_mode": "half_pixel_symmetric", "nearest_mode": "floor"}
    # Output 1 sits at exactly 2 (ONNX Runtime 1.32 computes 1.9999999 and reads 1; onnx's reference reads 2).
    y = np.arange(5, dtype=np.float32).reshape(1, 1, 5, 1)
    assert import_model(resize_model(19, attrs, sizes=[1, 1, 3, 1], shape=y.shape))(y).ravel().tolist() == [0, 2, 3]


def test_an_aspect_policys_scale_is_its_exact_ratio_on_the_other_axis_too() -> None:
    """not_larger 5 x 7 to (3, 4): the scale is 4 / 7 on both axes, height 5 -> 3 puts output 2 at exactly 3.5
    (float32's 3.4999998 read index 3; ONNX Runtime and onnx's reference read 4)."""
    from onnx.reference import ReferenceEvaluator

    x = np.arange(35, dtype=np.float32).reshape(1, 1, 5, 7)
    attrs = {"mode": "nearest", "coordinate_transformation_mode": "asymmetric", "nearest_mode": "round_prefer_ceil",
             "axes": [2, 3], "keep_aspect_ratio_policy": "not_larger"}  # fmt: skip
    model = resize_model(19, attrs, sizes=[3, 4], shape=x.shape)
    got = import_model(model)(x)
    assert got[0, 0, :, 0].tolist() == [0, 14, 28]  # rows 0, 2 and 4
    np.testing.assert_array_equal(got, onnx_runtime(model, x)[0])
    np.testing.assert_array_equal(got, ReferenceEvaluator(model).run(None, {"x": x})[0])


def exported_with_a_dynamic_batch(module: object, example: object, opset: int) -> onnx.ModelProto:
    """PyTorch's (TorchScript) export of ``module`` with input ``x`` and output ``y``, its batch dimension dynamic."""
    import torch

    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module, (example,), buffer, dynamo=False, opset_version=opset, input_names=["x"], output_names=["y"],
            dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}},
        )  # fmt: skip
    return onnx.load_from_string(buffer.getvalue())


class Interpolate:
    """``torch.nn.functional.interpolate`` with fixed arguments, as a module to export."""

    def __new__(cls, **options: object) -> object:
        import torch

        class Module(torch.nn.Module):
            def forward(self, x: torch.Tensor) -> torch.Tensor:
                return torch.nn.functional.interpolate(x, **options)  # type: ignore[arg-type]

        return Module()


@pytest.mark.parametrize(
    "options",
    [
        {"scale_factor": 2, "mode": "nearest"},
        {"scale_factor": 0.6, "mode": "nearest"},
        {"scale_factor": 2, "mode": "bilinear", "align_corners": False},
        {"scale_factor": 1.5, "mode": "bilinear", "align_corners": True},
        {"scale_factor": 2, "mode": "bicubic", "align_corners": False},
        {"size": (7, 5), "mode": "bilinear", "align_corners": False},
        {"size": (3, 4), "mode": "nearest"},
    ],
    ids=lambda options: "-".join(f"{k}={v}" for k, v in options.items()),
)
def test_pytorchs_export_of_interpolate_gives_pytorchs_values_at_any_batch(options: dict[str, object]) -> None:
    torch = pytest.importorskip("torch")
    module = Interpolate(**options)
    model = import_model(exported_with_a_dynamic_batch(module, torch.randn(2, 3, 6, 8), opset=18))
    for batch in (1, 3):
        x = torch.randn(batch, 3, 6, 8)
        np.testing.assert_allclose(model(x.numpy()), module(x).numpy(), rtol=1e-5, atol=2e-5)


def test_an_imported_upsampling_passes_pytorchs_gradient_back() -> None:
    torch = pytest.importorskip("torch")
    model = resize_model(17, {"mode": "cubic", "coordinate_transformation_mode": "half_pixel"}, scales=[1, 1, 1.6, 0.6])
    imported = import_model(model)
    x = imported.inputs[0]
    y = imported.outputs[0]
    weights = np.random.default_rng(1).standard_normal((2, 3, 8, 4)).astype(np.float32)
    with imported.graph.as_default():
        [grad] = cg.gradients(cg.reduce_sum(y * cg.constant(weights)), [x])
    ours = imported.session.run(grad, {x: X})
    tx = torch.tensor(X, requires_grad=True)
    out = torch.nn.functional.interpolate(tx, scale_factor=(1.6, 0.6), mode="bicubic", align_corners=False)
    (out * torch.tensor(weights)).sum().backward()
    np.testing.assert_allclose(ours, tx.grad.numpy(), rtol=1e-4, atol=1e-5)


def test_a_pytorch_unet_with_upsampling_imports_and_backpropagates_as_pytorch() -> None:
    """A small U-Net (convolutions, batch norm folded by the exporter, max pools, bilinear and nearest upsampling,
    skip concatenations), exported with a dynamic batch: its outputs and its input gradient are PyTorch's."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)

    def block(inputs: int, outputs: int) -> object:
        return torch.nn.Sequential(
            torch.nn.Conv2d(inputs, outputs, 3, padding=1), torch.nn.BatchNorm2d(outputs), torch.nn.ReLU()
        )

    class UNet(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.down1, self.down2, self.middle = block(3, 8), block(8, 16), block(16, 16)
            self.up2, self.up1, self.head = block(32, 8), block(16, 8), torch.nn.Conv2d(8, 2, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            f = torch.nn.functional
            a = self.down1(x)
            b = self.down2(f.max_pool2d(a, 2))
            m = self.middle(f.max_pool2d(b, 2))
            u = self.up2(torch.cat([f.interpolate(m, scale_factor=2, mode="bilinear"), b], 1))
            return self.head(self.up1(torch.cat([f.interpolate(u, scale_factor=2, mode="nearest"), a], 1)))

    unet = UNet().eval()
    for layer in unet.modules():
        if isinstance(layer, torch.nn.BatchNorm2d):
            layer.running_mean.uniform_(-0.5, 0.5)
            layer.running_var.uniform_(0.5, 2.0)
    exported = exported_with_a_dynamic_batch(unet, torch.randn(2, 3, 16, 16), opset=17)
    assert "Resize" in {node.op_type for node in exported.graph.node}
    imported = import_model(exported)
    for batch in (1, 4):
        x = torch.randn(batch, 3, 16, 16, requires_grad=True)
        weights = torch.randn(batch, 2, 16, 16)
        (unet(x) * weights).sum().backward()
        with imported.graph.as_default():
            loss = cg.reduce_sum(imported.outputs[0] * cg.constant(weights.numpy()))
            [grad] = cg.gradients(loss, [imported.inputs[0]])
        got_y, got_grad = imported.session.run([imported.outputs[0], grad], {imported.inputs[0]: x.detach().numpy()})
        np.testing.assert_allclose(got_y, unet(x).detach().numpy(), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(got_grad, x.grad.numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    ("model", "words"),
    [
        (
            resize_model(19, {"mode": "linear"}, scales=[1, 1, 2, 2], sizes=[2, 3, 10, 14]),
            "Resize given both scales and sizes, or neither: it takes exactly one",
        ),
        (
            resize_model(19, {"mode": "linear"}, scales=[1, 1, 2, 2], shape=(2, 3, "h", 7)),
            r"Resize of axes \[2\] of an input of shape \[2, 3, None, 7\]: their sizes must be known and above 0",
        ),
        (
            resize_model(19, {"mode": "nearest", "antialias": 1}, scales=[1, 1, 0.5, 0.5]),
            "Resize with antialias in nearest mode",
        ),
        (
            resize_model(
                19, {"mode": "linear", "coordinate_transformation_mode": "tf_crop_and_resize"}, sizes=[2, 3, 4, 4]
            ),
            r"Resize by tf_crop_and_resize without a region of interest \(input 1\)",
        ),
        (resize_model(19, {"mode": "linear"}, scales=[1, 1, 0, 2]), r"every scale must be above 0"),
        (resize_model(19, {"mode": "linear"}, scales=[1, 2]), r"Resize with 2 scales for 4 axes"),
        (resize_model(19, {"mode": "area"}, scales=[1, 1, 2, 2]), r"Resize mode 'area' \(ONNX's are nearest, linear"),
        (
            resize_model(19, {"mode": "nearest"}, scales=[1, 1, 0.1, 0.1]),
            r"to sizes \[0, 0\]: every output size must be at least 1",
        ),
        (
            resize_model(19, {"mode": "linear", "coordinate_transformation_mode": "edges"}, scales=[1, 1, 2, 2]),
            r"coordinate_transformation_mode 'edges'",
        ),
        (
            resize_model(19, {"mode": "nearest", "nearest_mode": "up"}, scales=[1, 1, 2, 2]),
            r"nearest_mode 'up' \(ONNX's are round_prefer_floor, round_prefer_ceil, floor, ceil\)",
        ),
        (
            resize_model(19, {"mode": "nearest", "keep_aspect_ratio_policy": "fit"}, sizes=[2, 3, 8, 8]),
            r"keep_aspect_ratio_policy 'fit' \(ONNX's are stretch, not_larger, not_smaller\)",
        ),
        (
            resize_model(
                19,
                {"mode": "linear", "coordinate_transformation_mode": "tf_crop_and_resize"},
                sizes=[2, 3, 4, 4],
                roi=[0, 0, 1, 1],
            ),
            r"Resize with a region of interest of 4 values for 4 axes \(it takes 2 per axis\)",
        ),
    ],
    ids=[
        "both",
        "dynamic-height",
        "antialias-nearest",
        "crop-without-roi",
        "zero-scale",
        "too-few",
        "area",
        "empty",
        "coordinates",
        "rounding",
        "policy",
        "roi-length",
    ],
)
def test_a_resize_cellgraph_cannot_build_is_refused_with_its_reason(model: onnx.ModelProto, words: str) -> None:
    with pytest.raises(OnnxError, match=words):
        import_model(model)


def test_a_linear_resize_of_integers_is_refused_and_nearest_takes_them() -> None:
    ints = resize_model(19, {"mode": "linear"}, scales=[1, 1, 2, 2])
    ints.graph.input[0].type.tensor_type.elem_type = TensorProto.INT32
    ints.graph.output[0].type.tensor_type.elem_type = TensorProto.INT32
    with pytest.raises(OnnxError, match=r"linear Resize of int32 \(cellgraph resamples floats this way"):
        import_model(ints)
    ints.graph.node[0].attribute[0].s = b"nearest"
    x = np.arange(X.size, dtype=np.int32).reshape(X.shape)
    np.testing.assert_array_equal(import_model(ints)(x), onnx_runtime(ints, x)[0])
