"""Export rows of the ops the deeper example models add: batched matmul, layer norm, placeholder defaults.

``export_ops.EXPORTERS`` takes these rows in (``NN_EXPORTERS``), as the import
table takes ``import_normalization``'s.

- ``BatchMatMul``: ONNX's MatMul is NumPy's ``matmul`` (batch dims broadcast), so
  only the adjoint flags need a Transpose swapping the operand's last two axes.
- ``LayerNorm``: ONNX's LayerNormalization (opset 17) normalizes the axes from
  ``axis`` on, as cellgraph's ``begin_axis``; scale and bias are its gamma and beta.
- ``PlaceholderWithDefault``: ONNX has no graph input with a default, so one that
  is not among the model's inputs exports as its default. (The training switch
  never gets here: the inference graph fixes it to False, ``cellgraph/inference.py``.)

Examples
--------
>>> sorted(NN_EXPORTERS)
['BatchMatMul', 'LayerNorm', 'PlaceholderWithDefault']
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from cellgraph.dataflow.graph import Node

if TYPE_CHECKING:
    from .exporter import Emitter


def _adjoint(e: Emitter, name: str, rank: int) -> str:
    """``name`` with its last two axes swapped (the matrices of a batch transposed)."""
    return e.node("Transpose", [name], perm=[*range(rank - 2), rank - 1, rank - 2])[0]


def _batch_matmul(e: Emitter, node: Node) -> None:
    a, b = e.ins(node)
    if node.attrs["transpose_a"]:
        a = _adjoint(e, a, len(node.inputs[0].shape))
    if node.attrs["transpose_b"]:
        b = _adjoint(e, b, len(node.inputs[1].shape))
    e.node("MatMul", [a, b], e.outs(node))


def _layer_norm(e: Emitter, node: Node) -> None:
    attrs = {"axis": int(node.attrs["begin_axis"]), "epsilon": float(node.attrs["epsilon"])}
    e.node("LayerNormalization", e.ins(node), e.outs(node), **attrs)


NN_EXPORTERS: dict[str, Callable[[Emitter, Node], object]] = {
    "BatchMatMul":            _batch_matmul,
    "LayerNorm":              _layer_norm,
    "PlaceholderWithDefault": lambda e, node: e.node("Identity", e.ins(node), e.outs(node)),
}  # fmt: skip
