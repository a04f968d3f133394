"""Kernels of the activations in ``ops/activations.py``.

Each loops once over the flat buffer, computing in the scalar arithmetic of
the input's dtype and storing into an output of that dtype. An attr (leaky
relu's and elu's ``alpha``) comes in as an argument. Every formula keeps NaN
as NaN: a comparison with NaN is false, so it falls through to arithmetic
on the NaN itself.

Examples
--------
>>> import numpy as np
>>> leaky_relu(np.array([-2.0, 3.0]), 0.5)
array([-1.,  3.])
"""

from __future__ import annotations

import math

import numpy as np

from . import gelu_f32 as g32
from . import kernel
from . import vector_f32 as f32

SELU_ALPHA = 1.6732632423543772848170429916717
SELU_SCALE = 1.0507009873554804934193349852946
SQRT_HALF = 0.7071067811865476  # 1 / sqrt(2)
SQRT_2_OVER_PI = 0.7978845608028654
INV_SQRT_2PI = 0.3989422804014327  # the standard normal density at 0
GELU_CUBIC = 0.044715


@kernel
def leaky_relu(x, alpha):  # type: ignore[no-untyped-def]
    src = np.ascontiguousarray(x).ravel()
    out = np.empty_like(src)
    for i in range(src.size):
        v = src[i]
        out[i] = v if v > 0 else v * alpha
    return out.reshape(x.shape)


def elu(x, alpha):  # type: ignore[no-untyped-def]
    """float32 through ``vector_f32``'s vectorised loop, other dtypes through libm."""
    return f32.elu(x, alpha) if x.dtype == np.float32 else _elu_libm(x, alpha)


@kernel
def _elu_libm(x, alpha):  # type: ignore[no-untyped-def]
    src = np.ascontiguousarray(x).ravel()
    out = np.empty_like(src)
    for i in range(src.size):
        v = src[i]
        out[i] = v if v > 0 else alpha * math.expm1(v)
    return out.reshape(x.shape)


def selu(x):  # type: ignore[no-untyped-def]
    """float32 through ``vector_f32``'s vectorised loop, other dtypes through libm."""
    return f32.selu(x) if x.dtype == np.float32 else _selu_libm(x)


@kernel
def _selu_libm(x):  # type: ignore[no-untyped-def]
    src = np.ascontiguousarray(x).ravel()
    out = np.empty_like(src)
    for i in range(src.size):
        v = src[i]
        out[i] = SELU_SCALE * (v if v > 0 else SELU_ALPHA * math.expm1(v))
    return out.reshape(x.shape)


def gelu(x):  # type: ignore[no-untyped-def]
    """float32 through ``gelu_f32``'s vectorised loop (4x faster here), other dtypes through libm's erfc."""
    return g32.gelu(x) if x.dtype == np.float32 else _gelu_libm(x)


@kernel
def _gelu_libm(x):  # type: ignore[no-untyped-def]
    src = np.ascontiguousarray(x).ravel()
    out = np.empty_like(src)
    for i in range(src.size):
        v = src[i]
        out[i] = 0.5 * v * math.erfc(-v * SQRT_HALF)  # 1 + erf(v / sqrt 2), without its cancellation
    return out.reshape(x.shape)


def gelu_grad(dy, x):  # type: ignore[no-untyped-def]
    """float32 through ``gelu_f32``'s vectorised loop, other dtypes through libm."""
    return g32.gelu_grad(dy, x) if dy.dtype == np.float32 and x.dtype == np.float32 else _gelu_grad_libm(dy, x)


@kernel
def _gelu_grad_libm(dy, x):  # type: ignore[no-untyped-def]
    g = np.ascontiguousarray(dy).ravel()
    src = np.ascontiguousarray(x).ravel()
    out = np.empty_like(g)
    for i in range(src.size):
        v = src[i]  # d/dx x Phi(x) = Phi(x) + x phi(x)
        out[i] = g[i] * (0.5 * math.erfc(-v * SQRT_HALF) + v * math.exp(-0.5 * v * v) * INV_SQRT_2PI)
    return out.reshape(dy.shape)


@kernel
def gelu_tanh(x):  # type: ignore[no-untyped-def]
    src = np.ascontiguousarray(x).ravel()
    out = np.empty_like(src)
    for i in range(src.size):
        v = src[i]
        # 0.5 (1 + tanh(u)) is sigmoid(2u), whose tail-exact form keeps gelu(-10) from becoming 0.
        u2 = 2.0 * SQRT_2_OVER_PI * (v + GELU_CUBIC * v * v * v)
        e = math.exp(-abs(u2))
        out[i] = v * (1.0 / (1.0 + e) if u2 >= 0 else e / (1.0 + e))
    return out.reshape(x.shape)


def softplus(x):  # type: ignore[no-untyped-def]
    """float32 through ``vector_f32``'s vectorised loop, other dtypes through libm."""
    return f32.softplus(x) if x.dtype == np.float32 else _softplus_libm(x)


@kernel
def _softplus_libm(x):  # type: ignore[no-untyped-def]
    src = np.ascontiguousarray(x).ravel()
    out = np.empty_like(src)
    for i in range(src.size):
        v = src[i]
        # log(1 + e^v) = max(v, 0) + log1p(e^-|v|): no overflow for large v, no loss for very negative v.
        out[i] = (v if v > 0 else 0.0) + math.log1p(math.exp(-abs(v)))
    return out.reshape(x.shape)


@kernel
def softsign(x):  # type: ignore[no-untyped-def]
    src = np.ascontiguousarray(x).ravel()
    out = np.empty_like(src)
    for i in range(src.size):
        v = src[i]
        out[i] = v / (1.0 + abs(v))
    return out.reshape(x.shape)


def silu(x):  # type: ignore[no-untyped-def]
    """float32 through ``vector_f32``'s vectorised loop (7x faster here), other dtypes through libm's exp."""
    return f32.silu(x) if x.dtype == np.float32 else _silu_libm(x)


@kernel
def _silu_libm(x):  # type: ignore[no-untyped-def]
    src = np.ascontiguousarray(x).ravel()
    out = np.empty_like(src)
    for i in range(src.size):
        v = src[i]
        e = math.exp(-abs(v))  # the logistic function with neither tail cancelled
        s = 1.0 / (1.0 + e) if v >= 0 else e / (1.0 + e)
        out[i] = v * s
    return out.reshape(x.shape)


@kernel
def relu6(x):  # type: ignore[no-untyped-def]
    src = np.ascontiguousarray(x).ravel()
    out = np.empty_like(src)
    for i in range(src.size):
        v = src[i]
        out[i] = 0.0 if v <= 0 else (6.0 if v >= 6 else v)
    return out.reshape(x.shape)


@kernel
def hard_sigmoid(x):  # type: ignore[no-untyped-def]
    src = np.ascontiguousarray(x).ravel()
    out = np.empty_like(src)
    for i in range(src.size):
        u = src[i] / 6.0 + 0.5
        out[i] = 0.0 if u <= 0 else (1.0 if u >= 1 else u)
    return out.reshape(x.shape)
