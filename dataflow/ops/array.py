"""Array ops: reshape, transpose, concat, slice, pad, indexing (gather and one-hot: ``array_gather.py``).

They move data without arithmetic, so their gradients move the upstream
gradient back: a reshape's is a reshape, a slice's pads, a concat's splits, a
gather's scatter-adds. A rule that needs an input's run-time shape (its static
one may have ``None`` dims) reads it from that input passed as a ``like``
operand, where TensorFlow would pass ``Shape(x)``; those ``*Like`` ops and
``StridedSliceGrad`` are internal, built only by gradient rules.

Attrs are plain hashable values (ints, tuples, strings, bools, floats) so that
a GraphDef round-trips them; indexing uses TensorFlow's StridedSlice encoding.
"""

from __future__ import annotations

import builtins
import operator
from collections.abc import Sequence
from math import prod
from typing import Any

import numpy as np

from ..errors import DTypeError, GraphError, ShapeError
from ..graph import Node, Tensor
from ..kernels.cpu import array as k
from ..kernels.cuda import cuda_kernel
from ..opdef import InferContext, KernelFactory, OpDef, Shape, TensorSpec, register_op
from ..shapes import fmt, num_elements
from .base import TensorLike, apply, apply_node, as_tensor, fits, graph_of, upstream
from .math import zeros_like

FAMILY = "array"
Dys = list[Tensor | None]
Attrs = dict[str, Any]


def _cuda(name: str) -> KernelFactory:
    """The CUDA kernel factory ``name`` of ``kernels/cuda/array.py`` (it reads the node's attrs)."""
    return cuda_kernel("array", name)


def _ints(value: Any, what: str, op: str) -> tuple[int, ...]:
    """``value`` as a tuple of Python ints (NumPy ints welcome), or a ShapeError."""
    try:
        return tuple(operator.index(v) for v in value)
    except TypeError:
        raise ShapeError(f"{op}: {what} must be a sequence of ints, got {value!r}") from None


def _scalar(value: Any, what: str, op: str) -> bool | int | float:
    """``value`` as a plain Python scalar for an attr (a NumPy scalar is unwrapped)."""
    if isinstance(value, np.generic):
        value = value.item()
    if not isinstance(value, (bool, int, float)):
        raise DTypeError(f"{op}: {what} must be a bool, int or float scalar, got {value!r}")
    return value


def _axis(axis: int, rank: int) -> int:
    """``axis`` made non-negative when it is in range; else left for the shape rule to report."""
    return axis % rank if -rank <= axis < rank else axis


# ---------------------------------------------------------------- Reshape
def _infer_reshape(ctx: InferContext) -> TensorSpec:
    x, dst = ctx.inputs[0], ctx.attrs["shape"]
    src = x.shape
    why = f"cannot reshape {fmt(src)} to {fmt(dst)}"
    if any(d < -1 for d in dst):
        raise ctx.shape_error(f"{why}: dims must be >= 0, or -1 for the one to infer")
    if dst.count(-1) > 1:
        raise ctx.shape_error(f"{why}: only one dim can be -1")
    known = prod(d for d in dst if d != -1)
    total = num_elements(src)
    if total is not None and -1 in dst:
        if known == 0 or total % known:
            raise ctx.shape_error(f"{why}: {total} is not divisible by {known}")
        return TensorSpec(tuple(total // known if d == -1 else d for d in dst), x.dtype)
    if total is not None and total != known:
        raise ctx.shape_error(f"{why}: {total} elements do not fit in {known}")
    # Unknown input dims: their product can be any multiple of the known ones.
    part = prod(d for d in src if d is not None)
    if total is None and -1 not in dst and (known % part if part else known):
        raise ctx.shape_error(f"{why}: {known} is not a multiple of {part}")
    return TensorSpec(tuple(None if d == -1 else d for d in dst), x.dtype)


def _infer_reshape_like(ctx: InferContext) -> TensorSpec:
    x, like = ctx.inputs
    n, m = num_elements(x.shape), num_elements(like.shape)
    if n is not None and m is not None and n != m:
        raise ctx.shape_error(f"cannot reshape {fmt(x.shape)} like {fmt(like.shape)}: {n} elements vs {m}")
    return TensorSpec(like.shape, x.dtype)


register_op(OpDef(
    name="Reshape", family=FAMILY, infer=_infer_reshape,
    reference=lambda attrs, x: np.reshape(x, attrs["shape"]),
    grad=lambda node, dys: [reshape_like(upstream(dys), node.inputs[0])],
    kernels={"cpu": lambda node, ctx: k.reshape(node.attrs["shape"]), "cuda": _cuda("reshape_op")}, view=True,
))  # fmt: skip
register_op(OpDef(
    name="ReshapeLike", family=FAMILY, infer=_infer_reshape_like,
    reference=lambda attrs, x, like: np.reshape(x, like.shape),
    grad=lambda node, dys: [reshape_like(upstream(dys), node.inputs[0]), None],
    kernels={"cpu": lambda node, ctx: k.reshape_like, "cuda": _cuda("reshape_like_op")}, view=True,
))  # fmt: skip


def reshape(x: TensorLike, shape: Sequence[int | None], name: str = "reshape") -> Tensor:
    """``x`` with a new shape of the same size; one dim may be -1 (or None) to infer.

    Examples
    --------
    >>> import cellgraph as cg
    >>> g = cg.Graph()
    >>> with g.as_default():
    ...     x = cg.placeholder((None, 4, 4, 3), name="x")
    ...     flat = cg.reshape(x, (-1, 48))
    >>> flat.shape
    (None, 48)
    """
    dims = _ints((-1 if d is None else d for d in shape), "shape", "reshape")
    return apply("Reshape", [x], {"shape": dims}, name=name)


def reshape_like(x: Tensor, like: Tensor, name: str = "reshape_like") -> Tensor:
    """``x`` reshaped to ``like``'s run-time shape (gradients of shape changes)."""
    return apply("ReshapeLike", [x, like], name=name)


# ---------------------------------------------------- ExpandDims, Squeeze
def _infer_expand_dims(ctx: InferContext) -> TensorSpec:
    x, axes = ctx.inputs[0], ctx.attrs["axes"]
    rank = x.rank + len(axes)
    if any(not 0 <= a < rank for a in axes) or len(set(axes)) != len(axes):
        raise ctx.shape_error(f"axes {axes} are out of range or repeated for {fmt(x.shape)} made rank {rank}")
    dims = iter(x.shape)
    return TensorSpec(tuple(1 if i in axes else next(dims) for i in range(rank)), x.dtype)


def _infer_squeeze(ctx: InferContext) -> TensorSpec:
    x, axes = ctx.inputs[0], ctx.attrs["axes"]
    for a in axes:
        if not 0 <= a < x.rank:
            raise ctx.shape_error(f"axis {a} is out of range for {fmt(x.shape)}")
        if x.shape[a] not in (1, None):
            raise ctx.shape_error(f"cannot squeeze axis {a} of {fmt(x.shape)}: its size is {x.shape[a]}, not 1")
    return TensorSpec(tuple(d for i, d in enumerate(x.shape) if i not in axes), x.dtype)


register_op(OpDef(
    name="ExpandDims", family=FAMILY, infer=_infer_expand_dims,
    reference=lambda attrs, x: np.expand_dims(x, attrs["axes"]),
    grad=lambda node, dys: [squeeze(upstream(dys), node.attrs["axes"])],
    kernels={"cpu": lambda node, ctx: lambda x, _a=node.attrs["axes"]: np.expand_dims(x, _a),
             "cuda": _cuda("expand_dims_op")}, view=True,
))  # fmt: skip
register_op(OpDef(
    name="Squeeze", family=FAMILY, infer=_infer_squeeze,
    reference=lambda attrs, x: np.squeeze(x, attrs["axes"]),
    grad=lambda node, dys: [expand_dims(upstream(dys), node.attrs["axes"])],
    # np.squeeze checks at run time that a dim unknown when building is 1.
    kernels={"cpu": lambda node, ctx: lambda x, _a=node.attrs["axes"]: np.squeeze(x, _a),
             "cuda": _cuda("squeeze_op")}, view=True,
))  # fmt: skip


def expand_dims(x: TensorLike, axis: int | Sequence[int], name: str = "expand_dims") -> Tensor:
    """``x`` with a size-1 dim inserted at ``axis`` (a position in the result)."""
    t = as_tensor(x)
    axes = (axis,) if isinstance(axis, int) else _ints(axis, "axis", "expand_dims")
    rank = len(t.shape) + len(axes)
    return apply("ExpandDims", [t], {"axes": tuple(sorted(_axis(a, rank) for a in axes))}, name=name)


def squeeze(x: TensorLike, axis: int | Sequence[int] | None = None, name: str = "squeeze") -> Tensor:
    """``x`` without the size-1 dims ``axis`` (all of them when None: they must be known)."""
    t = as_tensor(x)
    if axis is None:
        if None in t.shape:
            raise ShapeError(
                f"squeeze of {t.name!r} {fmt(t.shape)}: which unknown dims are 1 is not known "
                "until the graph runs; pass axis="
            )
        axes: tuple[int, ...] = tuple(i for i, d in enumerate(t.shape) if d == 1)
    else:
        axes = (axis,) if isinstance(axis, int) else _ints(axis, "axis", "squeeze")
    return apply("Squeeze", [t], {"axes": tuple(sorted({_axis(a, len(t.shape)) for a in axes}))}, name=name)


# -------------------------------------------------------------- Transpose
def _infer_transpose(ctx: InferContext) -> TensorSpec:
    x, perm = ctx.inputs[0], ctx.attrs["perm"]
    if len(perm) != x.rank:
        raise ctx.shape_error(f"perm {perm} does not match rank {x.rank} of {fmt(x.shape)}")
    if sorted(perm) != list(range(x.rank)):
        raise ctx.shape_error(f"perm {perm} is not a permutation of {tuple(range(x.rank))}")
    return TensorSpec(tuple(x.shape[p] for p in perm), x.dtype)


register_op(OpDef(
    name="Transpose", family=FAMILY, infer=_infer_transpose,
    reference=lambda attrs, x: np.transpose(x, attrs["perm"]),
    grad=lambda node, dys: [transpose(upstream(dys), tuple(int(i) for i in np.argsort(node.attrs["perm"])))],
    # view: an identity perm, or one that moves only size-1 dims, is already contiguous.
    kernels={"cpu": lambda node, ctx: k.transpose(node.attrs["perm"]), "cuda": _cuda("transpose_op")}, view=True,
))  # fmt: skip


def transpose(x: TensorLike, perm: Sequence[int] | None = None, name: str = "transpose") -> Tensor:
    """``x`` with its dims permuted: dim ``i`` of the result is dim ``perm[i]`` of ``x``
    (reversed when ``perm`` is None)."""
    t = as_tensor(x)
    dims = tuple(reversed(range(len(t.shape)))) if perm is None else _ints(perm, "perm", "transpose")
    return apply("Transpose", [t], {"perm": dims}, name=name)


# ---------------------------------------------------- Concat, SplitLike
def _infer_concat(ctx: InferContext) -> TensorSpec:
    first, axis = ctx.inputs[0], ctx.attrs["axis"]
    for x in ctx.inputs[1:]:
        if x.dtype != first.dtype:
            raise ctx.dtype_error(f"inputs have different dtypes: {first.dtype} and {x.dtype}")
        if x.rank != first.rank:
            raise ctx.shape_error(f"inputs differ in rank: {fmt(first.shape)} and {fmt(x.shape)}")
    if not 0 <= axis < first.rank:
        raise ctx.shape_error(f"axis {axis} is out of range for {fmt(first.shape)}")
    dims, source = list(first.shape), [first.shape] * first.rank  # which input fixed each dim
    for x in ctx.inputs[1:]:
        for i, d in enumerate(x.shape):
            have = dims[i]
            if i == axis:
                dims[i] = None if have is None or d is None else have + d
            elif have is None:
                dims[i], source[i] = d, x.shape
            elif d is not None and d != have:
                raise ctx.shape_error(f"inputs differ on axis {i}: {fmt(source[i])} and {fmt(x.shape)}")
    return TensorSpec(tuple(dims), first.dtype)


def _infer_split_like(ctx: InferContext) -> list[TensorSpec]:
    g, likes, axis = ctx.inputs[0], ctx.inputs[1:], ctx.attrs["axis"]
    rest = g.shape[:axis] + g.shape[axis + 1 :]
    for like in likes:
        if like.rank != g.rank or not fits(rest, like.shape[:axis] + like.shape[axis + 1 :]):
            raise ctx.shape_error(f"cannot split {fmt(g.shape)} on axis {axis} into a piece like {fmt(like.shape)}")
    sizes = [like.shape[axis] for like in likes]
    known = [size for size in sizes if size is not None]
    if len(known) == len(sizes) and g.shape[axis] is not None and sum(known) != g.shape[axis]:
        raise ctx.shape_error(f"pieces of sizes {tuple(sizes)} do not add up to {fmt(g.shape)} on axis {axis}")
    return [TensorSpec(g.shape[:axis] + (size,) + g.shape[axis + 1 :], g.dtype) for size in sizes]


def _grad_split_like(node: Node, dys: Dys) -> list[Tensor | None]:
    parts = [dy if dy is not None else zeros_like(out) for dy, out in zip(dys, node.outputs)]
    return [concat(parts, node.attrs["axis"]), *[None] * (len(node.inputs) - 1)]


def _ref_split_like(attrs: Attrs, g: np.ndarray, *likes: np.ndarray) -> Any:
    cuts = np.cumsum([like.shape[attrs["axis"]] for like in likes])[:-1]
    pieces = np.split(g, cuts, axis=attrs["axis"])
    return pieces[0] if len(pieces) == 1 else tuple(pieces)


register_op(OpDef(
    name="Concat", family=FAMILY, infer=_infer_concat,
    reference=lambda attrs, *xs: np.concatenate(xs, attrs["axis"]),
    grad=lambda node, dys: _split_like(upstream(dys), node.inputs, node.attrs["axis"]),
    kernels={"cpu": lambda node, ctx: k.concat(node.attrs["axis"]), "cuda": _cuda("concat_op")},
))  # fmt: skip
register_op(OpDef(
    name="SplitLike", family=FAMILY, infer=_infer_split_like, reference=_ref_split_like, grad=_grad_split_like,
    kernels={"cpu": lambda node, ctx: k.split_like(node.attrs["axis"]), "cuda": _cuda("split_like_op")}, view=True,
))  # fmt: skip


def concat(values: Sequence[TensorLike], axis: int, name: str = "concat") -> Tensor:
    """The tensors ``values`` joined along ``axis``; other dims must agree.

    Examples
    --------
    >>> import cellgraph as cg
    >>> g = cg.Graph()
    >>> with g.as_default():
    ...     a = cg.placeholder((None, 8, 8, 16), name="a")
    ...     b = cg.placeholder((None, 8, 8, 32), name="b")
    ...     c = cg.concat([a, b], axis=3)
    >>> c.shape
    (None, 8, 8, 48)
    """
    if not values:
        raise ShapeError("concat needs at least one tensor, got none")
    g = graph_of(values)
    tensors = [as_tensor(v, graph=g) for v in values]
    if not tensors[0].shape:
        raise ShapeError(f"concat cannot join scalars: {tensors[0].name!r} has shape ()")
    return apply("Concat", tensors, {"axis": _axis(axis, len(tensors[0].shape))}, name=name)


def _split_like(g: Tensor, likes: Sequence[Tensor], axis: int) -> list[Tensor | None]:
    """``g`` split along ``axis`` into one piece per tensor of ``likes``, sized like it."""
    node = apply_node("SplitLike", [g, *likes], {"axis": axis}, name="split_like")
    return list(node.outputs)


# --------------------------------------------------------------- Slice, Pad
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
register_op(OpDef(
    name="StridedSliceGrad", family=FAMILY, infer=_infer_strided_slice_grad, reference=_ref_strided_slice_grad,
    grad=lambda node, dys: [apply("StridedSlice", [upstream(dys)], node.attrs, name="strided_slice"), None],
    kernels={"cpu": lambda node, ctx: k.strided_slice_grad(_index(node.attrs)),
             "cuda": _cuda_indexed("strided_slice_grad_op")},
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


__all__ = ["concat", "expand_dims", "getitem", "pad", "reshape", "slice", "squeeze", "transpose"]
