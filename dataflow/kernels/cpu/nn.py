"""Activations, softmax, cross-entropy, bias and dropout kernels.

Elementwise kernels take C-contiguous arrays (their callers make sure) and
loop over the flat buffer once; reshaping to the input's shape keeps a
rank-0 input a rank-0 array.
"""

from __future__ import annotations

import math

import numpy as np

from . import kernel
from . import vector_f32 as f32
from .reduce import reducer


# ------------------------------------------------------------ activations
@kernel
def relu(x):  # type: ignore[no-untyped-def]
    src = x.ravel()
    out = np.empty_like(src)
    for i in range(src.size):
        out[i] = 0 if src[i] <= 0 else src[i]  # NaN <= 0 is false: NaN stays NaN, as in NumPy and PyTorch
    return out.reshape(x.shape)


def sigmoid(x):  # type: ignore[no-untyped-def]
    """float32 through ``vector_f32``'s vectorised loop (7x faster here), other dtypes through libm's exp."""
    return f32.sigmoid(x) if x.dtype == np.float32 else _sigmoid_libm(x)


def tanh(x):  # type: ignore[no-untyped-def]
    """float32 through ``vector_f32``'s vectorised loop (20x faster here), other dtypes through libm's tanh."""
    return f32.tanh(x) if x.dtype == np.float32 else _tanh_libm(x)


@kernel
def _sigmoid_libm(x):  # type: ignore[no-untyped-def]
    src = x.ravel()
    out = np.empty_like(src)
    for i in range(src.size):
        v = src[i]
        if v >= 0:  # exp of a non-positive number never overflows
            out[i] = 1.0 / (1.0 + math.exp(-v))
        else:
            e = math.exp(v)
            out[i] = e / (1.0 + e)
    return out.reshape(x.shape)


@kernel
def _tanh_libm(x):  # type: ignore[no-untyped-def]
    src = x.ravel()
    out = np.empty_like(src)
    for i in range(src.size):
        out[i] = math.tanh(src[i])
    return out.reshape(x.shape)


@kernel
def relu_grad(dy, y):  # type: ignore[no-untyped-def]
    g, z = dy.ravel(), y.ravel()
    out = np.empty_like(g)
    for i in range(g.size):
        out[i] = g[i] if z[i] > 0 else 0
    return out.reshape(dy.shape)


@kernel
def sigmoid_grad(dy, y):  # type: ignore[no-untyped-def]
    g, z = dy.ravel(), y.ravel()
    out = np.empty_like(g)
    for i in range(g.size):
        out[i] = g[i] * z[i] * (1 - z[i])
    return out.reshape(dy.shape)


@kernel
def tanh_grad(dy, y):  # type: ignore[no-untyped-def]
    g, z = dy.ravel(), y.ravel()
    out = np.empty_like(g)
    for i in range(g.size):
        out[i] = g[i] * (1 - z[i] * z[i])
    return out.reshape(dy.shape)


# ---------------------------------------------------------------- softmax
@kernel
def softmax_rows(x, log):  # type: ignore[no-untyped-def]
    """Softmax (or log-softmax) of each row of a 2-D array, shifted by the row max."""
    rows, cols = x.shape
    out = np.empty_like(x)
    if cols == 0:  # nothing to normalise (and no first element to start the max from)
        return out
    for r in range(rows):
        top = x[r, 0]
        for j in range(1, cols):
            top = max(top, x[r, j])
        total = 0.0
        for j in range(cols):
            e = math.exp(x[r, j] - top)
            out[r, j] = e
            total += e
        if log:
            # (x - top) - log(total), not x - (top + log(total)): at logits of 1e30 the sum
            # top + log(total) rounds back to top and every log-probability came out 0.
            lse = math.log(total)
            for j in range(cols):
                out[r, j] = (x[r, j] - top) - lse
        else:
            inv = 1.0 / total
            for j in range(cols):
                out[r, j] *= inv
    return out


def softmax(x: np.ndarray, axis: int, log: bool) -> np.ndarray:
    """Softmax (or log-softmax) of ``x`` along ``axis``, as rows of that axis moved last
    (no copy when it is last already; any dim may be 0)."""
    last = np.ascontiguousarray(np.moveaxis(x, axis, -1))
    out = softmax_rows(last.reshape(math.prod(last.shape[:-1]), last.shape[-1]), log)
    return np.ascontiguousarray(np.moveaxis(out.reshape(last.shape), -1, axis))


@kernel
def sparse_softmax_xent(logits, labels):  # type: ignore[no-untyped-def]
    """(loss per row, softmax - onehot, index of the first bad label or -1)."""
    n, classes = logits.shape
    loss = np.empty(n, logits.dtype)
    backprop = np.empty_like(logits)
    for r in range(n):
        label = labels[r]
        if label < 0 or label >= classes:
            return loss, backprop, r
        top = logits[r, 0]
        for j in range(1, classes):
            top = max(top, logits[r, j])
        total = 0.0
        for j in range(classes):
            e = math.exp(logits[r, j] - top)
            backprop[r, j] = e
            total += e
        loss[r] = math.log(total) - (logits[r, label] - top)  # top + log(total) would round off log(total)
        inv = 1.0 / total
        for j in range(classes):
            backprop[r, j] *= inv
        backprop[r, label] -= 1
    return loss, backprop, -1


# ------------------------------------------------------------------- bias
@kernel
def bias_add(x, bias):  # type: ignore[no-untyped-def]
    c = bias.size
    if c == 0:  # nothing to add (and no rows to count)
        return x.copy()
    rows = x.reshape(x.size // c, c)
    out = np.empty_like(rows)
    for r in range(rows.shape[0]):
        for j in range(c):
            out[r, j] = rows[r, j] + bias[j]
    return out.reshape(x.shape)


def bias_add_grad(dy: np.ndarray, c: int) -> np.ndarray:
    """``dy`` summed over every axis but the last, by the sum reduction (kernels/cpu/reduce.py): float32 in a
    float64 accumulator. Summed row by row in float32, 400000 rows were 1e-5 off."""
    if c == 0:
        return np.zeros(0, dy.dtype)
    return _column_sums(dy.reshape(dy.size // c, c))


_column_sums = reducer("sum", (0,), False)


# ---------------------------------------------------------------- dropout
@kernel
def dropout(x, u, rate, scale):  # type: ignore[no-untyped-def]
    """(x * mask, mask): mask is ``scale`` where uniform ``u >= rate``, else 0."""
    src, draw = x.ravel(), u.ravel()
    out = np.empty_like(src)
    mask = np.empty_like(src)
    for i in range(src.size):
        keep = scale if draw[i] >= rate else 0
        mask[i] = keep
        out[i] = src[i] * keep
    return out.reshape(x.shape), mask.reshape(x.shape)
