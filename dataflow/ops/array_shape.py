"""Shapes as tensors, and ranges: shape, size and range (TensorFlow's).

Shape and Size give a tensor's run-time dims as an int tensor (the static
shape may hold ``None``); Range counts from ``start`` towards ``limit`` by
``delta``, each of which may be a tensor, so its length is known when
building only if all three are constants. None of them is differentiable: an
integer shape has no gradient, and Range's values do not depend smoothly on
where it stops.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..dtypes import FLOATS, INTS, as_dtype
from ..errors import DTypeError
from ..graph import Tensor
from ..kernels.cpu import array_shape as k
from ..kernels.cuda import cuda_kernel
from ..opdef import InferContext, OpDef, TensorSpec, not_differentiable, register_op
from .base import TensorLike, apply, as_tensor, graph_of

FAMILY = "array"


def _out_type(value: str, op: str) -> str:
    dtype = as_dtype(value)
    if dtype not in INTS:
        raise DTypeError(f"{op}: out_type must be int32 or int64, got {dtype}")
    return dtype


register_op(OpDef(
    name="Shape", strings=True, family=FAMILY,
    infer=lambda ctx: TensorSpec((ctx.inputs[0].rank,), ctx.attrs["out_type"]),
    reference=lambda attrs, x: np.array(x.shape, attrs["out_type"]),
    grad=not_differentiable,  # integer dims
    kernels={"cpu": lambda node, ctx: k.shape(node.attrs["out_type"]), "cuda": cuda_kernel("array_shape", "shape_op")},
))  # fmt: skip
register_op(OpDef(
    name="Size", strings=True, family=FAMILY,
    infer=lambda ctx: TensorSpec((), ctx.attrs["out_type"]),
    reference=lambda attrs, x: np.array(x.size, attrs["out_type"]),
    grad=not_differentiable,  # an integer count
    kernels={"cpu": lambda node, ctx: k.size(node.attrs["out_type"]), "cuda": cuda_kernel("array_shape", "size_op")},
))  # fmt: skip


def shape(x: TensorLike, out_type: str = "int32", name: str = "shape") -> Tensor:
    """The dims of ``x`` when the graph runs, as a 1-D int tensor (``tf.shape``)."""
    return apply("Shape", [x], {"out_type": _out_type(out_type, "shape")}, name=name)


def size(x: TensorLike, out_type: str = "int32", name: str = "size") -> Tensor:
    """The number of elements of ``x`` when the graph runs, as an int scalar (``tf.size``)."""
    return apply("Size", [x], {"out_type": _out_type(out_type, "size")}, name=name)


# ------------------------------------------------------------------ Range
def _infer_range(ctx: InferContext) -> TensorSpec:
    dtypes = [spec.dtype for spec in ctx.inputs]
    if any(d != dtypes[0] for d in dtypes):
        raise ctx.dtype_error(f"start, limit and delta have different dtypes: {', '.join(dtypes)}")
    if dtypes[0] not in INTS | FLOATS:
        raise ctx.dtype_error(f"start, limit and delta must be ints or floats, got {dtypes[0]}")
    for what, spec in zip(("start", "limit", "delta"), ctx.inputs):
        if spec.shape != ():
            raise ctx.shape_error(f"{what} must be a scalar, got shape {spec.shape}")
    # Constants give the length now (a bad range is then a build-time error).
    values = [t.node.attrs["value"].item() for t in ctx.node.inputs if t.node.op == "Const"]
    if len(values) == 3:
        try:
            return TensorSpec((k.range_length(*values),), dtypes[0])
        except ValueError as err:
            raise ctx.shape_error(str(err)) from None
    return TensorSpec((None,), dtypes[0])


register_op(OpDef(
    name="Range", family=FAMILY, infer=_infer_range,
    reference=lambda attrs, start, limit, delta: np.arange(start.item(), limit.item(), delta.item(), dtype=start.dtype),
    grad=not_differentiable,  # a piecewise-constant count of steps
    kernels={"cpu": lambda node, ctx: k.range_, "cuda": cuda_kernel("array_shape", "range_op")},
))  # fmt: skip


def range(  # noqa: A001 - TensorFlow's name
    start: TensorLike,
    limit: TensorLike | None = None,
    delta: TensorLike = 1,
    dtype: str | None = None,
    name: str = "range",
) -> Tensor:
    """``start, start + delta, ...`` up to but not including ``limit`` (``tf.range``);
    ``range(n)`` counts from 0. The dtype is ``dtype``, else a tensor argument's, else
    float32 if any argument is a Python float, else int32.

    Examples
    --------
    >>> import cellgraph as cg
    >>> g = cg.Graph()
    >>> with g.as_default():
    ...     r = cg.range(2, 11, 3)
    >>> r.shape, r.dtype
    ((3,), 'int32')
    """
    if limit is None:
        start, limit = 0, start
    args: list[Any] = [start, limit, delta]
    if dtype is None:
        tensors = [a for a in args if isinstance(a, Tensor)]
        floats = any(np.asarray(a).dtype.kind == "f" for a in args if not isinstance(a, Tensor))
        dtype = tensors[0].dtype if tensors else "float32" if floats else "int32"
    g = graph_of(args)
    # Tensors keep their dtype, so that a mismatch is reported by the shape rule, naming all three.
    operands = [a if isinstance(a, Tensor) else as_tensor(a, as_dtype(dtype), g, "range") for a in args]
    return apply("Range", operands, name=name)


__all__ = ["range", "shape", "size"]
