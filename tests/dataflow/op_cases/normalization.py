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


def _bn_grad_op(dy, x, gamma, axis=-1):  # noqa: ANN001, ANN202
    from cellgraph.dataflow.ops.normalization import fused_batch_norm

    _, mean, var = fused_batch_norm(x, gamma, gamma * 0.0, epsilon=1e-3, axis=axis)
    attrs = {"axis": axis, "channel_axis": axis % len(x.shape), "epsilon": 1e-3}
    return apply_node("BatchNormGrad", [dy, x, gamma, mean, var], attrs, name="batch_norm_grad")


def _fused(axis=-1, output=0):  # noqa: ANN001, ANN202
    from cellgraph.dataflow.ops.normalization import fused_batch_norm

    return lambda x, g, b: fused_batch_norm(x, g, b, axis=axis)[output]


CASES += [
    OpCase("FusedBatchNorm", _fused(), [rand(6, 3, seed=91), rand(3, seed=92), rand(3, seed=93)], grad_rtol=1e-3),
    OpCase("FusedBatchNorm", _fused(axis=1), [rand(2, 3, 2, 2, seed=94), rand(3, seed=95), rand(3, seed=96)],
           id="nchw", grad_rtol=1e-3),
    OpCase("FusedBatchNorm", _fused(axis=-1), [rand(2, 2, 2, 3, seed=97), rand(3, seed=98), rand(3, seed=99)],
           static_shapes=[(None, 2, 2, 3), (3,), (3,)], id="nhwc-unknown-batch", grad_rtol=1e-3),
    OpCase("FusedBatchNorm", _fused(output=2), [rand(5, 3, seed=100), rand(3, seed=101), rand(3, seed=102)],
           wrt=(0,), id="variance-output", grad_rtol=1e-3),
    OpCase("FusedBatchNorm", _fused(output=1), [rand(5, 3, seed=103), rand(3, seed=104), rand(3, seed=105)],
           wrt=(0,), id="mean-output"),
    OpCase("BatchNormGrad", lambda dy, x, g: _bn_grad_op(dy, x, g),
           [rand(6, 3, seed=106), rand(6, 3, seed=107), rand(3, seed=108)], grad=False),
    OpCase("BatchNormGrad", lambda dy, x, g: _bn_grad_op(dy, x, g, axis=1),
           [rand(2, 3, 4, seed=109), rand(2, 3, 4, seed=110), rand(3, seed=111)], grad=False, id="nch"),
]  # fmt: skip
