"""Oracle rows of ops/reductions.py: min, prod, logsumexp, and moments (mean and variance).

Any, all, argmax and argmin are not differentiable and give bools or indices,
which the harness cannot weight: the op table checks them against NumPy.
Rows follow ``rows.py``'s conventions and are appended to its ``ROWS``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

import cellgraph as cg

from .rows import ZERO, Row, fixed, x

try:
    import torch
except ImportError:  # the comparisons skip (test_ops.py); the table still loads
    torch = None  # type: ignore[assignment]

# Slots with no zero, one zero and two zeros: each has its own gradient rule.
ZEROS = np.array([[0.5, -1.5, 2.0, 0.8], [0.0, 1.5, -2.0, 0.7], [0.0, 1.2, 0.0, -0.9]])


def _amin(t: Any, dim: int, keepdim: bool = False) -> Any:
    """torch.amin, and over an empty axis the identity of min, +inf (TensorFlow's, ONNX's, cellgraph's)."""
    if t.shape[dim]:
        return t.amin(dim, keepdim=keepdim)
    shape = list(t.shape)
    shape[dim] = 1
    out = torch.full(shape, float("inf"), dtype=t.dtype) + 0 * t.sum(dim, keepdim=True)
    return out if keepdim else out.squeeze(dim)


def _moments(t: Any, dims: tuple[int, ...], keepdim: bool = False) -> Any:
    variance, mean = torch.var_mean(t, dims, correction=0, keepdim=keepdim)
    return mean, variance


REDUCTION_ROWS: list[Row] = [
    Row("ReduceMin", lambda a: cg.reduce_min(a, 1), lambda a: a.amin(1), [x("n", 6)], variants=ZERO),
    Row("ReduceMin", lambda a: cg.reduce_min(a, 0, keepdims=True), lambda a: _amin(a, 0, keepdim=True),
        [x("n", "c")], id="batch-keep", sizes={"n": 4}, variants=ZERO),
    Row("ReduceMin", lambda a: cg.reduce_min(a), lambda a: a.amin(), [x("n", 3)], id="all"),
    Row("ReduceMin", lambda a: cg.reduce_min(a, 1), lambda a: a.amin(1),
        [fixed(np.array([[1.0, -2.0, -2.0, 0.5], [3.0, 3.0, 3.0, 3.0]]))], id="ties-share"),
    Row("ReduceProd", lambda a: cg.reduce_prod(a, 1), lambda a: torch.prod(a, 1), [x("n", 4, low=0.5, high=1.5)],
        variants=ZERO),
    Row("ReduceProd", lambda a: cg.reduce_prod(a, 1, keepdims=True), lambda a: torch.prod(a, 1, keepdim=True),
        [fixed(ZEROS)], id="zeros"),
    Row("ReduceProd", lambda a: cg.reduce_prod(a, 0), lambda a: torch.prod(a, 0), [x("n", 3)], id="batch",
        variants=ZERO),
    Row("ReduceLogSumExp", lambda a: cg.reduce_logsumexp(a, -1), lambda a: torch.logsumexp(a, -1),
        [x("n", "c", low=-3, high=3)], sizes={"c": 5}, variants=({"n": 0}, {"c": 0})),
    Row("ReduceLogSumExp", lambda a: cg.reduce_logsumexp(a, (0, 2), keepdims=True),
        lambda a: torch.logsumexp(a, (0, 2), keepdim=True), [x("n", 3, 2)], id="axes02-keep", variants=ZERO),
    Row("ReduceLogSumExp", lambda a: cg.reduce_logsumexp(a, 1), lambda a: torch.logsumexp(a, 1),
        [x("n", 4, low=700.0, high=800.0)], id="large"),
    Row("ReduceMean", lambda a: cg.moments(a, 0), lambda a: _moments(a, (0,)), [x("n", 4)], id="moments",
        variants=({"n": 1},)),
    Row("ReduceMean", lambda a: cg.moments(a, (0, 1, 2), keepdims=True), lambda a: _moments(a, (0, 1, 2), True),
        [x("n", 3, 3, 2)], id="moments-nhw-keep"),
]  # fmt: skip
