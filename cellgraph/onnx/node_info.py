"""One ONNX node as the importer's rows see it: ``NodeInfo``, its attributes resolved and what is known of its
inputs (static values, shapes and element types from ONNX shape inference).

Examples
--------
>>> import numpy as np
>>> from onnx import helper
>>> node = helper.make_node("Relu", ["x"], ["y"])
>>> info = NodeInfo(node, 17, {}, {"x": np.zeros((2, 3), np.float32)}, {})
>>> info.name, info.version, info.shape(0), info.describe()
('Relu->y', 14, (2, 3), "Relu node 'Relu->y', opset 17")
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx

from .common import as_text, onnx_code, onnx_dtype_name, shape_dims


@dataclass
class NodeInfo:
    """One ONNX node with its attributes resolved (defaults filled) and what is known about its values."""

    proto: onnx.NodeProto
    opset: int
    attrs: dict[str, Any]
    known: Mapping[str, np.ndarray]
    types: Mapping[str, onnx.TypeProto]
    # A ConstantOfShape's or Expand's shape known only in part (import_symbolic.py): built when it runs.
    fill: np.ndarray | None = None

    @property
    def op(self) -> str:
        return str(self.proto.op_type)

    @property
    def name(self) -> str:
        return str(self.proto.name) or f"{self.op}->{','.join(self.proto.output)}"

    @property
    def inputs(self) -> list[str]:
        return list(self.proto.input)

    @property
    def outputs(self) -> list[str]:
        return list(self.proto.output)

    @property
    def version(self) -> int:
        """The version of the node's op that the model's opset means (its schema's since_version)."""
        return int(onnx.defs.get_schema(self.op, self.opset, "").since_version)

    def describe(self) -> str:
        return f"{self.op} node {self.name!r}, opset {self.opset}"

    def shape(self, i: int) -> tuple[int | None, ...] | None:
        """Input ``i``'s static shape from ONNX shape inference, or None when its rank is unknown."""
        if i >= len(self.inputs) or not self.inputs[i]:
            return None
        if self.inputs[i] in self.known:
            return tuple(self.known[self.inputs[i]].shape)
        dims = shape_dims(self.types.get(self.inputs[i]))
        return None if dims is None else tuple(dims)

    def rank(self, i: int) -> int | None:
        shape = self.shape(i)
        return None if shape is None else len(shape)

    def static_value(self, i: int, shaped: bool = False) -> np.ndarray | None:
        if i >= len(self.inputs) or self.inputs[i] not in self.known:
            return None
        value = self.known[self.inputs[i]]
        return value if shaped else value.reshape(-1)

    def text(self, name: str, default: str = "") -> str:
        """STRING attribute ``name`` as ``str`` (``default`` when the op's version has no such attribute)."""
        return as_text(self.attrs[name]) if name in self.attrs else default

    def elem_type(self, i: int) -> int | None:
        """Input ``i``'s ONNX element type (a TensorProto code): its value's when known, else from shape inference;
        None when unknown (UNDEFINED too)."""
        if i >= len(self.inputs) or not self.inputs[i]:
            return None
        if self.inputs[i] in self.known:
            return onnx_code(self.known[self.inputs[i]])
        t = self.types.get(self.inputs[i])
        code = int(t.tensor_type.elem_type) if t is not None and t.HasField("tensor_type") else 0
        return code or None

    @property
    def static_output(self) -> np.ndarray | None:
        return self.known.get(self.outputs[0]) if self.outputs else None

    def dtype_name(self, code: int | None) -> str:
        return "no type" if code is None else onnx_dtype_name(code)
