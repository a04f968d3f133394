"""CUDA kernel of ``ops/top_k.py``: one thread per row, k passes over it.

Pass t finds the best entry that ranks below pass t-1's pick in the order
(value descending, NaN first, ties by ascending index), so no scratch memory
or marks are needed and the picks equal the CPU kernel's sort. O(n k) per
row: right for the small k of a top-k (beam search, accuracy@k); a full sort
wants a parallel sort instead.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
from numba import cuda

from . import launch


@cuda.jit(device=True)
def _before(a, i, b, j):  # type: ignore[no-untyped-def]
    """Whether entry (a, i) ranks before entry (b, j)."""
    a_nan, b_nan = a != a, b != b
    if a_nan or b_nan:
        return (a_nan and not b_nan) or (a_nan and b_nan and i < j)
    return a > b or (a == b and i < j)


@cuda.jit
def _top_k(x, values, indices, rows, n, k):  # type: ignore[no-untyped-def]
    r = cuda.grid(1)
    if r < rows:
        base = r * n
        prev = -1
        for t in range(k):
            best = -1
            for j in range(n):
                v = x[base + j]
                if prev >= 0 and not _before(x[base + prev], prev, v, j):
                    continue  # ranks at or before the last pick: taken already
                if best < 0 or _before(v, j, x[base + best], best):
                    best = j
            indices[r * k + t] = best
            values[r * k + t] = x[base + best]
            prev = best


def top_k_op(node: Any, ctx: Any) -> Callable[[Any], tuple[Any, Any]]:
    k = node.attrs["k"]

    def run(x: Any) -> tuple[Any, Any]:
        shape = tuple(x.shape)  # the simulator's shapes take no negative index
        n = shape[-1]
        if k > n:
            raise ValueError(f"k = {k} is more than the {n} entries of the last axis of {shape}")
        rows = math.prod(shape[:-1])
        values = cuda.device_array((*shape[:-1], k), x.dtype)
        indices = cuda.device_array((*shape[:-1], k), np.int32)
        if values.size:
            blocks, threads = launch(rows)
            _top_k[blocks, threads](
                x.reshape(rows * n), values.reshape(rows * k), indices.reshape(rows * k), rows, n, k
            )
        return values, indices

    return run
