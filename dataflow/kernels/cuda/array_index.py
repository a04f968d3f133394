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

from ..cpu.array_index import REDUCTIONS, bad_batch_index, bad_row_error, batch_blocks, batch_gather_shape
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


# ------------------------------------------- gather with batch_dims (BatchGather)
@cuda.jit(device=True)
def _batch_source(i, indices, pre, n, m, post):  # type: ignore[no-untyped-def]
    """For element ``i`` of a (b, pre, m, post) block: its place in the (b, pre, n, post) one, or -1."""
    q = i % post
    j = (i // post) % m
    rest = i // (post * m)  # batch * pre + p
    k = indices[(rest // pre) * m + j]
    if k < 0 or k >= n:
        return -1
    return (rest * n + k) * post + q


@cuda.jit(device=True)
def _flag_index(indices, n, flag, i):  # type: ignore[no-untyped-def]
    """Thread ``i`` checks index ``i``: the first one outside [0, n) ends up in ``flag[0]``."""
    if i < indices.size and (indices[i] < 0 or indices[i] >= n):
        cuda.atomic.min(flag, 0, int64(i))


@cuda.jit
def _batch_gather(params, indices, out, pre, n, m, post, flag):  # type: ignore[no-untyped-def]
    i = cuda.grid(1)
    _flag_index(indices, n, flag, i)
    if i < out.size:
        src = _batch_source(i, indices, pre, n, m, post)
        if src >= 0:
            out[i] = params[src]


@cuda.jit
def _batch_scatter_add(updates, indices, out, pre, n, m, post, flag):  # type: ignore[no-untyped-def]
    i = cuda.grid(1)
    _flag_index(indices, n, flag, i)
    if i < updates.size:
        dst = _batch_source(i, indices, pre, n, m, post)
        if dst >= 0:
            cuda.atomic.add(out, dst, updates[i])


def _batch_launch(kernel: Any, data: Any, indices: Any, out: Any, shape: tuple[int, ...], node: Any) -> Any:
    batch_dims, axis = node.attrs["batch_dims"], node.attrs["axis"]
    b, pre, n, post = batch_blocks(shape, batch_dims, axis)
    m = indices.size // b if b else 0
    flag = fill((1,), np.int64, indices.size)
    work = max(data.size if kernel is _batch_scatter_add else out.size, indices.size)
    if work:
        blocks, threads = launch(work)
        kernel[blocks, threads](_flat(data), _flat(indices), _flat(out), max(pre, 1), n, max(m, 1), max(post, 1), flag)
    bad = int(flag.copy_to_host()[0])
    if bad < indices.size:
        host = indices.copy_to_host()
        what = f"params {shape}" if kernel is _batch_gather else f"output {shape}"
        raise bad_batch_index(host, bad, n, axis, what)
    return out


def batch_gather_op(node: Any, ctx: Any) -> Callable[[Any, Any], Any]:
    batch_dims, axis = node.attrs["batch_dims"], node.attrs["axis"]

    def run(params: Any, indices: Any) -> Any:
        shape, ishape = tuple(params.shape), tuple(indices.shape)
        if ishape[:batch_dims] != shape[:batch_dims]:
            raise ValueError(f"batch dims of params {shape} and indices {ishape} differ")
        out = cuda.device_array(batch_gather_shape(shape, ishape, batch_dims, axis), params.dtype)
        return _batch_launch(_batch_gather, params, indices, out, shape, node)

    return run


def batch_gather_grad_op(node: Any, ctx: Any) -> Callable[[Any, Any, Any], Any]:
    def run(updates: Any, indices: Any, like: Any) -> Any:
        shape = tuple(like.shape)
        return _batch_launch(_batch_scatter_add, updates, indices, fill(shape, updates.dtype, 0), shape, node)

    return run


# ------------------------------------------------ TensorScatterReduce
@cuda.jit
def _scatter_reduce(rows, data, updates, out, depth, dims, inner, m, mode, flag):  # type: ignore[no-untyped-def]
    """Thread ``i`` folds into element ``i`` of ``data`` every update aimed at it, in row
    order: no atomics (there is none for a product), and the same order as the CPU loop,
    at the cost of each thread reading every row (work: elements x rows)."""
    i = cuda.grid(1)
    if i < m and _slice_start(rows, i, depth, dims, inner) < 0:
        cuda.atomic.min(flag, 0, int64(i))
    if i < out.size:
        v = data[i]
        here = i - i % inner
        for r in range(m):
            if _slice_start(rows, r, depth, dims, inner) == here:
                u = updates[r * inner + i % inner]
                if mode == 0:  # a NaN wins, as on the CPU
                    v = u if u > v or u != u else v
                elif mode == 1:
                    v = u if u < v or u != u else v
                else:
                    v = v * u
        out[i] = v


def tensor_scatter_reduce_op(node: Any, ctx: Any) -> Callable[[Any, Any, Any], Any]:
    mode = REDUCTIONS[node.attrs["reduction"]]

    def run(data: Any, indices: Any, updates: Any) -> Any:
        shape, ishape = tuple(data.shape), tuple(indices.shape)
        depth = ishape[-1]
        m = math.prod(ishape[:-1])
        inner = math.prod(shape[depth:])
        out = cuda.device_array(shape, data.dtype)
        flag = fill((1,), np.int64, m)
        dims = tuple(shape[:depth]) if depth else (1,)
        work = max(out.size, m)
        if work:
            blocks, threads = launch(work)
            _scatter_reduce[blocks, threads](
                _flat(indices), _flat(data), _flat(updates), _flat(out), depth, dims, max(inner, 1), m, mode, flag
            )
        _raise_bad(flag, indices, m, shape, "tensor")
        return out

    return run
