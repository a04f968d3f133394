"""The scope tree GraphView draws: name scopes as boxes, series of identical ops folded.

A node ``a/b/c`` lives in scope ``a/b``, itself in scope ``a``. Siblings that
form a series (``dense``, ``dense_1`` … ``dense_9``: one base name, numbered,
and the same content) are folded under one *fold* item, which opens like a
scope. Items have ids that cannot clash (``n:`` node, ``s:`` scope, ``f:``
fold), because a graph read from a GraphDef may use one name for a node and a
scope.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Literal

from cellgraph.dataflow.errors import CellgraphError
from cellgraph.dataflow.graph import Graph

ROOT = ""  # the id of the (always open) outermost container
MIN_FOLD = 3  # two of a kind read fine side by side; three or more make a series
_SERIES = re.compile(r"^(.*\D)_(\d+)$")

Kind = Literal["root", "node", "scope", "fold"]


class GraphViewError(CellgraphError, ValueError):
    """A GraphView request that names something the graph does not have."""


@dataclass
class Item:
    """One drawable thing: a node, a name scope, or a fold of a series."""

    id: str
    kind: Kind
    name: str  # node name, scope path, or ``scope/base_*`` for a fold
    label: str  # what the box says
    parent: str  # id of the container it is drawn in
    children: list[str] = field(default_factory=list)
    size: int = 0  # graph nodes at or beneath this item
    op: str = ""  # the op of a node, or of every node in a fold of nodes
    stale: int = 0  # stale graph nodes (a re-run cell removed or changed their inputs) at or beneath this item


def series_of(short: str) -> tuple[str, int]:
    """``dense_7`` -> ``("dense", 7)``; an unnumbered name is member 0 of its series."""
    m = _SERIES.match(short)
    return (m.group(1), int(m.group(2))) if m else (short, 0)


class ScopeTree:
    """Items for every node, scope and fold of ``graph``, built once per graph version."""

    def __init__(self, graph: Graph, min_fold: int = MIN_FOLD) -> None:
        self.version = graph.version
        self.items: dict[str, Item] = {ROOT: Item(ROOT, "root", "", "", ROOT)}
        self.ops: dict[str, Counter[str]] = {ROOT: Counter()}
        for node in graph:
            self._add_node(node.name, node.op, node.stale is not None)
        self._fold_all(min_fold)
        self.chains: dict[str, tuple[str, ...]] = {node.name: self._chain("n:" + node.name) for node in graph}
        # A node wins over a scope of the same name, and a scope over a fold.
        rank = {"root": -1, "fold": 0, "scope": 1, "node": 2}
        ordered = sorted(self.items.values(), key=lambda i: rank[i.kind])
        self.by_name: dict[str, str] = {i.name: i.id for i in ordered if i.kind != "root"}
        self.names = list(self.chains)

    # ---------------------------------------------------------------- build
    def _add_node(self, name: str, op: str, stale: bool = False) -> None:
        parts = name.split("/")
        parent = ROOT
        for depth in range(1, len(parts)):
            path = "/".join(parts[:depth])
            sid = "s:" + path
            if sid not in self.items:
                self.items[sid] = Item(sid, "scope", path, parts[depth - 1], parent)
                self.items[parent].children.append(sid)
                self.ops[sid] = Counter()
            parent = sid
        nid = "n:" + name
        self.items[nid] = Item(nid, "node", name, parts[-1], parent, op=op)
        self.items[parent].children.append(nid)
        # Sizes and op counts go to every enclosing container, for labels,
        # series signatures and the info panel.
        item = self.items[parent]
        self.items[nid].size = 1
        self.items[nid].stale = int(stale)
        while True:
            item.size += 1
            item.stale += int(stale)
            self.ops[item.id][op] += 1
            if item.id == ROOT:
                break
            item = self.items[item.parent]

    def _signature(self, item: Item) -> tuple[object, ...]:
        """What makes two series members 'identical': the op, or the ops a scope holds."""
        if item.kind == "node":
            return ("node", item.op)
        return ("scope", frozenset(self.ops[item.id].items()))

    def _fold_all(self, min_fold: int) -> None:
        for container in [i for i in self.items.values() if i.kind in ("root", "scope")]:
            groups: dict[tuple[object, ...], list[tuple[int, str]]] = {}
            for child in container.children:
                item = self.items[child]
                base, index = series_of(item.label)
                groups.setdefault((base, *self._signature(item)), []).append((index, child))
            folds = {key: members for key, members in groups.items() if len(members) >= min_fold}
            if not folds:
                continue
            position = {child: i for i, child in enumerate(container.children)}
            first_of = {min((c for _, c in m), key=position.__getitem__): key for key, m in folds.items()}
            folded = {child for members in folds.values() for _, child in members}
            children: list[str] = []
            for child in container.children:
                if child in first_of:
                    children.append(self._make_fold(container, first_of[child], folds[first_of[child]]))
                elif child not in folded:
                    children.append(child)
            container.children = children

    def _make_fold(self, container: Item, key: tuple[object, ...], members: list[tuple[int, str]]) -> str:
        members = sorted(members)
        base = str(key[0])
        prefix = container.name + "/" if container.name else ""
        name = f"{prefix}{base}_*"
        fid = "f:" + name
        if fid in self.items:  # a second series of one base name (say, nodes and scopes)
            fid = f"{fid}#{len(self.items)}"
        first, last = self.items[members[0][1]], self.items[members[-1][1]]
        fold = Item(fid, "fold", name, f"{first.label}..{last.label} ×{len(members)}", container.id)
        fold.children = [child for _, child in members]
        fold.op = first.op if first.kind == "node" else ""
        self.ops[fid] = Counter()
        for child in fold.children:
            self.items[child].parent = fid
            fold.size += self.items[child].size
            fold.stale += self.items[child].stale
            self.ops[fid].update(self.ops.get(child) or {self.items[child].op: 1})
        self.items[fid] = fold
        return fid

    def _chain(self, item_id: str) -> tuple[str, ...]:
        """Ids from the outermost container below the root down to ``item_id``."""
        chain = []
        while item_id != ROOT:
            chain.append(item_id)
            item_id = self.items[item_id].parent
        return tuple(reversed(chain))

    # ---------------------------------------------------------------- query
    def resolve(self, name: str, *, openable: bool = False) -> Item:
        """The item called ``name``: a node name, a scope path, or a fold ``scope/base_*``."""
        if not isinstance(name, str):
            raise GraphViewError(f"expected a node or scope name (a str), got {type(name).__name__} {name!r}")
        item_id = self.by_name.get(name)
        if openable:
            # A scope may share its name with a node; opening means the scope.
            item_id = next((i for i in ("s:" + name, "f:" + name) if i in self.items), None)
        if item_id is None:
            what = "name scope or folded series" if openable else "node, name scope or folded series"
            raise GraphViewError(f"no {what} named {name!r} in this graph{self._hint(name, openable)}")
        return self.items[item_id]

    def _hint(self, name: str, openable: bool) -> str:
        kinds = ("scope", "fold") if openable else ("node", "scope", "fold")
        close = [i.name for i in self.items.values() if i.kind in kinds and name.lower() in i.name.lower()][:5]
        if close:
            return "; did you mean " + ", ".join(repr(c) for c in close) + "?"
        tops = [self.items[c].name for c in self.items[ROOT].children if self.items[c].kind in kinds][:8]
        return "; top-level names: " + ", ".join(repr(t) for t in tops) if tops else ""

    def ancestors(self, item_id: str) -> tuple[str, ...]:
        """The containers around ``item_id``, outermost first (the root left out)."""
        return self._chain(item_id)[:-1]
