"""Kernels of ``ops/array_index.py``: gather_nd and scatter_nd.

Both see the indices as ``(m, k)`` rows, each the coordinates of one slice of
``inner`` elements in a block of ``k`` leading dims: gather_nd reads the rows
with NumPy's fancy indexing (a C loop), scatter_nd adds into them in a Numba
loop (``np.add.at`` is an unbuffered Python-level ufunc loop, many times slower).
Indices are checked first: TensorFlow's range is [0, dim), where NumPy would
wrap a negative index around.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from . import kernel
from .array import contiguous


@kernel
def _first_bad_row(rows, dims):  # type: ignore[no-untyped-def]
    """The first row of ``rows`` (m, k) with a coordinate outside [0, dims[j]), or -1."""
    for r in range(rows.shape[0]):
        for j in range(rows.shape[1]):
            if rows[r, j] < 0 or rows[r, j] >= dims[j]:
                return r
    return -1


@kernel
def _scatter_rows(rows, updates, out, dims):  # type: ignore[no-untyped-def]
    """updates (m, inner) summed into out (prod(dims), inner) at the flat positions of ``rows``."""
    for r in range(rows.shape[0]):
        flat = 0
        for j in range(rows.shape[1]):
            flat = flat * dims[j] + rows[r, j]
        for i in range(updates.shape[1]):
            out[flat, i] += updates[r, i]


def bad_row_error(indices: np.ndarray, rows: np.ndarray, bad: int, shape: tuple[int, ...], what: str) -> IndexError:
    """The error for row ``bad`` of ``indices`` (seen as ``rows``): it names the row and its coordinates."""
    where = tuple(int(i) for i in np.unravel_index(bad, indices.shape[:-1])) if indices.ndim > 1 else ()
    coords = [int(c) for c in rows[bad]]
    return IndexError(f"indices{list(where)} = {coords} does not index into {what} {tuple(shape)}")


def as_rows(indices: np.ndarray) -> np.ndarray:
    """``indices`` (..., k) as (m, k) rows; k may be 0, so m is counted, not inferred."""
    return contiguous(indices).reshape(math.prod(indices.shape[:-1]), indices.shape[-1])


def gather_nd(params: np.ndarray, indices: np.ndarray) -> np.ndarray:
    k = indices.shape[-1]
    rows = as_rows(indices)
    dims = np.asarray(params.shape[:k], np.int64)
    bad = _first_bad_row(rows, dims)
    if bad >= 0:
        raise bad_row_error(indices, rows, bad, params.shape, "params")
    picked = params[tuple(rows.T)] if k else np.broadcast_to(params, (rows.shape[0], *params.shape))
    return np.array(picked.reshape(indices.shape[:-1] + params.shape[k:]), order="C")


def scatter_nd(indices: np.ndarray, updates: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    k = indices.shape[-1]
    rows = as_rows(indices)
    dims = np.asarray(shape[:k], np.int64)
    bad = _first_bad_row(rows, dims)
    if bad >= 0:
        raise bad_row_error(indices, rows, bad, shape, "output")
    inner = math.prod(shape[k:])
    out = np.zeros((math.prod(shape[:k]), inner), updates.dtype)
    _scatter_rows(rows, contiguous(updates).reshape(rows.shape[0], inner), out, dims)
    return out.reshape(shape)


def scatter_nd_op(shape: tuple[int, ...]) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    return lambda indices, updates: scatter_nd(indices, updates, shape)


def scatter_nd_like(indices: np.ndarray, updates: np.ndarray, like: np.ndarray) -> np.ndarray:
    return scatter_nd(indices, updates, like.shape)
