"""Export rows of the issue-16 array ops: Split, Tile, BroadcastTo, MirrorPad, GatherNd,
ScatterNd, TensorScatterReduce, BatchGather, Shape, Size and Range.

Most have an ONNX op of the same meaning. ONNX's indices are int64 (cellgraph's
may be int32: cast first), and its Shape and Size give int64 (cast back to an
int32 ``out_type``). SYMMETRIC padding has no ONNX mode: it is concatenated
from reversed slices, which need no dim to be known.

Examples
--------
>>> sorted(ARRAY_EXPORTERS)[:3]
['BatchGather', 'BroadcastTo', 'GatherNd']
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from cellgraph.dataflow.graph import Node

from .common import DTYPE_TO_ONNX, INT64_MIN, OnnxError

if TYPE_CHECKING:
    from .exporter import Emitter

INT64 = DTYPE_TO_ONNX["int64"]


def _ints(e: Emitter, values: object) -> str:
    return e.const(np.array(values, np.int64).reshape(-1))


def _int64(e: Emitter, name: str, dtype: str) -> str:
    return name if dtype == "int64" else e.node("Cast", [name], to=INT64)[0]


def _split(e: Emitter, node: Node) -> None:
    x = e.ins(node)[0]
    axis, sizes = node.attrs["axis"], node.attrs["sizes"]
    pieces = [spec.shape[axis] for spec in node.specs]
    if None not in pieces:
        e.node("Split", [x, _ints(e, pieces)], e.outs(node), axis=axis)
    elif not sizes:
        e.node("Split", [x], e.outs(node), axis=axis)  # no split input: equal pieces
    else:
        # The rest piece (-1) of an axis unknown until run time: its size minus the others.
        dim = e.node("Gather", [e.node("Shape", [x])[0], _ints(e, [axis])], axis=0)[0]
        rest = e.node("Sub", [dim, _ints(e, [sum(s for s in sizes if s != -1)])])[0]
        parts = [rest if s == -1 else _ints(e, [s]) for s in sizes]
        e.node("Split", [x, e.node("Concat", parts, axis=0)[0]], e.outs(node), axis=axis)


def _mirror_pad(e: Emitter, node: Node) -> None:
    pairs = node.attrs["paddings"]
    if node.attrs["mode"] == "REFLECT":
        pads = [p[0] for p in pairs] + [p[1] for p in pairs]
        e.node("Pad", [e.ins(node)[0], _ints(e, pads)], e.outs(node), mode="reflect")
        return
    x = e.ins(node)[0]
    for axis, (before, after) in enumerate(pairs):
        if not before and not after:
            continue
        parts = []
        if before:  # x[before-1::-1] along axis: the first `before` elements, reversed
            parts.append(e.node("Slice", [x, _ints(e, [before - 1]), _ints(e, [INT64_MIN]), _ints(e, [axis]),
                                          _ints(e, [-1])])[0])  # fmt: skip
        parts.append(x)
        if after:  # x[-1:-after-1:-1]: the last `after` elements, reversed
            parts.append(e.node("Slice", [x, _ints(e, [-1]), _ints(e, [-after - 1]), _ints(e, [axis]),
                                          _ints(e, [-1])])[0])  # fmt: skip
        x = e.node("Concat", parts, axis=axis)[0]
    e.node("Identity", [x], e.outs(node))


def _gather_nd(e: Emitter, node: Node) -> None:
    params, indices = e.ins(node)
    e.node("GatherND", [params, _int64(e, indices, node.inputs[1].dtype)], e.outs(node))


def _scatter_nd(e: Emitter, node: Node) -> None:
    indices, updates = e.ins(node)
    zeros = e.const(np.zeros(node.attrs["shape"], np.dtype(node.inputs[1].dtype)))
    index = _int64(e, indices, node.inputs[0].dtype)
    e.node("ScatterND", [zeros, index, updates], e.outs(node), reduction="add")  # repeated rows sum


def _tensor_scatter(e: Emitter, node: Node) -> None:
    reduction = node.attrs["reduction"]
    if reduction != "mul" and e.opset < 18:
        raise OnnxError(
            f"{node.describe()}: ScatterND's reduction {reduction!r} needs opset 18 or newer, not {e.opset}: "
            "export with opset=18"
        )
    data, indices, updates = e.ins(node)
    index = _int64(e, indices, node.inputs[1].dtype)
    e.node("ScatterND", [data, index, updates], e.outs(node), reduction=reduction)


def _batch_gather(e: Emitter, node: Node) -> None:
    batch_dims, axis = node.attrs["batch_dims"], node.attrs["axis"]
    if axis != batch_dims:
        raise OnnxError(
            f"{node.describe()}: gather with axis {axis} after batch_dims {batch_dims} has no ONNX equivalent "
            "(GatherND's batch_dims indexes the axis right after them)"
        )
    params, indices = e.ins(node)
    rows = e.node("Unsqueeze", [_int64(e, indices, node.inputs[1].dtype), _ints(e, [-1])])[0]
    e.node("GatherND", [params, rows], e.outs(node), batch_dims=batch_dims)


def _measure(op_type: str) -> Callable[[Emitter, Node], None]:
    def row(e: Emitter, node: Node) -> None:
        if node.attrs["out_type"] == "int64":
            e.node(op_type, e.ins(node), e.outs(node))
        else:
            e.node("Cast", e.node(op_type, e.ins(node)), e.outs(node), to=DTYPE_TO_ONNX[node.attrs["out_type"]])

    return row


ARRAY_EXPORTERS: dict[str, Callable[[Emitter, Node], object]] = {  # what a row returns is ignored
    "Split":       _split,
    "Tile":        lambda e, node: e.node("Tile", [e.ins(node)[0], _ints(e, node.attrs["multiples"])], e.outs(node)),
    "BroadcastTo": lambda e, node: e.node("Expand", [e.ins(node)[0], _ints(e, node.attrs["shape"])], e.outs(node)),
    "MirrorPad":   _mirror_pad,
    "GatherNd":    _gather_nd,
    "ScatterNd":   _scatter_nd,
    "TensorScatterReduce": _tensor_scatter,
    "BatchGather": _batch_gather,
    "Shape":       _measure("Shape"),
    "Size":        _measure("Size"),
    "Range":       lambda e, node: e.node("Range", e.ins(node), e.outs(node)),
}  # fmt: skip
