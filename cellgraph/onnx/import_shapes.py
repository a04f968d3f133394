"""Import rows of ONNX's rearranging ops, computed by cellgraph's slicing, reshaping and masking:
Split, Trilu, SpaceToDepth, DepthToSpace, OneHot, Hardmax, and Range and ConstantOfShape of known inputs.

Each needs the sizes it rearranges to be known when the graph is built
(cellgraph's shapes are static); a row's check says which one is not.

Examples
--------
>>> import numpy as np
>>> from onnx import TensorProto, helper
>>> import cellgraph as cg
>>> node = helper.make_node("Trilu", ["x"], ["y"], upper=0)
>>> graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 3])],
...                           [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
>>> model = cg.onnx.import_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
>>> model(np.ones((3, 3), np.float32))
array([[1., 0., 0.],
       [1., 1., 0.],
       [1., 1., 1.]], dtype=float32)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

import cellgraph as cg
from cellgraph.dataflow.dtypes import COMPUTE_DTYPE
from cellgraph.dataflow.graph import Tensor
from cellgraph.dataflow.ops import math_unary as mu

from .common import ImportRow
from .import_wrappers import check_coerced, coerced_to_2d

if TYPE_CHECKING:
    from .importer import Builder
    from .node_info import NodeInfo


def _static_dims(n: NodeInfo, what: str, dims: slice) -> str | None:
    shape = n.shape(0)
    if shape is None or None in shape[dims]:
        return f"{n.op} whose {what} is unknown until the graph runs"
    return None


def _known_output(b: Builder, n: NodeInfo) -> list[Tensor]:
    return [b.tensor(n.outputs[0])]


# ---------------------------------------------------------------------- Split
def _split_sizes(n: NodeInfo) -> list[int]:
    shape = n.shape(0)
    assert shape is not None
    axis = int(n.attrs["axis"]) % len(shape)
    size = int(shape[axis])  # type: ignore[arg-type]
    given = n.static_value(1)
    if given is not None:
        return [int(s) for s in given]
    parts = int(n.attrs["num_outputs"] or len(n.outputs))
    chunk = -(-size // parts)  # ONNX: equal chunks of ceil(size / n), the last one smaller
    return [min(chunk, size - i * chunk) for i in range(parts)]


def _split(b: Builder, n: NodeInfo) -> list[Tensor]:
    x = b.ins(n)[0]
    axis = int(n.attrs["axis"]) % len(x.shape)
    out, start = [], 0
    for size in _split_sizes(n):
        key = tuple(slice(start, start + size) if i == axis else slice(None) for i in range(len(x.shape)))
        out.append(x[key])
        start += size
    return out


def _check_split(n: NodeInfo) -> str | None:
    shape = n.shape(0)
    if shape is None or shape[int(n.attrs["axis"]) % len(shape)] is None:
        return "Split along an axis whose size is unknown until the graph runs"
    return None


# ---------------------------------------------------------------------- Trilu
def _trilu(b: Builder, n: NodeInfo) -> list[Tensor]:
    x = b.ins(n)[0]
    rows, cols = (int(d) for d in x.shape[-2:])  # type: ignore[arg-type]
    k = n.static_value(1)
    offset = int(k[0]) if k is not None else 0
    ones = np.ones((rows, cols), bool)
    mask = np.triu(ones, offset) if n.attrs["upper"] else np.tril(ones, offset)
    return [mu.where(cg.constant(mask), x, cg.zeros_like(x))]


# --------------------------------------------------- SpaceToDepth, DepthToSpace
def _mode(n: NodeInfo) -> str:
    return n.text("mode")


def _space_to_depth(b: Builder, n: NodeInfo) -> list[Tensor]:
    x, s = b.ins(n)[0], int(n.attrs["blocksize"])
    c, h, w = (int(d) for d in x.shape[1:])  # type: ignore[arg-type]
    blocks = cg.reshape(x, (-1, c, h // s, s, w // s, s))
    # DCR puts the block offset before the channel in the new channel index, CRD after it.
    perm = (0, 3, 5, 1, 2, 4) if _mode(n) == "DCR" else (0, 1, 3, 5, 2, 4)
    return [cg.reshape(cg.transpose(blocks, perm), (-1, c * s * s, h // s, w // s))]


def _depth_to_space(b: Builder, n: NodeInfo) -> list[Tensor]:
    x, s = b.ins(n)[0], int(n.attrs["blocksize"])
    c, h, w = (int(d) for d in x.shape[1:])  # type: ignore[arg-type]
    if _mode(n) == "DCR":
        blocks, perm = cg.reshape(x, (-1, s, s, c // (s * s), h, w)), (0, 3, 4, 1, 5, 2)
    else:
        blocks, perm = cg.reshape(x, (-1, c // (s * s), s, s, h, w)), (0, 1, 4, 2, 5, 3)
    return [cg.reshape(cg.transpose(blocks, perm), (-1, c // (s * s), h * s, w * s))]


def _check_blocks(n: NodeInfo) -> str | None:
    return _static_dims(n, "channels, height or width", slice(1, None)) if n.rank(0) == 4 else "a non-4-D input"


# ------------------------------------------------------------- OneHot, Hardmax
def _move_last(t: Tensor, axis: int) -> Tensor:
    """``t`` with its last axis moved to ``axis`` (a position in the result)."""
    rank = len(t.shape)
    axis %= rank
    if axis == rank - 1:
        return t
    perm = [*range(axis), rank - 1, *range(axis, rank - 1)]
    return cg.transpose(t, perm)


def _one_hot(b: Builder, n: NodeInfo) -> list[Tensor]:
    indices = cg.cast(b.ins(n)[0], "int64")
    depth = int(np.asarray(b.static(n.inputs[1])).reshape(-1)[0])
    values = np.asarray(b.static(n.inputs[2]))
    dtype = values.dtype.name
    # Python scalars for the attributes: a bfloat16 scalar's item() is still a bfloat16.
    off, on = (v.item() for v in values.reshape(-1)[:2].astype(COMPUTE_DTYPE.get(dtype, dtype)))
    # ONNX counts a negative index from the end; beyond [-depth, depth) the row is all off_value.
    below = cg.cast(cg.less(indices, cg.zeros_like(indices)), "int64")
    y = cg.one_hot(indices + below * depth, depth, on_value=on, off_value=off, dtype=dtype)
    return [_move_last(y, int(n.attrs["axis"]))]


def _hardmax(b: Builder, n: NodeInfo) -> list[Tensor]:
    x = b.ins(n)[0]
    axis = int(n.attrs["axis"]) % len(x.shape)
    hot = cg.one_hot(cg.argmax(x, axis=axis), int(x.shape[axis]), dtype=x.dtype)  # type: ignore[arg-type]
    return [_move_last(hot, axis)]


def _check_hardmax(n: NodeInfo) -> str | None:
    shape = n.shape(0)
    if shape is None or shape[int(n.attrs["axis"]) % len(shape)] is None:
        return "Hardmax along an axis whose size is unknown until the graph runs"
    return None


# ------------------------------------------------------- Range, ConstantOfShape
def _range_value(n: NodeInfo) -> np.ndarray | None:
    values = [n.static_value(i, shaped=True) for i in range(3)]
    if any(v is None for v in values):
        return None
    start, limit, delta = (np.asarray(v) for v in values)
    return np.arange(start.item(), limit.item(), delta.item()).astype(start.dtype)


def _constant_of_shape_value(n: NodeInfo) -> np.ndarray | None:
    shape = n.static_value(0)
    if shape is None:
        return None
    fill = constant_of_shape_fill(n.attrs["value"])
    return np.full([int(d) for d in shape], fill.reshape(-1)[0], dtype=fill.dtype)


def constant_of_shape_fill(value: Any) -> np.ndarray:
    """ConstantOfShape's fill: its ``value`` attribute (a one-element TensorProto), float32 0 without one."""
    from .importer_checks import tensor_array

    return np.zeros(1, np.float32) if value is None else tensor_array(value, "ConstantOfShape's attribute 'value'")


def _mode_check(valid: tuple[str, ...]) -> Any:
    return lambda n: None if _mode(n) in valid else f"{n.op} mode {_mode(n)!r}"


SHAPES: dict[str, ImportRow] = {
    "Split":           ImportRow(_split, {"axis": 0, "num_outputs": None}, (1,), _check_split),
    "Trilu":           ImportRow(_trilu, {"upper": 1}, (1,),
                                 lambda n: _static_dims(n, "last two dims", slice(-2, None))),
    "SpaceToDepth":    ImportRow(_space_to_depth, {"blocksize": None, "mode": "DCR"},
                                 check=lambda n: _check_blocks(n) or _mode_check(("DCR", "CRD"))(n)),
    "DepthToSpace":    ImportRow(_depth_to_space, {"blocksize": None, "mode": "DCR"},
                                 check=lambda n: _check_blocks(n) or _mode_check(("DCR", "CRD"))(n)),
    "OneHot":          ImportRow(_one_hot, {"axis": -1}, (1, 2)),
    "Hardmax":         ImportRow(coerced_to_2d(_hardmax), {"axis": -1},
                                 check=lambda n: check_coerced(n) or _check_hardmax(n)),
    "Range":           ImportRow(_known_output, {}, (0, 1, 2), fold=_range_value),
    "ConstantOfShape": ImportRow(_known_output, {"value": None}, (0,), fold=_constant_of_shape_value),
}  # fmt: skip
