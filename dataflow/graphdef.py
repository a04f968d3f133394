"""Graph <-> GraphDef: a graph as protobuf data, exactly, both ways.

``to_graphdef`` writes every node with its name, op, inputs, attrs, device,
cell, source line, stale marker and output types. ``from_graphdef`` rebuilds a
``Graph`` from one, running every op's shape rule again (a GraphDef from
elsewhere is validated as if its nodes were made anew) but keeping the names,
devices, cells and stale markers it was given. Nodes are built in a topological
order and added in the GraphDef's order, so a round trip is exact:
``to_graphdef(from_graphdef(to_graphdef(g))) == to_graphdef(g)``.

Examples
--------
>>> import cellgraph as cg
>>> from cellgraph.dataflow.graphdef import from_graphdef, to_graphdef
>>> g = cg.Graph()
>>> with g.as_default():
...     x = cg.placeholder((None, 2), "float32", name="x")
...     y = cg.reduce_sum(x * 2.0, name="y")
>>> g2 = from_graphdef(to_graphdef(g))
>>> cg.Session(g2).run("y:0", {"x:0": [[1.0, 2.0]]})
array(6., dtype=float32)
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from cellgraph.protos import graph_pb2, tensor_pb2

from .dtypes import DTYPES, as_dtype, as_strings
from .errors import DTypeError, GraphError, RegistryError
from .graph import Graph, Node, Tensor
from .opdef import OPS, InferContext, TensorSpec
from .shapes import fmt

# The GraphDef format this module writes, and the oldest format a reader must
# understand to read what it writes. Bump GRAPHDEF_VERSION when the meaning of
# a field changes; bump MIN_CONSUMER too when older readers would misread it.
GRAPHDEF_VERSION = 1
MIN_CONSUMER = 1

# DataType enum of each cellgraph dtype name, and back; the parameter service uses them too.
DTYPE_ENUM: dict[str, tensor_pb2.DataType.ValueType] = {
    "float32": tensor_pb2.DT_FLOAT32,
    "float64": tensor_pb2.DT_FLOAT64,
    "int32": tensor_pb2.DT_INT32,
    "int64": tensor_pb2.DT_INT64,
    "bool": tensor_pb2.DT_BOOL,
    "float16": tensor_pb2.DT_FLOAT16,
    "bfloat16": tensor_pb2.DT_BFLOAT16,
    "int8": tensor_pb2.DT_INT8,
    "uint8": tensor_pb2.DT_UINT8,
    "int16": tensor_pb2.DT_INT16,
    "string": tensor_pb2.DT_STRING,
}
DTYPE_NAME = {enum: name for name, enum in DTYPE_ENUM.items()}
assert set(DTYPE_ENUM) == set(DTYPES), "every cellgraph dtype needs a DataType in protos/tensor.proto"

_INT64 = (-(2**63), 2**63 - 1)
_INT32 = (-(2**31), 2**31 - 1)
_SUPPORTED = "bool, int, float, str, None, numpy.ndarray, and tuples or lists of these"


# ------------------------------------------------------------------ tensors
def _dtype_enum(dtype: np.dtype[Any]) -> tensor_pb2.DataType.ValueType:
    try:
        return DTYPE_ENUM[as_dtype(dtype)]
    except (KeyError, DTypeError):
        raise DTypeError(f"unsupported dtype {dtype.name}; a TensorProto holds {', '.join(DTYPE_ENUM)}") from None


def _dtype_name(enum: int) -> str:
    try:
        return DTYPE_NAME[enum]  # type: ignore[index]
    except KeyError:
        known = ", ".join(f"{tensor_pb2.DataType.Name(e)} ({name})" for name, e in DTYPE_ENUM.items())
        raise GraphError(f"DataType {enum} is not a tensor dtype; expected one of {known}") from None


def to_tensor_proto(array: np.ndarray) -> tensor_pb2.TensorProto:
    """A NumPy array as a ``TensorProto``: dtype, shape and little-endian C-order bytes."""
    enum = _dtype_enum(array.dtype)
    if enum == tensor_pb2.DT_STRING:
        return tensor_pb2.TensorProto(
            dtype=enum, shape=tensor_pb2.TensorShapeProto(dim=array.shape), strings=_utf8(array)
        )
    little = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<"))
    return tensor_pb2.TensorProto(
        dtype=enum, shape=tensor_pb2.TensorShapeProto(dim=array.shape), content=little.tobytes()
    )


def from_tensor_proto(proto: tensor_pb2.TensorProto) -> np.ndarray:
    """The read-only NumPy array a ``TensorProto`` holds, of its exact dtype and shape."""
    name = _dtype_name(proto.dtype)
    shape = tuple(proto.shape.dim)
    if any(d < 0 for d in shape):
        raise GraphError(f"a tensor value needs every dim known, got shape {fmt(shape)}")
    if name == "string":
        return _strings_from_proto(proto, shape)
    wire = DTYPES[name].newbyteorder("<")
    # Python integers: NumPy's int64 product wraps, and dims (2**40, 2**40) counted 0 bytes, so empty content passed.
    expected = math.prod(shape) * wire.itemsize
    if len(proto.content) != expected:
        raise GraphError(
            f"a {name} tensor of shape {fmt(shape)} needs {expected} bytes of content, got {len(proto.content)}"
        )
    if name == "bool" and proto.content and max(proto.content) > 1:
        raise GraphError("a bool tensor's content bytes must each be 0 or 1")
    # A copy in native byte order: aligned, owned, and independent of the message.
    array = np.frombuffer(proto.content, dtype=wire).reshape(shape).astype(DTYPES[name], copy=True)
    array.flags.writeable = False
    return array


def _utf8(array: np.ndarray) -> list[bytes]:
    return [element.encode("utf-8") for element in as_strings(array, "a TensorProto's value").reshape(-1)]


def _strings_from_proto(proto: tensor_pb2.TensorProto, shape: tuple[int, ...]) -> np.ndarray:
    count = math.prod(shape)  # exact, as for content
    if len(proto.strings) != count or proto.content:
        raise GraphError(
            f"a string tensor of shape {fmt(shape)} needs {count} strings and no content, "
            f"got {len(proto.strings)} strings and {len(proto.content)} content bytes"
        )
    array = np.empty(count, dtype=object)
    for i, raw in enumerate(proto.strings):
        try:
            array[i] = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            raise GraphError(f"string {i} of a string tensor is not UTF-8: {err}") from None
    array = array.reshape(shape)
    array.flags.writeable = False
    return array


def _spec_to_proto(spec: TensorSpec) -> tensor_pb2.TensorSpecProto:
    dims = [-1 if d is None else d for d in spec.shape]
    return tensor_pb2.TensorSpecProto(dtype=DTYPE_ENUM[spec.dtype], shape=tensor_pb2.TensorShapeProto(dim=dims))


def _spec_from_proto(proto: tensor_pb2.TensorSpecProto, where: str) -> TensorSpec:
    try:
        dtype = _dtype_name(proto.dtype)
    except GraphError as err:
        raise GraphError(f"{where}: {err}") from None
    dims = tuple(proto.shape.dim)
    if any(d < -1 for d in dims):
        raise GraphError(f"{where}: shape {list(dims)} has a dim below -1 (-1 marks an unknown dim)")
    return TensorSpec(tuple(None if d == -1 else d for d in dims), dtype)


def _specs_text(specs: list[TensorSpec]) -> str:
    return ", ".join(f"{fmt(s.shape)} {s.dtype}" for s in specs) or "none"


# -------------------------------------------------------------------- attrs
def _attr_to_proto(value: Any, node: Node, path: str) -> graph_pb2.AttrValue:
    out = graph_pb2.AttrValue()
    if value is None:
        out.none.SetInParent()
    elif isinstance(value, (bool, np.bool_)):  # before int: bool is an int
        out.b = bool(value)
    elif isinstance(value, (int, np.integer)):
        if not _INT64[0] <= value <= _INT64[1]:
            raise GraphError(f"cannot export attr {path} of {node.describe()}: int {value} does not fit in 64 bits")
        out.i = int(value)
    elif isinstance(value, (float, np.float16, np.float32, np.float64)):  # exact as a double
        out.f = float(value)
    elif isinstance(value, str):
        out.s = value
    elif isinstance(value, np.ndarray):
        try:
            out.tensor.CopyFrom(to_tensor_proto(value))
        except DTypeError as err:
            raise DTypeError(f"cannot export attr {path} of {node.describe()}: {err}") from None
    elif isinstance(value, (tuple, list)):
        items = out.tuple if isinstance(value, tuple) else out.list
        items.SetInParent()  # an empty tuple is still a tuple
        for i, item in enumerate(value):
            items.value.append(_attr_to_proto(item, node, f"{path}[{i}]"))
    else:
        raise GraphError(
            f"cannot export attr {path} of {node.describe()}: a value of type {type(value).__name__} "
            f"is not supported (supported: {_SUPPORTED})"
        )
    return out


def _attr_from_proto(value: graph_pb2.AttrValue, where: str) -> Any:
    kind = value.WhichOneof("value")
    if kind is None:
        raise GraphError(f"{where} has no value")
    if kind == "none":
        return None
    if kind == "tensor":
        try:
            return from_tensor_proto(value.tensor)
        except GraphError as err:
            raise GraphError(f"{where}: {err}") from None
    if kind == "tuple":
        return tuple(_attr_from_proto(v, f"{where}[{i}]") for i, v in enumerate(value.tuple.value))
    if kind == "list":
        return [_attr_from_proto(v, f"{where}[{i}]") for i, v in enumerate(value.list.value)]
    return getattr(value, kind)


# ------------------------------------------------------------ Graph -> proto
def to_graphdef(graph: Graph) -> graph_pb2.GraphDef:
    """The ``GraphDef`` of ``graph``: every node, in the graph's order.

    Raises ``GraphError`` naming the node and attr when an attr value has a
    type a GraphDef cannot hold.
    """
    graphdef = graph_pb2.GraphDef(versions=graph_pb2.VersionDef(producer=GRAPHDEF_VERSION, min_consumer=MIN_CONSUMER))
    for node in graph.nodes:
        graphdef.node.append(_node_to_proto(graph, node))
    return graphdef


def computed_by(tensor: Tensor) -> dict[str, bytes]:
    """What ``tensor`` is computed from: each node it depends on, by name, as its NodeDef's bytes without where it
    was written (cell, file, line) or a variable's initial value (trained values stand for it). Equal for the same
    computation, whichever cell run made the nodes: a job compares the graph it trains with the graph now.

    >>> import cellgraph as cg
    >>> g = cg.Graph()
    >>> with g.as_default():
    ...     w = cg.variable([1.0], name="w")
    ...     y = cg.mul(w, 2.0, name="y")
    >>> sorted(computed_by(y))
    ['const', 'w', 'y']
    """
    graph, todo = tensor.graph, [tensor.node]
    found: dict[str, bytes] = {}
    while todo:
        node = todo.pop()
        if node.name in found:
            continue
        proto = _node_to_proto(graph, node)
        for where in ("cell", "cell_label", "file", "line"):
            proto.ClearField(where)  # type: ignore[arg-type]
        if node.op == "Variable":
            del proto.attr["initial_value"]
        found[node.name] = proto.SerializeToString(deterministic=True)
        todo += [t.node for t in node.inputs] + list(node.control_inputs)
    return found


def _removed(node: Node) -> graph_pb2.RemovedNode:
    return graph_pb2.RemovedNode(op=node.op, output=[_spec_to_proto(s) for s in node.specs])


def _node_to_proto(graph: Graph, node: Node) -> graph_pb2.NodeDef:
    proto = graph_pb2.NodeDef(name=node.name, op=node.op, device=node.device)
    # An input whose node is gone (its cell was re-run without it) still names
    # it; removed_input keeps what the node was, since no NodeDef describes it.
    for i, t in enumerate(node.inputs):
        proto.input.append(t.name)
        if t.node not in graph:
            proto.removed_input[i].CopyFrom(_removed(t.node))
    for i, dep in enumerate(node.control_inputs):
        proto.control_input.append(dep.name)
        if dep not in graph:
            proto.removed_control_input[i].CopyFrom(_removed(dep))
    for key in sorted(node.attrs):
        proto.attr[key].CopyFrom(_attr_to_proto(node.attrs[key], node, repr(key)))
    if node.cell is not None:
        proto.cell = node.cell
    if node.cell_label is not None:
        proto.cell_label = str(node.cell_label)
    if node.file is not None:
        proto.file = node.file
    if node.line is not None:
        if not _INT32[0] <= node.line <= _INT32[1]:
            raise GraphError(f"cannot export {node.describe()}: line {node.line} does not fit in 32 bits")
        proto.line = node.line
    if node.stale is not None:
        proto.stale = node.stale
    proto.output.extend(_spec_to_proto(s) for s in node.specs)
    return proto


# ------------------------------------------------------------ proto -> Graph
def from_graphdef(graphdef: graph_pb2.GraphDef) -> Graph:
    """A new ``Graph`` with the nodes of ``graphdef``, each checked by its op's shape rule.

    Names, devices, cells (and the graph's ``cells`` index), source lines,
    control inputs and stale markers are kept as written. Raises
    ``RegistryError`` for an unknown op, ``GraphError`` for a duplicate name,
    an input naming a missing node, a cycle, an unreadable attr or recorded
    output types the shape rule disagrees with, and the shape rule's own
    ``ShapeError`` / ``DTypeError``; each message names the node.
    """
    versions = graphdef.versions
    if versions.min_consumer > GRAPHDEF_VERSION:
        raise GraphError(
            f"this GraphDef needs a reader of format version {versions.min_consumer} or later "
            f"(it was written by version {versions.producer}); this cellgraph reads version "
            f"{GRAPHDEF_VERSION}: upgrade cellgraph"
        )
    defs: dict[str, graph_pb2.NodeDef] = {}
    position: dict[str, int] = {}
    for i, proto in enumerate(graphdef.node):
        _check_name(proto, i)
        if proto.name in defs:
            raise GraphError(
                f"GraphDef has two nodes named {proto.name!r} ({defs[proto.name].op} #{position[proto.name]} "
                f"and {proto.op} #{i}); node names must be unique"
            )
        defs[proto.name] = proto
        position[proto.name] = i
    graph = Graph()
    built: dict[str, Node] = {}
    stand_ins: dict[tuple[str, bytes], Node] = {}
    for name in _topological_order(defs):
        built[name] = _node_from_proto(graph, defs[name], built, stand_ins)
    for proto in graphdef.node:
        graph._add(built[proto.name])
    return graph


def _check_name(proto: graph_pb2.NodeDef, i: int) -> None:
    if not proto.name:
        raise GraphError(f"GraphDef node #{i} ({proto.op or 'no op'}) has no name")


def _parse_input(text: str, proto: graph_pb2.NodeDef) -> tuple[str, int]:
    name, colon, index = text.rpartition(":")
    if not colon:
        return text, 0
    if not name or not index.isdigit():
        raise GraphError(f"GraphDef node {proto.name!r} ({proto.op}): input {text!r} is not 'node:index'")
    return name, int(index)


def _dependencies(proto: graph_pb2.NodeDef, defs: dict[str, graph_pb2.NodeDef]) -> list[str]:
    """The nodes ``proto`` reads or waits for, checked to exist."""
    deps = []
    for i, text in enumerate(proto.input):
        name, _ = _parse_input(text, proto)
        if i in proto.removed_input:
            continue
        if name not in defs:
            raise GraphError(f"GraphDef node {proto.name!r} ({proto.op}): input {text!r} names no node in the GraphDef")
        deps.append(name)
    for i, name in enumerate(proto.control_input):
        if i in proto.removed_control_input:
            continue
        if name not in defs:
            raise GraphError(
                f"GraphDef node {proto.name!r} ({proto.op}): control input {name!r} names no node in the GraphDef"
            )
        deps.append(name)
    return deps


def dependency_order(graphdef: graph_pb2.GraphDef) -> list[str]:
    """``graphdef``'s node names, each after the nodes it reads (in the written order where that allows)."""
    return _topological_order({proto.name: proto for proto in graphdef.node})


def _topological_order(defs: dict[str, graph_pb2.NodeDef]) -> list[str]:
    """Node names, each after everything it depends on; raise naming a cycle."""
    deps = {name: _dependencies(proto, defs) for name, proto in defs.items()}
    done: set[str] = set()
    order: list[str] = []
    for root in defs:
        if root in done:
            continue
        # Iterative depth-first search: a deep chain must not hit the recursion limit.
        path = [root]
        on_path = {root}
        pending = [iter(deps[root])]
        while pending:
            for dep in pending[-1]:
                if dep in on_path:
                    loop = [*path[path.index(dep) :], dep]
                    raise GraphError(
                        "GraphDef nodes form a cycle (each reads the next): " + " -> ".join(repr(n) for n in loop)
                    )
                if dep not in done:
                    path.append(dep)
                    on_path.add(dep)
                    pending.append(iter(deps[dep]))
                    break
            else:
                pending.pop()
                finished = path.pop()
                on_path.discard(finished)
                done.add(finished)
                order.append(finished)
    return order


def _stand_in(graph: Graph, name: str, removed: graph_pb2.RemovedNode, cache: dict[tuple[str, bytes], Node]) -> Node:
    """The node a removed input named: outside the graph, never run, kept for its name and types."""
    key = (name, removed.SerializeToString(deterministic=True))
    if key not in cache:
        specs = [_spec_from_proto(s, f"removed input {name!r}") for s in removed.output]
        cache[key] = Node(name=name, op=removed.op, inputs=[], attrs={}, specs=specs, graph=graph)
    return cache[key]


def _node_from_proto(
    graph: Graph,
    proto: graph_pb2.NodeDef,
    built: dict[str, Node],
    stand_ins: dict[tuple[str, bytes], Node],
) -> Node:
    """Build one node as ``Graph.create_node`` would, but with the name, device and cell given."""
    try:
        opdef = OPS.lookup(proto.op)
    except RegistryError as err:
        raise RegistryError(f"GraphDef node {proto.name!r}: {err}") from None
    inputs: list[Tensor] = []
    for i, text in enumerate(proto.input):
        name, index = _parse_input(text, proto)
        source = _stand_in(graph, name, proto.removed_input[i], stand_ins) if i in proto.removed_input else built[name]
        if index >= len(source.specs):
            raise GraphError(
                f"GraphDef node {proto.name!r} ({proto.op}): input {text!r} asks for output {index}, "
                f"but {source.op} {source.name!r} has {len(source.specs)} output(s)"
            )
        inputs.append(source.output(index))
    control_inputs = [
        _stand_in(graph, name, proto.removed_control_input[i], stand_ins)
        if i in proto.removed_control_input
        else built[name]
        for i, name in enumerate(proto.control_input)
    ]
    node = Node(
        name=proto.name,
        op=proto.op,
        inputs=inputs,
        attrs={},
        device=proto.device,
        cell=proto.cell if proto.HasField("cell") else None,
        cell_label=proto.cell_label if proto.HasField("cell_label") else None,
        line=proto.line if proto.HasField("line") else None,
        file=proto.file if proto.HasField("file") else None,
        control_inputs=control_inputs,
        graph=graph,
        stale=proto.stale if proto.HasField("stale") else None,
    )
    node.attrs = {
        key: _attr_from_proto(proto.attr[key], f"{node.describe()} attr {key!r}") for key in sorted(proto.attr)
    }
    recorded = [_spec_from_proto(s, f"{node.describe()} output {i}") for i, s in enumerate(proto.output)]
    if node.stale is not None:
        # A stale node's inputs no longer fit its shape rule: it keeps the types it had.
        node.specs = recorded
        return node
    inferred = opdef.infer(InferContext(node, [t.spec for t in inputs]))
    specs = list(inferred) if isinstance(inferred, list) else [inferred]
    if proto.output and specs != recorded:
        raise GraphError(
            f"{node.describe()}: the GraphDef records outputs {_specs_text(recorded)} "
            f"but the shape rule gives {_specs_text(specs)}"
        )
    node.specs = specs
    return node


__all__ = [
    "GRAPHDEF_VERSION",
    "dependency_order",
    "from_graphdef",
    "from_tensor_proto",
    "to_graphdef",
    "to_tensor_proto",
]
