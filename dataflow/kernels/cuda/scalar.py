"""Scalar device functions of the second set of unary ops: math, logic, activations.

Each takes ``(x, c)`` like every unary function of ``elementwise.py``; ``c``
is the op's attr where it has one (leaky relu's and elu's ``alpha``). They
are the GPU twins of ``kernels/cpu/math_more.py`` and ``activations.py``, and
keep NaN as NaN the same way: a comparison with NaN is false, so NaN falls
through to arithmetic on itself.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from numba import cuda

from ..cpu.activations import GELU_CUBIC, INV_SQRT_2PI, SELU_ALPHA, SELU_SCALE, SQRT_2_OVER_PI, SQRT_HALF
from . import device_math

math = device_math()  # IEEE results (inf, NaN) on the simulator too


def _device(fn: Callable[..., Any]) -> Any:
    return cuda.jit(device=True)(fn)


@cuda.jit(device=True)
def _sign(x, c):  # type: ignore[no-untyped-def]
    if x > 0:
        return 1
    if x < 0:
        return -1
    return x  # 0 stays 0, NaN stays NaN


@cuda.jit(device=True)
def _round_half_even(x, c):  # type: ignore[no-untyped-def]
    r = math.floor(x)
    d = x - r  # exact: the fraction of a float is a float
    # inf - inf and NaN give a NaN d: both comparisons are false and r (inf, NaN) is the answer.
    if d > 0.5 or (d == 0.5 and r - 2.0 * math.floor(r * 0.5) != 0.0):
        r += 1.0
    return r


@cuda.jit(device=True)
def _logistic(x):  # type: ignore[no-untyped-def]
    e = math.exp(-abs(x))
    r = 1.0 / (1.0 + e)
    return r if x >= 0 else e * r


@cuda.jit(device=True)
def _hard_sigmoid(x, c):  # type: ignore[no-untyped-def]
    u = x / 6.0 + 0.5
    return 0.0 if u <= 0 else (1.0 if u >= 1 else u)


@cuda.jit(device=True)
def gelu_grad(dy, x):  # type: ignore[no-untyped-def]
    return dy * (0.5 * math.erfc(-x * SQRT_HALF) + x * math.exp(-0.5 * x * x) * INV_SQRT_2PI)


UNARY_MORE = {
    # --------------------------------------------------------------- math
    "Abs": _device(lambda x, c: abs(x)),
    "Sign": _sign,
    "Floor": _device(lambda x, c: math.floor(x)),
    "Ceil": _device(lambda x, c: math.ceil(x)),
    "Round": _round_half_even,
    "Sin": _device(lambda x, c: math.sin(x)),
    "Cos": _device(lambda x, c: math.cos(x)),
    "Tan": _device(lambda x, c: math.tan(x)),
    "Rsqrt": _device(lambda x, c: 1.0 / math.sqrt(x)),
    "Log1p": _device(lambda x, c: math.log1p(x)),
    "Expm1": _device(lambda x, c: math.expm1(x)),
    "Erf": _device(lambda x, c: math.erf(x)),
    # -------------------------------------------------------------- logic
    "LogicalNot": _device(lambda x, c: not x),
    "IsNan": _device(lambda x, c: math.isnan(x)),
    "IsFinite": _device(lambda x, c: math.isfinite(x)),
    # -------------------------------------------------------- activations
    "LeakyRelu": _device(lambda x, c: x if x > 0 else x * c),
    "Elu": _device(lambda x, c: x if x > 0 else c * math.expm1(x)),
    "Selu": _device(lambda x, c: SELU_SCALE * (x if x > 0 else SELU_ALPHA * math.expm1(x))),
    "Gelu": _device(lambda x, c: 0.5 * x * math.erfc(-x * SQRT_HALF)),
    "GeluTanh": _device(lambda x, c: x * _logistic(2.0 * SQRT_2_OVER_PI * (x + GELU_CUBIC * x * x * x))),
    "Softplus": _device(lambda x, c: (x if x > 0 else 0.0) + math.log1p(math.exp(-abs(x)))),
    "Softsign": _device(lambda x, c: x / (1.0 + abs(x))),
    "Silu": _device(lambda x, c: x * _logistic(x)),
    "Relu6": _device(lambda x, c: 0.0 if x <= 0 else (6.0 if x >= 6 else x)),
    "HardSigmoid": _hard_sigmoid,
}  # fmt: skip
