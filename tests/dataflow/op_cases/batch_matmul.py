"""Rows for ops/batch_matmul.py: matmul over batches, batch dims broadcast, transposes."""

from __future__ import annotations

import cellgraph as cg

from . import OpCase, rand

CASES = [
    OpCase("BatchMatMul", lambda x, y: x @ y, [rand(2, 3, 4, seed=51), rand(2, 4, 5, seed=52)]),
    OpCase(
        "BatchMatMul", lambda x, y: x @ y, [rand(2, 1, 3, 4, seed=53), rand(3, 4, 2, seed=54)], id="broadcast-batch"
    ),
    OpCase("BatchMatMul", lambda x, y: x @ y, [rand(2, 3, 4, seed=55), rand(4, 5, seed=56)], id="rank3-at-matrix"),
    OpCase(
        "BatchMatMul",
        lambda x, y: cg.matmul(x, y, transpose_b=True),
        [rand(2, 3, 4, seed=61), rand(5, 4, seed=62)],
        id="rank3-at-matrix-tb",
    ),
    OpCase("BatchMatMul", lambda x, y: x @ y, [rand(3, 4, seed=57), rand(2, 4, 5, seed=58)], id="matrix-at-rank3"),
    OpCase(
        "BatchMatMul",
        lambda x, y: cg.matmul(x, y, transpose_a=True),
        [rand(2, 4, 3, seed=59), rand(1, 4, 2, seed=60)],
        id="ta-broadcast",
    ),
    OpCase(
        "BatchMatMul",
        lambda x, y: cg.matmul(x, y, transpose_b=True),
        [rand(2, 2, 3, 4, seed=63), rand(2, 2, 5, 4, seed=64)],
        id="tb-attention",
    ),
    OpCase(
        "BatchMatMul",
        lambda x, y: cg.matmul(x, y, transpose_a=True, transpose_b=True),
        [rand(2, 4, 3, seed=65), rand(2, 5, 4, seed=66)],
        id="ta-tb",
    ),
    OpCase(
        "BatchMatMul",
        lambda x, y: x @ y,
        [rand(4, 3, 4, seed=67), rand(4, 4, 2, seed=68)],
        static_shapes=[(None, 3, 4), (None, 4, 2)],
        id="unknown-batch",
    ),
]
