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
    if var + eps > 0.0:
        return mean, 1.0 / np.sqrt(var + eps)
    return mean, np.inf  # a constant row with epsilon 0: IEEE's 1 / 0, without the division raising


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
