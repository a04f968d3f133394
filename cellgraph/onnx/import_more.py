"""Import rows of the ONNX ops that map onto issue 16's newer cellgraph ops: CumSum
(``cg.cumsum``) and TopK (``cg.top_k``).

CumSum's axis and TopK's K must be known when the graph is built (they are
attrs of cellgraph's ops). TopK along another axis than the last is moved
there and back by transposes; ``largest=0`` is the top k of ``-x`` (floats
only: negating the most negative int overflows), which keeps ONNX's tie rule
(the lower index first). ``sorted=0`` leaves the order to the runtime, and
cellgraph's sorted order is one such order.

Examples
--------
>>> import numpy as np
>>> from onnx import TensorProto, helper
>>> import cellgraph as cg
>>> node = helper.make_node("CumSum", ["x", "axis"], ["y"], exclusive=1)
>>> graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
...     [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
...     [helper.make_tensor("axis", TensorProto.INT32, [], [0])])
>>> model = cg.onnx.import_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
>>> model(np.array([1.0, 2.0, 3.0], np.float32))
array([0., 1., 3.], dtype=float32)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import cellgraph as cg
from cellgraph.dataflow.graph import Tensor

from .common import ImportRow

if TYPE_CHECKING:
    from .importer import Builder, NodeInfo


def _cumsum(b: Builder, n: NodeInfo) -> list[Tensor]:
    x = b.ins(n)[0]
    axis = int(b.static(n.inputs[1]).reshape(-1)[0])
    return [cg.cumsum(x, axis, exclusive=bool(n.attrs["exclusive"]), reverse=bool(n.attrs["reverse"]))]


def _check_cumsum(n: NodeInfo) -> str | None:
    rank = n.rank(0)
    if rank is None:
        return "CumSum of an input whose rank is unknown until the graph runs"
    axis = n.static_value(1)
    if axis is not None and not -rank <= int(axis[0]) < rank:
        return f"CumSum along axis {int(axis[0])} of a rank-{rank} input"
    return None


def _top_k(b: Builder, n: NodeInfo) -> list[Tensor]:
    x = b.ins(n)[0]
    k = int(b.static(n.inputs[1]).reshape(-1)[0])
    rank = len(x.shape)
    axis = int(n.attrs["axis"]) % rank
    perm = [*(i for i in range(rank) if i != axis), axis]
    moved = x if axis == rank - 1 else cg.transpose(x, perm)
    smallest = not n.attrs["largest"]
    values, indices = cg.top_k(-moved if smallest else moved, k)
    if smallest:
        values = -values
    indices = cg.cast(indices, "int64")
    if axis != rank - 1:
        back = [perm.index(i) for i in range(rank)]
        values, indices = cg.transpose(values, back), cg.transpose(indices, back)
    return [values, indices]


def _check_top_k(n: NodeInfo) -> str | None:
    shape = n.shape(0)
    if shape is None or not shape:
        return "TopK of an input whose rank is unknown until the graph runs, or of rank 0"
    if not n.attrs["largest"] and n.types.get(n.inputs[0]) is not None:
        elem = n.types[n.inputs[0]].tensor_type.elem_type
        if elem not in (1, 10, 11, 16):  # FLOAT, FLOAT16, DOUBLE, BFLOAT16
            return "TopK with largest=0 of integers (the smallest are found as the largest of -x)"
    return None


MORE: dict[str, ImportRow] = {
    "CumSum": ImportRow(_cumsum, {"exclusive": 0, "reverse": 0}, (1,), _check_cumsum),
    "TopK":   ImportRow(_top_k, {"axis": -1, "largest": 1, "sorted": 1}, (1,), _check_top_k, since=10),
}  # fmt: skip
