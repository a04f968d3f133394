"""Evaluation metrics, as graph tensors."""

from __future__ import annotations

from cellgraph.dataflow.graph import Tensor
from cellgraph.dataflow.ops import math, reductions


def accuracy(logits: Tensor, labels: Tensor, name: str = "accuracy") -> Tensor:
    """Fraction of rows whose largest logit is at the label (a tie counts for its first class), as float32.

    Examples
    --------
    >>> import cellgraph as cg
    >>> g = cg.Graph()
    >>> with g.as_default():
    ...     logits = cg.constant([[0.1, 0.9], [0.8, 0.2], [0.3, 0.7], [0.6, 0.4]])
    ...     acc = cg.metrics.accuracy(logits, cg.constant([1, 0, 0, 1], dtype="int32"))
    >>> float(cg.Session(g).run(acc))
    0.5
    """
    hits = math.equal(reductions.argmax(logits, axis=-1), math.cast(labels, "int32"))
    return math.reduce_mean(math.cast(hits, "float32"), name=name)


__all__ = ["accuracy"]


def __dir__() -> list[str]:
    """What ``cg.metrics.<Tab>`` offers: its public names, not the modules and types it imports for itself."""
    return sorted(__all__)
