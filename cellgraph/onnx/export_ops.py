"""cellgraph op -> ONNX nodes: one row per op that has an ONNX equivalent.

A row is a function ``(emitter, node) -> None`` that appends the ONNX nodes
computing ``node`` and writes its outputs to ``emitter.outs(node)``. An op
without a row has no ONNX equivalent (gradients, optimizer steps, transfers):
exporting a graph that needs one is an ``OnnxError`` naming it. A new op
gets a new row here and nothing else.

cellgraph images are NHWC with HWIO filters (TensorFlow's layout); ONNX's are
NCHW with OIHW filters, so the convolution and pooling rows transpose around
the ONNX op (ONNX Runtime folds the transposes of constant filters).

Examples
--------
>>> "Conv2D" in EXPORTERS, "ReluGrad" in EXPORTERS
(True, False)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from cellgraph.dataflow.graph import Node
from cellgraph.dataflow.kernels.cpu.conv import axis_padding, window

from .common import DTYPE_TO_ONNX, INT64_MAX, INT64_MIN, OnnxError
from .export_arrays import ARRAY_EXPORTERS
from .export_exact import EXACT_EXPORTERS, nan_mask, positive, scalar, sees_nan
from .export_nn import NN_EXPORTERS

if TYPE_CHECKING:
    from .exporter import Emitter

Row = Callable[["Emitter", Node], object]  # what a row returns is ignored
NHWC_TO_NCHW = [0, 3, 1, 2]
NCHW_TO_NHWC = [0, 2, 3, 1]
HWIO_TO_OIHW = [3, 2, 0, 1]


def same(op_type: str, **attrs: Any) -> Row:
    """The ONNX op of the same inputs and outputs."""
    return lambda e, node: e.node(op_type, e.ins(node), e.outs(node), **attrs)


def _square(e: Emitter, node: Node) -> None:
    x = e.ins(node)[0]
    e.node("Mul", [x, x], e.outs(node))


def _cast(e: Emitter, node: Node) -> None:
    e.node("Cast", e.ins(node), e.outs(node), to=DTYPE_TO_ONNX[node.attrs["dtype"]])


def _matmul(e: Emitter, node: Node) -> None:
    a, b = e.ins(node)
    if node.attrs["transpose_a"]:
        a = e.node("Transpose", [a], perm=[1, 0])[0]
    if node.attrs["transpose_b"]:
        b = e.node("Transpose", [b], perm=[1, 0])[0]
    e.node("MatMul", [a, b], e.outs(node))


def _reduce(op_type: str, axes_input_from: int) -> Row:
    """ONNX moved ``axes`` from an attribute to an input (ReduceSum at opset 13, the rest at 18)."""

    def row(e: Emitter, node: Node) -> None:
        x = e.ins(node)[0]
        if op_type == "ReduceProd" and node.inputs[0].dtype == "float32":
            # cellgraph multiplies float32 factors in float64 (as its cumprod): ONNX Runtime's float32
            # product of a thousand factors 1.001 was 1.5e-6 off it.
            wide = e.node("Cast", [x], to=DTYPE_TO_ONNX["float64"])[0]
            y = _reduced(e, op_type, wide, node, axes_input_from, None)
            e.node("Cast", [y], e.outs(node), to=DTYPE_TO_ONNX["float32"])
            return
        out = e.outs(node) if not sees_nan(op_type, node) else None
        y = _reduced(e, op_type, x, node, axes_input_from, out)
        if out is None:  # ReduceMax and ReduceMin of floats: NaN where one is among the reduced values
            seen = _reduced(e, "ReduceMax", nan_mask(e, node, x), node, 18, None)
            e.node("Where", [positive(e, node, seen), scalar(e, node, np.nan), y], e.outs(node))

    return row


def _reduced(e: Emitter, op_type: str, x: str, node: Node, axes_input_from: int, out: list[str] | None) -> str:
    axes, keep = list(node.attrs["axes"]), int(bool(node.attrs["keepdims"]))
    if e.opset >= axes_input_from:
        return e.node(op_type, [x, e.const(np.array(axes, np.int64))], out, keepdims=keep)[0]
    return e.node(op_type, [x], out, axes=axes, keepdims=keep)[0]


def _arg(op_type: str) -> Row:
    # ONNX's ArgMax and ArgMin give int64; cellgraph's give int32.
    def row(e: Emitter, node: Node) -> None:
        x, axis = e.ins(node)[0], int(node.attrs["axes"][0])
        index = e.node(op_type, [x], axis=axis, keepdims=0)[0]
        if sees_nan(op_type, node):  # the first NaN's index where there is one
            mask = nan_mask(e, node, x)
            first = e.node("ArgMax", [mask], axis=axis, keepdims=0)[0]
            if e.opset >= 18:
                seen = e.node("ReduceMax", [mask, e.const(np.array([axis], np.int64))], keepdims=0)[0]
            else:
                seen = e.node("ReduceMax", [mask], axes=[axis], keepdims=0)[0]
            index = e.node("Where", [positive(e, node, seen), first, index])[0]
        e.node("Cast", [index], e.outs(node), to=DTYPE_TO_ONNX["int32"])

    return row


def _bool_reduce(op_type: str) -> Row:
    """ReduceAny / ReduceAll: the max / min of the bools as int32 (ONNX's ReduceMax of bool is newer than 17)."""

    def row(e: Emitter, node: Node) -> None:
        x = e.node("Cast", e.ins(node), to=DTYPE_TO_ONNX["int32"])[0]
        axes, keep = list(node.attrs["axes"]), int(bool(node.attrs["keepdims"]))
        if e.opset >= 18:
            y = e.node(op_type, [x, e.const(np.array(axes, np.int64))], keepdims=keep)[0]
        else:
            y = e.node(op_type, [x], axes=axes, keepdims=keep)[0]
        e.node("Cast", [y], e.outs(node), to=DTYPE_TO_ONNX["bool"])

    return row


def _fill_like(value: int) -> Row:
    def row(e: Emitter, node: Node) -> None:
        dtype = np.dtype(node.inputs[0].dtype)
        shape = e.node("Shape", e.ins(node))[0]
        e.node("ConstantOfShape", [shape], e.outs(node), value=e.tensor(np.array([value], dtype)))

    return row


def _softmax(op_type: str) -> Row:
    return lambda e, node: e.node(op_type, e.ins(node), e.outs(node), axis=int(node.attrs["axis"]))


def _reshape(e: Emitter, node: Node) -> None:
    dims = list(node.attrs["shape"])
    # ONNX reads a 0 as "copy this dim" unless allowzero is set; cellgraph's 0 is a 0.
    attrs = {"allowzero": 1} if 0 in dims else {}
    e.node("Reshape", [e.ins(node)[0], e.const(np.array(dims, np.int64))], e.outs(node), **attrs)


def _reshape_like(e: Emitter, node: Node) -> None:
    x, like = e.ins(node)
    e.node("Reshape", [x, e.node("Shape", [like])[0]], e.outs(node), allowzero=1)


def _axes_op(op_type: str) -> Row:
    return lambda e, node: e.node(
        op_type, [e.ins(node)[0], e.const(np.array(node.attrs["axes"], np.int64))], e.outs(node)
    )


def _slice(e: Emitter, node: Node) -> None:
    begin, size = node.attrs["begin"], node.attrs["size"]
    ends = [INT64_MAX if s == -1 else b + s for b, s in zip(begin, size, strict=True)]
    e.node(
        "Slice",
        [e.ins(node)[0], e.const(np.array(begin, np.int64)), e.const(np.array(ends, np.int64))],
        e.outs(node),
    )


def _pad(e: Emitter, node: Node) -> None:
    pairs = node.attrs["paddings"]
    pads = [p[0] for p in pairs] + [p[1] for p in pairs]
    value = np.array(node.attrs["constant_values"], np.dtype(node.inputs[0].dtype))
    e.node("Pad", [e.ins(node)[0], e.const(np.array(pads, np.int64)), e.const(value)], e.outs(node))


def _strided_slice(e: Emitter, node: Node) -> None:
    """NumPy basic indexing as Slice (every sliced or indexed axis), Squeeze (ints), Unsqueeze (None)."""
    a = node.attrs
    starts, ends, axes, steps, shrink, new = [], [], [], [], [], []
    axis = out = 0
    for i, (b, end, s) in enumerate(zip(a["begin"], a["end"], a["strides"], strict=True)):
        bit = 1 << i
        if a["new_axis_mask"] & bit:
            new.append(out)
            out += 1
            continue
        if a["shrink_axis_mask"] & bit:
            starts.append(b)
            ends.append(INT64_MAX if b == -1 else b + 1)
            steps.append(1)
            shrink.append(axis)
        else:
            first = INT64_MAX if s < 0 else 0
            last = INT64_MIN if s < 0 else INT64_MAX
            starts.append(first if a["begin_mask"] & bit else b)
            ends.append(last if a["end_mask"] & bit else end)
            steps.append(s)
            out += 1
        axes.append(axis)
        axis += 1
    x = e.ins(node)[0]
    if axes:
        arrays = [np.array(v, np.int64) for v in (starts, ends, axes, steps)]
        x = e.node("Slice", [x, *(e.const(v) for v in arrays)])[0]
    if shrink:
        x = e.node("Squeeze", [x, e.const(np.array(shrink, np.int64))])[0]
    if new:
        x = e.node("Unsqueeze", [x, e.const(np.array(new, np.int64))])[0]
    e.node("Identity", [x], e.outs(node))


def _one_hot(e: Emitter, node: Node) -> None:
    # ONNX's OneHot wraps negative indices; cellgraph gives a row of off_value for any index
    # outside [0, depth). Comparing with a range does exactly that.
    dtype = np.dtype(node.attrs["dtype"])
    index = e.node("Cast", [e.ins(node)[0]], to=DTYPE_TO_ONNX["int64"])[0]
    index = e.node("Unsqueeze", [index, e.const(np.array([-1], np.int64))])[0]
    hit = e.node("Equal", [index, e.const(np.arange(node.attrs["depth"], dtype=np.int64))])[0]
    on, off = (e.const(np.array(node.attrs[k], dtype)) for k in ("on_value", "off_value"))
    e.node("Where", [hit, on, off], e.outs(node))


def _window(node: Node) -> dict[str, Any]:
    strides = node.attrs["strides"]
    pad = "SAME_UPPER" if node.attrs["padding"] == "SAME" else "VALID"  # TF's SAME puts the odd pixel last
    return {"strides": list(strides), "auto_pad": pad}


def _conv_attrs(node: Node) -> dict[str, Any]:
    """Conv's strides, dilations and group, and its auto_pad or explicit (top, left, bottom, right) pads."""
    padding = node.attrs["padding"]
    attrs: dict[str, Any] = {
        "strides": list(node.attrs["strides"]),
        "dilations": list(node.attrs.get("dilations", (1, 1))),
        "group": int(node.attrs.get("groups", 1)),
    }
    if isinstance(padding, str):
        return {**attrs, **_window(node)}
    (top, bottom), (left, right) = padding
    return {**attrs, "pads": [top, left, bottom, right]}


def _conv2d(e: Emitter, node: Node) -> None:
    x, w = e.ins(node)
    x = e.node("Transpose", [x], perm=NHWC_TO_NCHW)[0]
    w = e.node("Transpose", [w], perm=HWIO_TO_OIHW)[0]
    kernel = [int(d) for d in node.inputs[1].shape[:2]]  # type: ignore[arg-type]
    attrs = _conv_attrs(node)
    if attrs.get("auto_pad") == "SAME_UPPER" and any(d > 1 for d in attrs["dilations"]):
        # ONNX Runtime runs no dilated convolution with auto_pad SAME_UPPER: its pads, written out.
        attrs["pads"] = _same_pads(node, kernel, attrs["strides"], attrs["dilations"])
        del attrs["auto_pad"]
    y = e.node("Conv", [x, w], kernel_shape=kernel, **attrs)[0]
    e.node("Transpose", [y], e.outs(node), perm=NCHW_TO_NHWC)


def _same_pads(node: Node, kernel: list[int], strides: list[int], dilations: list[int]) -> list[int]:
    """A SAME convolution's pads, (top, left, bottom, right), by TensorFlow's rule (the odd pixel last)."""
    sizes = node.inputs[0].shape[1:3]
    if None in sizes:
        raise OnnxError(
            f"{node.describe()}: a dilated convolution with SAME padding exports only with a known height and "
            f"width, got input {node.inputs[0].shape} (ONNX Runtime runs no dilated auto_pad SAME_UPPER)"
        )
    begin, end = [], []
    for i in range(2):
        out, before = window(sizes[i], kernel[i], strides[i], "SAME", dilations[i])  # type: ignore[arg-type]
        total = max((out - 1) * strides[i] + (kernel[i] - 1) * dilations[i] + 1 - sizes[i], 0)  # type: ignore[operator]
        begin.append(before)
        end.append(total - before)
    return begin + end


def _conv2d_transpose(e: Emitter, node: Node) -> None:
    # ONNX's ConvTranspose is the full transposed convolution less pads at each end, plus
    # output_padding after: cellgraph's output starts at its pad before and is cropped to its size.
    x, w = e.ins(node)
    sizes, out = node.inputs[0].shape[1:3], node.outputs[0].shape[1:3]
    kernel = [int(d) for d in node.inputs[1].shape[:2]]  # type: ignore[arg-type]
    if None in sizes or None in out:
        raise OnnxError(f"{node.describe()}: a transposed convolution exports only with a known height and width")
    attrs = _conv_attrs(node)
    begin, end, extra = [], [], []
    for i in range(2):
        span = (kernel[i] - 1) * attrs["dilations"][i] + 1
        before = window(out[i], kernel[i], attrs["strides"][i], axis_padding(node.attrs["padding"], i),  # type: ignore[arg-type]
                        attrs["dilations"][i])[1]  # fmt: skip
        after = (sizes[i] - 1) * attrs["strides"][i] + span - before - out[i]  # type: ignore[operator]
        begin.append(before)
        end.append(max(after, 0))
        extra.append(max(-after, 0))
    attrs.pop("auto_pad", None)
    attrs["pads"] = begin + end
    x = e.node("Transpose", [x], perm=NHWC_TO_NCHW)[0]
    w = e.node("Transpose", [w], perm=HWIO_TO_OIHW)[0]  # (in, out / group, kh, kw), as ConvTranspose reads it
    y = e.node("ConvTranspose", [x, w], kernel_shape=kernel, output_padding=extra, **attrs)[0]
    e.node("Transpose", [y], e.outs(node), perm=NCHW_TO_NHWC)


def _max_pool_with_argmax(e: Emitter, node: Node) -> None:
    # ONNX's Indices are NCHW flat indices (batch included); TensorFlow's are NHWC ones.
    h, w, c = node.inputs[0].shape[1:]
    if None in (h, w, c):
        raise OnnxError(f"{node.describe()}: max_pool_with_argmax exports only with a known height, width and channels")
    x = e.node("Transpose", e.ins(node), perm=NHWC_TO_NCHW)[0]
    y, at = e.node("MaxPool", [x], [e.fresh("maxpool"), e.fresh("indices")],
                   kernel_shape=list(node.attrs["ksize"]), **_window(node))  # fmt: skip
    values, argmax = e.outs(node)
    e.node("Transpose", [y], [values], perm=NCHW_TO_NHWC)
    at = e.node("Transpose", [at], perm=NCHW_TO_NHWC)[0]
    plane, image = h * w, h * w * c  # type: ignore[operator]
    rest = e.node("Mod", [at, e.const(np.array(image, np.int64))])[0]
    channel = e.node("Div", [rest, e.const(np.array(plane, np.int64))])[0]
    pixel = e.node("Mod", [rest, e.const(np.array(plane, np.int64))])[0]
    index = e.node("Add", [e.node("Mul", [pixel, e.const(np.array(c, np.int64))])[0], channel])[0]
    if node.attrs["include_batch_in_index"]:
        batch = e.node("Sub", [at, rest])[0]  # = image number * h * w * c
        index = e.node("Add", [index, batch])[0]
    e.node("Identity", [index], [argmax])


def _pool(op_type: str, **fixed: Any) -> Row:
    def row(e: Emitter, node: Node) -> None:
        attrs = {**_window(node), **fixed}
        dilations = list(node.attrs.get("dilations", (1, 1)))
        if dilations != [1, 1]:
            if op_type == "AveragePool" and e.opset < 19:
                raise OnnxError(f"{node.describe()}: a dilated AveragePool needs opset 19 or newer, not {e.opset}")
            attrs["dilations"] = dilations
        x = e.node("Transpose", e.ins(node), perm=NHWC_TO_NCHW)[0]
        y = e.node(op_type, [x], kernel_shape=list(node.attrs["ksize"]), **attrs)[0]
        if sees_nan(op_type, node):  # NaN where one is in the window (a pad is no NaN)
            seen = e.node(op_type, [nan_mask(e, node, x)], kernel_shape=list(node.attrs["ksize"]), **attrs)[0]
            y = e.node("Where", [positive(e, node, seen), scalar(e, node, np.nan), y])[0]
        e.node("Transpose", [y], e.outs(node), perm=NCHW_TO_NHWC)

    return row


def _xent(e: Emitter, node: Node) -> None:
    logits, labels = e.ins(node)
    loss, backprop = e.outs(node)
    e.node("SoftmaxCrossEntropyLoss", [logits, labels], [loss], reduction="none")
    depth = e.node("Shape", [logits], start=1, end=2)[0]
    index = e.node("Unsqueeze", [e.node("Cast", [labels], to=DTYPE_TO_ONNX["int64"])[0], e.const(np.array([-1]))])[0]
    classes = e.node("Range", [e.const(np.array(0)), e.node("Squeeze", [depth])[0], e.const(np.array(1))])[0]
    onehot = e.node("Cast", [e.node("Equal", [index, classes])[0]], to=DTYPE_TO_ONNX[node.inputs[0].dtype])[0]
    e.node("Sub", [e.node("Softmax", [logits], axis=1)[0], onehot], [backprop])


def _chain(*steps: tuple[str, dict[str, Any]]) -> Row:
    """Unary ONNX ops applied one after another (``Reciprocal(Sqrt(x))``)."""

    def row(e: Emitter, node: Node) -> None:
        x = e.ins(node)[0]
        for i, (op_type, attrs) in enumerate(steps):
            x = e.node(op_type, [x], e.outs(node) if i == len(steps) - 1 else None, **attrs)[0]

    return row


def _clip(e: Emitter, node: Node) -> None:
    x, low, high = e.ins(node)
    e.node("Min", [e.node("Max", [x, low])[0], high], e.outs(node))


def _relu6(e: Emitter, node: Node) -> None:
    x = e.ins(node)[0]
    e.node("Clip", [x, scalar(e, node, 0.0), scalar(e, node, 6.0)], e.outs(node))


def _is_finite(e: Emitter, node: Node) -> None:
    x = e.ins(node)[0]
    bad = e.node("Or", [e.node("IsInf", [x])[0], e.node("IsNaN", [x])[0]])[0]
    e.node("Not", [bad], e.outs(node))


# ONNX's Equal takes strings from opset 19; cellgraph's Equal and NotEqual take them at any.
_STRING_EQUAL_OPSET = 19


def _equal(negate: bool) -> Row:
    def row(e: Emitter, node: Node) -> None:
        if node.inputs[0].dtype == "string" and e.opset < _STRING_EQUAL_OPSET:
            raise OnnxError(
                f"{node.describe()} compares strings, which ONNX's Equal does from opset {_STRING_EQUAL_OPSET}; "
                f"export with opset={_STRING_EQUAL_OPSET} or newer (this export is opset {e.opset})"
            )
        if negate:
            e.node("Not", [e.node("Equal", e.ins(node))[0]], e.outs(node))
        else:
            e.node("Equal", e.ins(node), e.outs(node))

    return row


def _alpha(op_type: str) -> Row:
    return lambda e, node: e.node(op_type, e.ins(node), e.outs(node), alpha=float(node.attrs["alpha"]))


# One row per cellgraph op, aligned: op -> how ONNX computes it.
EXPORTERS: dict[str, Row] = {
    "Add":          same("Add"),
    "Sub":          same("Sub"),
    "Mul":          same("Mul"),
    "Div":          same("Div"),
    "Pow":          same("Pow"),
    "Maximum":      same("Max"),
    "Minimum":      same("Min"),
    "Neg":          same("Neg"),
    "Sqrt":         same("Sqrt"),
    "Exp":          same("Exp"),
    "Log":          same("Log"),
    "Square":       _square,
    "Equal":        _equal(negate=False),
    "Less":         same("Less"),
    "GreaterEqual": same("GreaterOrEqual"),
    "Cast":         _cast,
    "MatMul":       _matmul,
    "ReduceSum":    _reduce("ReduceSum", 13),
    "ReduceMean":   _reduce("ReduceMean", 18),
    "ReduceMax":    _reduce("ReduceMax", 18),
    "ArgMax":       _arg("ArgMax"),
    "ArgMin":       _arg("ArgMin"),
    "ReduceMin":    _reduce("ReduceMin", 18),
    "ReduceProd":   _reduce("ReduceProd", 18),
    "ReduceLogSumExp": _reduce("ReduceLogSumExp", 18),
    "ReduceAny":    _bool_reduce("ReduceMax"),
    "ReduceAll":    _bool_reduce("ReduceMin"),
    "OnesLike":     _fill_like(1),
    "ZerosLike":    _fill_like(0),
    "Relu":         same("Relu"),
    "Sigmoid":      same("Sigmoid"),
    "Tanh":         same("Tanh"),
    "Softmax":      _softmax("Softmax"),
    "LogSoftmax":   _softmax("LogSoftmax"),
    "BiasAdd":      same("Add"),
    "Identity":     same("Identity"),
    "Reshape":      _reshape,
    "ReshapeLike":  _reshape_like,
    "Concat":       lambda e, node: e.node("Concat", e.ins(node), e.outs(node), axis=int(node.attrs["axis"])),
    "ExpandDims":   _axes_op("Unsqueeze"),
    "Squeeze":      _axes_op("Squeeze"),
    "Transpose":    lambda e, node: e.node("Transpose", e.ins(node), e.outs(node), perm=list(node.attrs["perm"])),
    "Slice":        _slice,
    "Pad":          _pad,
    "StridedSlice": _strided_slice,
    "Gather":       lambda e, node: e.node("Gather", e.ins(node), e.outs(node), axis=int(node.attrs["axis"])),
    "OneHot":       _one_hot,
    "Conv2D":       _conv2d,
    "Conv2DTranspose": _conv2d_transpose,
    "MaxPoolWithArgmax": _max_pool_with_argmax,
    "MaxPool":      _pool("MaxPool"),
    "AvgPool":      _pool("AveragePool", count_include_pad=0),
    "SparseSoftmaxCrossEntropyWithLogits": _xent,
    # math_unary.py, logic.py, activations.py
    "Abs":          same("Abs"),
    "Sign":         same("Sign"),
    "Ceil":         same("Ceil"),
    "Floor":        same("Floor"),
    "Round":        same("Round"),  # both round half to even
    "Sin":          same("Sin"),
    "Cos":          same("Cos"),
    "Tan":          same("Tan"),
    "Erf":          same("Erf"),
    "Rsqrt":        _chain(("Sqrt", {}), ("Reciprocal", {})),
    "ClipByValue":  _clip,
    "Where":        same("Where"),
    "StopGradient": same("Identity"),
    "NotEqual":     _equal(negate=True),
    "LogicalAnd":   same("And"),
    "LogicalOr":    same("Or"),
    "LogicalXor":   same("Xor"),
    "LogicalNot":   same("Not"),
    "IsNan":        same("IsNaN"),
    "IsFinite":     _is_finite,
    "LeakyRelu":    _alpha("LeakyRelu"),
    "Softplus":     same("Softplus"),
    "Softsign":     same("Softsign"),
    "Relu6":        _relu6,
    "HardSigmoid":  same("HardSigmoid", alpha=1.0 / 6.0, beta=0.5),
    **EXACT_EXPORTERS,  # export_exact.py: expm1, log1p, elu, selu, floored division, gelu, silu
    **ARRAY_EXPORTERS,  # export_arrays.py: split, tile, broadcast_to, mirror pad, gather_nd, shape, range, ...
    **NN_EXPORTERS,  # export_nn.py: BatchMatMul, LayerNorm, PlaceholderWithDefault
}  # fmt: skip
