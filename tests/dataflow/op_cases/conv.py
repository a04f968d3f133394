"""Rows for the convolution variants: dilations, explicit pads and groups (depthwise
included), conv1d, conv2d_transpose, and max pooling with its argmax.

The plain convolution and pooling rows are in ``nn.py``. Shapes stay small:
the CUDA column runs these rows on Numba's simulator, one Python thread per
GPU thread.
"""

from __future__ import annotations

from typing import Any

import cellgraph as cg
from cellgraph.dataflow.ops import conv, conv_more

from . import OpCase, rand

# (id, strides, padding, dilations, groups, x shape, filter shape)
VARIANTS: list[tuple[str, Any, Any, Any, int, tuple[int, ...], tuple[int, ...]]] = [
    ("dilated-same",       1,      "SAME",             2,      1, (2, 6, 6, 2), (3, 3, 2, 3)),
    ("dilated-valid-21",   (2, 1), "VALID",            (2, 3), 1, (2, 7, 8, 2), (2, 2, 2, 2)),
    ("pads",               1,      ((1, 0), (2, 1)),   1,      1, (2, 4, 5, 2), (3, 2, 2, 3)),
    ("pads-stride2",       2,      ((0, 2), (1, 1)),   1,      1, (1, 5, 5, 2), (3, 3, 2, 2)),
    ("pads-dilated",       (1, 2), 1,                  (2, 1), 1, (1, 5, 6, 3), (2, 3, 3, 2)),
    ("groups2",            1,      "SAME",             1,      2, (2, 4, 4, 4), (3, 3, 2, 6)),
    ("depthwise",          2,      "SAME",             1,      3, (2, 5, 5, 3), (3, 3, 1, 3)),
    ("depthwise-mult2",    1,      "VALID",            2,      2, (1, 6, 5, 2), (2, 2, 1, 4)),
    ("groups-pads-stride", 2,      ((1, 1), (0, 1)),   1,      2, (1, 5, 4, 4), (2, 3, 2, 2)),
]  # fmt: skip


def _rows() -> list[OpCase]:
    rows: list[OpCase] = []
    for i, (id_, s, p, d, g, xs, fs) in enumerate(VARIANTS):
        kw = {"strides": s, "padding": p, "dilations": d, "groups": g}
        x, f = rand(*xs, seed=200 + i), rand(*fs, seed=300 + i)
        y = conv._ref_conv2d(conv.conv_attrs(**kw), x, f)  # only dy's shape comes from the reference
        dy = rand(*y.shape, seed=400 + i)
        rows += [
            OpCase("Conv2D", lambda a, b, kw=kw: cg.conv2d(a, b, **kw), [x, f], id=id_),
            OpCase(
                "Conv2DBackpropInput",
                lambda a, b, c, kw=kw: cg.conv2d_backprop_input(a, b, c, **kw),
                [x, f, dy],
                wrt=(1, 2),
                id=id_,
            ),
            OpCase(
                "Conv2DBackpropFilter",
                lambda a, b, c, kw=kw: cg.conv2d_backprop_filter(a, b, c, **kw),
                [x, f, dy],
                wrt=(0, 2),
                id=id_,
            ),
        ]
    return rows


CASES: list[OpCase] = [
    *_rows(),
    OpCase(
        "Conv2D",
        lambda a, b: cg.conv2d(a, b, dilations=2, groups=2),
        [rand(2, 6, 6, 4, seed=40), rand(3, 3, 2, 2, seed=41)],
        static_shapes=[(None, None, None, 4), (3, 3, 2, 2)],
        id="grouped-unknown-spatial",
    ),
    # ------------------------------------------------------- conv2d_transpose
    OpCase(
        "Conv2DTranspose",
        lambda a, f: conv_more.conv2d_transpose(a, f, (5, 5), strides=2),
        [rand(2, 3, 3, 3, seed=50), rand(3, 3, 2, 3, seed=51)],
        id="same-stride2-odd",
    ),
    OpCase(
        "Conv2DTranspose",
        lambda a, f: conv_more.conv2d_transpose(a, f, strides=(2, 1), padding="VALID"),
        [rand(2, 3, 4, 2, seed=52), rand(2, 3, 3, 2, seed=53)],
        id="valid-default-size",
    ),
    OpCase(
        "Conv2DTranspose",
        lambda a, f: conv_more.conv2d_transpose(a, f, (2, 6, 6, 4), padding=((1, 0), (1, 1)), dilations=2, groups=2),
        [rand(2, 5, 6, 2, seed=54), rand(2, 2, 2, 2, seed=55)],
        id="pads-dilated-groups",
    ),
    OpCase(
        "Conv2DTranspose",
        lambda a, f: conv_more.conv2d_transpose(a, f, strides=2),
        [rand(2, 3, 2, 3, seed=56), rand(3, 3, 2, 3, seed=57)],
        static_shapes=[(None, None, None, 3), (3, 3, 2, 3)],
        id="unknown-spatial",
    ),
    # ------------------------------------------------------------ dilated pools
    *[
        OpCase(op, build, inputs, id=id_, wrt=(1,) if len(inputs) == 2 else None)
        for op, build, inputs, id_ in [
            ("MaxPool", lambda a: cg.max_pool(a, 2, 1, dilations=2), [rand(2, 5, 6, 2, seed=80)], "dilated"),
            (
                "MaxPool",
                lambda a: cg.max_pool(a, (2, 3), (2, 1), dilations=(2, 2)),
                [rand(1, 6, 7, 2, seed=81)],
                "dilated-strided",
            ),
            ("AvgPool", lambda a: cg.avg_pool(a, 2, (1, 2), dilations=(1, 3)), [rand(2, 4, 8, 2, seed=82)], "dilated"),
            (
                "MaxPoolGrad",
                lambda a, b: conv.max_pool_grad(a, b, 2, 1, "VALID", dilations=2),
                [rand(2, 5, 6, 2, seed=83), rand(2, 3, 4, 2, seed=84)],
                "dilated",
            ),
            (
                "MaxPoolGradGrad",
                lambda a, b: conv.max_pool_grad_grad(a, b, 2, (2, 1), "VALID", dilations=(2, 2)),
                [rand(2, 6, 6, 2, seed=85), rand(2, 6, 6, 2, seed=86)],
                "dilated",
            ),
            (
                "AvgPoolGrad",
                lambda a, b: conv.avg_pool_grad(a, b, 2, (1, 2), "VALID", dilations=(1, 3)),
                [rand(2, 4, 8, 2, seed=87), rand(2, 3, 3, 2, seed=88)],
                "dilated",
            ),
        ]
    ],
    # ------------------------------------------------------- max pool + argmax
    OpCase(
        "MaxPoolWithArgmax",
        lambda a: conv_more.max_pool_with_argmax(a, 2, 2)[0],
        [rand(2, 4, 5, 3, seed=60)],
        id="values-valid",
    ),
    OpCase(
        "MaxPoolWithArgmax",
        lambda a: conv_more.max_pool_with_argmax(a, 3, 2, "SAME")[1],
        [rand(2, 5, 5, 2, seed=61)],
        grad=False,
        id="argmax-same",
    ),
    OpCase(
        "MaxPoolWithArgmax",
        lambda a: conv_more.max_pool_with_argmax(a, (2, 3), (1, 2), "SAME", include_batch_in_index=True)[1],
        [rand(3, 4, 5, 2, seed=62)],
        grad=False,
        id="argmax-with-batch",
    ),
]
