"""Rows for the array family: reshaping, joining, slicing, padding, indexing, gathering."""

from __future__ import annotations

import numpy as np

import cellgraph as cg
from cellgraph.dataflow.ops import array, array_gather, array_slice

from . import OpCase, rand

x234 = rand(2, 3, 4, seed=1)
ids = np.array([2, 0, 2, 1], np.int32)  # a repeat, so scatter-add must sum


def _sliced_attrs(t: cg.Tensor) -> dict:
    """The StridedSlice attrs of ``t[1:, ::-2]`` (to build its gradient op directly)."""
    return t[1:, ::-2].node.attrs


CASES = [
    # ---------------------------------------------------------- Reshape
    OpCase("Reshape", lambda x: cg.reshape(x, (4, -1)), [x234]),
    OpCase("Reshape", lambda x: cg.reshape(x, (-1, 12)), [x234], static_shapes=[(None, 3, 4)], id="unknown-batch"),
    OpCase("Reshape", lambda x: cg.reshape(x, (None, 2, 2)), [x234], static_shapes=[(2, None, 4)], id="none-as-minus-one"),
    OpCase("Reshape", lambda x: cg.reshape(x, ()), [rand(1, 1)], id="to-scalar"),
    OpCase("ReshapeLike", lambda x, like: array.reshape_like(x, like), [rand(6, 4), x234], wrt=(0,)),
    OpCase("ReshapeLike", lambda x, like: array.reshape_like(x, like), [rand(6, 4), x234],
           static_shapes=[(None, 4), (None, None, 4)], wrt=(0,), id="unknown-dims"),
    OpCase("ReshapeLike", lambda x, like: array.reshape_like(x, like, same_shape=True), [rand(2, 3), rand(2, 3)],
           static_shapes=[(None, None), (None, None)], wrt=(0,), id="same-shape"),
    # ---------------------------------------------- ExpandDims, Squeeze
    OpCase("ExpandDims", lambda x: cg.expand_dims(x, 1), [x234]),
    OpCase("ExpandDims", lambda x: cg.expand_dims(x, -1), [x234], static_shapes=[(None, 3, 4)], id="last-unknown-batch"),
    OpCase("ExpandDims", lambda x: cg.expand_dims(x, (0, 2)), [rand(3)], id="two-axes"),
    OpCase("Squeeze", lambda x: cg.squeeze(x, 1), [rand(3, 1, 4)]),
    OpCase("Squeeze", lambda x: cg.squeeze(x), [rand(1, 3, 1)], id="all"),
    OpCase("Squeeze", lambda x: cg.squeeze(x, -1), [rand(5, 1)], static_shapes=[(None, None)], id="unknown-dims"),
    # --------------------------------------------------------- Transpose
    OpCase("Transpose", lambda x: cg.transpose(x), [x234], id="reverse"),
    OpCase("Transpose", lambda x: cg.transpose(x, (0, 2, 1)), [x234], static_shapes=[(None, 3, 4)], id="unknown-batch"),
    OpCase("Transpose", lambda x: cg.transpose(x, (0, 3, 1, 2)), [rand(2, 3, 2, 5)], id="nhwc-to-nchw"),
    # ------------------------------------------------ Concat, SplitLike
    OpCase("Concat", lambda a, b, c: cg.concat([a, b, c], axis=1), [rand(2, 1), rand(2, 3, seed=1), rand(2, 2, seed=2)]),
    OpCase("Concat", lambda a, b, c, d: cg.concat([a, b, c, d], axis=3),
           [rand(2, 2, 2, 3, seed=i) for i in range(3)] + [rand(2, 2, 2, 1)],
           static_shapes=[(None, 2, 2, 3)] * 3 + [(None, 2, 2, 1)], id="nhwc-channels-unknown-batch"),
    OpCase("Concat", lambda a, b: cg.concat([a, b], axis=0), [rand(2, 3), rand(4, 3, seed=1)],
           static_shapes=[(None, 3), (None, 3)], id="axis0-unknown-sizes"),
    OpCase("Concat", lambda a, b: cg.concat([a, b], axis=-1), [rand(3, 2), rand(3, 2, seed=1)], id="negative-axis"),
    OpCase("Concat", lambda a: cg.concat([a], axis=0), [rand(3, 2)], id="one-input"),
    OpCase("Concat", lambda a, b: cg.concat([a, b], axis=0), [ids, ids[:2]], grad=False, id="int32"),
    OpCase("SplitLike", lambda g, a, b: array._split_like(g, [a, b], 1)[0], [rand(2, 5), rand(2, 2), rand(2, 3)], wrt=(0,)),
    OpCase("SplitLike", lambda g, a, b: array._split_like(g, [a, b], 0)[1], [rand(5, 2), rand(2, 2), rand(3, 2)],
           static_shapes=[(None, 2), (None, 2), (None, 2)], wrt=(0,), id="second-piece-unknown"),
    # -------------------------------------------------------- Slice, Pad
    OpCase("Slice", lambda x: cg.slice(x, (0, 1, 1), (2, 2, 3)), [x234]),
    OpCase("Slice", lambda x: cg.slice(x, (1, 0, 2), (-1, 3, -1)), [x234], id="size-minus-one"),
    OpCase("Slice", lambda x: cg.slice(x, (1, 1, 0), (-1, 2, 2)), [x234], static_shapes=[(None, 3, None)], id="unknown-dims"),
    OpCase("Slice", lambda x: cg.slice(x, (0, 1, 0), (-1, 2, -1)), [x234], id="from-start-to-end"),
    OpCase("Pad", lambda x: cg.pad(x, ((1, 0), (0, 2))), [rand(2, 3)]),
    OpCase("Pad", lambda x: cg.pad(x, ((0, 0), (1, 1), (2, 0)), constant_values=-1.5), [x234],
           static_shapes=[(None, 3, 4)], id="constant-unknown-batch"),
    OpCase("Pad", lambda x: cg.pad(x, ((0, 0), (1, 2))), [ids.reshape(2, 2)], grad=False, id="int32"),
    # ----------------------------------------- StridedSlice (x[key])
    OpCase("StridedSlice", lambda x: x[1], [x234], id="int"),
    OpCase("StridedSlice", lambda x: x[-1, :, 2], [x234], id="negative-int"),
    OpCase("StridedSlice", lambda x: x[:, 1:, ::2], [x234], id="step"),
    OpCase("StridedSlice", lambda x: x[:, ::-1, -1:0:-2], [x234], id="negative-step"),
    OpCase("StridedSlice", lambda x: x[..., None, 1:3], [x234], id="ellipsis-newaxis"),
    OpCase("StridedSlice", lambda x: x[None, 0, ..., np.int64(1)], [x234], id="newaxis-first-numpy-int"),
    OpCase("StridedSlice", lambda x: x[:, -2:], [x234], static_shapes=[(None, 3, 4)], id="unknown-batch"),
    OpCase("StridedSlice", lambda x: x[1:-1], [rand(6, 2)], static_shapes=[(None, 2)], id="slice-unknown-dim"),
    OpCase("StridedSlice", lambda x: x[3], [rand(5)], id="to-scalar"),
    OpCase("StridedSlice", lambda x: x[...], [x234], id="ellipsis-only"),
    OpCase("StridedSlice", lambda x: x[5:1], [x234], id="empty"),
    OpCase("StridedSliceGrad", lambda g, x: array_slice._strided_slice_grad(g, x, _sliced_attrs(x)), [rand(1, 2), rand(2, 4)], wrt=(0,)),
    # ------------------------------------ Gather, ScatterAddLike, OneHot
    OpCase("Gather", lambda p, i: cg.gather(p, i), [rand(3, 4), ids]),
    OpCase("Gather", lambda p, i: cg.gather(p, i, axis=1), [x234, ids], static_shapes=[(None, 3, 4), (None,)], id="axis1-unknown"),
    OpCase("Gather", lambda p, i: cg.gather(p, i, axis=-1), [x234, ids.reshape(2, 2).astype(np.int64)], id="2d-int64-indices"),
    OpCase("Gather", lambda p, i: cg.gather(p, i), [rand(3), np.array(2, np.int32)], id="scalar-index"),
    OpCase("ScatterAddLike", lambda u, i, like: array_gather._scatter_add_like(u, i, like, 0), [rand(4, 2), ids, rand(3, 2)], wrt=(0,)),
    OpCase("ScatterAddLike", lambda u, i, like: array_gather._scatter_add_like(u, i, like, 1), [rand(2, 4, 4), ids, x234],
           static_shapes=[(None, 4, 4), (4,), (None, 3, 4)], wrt=(0,), id="axis1"),
    OpCase("OneHot", lambda i: cg.one_hot(i, 3), [np.array([0, 2, 5, -1], np.int32)], grad=False),
    OpCase("OneHot", lambda i: cg.one_hot(i, 4, on_value=7, off_value=-1, dtype="int32"), [ids.reshape(2, 2)],
           grad=False, static_shapes=[(None, 2)], id="int-values-2d"),
]  # fmt: skip
