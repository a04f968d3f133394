"""Kernels of ``ops/cumulative.py``: cumulative sum and product along one axis, and
the cumulative product's gradient.

The input is viewed as (outer, n, inner) with the scanned axis in the middle,
so the loop walks the axis in its outer position and the contiguous inner
dim in its innermost loop, which keeps every pass over memory sequential.
Each output element is the running total of one accumulator per line. For
float32 that accumulator is float64, as PyTorch's CPU cumsum and cumprod keep
it (``at::acc_type``): a float32 one, as TensorFlow keeps, stops counting at
2**24 (the cumulative sum of 2**25 float32 ones ended at 16777216); the sum
of 1e7 uniform numbers was off by 1e-5 relative. Other dtypes accumulate in
their own (integers wrap, as TensorFlow's and PyTorch's do).

The product's gradient avoids dividing by ``x`` (TensorFlow's rule, which
gives NaN at a zero): with P_t the exclusive product before step t, the
gradient at step t is P_t * S_t, where S_t sums the upstream gradient of
every later output times the factors between, built backwards as
S_t = dy_t + x_{t+1} S_{t+1} (inclusive) or S_t = dy_{t+1} + x_{t+1} S_{t+1}
(exclusive).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from . import kernel
from .reduce import accumulator


def lines(shape: tuple[int, ...], axis: int) -> tuple[int, int, int]:
    """(outer, n, inner): ``shape`` seen as the dims before ``axis``, ``axis``, the dims after."""
    outer = int(np.prod(shape[:axis], dtype=np.int64))
    inner = int(np.prod(shape[axis + 1 :], dtype=np.int64))
    return outer, shape[axis], inner


@kernel
def _scan(x, out, carry, product, exclusive, reverse):  # type: ignore[no-untyped-def]
    outer, n, inner = x.shape
    for o in range(outer):
        for t in range(n):
            j = n - 1 - t if reverse else t
            p = j + 1 if reverse else j - 1  # the step before along the scan
            for i in range(inner):
                if t == 0:
                    carry[i] = (1 if product else 0) if exclusive else x[o, j, i]
                else:
                    v = x[o, p, i] if exclusive else x[o, j, i]
                    carry[i] = carry[i] * v if product else carry[i] + v
                out[o, j, i] = carry[i]


@kernel
def _cumprod_grad(x, dy, out, exclusive, reverse):  # type: ignore[no-untyped-def]
    outer, n, inner = x.shape
    carry = np.empty(inner, x.dtype)
    for o in range(outer):
        # First pass: the exclusive product before each step.
        for t in range(n):
            j = n - 1 - t if reverse else t
            p = j + 1 if reverse else j - 1
            for i in range(inner):
                out[o, j, i] = 1 if t == 0 else out[o, p, i] * x[o, p, i]
        # Second pass, backwards: S_t, times the product before it.
        for t in range(n - 1, -1, -1):
            j = n - 1 - t if reverse else t
            q = j - 1 if reverse else j + 1  # the step after along the scan
            for i in range(inner):
                if t == n - 1:
                    carry[i] = 0 if exclusive else dy[o, j, i]
                elif exclusive:
                    carry[i] = dy[o, q, i] + x[o, q, i] * carry[i]
                else:
                    carry[i] = dy[o, j, i] + x[o, q, i] * carry[i]
                out[o, j, i] = out[o, j, i] * carry[i]


def scan(axis: int, product: bool, exclusive: bool, reverse: bool) -> Callable[[Any], np.ndarray]:
    def run(x: np.ndarray) -> np.ndarray:
        x = np.ascontiguousarray(x)
        out = np.empty_like(x)
        grid = lines(x.shape, axis)
        carry = np.empty(grid[2], accumulator(x.dtype))
        _scan(x.reshape(grid), out.reshape(grid), carry, product, exclusive, reverse)
        return out

    return run


def cumprod_grad(axis: int, exclusive: bool, reverse: bool) -> Callable[[Any, Any], np.ndarray]:
    def run(x: np.ndarray, dy: np.ndarray) -> np.ndarray:
        x, dy = np.ascontiguousarray(x), np.ascontiguousarray(dy)
        if x.shape != dy.shape:
            raise ValueError(f"gradient shape {dy.shape} is not the input's {x.shape}")
        out = np.empty_like(x)
        grid = lines(x.shape, axis)
        _cumprod_grad(x.reshape(grid), dy.reshape(grid), out.reshape(grid), exclusive, reverse)
        return out

    return run
