"""More reductions and search: min, prod, logsumexp, any, all, argmax, argmin, moments.

``math.py`` holds the reductions every model needs (sum, mean, max); this file
holds the rest of what ``tf.math`` offers, with the same columns: shape rule,
NumPy reference, gradient (or ``not_differentiable``), CPU and CUDA kernels
(``kernels/cpu/reduce.py`` and ``kernels/cuda/reduce.py``, one kernel family
for every reduction). Over an empty set each gives its identity, as
TensorFlow and ONNX define it (min +inf, prod 1, logsumexp -inf, any False,
all True); argmax and argmin have no index to give and fail the run.

``reduce_logsumexp`` is stable (the maximum is taken out before ``exp``).
ArgMax and ArgMin nodes give int32 positions, as the kernels do;
``output_type="int64"`` and ``keepdims`` are a Cast and an ExpandDims after
them, so one index kernel serves every variant. ``moments`` is the mean and
the (biased) variance, ``tf.nn.moments``.

>>> import cellgraph as cg
>>> import numpy as np
>>> x = cg.constant(np.array([[1.0, 5.0, 3.0], [4.0, 2.0, 6.0]], np.float32))
>>> sess = cg.Session()
>>> sess.run([cg.reduce_min(x, axis=1), cg.reduce_prod(x, axis=0)])
[array([1., 2.], dtype=float32), array([ 4., 10., 18.], dtype=float32)]
>>> sess.run(cg.argmin(x, axis=1, keepdims=True, output_type="int64"))
array([[0],
       [1]])
>>> big = cg.constant(np.array([1000.0, 1000.0], np.float32))
>>> float(sess.run(cg.reduce_logsumexp(big)))  # exp(1000) would overflow
1000.693...
>>> mean, variance = cg.moments(x, axes=0)
>>> sess.run([mean, variance])
[array([2.5, 3.5, 4.5], dtype=float32), array([2.25, 2.25, 2.25], dtype=float32)]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..dtypes import FLOATS, INTS, is_float
from ..errors import DTypeError
from ..graph import Node, Tensor
from ..kernels.cpu.reduce import empty_index, highest, reducer
from ..kernels.cuda import cuda_kernel
from ..opdef import InferContext, OpDef, TensorSpec, not_differentiable, register_op
from .array import expand_dims, squeeze
from .base import TensorLike, as_tensor
from .math import (
    _grad_reduce_max,
    _reduce,
    _reduced_shape,
    broadcast_like,
    cast,
    equal,
    exp,
    ones_like,
    reduce_mean,
    reduce_sum,
    square,
    zeros_like,
)
from .math_unary import stop_gradient, where

FAMILY = "math"
Dys = list[Tensor | None]
INDEX_TYPES = ("int32", "int64")


# ------------------------------------------------------------ shape rules
def _infer_numeric(ctx: InferContext) -> TensorSpec:
    x = ctx.inputs[0]
    if x.dtype not in FLOATS | INTS:
        raise ctx.dtype_error(f"expects a float or int tensor, got {x.dtype}")
    return TensorSpec(_reduced_shape(ctx), x.dtype)


def _infer_ordered(ctx: InferContext) -> TensorSpec:
    """Min: any dtype with an order (bool too, as ReduceMax)."""
    return TensorSpec(_reduced_shape(ctx), ctx.inputs[0].dtype)


def _infer_float(ctx: InferContext) -> TensorSpec:
    if not is_float(ctx.inputs[0].dtype):
        raise ctx.dtype_error(f"expects a float tensor, got {ctx.inputs[0].dtype}")
    return TensorSpec(_reduced_shape(ctx), ctx.inputs[0].dtype)


def _infer_bool(ctx: InferContext) -> TensorSpec:
    if ctx.inputs[0].dtype != "bool":
        raise ctx.dtype_error(f"expects a bool tensor, got {ctx.inputs[0].dtype}")
    return TensorSpec(_reduced_shape(ctx), "bool")


def _infer_index(ctx: InferContext) -> TensorSpec:
    if ctx.inputs[0].dtype not in FLOATS | INTS:
        raise ctx.dtype_error(f"expects a float or int tensor, got {ctx.inputs[0].dtype}")
    return TensorSpec(_reduced_shape(ctx), "int32")


# ------------------------------------------------------------- references
def _axes(a: dict[str, Any]) -> tuple[int, ...]:
    return tuple(a["axes"])


def _ref_min(a: dict[str, Any], x: np.ndarray) -> np.ndarray:
    return np.asarray(np.min(x, axis=_axes(a), keepdims=a["keepdims"], initial=highest(x.dtype)))


def _ref_prod(a: dict[str, Any], x: np.ndarray) -> np.ndarray:
    return np.asarray(np.prod(x, axis=_axes(a), keepdims=a["keepdims"]), x.dtype)


def _ref_logsumexp(a: dict[str, Any], x: np.ndarray) -> np.ndarray:
    axes, keep = _axes(a), a["keepdims"]
    top = np.max(x, axis=axes, keepdims=True, initial=-np.inf)
    shift = np.where(np.isfinite(top), top, 0).astype(x.dtype)
    with np.errstate(divide="ignore"):  # log(0) = -inf: an empty set, or all -inf
        out = np.log(np.sum(np.exp(x - shift), axis=axes, keepdims=True)) + shift
    return np.asarray(out if keep else np.squeeze(out, axis=axes), x.dtype)


def _ref_any(a: dict[str, Any], x: np.ndarray) -> np.ndarray:
    return np.asarray(np.any(x, axis=_axes(a), keepdims=a["keepdims"]))


def _ref_all(a: dict[str, Any], x: np.ndarray) -> np.ndarray:
    return np.asarray(np.all(x, axis=_axes(a), keepdims=a["keepdims"]))


def _ref_index(kind: str) -> Any:
    pick = np.argmax if kind == "argmax" else np.argmin

    def ref(a: dict[str, Any], x: np.ndarray) -> np.ndarray:
        if x.shape[a["axes"][0]] == 0:
            raise empty_index(kind, x.shape, a["axes"])
        return np.asarray(pick(x, axis=a["axes"][0]), np.int32)

    return ref


# ---------------------------------------------------------------- gradients
def _grad_prod(node: Node, dys: Dys) -> list[Tensor | None]:
    """d prod / d x_i is the product of the others, without dividing by a zero x_i:
    at a nonzero x_i it is prod / x_i (0 when the set holds a zero); at the one zero
    of a set, the product of the rest; at one of several zeros, 0 (PyTorch's rule).

    Each 0 is written so that its own gradient (the second derivative) is right, as
    PyTorch's is: prod / x_i with the product itself, which moves with a zero's value,
    and at one of two zeros the other zero times the rest. Constant zeros gave 0 there."""
    x, axes, keep = node.inputs[0], node.attrs["axes"], node.attrs["keepdims"]
    is_zero = equal(x, zeros_like(x))
    safe = where(is_zero, ones_like(x), x)
    zeros = broadcast_like(reduce_sum(cast(is_zero, x.dtype), axes, keepdims=True), x, axes)
    rest = broadcast_like(reduce_prod(safe, axes, keepdims=True), x, axes)
    # At one of two zeros the product of the others is the other zero times the rest: 0, but moving with it.
    other_zero = broadcast_like(reduce_sum(where(is_zero, x, zeros_like(x)), axes, keepdims=True), x, axes) - x
    at_a_zero = where(equal(zeros, 1.0), rest, where(equal(zeros, 2.0), rest * other_zero, zeros_like(x)))
    local = where(is_zero, at_a_zero, broadcast_like(node.output(0), x, axes, keep) / safe)
    return [broadcast_like(dys[0], x, axes, keep) * local]


def _grad_logsumexp(node: Node, dys: Dys) -> list[Tensor | None]:
    x, axes, keep = node.inputs[0], node.attrs["axes"], node.attrs["keepdims"]
    softmax = exp(x - broadcast_like(node.output(0), x, axes, keep))
    return [broadcast_like(dys[0], x, axes, keep) * softmax]


def _reduce_kernel(kind: str) -> Any:
    return lambda node, ctx: reducer(kind, node.attrs["axes"], node.attrs["keepdims"])


# name, kernel kind, shape rule, reference, gradient
_REDUCE: list[tuple[Any, ...]] = [
    ("ReduceMin",       "min",       _infer_ordered, _ref_min,             _grad_reduce_max),
    ("ReduceProd",      "prod",      _infer_numeric, _ref_prod,            _grad_prod),
    ("ReduceLogSumExp", "logsumexp", _infer_float,   _ref_logsumexp,       _grad_logsumexp),
    # any and all are max and min over bool: the same kernels, False < True.
    ("ReduceAny",       "max",       _infer_bool,    _ref_any,             not_differentiable),
    ("ReduceAll",       "min",       _infer_bool,    _ref_all,             not_differentiable),
    ("ArgMax",          "argmax",    _infer_index,   _ref_index("argmax"), not_differentiable),
    ("ArgMin",          "argmin",    _infer_index,   _ref_index("argmin"), not_differentiable),
]  # fmt: skip
for _name, _kind, _infer, _ref, _grad in _REDUCE:
    register_op(OpDef(
        name=_name, family=FAMILY, infer=_infer, reference=_ref, grad=_grad,
        kernels={"cpu": _reduce_kernel(_kind), "cuda": cuda_kernel("reduce", "reduce_op", _kind)},
    ))  # fmt: skip

Axis = int | Sequence[int] | None


def reduce_min(x: TensorLike, axis: Axis = None, keepdims: bool = False, name: str = "reduce_min") -> Tensor:
    """Minimum over ``axis`` (all axes when None); +inf (the dtype's largest) over an empty set."""
    return _reduce("ReduceMin", x, axis, keepdims, name)


def reduce_prod(x: TensorLike, axis: Axis = None, keepdims: bool = False, name: str = "reduce_prod") -> Tensor:
    """Product over ``axis`` (all axes when None); 1 over an empty set."""
    return _reduce("ReduceProd", x, axis, keepdims, name)


def reduce_logsumexp(
    x: TensorLike, axis: Axis = None, keepdims: bool = False, name: str = "reduce_logsumexp"
) -> Tensor:
    """``log(sum(exp(x)))`` over ``axis``, computed without overflow; -inf over an empty set."""
    return _reduce("ReduceLogSumExp", x, axis, keepdims, name)


def reduce_any(x: TensorLike, axis: Axis = None, keepdims: bool = False, name: str = "reduce_any") -> Tensor:
    """Logical or of a bool tensor over ``axis``; False over an empty set."""
    return _reduce("ReduceAny", x, axis, keepdims, name)


def reduce_all(x: TensorLike, axis: Axis = None, keepdims: bool = False, name: str = "reduce_all") -> Tensor:
    """Logical and of a bool tensor over ``axis``; True over an empty set."""
    return _reduce("ReduceAll", x, axis, keepdims, name)


def _index(op: str, x: TensorLike, axis: int, keepdims: bool, output_type: str, name: str) -> Tensor:
    if output_type not in INDEX_TYPES:
        raise ValueError(f"{name}: output_type must be 'int32' or 'int64', got {output_type!r}")
    if not isinstance(axis, (int, np.integer)) or isinstance(axis, bool):
        raise TypeError(f"{name}: axis must be one int, got {axis!r}")
    t = as_tensor(x)
    out = _reduce(op, t, int(axis), False, name)
    if output_type != "int32":
        out = cast(out, output_type, name=f"{name}_{output_type}")
    if keepdims:
        out = expand_dims(out, int(axis) % len(t.shape), name=f"{name}_keepdims")
    return out


def argmax(
    x: TensorLike, axis: int = -1, keepdims: bool = False, output_type: str = "int32", name: str = "argmax"
) -> Tensor:
    """Index of the largest value along ``axis`` (the first among ties), as ``output_type`` (int32 or int64)."""
    return _index("ArgMax", x, axis, keepdims, output_type, name)


def argmin(
    x: TensorLike, axis: int = -1, keepdims: bool = False, output_type: str = "int32", name: str = "argmin"
) -> Tensor:
    """Index of the smallest value along ``axis`` (the first among ties), as ``output_type`` (int32 or int64)."""
    return _index("ArgMin", x, axis, keepdims, output_type, name)


def moments(x: TensorLike, axes: Axis, keepdims: bool = False, name: str = "moments") -> tuple[Tensor, Tensor]:
    """Mean and (biased) variance of ``x`` over ``axes``, as ``tf.nn.moments``.

    The variance is taken around the mean with its gradient stopped: the
    variance's derivative with respect to the mean is 0, so nothing is lost,
    and the backward pass does not walk the mean twice.
    """
    t = as_tensor(x)
    if not is_float(t.dtype):
        # ReduceMean's shape rule would say it too, but of an inner node.
        raise DTypeError(f"{name}: expects a float tensor, got {t.dtype}")
    mean = reduce_mean(t, axes, keepdims=True, name=f"{name}_mean")
    variance = reduce_mean(square(t - stop_gradient(mean)), axes, keepdims=keepdims, name=f"{name}_variance")
    if not keepdims:
        reduced = mean.node.attrs["axes"]
        mean = squeeze(mean, reduced, name=f"{name}_mean_squeezed") if reduced else mean
    return mean, variance


__all__ = [
    "argmax", "argmin", "moments", "reduce_all", "reduce_any", "reduce_logsumexp", "reduce_min", "reduce_prod",
]  # fmt: skip
