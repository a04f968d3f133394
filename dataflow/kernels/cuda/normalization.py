"""Layer normalization on the GPU: one thread per row, the CPU kernel's arithmetic.

A thread walks its row three times (mean, variance, output), accumulating in
float64 as the CPU kernel does (``kernels/cpu/normalization.py`` has the
formulas). The backward pass writes ``dx`` row by row and ``dy * xhat`` beside
it; ``dgamma`` and ``dbeta`` are then column sums by the tree reduction of
``reduce.py``, rather than every row adding into one column at once.
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
    if var + eps > 0.0:
        return mean, 1.0 / math.sqrt(var + eps)
    return mean, np.inf  # a constant row with epsilon 0: IEEE's 1 / 0, without the division raising


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


# ------------------------------------------------------------ kernel factories
def layer_norm_op(node: Any, ctx: Any) -> Callable[[Any, Any, Any], Any]:
    eps, begin = node.attrs["epsilon"], node.attrs["begin_axis"]
    return lambda x, gamma, beta: layer_norm(x, gamma, beta, eps, begin)


def layer_norm_grad_op(node: Any, ctx: Any) -> Callable[[Any, Any, Any], Any]:
    eps, begin = node.attrs["epsilon"], node.attrs["begin_axis"]
    return lambda dy, x, gamma: layer_norm_grad(dy, x, gamma, eps, begin)
