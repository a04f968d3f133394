"""Import rows of ONNX's losses: NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss (what a training graph
exported with its loss holds), as a gather of each target's score and sums.

For input ``(N, C, d...)`` and target ``(N, d...)``: each element's loss is
``-input[n, target, d...] * weight[target]`` (weight 1 without one), 0 where
the target is ``ignore_index``. ``none`` keeps them, ``sum`` adds them,
``mean`` divides the sum by the sum of the weights of the targets not
ignored. SoftmaxCrossEntropyLoss takes the log-softmax of its scores over C
first, and gives it as its second output when asked. Half floats are
computed in float32 and rounded once.

Examples
--------
>>> import numpy as np
>>> from onnx import TensorProto, helper
>>> import cellgraph as cg
>>> node = helper.make_node("NegativeLogLikelihoodLoss", ["x", "t"], ["loss"], reduction="sum")
>>> graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
...     helper.make_tensor_value_info("t", TensorProto.INT64, [2])],
...     [helper.make_tensor_value_info("loss", TensorProto.FLOAT, None)])
>>> model = cg.onnx.import_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
>>> float(model(np.array([[-1.0, -2.0, -3.0], [-4.0, -5.0, -6.0]], np.float32), np.array([2, 0])))
7.0
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

import cellgraph as cg
from cellgraph.dataflow.graph import Tensor

from .common import ImportRow
from .import_wrappers import in_float32

if TYPE_CHECKING:
    from .importer import Builder
    from .node_info import NodeInfo

REDUCTIONS = ("none", "sum", "mean")


def _nll(n: NodeInfo, scores: Tensor, target: Tensor, weight: Tensor | None) -> Tensor:
    """The loss of log-probabilities ``scores`` (N, C, d...) at ``target`` (N, d...), as the node's attributes say."""
    target = cg.cast(target, "int64")
    ignore = n.attrs.get("ignore_index")
    if ignore is not None:
        kept = cg.not_equal(target, cg.constant(np.array(int(ignore), np.int64), dtype="int64"))
        target = cg.where(kept, target, cg.zeros_like(target))  # an ignored target reads class 0, weighted 0 below
    picked = cg.gather(scores, target, axis=1, batch_dims=1) if len(scores.shape) == 2 else _pick(scores, target)
    w = cg.ones_like(picked) if weight is None else cg.gather(weight, target)
    if ignore is not None:
        w = cg.where(kept, w, cg.zeros_like(w))
    losses = -picked * w
    reduction = n.text("reduction")
    if reduction == "none":
        return losses
    total = cg.reduce_sum(losses)
    return total if reduction == "sum" else total / cg.reduce_sum(w)


def _pick(scores: Tensor, target: Tensor) -> Tensor:
    """``scores[n, target[n, d...], d...]`` for a rank > 2: the class axis moved last, then one gather per element."""
    rank = len(scores.shape)
    last = cg.transpose(scores, [0, *range(2, rank), 1])  # (N, d..., C)
    return cg.gather(last, target, axis=rank - 1, batch_dims=rank - 1)


def _negative_log_likelihood(b: Builder, n: NodeInfo) -> list[Tensor]:
    ins = b.ins(n)
    return [_nll(n, ins[0], ins[1], ins[2] if len(ins) > 2 else None)]


def _softmax_cross_entropy(b: Builder, n: NodeInfo) -> list[Tensor]:
    ins = b.ins(n)
    log_prob = cg.log_softmax(ins[0], axis=1)
    loss = _nll(n, log_prob, ins[1], ins[2] if len(ins) > 2 else None)
    return [loss, log_prob] if len([o for o in n.outputs if o]) > 1 else [loss]


def _check_loss(n: NodeInfo) -> str | None:
    reduction = n.text("reduction")
    if reduction not in REDUCTIONS:
        return f"{n.op} with reduction {reduction!r} (ONNX's are {', '.join(REDUCTIONS)})"
    shape = n.shape(0)
    if shape is None or len(shape) < 2:
        return f"{n.op} of scores of unknown rank or without a class axis"
    return None


_ATTRS: dict[str, Any] = {"reduction": "mean", "ignore_index": None}

LOSSES: dict[str, ImportRow] = {
    "NegativeLogLikelihoodLoss": ImportRow(in_float32(_negative_log_likelihood), _ATTRS, check=_check_loss, since=12),
    "SoftmaxCrossEntropyLoss":   ImportRow(in_float32(_softmax_cross_entropy), _ATTRS, check=_check_loss, since=12),
}  # fmt: skip
