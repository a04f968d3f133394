"""Half floats in an exported model: an ONNX op with no such type in the opset computes in float32.

cellgraph stores float16 and bfloat16 and computes every op in float32,
rounding each output once (``dataflow/kernels/storage.py``). ONNX allows
bfloat16 for fewer ops (opset 17 has no bfloat16 Conv, pools, Elu, Softplus,
ConstantOfShape, ...). So after the rows have written their nodes, each node
whose schema refuses the half type of one of its inputs (or of a tensor
attribute, such as ConstantOfShape's value) is rewritten: its half inputs are
cast to float32, it runs in float32, and each float32 output is cast back to
the half type. That is cellgraph's own computation for the node, so the
export still gives cellgraph's values; nodes the schema accepts keep the half
type and are left as they are.

Examples
--------
>>> from onnx import TensorProto, helper
>>> elu = helper.make_node("Elu", ["x"], ["y"], alpha=0.5)
>>> counter = iter(range(10))
>>> nodes = float32_for_half(
...     [elu], {"x": TensorProto.BFLOAT16}, 17, lambda hint: f"{hint}__{next(counter)}"
... )
>>> [(n.op_type, list(n.input), list(n.output)) for n in nodes]
[('Cast', ['x'], ['x_float__0']), ('Elu', ['x_float__0'], ['y_float__2']), ('Cast', ['y_float__2'], ['y'])]
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HALF: tuple[int, ...] = (TensorProto.FLOAT16, TensorProto.BFLOAT16)


def _allowed(schema: onnx.defs.OpSchema, type_str: str) -> set[str]:
    for constraint in schema.type_constraints:
        if constraint.type_param_str == type_str:
            return set(constraint.allowed_type_strs)
    return {type_str}  # a concrete type ("tensor(int64)")


_TYPE_STR: dict[int, str] = {TensorProto.FLOAT16: "tensor(float16)", TensorProto.BFLOAT16: "tensor(bfloat16)"}


def _half_attrs(node: onnx.NodeProto) -> list[int]:
    return [a.t.data_type for a in node.attribute if a.type == onnx.AttributeProto.TENSOR and a.t.data_type in HALF]


def _refuses_half(schema: onnx.defs.OpSchema, node: onnx.NodeProto, types: Mapping[str, int]) -> bool:
    """Whether the node reads a half value (input or tensor attribute) where its schema allows no such type."""
    formals = list(schema.inputs)
    for i, name in enumerate(node.input):
        code = types.get(name)
        if name and code in HALF and formals:
            formal = formals[min(i, len(formals) - 1)]  # the last formal input may be variadic
            if _TYPE_STR[code] not in _allowed(schema, formal.type_str):
                return True
    # A half tensor attribute gives an output its type (ConstantOfShape's value).
    return any(
        _TYPE_STR[code] not in _allowed(schema, o.type_str) for code in _half_attrs(node) for o in schema.outputs
    )


def _infer(schema: onnx.defs.OpSchema, node: onnx.NodeProto, types: Mapping[str, int]) -> dict[str, int]:
    """The element types of the node's outputs, or {} where ONNX cannot infer them from types alone."""
    given = {n: helper.make_tensor_type_proto(types[n], None) for n in node.input if n in types}
    try:
        inferred = onnx.shape_inference.infer_node_outputs(schema, node, given)
    except Exception:  # the checker, which runs after, names what is wrong with the node
        return {}
    return {name: t.tensor_type.elem_type for name, t in inferred.items() if t.HasField("tensor_type")}


def _in_float32(
    node: onnx.NodeProto, schema: onnx.defs.OpSchema, types: dict[str, int], fresh: Callable[[str], str]
) -> list[onnx.NodeProto]:
    before: list[onnx.NodeProto] = []
    inputs, halves = [], {types[n] for n in node.input if types.get(n) in HALF} | set(_half_attrs(node))
    for name in node.input:
        if name and types.get(name) in HALF:
            cast = fresh(f"{name}_float")
            before.append(helper.make_node("Cast", [name], [cast], name=fresh("Cast"), to=TensorProto.FLOAT))
            types[cast] = TensorProto.FLOAT
            name = cast
        inputs.append(name)
    attrs: dict[str, Any] = {}
    for a in node.attribute:
        if a.type == onnx.AttributeProto.TENSOR and a.t.data_type in HALF:
            attrs[a.name] = numpy_helper.from_array(numpy_helper.to_array(a.t).astype(np.float32), a.t.name)
        else:
            attrs[a.name] = helper.get_attribute_value(a)
    rewritten = helper.make_node(node.op_type, inputs, list(node.output), name=node.name, domain=node.domain, **attrs)
    outputs = _infer(schema, rewritten, types)
    # The half type an output rounds back to: its inputs' (float16 and bfloat16 never meet in one node).
    half = max(halves)
    after, names = [], []
    for name in node.output:
        if name and outputs.get(name) == TensorProto.FLOAT:
            wide = fresh(f"{name}_float")
            after.append(helper.make_node("Cast", [wide], [name], name=fresh("Cast"), to=half))
            types[wide], types[name] = TensorProto.FLOAT, half
            name = wide
        elif name in outputs:
            types[name] = outputs[name]
        names.append(name)
    del rewritten.output[:]
    rewritten.output.extend(names)
    return [*before, rewritten, *after]


def _reads_bfloat16(node: onnx.NodeProto, types: Mapping[str, int]) -> bool:
    """Whether a node other than a Cast reads a bfloat16 value (input or tensor attribute)."""
    if node.op_type == "Cast":  # the one op ONNX Runtime's CPU provider runs in bfloat16
        return False
    codes = [types.get(name) for name in node.input if name] + _half_attrs(node)
    return TensorProto.BFLOAT16 in codes


def float32_for_half(
    nodes: Sequence[onnx.NodeProto],
    types: Mapping[str, int],
    opset: int,
    fresh: Callable[[str], str],
    keep_bfloat16: bool = True,
) -> list[onnx.NodeProto]:
    """``nodes`` with each one whose schema (at ``opset``) refuses a half input computed in float32 between Casts,
    and, unless ``keep_bfloat16``, each one that reads bfloat16 at all (Casts excepted).

    ``types`` gives the element type of the graph's inputs and initializers; the
    nodes' own outputs are typed as the walk goes, in order.
    """
    known = dict(types)
    out: list[onnx.NodeProto] = []
    for node in nodes:
        schema = onnx.defs.get_schema(node.op_type, opset, node.domain)
        if _refuses_half(schema, node, known) or (not keep_bfloat16 and _reads_bfloat16(node, known)):
            out.extend(_in_float32(node, schema, known, fresh))
        else:
            known.update(_infer(schema, node, known))
            out.append(node)
    return out
