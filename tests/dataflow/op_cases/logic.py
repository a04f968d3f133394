"""Rows for ops/logic.py: comparisons, logical connectives, NaN and finiteness tests (none differentiable)."""

from __future__ import annotations

import numpy as np

import cellgraph as cg

from . import OpCase, rand

a, b = rand(3, 4, seed=41), rand(4, seed=42)
p, q = a > 0, b > 0.2
SPECIAL = np.array([np.nan, -np.inf, np.inf, 0.0, -1.5, 3e38], np.float32)

CASES = [
    OpCase("Less", lambda x, y: cg.greater(x, y), [a, b], grad=False, id="greater"),
    OpCase("Less", lambda x, y: x > y, [a, b], grad=False, id="greater-operator"),
    OpCase("Less", lambda x: x < 0.25, [a], grad=False, id="operator-python"),
    OpCase("GreaterEqual", lambda x, y: x >= y, [a, b], grad=False, id="operator"),
    OpCase("GreaterEqual", lambda x, y: x <= y, [a, b], grad=False, id="less-equal-operator"),
    OpCase("NotEqual", lambda x, y: cg.not_equal(x, y), [np.round(a), np.round(b)], grad=False),
    OpCase("NotEqual", lambda x, y: cg.not_equal(x, y), [SPECIAL, SPECIAL], grad=False, id="nan"),
    OpCase("NotEqual", lambda x, y: cg.not_equal(x, y), [p, q], grad=False, id="bool"),
    OpCase("LogicalAnd", lambda x, y: cg.logical_and(x, y), [p, q], grad=False),
    OpCase("LogicalAnd", lambda x, y: x & y, [p, q], grad=False, id="operator"),
    OpCase("LogicalOr", lambda x, y: cg.logical_or(x, y), [p, q], grad=False),
    OpCase("LogicalOr", lambda x: True | x, [p], grad=False, id="operator-python-left"),
    OpCase("LogicalXor", lambda x, y: cg.logical_xor(x, y), [p, q], grad=False),
    OpCase("LogicalXor", lambda x, y: x ^ y, [p, q], grad=False, id="operator"),
    OpCase("LogicalNot", lambda x: cg.logical_not(x), [p], grad=False),
    OpCase("LogicalNot", lambda x: ~x, [p], static_shapes=[(None, 4)], grad=False, id="operator"),
    OpCase("IsNan", lambda x: cg.is_nan(x), [SPECIAL], grad=False),
    OpCase("IsFinite", lambda x: cg.is_finite(x), [SPECIAL], grad=False),
    OpCase("IsFinite", lambda x: cg.is_finite(x), [SPECIAL.astype(np.float64)], grad=False, id="float64"),
]
