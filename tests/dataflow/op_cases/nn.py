"""Rows for the nn family: activations, softmax, cross-entropy, bias, conv, pooling, dropout.

Gradient rows keep shapes small (finite differences perturb one element at a
time). Pooling rows use distinct random values, so no window has a tie that
a perturbation could flip.
"""

from __future__ import annotations

import numpy as np

import cellgraph as cg
from cellgraph.dataflow.ops import conv, nn

from . import OpCase, rand

x34 = rand(3, 4, seed=11)
labels = np.array([0, 4, 2, 1], np.int32)
logits = rand(4, 5, seed=12) * 3


def _second(t: cg.Tensor) -> cg.Tensor:
    """Output 1 of ``t``'s node (the backprop of cross-entropy, the mask of dropout)."""
    return t.node.output(1)


CASES = [
    # ------------------------------------------------------------ activations
    OpCase("Relu", lambda x: cg.relu(x), [x34]),
    OpCase("Relu", lambda x: cg.relu(x), [x34], static_shapes=[(None, 4)], id="unknown-batch"),
    OpCase("Relu", lambda x: cg.relu(x), [rand(seed=13)], id="rank0"),
    OpCase("Sigmoid", lambda x: cg.sigmoid(x), [x34 * 4]),
    OpCase(
        "Sigmoid",
        lambda x: cg.sigmoid(x),
        [np.array([-800.0, -30.0, 0.0, 30.0, 800.0], np.float32)],
        grad=False,
        id="saturated",
    ),
    OpCase("Tanh", lambda x: cg.tanh(x), [x34 * 2]),
    OpCase("ReluGrad", lambda g, y: nn.relu_grad(g, y), [rand(3, 4, seed=14), x34], wrt=(0,)),
    OpCase(
        "SigmoidGrad",
        lambda g, y: nn.sigmoid_grad(g, y),
        [rand(3, 4, seed=15), rand(3, 4, seed=16, low=0.05, high=0.95)],
    ),
    OpCase("TanhGrad", lambda g, y: nn.tanh_grad(g, y), [rand(3, 4, seed=17), rand(3, 4, seed=18, low=-0.9, high=0.9)]),
    # ------------------------------------------------------------------ softmax
    OpCase("Softmax", lambda x: cg.softmax(x), [x34 * 3]),
    OpCase("Softmax", lambda x: cg.softmax(x, axis=0), [x34 * 3], id="axis0"),
    OpCase("Softmax", lambda x: cg.softmax(x, axis=1), [rand(2, 3, 4, seed=19)], id="middle-axis"),
    OpCase(
        "Softmax", lambda x: cg.softmax(x), [np.array([[1000.0, 999.0, -1000.0]], np.float32)], grad=False, id="large"
    ),
    OpCase("LogSoftmax", lambda x: cg.log_softmax(x), [x34 * 3]),
    OpCase(
        "LogSoftmax",
        lambda x: cg.log_softmax(x, axis=1),
        [rand(2, 3, 4, seed=20)],
        static_shapes=[(None, 3, 4)],
        id="axis1-unknown-batch",
    ),
    OpCase(
        "LogSoftmax",
        lambda x: cg.log_softmax(x),
        [np.array([[1000.0, 0.0], [-1000.0, 0.0]], np.float32)],
        grad=False,
        id="large",
    ),
    # ------------------------------------------------------------ cross-entropy
    OpCase(
        "SparseSoftmaxCrossEntropyWithLogits",
        lambda x, y: cg.sparse_softmax_cross_entropy(x, y),
        [logits, labels],
        wrt=(0,),
    ),
    OpCase(
        "SparseSoftmaxCrossEntropyWithLogits",
        lambda x, y: cg.sparse_softmax_cross_entropy(x, y),
        [logits, labels.astype(np.int64)],
        static_shapes=[(None, 5), (None,)],
        wrt=(0,),
        id="int64-unknown-batch",
    ),
    OpCase(
        "SparseSoftmaxCrossEntropyWithLogits",
        lambda x, y: _second(cg.sparse_softmax_cross_entropy(x, y)),
        [logits, labels],
        wrt=(0,),
        id="through-backprop",
    ),
    OpCase(
        "SparseSoftmaxCrossEntropyWithLogits",
        lambda x, y: cg.sparse_softmax_cross_entropy(x, y),
        [np.array([[1000.0, -1000.0, 0.0]], np.float32), np.array([1], np.int32)],
        grad=False,
        id="large",
    ),
    # --------------------------------------------------------------------- bias
    OpCase("BiasAdd", lambda x, b: cg.bias_add(x, b), [rand(2, 3, 4, seed=21), rand(4, seed=22)]),
    OpCase(
        "BiasAdd",
        lambda x, b: cg.bias_add(x, b),
        [rand(2, 3, 3, 2, seed=23), rand(2, seed=24)],
        static_shapes=[(None, 3, 3, 2), (2,)],
        id="nhwc-unknown-batch",
    ),
    OpCase("BiasAddGrad", lambda g: nn.bias_add_grad(g), [rand(2, 3, 4, seed=25)]),
    # -------------------------------------------------------------- convolution
    OpCase("Conv2D", lambda x, f: cg.conv2d(x, f), [rand(2, 5, 5, 3, seed=30), rand(3, 3, 3, 4, seed=31)], id="same"),
    OpCase(
        "Conv2D",
        lambda x, f: cg.conv2d(x, f, padding="VALID"),
        [rand(2, 6, 5, 2, seed=32), rand(3, 2, 2, 3, seed=33)],
        id="valid",
    ),
    OpCase(
        "Conv2D",
        lambda x, f: cg.conv2d(x, f, strides=2),
        [rand(2, 6, 7, 2, seed=34), rand(3, 3, 2, 3, seed=35)],
        id="same-stride2",
    ),
    OpCase(
        "Conv2D",
        lambda x, f: cg.conv2d(x, f, strides=(2, 1), padding="VALID"),
        [rand(1, 7, 5, 2, seed=36), rand(2, 3, 2, 2, seed=37)],
        id="valid-stride21",
    ),
    OpCase(
        "Conv2D",
        lambda x, f: cg.conv2d(x, f, strides=(1, 2, 2, 1)),
        [rand(2, 4, 4, 3, seed=38), rand(1, 1, 3, 2, seed=39)],
        id="1x1-stride2",
    ),
    OpCase(
        "Conv2D",
        lambda x, f: cg.conv2d(x, f),
        [rand(2, 4, 4, 3, seed=40), rand(1, 1, 3, 5, seed=41)],
        static_shapes=[(None, 4, 4, 3), (1, 1, 3, 5)],
        id="pointwise-unknown-batch",
    ),
    OpCase(
        "Conv2D",
        lambda x, f: cg.conv2d(x, f),
        [rand(2, 5, 4, 3, seed=42), rand(3, 3, 3, 2, seed=43)],
        static_shapes=[(None, None, None, 3), (3, 3, 3, 2)],
        grad=False,
        id="unknown-spatial",
    ),
    OpCase(
        "Conv2D",
        lambda x, f: cg.conv2d(x, f),
        [rand(64, 8, 8, 16, seed=44), rand(3, 3, 16, 16, seed=45)],
        grad=False,
        rtol=1e-4,
        atol=1e-4,
        id="several-blocks",
    ),
    OpCase(
        "Conv2D",
        lambda x, f: cg.conv2d(x, f),
        [rand(2, 6, 6, 8, seed=86), rand(3, 3, 8, 8, seed=87)],
        grad=False,
        id="gpu-blocks",  # several thread blocks, small enough for the CUDA simulator
    ),
    OpCase(
        "Conv2DBackpropInput",
        lambda x, f, dy: cg.conv2d_backprop_input(x, f, dy),
        [rand(2, 5, 5, 3, seed=46), rand(3, 3, 3, 4, seed=47), rand(2, 5, 5, 4, seed=48)],
        wrt=(1, 2),
        id="same",
    ),
    OpCase(
        "Conv2DBackpropInput",
        lambda x, f, dy: cg.conv2d_backprop_input(x, f, dy, strides=2, padding="VALID"),
        [rand(2, 7, 6, 2, seed=49), rand(3, 2, 2, 3, seed=50), rand(2, 3, 3, 3, seed=51)],
        wrt=(1, 2),
        id="valid-stride2",
    ),
    OpCase(
        "Conv2DBackpropInput",
        lambda x, f, dy: cg.conv2d_backprop_input(x, f, dy, strides=2),
        [rand(64, 8, 8, 16, seed=52), rand(3, 3, 16, 8, seed=53), rand(64, 4, 4, 8, seed=54)],
        grad=False,
        rtol=1e-4,
        atol=1e-4,
        id="stride2-several-blocks",
    ),
    OpCase(
        "Conv2DBackpropInput",
        lambda x, f, dy: cg.conv2d_backprop_input(x, f, dy, strides=2),
        [rand(2, 8, 8, 4, seed=88), rand(3, 3, 4, 6, seed=89), rand(2, 4, 4, 6, seed=90)],
        grad=False,
        id="stride2-gpu-blocks",
    ),
    OpCase(
        "Conv2DBackpropFilter",
        lambda x, f, dy: cg.conv2d_backprop_filter(x, f, dy),
        [rand(2, 5, 5, 3, seed=55), rand(3, 3, 3, 4, seed=56), rand(2, 5, 5, 4, seed=57)],
        wrt=(0, 2),
        id="same",
    ),
    OpCase(
        "Conv2DBackpropFilter",
        lambda x, f, dy: cg.conv2d_backprop_filter(x, f, dy, strides=(1, 2), padding="VALID"),
        [rand(2, 5, 6, 2, seed=58), rand(2, 3, 2, 3, seed=59), rand(2, 4, 2, 3, seed=60)],
        wrt=(0, 2),
        id="valid-stride12",
    ),
    OpCase(
        "Conv2DBackpropFilter",
        lambda x, f, dy: cg.conv2d_backprop_filter(x, f, dy),
        [rand(64, 8, 8, 16, seed=61), rand(3, 3, 16, 8, seed=62), rand(64, 8, 8, 8, seed=63)],
        grad=False,
        rtol=1e-4,
        atol=1e-3,
        id="several-blocks",
    ),
    OpCase(
        "Conv2DBackpropFilter",
        lambda x, f, dy: cg.conv2d_backprop_filter(x, f, dy, strides=2),
        [rand(2, 6, 6, 8, seed=91), rand(3, 3, 8, 20, seed=92), rand(2, 3, 3, 20, seed=93)],
        grad=False,
        id="stride2-gpu-blocks",  # 5 x 2 tiles of the filter, 2 of the pixels
    ),
    # ------------------------------------------------------------------ pooling
    OpCase("MaxPool", lambda x: cg.max_pool(x, 2, 2), [rand(2, 4, 4, 3, seed=70)], id="valid-2x2"),
    OpCase(
        "MaxPool",
        lambda x: cg.max_pool(x, 3, 1, "SAME"),
        [rand(2, 5, 5, 2, seed=71)],
        static_shapes=[(None, 5, 5, 2)],
        id="same-3x3-stride1",
    ),
    OpCase(
        "MaxPool", lambda x: cg.max_pool(x, 3, 2, "SAME"), [rand(1, 6, 6, 2, seed=72)], id="same-3x3-stride2-uneven-pad"
    ),
    OpCase("MaxPool", lambda x: cg.max_pool(x, (2, 3), (1, 2), "VALID"), [rand(2, 4, 7, 2, seed=73)], id="valid-2x3"),
    OpCase(
        "MaxPoolGrad",
        lambda x, dy: conv.max_pool_grad(x, dy, 3, 2, "SAME"),
        [rand(2, 6, 6, 2, seed=74), rand(2, 3, 3, 2, seed=75)],
        wrt=(1,),
    ),
    OpCase(
        "MaxPoolGradGrad",
        lambda x, ddx: conv.max_pool_grad_grad(x, ddx, 3, 2, "SAME"),
        [rand(2, 6, 6, 2, seed=76), rand(2, 6, 6, 2, seed=77)],
        wrt=(1,),
    ),
    OpCase("AvgPool", lambda x: cg.avg_pool(x, 2, 2), [rand(2, 4, 4, 3, seed=78)], id="valid-2x2"),
    OpCase(
        "AvgPool",
        lambda x: cg.avg_pool(x, 3, 1, "SAME"),
        [rand(2, 5, 5, 2, seed=79)],
        static_shapes=[(None, 5, 5, 2)],
        id="same-3x3-stride1",
    ),
    OpCase(
        "AvgPool", lambda x: cg.avg_pool(x, 3, 2, "SAME"), [rand(1, 6, 6, 2, seed=80)], id="same-3x3-stride2-uneven-pad"
    ),
    OpCase(
        "AvgPoolGrad",
        lambda x, dy: conv.avg_pool_grad(x, dy, 3, 2, "SAME"),
        [rand(2, 6, 6, 2, seed=81), rand(2, 3, 3, 2, seed=82)],
        wrt=(1,),
    ),
    # ------------------------------------------------------------------ dropout
    # A mask changes every run, so finite differences (many runs) check the
    # gradient only at rate 0; test_nn.py checks the masked gradient in one run.
    OpCase("Dropout", lambda x: cg.dropout(x, 0.5, seed=3), [rand(4, 5, seed=83)], grad=False),
    OpCase("Dropout", lambda x: _second(cg.dropout(x, 0.25, seed=4)), [rand(4, 5, seed=84)], grad=False, id="mask"),
    OpCase("Dropout", lambda x: cg.dropout(x, 0.0), [rand(4, 5, seed=85)], id="rate0"),
]
