"""Math ops: elementwise arithmetic, comparisons, matmul, reductions, casts."""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from math import prod
from typing import Any

import numpy as np

from ..dtypes import as_dtype, is_float
from ..graph import Node, Tensor
from ..kernels.cpu import elementwise as ew
from ..kernels.cpu.matmul import matmul as matmul_kernel
from ..kernels.cpu.reduce import empty_value, lowest, reducer
from ..kernels.cuda import cuda_kernel
from ..opdef import InferContext, OpDef, TensorSpec, not_differentiable, register_op, simple_kernel
from ..shapes import fmt, normalize_axes
from .base import (
    TensorLike,
    apply,
    binary_inputs,
    elementwise_kernel,
    infer_broadcast,
    infer_compare,
    infer_float_broadcast,
    infer_float_unary,
    infer_same,
)

FAMILY = "math"
Dys = list[Tensor | None]

# --------------------------------------------------- elementwise, as a table
# name, kernel, reference, gradient (x/y: inputs, z: output, g: upstream grad),
# and the scalar expression elementwise fusion will use.
_x = lambda n: n.inputs[0]  # noqa: E731
_y = lambda n: n.inputs[1]  # noqa: E731
_z = lambda n: n.output(0)  # noqa: E731

# Fused Maximum and Minimum keep a NaN on either side, as np.maximum does unfused: Python's max(1.0, nan)
# (what a fused loop's max(a, b) is) gives 1.0, and a fused maximum(a, b) dropped a NaN in b. Every fused
# expression that takes a maximum or minimum (Relu, ClipByValue) is built from these: in a CUDA kernel the
# builtin max is fmax, which drops a NaN on either side (a fused Relu of NaN was 0 on an H200).
MAX_EXPR = "({0} if {0} > {1} or {0} != {0} else {1})"
MIN_EXPR = "({0} if {0} < {1} or {0} != {0} else {1})"
# Maximum and Minimum give a tie's whole gradient to x, as TensorFlow's _MaximumGrad (x >= y) does; PyTorch
# splits it in half. Either is a subgradient: this one is TensorFlow's on purpose.
_BINARY: list[tuple[Any, ...]] = [
    ("Add",     ew.add,     np.add,      lambda n, g: [g, g],                                             "({0} + {1})"),
    ("Sub",     ew.sub,     np.subtract, lambda n, g: [g, neg(g)],                                        "({0} - {1})"),
    ("Mul",     ew.mul,     np.multiply, lambda n, g: [g * _y(n), g * _x(n)],                             "({0} * {1})"),
    ("Div",     ew.div,     np.divide,   lambda n, g: [g / _y(n), neg(g) * _z(n) / _y(n)],                "({0} / {1})"),
    ("Pow",     ew.power,   np.power,    lambda n, g: _grad_pow(n, g),                                     "({0} ** {1})"),
    ("Maximum", ew.maximum, np.maximum,  lambda n, g: [g * _mask(greater_equal(_x(n), _y(n)), g), g * _mask(less(_x(n), _y(n)), g)], MAX_EXPR),
    ("Minimum", ew.minimum, np.minimum,  lambda n, g: [g * _mask(less_equal(_x(n), _y(n)), g), g * _mask(less(_y(n), _x(n)), g)], MIN_EXPR),
]  # fmt: skip

_UNARY: list[tuple[Any, ...]] = [
    ("Neg",    ew.neg,    np.negative, lambda n, g: [neg(g)],                         "(-{0})"),
    ("Square", ew.square, np.square,   lambda n, g: [g * 2.0 * _x(n)],                "({0} * {0})"),
    ("Sqrt",   ew.sqrt,   np.sqrt,     lambda n, g: [g * 0.5 / _z(n)],                "math.sqrt({0})"),
    ("Exp",    ew.exp,    np.exp,      lambda n, g: [g * _z(n)],                      "math.exp({0})"),
    ("Log",    ew.log,    np.log,      lambda n, g: [g / _x(n)],                      "math.log({0})"),
]  # fmt: skip

_COMPARE: list[tuple[Any, ...]] = [
    ("Equal",        ew.equal,         np.equal),
    ("Less",         ew.less,          np.less),
    ("GreaterEqual", ew.greater_equal, np.greater_equal),
]  # fmt: skip


def _mask(cond: Tensor, like: Tensor) -> Tensor:
    return cast(cond, like.dtype)


def _grad_pow(n: Node, g: Tensor) -> list[Tensor]:
    """``y x**(y-1)`` and ``x**y log x``, each 0 where it is a 0 * inf with limit 0, as PyTorch's pow_backward masks:
    the base's where ``y == 0`` (``0 * 0**-1`` was NaN at ``x == 0``), the exponent's where ``x == 0`` and ``y >= 0``
    (``0**y * log 0`` was NaN, or -inf at ``0**0``). TensorFlow masks only the second (its ``log x`` is 0 for
    ``x <= 0``, a negative base included; PyTorch and this rule give NaN there, where ``x**y`` has no derivative
    in ``y``)."""
    from .logic import logical_and  # these modules import this one
    from .math_unary import where

    x, y, z = _x(n), _y(n), _z(n)
    dx = where(equal(y, 0.0), 0.0, g * y * pow(x, y - 1.0))
    dy = where(logical_and(equal(x, 0.0), greater_equal(y, 0.0)), 0.0, g * z * log(x))
    return [dx, dy]


def _as_list_grad(rule: Any) -> Any:
    return lambda node, dys: rule(node, dys[0])


for _name, _kernel, _ref, _rule, _expr in _BINARY:
    register_op(OpDef(
        name=_name, family=FAMILY,
        infer=infer_broadcast if _name in ("Add", "Sub", "Mul", "Maximum", "Minimum") else infer_float_broadcast,
        reference=lambda attrs, a, b, _f=_ref: _f(a, b),
        grad=_as_list_grad(_rule), broadcasts=True, elementwise=_expr,
        kernels={"cpu": elementwise_kernel(_kernel), "cuda": cuda_kernel("elementwise", "binary_op", _name)},
    ))  # fmt: skip
for _name, _kernel, _ref, _rule, _expr in _UNARY:
    register_op(OpDef(
        name=_name, family=FAMILY, infer=infer_same if _name in ("Neg", "Square") else infer_float_unary,
        reference=lambda attrs, x, _f=_ref: _f(x),
        grad=_as_list_grad(_rule), elementwise=_expr,
        kernels={"cpu": elementwise_kernel(_kernel), "cuda": cuda_kernel("elementwise", "unary_op", _name)},
    ))  # fmt: skip
for _name, _kernel, _ref in _COMPARE:
    register_op(OpDef(
        name=_name, family=FAMILY, infer=infer_compare,
        reference=lambda attrs, a, b, _f=_ref: _f(a, b),
        grad=not_differentiable, broadcasts=True, strings=_name == "Equal",
        kernels={"cpu": elementwise_kernel(_kernel), "cuda": cuda_kernel("elementwise", "binary_op", _name)},
    ))  # fmt: skip


def add(a: TensorLike, b: TensorLike, name: str = "add") -> Tensor:
    """``a + b`` with NumPy broadcasting."""
    return apply("Add", binary_inputs(a, b, "Add"), name=name)


def sub(a: TensorLike, b: TensorLike, name: str = "sub") -> Tensor:
    return apply("Sub", binary_inputs(a, b, "Sub"), name=name)


def mul(a: TensorLike, b: TensorLike, name: str = "mul") -> Tensor:
    return apply("Mul", binary_inputs(a, b, "Mul"), name=name)


def div(a: TensorLike, b: TensorLike, name: str = "div") -> Tensor:
    return apply("Div", binary_inputs(a, b, "Div"), name=name)


def pow(a: TensorLike, b: TensorLike, name: str = "pow") -> Tensor:  # noqa: A001 - TF's name
    return apply("Pow", binary_inputs(a, b, "Pow"), name=name)


def maximum(a: TensorLike, b: TensorLike, name: str = "maximum") -> Tensor:
    """The larger of ``a`` and ``b`` elementwise (broadcast); NaN where either is NaN, as ``torch.maximum``.

    Where they tie, the whole gradient goes to ``a`` (TensorFlow's rule: ``a >= b``); ``torch.maximum``
    gives each half. So ``maximum(x, 0.0)`` has slope 1 at x = 0, where ``relu`` (and torch's) has 0.
    """
    return apply("Maximum", binary_inputs(a, b, "Maximum"), name=name)


def minimum(a: TensorLike, b: TensorLike, name: str = "minimum") -> Tensor:
    """The smaller of ``a`` and ``b`` elementwise (broadcast); NaN where either is NaN, as ``torch.minimum``.

    Where they tie, the whole gradient goes to ``a`` (TensorFlow's rule: ``a <= b``); ``torch.minimum``
    gives each half.
    """
    return apply("Minimum", binary_inputs(a, b, "Minimum"), name=name)


def neg(x: TensorLike, name: str = "neg") -> Tensor:
    return apply("Neg", [x], name=name)


def square(x: TensorLike, name: str = "square") -> Tensor:
    return apply("Square", [x], name=name)


def sqrt(x: TensorLike, name: str = "sqrt") -> Tensor:
    return apply("Sqrt", [x], name=name)


def exp(x: TensorLike, name: str = "exp") -> Tensor:
    return apply("Exp", [x], name=name)


def log(x: TensorLike, name: str = "log") -> Tensor:
    return apply("Log", [x], name=name)


def equal(a: TensorLike, b: TensorLike, name: str = "equal") -> Tensor:
    """Elementwise ``a == b`` as a bool tensor (not differentiable)."""
    return apply("Equal", binary_inputs(a, b, "Equal"), name=name)


def less(a: TensorLike, b: TensorLike, name: str = "less") -> Tensor:
    return apply("Less", binary_inputs(a, b, "Less"), name=name)


def greater_equal(a: TensorLike, b: TensorLike, name: str = "greater_equal") -> Tensor:
    return apply("GreaterEqual", binary_inputs(a, b, "GreaterEqual"), name=name)


def less_equal(a: TensorLike, b: TensorLike, name: str = "less_equal") -> Tensor:
    a, b = binary_inputs(a, b, "GreaterEqual")
    return apply("GreaterEqual", [b, a], name=name)


# ------------------------------------------------------------------- Cast
def _infer_cast(ctx: InferContext) -> TensorSpec:
    return TensorSpec(ctx.inputs[0].shape, ctx.attrs["dtype"])


def _grad_cast(node: Node, dys: Dys) -> list[Tensor | None]:
    src, dst = node.inputs[0].dtype, node.attrs["dtype"]
    if dys[0] is None or not (is_float(src) and is_float(dst)):
        return [None]  # a cast to or from an integer has no gradient: the truth
    return [cast(dys[0], src)]


def _cast_kernel(node: Node, ctx: Any) -> Any:
    dtype = np.dtype(node.attrs["dtype"])

    def cast_kernel(x: np.ndarray) -> np.ndarray:
        # Past a narrow float's range the cast is inf, as IEEE 754 defines it: not worth a warning.
        with np.errstate(over="ignore"):
            return x.astype(dtype)

    return cast_kernel


register_op(OpDef(
    name="Cast", family=FAMILY, infer=_infer_cast,
    reference=lambda attrs, x: x.astype(attrs["dtype"]),
    grad=_grad_cast, kernels={"cpu": _cast_kernel, "cuda": cuda_kernel("elementwise", "cast_op")},
))  # fmt: skip


def cast(x: TensorLike, dtype: str, name: str = "cast") -> Tensor:
    return apply("Cast", [x], {"dtype": as_dtype(dtype)}, name=name)


# ----------------------------------------------------------------- MatMul
def _infer_matmul(ctx: InferContext) -> TensorSpec:
    a, b = ctx.inputs
    if a.dtype != b.dtype:
        raise ctx.dtype_error(f"operands have different dtypes: {a.dtype} and {b.dtype}")
    if a.rank != 2 or b.rank != 2:
        raise ctx.shape_error(f"expects two matrices, got {fmt(a.shape)} @ {fmt(b.shape)}")
    m, k1 = a.shape[::-1] if ctx.attrs["transpose_a"] else a.shape
    k2, n = b.shape[::-1] if ctx.attrs["transpose_b"] else b.shape
    if k1 is not None and k2 is not None and k1 != k2:
        raise ctx.shape_error(f"inner dimensions differ: {fmt(a.shape)} @ {fmt(b.shape)}")
    return TensorSpec((m, n), a.dtype)


def _ref_matmul(attrs: dict[str, Any], a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a.T if attrs["transpose_a"] else a) @ (b.T if attrs["transpose_b"] else b)


def _grad_matmul(node: Node, dys: Dys) -> list[Tensor | None]:
    g, (a, b) = dys[0], node.inputs
    assert g is not None
    ta, tb = node.attrs["transpose_a"], node.attrs["transpose_b"]
    da = matmul(b, g, transpose_a=tb, transpose_b=True) if ta else matmul(g, b, transpose_b=not tb)
    db = matmul(g, a, transpose_a=True, transpose_b=ta) if tb else matmul(a, g, transpose_a=not ta)
    return [da, db]


register_op(OpDef(
    name="MatMul", family=FAMILY, infer=_infer_matmul, reference=_ref_matmul, grad=_grad_matmul,
    kernels={
        "cpu": lambda node, ctx: matmul_kernel(node.attrs["transpose_a"], node.attrs["transpose_b"]),
        "cuda": cuda_kernel("matmul", "matmul_op"),
    },
))  # fmt: skip


def matmul(
    a: TensorLike, b: TensorLike, transpose_a: bool = False, transpose_b: bool = False, name: str = "matmul"
) -> Tensor:
    """Matrix product, optionally transposing either operand; an operand of rank 3 or more
    makes it a batched product over its leading dims (``batch_matmul.py``)."""
    a, b = binary_inputs(a, b, "MatMul")
    if len(a.shape) > 2 or len(b.shape) > 2:
        from .batch_matmul import batch_matmul

        return batch_matmul(a, b, transpose_a, transpose_b, name=name)
    return apply("MatMul", [a, b], {"transpose_a": transpose_a, "transpose_b": transpose_b}, name=name)


# ------------------------------------------------------------- reductions
def _reduced_shape(ctx: InferContext) -> tuple[int | None, ...]:
    x = ctx.inputs[0]
    axes = ctx.attrs["axes"]
    if any(not 0 <= a < x.rank for a in axes):
        raise ctx.shape_error(f"axis {ctx.attrs['axis']} is out of range for shape {fmt(x.shape)}")
    if ctx.attrs["keepdims"]:
        return tuple(1 if i in axes else d for i, d in enumerate(x.shape))
    return tuple(d for i, d in enumerate(x.shape) if i not in axes)


def _infer_reduce(ctx: InferContext) -> TensorSpec:
    return TensorSpec(_reduced_shape(ctx), ctx.inputs[0].dtype)


def _infer_reduce_sum(ctx: InferContext) -> TensorSpec:
    # A bool sum would be a bool (any), not a count: reduce_sum([True] * 4) gave True, where NumPy and PyTorch
    # count 4. TensorFlow refuses bool too.
    if ctx.inputs[0].dtype == "bool":
        raise ctx.dtype_error("expects a float or int tensor, got bool; count with reduce_sum(cast(x, 'int32'))")
    return _infer_reduce(ctx)


def _infer_reduce_float(ctx: InferContext) -> TensorSpec:
    if not is_float(ctx.inputs[0].dtype):
        raise ctx.dtype_error(f"expects a float tensor, got {ctx.inputs[0].dtype}")
    return _infer_reduce(ctx)


def _grad_reduce_sum(node: Node, dys: Dys) -> list[Tensor | None]:
    return [broadcast_like(dys[0], node.inputs[0], node.attrs["axes"], node.attrs["keepdims"])]


def _grad_reduce_mean(node: Node, dys: Dys) -> list[Tensor | None]:
    return [broadcast_like(dys[0], node.inputs[0], node.attrs["axes"], node.attrs["keepdims"], mean=True)]


def _grad_reduce_max(node: Node, dys: Dys) -> list[Tensor | None]:
    x, axes, keep = node.inputs[0], node.attrs["axes"], node.attrs["keepdims"]
    # Ties share the gradient equally, as TensorFlow does.
    hit = cast(equal(x, broadcast_like(node.output(0), x, axes, keep)), x.dtype)
    count = broadcast_like(reduce_sum(hit, axes, keepdims=keep), x, axes, keep)
    return [broadcast_like(dys[0], x, axes, keep) * hit / count]


def _reduce_kernel(kind: str) -> Any:
    return lambda node, ctx: reducer(kind, node.attrs["axes"], node.attrs["keepdims"])


# Over an empty axis the references give what the kernels give, as TensorFlow and
# ONNX define it (kernels/cpu/reduce.py holds the definitions): sum 0, mean NaN
# (NumPy's 0 / 0), max the identity of max (-inf, the int's min, False) where
# np.max raises. The other reductions (min, prod, argmax, ...) are in reductions.py.
def _ref_reduce_mean(a: dict[str, Any], x: np.ndarray) -> np.ndarray:
    total = np.sum(x, axis=a["axes"], keepdims=a["keepdims"])
    count = prod(x.shape[i] for i in a["axes"])
    return np.asarray(total / count if count else np.full_like(total, empty_value("mean", x.dtype)), x.dtype)


_REDUCE: list[tuple[Any, ...]] = [
    ("ReduceSum",  "sum",    _infer_reduce_sum,   lambda a, x: np.sum(x, axis=a["axes"], keepdims=a["keepdims"]), _grad_reduce_sum),
    ("ReduceMean", "mean",   _infer_reduce_float, _ref_reduce_mean,                                               _grad_reduce_mean),
    ("ReduceMax",  "max",    _infer_reduce,       lambda a, x: np.max(x, axis=a["axes"], keepdims=a["keepdims"], initial=lowest(x.dtype)), _grad_reduce_max),
]  # fmt: skip
for _name, _kind, _infer, _ref, _grad in _REDUCE:
    register_op(OpDef(
        name=_name, family=FAMILY, infer=_infer, reference=_ref, grad=_grad,
        kernels={"cpu": _reduce_kernel(_kind), "cuda": cuda_kernel("reduce", "reduce_op", _kind)},
    ))  # fmt: skip


def _reduce(op: str, x: TensorLike, axis: int | Sequence[int] | None, keepdims: bool, name: str) -> Tensor:
    from .base import as_tensor

    t = as_tensor(x)
    axes = normalize_axes(axis, len(t.shape))
    # An out-of-range axis is reported by the shape rule, with the node's name.
    attrs = {"axis": axis, "axes": axes if axes is not None else (-1,), "keepdims": keepdims}
    return apply(op, [t], attrs, name=name)


def reduce_sum(
    x: TensorLike, axis: int | Sequence[int] | None = None, keepdims: bool = False, name: str = "reduce_sum"
) -> Tensor:
    """Sum over ``axis`` (all axes when None), in ``x``'s dtype.

    An integer sum wraps round in that dtype, as TensorFlow's does (int32 counts past 2**31 - 1 turn
    negative); NumPy and torch sum int32 into int64: cast first for a large count.
    """
    return _reduce("ReduceSum", x, axis, keepdims, name)


def reduce_mean(
    x: TensorLike, axis: int | Sequence[int] | None = None, keepdims: bool = False, name: str = "reduce_mean"
) -> Tensor:
    """Mean over ``axis`` (all axes when None)."""
    return _reduce("ReduceMean", x, axis, keepdims, name)


def reduce_max(
    x: TensorLike, axis: int | Sequence[int] | None = None, keepdims: bool = False, name: str = "reduce_max"
) -> Tensor:
    return _reduce("ReduceMax", x, axis, keepdims, name)


# ------------------------------------------ autodiff plumbing (internal ops)
def _infer_broadcast_like(ctx: InferContext) -> TensorSpec:
    return TensorSpec(ctx.inputs[1].shape, ctx.inputs[0].dtype)


def _broadcast_like_kernel(node: Any, ctx: Any) -> Any:
    axes, keepdims, mean = node.attrs["axes"], node.attrs["keepdims"], node.attrs["mean"]

    def run(g: np.ndarray, like: np.ndarray) -> np.ndarray:
        if not keepdims and axes:
            g = g.reshape(tuple(1 if i in axes else d for i, d in enumerate(like.shape)))
        out = np.broadcast_to(g, like.shape)
        if mean:
            count = builtins.max(prod([like.shape[a] for a in axes]), 1)
            return out / np.asarray(count, out.dtype)
        return np.array(out)  # a fresh C-ordered buffer; keeps rank 0 as rank 0

    return run


def _ref_broadcast_like(attrs: dict[str, Any], g: np.ndarray, like: np.ndarray) -> np.ndarray:
    return _broadcast_like_kernel(type("N", (), {"attrs": attrs})(), None)(g, like)


def _grad_broadcast_like(node: Node, dys: Dys) -> list[Tensor | None]:
    g, (x, like) = dys[0], node.inputs
    assert g is not None
    axes, keepdims = node.attrs["axes"], node.attrs["keepdims"]
    if node.attrs["mean"]:
        # Scale each element as the forward pass did, by 1 / max(count, 1):
        # a count taken as size(like) / size(x) is 0 / 0 for an empty batch.
        g = g * broadcast_like(ones_like(x), like, axes, keepdims, mean=True)
    return [sum_to_shape_of(reduce_sum(g, axes, keepdims=keepdims), x), None]


register_op(OpDef(
    name="BroadcastLike", family=FAMILY, infer=_infer_broadcast_like, reference=_ref_broadcast_like,
    grad=_grad_broadcast_like,
    kernels={"cpu": _broadcast_like_kernel, "cuda": cuda_kernel("elementwise", "broadcast_like_op")},
))  # fmt: skip


def broadcast_like(
    g: Tensor | None, like: Tensor, axes: Sequence[int] = (), keepdims: bool = True, mean: bool = False
) -> Tensor:
    """``g`` (reduced over ``axes``) broadcast back to ``like``'s run-time shape."""
    assert g is not None
    attrs = {"axes": tuple(axes), "keepdims": keepdims, "mean": mean}
    return apply("BroadcastLike", [g, like], attrs, name="broadcast_like")


def _broadcast_axes(g: np.ndarray, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The axes of ``g`` NumPy broadcasting added to reach it from ``shape``."""
    lead = g.ndim - len(shape)
    return tuple(range(lead)) + tuple(i + lead for i, d in enumerate(shape) if d == 1 and g.shape[i + lead] != 1)


def _sum_to_shape(g: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Sum ``g`` over the axes NumPy broadcasting added to reach it from ``shape`` (the reference: NumPy, float64)."""
    axes = _broadcast_axes(g, shape)
    if not axes:
        return g.reshape(shape)
    # np.sum down to rank 0 gives a NumPy scalar: kernels downstream need an array.
    return np.asarray(np.sum(g, axis=axes, dtype=np.float64 if g.dtype == np.float32 else None), g.dtype).reshape(shape)


def _sum_to_shape_kernel(node: Any, ctx: Any) -> Any:
    # The sum reduction's kernel: float32 in a float64 accumulator. np.sum over a leading axis adds row after row in
    # float32: a bias's gradient over 400000 rows (x + b) was 1e-5 off.
    def run(g: np.ndarray, like: np.ndarray) -> np.ndarray:
        axes = _broadcast_axes(g, like.shape)
        return reducer("sum", axes, False)(g).reshape(like.shape) if axes else g.reshape(like.shape)

    return run


register_op(OpDef(
    name="SumToShapeOf", family=FAMILY,
    infer=lambda ctx: TensorSpec(ctx.inputs[1].shape, ctx.inputs[0].dtype),
    reference=lambda attrs, g, like: _sum_to_shape(g, like.shape),
    grad=lambda node, dys: [broadcast_like(dys[0], node.inputs[0]), None],
    kernels={"cpu": _sum_to_shape_kernel, "cuda": cuda_kernel("reduce", "sum_to_shape_op")}, view=True,
))  # fmt: skip


def sum_to_shape_of(g: Tensor, like: Tensor) -> Tensor:
    """Undo broadcasting: sum ``g`` down to ``like``'s run-time shape."""
    return apply("SumToShapeOf", [g, like], name="sum_to_shape")


_FILL: list[tuple[Any, ...]] = [("OnesLike", np.ones_like, 1), ("ZerosLike", np.zeros_like, 0)]
for _name, _fill, _value in _FILL:
    register_op(OpDef(
        name=_name, family=FAMILY, infer=infer_same,
        reference=lambda attrs, x, _f=_fill: _f(x),
        grad=not_differentiable,
        kernels={"cpu": simple_kernel(_fill), "cuda": cuda_kernel("elementwise", "fill_op", _value)},
    ))  # fmt: skip


def ones_like(x: TensorLike, name: str = "ones_like") -> Tensor:
    return apply("OnesLike", [x], name=name)


def zeros_like(x: TensorLike, name: str = "zeros_like") -> Tensor:
    return apply("ZerosLike", [x], name=name)


__all__ = [
    "add", "cast", "div", "equal", "exp", "greater_equal", "less", "less_equal", "log", "matmul",
    "maximum", "minimum", "mul", "neg", "ones_like", "pow", "reduce_max", "reduce_mean", "reduce_sum",
    "sqrt", "square", "sub", "zeros_like",
]  # fmt: skip
