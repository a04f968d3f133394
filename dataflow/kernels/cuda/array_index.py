"""CUDA kernels of ``ops/array_index.py``: gather_nd and scatter_nd.

One thread per element moved: thread ``i`` of GatherNd reads element ``i %
inner`` of the slice that row ``i // inner`` of the indices names; ScatterNd's
threads add their update element there, with atomic adds since rows may repeat
(floats then agree with the CPU loop to rounding). Thread ``r`` also checks
row ``r`` and the first bad row is flagged; the flag is read back as in
``array.py`` (``_raise_outside``), so a bad index fails at the node with the
CPU kernel's words.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
from numba import cuda, int64

from ..cpu.array_index import bad_row_error
from . import launch
from .array import _flat
from .elementwise import fill


@cuda.jit(device=True)
def _slice_start(rows, r, depth, dims, inner):  # type: ignore[no-untyped-def]
    """The flat offset of the slice row ``r`` names, or -1 if a coordinate is out of range."""
    flat = 0
    for j in range(depth):
        c = rows[r * depth + j]
        if c < 0 or c >= dims[j]:
            return -1
        flat = flat * dims[j] + c
    return flat * inner


@cuda.jit
def _gather_nd(rows, params, out, depth, dims, inner, m, flag):  # type: ignore[no-untyped-def]
    i = cuda.grid(1)
    if i < m and _slice_start(rows, i, depth, dims, inner) < 0:
        cuda.atomic.min(flag, 0, int64(i))
    if i < out.size:
        start = _slice_start(rows, i // inner, depth, dims, inner)
        if start >= 0:
            out[i] = params[start + i % inner]


@cuda.jit
def _scatter_nd(rows, updates, out, depth, dims, inner, m, flag):  # type: ignore[no-untyped-def]
    i = cuda.grid(1)
    if i < m and _slice_start(rows, i, depth, dims, inner) < 0:
        cuda.atomic.min(flag, 0, int64(i))
    if i < updates.size:
        start = _slice_start(rows, i // inner, depth, dims, inner)
        if start >= 0:
            cuda.atomic.add(out, start + i % inner, updates[i])


def _raise_bad(flag: Any, indices: Any, m: int, shape: tuple[int, ...], what: str) -> None:
    """The one host copy: the flag (and, to word the error, the indices)."""
    bad = int(flag.copy_to_host()[0])
    if bad < m:
        host = indices.copy_to_host()
        rows = host.reshape(m, tuple(host.shape)[-1])
        raise bad_row_error(host, rows, bad, shape, what)


def _launch(kernel: Any, indices: Any, data: Any, out: Any, shape: tuple[int, ...], what: str) -> Any:
    """Run ``kernel`` (GatherNd's or ScatterNd's) over ``indices`` into ``shape``, then check the flag."""
    ishape = tuple(indices.shape)  # the simulator's shapes take no negative index
    depth = ishape[-1]
    m = math.prod(ishape[:-1])
    inner = math.prod(shape[depth:])
    flag = fill((1,), np.int64, m)  # no row is bad until one is found
    dims = tuple(shape[:depth]) if depth else (1,)  # a 0-depth row reads no dim
    work = max(data.size if kernel is _scatter_nd else out.size, m)  # every row is checked, even if nothing moves
    if work:
        blocks, threads = launch(work)
        kernel[blocks, threads](_flat(indices), _flat(data), _flat(out), depth, dims, max(inner, 1), m, flag)
    _raise_bad(flag, indices, m, shape, what)
    return out


def gather_nd_op(node: Any, ctx: Any) -> Callable[[Any, Any], Any]:
    def run(params: Any, indices: Any) -> Any:
        shape = tuple(params.shape)
        ishape = tuple(indices.shape)
        out = cuda.device_array(ishape[:-1] + shape[ishape[-1] :], params.dtype)
        return _launch(_gather_nd, indices, params, out, shape, "params")

    return run


def _scatter(indices: Any, updates: Any, shape: tuple[int, ...]) -> Any:
    return _launch(_scatter_nd, indices, updates, fill(shape, updates.dtype, 0), shape, "output")


def scatter_nd_op(node: Any, ctx: Any) -> Callable[[Any, Any], Any]:
    shape = node.attrs["shape"]
    return lambda indices, updates: _scatter(indices, updates, shape)


def scatter_nd_like_op(node: Any, ctx: Any) -> Callable[[Any, Any, Any], Any]:
    return lambda indices, updates, like: _scatter(indices, updates, tuple(like.shape))
