"""Kernels of ``ops/array_shape.py``: shape, size and range.

Shape and Size read only the input's metadata. Range's length is known only
from its operands' values, so it is checked and computed here, with the words
its errors use on every device (``range_length``).

Examples
--------
>>> range_length(2, 11, 3), range_length(5, -4, -2), range_length(0.0, 1.0, 0.3)
(3, 5, 4)
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np


def range_length(start: Any, limit: Any, delta: Any) -> int:
    """The number of elements ``start, start + delta, ...`` short of ``limit``, or a ValueError."""
    if delta == 0:
        raise ValueError(f"range from {start} to {limit}: delta must not be 0")
    if (delta > 0 and start > limit) or (delta < 0 and start < limit):
        sign = "<=" if delta > 0 else ">="
        raise ValueError(
            f"range from {start} to {limit} by {delta}: start must be {sign} limit when delta is "
            f"{'positive' if delta > 0 else 'negative'}"
        )
    if (
        isinstance(start, (int, np.integer))
        and isinstance(limit, (int, np.integer))
        and isinstance(delta, (int, np.integer))
    ):
        return (abs(int(limit) - int(start)) + abs(int(delta)) - 1) // abs(int(delta))  # exact for ints
    return math.ceil((limit - start) / delta)


def shape(dtype: str) -> Any:
    return lambda x: np.array(x.shape, dtype)


def size(dtype: str) -> Any:
    return lambda x: np.array(x.size, dtype)


def range_(start: np.ndarray, limit: np.ndarray, delta: np.ndarray) -> np.ndarray:
    s, d = start.item(), delta.item()
    n = range_length(s, limit.item(), d)
    # start + i * delta, as the CUDA kernel computes it (np.arange's own float steps may differ in the last bit).
    return np.asarray(s + np.arange(n, dtype=start.dtype) * np.asarray(d, start.dtype), start.dtype)
