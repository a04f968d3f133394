"""Oracle rows of batched matmul (ops/batch_matmul.py) and the normalizations.

Rows follow ``rows.py``'s conventions and are appended to its ``ROWS``.
"""

from __future__ import annotations

from typing import Any

import cellgraph as cg

from .rows import ZERO, Row, x


def _t(a: Any) -> Any:
    return a.transpose(-1, -2)


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
]  # fmt: skip
