"""Oracle rows of ops/array_more.py: split, unstack, stack, tile, broadcast_to, reverse.

Rows follow ``rows.py``'s conventions and are appended to its ``ROWS``.
TileGrad, the internal gradient of Tile, is said in torch as the adjoint of
``Tensor.repeat`` (the sum of the tiles).
"""

from __future__ import annotations

from typing import Any

import cellgraph as cg
from cellgraph.dataflow.ops.base import apply

from .rows import ZERO, Row, x

try:
    import torch
except ImportError:  # the comparisons skip (test_ops.py); the table still loads
    torch = None  # type: ignore[assignment]


def _untile(g: Any, like: Any, multiples: tuple[int, ...]) -> Any:
    """The sum of ``g``'s tiles, each shaped like ``like``: torch's adjoint of ``like.repeat(multiples)``."""
    pairs = [n for d, m in zip(like.shape, multiples) for n in (m, d)]
    return g.reshape(pairs).sum(tuple(range(0, len(pairs), 2)))


ARRAY_ROWS: list[Row] = [
    Row("Split", lambda a: tuple(cg.split(a, [1, -1, 2], axis=1)), lambda a: torch.split(a, [1, 3, 2], 1),
        [x("n", 6)], variants=ZERO),
    Row("Split", lambda a: tuple(cg.split(a, 2, axis=0)), lambda a: torch.chunk(a, 2, 0), [x(4, "c")], id="count",
        variants=({"c": 0},)),
    Row("Squeeze", lambda a: tuple(cg.unstack(a, axis=1)), lambda a: torch.unbind(a, 1), [x("n", 3, "c")],
        id="unstack", variants=ZERO),
    Row("Concat", lambda a, b: cg.stack([a, b], axis=1), lambda a, b: torch.stack([a, b], 1), [x("n", 3), x("n", 3)],
        id="stack", variants=ZERO),
    Row("Tile", lambda a: cg.tile(a, (2, 3)), lambda a: a.repeat(2, 3), [x("n", 2)], variants=ZERO),
    Row("Tile", lambda a: cg.tile(a, (1, 2, 2)), lambda a: a.repeat(1, 2, 2), [x("n", 1, 3)], id="rank3"),
    Row("TileGrad", lambda g, a: apply("TileGrad", [g, a], {"multiples": (3, 2)}),
        lambda g, a: _untile(g, a, (3, 2)), [x(6, 4), x(2, 2)]),
    Row("BroadcastTo", lambda a: cg.broadcast_to(a, (2, 3, 4)), lambda a: a.expand(2, 3, 4), [x(3, 1)]),
    Row("BroadcastTo", lambda a: cg.broadcast_to(a, (5, 4)), lambda a: a.expand(5, 4), [x(4)], id="leading"),
    Row("StridedSlice", lambda a: cg.reverse(a, [0, 2]), lambda a: torch.flip(a, (0, 2)), [x("n", 2, 3)],
        id="reverse", variants=ZERO),
]  # fmt: skip
