"""Matrix multiply as a tiled shared-memory kernel.

Each block computes a TILE x TILE tile of the output: it walks the inner
dimension one tile at a time, every thread loading one element of each
operand's tile into shared memory, so each element read from global memory
serves TILE multiply-adds. Transposed operands are loaded along their rows
(consecutive threads read consecutive addresses) and stored transposed into
shared memory, whose rows are padded by one to avoid bank conflicts.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import cache
from typing import Any

import numpy as np
from numba import cuda, from_dtype

TILE = 16
PADDED = TILE + 1  # a shared row; the shape of a shared array must be a constant


@cache
def _tiled_kernel(dtype: np.dtype) -> Any:
    acc_type = from_dtype(dtype)

    @cuda.jit
    def run(a, b, out, transpose_a, transpose_b):  # type: ignore[no-untyped-def]
        sa = cuda.shared.array((TILE, PADDED), acc_type)  # sa[row, k]
        sb = cuda.shared.array((TILE, PADDED), acc_type)  # sb[k, col]
        tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
        row0, col0 = cuda.blockIdx.y * TILE, cuda.blockIdx.x * TILE
        m, n = out.shape
        k = a.shape[0] if transpose_a else a.shape[1]
        acc = acc_type(0)
        for k0 in range(0, k, TILE):
            if transpose_a:  # a is (k, m): read a[k0 + ty, row0 + tx]
                inside = k0 + ty < k and row0 + tx < m
                sa[tx, ty] = a[k0 + ty, row0 + tx] if inside else acc_type(0)
            else:
                inside = row0 + ty < m and k0 + tx < k
                sa[ty, tx] = a[row0 + ty, k0 + tx] if inside else acc_type(0)
            if transpose_b:  # b is (n, k): read b[col0 + ty, k0 + tx]
                inside = col0 + ty < n and k0 + tx < k
                sb[tx, ty] = b[col0 + ty, k0 + tx] if inside else acc_type(0)
            else:
                inside = k0 + ty < k and col0 + tx < n
                sb[ty, tx] = b[k0 + ty, col0 + tx] if inside else acc_type(0)
            cuda.syncthreads()
            for j in range(TILE):
                acc += sa[ty, j] * sb[j, tx]
            cuda.syncthreads()
        if row0 + ty < m and col0 + tx < n:
            out[row0 + ty, col0 + tx] = acc

    return run


def matmul(a: Any, b: Any, transpose_a: bool, transpose_b: bool) -> Any:
    """``op(a) @ op(b)`` for device matrices, ``op`` transposing where asked."""
    m = a.shape[1] if transpose_a else a.shape[0]
    n = b.shape[0] if transpose_b else b.shape[1]
    out = cuda.device_array((m, n), a.dtype)
    if out.size:
        blocks = (math.ceil(n / TILE), math.ceil(m / TILE))
        _tiled_kernel(np.dtype(a.dtype))[blocks, (TILE, TILE)](a, b, out, transpose_a, transpose_b)
    return out


def matmul_op(node: Any, ctx: Any) -> Callable[[Any, Any], Any]:
    ta, tb = node.attrs["transpose_a"], node.attrs["transpose_b"]
    return lambda a, b: matmul(a, b, ta, tb)
