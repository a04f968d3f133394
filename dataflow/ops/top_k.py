"""``top_k``: the k largest entries along the last axis and their positions, as
``tf.math.top_k`` (sorted, largest first, ties by lower index).

TopK is one op with two outputs, values and int32 indices. Its gradient
sends each value's upstream gradient back to the position it came from:
that is the gradient of a batched gather along the last axis at those
indices, so the rule is one BatchGatherGrad (``array_index.py``), and the
indices output has none. NaN ranks above every number (NumPy's sort order).

>>> import cellgraph as cg
>>> import numpy as np
>>> values, indices = cg.top_k(cg.constant(np.array([[1.0, 3.0, 2.0, 3.0]], np.float32)), k=2)
>>> cg.Session().run([values, indices])
[array([[3., 3.]], dtype=float32), array([[1, 3]], dtype=int32)]
"""

from __future__ import annotations

import operator
from typing import Any

import numpy as np

from ..dtypes import FLOATS, INTS
from ..errors import ShapeError
from ..graph import Node, Tensor
from ..kernels.cpu import top_k as k
from ..kernels.cuda import cuda_kernel
from ..opdef import InferContext, OpDef, TensorSpec, register_op
from ..shapes import fmt
from .base import TensorLike, apply, apply_node, as_tensor

__all__ = ["top_k"]


def _infer_top_k(ctx: InferContext) -> list[TensorSpec]:
    x, count = ctx.inputs[0], ctx.attrs["k"]
    if x.dtype not in FLOATS | INTS:
        raise ctx.dtype_error(f"expects a float or int tensor, got {x.dtype}")
    if x.rank < 1:
        raise ctx.shape_error(f"needs a tensor of rank >= 1, got {fmt(x.shape)}")
    n = x.shape[-1]
    if count < 0 or (n is not None and count > n):
        raise ctx.shape_error(f"k = {count} is outside [0, {n}], the last axis of {fmt(x.shape)}")
    shape = (*x.shape[:-1], count)
    return [TensorSpec(shape, x.dtype), TensorSpec(shape, "int32")]


def _ref_top_k(attrs: dict[str, Any], x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    count, n = attrs["k"], x.shape[-1]
    if count > n:
        raise ValueError(f"k = {count} is more than the {n} entries of the last axis of {x.shape}")
    # Stable descending order with ties by lower index: sort the reversed row, read backwards.
    order = n - 1 - np.argsort(x[..., ::-1], axis=-1, kind="stable")[..., ::-1]
    indices = order[..., :count].astype(np.int32)
    return np.take_along_axis(x, indices.astype(np.int64), -1), indices


def _grad_top_k(node: Node, dys: list[Tensor | None]) -> list[Tensor | None]:
    dy = dys[0]
    if dy is None:
        return [None]
    last = len(node.inputs[0].shape) - 1
    attrs = {"axis": last, "batch_dims": last}
    return [apply("BatchGatherGrad", [dy, node.outputs[1], node.inputs[0]], attrs, name="top_k_grad")]


register_op(OpDef(
    name="TopK", family="array", infer=_infer_top_k, reference=_ref_top_k, grad=_grad_top_k,
    kernels={"cpu": lambda node, ctx: k.top_k(node.attrs["k"]), "cuda": cuda_kernel("top_k", "top_k_op")},
))  # fmt: skip


def top_k(x: TensorLike, k: int = 1, sorted: bool = True, name: str = "top_k") -> tuple[Tensor, Tensor]:  # noqa: A002
    """The ``k`` largest entries along the last axis, and their int32 indices.

    Parameters
    ----------
    x : TensorLike
        A float or int tensor of rank >= 1.
    k : int
        How many entries to keep, in [0, last dim].
    sorted : bool
        Must be True: the entries always come largest first (as TensorFlow's
        ``sorted=True``); ``False`` is refused rather than silently ignored.

    Examples
    --------
    >>> import cellgraph as cg
    >>> import numpy as np
    >>> logits = cg.constant(np.array([[0.1, 0.7, 0.2], [0.5, 0.4, 0.9]], np.float32))
    >>> cg.Session().run(cg.top_k(logits, k=2)[1])
    array([[1, 2],
           [2, 0]], dtype=int32)
    """
    try:
        count = operator.index(k)
    except TypeError:
        raise ShapeError(f"{name}: k must be an int, got {k!r}") from None
    if sorted is not True:
        raise ShapeError(f"{name}: sorted={sorted!r} is not supported; the entries always come largest first")
    node = apply_node("TopK", [as_tensor(x)], {"k": count}, name=name)
    return node.outputs[0], node.outputs[1]
