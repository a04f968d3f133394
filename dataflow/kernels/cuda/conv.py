"""2-D convolution and pooling (NHWC input, HWIO filter) on the GPU.

Every kernel that writes an image-shaped result *gathers*: one thread per
output element walks the window taps that reach it, so no two threads write
the same element and no atomics are needed (sums come out in one fixed
order). Consecutive threads differ in the channel, the innermost NHWC and HWIO
dim, so their loads of a filter or gradient row are coalesced. The filter
gradient sums over every image and output pixel: it is the matrix product
patches(x)^T @ dy, computed in shared-memory tiles as ``matmul.py`` does, the
patch matrix read from x on the fly (an implicit GEMM). The max-pool gradients
first record each window's first maximum (taps in row-major order, as the CPU
kernels and the reference keep it), then route through it.

Geometry (output size, leading pad) follows TensorFlow's SAME/VALID rules via
``kernels.cpu.conv.window``; padded pixels are never read.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import cache
from typing import Any

import numpy as np
from numba import cuda, from_dtype

from ..cpu.conv import window
from . import launch
from .matmul import PADDED, TILE

HW = tuple[int, int]


def _geometry(h: int, w: int, k: HW, strides: HW, padding: str) -> tuple[int, int, int, int]:
    """(out height, out width, pad top, pad left)."""
    oh, pt = window(h, k[0], strides[0], padding)
    ow, pl = window(w, k[1], strides[1], padding)
    return oh, ow, pt, pl


@cuda.jit(device=True)
def _unravel(i, shape):  # type: ignore[no-untyped-def]
    """(n, h, w, c) of flat index ``i`` into a C-contiguous 4-D ``shape``."""
    c = i % shape[3]
    i //= shape[3]
    w = i % shape[2]
    i //= shape[2]
    return i // shape[1], i % shape[1], w, c


@cuda.jit(device=True)
def _first_window(pos, pad, k, stride, out_size):  # type: ignore[no-untyped-def]
    """(first, stop): the outputs along one dim whose window covers input ``pos``."""
    hi = min((pos + pad) // stride + 1, out_size)
    lo = max(pos + pad - k + stride, 0) // stride  # ceil((pos + pad - k + 1) / stride), at least 0
    return lo, hi


# ---------------------------------------------------------------- convolution
@cuda.jit
def _conv2d(x, f, out, sh, sw, pt, pl, zero):  # type: ignore[no-untyped-def]
    i = cuda.grid(1)
    if i < out.size:
        n, oi, oj, o = _unravel(i, out.shape)
        _, h, w, c = x.shape
        kh, kw = f.shape[0], f.shape[1]
        acc = zero
        for p in range(kh):
            ih = oi * sh - pt + p
            if 0 <= ih < h:
                for q in range(kw):
                    iw = oj * sw - pl + q
                    if 0 <= iw < w:
                        for ch in range(c):
                            acc += x[n, ih, iw, ch] * f[p, q, ch, o]
        out[n, oi, oj, o] = acc


@cuda.jit
def _conv2d_input_grad(dy, f, dx, sh, sw, pt, pl, zero):  # type: ignore[no-untyped-def]
    i = cuda.grid(1)
    if i < dx.size:
        n, ih, iw, ch = _unravel(i, dx.shape)
        _, oh, ow, o = dy.shape
        kh, kw = f.shape[0], f.shape[1]
        acc = zero
        for p in range(kh):
            t = ih + pt - p  # = output row * sh, if that output's tap p reads row ih
            if t >= 0 and t % sh == 0 and t // sh < oh:
                for q in range(kw):
                    u = iw + pl - q
                    if u >= 0 and u % sw == 0 and u // sw < ow:
                        for oc in range(o):
                            acc += dy[n, t // sh, u // sw, oc] * f[p, q, ch, oc]
        dx[n, ih, iw, ch] = acc


@cache
def _conv2d_filter_grad(dtype: np.dtype) -> Any:
    acc_type = from_dtype(dtype)

    @cuda.jit
    def run(x, dy, df, sh, sw, pt, pl):  # type: ignore[no-untyped-def]
        # df as a (taps * in channels, out channels) matrix: patches(x)^T @ dy,
        # the patch matrix read from x on the fly (an implicit GEMM).
        sa = cuda.shared.array((TILE, PADDED), acc_type)  # sa[tap and channel, pixel]
        sb = cuda.shared.array((TILE, PADDED), acc_type)  # sb[pixel, out channel]
        tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
        row0, col0 = cuda.blockIdx.y * TILE, cuda.blockIdx.x * TILE
        _, h, w, c = x.shape
        n, oh, ow, o = dy.shape
        kw = df.shape[1]
        rows, pixels = df.shape[0] * kw * c, n * oh * ow
        kk = row0 + tx  # the tap and channel this thread loads
        ch, q, p = kk % c, (kk // c) % kw, kk // (c * kw)
        acc = acc_type(0)
        for m0 in range(0, pixels, TILE):
            m = m0 + ty  # the output pixel this thread loads
            oj, oi, b = m % ow, (m // ow) % oh, m // (ow * oh)
            ih, iw = oi * sh - pt + p, oj * sw - pl + q
            inside = kk < rows and m < pixels and 0 <= ih < h and 0 <= iw < w
            sa[tx, ty] = x[b, ih, iw, ch] if inside else acc_type(0)
            sb[ty, tx] = dy[b, oi, oj, col0 + tx] if m < pixels and col0 + tx < o else acc_type(0)
            cuda.syncthreads()
            for j in range(TILE):
                acc += sa[ty, j] * sb[j, tx]
            cuda.syncthreads()
        if row0 + ty < rows and col0 + tx < o:
            r = row0 + ty
            df[r // (c * kw), (r // c) % kw, r % c, col0 + tx] = acc

    return run


def conv2d(x: Any, f: Any, strides: HW, padding: str) -> Any:
    n, h, w, _ = x.shape
    kh, kw, _, o = f.shape
    oh, ow, pt, pl = _geometry(h, w, (kh, kw), strides, padding)
    out = cuda.device_array((n, oh, ow, o), x.dtype)
    if out.size:
        blocks, threads = launch(out.size)
        _conv2d[blocks, threads](x, f, out, *strides, pt, pl, x.dtype.type(0))
    return out


def conv2d_input_grad(like: Any, f: Any, dy: Any, strides: HW, padding: str) -> Any:
    _, h, w, _ = like.shape
    _, _, pt, pl = _geometry(h, w, (f.shape[0], f.shape[1]), strides, padding)
    dx = cuda.device_array(like.shape, dy.dtype)
    if dx.size:
        blocks, threads = launch(dx.size)
        _conv2d_input_grad[blocks, threads](dy, f, dx, *strides, pt, pl, dy.dtype.type(0))
    return dx


def conv2d_filter_grad(x: Any, like: Any, dy: Any, strides: HW, padding: str) -> Any:
    _, h, w, _ = x.shape
    _, _, pt, pl = _geometry(h, w, (like.shape[0], like.shape[1]), strides, padding)
    df = cuda.device_array(like.shape, dy.dtype)
    if df.size:
        kh, kw, c, o = like.shape
        blocks = (math.ceil(o / TILE), math.ceil(kh * kw * c / TILE))
        _conv2d_filter_grad(np.dtype(dy.dtype))[blocks, (TILE, TILE)](x, dy, df, *strides, pt, pl)
    return df


# -------------------------------------------------------------------- pooling
@cuda.jit
def _max_pool(x, out, at, kh, kw, sh, sw, pt, pl):  # type: ignore[no-untyped-def]
    """out: each window's maximum; at: the flat index into ``x`` of its first maximum."""
    i = cuda.grid(1)
    if i < out.size:
        n, oi, oj, ch = _unravel(i, out.shape)
        _, h, w, c = x.shape
        best = x[n, 0, 0, ch]
        where = -1
        for p in range(kh):
            ih = oi * sh - pt + p
            if 0 <= ih < h:
                for q in range(kw):
                    iw = oj * sw - pl + q
                    if 0 <= iw < w:
                        v = x[n, ih, iw, ch]
                        if where < 0 or v > best:
                            best = v
                            where = ((n * h + ih) * w + iw) * c + ch
        out[n, oi, oj, ch] = best
        at[n, oi, oj, ch] = where


@cuda.jit
def _max_pool_grad(dy, at, dx, kh, kw, sh, sw, pt, pl, zero):  # type: ignore[no-untyped-def]
    """dx: the sum of the output gradients whose window's first maximum is this pixel."""
    i = cuda.grid(1)
    if i < dx.size:
        n, ih, iw, ch = _unravel(i, dx.shape)
        _, oh, ow, _ = dy.shape
        acc = zero
        lo_i, hi_i = _first_window(ih, pt, kh, sh, oh)
        lo_j, hi_j = _first_window(iw, pl, kw, sw, ow)
        for oi in range(lo_i, hi_i):
            for oj in range(lo_j, hi_j):
                if at[n, oi, oj, ch] == i:
                    acc += dy[n, oi, oj, ch]
        dx[n, ih, iw, ch] = acc


@cuda.jit
def _take(src, at, out):  # type: ignore[no-untyped-def]
    i = cuda.grid(1)
    if i < out.size:
        out[i] = src[at[i]]


@cuda.jit
def _avg_pool(x, out, kh, kw, sh, sw, pt, pl, zero):  # type: ignore[no-untyped-def]
    """out: the mean of the real pixels of each window."""
    i = cuda.grid(1)
    if i < out.size:
        n, oi, oj, ch = _unravel(i, out.shape)
        _, h, w, _ = x.shape
        h0, w0 = oi * sh - pt, oj * sw - pl
        acc = zero
        for ih in range(max(h0, 0), min(h0 + kh, h)):
            for iw in range(max(w0, 0), min(w0 + kw, w)):
                acc += x[n, ih, iw, ch]
        out[n, oi, oj, ch] = acc / ((min(h0 + kh, h) - max(h0, 0)) * (min(w0 + kw, w) - max(w0, 0)))


@cuda.jit
def _avg_pool_grad(dy, dx, kh, kw, sh, sw, pt, pl, zero):  # type: ignore[no-untyped-def]
    """dx: each covering window's gradient divided by that window's count of real pixels."""
    i = cuda.grid(1)
    if i < dx.size:
        n, ih, iw, ch = _unravel(i, dx.shape)
        _, h, w, _ = dx.shape
        _, oh, ow, _ = dy.shape
        acc = zero
        lo_i, hi_i = _first_window(ih, pt, kh, sh, oh)
        lo_j, hi_j = _first_window(iw, pl, kw, sw, ow)
        for oi in range(lo_i, hi_i):
            h0 = oi * sh - pt
            rows = min(h0 + kh, h) - max(h0, 0)
            for oj in range(lo_j, hi_j):
                w0 = oj * sw - pl
                acc += dy[n, oi, oj, ch] / (rows * (min(w0 + kw, w) - max(w0, 0)))
        dx[n, ih, iw, ch] = acc


def _pool_shape(x: Any, ksize: HW, strides: HW, padding: str) -> tuple[tuple[int, ...], int, int]:
    """(output shape, pad top, pad left) of pooling NHWC ``x``."""
    n, h, w, c = x.shape
    oh, ow, pt, pl = _geometry(h, w, ksize, strides, padding)
    return (n, oh, ow, c), pt, pl


def _first_max(x: Any, ksize: HW, strides: HW, padding: str) -> tuple[Any, Any, int, int]:
    """(max-pooled x, flat index of each window's first maximum, pad top, pad left)."""
    shape, pt, pl = _pool_shape(x, ksize, strides, padding)
    out = cuda.device_array(shape, x.dtype)
    at = cuda.device_array(shape, np.int32 if x.size < 2**31 else np.int64)
    if out.size:
        blocks, threads = launch(out.size)
        _max_pool[blocks, threads](x, out, at, *ksize, *strides, pt, pl)
    return out, at, pt, pl


def max_pool(x: Any, ksize: HW, strides: HW, padding: str) -> Any:
    return _first_max(x, ksize, strides, padding)[0]


def max_pool_grad(x: Any, dy: Any, ksize: HW, strides: HW, padding: str) -> Any:
    _, at, pt, pl = _first_max(x, ksize, strides, padding)
    dx = cuda.device_array(x.shape, dy.dtype)
    if dx.size:
        blocks, threads = launch(dx.size)
        _max_pool_grad[blocks, threads](dy, at, dx, *ksize, *strides, pt, pl, dy.dtype.type(0))
    return dx


def max_pool_grad_grad(x: Any, ddx: Any, ksize: HW, strides: HW, padding: str) -> Any:
    _, at, _, _ = _first_max(x, ksize, strides, padding)
    out = cuda.device_array(at.shape, ddx.dtype)
    if out.size:
        blocks, threads = launch(out.size)
        _take[blocks, threads](ddx.reshape(ddx.size), at.reshape(at.size), out.reshape(out.size))
    return out


def avg_pool(x: Any, ksize: HW, strides: HW, padding: str) -> Any:
    shape, pt, pl = _pool_shape(x, ksize, strides, padding)
    out = cuda.device_array(shape, x.dtype)
    if out.size:
        blocks, threads = launch(out.size)
        _avg_pool[blocks, threads](x, out, *ksize, *strides, pt, pl, x.dtype.type(0))
    return out


def avg_pool_grad(like: Any, dy: Any, ksize: HW, strides: HW, padding: str) -> Any:
    _, pt, pl = _pool_shape(like, ksize, strides, padding)
    dx = cuda.device_array(like.shape, dy.dtype)
    if dx.size:
        blocks, threads = launch(dx.size)
        _avg_pool_grad[blocks, threads](dy, dx, *ksize, *strides, pt, pl, dy.dtype.type(0))
    return dx


# ------------------------------------------------------------ kernel factories
CONVOLUTIONS: dict[str, Callable[..., Any]] = {
    "conv2d": conv2d,
    "conv2d_input_grad": conv2d_input_grad,
    "conv2d_filter_grad": conv2d_filter_grad,
}
POOLS: dict[str, Callable[..., Any]] = {
    "max_pool": max_pool, "max_pool_grad": max_pool_grad, "max_pool_grad_grad": max_pool_grad_grad,
    "avg_pool": avg_pool, "avg_pool_grad": avg_pool_grad,
}  # fmt: skip


def conv_op(node: Any, ctx: Any, name: str) -> Callable[..., Any]:
    """Convolution kernel ``name`` with the node's strides and padding."""
    run, strides, padding = CONVOLUTIONS[name], node.attrs["strides"], node.attrs["padding"]
    return lambda *args: run(*args, strides, padding)


def pool_op(node: Any, ctx: Any, name: str) -> Callable[..., Any]:
    """Pooling kernel ``name`` with the node's window, strides and padding."""
    run, ksize, strides, padding = POOLS[name], node.attrs["ksize"], node.attrs["strides"], node.attrs["padding"]
    return lambda *args: run(*args, ksize, strides, padding)
