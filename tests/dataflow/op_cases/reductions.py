"""Rows for ops/reductions.py: min, prod, logsumexp, any, all, argmax, argmin."""

from __future__ import annotations

import numpy as np

import cellgraph as cg

from . import OpCase, rand

x3 = rand(2, 3, 4, seed=41)
ints = (rand(2, 3, 4, seed=42) * 1000).astype(np.int32)
small_ints = (rand(3, 4, seed=43) * 4).astype(np.int32)
# Slots with no zero, one zero and two zeros: the product's gradient has a rule for each.
ZEROS = np.array([[0.5, -1.5, 2.0, 0.8], [0.0, 1.5, -2.0, 0.7], [0.0, 1.2, 0.0, -0.9]], np.float32)
LARGE = np.array([[1000.0, 999.0, -1000.0], [-np.inf, -np.inf, -np.inf], [np.inf, 1.0, 2.0]], np.float32)
TIES = np.array([[3.0, 1.0, 1.0, 3.0], [2.0, 2.0, 2.0, 2.0]], np.float32)
flags = rand(3, 4, 2, seed=44) > 0.3

CASES = [
    OpCase("ReduceMin", lambda x: cg.reduce_min(x, axis=1), [rand(4, 6, seed=45)]),
    OpCase("ReduceMin", lambda x: cg.reduce_min(x, axis=(0, 2), keepdims=True), [x3], id="axes02-keep"),
    OpCase("ReduceMin", lambda x: cg.reduce_min(x), [ints], grad=False, id="int32-all"),
    OpCase("ReduceMin", lambda x: cg.reduce_min(x, axis=0), [rand(3, 4) > 0], grad=False, id="bool"),
    OpCase(
        "ReduceMin",
        lambda x: cg.reduce_min(x, axis=-1),
        [rand(5, 3, seed=46)],
        static_shapes=[(None, 3)],
        id="unknown-batch",
    ),
    OpCase("ReduceProd", lambda x: cg.reduce_prod(x, axis=1), [rand(3, 4, seed=47, low=0.5, high=1.5)]),
    OpCase("ReduceProd", lambda x: cg.reduce_prod(x, axis=1, keepdims=True), [ZEROS], id="zeros"),
    OpCase("ReduceProd", lambda x: cg.reduce_prod(x, axis=(0, 2)), [x3], id="axes02"),
    OpCase("ReduceProd", lambda x: cg.reduce_prod(x, axis=0), [small_ints], grad=False, id="int32"),
    OpCase("ReduceLogSumExp", lambda x: cg.reduce_logsumexp(x, axis=1), [rand(4, 6, seed=48, low=-3, high=3)]),
    OpCase("ReduceLogSumExp", lambda x: cg.reduce_logsumexp(x), [x3], id="all"),
    OpCase("ReduceLogSumExp", lambda x: cg.reduce_logsumexp(x, axis=(0, 2), keepdims=True), [x3], id="axes02-keep"),
    OpCase("ReduceLogSumExp", lambda x: cg.reduce_logsumexp(x, axis=1), [LARGE], grad=False, id="large-and-inf"),
    OpCase("ReduceAny", lambda x: cg.reduce_any(x, axis=1), [flags], grad=False),
    OpCase("ReduceAny", lambda x: cg.reduce_any(x), [flags], grad=False, id="all-axes"),
    OpCase("ReduceAll", lambda x: cg.reduce_all(x, axis=(0, 2), keepdims=True), [flags], grad=False),
    OpCase("ReduceAll", lambda x: cg.reduce_all(x, axis=2), [flags], grad=False, id="last"),
    OpCase("ArgMax", lambda x: cg.argmax(x, axis=0), [x3], grad=False, id="axis0"),
    OpCase("ArgMax", lambda x: cg.argmax(x, axis=1), [TIES], grad=False, id="ties-first"),
    OpCase("ArgMax", lambda x: cg.argmax(x, axis=-1), [ints], grad=False, id="int32"),
    OpCase("ArgMin", lambda x: cg.argmin(x, axis=1), [rand(4, 6, seed=49)], grad=False),
    OpCase("ArgMin", lambda x: cg.argmin(x, axis=1), [TIES], grad=False, id="ties-first"),
    OpCase("ArgMin", lambda x: cg.argmin(x, axis=0), [ints], grad=False, id="int32-axis0"),
]
