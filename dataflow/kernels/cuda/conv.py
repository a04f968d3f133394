"""2-D convolution and pooling (NHWC input, HWIO filter) on the GPU.

The three convolutions are implicit GEMMs on the register-blocked tiles of
``gemm.py``, the operands gathered from the image, filter and gradient on the
fly (never formed in memory): the forward pass is patches(x) @ f, the input
gradient gathers, for each input pixel, the output gradients whose taps read it
(dy @ f^T, with no scatter and no atomics), and the filter gradient is
patches(x)^T @ dy. Each output element is one thread's register, summed in one
fixed order. Pooling *gathers*: one thread per output element walks the window
taps that reach it; consecutive threads differ in the channel, the innermost
NHWC dim, so their loads are coalesced. The max-pool gradients first record
each window's first maximum (taps in row-major order, as the CPU kernels and the
reference keep it), then route through it.

Geometry (output size, leading pad) follows TensorFlow's SAME/VALID rules, or
explicit per-side pads, via ``kernels.cpu.conv.window``; padded pixels are never
read. Dilated windows only change where a tap reads. Grouped convolutions
(depthwise ones included) are not one GEMM: they gather directly, one thread
per output element, summing its group's taps and channels in a fixed order.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from numba import cuda

from ..cpu.conv import Padding, axis_padding, window
from . import flat, launch
from .gemm import Operand, gemm

HW = tuple[int, int]


def _geometry(
    h: int, w: int, k: HW, strides: HW, padding: Padding, dilations: HW = (1, 1)
) -> tuple[int, int, int, int]:
    """(out height, out width, pad top, pad left)."""
    oh, pt = window(h, k[0], strides[0], axis_padding(padding, 0), dilations[0])
    ow, pl = window(w, k[1], strides[1], axis_padding(padding, 1), dilations[1])
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
# Each convolution is one GEMM (gemm.py) whose operands are gathered on the fly.
# geo = (h, w, c, kw, sh, sw, pt, pl, oh, ow, o, dh, dw): input size and channels,
# filter width, strides, leading pads, output size and channels, dilations. A "patch" row is one
# output pixel (image, row, column); its columns are the taps and input channels
# (filter row, filter column, channel), in HWIO order.
@cuda.jit(device=True, inline=True)
def _patch(pix, tap_ch, geo):  # type: ignore[no-untyped-def]
    """Flat index into x of patch element (output pixel, tap and channel); -1 in the padding."""
    h, w, c, kw, sh, sw, pt, pl, oh, ow, _, dh, dw = geo
    oj, rest = pix % ow, pix // ow
    oi, b = rest % oh, rest // oh
    ch, tap = tap_ch % c, tap_ch // c
    ih, iw = oi * sh - pt + (tap // kw) * dh, oj * sw - pl + (tap % kw) * dw
    if 0 <= ih < h and 0 <= iw < w:
        return ((b * h + ih) * w + iw) * c + ch
    return -1


@cuda.jit(device=True, inline=True)
def _patch_transposed(tap_ch, pix, geo):  # type: ignore[no-untyped-def]
    return _patch(pix, tap_ch, geo)


@cuda.jit(device=True, inline=True)
def _by_out_channel(j, kk, geo):  # type: ignore[no-untyped-def]
    """Element (kk, j) of a row-major (K, o) matrix: the filter as (taps * c, o), or dy as (pixels, o)."""
    return kk * geo[10] + j


@cuda.jit(device=True, inline=True)
def _dy_tap(pix, tap_oc, geo):  # type: ignore[no-untyped-def]
    """Flat index into dy of the output gradient that input pixel ``pix`` receives through (tap, out channel)."""
    h, w, _, kw, sh, sw, pt, pl, oh, ow, o, dh, dw = geo
    iw, rest = pix % w, pix // w
    ih, b = rest % h, rest // h
    oc, tap = tap_oc % o, tap_oc // o
    # = output row * sh (column * sw) if that output's tap reads here
    t, u = ih + pt - (tap // kw) * dh, iw + pl - (tap % kw) * dw
    if t >= 0 and u >= 0 and t % sh == 0 and u % sw == 0 and t // sh < oh and u // sw < ow:
        return ((b * oh + t // sh) * ow + u // sw) * o + oc
    return -1


@cuda.jit(device=True, inline=True)
def _filter_transposed(ch, tap_oc, geo):  # type: ignore[no-untyped-def]
    """Filter element (tap, ch, out channel): the filter as a (taps * o, c) matrix."""
    c, o = geo[2], geo[10]
    return ((tap_oc // o) * c + ch) * o + tap_oc % o


def _geo(
    x_shape: tuple[int, ...], f_shape: tuple[int, ...], strides: HW, padding: Padding, dilations: HW
) -> tuple[int, ...]:
    _, h, w, c = x_shape
    kh, kw, _, o = f_shape
    oh, ow, pt, pl = _geometry(h, w, (kh, kw), strides, padding, dilations)
    return h, w, c, kw, strides[0], strides[1], pt, pl, oh, ow, o, dilations[0], dilations[1]


@cuda.jit
def _grouped_forward(x, f, out, groups, sh, sw, dh, dw, pt, pl, zero):  # type: ignore[no-untyped-def]
    i = cuda.grid(1)
    if i < out.size:
        n, oi, oj, oc = _unravel(i, out.shape)
        _, h, w, _ = x.shape
        kh, kw, cg, o = f.shape
        first = (oc // (o // groups)) * cg
        acc = zero
        for p in range(kh):
            ih = oi * sh - pt + p * dh
            if 0 <= ih < h:
                for q in range(kw):
                    iw = oj * sw - pl + q * dw
                    if 0 <= iw < w:
                        for ci in range(cg):
                            acc += x[n, ih, iw, first + ci] * f[p, q, ci, oc]
        out[n, oi, oj, oc] = acc


@cuda.jit
def _grouped_input_grad(dy, f, dx, groups, sh, sw, dh, dw, pt, pl, zero):  # type: ignore[no-untyped-def]
    i = cuda.grid(1)
    if i < dx.size:
        n, ih, iw, ch = _unravel(i, dx.shape)
        _, oh, ow, _ = dy.shape
        kh, kw, cg, o = f.shape
        og = o // groups
        ci, first = ch % cg, (ch // cg) * og
        acc = zero
        for p in range(kh):
            t = ih + pt - p * dh  # = output row * sh if that row's tap p reads here
            if t >= 0 and t % sh == 0 and t // sh < oh:
                for q in range(kw):
                    u = iw + pl - q * dw
                    if u >= 0 and u % sw == 0 and u // sw < ow:
                        for m in range(og):
                            acc += dy[n, t // sh, u // sw, first + m] * f[p, q, ci, first + m]
        dx[n, ih, iw, ch] = acc


@cuda.jit
def _grouped_filter_grad(x, dy, df, groups, sh, sw, dh, dw, pt, pl, zero):  # type: ignore[no-untyped-def]
    i = cuda.grid(1)
    if i < df.size:
        p, q, ci, oc = _unravel(i, df.shape)
        nb, h, w, _ = x.shape
        _, oh, ow, o = dy.shape
        ch = (oc // (o // groups)) * df.shape[2] + ci
        acc = zero
        for n in range(nb):
            for oi in range(oh):
                ih = oi * sh - pt + p * dh
                if 0 <= ih < h:
                    for oj in range(ow):
                        iw = oj * sw - pl + q * dw
                        if 0 <= iw < w:
                            acc += x[n, ih, iw, ch] * dy[n, oi, oj, oc]
        df[p, q, ci, oc] = acc


def _grouped(kernel: Any, out: Any, a: Any, b: Any, geo: tuple[int, ...], groups: int) -> Any:
    if out.size:
        blocks, threads = launch(out.size)
        sh, sw, pt, pl, dh, dw = geo[4], geo[5], geo[6], geo[7], geo[11], geo[12]
        kernel[blocks, threads](a, b, out, groups, sh, sw, dh, dw, pt, pl, out.dtype.type(0))
    return out


def conv2d(x: Any, f: Any, strides: HW, padding: Padding, dilations: HW = (1, 1), groups: int = 1) -> Any:
    """out[pixel, o] = patches(x) @ f as (taps * c, o)."""
    geo = _geo(x.shape, f.shape, strides, padding, dilations)
    kh, kw, c, o = f.shape
    out = cuda.device_array((x.shape[0], geo[8], geo[9], o), x.dtype)
    if groups > 1:
        return _grouped(_grouped_forward, out, x, f, geo, groups)
    patches = Operand(flat(x), _patch, fast=False)  # channels (along K) are adjacent
    pixels = x.shape[0] * geo[8] * geo[9]  # from the shapes, not size // o: any of them may be 0
    gemm(patches, Operand(flat(f), _by_out_channel, fast=True), out.reshape(pixels, o), kh * kw * c, geo)
    return out


def conv2d_input_grad(
    like: Any, f: Any, dy: Any, strides: HW, padding: Padding, dilations: HW = (1, 1), groups: int = 1
) -> Any:
    """dx[pixel, c] = gathered dy @ f as (taps * o, c): each input pixel sums the outputs whose taps read it."""
    geo = _geo(like.shape, f.shape, strides, padding, dilations)
    kh, kw, c, o = f.shape
    dx = cuda.device_array(like.shape, dy.dtype)
    if groups > 1:
        return _grouped(_grouped_input_grad, dx, dy, f, geo, groups)
    left, right = Operand(flat(dy), _dy_tap, fast=False), Operand(flat(f), _filter_transposed, fast=False)
    gemm(left, right, dx.reshape(like.shape[0] * geo[0] * geo[1], c), kh * kw * o, geo)
    return dx


def conv2d_filter_grad(
    x: Any, like: Any, dy: Any, strides: HW, padding: Padding, dilations: HW = (1, 1), groups: int = 1
) -> Any:
    """df as (taps * c, o) = patches(x)^T @ dy as (pixels, o)."""
    geo = _geo(x.shape, like.shape, strides, padding, dilations)
    kh, kw, c, o = like.shape
    df = cuda.device_array(like.shape, dy.dtype)
    if groups > 1:
        return _grouped(_grouped_filter_grad, df, x, dy, geo, groups)
    patches = Operand(flat(x), _patch_transposed, fast=True)  # channels (along M) are adjacent
    pixels = dy.shape[0] * dy.shape[1] * dy.shape[2]
    gemm(patches, Operand(flat(dy), _by_out_channel, fast=True), df.reshape(kh * kw * c, o), pixels, geo)
    return df


# -------------------------------------------------------------------- pooling
@cuda.jit
def _max_pool(x, out, at, kh, kw, sh, sw, dh, dw, pt, pl):  # type: ignore[no-untyped-def]
    """out: each window's maximum; at: the flat index into ``x`` of its first maximum."""
    i = cuda.grid(1)
    if i < out.size:
        n, oi, oj, ch = _unravel(i, out.shape)
        _, h, w, c = x.shape
        best = x[n, 0, 0, ch]
        where = -1
        for p in range(kh):
            ih = oi * sh - pt + p * dh
            if 0 <= ih < h:
                for q in range(kw):
                    iw = oj * sw - pl + q * dw
                    if 0 <= iw < w:
                        v = x[n, ih, iw, ch]
                        if where < 0 or (best == best and (v > best or v != v)):  # NaN wins, as on the CPU
                            best = v
                            where = ((n * h + ih) * w + iw) * c + ch
        out[n, oi, oj, ch] = best
        at[n, oi, oj, ch] = where


@cuda.jit
def _max_pool_grad(dy, at, dx, kh, kw, sh, sw, dh, dw, pt, pl, zero):  # type: ignore[no-untyped-def]
    """dx: the sum of the output gradients whose window's first maximum is this pixel."""
    i = cuda.grid(1)
    if i < dx.size:
        n, ih, iw, ch = _unravel(i, dx.shape)
        _, oh, ow, _ = dy.shape
        acc = zero
        if dh == 1 and dw == 1:
            lo_i, hi_i = _first_window(ih, pt, kh, sh, oh)
            lo_j, hi_j = _first_window(iw, pl, kw, sw, ow)
            for oi in range(lo_i, hi_i):
                for oj in range(lo_j, hi_j):
                    if at[n, oi, oj, ch] == i:
                        acc += dy[n, oi, oj, ch]
        else:  # the outputs whose tap (p, q) lands here, if any: one per tap
            for p in range(kh - 1, -1, -1):
                t = ih + pt - p * dh
                if t >= 0 and t % sh == 0 and t // sh < oh:
                    for q in range(kw - 1, -1, -1):
                        u = iw + pl - q * dw
                        if u >= 0 and u % sw == 0 and u // sw < ow and at[n, t // sh, u // sw, ch] == i:
                            acc += dy[n, t // sh, u // sw, ch]
        dx[n, ih, iw, ch] = acc


@cuda.jit
def _take(src, at, out):  # type: ignore[no-untyped-def]
    i = cuda.grid(1)
    if i < out.size:
        out[i] = src[at[i]]


@cuda.jit
def _avg_pool(x, out, kh, kw, sh, sw, dh, dw, pt, pl, zero):  # type: ignore[no-untyped-def]
    """out: the mean of the real pixels of each window (a dilated one is VALID: all of them)."""
    i = cuda.grid(1)
    if i < out.size:
        n, oi, oj, ch = _unravel(i, out.shape)
        _, h, w, _ = x.shape
        h0, w0 = oi * sh - pt, oj * sw - pl
        acc = zero
        if dh == 1 and dw == 1:
            for ih in range(max(h0, 0), min(h0 + kh, h)):
                for iw in range(max(w0, 0), min(w0 + kw, w)):
                    acc += x[n, ih, iw, ch]
            out[n, oi, oj, ch] = acc / ((min(h0 + kh, h) - max(h0, 0)) * (min(w0 + kw, w) - max(w0, 0)))
        else:
            for p in range(kh):
                for q in range(kw):
                    acc += x[n, h0 + p * dh, w0 + q * dw, ch]
            out[n, oi, oj, ch] = acc / (kh * kw)


@cuda.jit
def _avg_pool_grad(dy, dx, kh, kw, sh, sw, dh, dw, pt, pl, zero):  # type: ignore[no-untyped-def]
    """dx: each covering window's gradient divided by that window's count of real pixels."""
    i = cuda.grid(1)
    if i < dx.size:
        n, ih, iw, ch = _unravel(i, dx.shape)
        _, h, w, _ = dx.shape
        _, oh, ow, _ = dy.shape
        acc = zero
        if dh != 1 or dw != 1:  # VALID: every window counts kh * kw pixels
            for p in range(kh - 1, -1, -1):
                t = ih + pt - p * dh
                if t >= 0 and t % sh == 0 and t // sh < oh:
                    for q in range(kw - 1, -1, -1):
                        u = iw + pl - q * dw
                        if u >= 0 and u % sw == 0 and u // sw < ow:
                            acc += dy[n, t // sh, u // sw, ch] / (kh * kw)
            dx[n, ih, iw, ch] = acc
            return
        lo_i, hi_i = _first_window(ih, pt, kh, sh, oh)
        lo_j, hi_j = _first_window(iw, pl, kw, sw, ow)
        for oi in range(lo_i, hi_i):
            h0 = oi * sh - pt
            rows = min(h0 + kh, h) - max(h0, 0)
            for oj in range(lo_j, hi_j):
                w0 = oj * sw - pl
                acc += dy[n, oi, oj, ch] / (rows * (min(w0 + kw, w) - max(w0, 0)))
        dx[n, ih, iw, ch] = acc


def _pool_shape(
    x: Any, ksize: HW, strides: HW, padding: str, dilations: HW = (1, 1)
) -> tuple[tuple[int, ...], int, int]:
    """(output shape, pad top, pad left) of pooling NHWC ``x``."""
    n, h, w, c = x.shape
    oh, ow, pt, pl = _geometry(h, w, ksize, strides, padding, dilations)
    return (n, oh, ow, c), pt, pl


def _first_max(x: Any, ksize: HW, strides: HW, padding: str, dilations: HW = (1, 1)) -> tuple[Any, Any, int, int]:
    """(max-pooled x, flat index of each window's first maximum, pad top, pad left)."""
    shape, pt, pl = _pool_shape(x, ksize, strides, padding, dilations)
    out = cuda.device_array(shape, x.dtype)
    at = cuda.device_array(shape, np.int32 if x.size < 2**31 else np.int64)
    if out.size:
        blocks, threads = launch(out.size)
        _max_pool[blocks, threads](x, out, at, *ksize, *strides, *dilations, pt, pl)
    return out, at, pt, pl


def max_pool(x: Any, ksize: HW, strides: HW, padding: str, dilations: HW = (1, 1)) -> Any:
    return _first_max(x, ksize, strides, padding, dilations)[0]


def max_pool_grad(x: Any, dy: Any, ksize: HW, strides: HW, padding: str, dilations: HW = (1, 1)) -> Any:
    _, at, pt, pl = _first_max(x, ksize, strides, padding, dilations)
    dx = cuda.device_array(x.shape, dy.dtype)
    if dx.size:
        blocks, threads = launch(dx.size)
        _max_pool_grad[blocks, threads](dy, at, dx, *ksize, *strides, *dilations, pt, pl, dy.dtype.type(0))
    return dx


def max_pool_grad_grad(x: Any, ddx: Any, ksize: HW, strides: HW, padding: str, dilations: HW = (1, 1)) -> Any:
    _, at, _, _ = _first_max(x, ksize, strides, padding, dilations)
    out = cuda.device_array(at.shape, ddx.dtype)
    if out.size:
        blocks, threads = launch(out.size)
        _take[blocks, threads](ddx.reshape(ddx.size), at.reshape(at.size), out.reshape(out.size))
    return out


@cuda.jit
def _argmax_index(at, out, per_image):  # type: ignore[no-untyped-def]
    """The flat indices as int64, within the image when ``per_image`` > 0."""
    i = cuda.grid(1)
    if i < out.size:
        out[i] = at[i] % per_image if per_image > 0 else at[i]


def max_pool_with_argmax(x: Any, ksize: HW, strides: HW, padding: str, include_batch_in_index: bool) -> Any:
    out, at, _, _ = _first_max(x, ksize, strides, padding)
    where = cuda.device_array(at.shape, np.int64)
    if where.size:
        blocks, threads = launch(where.size)
        per_image = 0 if include_batch_in_index else x.shape[1] * x.shape[2] * x.shape[3]
        _argmax_index[blocks, threads](at.reshape(at.size), where.reshape(where.size), per_image)
    return out, where


def avg_pool(x: Any, ksize: HW, strides: HW, padding: str, dilations: HW = (1, 1)) -> Any:
    shape, pt, pl = _pool_shape(x, ksize, strides, padding, dilations)
    out = cuda.device_array(shape, x.dtype)
    if out.size:
        blocks, threads = launch(out.size)
        _avg_pool[blocks, threads](x, out, *ksize, *strides, *dilations, pt, pl, x.dtype.type(0))
    return out


def avg_pool_grad(like: Any, dy: Any, ksize: HW, strides: HW, padding: str, dilations: HW = (1, 1)) -> Any:
    _, pt, pl = _pool_shape(like, ksize, strides, padding, dilations)
    dx = cuda.device_array(like.shape, dy.dtype)
    if dx.size:
        blocks, threads = launch(dx.size)
        _avg_pool_grad[blocks, threads](dy, dx, *ksize, *strides, *dilations, pt, pl, dy.dtype.type(0))
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
    """Convolution kernel ``name`` with the node's strides, padding, dilations and groups."""
    attrs = node.attrs
    spec = (attrs["strides"], attrs["padding"], attrs.get("dilations", (1, 1)), attrs.get("groups", 1))
    run = CONVOLUTIONS[name]
    return lambda *args: run(*args, *spec)


def pool_op(node: Any, ctx: Any, name: str) -> Callable[..., Any]:
    """Pooling kernel ``name`` with the node's window, strides, padding and dilations."""
    run, ksize, strides, padding = POOLS[name], node.attrs["ksize"], node.attrs["strides"], node.attrs["padding"]
    dilations = node.attrs.get("dilations", (1, 1))
    return lambda *args: run(*args, ksize, strides, padding, dilations)


def max_pool_with_argmax_op(node: Any, ctx: Any) -> Callable[..., Any]:
    """MaxPoolWithArgmax with the node's window, strides, padding and index convention."""
    a = node.attrs
    return lambda x: max_pool_with_argmax(x, a["ksize"], a["strides"], a["padding"], a["include_batch_in_index"])
