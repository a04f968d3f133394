"""Import rows of ONNX's arithmetic whose integer, unsigned or infinite cases need more than the
cellgraph op of the same name: Pow (exact integer powers), Clip (absent bounds are the type's
extremes; Clip-6's attributes), Sign and Relu of integers, and C's fmod of floats.

Each was a wrong number or a refusal found by the ONNX Runtime sweep (tests/export/onnx_sweep*.py).

Examples
--------
>>> import numpy as np
>>> from onnx import TensorProto, helper
>>> import cellgraph as cg
>>> node = helper.make_node("Pow", ["x", "y"], ["z"])
>>> graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(n, TensorProto.INT64, [1]) for n in "xy"],
...                           [helper.make_tensor_value_info("z", TensorProto.INT64, [1])])
>>> model = cg.onnx.import_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
>>> int(model(np.array([3]), np.array([39]))[0]) == 3**39
True
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import ml_dtypes
import numpy as np

import cellgraph as cg
from cellgraph.dataflow.dtypes import DTYPES, is_float
from cellgraph.dataflow.graph import Tensor
from cellgraph.dataflow.ops import logic
from cellgraph.dataflow.ops import math_unary as mu

from .common import ImportRow
from .import_wrappers import same_shapes_before

if TYPE_CHECKING:
    from .importer import Builder
    from .node_info import NodeInfo


def _via_float64(fn: Callable[[Tensor, Tensor], Tensor], x: Tensor, y: Tensor) -> Tensor:
    """An integer ``x`` and a float ``y`` (Pow of an integer to a fractional power) computed in float64
    and truncated back to ``x``'s type, as ONNX Runtime's kernel computes it."""
    return cg.cast(fn(cg.cast(x, "float64"), cg.cast(y, "float64")), x.dtype)


def _int_pow(x: Tensor, y: Tensor) -> Tensor:
    """An integer ``x`` to an integer power ``y``, exact wherever the result fits in ``x``'s dtype.

    By squaring, in ``x``'s own type: through float64 an int64 above 2**53 rounds (3**39 came back
    as 4052555153018976256, not ...267; ONNX Runtime's CPU kernel rounds the same way). An exponent
    past 64 only matters for bases 0, 1 and -1 (any other result does not fit), so it is clamped to
    64 or 65, keeping its parity, and 7 squarings cover every exponent. A negative exponent gives
    1 / x**k truncated toward zero, as a float power cast back would: 1, or -1 for -1 to an odd power,
    else 0 (ONNX leaves 0 to a negative power undefined; this gives 0).
    """
    signed = not y.dtype.startswith("uint")
    e = mu.abs(y) if signed else y
    if y.dtype not in ("int8", "uint8"):
        big = logic.greater(e, cg.constant(np.array(64, y.dtype), dtype=y.dtype))
        e = mu.where(big, mu.mod(e, cg.constant(np.array(2, y.dtype), dtype=y.dtype)) + 64, e)
    two = cg.constant(np.array(2, e.dtype), dtype=e.dtype)
    one = cg.constant(np.array(1, e.dtype), dtype=e.dtype)
    result = cg.ones_like(x) * cg.cast(cg.ones_like(y), x.dtype)  # the broadcast shape of x and y
    base = x
    for step in range(7):
        result = mu.where(cg.equal(mu.mod(e, two), one), result * base, result)
        if step < 6:
            base, e = base * base, mu.floordiv(e, two)
    if not signed:
        return result
    unit = logic.logical_or(cg.equal(x, cg.ones_like(x)), cg.equal(x, cg.neg(cg.ones_like(x))))
    negative = cg.less(y, cg.zeros_like(y))
    return mu.where(logic.logical_and(negative, logic.logical_not(unit)), cg.zeros_like(result), result)


def _pow(b: Builder, n: NodeInfo) -> list[Tensor]:
    x, y = b.ins(n, 2)
    if not is_float(x.dtype):
        # A fractional power of an integer is a float power truncated back, as ONNX Runtime computes it.
        return [_int_pow(x, y) if not is_float(y.dtype) else _via_float64(cg.pow, x, y)]
    # ONNX lets the exponent have its own type; cellgraph's Pow takes one dtype. Rounding the exponent
    # to the base's type would change the power (x ** 4.000001 as x ** 4, 625 for 624): both are computed
    # in the wider of float32 and their types, and the result rounded once to the base's.
    wide = "float64" if "float64" in (x.dtype, y.dtype) else "float32"
    if x.dtype == y.dtype == wide:
        return [cg.pow(x, y)]
    return [cg.cast(cg.pow(cg.cast(x, wide), cg.cast(y, wide)), x.dtype)]


def _clip_op(b: Builder, n: NodeInfo) -> list[Tensor]:
    x = b.ins(n)[0]
    if n.version < 11:
        # min and max are attributes, defaulting to float32's extremes (an inf input becomes one).
        low_value, high_value = n.attrs["min"], n.attrs["max"]
        bounds = [cg.constant(np.array(v, x.dtype), dtype=x.dtype) for v in (low_value, high_value)]
        return [cg.minimum(cg.maximum(x, bounds[0]), bounds[1])]
    low, high = (b.tensor(n.inputs[i]) if len(n.inputs) > i and n.inputs[i] else None for i in (1, 2))
    if is_float(x.dtype):
        # An absent bound is the type's numeric_limits lowest() or max(), not an infinity:
        # Clip(inf) with no max is the largest finite value (ONNX's spec; ONNX Runtime's kernel).
        largest = float(ml_dtypes.finfo(DTYPES[x.dtype]).max)
        low = cg.constant(np.array(-largest, DTYPES[x.dtype]), dtype=x.dtype) if low is None else low
        high = cg.constant(np.array(largest, DTYPES[x.dtype]), dtype=x.dtype) if high is None else high
    y = x if low is None else cg.maximum(x, low)
    # Min(max, Max(x, min)): where min > max every value is max, as ONNX's spec says.
    return [cg.identity(y) if high is None else cg.minimum(y, high)]


def _check_clip(n: NodeInfo) -> str | None:
    given = [a.name for a in n.proto.attribute]
    if n.version >= 11 and given:
        return f"Clip attribute {given[0]!r} (since version 11 min and max are inputs)"
    return None


def float_fmod(a: Tensor, c: Tensor) -> Tensor:
    """C's fmod of floats, the dividend's sign: exact, as the remainder of two floats always is.

    Of two non-negative operands the floored modulo is fmod; the sign is then the dividend's.
    (``a - c * trunc(a / c)`` rounded the quotient: fmod(1e20, 3) gave 0, not 2; and gave NaN
    for a finite ``a`` over an infinite ``c``, whose fmod is ``a``.)
    """
    r = mu.mod(mu.abs(a), mu.abs(c))
    return mu.where(cg.less(a, cg.zeros_like(a)), cg.neg(r), r)


def _relu(b: Builder, n: NodeInfo) -> list[Tensor]:
    x = b.ins(n)[0]
    # Relu-14 takes signed integers, which cellgraph's relu (for floats) does not: their max with 0.
    return [cg.relu(x) if is_float(x.dtype) else cg.maximum(x, cg.zeros_like(x))]


def _sign(b: Builder, n: NodeInfo) -> list[Tensor]:
    x = b.ins(n)[0]
    if x.dtype.startswith("uint"):
        # 0 or 1: cellgraph's Sign kernel (NumPy's sign under Numba) gives 255 for uint8 255.
        return [cg.cast(logic.greater(x, cg.zeros_like(x)), x.dtype)]
    return [mu.sign(x)]


FLOAT32_MAX = float(np.finfo(np.float32).max)

MATH: dict[str, ImportRow] = {
    "Pow":  ImportRow(_pow, check=same_shapes_before(7)),
    "Relu": ImportRow(_relu),
    "Sign": ImportRow(_sign),
    # Clip-6's min and max default to float32's lowest and largest (ONNX Runtime's and ONNX's reference's
    # numeric_limits; the schema prints them rounded, -3.402823e38, 2 ulps inside).
    "Clip": ImportRow(_clip_op, {"min": -FLOAT32_MAX, "max": FLOAT32_MAX}, check=_check_clip),
}  # fmt: skip
