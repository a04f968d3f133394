"""2-D convolution (NHWC input, HWIO filter) and its two gradients.

Each is im2col + GEMM: the input is unrolled into a patch matrix (one row per
output pixel, one column per filter tap and input channel), so the filter
acts as a (taps * in_channels, out_channels) matrix and BLAS does the
arithmetic. The patch matrix is built a block of images at a time, small enough
to stay in L2 cache while BLAS reads it, instead of all at once (for a batch
of 64 8x8 images with 16 channels that would be 2.4 MB, written and read back
from memory). A 1x1 stride-1 convolution skips the unrolling: its input is
that matrix already. The input gradient of a stride-1 convolution is itself a
convolution (of the output gradient with the flipped filter), so it reuses the
forward path; strided ones scatter a GEMM's patch rows back (col2im).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from . import kernel

Kernel = Callable[..., np.ndarray]

# Bytes of patch matrix per block: about a quarter of a core's L2 cache.
_BLOCK_BYTES = 256 * 1024


Padding = str | tuple[tuple[int, int], tuple[int, int]]


def window(size: int, k: int, stride: int, padding: str | tuple[int, int], dilation: int = 1) -> tuple[int, int]:
    """(output size, padding before) along one spatial dim, by TensorFlow's rules.

    SAME gives ``ceil(size / stride)`` outputs and pads the shortfall, the odd
    element after; VALID pads nothing and keeps only whole windows; an explicit
    (before, after) pair pads exactly that. A dilated window of ``k`` taps
    spans ``(k - 1) * dilation + 1`` pixels.
    """
    span = (k - 1) * dilation + 1
    if isinstance(padding, tuple):
        return (size + padding[0] + padding[1] - span) // stride + 1, padding[0]
    if padding == "VALID":
        return (size - span) // stride + 1, 0
    out = -(-size // stride)
    return out, max((out - 1) * stride + span - size, 0) // 2


def axis_padding(padding: Padding, axis: int) -> str | tuple[int, int]:
    """Padding along spatial ``axis`` (0 height, 1 width): the mode, or that axis's explicit pair."""
    return padding if isinstance(padding, str) else padding[axis]


@kernel
def _block_images(rows_per_image, k, itemsize, n):  # type: ignore[no-untyped-def]
    """How many images' patch rows make one block of about _BLOCK_BYTES."""
    return min(max(1, _BLOCK_BYTES // max(rows_per_image * k * itemsize, 1)), max(n, 1))


@kernel
def _im2col_rows(x, cols, b0, b1, kh, kw, sh, dh, sw, pt, pl, oh, ow):  # type: ignore[no-untyped-def]
    """im2col for an undilated width: each window row is at most three contiguous
    stretches, zeros for the taps left of the input, one copy of the taps inside,
    zeros for those right of it."""
    n, h, w, c = x.shape
    rows = x.reshape(n * h, w * c)
    span = kw * c
    for b in range(b0, b1):
        for i in range(oh):
            h0 = i * sh - pt
            for j in range(ow):
                w0 = j * sw - pl
                dst = cols[((b - b0) * oh + i) * ow + j]
                left = np.uintp(max(0, -w0) * c)  # the taps inside are [left, right)
                right = np.uintp(max(min(kw, w - w0) * c, left))
                start = np.uintp(max(w0, 0) * c)
                for p in range(kh):
                    ih = h0 + p * dh
                    base = np.uintp(p * span)
                    if ih < 0 or ih >= h:
                        for t in range(np.uintp(span)):
                            dst[base + t] = 0
                        continue
                    src = rows[b * h + ih]
                    for t in range(left):
                        dst[base + t] = 0
                    for t in range(right - left):
                        dst[base + left + t] = src[start + t]
                    for t in range(right, np.uintp(span)):
                        dst[base + t] = 0


@kernel
def _im2col_taps(x, cols, b0, b1, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow):  # type: ignore[no-untyped-def]
    """im2col for a dilated width: a tap (its ``c`` channels) at a time."""
    n, h, w, c = x.shape
    for b in range(b0, b1):
        for i in range(oh):
            for j in range(ow):
                dst = cols[((b - b0) * oh + i) * ow + j]
                for p in range(kh):
                    ih = i * sh - pt + p * dh
                    for q in range(kw):
                        iw = j * sw - pl + q * dw
                        at = np.uintp((p * kw + q) * c)
                        if ih < 0 or ih >= h or iw < 0 or iw >= w:
                            for t in range(np.uintp(c)):
                                dst[at + t] = 0
                        else:
                            src = x[b, ih, iw]
                            for t in range(np.uintp(c)):
                                dst[at + t] = src[t]


@kernel
def im2col(x, cols, b0, b1, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow):  # type: ignore[no-untyped-def]
    """Patch rows of images ``b0:b1`` into ``cols`` (one row per output pixel, its
    taps and channels in HWIO order); taps outside ``x`` are 0. Offsets are
    unsigned so that Numba skips negative-index wraparound, which would keep
    LLVM from vectorizing the copies."""
    if dw == 1:
        _im2col_rows(x, cols, b0, b1, kh, kw, sh, dh, sw, pt, pl, oh, ow)
    else:
        _im2col_taps(x, cols, b0, b1, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow)


@kernel
def _col2im_rows(cols, dx, b0, b1, kh, kw, sh, dh, sw, pt, pl, oh, ow):  # type: ignore[no-untyped-def]
    n, h, w, c = dx.shape
    rows = dx.reshape(n * h, w * c)
    span = kw * c
    for b in range(b0, b1):
        for i in range(oh):
            h0 = i * sh - pt
            for j in range(ow):
                w0 = j * sw - pl
                src = cols[((b - b0) * oh + i) * ow + j]
                left = np.uintp(max(0, -w0) * c)
                right = np.uintp(max(min(kw, w - w0) * c, left))
                start = np.uintp(max(w0, 0) * c)
                for p in range(kh):
                    ih = h0 + p * dh
                    if ih < 0 or ih >= h:
                        continue
                    dst = rows[b * h + ih]
                    base = np.uintp(p * span) + left
                    for t in range(right - left):
                        dst[start + t] += src[base + t]


@kernel
def _col2im_taps(cols, dx, b0, b1, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow):  # type: ignore[no-untyped-def]
    n, h, w, c = dx.shape
    for b in range(b0, b1):
        for i in range(oh):
            for j in range(ow):
                src = cols[((b - b0) * oh + i) * ow + j]
                for p in range(kh):
                    ih = i * sh - pt + p * dh
                    for q in range(kw):
                        iw = j * sw - pl + q * dw
                        if 0 <= ih < h and 0 <= iw < w:
                            dst, at = dx[b, ih, iw], np.uintp((p * kw + q) * c)
                            for t in range(np.uintp(c)):
                                dst[t] += src[at + t]


@kernel
def col2im(cols, dx, b0, b1, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow):  # type: ignore[no-untyped-def]
    """The adjoint of im2col: add the patch rows of images ``b0:b1`` back onto ``dx``."""
    if dw == 1:
        _col2im_rows(cols, dx, b0, b1, kh, kw, sh, dh, sw, pt, pl, oh, ow)
    else:
        _col2im_taps(cols, dx, b0, b1, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow)


@kernel
def _is_pointwise(kh, kw, sh, sw, pt, pl):  # type: ignore[no-untyped-def]
    return kh == 1 and kw == 1 and sh == 1 and sw == 1 and pt == 0 and pl == 0


@kernel
def conv2d_forward(x, f, sh, sw, dh, dw, pt, pl, oh, ow):  # type: ignore[no-untyped-def]
    """y = conv2d(x, f) for C-contiguous NHWC ``x`` and HWIO ``f``."""
    n, h, w, c = x.shape
    kh, kw, _, o = f.shape
    k = kh * kw * c
    f2 = f.reshape(k, o)
    if _is_pointwise(kh, kw, sh, sw, pt, pl) and oh == h and ow == w:
        return np.dot(x.reshape(n * h * w, c), f2).reshape(n, oh, ow, o)
    per = oh * ow
    nb = _block_images(per, k, x.itemsize, n)
    cols = np.empty((nb * per, k), x.dtype)
    if nb >= n:  # one block: the GEMM writes the output directly
        im2col(x, cols, 0, n, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow)
        return np.dot(cols[: n * per], f2).reshape(n, oh, ow, o)
    out = np.empty((n * per, o), x.dtype)
    for b0 in range(0, n, nb):
        b1 = min(b0 + nb, n)
        part = cols[: (b1 - b0) * per]
        im2col(x, part, b0, b1, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow)
        out[b0 * per : b1 * per] = np.dot(part, f2)
    return out.reshape(n, oh, ow, o)


@kernel
def conv2d_backprop_filter(x, dy, kh, kw, sh, sw, dh, dw, pt, pl):  # type: ignore[no-untyped-def]
    """df = patches(x)^T @ dy, accumulated a block of images at a time."""
    n, oh, ow, o = dy.shape
    h, w, c = x.shape[1], x.shape[2], x.shape[3]
    k = kh * kw * c
    per = oh * ow
    dy2 = dy.reshape(n * per, o)
    if _is_pointwise(kh, kw, sh, sw, pt, pl) and oh == h and ow == w:
        return np.dot(x.reshape(n * per, c).T, dy2).reshape(kh, kw, c, o)
    nb = _block_images(per, k, x.itemsize, n)
    cols = np.empty((nb * per, k), x.dtype)
    df = np.zeros((k, o), x.dtype)
    for b0 in range(0, n, nb):
        b1 = min(b0 + nb, n)
        part = cols[: (b1 - b0) * per]
        im2col(x, part, b0, b1, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow)
        df += np.dot(part.T, dy2[b0 * per : b1 * per])
    return df.reshape(kh, kw, c, o)


@kernel
def conv2d_backprop_input(dy, f, h, w, sh, sw, dh, dw, pt, pl):  # type: ignore[no-untyped-def]
    """dx of a convolution whose input was ``h`` x ``w``."""
    n, oh, ow, o = dy.shape
    kh, kw, c, _ = f.shape
    k = kh * kw * c
    if sh == 1 and sw == 1:
        # dx = conv2d(dy, f flipped in space with in/out channels swapped),
        # padded so each input pixel meets every output pixel its taps touched.
        flipped = np.empty((kh, kw, o, c), f.dtype)
        for p in range(kh):
            for q in range(kw):
                for ch in range(c):
                    for oc in range(o):
                        flipped[kh - 1 - p, kw - 1 - q, oc, ch] = f[p, q, ch, oc]
        top, left = (kh - 1) * dh - pt, (kw - 1) * dw - pl
        return conv2d_forward(dy, flipped, 1, 1, dh, dw, top, left, h, w)
    per = oh * ow
    dy2 = dy.reshape(n * per, o)
    ft = f.reshape(k, o).T
    dx = np.zeros((n, h, w, c), dy.dtype)
    nb = _block_images(per, k, dy.itemsize, n)
    for b0 in range(0, n, nb):
        b1 = min(b0 + nb, n)
        col2im(np.dot(dy2[b0 * per : b1 * per], ft), dx, b0, b1, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow)
    return dx


# Depthwise convolutions (one input channel a group) walk the windows directly:
# a group's GEMM would be 1 channel deep, too narrow for BLAS to pay for the
# unrolled patches (64 8x8 images of 32 channels: 0.16 ms direct, 2.6 ms as 32
# GEMMs). Wider groups are one im2col + GEMM each (2 groups of 16 channels:
# 0.74 ms, against 9.1 ms walking the windows). The innermost loop runs over a
# group's output channels, or over all channels when each group has one input
# and one output.
@kernel
def grouped_forward(x, f, groups, sh, sw, dh, dw, pt, pl, oh, ow):  # type: ignore[no-untyped-def]
    n, h, w, c = x.shape
    kh, kw, cg, o = f.shape
    og = o // groups
    out = np.zeros((n, oh, ow, o), x.dtype)
    for b in range(n):
        for i in range(oh):
            for j in range(ow):
                acc = out[b, i, j]
                for p in range(kh):
                    ih = i * sh - pt + p * dh
                    if ih < 0 or ih >= h:
                        continue
                    for q in range(kw):
                        iw = j * sw - pl + q * dw
                        if iw < 0 or iw >= w:
                            continue
                        px, taps = x[b, ih, iw], f[p, q]
                        if cg == 1 and og == 1:  # depthwise: one vector product
                            row = taps[0]
                            for ch in range(c):
                                acc[ch] += px[ch] * row[ch]
                            continue
                        for g in range(groups):
                            for ci in range(cg):
                                v, row = px[g * cg + ci], taps[ci]
                                for m in range(g * og, (g + 1) * og):
                                    acc[m] += v * row[m]
    return out


@kernel
def grouped_backprop_input(dy, f, h, w, groups, sh, sw, dh, dw, pt, pl):  # type: ignore[no-untyped-def]
    n, oh, ow, o = dy.shape
    kh, kw, cg, _ = f.shape
    og = o // groups
    dx = np.zeros((n, h, w, cg * groups), dy.dtype)
    for b in range(n):
        for i in range(oh):
            for j in range(ow):
                grad = dy[b, i, j]
                for p in range(kh):
                    ih = i * sh - pt + p * dh
                    if ih < 0 or ih >= h:
                        continue
                    for q in range(kw):
                        iw = j * sw - pl + q * dw
                        if iw < 0 or iw >= w:
                            continue
                        px, taps = dx[b, ih, iw], f[p, q]
                        if cg == 1 and og == 1:
                            row = taps[0]
                            for ch in range(o):
                                px[ch] += grad[ch] * row[ch]
                            continue
                        for g in range(groups):
                            for ci in range(cg):
                                row, acc = taps[ci], px[g * cg + ci]
                                for m in range(g * og, (g + 1) * og):
                                    acc += grad[m] * row[m]
                                px[g * cg + ci] = acc
    return dx


@kernel
def grouped_backprop_filter(x, dy, kh, kw, groups, sh, sw, dh, dw, pt, pl):  # type: ignore[no-untyped-def]
    n, h, w, c = x.shape
    _, oh, ow, o = dy.shape
    cg, og = c // groups, o // groups
    df = np.zeros((kh, kw, cg, o), x.dtype)
    for b in range(n):
        for i in range(oh):
            for j in range(ow):
                grad = dy[b, i, j]
                for p in range(kh):
                    ih = i * sh - pt + p * dh
                    if ih < 0 or ih >= h:
                        continue
                    for q in range(kw):
                        iw = j * sw - pl + q * dw
                        if iw < 0 or iw >= w:
                            continue
                        px, taps = x[b, ih, iw], df[p, q]
                        if cg == 1 and og == 1:
                            row = taps[0]
                            for ch in range(o):
                                row[ch] += px[ch] * grad[ch]
                            continue
                        for g in range(groups):
                            for ci in range(cg):
                                v, row = px[g * cg + ci], taps[ci]
                                for m in range(g * og, (g + 1) * og):
                                    row[m] += v * grad[m]
    return df


class Geometry:
    """Output sizes and leading pads for fixed strides, padding and dilations, per input and window size.

    Computed once per distinct (height, width, window) and then looked up, so
    the batch size may vary freely at a per-call cost of one dict lookup.
    """

    def __init__(self, strides: tuple[int, int], padding: Padding, dilations: tuple[int, int] = (1, 1)) -> None:
        self.strides = strides
        self.padding = padding
        self.dilations = dilations
        self._cache: dict[tuple[int, int, int, int], tuple[int, int, int, int]] = {}

    def __call__(self, h: int, w: int, kh: int, kw: int) -> tuple[int, int, int, int]:
        """(out height, out width, pad top, pad left)."""
        key = (h, w, kh, kw)
        found = self._cache.get(key)
        if found is None:
            oh, pt = window(h, kh, self.strides[0], axis_padding(self.padding, 0), self.dilations[0])
            ow, pl = window(w, kw, self.strides[1], axis_padding(self.padding, 1), self.dilations[1])
            found = self._cache[key] = (oh, ow, pt, pl)
        return found


def _by_group(
    groups: int, parts: list[np.ndarray], run: Callable[..., np.ndarray], shape: tuple[int, ...]
) -> np.ndarray:
    """``run`` on each group's slices of ``parts`` (each split into ``groups`` equal
    slices along its last axis), the results side by side along the last axis."""
    out = np.empty(shape, parts[0].dtype)
    width = shape[-1] // groups
    for g in range(groups):
        sliced = [np.ascontiguousarray(np.split(a, groups, axis=-1)[g]) for a in parts]
        out[..., g * width : (g + 1) * width] = run(*sliced)
    return out


def conv2d(strides: tuple[int, int], padding: Padding, dilations: tuple[int, int] = (1, 1), groups: int = 1) -> Kernel:
    """Kernel of (x, filters) -> y."""
    geometry, (sh, sw), (dh, dw) = Geometry(strides, padding, dilations), strides, dilations

    def forward(x: np.ndarray, f: np.ndarray, oh: int, ow: int, pt: int, pl: int) -> np.ndarray:
        return conv2d_forward(x, f, sh, sw, dh, dw, pt, pl, oh, ow)

    def run(x: np.ndarray, f: np.ndarray) -> np.ndarray:
        oh, ow, pt, pl = geometry(x.shape[1], x.shape[2], f.shape[0], f.shape[1])
        x, f = np.ascontiguousarray(x), np.ascontiguousarray(f)
        if groups > 1 and f.shape[2] == 1:
            return grouped_forward(x, f, groups, sh, sw, dh, dw, pt, pl, oh, ow)
        if groups > 1:
            return _by_group(
                groups, [x, f], lambda a, b: forward(a, b, oh, ow, pt, pl), (x.shape[0], oh, ow, f.shape[3])
            )
        return conv2d_forward(x, f, sh, sw, dh, dw, pt, pl, oh, ow)

    return run


def conv2d_input_grad(
    strides: tuple[int, int], padding: Padding, dilations: tuple[int, int] = (1, 1), groups: int = 1
) -> Kernel:
    """Kernel of (like, filters, dy) -> dx; ``like`` (the input) only lends its shape."""
    geometry, (sh, sw), (dh, dw) = Geometry(strides, padding, dilations), strides, dilations

    def run(like: Any, f: np.ndarray, dy: np.ndarray) -> np.ndarray:
        h, w = like.shape[1], like.shape[2]
        _, _, pt, pl = geometry(h, w, f.shape[0], f.shape[1])
        dy, f = np.ascontiguousarray(dy), np.ascontiguousarray(f)
        if groups > 1 and f.shape[2] == 1:
            return grouped_backprop_input(dy, f, h, w, groups, sh, sw, dh, dw, pt, pl)
        if groups > 1:
            shape = (dy.shape[0], h, w, f.shape[2] * groups)
            return _by_group(
                groups, [dy, f], lambda a, b: conv2d_backprop_input(a, b, h, w, sh, sw, dh, dw, pt, pl), shape
            )
        return conv2d_backprop_input(dy, f, h, w, sh, sw, dh, dw, pt, pl)

    return run


def conv2d_filter_grad(
    strides: tuple[int, int], padding: Padding, dilations: tuple[int, int] = (1, 1), groups: int = 1
) -> Kernel:
    """Kernel of (x, like, dy) -> dfilters; ``like`` (the filter) only lends its shape."""
    geometry, (sh, sw), (dh, dw) = Geometry(strides, padding, dilations), strides, dilations

    def filters(x: np.ndarray, dy: np.ndarray, kh: int, kw: int, pt: int, pl: int) -> np.ndarray:
        return conv2d_backprop_filter(x, dy, kh, kw, sh, sw, dh, dw, pt, pl)

    def run(x: np.ndarray, like: Any, dy: np.ndarray) -> np.ndarray:
        kh, kw = like.shape[0], like.shape[1]
        _, _, pt, pl = geometry(x.shape[1], x.shape[2], kh, kw)
        x, dy = np.ascontiguousarray(x), np.ascontiguousarray(dy)
        if groups > 1 and like.shape[2] == 1:
            return grouped_backprop_filter(x, dy, kh, kw, groups, sh, sw, dh, dw, pt, pl)
        if groups > 1:
            return _by_group(groups, [x, dy], lambda a, b: filters(a, b, kh, kw, pt, pl), tuple(like.shape))
        return conv2d_backprop_filter(x, dy, kh, kw, sh, sw, dh, dw, pt, pl)

    return run
