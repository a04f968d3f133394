"""Import rows of ONNX's activations that cellgraph builds from a few of its ops: PRelu, Mish, ThresholdedRelu and
Shrink.

PRelu's slope broadcasts to the input from the right (ONNX's unidirectional
broadcast), so a per-channel slope of an NCHW image is stored ``(C, 1, 1)``;
it is a variable when it is an initializer, and trains. Half floats are
computed in float32 and rounded once, as ONNX Runtime does.

Examples
--------
>>> import numpy as np
>>> from onnx import TensorProto, helper
>>> import cellgraph as cg
>>> node = helper.make_node("PRelu", ["x", "slope"], ["y"])
>>> graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
...     [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
...     [helper.make_tensor("slope", TensorProto.FLOAT, [1], [0.25])])
>>> model = cg.onnx.import_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
>>> model(np.array([-2.0, 0.0, 3.0], np.float32))
array([-0.5,  0. ,  3. ], dtype=float32)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

import cellgraph as cg
from cellgraph.dataflow.graph import Tensor
from cellgraph.dataflow.ops import activations as act
from cellgraph.dataflow.ops import math_unary as mu

from .common import FLOAT_CODES, ImportRow
from .import_wrappers import in_float32

if TYPE_CHECKING:
    from .importer import Builder
    from .node_info import NodeInfo


def _scalar(value: float, like: Tensor) -> Tensor:
    return cg.constant(np.array(value, like.dtype), dtype=like.dtype)


def _prelu(b: Builder, n: NodeInfo) -> list[Tensor]:
    x, slope = b.ins(n, 2)
    return [mu.where(x < _scalar(0, x), x * slope, x)]


def _check_prelu(n: NodeInfo) -> str | None:
    x, slope = n.shape(0), n.shape(1)
    if x is not None and slope is not None and len(slope) > len(x):
        return f"PRelu with a slope of rank {len(slope)} over an input of rank {len(x)}"
    return None


def _mish(b: Builder, n: NodeInfo) -> list[Tensor]:
    x = b.ins(n, 1)[0]
    return [x * cg.tanh(act.softplus(x))]


def _thresholded_relu(b: Builder, n: NodeInfo) -> list[Tensor]:
    x = b.ins(n, 1)[0]
    return [mu.where(x > _scalar(float(n.attrs["alpha"]), x), x, _scalar(0, x))]


def _shrink(b: Builder, n: NodeInfo) -> list[Tensor]:
    x = b.ins(n, 1)[0]
    lambd, bias = float(n.attrs["lambd"]), float(n.attrs["bias"])
    zero = _scalar(0, x)
    below = mu.where(x < _scalar(-lambd, x), x + _scalar(bias, x), zero)
    return [mu.where(x > _scalar(lambd, x), x - _scalar(bias, x), below)]


def _floats_only(op: str) -> object:
    def check(n: NodeInfo) -> str | None:
        code = n.elem_type(0)
        if code and code not in FLOAT_CODES:
            return f"{op} of {n.dtype_name(code)} (cellgraph imports it for floats)"
        return None

    return check


ACTIVATIONS: dict[str, ImportRow] = {
    "PRelu":           ImportRow(in_float32(_prelu), check=_check_prelu, since=7),
    "Mish":            ImportRow(in_float32(_mish)),
    "ThresholdedRelu": ImportRow(in_float32(_thresholded_relu), {"alpha": 1.0}),
    "Shrink":          ImportRow(in_float32(_shrink), {"bias": 0.0, "lambd": 0.5}, check=_floats_only("Shrink")),  # type: ignore[arg-type]
}  # fmt: skip
