"""Shapes computed at import from a run-time shape: known but for their dynamic dims.

An exporter with a dynamic batch (PyTorch's, for attention and most
reshapes) computes a Reshape's target from the input's own shape: ``Shape``
of a ``(batch, 5, 16)`` tensor, ``Gather`` of its dims, arithmetic such as
``batch * heads``, ``Unsqueeze`` and ``Concat``. cellgraph's shapes are
static but for unknown dims (``None``), so this chain is computed when the
model is imported, with each dim unknown until run time held as ``None``
(an object array of ints and Nones): a partial value. A chain whose value
turns out whole (every dim it reads static) becomes a known value like any
constant.

A Reshape may take a partial target with one unknown dim: that dim becomes
-1, inferred at run time as ONNX infers it. Any other reader of a partial
value (a second unknown in one Reshape, an Expand's shape, a tensor input)
is refused before anything is built, naming the value and what is unknown.

Examples
--------
>>> dims = np.array([None, 5, 16], dtype=object)
>>> elementwise("Mul", [dims[0:1], np.array([2])]).tolist(), reshape_target(np.array([None, 5, 8], dtype=object))
([None], array([-1,  5,  8]))
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx

from cellgraph.dataflow.graph import Tensor

from .common import OnnxError, shape_dims
from .import_shapes import constant_of_shape_fill

# The ops a partial value flows through: each computes on int vectors with NumPy's own indexing.
SYMBOLIC_OPS = frozenset(
    {
        "Shape",
        "Gather",
        "Unsqueeze",
        "Squeeze",
        "Concat",
        "Slice",
        "Cast",
        "Identity",
        "Reshape",
        "Mul",
        "Div",
        "Add",
        "Sub",
        "Mod",
    }
)


@dataclass(frozen=True)
class Dim:
    """A dim known only at run time: axis ``axis`` of ONNX value ``tensor``. A fill of a shape holding
    one (ConstantOfShape, Expand) takes its size from that tensor when the graph runs."""

    tensor: str
    axis: int

    def __repr__(self) -> str:
        return f"{self.tensor}.shape[{self.axis}]"


def unknown(v: Any) -> bool:
    """Whether an element of a partial value is unknown until run time (a ``Dim``, or None once computed on)."""
    return v is None or isinstance(v, Dim)


def _trunc_div(a: int, b: int) -> int:
    # ONNX's integer Div truncates toward zero (as C does), not toward -inf as Python's // does.
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


_ARITHMETIC: dict[str, Callable[[int, int], int]] = {
    "Add": lambda a, b: a + b,
    "Sub": lambda a, b: a - b,
    "Mul": lambda a, b: a * b,
    "Div": _trunc_div,
    "Mod": lambda a, b: a % b,  # fmod=0: the sign of the divisor, as Python's %
}


def elementwise(op: str, values: list[np.ndarray]) -> np.ndarray:
    """``op`` of two int arrays that broadcast, None wherever either side is None."""
    f = _ARITHMETIC[op]
    a, b = np.broadcast_arrays(np.asarray(values[0], dtype=object), np.asarray(values[1], dtype=object))
    out = np.empty(a.shape, dtype=object)
    for index in np.ndindex(a.shape):
        x, y = a[index], b[index]
        out[index] = None if unknown(x) or unknown(y) else f(int(x), int(y))
    return out


def is_partial(value: np.ndarray) -> bool:
    return value.dtype == object and any(unknown(v) for v in value.reshape(-1))


def evaluate(
    node: onnx.NodeProto,
    known: Mapping[str, np.ndarray],
    partial: Mapping[str, np.ndarray],
    types: Mapping[str, onnx.TypeProto],
) -> np.ndarray | None:
    """The output of ``node`` as an object array (ints, None where unknown) when it computes on a run-time
    shape (a Shape of a dynamic tensor, or any input partial) and its other inputs are known; else None."""
    if node.op_type not in SYMBOLIC_OPS or node.domain not in ("", "ai.onnx") or len(node.output) != 1:
        return None
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    if node.op_type == "Shape":
        dims = shape_dims(types.get(node.input[0]))
        if dims is None or None not in dims:
            return None  # a rank unknown (refused elsewhere) or every dim static (folded as a constant)
        rank = len(dims)
        start, end = int(attrs.get("start", 0)), attrs.get("end")
        stop = rank if end is None else int(end)
        held = [Dim(node.input[0], axis) if d is None else d for axis, d in enumerate(dims)]
        return np.array(held[start + rank if start < 0 else start : stop + rank if stop < 0 else stop], dtype=object)
    names = [name for name in node.input if name]
    if not any(name in partial for name in names) or not all(name in partial or name in known for name in names):
        return None
    if node.op_type == "Slice" and len(names) < 3:
        return None  # Slice-1's starts and ends are attributes: its row refuses it by name
    values = [np.asarray(partial[name] if name in partial else known[name]).astype(object) for name in names]
    # np.take of one index gives a bare element: every result is an array (0-D for a scalar).
    return np.asarray(_compute(node.op_type, attrs, values, node), dtype=object)


def _ints(value: np.ndarray, what: str, node: onnx.NodeProto) -> list[int]:
    if is_partial(value):
        raise OnnxError(f"{what} of {node.op_type} node {node.name!r} is unknown until run time: {value.tolist()}")
    return [int(v) for v in value.reshape(-1)]


def _compute(op: str, attrs: dict[str, Any], values: list[np.ndarray], node: onnx.NodeProto) -> np.ndarray:
    x = values[0]
    if op in _ARITHMETIC:
        return elementwise(op, values)
    if op in ("Cast", "Identity"):
        return x
    if op == "Gather":
        indices = np.asarray(_ints(values[1], "the indices", node)).reshape(np.shape(values[1]))
        size = x.shape[int(attrs.get("axis", 0))]
        return np.take(x, np.where(indices < 0, indices + size, indices), axis=int(attrs.get("axis", 0)))
    if op in ("Unsqueeze", "Squeeze"):
        axes = attrs.get("axes") if len(values) < 2 else _ints(values[1], "the axes", node)
        rank = x.ndim + (len(axes or []) if op == "Unsqueeze" else 0)
        axes = sorted(a % rank for a in axes) if axes is not None else None
        if op == "Squeeze":
            return np.squeeze(x, axis=tuple(axes) if axes is not None else None)
        for a in axes or []:
            x = np.expand_dims(x, a)
        return x
    if op == "Concat":
        return np.concatenate([np.atleast_1d(v) for v in values], axis=int(attrs["axis"]))
    if op == "Reshape":
        return x.reshape(_ints(values[1], "the target shape", node))
    # Slice of a 1-D value (a shape): starts, ends, axes, steps as ONNX gives them.
    starts, ends = _ints(values[1], "the starts", node), _ints(values[2], "the ends", node)
    axes = _ints(values[3], "the axes", node) if len(values) > 3 else [0]
    steps = _ints(values[4], "the steps", node) if len(values) > 4 else [1]
    if x.ndim != 1 or axes not in ([0], [-1]):
        raise OnnxError(f"Slice node {node.name!r} slices a run-time shape other than along its one axis")
    return x[slice(starts[0], ends[0], steps[0])]


def reshape_target(value: np.ndarray) -> np.ndarray:
    """A Reshape's partial target as a static one: its one unknown dim becomes -1 (inferred at run time)."""
    if sum(1 for v in value.reshape(-1) if unknown(v) or v == -1) > 1:
        raise OnnxError(
            f"a Reshape to {value.tolist()} has more than one dim unknown until run time (a run-time dim, or -1): "
            "cellgraph reshapes with at most one"
        )
    return np.array([-1 if unknown(v) else int(v) for v in value.reshape(-1)], dtype=np.int64)


def fill_dims(dims: np.ndarray) -> str | None:
    """Why a fill (ConstantOfShape, Expand) of the partial shape ``dims`` cannot be made at run time, or None:
    each unknown dim must be a tensor's own (a dim computed on, such as ``batch * 2``, has no tensor)."""
    lost = [i for i, v in enumerate(dims.reshape(-1)) if v is None]
    if lost:
        return f"dims {lost} of {dims.tolist()} are computed from a run-time shape, not read from one tensor"
    return None


def run_time_fill(dims: np.ndarray, value: np.ndarray, tensor: Callable[[str], Tensor]) -> Tensor:
    """A tensor of shape ``dims`` filled with ``value``: static dims from a constant, and each ``Dim`` added
    along its axis as a line of zeros as long as that tensor's dim when the graph runs (broadcasting)."""
    import cellgraph as cg

    dims = dims.reshape(-1)
    rank = len(dims)
    compute = "int32" if value.dtype == np.bool_ else value.dtype.name
    static = [1 if unknown(d) else int(d) for d in dims]
    out = cg.constant(np.full(static, value.reshape(-1)[0], dtype=compute), dtype=compute)
    for k, d in enumerate(dims):
        if isinstance(d, Dim):
            t = tensor(d.tensor)
            r = len(t.shape)
            line = cg.slice(t, [0] * r, [-1 if i == d.axis else 1 for i in range(r)])  # one element across
            zeros = cg.zeros_like(cg.cast(line, compute))
            out = out + cg.reshape(zeros, [-1 if i == k else 1 for i in range(rank)])
    return cg.cast(out, "bool") if value.dtype == np.bool_ else out


# The fills whose shape input may be partial: (op, position of the shape).
FILLS = {"ConstantOfShape": 0, "Expand": 1}


def fill_shape(
    node: onnx.NodeProto, partial: Mapping[str, np.ndarray], describe: Callable[[], str]
) -> np.ndarray | None:
    """The partial shape a ConstantOfShape or Expand fills to, when it is one (else None); an OnnxError
    naming the node when a dim of it has no tensor to take its size from."""
    position = FILLS.get(node.op_type)
    if position is None or len(node.input) <= position or node.input[position] not in partial:
        return None
    dims = partial[node.input[position]]
    why = fill_dims(dims)
    if why is not None or any(name in partial for i, name in enumerate(node.input) if i != position):
        raise OnnxError(f"{describe()} fills a shape known only when the graph runs: {why or 'its input is partial'}")
    return dims


def build_fill(dims: np.ndarray, node: onnx.NodeProto, tensor: Callable[[str], Tensor]) -> Tensor:
    """The output of a ConstantOfShape or Expand (``fill_shape`` gave ``dims``), made when the graph runs."""
    from cellgraph.dataflow.ops import logic

    if node.op_type == "ConstantOfShape":
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        return run_time_fill(dims, constant_of_shape_fill(attrs.get("value")), tensor)
    x = tensor(node.input[0])  # Expand: ONNX broadcasts both ways, as adding zeros of the shape does
    zeros = run_time_fill(dims, np.zeros(1, np.bool_ if x.dtype == "bool" else x.dtype), tensor)
    return logic.logical_or(x, zeros) if x.dtype == "bool" else x + zeros
