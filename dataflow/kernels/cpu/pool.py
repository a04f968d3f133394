"""Max and average pooling over NHWC windows, and their gradients.

Padding (SAME) never enters a window: a max sees only real pixels, and an
average divides by the number of real pixels it covered, as TensorFlow does.
The max gradients route through the first largest tap of each window (taps in
row-major order), the one the forward pass kept. A NaN counts as the largest,
as in PyTorch's max_pool2d: a window holding one gives NaN, and its gradient
goes to the first NaN (``max(out, v)`` had kept a NaN only as the first tap).

Every kernel walks a table of *runs*, built once per input size when a node
is bound: for each output row and window tap, the output columns that tap
reaches inside the input. With a column stride of 1 those columns' channels
are one contiguous stretch of both input and output, so the innermost loop is
long enough to vectorize; going pixel by pixel over a few channels costs more
in loop overhead than in arithmetic. Offsets are unsigned so that Numba skips
negative-index wraparound, which would otherwise block vectorization.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from . import kernel
from .conv import window

Kernel = Callable[..., np.ndarray]


@kernel
def window_runs(h, w, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow):  # type: ignore[no-untyped-def]
    """(starts, runs): output row i's runs are ``runs[starts[i]:starts[i + 1]]``, each
    (input row, first input column, first output column, columns), taps in row-major order.

    With a column stride of 1 a tap's columns are contiguous however far apart
    the taps are (dilated): output column j reads input column j + offset.
    """
    per_tap = 1 if sw == 1 else ow
    runs = np.empty((oh * kh * kw * per_tap, 4), np.int64)
    starts = np.zeros(oh + 1, np.int64)
    r = 0
    for i in range(oh):
        h0 = i * sh - pt
        for p in range(kh):
            ih = h0 + p * dh
            if ih < 0 or ih >= h:
                continue
            for q in range(kw):
                offset = q * dw - pl  # output column j reads input column j * sw + offset
                j0 = max(0, -(offset // sw))  # first column whose tap q is inside
                j1 = min(ow, -((offset - w) // sw))
                if j1 <= j0:
                    continue
                if sw == 1:  # one contiguous stretch
                    runs[r, 0], runs[r, 1], runs[r, 2], runs[r, 3] = ih, j0 + offset, j0, j1 - j0
                    r += 1
                else:
                    for j in range(j0, j1):
                        runs[r, 0], runs[r, 1], runs[r, 2], runs[r, 3] = ih, j * sw + offset, j, 1
                        r += 1
        starts[i + 1] = r
    return starts, runs[:r].copy()


@kernel
def window_scale(h, w, kh, kw, sh, sw, pt, pl, oh, ow, c):  # type: ignore[no-untyped-def]
    """(oh, ow * c): 1 / the number of real pixels in each output's window."""
    scale = np.empty((oh, ow * c))
    for i in range(oh):
        h0 = i * sh - pt
        rows = min(kh, h - h0) - max(0, -h0)
        for j in range(ow):
            w0 = j * sw - pl
            inv = 1.0 / (rows * (min(kw, w - w0) - max(0, -w0)))
            for ch in range(c):
                scale[i, j * c + ch] = inv
    return scale


@kernel
def _offsets(run, b, i, h, w, oh, ow, c):  # type: ignore[no-untyped-def]
    """(input offset, output offset, length) of one run, in elements."""
    ih, iw, j, cols = run[0], run[1], run[2], run[3]
    return np.uintp(((b * h + ih) * w + iw) * c), np.uintp(((b * oh + i) * ow + j) * c), np.uintp(cols * c)


@kernel
def max_pool(x, starts, runs, oh, ow):  # type: ignore[no-untyped-def]
    n, h, w, c = x.shape
    src = x.reshape(x.size)
    out = np.full(n * oh * ow * c, -np.inf, x.dtype)
    for b in range(n):
        for i in range(oh):
            for r in range(starts[i], starts[i + 1]):
                xo, oo, length = _offsets(runs[r], b, i, h, w, oh, ow, c)
                for t in range(length):
                    v, cur = src[xo + t], out[oo + t]
                    out[oo + t] = v if (v > cur) | (v != v) else cur
    return out.reshape(n, oh, ow, c)


@kernel
def avg_pool(x, starts, runs, scale, oh, ow):  # type: ignore[no-untyped-def]
    n, h, w, c = x.shape
    src = x.reshape(x.size)
    out = np.zeros(n * oh * ow * c, x.dtype)
    for b in range(n):
        for i in range(oh):
            for r in range(starts[i], starts[i + 1]):
                xo, oo, length = _offsets(runs[r], b, i, h, w, oh, ow, c)
                for t in range(length):
                    out[oo + t] += src[xo + t]
            row = np.uintp((b * oh + i) * ow * c)
            for t in range(np.uintp(ow * c)):
                out[row + t] *= scale[i, t]
    return out.reshape(n, oh, ow, c)


@kernel
def _row_argmax(src, b, i, starts, runs, h, w, oh, ow, c, best, at):  # type: ignore[no-untyped-def]
    """``at[j * c + ch]``: the flat input index of the first maximum of output (b, i, j, ch)'s window."""
    best[:] = -np.inf
    at[:] = -1
    row = np.uintp((b * oh + i) * ow * c)
    for r in range(starts[i], starts[i + 1]):
        xo, oo, length = _offsets(runs[r], b, i, h, w, oh, ow, c)
        o = oo - row
        for t in range(length):
            v = src[xo + t]
            top = best[o + t]
            better = (at[o + t] < 0) | ((top == top) & ((v > top) | (v != v)))  # no branch: it vectorizes
            best[o + t] = v if better else best[o + t]
            at[o + t] = np.int64(xo + t) if better else at[o + t]


@kernel
def max_pool_grad(x, dy, starts, runs):  # type: ignore[no-untyped-def]
    """dx: each output gradient added onto its window's first maximum."""
    n, h, w, c = x.shape
    _, oh, ow, _ = dy.shape
    src, g = x.reshape(x.size), dy.reshape(dy.size)
    dx = np.zeros(x.size, x.dtype)
    best = np.empty(ow * c, x.dtype)
    at = np.empty(ow * c, np.int64)
    for b in range(n):
        for i in range(oh):
            _row_argmax(src, b, i, starts, runs, h, w, oh, ow, c, best, at)
            row = np.uintp((b * oh + i) * ow * c)
            for t in range(np.uintp(ow * c)):
                dx[at[t]] += g[row + t]
    return dx.reshape(x.shape)


@kernel
def max_pool_grad_grad(x, ddx, starts, runs, oh, ow):  # type: ignore[no-untyped-def]
    """The gradient of max_pool_grad for its ``dy``: ``ddx`` read at each window's first maximum."""
    n, h, w, c = x.shape
    src, gg = x.reshape(x.size), ddx.reshape(ddx.size)
    out = np.empty(n * oh * ow * c, x.dtype)
    best = np.empty(ow * c, x.dtype)
    at = np.empty(ow * c, np.int64)
    for b in range(n):
        for i in range(oh):
            _row_argmax(src, b, i, starts, runs, h, w, oh, ow, c, best, at)
            row = np.uintp((b * oh + i) * ow * c)
            for t in range(np.uintp(ow * c)):
                out[row + t] = gg[at[t]]
    return out.reshape(n, oh, ow, c)


@kernel
def max_pool_argmax(x, starts, runs, oh, ow, with_batch):  # type: ignore[no-untyped-def]
    """(max-pooled x, flat index of each window's first maximum, within its image unless ``with_batch``)."""
    n, h, w, c = x.shape
    src = x.reshape(x.size)
    out = np.empty(n * oh * ow * c, x.dtype)
    where = np.empty(n * oh * ow * c, np.int64)
    best = np.empty(ow * c, x.dtype)
    at = np.empty(ow * c, np.int64)
    for b in range(n):
        shift = 0 if with_batch else b * h * w * c
        for i in range(oh):
            _row_argmax(src, b, i, starts, runs, h, w, oh, ow, c, best, at)
            row = np.uintp((b * oh + i) * ow * c)
            for t in range(np.uintp(ow * c)):
                out[row + t] = best[t]
                where[row + t] = at[t] - shift
    return out.reshape(n, oh, ow, c), where.reshape(n, oh, ow, c)


@kernel
def avg_pool_grad(dy, h, w, starts, runs, scale):  # type: ignore[no-untyped-def]
    """dx: each output gradient spread evenly over the real pixels of its window."""
    n, oh, ow, c = dy.shape
    g = dy.reshape(dy.size)
    dx = np.zeros(n * h * w * c, dy.dtype)
    for b in range(n):
        for i in range(oh):
            row = np.uintp((b * oh + i) * ow * c)
            for r in range(starts[i], starts[i + 1]):
                xo, oo, length = _offsets(runs[r], b, i, h, w, oh, ow, c)
                o = oo - row
                for t in range(length):
                    dx[xo + t] += g[oo + t] * scale[i, o + t]
    return dx.reshape(n, h, w, c)


class Windows:
    """The run table and averaging scale of one pooling node, per input size (built once each)."""

    def __init__(
        self, ksize: tuple[int, int], strides: tuple[int, int], padding: str, dilations: tuple[int, int] = (1, 1)
    ) -> None:
        # Dilated windows are VALID (the shape rule says so): every tap is inside, so the
        # averaging scale, which counts real pixels of undilated windows, stays right.
        self.ksize, self.strides, self.padding, self.dilations = ksize, strides, padding, dilations
        self._cache: dict[tuple[int, int, int], tuple[int, int, np.ndarray, np.ndarray, np.ndarray | None]] = {}

    def __call__(
        self, h: int, w: int, c: int, scale: bool = False
    ) -> tuple[int, int, np.ndarray, np.ndarray, np.ndarray | None]:
        """(out height, out width, starts, runs, scale or None)."""
        key = (h, w, c if scale else -1)
        found = self._cache.get(key)
        if found is None:
            (kh, kw), (sh, sw), (dh, dw) = self.ksize, self.strides, self.dilations
            oh, pt = window(h, kh, sh, self.padding, dh)
            ow, pl = window(w, kw, sw, self.padding, dw)
            starts, runs = window_runs(h, w, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow)
            weights = window_scale(h, w, kh, kw, sh, sw, pt, pl, oh, ow, c) if scale else None
            found = self._cache[key] = (oh, ow, starts, runs, weights)
        return found


def max_pool_forward(
    ksize: tuple[int, int], strides: tuple[int, int], padding: str, dilations: tuple[int, int] = (1, 1)
) -> Kernel:
    """Kernel of x -> max-pooled x."""
    windows = Windows(ksize, strides, padding, dilations)

    def run(x: np.ndarray) -> np.ndarray:
        oh, ow, starts, runs, _ = windows(x.shape[1], x.shape[2], x.shape[3])
        return max_pool(np.ascontiguousarray(x), starts, runs, oh, ow)

    return run


def avg_pool_forward(
    ksize: tuple[int, int], strides: tuple[int, int], padding: str, dilations: tuple[int, int] = (1, 1)
) -> Kernel:
    """Kernel of x -> average-pooled x."""
    windows = Windows(ksize, strides, padding, dilations)

    def run(x: np.ndarray) -> np.ndarray:
        oh, ow, starts, runs, scale = windows(x.shape[1], x.shape[2], x.shape[3], scale=True)
        return avg_pool(np.ascontiguousarray(x), starts, runs, scale, oh, ow)

    return run


def max_pool_backprop(
    ksize: tuple[int, int], strides: tuple[int, int], padding: str, dilations: tuple[int, int] = (1, 1)
) -> Kernel:
    """Kernel of (x, dy) -> dx."""
    windows = Windows(ksize, strides, padding, dilations)

    def run(x: np.ndarray, dy: np.ndarray) -> np.ndarray:
        _, _, starts, runs, _ = windows(x.shape[1], x.shape[2], x.shape[3])
        return max_pool_grad(np.ascontiguousarray(x), np.ascontiguousarray(dy), starts, runs)

    return run


def max_pool_backprop_backprop(
    ksize: tuple[int, int], strides: tuple[int, int], padding: str, dilations: tuple[int, int] = (1, 1)
) -> Kernel:
    """Kernel of (x, ddx) -> ddy."""
    windows = Windows(ksize, strides, padding, dilations)

    def run(x: np.ndarray, ddx: np.ndarray) -> np.ndarray:
        oh, ow, starts, runs, _ = windows(x.shape[1], x.shape[2], x.shape[3])
        return max_pool_grad_grad(np.ascontiguousarray(x), np.ascontiguousarray(ddx), starts, runs, oh, ow)

    return run


def avg_pool_backprop(
    ksize: tuple[int, int], strides: tuple[int, int], padding: str, dilations: tuple[int, int] = (1, 1)
) -> Kernel:
    """Kernel of (like, dy) -> dx; ``like`` (the input) only lends its shape."""
    windows = Windows(ksize, strides, padding, dilations)

    def run(like: np.ndarray, dy: np.ndarray) -> np.ndarray:
        h, w, c = like.shape[1], like.shape[2], like.shape[3]
        _, _, starts, runs, scale = windows(h, w, c, scale=True)
        return avg_pool_grad(np.ascontiguousarray(dy), h, w, starts, runs, scale)

    return run


def max_pool_with_argmax(
    ksize: tuple[int, int], strides: tuple[int, int], padding: str, include_batch_in_index: bool
) -> Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """Kernel of x -> (max-pooled x, argmax)."""
    windows = Windows(ksize, strides, padding)

    def run(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        oh, ow, starts, runs, _ = windows(x.shape[1], x.shape[2], x.shape[3])
        return max_pool_argmax(np.ascontiguousarray(x), starts, runs, oh, ow, include_batch_in_index)

    return run
