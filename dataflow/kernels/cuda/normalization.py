"""Layer and batch normalization on the GPU, with the CPU kernels' arithmetic.

Layer norm: one thread per row. A thread walks its row three times (mean,
variance, output), accumulating in float64 as the CPU kernel does
(``kernels/cpu/normalization.py`` has the formulas). The backward pass writes
``dx`` row by row and ``dy * xhat`` beside it; ``dgamma`` and ``dbeta`` are
then column sums by the tree reduction of ``reduce.py``, rather than every row
adding into one column at once.

Batch norm: the per-channel sums are the tree reductions of ``reduce.py`` over
every axis but the channel's; the elementwise passes are one thread per
element, which finds its channel from its flat index, ``(k // inner) % channels``.
"""

from __future__ import annotations

import math as host_math
from collections.abc import Callable
from typing import Any

import numpy as np
from numba import cuda, float64

from . import device_math, launch
from .elementwise import fill
from .reduce import reduce

math = device_math()


@cuda.jit(device=True)
def _rstd_of(v):  # type: ignore[no-untyped-def]
    """``1 / sqrt(v)``: inf at 0, NaN at NaN, as kernels/cpu/normalization.py's ``rstd_of``."""
    if v > 0.0:
        return 1.0 / math.sqrt(v)
    return np.inf if v == 0.0 else np.nan


@cuda.jit(device=True)
def _row_stats(x2, r, eps):  # type: ignore[no-untyped-def]
    n = x2.shape[1]
    mean = float64(0.0)
    for j in range(n):
        mean += x2[r, j]
    mean /= n
    var = float64(0.0)
    for j in range(n):
        d = x2[r, j] - mean
        var += d * d
    var /= n
    return mean, _rstd_of(var + eps)


@cuda.jit
def _forward(x2, gamma, beta, eps, y2):  # type: ignore[no-untyped-def]
    r = cuda.grid(1)
    if r < x2.shape[0]:
        mean, rstd = _row_stats(x2, r, eps)
        for j in range(x2.shape[1]):
            y2[r, j] = (x2[r, j] - mean) * rstd * gamma[j] + beta[j]


@cuda.jit
def _backward(dy2, x2, gamma, eps, dx2, dyx):  # type: ignore[no-untyped-def]
    r = cuda.grid(1)
    if r < x2.shape[0]:
        n = x2.shape[1]
        mean, rstd = _row_stats(x2, r, eps)
        sum_g = float64(0.0)
        sum_gx = float64(0.0)
        for j in range(n):
            xhat = (x2[r, j] - mean) * rstd
            g = dy2[r, j] * gamma[j]
            sum_g += g
            sum_gx += g * xhat
            dyx[r, j] = dy2[r, j] * xhat
        for j in range(n):
            xhat = (x2[r, j] - mean) * rstd
            dx2[r, j] = rstd * (dy2[r, j] * gamma[j] - sum_g / n - xhat * sum_gx / n)


def _rows(x: Any, begin_axis: int) -> Any:
    shape = tuple(x.shape)
    return x.reshape(host_math.prod(shape[:begin_axis]), host_math.prod(shape[begin_axis:]))


def layer_norm(x: Any, gamma: Any, beta: Any, eps: float, begin_axis: int) -> Any:
    x2 = _rows(x, begin_axis)
    y2 = cuda.device_array(x2.shape, x.dtype)
    if x2.size:
        blocks, threads = launch(x2.shape[0])
        _forward[blocks, threads](x2, gamma.reshape(gamma.size), beta.reshape(beta.size), eps, y2)
    return y2.reshape(x.shape)


def layer_norm_grad(dy: Any, x: Any, gamma: Any, eps: float, begin_axis: int) -> tuple[Any, Any, Any]:
    x2, dy2 = _rows(x, begin_axis), _rows(dy, begin_axis)
    if not x2.size:  # nothing to normalize: no gradient but zeros
        return (
            fill(tuple(x.shape), x.dtype, 0),
            fill(tuple(gamma.shape), x.dtype, 0),
            fill(tuple(gamma.shape), x.dtype, 0),
        )
    dx2 = cuda.device_array(x2.shape, x.dtype)
    dyx = cuda.device_array(x2.shape, x.dtype)
    blocks, threads = launch(x2.shape[0])
    _backward[blocks, threads](dy2, x2, gamma.reshape(gamma.size), eps, dx2, dyx)
    dgamma = reduce("sum", dyx, (0,), False).reshape(tuple(gamma.shape))
    dbeta = reduce("sum", dy2, (0,), False).reshape(tuple(gamma.shape))
    return dx2.reshape(tuple(x.shape)), dgamma, dbeta


# ------------------------------------------------------------ batch norm
@cuda.jit
def _centered_square(x, mean, inner, channels, out):  # type: ignore[no-untyped-def]
    k = cuda.grid(1)
    if k < x.size:
        d = x[k] - mean[(k // inner) % channels]
        out[k] = d * d


@cuda.jit
def _bn_forward(x, mean, var, gamma, beta, eps, inner, channels, y):  # type: ignore[no-untyped-def]
    k = cuda.grid(1)
    if k < x.size:
        c = (k // inner) % channels
        v = var[c] + eps
        rstd = _rstd_of(v)
        y[k] = (x[k] - mean[c]) * rstd * gamma[c] + beta[c]


@cuda.jit
def _bn_dy_xhat(dy, x, mean, var, eps, inner, channels, out):  # type: ignore[no-untyped-def]
    k = cuda.grid(1)
    if k < x.size:
        c = (k // inner) % channels
        v = var[c] + eps
        rstd = _rstd_of(v)
        out[k] = dy[k] * (x[k] - mean[c]) * rstd


@cuda.jit
def _bn_backward(dy, x, gamma, mean, var, dgamma, dbeta, eps, inner, channels, count, dx):  # type: ignore[no-untyped-def]
    k = cuda.grid(1)
    if k < x.size:
        c = (k // inner) % channels
        v = var[c] + eps
        rstd = _rstd_of(v)
        xhat = (x[k] - mean[c]) * rstd
        dx[k] = gamma[c] * rstd * (dy[k] - dbeta[c] / count - xhat * dgamma[c] / count)


def _around(shape: tuple[int, ...], axis: int) -> tuple[tuple[int, ...], int, int]:
    """The axes reduced for channel ``axis``, the channel count and the elements after the channel axis."""
    return tuple(a for a in range(len(shape)) if a != axis), shape[axis], host_math.prod(shape[axis + 1 :])


def batch_norm_training(x: Any, gamma: Any, beta: Any, eps: float, axis: int) -> tuple[Any, Any, Any]:
    shape = tuple(x.shape)
    axes, channels, inner = _around(shape, axis)
    mean = reduce("mean", x, axes, False)
    if not x.size:
        return cuda.device_array(shape, x.dtype), mean, fill((channels,), x.dtype, np.nan)
    blocks, threads = launch(x.size)
    flat_x = x.reshape(x.size)
    squares = cuda.device_array(x.size, x.dtype)
    _centered_square[blocks, threads](flat_x, mean, inner, channels, squares)
    var = reduce("mean", squares.reshape(shape), axes, False)
    y = cuda.device_array(x.size, x.dtype)
    _bn_forward[blocks, threads](flat_x, mean, var, gamma, beta, eps, inner, channels, y)
    return y.reshape(shape), mean, var


def batch_norm_grad(dy: Any, x: Any, gamma: Any, mean: Any, var: Any, eps: float, axis: int) -> tuple[Any, Any, Any]:
    shape = tuple(x.shape)
    axes, channels, inner = _around(shape, axis)
    if not x.size:
        zeros = fill((channels,), x.dtype, 0)
        return cuda.device_array(shape, x.dtype), zeros, fill((channels,), x.dtype, 0)
    blocks, threads = launch(x.size)
    flat_x, flat_dy = x.reshape(x.size), dy.reshape(dy.size)
    dy_xhat = cuda.device_array(x.size, x.dtype)
    _bn_dy_xhat[blocks, threads](flat_dy, flat_x, mean, var, eps, inner, channels, dy_xhat)
    dgamma = reduce("sum", dy_xhat.reshape(shape), axes, False)
    dbeta = reduce("sum", dy, axes, False)
    dx = cuda.device_array(x.size, x.dtype)
    count = x.size // channels
    _bn_backward[blocks, threads](flat_dy, flat_x, gamma, mean, var, dgamma, dbeta, eps, inner, channels, count, dx)
    return dx.reshape(shape), dgamma, dbeta


# ------------------------------------------------------------ kernel factories
def layer_norm_op(node: Any, ctx: Any) -> Callable[[Any, Any, Any], Any]:
    eps, begin = node.attrs["epsilon"], node.attrs["begin_axis"]
    return lambda x, gamma, beta: layer_norm(x, gamma, beta, eps, begin)


def layer_norm_grad_op(node: Any, ctx: Any) -> Callable[[Any, Any, Any], Any]:
    eps, begin = node.attrs["epsilon"], node.attrs["begin_axis"]
    return lambda dy, x, gamma: layer_norm_grad(dy, x, gamma, eps, begin)


def batch_norm_training_op(node: Any, ctx: Any) -> Callable[[Any, Any, Any], Any]:
    eps, axis = node.attrs["epsilon"], node.attrs["channel_axis"]
    return lambda x, gamma, beta: batch_norm_training(x, gamma, beta, eps, axis)


def batch_norm_grad_op(node: Any, ctx: Any) -> Callable[..., Any]:
    eps, axis = node.attrs["epsilon"], node.attrs["channel_axis"]
    return lambda dy, x, gamma, mean, var: batch_norm_grad(dy, x, gamma, mean, var, eps, axis)
