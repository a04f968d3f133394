"""Rows for ops/normalization.py: LayerNorm and its gradient op."""

from __future__ import annotations

import numpy as np

import cellgraph as cg
from cellgraph.dataflow.ops.base import apply_node

from . import OpCase, rand


def _grad_op(dy, x, gamma, begin_axis=-1):  # noqa: ANN001, ANN202
    rank = len(x.shape)
    attrs = {"axis": begin_axis, "begin_axis": begin_axis % rank, "epsilon": 1e-5}
    return apply_node("LayerNormGrad", [dy, x, gamma], attrs, name="layer_norm_grad")


CASES = [
    OpCase("LayerNorm", lambda x, g, b: cg.layer_norm(x, g, b), [rand(4, 6, seed=71), rand(6, seed=72), rand(6, seed=73)],
           grad_rtol=1e-3),
    OpCase("LayerNorm", lambda x, g, b: cg.layer_norm(x, g, b, begin_axis=1),
           [rand(2, 3, 4, seed=74), rand(3, 4, seed=75), rand(3, 4, seed=76)], id="last-two", grad_rtol=1e-3),
    OpCase("LayerNorm", lambda x, g, b: cg.layer_norm(x, g, b, epsilon=1e-3),
           [rand(3, 2, 5, seed=77), rand(5, seed=78), rand(5, seed=79)], static_shapes=[(None, 2, 5), (5,), (5,)],
           id="unknown-batch", grad_rtol=1e-3),
    OpCase("LayerNorm", lambda x, g, b: cg.layer_norm(x, g, b),
           [np.full((2, 3), 4.0, np.float32), rand(3, seed=80), rand(3, seed=81)], grad=False, id="constant-rows"),
    OpCase("LayerNormGrad", lambda dy, x, g: _grad_op(dy, x, g),
           [rand(4, 6, seed=82), rand(4, 6, seed=83), rand(6, seed=84)], grad=False),
    OpCase("LayerNormGrad", lambda dy, x, g: _grad_op(dy, x, g, begin_axis=1),
           [rand(2, 3, 4, seed=85), rand(2, 3, 4, seed=86), rand(3, 4, seed=87)], grad=False, id="last-two"),
]  # fmt: skip
