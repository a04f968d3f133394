"""Oracle rows of ``cg.losses`` against ``torch.nn.functional``'s losses, values and gradients.

A loss is written over existing ops, so each row names the op it is built
around (``Softplus`` for the sigmoid cross-entropy, ...); the label says which
loss. Rows follow ``rows.py``'s conventions and are appended to its ``ROWS``.
"""

from __future__ import annotations

from typing import Any

import cellgraph as cg

from .rows import ZERO, Row, ints, pos, x

try:
    import torch
    import torch.nn.functional as F  # noqa: N812 - PyTorch's own spelling
except ImportError:  # the comparisons skip (test_ops.py); the table still loads
    torch = F = None  # type: ignore[assignment]

IGNORE = 5  # labels are drawn in [0, 6) against 5 classes: about one in six is ignored


def _channels_first(z: Any) -> Any:
    """torch wants the classes at dim 1; cellgraph keeps them last."""
    return z.movedim(-1, 1)


def _bce(reduction: str) -> Any:
    return lambda z, t: F.binary_cross_entropy_with_logits(z, t, reduction=reduction)


def _sigmoid_xent(reduction: str) -> Any:
    return lambda z, t: cg.losses.sigmoid_cross_entropy_with_logits(z, t, reduction=reduction)


def _sparse(reduction: str = "mean", weighted: bool = False, ignore: bool = False) -> Any:
    def build(z: Any, y: Any, *cw: Any) -> Any:
        weights = cg.gather(cw[0], cg.maximum(cg.minimum(y, 4), 0)) if weighted else None
        return cg.losses.sparse_softmax_cross_entropy(
            z, y, weights=weights, ignore_index=IGNORE if ignore else None, reduction=reduction
        )

    return build


def _torch_sparse(reduction: str = "mean", weighted: bool = False, ignore: bool = False) -> Any:
    """torch's ``cross_entropy``; with class weights its weighted mean written out, since torch gives
    no gradient for ``weight=`` (test_losses.py checks ``weight=`` itself gives the same values)."""

    def run(z: Any, y: Any, *cw: Any) -> Any:
        ignore_index = IGNORE if ignore else -100
        per = F.cross_entropy(_channels_first(z), y.long(), ignore_index=ignore_index, reduction="none")
        if not weighted:
            return F.cross_entropy(_channels_first(z), y.long(), ignore_index=ignore_index, reduction=reduction)
        w = cw[0][y.long().clamp(0, 4)] * (y != ignore_index)
        per = per * w
        if reduction == "none":
            return per
        return per.sum() / w.sum() if reduction == "mean" else per.sum()

    return run


def _logits(*shape: Any) -> Any:
    return x(*shape, low=-3, high=3)


LOSS_ROWS: list[Row] = [
    # ---------------------------------------------- sigmoid cross-entropy (BCEWithLogits)
    Row("Softplus", _sigmoid_xent("mean"), _bce("mean"), [x("n", 4, low=-40, high=40), x("n", 4, low=0, high=1)],
        id="sigmoid-xent-mean"),
    Row("Softplus", _sigmoid_xent("sum"), _bce("sum"), [x("n", 4, low=-40, high=40), x("n", 4, low=0, high=1)],
        id="sigmoid-xent-sum", variants=ZERO),
    Row("Softplus", _sigmoid_xent("none"), _bce("none"), [x("n", 2, 3, low=-5, high=5), x("n", 2, 3, low=0, high=1)],
        id="sigmoid-xent-none", variants=ZERO),
    # ---------------------------------------------- dense softmax cross-entropy (probability targets)
    Row("LogSoftmax", lambda z, t: cg.losses.softmax_cross_entropy_with_logits(z, t),
        lambda z, t: F.cross_entropy(z, t), [_logits("n", 5), x("n", 5, low=0, high=1)], id="softmax-xent-mean"),
    Row("LogSoftmax", lambda z, t: cg.losses.softmax_cross_entropy_with_logits(z, t, reduction="none"),
        lambda z, t: F.cross_entropy(_channels_first(z), _channels_first(t), reduction="none"),
        [_logits("n", 2, 5), x("n", 2, 5, low=0, high=1)], id="softmax-xent-rank3-none", variants=ZERO),
    # ---------------------------------------------- sparse cross-entropy: weights, ignore_index, rank > 2
    Row("SparseSoftmaxCrossEntropyWithLogits", _sparse(weighted=True), _torch_sparse(weighted=True),
        [_logits("n", 5), ints("n", high=5), pos(5)], id="loss-class-weights"),
    Row("SparseSoftmaxCrossEntropyWithLogits", _sparse(ignore=True), _torch_sparse(ignore=True),
        [_logits("n", 5), ints("n", high=6)], id="loss-ignore-index", sizes={"n": 8}, unit=False),
    Row("SparseSoftmaxCrossEntropyWithLogits", _sparse(weighted=True, ignore=True),
        _torch_sparse(weighted=True, ignore=True), [_logits("n", 5), ints("n", high=6, dtype="int64"), pos(5)],
        id="loss-weights-ignore", sizes={"n": 8}, unit=False),
    Row("SparseSoftmaxCrossEntropyWithLogits", _sparse("sum", ignore=True), _torch_sparse("sum", ignore=True),
        [_logits("n", 5), ints("n", high=6)], id="loss-ignore-sum", variants=ZERO),
    Row("SparseSoftmaxCrossEntropyWithLogits", _sparse("none", weighted=True, ignore=True),
        _torch_sparse("none", weighted=True, ignore=True), [_logits("n", "t", 5), ints("n", "t", high=6), pos(5)],
        id="loss-rank3-none", sizes={"t": 4}, variants=({"n": 0},)),
    Row("SparseSoftmaxCrossEntropyWithLogits", _sparse(weighted=True), _torch_sparse(weighted=True),
        [_logits("n", 2, 3, 5), ints("n", 2, 3, high=5), pos(5)], id="loss-rank4-mean"),
    # ---------------------------------------------- Huber, l2_loss
    Row("Minimum", lambda p, t: cg.losses.huber(p, t, delta=0.7), lambda p, t: F.huber_loss(p, t, delta=0.7),
        [x("n", 6, low=-2, high=2), x("n", 6, low=-2, high=2)], id="huber-mean"),
    Row("Minimum", lambda p, t: cg.losses.huber(p, t, delta=1.5, reduction="none"),
        lambda p, t: F.huber_loss(p, t, delta=1.5, reduction="none"),
        [x("n", 2, 3, low=-4, high=4), x("n", 2, 3, low=-4, high=4)], id="huber-none", variants=ZERO),
    Row("Minimum", lambda p, t: cg.losses.huber(p, t, reduction="sum"),
        lambda p, t: F.huber_loss(p, t, reduction="sum"), [x("n", 5, low=-3, high=3), x("n", 5, low=-3, high=3)],
        id="huber-sum", variants=ZERO),
    Row("Square", lambda a: cg.losses.l2_loss(a), lambda a: (a * a).sum() / 2, [x("n", 3, 2)], id="l2-loss",
        variants=ZERO),
]  # fmt: skip
