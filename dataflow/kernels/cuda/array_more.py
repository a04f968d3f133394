"""CUDA kernels of ``ops/array_more.py``: split, tile and its gradient, broadcast_to.

Split pieces and BroadcastTo are strided reads of ``array.py`` (a broadcast
dim has stride 0). Tile maps each output element to the input element it
repeats (its index modulo the input's dims); TileGrad gives each input element
one thread that sums the element's copies in every tile, so no atomics are
needed and the order of the sum is fixed.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
from numba import cuda

from ..cpu.array_more import check_mirror, split_sizes
from . import broadcast_strides, launch
from .array import _along, _copy, _flat, read
from .elementwise import fill


@cuda.jit
def _tile(x, out, out_shape, x_shape):  # type: ignore[no-untyped-def]
    i = cuda.grid(1)
    if i < out.size:
        j = i
        src = 0
        step = 1
        for d in range(len(out_shape) - 1, -1, -1):
            src += (j % out_shape[d]) % x_shape[d] * step
            j //= out_shape[d]
            step *= x_shape[d]
        out[i] = x[src]


@cuda.jit
def _untile(g, out, x_shape, multiples, g_shape, copies, zero):  # type: ignore[no-untyped-def]
    """out[i] = the sum of the ``copies`` elements of ``g`` that tile input element ``i``."""
    i = cuda.grid(1)
    if i < out.size:
        total = zero  # g may be empty (a multiple of 0): never read g[0] for the type
        for t in range(copies):
            # Tile coordinates of copy t (t read in C order over multiples), plus
            # element i's coordinates within a tile, give its place in g.
            j = i
            r = t
            src = 0
            step = 1
            for d in range(len(x_shape) - 1, -1, -1):
                c = j % x_shape[d] + (r % multiples[d]) * x_shape[d]
                j //= x_shape[d]
                r //= multiples[d]
                src += c * step
                step *= g_shape[d]
            total += g[src]
        out[i] = total


@cuda.jit(device=True)
def _mirror_source(i, out_shape, x_shape, before, edge):  # type: ignore[no-untyped-def]
    """The flat index in ``x`` that output element ``i`` of a mirror pad copies."""
    j = i
    src = 0
    step = 1
    for d in range(len(out_shape) - 1, -1, -1):
        c = j % out_shape[d] - before[d]
        j //= out_shape[d]
        n = x_shape[d]
        if c < 0:
            c = -c - edge  # REFLECT (edge 0) skips the edge element, SYMMETRIC (edge 1) repeats it
        elif c >= n:
            c = 2 * n - 2 + edge - c
        src += c * step
        step *= n
    return src


@cuda.jit
def _mirror_pad(x, out, out_shape, x_shape, before, edge):  # type: ignore[no-untyped-def]
    i = cuda.grid(1)
    if i < out.size:
        out[i] = x[_mirror_source(i, out_shape, x_shape, before, edge)]


@cuda.jit
def _mirror_fold(g, out, g_shape, x_shape, before, edge):  # type: ignore[no-untyped-def]
    """Each element of ``g`` added onto the one it copied (atomic: several copy one)."""
    i = cuda.grid(1)
    if i < g.size:
        cuda.atomic.add(out, _mirror_source(i, g_shape, x_shape, before, edge), g[i])


def split_op(node: Any, ctx: Any) -> Callable[[Any], Any]:
    axis, sizes, num = node.attrs["axis"], node.attrs["sizes"], node.attrs["num"]

    def run(x: Any) -> Any:
        fitted = split_sizes(sizes, num, x.shape[axis])
        if isinstance(fitted, str):
            raise ValueError(f"cannot split {tuple(x.shape)} on axis {axis}: {fitted}")
        pieces, start = [], 0
        for size in fitted:
            pieces.append(read(x, _along(axis, start, start + size)))
            start += size
        return pieces[0] if len(pieces) == 1 else tuple(pieces)

    return run


def tile_op(node: Any, ctx: Any) -> Callable[[Any], Any]:
    multiples = node.attrs["multiples"]

    def run(x: Any) -> Any:
        shape = tuple(d * m for d, m in zip(x.shape, multiples))
        out = cuda.device_array(shape, x.dtype)
        if out.size:
            blocks, threads = launch(out.size)
            grid, x_grid = (shape, tuple(x.shape)) if shape else ((1,), (1,))
            _tile[blocks, threads](_flat(x), _flat(out), grid, x_grid)
        return out

    return run


def tile_grad_op(node: Any, ctx: Any) -> Callable[[Any, Any], Any]:
    multiples = node.attrs["multiples"]

    def run(g: Any, x: Any) -> Any:
        shape = tuple(x.shape)
        if tuple(g.shape) != tuple(d * m for d, m in zip(shape, multiples)):
            raise ValueError(f"gradient {tuple(g.shape)} is not {shape} tiled {multiples}")
        out = cuda.device_array(shape, g.dtype)
        if out.size:
            blocks, threads = launch(out.size)
            grids = (shape, multiples, tuple(g.shape)) if shape else ((1,), (1,), (1,))
            _untile[blocks, threads](_flat(g), _flat(out), *grids, math.prod(multiples), np.dtype(g.dtype).type(0))
        return out

    return run


def broadcast_to_op(node: Any, ctx: Any) -> Callable[[Any], Any]:
    shape = node.attrs["shape"]

    def run(x: Any) -> Any:
        lead = len(shape) - x.ndim
        if any(d not in (1, shape[lead + i]) for i, d in enumerate(x.shape)):
            # A dim unknown when building, checked now with NumPy's words.
            raise ValueError(f"operands could not be broadcast together with remapped shapes {tuple(x.shape)} {shape}")
        return _copy(x, (0, shape, broadcast_strides(tuple(x.shape), shape)))

    return run


def _mirror(kernel: Any, src: Any, out: Any, big: tuple[int, ...], small: tuple[int, ...], node: Any) -> Any:
    """Launch a mirror kernel over the padded shape ``big`` (``small`` is the unpadded one)."""
    before = tuple(b for b, _ in node.attrs["paddings"])
    edge = 0 if node.attrs["mode"] == "REFLECT" else 1
    work = math.prod(big)
    if work:
        blocks, threads = launch(work)
        grids = (big, small, before) if big else ((1,), (1,), (0,))
        kernel[blocks, threads](_flat(src), _flat(out), *grids, edge)
    return out


def mirror_pad_op(node: Any, ctx: Any) -> Callable[[Any], Any]:
    paddings, mode = node.attrs["paddings"], node.attrs["mode"]

    def run(x: Any) -> Any:
        small = tuple(x.shape)
        check_mirror(small, paddings, mode)
        big = tuple(d + b + a for d, (b, a) in zip(small, paddings))
        return _mirror(_mirror_pad, x, cuda.device_array(big, x.dtype), big, small, node)

    return run


def mirror_pad_grad_op(node: Any, ctx: Any) -> Callable[[Any], Any]:
    paddings = node.attrs["paddings"]

    def run(g: Any) -> Any:
        big = tuple(g.shape)
        small = tuple(d - b - a for d, (b, a) in zip(big, paddings))
        check_mirror(small, paddings, node.attrs["mode"])
        return _mirror(_mirror_fold, g, fill(small, g.dtype, 0), big, small, node)

    return run
