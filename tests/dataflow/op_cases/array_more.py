"""Rows for ``ops/array_more.py``: Split, Tile, TileGrad, BroadcastTo, and the
compositions (stack, unstack, reverse) as rows of the op each one ends in."""

from __future__ import annotations

import numpy as np

import cellgraph as cg
from cellgraph.dataflow.ops.base import apply

from . import OpCase, rand

x234 = rand(2, 3, 4, seed=3)
ids = np.array([[2, 0, 5], [1, 1, 3]], np.int32)


def _tile_grad(g: cg.Tensor, x: cg.Tensor, multiples: tuple[int, ...]) -> cg.Tensor:
    return apply("TileGrad", [g, x], {"multiples": multiples})


def _mirror_grad(g: cg.Tensor, paddings: tuple, mode: str) -> cg.Tensor:
    return apply("MirrorPadGrad", [g], {"paddings": paddings, "mode": mode})


CASES = [
    # ------------------------------------------------------------ Split
    OpCase("Split", lambda x: cg.split(x, 2, axis=2)[1], [x234], id="count"),
    OpCase("Split", lambda x: cg.split(x, [1, -1, 1], axis=1)[1], [rand(2, 5, seed=1)], id="sizes-rest"),
    OpCase("Split", lambda x: cg.split(x, [1, 2], axis=0)[0], [rand(3, 4, seed=4)], static_shapes=[(None, 4)],
           id="sizes-unknown-dim"),
    OpCase("Split", lambda x: cg.split(x, 3, axis=-1)[2], [rand(4, 6, seed=2)], static_shapes=[(4, None)],
           id="count-unknown-dim"),
    OpCase("Split", lambda x: cg.split(x, 1)[0], [rand(3)], id="one-piece"),
    OpCase("Split", lambda x: cg.split(x, [2, 1], axis=1)[0], [ids], grad=False, id="int32"),
    OpCase("Squeeze", lambda x: cg.unstack(x, axis=1)[2], [x234], id="unstack"),
    OpCase("Squeeze", lambda x: cg.unstack(x, num=2)[1], [rand(2, 3)], static_shapes=[(None, 3)],
           id="unstack-num-unknown"),
    # ------------------------------------------------------- stack (Concat)
    OpCase("Concat", lambda a, b, c: cg.stack([a, b, c], axis=1), [rand(2, 3, seed=i) for i in range(3)], id="stack"),
    OpCase("Concat", lambda a, b: cg.stack([a, b], axis=-1), [rand(2, 3), rand(2, 3, seed=1)],
           static_shapes=[(None, 3), (2, None)], id="stack-last-unknown"),
    OpCase("Concat", lambda a, b: cg.stack([a, b]), [np.float32(1.5), np.float32(-2.0)], id="stack-scalars"),
    # --------------------------------------------------- Tile, TileGrad
    OpCase("Tile", lambda x: cg.tile(x, (2, 1, 3)), [x234]),
    OpCase("Tile", lambda x: cg.tile(x, (3, 2)), [rand(2, 3)], static_shapes=[(None, 3)], id="unknown-batch"),
    OpCase("Tile", lambda x: cg.tile(x, (1, 0)), [rand(2, 3)], id="zero-multiple"),
    OpCase("Tile", lambda x: cg.tile(x, ()), [np.float32(0.5)], id="rank0"),
    OpCase("Tile", lambda x: cg.tile(x, (2, 2)), [ids], grad=False, id="int32"),
    OpCase("TileGrad", lambda g, x: _tile_grad(g, x, (2, 1, 3)), [rand(4, 3, 12), x234], wrt=(0,)),
    OpCase("TileGrad", lambda g, x: _tile_grad(g, x, (3, 2)), [rand(6, 6), rand(2, 3)],
           static_shapes=[(None, None), (None, 3)], wrt=(0,), id="unknown-dims"),
    # ------------------------------------------------------------ BroadcastTo
    OpCase("BroadcastTo", lambda x: cg.broadcast_to(x, (2, 3, 4)), [rand(3, 1)]),
    OpCase("BroadcastTo", lambda x: cg.broadcast_to(x, (2, 3)), [rand(2, 3)], id="same-shape"),
    OpCase("BroadcastTo", lambda x: cg.broadcast_to(x, (4, 2, 3)), [rand(1, 3)], static_shapes=[(None, 3)],
           id="unknown-dim"),
    OpCase("BroadcastTo", lambda x: cg.broadcast_to(x, (3, 2)), [np.float32(2.5)], id="scalar"),
    OpCase("BroadcastTo", lambda x: cg.broadcast_to(x, (2, 3, 0)), [rand(3, 1)], id="to-empty"),
    OpCase("BroadcastTo", lambda x: cg.broadcast_to(x, (2, 2, 3)), [ids], grad=False, id="int32"),
    # ------------------------------------------------ reverse (StridedSlice)
    OpCase("StridedSlice", lambda x: cg.reverse(x, [0, -1]), [x234], id="reverse"),
    OpCase("StridedSlice", lambda x: cg.reverse(x, 1), [x234], static_shapes=[(None, 3, None)],
           id="reverse-unknown-dims"),
    # ------------------------- space_to_depth, depth_to_space (Reshape last)
    OpCase("Reshape", lambda x: cg.space_to_depth(x, 2), [rand(2, 4, 6, 3, seed=5)], id="space-to-depth"),
    OpCase("Reshape", lambda x: cg.depth_to_space(x, 2), [rand(2, 2, 3, 8, seed=6)], id="depth-to-space"),
    OpCase("Reshape", lambda x: cg.space_to_depth(x, 3), [rand(1, 3, 3, 1, seed=7)], id="space-to-depth-one-block"),
    # --------------------------------------------- MirrorPad, MirrorPadGrad
    OpCase("MirrorPad", lambda x: cg.pad(x, ((1, 1), (0, 0), (3, 1)), mode="REFLECT"), [x234]),
    OpCase("MirrorPad", lambda x: cg.pad(x, ((2, 1), (3, 0)), mode="symmetric"), [rand(2, 3)], id="symmetric-whole"),
    OpCase("MirrorPad", lambda x: cg.pad(x, ((0, 0), (2, 2), (1, 1)), mode="SYMMETRIC"), [x234],
           static_shapes=[(None, 3, None)], id="symmetric-unknown-dims"),
    OpCase("MirrorPad", lambda x: cg.pad(x, ((1, 1),), mode="REFLECT"), [ids[0]], grad=False, id="int32"),
    OpCase("MirrorPadGrad", lambda g: _mirror_grad(g, ((1, 2), (3, 1)), mode="REFLECT"), [rand(6, 8)]),
    OpCase("MirrorPadGrad", lambda g: _mirror_grad(g, ((2, 1), (3, 0)), mode="SYMMETRIC"), [rand(5, 6)],
           static_shapes=[(None, 6)], id="symmetric-unknown"),
    OpCase("MirrorPadGrad", lambda g: _mirror_grad(g, ((0, 0), (2, 1)), mode="REFLECT"), [rand(3, 7)],
           id="one-axis"),
]  # fmt: skip
