"""Colours for GraphView: by device in placement mode, else by op family, with a legend.

A collapsed scope holds many nodes; a scope whose nodes all share a colour
takes it, and a mixed one (half its ops on the worker, half on the parameter
server) is drawn in bands of each colour as wide as their share, so the mix
shows without opening it. The box's own colour stays the most common one.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

from cellgraph.dataflow.graph import Graph
from cellgraph.dataflow.opdef import OPS

from .graph_tree import ROOT, GraphViewError, ScopeTree

if TYPE_CHECKING:
    from cellgraph.dataflow.placement import Placement

# Picked to stay apart for the common colour-vision deficiencies (after Okabe & Ito).
DEVICE_COLORS = (
    "#0072b2",
    "#e69f00",
    "#009e73",
    "#cc79a7",
    "#56b4e9",
    "#d55e00",
    "#f0e442",
    "#7f7f7f",
    "#332288",
    "#882255",
)
FAMILY_COLORS = {
    "math": "#9ecae1",
    "nn": "#fdae6b",
    "conv": "#fd8d3c",
    "array": "#c7e9c0",
    "state": "#bcbddc",
    "training": "#fcbba1",
    "transfer": "#d9d9d9",
}
OTHER_COLOR = "#e0e0e0"
MAX_BANDS = 4  # the most common colours of a mixed scope; the rest share one grey band


def check_placement(graph: Graph, placement: Placement | None) -> None:
    """Reject a placement that is not one, or that was made for another graph."""
    if placement is None:
        return
    from cellgraph.dataflow.placement import Placement

    if not isinstance(placement, Placement):
        raise GraphViewError(
            f"placement must be what cg.placement.place(graph, devices) returns, got {type(placement).__name__}"
        )
    missing = [node.name for node in graph if node.name not in placement.device_of]
    if missing:
        shown = ", ".join(repr(m) for m in missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        raise GraphViewError(
            f"the placement has no device for {len(missing)} node(s) of this graph ({shown}): it was made for "
            "another graph or an older version of it; call cg.placement.place(graph, devices) again"
        )


class Style:
    """Each node's colour key (device or op family) and each item's colour and stripes."""

    def __init__(self, graph: Graph, tree: ScopeTree, placement: Placement | None) -> None:
        check_placement(graph, placement)
        self.mode = "device" if placement is not None else "family"
        if placement is not None:
            self.key_of = {node.name: placement.device_of[node.name] for node in graph}
            self.colors = {d: DEVICE_COLORS[i % len(DEVICE_COLORS)] for i, d in enumerate(placement.devices)}
        else:
            self.key_of = {node.name: _family(node.op) for node in graph}
            self.colors = dict(FAMILY_COLORS)
        # Key counts for every container, added up once along each node's chain.
        self.counts: dict[str, Counter[str]] = {ROOT: Counter()}
        for name, chain in tree.chains.items():
            key = self.key_of[name]
            self.counts[ROOT][key] += 1
            for item_id in chain[:-1]:
                counts = self.counts.get(item_id)
                if counts is None:
                    counts = self.counts[item_id] = Counter()
                counts[key] += 1

    def color(self, key: str) -> str:
        return self.colors.get(key, OTHER_COLOR)

    def paint(self, item_id: str) -> dict[str, Any]:
        """``{"color": ...}`` for one item; a scope of several colours adds ``"mix"``: ``[[color, share, label,
        count], ...]``, most common first, the shares adding up to 1 (past ``MAX_BANDS``, the rest as "other")."""
        if item_id.startswith("n:"):
            return {"color": self.color(self.key_of[item_id[2:]])}
        counts = self.counts[item_id]
        ranked = counts.most_common()
        out: dict[str, Any] = {"color": self.color(ranked[0][0])}
        if len(ranked) > 1:
            total = sum(counts.values())
            if len(ranked) > MAX_BANDS:
                ranked = [*ranked[: MAX_BANDS - 1], ("other", sum(n for _, n in ranked[MAX_BANDS - 1 :]))]
            out["mix"] = [[self.color(key), round(n / total, 4), key, n] for key, n in ranked]
        return out

    def legend(self) -> list[dict[str, Any]]:
        """One row per device (placement mode) or op family present, with its node count."""
        counts = self.counts[ROOT]
        keys = list(self.colors) if self.mode == "device" else sorted(counts)
        return [{"label": key, "color": self.color(key), "count": counts.get(key, 0)} for key in keys]


def _family(op: str) -> str:
    try:
        return OPS.lookup(op).family
    except LookupError:
        return "other"
