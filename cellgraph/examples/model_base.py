"""A built demo model (``Model``) and ``finish``, which gives a model's logits its loss, accuracy and training op.

>>> import numpy as np
>>> from cellgraph.examples.models import mlp
>>> model = mlp(hidden=8)
>>> x, y = np.zeros((3, 64), np.float32), np.zeros(3, np.int32)
>>> float(cg.Session(model.graph).run(model.accuracy, model.eval_feeds(x, y))) in (0.0, 1.0)
True
"""

from __future__ import annotations

from dataclasses import dataclass

import cellgraph as cg


@dataclass
class Model:
    """A built model: its graph, inputs, outputs and training op."""

    name: str
    graph: cg.Graph
    x: cg.Tensor
    y: cg.Tensor
    logits: cg.Tensor
    loss: cg.Tensor
    accuracy: cg.Tensor
    train_op: cg.Node
    image_input: bool
    training: cg.Tensor | None = None

    def eval_feeds(self, x: object, y: object) -> dict[cg.Tensor, object]:
        """The feeds that evaluate on ``x`` and ``y``: the training switch, if any, off."""
        feeds: dict[cg.Tensor, object] = {self.x: x, self.y: y}
        if self.training is not None:
            feeds[self.training] = False
        return feeds


def finish(
    name: str,
    g: cg.Graph,
    x: cg.Tensor,
    y: cg.Tensor,
    logits: cg.Tensor,
    optimizer: cg.optim.Optimizer,
    image_input: bool,
    training: cg.Tensor | None = None,
) -> Model:
    loss = cg.losses.sparse_softmax_cross_entropy(logits, y)
    train_op = optimizer.minimize(loss)
    return Model(name, g, x, y, logits, loss, cg.metrics.accuracy(logits, y), train_op, image_input, training)
