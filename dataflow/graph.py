"""The graph IR: ``Graph`` holds ``Node``s and hands out ``Tensor`` handles.

Name scopes, device scopes and control dependencies are stacks on the graph,
applied as each node is created. A node records the cell and source line that
created it, so every error can point back at the user's code.
"""

from __future__ import annotations

import difflib
import itertools
import os
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from . import display
from .devices import DeviceSpec, merge
from .dtypes import STRING
from .errors import DTypeError, GraphError
from .names import NameTable
from .opdef import OPS, InferContext, OpDef, Shape, TensorSpec

if TYPE_CHECKING:
    from cellgraph.protos import graph_pb2

    from .cells import CellRun

# Frames from these folders are cellgraph's own; the first frame outside them
# is the user's line that created a node.
_OWN_DIRS = tuple(
    os.path.dirname(os.path.abspath(p)) + os.sep
    for p in (__file__, os.path.join(os.path.dirname(__file__), "..", "cellgraph", "x"))
)


def _user_location() -> tuple[str | None, int | None]:
    frame = sys._getframe(2)
    while frame is not None:
        filename = os.path.abspath(frame.f_code.co_filename)
        if not filename.startswith(_OWN_DIRS) and not filename.endswith("contextlib.py"):
            return frame.f_code.co_filename, frame.f_lineno
        frame = frame.f_back  # type: ignore[assignment]
    return None, None


_graph_numbers = itertools.count(1)


@dataclass(eq=False)
class Node:
    """One operation in a graph. Identity, not value, makes two nodes equal."""

    name: str
    op: str
    inputs: list[Tensor]
    attrs: dict[str, Any]
    device: str = ""
    cell: str | None = None
    cell_label: str | None = None
    line: int | None = None
    file: str | None = None
    control_inputs: list[Node] = field(default_factory=list)
    specs: list[TensorSpec] = field(default_factory=list)
    graph: Graph | None = field(default=None, repr=False)
    # Why this node can no longer run (its input was replaced and no longer
    # fits), or None while it is healthy.
    stale: str | None = None
    # Why this node left its graph, and what to do instead, or None while it is in it.
    removed: str | None = field(default=None, repr=False)
    _outputs: list[Tensor] = field(default_factory=list, repr=False)

    @property
    def opdef(self) -> OpDef:
        """This node's registry entry."""
        return OPS.lookup(self.op)

    @property
    def outputs(self) -> list[Tensor]:
        if len(self._outputs) != len(self.specs):
            self._outputs = [Tensor(self, i) for i in range(len(self.specs))]
        return self._outputs

    def output(self, index: int = 0) -> Tensor:
        return self.outputs[index]

    def where(self) -> str:
        """Where the node was made: ``cell 7, line 3`` or ``file.py:12``."""
        if self.cell is not None:
            label = self.cell_label if self.cell_label is not None else self.cell
            return f"cell {label}, line {self.line}" if self.line else f"cell {label}"
        if self.file is not None:
            return f"{os.path.basename(self.file)}:{self.line}"
        return "unknown location"

    def describe(self) -> str:
        """``MatMul 'dense/matmul' (cell 7, line 3)``: the prefix of every node error."""
        return f"{self.op} '{self.name}' ({self.where()})"


@dataclass(frozen=True, eq=False)
class Tensor:
    """A handle to one output of a node."""

    node: Node
    index: int = 0

    @property
    def spec(self) -> TensorSpec:
        return self.node.specs[self.index]

    @property
    def shape(self) -> Shape:
        return self.spec.shape

    @property
    def dtype(self) -> str:
        return self.spec.dtype

    @property
    def name(self) -> str:
        return f"{self.node.name}:{self.index}"

    @property
    def graph(self) -> Graph:
        assert self.node.graph is not None
        return self.node.graph

    @property
    def op(self) -> str:
        return self.node.op

    def __repr__(self) -> str:
        dims = ", ".join("?" if d is None else str(d) for d in self.shape)
        return f"<Tensor {self.name!r} shape=({dims}) dtype={self.dtype}>"

    # NumPy defers to the reflected operators below: without this, ``array - tensor``
    # would become an object array of one-element graph ops instead of one op.
    __array_ufunc__ = None

    # Python operators build graph ops; the functions live in the op families.
    def __add__(self, other: Any) -> Tensor:
        from .ops import math

        return math.add(self, other)

    def __radd__(self, other: Any) -> Tensor:
        from .ops import math

        return math.add(other, self)

    def __sub__(self, other: Any) -> Tensor:
        from .ops import math

        return math.sub(self, other)

    def __rsub__(self, other: Any) -> Tensor:
        from .ops import math

        return math.sub(other, self)

    def __mul__(self, other: Any) -> Tensor:
        from .ops import math

        return math.mul(self, other)

    def __rmul__(self, other: Any) -> Tensor:
        from .ops import math

        return math.mul(other, self)

    def __truediv__(self, other: Any) -> Tensor:
        from .ops import math

        return math.div(self, other)

    def __rtruediv__(self, other: Any) -> Tensor:
        from .ops import math

        return math.div(other, self)

    def __matmul__(self, other: Any) -> Tensor:
        from .ops import math

        return math.matmul(self, other)

    def __rmatmul__(self, other: Any) -> Tensor:
        from .ops import math

        return math.matmul(other, self)

    def __pow__(self, other: Any) -> Tensor:
        from .ops import math

        return math.pow(self, other)

    def __neg__(self) -> Tensor:
        from .ops import math

        return math.neg(self)

    if TYPE_CHECKING:  # installed from the table in ops/operators.py; declared here for type checkers

        def __rpow__(self, other: Any) -> Tensor: ...
        def __abs__(self) -> Tensor: ...
        def __lt__(self, other: Any) -> Tensor: ...
        def __le__(self, other: Any) -> Tensor: ...
        def __gt__(self, other: Any) -> Tensor: ...
        def __ge__(self, other: Any) -> Tensor: ...
        def __floordiv__(self, other: Any) -> Tensor: ...
        def __rfloordiv__(self, other: Any) -> Tensor: ...
        def __mod__(self, other: Any) -> Tensor: ...
        def __rmod__(self, other: Any) -> Tensor: ...
        def __and__(self, other: Any) -> Tensor: ...
        def __rand__(self, other: Any) -> Tensor: ...
        def __or__(self, other: Any) -> Tensor: ...
        def __ror__(self, other: Any) -> Tensor: ...
        def __xor__(self, other: Any) -> Tensor: ...
        def __rxor__(self, other: Any) -> Tensor: ...
        def __invert__(self) -> Tensor: ...

    def __getitem__(self, key: Any) -> Tensor:
        from .ops import array_slice

        return array_slice.getitem(self, key)

    def __iter__(self) -> Iterator[Tensor]:
        # Without this, Python would iterate through __getitem__ with ever
        # larger indices; with an unknown first dim that would never end.
        if not self.shape or self.shape[0] is None:
            raise GraphError(
                f"cannot iterate over tensor {self.name!r} of shape {_fmt(self.shape)}: "
                "its first dimension must be known; index or slice it instead"
            )
        return (self[i] for i in range(self.shape[0]))

    def __bool__(self) -> bool:
        raise GraphError(
            f"the truth value of tensor {self.name!r} is unknown until the graph runs; "
            "use cg.equal / cg.less and run them in a Session"
        )


class Graph:
    """A dataflow graph: nodes in creation order, plus the scopes that name them."""

    def __init__(self) -> None:
        # A number in creation order: how messages tell two graphs apart.
        self.number = next(_graph_numbers)
        self._nodes: dict[str, Node] = {}
        # The names in use, so a new scope or node gets a fresh name, and removing a cell's nodes frees theirs.
        self._names = NameTable()
        self._name_stack: list[str] = []
        self._device_stack: list[str] = []
        self._control_stack: list[list[Node]] = []
        self._colocate_stack: list[Node] = []
        self._cell_run: CellRun | None = None
        self.cells: dict[str, list[str]] = {}
        # Bumped by every change, so executors can cache plans per version.
        self.version = 0
        # What the notebook calls it (a %%graph NAME cell's NAME), said in messages beside the number.
        self.label: str | None = None

    # ----------------------------------------------------------------- nodes
    @property
    def nodes(self) -> list[Node]:
        return list(self._nodes.values())

    def __iter__(self) -> Iterator[Node]:
        return iter(list(self._nodes.values()))

    def __len__(self) -> int:
        return len(self._nodes)

    def describe(self) -> str:
        """``graph #3 (12 nodes, the default graph)``, or ``graph 'mlp' (#3, 12 nodes)`` for a labelled one: how
        errors name a graph."""
        default = ", the default graph" if get_default_graph() is self else ""
        size = f"{len(self._nodes)} node{'' if len(self._nodes) == 1 else 's'}{default}"
        if self.label is not None:
            return f"graph {self.label!r} (#{self.number}, {size})"
        return f"graph #{self.number} ({size})"

    def __contains__(self, item: object) -> bool:
        if isinstance(item, Tensor):
            item = item.node
        return isinstance(item, Node) and self._nodes.get(item.name) is item

    def node(self, name: str) -> Node:
        try:
            return self._nodes[name]
        except KeyError:
            raise GraphError(f"no node named {name!r} in this graph{self._near(name)}") from None

    def _near(self, name: str) -> str:
        """What a missing ``name`` may have meant: the nodes of a scope of that name (a layer is a scope, so
        ``"logits"`` is ``"logits/..."``), else names spelt nearly so."""
        inside = [n for n in self._nodes if n.startswith(f"{name}/")]
        if inside:
            shown = ", ".join(repr(n) for n in inside[-3:])
            return f"; {name!r} is a scope of {len(inside)} node(s), the last {shown}: name one of them"
        close = difflib.get_close_matches(name, list(self._nodes), n=3)
        return f"; did you mean {' or '.join(repr(n) for n in close)}?" if close else ""

    def tensor(self, name: str) -> Tensor:
        """The tensor ``"node:index"`` (or ``"node"`` for output 0)."""
        node_name, _, index = name.partition(":")
        node = self.node(node_name)
        if index and not index.isdigit():
            raise GraphError(f"bad tensor name {name!r}: use 'node' or 'node:index'")
        i = int(index) if index else 0
        if not 0 <= i < len(node.specs):
            outputs = f"{len(node.specs)} output{'' if len(node.specs) == 1 else 's'}"
            raise GraphError(f"node {node_name!r} has {outputs}, not index {i}")
        return node.output(i)

    def as_graph_def(self) -> graph_pb2.GraphDef:
        """This graph as a ``GraphDef`` protobuf; ``cg.from_graphdef`` reads it back."""
        from .graphdef import to_graphdef

        return to_graphdef(self)

    def variables(self) -> list[Node]:
        return [n for n in self._nodes.values() if n.op == "Variable"]

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None, **_: Any) -> dict[str, Any]:
        """In a Jupyter kernel, a GraphView of this graph; elsewhere (a terminal), a text summary."""
        return display.bundle("graph", self, include, exclude)  # the widget side's, registered from above

    def _add(self, node: Node) -> None:
        node.removed = None
        self._nodes[node.name] = node
        self._names.take(node.name)
        if node.cell is not None:
            self.cells.setdefault(node.cell, []).append(node.name)
        self.version += 1

    def _remove(self, node: Node, why: str | None = None) -> None:
        """Take ``node`` out; ``why`` (and what to do instead) is what a later use of it is told."""
        node.removed = why
        del self._nodes[node.name]
        self._names.release(node.name)
        if node.cell is not None and node.cell in self.cells:
            names = self.cells[node.cell]
            if node.name in names:
                names.remove(node.name)
        self.version += 1

    def unique_name(self, name: str) -> str:
        """``name`` under the current name scope, suffixed ``_1``, ``_2`` if taken."""
        full = "/".join([*self._name_stack, name]) if self._name_stack else name
        return self._names.unique(full)

    # ---------------------------------------------------------------- scopes
    @contextmanager
    def as_default(self) -> Iterator[Graph]:
        _default.stack.append(self)
        try:
            for hook in list(_graph_hooks):
                hook(self, "as_default")
            yield self
        finally:
            _default.stack.pop()

    @contextmanager
    def name_scope(self, name: str, reopen: bool = False) -> Iterator[str]:
        """Prefix the names of nodes made inside with ``name/`` (made unique).

        With ``reopen``, ``name`` is a whole scope that an earlier ``name_scope`` yielded, entered again as it is:
        what one object builds in two calls (mixed precision's gradients, then its update) shares one scope.
        """
        if reopen and (":" in name or not all(name.split("/"))):
            raise GraphError(f"bad name scope {name!r} to reopen: use a scope that name_scope yielded")
        if not reopen and (not name or "/" in name or ":" in name):
            raise GraphError(f"bad name scope {name!r}: use a non-empty name without '/' or ':'")
        scope = name if reopen else self.unique_name(name)
        saved = self._name_stack
        self._name_stack = scope.split("/")
        # Reserve the scope so a sibling scope of the same name gets a suffix.
        self._names.reserve(scope)
        try:
            yield scope
        finally:
            self._name_stack = saved
            self._names.unreserve(scope)

    @contextmanager
    def device(self, spec: str | DeviceSpec | None) -> Iterator[None]:
        """Place nodes made inside on ``spec``, merged with the enclosing scopes.

        Parts left out of ``spec`` come from the enclosing scope, as in
        TensorFlow; ``None`` clears the enclosing scopes. A malformed name
        raises ``PlacementError`` here, not when the graph is placed.
        """
        outer = DeviceSpec.parse(self._device_stack[-1]) if self._device_stack else DeviceSpec()
        merged = DeviceSpec() if spec is None else merge(outer, DeviceSpec.parse(spec))
        self._device_stack.append(str(merged))
        try:
            yield
        finally:
            self._device_stack.pop()

    @contextmanager
    def control_dependencies(self, deps: Iterable[Tensor | Node]) -> Iterator[None]:
        nodes = [d.node if isinstance(d, Tensor) else d for d in deps]
        for d in nodes:
            self._check_owned(d)
        self._control_stack.append(nodes)
        try:
            yield
        finally:
            self._control_stack.pop()

    @contextmanager
    def colocate_with(self, tensor: Tensor | Node) -> Iterator[None]:
        node = tensor.node if isinstance(tensor, Tensor) else tensor
        self._check_owned(node)
        self._colocate_stack.append(node)
        try:
            yield
        finally:
            self._colocate_stack.pop()

    def _check_owned(self, node: Node, user: str | None = None) -> None:
        """Refuse a node of another graph, or one no longer in this one; ``user`` names the op being built."""
        prefix = f"{user}: input" if user else "node"
        if node.graph is not self:
            other = node.graph.describe() if node.graph is not None else "no graph"
            raise GraphError(
                f"{prefix} {node.name!r} ({node.where()}) belongs to another graph, {other}, "
                f"not to {self.describe()}; build both in one graph (with graph.as_default())"
            )
        if self._nodes.get(node.name) is not node:
            why = node.removed or "its cell was re-run; use the new handle"
            raise GraphError(f"{prefix} {node.name!r} ({node.where()}) was removed from the graph ({why})")

    # ------------------------------------------------------------- creation
    def create_node(
        self,
        op: str,
        inputs: Sequence[Tensor],
        attrs: dict[str, Any] | None = None,
        name: str | None = None,
    ) -> Node:
        """Build, shape-check and add one node; raise before adding anything."""
        if name is not None and ":" in name:
            # A tensor is named node:index, so "a:b" would later be looked up as node 'a'.
            raise GraphError(f"bad node name {name!r}: use a name without ':' (a tensor is named node:index)")
        opdef = OPS.lookup(op)
        file, line = _user_location()
        if self._cell_run is None:
            for hook in list(_graph_hooks):
                hook(self, "node")  # the notebook extension may open the running cell's scope here
        run = self._cell_run
        for t in inputs:
            if not isinstance(t, Tensor):
                raise GraphError(f"{op} input {t!r} is not a Tensor")
            if t.node.graph is not self or self._nodes.get(t.node.name) is not t.node:
                where = (
                    f"cell {run.label}, line {line}"
                    if run is not None and line
                    else (f"{os.path.basename(file)}:{line}" if file else "unknown location")
                )
                self._check_owned(t.node, user=f"{op} '{self.unique_name(name or _snake(op))}' ({where})")
        node = Node(
            name=self.unique_name(name or _snake(op)),
            op=op,
            inputs=list(inputs),
            attrs=dict(attrs or {}),
            device=self._device_stack[-1] if self._device_stack else "",
            cell=run.cell_id if run else None,
            cell_label=run.label if run else None,
            line=line,
            file=file,
            control_inputs=[n for deps in self._control_stack for n in deps],
            graph=self,
        )
        if self._colocate_stack:
            node.attrs.setdefault("_colocate", self._colocate_stack[-1].name)
        specs = opdef.infer(InferContext(node, [t.spec for t in inputs]))
        node.specs = list(specs) if isinstance(specs, list) else [specs]
        if not opdef.strings:
            _refuse_strings(node)
        if run is not None:
            run.adopt(node)
        self._add(node)
        return node

    @contextmanager
    def atomic(self) -> Iterator[None]:
        """Build several nodes as one change: if the block raises, every node it
        added is taken out again, so a rejected request leaves the graph as it was."""
        mark = len(self._nodes)
        try:
            yield
        except BaseException:
            for node in list(self._nodes.values())[mark:][::-1]:
                self._remove(node)
                if self._cell_run is not None and node in self._cell_run.new:
                    self._cell_run.new.remove(node)
            raise


def _refuse_strings(node: Node) -> None:
    """A DTypeError when ``node`` reads or makes a string tensor but its op computes on none."""
    text = [f"input {i} {t.name!r}" for i, t in enumerate(node.inputs) if t.dtype == STRING]
    text += [f"output {i}" for i, s in enumerate(node.specs) if s.dtype == STRING]
    if text:
        takers = ", ".join(name for name in OPS if OPS.lookup(name).strings)
        raise DTypeError(
            f"{node.describe()} does not take string tensors (string: {', '.join(text)}); the ops that do: {takers}"
        )


def _fmt(shape: Shape) -> str:
    from .shapes import fmt

    return fmt(shape)


def _snake(op: str) -> str:
    out = []
    for i, ch in enumerate(op):
        if ch.isupper() and i and not op[i - 1].isupper():
            out.append("_")
        out.append(ch.lower())
    return "".join(out)


class _DefaultGraph(threading.local):
    def __init__(self) -> None:
        self.stack: list[Graph] = []


_default = _DefaultGraph()
_global_graph = Graph()
# Called as ``with graph.as_default()`` enters a graph (``hook(graph, "as_default")``) and as a node is about to be
# added to a graph with no cell scope open (``hook(graph, "node")``), on that thread. The notebook extension opens
# the running cell's scope there, so that a cell building into its own graph is a cell there too. The IR knows
# nothing of notebooks: the extension adds its hook, and takes it away on unload.
_graph_hooks: list[Callable[[Graph, str], None]] = []


def add_graph_hook(hook: Callable[[Graph, str], None]) -> Callable[[], None]:
    """Call ``hook(graph, "as_default" | "node")`` (see ``_graph_hooks``); return what removes it again."""
    _graph_hooks.append(hook)
    return lambda: _graph_hooks.remove(hook) if hook in _graph_hooks else None


def get_default_graph() -> Graph:
    """The innermost ``with g.as_default()`` graph, else one global graph."""
    return _default.stack[-1] if _default.stack else _global_graph


def reset_default_graph() -> Graph:
    """Replace the global default graph with an empty one and return it."""
    global _global_graph
    if _default.stack:
        raise GraphError("reset_default_graph() inside a 'with graph.as_default()' block")
    _global_graph = Graph()
    return _global_graph


def name_scope(name: str) -> Any:
    return get_default_graph().name_scope(name)


def device(spec: str | DeviceSpec | None) -> Any:
    return get_default_graph().device(spec)


def control_dependencies(deps: Iterable[Tensor | Node]) -> Any:
    return get_default_graph().control_dependencies(deps)


def colocate_with(tensor: Tensor | Node) -> Any:
    return get_default_graph().colocate_with(tensor)
