"""Slice, pad and Python indexing (StridedSlice): ops that take or surround a window of a tensor.

A slice's gradient pads the upstream gradient back to the input's shape, a
pad's slices it out, and an index's (``StridedSliceGrad``, internal, built only
by that rule) scatters it into zeros shaped like the input at run time.
Indexing uses TensorFlow's StridedSlice encoding (begin, end, strides and the
four masks), so that a GraphDef round-trips it.
"""

from __future__ import annotations

import builtins
import operator
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import GraphError, ShapeError
from ..graph import Node, Tensor
from ..kernels.cpu import array as k
from ..kernels.cuda import cuda_kernel
from ..opdef import InferContext, KernelFactory, OpDef, Shape, TensorSpec, register_op
from ..shapes import fmt
from .array import FAMILY, Attrs, Dys, _cuda, _ints, _scalar
from .base import TensorLike, apply, as_tensor, fits, rule_checked, upstream


def _infer_slice(ctx: InferContext) -> TensorSpec:
    x, begin, size = ctx.inputs[0], ctx.attrs["begin"], ctx.attrs["size"]
    if len(begin) != x.rank or len(size) != x.rank:
        raise ctx.shape_error(f"begin {begin} and size {size} need one entry per dim of {fmt(x.shape)}")
    dims: list[int | None] = []
    for axis, (b, s, d) in enumerate(zip(begin, size, x.shape)):
        if b < 0 or s < -1:
            raise ctx.shape_error(f"begin {begin} must be >= 0 and size {size} >= -1 (to the end)")
        if d is not None and (b > d or (s != -1 and b + s > d)):
            raise ctx.shape_error(f"begin {begin} size {size} is out of bounds for {fmt(x.shape)} on axis {axis}")
        dims.append(s if s != -1 else None if d is None else d - b)
    return TensorSpec(tuple(dims), x.dtype)


def _grad_slice(node: Node, dys: Dys) -> list[Tensor | None]:
    begin, size = node.attrs["begin"], node.attrs["size"]
    end_mask = sum(1 << i for i, s in enumerate(size) if s == -1)
    attrs = _strided_attrs(
        begin, tuple(b + max(s, 0) for b, s in zip(begin, size)), (1,) * len(begin), end_mask=end_mask
    )
    return [_strided_slice_grad(upstream(dys), node.inputs[0], attrs)]


def _infer_pad(ctx: InferContext) -> TensorSpec:
    x, paddings = ctx.inputs[0], ctx.attrs["paddings"]
    if len(paddings) != x.rank or any(len(p) != 2 for p in paddings):
        raise ctx.shape_error(f"paddings {paddings} need one (before, after) pair per dim of {fmt(x.shape)}")
    if any(v < 0 for p in paddings for v in p):
        raise ctx.shape_error(f"paddings {paddings} must be >= 0")
    return TensorSpec(tuple(None if d is None else d + b + a for d, (b, a) in zip(x.shape, paddings)), x.dtype)


def _grad_pad(node: Node, dys: Dys) -> list[Tensor | None]:
    # The gradient is the middle of g: g[before:-after] on every axis, which
    # needs no run-time shape of x.
    paddings = node.attrs["paddings"]
    attrs = _strided_attrs(
        begin=tuple(b for b, _ in paddings),
        end=tuple(-a for _, a in paddings),
        strides=(1,) * len(paddings),
        end_mask=sum(1 << i for i, (_, a) in enumerate(paddings) if a == 0),
    )
    return [apply("StridedSlice", [upstream(dys)], attrs, name="pad_grad")]


register_op(OpDef(
    name="Slice", family=FAMILY, infer=_infer_slice,
    reference=lambda attrs, x: x[tuple(builtins.slice(b, None if s == -1 else b + s) for b, s in zip(attrs["begin"], attrs["size"]))],
    grad=_grad_slice,
    kernels={"cpu": lambda node, ctx: k.slice_(node.attrs["begin"], node.attrs["size"]),
             "cuda": _cuda("slice_op")}, view=True,
))  # fmt: skip
register_op(OpDef(
    name="Pad", family=FAMILY, infer=_infer_pad,
    reference=lambda attrs, x: np.pad(x, attrs["paddings"], constant_values=attrs["constant_values"]),
    grad=_grad_pad,
    kernels={"cpu": lambda node, ctx: k.pad(node.attrs["paddings"], node.attrs["constant_values"]),
             "cuda": _cuda("pad_op")},
))  # fmt: skip


def slice(x: TensorLike, begin: Sequence[int], size: Sequence[int], name: str = "slice") -> Tensor:  # noqa: A001 - TF's name
    """The block of ``x`` starting at ``begin`` with extent ``size`` (-1: to the end).

    Examples
    --------
    >>> import cellgraph as cg
    >>> g = cg.Graph()
    >>> with g.as_default():
    ...     x = cg.placeholder((None, 10), name="x")
    ...     y = cg.slice(x, (0, 2), (-1, 5))
    >>> y.shape
    (None, 5)
    """
    attrs = {"begin": _ints(begin, "begin", "slice"), "size": _ints(size, "size", "slice")}
    return apply("Slice", [x], attrs, name=name)


def pad(
    x: TensorLike,
    paddings: Sequence[Sequence[int]],
    constant_values: float | int | bool = 0,
    mode: str = "CONSTANT",
    name: str = "pad",
) -> Tensor:
    """``x`` with ``paddings[i] = (before, after)`` entries around dim ``i``: ``constant_values``
    (mode CONSTANT), or ``x`` mirrored without its edge (REFLECT) or with it (SYMMETRIC),
    as TensorFlow's ``tf.pad`` (``mode`` comes after ``constant_values`` here, which was first)."""
    try:
        pairs = tuple(tuple(operator.index(v) for v in pair) for pair in paddings)
    except TypeError:
        raise ShapeError(f"pad: paddings must be one (before, after) pair of ints per dim, got {paddings!r}") from None
    if not isinstance(mode, str) or mode.upper() not in ("CONSTANT", "REFLECT", "SYMMETRIC"):
        raise GraphError(f"pad: mode must be 'CONSTANT', 'REFLECT' or 'SYMMETRIC', got {mode!r}")
    if mode.upper() != "CONSTANT":
        from .array_more import mirror_pad

        return mirror_pad(as_tensor(x), pairs, mode.upper(), name)
    attrs = {"paddings": pairs, "constant_values": _scalar(constant_values, "constant_values", "pad")}
    return apply("Pad", [x], attrs, name=name)


# ----------------------------------------- StridedSlice (Python indexing)
# TensorFlow's encoding: one (begin, end, stride) per index entry, and bit i of
# a mask marks entry i as "start from the beginning", "run to the end", "an
# int that drops the dim" or "a new dim of size 1". Ellipsis is expanded when
# the node is built, since the rank is known then.
_MASKS = ("begin_mask", "end_mask", "shrink_axis_mask", "new_axis_mask")


def _strided_attrs(
    begin: tuple[int, ...],
    end: tuple[int, ...],
    strides: tuple[int, ...],
    begin_mask: int = 0,
    end_mask: int = 0,
    shrink_axis_mask: int = 0,
    new_axis_mask: int = 0,
) -> Attrs:
    return {
        "begin": begin, "end": end, "strides": strides, "begin_mask": begin_mask,
        "end_mask": end_mask, "shrink_axis_mask": shrink_axis_mask, "new_axis_mask": new_axis_mask,
    }  # fmt: skip


def _index(attrs: Attrs) -> tuple[Any, ...]:
    """The NumPy basic index that StridedSlice attrs encode."""
    key: list[Any] = []
    for i, (b, e, s) in enumerate(zip(attrs["begin"], attrs["end"], attrs["strides"])):
        bit = 1 << i
        if attrs["new_axis_mask"] & bit:
            key.append(None)
        elif attrs["shrink_axis_mask"] & bit:
            key.append(b)
        else:
            start = None if attrs["begin_mask"] & bit else b
            key.append(builtins.slice(start, None if attrs["end_mask"] & bit else e, s))
    return tuple(key)


def _cuda_indexed(name: str) -> KernelFactory:
    """The CUDA kernel factory ``name``, given the NumPy index that the node's attrs encode."""
    return lambda node, ctx: cuda_kernel("array", name, _index(node.attrs))(node, ctx)


def _fmt_index(key: tuple[Any, ...]) -> str:
    """``[0, 1:3, ::-1, None]``: an index as the user wrote it."""

    def one(item: Any) -> str:
        if not isinstance(item, builtins.slice):
            return str(item)
        text = f"{'' if item.start is None else item.start}:{'' if item.stop is None else item.stop}"
        return text if item.step == 1 else f"{text}:{item.step}"

    return "[" + ", ".join(one(item) for item in key) + "]"


def _indexed_shape(ctx: InferContext, shape: Shape, key: tuple[Any, ...]) -> Shape:
    consumed = sum(item is not None for item in key)
    if consumed > len(shape):
        raise ctx.shape_error(f"too many indices for {fmt(shape)}: {_fmt_index(key)}")
    dims: list[int | None] = []
    axis = 0
    for item in key:
        if item is None:
            dims.append(1)
            continue
        d = shape[axis]
        if isinstance(item, builtins.slice):
            if item.step == 0:
                raise ctx.shape_error(f"slice step cannot be zero: {_fmt_index(key)}")
            dims.append(None if d is None else len(range(*item.indices(d))))
        elif d is not None and not -d <= item < d:
            raise ctx.shape_error(f"index {item} is out of range for axis {axis} of {fmt(shape)}: {_fmt_index(key)}")
        axis += 1
    return tuple(dims) + tuple(shape[axis:])


def _infer_strided_slice(ctx: InferContext) -> TensorSpec:
    x = ctx.inputs[0]
    return TensorSpec(_indexed_shape(ctx, x.shape, _index(ctx.attrs)), x.dtype)


def _infer_strided_slice_grad(ctx: InferContext) -> TensorSpec:
    g, like = ctx.inputs
    key = _index(ctx.attrs)
    if not fits(g.shape, _indexed_shape(ctx, like.shape, key)):
        raise ctx.shape_error(f"gradient {fmt(g.shape)} does not fit {_fmt_index(key)} of {fmt(like.shape)}")
    return TensorSpec(like.shape, g.dtype)


def _ref_strided_slice_grad(attrs: Attrs, g: np.ndarray, like: np.ndarray) -> np.ndarray:
    out = np.zeros_like(like, dtype=g.dtype)
    out[_index(attrs)] = g
    return out


register_op(OpDef(
    name="StridedSlice", family=FAMILY, infer=_infer_strided_slice,
    reference=lambda attrs, x: np.array(x[_index(attrs)]),
    grad=lambda node, dys: [_strided_slice_grad(upstream(dys), node.inputs[0], node.attrs)],
    kernels={"cpu": lambda node, ctx: k.strided_slice(_index(node.attrs)),
             "cuda": _cuda_indexed("strided_slice_op")}, view=True,
))  # fmt: skip
# Built by gradient rules: the rule runs again on the arrays' shapes (rule_checked), since with dims unknown when
# building, a gradient that did not fit the slice of the like was broadcast into it without a word.
register_op(OpDef(
    name="StridedSliceGrad", family=FAMILY, infer=_infer_strided_slice_grad, reference=_ref_strided_slice_grad,
    grad=lambda node, dys: [apply("StridedSlice", [upstream(dys)], node.attrs, name="strided_slice"), None],
    kernels={"cpu": rule_checked(lambda node, ctx: k.strided_slice_grad(_index(node.attrs))),
             "cuda": rule_checked(_cuda_indexed("strided_slice_grad_op"))},
))  # fmt: skip


def _strided_slice_grad(g: Tensor, like: Tensor, attrs: Attrs) -> Tensor:
    """``g`` written into zeros shaped like ``like`` where ``attrs`` index it (a pad)."""
    return apply("StridedSliceGrad", [g, like], {name: attrs[name] for name in ("begin", "end", "strides", *_MASKS)})


_SUPPORTED_KEYS = "ints, slices (start:stop:step), ... (Ellipsis) and None (newaxis)"


def _describe_key(item: Any) -> str:
    if isinstance(item, Tensor):
        return f"tensor {item.name!r}"
    return f"{type(item).__name__} {item!r}"


def _as_int(item: Any) -> int | None:
    """``item`` as an int if it is one (a NumPy int, a 0-d int array), else None."""
    if isinstance(item, (bool, np.bool_)):  # True is an int to Python, a mask to NumPy
        return None
    try:
        return operator.index(item)
    except TypeError:
        return None


def _key_int(value: Any, t: Tensor) -> int | None:
    if value is None:
        return None
    if _as_int(value) is None:
        raise GraphError(
            f"cannot index {t.name!r} with a slice bound {_describe_key(value)}: slice bounds must be ints or None"
        )
    return _as_int(value)


def getitem(x: TensorLike, key: Any, name: str = "getitem") -> Tensor:
    """``x[key]`` with NumPy basic indexing: ints, slices with steps, ``...`` and None.

    Examples
    --------
    >>> import cellgraph as cg
    >>> g = cg.Graph()
    >>> with g.as_default():
    ...     x = cg.placeholder((None, 8, 8, 3), name="x")
    ...     y = x[:, ::2, -1, None]
    >>> y.shape
    (None, 4, 1, 3)
    """
    t = as_tensor(x)
    items = key if isinstance(key, tuple) else (key,)
    entries: list[tuple[str, int | None, int | None, int | None]] = []  # kind, start/index, stop, step
    for item in items:
        if item is None:
            entries.append(("new", None, None, None))
        elif item is Ellipsis:
            entries.append(("...", None, None, None))
        elif isinstance(item, builtins.slice):
            entries.append(("slice", _key_int(item.start, t), _key_int(item.stop, t), _key_int(item.step, t)))
        elif _as_int(item) is not None:
            entries.append(("int", _as_int(item), None, None))
        else:
            raise GraphError(
                f"cannot index {t.name!r} with {_describe_key(item)}: indexing supports {_SUPPORTED_KEYS}; "
                "for indices held in a tensor or a list use cg.gather"
            )
    if sum(kind == "..." for kind, *_ in entries) > 1:
        raise GraphError(f"cannot index {t.name!r} with {key!r}: an index can have only one ... (Ellipsis)")
    whole = ("slice", None, None, None)
    rest = max(len(t.shape) - sum(kind in ("int", "slice") for kind, *_ in entries), 0)
    if not any(kind == "..." for kind, *_ in entries):
        entries.append(("...", None, None, None))
    at = next(i for i, (kind, *_) in enumerate(entries) if kind == "...")
    entries[at : at + 1] = [whole] * rest

    triples: list[tuple[int, int, int]] = []  # (begin, end, stride) per entry
    masks = dict.fromkeys(_MASKS, 0)
    for i, (kind, start, stop, step) in enumerate(entries):
        bit = 1 << i
        if kind == "int":
            assert start is not None
            triples.append((start, start + 1, 1))
            masks["shrink_axis_mask"] |= bit
        elif kind == "new":
            triples.append((0, 0, 1))
            masks["new_axis_mask"] |= bit
        else:
            triples.append((start or 0, stop or 0, 1 if step is None else step))
            masks["begin_mask"] |= bit if start is None else 0
            masks["end_mask"] |= bit if stop is None else 0
    begin, end, strides = (tuple(column) for column in zip(*triples)) if triples else ((), (), ())
    attrs = _strided_attrs(begin, end, strides, **masks)
    return apply("StridedSlice", [t], attrs, name=name)


__all__ = ["getitem", "pad", "slice"]
