"""Rows for ``ops/array_index.py``: GatherNd, ScatterNd and ScatterNdLike."""

from __future__ import annotations

import numpy as np

import cellgraph as cg
from cellgraph.dataflow.ops import array_index
from cellgraph.dataflow.ops.base import apply

from . import OpCase, rand

x345 = rand(3, 4, 5, seed=5)
pairs = np.array([[2, 1], [0, 3], [2, 1]], np.int32)  # a repeated row: the scatter must sum
cells = np.array([[[0, 0, 4]], [[2, 3, 1]]], np.int64)  # (2, 1, 3): full coordinates, int64

batch_ids = np.array([[2, 0, 2], [1, 1, 0]], np.int32)  # (2, 3): per batch, a repeat in the first


def _batch_grad(u: cg.Tensor, i: cg.Tensor, like: cg.Tensor, axis: int) -> cg.Tensor:
    return apply("BatchGatherGrad", [u, i, like], {"batch_dims": 1, "axis": axis})


CASES = [
    # ------------------------------------------------------------ GatherNd
    OpCase("GatherNd", lambda p, i: cg.gather_nd(p, i), [x345, pairs]),
    OpCase("GatherNd", lambda p, i: cg.gather_nd(p, i), [x345, cells], id="elements-int64"),
    OpCase("GatherNd", lambda p, i: cg.gather_nd(p, i), [x345, np.array([1, 2], np.int32)], id="one-row"),
    OpCase("GatherNd", lambda p, i: cg.gather_nd(p, i), [x345, pairs[:, :1]],
           static_shapes=[(None, 4, 5), (None, 1)], id="unknown-dims"),
    OpCase("GatherNd", lambda p, i: cg.gather_nd(p, i), [rand(2, 3), np.zeros((2, 0), np.int32)], id="depth0"),
    OpCase("GatherNd", lambda p, i: cg.gather_nd(p, i), [pairs, np.array([[1, 1]], np.int32)], grad=False,
           id="int32-params"),
    # ----------------------------------------------------------- ScatterNd
    OpCase("ScatterNd", lambda i, u: cg.scatter_nd(i, u, (3, 4, 5)), [pairs, rand(3, 5)]),
    OpCase("ScatterNd", lambda i, u: cg.scatter_nd(i, u, (3, 4, 5)), [cells, rand(2, 1)], id="elements-int64"),
    OpCase("ScatterNd", lambda i, u: cg.scatter_nd(i, u, (4, 2)), [pairs[:, 1:], rand(3, 2)],
           static_shapes=[(None, 1), (None, 2)], id="unknown-rows"),
    OpCase("ScatterNd", lambda i, u: cg.scatter_nd(i, u, (3, 4)), [pairs, np.array([5, 6, 7], np.int32)],
           grad=False, id="int32-updates"),
    OpCase("ScatterNdLike", lambda i, u, like: array_index._scatter_nd_like(i, u, like), [pairs, rand(3, 5), x345],
           wrt=(1,)),
    OpCase("ScatterNdLike", lambda i, u, like: array_index._scatter_nd_like(i, u, like), [pairs, rand(3, 5), x345],
           static_shapes=[(None, 2), (None, 5), (None, None, 5)], wrt=(1,), id="unknown-dims"),
    # ------------------------------------------ gather with batch_dims
    OpCase("BatchGather", lambda p, i: cg.gather(p, i, batch_dims=1), [rand(2, 3, 4, seed=6), batch_ids]),
    OpCase("BatchGather", lambda p, i: cg.gather(p, i, axis=2, batch_dims=1), [rand(2, 2, 3, seed=7), batch_ids],
           static_shapes=[(None, 2, 3), (None, 3)], id="axis2-unknown-batch"),
    OpCase("BatchGather", lambda p, i: cg.gather(p, i, batch_dims=-1), [rand(2, 4, seed=8), batch_ids.astype(np.int64)],
           id="negative-batch-dims-int64"),
    OpCase("BatchGather", lambda p, i: cg.gather(p, i, batch_dims=2), [rand(2, 3, 3, seed=9), batch_ids],
           id="indices-all-batch"),
    OpCase("BatchGather", lambda p, i: cg.gather(p, i, batch_dims=1), [batch_ids, batch_ids], grad=False, id="int32"),
    OpCase("BatchGatherGrad", lambda u, i, like: _batch_grad(u, i, like, 1), [rand(2, 3, 4), batch_ids, rand(2, 3, 4)],
           wrt=(0,)),
    OpCase("BatchGatherGrad", lambda u, i, like: _batch_grad(u, i, like, 2), [rand(2, 2, 3), batch_ids, rand(2, 2, 3)],
           static_shapes=[(None, 2, 3), (None, 3), (None, 2, None)], wrt=(0,), id="axis2-unknown"),
]  # fmt: skip

_reduce_ids = np.array([[1], [0], [1]], np.int32)  # row 1 twice: the reductions fold in turn
CASES += [
    OpCase("TensorScatterReduce", lambda t, i, u: array_index.tensor_scatter_reduce(t, i, u, "max"),
           [rand(3, 4), _reduce_ids, rand(3, 4, seed=2)], id="max"),
    OpCase("TensorScatterReduce", lambda t, i, u: array_index.tensor_scatter_reduce(t, i, u, "min"),
           [rand(3, 4), _reduce_ids, rand(3, 4, seed=2)], static_shapes=[(None, 4), (None, 1), (None, 4)],
           id="min-unknown-dims"),
    OpCase("TensorScatterReduce", lambda t, i, u: array_index.tensor_scatter_reduce(t, i, u, "mul"),
           [rand(3, 4), pairs[:2], rand(2, 5, seed=3)[:, :1].reshape(2)], grad=False, id="mul-elements"),
    OpCase("TensorScatterReduce", lambda t, i, u: array_index.tensor_scatter_reduce(t, i, u, "max"),
           [np.arange(12, dtype=np.int32).reshape(3, 4), _reduce_ids, np.full((3, 4), 5, np.int32)], grad=False,
           id="max-int32"),
]  # fmt: skip
