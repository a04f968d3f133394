"""Elementwise kernels with NumPy broadcasting, one thread per output element.

Broadcasting is done by strides: each input is read through element strides
that are 0 along the dimensions it is stretched over, so no input is ever
materialised at the output's shape. One kernel is compiled per scalar function
(Numba specialises it per dtype and rank).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Any

import numpy as np
from numba import cuda

from . import broadcast_strides, device_math, flat, launch
from .scalar import UNARY_MORE, gelu_grad

math = device_math()  # IEEE results (inf, NaN) on the simulator too


@cuda.jit(device=True)
def offset(i, shape, strides):  # type: ignore[no-untyped-def]
    """Element offset of flat output index ``i`` in an input read through ``strides``."""
    off = 0
    for d in range(len(shape) - 1, -1, -1):
        off += (i % shape[d]) * strides[d]
        i //= shape[d]
    return off


def _device(fn: Callable[..., Any]) -> Any:
    return cuda.jit(device=True)(fn)


@cuda.jit(device=True)
def _floor_float(x):  # type: ignore[no-untyped-def]
    """floor(x) as a float: Numba's math.floor returns an int64, which a large float overflows."""
    if x - x != 0:  # inf and NaN (inf - inf is NaN) are their own floor
        return x
    frac = math.fmod(x, 1.0)
    whole = x - frac  # exact: frac holds the bits below the units
    return whole - 1.0 if frac < 0 else whole


@cuda.jit(device=True)
def _floordiv_float(a, b):  # type: ignore[no-untyped-def]
    """Python's floored division of floats, from fmod, as the CPU kernel's (kernels/cpu/math_more.py).

    numba-cuda's float ``//`` gave NaN for -1e4 // inf and 5 // -inf on an H200 (Python and NumPy: -1), and the
    simulator, which runs Python's ``//``, could not show it.
    """
    if b == 0:
        return a / b
    mod = math.fmod(a, b)
    div = (a - mod) / b
    if mod != 0 and (b < 0) != (mod < 0):
        div -= 1.0
    if div == 0:
        return math.copysign(0.0, a / b)
    floored = _floor_float(div)
    return floored + 1.0 if div - floored > 0.5 else floored


@cuda.jit(device=True)
def _floormod_float(a, b):  # type: ignore[no-untyped-def]
    """Python's float ``%`` (the divisor's sign), from fmod, as np.mod: written out for the same reason as
    ``_floordiv_float`` (-1e4 % inf is inf, 5 % -inf is -inf; a floor of a / b makes them NaN)."""
    mod = math.fmod(a, b)
    if mod != 0:
        if (b < 0) != (mod < 0):
            mod += b
        return mod
    return math.copysign(0.0, b)


# Scalar functions, by op name. Unary ones take a second, scalar operand `c`
# that only the broadcast-and-divide of BroadcastLike(mean) uses.
BINARY = {
    "Add": _device(lambda a, b: a + b),
    "Sub": _device(lambda a, b: a - b),
    "Mul": _device(lambda a, b: a * b),
    "Div": _device(lambda a, b: a / b),
    "Pow": _device(lambda a, b: a**b),
    # A NaN on either side wins, as np.maximum on the CPU (Python's max(1.0, nan) is 1.0).
    "Maximum": _device(lambda a, b: a if a > b or a != a else b),
    "Minimum": _device(lambda a, b: a if a < b or a != a else b),
    "Equal": _device(lambda a, b: a == b),
    "Less": _device(lambda a, b: a < b),
    "GreaterEqual": _device(lambda a, b: a >= b),
    "NotEqual": _device(lambda a, b: a != b),
    # Numba's // and % follow Python (floor) semantics on ints, as NumPy's do; floats take the *Float twins.
    "FloorDiv": _device(lambda a, b: a // b),
    "FloorDivFloat": _floordiv_float,
    "FloorMod": _device(lambda a, b: a % b),
    "FloorModFloat": _floormod_float,
    "LogicalAnd": _device(lambda a, b: a and b),
    "LogicalOr": _device(lambda a, b: a or b),
    "LogicalXor": _device(lambda a, b: a != b),
    "GeluGrad": gelu_grad,
}  # fmt: skip
UNARY = {
    "Neg": _device(lambda x, c: -x),
    "Square": _device(lambda x, c: x * x),
    "Sqrt": _device(lambda x, c: math.sqrt(x)),
    "Exp": _device(lambda x, c: math.exp(x)),
    "Log": _device(lambda x, c: math.log(x)),
    "Copy": _device(lambda x, c: x),  # Cast (the store converts), BroadcastLike
    "DivideBy": _device(lambda x, c: x / c),  # BroadcastLike(mean)
    **UNARY_MORE,  # ops/math_unary.py, ops/logic.py, ops/activations.py: `c` is an attr such as alpha
}  # fmt: skip
TERNARY = {
    "Where": _device(lambda c, a, b: a if c else b),
    # A NaN x stays NaN, whichever way max and min are lowered (CUDA's fmaxf would give the bound).
    "ClipByValue": _device(lambda x, low, high: x if x != x else min(max(x, low), high)),
}  # fmt: skip
COMPARISONS = ("Equal", "Less", "GreaterEqual", "NotEqual")


@cache
def _binary_kernel(name: str) -> Any:
    fn = BINARY[name]

    @cuda.jit
    def run(a, b, out, a_strides, b_strides, shape):  # type: ignore[no-untyped-def]
        i = cuda.grid(1)
        if i < out.size:
            out[i] = fn(a[offset(i, shape, a_strides)], b[offset(i, shape, b_strides)])

    return run


@cache
def _unary_kernel(name: str) -> Any:
    fn = UNARY[name]

    @cuda.jit
    def run(x, out, x_strides, shape, c):  # type: ignore[no-untyped-def]
        i = cuda.grid(1)
        if i < out.size:
            out[i] = fn(x[offset(i, shape, x_strides)], c)

    return run


@cache
def _ternary_kernel(name: str) -> Any:
    fn = TERNARY[name]

    @cuda.jit
    def run(a, b, c, out, a_strides, b_strides, c_strides, shape):  # type: ignore[no-untyped-def]
        i = cuda.grid(1)
        if i < out.size:
            out[i] = fn(a[offset(i, shape, a_strides)], b[offset(i, shape, b_strides)], c[offset(i, shape, c_strides)])

    return run


@cuda.jit
def _fill(out, value):  # type: ignore[no-untyped-def]
    i = cuda.grid(1)
    if i < out.size:
        out[i] = value


def binary(name: str, a: Any, b: Any, out: Any = None) -> Any:
    """``name`` applied to ``a`` and ``b`` broadcast together (into ``out`` if given)."""
    shape = np.broadcast_shapes(a.shape, b.shape)
    if out is None:
        dtype = np.bool_ if name in COMPARISONS else a.dtype
        out = cuda.device_array(shape, dtype)
    if out.size:
        grid = shape or (1,)
        blocks, threads = launch(out.size)
        _binary_kernel(name)[blocks, threads](
            flat(a), flat(b), flat(out), broadcast_strides(a.shape, grid), broadcast_strides(b.shape, grid), grid
        )
    return out


def unary(name: str, x: Any, shape: tuple[int, ...] | None = None, dtype: Any = None, c: float = 0.0) -> Any:
    """``name`` applied to ``x`` broadcast to ``shape``, stored as ``dtype`` (both default to ``x``'s)."""
    shape = tuple(x.shape) if shape is None else shape
    out = cuda.device_array(shape, x.dtype if dtype is None else dtype)
    if out.size:
        grid = shape or (1,)
        blocks, threads = launch(out.size)
        _unary_kernel(name)[blocks, threads](
            flat(x), flat(out), broadcast_strides(x.shape, grid), grid, x.dtype.type(c)
        )
    return out


def ternary(name: str, a: Any, b: Any, c: Any) -> Any:
    """``name`` applied to ``a``, ``b`` and ``c`` broadcast together; the output has ``b``'s dtype
    (Where's ``x``, ClipByValue's bounds, which are ``x``'s)."""
    shape = np.broadcast_shapes(a.shape, b.shape, c.shape)
    out = cuda.device_array(shape, b.dtype)
    if out.size:
        grid = shape or (1,)
        blocks, threads = launch(out.size)
        strides = [broadcast_strides(t.shape, grid) for t in (a, b, c)]
        _ternary_kernel(name)[blocks, threads](flat(a), flat(b), flat(c), flat(out), *strides, grid)
    return out


def fill(shape: tuple[int, ...], dtype: Any, value: float) -> Any:
    out = cuda.device_array(shape, dtype)
    if out.size:
        blocks, threads = launch(out.size)
        _fill[blocks, threads](flat(out), np.dtype(dtype).type(value))
    return out


# ------------------------------------------------------------ kernel factories
def binary_op(node: Any, ctx: Any, name: str) -> Callable[[Any, Any], Any]:
    if name in ("FloorDiv", "FloorMod") and np.dtype(node.specs[0].dtype).kind == "f":
        name += "Float"
    return lambda a, b: binary(name, a, b)


def unary_op(node: Any, ctx: Any, name: str) -> Callable[[Any], Any]:
    return lambda x: unary(name, x)


def unary_attr_op(node: Any, ctx: Any, name: str, attr: str | None = None) -> Callable[[Any], Any]:
    """A unary op whose scalar function reads attr ``attr`` (an alpha) as its ``c``; its
    output has the op's dtype (bool for IsNan), not necessarily the input's."""
    dtype = np.dtype(node.specs[0].dtype)
    c = float(node.attrs[attr]) if attr else 0.0
    return lambda x: unary(name, x, dtype=dtype, c=c)


def ternary_op(node: Any, ctx: Any, name: str) -> Callable[[Any, Any, Any], Any]:
    return lambda a, b, c: ternary(name, a, b, c)


def cast_op(node: Any, ctx: Any) -> Callable[[Any], Any]:
    dtype = np.dtype(node.attrs["dtype"])
    return lambda x: unary("Copy", x, dtype=dtype)


def fill_op(node: Any, ctx: Any, value: float) -> Callable[[Any], Any]:
    return lambda x: fill(tuple(x.shape), x.dtype, value)


def assign_add_op(node: Any, ctx: Any) -> Callable[[Any, Any], Any]:
    # In place: every thread reads and writes only its own element of `ref`.
    return lambda ref, value: binary("Add", ref, value, out=ref)


def broadcast_like_op(node: Any, ctx: Any) -> Callable[[Any, Any], Any]:
    axes, keepdims, mean = node.attrs["axes"], node.attrs["keepdims"], node.attrs["mean"]

    def run(g: Any, like: Any) -> Any:
        if not keepdims and axes:
            g = g.reshape(tuple(1 if i in axes else d for i, d in enumerate(like.shape)))
        shape = tuple(like.shape)
        if mean:
            count = max(math.prod([shape[a] for a in axes]), 1)
            return unary("DivideBy", g, shape, c=count)
        return unary("Copy", g, shape)

    return run
