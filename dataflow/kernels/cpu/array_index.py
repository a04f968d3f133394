"""Kernels of ``ops/array_index.py``: gather_nd and scatter_nd.

Both see the indices as ``(m, k)`` rows, each the coordinates of one slice of
``inner`` elements in a block of ``k`` leading dims: gather_nd reads the rows
with NumPy's fancy indexing (a C loop), scatter_nd adds into them in a Numba
loop (``np.add.at`` is an unbuffered Python-level ufunc loop, many times slower).
Indices are checked first: TensorFlow's range is [0, dim), where NumPy would
wrap a negative index around.

Examples
--------
>>> import numpy as np
>>> gather_nd(np.arange(6).reshape(2, 3), np.array([[1, 2], [0, 0]]))
array([5, 0])
>>> scatter_nd(np.array([[1], [1]]), np.array([2.0, 3.0]), (3,))
array([0., 5., 0.])
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

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


# TensorScatterReduce's reductions, by the code its loops take.
REDUCTIONS = {"max": 0, "min": 1, "mul": 2}


@kernel
def _reduce_rows(rows, updates, out, dims, mode):  # type: ignore[no-untyped-def]
    """Each row's update (m, inner) folded into out (prod(dims), inner) by max, min or product, in row order."""
    for r in range(rows.shape[0]):
        flat = 0
        for j in range(rows.shape[1]):
            flat = flat * dims[j] + rows[r, j]
        for i in range(updates.shape[1]):
            u, v = updates[r, i], out[flat, i]
            # A NaN on either side wins, as in np.maximum and torch's scatter_reduce("amax"): max(v, u) kept
            # a NaN only when it was already there.
            if mode == 0:
                out[flat, i] = u if u > v or u != u else v
            elif mode == 1:
                out[flat, i] = u if u < v or u != u else v
            else:
                out[flat, i] = v * u


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


# ------------------------------------------- gather with batch_dims (BatchGather)
@kernel
def _batch_gather(params, indices, out):  # type: ignore[no-untyped-def]
    """out (b, pre, m, post) = params (b, pre, n, post) at indices (b, m), batch by batch;
    returns the flat position of the first index outside [0, n), or -1."""
    b, pre, n, post = params.shape
    m = indices.shape[1]
    for i in range(b):
        for j in range(m):
            if indices[i, j] < 0 or indices[i, j] >= n:
                return i * m + j
    for i in range(b):
        for p in range(pre):
            for j in range(m):
                k = indices[i, j]
                for q in range(post):
                    out[i, p, j, q] = params[i, p, k, q]
    return -1


@kernel
def _batch_scatter_add(updates, indices, out):  # type: ignore[no-untyped-def]
    """updates (b, pre, m, post) summed into out (b, pre, n, post) zeros at indices (b, m)."""
    b, pre, n, post = out.shape
    m = indices.shape[1]
    for i in range(b):
        for j in range(m):
            if indices[i, j] < 0 or indices[i, j] >= n:
                return i * m + j
    for i in range(b):
        for p in range(pre):
            for j in range(m):
                k = indices[i, j]
                for q in range(post):
                    out[i, p, k, q] += updates[i, p, j, q]
    return -1


def batch_blocks(shape: tuple[int, ...], batch_dims: int, axis: int) -> tuple[int, int, int, int]:
    """``(b, pre, n, post)``: ``shape`` seen as batch dims, dims up to ``axis``, ``axis``, the rest."""
    return (
        math.prod(shape[:batch_dims]), math.prod(shape[batch_dims:axis]), shape[axis], math.prod(shape[axis + 1 :])
    )  # fmt: skip


def batch_gather_shape(
    params: tuple[Any, ...], indices: tuple[Any, ...], batch_dims: int, axis: int
) -> tuple[Any, ...]:
    """The result's shape (dims may be None: the shape rule asks too)."""
    return params[:axis] + indices[batch_dims:] + params[axis + 1 :]


def bad_batch_index(indices: np.ndarray, flat: int, n: int, axis: int, what: str) -> IndexError:
    where = tuple(int(i) for i in np.unravel_index(flat, indices.shape))
    value = int(indices.reshape(-1)[flat])
    return IndexError(f"index {value} (at {where} in indices) is out of range [0, {n}) for axis {axis} of {what}")


def batch_gather(batch_dims: int, axis: int) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    def run(params: np.ndarray, indices: np.ndarray) -> np.ndarray:
        b, pre, n, post = batch_blocks(params.shape, batch_dims, axis)
        if indices.shape[:batch_dims] != params.shape[:batch_dims]:
            raise ValueError(f"batch dims of params {params.shape} and indices {indices.shape} differ")
        idx = contiguous(indices).reshape(b, -1) if b else np.zeros((0, 0), indices.dtype)
        out = np.empty(batch_gather_shape(params.shape, indices.shape, batch_dims, axis), params.dtype)
        bad = _batch_gather(contiguous(params).reshape(b, pre, n, post), idx, out.reshape(b, pre, idx.shape[1], post))
        if bad >= 0:
            raise bad_batch_index(indices, bad, n, axis, f"params {params.shape}")
        return out

    return run


def batch_gather_grad(batch_dims: int, axis: int) -> Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]:
    """The sum of ``updates`` at ``indices`` (batch by batch) into zeros shaped like ``like``."""

    def run(updates: np.ndarray, indices: np.ndarray, like: np.ndarray) -> np.ndarray:
        b, pre, n, post = batch_blocks(like.shape, batch_dims, axis)
        idx = contiguous(indices).reshape(b, -1) if b else np.zeros((0, 0), indices.dtype)
        out = np.zeros(like.shape, updates.dtype)
        flat_updates = contiguous(updates).reshape(b, pre, idx.shape[1], post)
        bad = _batch_scatter_add(flat_updates, idx, out.reshape(b, pre, n, post))
        if bad >= 0:
            raise bad_batch_index(indices, bad, n, axis, f"output {like.shape}")
        return out

    return run


def tensor_scatter_reduce(reduction: str) -> Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]:
    """``data`` with each row's update folded in by ``reduction`` (max, min or mul)."""
    mode = REDUCTIONS[reduction]

    def run(data: np.ndarray, indices: np.ndarray, updates: np.ndarray) -> np.ndarray:
        k = indices.shape[-1]
        rows = as_rows(indices)
        dims = np.asarray(data.shape[:k], np.int64)
        bad = _first_bad_row(rows, dims)
        if bad >= 0:
            raise bad_row_error(indices, rows, bad, data.shape, "tensor")
        inner = math.prod(data.shape[k:])
        out = np.array(data, order="C")
        flat_out = out.reshape(math.prod(data.shape[:k]), inner)  # counted: inner may be 0
        _reduce_rows(rows, contiguous(updates).reshape(rows.shape[0], inner), flat_out, dims, mode)
        return out

    return run
