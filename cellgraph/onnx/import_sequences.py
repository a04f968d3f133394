"""ONNX sequences and optionals at an imported model's boundary: each becomes the tensors it holds.

cellgraph's values are tensors, with static ranks. An ONNX graph input of a
sequence type (a list of tensors) or an optional type (a value, or none) is
fixed in structure when the model is imported, from an example value, as
tracing fixes it: ``import_model(model, examples={"x": [a, b]})``.

- A sequence of n tensors becomes n placeholders ``x/0`` ... ``x/{n-1}``, each
  of the element type's dtype and shape, or of the example element's rank with
  every dim left open where the type gives no shape.
- An optional holding a value becomes that value's placeholders; an empty one
  (example ``None``) becomes none.

Identity passes a sequence or optional on as it is. Any other op reading one
is refused, before anything is built, naming the value and the node. The
model takes such an input, and returns such an output, as a list of arrays (or
``None`` for an empty optional); a sequence of another length is refused with
the length fixed at import.

Examples
--------
>>> import numpy as np
>>> from onnx import TensorProto, helper
>>> seq = helper.make_tensor_sequence_value_info("x", TensorProto.FLOAT, None)
>>> node = helper.make_node("Identity", ["x"], ["y"])
>>> out = helper.make_tensor_sequence_value_info("y", TensorProto.FLOAT, None)
>>> model = helper.make_model(helper.make_graph([node], "g", [seq], [out]))
>>> from cellgraph.onnx import import_model
>>> m = import_model(model, examples={"x": [np.zeros(2, np.float32), np.ones((2,), np.float32)]})
>>> [t.name for t in m.inputs], m([np.arange(3, dtype=np.float32), np.ones(1, np.float32)])
(['x/0:0', 'x/1:0'], [array([0., 1., 2.], dtype=float32), array([1.], dtype=float32)])
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx

import cellgraph as cg
from cellgraph.dataflow.graph import Tensor

from .common import ONNX_TO_DTYPE, OnnxError, cell_name, onnx_dtype_name, shape_dims

TENSOR, SEQUENCE, EMPTY = "tensor", "sequence", "empty"


@dataclass(frozen=True)
class Slot:
    """One ONNX graph input or output as cellgraph holds it: a tensor, a sequence of ``count``
    tensors, or an empty optional (no tensor)."""

    name: str
    kind: str
    count: int

    def describe(self) -> str:
        if self.kind == SEQUENCE:
            return f"a sequence of {self.count} tensor{'' if self.count == 1 else 's'}"
        return "an empty optional" if self.kind == EMPTY else "a tensor"


def is_container(t: onnx.TypeProto | None) -> bool:
    """Whether an ONNX type is a sequence or an optional (not a tensor)."""
    return t is not None and (t.HasField("sequence_type") or t.HasField("optional_type"))


def refuse_container_read(value: str, t: onnx.TypeProto | None, what: str) -> None:
    """An ``OnnxError`` when a node other than Identity (``what``) reads a sequence or optional."""
    if is_container(t):
        kind = "a sequence" if t is not None and t.HasField("sequence_type") else "an optional"
        raise OnnxError(
            f"value {value!r} of {what} is {kind}: cellgraph holds it as the tensors in it, "
            "which only Identity passes on"
        )


def _element(t: onnx.TypeProto, name: str) -> tuple[onnx.TypeProto, str]:
    """The tensor type inside a sequence or optional type, and the kind of container it is in."""
    kind = TENSOR
    if t.HasField("optional_type"):
        t = t.optional_type.elem_type
    if t.HasField("sequence_type"):
        kind, t = SEQUENCE, t.sequence_type.elem_type
    if not t.HasField("tensor_type"):
        raise OnnxError(f"graph input {name!r} nests containers cellgraph has no tensors for: {t}")
    return t, kind


def input_placeholders(value: onnx.ValueInfoProto, example: Any, has_example: bool) -> tuple[Slot, list[Tensor]]:
    """The placeholders of one sequence or optional graph input, its structure fixed by ``example``."""
    name = value.name
    if not has_example:
        raise OnnxError(
            f"graph input {name!r} is a sequence or optional: give an example value, "
            f"import_model(..., examples={{{name!r}: [...]}}), which fixes its length (None: an empty optional)"
        )
    element, kind = _element(value.type, name)
    if example is None:
        if not value.type.HasField("optional_type"):
            raise OnnxError(f"graph input {name!r} is a sequence, not an optional: its example cannot be None")
        return Slot(name, EMPTY, 0), []
    code = element.tensor_type.elem_type
    if code not in ONNX_TO_DTYPE:  # in their own type: a sequence's elements are not wrapped back
        raise OnnxError(f"graph input {name!r} holds {onnx_dtype_name(code)} tensors, which cellgraph does not have")
    if kind == SEQUENCE and not isinstance(example, Sequence | np.ndarray):
        raise OnnxError(f"the example of sequence input {name!r} is a {type(example).__name__}, not a list of arrays")
    items = list(example) if kind == SEQUENCE else [example]
    typed = shape_dims(element)
    placeholders = []
    for i, item in enumerate(items):
        dims = typed if typed is not None else [None] * np.ndim(item)
        label = f"{name}/{i}" if kind == SEQUENCE else name
        placeholders.append(cg.placeholder(dims, ONNX_TO_DTYPE[code], name=cell_name(label)))
    return Slot(name, kind, len(items) if kind == SEQUENCE else 1), placeholders


def output_slot(name: str, value: Tensor | list[Tensor] | None) -> tuple[Slot, list[Tensor]]:
    """A graph output: a tensor, or the tensors of a sequence or optional that Identity passed on."""
    if value is None:
        return Slot(name, EMPTY, 0), []
    if isinstance(value, list):
        outs = [cg.identity(t, name=cell_name(f"{name}/{i}")) for i, t in enumerate(value)]
        return Slot(name, SEQUENCE, len(outs)), outs
    return Slot(name, TENSOR, 1), [cg.identity(value, name=cell_name(name))]


def flatten(slots: list[Slot], args: Sequence[Any]) -> list[Any]:
    """The model's arguments (a list for each sequence, None for an empty optional) as its tensors' feeds."""
    if len(args) != len(slots):
        names = ", ".join(f"{s.name} ({s.describe()})" for s in slots)
        raise OnnxError(f"this model takes {len(slots)} input(s): {names}; got {len(args)}")
    fed: list[Any] = []
    for slot, arg in zip(slots, args, strict=True):
        if slot.kind == TENSOR:
            fed.append(arg)
        elif slot.kind == EMPTY:
            if arg is not None:
                raise OnnxError(f"input {slot.name!r} was imported as an empty optional; pass None")
        else:
            items = list(arg) if isinstance(arg, Sequence | np.ndarray) else None
            if items is None or len(items) != slot.count:
                got = f"{len(items)} tensors" if items is not None else f"a {type(arg).__name__}"
                raise OnnxError(f"input {slot.name!r} is {slot.describe()} (its length was fixed at import); got {got}")
            fed.extend(items)
    return fed


def regroup(slots: list[Slot], results: list[Any]) -> list[Any]:
    """The model's tensors' results as its ONNX outputs: a list for a sequence, None for an empty optional."""
    out: list[Any] = []
    at = 0
    for slot in slots:
        if slot.kind == TENSOR:
            out.append(results[at])
        elif slot.kind == EMPTY:
            out.append(None)
        else:
            out.append(list(results[at : at + slot.count]))
        at += slot.count
    return out


def examples_of(model: onnx.ModelProto, values: Mapping[str, Any]) -> dict[str, Any]:
    """Of ``values`` by graph input name, those of the model's sequence and optional inputs."""
    return {v.name: values[v.name] for v in model.graph.input if is_container(v.type) and v.name in values}
