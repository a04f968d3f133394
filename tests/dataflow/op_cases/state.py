"""Rows for the state family: constants, identity, assignment, grouping."""

from __future__ import annotations

import numpy as np

import cellgraph as cg

from . import OpCase, rand

CASES = [
    OpCase("Const", lambda: cg.constant(np.arange(6, dtype=np.float32).reshape(2, 3)), [], grad=False),
    OpCase("Placeholder", lambda x: cg.identity(x), [rand(2, 3)], id="fed-through-identity"),
    OpCase("Identity", lambda x: cg.identity(x), [rand(2, 3)]),
    OpCase("Variable", lambda v: v, [rand(3, 2)], variables=(0,), grad=False),
    OpCase("Assign", lambda v, x: cg.assign(v, x), [rand(3, 2), rand(3, 2, seed=1)], variables=(0,), grad=False),
    OpCase("AssignAdd", lambda v, x: cg.assign_add(v, x), [rand(3, 2), rand(3, 2, seed=1)], variables=(0,), grad=False),
    OpCase(
        "NoOp", lambda v, x: cg.group(cg.assign(v, x)), [rand(3, 2), rand(3, 2, seed=1)], variables=(0,), grad=False
    ),
]
