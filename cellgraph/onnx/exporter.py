"""A trained cellgraph model as an ONNX model: ``export(path, inputs, outputs, source, opset)``.

The graph exported is the inference graph (``cellgraph.inference``): only what
the outputs need, dropout switched off. Variables and constants become
initializers named after their nodes; placeholders become graph inputs whose
unknown dims stay dynamic (``batch`` for the first). Every op is translated by
its row in ``export_ops.EXPORTERS``; a node whose ONNX op has no float16 or
bfloat16 in the opset is computed in float32 between Casts, as cellgraph
computes it (``export_half``), and by default so is every op that reads
bfloat16, so that ONNX Runtime's CPU provider (no bfloat16 kernels) runs a
model made under ``mixed_bfloat16`` (``bfloat16="keep"`` keeps bfloat16 where
the opset has it, for a runtime with such kernels); the model is checked with
``onnx.checker`` (with shape inference) before it is written.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from cellgraph.dataflow.dtypes import is_half
from cellgraph.dataflow.graph import Node, Tensor

from ..inference import Source, inference_graph, trained_values, write_atomically
from .common import DTYPE_TO_ONNX, MAX_OPSET, MIN_OPSET, OnnxError
from .export_half import HALF, float32_for_half
from .export_ops import EXPORTERS

PRODUCER = "cellgraph"


def value_name(t: Tensor) -> str:
    """The ONNX name of a cellgraph tensor: the node's name for output 0, ``node:i`` after."""
    return t.node.name if t.index == 0 else t.name


class Emitter:
    """What an export row writes with: fresh value names, nodes, constants."""

    def __init__(self, opset: int) -> None:
        self.opset = opset
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._count = 0
        self._prefix = ""

    def ins(self, node: Node) -> list[str]:
        return [value_name(t) for t in node.inputs]

    def outs(self, node: Node) -> list[str]:
        return [value_name(t) for t in node.outputs]

    def fresh(self, hint: str) -> str:
        self._count += 1
        return f"{self._prefix}{hint}__{self._count}"

    def node(
        self, op_type: str, inputs: Sequence[str], outputs: Sequence[str] | None = None, **attrs: Any
    ) -> list[str]:
        """Append one ONNX node; its outputs are ``outputs`` or one fresh name. Returns them."""
        outs = list(outputs) if outputs is not None else [self.fresh(op_type.lower())]
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, name=self.fresh(op_type), **attrs))
        return outs

    def tensor(self, array: np.ndarray, name: str = "") -> onnx.TensorProto:
        return numpy_helper.from_array(np.asarray(array), name)

    def const(self, array: np.ndarray, name: str | None = None) -> str:
        """An initializer holding ``array``; returns its name."""
        name = name or self.fresh("const")
        self.initializers.append(self.tensor(array, name))
        return name


def _value_info(name: str, t: Tensor) -> onnx.ValueInfoProto:
    dims: list[int | str] = [
        d if d is not None else ("batch" if i == 0 else f"{name}_dim{i}") for i, d in enumerate(t.shape)
    ]
    return helper.make_tensor_value_info(name, DTYPE_TO_ONNX[t.dtype], dims)


BFLOAT16_CHOICES = ("float32", "keep")


def to_onnx(
    inputs: Tensor | Sequence[Tensor],
    outputs: Tensor | Sequence[Tensor],
    source: Source,
    opset: int = MIN_OPSET,
    bfloat16: str = "float32",
) -> onnx.ModelProto:
    """The checked ONNX model of ``outputs`` fed by ``inputs``, with ``source``'s trained values."""
    if not MIN_OPSET <= opset <= MAX_OPSET:
        raise OnnxError(f"opset {opset} is not one this exporter writes: choose {MIN_OPSET} to {MAX_OPSET}")
    if bfloat16 not in BFLOAT16_CHOICES:
        raise OnnxError(
            f"bfloat16={bfloat16!r} is not a choice: 'float32' computes each op that reads bfloat16 in float32 "
            "between Casts (ONNX Runtime's CPU provider has no bfloat16 kernels), 'keep' keeps bfloat16 where "
            "the opset has it (for a runtime with bfloat16 kernels)"
        )
    model = inference_graph(inputs, outputs)
    graph = model.graph
    # Every op must have a row before anything is translated: one clear error, nothing half-built.
    for node in graph.nodes:
        if node.op not in EXPORTERS and node.op not in ("Placeholder", "Variable", "Const"):
            raise OnnxError(
                f"{node.op} has no ONNX equivalent (node {node.name!r}, {node.where()}): "
                f"ONNX export covers {', '.join(sorted(EXPORTERS))}"
            )
        for t in node.outputs:
            if t.dtype not in DTYPE_TO_ONNX:
                raise OnnxError(f"{node.describe()}: output dtype {t.dtype} has no ONNX type")
    values = trained_values(source, graph)
    emitter = Emitter(opset)
    graph_inputs = []
    for node in graph.nodes:
        if node.op == "Placeholder":
            graph_inputs.append(_value_info(node.name, node.output(0)))
        elif node.op == "Variable":
            emitter.const(values[node.name], node.name)
        elif node.op == "Const":
            emitter.const(np.asarray(node.attrs["value"]), node.name)
        else:
            EXPORTERS[node.op](emitter, node)
    graph_outputs = [_value_info(value_name(t), t) for t in model.tensors(model.outputs)]
    nodes = emitter.nodes
    types = {v.name: v.type.tensor_type.elem_type for v in graph_inputs}
    types.update({t.name: t.data_type for t in emitter.initializers})
    if any(code in HALF for code in types.values()) or any(is_half(t.dtype) for n in graph.nodes for t in n.outputs):
        nodes = float32_for_half(nodes, types, opset, emitter.fresh, keep_bfloat16=bfloat16 == "keep")
    onnx_graph = helper.make_graph(nodes, "cellgraph", graph_inputs, graph_outputs, emitter.initializers)
    result = helper.make_model(onnx_graph, opset_imports=[helper.make_opsetid("", opset)], producer_name=PRODUCER)
    try:
        onnx.checker.check_model(result, full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as err:
        raise OnnxError(f"the exported ONNX model does not pass onnx.checker: {err}") from err
    return result


def export(
    path: str | Path,
    inputs: Tensor | Sequence[Tensor],
    outputs: Tensor | Sequence[Tensor],
    source: Source,
    opset: int = MIN_OPSET,
    bfloat16: str = "float32",
) -> onnx.ModelProto:
    """Write the ONNX model of ``outputs`` fed by ``inputs`` to ``path``; return it.

    ``source`` gives the variables' values (a ``Session``, a ``Job``, a
    checkpoint folder or a mapping). Raises ``OnnxError`` naming the op and
    node when an op has no ONNX equivalent; nothing is written then.
    ``bfloat16``: ``"float32"`` (the default) computes each op that reads
    bfloat16 (a ``mixed_bfloat16`` model's) in float32 between Casts, as
    cellgraph does, so that ONNX Runtime's CPU provider, which has no
    bfloat16 kernels, runs it; ``"keep"`` keeps bfloat16 wherever the opset
    has it, for a runtime that has bfloat16 kernels.

    Examples
    --------
    >>> import tempfile, os
    >>> import cellgraph as cg
    >>> g = cg.Graph()
    >>> with g.as_default():
    ...     x = cg.placeholder((None, 3), name="x")
    ...     y = cg.softmax(cg.layers.dense(x, 2, name="dense"), name="probs")
    >>> with tempfile.TemporaryDirectory() as d:
    ...     model = cg.onnx.export(os.path.join(d, "m.onnx"), x, y, cg.Session(g))
    >>> [o.name for o in model.graph.output]
    ['probs']
    """
    model = to_onnx(inputs, outputs, source, opset, bfloat16)
    write_atomically(Path(path), model.SerializeToString(), "the ONNX model")
    return model
