"""Import rows of ONNX's array ops that map onto cellgraph's own: Tile, Expand, GatherND,
ScatterND and Size.

ScatterND adds (reduction add) or replaces (none) through cellgraph's
scatter-add into zeros shaped like the data; mul, max and min are
``tensor_scatter_reduce``.

Tile's repeats and Expand's shape must be known when the graph is built (they
are attrs of cellgraph's Tile and BroadcastTo); GatherND and ScatterND read
their indices at run time. ONNX lets an index be negative (from the end):
where the dims it counts from are known, one is added as their size.

Examples
--------
>>> import numpy as np
>>> from onnx import TensorProto, helper
>>> import cellgraph as cg
>>> node = helper.make_node("Tile", ["x", "r"], ["y"])
>>> graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2])],
...     [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
...     [helper.make_tensor("r", TensorProto.INT64, [2], [2, 1])])
>>> model = cg.onnx.import_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
>>> model(np.array([[1.0, 2.0]], np.float32))
array([[1., 2.],
       [1., 2.]], dtype=float32)
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

import cellgraph as cg
from cellgraph.dataflow.graph import Tensor
from cellgraph.dataflow.ops import array_index

from .common import ImportRow

if TYPE_CHECKING:
    from .importer import Builder
    from .node_info import NodeInfo


def _tile(b: Builder, n: NodeInfo) -> list[Tensor]:
    return [cg.tile(b.ins(n)[0], [int(r) for r in b.static(n.inputs[1]).reshape(-1)])]


def _expand_shape(n: NodeInfo) -> tuple[int, ...] | None:
    """Expand's output: ONNX broadcasts both ways (a 1 in ``shape`` keeps the input's dim)."""
    shape, target = n.shape(0), n.static_value(1)
    if shape is None or None in shape or target is None:
        return None
    return tuple(int(d) for d in np.broadcast_shapes(tuple(shape), tuple(int(d) for d in target)))  # type: ignore[arg-type]


def _expand(b: Builder, n: NodeInfo) -> list[Tensor]:
    shape = _expand_shape(n)
    assert shape is not None  # the check refused it otherwise
    return [cg.broadcast_to(b.ins(n)[0], shape)]


def _check_expand(n: NodeInfo) -> str | None:
    try:
        known = _expand_shape(n)
    except ValueError as err:
        return f"Expand to a shape that does not broadcast: {err}"
    return None if known is not None else "Expand of an input whose shape is unknown until the graph runs"


def _from_end(indices: Tensor, dims: tuple[int | None, ...]) -> Tensor:
    """``indices`` (..., k) with each negative coordinate counted from the end of its dim."""
    if None in dims:
        return indices
    # Only a coordinate in [-dim, 0) moves: one below -dim stays as given, for the kernel's error to name.
    lowest = cg.constant(-np.array(dims, indices.dtype), dtype=indices.dtype)
    from_end = cg.logical_and(cg.less(indices, cg.zeros_like(indices)), cg.greater_equal(indices, lowest))
    return indices + cg.cast(from_end, indices.dtype) * cg.constant(np.array(dims, indices.dtype), dtype=indices.dtype)


def _with_batch(indices: Tensor, batch_dims: int) -> Tensor:
    """``indices`` (B..., ..., k) with the coordinates of its first ``batch_dims`` dims put in front
    of each row: ONNX's batch_dims as a plain gather_nd (the indices' shape must be known)."""
    shape = indices.shape[:-1]
    grids = np.indices(shape[:batch_dims]).reshape(batch_dims, *shape[:batch_dims], *[1] * (len(shape) - batch_dims))  # type: ignore[misc]
    coords = np.broadcast_to(np.moveaxis(grids, 0, -1), (*shape, batch_dims)).astype(indices.dtype)  # type: ignore[misc]
    return cg.concat([cg.constant(coords, dtype=indices.dtype), indices], axis=-1)


def _gather_nd(b: Builder, n: NodeInfo) -> list[Tensor]:
    data, indices = b.ins(n, 2)
    batch = int(n.attrs["batch_dims"])
    depth = indices.shape[-1]
    assert depth is not None
    indices = _from_end(indices, data.shape[batch : batch + depth])
    if batch:
        indices = _with_batch(indices, batch)
    return [cg.gather_nd(data, indices)]


def _check_gather_nd(n: NodeInfo) -> str | None:
    indices = n.shape(1)
    if indices is None or indices[-1] is None:
        return "GatherND whose indices' last dim is unknown until the graph runs"
    if int(n.attrs["batch_dims"]) and None in indices:
        return "GatherND with batch_dims of indices whose shape is unknown until the graph runs"
    return None


def _scatter_nd(b: Builder, n: NodeInfo) -> list[Tensor]:
    data, indices, updates = b.ins(n, 3)
    depth = indices.shape[-1]
    assert depth is not None
    indices = _from_end(indices, data.shape[:depth])
    reduction = _reduction(n)
    if reduction in ("mul", "max", "min"):
        return [array_index.tensor_scatter_reduce(data, indices, updates, reduction)]
    added = array_index._scatter_nd_like(indices, updates, data)
    if reduction == "add":
        return [data + added]
    # none: each indexed slice replaced by its update (ONNX leaves repeated rows undefined).
    hit = array_index._scatter_nd_like(indices, cg.ones_like(updates), data)
    return [cg.where(cg.greater(hit, cg.zeros_like(hit)), added, data)]


def _reduction(n: NodeInfo) -> str:
    return n.text("reduction")


def _check_scatter_nd(n: NodeInfo) -> str | None:
    if _reduction(n) not in ("none", "add", "mul", "max", "min"):
        return f"ScatterND with reduction {_reduction(n)!r}"
    indices = n.shape(1)
    if indices is None or indices[-1] is None:
        return "ScatterND whose indices' last dim is unknown until the graph runs"
    return None


def _size_value(n: NodeInfo) -> np.ndarray | None:
    shape = n.shape(0)
    return None if shape is None or None in shape else np.array(math.prod(d or 0 for d in shape), np.int64)


def _gather_elements(b: Builder, n: NodeInfo) -> list[Tensor]:
    """GatherElements as a GatherND: each index's full coordinates, its own position on every other axis."""
    data, indices = b.ins(n, 2)
    rank = len(indices.shape)
    axis = int(n.attrs["axis"]) % rank
    index = cg.cast(indices, "int64")
    size = cg.constant(np.array(data.shape[axis], np.int64), dtype="int64")
    # A negative index counts from the end; one below -size stays as given, for the kernel's error to name.
    from_end = cg.logical_and(cg.less(index, cg.zeros_like(index)), cg.greater_equal(index, cg.neg(size)))
    index = cg.where(from_end, index + size, index)
    if None in indices.shape:  # a run-time dim (a dynamic batch): each position along d counted when it runs
        ones = cg.ones_like(index)
        grid = [cg.cumsum(ones, d, exclusive=True) for d in range(rank)]
    else:
        grid = [cg.constant(g, dtype="int64") for g in np.indices([int(d) for d in indices.shape], dtype=np.int64)]  # type: ignore[arg-type]
    coordinates = [index if d == axis else grid[d] for d in range(rank)]
    return [cg.gather_nd(data, cg.stack(coordinates, axis=-1))]


def _check_gather_elements(n: NodeInfo) -> str | None:
    data, indices = n.shape(0), n.shape(1)
    if indices is None or data is None:
        return "GatherElements of an input or indices whose rank is unknown until the graph runs"
    axis = int(n.attrs["axis"]) % max(len(indices), 1)
    if data[axis] is None:
        return f"GatherElements along axis {axis}, whose size is unknown until the graph runs"
    return None


ARRAYS: dict[str, ImportRow] = {
    "Tile":      ImportRow(_tile, {}, (1,), strings=True),
    "Expand":    ImportRow(_expand, {}, (1,), _check_expand),
    "GatherND":  ImportRow(_gather_nd, {"batch_dims": 0}, check=_check_gather_nd),
    "GatherElements": ImportRow(_gather_elements, {"axis": 0}, check=_check_gather_elements, since=11),
    "ScatterND": ImportRow(_scatter_nd, {"reduction": "none"}, check=_check_scatter_nd),
    # A static shape gives the size now; otherwise cellgraph's Size computes it.
    "Size":      ImportRow(lambda b, n: [cg.size(b.ins(n)[0], out_type="int64")], fold=_size_value, strings=True),
}  # fmt: skip
