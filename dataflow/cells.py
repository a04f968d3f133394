"""Cell-aware graphs: re-running a notebook cell replaces that cell's nodes.

TensorFlow 1's default graph grows ``dense_1``, ``dense_2``, ... each time a
cell is re-run, and old nodes keep feeding the new ones. Here a cell's nodes are
taken out of the graph when the cell starts again, the re-run makes them anew
under the same names, and nodes in other cells that consumed them are re-bound
to the new ones, or marked stale (with the cells to re-run) when they no longer
fit. A cell that raises leaves the graph exactly as it was.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np

from .errors import CellgraphError, GraphError
from .graph import Graph, Node, get_default_graph
from .opdef import InferContext


class CellgraphWarning(UserWarning):
    """Something the user should know about but that does not stop the cell."""


def _fmt(shape: tuple[int | None, ...]) -> str:
    dims = [("None" if d is None else str(d)) for d in shape]
    return "(" + ", ".join(dims) + ("," if len(dims) == 1 else "") + ")"


def _same_initial_value(old: Node, new: Node) -> bool:
    """Whether a re-run defined variable ``new`` as ``old`` was (a session keeps its trained value then)."""
    a, b = np.asarray(old.attrs["initial_value"]), np.asarray(new.attrs["initial_value"])
    return a.shape == b.shape and bool(np.array_equal(a, b, equal_nan=a.dtype.kind not in "biu"))


class CellRun:
    """One execution of a cell: the nodes it replaces and the nodes it makes."""

    def __init__(self, graph: Graph, cell_id: str, label: str | None) -> None:
        self.graph = graph
        self.cell_id = cell_id
        self.label = str(label) if label is not None else cell_id
        self.old: dict[str, Node] = {}
        self.new: list[Node] = []

    def begin(self) -> None:
        for name in list(self.graph.cells.get(self.cell_id, [])):
            node = self.graph.node(name)
            self.old[name] = node
            self.graph._remove(node, "its cell was re-run; use the new handle")
        self.graph.cells.pop(self.cell_id, None)

    def adopt(self, node: Node) -> None:
        self.new.append(node)

    def rollback(self) -> None:
        why = f"cell {self.label} raised an error, and the nodes it had made were rolled back; fix and re-run that cell"
        for node in reversed(self.new):
            if node.name in self.graph._nodes:
                self.graph._remove(node, why)
        self.graph.cells.pop(self.cell_id, None)
        for node in self.old.values():
            self.graph._add(node)

    def commit(self) -> list[str]:
        """Re-bind consumers of replaced nodes; return the warnings given."""
        new_by_name = {n.name: n for n in self.new}
        notes = self._variable_notes(new_by_name)
        stale_cells: set[str] = set()
        loose: list[str] = []
        old_ids = {id(n) for n in self.old.values()}
        for consumer in self.graph.nodes:
            if consumer.cell == self.cell_id:
                continue
            touched = removed = False
            for i, t in enumerate(consumer.inputs):
                if id(t.node) not in old_ids:
                    continue
                touched = True
                replacement = new_by_name.get(t.node.name)
                if replacement is None or t.index >= len(replacement.specs):
                    removed = True
                    consumer.stale = f"its input {t.name!r} was removed when cell {self.label} was re-run"
                    continue
                consumer.inputs[i] = replacement.output(t.index)
            for i, c in enumerate(consumer.control_inputs):
                if id(c) not in old_ids:
                    continue
                touched = True
                if c.name in new_by_name:
                    consumer.control_inputs[i] = new_by_name[c.name]
                else:
                    removed = True
                    consumer.stale = f"its control input {c.name!r} was removed when cell {self.label} was re-run"
            if touched and not removed:
                self._reinfer(consumer)
            if touched and consumer.stale:
                if consumer.cell is None:
                    loose.append(consumer.name)
                else:
                    stale_cells.add(str(consumer.cell_label or consumer.cell))
        if stale_cells:
            cells = ", ".join(sorted(stale_cells))
            notes.append(f"re-running cell {self.label} made nodes in cell(s) {cells} stale; re-run cell(s) {cells}")
        if loose:
            names = ", ".join(repr(n) for n in loose)
            notes.append(
                f"re-running cell {self.label} made node(s) {names}, made outside any cell, stale; build them again"
            )
        self.graph.version += 1
        for note in notes:
            warnings.warn(note, CellgraphWarning, stacklevel=4)
        return notes

    def _reinfer(self, consumer: Node) -> None:
        missing = [t.name for t in consumer.inputs if t.node not in self.graph]
        missing += [c.name for c in consumer.control_inputs if c not in self.graph]
        if missing:  # another input is still gone: re-binding this one does not heal it
            consumer.stale = f"its input(s) {', '.join(repr(m) for m in missing)} are no longer in the graph"
            return
        try:
            specs = consumer.opdef.infer(InferContext(consumer, [t.spec for t in consumer.inputs]))
        except CellgraphError as err:
            reason = str(err).removeprefix(f"{consumer.describe()}: ")  # the prefix is said by whoever reports it
            consumer.stale = f"its inputs from cell {self.label} no longer fit: {reason}"
            return
        specs = list(specs) if isinstance(specs, list) else [specs]
        if specs != consumer.specs:
            before = ", ".join(_fmt(s.shape) for s in consumer.specs)
            after = ", ".join(_fmt(s.shape) for s in specs)
            consumer.stale = f"re-running cell {self.label} changed its output from {before} to {after}"
        else:
            consumer.stale = None

    def _variable_notes(self, new_by_name: dict[str, Node]) -> list[str]:
        notes = []
        for name, old in self.old.items():
            new = new_by_name.get(name)
            if old.op == "Variable" and new is not None and new.op == "Variable":
                if old.specs != new.specs:
                    o, n = old.specs[0], new.specs[0]
                    notes.append(
                        f"variable {name!r} (cell {self.label}) changed from "
                        f"{_fmt(o.shape)} {o.dtype} to {_fmt(n.shape)} {n.dtype}; "
                        "it is re-initialised"
                    )
                elif not _same_initial_value(old, new):
                    notes.append(
                        f"variable {name!r} (cell {self.label}) has a new initial value; "
                        "it is re-initialised, and its optimizer slots with it"
                    )
        return notes


@contextmanager
def cell_scope(cell_id: str, label: str | None = None, graph: Graph | None = None) -> Iterator[CellRun]:
    """Tag the nodes made inside with ``cell_id``; a second run replaces them.

    Examples
    --------
    >>> import cellgraph as cg
    >>> g = cg.Graph()
    >>> with g.as_default():
    ...     for _ in range(2):  # the same cell, run twice
    ...         with cg.cell_scope("cell-a", label="1"):
    ...             x = cg.placeholder((None, 4), "float32", name="x")
    >>> [n.name for n in g.nodes]
    ['x']
    """
    g = graph if graph is not None else get_default_graph()  # an empty Graph is falsy (len 0)
    if g._cell_run is not None:
        raise GraphError(f"cell_scope({cell_id!r}) inside cell_scope({g._cell_run.cell_id!r}): cell scopes do not nest")
    run = CellRun(g, str(cell_id), label)
    run.begin()
    g._cell_run = run
    try:
        yield run
    except BaseException:
        g._cell_run = None
        run.rollback()
        raise
    g._cell_run = None
    run.commit()
