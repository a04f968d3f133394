"""Rows for ops/math_unary.py: unary math, floor division and modulo, clip, where, stop_gradient."""

from __future__ import annotations

import numpy as np

import cellgraph as cg

from . import OpCase, positive, rand

a = rand(3, 4, seed=31)
col = rand(3, 1, seed=32)
SPECIAL = np.array([np.nan, -np.inf, np.inf, -0.0, 0.0, 1e30, -2.5], np.float32)
TIES = np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.5, 4.4999995], np.float32)
# Every sign combination of dividend and divisor, exact multiples included.
NUM = np.array([[7, -7, 7, -7, 6, -6, 0]], np.int32)
DEN = np.array([[2], [-2], [3]], np.int32)
cond = rand(3, 1, seed=33) > 0

CASES = [
    OpCase("Abs", lambda x: cg.abs(x), [a]),
    OpCase("Abs", lambda x: abs(x), [(a * 100).astype(np.int32)], grad=False, id="int32-operator"),
    OpCase("Sign", lambda x: cg.sign(x), [a]),
    OpCase("Sign", lambda x: cg.sign(x), [SPECIAL], grad=False, id="special"),
    OpCase("Sign", lambda x: cg.sign(x), [(a * 100).astype(np.int32)], grad=False, id="int32"),
    OpCase("Floor", lambda x: cg.floor(x), [a * 3]),
    OpCase("Floor", lambda x: cg.floor(x), [SPECIAL], grad=False, id="special"),
    OpCase("Ceil", lambda x: cg.ceil(x), [a * 3], static_shapes=[(None, 4)], id="unknown-batch"),
    OpCase("Ceil", lambda x: cg.ceil(x), [SPECIAL], grad=False, id="special"),
    OpCase("Round", lambda x: cg.round(x), [a * 3]),
    OpCase("Round", lambda x: cg.round(x), [TIES], grad=False, id="ties-to-even"),
    OpCase("Round", lambda x: cg.round(x), [SPECIAL], grad=False, id="special"),
    OpCase("Sin", lambda x: cg.sin(x), [a * 3]),
    OpCase("Cos", lambda x: cg.cos(x), [a * 3]),
    OpCase("Tan", lambda x: cg.tan(x), [a]),
    OpCase("Rsqrt", lambda x: cg.rsqrt(x), [positive(3, 4)]),
    OpCase("Log1p", lambda x: cg.log1p(x), [rand(3, 4, seed=34, low=-0.5, high=2.0)]),
    OpCase("Log1p", lambda x: cg.log1p(x), [np.array([1e-10, -1e-12, 0.0], np.float64)], grad=False, id="tiny"),
    OpCase("Expm1", lambda x: cg.expm1(x), [a]),
    OpCase("Erf", lambda x: cg.erf(x), [a * 2]),
    OpCase("Erf", lambda x: cg.erf(x), [rand(seed=35)], id="rank0"),
    OpCase("FloorDiv", lambda x, y: x // y, [NUM, DEN], grad=False, id="int32-signs"),
    OpCase("FloorDiv", lambda x, y: cg.floordiv(x, y), [a * 5, col + 2.0], grad=False, id="float-broadcast"),
    OpCase("FloorMod", lambda x, y: x % y, [NUM, DEN], grad=False, id="int32-signs"),
    OpCase("FloorMod", lambda x, y: cg.mod(x, y), [a * 5, np.where(col > 0, col + 1.0, col - 1.0)], id="float"),
    OpCase("FloorMod", lambda x: 7.5 % x, [np.array([2.0, -2.0, 4.0], np.float32)], id="python-left"),
    OpCase(
        "ClipByValue",
        lambda x, lo, hi: cg.clip_by_value(x, lo, hi),
        [a, rand(3, 1, seed=36, low=-0.6, high=-0.4), np.float32(0.5)],
    ),
    OpCase("ClipByValue", lambda x: cg.clip_by_value(x, -0.3, 0.3), [a], id="python-bounds"),
    OpCase("ClipByValue", lambda x: cg.clip_by_value(x, -5, 50), [(a * 100).astype(np.int32)], grad=False, id="int32"),
    OpCase("Where", lambda c, x, y: cg.where(c, x, y), [cond, a, rand(4, seed=37)]),
    OpCase(
        "Where",
        lambda c, x, y: cg.where(c, x, y),
        [a > 0, a, rand(1, 4, seed=38)],
        static_shapes=[(None, 4), (None, 4), (1, 4)],
        id="unknown-batch",
    ),
    OpCase("Where", lambda x: cg.where(x > 0.0, x, 0.0), [a], id="python-branch"),
    OpCase("StopGradient", lambda x: cg.stop_gradient(x), [a], grad=False),
]
