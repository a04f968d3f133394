"""Kernel of ``ops/top_k.py``: the k largest entries of each row (the last axis).

Each row is sorted once, stably, with the row reversed going in and the
order reversed coming out: that lists the entries from largest to smallest
with ties in ascending index order (TensorFlow's rule) for floats and ints
alike, with no negation (which would overflow the most negative int). NaN
sorts as the largest value, as in NumPy. O(n log n) per row.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from . import kernel


@kernel
def _top_k(x, values, indices, k):  # type: ignore[no-untyped-def]
    rows, n = x.shape
    for r in range(rows):
        order = np.argsort(x[r, ::-1], kind="mergesort")
        for t in range(k):
            j = n - 1 - order[n - 1 - t]
            indices[r, t] = j
            values[r, t] = x[r, j]


def top_k(k: int) -> Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]:
    def run(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        n = x.shape[-1]
        if k > n:
            raise ValueError(f"k = {k} is more than the {n} entries of the last axis of {x.shape}")
        rows = int(np.prod(x.shape[:-1], dtype=np.int64))
        values = np.empty((*x.shape[:-1], k), x.dtype)
        indices = np.empty((*x.shape[:-1], k), np.int32)
        if values.size:
            _top_k(np.ascontiguousarray(x).reshape(rows, n), values.reshape(rows, k), indices.reshape(rows, k), k)
        return values, indices

    return run
