"""Losses, each reduced to one scalar (the mean over the batch)."""

from __future__ import annotations

from cellgraph.dataflow.graph import Tensor
from cellgraph.dataflow.ops import math, nn


def sparse_softmax_cross_entropy(logits: Tensor, labels: Tensor, name: str = "loss") -> Tensor:
    """Mean cross-entropy of ``logits`` (N, C) against integer class ``labels`` (N,)."""
    return math.reduce_mean(nn.sparse_softmax_cross_entropy(logits, labels), name=name)


def mean_squared_error(predictions: Tensor, targets: Tensor, name: str = "loss") -> Tensor:
    """Mean of the squared differences ``(predictions - targets) ** 2`` over every element.

    Examples
    --------
    >>> import cellgraph as cg
    >>> g = cg.Graph()
    >>> with g.as_default():
    ...     loss = cg.losses.mean_squared_error(cg.constant([1.0, 2.0, 4.0]), cg.constant([1.0, 0.0, 1.0]))
    >>> float(cg.Session(g).run(loss))  # (0 + 4 + 9) / 3
    4.333333492279053
    """
    return math.reduce_mean(math.square(predictions - targets), name=name)
