"""Rows for the math family."""

from __future__ import annotations

import numpy as np

import cellgraph as cg

from . import OpCase, positive, rand

a, b = rand(3, 4, seed=1), rand(3, 4, seed=2)
row, col = rand(4, seed=3), rand(3, 1, seed=4)
far_a, far_b = rand(3, 4, seed=5), rand(3, 4, seed=6) + 3.0  # no ties for max/min
ints = (rand(2, 3, 4, seed=9) * 1000).astype(np.int32)

CASES = [
    OpCase("Add", lambda x, y: x + y, [a, b]),
    OpCase("Add", lambda x, y: x + y, [a, row], id="broadcast-row"),
    OpCase("Add", lambda x, y: x + y, [a, row], static_shapes=[(None, 4), (4,)], id="unknown-batch"),
    OpCase("Sub", lambda x, y: x - y, [a, col], id="broadcast-col"),
    OpCase("Mul", lambda x, y: x * y, [a, b]),
    OpCase("Mul", lambda x, y: x * y, [col, row], id="outer"),
    OpCase("Div", lambda x, y: x / y, [a, positive(3, 4)]),
    OpCase("Pow", lambda x, y: cg.pow(x, y), [positive(3, 4), rand(3, 4, seed=8)]),
    OpCase("Maximum", lambda x, y: cg.maximum(x, y), [far_a, far_b - 3.5]),
    OpCase("Minimum", lambda x, y: cg.minimum(x, y), [far_a, far_b - 3.5]),
    OpCase("Neg", lambda x: -x, [a]),
    OpCase("Square", lambda x: cg.square(x), [a]),
    OpCase("Sqrt", lambda x: cg.sqrt(x), [positive(3, 4)]),
    OpCase("Exp", lambda x: cg.exp(x), [a]),
    OpCase("Log", lambda x: cg.log(x), [positive(3, 4)]),
    OpCase(
        "Equal", lambda x, y: cg.equal(x, y), [np.array([1, 2, 3], np.int32), np.array([1, 0, 3], np.int32)], grad=False
    ),
    OpCase("Less", lambda x, y: cg.less(x, y), [a, b], grad=False),
    OpCase("GreaterEqual", lambda x, y: cg.greater_equal(x, y), [a, b], grad=False),
    OpCase("Cast", lambda x: cg.cast(x, "int32"), [a * 5], grad=False, id="to-int"),
    OpCase("Cast", lambda x: cg.cast(x, "float64"), [a], id="to-float64"),
    OpCase("MatMul", lambda x, y: x @ y, [rand(3, 5), rand(5, 2, seed=1)]),
    OpCase("MatMul", lambda x, y: cg.matmul(x, y, transpose_a=True), [rand(5, 3), rand(5, 2, seed=1)], id="ta"),
    OpCase("MatMul", lambda x, y: cg.matmul(x, y, transpose_b=True), [rand(3, 5), rand(2, 5, seed=1)], id="tb"),
    OpCase(
        "MatMul",
        lambda x, y: cg.matmul(x, y, transpose_a=True, transpose_b=True),
        [rand(5, 3), rand(2, 5, seed=1)],
        id="ta-tb",
    ),
    OpCase("ReduceSum", lambda x: cg.reduce_sum(x), [rand(2, 3, 4)], id="all"),
    OpCase("ReduceSum", lambda x: cg.reduce_sum(x, axis=1, keepdims=True), [rand(2, 3, 4)], id="axis1-keep"),
    OpCase("ReduceSum", lambda x: cg.reduce_sum(x, axis=(0, 2)), [rand(2, 3, 4)], id="axes02"),
    OpCase("ReduceMean", lambda x: cg.reduce_mean(x, axis=0), [rand(5, 3)], id="axis0"),
    OpCase(
        "ReduceMean",
        lambda x: cg.reduce_mean(x, axis=-1, keepdims=True),
        [rand(5, 3)],
        static_shapes=[(None, 3)],
        id="unknown-batch",
    ),
    OpCase("ReduceMax", lambda x: cg.reduce_max(x, axis=1), [rand(4, 6)]),
    OpCase("ReduceMax", lambda x: cg.reduce_max(x, axis=1, keepdims=True), [rand(2, 3, 4)], id="axis1-keep"),
    OpCase("ReduceMax", lambda x: cg.reduce_max(x, axis=(0, 2)), [ints], grad=False, id="int32"),
    OpCase("ReduceMax", lambda x: cg.reduce_max(x), [rand(3, 4) > 0], grad=False, id="bool-all"),
    OpCase("ArgMax", lambda x: cg.argmax(x, axis=1), [rand(4, 6)], grad=False),
    OpCase("OnesLike", lambda x: cg.ones_like(x), [a], grad=False),
    OpCase("ZerosLike", lambda x: cg.zeros_like(x), [a], grad=False),
    OpCase(
        "BroadcastLike",
        lambda g, x: cg.dataflow.ops.math.broadcast_like(g, x, (1,), keepdims=False),
        [rand(3), rand(3, 4)],
        wrt=(0,),
    ),
    OpCase(
        "BroadcastLike",
        lambda g, x: cg.dataflow.ops.math.broadcast_like(g, x, (0,), mean=True),
        [rand(1, 4), rand(3, 4)],
        wrt=(0,),
        id="mean",
    ),
    OpCase("SumToShapeOf", lambda g, x: cg.dataflow.ops.math.sum_to_shape_of(g, x), [rand(3, 4), rand(4)], wrt=(0,)),
]
