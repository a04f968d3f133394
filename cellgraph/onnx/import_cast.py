"""ONNX Cast, including casts to the narrow types cellgraph holds wider (float8, float4, int4, int2).

A cast to one of cellgraph's dtypes is ``cg.cast``. A cast to a type that
cellgraph reads wider (``common.READ_ONLY``: float8 as float16, int4 as int8)
is its rounding computed exactly in float32 and held in the wider dtype. Each
value is then one of the narrow type's, so the model's boundary converts it
without change. The float grids round half to even at the element's quantum,
a power of two found by comparing against the binade bounds: no logarithm, so
nothing inexact. Overflow (an infinite input too) saturates to the largest
value, or without ``saturate`` is inf (e5m2) or NaN (the types without inf),
as ONNX's reference gives them. A cast to
float8e8m0 (a scale exponent, with its own rounding modes) stays refused.

Examples
--------
>>> import numpy as np
>>> from onnx import TensorProto, helper
>>> node = helper.make_node("Cast", ["x"], ["y"], to=TensorProto.FLOAT8E4M3FN)
>>> graph = helper.make_graph(
...     [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
...     [helper.make_tensor_value_info("y", TensorProto.FLOAT8E4M3FN, [4])],
... )
>>> from cellgraph.onnx import import_model
>>> model = import_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]))
>>> model(np.array([0.3, 17.0, 1000.0, -0.0009], np.float32)).astype(np.float32).tolist()
[0.3125, 16.0, 448.0, -0.0]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from onnx import TensorProto

import cellgraph as cg
from cellgraph.dataflow.graph import Tensor
from cellgraph.dataflow.ops import logic
from cellgraph.dataflow.ops import math_unary as mu

from .common import COMPUTE_DTYPE, READ_DTYPE, READ_ONLY, ImportRow

if TYPE_CHECKING:
    from .importer import Builder
    from .node_info import NodeInfo


@dataclass(frozen=True)
class FloatGrid:
    """A narrow float type: ``bits`` stored mantissa bits, its smallest normal exponent, its largest finite value."""

    bits: int
    min_exponent: int
    largest: float
    has_inf: bool  # overflow without saturation: inf, or NaN for the types without one
    unsigned_zero: bool  # the fnuz types: no -0
    has_nan: bool = True  # float4e2m1 has none: NaN becomes 0 (ONNX's reference gives -0), overflow saturates

    @property
    def max_exponent(self) -> int:
        exponent = 0
        while 2.0 ** (exponent + 1) <= self.largest:
            exponent += 1
        return exponent


# ONNX's narrow float types (TensorProto codes), as the ONNX Cast spec and ml_dtypes define them.
FLOAT_GRIDS: dict[int, FloatGrid] = {
    17: FloatGrid(3, -6, 448.0, has_inf=False, unsigned_zero=False),  # FLOAT8E4M3FN
    18: FloatGrid(3, -7, 240.0, has_inf=False, unsigned_zero=True),  # FLOAT8E4M3FNUZ
    19: FloatGrid(2, -14, 57344.0, has_inf=True, unsigned_zero=False),  # FLOAT8E5M2
    20: FloatGrid(2, -15, 57344.0, has_inf=False, unsigned_zero=True),  # FLOAT8E5M2FNUZ
    23: FloatGrid(1, 0, 6.0, has_inf=False, unsigned_zero=False, has_nan=False),  # FLOAT4E2M1
}
# ONNX's narrow integer types: the range of each.
INT_RANGES: dict[int, tuple[int, int]] = {21: (0, 15), 22: (-8, 7), 25: (0, 3), 26: (-2, 1)}


def _const(value: float) -> Tensor:
    return cg.constant(value, dtype="float32")


def _like(t: Tensor, value: float) -> Tensor:
    """``value`` everywhere in ``t``'s shape (a where's branches have one shape)."""
    return cg.zeros_like(t) + value


def _special(t: Tensor, value: float) -> Tensor:
    """inf or NaN in ``t``'s shape, computed when the graph runs.

    Not a constant: elementwise fusion (dataflow/fusion.py) writes a one-value
    constant into its generated code as ``repr(float(v))``, a bare ``inf`` or
    ``nan`` that the compiled kernel does not define. 1e300 overflows float32
    to inf; inf - inf is NaN.
    """
    inf = cg.cast(cg.cast(cg.zeros_like(t), "float64") + 1e300, "float32")
    return inf if value > 0 else inf - inf


def to_float_grid(x: Tensor, grid: FloatGrid, saturate: bool) -> Tensor:
    """``x`` (float32) rounded to ``grid``'s values, half to even, with ONNX's overflow rule; float32."""
    a = mu.abs(x)
    # The quantum of a's binade, from the subnormals' up to the largest binade's.
    quantum = _like(a, 2.0 ** (grid.min_exponent - grid.bits))
    for exponent in range(grid.min_exponent + 1, grid.max_exponent + 1):
        quantum = mu.where(cg.greater_equal(a, _const(2.0**exponent)), _like(a, 2.0 ** (exponent - grid.bits)), quantum)
    rounded = mu.round(a / quantum) * quantum  # exact: quantum is a power of two
    over = logic.greater(rounded, _const(grid.largest))  # false for NaN: it stays NaN
    if saturate or not grid.has_nan:
        rounded = mu.where(over, _like(rounded, grid.largest), rounded)
    else:
        rounded = mu.where(over, _special(rounded, float("inf") if grid.has_inf else float("nan")), rounded)
    if not grid.has_nan:
        rounded = mu.where(logic.is_nan(rounded), cg.zeros_like(rounded), rounded)
    signed = mu.where(cg.less(x, cg.zeros_like(x)), cg.neg(rounded), rounded)
    # + 0 turns a negative zero positive (fnuz types have none).
    return signed + 0.0 if grid.unsigned_zero else signed


def _to(n: NodeInfo) -> int | None:
    """Cast's target type: a TensorProto code, or (Cast-1) its name as a string ("FLOAT"); CastLike's is its second
    input's type (its values are not read)."""
    if n.op == "CastLike":
        return n.elem_type(1)
    to = n.attrs["to"]
    if isinstance(to, bytes | str):
        name = to.decode() if isinstance(to, bytes) else to
        return int(TensorProto.DataType.Value(name)) if name in TensorProto.DataType.keys() else None
    return None if to is None else int(to)


def _cast(b: Builder, n: NodeInfo) -> list[Tensor]:
    x = b.ins(n, 1)[0]
    to = _to(n)
    assert to is not None  # the check refused it otherwise
    if to not in READ_ONLY:
        return [cg.cast(x, COMPUTE_DTYPE[to])]
    wide = x if x.dtype == "float32" else cg.cast(x, "float32")
    if to in FLOAT_GRIDS:
        y = to_float_grid(wide, FLOAT_GRIDS[to], bool(n.attrs["saturate"]))
    else:
        # Truncated toward zero, as every float-to-integer Cast is. Out of range ONNX leaves the
        # result undefined; its reference (ml_dtypes) gives 0, and so does this (NaN too).
        low, high = INT_RANGES[to]
        inside = logic.logical_and(logic.greater(wide, _const(low - 1.0)), cg.less(wide, _const(high + 1.0)))
        y = mu.where(inside, wide, cg.zeros_like(wide))
    return [cg.cast(y, READ_DTYPE[to])]


def _check_cast(n: NodeInfo) -> str | None:
    to = _to(n)
    if to is None:
        if n.op == "CastLike":
            return "CastLike to the type of an input whose type is unknown"
        return f"Cast to {n.attrs['to']!r}, which is no ONNX type"
    if to in COMPUTE_DTYPE or to in FLOAT_GRIDS or to in INT_RANGES:
        return None
    return f"Cast to {n.dtype_name(to)}"


CAST = {
    # A Cast may make the narrow types it rounds into exactly (held wider: float8 as float16).
    "Cast": ImportRow(_cast, {"to": None, "saturate": 1, "round_mode": "up"}, check=_check_cast, makes_narrow=True),
    "CastLike": ImportRow(_cast, {"saturate": 1, "round_mode": "up"}, check=_check_cast, makes_narrow=True, since=15),
}
