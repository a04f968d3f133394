"""Rows for ``ops/top_k.py``: TopK, its values (differentiable) and indices."""

from __future__ import annotations

import numpy as np

import cellgraph as cg

from . import OpCase, rand

ties = np.array([[1.0, 3.0, 2.0, 3.0, -1.0], [0.5, 0.5, 0.5, -2.0, 0.5]], np.float32)
ints = np.array([[3, -1, 4, 1, -2147483648], [1, 5, -9, 2, 6]], np.int32)
with_nan = np.array([[0.5, np.nan, -1.0, 2.0]], np.float32)

CASES = [
    OpCase("TopK", lambda x: cg.top_k(x, 2)[0], [rand(3, 6, seed=2)]),
    OpCase("TopK", lambda x: cg.top_k(x, 3)[0], [rand(2, 3, 5, seed=4)], static_shapes=[(None, 3, 5)],
           id="rank3-unknown-batch"),
    OpCase("TopK", lambda x: cg.top_k(x, 4)[0], [rand(4, seed=5)], id="rank1"),
    OpCase("TopK", lambda x: cg.top_k(x, 5)[0], [rand(2, 5, seed=6)], static_shapes=[(2, None)],
           id="all-unknown-last"),
    OpCase("TopK", lambda x: cg.top_k(x, 0)[0], [rand(2, 5, seed=7)], id="k0"),
    OpCase("TopK", lambda x: cg.top_k(x, 4)[0], [ties], grad=False, id="ties"),
    OpCase("TopK", lambda x: cg.top_k(x, 3)[0], [ints], grad=False, id="int32"),
    OpCase("TopK", lambda x: cg.top_k(x, 2)[0], [with_nan], grad=False, id="nan-first"),
]  # fmt: skip
