"""Rows for ``ops/cumulative.py``: Cumsum, Cumprod (every flag pair) and CumprodGrad."""

from __future__ import annotations

import numpy as np

import cellgraph as cg
from cellgraph.dataflow.ops.base import apply

from . import OpCase, rand

x234 = rand(2, 3, 4, seed=11)
with_zeros = np.array([[0.5, 0.0, 2.0, -1.5], [1.25, -0.75, 0.0, 0.0]], np.float32)
ints = np.array([[3, -1, 4], [1, 5, -9]], np.int32)


def _cumprod_grad(x: cg.Tensor, dy: cg.Tensor, axis: int, exclusive: bool, reverse: bool) -> cg.Tensor:
    return apply("CumprodGrad", [x, dy], {"axis": axis, "exclusive": exclusive, "reverse": reverse})


CASES = [
    OpCase("Cumsum", lambda x: cg.cumsum(x, axis=1), [x234]),
    OpCase("Cumsum", lambda x: cg.cumsum(x, axis=-1, exclusive=True), [x234], id="exclusive"),
    OpCase("Cumsum", lambda x: cg.cumsum(x, reverse=True), [x234], static_shapes=[(None, 3, 4)],
           id="reverse-unknown-batch"),
    OpCase("Cumsum", lambda x: cg.cumsum(x, axis=1, exclusive=True, reverse=True), [x234], id="exclusive-reverse"),
    OpCase("Cumsum", lambda x: cg.cumsum(x, axis=1, reverse=True), [ints], grad=False, id="int32"),
    OpCase("Cumsum", lambda x: cg.cumsum(x), [rand(5)], id="rank1"),
    OpCase("Cumprod", lambda x: cg.cumprod(x, axis=1), [x234]),
    OpCase("Cumprod", lambda x: cg.cumprod(x, axis=1, exclusive=True), [with_zeros], id="exclusive-zeros"),
    OpCase("Cumprod", lambda x: cg.cumprod(x, axis=-1, reverse=True), [with_zeros], id="reverse-zeros"),
    OpCase("Cumprod", lambda x: cg.cumprod(x, axis=0, exclusive=True, reverse=True), [x234],
           static_shapes=[(2, None, 4)], id="exclusive-reverse-unknown"),
    OpCase("Cumprod", lambda x: cg.cumprod(x, axis=1), [with_zeros], id="zeros"),
    OpCase("Cumprod", lambda x: cg.cumprod(x, axis=1, exclusive=True), [ints], grad=False, id="int32"),
    OpCase("CumprodGrad", lambda x, dy: _cumprod_grad(x, dy, 1, False, False), [with_zeros, rand(2, 4, seed=3)],
           grad=False),
    OpCase("CumprodGrad", lambda x, dy: _cumprod_grad(x, dy, 2, True, True), [x234, rand(2, 3, 4, seed=4)],
           grad=False, id="exclusive-reverse"),
]  # fmt: skip
