"""What the ONNX exporter and importer share: their error, and the dtypes both sides know.

Examples
--------
>>> DTYPE_TO_ONNX["float32"], ONNX_TO_DTYPE[7]
(1, 'int64')
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from cellgraph.inference import ExportError

if TYPE_CHECKING:
    import onnx

    from cellgraph.dataflow.graph import Tensor

    from .importer import Builder
    from .node_info import NodeInfo

Build = Callable[["Builder", "NodeInfo"], "list[Tensor]"]
Check = Callable[["NodeInfo"], "str | None"]

# cellgraph dtype name <-> onnx.TensorProto.DataType value (the enum's numbers are ONNX's spec).
# float16 and bfloat16 cross in their own type (cellgraph stores them and computes in float32, as
# ONNX Runtime's CPU kernels do); int8, uint8 and int16 compute in their own type and wrap as ONNX's do.
DTYPE_TO_ONNX: dict[str, int] = {
    "float32": 1, "uint8": 2, "int8": 3, "int16": 5, "int32": 6, "int64": 7, "bool": 9,
    "float16": 10, "float64": 11, "bfloat16": 16, "string": 8,
}  # fmt: skip
STRING_CODE = 8
ONNX_TO_DTYPE: dict[int, str] = {code: name for name, code in DTYPE_TO_ONNX.items()}
# ONNX types cellgraph has no tensors of, and the wider cellgraph dtype an imported model computes
# them in: every value fits, and integer results wrap back at the model's boundary as ONNX's would
# (modular arithmetic): uint16 as int32, uint32 as int64.
WIDENED: dict[int, str] = {4: "int32", 12: "int64"}
# The cellgraph dtype each ONNX type that a node can make computes in.
COMPUTE_DTYPE: dict[int, str] = {**ONNX_TO_DTYPE, **WIDENED}
# ONNX types a model may read but no node of an imported model may make: every value is exact in the
# cellgraph dtype beside it, so a graph input or initializer of one, and a Cast from it (dequantizing
# float8 or int4 weights), are exact. A node making one (a Cast to float8) is refused: its rounding and
# saturation to the narrow grid are not expressible, and computing it wider would skip exactly them.
READ_ONLY: dict[int, str] = {
    17: "float16", 18: "float16", 19: "float16", 20: "float16",  # FLOAT8E4M3FN(UZ), FLOAT8E5M2(FNUZ)
    21: "uint8", 22: "int8", 25: "uint8", 26: "int8",  # UINT4, INT4, UINT2, INT2
    23: "float16", 24: "float32",  # FLOAT4E2M1; FLOAT8E8M0 (powers of two from 2**-127)
}  # fmt: skip
# The cellgraph dtype each ONNX type that can be read (a node's input, a graph input) computes in.
READ_DTYPE: dict[int, str] = {**COMPUTE_DTYPE, **READ_ONLY}

# The opsets this exporter writes and this importer reads (default domain).
MIN_OPSET = 17
MAX_OPSET = 21
INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)


class OnnxError(ExportError):
    """A model cannot cross to or from ONNX: names the op, the node and (importing) the opset."""


# ONNX's float element types: TensorProto.FLOAT, DOUBLE, FLOAT16, BFLOAT16.
FLOAT_CODES = (1, 11, 10, 16)


def as_text(value: Any) -> str:
    """A STRING attribute's value as ``str`` (ONNX gives bytes)."""
    return value.decode() if isinstance(value, bytes) else str(value)


def onnx_code(array: np.ndarray) -> int | None:
    """The ONNX data type of a NumPy array, or None for one ONNX has no type for."""
    import onnx

    try:
        return int(onnx.helper.np_dtype_to_tensor_dtype(array.dtype))
    except (KeyError, ValueError, TypeError):
        return None


def is_wider(code: int | None) -> bool:
    """Whether values of ONNX type ``code`` are computed in a wider cellgraph dtype (uint16, float8, int4, ...)."""
    return code in WIDENED or code in READ_ONLY


def widen(array: np.ndarray) -> np.ndarray:
    """``array`` in the cellgraph dtype its ONNX type computes in (uint16 as int32, float8 as float16, ...)."""
    code = onnx_code(array)
    return array.astype(READ_DTYPE[code]) if code is not None and is_wider(code) else array


def cell_name(name: str) -> str:
    """An ONNX value name as a cellgraph node name (no ':'; not empty)."""
    cleaned = re.sub(r"[^A-Za-z0-9_./-]", "_", name).strip("/") or "value"
    return cleaned.replace("//", "/")


def shape_dims(t: onnx.TypeProto | None) -> list[int | None] | None:
    """The dims of a tensor type (None for a dim unknown until run time), or None when its rank is unknown."""
    if t is None or not t.HasField("tensor_type") or not t.tensor_type.HasField("shape"):
        return None
    return [d.dim_value if d.HasField("dim_value") else None for d in t.tensor_type.shape.dim]


def onnx_dtype_name(code: int) -> str:
    """ONNX's name for a TensorProto data type (``FLOAT16``), for messages."""
    import onnx

    try:
        return str(onnx.TensorProto.DataType.Name(code))
    except ValueError:
        return f"data type {code}"


@dataclass(frozen=True)
class ImportRow:
    """How one ONNX op comes into cellgraph (a row of ``import_ops.IMPORTERS``)."""

    build: Build
    attrs: dict[str, Any] = field(default_factory=dict)  # understood attributes and their defaults
    static: tuple[int, ...] = ()  # inputs whose values must be known at build time
    check: Check | None = None
    # The value of output 0 when it is known before the graph runs (a Constant, a static Shape).
    fold: Callable[[NodeInfo], np.ndarray | None] | None = None
    # The oldest version of the op whose meaning the row follows. Older versions that only
    # differ in attributes need nothing here: their attributes are refused by name.
    since: int = 1
    # Whether the op may make values of the types cellgraph only reads (READ_ONLY): a Cast that
    # rounds into them exactly. No other row makes them.
    makes_narrow: bool = False
    # Whether the row reads and makes STRING tensors: only rows built from cellgraph ops that take
    # strings (moves, Equal); every other row refuses them at the plan, before anything is built.
    strings: bool = False
    # How the row reads input i when it is computed from a run-time shape and known only in part
    # (import_symbolic.py): ``partial(node, i, value)`` gives a static stand-in for it (a Reshape's
    # target with -1 for its unknown dim), or None where it cannot (the read is then refused).
    partial: Callable[[onnx.NodeProto, int, np.ndarray], np.ndarray | None] | None = None


HALF_FLOATS = ("float16", "bfloat16")
