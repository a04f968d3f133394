"""Rows for ``ops/einsum.py``: einsum is a composition, so each row names the op
its equation ends in; the table's gradient check covers the whole chain."""

from __future__ import annotations

import cellgraph as cg

from . import OpCase, rand

CASES = [
    OpCase("BatchMatMul", lambda q, k: cg.einsum("bqhd,bkhd->bhqk", q, k), [rand(2, 3, 2, 4), rand(2, 5, 2, 4, seed=1)],
           id="einsum-attention-scores"),
    OpCase("Transpose", lambda p, v: cg.einsum("bhqk,bkhd->bqhd", p, v), [rand(2, 2, 3, 5), rand(2, 5, 2, 4, seed=1)],
           static_shapes=[(None, 2, 3, 5), (None, 5, 2, 4)], id="einsum-attention-values-unknown-batch"),
    OpCase("Reshape", lambda x, w: cg.einsum("btd,de->bte", x, w), [rand(2, 3, 4), rand(4, 5, seed=2)],
           static_shapes=[(None, 3, 4), (4, 5)], id="einsum-dense"),
    OpCase("Reshape", lambda a, b: cg.einsum("ij,ij->i", a, b), [rand(3, 4), rand(3, 4, seed=1)], id="einsum-rowdot"),
    OpCase("Reshape", lambda a, b, c: cg.einsum("abc,cd,de->abe", a, b, c),
           [rand(2, 3, 4), rand(4, 5, seed=1), rand(5, 2, seed=2)], id="einsum-three"),
    OpCase("MatMul", lambda a, b: cg.einsum("ji,kj", a, b), [rand(3, 2), rand(4, 3, seed=1)], id="einsum-implicit"),
    OpCase("ReduceSum", lambda x: cg.einsum("ijk->j", x), [rand(2, 3, 4)], id="einsum-one-operand"),
]  # fmt: skip
