"""Layered drawings of one container's children: grandalf's Sugiyama layout, or a plain layering when large.

A container with more than ``GRANDALF_MAX`` children in one connected piece
gets a longest-path layering instead of grandalf: grandalf's crossing
reduction is quadratic-ish in pure Python and recursive (it raises the
recursion limit to the graph's size), which is how dagre-based viewers fall
over on huge graphs. Cycles (scopes feeding each other once closed) are broken
here, iteratively, by reversing the back edges of a depth-first walk.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from grandalf.graphs import Edge as GEdge
from grandalf.graphs import Graph as GGraph
from grandalf.graphs import Vertex
from grandalf.layouts import SugiyamaLayout

# GraphView lays out every container up front (the browser opens scopes without the kernel): grandalf takes
# about 75 ms for 50 children, so the 200 scopes of 50 of a 10,000-node graph would take 15 s; at 32 and
# below it is a few ms, and the whole graph about 0.4 s.
GRANDALF_MAX = 32
XSPACE, YSPACE = 24, 44
EPSILON = 1e-6  # a box that ends where another starts is before it (float sums of the layouts)
ROW_WIDTH = 1600  # disconnected pieces wrap onto a new row past this width

Size = tuple[float, float]


@dataclass(frozen=True)
class Box:
    """One container's layout: top-left positions of its children, and its inner size."""

    pos: dict[str, tuple[float, float]]
    w: float
    h: float


def layered(children: list[str], sizes: dict[str, Size], edges: set[tuple[str, str]]) -> Box:
    """Lay ``children`` out in layers along ``edges``; disconnected pieces side by side."""
    parent = {c: c for c in children}

    def find(c: str) -> str:
        while parent[c] != c:
            parent[c] = parent[parent[c]]
            c = parent[c]
        return c

    for a, b in edges:
        parent[find(a)] = find(b)
    pieces: dict[str, list[str]] = {}
    for c in children:
        pieces.setdefault(find(c), []).append(c)
    boxes = []
    for members in pieces.values():
        if len(members) == 1:
            w, h = sizes[members[0]]
            boxes.append(Box({members[0]: (0.0, 0.0)}, w, h))
            continue
        inside = {(a, b) for a, b in edges if a != b and find(a) == find(members[0])}
        boxes.append((_sugiyama if len(members) <= GRANDALF_MAX else _longest_path)(members, sizes, inside))
    return _shelf(boxes)


def restack(base: Box, closed: dict[str, Size], sizes: dict[str, Size]) -> Box:
    """``base`` (laid out with every child closed) with some children grown to ``sizes`` (opened).

    Each child moves right by the growth of every child wholly left of it in ``base``, and down by the growth of
    every child wholly above it: children apart in ``base`` stay apart, and the order, layers and crossings of
    the layout are kept. graph_view.js does the same in the browser, so that a scope opens without the kernel
    (tests/widgets/test_graph_view_browser.py checks that both draw the same).
    """
    grow = {c: (sizes[c][0] - closed[c][0], sizes[c][1] - closed[c][1]) for c in base.pos}
    if not any(dx or dy for dx, dy in grow.values()):
        return base
    x_shift = _shifts(
        {c: base.pos[c][0] for c in base.pos}, {c: closed[c][0] for c in base.pos}, {c: g[0] for c, g in grow.items()}
    )
    y_shift = _shifts(
        {c: base.pos[c][1] for c in base.pos}, {c: closed[c][1] for c in base.pos}, {c: g[1] for c, g in grow.items()}
    )
    pos = {c: (x + x_shift[c], y + y_shift[c]) for c, (x, y) in base.pos.items()}
    return _bounded(pos, sizes)


def _shifts(start: dict[str, float], length: dict[str, float], growth: dict[str, float]) -> dict[str, float]:
    """For each child, the sum of ``growth`` of the children that end at or before its start (sorted sums)."""
    ends = sorted((start[c] + length[c], growth[c]) for c in start)
    sums = [0.0]
    for _, g in ends:
        sums.append(sums[-1] + g)
    edges = [e for e, _ in ends]
    return {c: sums[bisect.bisect_right(edges, start[c] + EPSILON)] for c in start}


class _Vertex(Vertex):  # type: ignore[misc]
    """A vertex hashed by its position: grandalf keeps vertices and edges in sets, and objects hashed by address
    made two layouts of the same graph differ from one build to the next."""

    def __init__(self, data: str, rank: int) -> None:
        super().__init__(data)
        self.rank = rank

    def __hash__(self) -> int:
        return self.rank


class _Edge(GEdge):  # type: ignore[misc]
    def __init__(self, a: _Vertex, b: _Vertex, rank: int) -> None:
        super().__init__(a, b)
        self.rank = rank

    def __hash__(self) -> int:
        return self.rank


def _sugiyama(members: list[str], sizes: dict[str, Size], edges: set[tuple[str, str]]) -> Box:
    vertices = {}
    for i, c in enumerate(members):
        v = _Vertex(c, i)
        v.view = _View(*sizes[c])
        vertices[c] = v
    # Edges in the members' order, not the set's (string hashing varies per process): the same layout every run.
    position = {c: i for i, c in enumerate(members)}
    ordered = sorted(edges, key=lambda e: (position[e[0]], position[e[1]]))
    gedges = {pair: _Edge(vertices[pair[0]], vertices[pair[1]], i) for i, pair in enumerate(ordered)}
    back = _back_edges(members, edges)
    graph = GGraph(list(vertices.values()), list(gedges.values()))
    sug = SugiyamaLayout(graph.C[0])
    sug.xspace, sug.yspace = XSPACE, YSPACE
    # Our own (iterative) cycle breaking: grandalf's is recursive.
    sug.init_all(roots=[], inverted_edges=[gedges[pair] for pair in ordered if pair in back])
    sug.draw(N=1.5)
    left = min(v.view.xy[0] - v.view.w / 2 for v in vertices.values())
    top = min(v.view.xy[1] - v.view.h / 2 for v in vertices.values())
    pos = {c: (v.view.xy[0] - v.view.w / 2 - left, v.view.xy[1] - v.view.h / 2 - top) for c, v in vertices.items()}
    return _bounded(pos, sizes)


def _longest_path(members: list[str], sizes: dict[str, Size], edges: set[tuple[str, str]]) -> Box:
    """Layers by longest path from the sources, ordered once by the parents' mean position."""
    back = _back_edges(members, edges)
    preds: dict[str, list[str]] = {c: [] for c in members}
    for a, b in edges:
        a, b = (b, a) if (a, b) in back else (a, b)
        preds[b].append(a)
    rank: dict[str, int] = {}
    for c in _topological(members, preds):
        rank[c] = 1 + max((rank[p] for p in preds[c]), default=-1)
    layers: list[list[str]] = [[] for _ in range(max(rank.values()) + 1)]
    for c in members:
        layers[rank[c]].append(c)
    pos: dict[str, tuple[float, float]] = {}
    y = 0.0
    order: dict[str, float] = {}
    for layer in layers:
        layer.sort(key=lambda c: sum(order[p] for p in preds[c]) / len(preds[c]) if preds[c] else 0.0)
        x = 0.0
        for i, c in enumerate(layer):
            order[c] = i
            pos[c] = (x, y)
            x += sizes[c][0] + XSPACE
        y += max(sizes[c][1] for c in layer) + YSPACE
    return _bounded(pos, sizes)


def _topological(members: list[str], preds: dict[str, list[str]]) -> list[str]:
    succs: dict[str, list[str]] = {c: [] for c in members}
    indegree = {c: len(preds[c]) for c in members}
    for c in members:
        for p in preds[c]:
            succs[p].append(c)
    ready = [c for c in members if not indegree[c]]
    out = []
    while ready:
        c = ready.pop()
        out.append(c)
        for s in succs[c]:
            indegree[s] -= 1
            if not indegree[s]:
                ready.append(s)
    return out


def _back_edges(members: list[str], edges: set[tuple[str, str]]) -> set[tuple[str, str]]:
    """Edges that close a cycle in a depth-first walk; reversing them leaves a DAG."""
    succs: dict[str, list[str]] = {c: [] for c in members}
    has_pred = set()
    position = {c: i for i, c in enumerate(members)}
    # Sorted, so the same graph always breaks its cycles at the same edges.
    for a, b in sorted(edges, key=lambda e: (position[e[0]], position[e[1]])):
        succs[a].append(b)
        has_pred.add(b)
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    back = set()
    for start in [c for c in members if c not in has_pred] + members:
        if start in state:
            continue
        state[start] = 1
        stack = [(start, iter(succs[start]))]
        while stack:
            node, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                state[node] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                back.add((node, nxt))
            elif nxt not in state:
                state[nxt] = 1
                stack.append((nxt, iter(succs[nxt])))
    return back


def _shelf(boxes: list[Box]) -> Box:
    """Pack boxes left to right in rows no wider than ``ROW_WIDTH`` (or the widest box)."""
    limit = max([ROW_WIDTH, *(b.w for b in boxes)])
    pos: dict[str, tuple[float, float]] = {}
    x = y = row_h = width = 0.0
    for box in boxes:
        if x and x + box.w > limit:
            x, y, row_h = 0.0, y + row_h + YSPACE, 0.0
        for c, (cx, cy) in box.pos.items():
            pos[c] = (x + cx, y + cy)
        width = max(width, x + box.w)
        row_h = max(row_h, box.h)
        x += box.w + XSPACE
    return Box(pos, width, y + row_h)


def _bounded(pos: dict[str, tuple[float, float]], sizes: dict[str, Size]) -> Box:
    return Box(
        pos, max(x + sizes[c][0] for c, (x, _) in pos.items()), max(y + sizes[c][1] for c, (_, y) in pos.items())
    )


class _View:
    """What grandalf reads and writes for each vertex: its size, then its centre."""

    def __init__(self, w: float, h: float) -> None:
        self.w, self.h = w, h
        self.xy = (0.0, 0.0)
