"""Kernels of the second set of math and logic ops (``ops/math_unary.py``, ``ops/logic.py``).

Most are NumPy array expressions, which Numba fuses into one loop and which
broadcast as NumPy does. A constant that must keep a float32 tensor float32
(a Python float would make the expression float64) comes in as an argument
of the tensor's dtype, from the kernel factory. ``erf`` has no NumPy ufunc,
so it loops over the flat buffer with ``math.erf``.

Examples
--------
>>> import numpy as np
>>> round_half_even(np.array([0.5, 1.5, 2.5, -0.5]))
array([ 0.,  2.,  2., -0.])
"""

from __future__ import annotations

import math

import numpy as np

from . import kernel


# ------------------------------------------------------------ unary math
@kernel
def abs_(x):  # type: ignore[no-untyped-def]
    return np.abs(x)


@kernel
def _sign_signed(x):  # type: ignore[no-untyped-def]
    return np.sign(x)


def sign(x: np.ndarray) -> np.ndarray:
    # Numba's np.sign of an unsigned int goes through the signed type: sign(uint8 255) was 255 (-1 wrapped).
    if x.dtype.kind == "u":
        return (x != 0).astype(x.dtype)
    return _sign_signed(x)  # type: ignore[no-any-return]


@kernel
def floor(x):  # type: ignore[no-untyped-def]
    return np.floor(x)


@kernel
def ceil(x):  # type: ignore[no-untyped-def]
    return np.ceil(x)


@kernel
def round_half_even(x):  # type: ignore[no-untyped-def]
    return np.rint(x)  # rint rounds ties to even, as np.round and TensorFlow's round do


@kernel
def sin(x):  # type: ignore[no-untyped-def]
    return np.sin(x)


@kernel
def cos(x):  # type: ignore[no-untyped-def]
    return np.cos(x)


@kernel
def tan(x):  # type: ignore[no-untyped-def]
    return np.tan(x)


@kernel
def rsqrt(x, one):  # type: ignore[no-untyped-def]
    return one / np.sqrt(x)


@kernel
def log1p(x):  # type: ignore[no-untyped-def]
    return np.log1p(x)


@kernel
def expm1(x):  # type: ignore[no-untyped-def]
    return np.expm1(x)


@kernel
def erf(x):  # type: ignore[no-untyped-def]
    src = np.ascontiguousarray(x).ravel()
    out = np.empty_like(src)
    for i in range(src.size):
        out[i] = math.erf(src[i])
    return out.reshape(x.shape)


# ----------------------------------------------------- binary and ternary
@kernel
def _floordiv_ints(a, b):  # type: ignore[no-untyped-def]
    return np.floor_divide(a, b)


@kernel
def _floordiv_floats(a, b):  # type: ignore[no-untyped-def]
    # Python's and NumPy's floored division, from fmod, so that a == (a // b) * b + a % b holds with floormod's
    # np.mod. Numba's np.floor_divide is floor(a / b), which rounds a / b first: 1.0 // 0.1 was 10 (Python,
    # NumPy and PyTorch: 9, beside 1.0 % 0.1 = 0.09999999999999995), and -1e4 // inf was -0, not -1.
    mod = np.fmod(a, b)
    div = (a - mod) / b
    div = div - ((mod != 0) & ((b < 0) != (mod < 0)))
    floored = np.floor(div)
    floored = floored + ((div - floored) > 0.5)
    signed_zero = np.copysign(np.zeros_like(div), a / b)
    return np.where(b == 0, a / b, np.where(div != 0, floored, signed_zero))


def floordiv(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return _floordiv_floats(a, b) if np.asarray(a).dtype.kind == "f" else _floordiv_ints(a, b)


@kernel
def floormod(a, b):  # type: ignore[no-untyped-def]
    return np.mod(a, b)  # the sign of the divisor, as Python's % and TensorFlow's floormod


@kernel
def clip(x, low, high):  # type: ignore[no-untyped-def]
    return np.minimum(np.maximum(x, low), high)


@kernel
def where(cond, a, b):  # type: ignore[no-untyped-def]
    return np.where(cond, a, b)


# ------------------------------------------------------------------ logic
@kernel
def not_equal(a, b):  # type: ignore[no-untyped-def]
    return a != b


@kernel
def logical_and(a, b):  # type: ignore[no-untyped-def]
    return np.logical_and(a, b)


@kernel
def logical_or(a, b):  # type: ignore[no-untyped-def]
    return np.logical_or(a, b)


@kernel
def logical_xor(a, b):  # type: ignore[no-untyped-def]
    return np.logical_xor(a, b)


@kernel
def logical_not(x):  # type: ignore[no-untyped-def]
    return np.logical_not(x)


@kernel
def is_nan(x):  # type: ignore[no-untyped-def]
    return np.isnan(x)


@kernel
def is_finite(x):  # type: ignore[no-untyped-def]
    return np.isfinite(x)
