"""An ONNX model as a cellgraph graph: ``import_model(path)``.

Every node is checked against its row in ``import_ops.IMPORTERS`` (op,
attributes, attribute values, dtypes, inputs that must be known) before
anything is built, so an unsupported model raises one ``OnnxError`` naming the
op or attribute, the node and the opset, and no graph exists. Then each
initializer that the graph reads becomes a variable (trainable when it is a
float), each graph input a placeholder (unknown dims stay unknown), and each
output an identity named after it.

Examples
--------
>>> import numpy as np
>>> from onnx import TensorProto, helper, numpy_helper
>>> node = helper.make_node("Gemm", ["x", "w"], ["y"], name="dense", transB=1)
>>> graph = helper.make_graph(
...     [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 2])],
...     [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 1])],
...     [numpy_helper.from_array(np.array([[1.0, 2.0]], np.float32), "w")],
... )
>>> model = import_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
>>> model.inputs, [n.name for n in model.graph.variables()]
([<Tensor 'x:0' shape=(?, 2) dtype=float32>], ['w'])
>>> model(np.array([[3.0, 4.0]], np.float32))
array([[11.]], dtype=float32)
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import onnx

import cellgraph as cg
from cellgraph.dataflow.dtypes import is_float
from cellgraph.dataflow.errors import CellgraphError
from cellgraph.dataflow.graph import Graph, Tensor

from ..saved_model import LoadedModel
from .common import (
    COMPUTE_DTYPE,
    READ_DTYPE,
    STRING_CODE,
    WIDENED,
    OnnxError,
    cell_name,
    is_wider,
    onnx_code,
    onnx_dtype_name,
    shape_dims,
    widen,
)
from .import_limits import LIMITS, attrs_of, refuse_out_of_range
from .import_ops import IMPORTERS
from .import_sequences import (
    SEQUENCE,
    TENSOR,
    Slot,
    flatten,
    input_placeholders,
    is_container,
    output_slot,
    refuse_container_read,
    regroup,
)
from .import_symbolic import build_fill, evaluate, fill_shape, is_partial
from .importer_checks import (
    refuse_declared_type_not_made,
    refuse_huge,
    refuse_output_types_that_disagree,
    refuse_remade,
    tensor_array,
)
from .node_info import NodeInfo


class ImportedModel(LoadedModel):
    """A ``LoadedModel`` of an ONNX model: values of ONNX types cellgraph has no tensors of (uint16,
    uint32) cross its boundary converted, in to the dtype they compute in and out back to the ONNX
    type (``signature["widened"]`` lists them)."""

    def __init__(
        self,
        graph: Graph,
        inputs: list[Tensor],
        outputs: list[Tensor],
        signature: dict[str, Any],
        output_types: list[np.dtype[Any] | None],
        slots: tuple[list[Slot], list[Slot]] | None = None,
    ) -> None:
        super().__init__(graph, inputs, outputs, signature)
        self.output_types = output_types  # one per tensor of ``outputs``
        # The ONNX inputs and outputs that are sequences or optionals (import_sequences.py), if any.
        self.input_slots, self.output_slots = slots or ([], [])

    def __call__(self, *args: Any) -> Any:
        flat = flatten(self.input_slots, args) if self.input_slots else list(args)
        fed = [widen(np.asarray(arg)) for arg in flat[: len(self.inputs)]]
        result = super().__call__(*fed, *flat[len(self.inputs) :])
        results = list(result) if isinstance(result, tuple) else [result]
        # Back to the narrow type as ONNX would have it: integers wrap.
        with np.errstate(over="ignore", invalid="ignore"):
            back = [
                r if kind is None else np.asarray(r).astype(kind)
                for r, kind in zip(results, self.output_types, strict=True)
            ]
        if self.output_slots:
            back = regroup(self.output_slots, back)
        return back[0] if len(back) == 1 else tuple(back)


def _default_opset(model: onnx.ModelProto) -> int:
    for entry in model.opset_import:
        if entry.domain in ("", "ai.onnx"):
            # An opset newer than this onnx package knows: get_schema answered with the newest version of
            # each op, so the model imported as if its ops meant what they mean at the newest opset known.
            newest = onnx.defs.onnx_opset_version()
            if entry.version > newest:
                raise OnnxError(
                    f"the ONNX model imports opset {entry.version} of the default domain (ai.onnx), newer than "
                    f"{newest}, the newest this onnx package ({onnx.__version__}) defines: what its ops mean "
                    "is unknown here"
                )
            return int(entry.version)
    raise OnnxError("the ONNX model imports no default-domain (ai.onnx) opset")


def _unsupported(what: str, info: NodeInfo) -> OnnxError:
    return OnnxError(f"{what} has no cellgraph equivalent ({info.describe()})")


def _types(model: onnx.ModelProto) -> dict[str, onnx.TypeProto]:
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # a model shape inference cannot follow still imports; ranks are then unknown
        inferred = model
    g = inferred.graph
    return {v.name: v.type for v in [*g.input, *g.value_info, *g.output]}


def plan(
    model: onnx.ModelProto, static_inputs: Mapping[str, Any] | None = None
) -> tuple[list[NodeInfo], dict[str, np.ndarray]]:
    """Every node of ``model`` checked and resolved, or an ``OnnxError`` for the first one cellgraph cannot express."""
    opset = _default_opset(model)
    graph = model.graph
    refuse_remade(graph)
    refuse_output_types_that_disagree(graph)
    known: dict[str, np.ndarray] = {
        i.name: widen(tensor_array(i, f"initializer {i.name!r}")) for i in graph.initializer
    }
    for name, value in (static_inputs or {}).items():
        known[name] = widen(np.asarray(value))
    types = _types(model)
    trainable = {i.name for i in graph.initializer}
    needed = _needed_at_build(graph)
    # Values computed from a run-time shape, known but for their dynamic dims (import_symbolic.py).
    partial: dict[str, np.ndarray] = {}
    infos = []
    for node in graph.node:
        if node.op_type in LIMITS and node.domain in ("", "ai.onnx"):  # before it is computed ahead or built
            refuse_out_of_range(NodeInfo(node, opset, attrs_of(node, IMPORTERS[node.op_type].attrs), known, types))
        if node.input and all(name in known for name in node.input if name):  # it may be computed now
            refuse_huge(node, opset, known, NodeInfo(node, opset, {}, known, types).describe())
        folded = _fold(node, opset, known, trainable, needed)
        if folded is not None:
            known.update(_check_folded(node, opset, folded, known, types))
            continue
        shaped = evaluate(node, known, partial, types) if any(o in needed for o in node.output) else None
        if shaped is not None:
            if is_partial(shaped):
                partial[node.output[0]] = shaped
            else:  # every dim it read was static after all: a constant
                known.update(_check_folded(node, opset, {node.output[0]: shaped.astype(np.int64)}, known, types))
            continue
        fill = fill_shape(node, partial, NodeInfo(node, opset, {}, known, types).describe)
        if fill is not None:  # a ConstantOfShape or Expand to a shape with run-time dims: made when it runs
            infos.append(NodeInfo(node, opset, {}, known, types, fill=fill))
            continue
        info = _check_node(_resolve_partial_reads(node, opset, known, partial), opset, known, types)
        infos.append(info)
    return infos, known


def _resolve_partial_reads(
    node: onnx.NodeProto, opset: int, known: dict[str, np.ndarray], partial: Mapping[str, np.ndarray]
) -> onnx.NodeProto:
    """``node`` reading a static stand-in for each partial value its row can read so (``ImportRow.partial``: a
    Reshape's target with one unknown dim as -1); an ``OnnxError`` for any other read of a partial value."""
    reads = [(i, name) for i, name in enumerate(node.input) if name in partial]
    if not reads:
        return node
    row = IMPORTERS.get(node.op_type)
    resolved = onnx.NodeProto()
    resolved.CopyFrom(node)
    for position, name in reads:
        try:
            stand_in = None if row is None or row.partial is None else row.partial(node, position, partial[name])
        except OnnxError as err:
            raise OnnxError(f"{err} ({NodeInfo(node, opset, {}, known, {}).describe()})") from None
        if stand_in is None:
            raise OnnxError(
                f"input {position} ({name!r}) of {NodeInfo(node, opset, {}, known, {}).describe()} is computed from "
                f"a run-time shape and known only in part when the graph is built ({partial[name].tolist()}; a "
                "tensor's dim, or None, is known only when it runs): cellgraph's shapes are static but for one "
                "unknown dim per Reshape and a Resize's sizes of the dims it keeps"
            )
        resolved.input[position] = f"{name}#static"  # this node's own reading (-1 means "infer" only here)
        known[resolved.input[position]] = stand_in
    return resolved


# Ops whose result is not a function of their inputs: never computed ahead.
_NOT_FOLDED = ("Random", "Multinomial", "Bernoulli", "Dropout")
# Ops computed ahead whenever their inputs are known constants (weights stored as Constant nodes and
# then transposed or cast): they move or convert values exactly, in ONNX's reference as in cellgraph.
# (Not Unsqueeze: the reference's Unsqueeze-11 inserts unsorted axes one by one, (2, 3, 4) with axes
# [3, 0] giving (1, 2, 3, 4, 1), not (1, 2, 3, 1, 4).)
_MOVES = frozenset(
    {"Identity", "Cast", "Reshape", "Transpose", "Concat", "Gather", "Slice", "Flatten", "Expand", "Tile"}
)


def _needed_at_build(graph: onnx.GraphProto) -> set[str]:
    """The values some row needs known when the graph is built (a Reshape's shape), and every value
    those are computed from: the constant subgraphs that must be computed ahead."""
    needed: set[str] = set()
    for node in reversed(graph.node):  # consumers before the producers they need (nodes are sorted)
        row = IMPORTERS.get(node.op_type)
        if row is not None:
            needed.update(node.input[i] for i in row.static if i < len(node.input) and node.input[i])
        if any(name in needed for name in node.output):
            needed.update(name for name in node.input if name)
    return needed


def _fold(
    node: onnx.NodeProto, opset: int, known: Mapping[str, np.ndarray], trainable: set[str], needed: set[str]
) -> dict[str, np.ndarray] | None:
    """The outputs of a node whose inputs are all known constants, computed now by ONNX's reference
    implementation at the model's opset (a shape computed from a static shape, say); None when it
    must be built.

    Only what must be known at build time is computed ahead (and exact moves of values, and ops
    cellgraph has no row for): every other node is built, computed by its row as ONNX Runtime
    computes it. ONNX's reference differs from both in places (Clip without bounds keeps inf,
    composite ops of float16 round at each step, and it ran an old version of an op as the newest:
    Squeeze-1 ignored its axes, Softmax-1 was not flattened to 2-D).

    A node reading an initializer is built, never folded: initializers are the model's
    trainable variables, and a folded copy would not follow them when they train.
    """
    inputs = [name for name in node.input if name]
    if (
        not inputs
        or node.domain not in ("", "ai.onnx")
        or node.op_type.startswith(_NOT_FOLDED)
        or any(name not in known or name in trainable for name in inputs)
    ):
        return None
    if node.op_type in IMPORTERS and node.op_type not in _MOVES and not any(o in needed for o in node.output):
        return None
    from onnx.reference import ReferenceEvaluator

    # A one-node model of the model's opset: given the node alone, the reference runs the newest version.
    values_info = [onnx.helper.make_value_info(name, onnx.TypeProto()) for name in inputs]
    outputs = [onnx.helper.make_value_info(name, onnx.TypeProto()) for name in node.output if name]
    one = onnx.helper.make_graph([node], "fold", values_info, outputs)
    try:
        reference = ReferenceEvaluator(onnx.helper.make_model(one, opset_imports=[onnx.helper.make_opsetid("", opset)]))
        values = reference.run(None, {name: known[name] for name in inputs})
    except Exception:  # an op the reference cannot run ahead: it is checked and built as any other
        return None
    return {name: np.asarray(v) for name, v in zip([o for o in node.output if o], values, strict=False)}


def _check_node(
    node: onnx.NodeProto, opset: int, known: dict[str, np.ndarray], types: Mapping[str, onnx.TypeProto]
) -> NodeInfo:
    info = NodeInfo(node, opset, {}, known, types)
    if node.domain not in ("", "ai.onnx"):
        raise _unsupported(f"ONNX op {node.domain}.{node.op_type}", info)
    row = IMPORTERS.get(node.op_type)
    if row is None:
        raise OnnxError(
            f"ONNX op {node.op_type!r} has no cellgraph equivalent ({info.describe()}); "
            f"cellgraph imports {', '.join(sorted(IMPORTERS))}"
        )
    try:
        version = int(onnx.defs.get_schema(node.op_type, opset, "").since_version)
    except onnx.defs.SchemaError:
        raise _unsupported(f"ONNX op {node.op_type!r}, which opset {opset} does not define,", info) from None
    if version < row.since:
        raise _unsupported(
            f"version {version} of ONNX op {node.op_type!r} (cellgraph reads {row.since} or newer)", info
        )
    # ONNX stores a FLOAT attribute as a float32: a row's default (LeakyRelu's alpha 0.01) is
    # rounded the same way, so a node without the attribute computes what one with it does.
    attrs = {k: float(np.float32(v)) if isinstance(v, float) else v for k, v in row.attrs.items()}
    for a in node.attribute:
        if a.name not in row.attrs:
            raise _unsupported(f"attribute {a.name!r} of ONNX op {node.op_type!r}", info)
        attrs[a.name] = onnx.helper.get_attribute_value(a)
    info.attrs = attrs
    for position in row.static:
        if position < len(node.input) and node.input[position] and node.input[position] not in known:
            raise OnnxError(
                f"input {position} ({node.input[position]!r}) of {info.describe()} must be known when the graph "
                "is built (an initializer or a Constant): cellgraph's shapes are static; "
                "pass its value in static_inputs"
            )
    if node.op_type != "Identity":
        for value_name in node.input:
            refuse_container_read(value_name, types.get(value_name), info.describe())
    # A node may read the types cellgraph reads wider (float8, int4, ...) but make none of them.
    made = READ_DTYPE if row.makes_narrow else COMPUTE_DTYPE
    for value_name, readable in [*((n, READ_DTYPE) for n in node.input), *((n, made) for n in node.output)]:
        t = types.get(value_name)
        code = t.tensor_type.elem_type if t is not None and t.HasField("tensor_type") else None
        if value_name in known:
            code = onnx_code(known[value_name]) or 0
        if code and code not in readable:
            raise _unsupported(f"dtype {onnx_dtype_name(code)} of value {value_name!r}", info)
        if code == STRING_CODE and not row.strings:
            strung = ", ".join(op for op, r in IMPORTERS.items() if r.strings)
            raise OnnxError(
                f"value {value_name!r} of {info.describe()} is a STRING tensor; of the ONNX ops cellgraph "
                f"imports, these take strings: {strung}"
            )
    try:  # both may read a value of the file: a Constant whose data does not fit its dims, a Range of step 0
        reason = row.check(info) if row.check is not None else None
        # A value known now (a Constant, the Shape of a static shape) can feed inputs that must be known.
        folded = row.fold(info) if row.fold is not None and reason is None else None
    except (ValueError, ArithmeticError, IndexError) as err:
        raise OnnxError(f"{info.describe()} cannot be computed at import: {err}") from None
    if reason is not None:
        raise _unsupported(reason, info)
    if folded is not None:
        known.update(_check_folded(node, opset, {node.output[0]: folded}, known, types))
    return info


def _check_folded(
    node: onnx.NodeProto,
    opset: int,
    values: Mapping[str, np.ndarray],
    known: Mapping[str, np.ndarray],
    types: Mapping[str, onnx.TypeProto],
) -> dict[str, np.ndarray]:
    """Values computed at import, in the dtypes cellgraph computes them in; refused naming any other."""
    out = {}
    for name, value in values.items():
        code = onnx_code(value)
        if code not in COMPUTE_DTYPE:
            info = NodeInfo(node, opset, {}, known, types)
            raise _unsupported(f"dtype {onnx_dtype_name(code or 0)} of value {name!r}", info)
        out[name] = widen(value)
    return out


class Builder:
    """What an import row builds with: the cellgraph tensor of an ONNX value, or its known value."""

    def __init__(self, graph: Graph, initializers: Mapping[str, np.ndarray], known: Mapping[str, np.ndarray]) -> None:
        self.graph = graph
        self.initializers = initializers
        self.known = known
        self.tensors: dict[str, Tensor] = {}
        self.variables: dict[str, Tensor] = {}
        # Sequence values (their tensors) and empty optionals (None): what Identity passes on.
        self.containers: dict[str, list[Tensor] | None] = {}

    def static(self, name: str) -> np.ndarray:
        return np.asarray(self.known[name])

    def tensor(self, name: str) -> Tensor:
        if name not in self.tensors:
            if name in self.initializers and self.initializers[name].dtype != object:
                self.tensors[name] = self._variable(name, self.initializers[name])
            elif name in self.known:  # a string initializer too: text is a constant, never trained
                value = np.asarray(self.known[name])  # its own dtype: cg.constant would narrow int64
                self.tensors[name] = cg.constant(value, dtype=value.dtype.name, name=cell_name(name))
            else:
                raise OnnxError(f"ONNX value {name!r} is read before any node makes it")
        return self.tensors[name]

    def _variable(self, name: str, value: np.ndarray) -> Tensor:
        value = np.asarray(value)
        trainable = is_float(value.dtype.name)  # bfloat16 included (NumPy's kind for it is 'V')
        t = cg.variable(value, dtype=value.dtype.name, name=cell_name(name), trainable=trainable)
        self.variables[name] = t
        return t

    def filter_hwio(self, name: str) -> Tensor:
        """An ONNX OIHW filter as cellgraph's HWIO: an initializer is stored transposed, as a variable."""
        # A 1-D filter (OIL) is the 2-D filter of an image of height 1.
        if name in self.initializers and name not in self.tensors:
            oihw = self.initializers[name]
            oihw = oihw[:, :, None, :] if oihw.ndim == 3 else oihw
            hwio = np.ascontiguousarray(np.transpose(oihw, (2, 3, 1, 0)))
            self.tensors[f"{name}#hwio"] = t = self._variable(name, hwio)
            return t
        if f"{name}#hwio" in self.tensors:
            return self.tensors[f"{name}#hwio"]
        w = self.tensor(name)
        return cg.transpose(cg.expand_dims(w, 2) if len(w.shape) == 3 else w, (2, 3, 1, 0))

    def ins(self, info: NodeInfo, count: int | None = None) -> list[Tensor]:
        # Inputs read as values at build time (a reshape's shape) are not tensors of the graph.
        static = IMPORTERS[info.op].static
        names = [n for i, n in enumerate(info.inputs) if n and i not in static]
        return [self.tensor(n) for n in (names if count is None else names[:count])]


def _wrapped(t: Tensor, onnx_type: onnx.TypeProto | None) -> Tensor:
    """``t`` reduced modulo 2**bits where its ONNX type is one cellgraph computes wider (uint16 as
    int32, uint32 as int64), as the narrow type would have wrapped it.

    Wrapping only at the model's boundary was too late: a uint32 ``1 - 2`` stayed -1 in int64, so a
    later Less, Div or Cast saw -1 where ONNX has 4294967295 (Less(1 - 2, 10) was true).
    """
    code = onnx_type.tensor_type.elem_type if onnx_type is not None and onnx_type.HasField("tensor_type") else 0
    if code not in WIDENED:
        return t
    modulus = 2 ** (8 * onnx.helper.tensor_dtype_to_np_dtype(code).itemsize)
    return cg.mod(t, cg.constant(np.array(modulus, t.dtype), dtype=t.dtype))


def _placeholder(value: onnx.ValueInfoProto) -> Tensor:
    dims = shape_dims(value.type) or []  # a type without a shape: rank 0, as the importer has always read it
    return cg.placeholder(dims, READ_DTYPE[value.type.tensor_type.elem_type], name=cell_name(value.name))


def import_model(
    source: str | Path | onnx.ModelProto,
    static_inputs: Mapping[str, Any] | None = None,
    examples: Mapping[str, Any] | None = None,
) -> ImportedModel:
    """A cellgraph graph computing the ONNX model ``source`` (a path or a ``ModelProto``).

    Initializers become variables (trainable when float), so the imported
    model can be fine-tuned. ``static_inputs`` gives values for graph inputs
    that must be known when building (a shape fed as an input). ``examples``
    gives an example value of each sequence or optional graph input (a list
    of arrays; None for an empty optional), which fixes its structure
    (``import_sequences.py``). Returns a model callable like
    ``cg.load_model``'s, with ``graph``, ``inputs`` and ``outputs``.

    Raises ``OnnxError`` naming the op or attribute, the node and the opset
    for anything cellgraph cannot express, before building anything.

    A graph output listed twice (valid ONNX: a graph output is a use of a
    value, and only definitions must be unique) is returned twice, as
    onnxruntime returns it; the second identity is named ``y_1``. Listed with
    two dtypes, it is refused.
    """
    model = source if isinstance(source, onnx.ModelProto) else _load(source)
    infos, known = plan(model, static_inputs)
    g = model.graph
    examples = examples or {}
    initializers = {i.name: widen(tensor_array(i, f"initializer {i.name!r}")) for i in g.initializer}
    fed = [v for v in g.input if v.name not in initializers and v.name not in (static_inputs or {})]
    for v in fed:
        code = v.type.tensor_type.elem_type
        if not is_container(v.type) and code not in READ_DTYPE:
            raise OnnxError(f"graph input {v.name!r} has dtype {onnx_dtype_name(code)}, which cellgraph does not have")
    graph = Graph()
    builder = Builder(graph, initializers, known)
    try:
        with graph.as_default(), graph.atomic():
            inputs, in_slots = _inputs(fed, builder, examples)
            for info in infos:
                if IMPORTERS[info.op].fold is not None and info.outputs[0] in known:
                    continue  # a known value becomes a constant where a tensor reads it, if one does
                if info.fill is not None:
                    builder.tensors[info.outputs[0]] = build_fill(info.fill, info.proto, builder.tensor)
                    continue
                if info.op == "Identity" and info.inputs[0] in builder.containers:
                    builder.containers[info.outputs[0]] = builder.containers[info.inputs[0]]
                    continue
                try:
                    outs = IMPORTERS[info.op].build(builder, info)
                except CellgraphError as err:
                    # A dtype or shape cellgraph's op refuses (an integer ReduceMean): named by the ONNX node.
                    raise OnnxError(f"{info.describe()} does not build in cellgraph: {err}") from err
                except (IndexError, ValueError) as err:  # an attribute out of range for the shapes (Gather's axis)
                    attrs = ", ".join(f"{k}={v!r}" for k, v in info.attrs.items())
                    shapes = [info.shape(i) for i in range(len(info.inputs))]
                    raise OnnxError(
                        f"{info.describe()} does not build in cellgraph: its attributes ({attrs}) do not fit its "
                        f"inputs' shapes {shapes} ({type(err).__name__}: {err})"
                    ) from err
                for name, t in zip(info.outputs, outs, strict=False):
                    if name:
                        builder.tensors[name] = _wrapped(t, info.types.get(name))
            outputs, out_slots = [], []
            for v in g.output:
                held = builder.containers[v.name] if v.name in builder.containers else builder.tensor(v.name)
                if isinstance(held, Tensor):
                    refuse_declared_type_not_made(v, held.dtype)
                slot, tensors = output_slot(v.name, held)
                outputs += tensors
                out_slots.append(slot)
    except OnnxError:
        raise
    except CellgraphError as err:
        raise OnnxError(f"the ONNX model does not build in cellgraph: {err}") from err
    signature = {
        "format": "onnx",
        "opset": _default_opset(model),
        "inputs": [{"name": t.name, "dtype": t.dtype, "shape": list(t.shape)} for t in inputs],
        "outputs": [{"name": t.name, "dtype": t.dtype, "shape": list(t.shape)} for t in outputs],
        "variables": sorted(t.node.name for t in builder.variables.values()),
    }
    types = _types(model)
    codes = [types[v.name].tensor_type.elem_type if v.name in types else 0 for v in g.output]
    widened = {
        v.name: onnx_dtype_name(v.type.tensor_type.elem_type) for v in fed if is_wider(v.type.tensor_type.elem_type)
    }
    widened.update({v.name: onnx_dtype_name(code) for v, code in zip(g.output, codes, strict=True) if is_wider(code)})
    signature["widened"] = widened
    output_types: list[np.dtype[Any] | None] = []
    for slot, code in zip(out_slots, codes, strict=True):
        narrow = onnx.helper.tensor_dtype_to_np_dtype(code) if slot.kind == TENSOR and is_wider(code) else None
        output_types += [narrow] * slot.count
    containers = any(s.kind != TENSOR for s in in_slots + out_slots)
    if containers:
        signature["structure"] = {
            "inputs": {s.name: s.describe() for s in in_slots},
            "outputs": {s.name: s.describe() for s in out_slots},
        }
    return ImportedModel(graph, inputs, outputs, signature, output_types, (in_slots, out_slots) if containers else None)


def _inputs(
    fed: list[onnx.ValueInfoProto], builder: Builder, examples: Mapping[str, Any]
) -> tuple[list[Tensor], list[Slot]]:
    """The placeholders of the fed graph inputs, and each input's slot (a sequence is several)."""
    inputs: list[Tensor] = []
    slots = []
    for v in fed:
        if is_container(v.type):
            slot, tensors = input_placeholders(v, examples.get(v.name), v.name in examples)
            if slot.kind == TENSOR:  # an optional holding a tensor is that tensor
                builder.tensors[v.name] = tensors[0]
            else:
                builder.containers[v.name] = tensors if slot.kind == SEQUENCE else None
        else:
            slot, tensors = Slot(v.name, TENSOR, 1), [_placeholder(v)]
            builder.tensors[v.name] = tensors[0]
        inputs += tensors
        slots.append(slot)
    return inputs, slots


def _load(path: str | Path) -> onnx.ModelProto:
    from cellgraph.cluster.ps.checkpoint_manifest import read_regular_file

    # Read here, a regular file only: onnx.load read a FIFO's open for good and /dev/zero until memory ran out.
    try:
        data = read_regular_file(Path(path))
    except FileNotFoundError:
        raise OnnxError(f"ONNX model {str(path)!r} does not exist") from None
    except OSError as err:
        raise OnnxError(f"ONNX model {str(path)!r} cannot be read: {err.strerror or err}") from None
    try:
        # The format by the file's extension (.onnx, .onnxtxt, ...), and external data inside its folder, as onnx.load.
        fmt = onnx.serialization.registry.get_format_from_file_extension(os.path.splitext(str(path))[1]) or "protobuf"
        model = onnx.load_model_from_string(data, format=fmt)
        onnx.external_data_helper.load_external_data_for_model(model, os.path.dirname(str(path)))
        return model
    except Exception as err:  # protobuf's DecodeError for a file that is not a model
        raise OnnxError(f"{str(path)!r} is not an ONNX model: {err}") from err
