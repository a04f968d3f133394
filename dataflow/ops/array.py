"""Array ops: reshape, expand_dims, squeeze, transpose, concat (slicing, padding and indexing:
``array_slice.py``; gather and one-hot: ``array_gather.py``).

They move data without arithmetic, so their gradients move the upstream
gradient back: a reshape's is a reshape, a slice's pads, a concat's splits, a
gather's scatter-adds. A rule that needs an input's run-time shape (its static
one may have ``None`` dims) reads it from that input passed as a ``like``
operand, where TensorFlow would pass ``Shape(x)``; those ``*Like`` ops and
``StridedSliceGrad`` are internal, built by gradient rules (and a same-shape ``ReshapeLike`` by the losses,
metrics and layers that check a fed array against another's run-time shape).

Attrs are plain hashable values (ints, tuples, strings, bools, floats) so that
a GraphDef round-trips them; indexing uses TensorFlow's StridedSlice encoding.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from math import prod
from typing import Any

import numpy as np

from ..errors import DTypeError, ShapeError
from ..graph import Node, Tensor
from ..kernels.cpu import array as k
from ..kernels.cuda import cuda_kernel
from ..opdef import InferContext, KernelFactory, OpDef, TensorSpec, register_op
from ..shapes import fmt, num_elements
from .base import TensorLike, apply, apply_node, as_tensor, fits, graph_of, shapes_checked, upstream
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
    if ctx.attrs.get("same_shape"):
        if not fits(x.shape, like.shape):
            raise ctx.shape_error(f"{fmt(x.shape)} must have the shape of {fmt(like.shape)}")
        return TensorSpec(like.shape, x.dtype)
    n, m = num_elements(x.shape), num_elements(like.shape)
    if n is not None and m is not None and n != m:
        raise ctx.shape_error(f"cannot reshape {fmt(x.shape)} like {fmt(like.shape)}: {n} elements vs {m}")
    return TensorSpec(like.shape, x.dtype)


register_op(OpDef(
    name="Reshape", strings=True, family=FAMILY, infer=_infer_reshape,
    reference=lambda attrs, x: np.reshape(x, attrs["shape"]),
    grad=lambda node, dys: [reshape_like(upstream(dys), node.inputs[0])],
    kernels={"cpu": lambda node, ctx: k.reshape(node.attrs["shape"]), "cuda": _cuda("reshape_op")}, view=True,
))  # fmt: skip


def _same_shape_problem(node: Node, x: Any, like: Any) -> str | None:
    """A same-shape ReshapeLike's words when ``x`` is not shaped as ``like``: of the same size, a transposed
    (time, batch) mask passed the reshape and was read as (batch, time) without a word."""
    if tuple(x.shape) == tuple(like.shape):
        return None
    x_name, like_name = (t.name for t in node.inputs)
    return (
        f"{x_name!r} has shape {fmt(tuple(x.shape))} but must have the shape of {like_name!r}, {fmt(tuple(like.shape))}"
    )


def _reshape_like_kernel(factory: KernelFactory) -> KernelFactory:
    """``factory``'s reshape, for a same-shape ReshapeLike first checking the run-time shapes (not only sizes)."""
    checked = shapes_checked(factory, _same_shape_problem)
    return lambda node, ctx: (checked if node.attrs.get("same_shape") else factory)(node, ctx)


register_op(OpDef(
    name="ReshapeLike", family=FAMILY, infer=_infer_reshape_like,
    reference=lambda attrs, x, like: np.reshape(x, like.shape),
    grad=lambda node, dys: [reshape_like(upstream(dys), node.inputs[0]), None],
    kernels={"cpu": _reshape_like_kernel(lambda node, ctx: k.reshape_like),
             "cuda": _reshape_like_kernel(_cuda("reshape_like_op"))}, view=True,
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


def reshape_like(x: Tensor, like: Tensor, name: str = "reshape_like", same_shape: bool = False) -> Tensor:
    """``x`` reshaped to ``like``'s run-time shape (gradients of shape changes).

    With ``same_shape``, ``x`` must already have ``like``'s shape when the graph runs, or the run fails naming
    both: a check of a fed mask, weights or targets, where a same-size reshape would take a transposed
    (time, batch) array for (batch, time).
    """
    return apply("ReshapeLike", [x, like], {"same_shape": True} if same_shape else None, name=name)


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
    name="ExpandDims", strings=True, family=FAMILY, infer=_infer_expand_dims,
    reference=lambda attrs, x: np.expand_dims(x, attrs["axes"]),
    grad=lambda node, dys: [squeeze(upstream(dys), node.attrs["axes"])],
    kernels={"cpu": lambda node, ctx: lambda x, _a=node.attrs["axes"]: np.expand_dims(x, _a),
             "cuda": _cuda("expand_dims_op")}, view=True,
))  # fmt: skip
register_op(OpDef(
    name="Squeeze", strings=True, family=FAMILY, infer=_infer_squeeze,
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
    name="Transpose", strings=True, family=FAMILY, infer=_infer_transpose,
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
    name="Concat", strings=True, family=FAMILY, infer=_infer_concat,
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


__all__ = ["concat", "expand_dims", "reshape", "squeeze", "transpose"]
