"""Matrix multiply on the GPU: the register-blocked GEMM of ``gemm.py`` over plain matrices.

``op(a) @ op(b)``, ``op`` transposing where the node asks: the transpose is
never formed, only the index functions change, and with them which dimension a
warp's loads walk (the operand's contiguous one, so loads stay coalesced).
Both operands and the output are C-contiguous, as every CUDA kernel's outputs
and the plans' feeds are (``kernels/cuda/__init__.py``); ``geo`` is
``(m, n, k)``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from numba import cuda

from . import flat
from .gemm import Operand, Tiles, gemm


@cuda.jit(device=True, inline=True)
def _row_major_a(i, kk, geo):  # type: ignore[no-untyped-def]
    return i * geo[2] + kk  # a is (m, k)


@cuda.jit(device=True, inline=True)
def _transposed_a(i, kk, geo):  # type: ignore[no-untyped-def]
    return kk * geo[0] + i  # a is (k, m)


@cuda.jit(device=True, inline=True)
def _row_major_b(j, kk, geo):  # type: ignore[no-untyped-def]
    return kk * geo[1] + j  # b is (k, n)


@cuda.jit(device=True, inline=True)
def _transposed_b(j, kk, geo):  # type: ignore[no-untyped-def]
    return j * geo[2] + kk  # b is (n, k)


def matmul(a: Any, b: Any, transpose_a: bool, transpose_b: bool, tiles: Tiles | None = None) -> Any:
    """``op(a) @ op(b)`` for C-contiguous device matrices; ``tiles`` as ``gemm.choose_tiles`` picks them by default."""
    m, k = (a.shape[1], a.shape[0]) if transpose_a else a.shape
    n = b.shape[0] if transpose_b else b.shape[1]
    out = cuda.device_array((m, n), a.dtype)
    left = Operand(flat(a), _transposed_a if transpose_a else _row_major_a, fast=transpose_a)
    right = Operand(flat(b), _transposed_b if transpose_b else _row_major_b, fast=not transpose_b)
    return gemm(left, right, out, k, (m, n, k), tiles)


def batched_matmul(a: Any, b: Any, a_ids: np.ndarray, b_ids: np.ndarray, transpose_a: bool, transpose_b: bool) -> Any:
    """``op(a[a_ids[z]]) @ op(b[b_ids[z]])`` for every ``z``, in one launch: a ``(len(a_ids), m, n)`` stack.

    ``a`` and ``b`` are C-contiguous stacks of matrices; the ids (host integer
    arrays) say which matrix of each stack every product reads, so an operand
    broadcast over the batch is read in place, never copied.
    """
    m, k = (a.shape[2], a.shape[1]) if transpose_a else a.shape[1:]
    n = b.shape[1] if transpose_b else b.shape[2]
    out = cuda.device_array((len(a_ids), m, n), a.dtype)
    left = Operand(flat(a), _transposed_a if transpose_a else _row_major_a, fast=transpose_a)
    right = Operand(flat(b), _transposed_b if transpose_b else _row_major_b, fast=not transpose_b)
    starts = tuple(
        cuda.to_device(np.asarray(ids, np.int64) * (x.shape[1] * x.shape[2])) for x, ids in ((a, a_ids), (b, b_ids))
    )
    return gemm(left, right, out, k, (m, n, k), starts=starts)


def matmul_op(node: Any, ctx: Any) -> Callable[[Any, Any], Any]:
    ta, tb = node.attrs["transpose_a"], node.attrs["transpose_b"]
    return lambda a, b: matmul(a, b, ta, tb)
