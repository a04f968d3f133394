"""Oracle rows of ops/cumulative.py: cumsum and cumprod with every flag, and einsum.

PyTorch has no exclusive or reverse scan, so the torch side says them with
flips and a shift (``_scan``); cumprod's rows hold zeros, where PyTorch's
gradient (like cellgraph's CumprodGrad) is exact. Einsum is a composition of
ops with rows of their own; its rows check the compositions the Transformer
uses against ``torch.einsum``. Rows follow ``rows.py``'s conventions.
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

# One zero in the first row, two in the second: the cases a division-based rule gets wrong.
ZEROS = np.array([[0.5, -1.5, 0.0, 0.8, 1.1], [0.0, 1.5, -2.0, 0.0, 0.7]])


def _scan(t: Any, dim: int, product: bool = False, exclusive: bool = False, reverse: bool = False) -> Any:
    if reverse:
        t = torch.flip(t, [dim])
    y = torch.cumprod(t, dim) if product else torch.cumsum(t, dim)
    if exclusive:
        first = torch.ones_like(y.narrow(dim, 0, 1)) if product else torch.zeros_like(y.narrow(dim, 0, 1))
        y = torch.cat([first, y.narrow(dim, 0, y.shape[dim] - 1)], dim)
    return torch.flip(y, [dim]) if reverse else y


CUMULATIVE_ROWS: list[Row] = [
    Row("Cumsum", lambda a: cg.cumsum(a, 1), lambda a: torch.cumsum(a, 1), [x("n", 5)], variants=ZERO),
    Row("Cumsum", lambda a: cg.cumsum(a, 0, exclusive=True), lambda a: _scan(a, 0, exclusive=True), [x("n", 3)],
        id="exclusive-batch", sizes={"n": 4}),
    Row("Cumsum", lambda a: cg.cumsum(a, -1, exclusive=True, reverse=True),
        lambda a: _scan(a, 2, exclusive=True, reverse=True), [x("n", 2, 4)], id="exclusive-reverse", variants=ZERO),
    Row("Cumprod", lambda a: cg.cumprod(a, 1), lambda a: torch.cumprod(a, 1), [x("n", 5, low=0.5, high=1.5)],
        variants=ZERO),
    Row("Cumprod", lambda a: cg.cumprod(a, 1), lambda a: torch.cumprod(a, 1), [fixed(ZEROS)], id="zeros"),
    Row("Cumprod", lambda a: cg.cumprod(a, 1, exclusive=True, reverse=True),
        lambda a: _scan(a, 1, product=True, exclusive=True, reverse=True), [fixed(ZEROS)], id="zeros-exclusive-reverse"),
    Row("Cumprod", lambda a: cg.cumprod(a, 0, reverse=True), lambda a: _scan(a, 0, product=True, reverse=True),
        [x("n", 3)], id="reverse-batch", sizes={"n": 4}),
    Row("BatchMatMul", lambda q, k: cg.einsum("bqhd,bkhd->bhqk", q, k),
        lambda q, k: torch.einsum("bqhd,bkhd->bhqk", q, k), [x("n", 3, 2, 4), x("n", 5, 2, 4)], id="einsum-scores",
        variants=ZERO),
    Row("Transpose", lambda p, v: cg.einsum("bhqk,bkhd->bqhd", p, v),
        lambda p, v: torch.einsum("bhqk,bkhd->bqhd", p, v), [x("n", 2, 3, 5), x("n", 5, 2, 4)], id="einsum-values",
        variants=ZERO),
]  # fmt: skip

CUMULATIVE_ROWS += [
    Row("TopK", lambda a: cg.top_k(a, 3)[0], lambda a: torch.topk(a, 3).values, [x("n", 6)], id="values"),
    Row("TopK", lambda a: cg.top_k(a, 2)[0], lambda a: torch.topk(a, 2).values, [x("n", 2, 5)], id="rank3",
        variants=ZERO),
]  # fmt: skip


def _interpolate(t: Any, size: tuple[int, int], mode: str) -> Any:
    extra = {"align_corners": False} if mode == "bilinear" else {}
    nchw = torch.nn.functional.interpolate(t.permute(0, 3, 1, 2), size=size, mode=mode, **extra)
    return nchw.permute(0, 2, 3, 1)


# cg.resize (ops/resize.py) ends in an Add (bilinear) or a Gather (nearest, PyTorch's "nearest-exact").
CUMULATIVE_ROWS += [
    Row("Add", lambda a: cg.resize(a, (7, 3)), lambda a: _interpolate(a, (7, 3), "bilinear"), [x("n", 4, 5, 2)],
        id="resize-bilinear", variants=ZERO),
    Row("Gather", lambda a: cg.resize(a, (2, 6), "nearest"), lambda a: _interpolate(a, (2, 6), "nearest-exact"),
        [x("n", 5, 4, 3)], id="resize-nearest", variants=ZERO),
]  # fmt: skip
