"""The demo models, built as cellgraph graphs: an MLP and a mini-Inception CNN here; a ResNet, an
Inception-v3, a Transformer encoder and an LSTM in ``deep_models.py``.

The mini-Inception keeps the shape of GoogLeNet's building block (Szegedy et
al., 2015) at digit scale: a conv stem, then parallel 1x1 / 3x3 / 5x5 / pooling
branches joined by a channel concat, then a dense head.

A model with batch normalization or dropout has a ``training`` switch
(``cg.layers.training_switch()``): true unless fed, so a training step feeds
only the data; evaluation feeds it ``False`` (``Model.eval_feeds``).
"""

from __future__ import annotations

from collections.abc import Callable

import cellgraph as cg

from .deep_models import inception_v3, lstm, resnet, transformer
from .model_base import Model, finish

__all__ = ["MODELS", "Model", "inception_block", "mini_inception", "mlp"]


def mlp(hidden: int = 128, optimizer: cg.optim.Optimizer | None = None) -> Model:
    """64 -> ``hidden`` (ReLU) -> 10."""
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((None, 64), "float32", name="x")
        y = cg.placeholder((None,), "int32", name="y")
        h = cg.layers.dense(x, hidden, activation="relu", name="hidden")
        logits = cg.layers.dense(h, 10, name="logits")
        return finish("mlp", g, x, y, logits, optimizer or cg.optim.Adam(1e-2), image_input=False)


def inception_block(x: cg.Tensor, width: int = 8, name: str = "inception") -> cg.Tensor:
    """Four parallel branches over ``x``, concatenated on channels (4 * ``width``)."""
    with cg.name_scope(name):
        b1 = cg.layers.conv2d(x, width, 1, activation="relu", name="b1x1")
        b3 = cg.layers.conv2d(
            cg.layers.conv2d(x, width, 1, activation="relu", name="b3x3_reduce"),
            width,
            3,
            activation="relu",
            name="b3x3",
        )
        b5 = cg.layers.conv2d(
            cg.layers.conv2d(x, width, 1, activation="relu", name="b5x5_reduce"),
            width,
            5,
            activation="relu",
            name="b5x5",
        )
        pool = cg.max_pool(x, 3, 1, "SAME", name="pool")
        bp = cg.layers.conv2d(pool, width, 1, activation="relu", name="pool_proj")
        return cg.concat([b1, b3, b5, bp], axis=3)


def mini_inception(optimizer: cg.optim.Optimizer | None = None) -> Model:
    """conv 3x3 (16) -> Inception block (4 x 8) -> 2x2 max pool -> dense 10."""
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((None, 8, 8, 1), "float32", name="x")
        y = cg.placeholder((None,), "int32", name="y")
        stem = cg.layers.conv2d(x, 16, 3, activation="relu", name="stem")
        block = inception_block(stem, 8)
        pooled = cg.layers.max_pool2d(block, 2)
        logits = cg.layers.dense(cg.layers.flatten(pooled), 10, name="logits")
        return finish("mini-inception", g, x, y, logits, optimizer or cg.optim.Adam(3e-3), image_input=True)


MODELS: dict[str, Callable[..., Model]] = {
    "mlp": mlp,
    "inception": mini_inception,
    "resnet": resnet,
    "inception_v3": inception_v3,
    "transformer": transformer,
    "lstm": lstm,
}
