"""cg.onnx.export: every mapped op, and the example models, run by ONNX Runtime as the session runs them."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import cellgraph as cg
from cellgraph.dataflow.ops import activations as act
from cellgraph.dataflow.ops import logic
from cellgraph.dataflow.ops import math_unary as mu
from cellgraph.dataflow.ops import reductions as red
from cellgraph.onnx import OnnxError
from cellgraph.onnx.export_ops import EXPORTERS

from .conftest import Trained
from .onnx_array_cases import ARRAY_CASES

RNG = np.random.default_rng(7)


def run_onnx(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return list(session.run(None, feeds))


def test_the_example_models_run_in_onnx_runtime_as_in_the_session(trained: Trained, tmp_path: Path) -> None:
    m = trained.model
    model = cg.onnx.export(tmp_path / "model.onnx", m.x, m.logits, trained.session)
    assert onnx.load(str(tmp_path / "model.onnx")) == model
    # The batch dimension stays dynamic, on the way in and out.
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    assert model.graph.output[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    # A training switch is no input: the export is the inference graph, the switch fixed off.
    assert [i.name for i in model.graph.input] == ["x"]
    for rows in (1, 37, len(trained.x_test)):
        x = trained.x_test[:rows]
        [got] = run_onnx(model, {"x": x})
        want = trained.logits(x)
        assert got.shape == want.shape and np.abs(got - want).max() <= 1e-4
        assert (got.argmax(axis=1) == want.argmax(axis=1)).all()


def test_an_exported_model_imported_again_gives_the_same_outputs(trained: Trained, tmp_path: Path) -> None:
    m = trained.model
    cg.onnx.export(tmp_path / "model.onnx", m.x, m.logits, trained.session)
    imported = cg.onnx.import_model(tmp_path / "model.onnx")
    for rows in (1, 37, len(trained.x_test)):
        x = trained.x_test[:rows]
        assert np.abs(imported(x) - trained.logits(x)).max() <= 1e-4
    # The trained weights came in as variables under their own names (the graph's constants,
    # such as batch norm's epsilon, and the exporter's own, const__N, came in as variables too).
    consts = {n.name for n in m.graph if n.op == "Const"}
    consts |= {n for n in imported.signature["variables"] if n.startswith("const__")}
    assert set(trained.session.variable_values()) >= set(imported.signature["variables"]) - consts


# ------------------------------------------------ one row per exported op
Case = Callable[[], tuple[list[cg.Tensor], cg.Tensor]]
F = "float32"


def _x(shape: tuple[int | None, ...] = (None, 3, 4), name: str = "x", dtype: str = F) -> cg.Tensor:
    return cg.placeholder(shape, dtype, name=name)


def _binary(fn: Callable[[cg.Tensor, cg.Tensor], cg.Tensor]) -> Case:
    def case() -> tuple[list[cg.Tensor], cg.Tensor]:
        a, b = _x(), _x((4,), "b")
        return [a, b], fn(a, b)

    return case


def _unary(fn: Callable[[cg.Tensor], cg.Tensor]) -> Case:
    def case() -> tuple[list[cg.Tensor], cg.Tensor]:
        x = _x()
        return [x], fn(x)

    return case


def _conv() -> tuple[list[cg.Tensor], cg.Tensor]:
    x = _x((None, 7, 6, 3))
    w = cg.variable(cg.init.glorot_uniform, shape=(3, 2, 3, 5), name="w")
    same = cg.conv2d(x, w, strides=(2, 1), padding="SAME")  # (N, 4, 6, 5)
    valid = cg.conv2d(x, w, strides=1, padding="VALID")  # (N, 5, 5, 5)
    return [x], same[:, :, :5] + valid[:, :4]


def _conv_variants() -> tuple[list[cg.Tensor], cg.Tensor]:
    x = _x((None, 7, 6, 4))
    dilated = cg.conv2d(x, cg.variable(cg.init.glorot_uniform, shape=(3, 2, 2, 4), name="wd"), dilations=(2, 1),
                        groups=2)  # fmt: skip
    padded = cg.conv2d(x, cg.variable(cg.init.glorot_uniform, shape=(2, 3, 4, 4), name="wp"), 2, ((1, 0), (2, 1)))
    depthwise = cg.nn.depthwise_conv2d(x, cg.variable(cg.init.glorot_uniform, shape=(3, 3, 4, 1), name="ww"), 2)
    return [x], dilated[:, :4, :3] + padded[:, :, :3] + depthwise[:, :, :3]


def _conv_transpose() -> tuple[list[cg.Tensor], cg.Tensor]:
    x = _x((None, 4, 3, 4))
    w = cg.variable(cg.init.glorot_uniform, shape=(3, 3, 2, 4), name="w")
    same = cg.conv2d_transpose(x, w, (7, 6), strides=2)  # an output_padding of 1 in width
    valid = cg.conv2d_transpose(x, w, strides=(1, 2), padding="VALID", dilations=(1, 2))  # (N, 6, 9, 2)
    return [x], same[:, :6] + valid[:, :, :6]


def _max_pool_with_argmax() -> tuple[list[cg.Tensor], cg.Tensor]:
    x = _x((None, 7, 6, 2))
    values, at = cg.nn.max_pool_with_argmax(x, 3, 2, "SAME", include_batch_in_index=True)
    _, within = cg.nn.max_pool_with_argmax(x, 2, 2)
    return [x], (values + cg.cast(at, F))[:, :3] + cg.cast(within, F)


def _xent() -> tuple[list[cg.Tensor], cg.Tensor]:
    logits, labels = _x((None, 5)), cg.placeholder((None,), "int32", name="labels")
    node = cg.sparse_softmax_cross_entropy(logits, labels).node
    while node.op != "SparseSoftmaxCrossEntropyWithLogits":
        node = node.inputs[0].node
    return [logits, labels], cg.reduce_sum(node.output(1), axis=1) + node.output(0)


def _batch_matmul() -> tuple[list[cg.Tensor], cg.Tensor]:
    x = _x()  # (N, 3, 4): every adjoint flag, and a matrix shared by the batch
    gram = cg.matmul(x, x, transpose_b=True)  # (N, 3, 3)
    outer = cg.matmul(x, x, transpose_a=True)  # (N, 4, 4)
    both = cg.matmul(cg.transpose(x, (0, 2, 1)), x, transpose_a=True, transpose_b=True)  # (N, 3, 3)
    shared = cg.matmul(x, cg.variable(cg.init.glorot_uniform, shape=(4, 4), name="w"))
    return [x], cg.matmul(gram + both, x) + cg.matmul(x, outer) + shared


def _layer_norm() -> tuple[list[cg.Tensor], cg.Tensor]:
    x = _x()
    last = cg.layers.layer_norm(x, name="last")
    gamma = cg.variable(cg.init.glorot_uniform, shape=(3, 4), name="gamma")
    both = cg.layer_norm(x, gamma, np.full((3, 4), 0.5, np.float32), begin_axis=1, epsilon=1e-3)
    return [x], last + both


def _placeholder_with_default() -> tuple[list[cg.Tensor], cg.Tensor]:
    x = _x()
    scale = cg.placeholder_with_default(np.arange(4, dtype=np.float32), (4,), name="scale")
    return [x], x * scale


CASES: dict[str, Case] = {
    "Add":          _binary(cg.add),
    "Sub":          _binary(cg.sub),
    "Mul":          _binary(cg.mul),
    "Div":          _binary(cg.div),
    "Pow":          lambda: (lambda x: ([x], cg.pow(cg.exp(x), 1.5)))(_x()),
    "Maximum":      _binary(cg.maximum),
    "Minimum":      _binary(cg.minimum),
    "Neg":          _unary(cg.neg),
    "Sqrt":         _unary(lambda x: cg.sqrt(cg.exp(x))),
    "Exp":          _unary(cg.exp),
    "Log":          _unary(lambda x: cg.log(cg.exp(x))),
    "Square":       _unary(cg.square),
    "Equal":        _binary(lambda a, b: cg.cast(cg.equal(a, cg.maximum(a, b)), F)),
    "Less":         _binary(lambda a, b: cg.cast(cg.less(a, b), F)),
    "GreaterEqual": _binary(lambda a, b: cg.cast(cg.greater_equal(a, b), F)),
    "Cast":         _unary(lambda x: cg.cast(cg.cast(x * 3.0, "int32"), "float64")),
    "MatMul":       lambda: (lambda a: ([a], cg.matmul(a, cg.constant(RNG.normal(size=(4, 5)).astype(np.float32)))
                                      + cg.matmul(cg.constant(np.ones((4, 5), np.float32)), a, transpose_a=True,
                                                  transpose_b=True)[:1, 0]))(_x((None, 4))),
    "ReduceSum":    _unary(lambda x: cg.reduce_sum(x, axis=1)),
    "ReduceMean":   _unary(lambda x: cg.reduce_mean(x, axis=(1, 2), keepdims=True)),
    "ReduceMax":    _unary(lambda x: cg.reduce_max(x, axis=-1)),
    "ArgMax":       _unary(lambda x: cg.argmax(x, axis=2)),
    "ArgMin":       _unary(lambda x: red.argmin(x, axis=1)),
    "ReduceMin":    _unary(lambda x: red.reduce_min(x, axis=(0, 2), keepdims=True)),
    "ReduceProd":   _unary(lambda x: red.reduce_prod(x, axis=1)),
    "ReduceLogSumExp": _unary(lambda x: red.reduce_logsumexp(x, axis=-1)),
    "ReduceAny":    _unary(lambda x: cg.cast(red.reduce_any(cg.less(x, -1.0), axis=1), F)),
    "ReduceAll":    _unary(lambda x: cg.cast(red.reduce_all(cg.less(x, 1.0), axis=2, keepdims=True), F)),
    "OnesLike":     _unary(lambda x: x + cg.ones_like(x)),
    "ZerosLike":    _unary(lambda x: x * 2.0 + cg.zeros_like(x)),
    "Relu":         _unary(cg.relu),
    "Sigmoid":      _unary(cg.sigmoid),
    "Tanh":         _unary(cg.tanh),
    "Softmax":      _unary(lambda x: cg.softmax(x, axis=1)),
    "LogSoftmax":   _unary(cg.log_softmax),
    "BiasAdd":      _unary(lambda x: cg.bias_add(x, cg.constant(np.arange(4, dtype=np.float32)))),
    "Identity":     _unary(cg.identity),
    "Reshape":      _unary(lambda x: cg.reshape(x, (-1, 2, 6))),
    "ReshapeLike":  _unary(lambda x: cg.dataflow.ops.array.reshape_like(cg.reshape(x, (-1, 12)), x)),
    "Concat":       _unary(lambda x: cg.concat([x, x * 2.0], axis=1)),
    "ExpandDims":   _unary(lambda x: cg.expand_dims(x, 1)),
    "Squeeze":      _unary(lambda x: cg.squeeze(cg.reshape(x, (-1, 1, 12)), 1)),
    "Transpose":    _unary(lambda x: cg.transpose(x, (2, 0, 1))),
    "Slice":        _unary(lambda x: cg.slice(x, (0, 1, 1), (-1, 2, -1))),
    "Pad":          _unary(lambda x: cg.pad(x, ((0, 0), (1, 2), (0, 1)), constant_values=-1.5)),
    "StridedSlice": _unary(lambda x: x[:, ::-1, None, 1:3] + x[:, -1, None, None, ::2][..., :1]),
    "Gather":       lambda: (lambda x, i: ([x, i], cg.gather(x, i, axis=1)))(_x(), _x((2,), "i", "int32")),
    "OneHot":       lambda: (lambda i: ([i], cg.one_hot(i, 4, on_value=2.0, off_value=-1.0)))(_x((None,), "i", "int32")),
    "Conv2D":       _conv,
    "Conv2DTranspose": _conv_transpose,
    "MaxPoolWithArgmax": _max_pool_with_argmax,
    "MaxPool":      lambda: (lambda x: ([x], cg.max_pool(x, 3, 2, "SAME") * 1.0 + cg.max_pool(x, 2, 1, "VALID")[:, :4, :3]))(_x((None, 7, 6, 2))),
    "AvgPool":      lambda: (lambda x: ([x], cg.avg_pool(x, 3, 2, "SAME")))(_x((None, 7, 6, 2))),
    "SparseSoftmaxCrossEntropyWithLogits": _xent,
    "Abs":          _unary(mu.abs),
    "Sign":         _unary(lambda x: mu.sign(mu.round(x))),
    "Ceil":         _unary(mu.ceil),
    "Floor":        _unary(mu.floor),
    "Round":        _unary(lambda x: mu.round(x * 4.0)),
    "Sin":          _unary(mu.sin),
    "Cos":          _unary(mu.cos),
    "Tan":          _unary(mu.tan),
    "Erf":          _unary(mu.erf),
    "Expm1":        _unary(mu.expm1),
    "Log1p":        _unary(lambda x: mu.log1p(cg.exp(x))),
    "Rsqrt":        _unary(lambda x: mu.rsqrt(cg.exp(x))),
    "ClipByValue":  _binary(lambda a, b: mu.clip_by_value(a, -0.5, b)),
    "FloorDiv":     lambda: (lambda n: ([n], mu.floordiv(n, cg.constant(np.array([3, -2, 5, -7], np.int32)))))(_x((None, 4), "n", "int32")),
    "FloorMod":     lambda: (lambda n, x: ([n, x], cg.cast(mu.mod(n, cg.constant(np.array([3, -2, 5, -7], np.int32))), F)
                                          + mu.mod(x, 0.75)))(_x((None, 4), "n", "int32"), _x((None, 4))),
    "Where":        _binary(lambda a, b: mu.where(cg.less(a, b), a, b * 2.0)),
    "StopGradient": _unary(mu.stop_gradient),
    "NotEqual":     _binary(lambda a, b: cg.cast(logic.not_equal(cg.less(a, 0.0), cg.less(b, 0.0)), F)),
    "LogicalAnd":   _binary(lambda a, b: cg.cast(logic.logical_and(cg.less(a, b), cg.less(b, 0.0)), F)),
    "LogicalOr":    _binary(lambda a, b: cg.cast(logic.logical_or(cg.less(a, b), cg.less(b, 0.0)), F)),
    "LogicalXor":   _binary(lambda a, b: cg.cast(logic.logical_xor(cg.less(a, b), cg.less(b, 0.0)), F)),
    "LogicalNot":   _unary(lambda x: cg.cast(logic.logical_not(cg.less(x, 0.0)), F)),
    "IsNan":        _unary(lambda x: cg.cast(logic.is_nan(cg.sqrt(x)), F)),
    "IsFinite":     _unary(lambda x: cg.cast(logic.is_finite(cg.log(x) / x), F)),
    "LeakyRelu":    _unary(lambda x: act.leaky_relu(x, 0.1)),
    "Elu":          _unary(lambda x: act.elu(x, 0.7)),
    "Selu":         _unary(act.selu),
    "Gelu":         _unary(act.gelu),
    "GeluTanh":     _unary(lambda x: act.gelu(x, approximate=True)),
    "Softplus":     _unary(act.softplus),
    "Softsign":     _unary(act.softsign),
    "Silu":         _unary(act.silu),
    "Relu6":        _unary(lambda x: act.relu6(x * 4.0)),
    "HardSigmoid":  _unary(lambda x: act.hard_sigmoid(x * 4.0)),
    "BatchMatMul":  _batch_matmul,
    "LayerNorm":    _layer_norm,
    "PlaceholderWithDefault": _placeholder_with_default,
}  # fmt: skip
CASES.update(ARRAY_CASES)  # onnx_array_cases.py: the issue-16 array ops


def _feed(t: cg.Tensor, rows: int) -> np.ndarray:
    shape = tuple(rows if d is None else d for d in t.shape)
    if t.name == "i:0":
        return np.array([3, 0, -1, 4, 1][: shape[0]], np.int32) if t.shape[0] is None else np.array([2, 0], np.int32)
    if t.name == "n:0":
        return RNG.integers(-20, 20, size=shape).astype(np.int32)
    if t.name == "labels:0":
        return RNG.integers(0, 5, size=shape).astype(np.int32)
    return RNG.normal(size=shape).astype(t.dtype)


def test_every_exported_op_has_a_case() -> None:
    assert sorted(CASES) == sorted(EXPORTERS)


@pytest.mark.parametrize("op", sorted(CASES))
@pytest.mark.parametrize("opset", [17, 18])
def test_each_op_runs_in_onnx_runtime_as_in_the_session(op: str, opset: int, tmp_path: Path) -> None:
    g = cg.Graph()
    with g.as_default():
        inputs, output = CASES[op]()
    assert op in {n.op for n in g}, f"the case of {op} does not build it"
    session = cg.Session(g)
    model = cg.onnx.export(tmp_path / "m.onnx", inputs, output, session, opset=opset)
    for rows in (1, 5):
        feeds = {t: _feed(t, rows) for t in inputs}
        want = session.run(output, feeds)
        [got] = run_onnx(model, {t.node.name: v for t, v in feeds.items()})
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_an_op_without_an_onnx_equivalent_is_named_with_its_node(tmp_path: Path) -> None:
    g = cg.Graph()
    with g.as_default():
        x = _x((None, 3))
        dx = cg.dataflow.ops.nn.relu_grad(x, cg.relu(x), name="backward")
    with pytest.raises(
        OnnxError,
        match=r"ReluGrad has no ONNX equivalent \(node 'backward', test_onnx_export.py:\d+\): ONNX export covers Abs, Add, ArgMax, ArgMin",
    ):
        cg.onnx.export(tmp_path / "m.onnx", x, dx, cg.Session(g))
    assert not (tmp_path / "m.onnx").exists()


def test_an_opset_outside_the_supported_range_is_refused(tmp_path: Path) -> None:
    g = cg.Graph()
    with g.as_default():
        x = _x((None, 3))
        y = cg.relu(x)
    with pytest.raises(OnnxError, match=r"opset 16 is not one this exporter writes: choose 17 to 21"):
        cg.onnx.export(tmp_path / "m.onnx", x, y, cg.Session(g), opset=16)
    assert not (tmp_path / "m.onnx").exists()
