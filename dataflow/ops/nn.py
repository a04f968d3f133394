"""Neural-network ops: activations, softmax, cross-entropy, bias, convolution,
pooling and dropout.

Images are NHWC and filters HWIO, as in TensorFlow. Gradients that need more
than a line of other ops are ops of their own (``Conv2DBackpropInput``,
``MaxPoolGrad``, ...), each a full registry entry with a NumPy reference and a
gradient of its own, so second derivatives work and every kernel is checked.
"""

from __future__ import annotations

import numbers
import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..dtypes import INTS, is_float
from ..graph import Node, Tensor
from ..kernels.cpu import conv as conv_kernels
from ..kernels.cpu import nn as nnk
from ..kernels.cpu import pool as pool_kernels
from ..kernels.cpu.conv import window
from ..opdef import InferContext, KernelContext, OpDef, Shape, TensorSpec, register_op
from ..shapes import fmt, normalize_axes
from .base import TensorLike, apply, apply_node, as_tensor, graph_of, infer_float_unary
from .math import _elementwise_kernel, broadcast_like, exp, reduce_sum

FAMILY = "nn"
Dys = list[Tensor | None]
Grads = list[Tensor | None]
HW = tuple[int, int]


# ------------------------------------------------------- checks shared by rules
def _require_float(ctx: InferContext, *specs: TensorSpec) -> str:
    """The one float dtype of ``specs``, or a DTypeError naming them."""
    dtypes = [s.dtype for s in specs]
    if any(d != dtypes[0] for d in dtypes):
        raise ctx.dtype_error(f"operands have different dtypes: {', '.join(dtypes)}")
    if not is_float(dtypes[0]):
        raise ctx.dtype_error(f"expects float tensors, got {dtypes[0]}")
    return dtypes[0]


def _fits(shape: Shape, expected: Shape) -> bool:
    return len(shape) == len(expected) and all(a is None or b is None or a == b for a, b in zip(shape, expected))


def _check_fits(ctx: InferContext, what: str, spec: TensorSpec, expected: Shape) -> None:
    if not _fits(spec.shape, expected):
        raise ctx.shape_error(f"{what} has shape {fmt(spec.shape)}, expected {fmt(expected)}")


def _merge(a: Shape, b: Shape) -> Shape:
    return tuple(x if x is not None else y for x, y in zip(a, b))


def _hw(value: Any) -> HW | None:
    """(height, width) from an int, a pair, or TensorFlow's (1, h, w, 1); None if none of these."""
    if isinstance(value, (int, np.integer)):
        dims: tuple[Any, ...] = (value, value)
    elif isinstance(value, (tuple, list)) and len(value) == 2:
        dims = tuple(value)
    elif isinstance(value, (tuple, list)) and len(value) == 4 and value[0] == 1 and value[3] == 1:
        dims = (value[1], value[2])
    else:
        return None
    if not all(isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d >= 1 for d in dims):
        return None
    return int(dims[0]), int(dims[1])


def _window_attr(ctx: InferContext, key: str) -> HW:
    value = _hw(ctx.attrs[key])
    if value is None:
        raise ctx.shape_error(
            f"{key} must be a positive int, a (height, width) pair or (1, height, width, 1), got {ctx.attrs[key]!r}"
        )
    return value


def _padding_attr(ctx: InferContext) -> str:
    padding = ctx.attrs["padding"]
    if not isinstance(padding, str) or padding not in ("SAME", "VALID"):
        raise ctx.shape_error(f"padding must be 'SAME' or 'VALID', got {padding!r}")
    return str(padding)


def _nhwc(ctx: InferContext, what: str, spec: TensorSpec) -> None:
    if spec.rank != 4:
        raise ctx.shape_error(f"{what} must be 4-D NHWC (batch, height, width, channels), got {fmt(spec.shape)}")


def _spatial(ctx: InferContext, x: Shape, k: tuple[int | None, int | None], what: str, shapes: str) -> Shape:
    """Output (height, width) of windows ``k`` sliding over NHWC ``x``."""
    strides, padding = _window_attr(ctx, "strides"), _padding_attr(ctx)
    out: list[int | None] = []
    for axis, name in ((1, "height"), (2, "width")):
        size, kk, s = x[axis], k[axis - 1], strides[axis - 1]
        if size is None or kk is None:
            out.append(None)
            continue
        if padding == "VALID" and kk > size:
            raise ctx.shape_error(
                f"{what} {name} {kk} is larger than the input {name} {size} with VALID padding: {shapes}"
            )
        out.append(window(size, kk, s, padding)[0])
    return tuple(out)


def _strides_padding(node: Node) -> tuple[HW, str]:
    """The validated attrs of a node that exists (its shape rule checked them)."""
    strides = _hw(node.attrs["strides"])
    assert strides is not None
    return strides, node.attrs["padding"]


# --------------------------------------------------- activations, as a table
# Gradients use helper ops of (dy, y): one pass over memory instead of two or
# three elementwise ops, and the forward output y is all they need.
_y = lambda n: n.output(0)  # noqa: E731


def _infer_activation_grad(ctx: InferContext) -> TensorSpec:
    dy, y = ctx.inputs
    dtype = _require_float(ctx, dy, y)
    if not _fits(dy.shape, y.shape):
        raise ctx.shape_error(f"gradient and output shapes differ: {fmt(dy.shape)} and {fmt(y.shape)}")
    return TensorSpec(_merge(dy.shape, y.shape), dtype)


# name, kernel, reference, gradient (g: upstream gradient), fusion expression
_ACTIVATIONS: list[tuple[str, Any, Any, Any, str]] = [
    ("Relu",    nnk.relu,    lambda x: np.maximum(x, 0),            lambda n, g: [relu_grad(g, _y(n))],    "max({0}, 0.0)"),
    ("Sigmoid", nnk.sigmoid, lambda x: 0.5 * (1 + np.tanh(0.5 * x)), lambda n, g: [sigmoid_grad(g, _y(n))], "(1.0 / (1.0 + math.exp(-{0})))"),
    ("Tanh",    nnk.tanh,    np.tanh,                                lambda n, g: [tanh_grad(g, _y(n))],    "math.tanh({0})"),
]  # fmt: skip

# (dy, y) -> dx, and their own gradients (z: the upstream gradient of dx).
_g = lambda n: n.inputs[0]  # noqa: E731
_o = lambda n: n.inputs[1]  # noqa: E731
_ACTIVATION_GRADS: list[tuple[str, Any, Any, Any, str]] = [
    ("ReluGrad",    nnk.relu_grad,    lambda g, y: np.where(y > 0, g, 0).astype(g.dtype), lambda n, z: [relu_grad(z, _o(n)), None],                          "({0} if {1} > 0.0 else 0.0)"),
    ("SigmoidGrad", nnk.sigmoid_grad, lambda g, y: g * y * (1 - y),                       lambda n, z: [sigmoid_grad(z, _o(n)), z * _g(n) * (1.0 - 2.0 * _o(n))], "({0} * {1} * (1.0 - {1}))"),
    ("TanhGrad",    nnk.tanh_grad,    lambda g, y: g * (1 - y * y),                       lambda n, z: [tanh_grad(z, _o(n)), z * _g(n) * _o(n) * -2.0],          "({0} * (1.0 - {1} * {1}))"),
]  # fmt: skip


def _one_upstream(rule: Any) -> Any:
    """A table rule of (node, upstream gradient) as a registry rule of (node, [gradient])."""
    return lambda node, dys: rule(node, dys[0])


for _name, _kernel, _ref, _rule, _expr in _ACTIVATIONS:
    register_op(OpDef(
        name=_name, family=FAMILY, infer=infer_float_unary,
        reference=lambda attrs, x, _f=_ref: _f(x).astype(x.dtype),
        grad=_one_upstream(_rule),
        kernels={"cpu": _elementwise_kernel(_kernel)}, elementwise=_expr,
    ))  # fmt: skip
for _name, _kernel, _ref, _rule, _expr in _ACTIVATION_GRADS:
    register_op(OpDef(
        name=_name, family=FAMILY, infer=_infer_activation_grad,
        reference=lambda attrs, g, y, _f=_ref: _f(g, y).astype(g.dtype),
        grad=_one_upstream(_rule),
        kernels={"cpu": _elementwise_kernel(_kernel)}, elementwise=_expr,
    ))  # fmt: skip


def relu(x: TensorLike, name: str = "relu") -> Tensor:
    """``max(x, 0)`` elementwise."""
    return apply("Relu", [x], name=name)


def sigmoid(x: TensorLike, name: str = "sigmoid") -> Tensor:
    """``1 / (1 + exp(-x))`` elementwise, without overflow for large ``|x|``."""
    return apply("Sigmoid", [x], name=name)


def tanh(x: TensorLike, name: str = "tanh") -> Tensor:
    return apply("Tanh", [x], name=name)


def relu_grad(dy: TensorLike, y: TensorLike, name: str = "relu_grad") -> Tensor:
    """``dy`` where the relu output ``y`` is positive, else 0."""
    return apply("ReluGrad", [dy, y], name=name)


def sigmoid_grad(dy: TensorLike, y: TensorLike, name: str = "sigmoid_grad") -> Tensor:
    """``dy * y * (1 - y)`` for the sigmoid output ``y``."""
    return apply("SigmoidGrad", [dy, y], name=name)


def tanh_grad(dy: TensorLike, y: TensorLike, name: str = "tanh_grad") -> Tensor:
    """``dy * (1 - y * y)`` for the tanh output ``y``."""
    return apply("TanhGrad", [dy, y], name=name)


# ------------------------------------------------------ Softmax, LogSoftmax
def _softmax_axis(ctx: InferContext) -> int:
    x = ctx.inputs[0]
    axes = normalize_axes(ctx.attrs["axis"], x.rank) if isinstance(ctx.attrs["axis"], int) else None
    if axes is None or x.rank == 0:
        raise ctx.shape_error(f"axis {ctx.attrs['axis']!r} is out of range for shape {fmt(x.shape)}")
    return axes[0]


def _infer_softmax(ctx: InferContext) -> TensorSpec:
    _softmax_axis(ctx)
    return infer_float_unary(ctx)


def _ref_softmax(attrs: dict[str, Any], x: np.ndarray, log: bool = False) -> np.ndarray:
    shifted = x - np.max(x, axis=attrs["axis"], keepdims=True)
    total = np.sum(np.exp(shifted), axis=attrs["axis"], keepdims=True)
    return (shifted - np.log(total) if log else np.exp(shifted) / total).astype(x.dtype)


def _softmax_kernel(log: bool) -> Any:
    def factory(node: Node, ctx: KernelContext) -> Any:
        axis = node.attrs["axis"]

        def run(x: np.ndarray) -> np.ndarray:
            if axis == x.ndim - 1:
                return nnk.softmax_rows(np.ascontiguousarray(x).reshape(-1, x.shape[-1]), log).reshape(x.shape)
            last = np.ascontiguousarray(np.moveaxis(x, axis, -1))
            out = nnk.softmax_rows(last.reshape(-1, last.shape[-1]), log)
            return np.ascontiguousarray(np.moveaxis(out.reshape(last.shape), -1, axis))

        return run

    return factory


def _grad_softmax(node: Node, dys: Dys) -> Grads:
    g, y, axis = dys[0], node.output(0), node.attrs["axis"]
    assert g is not None
    return [(g - reduce_sum(g * y, axis, keepdims=True)) * y]


def _grad_log_softmax(node: Node, dys: Dys) -> Grads:
    g, y, axis = dys[0], node.output(0), node.attrs["axis"]
    assert g is not None
    return [g - exp(y) * reduce_sum(g, axis, keepdims=True)]


register_op(OpDef(
    name="Softmax", family=FAMILY, infer=_infer_softmax, reference=_ref_softmax,
    grad=_grad_softmax, kernels={"cpu": _softmax_kernel(log=False)},
))  # fmt: skip
register_op(OpDef(
    name="LogSoftmax", family=FAMILY, infer=_infer_softmax,
    reference=lambda attrs, x: _ref_softmax(attrs, x, log=True),
    grad=_grad_log_softmax, kernels={"cpu": _softmax_kernel(log=True)},
))  # fmt: skip


def _axis_attrs(x: Tensor, axis: int) -> dict[str, Any]:
    # Stored non-negative so the kernels and gradients need no rank; an
    # out-of-range axis is kept as given for the shape rule to report.
    rank = len(x.shape)
    return {"axis": axis % rank if isinstance(axis, int) and rank and -rank <= axis < rank else axis}


def softmax(logits: TensorLike, axis: int = -1, name: str = "softmax") -> Tensor:
    """``exp(logits) / sum(exp(logits))`` along ``axis``, computed without overflow.

    Examples
    --------
    >>> import cellgraph as cg
    >>> g = cg.Graph()
    >>> with g.as_default():
    ...     p = cg.softmax(cg.constant([[0.0, 0.0], [1000.0, 0.0]]))
    >>> cg.Session(g).run(p)
    array([[0.5, 0.5],
           [1. , 0. ]], dtype=float32)
    """
    t = as_tensor(logits)
    return apply("Softmax", [t], _axis_attrs(t, axis), name=name)


def log_softmax(logits: TensorLike, axis: int = -1, name: str = "log_softmax") -> Tensor:
    """``logits - log(sum(exp(logits)))`` along ``axis``, computed without overflow."""
    t = as_tensor(logits)
    return apply("LogSoftmax", [t], _axis_attrs(t, axis), name=name)


# ------------------------------------------------ SparseSoftmaxCrossEntropy
def _infer_xent(ctx: InferContext) -> list[TensorSpec]:
    logits, labels = ctx.inputs
    if not is_float(logits.dtype):
        raise ctx.dtype_error(f"logits must be float, got {logits.dtype}")
    if labels.dtype not in INTS:
        raise ctx.dtype_error(f"labels must be int32 or int64 class indices, got {labels.dtype}")
    if logits.rank != 2:
        raise ctx.shape_error(f"logits must be 2-D (batch, classes), got {fmt(logits.shape)}")
    if labels.rank != 1:
        raise ctx.shape_error(f"labels must be 1-D (batch,), got {fmt(labels.shape)}")
    n, m = logits.shape[0], labels.shape[0]
    if n is not None and m is not None and n != m:
        raise ctx.shape_error(f"logits have {n} rows but labels have {m}: {fmt(logits.shape)} and {fmt(labels.shape)}")
    batch = n if n is not None else m
    return [TensorSpec((batch,), logits.dtype), TensorSpec((batch, logits.shape[1]), logits.dtype)]


def _ref_xent(attrs: dict[str, Any], logits: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    log_p = _ref_softmax({"axis": 1}, logits, log=True)
    rows = np.arange(len(labels))
    onehot = np.zeros_like(logits)
    onehot[rows, labels] = 1
    return -log_p[rows, labels], (np.exp(log_p) - onehot).astype(logits.dtype)


def _xent_kernel(node: Node, ctx: KernelContext) -> Any:
    def run(logits: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        loss, backprop, bad = nnk.sparse_softmax_xent(np.ascontiguousarray(logits), labels)
        if bad >= 0:
            raise ValueError(f"label {labels[bad]} of example {bad} is outside the valid range [0, {logits.shape[1]})")
        return loss, backprop

    return run


def _grad_xent(node: Node, dys: Dys) -> Grads:
    """d loss / d logits is the backprop output; the backprop output's own
    gradient (for second derivatives) is the softmax's."""
    dloss, dback = dys
    logits, backprop = node.inputs[0], node.output(1)
    parts = []
    if dloss is not None:
        parts.append(broadcast_like(dloss, backprop, (1,), keepdims=False) * backprop)
    if dback is not None:
        p = softmax(logits)
        parts.append((dback - reduce_sum(dback * p, 1, keepdims=True)) * p)
    total = parts[0] if len(parts) == 1 else parts[0] + parts[1]
    return [total, None]  # integer labels have no gradient


register_op(OpDef(
    name="SparseSoftmaxCrossEntropyWithLogits", family=FAMILY, infer=_infer_xent,
    reference=_ref_xent, grad=_grad_xent, kernels={"cpu": _xent_kernel},
))  # fmt: skip


def sparse_softmax_cross_entropy(logits: TensorLike, labels: TensorLike, name: str = "xent") -> Tensor:
    """Per-example cross-entropy of ``logits`` (N, C) against class indices ``labels`` (N,).

    Returns the (N,) losses; the gradient with respect to ``logits`` is
    ``softmax(logits) - onehot(labels)``, computed in the same pass.

    Examples
    --------
    >>> import numpy as np
    >>> import cellgraph as cg
    >>> g = cg.Graph()
    >>> with g.as_default():
    ...     loss = cg.sparse_softmax_cross_entropy(cg.constant([[0.0, 0.0]]), cg.constant([1]))
    >>> np.round(cg.Session(g).run(loss), 4)
    array([0.6931], dtype=float32)
    """
    g = graph_of([logits, labels])
    return apply_node(
        "SparseSoftmaxCrossEntropyWithLogits", [as_tensor(logits, graph=g), as_tensor(labels, graph=g)], name=name
    ).output(0)


# ----------------------------------------------------- BiasAdd, BiasAddGrad
def _infer_bias_add(ctx: InferContext) -> TensorSpec:
    x, bias = ctx.inputs
    if x.dtype != bias.dtype:
        raise ctx.dtype_error(f"input and bias have different dtypes: {x.dtype} and {bias.dtype}")
    if x.dtype == "bool":
        raise ctx.dtype_error("expects numeric tensors, got bool")
    if bias.rank != 1:
        raise ctx.shape_error(f"bias must be 1-D, got {fmt(bias.shape)}")
    if x.rank < 1:
        raise ctx.shape_error(f"input must have at least one axis (the channels), got {fmt(x.shape)}")
    c, b = x.shape[-1], bias.shape[0]
    if c is not None and b is not None and c != b:
        raise ctx.shape_error(
            f"bias has {b} elements but the input's last axis has {c}: {fmt(x.shape)} + {fmt(bias.shape)}"
        )
    return TensorSpec((*x.shape[:-1], c if c is not None else b), x.dtype)


def _infer_bias_add_grad(ctx: InferContext) -> TensorSpec:
    dy = ctx.inputs[0]
    if dy.rank < 1:
        raise ctx.shape_error(f"gradient must have at least one axis (the channels), got {fmt(dy.shape)}")
    return TensorSpec((dy.shape[-1],), dy.dtype)


def _bias_add_kernel(node: Node, ctx: KernelContext) -> Any:
    return lambda x, bias: nnk.bias_add(np.ascontiguousarray(x), bias)


def _bias_add_grad_kernel(node: Node, ctx: KernelContext) -> Any:
    return lambda dy: nnk.bias_add_grad(np.ascontiguousarray(dy), dy.shape[-1])


def _grad_bias_add_grad(node: Node, dys: Dys) -> Grads:
    dy = node.inputs[0]
    return [broadcast_like(dys[0], dy, tuple(range(len(dy.shape) - 1)), keepdims=False)]


register_op(OpDef(
    name="BiasAdd", family=FAMILY, infer=_infer_bias_add,
    reference=lambda attrs, x, bias: x + bias,
    grad=lambda node, dys: [dys[0], bias_add_grad(dys[0])],
    kernels={"cpu": _bias_add_kernel},
))  # fmt: skip
register_op(OpDef(
    name="BiasAddGrad", family=FAMILY, infer=_infer_bias_add_grad,
    reference=lambda attrs, dy: dy.reshape(-1, dy.shape[-1]).sum(axis=0).astype(dy.dtype),
    grad=_grad_bias_add_grad, kernels={"cpu": _bias_add_grad_kernel},
))  # fmt: skip


def bias_add(x: TensorLike, bias: TensorLike, name: str = "bias_add") -> Tensor:
    """``x + bias`` with ``bias`` (C,) added along the last axis of ``x`` (..., C)."""
    g = graph_of([x, bias])
    xt = as_tensor(x, graph=g)
    # A bias given as values takes the input's dtype; a tensor keeps its own.
    b = bias if isinstance(bias, Tensor) else as_tensor(np.asarray(bias, xt.dtype), graph=g)
    return apply("BiasAdd", [xt, b], name=name)


def bias_add_grad(dy: Tensor | None, name: str = "bias_add_grad") -> Tensor:
    """The gradient of ``bias_add`` for its bias: ``dy`` summed over every axis but the last."""
    assert dy is not None
    return apply("BiasAddGrad", [dy], name=name)


# ---------------------------------------------------------------- convolution
def _conv_output(ctx: InferContext, x: TensorSpec, f: TensorSpec) -> Shape:
    """The NHWC output shape of conv2d(x, f), checking every shape and attr involved."""
    shapes = f"{fmt(x.shape)} * {fmt(f.shape)}"
    _nhwc(ctx, "input", x)
    if f.rank != 4:
        raise ctx.shape_error(f"filter must be 4-D HWIO (height, width, in, out), got {fmt(f.shape)}")
    c, i = x.shape[3], f.shape[2]
    if c is not None and i is not None and c != i:
        raise ctx.shape_error(f"input has {c} channels but the filter expects {i}: {shapes}")
    oh, ow = _spatial(ctx, x.shape, (f.shape[0], f.shape[1]), "filter", shapes)
    return (x.shape[0], oh, ow, f.shape[3])


def _infer_conv2d(ctx: InferContext) -> TensorSpec:
    x, f = ctx.inputs
    dtype = _require_float(ctx, x, f)
    return TensorSpec(_conv_output(ctx, x, f), dtype)


def _infer_conv2d_backprop_input(ctx: InferContext) -> TensorSpec:
    like, f, dy = ctx.inputs
    dtype = _require_float(ctx, like, f, dy)
    _check_fits(ctx, "out_backprop", dy, _conv_output(ctx, like, f))
    return TensorSpec(like.shape, dtype)


def _infer_conv2d_backprop_filter(ctx: InferContext) -> TensorSpec:
    x, like, dy = ctx.inputs
    dtype = _require_float(ctx, x, like, dy)
    _check_fits(ctx, "out_backprop", dy, _conv_output(ctx, x, like))
    return TensorSpec(like.shape, dtype)


def _pad_amounts(size: int, k: int, stride: int, padding: str) -> tuple[int, int, int]:
    """(output size, pad before, pad after) along one dim."""
    out, before = window(size, k, stride, padding)
    total = max((out - 1) * stride + k - size, 0) if padding == "SAME" else 0
    return out, before, total - before


def _padded(
    x: np.ndarray, k: HW, strides: HW, padding: str, fill: float = 0.0
) -> tuple[np.ndarray, int, int, int, int]:
    """``x`` padded for windows ``k``: (padded x, out height, out width, pad top, pad left)."""
    oh, top, bottom = _pad_amounts(x.shape[1], k[0], strides[0], padding)
    ow, left, right = _pad_amounts(x.shape[2], k[1], strides[1], padding)
    padded = np.pad(x, ((0, 0), (top, bottom), (left, right), (0, 0)), constant_values=fill)
    return padded, oh, ow, top, left


def _taps(k: HW, strides: HW, oh: int, ow: int) -> list[tuple[int, int, tuple[slice, slice, slice, slice]]]:
    """For each window tap (p, q), the index of the padded pixels it reads, output-shaped."""
    sh, sw = strides
    every = slice(None)
    return [
        (p, q, (every, slice(p, p + sh * (oh - 1) + 1, sh), slice(q, q + sw * (ow - 1) + 1, sw), every))
        for p in range(k[0])
        for q in range(k[1])
    ]


def _crop(padded: np.ndarray, top: int, left: int, like: tuple[int, ...]) -> np.ndarray:
    return padded[:, top : top + like[1], left : left + like[2], :]


def _ref_conv2d(attrs: dict[str, Any], x: np.ndarray, f: np.ndarray) -> np.ndarray:
    strides, padding = attrs["strides"], attrs["padding"]
    xp, oh, ow, _, _ = _padded(x, f.shape[:2], strides, padding)
    out = np.zeros((x.shape[0], oh, ow, f.shape[3]), x.dtype)
    for p, q, index in _taps(f.shape[:2], strides, oh, ow):
        out += np.einsum("nhwc,co->nhwo", xp[index], f[p, q])
    return out


def _ref_conv2d_backprop_input(attrs: dict[str, Any], like: np.ndarray, f: np.ndarray, dy: np.ndarray) -> np.ndarray:
    strides, padding = attrs["strides"], attrs["padding"]
    dxp, oh, ow, top, left = _padded(np.zeros_like(like), f.shape[:2], strides, padding)
    for p, q, index in _taps(f.shape[:2], strides, oh, ow):
        dxp[index] += np.einsum("nhwo,co->nhwc", dy, f[p, q])
    return _crop(dxp, top, left, like.shape).copy()


def _ref_conv2d_backprop_filter(attrs: dict[str, Any], x: np.ndarray, like: np.ndarray, dy: np.ndarray) -> np.ndarray:
    strides, padding = attrs["strides"], attrs["padding"]
    xp, oh, ow, _, _ = _padded(x, like.shape[:2], strides, padding)
    df = np.zeros_like(like)
    for p, q, index in _taps(like.shape[:2], strides, oh, ow):
        df[p, q] = np.einsum("nhwc,nhwo->co", xp[index], dy)
    return df


def _grad_conv2d(node: Node, dys: Dys) -> Grads:
    (x, f), g = node.inputs, dys[0]
    assert g is not None
    strides, padding = _strides_padding(node)
    return [
        conv2d_backprop_input(x, f, g, strides, padding),
        conv2d_backprop_filter(x, f, g, strides, padding),
    ]


def _grad_conv2d_backprop_input(node: Node, dys: Dys) -> Grads:
    # dx is bilinear in (f, dy): its adjoints are the other two convolutions.
    (_, f, dy), z = node.inputs, dys[0]
    assert z is not None
    strides, padding = _strides_padding(node)
    return [None, conv2d_backprop_filter(z, f, dy, strides, padding), conv2d(z, f, strides, padding)]


def _grad_conv2d_backprop_filter(node: Node, dys: Dys) -> Grads:
    (x, _, dy), z = node.inputs, dys[0]
    assert z is not None
    strides, padding = _strides_padding(node)
    return [conv2d_backprop_input(x, z, dy, strides, padding), None, conv2d(x, z, strides, padding)]


def _conv_kernel(make: Any) -> Any:
    def factory(node: Node, ctx: KernelContext) -> Any:
        return make(*_strides_padding(node))

    return factory


register_op(OpDef(
    name="Conv2D", family=FAMILY, infer=_infer_conv2d, reference=_ref_conv2d,
    grad=_grad_conv2d, kernels={"cpu": _conv_kernel(conv_kernels.conv2d)},
))  # fmt: skip
register_op(OpDef(
    name="Conv2DBackpropInput", family=FAMILY, infer=_infer_conv2d_backprop_input,
    reference=_ref_conv2d_backprop_input, grad=_grad_conv2d_backprop_input,
    kernels={"cpu": _conv_kernel(conv_kernels.conv2d_input_grad)},
))  # fmt: skip
register_op(OpDef(
    name="Conv2DBackpropFilter", family=FAMILY, infer=_infer_conv2d_backprop_filter,
    reference=_ref_conv2d_backprop_filter, grad=_grad_conv2d_backprop_filter,
    kernels={"cpu": _conv_kernel(conv_kernels.conv2d_filter_grad)},
))  # fmt: skip


def _window_attrs(strides: Any, padding: Any, ksize: Any = None) -> dict[str, Any]:
    # Normalised when valid; kept as given otherwise, for the shape rule to
    # report with the node's name and cell.
    attrs = {"strides": _hw(strides) or strides, "padding": padding}
    if ksize is not None:
        attrs["ksize"] = _hw(ksize) or ksize
    return attrs


def conv2d(
    x: TensorLike,
    filters: TensorLike,
    strides: int | Sequence[int] = 1,
    padding: str = "SAME",
    name: str = "conv2d",
) -> Tensor:
    """2-D convolution of NHWC ``x`` with HWIO ``filters`` (cross-correlation, as in TensorFlow).

    ``strides`` is an int, (height, width) or (1, height, width, 1);
    ``padding`` is "SAME" (output size ``ceil(input / stride)``) or "VALID"
    (only whole windows).

    Examples
    --------
    >>> import numpy as np
    >>> import cellgraph as cg
    >>> g = cg.Graph()
    >>> with g.as_default():
    ...     x = cg.placeholder((None, 8, 8, 3), name="images")
    ...     y = cg.conv2d(x, cg.constant(np.ones((3, 3, 3, 16), np.float32)), strides=2)
    >>> y.shape
    (None, 4, 4, 16)
    """
    g = graph_of([x, filters])
    return apply(
        "Conv2D", [as_tensor(x, graph=g), as_tensor(filters, graph=g)], _window_attrs(strides, padding), name=name
    )


def conv2d_backprop_input(
    x: Tensor,
    filters: TensorLike,
    dy: Tensor,
    strides: int | Sequence[int] = 1,
    padding: str = "SAME",
    name: str = "conv2d_backprop_input",
) -> Tensor:
    """The gradient of ``conv2d(x, filters)`` for ``x``, given the output's gradient ``dy``.

    ``x`` only lends its (run-time) shape; its values are not read.
    """
    attrs = _window_attrs(strides, padding)
    return apply("Conv2DBackpropInput", [x, as_tensor(filters, graph=x.graph), dy], attrs, name=name)


def conv2d_backprop_filter(
    x: TensorLike,
    filters: Tensor,
    dy: Tensor,
    strides: int | Sequence[int] = 1,
    padding: str = "SAME",
    name: str = "conv2d_backprop_filter",
) -> Tensor:
    """The gradient of ``conv2d(x, filters)`` for ``filters``, given the output's gradient ``dy``.

    ``filters`` only lends its shape; its values are not read.
    """
    attrs = _window_attrs(strides, padding)
    return apply("Conv2DBackpropFilter", [as_tensor(x, graph=filters.graph), filters, dy], attrs, name=name)


# ---------------------------------------------------------------------- pooling
def _pool_output(ctx: InferContext, x: TensorSpec) -> Shape:
    _nhwc(ctx, "input", x)
    ksize = _window_attr(ctx, "ksize")
    shapes = f"window {fmt(ksize)} over {fmt(x.shape)}"
    oh, ow = _spatial(ctx, x.shape, ksize, "window", shapes)
    return (x.shape[0], oh, ow, x.shape[3])


def _infer_pool(ctx: InferContext) -> TensorSpec:
    x = ctx.inputs[0]
    return TensorSpec(_pool_output(ctx, x), _require_float(ctx, x))


def _infer_pool_grad(ctx: InferContext) -> TensorSpec:
    """(x or its stand-in, dy) -> dx."""
    x, dy = ctx.inputs
    dtype = _require_float(ctx, x, dy)
    _check_fits(ctx, "out_backprop", dy, _pool_output(ctx, x))
    return TensorSpec(x.shape, dtype)


def _infer_max_pool_grad_grad(ctx: InferContext) -> TensorSpec:
    """(x, ddx) -> ddy."""
    x, ddx = ctx.inputs
    dtype = _require_float(ctx, x, ddx)
    _check_fits(ctx, "gradient", ddx, x.shape)
    return TensorSpec(_pool_output(ctx, x), dtype)


def _pool_attrs(attrs: dict[str, Any]) -> tuple[HW, HW, str]:
    return attrs["ksize"], attrs["strides"], attrs["padding"]


def _windows(x: np.ndarray, attrs: dict[str, Any], fill: float) -> tuple[np.ndarray, int, int, int, int]:
    """Every window tap of ``x``'s pooling as one (taps, n, oh, ow, c) stack, plus the geometry."""
    k, strides, padding = _pool_attrs(attrs)
    xp, oh, ow, top, left = _padded(x, k, strides, padding, fill)
    return np.stack([xp[index] for _, _, index in _taps(k, strides, oh, ow)]), oh, ow, top, left


def _scatter_taps(values: np.ndarray, like: np.ndarray, attrs: dict[str, Any]) -> np.ndarray:
    """The adjoint of ``_windows``: add each tap's (n, oh, ow, c) values back onto its pixels."""
    k, strides, padding = _pool_attrs(attrs)
    dxp, oh, ow, top, left = _padded(np.zeros_like(like), k, strides, padding)
    for t, (_, _, index) in enumerate(_taps(k, strides, oh, ow)):
        dxp[index] += values[t]
    return _crop(dxp, top, left, like.shape).copy()


def _ref_max_pool(attrs: dict[str, Any], x: np.ndarray) -> np.ndarray:
    return _windows(x, attrs, -np.inf)[0].max(axis=0)


def _ref_max_pool_grad(attrs: dict[str, Any], x: np.ndarray, dy: np.ndarray) -> np.ndarray:
    taps = _windows(x, attrs, -np.inf)[0]
    first_max = taps.argmax(axis=0) == np.arange(len(taps)).reshape(-1, 1, 1, 1, 1)
    return _scatter_taps(np.where(first_max, dy, 0).astype(x.dtype), x, attrs)


def _ref_max_pool_grad_grad(attrs: dict[str, Any], x: np.ndarray, ddx: np.ndarray) -> np.ndarray:
    taps = _windows(x, attrs, -np.inf)[0]
    first_max = taps.argmax(axis=0) == np.arange(len(taps)).reshape(-1, 1, 1, 1, 1)
    return np.where(first_max, _windows(ddx, attrs, 0.0)[0], 0).sum(axis=0).astype(x.dtype)


def _avg_pool_counts(like: np.ndarray, attrs: dict[str, Any]) -> np.ndarray:
    """How many real (unpadded) pixels each output's window covers."""
    return _windows(np.ones((1, *like.shape[1:3], 1), like.dtype), attrs, 0.0)[0].sum(axis=0)


def _ref_avg_pool(attrs: dict[str, Any], x: np.ndarray) -> np.ndarray:
    return (_windows(x, attrs, 0.0)[0].sum(axis=0) / _avg_pool_counts(x, attrs)).astype(x.dtype)


def _ref_avg_pool_grad(attrs: dict[str, Any], like: np.ndarray, dy: np.ndarray) -> np.ndarray:
    share = (dy / _avg_pool_counts(like, attrs)).astype(dy.dtype)
    return _scatter_taps(np.broadcast_to(share, (attrs["ksize"][0] * attrs["ksize"][1], *share.shape)), like, attrs)


def _pool_args(node: Node) -> tuple[HW, HW, str]:
    ksize, (strides, padding) = _hw(node.attrs["ksize"]), _strides_padding(node)
    assert ksize is not None
    return ksize, strides, padding


def _grad_max_pool(node: Node, dys: Dys) -> Grads:
    return [max_pool_grad(node.inputs[0], dys[0], *_pool_args(node))]


def _grad_max_pool_grad(node: Node, dys: Dys) -> Grads:
    # dx is linear in dy (routed through x's maxima, which move only at ties).
    return [None, max_pool_grad_grad(node.inputs[0], dys[0], *_pool_args(node))]


def _grad_max_pool_grad_grad(node: Node, dys: Dys) -> Grads:
    return [None, max_pool_grad(node.inputs[0], dys[0], *_pool_args(node))]


def _grad_avg_pool(node: Node, dys: Dys) -> Grads:
    return [avg_pool_grad(node.inputs[0], dys[0], *_pool_args(node))]


def _grad_avg_pool_grad(node: Node, dys: Dys) -> Grads:
    assert dys[0] is not None
    return [None, avg_pool(dys[0], *_pool_args(node))]


def _pool_kernel(make: Any) -> Any:
    def factory(node: Node, ctx: KernelContext) -> Any:
        return make(*_pool_args(node))

    return factory


_POOLS: list[tuple[str, Any, Any, Any, Any]] = [
    ("MaxPool",         _infer_pool,               _ref_max_pool,           _grad_max_pool,           _pool_kernel(pool_kernels.max_pool_forward)),
    ("MaxPoolGrad",     _infer_pool_grad,          _ref_max_pool_grad,      _grad_max_pool_grad,      _pool_kernel(pool_kernels.max_pool_backprop)),
    ("MaxPoolGradGrad", _infer_max_pool_grad_grad, _ref_max_pool_grad_grad, _grad_max_pool_grad_grad, _pool_kernel(pool_kernels.max_pool_backprop_backprop)),
    ("AvgPool",         _infer_pool,               _ref_avg_pool,           _grad_avg_pool,           _pool_kernel(pool_kernels.avg_pool_forward)),
    ("AvgPoolGrad",     _infer_pool_grad,          _ref_avg_pool_grad,      _grad_avg_pool_grad,      _pool_kernel(pool_kernels.avg_pool_backprop)),
]  # fmt: skip
for _name, _infer, _ref, _grad, _factory in _POOLS:
    register_op(OpDef(name=_name, family=FAMILY, infer=_infer, reference=_ref, grad=_grad, kernels={"cpu": _factory}))


def _pool(op: str, inputs: Sequence[TensorLike], ksize: Any, strides: Any, padding: Any, name: str) -> Tensor:
    return apply(op, inputs, _window_attrs(strides, padding, ksize), name=name)


def max_pool(
    x: TensorLike,
    ksize: int | Sequence[int] = 2,
    strides: int | Sequence[int] = 2,
    padding: str = "VALID",
    name: str = "max_pool",
) -> Tensor:
    """The largest value of each ``ksize`` window of NHWC ``x``, per channel.

    ``ksize`` and ``strides`` are an int, (height, width) or (1, h, w, 1);
    with "SAME" padding the padded pixels never win.
    """
    return _pool("MaxPool", [x], ksize, strides, padding, name)


def avg_pool(
    x: TensorLike,
    ksize: int | Sequence[int] = 2,
    strides: int | Sequence[int] = 2,
    padding: str = "VALID",
    name: str = "avg_pool",
) -> Tensor:
    """The mean of each ``ksize`` window of NHWC ``x``, per channel; with "SAME"
    padding a window averages only the real pixels it covers."""
    return _pool("AvgPool", [x], ksize, strides, padding, name)


def max_pool_grad(
    x: Tensor, dy: Tensor | None, ksize: Any, strides: Any, padding: str, name: str = "max_pool_grad"
) -> Tensor:
    """The gradient of ``max_pool(x)``: ``dy`` routed to each window's first maximum."""
    assert dy is not None
    return _pool("MaxPoolGrad", [x, dy], ksize, strides, padding, name)


def max_pool_grad_grad(
    x: Tensor, ddx: Tensor | None, ksize: Any, strides: Any, padding: str, name: str = "max_pool_grad_grad"
) -> Tensor:
    """The gradient of ``max_pool_grad`` for its ``dy``: ``ddx`` read at each window's first maximum."""
    assert ddx is not None
    return _pool("MaxPoolGradGrad", [x, ddx], ksize, strides, padding, name)


def avg_pool_grad(
    like: Tensor, dy: Tensor | None, ksize: Any, strides: Any, padding: str, name: str = "avg_pool_grad"
) -> Tensor:
    """The gradient of ``avg_pool``: ``dy`` spread evenly over each window; ``like`` lends its shape."""
    assert dy is not None
    return _pool("AvgPoolGrad", [like, dy], ksize, strides, padding, name)


# ---------------------------------------------------------------------- Dropout
def _infer_dropout(ctx: InferContext) -> list[TensorSpec]:
    rate = ctx.attrs["rate"]
    if isinstance(rate, bool) or not isinstance(rate, numbers.Real) or not 0 <= float(rate) < 1:
        raise ctx.shape_error(f"rate must be a number in [0, 1), got {rate!r}")
    x = infer_float_unary(ctx)
    return [x, x]


def _dropout_draw(seed: int) -> Any:
    """The uniform draws of one dropout node: the same sequence for the same seed."""
    rng = np.random.default_rng(seed)
    return lambda shape: rng.random(shape, dtype=np.float32)


def _ref_dropout(attrs: dict[str, Any], x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    rate = attrs["rate"]
    u = _dropout_draw(attrs["seed"])(x.shape)
    mask = np.where(u >= rate, np.asarray(1 / (1 - rate), x.dtype), np.asarray(0, x.dtype))
    return x * mask, mask


def _dropout_kernel(node: Node, ctx: KernelContext) -> Any:
    # One generator per bound kernel: each run draws a new mask, and a new
    # session (or executor) replays the same sequence.
    rate = float(node.attrs["rate"])
    scale = 1.0 / (1.0 - rate)
    draw = _dropout_draw(node.attrs["seed"])
    return lambda x: nnk.dropout(np.ascontiguousarray(x), draw(x.shape), rate, scale)


def _grad_dropout(node: Node, dys: Dys) -> Grads:
    g = dys[0]
    return [None if g is None else g * node.output(1)]


register_op(OpDef(
    name="Dropout", family=FAMILY, infer=_infer_dropout, reference=_ref_dropout,
    grad=_grad_dropout, kernels={"cpu": _dropout_kernel},
    stateful=True,  # a fresh mask each run: never constant-folded or deduplicated
))  # fmt: skip


def dropout(x: TensorLike, rate: float, seed: int | None = None, name: str = "dropout") -> Tensor:
    """Zero each element of ``x`` with probability ``rate``; scale the rest by ``1 / (1 - rate)``.

    Every run draws a new mask from a generator seeded by ``seed`` (by default
    derived from the node's name), so the masks of a session are reproducible.
    The gradient goes through the same mask as the forward pass.
    """
    t = as_tensor(x)
    if seed is None:
        seed = zlib.crc32(t.graph.unique_name(name).encode())
    return apply_node("Dropout", [t], {"rate": rate, "seed": int(seed)}, name=name).output(0)


__all__ = [
    "avg_pool", "bias_add", "conv2d", "conv2d_backprop_filter", "conv2d_backprop_input", "dropout",
    "log_softmax", "max_pool", "relu", "sigmoid", "softmax", "sparse_softmax_cross_entropy", "tanh",
]  # fmt: skip
