"""Batched matrix multiply on the GPU: the GEMM of ``matmul.py``, one launch for the whole batch.

Each matrix of the broadcast batch reads its operands' matrices through the
same index maps the CPU kernel uses (``kernels/cpu/batch_matmul.py``), so a
broadcast operand is never copied; the product is written into its slot of
the output. When ``b`` has no batch dims and ``a`` is not transposed, ``a`` is
one tall matrix and the batch is a single GEMM.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from ..cpu.batch_matmul import batch_index
from .elementwise import fill
from .matmul import batched_matmul, matmul


def batch_matmul(a: Any, b: Any, transpose_a: bool, transpose_b: bool) -> Any:
    """``op(a) @ op(b)`` over the last two dims of C-contiguous device arrays, batch dims broadcast."""
    a_shape, b_shape = tuple(a.shape), tuple(b.shape)
    full = _broadcast(a_shape[:-2], b_shape[:-2])
    m = a_shape[-1] if transpose_a else a_shape[-2]
    k = a_shape[-2] if transpose_a else a_shape[-1]
    n = b_shape[-2] if transpose_b else b_shape[-1]
    shape = (*full, m, n)
    if math.prod(shape) == 0 or k == 0:
        return fill(shape, a.dtype, 0)
    if len(b_shape) == 2 and not transpose_a:
        return matmul(a.reshape(math.prod(a_shape[:-1]), k), b, False, transpose_b).reshape(shape)
    a3 = a.reshape(math.prod(a_shape[:-2]), *a_shape[-2:])
    b3 = b.reshape(math.prod(b_shape[:-2]), *b_shape[-2:])
    ia, ib = batch_index(a_shape[:-2], full), batch_index(b_shape[:-2], full)
    return batched_matmul(a3, b3, ia, ib, transpose_a, transpose_b).reshape(shape)


def _broadcast(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    rank = max(len(a), len(b))
    a, b = (1,) * (rank - len(a)) + a, (1,) * (rank - len(b)) + b
    return tuple(y if x == 1 else x for x, y in zip(a, b))


def batch_matmul_op(node: Any, ctx: Any) -> Callable[[Any, Any], Any]:
    ta, tb = node.attrs["transpose_a"], node.attrs["transpose_b"]
    return lambda a, b: batch_matmul(a, b, ta, tb)
