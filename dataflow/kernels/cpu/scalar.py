"""Scalar functions for fused loops that LLVM can vectorise.

``math.tanh`` in a Numba loop is a call into libm per element (about 14 ns
here: 60 ms for 4M elements, against 1 ms for NumPy's vectorised tanh), and
a call stops the loop from vectorising. ``tanh_f32`` is a rational function
instead, ``x * P(u) / Q(u)`` with ``u = (x / C)^2``, whose coefficients were
fitted for this project by least squares on the relative error over
``[0, C]``; inputs beyond ``C`` are clamped to it (0.9999997, within
3 ulp of the truth up to ``SATURATE``, about 9.01), and past ``SATURATE``,
where float32's tanh is exactly ±1, the result is ±1. Its largest relative error on float32 inputs is
3.8e-7, about 3 ulp (``tests/dataflow/test_scalar.py`` checks it on a dense
grid). Only float32 segments use it: float64 ones keep ``math.tanh``.

``sigmoid_f32`` and ``sigmoid_f64`` are the logistic function written so that
neither tail cancels: ``e = exp(-|x|)`` never overflows, and for x < 0 the
result is ``e / (1 + e)``, whose relative error stays a few ulp down to the
smallest subnormal (``0.5 + 0.5 * tanh(x / 2)`` loses every digit below about
1e-7 in float32: ``log(sigmoid(-40))`` came out as -15.79).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

CLAMP = 7.90531110763549805
# 1 - tanh(x) = 2 / (exp(2x) + 1) is below half an ulp of 1 (2**-25) from here on: float32's tanh rounds to 1.
SATURATE = 0.5 * math.log(2.0 * 2.0**25)
_INV = 1.0 / CLAMP
P0, P1, P2, P3 = 0.9999999987420751, 8.207058887574572, 12.33616788650354, 2.866538502460335
P4, P5, P6 = -0.3473524353688985, 0.06310782712293847, -0.007355292819293501
Q1, Q2, Q3 = 29.038372626718466, 96.51133395880215, 64.1119468482096


@njit(inline="always", nogil=True, cache=True)
def tanh_f32(x):  # type: ignore[no-untyped-def]
    # Clamp with comparisons that keep NaN as NaN (NaN > C is false).
    c = CLAMP if x > CLAMP else x
    c = -CLAMP if c < -CLAMP else c
    u = (c * _INV) * (c * _INV)
    p = ((((((P6 * u + P5) * u + P4) * u + P3) * u + P2) * u + P1) * u) + P0
    q = (((Q3 * u + Q2) * u + Q1) * u) + 1.0
    r = c * p / q
    # Past SATURATE float32's tanh is exactly +-1, as libm's and the op-by-op kernel's (vector_f32.tanh_f32v) are,
    # so that 1 - y**2 is 0 there: the clamp alone gave 0.9999997 for every x past it (fused tanh(50) was not 1).
    # Selects, not branches: the loop still vectorises.
    r = 1.0 if x > SATURATE else r
    return -1.0 if x < -SATURATE else r


_ONE_F32 = np.float32(1.0)
_ZERO_F32 = np.float32(0.0)


@njit(inline="always", nogil=True, cache=True)
def sigmoid_f32(x):  # type: ignore[no-untyped-def]
    # float32 constants keep the arithmetic in float32, as the op-by-op kernel's result is.
    e = math.exp(-abs(x))
    r = _ONE_F32 / (_ONE_F32 + e)
    # NaN >= 0 is false and e * r is NaN: NaN stays NaN.
    return r if x >= _ZERO_F32 else e * r


@njit(inline="always", nogil=True, cache=True)
def sigmoid_f64(x):  # type: ignore[no-untyped-def]
    e = math.exp(-abs(x))
    r = 1.0 / (1.0 + e)
    return r if x >= 0.0 else e * r
