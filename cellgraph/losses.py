"""Losses, each reduced to one scalar (the mean over the batch)."""

from __future__ import annotations

from cellgraph.dataflow.graph import Tensor
from cellgraph.dataflow.ops import math, nn


def sparse_softmax_cross_entropy(logits: Tensor, labels: Tensor, name: str = "loss") -> Tensor:
    """Mean cross-entropy of ``logits`` (N, C) against integer class ``labels`` (N,)."""
    return math.reduce_mean(nn.sparse_softmax_cross_entropy(logits, labels), name=name)


def mean_squared_error(predictions: Tensor, targets: Tensor, name: str = "loss") -> Tensor:
    """Mean of the squared differences."""
    return math.reduce_mean(math.square(predictions - targets), name=name)
