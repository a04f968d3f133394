"""Oracle rows of batched matmul (ops/batch_matmul.py) and the normalizations.

Rows follow ``rows.py``'s conventions and are appended to its ``ROWS``.
"""

from __future__ import annotations

from typing import Any

import cellgraph as cg
from cellgraph.dataflow.ops.base import apply_node
from cellgraph.dataflow.ops.normalization import fused_batch_norm

from .rows import ZERO, Row, pos, x

try:
    import torch
    import torch.nn.functional as F  # noqa: N812 - PyTorch's own spelling
except ImportError:  # the comparisons skip (test_ops.py); the table still loads
    torch = F = None  # type: ignore[assignment]


def _t(a: Any) -> Any:
    return a.transpose(-1, -2)


def _bn_train_nhwc(a: Any, w: Any, b: Any, eps: float) -> Any:
    """torch's batch norm takes channels at dim 1: move NHWC's last dim there and back."""
    return F.batch_norm(a.permute(0, 3, 1, 2), None, None, w, b, True, 0.0, eps).permute(0, 2, 3, 1)


def _bn_eval(a: Any, w: Any, b: Any, mean: Any, var: Any, eps: float) -> Any:
    # F.batch_norm's inference formula, written out: torch gives no gradient for the running statistics.
    return (a - mean) / torch.sqrt(var + eps) * w + b


def _bn_with_moments(a: Any, w: Any, b: Any, eps: float) -> Any:
    """y, the batch mean and the biased batch variance, over every dim but 1 (the channels)."""
    variance, mean = torch.var_mean(a, (0, 2, 3), correction=0)
    return F.batch_norm(a, None, None, w, b, True, 0.0, eps), mean, variance


def _layer_norm_grad(begin: int, eps: float) -> Any:
    def build(dy: Any, a: Any, w: Any) -> Any:
        node = apply_node("LayerNormGrad", [dy, a, w], {"axis": begin, "begin_axis": begin, "epsilon": eps})
        return node.output(0), node.output(1), node.output(2)

    return build


def _torch_layer_norm_grad(dy: Any, a: Any, w: Any, eps: float) -> Any:
    """(dx, dgamma, dbeta) of layer_norm over ``w``'s dims by torch's autograd, kept differentiable."""
    b = torch.zeros_like(w, requires_grad=True)
    return torch.autograd.grad(F.layer_norm(a, w.shape, w, b, eps), (a, w, b), dy, create_graph=True)


def _batch_norm_grad(axis: int, eps: float) -> Any:
    def build(dy: Any, a: Any, w: Any, mean: Any, var: Any) -> Any:
        attrs = {"axis": axis, "channel_axis": axis, "epsilon": eps}
        node = apply_node("BatchNormGrad", [dy, a, w, mean, var], attrs)
        return node.output(0), node.output(1), node.output(2)

    return build


def _torch_batch_norm_grad(dy: Any, a: Any, w: Any, mean: Any, var: Any, eps: float) -> Any:
    """Batch norm's (dx, dgamma, dbeta) with the statistics given (channels last): y = (a - mean) rstd w + b,
    where mean and var are the batch's, so dx carries their dependence on a."""
    axes = tuple(range(a.ndim - 1))
    rstd = (var + eps) ** -0.5
    xhat = (a - mean) * rstd
    dbeta, dgamma = dy.sum(axes), (dy * xhat).sum(axes)
    count = a.numel() // a.shape[-1]
    return w * rstd * (dy - dbeta / count - xhat * dgamma / count), dgamma, dbeta


def _batch_norm(training: Any, axis: int = -1, eps: float = 1e-3) -> Any:
    def build(a: Any, w: Any, b: Any, mean: Any, var: Any) -> Any:
        return cg.batch_norm(a, w, b, mean, var, training=training, epsilon=eps, axis=axis)

    return build


NN_MORE_ROWS: list[Row] = [
    # ----------------------------------------------------------- batch matmul
    Row("BatchMatMul", lambda a, b: a @ b, lambda a, b: a @ b, [x("n", 3, 4), x("n", 4, 2)],
        variants=({"n": 0},)),
    Row("BatchMatMul", lambda a, b: a @ b, lambda a, b: a @ b, [x("n", 1, 3, "k"), x(2, "k", 5)],
        id="broadcast-batch", sizes={"k": 4}, variants=({"n": 0}, {"k": 0})),
    Row("BatchMatMul", lambda a, b: a @ b, lambda a, b: a @ b, [x("n", "t", 4), x(4, 3)], id="dense",
        variants=({"n": 0}, {"t": 0})),
    Row("BatchMatMul", lambda a, b: a @ b, lambda a, b: a @ b, [x(3, 4), x("n", 4, 2)], id="matrix-at-batch",
        variants=ZERO),
    Row("BatchMatMul", lambda a, b: cg.matmul(a, b, transpose_b=True), lambda a, b: a @ _t(b),
        [x("n", 2, 3, 4), x("n", 2, 5, 4)], id="tb-attention", variants=ZERO),
    Row("BatchMatMul", lambda a, b: cg.matmul(a, b, transpose_a=True), lambda a, b: _t(a) @ b,
        [x("n", 4, 3), x(1, 4, 2)], id="ta-broadcast", variants=ZERO),
    Row("BatchMatMul", lambda a, b: cg.matmul(a, b, transpose_a=True, transpose_b=True), lambda a, b: _t(a) @ _t(b),
        [x(2, 4, 3), x(5, 4)], id="ta-tb-matrix"),
    # ------------------------------------------------------- normalization
    Row("LayerNorm", lambda a, w, b: cg.layer_norm(a, w, b), lambda a, w, b: F.layer_norm(a, (5,), w, b, 1e-5),
        [x("n", 5), x(5), x(5)], variants=ZERO, rtol=1e-8, atol=1e-9),
    Row("LayerNorm", lambda a, w, b: cg.layer_norm(a, w, b, begin_axis=1, epsilon=1e-3),
        lambda a, w, b: F.layer_norm(a, (3, 4), w, b, 1e-3), [x("n", 3, 4), x(3, 4), x(3, 4)], id="last-two",
        variants=ZERO, rtol=1e-8, atol=1e-9),
    Row("LayerNorm", lambda a, w, b: cg.layer_norm(a, w, b), lambda a, w, b: F.layer_norm(a, (4,), w, b, 1e-5),
        [x(2, "t", 4, low=50.0, high=51.0), x(4), x(4)], id="offset-rows", sizes={"t": 3}, rtol=1e-7, atol=1e-8),
    # batch_norm in training is a FusedBatchNorm; in inference Rsqrt and elementwise arithmetic.
    Row("FusedBatchNorm", _batch_norm(True), lambda a, w, b, m, v: F.batch_norm(a, None, None, w, b, True, 0.0, 1e-3),
        [x("n", 3), x(3), x(3), x(3), pos(3)], id="batch-norm-training", variables=(3, 4), sizes={"n": 4},
        unit=False, rtol=1e-8, atol=1e-9),
    Row("FusedBatchNorm", _batch_norm(True), lambda a, w, b, m, v: _bn_train_nhwc(a, w, b, 1e-3),
        [x("n", 2, 3, 4), x(4), x(4), x(4), pos(4)], id="batch-norm-training-nhwc", variables=(3, 4),
        unit=False, rtol=1e-8, atol=1e-9),
    Row("Rsqrt", _batch_norm(False, axis=1), lambda a, w, b, m, v: _bn_eval(a.permute(0, 2, 1), w, b, m, v, 1e-3)
        .permute(0, 2, 1), [x("n", 3, 2), x(3), x(3), x(3), pos(3)], id="batch-norm-inference-nch",
        variables=(3, 4), variants=ZERO),
    Row("FusedBatchNorm", lambda a, w, b: fused_batch_norm(a, w, b, epsilon=1e-2, axis=1),
        lambda a, w, b: _bn_with_moments(a, w, b, 1e-2), [x("n", 3, 2, 2), x(3), x(3)], id="outputs-nchw",
        sizes={"n": 2}, unit=False, rtol=1e-8, atol=1e-9),
    # The normalizations' gradient ops, differentiated through their math in primitive ops (a gradient penalty).
    Row("LayerNormGrad", _layer_norm_grad(1, 1e-3), lambda dy, a, w: _torch_layer_norm_grad(dy, a, w, 1e-3),
        [x("n", 3, 4), x("n", 3, 4), x(3, 4)], variants=ZERO, rtol=1e-8, atol=1e-9),
    Row("BatchNormGrad", _batch_norm_grad(2, 1e-3),
        lambda dy, a, w, m, v: _torch_batch_norm_grad(dy, a, w, m, v, 1e-3),
        [x("n", 2, 3), x("n", 2, 3), x(3), x(3), pos(3)], sizes={"n": 2}, unit=False, rtol=1e-8, atol=1e-9),
]  # fmt: skip
