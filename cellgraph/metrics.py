"""Evaluation metrics, as graph tensors."""

from __future__ import annotations

from cellgraph.dataflow.errors import ShapeError
from cellgraph.dataflow.graph import Tensor
from cellgraph.dataflow.ops import array, math, reductions
from cellgraph.dataflow.ops.base import as_tensor, fits
from cellgraph.dataflow.shapes import fmt


def accuracy(logits: Tensor, labels: Tensor, name: str = "accuracy") -> Tensor:
    """Fraction of rows whose largest logit is at the label (a tie counts for its first class), as float32.

    ``labels`` holds one class index per row of ``logits`` (..., C): shape ``logits.shape[:-1]``, or that with
    a trailing 1 (a ``(batch, 1)`` column, read as ``(batch,)`` as Keras's ``sparse_categorical_accuracy``
    reads it). Any other shape is a ShapeError: compared as they stand, (batch,) predictions and (batch, 1)
    labels broadcast to a (batch, batch) table of every prediction against every label, and its mean is no
    accuracy. The labels' size must be the predictions' when the graph runs too.

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
    labels = as_tensor(labels)
    predicted = reductions.argmax(logits, axis=-1)
    rows = logits.shape[:-1]
    column = len(labels.shape) == len(logits.shape) and labels.shape[-1] in (1, None)
    if not (fits(labels.shape, rows) or (column and fits(labels.shape[:-1], rows))):
        raise ShapeError(
            f"accuracy {name!r}: labels have shape {fmt(labels.shape)} but logits {fmt(logits.shape)} need one "
            f"class index per row: shape {fmt(rows)} (or {fmt((*rows, 1))})"
        )
    # A (batch, 1) column is read as (batch,) (its squeeze fails the run on a wider one); then the labels must
    # have the predictions' run-time shape: of another size they broadcast against them, and of the same size
    # but another shape ((time, batch) for (batch, time)) a reshape read them in the wrong order.
    # Not cast when int32 already, so that a failed run names the labels as fed.
    wanted = labels if labels.dtype == "int32" else math.cast(labels, "int32", name=f"{name}_labels_int32")
    if len(labels.shape) != len(rows):
        wanted = array.squeeze(wanted, -1, name=f"{name}_label_column")
    wanted = array.reshape_like(wanted, predicted, name=f"{name}_labels", same_shape=True)
    hits = math.equal(predicted, wanted)
    return math.reduce_mean(math.cast(hits, "float32"), name=name)


__all__ = ["accuracy"]


def __dir__() -> list[str]:
    """What ``cg.metrics.<Tab>`` offers: its public names, not the modules and types it imports for itself."""
    return sorted(__all__)
