"""Evaluation metrics, as graph tensors."""

from __future__ import annotations

from cellgraph.dataflow.graph import Tensor
from cellgraph.dataflow.ops import math


def accuracy(logits: Tensor, labels: Tensor, name: str = "accuracy") -> Tensor:
    """Fraction of rows whose largest logit is at the label."""
    hits = math.equal(math.argmax(logits, axis=-1), math.cast(labels, "int32"))
    return math.reduce_mean(math.cast(hits, "float32"), name=name)
