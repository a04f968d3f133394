"""Export cases of the issue-16 array ops, for ``test_onnx_export.py``'s table (each runs in
ONNX Runtime, opsets 17 and 18, with 1 and 5 rows, against the session)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

import cellgraph as cg
from cellgraph.dataflow.ops import array_index

Case = Callable[[], tuple[list[cg.Tensor], cg.Tensor]]
F = "float32"


def _x(shape: tuple[int | None, ...] = (None, 3, 4), name: str = "x", dtype: str = F) -> cg.Tensor:
    return cg.placeholder(shape, dtype, name=name)


def _unary(fn: Callable[[cg.Tensor], cg.Tensor]) -> Case:
    def case() -> tuple[list[cg.Tensor], cg.Tensor]:
        x = _x()
        return [x], fn(x)

    return case


def _split(x: cg.Tensor) -> cg.Tensor:
    a, b = cg.split(x, [1, -1], axis=2)
    c, d = cg.split(cg.concat([x, x * 3.0], axis=0), 2, axis=0)  # equal pieces of a dim unknown until run time
    e, f = cg.split(x, [-1, 1], axis=0)
    return cg.reduce_sum(a * 2.0, axis=2) + cg.reduce_sum(b, axis=2) + cg.reduce_sum(c - d) + cg.reduce_sum(e - f * 0.5)


def _gather_nd() -> tuple[list[cg.Tensor], cg.Tensor]:
    x = _x()
    rows = cg.gather_nd(x, cg.constant(np.array([[0, 2], [0, 1]], np.int32)))
    return [x], rows + cg.gather_nd(x, cg.constant(np.array([[0, 1, 3]], np.int64)))


def _scatter_nd() -> tuple[list[cg.Tensor], cg.Tensor]:
    x = _x()
    rows = cg.reduce_sum(x, axis=0)  # (3, 4)
    return [x], cg.scatter_nd(cg.constant(np.array([[1], [0], [1]], np.int32)), rows, (2, 4))


def _tensor_scatter() -> tuple[list[cg.Tensor], cg.Tensor]:
    x = _x()
    rows = cg.reduce_sum(x, axis=0)  # (3, 4)
    index = cg.constant(np.array([[2], [0]], np.int32))
    return [x], array_index.tensor_scatter_reduce(rows, index, rows[:2] * 0.5, "mul")  # max and min need opset 18


def _batch_gather() -> tuple[list[cg.Tensor], cg.Tensor]:
    x = _x((2, 3, 4))
    return [x], cg.gather(x, cg.constant(np.array([[2, 0], [1, 1]], np.int32)), batch_dims=1)


def _range() -> tuple[list[cg.Tensor], cg.Tensor]:
    x = _x()
    count = cg.size(x) // 12  # the batch size, as a tensor
    return [x], cg.cast(cg.range(0, count * 2, 2), F) + cg.cast(cg.range(5), F)[:1]


ARRAY_CASES: dict[str, Case] = {
    "Split":       _unary(_split),
    "Tile":        _unary(lambda x: cg.tile(x, (1, 2, 3))),
    "BroadcastTo": lambda: (lambda x: ([x], cg.broadcast_to(x, (2, 3, 4))))(_x((3, 1))),
    "MirrorPad":   _unary(lambda x: cg.pad(x, ((0, 0), (2, 1), (1, 3)), mode="REFLECT")
                          + cg.pad(x, ((0, 0), (3, 0), (0, 4)), mode="SYMMETRIC")),
    "GatherNd":    _gather_nd,
    "ScatterNd":   _scatter_nd,
    "TensorScatterReduce": _tensor_scatter,
    "BatchGather": _batch_gather,
    "Shape":       _unary(lambda x: cg.cast(cg.shape(x), F) + cg.cast(cg.shape(x, out_type="int64"), F)),
    "Size":        _unary(lambda x: cg.cast(cg.size(x), F) + cg.cast(cg.size(x, out_type="int64"), F)),
    "Range":       _range,
}  # fmt: skip
