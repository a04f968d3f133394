"""Neural-network ops: activations, softmax, cross-entropy, bias and dropout.

Gradients that need more than a line of other ops are ops of their own
(``ReluGrad``, ``BiasAddGrad``, ...), each a full registry entry with a NumPy
reference and a gradient of its own, so second derivatives work and every
kernel is checked. Convolution and pooling live in ``conv.py``.
"""

from __future__ import annotations

import numbers
import zlib
from typing import Any

import numpy as np

from ..dtypes import INTS, is_float
from ..graph import Node, Tensor
from ..kernels.cpu import nn as nnk
from ..kernels.cuda import cuda_kernel
from ..opdef import InferContext, KernelContext, OpDef, TensorSpec, register_op
from ..shapes import fmt, normalize_axes
from .base import (
    TensorLike,
    apply,
    apply_node,
    as_tensor,
    elementwise_kernel,
    fits,
    graph_of,
    infer_float_unary,
    merge_shapes,
    require_float,
    rule_checked,
    shapes_checked,
)
from .math import MAX_EXPR, broadcast_like, exp, reduce_sum

FAMILY = "nn"
Dys = list[Tensor | None]
Grads = list[Tensor | None]
HW = tuple[int, int]


# --------------------------------------------------- activations, as a table
# Gradients use helper ops of (dy, y): one pass over memory instead of two or
# three elementwise ops, and the forward output y is all they need.
_y = lambda n: n.output(0)  # noqa: E731


def _infer_activation_grad(ctx: InferContext) -> TensorSpec:
    dy, y = ctx.inputs
    dtype = require_float(ctx, dy, y)
    if not fits(dy.shape, y.shape):
        raise ctx.shape_error(f"gradient and output shapes differ: {fmt(dy.shape)} and {fmt(y.shape)}")
    return TensorSpec(merge_shapes(dy.shape, y.shape), dtype)


def _ref_sigmoid(x: np.ndarray) -> np.ndarray:
    """The logistic function without cancellation in either tail: exp(-|x|) never overflows."""
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e))


# name, kernel, reference, gradient (g: upstream gradient), fusion expression
_ACTIVATIONS: list[tuple[str, Any, Any, Any, str]] = [
    ("Relu",    nnk.relu,    lambda x: np.maximum(x, 0),            lambda n, g: [relu_grad(g, _y(n))],    MAX_EXPR.format("{0}", "0.0")),
    ("Sigmoid", nnk.sigmoid, _ref_sigmoid,                           lambda n, g: [sigmoid_grad(g, _y(n))], "sigmoid_({0})"),
    ("Tanh",    nnk.tanh,    np.tanh,                                lambda n, g: [tanh_grad(g, _y(n))],    "tanh_({0})"),
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
        kernels={"cpu": elementwise_kernel(_kernel), "cuda": cuda_kernel("nn", "activation_op", _name)},
        elementwise=_expr,
    ))  # fmt: skip
# The gradients run their shape rule again on the arrays' shapes: the kernels walk dy and read y at the same
# flat index, so with dims unknown when building, a y of another shape was read past its end (or in another
# order, transposed) and a gradient came back without a word.
for _name, _kernel, _ref, _rule, _expr in _ACTIVATION_GRADS:
    register_op(OpDef(
        name=_name, family=FAMILY, infer=_infer_activation_grad,
        reference=lambda attrs, g, y, _f=_ref: _f(g, y).astype(g.dtype),
        grad=_one_upstream(_rule),
        kernels={"cpu": rule_checked(elementwise_kernel(_kernel)),
                 "cuda": rule_checked(cuda_kernel("nn", "activation_op", _name))},
        elementwise=_expr,
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
    if x.shape[attrs["axis"]] == 0:
        return x.copy()  # nothing to normalise along an empty axis (and np.max would raise)
    shifted = x - np.max(x, axis=attrs["axis"], keepdims=True)
    total = np.sum(np.exp(shifted), axis=attrs["axis"], keepdims=True)
    return (shifted - np.log(total) if log else np.exp(shifted) / total).astype(x.dtype)


def _softmax_kernel(log: bool) -> Any:
    def factory(node: Node, ctx: KernelContext) -> Any:
        axis = node.attrs["axis"]
        return lambda x: nnk.softmax(x, axis, log)

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
    grad=_grad_softmax, kernels={"cpu": _softmax_kernel(log=False), "cuda": cuda_kernel("nn", "softmax_op", False)},
))  # fmt: skip
register_op(OpDef(
    name="LogSoftmax", family=FAMILY, infer=_infer_softmax,
    reference=lambda attrs, x: _ref_softmax(attrs, x, log=True),
    grad=_grad_log_softmax, kernels={"cpu": _softmax_kernel(log=True), "cuda": cuda_kernel("nn", "softmax_op", True)},
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


def _labels_problem(node: Node, logits: Any, labels: Any) -> str | None:
    """One label per row at run time too: the kernel reads labels by the logits' rows, so 5 labels for 3 rows
    lost the last 2 without a word (and 1 label for 3 read past its end)."""
    if labels.shape[0] == logits.shape[0]:
        return None
    return (
        f"logits have {logits.shape[0]} rows but labels have {labels.shape[0]}: {fmt(tuple(logits.shape))} and "
        f"{fmt(tuple(labels.shape))}"
    )


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
    reference=_ref_xent, grad=_grad_xent,
    kernels={"cpu": shapes_checked(_xent_kernel, _labels_problem),
             "cuda": shapes_checked(cuda_kernel("nn", "sparse_softmax_xent_op"), _labels_problem)},
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
    # A (1,) bias fed for 3 channels was broadcast, and its gradient came back (3,): the rule runs again.
    kernels={"cpu": rule_checked(_bias_add_kernel), "cuda": rule_checked(cuda_kernel("nn", "bias_add_op"))},
))  # fmt: skip
register_op(OpDef(
    name="BiasAddGrad", family=FAMILY, infer=_infer_bias_add_grad,
    reference=lambda attrs, dy: dy.sum(axis=tuple(range(dy.ndim - 1))).astype(dy.dtype),
    grad=_grad_bias_add_grad,
    kernels={"cpu": _bias_add_grad_kernel, "cuda": cuda_kernel("nn", "bias_add_grad_op")},
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
    rate = float(node.attrs["rate"])
    scale = 1.0 / (1.0 - rate)
    # The session's stream: each run draws a new mask, whichever plan runs it (KernelContext.stream).
    draw = ctx.stream(node, _dropout_draw)
    return lambda x: nnk.dropout(np.ascontiguousarray(x), draw(x.shape), rate, scale)


def _grad_dropout(node: Node, dys: Dys) -> Grads:
    g = dys[0]
    return [None if g is None else g * node.output(1)]


register_op(OpDef(
    name="Dropout", family=FAMILY, infer=_infer_dropout, reference=_ref_dropout,
    grad=_grad_dropout, kernels={"cpu": _dropout_kernel, "cuda": cuda_kernel("nn", "dropout_op")},
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
    "bias_add", "dropout", "log_softmax", "relu", "sigmoid", "softmax", "sparse_softmax_cross_entropy", "tanh",
]  # fmt: skip
