"""N-dimensional indexing: gather_nd and scatter_nd (TensorFlow's semantics).

``indices`` has shape ``(..., k)``: each of its rows holds the coordinates of
one slice along the first ``k`` dims of ``params`` (GatherNd reads it) or of
the output (ScatterNd adds into it; repeated rows sum, as TensorFlow's do).
The two are each other's adjoints, so each one's gradient is the other;
GatherNd's scatters into zeros shaped like ``params`` at run time
(ScatterNdLike, internal), since ``params`` may have unknown dims.

``cg.gather`` with ``batch_dims`` is BatchGather here (and its gradient
BatchGatherGrad): each batch of ``params`` gathered at its own batch of indices.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from math import prod
from typing import Any

import numpy as np

from ..dtypes import INTS
from ..errors import GradientError, GraphError, ShapeError
from ..graph import Node, Tensor
from ..kernels.cpu import array_index as k
from ..kernels.cuda import cuda_kernel
from ..opdef import InferContext, OpDef, Shape, TensorSpec, register_op
from ..shapes import fmt
from .base import TensorLike, apply, as_tensor, fits, graph_of, rule_checked, upstream

FAMILY = "array"
Dys = list[Tensor | None]
Attrs = dict[str, Any]


def _check_index_dtype(ctx: InferContext, indices: TensorSpec) -> None:
    if indices.dtype not in INTS:
        raise ctx.dtype_error(f"indices must be int32 or int64, got {indices.dtype}")


def _check_updates(ctx: InferContext, updates: TensorSpec, indices: TensorSpec, into: Shape, expected: Shape) -> None:
    """A ShapeError unless ``updates`` fit the ``expected`` shape of what ``indices`` address in ``into``."""
    if not fits(updates.shape, expected):
        raise ctx.shape_error(
            f"updates {fmt(updates.shape)} do not fit indices {fmt(indices.shape)} into {fmt(into)}: "
            f"expected {fmt(expected)}"
        )


def _check_indices(ctx: InferContext, indices: TensorSpec, target: Shape, what: str) -> int:
    """The depth ``k`` of ``indices`` (its last dim) into ``target``, or a ShapeError/DTypeError."""
    _check_index_dtype(ctx, indices)
    if indices.rank == 0 or indices.shape[-1] is None:
        raise ctx.shape_error(
            f"indices {fmt(indices.shape)} need a last dim of known size: the number of coordinates per row"
        )
    depth = indices.shape[-1]
    if depth > len(target):
        raise ctx.shape_error(f"indices {fmt(indices.shape)} hold {depth} coordinates, but {what} {fmt(target)} has "
                              f"{len(target)} dims")  # fmt: skip
    return depth


def _infer_gather_nd(ctx: InferContext) -> TensorSpec:
    params, indices = ctx.inputs
    depth = _check_indices(ctx, indices, params.shape, "params")
    return TensorSpec(indices.shape[:-1] + params.shape[depth:], params.dtype)


def _infer_scatter(ctx: InferContext, indices: TensorSpec, updates: TensorSpec, shape: Shape) -> TensorSpec:
    depth = _check_indices(ctx, indices, shape, "the output")
    _check_updates(ctx, updates, indices, shape, indices.shape[:-1] + shape[depth:])
    return TensorSpec(shape, updates.dtype)


def _infer_scatter_nd(ctx: InferContext) -> TensorSpec:
    indices, updates = ctx.inputs
    shape = ctx.attrs["shape"]
    if any(d < 0 for d in shape):
        raise ctx.shape_error(f"shape {shape} must be >= 0")
    return _infer_scatter(ctx, indices, updates, shape)


def _infer_scatter_nd_like(ctx: InferContext) -> TensorSpec:
    indices, updates, like = ctx.inputs
    return _infer_scatter(ctx, indices, updates, like.shape)


def _rows(indices: np.ndarray) -> np.ndarray:
    return indices.reshape(prod(indices.shape[:-1]), indices.shape[-1])  # k may be 0: count the rows


def _check_row(row: np.ndarray, shape: tuple[int, ...], what: str) -> None:
    if any(not 0 <= c < d for c, d in zip(row, shape)):
        raise IndexError(f"indices row {[int(c) for c in row]} does not index into {what} {shape}")


def _ref_gather_nd(attrs: Attrs, params: np.ndarray, indices: np.ndarray) -> np.ndarray:
    """One row at a time: the plain statement of the read (the kernel reads all rows at once)."""
    depth = indices.shape[-1]
    picked = []
    for row in _rows(indices):
        _check_row(row, params.shape, "params")
        picked.append(params[tuple(row)])
    slices = np.array(picked, params.dtype) if picked else np.zeros((0,) + params.shape[depth:], params.dtype)
    return slices.reshape(indices.shape[:-1] + params.shape[depth:])


def _fold_rows(out: np.ndarray, indices: np.ndarray, updates: np.ndarray, fold: Any, what: str) -> np.ndarray:
    """Fold each row's update into ``out`` in turn (a repeated row folds again): the plain statement
    of a scatter, one row at a time (the kernels are Numba loops)."""
    rows = _rows(indices)
    for row, update in zip(rows, updates.reshape((rows.shape[0],) + out.shape[indices.shape[-1] :])):
        _check_row(row, out.shape, what)
        out[tuple(row)] = fold(out[tuple(row)], update)
    return out


def _ref_scatter(indices: np.ndarray, updates: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Zeros of ``shape`` with the updates summed in."""
    return _fold_rows(np.zeros(shape, updates.dtype), indices, updates, np.add, "output")


register_op(OpDef(
    name="GatherNd", family=FAMILY, infer=_infer_gather_nd, reference=_ref_gather_nd,
    grad=lambda node, dys: [_scatter_nd_like(node.inputs[1], upstream(dys), node.inputs[0]), None],
    kernels={"cpu": lambda node, ctx: k.gather_nd, "cuda": cuda_kernel("array_index", "gather_nd_op")},
))  # fmt: skip
register_op(OpDef(
    name="ScatterNd", family=FAMILY, infer=_infer_scatter_nd,
    reference=lambda attrs, indices, updates: _ref_scatter(indices, updates, attrs["shape"]),
    grad=lambda node, dys: [None, gather_nd(upstream(dys), node.inputs[0])],
    kernels={"cpu": lambda node, ctx: k.scatter_nd_op(node.attrs["shape"]),
             "cuda": cuda_kernel("array_index", "scatter_nd_op")},
))  # fmt: skip
register_op(OpDef(
    name="ScatterNdLike", family=FAMILY, infer=_infer_scatter_nd_like,
    reference=lambda attrs, indices, updates, like: _ref_scatter(indices, updates, like.shape),
    grad=lambda node, dys: [None, gather_nd(upstream(dys), node.inputs[0]), None],
    kernels={"cpu": lambda node, ctx: k.scatter_nd_like, "cuda": cuda_kernel("array_index", "scatter_nd_like_op")},
))  # fmt: skip


# ---------------------------------------------- gather with batch_dims
def _check_batch(ctx: InferContext, params: Shape, indices: TensorSpec) -> tuple[int, int]:
    batch_dims, axis = ctx.attrs["batch_dims"], ctx.attrs["axis"]
    _check_index_dtype(ctx, indices)
    if not 0 <= batch_dims <= indices.rank:
        raise ctx.shape_error(f"batch_dims {batch_dims} is out of range for indices {fmt(indices.shape)}")
    if not batch_dims <= axis < len(params):
        raise ctx.shape_error(f"axis {axis} must be at least batch_dims {batch_dims} and a dim of params {fmt(params)}")
    for i in range(batch_dims):
        a, b = params[i], indices.shape[i]
        if a is not None and b is not None and a != b:
            raise ctx.shape_error(
                f"params {fmt(params)} and indices {fmt(indices.shape)} differ in batch dim {i}: {a} and {b}"
            )
    return batch_dims, axis


def _infer_batch_gather(ctx: InferContext) -> TensorSpec:
    params, indices = ctx.inputs
    batch_dims, axis = _check_batch(ctx, params.shape, indices)
    batch = tuple(a if a is not None else b for a, b in zip(params.shape[:batch_dims], indices.shape))
    return TensorSpec(
        batch + k.batch_gather_shape(params.shape, indices.shape, batch_dims, axis)[batch_dims:], params.dtype
    )


def _infer_batch_gather_grad(ctx: InferContext) -> TensorSpec:
    updates, indices, like = ctx.inputs
    batch_dims, axis = _check_batch(ctx, like.shape, indices)
    _check_updates(ctx, updates, indices, like.shape, k.batch_gather_shape(like.shape, indices.shape, batch_dims, axis))
    return TensorSpec(like.shape, updates.dtype)


def _batches(attrs: Attrs, params_shape: tuple[int, ...], indices: np.ndarray) -> Any:
    """Each batch index, after checking every index against params' axis (TensorFlow's range, no wrapping)."""
    n = params_shape[attrs["axis"]]
    bad = (indices < 0) | (indices >= n)
    if bad.any():
        raise IndexError(f"index {int(indices[bad][0])} is out of range [0, {n}) for axis {attrs['axis']}")
    return np.ndindex(*params_shape[: attrs["batch_dims"]])


def _ref_batch_gather(attrs: Attrs, params: np.ndarray, indices: np.ndarray) -> np.ndarray:
    """Batch by batch, np.take: the plain statement of TensorFlow's batch_dims."""
    batch_dims, axis = attrs["batch_dims"], attrs["axis"]
    out = np.empty(k.batch_gather_shape(params.shape, indices.shape, batch_dims, axis), params.dtype)
    for b in _batches(attrs, params.shape, indices):
        out[b] = np.take(params[b], indices[b], axis=axis - batch_dims)
    return out


def _ref_batch_gather_grad(attrs: Attrs, updates: np.ndarray, indices: np.ndarray, like: np.ndarray) -> np.ndarray:
    batch_dims, axis = attrs["batch_dims"], attrs["axis"]
    out = np.zeros(like.shape, updates.dtype)
    for b in _batches(attrs, like.shape, indices):
        index = (slice(None),) * (axis - batch_dims) + (indices[b],)
        np.add.at(out[b], index, updates[b])
    return out


def _batch_attrs(node: Any) -> tuple[int, int]:
    return node.attrs["batch_dims"], node.attrs["axis"]


register_op(OpDef(
    name="BatchGather", family=FAMILY, infer=_infer_batch_gather, reference=_ref_batch_gather,
    grad=lambda node, dys: [apply("BatchGatherGrad", [upstream(dys), node.inputs[1], node.inputs[0]], node.attrs), None],
    kernels={"cpu": lambda node, ctx: k.batch_gather(*_batch_attrs(node)),
             "cuda": cuda_kernel("array_index", "batch_gather_op")},
))  # fmt: skip
# Built by gradient rules: the rule runs again on the arrays' shapes (rule_checked), since with dims unknown when
# building, updates, indices or a like of the same size but another shape was read in another order without a word.
register_op(OpDef(
    name="BatchGatherGrad", family=FAMILY, infer=_infer_batch_gather_grad, reference=_ref_batch_gather_grad,
    grad=lambda node, dys: [apply("BatchGather", [upstream(dys), node.inputs[1]], node.attrs), None, None],
    kernels={"cpu": rule_checked(lambda node, ctx: k.batch_gather_grad(*_batch_attrs(node))),
             "cuda": rule_checked(cuda_kernel("array_index", "batch_gather_grad_op"))},
))  # fmt: skip


def batch_gather(params: Tensor, indices: Tensor, axis: int, batch_dims: int, name: str) -> Tensor:
    """``cg.gather`` with ``batch_dims`` > 0 (both already made non-negative): one gather per batch."""
    return apply("BatchGather", [params, indices], {"axis": axis, "batch_dims": batch_dims}, name=name)


# ------------------------------------------------- TensorScatterReduce
def _infer_tensor_scatter(ctx: InferContext) -> TensorSpec:
    data, indices, updates = ctx.inputs
    if updates.dtype != data.dtype:
        raise ctx.dtype_error(f"updates are {updates.dtype}, the tensor they go into is {data.dtype}")
    return _infer_scatter(ctx, indices, updates, data.shape)


_FOLD = {"max": np.maximum, "min": np.minimum, "mul": np.multiply}


def _ref_tensor_scatter(attrs: Attrs, data: np.ndarray, indices: np.ndarray, updates: np.ndarray) -> np.ndarray:
    return _fold_rows(np.array(data), indices, updates, _FOLD[attrs["reduction"]], "tensor")


def _grad_tensor_scatter(node: Node, dys: Dys) -> list[Tensor | None]:
    """A max or min's gradient goes to the values it kept, shared equally among those that tie for it: the
    tensor's own value and every update to that slice equal to the result. TensorFlow's rule for
    TensorScatterMax and TensorScatterMin (array_grad.py) and torch's scatter_reduce("amax", include_self=True).
    It was not_differentiable, and cg.gradients gave None to both (no error): nothing flowed back."""
    from .math import cast, equal, maximum  # math imports this module's neighbours: import it when a rule runs

    data, indices, updates = node.inputs
    if node.attrs["reduction"] == "mul":
        raise GradientError(
            f"tensor_scatter_reduce {node.name!r}: no gradient for reduction 'mul' (a product over repeated rows); "
            "write it with gather_nd and a product to differentiate it"
        )
    out, g = node.output(0), upstream(dys)
    data_kept = cast(equal(data, out), data.dtype)
    updates_kept = cast(equal(updates, gather_nd(out, indices)), data.dtype)
    # At least 1 where the result is a value that was there; a NaN result equals none of them.
    sharing = maximum(data_kept + _scatter_nd_like(indices, updates_kept, data), 1.0)
    share = g / sharing
    return [share * data_kept, None, gather_nd(share, indices) * updates_kept]


register_op(OpDef(
    name="TensorScatterReduce", family=FAMILY, infer=_infer_tensor_scatter, reference=_ref_tensor_scatter,
    grad=_grad_tensor_scatter,
    kernels={"cpu": lambda node, ctx: k.tensor_scatter_reduce(node.attrs["reduction"]),
             "cuda": cuda_kernel("array_index", "tensor_scatter_reduce_op")},
))  # fmt: skip


def tensor_scatter_reduce(
    tensor: TensorLike, indices: TensorLike, updates: TensorLike, reduction: str, name: str = "tensor_scatter"
) -> Tensor:
    """``tensor`` with the update of each row of ``indices`` folded in by ``reduction``
    ("max", "min" or "mul"; repeated rows fold in turn). "max" and "min" are differentiable (a tie shares the
    gradient equally, as TensorFlow's TensorScatterMax); "mul" is not."""
    if reduction not in k.REDUCTIONS:
        raise GraphError(f"tensor_scatter_reduce: reduction must be 'max', 'min' or 'mul', got {reduction!r}")
    g = graph_of([tensor, indices, updates])
    operands = [as_tensor(v, graph=g) for v in (tensor, indices, updates)]
    return apply("TensorScatterReduce", operands, {"reduction": reduction}, name=name)


def tensor_scatter_nd_max(
    tensor: TensorLike, indices: TensorLike, updates: TensorLike, name: str = "tensor_scatter_nd_max"
) -> Tensor:
    """``tensor`` with each row's slice the maximum of itself and the row's update (``tf.tensor_scatter_nd_max``)."""
    return tensor_scatter_reduce(tensor, indices, updates, "max", name)


def tensor_scatter_nd_min(
    tensor: TensorLike, indices: TensorLike, updates: TensorLike, name: str = "tensor_scatter_nd_min"
) -> Tensor:
    """``tensor`` with each row's slice the minimum of itself and the row's update (``tf.tensor_scatter_nd_min``)."""
    return tensor_scatter_reduce(tensor, indices, updates, "min", name)


def gather_nd(params: TensorLike, indices: TensorLike, name: str = "gather_nd") -> Tensor:
    """Slices of ``params`` at the coordinates in the rows of ``indices`` (``tf.gather_nd``).

    ``indices`` has shape ``(..., k)``; the result has shape
    ``indices.shape[:-1] + params.shape[k:]``. A coordinate outside [0, dim)
    fails when the graph runs, naming the row.

    Examples
    --------
    >>> import cellgraph as cg
    >>> g = cg.Graph()
    >>> with g.as_default():
    ...     x = cg.placeholder((4, 5, 3), name="x")
    ...     pairs = cg.constant([[0, 1], [3, 4]], dtype="int32")
    ...     picked = cg.gather_nd(x, pairs)
    >>> picked.shape
    (2, 3)
    """
    g = graph_of([params, indices])
    return apply("GatherNd", [as_tensor(params, graph=g), as_tensor(indices, graph=g)], name=name)


def scatter_nd(indices: TensorLike, updates: TensorLike, shape: Sequence[int], name: str = "scatter_nd") -> Tensor:
    """Zeros of ``shape`` with ``updates`` added at the rows of ``indices`` (``tf.scatter_nd``):
    repeated rows sum. ``updates`` has shape ``indices.shape[:-1] + shape[k:]``."""
    try:
        dims = tuple(operator.index(d) for d in shape)
    except TypeError:
        raise ShapeError(f"scatter_nd: shape must be a sequence of ints, got {shape!r}") from None
    g = graph_of([indices, updates])
    return apply("ScatterNd", [as_tensor(indices, graph=g), as_tensor(updates, graph=g)], {"shape": dims}, name=name)


def _scatter_nd_like(indices: Tensor, updates: Tensor, like: Tensor) -> Tensor:
    return apply("ScatterNdLike", [indices, updates, like], name="scatter_nd_like")


__all__ = ["gather_nd", "scatter_nd", "tensor_scatter_nd_max", "tensor_scatter_nd_min", "tensor_scatter_reduce"]
