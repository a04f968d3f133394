"""GraphView's model: which scopes are open, and the layered layout of what is visible.

Each container (the root, a scope, a folded series) is laid out once, with
every child closed (graph_layered: grandalf's Sugiyama layout, or a plain
layering when large); an open child's box is as large as its own layout, and
its container's base layout is re-stacked around it (``restack``). The browser
gets every container's base layout up front (``structure``) and does the same
re-stacking, so opening or closing a scope needs no answer from the kernel,
which may be busy running a cell; ``scene()`` is what it draws, for the tests
and for Python users.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cellgraph.dataflow.graph import Graph
from cellgraph.dataflow.shapes import fmt

from .graph_layered import Box, Size, layered, restack
from .graph_style import Style
from .graph_tree import ROOT, Item, ScopeTree

if TYPE_CHECKING:
    from cellgraph.dataflow.placement import Placement

CHAR_W = 7.2  # 12px monospace, which the ES module draws with
NODE_H, SCOPE_H = 28, 40
PAD, HEADER = 12, 26


@dataclass(frozen=True)
class Link:
    """One graph edge: a tensor (``index >= 0``) or a control dependency (``index == -1``)."""

    src: str
    dst: str
    index: int


class GraphModel:
    """The tree of ``graph``, the set of open containers, and the visible scene.

    Examples
    --------
    >>> import cellgraph as cg
    >>> g = cg.Graph()
    >>> with g.as_default(), cg.name_scope("dense"):
    ...     w = cg.variable([[1.0]], name="w")
    >>> model = GraphModel(g)
    >>> [n["label"] for n in model.scene()["nodes"]]
    ['dense']
    >>> model.expand("dense")
    >>> sorted(n["label"] for n in model.scene()["nodes"])
    ['dense', 'w']
    """

    def __init__(self, graph: Graph, placement: Placement | None = None) -> None:
        if not isinstance(graph, Graph):
            raise TypeError(f"GraphView needs a cellgraph Graph, got {_what(graph)}")
        self.graph = graph
        self.placement = placement
        self.tree = ScopeTree(graph)
        self.style = Style(graph, self.tree, placement)
        self.links = [
            Link(t.node.name, node.name, t.index)
            for node in graph
            for t in node.inputs
            if t.node.name in self.tree.chains
        ] + [Link(c.name, node.name, -1) for node in graph for c in node.control_inputs if c.name in self.tree.chains]
        self.local = self._local_edges()
        self.expanded: set[str] = set()
        self._bases: dict[str, Box] = {}
        self.hits: set[str] = set()  # node names matching the search

    # ---------------------------------------------------------- open/close
    def expand(self, name: str) -> None:
        """Open the scope or folded series ``name``, and every container around it."""
        item = self.tree.resolve(name, openable=True)
        self.expanded.update([*self.tree.ancestors(item.id), item.id])

    def collapse(self, name: str) -> None:
        """Close ``name``; what is open inside it stays open for when it reopens."""
        item = self.tree.resolve(name, openable=True)
        self.expanded.discard(item.id)

    def reveal(self, name: str) -> Item:
        """Open every container around ``name`` so that it is drawn."""
        item = self.tree.resolve(name)
        self.expanded.update(self.tree.ancestors(item.id))
        return item

    def set_expanded(self, names: list[str]) -> None:
        """Open exactly ``names``, all checked first; one inside a closed scope shows when that opens."""
        self.expanded = {self.tree.resolve(name, openable=True).id for name in names}

    def expanded_names(self) -> list[str]:
        return sorted(self.tree.items[i].name for i in self.expanded)

    # -------------------------------------------------------------- layout
    def _local_edges(self) -> dict[str, set[tuple[str, str]]]:
        """For each container, which of its children feed which: independent of what is open."""
        local: dict[str, set[tuple[str, str]]] = {}
        chains = self.tree.chains
        for link in self.links:
            cu, cv = chains[link.src], chains[link.dst]
            k = 0
            while k < len(cu) and k < len(cv) and cu[k] == cv[k]:
                k += 1
            if k < len(cu) and k < len(cv):
                local.setdefault(cu[k - 1] if k else ROOT, set()).add((cu[k], cv[k]))
        return local

    def _closed(self, item_id: str) -> Size:
        item = self.tree.items[item_id]
        if item.kind == "node":
            return max(48.0, _text_w(item.label) + 20), NODE_H
        return max(72.0, _text_w(item.label) + 40), SCOPE_H

    def _size(self, item_id: str) -> Size:
        if item_id in self.expanded:
            box = self._layout(item_id)
            return max(box.w + 2 * PAD, _text_w(self.tree.items[item_id].label) + 40), box.h + HEADER + PAD
        return self._closed(item_id)

    def _base(self, container: str) -> Box:
        """The container's layout with every child closed: computed once, kept for the model's life."""
        box = self._bases.get(container)
        if box is None:
            children = self.tree.items[container].children
            box = self._bases[container] = layered(
                children, {c: self._closed(c) for c in children}, self.local.get(container, set())
            )
        return box

    def _layout(self, container: str) -> Box:
        """The container's layout as it is drawn: its base, re-stacked around the children that are open."""
        children = self.tree.items[container].children
        return restack(
            self._base(container), {c: self._closed(c) for c in children}, {c: self._size(c) for c in children}
        )

    def structure(self) -> dict[str, Any]:
        """Everything the browser needs to draw any set of open scopes without asking: every item (its box
        closed, its place in its container's base layout, its colours), the graph's edges, the legend.

        Columns (one list per field, an item's index in each), to keep a 10,000-node graph's message small.
        """
        ids = [i for i in self.tree.items if i != ROOT]
        index = {item_id: k for k, item_id in enumerate(ids)}
        columns: dict[str, list[Any]] = {
            k: []
            for k in ("id", "kind", "name", "label", "sub", "parent", "x", "y", "w", "h", "ow", "own", "color", "stale")
        }
        mix: dict[int, Any] = {}
        for k, item_id in enumerate(ids):
            item = self.tree.items[item_id]
            x, y = self._base(item.parent).pos[item_id]
            w, h = self._closed(item_id)
            for key, value in (
                ("id", item_id), ("kind", item.kind), ("name", item.name), ("label", item.label),
                ("sub", _sub(item)), ("parent", index.get(item.parent, -1)), ("x", round(x, 3)), ("y", round(y, 3)),
                ("w", round(w, 3)), ("h", round(h, 3)), ("ow", round(_text_w(item.label) + 40, 3)), ("own", self.tree.by_name.get(item.name) == item_id),
                ("stale", item.stale),
            ):  # fmt: skip
                columns[key].append(value)
            paint = self.style.paint(item_id)
            columns["color"].append(paint["color"])
            if "mix" in paint:
                mix[k] = paint["mix"]
        keys = sorted(set(self.style.key_of.values()))
        key_index = {key: k for k, key in enumerate(keys)}
        tensors: dict[tuple[str, int], int] = {}
        links = []
        for link in self.links:
            tensor = -1 if link.index < 0 else tensors.setdefault((link.src, link.index), len(tensors))
            links.append([index["n:" + link.src], index["n:" + link.dst], tensor])
        return {
            **columns,
            "mix": mix,
            "links": links,
            "shapes": [fmt(self.graph.node(src).specs[i].shape) for src, i in tensors],
            "keys": keys,
            "key": [key_index[self.style.key_of[self.tree.items[i].name]] if i.startswith("n:") else -1 for i in ids],
            "mode": self.style.mode,
            "legend": self.style.legend(),
            "total": len(self.tree.chains),
            "metrics": {"pad": PAD, "header": HEADER},
        }

    # --------------------------------------------------------------- scene
    def representatives(self) -> dict[str, str]:
        """Each node's visible item: itself, or the closed scope or fold it hides in."""
        reps = {}
        for name, chain in self.tree.chains.items():
            rep = chain[-1]
            for item_id in chain[:-1]:
                if item_id not in self.expanded:
                    rep = item_id
                    break
            reps[name] = rep
        return reps

    def scene(self) -> dict[str, Any]:
        """Everything the browser draws: visible boxes, edges between them, legend."""
        nodes: list[dict[str, Any]] = []
        box = self._layout(ROOT)
        self._place(ROOT, box, 0.0, 0.0, nodes)
        reps = self.representatives()
        hit_ids = {reps[name] for name in self.hits}
        for entry in nodes:
            if entry["id"] in hit_ids:
                entry["hit"] = True
        return {
            "width": round(box.w),
            "height": round(box.h),
            "nodes": nodes,
            "edges": self._edges(reps),
            "mode": self.style.mode,
            "legend": self.style.legend(),
            "total": len(self.tree.chains),
        }

    def _place(self, container: str, box: Box, ox: float, oy: float, out: list[dict[str, Any]]) -> None:
        for child in self.tree.items[container].children:
            x, y = box.pos[child]
            x, y = ox + x, oy + y
            w, h = self._size(child)
            item = self.tree.items[child]
            entry = {
                "id": child,
                "kind": item.kind,
                "name": item.name,
                "label": item.label,
                "x": round(x, 1),
                "y": round(y, 1),
                "w": round(w, 1),
                "h": round(h, 1),
                **self.style.paint(child),
            }
            entry["sub"] = _sub(item)
            if item.stale:
                entry["stale"] = item.stale
            if item.kind != "node":
                entry["open"] = child in self.expanded
            out.append(entry)
            if child in self.expanded:
                self._place(child, self._layout(child), x + PAD, y + HEADER, out)

    def _edges(self, reps: dict[str, str]) -> list[dict[str, Any]]:
        merged: dict[tuple[str, str], list[Link]] = {}
        for link in self.links:
            a, b = reps[link.src], reps[link.dst]
            if a != b:
                merged.setdefault((a, b), []).append(link)
        key_of = self.style.key_of
        edges = []
        for (a, b), links in merged.items():
            tensors = sorted({(lk.src, lk.index) for lk in links if lk.index >= 0})
            edge: dict[str, Any] = {"s": a, "t": b, "n": len(links)}
            if not tensors:
                edge["ctl"] = True
            elif len(tensors) == 1:
                edge["label"] = fmt(self.graph.node(tensors[0][0]).specs[tensors[0][1]].shape)
            else:
                edge["label"] = f"{len(tensors)} tensors"
            crossing = sorted({(key_of[lk.src], key_of[lk.dst]) for lk in links if key_of[lk.src] != key_of[lk.dst]})
            if self.style.mode == "device" and crossing:
                edge["cross"] = [list(pair) for pair in crossing[:4]]
            edges.append(edge)
        return edges


def _sub(item: Item) -> str:
    """A box's second line: a node's op, or how many nodes a scope or fold holds."""
    if item.kind == "node":
        return item.op
    return f"{item.size:,} nodes" if item.size != 1 else "1 node"


def _text_w(text: str) -> float:
    return len(text) * CHAR_W


def _what(value: object) -> str:
    hint = ""
    if hasattr(value, "graph") and isinstance(value.graph, Graph):
        hint = f"; pass its .graph (GraphView({type(value).__name__.lower()}.graph))"
    return f"{type(value).__name__} {value!r:.60}{hint}"
