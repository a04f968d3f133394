"""Batched matrix multiply: ``matmul`` of operands of rank >= 3, batch dims broadcast.

``matmul(a, b)`` with two matrices is a MatMul node (``math.py``); with
either operand of higher rank it is a BatchMatMul: the last two dims of each
operand are its matrices (transposed by ``transpose_a`` / ``transpose_b``),
the dims before them are batch dims that broadcast as NumPy's do, so
``(batch, heads, t, d) @ (batch, heads, d, t)`` and ``(batch, t, d) @ (d, e)``
both work. The gradient of an operand whose batch was broadcast is summed back
over the broadcast dims, to the operand's own shape.

>>> import cellgraph as cg
>>> import numpy as np
>>> q = cg.constant(np.ones((2, 3, 4), np.float32))
>>> k = cg.constant(np.ones((2, 5, 4), np.float32))
>>> scores = cg.matmul(q, k, transpose_b=True)
>>> scores.shape
(2, 3, 5)
>>> w = cg.constant(np.full((4, 6), 0.5, np.float32))
>>> cg.Session().run(q @ w)[1, 2]
array([2., 2., 2., 2., 2., 2.], dtype=float32)
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..graph import Node, Tensor
from ..kernels.cpu.batch_matmul import batch_matmul as batch_matmul_kernel
from ..kernels.cuda import cuda_kernel
from ..opdef import InferContext, OpDef, TensorSpec, register_op
from ..shapes import broadcast, fmt
from .array import reshape
from .base import TensorLike, apply, binary_inputs
from .math import matmul, sum_to_shape_of

FAMILY = "math"
Dys = list[Tensor | None]


def _infer(ctx: InferContext) -> TensorSpec:
    a, b = ctx.inputs
    ta, tb = ctx.attrs["transpose_a"], ctx.attrs["transpose_b"]
    both = f"{fmt(a.shape)} @ {fmt(b.shape)}"
    flags = "".join(f", {f}=True" for f, on in (("transpose_a", ta), ("transpose_b", tb)) if on)
    if a.dtype != b.dtype:
        raise ctx.dtype_error(f"operands have different dtypes: {a.dtype} and {b.dtype}")
    if a.rank < 2 or b.rank < 2:
        raise ctx.shape_error(
            f"expects operands of rank 2 or more (batches of matrices), got ranks {a.rank} and {b.rank}: {both}"
        )
    batch = broadcast(a.shape[:-2], b.shape[:-2])
    if batch is None:
        raise ctx.shape_error(
            f"batch dimensions do not broadcast: {fmt(a.shape[:-2])} and {fmt(b.shape[:-2])} in {both}"
        )
    m, k1 = a.shape[-2:][::-1] if ta else a.shape[-2:]
    k2, n = b.shape[-2:][::-1] if tb else b.shape[-2:]
    if k1 is not None and k2 is not None and k1 != k2:
        raise ctx.shape_error(f"inner dimensions differ: {k1} and {k2} in {both}{flags}")
    return TensorSpec((*batch, m, n), a.dtype)


def _reference(attrs: dict[str, Any], a: np.ndarray, b: np.ndarray) -> np.ndarray:
    left = np.swapaxes(a, -1, -2) if attrs["transpose_a"] else a
    right = np.swapaxes(b, -1, -2) if attrs["transpose_b"] else b
    return np.asarray(np.matmul(left, right), a.dtype)


def _grad(node: Node, dys: Dys) -> list[Tensor | None]:
    g, (a, b) = dys[0], node.inputs
    assert g is not None
    ta, tb = node.attrs["transpose_a"], node.attrs["transpose_b"]
    # The 2-D rule, matrix by matrix; then each operand's gradient summed over
    # the batch dims broadcasting gave it (SumToShapeOf reads its run-time shape).
    da = batch_matmul(b, g, transpose_a=tb, transpose_b=True) if ta else batch_matmul(g, b, transpose_b=not tb)
    k, n = a.shape[-1], g.shape[-1]
    if len(b.shape) == 2 and not ta and k is not None and n is not None:
        # A matrix shared by the whole batch ((batch, t, d) @ (d, e), a dense layer): its gradient
        # is one GEMM over the batch seen as rows, not one product per matrix summed afterwards.
        a2, g2 = reshape(a, (-1, k)), reshape(g, (-1, n))
        return [sum_to_shape_of(da, a), matmul(g2, a2, transpose_a=True) if tb else matmul(a2, g2, transpose_a=True)]
    db = batch_matmul(g, a, transpose_a=True, transpose_b=ta) if tb else batch_matmul(a, g, transpose_a=not ta)
    return [sum_to_shape_of(da, a), sum_to_shape_of(db, b)]


register_op(OpDef(
    name="BatchMatMul", family=FAMILY, infer=_infer, reference=_reference, grad=_grad,
    kernels={
        "cpu": lambda node, ctx: batch_matmul_kernel(node.attrs["transpose_a"], node.attrs["transpose_b"]),
        "cuda": cuda_kernel("batch_matmul", "batch_matmul_op"),
    },
))  # fmt: skip


def batch_matmul(
    a: TensorLike, b: TensorLike, transpose_a: bool = False, transpose_b: bool = False, name: str = "matmul"
) -> Tensor:
    """``op(a) @ op(b)`` over the last two dims, the dims before them broadcast (``np.matmul``).

    ``cg.matmul`` and ``@`` come here when either operand has rank other than 2.
    """
    attrs = {"transpose_a": bool(transpose_a), "transpose_b": bool(transpose_b)}
    return apply("BatchMatMul", binary_inputs(a, b, "BatchMatMul"), attrs, name=name)


__all__ = ["batch_matmul"]
