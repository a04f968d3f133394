"""Layer normalization, forward and backward, each one pass over the rows.

``x`` is seen as ``(rows, n)``: the normalized axes (the last ones) are one
row of ``n`` elements. A row's mean and variance are accumulated in float64
(two passes over the row, which is in cache: no cancellation as with
``E[x^2] - E[x]^2``), and the row is written at once. The backward pass
recomputes the row's statistics rather than keeping them from the forward
pass: one more read of a row in cache, and no extra tensors alive between the
passes. With ``xhat = (x - mean) * rstd`` and ``g = dy * gamma``::

    dx     = rstd * (g - mean(g) - xhat * mean(g * xhat))
    dgamma = sum over rows of dy * xhat
    dbeta  = sum over rows of dy

>>> import numpy as np
>>> x = np.array([[1.0, 2.0, 3.0], [2.0, 2.0, 2.0]])
>>> layer_norm(x, np.ones(3), np.zeros(3), 0.0, 1)[0].round(4)
array([-1.2247,  0.    ,  1.2247])
"""

from __future__ import annotations

import math

import numpy as np

from . import kernel


@kernel
def rstd_of(v):  # type: ignore[no-untyped-def]
    """``1 / sqrt(v)`` of a variance plus epsilon: IEEE's inf at 0 (a constant row with epsilon 0) without the
    division raising, and NaN at NaN (a row holding an inf or a NaN, as PyTorch gives); ``v > 0`` alone made
    that inf, and the row came out as infinities."""
    if v > 0.0:
        return 1.0 / np.sqrt(v)
    return np.inf if v == 0.0 else np.nan


@kernel
def _row_stats(x2, r, eps):  # type: ignore[no-untyped-def]
    n = x2.shape[1]
    mean = 0.0
    for j in range(n):
        mean += x2[r, j]
    mean /= n
    var = 0.0
    for j in range(n):
        d = x2[r, j] - mean
        var += d * d
    var /= n
    return mean, rstd_of(var + eps)


@kernel
def _forward(x2, gamma, beta, eps, y2):  # type: ignore[no-untyped-def]
    rows, n = x2.shape
    if n == 0:
        return y2
    for r in range(rows):
        mean, rstd = _row_stats(x2, r, eps)
        for j in range(n):
            y2[r, j] = (x2[r, j] - mean) * rstd * gamma[j] + beta[j]
    return y2


@kernel
def _backward(dy2, x2, gamma, eps, dx2, dgamma, dbeta):  # type: ignore[no-untyped-def]
    rows, n = x2.shape
    if n == 0:
        return dx2
    for r in range(rows):
        mean, rstd = _row_stats(x2, r, eps)
        sum_g = 0.0
        sum_gx = 0.0
        for j in range(n):
            xhat = (x2[r, j] - mean) * rstd
            g = dy2[r, j] * gamma[j]
            sum_g += g
            sum_gx += g * xhat
            dgamma[j] += dy2[r, j] * xhat
            dbeta[j] += dy2[r, j]
        for j in range(n):
            xhat = (x2[r, j] - mean) * rstd
            dx2[r, j] = rstd * (dy2[r, j] * gamma[j] - sum_g / n - xhat * sum_gx / n)
    return dx2


def _rows(x: np.ndarray, begin_axis: int) -> np.ndarray:
    return np.ascontiguousarray(x).reshape(math.prod(x.shape[:begin_axis]), math.prod(x.shape[begin_axis:]))


def layer_norm(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float, begin_axis: int) -> np.ndarray:
    """``(x - mean) / sqrt(var + eps) * gamma + beta`` over the axes from ``begin_axis`` on."""
    x2 = _rows(x, begin_axis)
    y2 = np.empty_like(x2)
    _forward(x2, np.ascontiguousarray(gamma).reshape(-1), np.ascontiguousarray(beta).reshape(-1), eps, y2)
    return y2.reshape(x.shape)


def layer_norm_grad(
    dy: np.ndarray, x: np.ndarray, gamma: np.ndarray, eps: float, begin_axis: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(dx, dgamma, dbeta)`` of :func:`layer_norm` for the upstream gradient ``dy``."""
    x2, dy2 = _rows(x, begin_axis), _rows(dy, begin_axis)
    dx2 = np.empty_like(x2)
    n = x2.shape[1]
    dgamma, dbeta = np.zeros(n, np.float64), np.zeros(n, np.float64)
    _backward(dy2, x2, np.ascontiguousarray(gamma).reshape(-1), eps, dx2, dgamma, dbeta)
    return dx2.reshape(x.shape), dgamma.astype(x.dtype).reshape(gamma.shape), dbeta.astype(x.dtype).reshape(gamma.shape)


# ------------------------------------------------------------ batch norm
# x is seen as (outer, channels, inner): NHWC is (N*H*W, C, 1), NCHW is (N, C, H*W).
# Every pass walks x in memory order and accumulates per channel (float64), so
# channels-last data is read row by row, never with a stride of C. Channels-last
# data (inner 1) goes to the (rows, channels) kernels ``*_last``, whose innermost
# loop runs over the channels and vectorizes (an inner loop of length 1 would
# not: 4-5x slower on (4096, 32)).
@kernel
def _channel_stats(x3, mean, var):  # type: ignore[no-untyped-def]
    outer, channels, inner = x3.shape
    count = outer * inner
    for c in range(channels):
        mean[c] = 0.0
        var[c] = 0.0
    if count == 0:
        mean[:] = np.nan  # 0 / 0, as reduce_mean gives over an empty batch
        var[:] = np.nan
        return
    for o in range(outer):
        for c in range(channels):
            for i in range(inner):
                mean[c] += x3[o, c, i]
    for c in range(channels):
        mean[c] /= count
    for o in range(outer):
        for c in range(channels):
            for i in range(inner):
                d = x3[o, c, i] - mean[c]
                var[c] += d * d
    for c in range(channels):
        var[c] /= count


@kernel
def _scale_shift(mean, var, gamma, beta, eps, scale, shift):  # type: ignore[no-untyped-def]
    for c in range(mean.shape[0]):
        rstd = rstd_of(var[c] + eps)
        scale[c] = gamma[c] * rstd
        shift[c] = beta[c] - mean[c] * scale[c]


@kernel
def _bn_forward(x3, scale, shift, y3):  # type: ignore[no-untyped-def]
    outer, channels, inner = x3.shape
    for o in range(outer):
        for c in range(channels):
            for i in range(inner):
                y3[o, c, i] = x3[o, c, i] * scale[c] + shift[c]
    return y3


@kernel
def _bn_backward(dy3, x3, gamma, mean, var, eps, dx3, dgamma, dbeta):  # type: ignore[no-untyped-def]
    outer, channels, inner = x3.shape
    count = outer * inner
    rstd = np.empty(channels)
    for c in range(channels):
        rstd[c] = rstd_of(var[c] + eps)
    for o in range(outer):
        for c in range(channels):
            for i in range(inner):
                dbeta[c] += dy3[o, c, i]
                dgamma[c] += dy3[o, c, i] * (x3[o, c, i] - mean[c]) * rstd[c]
    if count == 0:
        return dx3
    for o in range(outer):
        for c in range(channels):
            for i in range(inner):
                xhat = (x3[o, c, i] - mean[c]) * rstd[c]
                dx3[o, c, i] = gamma[c] * rstd[c] * (dy3[o, c, i] - dbeta[c] / count - xhat * dgamma[c] / count)
    return dx3


@kernel
def _channel_stats_last(x2, mean, var):  # type: ignore[no-untyped-def]
    rows, channels = x2.shape
    mean[:] = 0.0
    var[:] = 0.0
    if rows == 0:
        mean[:] = np.nan  # 0 / 0, as reduce_mean gives over an empty batch
        var[:] = np.nan
        return
    for o in range(rows):
        for c in range(channels):
            mean[c] += x2[o, c]
    mean /= rows
    for o in range(rows):
        for c in range(channels):
            d = x2[o, c] - mean[c]
            var[c] += d * d
    var /= rows


@kernel
def _bn_forward_last(x2, scale, shift, y2):  # type: ignore[no-untyped-def]
    rows, channels = x2.shape
    for o in range(rows):
        for c in range(channels):
            y2[o, c] = x2[o, c] * scale[c] + shift[c]
    return y2


@kernel
def _bn_backward_last(dy2, x2, gamma, mean, var, eps, dx2, dgamma, dbeta):  # type: ignore[no-untyped-def]
    rows, channels = x2.shape
    rstd = np.empty(channels)
    for c in range(channels):
        rstd[c] = rstd_of(var[c] + eps)
    for o in range(rows):
        for c in range(channels):
            d = dy2[o, c]
            dbeta[c] += d
            dgamma[c] += d * (x2[o, c] - mean[c]) * rstd[c]
    if rows == 0:
        return dx2
    for o in range(rows):
        for c in range(channels):
            xhat = (x2[o, c] - mean[c]) * rstd[c]
            dx2[o, c] = gamma[c] * rstd[c] * (dy2[o, c] - dbeta[c] / rows - xhat * dgamma[c] / rows)
    return dx2


def channels_view(x: np.ndarray, axis: int) -> np.ndarray:
    """``x`` as (outer, channels, inner) around its channel ``axis``."""
    shape = x.shape
    return np.ascontiguousarray(x).reshape(math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1 :]))


def batch_norm_training(
    x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float, axis: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(y, mean, variance)``: ``x`` normalized by its batch statistics per channel, then scaled and shifted."""
    x3 = channels_view(x, axis)
    channels = x3.shape[1]
    mean, var = np.empty(channels), np.empty(channels)
    scale, shift = np.empty(channels), np.empty(channels)
    y3 = np.empty_like(x3)
    if x3.shape[2] == 1:
        x2, y2 = x3.reshape(x3.shape[:2]), y3.reshape(x3.shape[:2])  # C-contiguous 2-D: Numba's fast layout
        _channel_stats_last(x2, mean, var)
        _scale_shift(mean, var, gamma.astype(np.float64), beta.astype(np.float64), eps, scale, shift)
        _bn_forward_last(x2, scale, shift, y2)
    else:
        _channel_stats(x3, mean, var)
        _scale_shift(mean, var, gamma.astype(np.float64), beta.astype(np.float64), eps, scale, shift)
        _bn_forward(x3, scale, shift, y3)
    return y3.reshape(x.shape), mean.astype(x.dtype), var.astype(x.dtype)


def batch_norm_grad(
    dy: np.ndarray, x: np.ndarray, gamma: np.ndarray, mean: np.ndarray, var: np.ndarray, eps: float, axis: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(dx, dgamma, dbeta)`` of :func:`batch_norm_training` for the upstream gradient ``dy`` of ``y``."""
    x3, dy3 = channels_view(x, axis), channels_view(dy, axis)
    channels = x3.shape[1]
    dx3 = np.empty_like(x3)
    dgamma, dbeta = np.zeros(channels), np.zeros(channels)
    stats = gamma.astype(np.float64), mean.astype(np.float64), var.astype(np.float64)
    if x3.shape[2] == 1:
        rows = x3.shape[:2]
        _bn_backward_last(dy3.reshape(rows), x3.reshape(rows), *stats, eps, dx3.reshape(rows), dgamma, dbeta)
    else:
        _bn_backward(dy3, x3, *stats, eps, dx3, dgamma, dbeta)
    return dx3.reshape(x.shape), dgamma.astype(x.dtype), dbeta.astype(x.dtype)
