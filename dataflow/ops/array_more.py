"""More array ops: stack, unstack, split, tile, broadcast_to, reverse, pad's mirror
modes, space_to_depth and depth_to_space.

Split, Tile (with its internal gradient TileGrad), BroadcastTo and MirrorPad
(with MirrorPadGrad, ``cg.pad`` in REFLECT or SYMMETRIC mode) are ops of their
own: each moves data in one pass that no chain of the existing ops does as
cheaply. The rest are compositions, as fast as an op of their own would be:
``stack`` is ExpandDims (a view) and one Concat, ``unstack`` one Split and a
Squeeze (a view) per piece, ``reverse`` one StridedSlice with step -1 on the
reversed axes, space_to_depth and depth_to_space a Transpose between two
Reshapes. Their gradients are those of the ops they are made of.

Attrs are plain ints and tuples, as in ``array.py``, so a GraphDef keeps them.
"""

from __future__ import annotations

import builtins
import operator
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import ShapeError
from ..graph import Node, Tensor
from ..kernels.cpu import array_more as k
from ..kernels.cpu.array_more import split_sizes
from ..kernels.cuda import cuda_kernel
from ..opdef import InferContext, KernelFactory, OpDef, TensorSpec, register_op
from ..shapes import fmt
from .array import concat, expand_dims, reshape, squeeze, transpose
from .array_slice import getitem
from .base import TensorLike, apply, apply_node, as_tensor, fits, graph_of, upstream
from .math import sum_to_shape_of, zeros_like

FAMILY = "array"
Dys = list[Tensor | None]
Attrs = dict[str, Any]


def _cuda(name: str) -> KernelFactory:
    return cuda_kernel("array_more", name)


def _ints(value: Any, what: str, op: str) -> tuple[int, ...]:
    """``value`` (one int or a sequence of them) as a tuple of Python ints, or a ShapeError."""
    try:
        return (
            (operator.index(value),)
            if not isinstance(value, (tuple, list, np.ndarray))
            else tuple(operator.index(v) for v in value)
        )
    except TypeError:
        raise ShapeError(f"{op}: {what} must be an int or a sequence of ints, got {value!r}") from None


def _axis(axis: Any, rank: int, op: str, what: str = "axis") -> int:
    """``axis`` in [-rank, rank) made non-negative, or a ShapeError naming the op."""
    (a,) = _ints(axis, what, op)
    if not -rank <= a < rank:
        raise ShapeError(f"{op}: {what} {a} is out of range for rank {rank}")
    return a % rank


# ------------------------------------------------------------------ Split
def _infer_split(ctx: InferContext) -> list[TensorSpec]:
    x, axis, sizes, num = ctx.inputs[0], ctx.attrs["axis"], ctx.attrs["sizes"], ctx.attrs["num"]
    if not 0 <= axis < x.rank:
        raise ctx.shape_error(f"axis {axis} is out of range for {fmt(x.shape)}")
    if sizes and (any(s < -1 for s in sizes) or sizes.count(-1) > 1):
        raise ctx.shape_error(f"sizes {sizes} must be >= 0, with at most one -1 for the rest of the axis")
    if not sizes and num < 1:
        raise ctx.shape_error(f"cannot split into {num} pieces: need at least one")
    dim = x.shape[axis]
    if dim is None:
        pieces: tuple[int | None, ...] = tuple(None if s == -1 else s for s in sizes) if sizes else (None,) * num
    else:
        fitted = split_sizes(sizes, num, dim)
        if isinstance(fitted, str):
            raise ctx.shape_error(f"cannot split {fmt(x.shape)} on axis {axis}: {fitted}")
        pieces = fitted
    return [TensorSpec(x.shape[:axis] + (p,) + x.shape[axis + 1 :], x.dtype) for p in pieces]


def _ref_split(attrs: Attrs, x: np.ndarray) -> Any:
    sizes = split_sizes(attrs["sizes"], attrs["num"], x.shape[attrs["axis"]])
    if isinstance(sizes, str):
        raise ValueError(f"cannot split {x.shape} on axis {attrs['axis']}: {sizes}")
    pieces = np.split(x, np.cumsum(sizes)[:-1], axis=attrs["axis"])
    return pieces[0] if len(pieces) == 1 else tuple(pieces)


def _grad_split(node: Node, dys: Dys) -> list[Tensor | None]:
    parts = [dy if dy is not None else zeros_like(out) for dy, out in zip(dys, node.outputs)]
    return [concat(parts, node.attrs["axis"])]


register_op(OpDef(
    name="Split", family=FAMILY, infer=_infer_split, reference=_ref_split, grad=_grad_split,
    kernels={"cpu": lambda node, ctx: k.split(node.attrs["axis"], node.attrs["sizes"], node.attrs["num"]),
             "cuda": _cuda("split_op")}, view=True,
))  # fmt: skip


def split(
    value: TensorLike,
    num_or_size_splits: int | Sequence[int],
    axis: int = 0,
    name: str = "split",
) -> list[Tensor]:
    """``value`` cut along ``axis`` into pieces, as TensorFlow's ``tf.split``.

    An int ``n`` gives ``n`` equal pieces (the axis must divide by ``n``, checked
    when the graph runs if its size is unknown until then); a sequence gives
    pieces of those sizes, one of which may be -1 for the rest of the axis.

    Examples
    --------
    >>> import cellgraph as cg
    >>> g = cg.Graph()
    >>> with g.as_default():
    ...     x = cg.placeholder((None, 10), name="x")
    ...     a, b, c = cg.split(x, [2, -1, 3], axis=1)
    >>> b.shape
    (None, 5)
    """
    t = as_tensor(value)
    rank = len(t.shape)
    if rank == 0:
        raise ShapeError(f"split cannot cut a scalar: {t.name!r} has shape ()")
    attrs: Attrs = {"axis": _axis(axis, rank, "split")}
    if isinstance(num_or_size_splits, (int, np.integer)):
        attrs.update(sizes=(), num=int(num_or_size_splits))
    else:
        sizes = _ints(num_or_size_splits, "num_or_size_splits", "split")
        if not sizes:
            raise ShapeError("split: num_or_size_splits is empty: give a count or at least one size")
        attrs.update(sizes=sizes, num=len(sizes))
    return list(apply_node("Split", [t], attrs, name=name).outputs)


def unstack(value: TensorLike, num: int | None = None, axis: int = 0, name: str = "unstack") -> list[Tensor]:
    """The ``num`` slices of ``value`` along ``axis``, each without that axis (``tf.unstack``).

    ``num`` may be left out when the axis's size is known when building.
    """
    t = as_tensor(value)
    rank = len(t.shape)
    if rank == 0:
        raise ShapeError(f"unstack cannot unpack a scalar: {t.name!r} has shape ()")
    a = _axis(axis, rank, "unstack")
    count = t.shape[a] if num is None else operator.index(num)
    if count is None:
        raise ShapeError(
            f"unstack of {t.name!r} {fmt(t.shape)}: the size of axis {a} is not known until the graph runs; pass num="
        )
    if count == 0 and t.shape[a] in (0, None):
        return []  # no pieces: nothing to compute
    pieces = split(t, [1] * count, a, name=name)
    return [squeeze(p, a, name=f"{name}_squeeze") for p in pieces]


def stack(values: Sequence[TensorLike], axis: int = 0, name: str = "stack") -> Tensor:
    """The tensors ``values`` (all of one shape) joined along a new axis ``axis`` (``tf.stack``).

    Examples
    --------
    >>> import cellgraph as cg
    >>> g = cg.Graph()
    >>> with g.as_default():
    ...     a = cg.placeholder((None, 3), name="a")
    ...     b = cg.placeholder((None, 3), name="b")
    ...     s = cg.stack([a, b], axis=1)
    >>> s.shape
    (None, 2, 3)
    """
    if not values:
        raise ShapeError("stack needs at least one tensor, got none")
    g = graph_of(values)
    tensors = [as_tensor(v, graph=g) for v in values]
    first = tensors[0]
    for t in tensors[1:]:
        if not fits(t.shape, first.shape):
            raise ShapeError(
                f"stack needs tensors of one shape: {first.name!r} is {fmt(first.shape)}, {t.name!r} is {fmt(t.shape)}"
            )
    a = _axis(axis, len(first.shape) + 1, "stack")
    return concat([expand_dims(t, a) for t in tensors], a, name=name)


# ------------------------------------------------------------ Tile, TileGrad
def _infer_tile(ctx: InferContext) -> TensorSpec:
    x, multiples = ctx.inputs[0], ctx.attrs["multiples"]
    if len(multiples) != x.rank:
        raise ctx.shape_error(f"multiples {multiples} need one entry per dim of {fmt(x.shape)}")
    if any(m < 0 for m in multiples):
        raise ctx.shape_error(f"multiples {multiples} must be >= 0")
    return TensorSpec(tuple(None if d is None else d * m for d, m in zip(x.shape, multiples)), x.dtype)


def _infer_tile_grad(ctx: InferContext) -> TensorSpec:
    g, x = ctx.inputs
    multiples = ctx.attrs["multiples"]
    tiled = tuple(None if d is None else d * m for d, m in zip(x.shape, multiples))
    if len(multiples) != x.rank or not fits(g.shape, tiled):
        raise ctx.shape_error(f"gradient {fmt(g.shape)} is not {fmt(x.shape)} tiled {multiples}")
    return TensorSpec(x.shape, g.dtype)


register_op(OpDef(
    name="Tile", strings=True, family=FAMILY, infer=_infer_tile,
    reference=lambda attrs, x: np.tile(x, attrs["multiples"]),
    grad=lambda node, dys: [apply("TileGrad", [upstream(dys), node.inputs[0]], node.attrs, name="tile_grad")],
    kernels={"cpu": lambda node, ctx: k.tile(node.attrs["multiples"]), "cuda": _cuda("tile_op")},
))  # fmt: skip
register_op(OpDef(
    name="TileGrad", family=FAMILY, infer=_infer_tile_grad,
    reference=lambda attrs, g, x: k.untile(g, x.shape, attrs["multiples"]),
    grad=lambda node, dys: [tile(upstream(dys), node.attrs["multiples"]), None],
    kernels={"cpu": lambda node, ctx: k.tile_grad(node.attrs["multiples"]), "cuda": _cuda("tile_grad_op")},
))  # fmt: skip


def tile(x: TensorLike, multiples: Sequence[int], name: str = "tile") -> Tensor:
    """``x`` repeated ``multiples[i]`` times along each dim ``i`` (``tf.tile``, ``np.tile``).

    Examples
    --------
    >>> import cellgraph as cg
    >>> g = cg.Graph()
    >>> with g.as_default():
    ...     x = cg.placeholder((None, 3), name="x")
    ...     y = cg.tile(x, (2, 4))
    >>> y.shape
    (None, 12)
    """
    return apply("Tile", [x], {"multiples": _ints(multiples, "multiples", "tile")}, name=name)


# ------------------------------------------------------------ BroadcastTo
def _infer_broadcast_to(ctx: InferContext) -> TensorSpec:
    x, shape = ctx.inputs[0], ctx.attrs["shape"]
    if any(d < 0 for d in shape):
        raise ctx.shape_error(f"shape {shape} must be >= 0")
    if x.rank > len(shape):
        raise ctx.shape_error(f"cannot broadcast {fmt(x.shape)} to {fmt(shape)}: it has more dims")
    lead = len(shape) - x.rank
    for i, d in enumerate(x.shape):
        if d is not None and d != 1 and d != shape[lead + i]:
            raise ctx.shape_error(
                f"cannot broadcast {fmt(x.shape)} to {fmt(shape)}: dim {i} is {d}, neither 1 nor {shape[lead + i]}"
            )
    return TensorSpec(shape, x.dtype)


register_op(OpDef(
    name="BroadcastTo", family=FAMILY, infer=_infer_broadcast_to,
    reference=lambda attrs, x: np.array(np.broadcast_to(x, attrs["shape"])),
    grad=lambda node, dys: [sum_to_shape_of(upstream(dys), node.inputs[0])],
    kernels={"cpu": lambda node, ctx: k.broadcast_to(node.attrs["shape"]), "cuda": _cuda("broadcast_to_op")},
))  # fmt: skip


def broadcast_to(x: TensorLike, shape: Sequence[int], name: str = "broadcast_to") -> Tensor:
    """``x`` broadcast NumPy-style to ``shape`` (``tf.broadcast_to``): a copy with the
    size-1 and missing leading dims repeated."""
    return apply("BroadcastTo", [x], {"shape": _ints(shape, "shape", "broadcast_to")}, name=name)


# ------------------------------------------------ MirrorPad, MirrorPadGrad
# REFLECT leaves the edge out of the mirror image ([1 2 3] -> 2 1 2 3 2), so a
# pad must be shorter than its dim; SYMMETRIC repeats the edge (-> 1 1 2 3 3),
# so a pad may be as long as its dim (TensorFlow's MirrorPad).
MIRROR_MODES = {"REFLECT": 0, "SYMMETRIC": 1}


def _check_paddings(ctx: InferContext, paddings: Any, rank: int, shape: Any) -> None:
    if len(paddings) != rank or any(len(p) != 2 for p in paddings):
        raise ctx.shape_error(f"paddings {paddings} need one (before, after) pair per dim of {fmt(shape)}")
    if any(v < 0 for p in paddings for v in p):
        raise ctx.shape_error(f"paddings {paddings} must be >= 0")


def _check_mirror(ctx: InferContext, shape: Any, paddings: Any, mode: str) -> None:
    edge = MIRROR_MODES[mode]
    for axis, (d, (b, a)) in enumerate(zip(shape, paddings)):
        if d is not None and max(b, a) > max(d - 1 + edge, 0):  # a pad of 0 mirrors nothing, even of nothing
            limit = "less than" if mode == "REFLECT" else "at most"
            raise ctx.shape_error(
                f"{mode} padding {(b, a)} of axis {axis} of {fmt(shape)} must be {limit} its size {d}"
            )


def _infer_mirror_pad(ctx: InferContext) -> TensorSpec:
    x, paddings, mode = ctx.inputs[0], ctx.attrs["paddings"], ctx.attrs["mode"]
    _check_paddings(ctx, paddings, x.rank, x.shape)
    _check_mirror(ctx, x.shape, paddings, mode)
    return TensorSpec(tuple(None if d is None else d + b + a for d, (b, a) in zip(x.shape, paddings)), x.dtype)


def _infer_mirror_pad_grad(ctx: InferContext) -> TensorSpec:
    g, paddings = ctx.inputs[0], ctx.attrs["paddings"]
    _check_paddings(ctx, paddings, g.rank, g.shape)
    dims = tuple(None if d is None else d - b - a for d, (b, a) in zip(g.shape, paddings))
    if any(d is not None and d < 0 for d in dims):
        raise ctx.shape_error(f"gradient {fmt(g.shape)} is smaller than its paddings {paddings}")
    _check_mirror(ctx, dims, paddings, ctx.attrs["mode"])
    return TensorSpec(dims, g.dtype)


register_op(OpDef(
    name="MirrorPad", family=FAMILY, infer=_infer_mirror_pad,
    reference=lambda attrs, x: np.pad(x, attrs["paddings"], mode=attrs["mode"].lower()),
    grad=lambda node, dys: [apply("MirrorPadGrad", [upstream(dys)], node.attrs, name="mirror_pad_grad")],
    kernels={"cpu": lambda node, ctx: k.mirror_pad(node.attrs["paddings"], node.attrs["mode"]),
             "cuda": _cuda("mirror_pad_op")},
))  # fmt: skip
register_op(OpDef(
    name="MirrorPadGrad", family=FAMILY, infer=_infer_mirror_pad_grad,
    reference=lambda attrs, g: k.mirror_fold(g, attrs["paddings"], attrs["mode"]),
    grad=lambda node, dys: [apply("MirrorPad", [upstream(dys)], node.attrs, name="mirror_pad")],
    kernels={"cpu": lambda node, ctx: k.mirror_pad_grad(node.attrs["paddings"], node.attrs["mode"]),
             "cuda": _cuda("mirror_pad_grad_op")},
))  # fmt: skip


def mirror_pad(x: Tensor, paddings: tuple[tuple[int, ...], ...], mode: str, name: str) -> Tensor:
    """``cg.pad`` in REFLECT or SYMMETRIC mode (``mode`` already checked)."""
    return apply("MirrorPad", [x], {"paddings": paddings, "mode": mode}, name=name)


# ------------------------------------------- space_to_depth, depth_to_space
# Both are one Transpose (one copy) between two Reshapes (views): the same work
# an op of their own would do. The batch dim may be unknown when building;
# the others must be known, since the reshapes split and join them.
def _nhwc(x: Tensor, block_size: int, op: str) -> tuple[int, int, int, int]:
    if len(x.shape) != 4:
        raise ShapeError(f"{op} needs an NHWC tensor of rank 4: {x.name!r} has shape {fmt(x.shape)}")
    if operator.index(block_size) < 2:
        raise ShapeError(f"{op}: block_size must be at least 2, got {block_size}")
    n, h, w, c = x.shape
    if h is None or w is None or c is None:
        raise ShapeError(f"{op} of {x.name!r} {fmt(x.shape)}: height, width and channels must be known when building")
    return -1 if n is None else n, h, w, c


def space_to_depth(x: TensorLike, block_size: int, name: str = "space_to_depth") -> Tensor:
    """Each ``block_size`` x ``block_size`` block of an NHWC tensor moved into the channels
    (``tf.nn.space_to_depth``): (N, H, W, C) -> (N, H / b, W / b, b * b * C).

    Examples
    --------
    >>> import cellgraph as cg
    >>> g = cg.Graph()
    >>> with g.as_default():
    ...     x = cg.placeholder((None, 8, 8, 3), name="x")
    ...     y = cg.space_to_depth(x, 2)
    >>> y.shape
    (None, 4, 4, 12)
    """
    t = as_tensor(x)
    n, h, w, c = _nhwc(t, block_size, "space_to_depth")
    b = block_size
    if h % b or w % b:
        raise ShapeError(f"space_to_depth of {t.name!r} {fmt(t.shape)}: height and width must divide by block_size {b}")
    blocks = reshape(t, (n, h // b, b, w // b, b, c), name=f"{name}_split")
    moved = transpose(blocks, (0, 1, 3, 2, 4, 5), name=f"{name}_move")
    return reshape(moved, (n, h // b, w // b, b * b * c), name=name)


def depth_to_space(x: TensorLike, block_size: int, name: str = "depth_to_space") -> Tensor:
    """The inverse of :func:`space_to_depth` (``tf.nn.depth_to_space``, DCR order):
    (N, H, W, b * b * C) -> (N, H * b, W * b, C)."""
    t = as_tensor(x)
    n, h, w, c = _nhwc(t, block_size, "depth_to_space")
    b = block_size
    if c % (b * b):
        raise ShapeError(f"depth_to_space of {t.name!r} {fmt(t.shape)}: channels must divide by block_size^2 = {b * b}")
    blocks = reshape(t, (n, h, w, b, b, c // (b * b)), name=f"{name}_split")
    moved = transpose(blocks, (0, 1, 3, 2, 4, 5), name=f"{name}_move")
    return reshape(moved, (n, h * b, w * b, c // (b * b)), name=name)


# ---------------------------------------------------------------- reverse
def reverse(x: TensorLike, axis: int | Sequence[int], name: str = "reverse") -> Tensor:
    """``x`` with the order of its elements reversed along each axis in ``axis`` (``tf.reverse``).

    One StridedSlice with step -1 on those axes: the slice kernels read
    through negative strides, and its gradient is the slice gradient.
    """
    t = as_tensor(x)
    rank = len(t.shape)
    axes = [_axis(a, rank, "reverse") for a in _ints(axis, "axis", "reverse")]
    if len(set(axes)) != len(axes):
        raise ShapeError(f"reverse: axis {tuple(axes)} names an axis twice (as non-negative axes)")
    key = tuple(builtins.slice(None, None, -1) if i in axes else builtins.slice(None) for i in range(rank))
    return getitem(t, key, name=name)


__all__ = ["broadcast_to", "depth_to_space", "reverse", "space_to_depth", "split", "stack", "tile", "unstack"]
