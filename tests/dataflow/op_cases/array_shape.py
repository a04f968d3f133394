"""Rows for ``ops/array_shape.py``: Shape, Size and Range (none differentiable)."""

from __future__ import annotations

import numpy as np

import cellgraph as cg

from . import OpCase, rand


def _i(v: int) -> np.ndarray:
    return np.array(v, np.int32)


CASES = [
    OpCase("Shape", lambda x: cg.shape(x), [rand(2, 3, 4)], grad=False),
    OpCase("Shape", lambda x: cg.shape(x, out_type="int64"), [rand(5, 2)], static_shapes=[(None, None)], grad=False,
           id="unknown-int64"),
    OpCase("Shape", lambda x: cg.shape(x), [np.float32(1.0)], grad=False, id="rank0"),
    OpCase("Size", lambda x: cg.size(x), [rand(2, 3, 4)], grad=False),
    OpCase("Size", lambda x: cg.size(x, out_type="int64"), [np.arange(6, dtype=np.int32).reshape(3, 2)],
           static_shapes=[(None, 2)], grad=False, id="unknown-int64"),
    OpCase("Range", lambda s, e, d: cg.range(s, e, d), [_i(2), _i(11), _i(3)], grad=False),
    OpCase("Range", lambda s, e, d: cg.range(s, e, d), [_i(5), _i(-4), _i(-2)], grad=False, id="negative-delta"),
    OpCase("Range", lambda s, e, d: cg.range(s, e, d), [np.float32(0.5), np.float32(2.25), np.float32(0.25)],
           grad=False, id="float32"),
    OpCase("Range", lambda s, e, d: cg.range(s, e, d), [np.int64(3), np.int64(3), np.int64(1)], grad=False,
           id="empty-int64"),
    OpCase("Range", lambda n: cg.range(n), [_i(4)], grad=False, id="count"),
]  # fmt: skip
