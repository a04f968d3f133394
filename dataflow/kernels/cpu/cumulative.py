"""Kernels of ``ops/cumulative.py``: cumulative sum and product along one axis, and
the cumulative product's gradient.

The input is viewed as (outer, n, inner) with the scanned axis in the middle,
so the loop walks the axis in its outer position and the contiguous inner
dim in its innermost loop, which keeps every pass over memory sequential.
Each output element is written from the one before it along the axis (read
back from the output), so the accumulator has the tensor's own dtype, as
TensorFlow's has.

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


def lines(shape: tuple[int, ...], axis: int) -> tuple[int, int, int]:
    """(outer, n, inner): ``shape`` seen as the dims before ``axis``, ``axis``, the dims after."""
    outer = int(np.prod(shape[:axis], dtype=np.int64))
    inner = int(np.prod(shape[axis + 1 :], dtype=np.int64))
    return outer, shape[axis], inner


@kernel
def _scan(x, out, product, exclusive, reverse):  # type: ignore[no-untyped-def]
    outer, n, inner = x.shape
    for o in range(outer):
        for t in range(n):
            j = n - 1 - t if reverse else t
            p = j + 1 if reverse else j - 1  # the step before along the scan
            for i in range(inner):
                if t == 0:
                    out[o, j, i] = (1 if product else 0) if exclusive else x[o, j, i]
                else:
                    v = x[o, p, i] if exclusive else x[o, j, i]
                    out[o, j, i] = out[o, p, i] * v if product else out[o, p, i] + v


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
        _scan(x.reshape(lines(x.shape, axis)), out.reshape(lines(x.shape, axis)), product, exclusive, reverse)
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
