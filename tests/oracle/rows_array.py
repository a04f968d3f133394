"""Oracle rows of ops/array_more.py (split, unstack, stack, tile, broadcast_to, reverse)
and ops/array_index.py (gather_nd, scatter_nd).

Rows follow ``rows.py``'s conventions and are appended to its ``ROWS``.
TileGrad, the internal gradient of Tile, is said in torch as the adjoint of
``Tensor.repeat`` (the sum of the tiles).
"""

from __future__ import annotations

from typing import Any

import numpy as np

import cellgraph as cg
from cellgraph.dataflow.ops import array_index
from cellgraph.dataflow.ops.base import apply

from .rows import ZERO, Row, fixed, x

try:
    import torch
except ImportError:  # the comparisons skip (test_ops.py); the table still loads
    torch = None  # type: ignore[assignment]


def _untile(g: Any, like: Any, multiples: tuple[int, ...]) -> Any:
    """The sum of ``g``'s tiles, each shaped like ``like``: torch's adjoint of ``like.repeat(multiples)``."""
    pairs = [n for d, m in zip(like.shape, multiples) for n in (m, d)]
    return g.reshape(pairs).sum(tuple(range(0, len(pairs), 2)))


def _scatter_reduce_rows(t: Any, i: Any, u: Any, reduce: str) -> Any:
    """``t`` with each row ``u[k]`` folded into row ``i[k, 0]`` by "amax" or "amin" (ties share the gradient)."""
    return t.scatter_reduce(0, i.long().expand(-1, t.shape[1]), u, reduce, include_self=True)


def _gather_nd(p: Any, i: Any) -> Any:
    return p[tuple(i.long().unbind(-1))]


def _scatter_nd(i: Any, u: Any, shape: tuple[int, ...]) -> Any:
    """Zeros with ``u`` added at ``i``'s rows: torch's ``index_put`` with accumulate (repeats sum)."""
    return torch.zeros(shape, dtype=u.dtype).index_put(tuple(i.long().unbind(-1)), u, accumulate=True)


def _batch_take(p: Any, i: Any, axis: int) -> Any:
    """``cg.gather(p, i, axis, batch_dims=1)`` in torch: ``index_select`` batch by batch."""
    shape = tuple(p.shape[1:axis]) + tuple(i.shape[1:]) + tuple(p.shape[axis + 1 :])
    return torch.stack([p[b].index_select(axis - 1, i[b].long().reshape(-1)).reshape(shape) for b in range(len(p))])


def _batch_put(u: Any, i: Any, like: Any, axis: int) -> Any:
    """The adjoint of ``_batch_take``: ``index_add`` into zeros, batch by batch (repeats sum)."""
    flat = tuple(like.shape[1:axis]) + (-1,) + tuple(like.shape[axis + 1 :])
    return torch.stack([
        torch.zeros_like(like[b]).index_add(axis - 1, i[b].long().reshape(-1), u[b].reshape(flat))
        for b in range(len(like))
    ]) + 0 * like.sum()  # fmt: skip


def _symmetric(t: Any, before: int, after: int) -> Any:
    """SYMMETRIC padding of the last axis (torch has reflect only): the edge repeated in the mirror."""
    return torch.cat([t[..., :before].flip(-1), t, t[..., t.shape[-1] - after :].flip(-1)], -1)


def _reflect_adjoint(g: Any, shape: tuple[int, ...], pad: tuple[int, int]) -> Any:
    """MirrorPad's gradient said in torch: the vector-Jacobian product of ``F.pad(mode="reflect")``,
    kept differentiable in ``g``."""
    x0 = torch.zeros(shape, dtype=g.dtype, requires_grad=True)
    (dx,) = torch.autograd.grad(torch.nn.functional.pad(x0, pad, mode="reflect"), x0, g, create_graph=True)
    return dx


BATCH_IDS = np.array([[2, 0, 2], [1, 1, 0]], np.int32)
PAIRS = np.array([[2, 1], [0, 3], [2, 1]], np.int32)  # a repeated row: gradients and scatters sum

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
    Row("GatherNd", lambda p, i: cg.gather_nd(p, i), _gather_nd, [x(3, 4, "c"), fixed(PAIRS)], variants=({"c": 0},)),
    Row("GatherNd", lambda p, i: cg.gather_nd(p, i), _gather_nd, [x(3, 4), fixed(PAIRS[:, :1].astype(np.int64))],
        id="rows-int64"),
    Row("ScatterNd", lambda i, u: cg.scatter_nd(i, u, (3, 4, 2)), lambda i, u: _scatter_nd(i, u, (3, 4, 2)),
        [fixed(PAIRS), x(3, 2)]),
    Row("ScatterNdLike", lambda i, u, like: array_index._scatter_nd_like(i, u, like),
        lambda i, u, like: _scatter_nd(i, u, tuple(like.shape)) + 0 * like.sum(), [fixed(PAIRS), x(3, "c"), x(3, 4, "c")],
        variants=({"c": 0},)),
    Row("BatchGather", lambda p, i: cg.gather(p, i, batch_dims=1), lambda p, i: _batch_take(p, i, 1),
        [x(2, 3, "c"), fixed(BATCH_IDS)], variants=({"c": 0},)),
    Row("BatchGather", lambda p, i: cg.gather(p, i, axis=2, batch_dims=1), lambda p, i: _batch_take(p, i, 2),
        [x(2, "c", 4), fixed(BATCH_IDS)], id="axis2", variants=({"c": 0},)),
    Row("BatchGatherGrad", lambda u, i, like: apply("BatchGatherGrad", [u, i, like], {"batch_dims": 1, "axis": 1}),
        lambda u, i, like: _batch_put(u, i, like, 1), [x(2, 3, "c"), fixed(BATCH_IDS), x(2, 4, "c")]),
    Row("TensorScatterReduce", lambda t, i, u: cg.tensor_scatter_nd_max(t, i, u),
        lambda t, i, u: _scatter_reduce_rows(t, i, u, "amax"), [x(4, "c"), fixed([[1], [0], [1]]), x(3, "c")],
        id="max", variants=({"c": 0},)),
    Row("TensorScatterReduce", lambda t, i, u: cg.tensor_scatter_nd_min(t, i, u),
        lambda t, i, u: _scatter_reduce_rows(t, i, u, "amin"), [x(4, "c"), fixed([[3], [3]]), x(2, "c")],
        id="min", variants=({"c": 0},)),
    Row("MirrorPad", lambda a: cg.pad(a, ((0, 0), (0, 0), (2, 1)), mode="REFLECT"),
        lambda a: torch.nn.functional.pad(a, (2, 1), mode="reflect"), [x("n", 2, 4)], variants=ZERO),
    Row("MirrorPad", lambda a: cg.pad(a, ((0, 0), (3, 1)), mode="SYMMETRIC"), lambda a: _symmetric(a, 3, 1),
        [x("n", 3)], id="symmetric", variants=ZERO),
    Row("MirrorPadGrad", lambda g: apply("MirrorPadGrad", [g], {"paddings": ((0, 0), (0, 0), (2, 1)), "mode": "REFLECT"}),
        lambda g: _reflect_adjoint(g, (2, 3, 4), (2, 1)), [x(2, 3, 7)]),
    Row("Reshape", lambda a: cg.space_to_depth(a, 2),
        lambda a: a.reshape(-1, 2, 2, 3, 2, 3).permute(0, 1, 3, 2, 4, 5).reshape(-1, 2, 3, 12), [x(2, 4, 6, 3)],
        id="space-to-depth"),
    Row("Reshape", lambda a: cg.depth_to_space(a, 2),
        lambda a: a.reshape(-1, 2, 3, 2, 2, 3).permute(0, 1, 3, 2, 4, 5).reshape(-1, 4, 6, 3), [x(2, 2, 3, 12)],
        id="depth-to-space"),
]  # fmt: skip
