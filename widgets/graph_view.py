"""GraphView: a dataflow graph in the notebook, with its scopes collapsed and its placement coloured.

The Python side owns the model (graph_layout.GraphModel) and sends the browser
every container's layout once, as the ``structure`` trait; the ES module
(graph_view.js) draws the open scopes (``expanded``) from it, and opens or
closes a scope on a click by itself, so that it never waits for a kernel busy
running a cell; ``expanded`` then syncs back. Selecting and searching are sent
as custom messages; the answers land in synced traits, so a notebook saved
with widget state shows the last view statically. ``scene`` is the visible part,
laid out as the browser draws it, for Python users and the tests.
"""

from __future__ import annotations

import threading
import time
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anywidget
import traitlets

from .graph_info import MAX_MATCHES, describe, search
from .graph_layout import GraphModel
from .graph_tree import GraphViewError
from .kernel_loop import in_kernel

if TYPE_CHECKING:
    from cellgraph.dataflow.graph import Graph
    from cellgraph.dataflow.placement import Placement

__all__ = ["GraphView", "GraphViewError"]

# The first drawing's messages go out before the layouts are computed (they share the interpreter).
STRUCTURE_DELAY_S = 0.1


class GraphView(anywidget.AnyWidget):
    """A dataflow graph with collapsible name scopes, coloured by device when given a placement.

    Parameters
    ----------
    graph : the graph to show.
    placement : what ``cg.placement.place(graph, devices)`` returned; nodes are
        then coloured by device, cross-device edges are drawn as Send/Recv, and
        the info panel says why each node went where it did. Without it, nodes
        are coloured by op family.

    Examples
    --------
    >>> import cellgraph as cg
    >>> from cellgraph.examples.models import mlp
    >>> view = GraphView(mlp().graph)
    >>> view.expand("hidden")
    >>> view.selected = "hidden/matmul"
    >>> view.info["op"], view.info["inputs"][0]["shape"]
    ('MatMul', '(None, 64)')
    """

    _esm = Path(__file__).with_name("graph_view.js")

    structure = traitlets.Dict(help="every item and container layout: what the browser draws from").tag(sync=True)
    scene = traitlets.Dict(help="the visible, laid-out part of the graph (what the browser draws)").tag(sync=True)
    hits = traitlets.List(traitlets.Unicode(), help="node names matching the query (all of them)").tag(sync=True)
    expanded = traitlets.List(traitlets.Unicode(), help="names of the open scopes and folded series").tag(sync=True)
    selected = traitlets.Unicode("", help="name of the selected node or scope ('' for none)").tag(sync=True)
    info = traitlets.Dict(help="the info panel's content for the selection").tag(sync=True)
    query = traitlets.Unicode("", help="the search box's text").tag(sync=True)
    matches = traitlets.List(traitlets.Unicode(), help="node names matching the query (the first 50)").tag(sync=True)
    error = traitlets.Unicode("", help="why the last request from the browser was refused").tag(sync=True)
    height = traitlets.Int(520, help="height of the drawing in pixels").tag(sync=True)

    def __init__(self, graph: Graph, placement: Placement | None = None) -> None:
        model = GraphModel(graph, placement)  # checks both arguments before any widget exists
        super().__init__()
        self._made = time.monotonic()
        _VIEWS.add(self)
        self._model = model
        self.scene = model.scene()
        self.layout_thread: threading.Thread | None = None
        """In a kernel, the thread computing ``structure`` (None once it was computed here)."""
        self._send_structure(model)
        self.on_msg(self._on_message)

    @property
    def graph(self) -> Graph:
        return self._model.graph

    def __repr__(self) -> str:
        head = f"<GraphView of {self.graph.describe()}"
        if self.comm is None:  # closed: IPython shows only this text now, where the view was (ipywidgets' close)
            return head + ", closed: display the graph itself again (or %graph NAME) for a new view>"
        return head + ">"

    @property
    def placement(self) -> Placement | None:
        return self._model.placement

    # ------------------------------------------------------------ requests
    def expand(self, name: str) -> None:
        """Open the scope (or folded series) ``name`` and those around it."""
        tree = self._model.tree
        item = tree.resolve(name, openable=True)
        around = [tree.items[i].name for i in tree.ancestors(item.id)]
        self.expanded = [*self.expanded, *around, item.name]

    def collapse(self, name: str) -> None:
        """Close ``name``; scopes open inside it stay open for when it reopens."""
        item = self._model.tree.resolve(name, openable=True)
        self.expanded = [n for n in self.expanded if n != item.name]

    def toggle(self, name: str) -> None:
        item = self._model.tree.resolve(name, openable=True)
        if item.name in self.expanded:
            self.collapse(name)
        else:
            self.expand(name)

    def reveal(self, name: str) -> None:
        """Open what hides the node or scope ``name``, and select it."""
        item = self._model.tree.resolve(name)
        ancestors = [self._model.tree.items[i].name for i in self._model.tree.ancestors(item.id)]
        with self.hold_sync():
            self.expanded = [*self.expanded, *ancestors]
            self.selected = name

    def search(self, query: str) -> list[str]:
        """Highlight what matches ``query`` (a name part, or an op type) and return the matching names."""
        found = search(self._model, query, limit=None)
        self._model.hits = set(found)
        with self.hold_sync():
            self.query = query
            self.hits = found
            self.matches = found[:MAX_MATCHES]
            self.scene = self._model.scene()
        return found

    def refresh(self) -> None:
        """Redraw from the graph as it is now (after a cell was re-run), keeping what still exists open."""
        if self._model.tree.version == self.graph.version:
            return
        model = GraphModel(self.graph, self.placement)
        keep = [n for n in self.expanded if _exists(model, n, openable=True)]
        self._model = model
        self._send_structure(model)
        with self.hold_sync():
            if self.selected and not _exists(model, self.selected):
                self.selected = ""  # first: the new scene's info panel must not look for it
            self.expanded = keep
            self.search(self.query)  # redraws the scene from the new model, hits included
            if self.selected:
                self.info = describe(model, model.tree.resolve(self.selected))

    def _send_structure(self, model: GraphModel) -> None:
        """Set ``structure`` (every container's layout, for the browser to open scopes by itself).

        In a kernel it is computed on a thread: for 10,000 nodes that takes about a second, and the first
        drawing (``scene``) must not wait for it; until it arrives, a click asks the kernel as before. The
        kernel's IOPub channel takes messages from any thread.
        """
        if not in_kernel():
            self.structure = model.structure()
            return

        def compute() -> None:
            time.sleep(STRUCTURE_DELAY_S)
            structure = model.structure()
            if model is self._model:  # not replaced by a refresh meanwhile
                self.structure = structure

        self.layout_thread = threading.Thread(target=compute, name="cellgraph-graphview-layout", daemon=True)
        self.layout_thread.start()

    # ----------------------------------------------------------- validation
    @traitlets.validate("expanded")
    def _check_expanded(self, proposal: dict[str, Any]) -> list[str]:
        # A scope open inside a closed one is remembered, not drawn, until that one opens.
        tree = self._model.tree
        return sorted({tree.resolve(name, openable=True).name for name in proposal["value"]})

    @traitlets.observe("expanded")
    def _expanded_changed(self, change: dict[str, Any]) -> None:
        self._model.set_expanded(change["new"])
        with self.hold_sync():
            self.scene = self._model.scene()
            if self.selected:  # a selected scope's panel says whether it is open
                self.info = describe(self._model, self._model.tree.resolve(self.selected))

    @traitlets.validate("selected")
    def _check_selected(self, proposal: dict[str, Any]) -> str:
        name = proposal["value"]
        if name:
            self._model.tree.resolve(name)
        return str(name)

    @traitlets.observe("selected")
    def _selected_changed(self, change: dict[str, Any]) -> None:
        name = change["new"]
        self.info = describe(self._model, self._model.tree.resolve(name)) if name else {}

    # ------------------------------------------------------ browser requests
    def set_state(self, sync_data: dict[str, Any]) -> None:
        """Changes from the browser (a scope it opened or closed, and its selection), read against the graph
        as it is now: a cell re-run since may have removed what it names. Those names are dropped and said in
        ``error``, never raised: there is no cell to raise into."""
        if "expanded" not in sync_data and "selected" not in sync_data:
            super().set_state(sync_data)
            return
        self.refresh()
        data = dict(sync_data)
        gone = [n for n in data.get("expanded", []) if not _exists(self._model, n, openable=True)]
        if gone:
            data["expanded"] = [n for n in data["expanded"] if n not in gone]
        if data.get("selected") and not _exists(self._model, data["selected"]):
            gone.append(data.pop("selected"))
        with self.hold_sync():
            super().set_state(data)
            self.error = (
                f"{', '.join(map(repr, gone))}: no longer in this graph (was its cell re-run?); "
                "the view shows the graph as it is now"
                if gone
                else ""
            )

    def _on_message(self, _widget: Any, content: dict[str, Any], _buffers: list[Any]) -> None:
        """One request from the browser; a bad one is answered in ``error`` and changes nothing."""
        try:
            with self.hold_sync():
                self.refresh()
                self._handle(content)
                self.error = ""
        except (GraphViewError, traitlets.TraitError) as err:
            self.error = str(err)

    def _handle(self, content: dict[str, Any]) -> None:
        kind = content.get("type") if isinstance(content, dict) else None
        tree = self._model.tree
        if kind in ("toggle", "select"):
            item_id = content.get("id")
            if not isinstance(item_id, str) or item_id not in tree.items or item_id == "":
                raise GraphViewError(f"{kind}: no item with id {item_id!r} in this graph (was it re-run?)")
            item = tree.items[item_id]
            if kind == "toggle":
                if item.kind == "node":
                    raise GraphViewError(f"toggle: {item.name!r} is a node, not a name scope; nothing to open")
                self.toggle(item.name)
            self.selected = item.name if tree.by_name.get(item.name) == item.id else self.selected
        elif kind == "reveal":
            self.reveal(str(content.get("name", "")))
        elif kind == "search":
            self.search(str(content.get("query", "")))
        else:
            raise GraphViewError(f"unknown request {kind!r}; GraphView understands toggle, select, reveal, search")


def _exists(model: GraphModel, name: str, openable: bool = False) -> bool:
    try:
        model.tree.resolve(name, openable=openable)
    except GraphViewError:
        return False
    return True


# Every view made in this process, for ``mark_views_stale``: weakly, as a view goes with its output.
_VIEWS: weakref.WeakSet[GraphView] = weakref.WeakSet()


def mark_views_stale(graph: Graph, label: str, since: float) -> None:
    """Say in each open view of ``graph`` drawn before ``since`` (``time.monotonic()``) that cell ``label`` was
    re-run and changed the graph: such a view went on showing the replaced nodes, as if current, until clicked.
    The notebook extension calls this when a re-run cell has replaced nodes; a click redraws the view (``refresh``)
    and clears the note."""
    for view in list(_VIEWS):
        if view.graph is graph and view.comm is not None and view._made < since:
            view.error = (
                f"cell {label} was re-run after this view was drawn and replaced nodes of the graph: click the view "
                "(or display the graph again) to see the graph as it is now"
            )
