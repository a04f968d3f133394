"""Cumulative sum and product along one axis: ``cumsum`` and ``cumprod`` (TensorFlow's
``exclusive`` and ``reverse`` flags), as ops of their own.

A scan is one sequential pass per line that no chain of existing ops does
without quadratic work, so each is an op with its kernels
(``kernels/cpu/cumulative.py``, ``kernels/cuda/cumulative.py``). Cumsum's
gradient is a Cumsum of the upstream gradient running the other way;
Cumprod's is the internal CumprodGrad op, which is exact at zeros (no
division by ``x``, unlike TensorFlow's rule) and has no gradient of its own
(a recorded decision: second derivatives of a product scan are not needed by
any model here).

>>> import cellgraph as cg
>>> import numpy as np
>>> x = cg.constant(np.array([1.0, 2.0, 3.0, 4.0], np.float32))
>>> cg.Session().run([cg.cumsum(x), cg.cumsum(x, exclusive=True), cg.cumprod(x, reverse=True)])
[array([ 1.,  3.,  6., 10.], dtype=float32), array([0., 1., 3., 6.], dtype=float32), array([24., 24., 12.,  4.], dtype=float32)]
"""

from __future__ import annotations

import operator
from typing import Any

import numpy as np

from ..dtypes import FLOATS, INTS
from ..errors import GradientError, ShapeError
from ..graph import Node, Tensor
from ..kernels.cpu import cumulative as k
from ..kernels.cuda import cuda_kernel
from ..opdef import InferContext, OpDef, TensorSpec, register_op
from ..shapes import fmt
from .base import TensorLike, apply, as_tensor, upstream

__all__ = ["cumprod", "cumsum"]

FAMILY = "math"
Attrs = dict[str, Any]


def _infer_scan(ctx: InferContext) -> TensorSpec:
    x, axis = ctx.inputs[0], ctx.attrs["axis"]
    if x.dtype not in FLOATS | INTS:
        raise ctx.dtype_error(f"expects a float or int tensor, got {x.dtype}")
    if not 0 <= axis < x.rank:
        raise ctx.shape_error(f"axis {axis} is out of range for {fmt(x.shape)}")
    return TensorSpec(x.shape, x.dtype)


def _infer_cumprod_grad(ctx: InferContext) -> TensorSpec:
    x, dy = ctx.inputs
    if dy.dtype != x.dtype:
        raise ctx.dtype_error(f"gradient dtype {dy.dtype} is not the input's {x.dtype}")
    if len(dy.shape) != x.rank or any(a is not None and b is not None and a != b for a, b in zip(x.shape, dy.shape)):
        raise ctx.shape_error(f"gradient shape {fmt(dy.shape)} is not the input's {fmt(x.shape)}")
    return _infer_scan(ctx)


def _ref_scan(product: bool) -> Any:
    def ref(a: Attrs, x: np.ndarray) -> np.ndarray:
        axis = a["axis"]
        if a["reverse"]:
            x = np.flip(x, axis)
        y = (np.cumprod if product else np.cumsum)(x, axis=axis, dtype=x.dtype)
        if a["exclusive"] and y.shape[axis]:
            first = np.ones_like(np.take(y, [0], axis)) if product else np.zeros_like(np.take(y, [0], axis))
            y = np.concatenate([first, np.take(y, np.arange(y.shape[axis] - 1), axis)], axis)
        return np.ascontiguousarray(np.flip(y, axis) if a["reverse"] else y)

    return ref


def _ref_cumprod_grad(a: Attrs, x: np.ndarray, dy: np.ndarray) -> np.ndarray:
    """By definition, in float64: d y_j / d x_i is the product of y_j's other factors."""
    ref = _ref_scan(True)
    out = np.zeros(x.shape, np.float64)
    for index in np.ndindex(*x.shape):
        others = x.astype(np.float64)
        others[index] = 1.0
        # y_j with x_i set to 1, for the j whose product includes x_i, else 0.
        with_one = ref(a, others)
        others[index] = 0.0
        includes = with_one - ref(a, others)
        out[index] = np.sum(includes * dy)
    return out.astype(x.dtype)


def _grad_cumsum(node: Node, dys: list[Tensor | None]) -> list[Tensor | None]:
    a = node.attrs
    return [apply("Cumsum", [upstream(dys)], {**_flags(node), "reverse": not a["reverse"]}, name="cumsum_grad")]


def _grad_cumprod(node: Node, dys: list[Tensor | None]) -> list[Tensor | None]:
    return [apply("CumprodGrad", [node.inputs[0], upstream(dys)], _flags(node), name="cumprod_grad")]


def _flags(node: Node) -> Attrs:
    """The attrs the kernels take (a gradient node also carries ``_colocate``)."""
    return {key: node.attrs[key] for key in ("axis", "exclusive", "reverse")}


register_op(OpDef(
    name="Cumsum", family=FAMILY, infer=_infer_scan, reference=_ref_scan(False), grad=_grad_cumsum,
    kernels={"cpu": lambda node, ctx: k.scan(product=False, **_flags(node)),
             "cuda": cuda_kernel("cumulative", "scan_op", False)},
))  # fmt: skip
register_op(OpDef(
    name="Cumprod", family=FAMILY, infer=_infer_scan, reference=_ref_scan(True), grad=_grad_cumprod,
    kernels={"cpu": lambda node, ctx: k.scan(product=True, **_flags(node)),
             "cuda": cuda_kernel("cumulative", "scan_op", True)},
))  # fmt: skip


def _no_second_derivative(node: Node, dys: list[Tensor | None]) -> list[Tensor | None]:
    """cumprod's gradient has no gradient here: a second derivative through a cumprod (a gradient penalty)
    is refused by name. It was not_differentiable, and cg.gradients dropped that path's share with no error."""
    raise GradientError(
        f"cumprod_grad {node.name!r}: no second derivative of cumprod (the gradient of its gradient); "
        "PyTorch's torch.cumprod has one"
    )


register_op(OpDef(
    name="CumprodGrad", family=FAMILY, infer=_infer_cumprod_grad, reference=_ref_cumprod_grad,
    grad=_no_second_derivative,
    kernels={"cpu": lambda node, ctx: k.cumprod_grad(**_flags(node)),
             "cuda": cuda_kernel("cumulative", "cumprod_grad_op")},
))  # fmt: skip


def _scan(op: str, x: TensorLike, axis: int, exclusive: bool, reverse: bool, name: str) -> Tensor:
    x = as_tensor(x)
    try:
        a = operator.index(axis)
    except TypeError:
        raise ShapeError(f"{name}: axis must be an int, got {axis!r}") from None
    rank = len(x.shape)
    if not -rank <= a < rank:
        raise ShapeError(f"{name}: axis {a} is out of range for shape {fmt(x.shape)} (rank {rank})")
    attrs = {"axis": a % rank, "exclusive": bool(exclusive), "reverse": bool(reverse)}
    return apply(op, [x], attrs, name=name)


def cumsum(
    x: TensorLike, axis: int = 0, exclusive: bool = False, reverse: bool = False, name: str = "cumsum"
) -> Tensor:
    """Running sum along ``axis``, as ``tf.math.cumsum``.

    ``exclusive`` leaves out each element itself (the first output is 0);
    ``reverse`` sums from the end of the axis towards its start.

    Examples
    --------
    >>> import cellgraph as cg
    >>> import numpy as np
    >>> x = cg.constant(np.array([[1, 2, 3], [4, 5, 6]], np.int32))
    >>> cg.Session().run(cg.cumsum(x, axis=1, exclusive=True, reverse=True))
    array([[ 5,  3,  0],
           [11,  6,  0]], dtype=int32)
    """
    return _scan("Cumsum", x, axis, exclusive, reverse, name)


def cumprod(
    x: TensorLike, axis: int = 0, exclusive: bool = False, reverse: bool = False, name: str = "cumprod"
) -> Tensor:
    """Running product along ``axis``, as ``tf.math.cumprod`` (``exclusive``: the first output is 1).

    Examples
    --------
    >>> import cellgraph as cg
    >>> import numpy as np
    >>> cg.Session().run(cg.cumprod(cg.constant(np.array([2.0, 0.0, 3.0], np.float32)), exclusive=True))
    array([1., 2., 0.], dtype=float32)
    """
    return _scan("Cumprod", x, axis, exclusive, reverse, name)
