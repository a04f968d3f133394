"""Wrappers of import rows, for what several ONNX ops share: half floats computed in float32 and
rounded once (``in_float32``), the old versions of Softmax, LogSoftmax and Hardmax over the input
flattened to 2-D (``coerced_to_2d``), and the old versions that broadcast nothing
(``same_shapes_before``).

Examples
--------
>>> import numpy as np
>>> from onnx import TensorProto, helper
>>> import cellgraph as cg
>>> node = helper.make_node("Softmax", ["x"], ["y"])  # version 11: over axes 1 and 2 together
>>> graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 2])],
...                           [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
>>> model = cg.onnx.import_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)]))
>>> model(np.zeros((1, 2, 2), np.float32))
array([[[0.25, 0.25],
        [0.25, 0.25]]], dtype=float32)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from .common import HALF_FLOATS, Build, Check

if TYPE_CHECKING:
    from cellgraph.dataflow.graph import Tensor

    from .importer import Builder
    from .node_info import NodeInfo


class _Float32Inputs:
    """A ``Builder`` whose half-float tensors come out as float32 (everything else as the builder's)."""

    def __init__(self, builder: Builder) -> None:
        self._builder = builder

    def __getattr__(self, name: str) -> Any:
        return getattr(self._builder, name)

    def ins(self, info: NodeInfo, count: int | None = None) -> list[Tensor]:
        return [_float32(t) for t in self._builder.ins(info, count)]

    def tensor(self, name: str) -> Tensor:
        return _float32(self._builder.tensor(name))

    def filter_hwio(self, name: str) -> Tensor:
        return _float32(self._builder.filter_hwio(name))


def _float32(t: Tensor) -> Tensor:
    import cellgraph as cg

    return cg.cast(t, "float32") if t.dtype in HALF_FLOATS else t


def in_float32(build: Build, like: tuple[int | None, ...] = ()) -> Build:
    """``build`` of a row made of several cellgraph ops, computed in float32 for half-float inputs
    and rounded back once, as ONNX Runtime's kernel of the one ONNX op rounds once.

    Each cellgraph op rounds its half-float result: HardSigmoid's ``x * alpha + beta`` as two ops
    was two roundings, 0.1416 where the float16 nearest the exact value is 0.1414. ``like[i]``: the
    input whose type output ``i`` has (None: float32, as LayerNormalization's mean); an output not
    listed has input 0's.
    """

    def build_in_float32(b: Builder, n: NodeInfo) -> list[Tensor]:
        import cellgraph as cg

        # Input 0 (the data) decides; only it is made now: a filter made as a plain tensor here would
        # not be stored as the HWIO variable Conv's row makes of it.
        if b.ins(n, 1)[0].dtype not in HALF_FLOATS:
            return build(b, n)
        outs = build(cast("Builder", _Float32Inputs(b)), n)
        ins = b.ins(n) if like else b.ins(n, 1)
        dtypes = [_output_dtype(ins, like, i) for i in range(len(outs))]
        return [cg.cast(t, d) if t.dtype != d else t for t, d in zip(outs, dtypes, strict=True)]

    return build_in_float32


def _output_dtype(ins: list[Tensor], like: tuple[int | None, ...], i: int) -> str:
    if i >= len(like):
        return ins[0].dtype
    source = like[i]
    return "float32" if source is None else ins[source].dtype


def same_shapes_before(version: int) -> Check:
    """A check refusing inputs of different shapes in versions older than ``version``, which broadcast
    nothing (Max-6, or Add-6 without its broadcast attribute): ONNX Runtime fails on them."""

    def check(n: NodeInfo) -> str | None:
        if n.version >= version:
            return None
        shapes = {n.shape(i) for i in range(len(n.inputs))}
        if len(shapes) > 1 or None in shapes or any(None in s for s in shapes if s is not None):
            return f"{n.op}-{n.version} of inputs whose shapes differ or are unknown (it broadcasts nothing)"
        return None

    return check


class _OneInput:
    """A ``Builder`` whose node reads ``tensor`` as its only input."""

    def __init__(self, builder: Builder, tensor: Tensor) -> None:
        self._builder, self._tensor = builder, tensor

    def __getattr__(self, name: str) -> Any:
        return getattr(self._builder, name)

    def ins(self, info: NodeInfo, count: int | None = None) -> list[Tensor]:
        return [self._tensor]


def _old_axis(n: NodeInfo) -> int:
    """The axis of a Softmax, LogSoftmax or Hardmax before version 13, whose default is 1."""
    return int(n.attrs["axis"]) if any(a.name == "axis" for a in n.proto.attribute) else 1


def coerced_to_2d(build: Build) -> Build:
    """``build`` (of Softmax, LogSoftmax or Hardmax along ``axis``) with the meaning these ops had
    before version 13: the input flattened to 2-D at ``axis`` (default 1), the op along its last
    axis, the result shaped back. Softmax-11 along axis 1 of (N, C, H, W) is over C, H and W together.
    """

    def build_coerced(b: Builder, n: NodeInfo) -> list[Tensor]:
        import dataclasses
        import math

        import cellgraph as cg

        if n.version >= 13:
            return build(b, n)
        x = b.ins(n)[0]
        rank = len(x.shape)
        axis = _old_axis(n) % rank
        flat = x if axis == rank - 1 else cg.reshape(x, (math.prod(x.shape[:axis]), math.prod(x.shape[axis:])))  # type: ignore[arg-type]
        outs = build(cast("Builder", _OneInput(b, flat)), dataclasses.replace(n, attrs={**n.attrs, "axis": -1}))
        return outs if axis == rank - 1 else [cg.reshape(outs[0], x.shape)]  # type: ignore[arg-type]

    return build_coerced


def check_coerced(n: NodeInfo) -> str | None:
    """Why a Softmax, LogSoftmax or Hardmax before version 13 cannot be flattened at its axis."""
    if n.version >= 13:
        return None
    shape = n.shape(0)
    if shape is None:
        return f"{n.op}-{n.version} of an input whose rank is unknown until the graph runs"
    if not -len(shape) <= _old_axis(n) < len(shape):  # its default axis 1 of a rank-1 input (import_limits.py: given)
        return f"{n.op}-{n.version} along axis {_old_axis(n)} of a rank-{len(shape)} input"
    if _old_axis(n) % len(shape) != len(shape) - 1 and None in shape:
        return f"{n.op}-{n.version} (over the input flattened to 2-D) of a shape unknown until the graph runs"
    return None
