"""Gather, its gradient ScatterAddLike, and one-hot: ops that read or write a tensor at integer indices.

A gather's gradient scatter-adds the upstream gradient back into zeros shaped,
at run time, like the gathered tensor (``ScatterAddLike``, an internal op built
only by that rule); a one-hot is a function of integer indices, so nothing
flows back through it.
"""

from __future__ import annotations

import builtins
import operator

import numpy as np

from ..dtypes import COMPUTE_DTYPE, INTS, as_dtype
from ..graph import Tensor
from ..kernels.cpu import array as k
from ..opdef import InferContext, OpDef, TensorSpec, not_differentiable, register_op
from ..shapes import fmt
from .array import FAMILY, Attrs, _axis, _cuda, _scalar
from .array_index import batch_gather
from .base import TensorLike, apply, as_tensor, fits, graph_of, rule_checked, upstream


def _check_indices(ctx: InferContext, indices: TensorSpec) -> None:
    if indices.dtype not in INTS:
        raise ctx.dtype_error(f"indices must be int32 or int64, got {indices.dtype}")


def _infer_gather(ctx: InferContext) -> TensorSpec:
    params, indices = ctx.inputs
    axis = ctx.attrs["axis"]
    _check_indices(ctx, indices)
    if not 0 <= axis < params.rank:
        raise ctx.shape_error(f"axis {axis} is out of range for params {fmt(params.shape)}")
    return TensorSpec(params.shape[:axis] + indices.shape + params.shape[axis + 1 :], params.dtype)


def _infer_scatter_add_like(ctx: InferContext) -> TensorSpec:
    updates, indices, like = ctx.inputs
    axis = ctx.attrs["axis"]
    _check_indices(ctx, indices)
    if not 0 <= axis < like.rank or not fits(updates.shape, like.shape[:axis] + indices.shape + like.shape[axis + 1 :]):
        raise ctx.shape_error(
            f"updates {fmt(updates.shape)} do not fit indices {fmt(indices.shape)} into {fmt(like.shape)} on axis {axis}"
        )
    return TensorSpec(like.shape, updates.dtype)


def _ref_scatter_add_like(attrs: Attrs, updates: np.ndarray, indices: np.ndarray, like: np.ndarray) -> np.ndarray:
    out = np.zeros(like.shape, updates.dtype)
    np.add.at(out, (builtins.slice(None),) * attrs["axis"] + (indices,), updates)
    return out


def _infer_one_hot(ctx: InferContext) -> TensorSpec:
    indices, depth = ctx.inputs[0], ctx.attrs["depth"]
    _check_indices(ctx, indices)
    if depth < 0:
        raise ctx.shape_error(f"depth must be >= 0, got {depth}")
    return TensorSpec(indices.shape + (depth,), ctx.attrs["dtype"])


def _ref_one_hot(attrs: Attrs, indices: np.ndarray) -> np.ndarray:
    hot = indices[..., None] == np.arange(attrs["depth"])
    return np.asarray(np.where(hot, attrs["on_value"], attrs["off_value"]), dtype=attrs["dtype"])


register_op(OpDef(
    name="Gather", strings=True, family=FAMILY, infer=_infer_gather,
    reference=lambda attrs, params, indices: np.take(params, indices, axis=attrs["axis"]),
    grad=lambda node, dys: [_scatter_add_like(upstream(dys), node.inputs[1], node.inputs[0], node.attrs["axis"]), None],
    kernels={"cpu": lambda node, ctx: k.gather(node.attrs["axis"]), "cuda": _cuda("gather_op")},
))  # fmt: skip
# Built by gradient rules: the rule runs again on the arrays' shapes (rule_checked), since with dims unknown when
# building, updates of the same size but another shape was read in another order without a word.
register_op(OpDef(
    name="ScatterAddLike", family=FAMILY, infer=_infer_scatter_add_like, reference=_ref_scatter_add_like,
    grad=lambda node, dys: [gather(upstream(dys), node.inputs[1], node.attrs["axis"]), None, None],
    kernels={"cpu": rule_checked(lambda node, ctx: k.scatter_add_like(node.attrs["axis"])),
             "cuda": rule_checked(_cuda("scatter_add_like_op"))},
))  # fmt: skip
register_op(OpDef(
    name="OneHot", family=FAMILY, infer=_infer_one_hot, reference=_ref_one_hot,
    grad=not_differentiable,  # a function of integer indices: nothing flows back
    kernels={
        # A half-float one-hot is filled in float32 (Numba has no bfloat16) and rounded by the storage wrapper.
        "cpu": lambda node, ctx: k.one_hot(
            node.attrs["depth"], node.attrs["on_value"], node.attrs["off_value"],
            COMPUTE_DTYPE.get(node.attrs["dtype"], node.attrs["dtype"]),
        ),
        "cuda": _cuda("one_hot_op"),
    },
))  # fmt: skip


def gather(
    params: TensorLike, indices: TensorLike, axis: int | None = None, batch_dims: int = 0, name: str = "gather"
) -> Tensor:
    """Slices of ``params`` along ``axis`` at ``indices`` (ints in [0, size)).

    The result has shape ``params.shape[:axis] + indices.shape + params.shape[axis + 1:]``;
    an index out of range fails when the graph runs, naming the node. With
    ``batch_dims`` b (TensorFlow's), the first b dims of both are a batch, each
    batch of ``params`` indexed by its own batch of ``indices``: the result is
    ``params.shape[:axis] + indices.shape[b:] + params.shape[axis + 1:]``;
    ``axis`` defaults to b.

    Examples
    --------
    >>> import cellgraph as cg
    >>> g = cg.Graph()
    >>> with g.as_default():
    ...     table = cg.variable(cg.init.zeros, shape=(1000, 16), name="embedding")
    ...     ids = cg.placeholder((None, 20), "int32", name="ids")
    ...     vectors = cg.gather(table, ids)
    >>> vectors.shape
    (None, 20, 16)
    """
    g = graph_of([params, indices])
    p, i = as_tensor(params, graph=g), as_tensor(indices, graph=g)
    if batch_dims:
        b = batch_dims + len(i.shape) if batch_dims < 0 else batch_dims
        return batch_gather(p, i, b if axis is None else _axis(axis, len(p.shape)), b, name)
    return apply("Gather", [p, i], {"axis": _axis(axis or 0, len(p.shape))}, name=name)


def _scatter_add_like(updates: Tensor, indices: Tensor, like: Tensor, axis: int) -> Tensor:
    """``updates`` summed at ``indices`` along ``axis`` into zeros shaped like ``like``
    (TensorFlow's UnsortedSegmentSum, sized at run time by ``like``)."""
    return apply("ScatterAddLike", [updates, indices, like], {"axis": axis}, name="scatter_add")


def one_hot(
    indices: TensorLike,
    depth: int,
    on_value: float | int | bool = 1,
    off_value: float | int | bool = 0,
    dtype: str = "float32",
    name: str = "one_hot",
) -> Tensor:
    """A new last dim of size ``depth``: ``on_value`` at each index, ``off_value`` elsewhere
    (a row of ``off_value`` for an index outside [0, depth))."""
    attrs = {
        "depth": operator.index(depth), "dtype": as_dtype(dtype),
        "on_value": _scalar(on_value, "on_value", "one_hot"), "off_value": _scalar(off_value, "off_value", "one_hot"),
    }  # fmt: skip
    return apply("OneHot", [indices], attrs, name=name)


__all__ = ["gather", "one_hot"]
