"""Checks of what an ONNX file claims, made before the importer trusts it: its tensors, its values, their sizes.

An ONNX file is data from whoever wrote it. A tensor whose bytes do not fit
its dims, two nodes making one value, or a Constant-fed ConstantOfShape of
(2**20, 2**20) are each refused here with an ``OnnxError`` naming the tensor
or node, instead of a bare NumPy error or a 4 TiB allocation at import.

Examples
--------
>>> import numpy as np
>>> from onnx import numpy_helper
>>> t = numpy_helper.from_array(np.ones(2, np.float32), "w")
>>> tensor_array(t, "initializer 'w'")
array([1., 1.], dtype=float32)
>>> t.dims[:] = [3]
>>> try:
...     tensor_array(t, "initializer 'w'")
... except OnnxError as err:
...     print(err)
initializer 'w' (FLOAT, dims (3,)) does not hold the values its dims ask for: cannot reshape array of size 2 into shape (3,)
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import onnx
from onnx import numpy_helper

from .common import DTYPE_TO_ONNX, READ_DTYPE, OnnxError, onnx_code, onnx_dtype_name

# The most bytes one value computed while importing (a Constant-fed ConstantOfShape, Range or Tile) may
# have: what one ONNX file can hold without external data. A bigger one is a hostile or broken file.
MAX_IMPORT_VALUE_BYTES = 2 * 1024**3
# Known inputs of at most this many elements go to ONNX's shape inference with their values (a shape,
# a count); bigger ones with their type only.
_VALUE_ELEMENTS = 1024


def tensor_array(t: onnx.TensorProto, what: str) -> np.ndarray:
    """``t`` as an array, or an ``OnnxError`` naming ``what`` when its data does not fit its dims and dtype."""
    dims = tuple(t.dims)
    kind = f"{what} ({onnx_dtype_name(t.data_type)}, dims {dims})"
    if any(d < 0 for d in dims):
        raise OnnxError(f"{kind} has a negative dim")
    if t.data_location == onnx.TensorProto.EXTERNAL:
        # Only a ModelProto given in memory gets here (onnx.load reads a file's external data, inside its folder):
        # to_array read the location relative to this process's working folder, whatever model it came from.
        location = next((e.value for e in t.external_data if e.key == "location"), "")
        raise OnnxError(
            f"{kind} keeps its values in external file {location[:200]!r}, which this ModelProto does not hold: "
            "import the model from its path (cg.onnx.import_model('folder/model.onnx') reads its external data "
            "inside that folder) or load them first (onnx.load(path))"
        )
    try:
        return numpy_helper.to_array(t)
    except (ValueError, TypeError) as err:
        raise OnnxError(f"{kind} does not hold the values its dims ask for: {err}") from None


def refuse_remade(graph: onnx.GraphProto) -> None:
    """Refuse a value made twice (by two nodes, or by a node and as an initializer or graph input).

    ONNX values are made once; importing such a file silently kept the last
    maker's value, so the model computed something its file does not say.
    """
    made: dict[str, str] = {}
    # Listed twice, one name was two placeholders (the model took an argument it never read) or two initializers
    # (the last one's values kept). A graph input may share an initializer's name: its default value.
    for kind, values in (("an initializer", graph.initializer), ("a graph input", graph.input)):
        for value in values:
            if made.get(value.name) == kind:
                raise OnnxError(
                    f"ONNX value {value.name!r} is listed twice as {kind}; every value of an "
                    "ONNX graph has one maker (onnx.checker refuses this model too)"
                )
            made.setdefault(value.name, kind)
    for i, node in enumerate(graph.node):
        maker = f"{node.op_type} node {node.name or f'#{i}'!r}"
        for name in node.output:
            if not name:
                continue
            if name in made:
                raise OnnxError(
                    f"ONNX value {name!r} is made twice: by {made[name]} and by {maker}; every value of an ONNX "
                    "graph has one maker"
                )
            made[name] = maker


def refuse_output_types_that_disagree(graph: onnx.GraphProto) -> None:
    """Refuse a graph output listed twice with two dtypes.

    Listing one value twice is valid ONNX (a graph output is a use, not a
    definition; the checker takes it and onnxruntime returns the value twice),
    and the importer returns it twice too. But one value has one dtype: the
    checker refuses two, and the importer returned the value's own dtype for
    both listings without a word, whatever the other one said.
    """
    first: dict[str, onnx.ValueInfoProto] = {}
    for v in graph.output:
        seen = first.setdefault(v.name, v)
        codes = (seen.type.tensor_type.elem_type, v.type.tensor_type.elem_type)
        if all(codes) and codes[0] != codes[1]:
            raise OnnxError(
                f"graph output {v.name!r} is listed twice with two dtypes, {onnx_dtype_name(codes[0])} and "
                f"{onnx_dtype_name(codes[1])}: one ONNX value has one dtype (onnx.checker refuses this model too)"
            )


def refuse_declared_type_not_made(output: onnx.ValueInfoProto, made: str) -> None:
    """Refuse a graph output declared a type other than the one its node makes.

    ONNX calls such a model invalid: onnx.checker's full check and ``infer_shapes(strict_mode=True)`` refuse it
    ("Inferred elem type differs from existing elem type"), and so does onnxruntime when it loads it. A type
    cellgraph computes wider (uint16, uint32) is narrowed back at the model's boundary (a float Neg declared
    UINT32 returned [-1, -2] as [0, 0]); any other (INT64, FLOAT16) came back in the node's type, float32,
    without a word. A declared type cellgraph does not read (an undefined one) is left alone.
    """
    code = output.type.tensor_type.elem_type if output.type.HasField("tensor_type") else 0
    if code not in READ_DTYPE or READ_DTYPE[code] == made:
        return
    made_name = onnx_dtype_name(DTYPE_TO_ONNX[made]) if made in DTYPE_TO_ONNX else made
    raise OnnxError(
        f"graph output {output.name!r} is declared {onnx_dtype_name(code)}, but the node that makes it computes "
        f"{made_name}: the file contradicts itself, and its values would be cast to {onnx_dtype_name(code)} "
        "(onnxruntime refuses this model too)"
    )


def refuse_huge(node: onnx.NodeProto, opset: int, known: Mapping[str, np.ndarray], describe: str) -> None:
    """Refuse, before it is computed, an output of ``node`` (every input known) over ``MAX_IMPORT_VALUE_BYTES``.

    ONNX's shape inference works out the output's shape from the known
    inputs without computing it (a ConstantOfShape's or Range's from their
    inputs' values); an output it cannot size is computed as before.
    """
    inputs = [name for name in node.input if name]
    small = {name for name in inputs if known[name].size <= _VALUE_ELEMENTS and onnx_code(known[name])}
    initializers = [numpy_helper.from_array(np.asarray(known[name]), name) for name in small]
    typed = [
        onnx.helper.make_tensor_value_info(name, onnx_code(known[name]) or 0, known[name].shape)
        for name in inputs
        if name not in small
    ]
    outputs = [onnx.helper.make_value_info(name, onnx.TypeProto()) for name in node.output if name]
    one = onnx.helper.make_graph([node], "size", typed, outputs, initializers)
    try:
        model = onnx.helper.make_model(one, opset_imports=[onnx.helper.make_opsetid("", opset)])
        inferred = onnx.shape_inference.infer_shapes(model).graph.output
    except Exception:  # noqa: BLE001 - a node inference cannot size is computed as before
        return
    for value in inferred:
        tensor = value.type.tensor_type
        dims = [d.dim_value for d in tensor.shape.dim]
        if not tensor.HasField("shape") or not all(d.HasField("dim_value") for d in tensor.shape.dim):
            continue
        try:
            itemsize = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type)).itemsize
        except (KeyError, TypeError, ValueError):
            continue
        nbytes = math.prod(dims) * itemsize  # Python ints: no overflow
        if nbytes > MAX_IMPORT_VALUE_BYTES:
            raise OnnxError(
                f"{describe} makes {value.name!r} of shape {tuple(dims)}, {nbytes:,} bytes, from constants of the "
                f"file: over the {MAX_IMPORT_VALUE_BYTES:,} bytes cellgraph lets such a value have (it would be "
                "computed ahead of any input)"
            )


__all__ = ["MAX_IMPORT_VALUE_BYTES", "refuse_declared_type_not_made", "refuse_huge", "refuse_remade", "tensor_array"]
