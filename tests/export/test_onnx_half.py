"""cellgraph's narrow dtypes across ONNX: float16, bfloat16, int8, uint8 and int16, both ways, initializers included."""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import cellgraph as cg
from cellgraph.dataflow.ops import activations as act
from cellgraph.onnx.common import DTYPE_TO_ONNX

RNG = np.random.default_rng(17)
ONNX_HALF = {"float16": TensorProto.FLOAT16, "bfloat16": TensorProto.BFLOAT16}


def _half_model(dtype: str) -> tuple[cg.Graph, cg.Tensor, cg.Tensor]:
    """A small image model stored entirely in ``dtype``: conv, pools, dense, normalisation, activations."""
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((None, 6, 6, 2), dtype, name="x")
        w = cg.variable(RNG.normal(size=(3, 3, 2, 4)).astype(dtype), dtype=dtype, name="conv_w")
        h = act.elu(cg.conv2d(x, w, padding="SAME"), 0.5)
        h = cg.max_pool(h, 2, 2) + cg.avg_pool(h, 2, 2)  # (N, 3, 3, 4)
        h = cg.reshape(h, (-1, 36))
        dense = cg.variable(RNG.normal(size=(36, 5)).astype(dtype) * 0.2, dtype=dtype, name="dense_w")
        bias = cg.variable(np.linspace(-1, 1, 5).astype(dtype), dtype=dtype, name="dense_b")
        h = act.gelu(cg.bias_add(cg.matmul(h, dense), bias))
        with cg.layers.policy(f"mixed_{dtype}"):  # a layer keeps a half input half under a mixed policy only
            h = act.softplus(cg.layers.layer_norm(h, name="norm"))
        y = cg.softmax(h, name="probs")
    return g, x, y


def _images(dtype: str, rows: int) -> np.ndarray:
    return RNG.normal(size=(rows, 6, 6, 2)).astype(dtype)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_a_half_float_model_exports_in_its_own_type_and_gives_the_sessions_outputs(dtype: str, tmp_path: Path) -> None:
    g, x, y = _half_model(dtype)
    session = cg.Session(g)
    model = cg.onnx.export(tmp_path / "m.onnx", x, y, session)  # onnx.checker (full) passed
    code = ONNX_HALF[dtype]
    assert model.graph.input[0].type.tensor_type.elem_type == code
    assert model.graph.output[0].type.tensor_type.elem_type == code
    assert {i.name: i.data_type for i in model.graph.initializer if i.name.endswith(("_w", "_b"))} == {
        "conv_w": code,
        "dense_w": code,
        "dense_b": code,
    }
    images = _images(dtype, 7)
    want = session.run(y, {x: images})
    if dtype == "float16":
        # ONNX Runtime has float16 CPU kernels for every op here; some compute in float16 itself.
        runtime = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        [got] = runtime.run(None, {"x": images})
    else:
        # ONNX Runtime's CPU provider has no bfloat16 kernels for these ops (nor takes bfloat16 arrays
        # from Python): ONNX's reference implementation runs the export instead.
        [got] = ReferenceEvaluator(model).run(None, {"x": images})
    assert got.dtype == want.dtype == np.dtype(cg.dataflow.dtypes.DTYPES[dtype])
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), atol=2e-2)
    assert (got.astype(np.float32).argmax(1) == want.astype(np.float32).argmax(1)).all()


def test_a_bfloat16_op_onnx_has_no_bfloat16_for_is_computed_in_float32_between_casts(tmp_path: Path) -> None:
    g, x, y = _half_model("bfloat16")
    # bfloat16="keep": bfloat16 wherever the opset has it (the default computes every such op in float32).
    model = cg.onnx.export(tmp_path / "m.onnx", x, y, cg.Session(g), opset=17, bfloat16="keep")
    by_output = {o: n for n in model.graph.node for o in n.output}
    # Opset 17 has no bfloat16 Conv or pools: each reads its bfloat16 inputs through a Cast to float.
    # (Elu is exported as Exp, Log and Where, which have bfloat16, for its accuracy near 0.)
    for op in ("Conv", "MaxPool", "AveragePool", "Softplus"):
        node = next(n for n in model.graph.node if n.op_type == op)
        sources = [by_output[i] for i in node.input if i in by_output]
        assert sources and all(s.op_type == "Cast" for s in sources[:1]), op
        assert helper.get_attribute_value(sources[0].attribute[0]) == TensorProto.FLOAT
    # MatMul, Gelu's Erf and Softmax take bfloat16 in opset 17: they stay in it.
    matmul = next(n for n in model.graph.node if n.op_type == "MatMul")
    assert "dense_w" in matmul.input
    # float16 has every one of these ops in ONNX: no Cast is added. The two there are the graph's own: the layer
    # norm, under a mixed policy, takes its statistics of the gelu's output in float32 and gives float16 back.
    g16, x16, y16 = _half_model("float16")
    model16 = cg.onnx.export(tmp_path / "m16.onnx", x16, y16, cg.Session(g16))
    casts = [list(n.input) for n in model16.graph.node if n.op_type == "Cast"]
    assert sorted(casts) == [["gelu"], ["norm/output_wide"]], casts


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_an_exported_half_model_imported_again_keeps_its_dtype_and_outputs(dtype: str, tmp_path: Path) -> None:
    g, x, y = _half_model(dtype)
    session = cg.Session(g)
    cg.onnx.export(tmp_path / "m.onnx", x, y, session)
    imported = cg.onnx.import_model(tmp_path / "m.onnx")
    assert [t.dtype for t in imported.inputs] == [dtype] and imported.outputs[0].dtype == dtype
    assert imported.signature["widened"] == {}
    variables = {v.name: v for v in imported.graph.variables()}
    assert variables["dense_w"].output(0).dtype == dtype
    assert variables["dense_w"].attrs["trainable"]  # a half variable can be fine-tuned
    images = _images(dtype, 5)
    got, want = imported(images), session.run(y, {x: images})
    assert got.dtype == want.dtype
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), atol=2e-2)


def _onnx_model(nodes: list[onnx.NodeProto], inputs: dict[str, int], outputs: dict[str, int],
                initializers: list[onnx.TensorProto] = ()) -> onnx.ModelProto:  # type: ignore[assignment]  # fmt: skip
    graph = helper.make_graph(
        nodes,
        "narrow",
        [helper.make_tensor_value_info(n, code, ["n"]) for n, code in inputs.items()],
        [helper.make_tensor_value_info(n, code, ["n"]) for n, code in outputs.items()],
        list(initializers),
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_narrow_onnx_types_import_in_their_own_dtype_and_wrap_as_onnx() -> None:
    model = _onnx_model(
        [
            helper.make_node("Add", ["a", "b"], ["sum8"]),
            helper.make_node("Mul", ["u", "k"], ["product_u8"]),
            helper.make_node("Sub", ["s", "s16"], ["difference16"]),
            helper.make_node("Mul", ["h", "h"], ["square16"]),
            helper.make_node("Add", ["bf", "bf"], ["twice_bf16"]),
            helper.make_node("Add", ["w", "w"], ["sum_u16"]),
        ],
        {"a": TensorProto.INT8, "b": TensorProto.INT8, "u": TensorProto.UINT8, "s": TensorProto.INT16,
         "h": TensorProto.FLOAT16, "bf": TensorProto.BFLOAT16, "w": TensorProto.UINT16},
        {"sum8": TensorProto.INT8, "product_u8": TensorProto.UINT8, "difference16": TensorProto.INT16,
         "square16": TensorProto.FLOAT16, "twice_bf16": TensorProto.BFLOAT16, "sum_u16": TensorProto.UINT16},
        [numpy_helper.from_array(np.array([3, 3, 3], np.uint8), "k"),
         numpy_helper.from_array(np.array([30000, -30000, 5], np.int16), "s16")],
    )  # fmt: skip
    feeds = {
        "a": np.array([100, -100, 3], np.int8),
        "b": np.array([100, -100, 4], np.int8),
        "u": np.array([100, 7, 255], np.uint8),
        "s": np.array([10000, -10000, 1], np.int16),
        "h": np.array([1.5, -2.25, 300.0], np.float16),
        "bf": np.array([1.5, 3.0e38, -0.1], ml_dtypes.bfloat16),
        "w": np.array([65535, 2, 40000], np.uint16),
    }
    with np.errstate(over="ignore"):
        want = ReferenceEvaluator(model).run(None, feeds)
    imported = cg.onnx.import_model(model)
    assert [t.dtype for t in imported.inputs] == ["int8", "int8", "uint8", "int16", "float16", "bfloat16", "int32"]
    variables = {v.name: v for v in imported.graph.variables()}
    assert (variables["k"].output(0).dtype, variables["s16"].output(0).dtype) == ("uint8", "int16")
    assert not any(v.attrs["trainable"] for v in variables.values())  # integer initializers are not trained
    # Only uint16, which cellgraph has no tensors of, is computed wider (int32) and wraps back.
    assert imported.signature["widened"] == {"w": "UINT16", "sum_u16": "UINT16"}
    got = imported(*feeds.values())
    for g_, w_ in zip(got, want, strict=True):
        assert g_.dtype == w_.dtype and g_.tolist() == w_.tolist()
    # int8 100 + 100 wraps to -56, uint8 100 * 3 to 44, int16 10000 - 30000 to -20000 (no wrap),
    # float16 300**2 overflows to inf, bfloat16 2 * 3e38 to inf, uint16 65535 + 65535 to 65534.
    assert got[0].tolist() == [-56, 56, 7] and got[1].tolist() == [44, 21, 253]
    assert np.isinf(got[3][2]) and np.isinf(got[4].astype(np.float32)[1]) and got[5][0] == 65534


def test_every_cellgraph_dtype_has_an_onnx_type_both_ways() -> None:
    assert sorted(DTYPE_TO_ONNX) == sorted(cg.dataflow.dtypes.DTYPES)
    for name, code in DTYPE_TO_ONNX.items():
        assert helper.tensor_dtype_to_np_dtype(code) == cg.dataflow.dtypes.DTYPES[name]


def test_a_bfloat16_one_hot_is_filled_in_float32_and_rounded() -> None:
    # Numba has no bfloat16: the op's CPU kernel fills float32 and the storage wrapper rounds.
    g = cg.Graph()
    with g.as_default():
        hot = cg.one_hot(cg.constant(np.array([0, 2, 5]), "int64"), 3, on_value=1.00390625, off_value=-2.0,
                         dtype="bfloat16")  # fmt: skip
    got = cg.Session(g).run(hot)
    assert got.dtype == ml_dtypes.bfloat16
    # 1 + 2**-8 is halfway between two bfloat16s: it rounds to the even one, 1.0.
    assert got.astype(np.float32).tolist() == [[1.0, -2.0, -2.0], [-2.0, -2.0, 1.0], [-2.0, -2.0, -2.0]]


def test_float8_and_int4_values_are_read_exactly_and_a_cast_to_float8e8m0_is_refused() -> None:
    # Dequantizing: float8 and int4 weights, and a float8 graph input, cast to cellgraph's types.
    w8 = numpy_helper.from_array(np.array([0.5, -448.0, 2.0**-9], ml_dtypes.float8_e4m3fn), "w8")
    q4 = numpy_helper.from_array(np.array([-8, 7, 3], ml_dtypes.int4), "q4")
    model = _onnx_model(
        [
            helper.make_node("Cast", ["w8"], ["weights"], to=TensorProto.FLOAT),
            helper.make_node("Cast", ["q4"], ["levels"], to=TensorProto.INT8),
            helper.make_node("Cast", ["x"], ["x16"], to=TensorProto.FLOAT16),
        ],
        {"x": TensorProto.FLOAT8E5M2},
        {"weights": TensorProto.FLOAT, "levels": TensorProto.INT8, "x16": TensorProto.FLOAT16},
        [w8, q4],
    )
    model.opset_import[0].version = 21
    x = np.array([57344.0, -(2.0**-16), 1.5], ml_dtypes.float8_e5m2)
    want = ReferenceEvaluator(model).run(None, {"x": x})
    imported = cg.onnx.import_model(model)
    # Read in the cellgraph dtype that holds every value exactly; no node makes a float8 or int4.
    assert [t.dtype for t in imported.inputs] == ["float16"]
    assert imported.signature["widened"] == {"x": "FLOAT8E5M2"}
    got = imported(x)
    for g_, w_ in zip(got, want, strict=True):
        assert g_.dtype == w_.dtype and g_.tolist() == w_.tolist()
    assert got[0].tolist() == [0.5, -448.0, 2.0**-9] and got[1].tolist() == [-8, 7, 3]

    scale = _onnx_model(
        [helper.make_node("Cast", ["v"], ["q"], name="scale", to=TensorProto.FLOAT8E8M0)],
        {"v": TensorProto.FLOAT},
        {"q": TensorProto.FLOAT8E8M0},
    )
    scale.opset_import[0].version = 24
    with pytest.raises(
        cg.onnx.OnnxError, match=r"Cast to FLOAT8E8M0 has no cellgraph equivalent \(Cast node 'scale', opset 24\)"
    ):
        cg.onnx.import_model(scale)


# 3000 values over 20 decades, and the edges: ties, the largest values, overflow, subnormals, inf, NaN.
_WIDE = np.concatenate([
    RNG.normal(size=3000) * 10.0 ** RNG.integers(-12, 8, 3000),
    [0.0, -0.0, np.inf, -np.inf, np.nan, 448, 464, 465, 480, 240, 248, 57344, 61440, 61441, 6, 7, 5,
     2.0**-9, 2.0**-10, 3 * 2.0**-11, 2.0**-17, 2.0**-18],
]).astype(np.float32)  # fmt: skip
_NARROW = [
    (TensorProto.FLOAT8E4M3FN, 1), (TensorProto.FLOAT8E4M3FN, 0), (TensorProto.FLOAT8E4M3FNUZ, 1),
    (TensorProto.FLOAT8E4M3FNUZ, 0), (TensorProto.FLOAT8E5M2, 1), (TensorProto.FLOAT8E5M2, 0),
    (TensorProto.FLOAT8E5M2FNUZ, 1), (TensorProto.FLOAT8E5M2FNUZ, 0), (TensorProto.FLOAT4E2M1, 1),
    (TensorProto.INT4, 1), (TensorProto.UINT4, 1), (TensorProto.INT2, 1), (TensorProto.UINT2, 1),
]  # fmt: skip


@pytest.mark.parametrize(("to", "saturate"), _NARROW)
def test_a_cast_to_a_narrow_type_rounds_exactly_as_onnxs_reference(to: int, saturate: int) -> None:
    floats = to in (TensorProto.FLOAT8E4M3FN, TensorProto.FLOAT8E4M3FNUZ, TensorProto.FLOAT8E5M2,
                    TensorProto.FLOAT8E5M2FNUZ, TensorProto.FLOAT4E2M1)  # fmt: skip
    attrs = {"to": to, "saturate": saturate} if floats else {"to": to}
    model = _onnx_model([helper.make_node("Cast", ["x"], ["y"], **attrs)], {"x": TensorProto.FLOAT}, {"y": to})
    model.opset_import[0].version = 23
    # Integers: every value in and around the type's range (ONNX leaves a cast out of range undefined).
    x = _WIDE if floats else np.clip(_WIDE, -20, 20)
    want = ReferenceEvaluator(model).run(None, {"x": x})[0]
    imported = cg.onnx.import_model(model)
    got = imported(x)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got.astype(np.float32), want.astype(np.float32))  # NaN where NaN
    # Held in a cellgraph dtype that holds each value exactly, converted at the boundary.
    assert imported.outputs[0].dtype == ("float16" if floats else "uint8" if to in (21, 25) else "int8")
