"""What GraphView's info panel shows for the selected item, and its search."""

from __future__ import annotations

from collections import Counter
from typing import Any

from cellgraph.dataflow.graph import Node
from cellgraph.dataflow.shapes import fmt

from .graph_layout import GraphModel
from .graph_tree import Item

MAX_LISTED = 12  # consumers, ops or devices listed before "and N more"
MAX_MATCHES = 50


def describe(model: GraphModel, item: Item) -> dict[str, Any]:
    """The panel's content for a node, a scope or a fold: plain data, so a static page can show it."""
    if item.kind == "node":
        return _node_info(model, model.graph.node(item.name))
    ops: Counter[str] = model.tree.ops[item.id]
    info: dict[str, Any] = {
        "kind": item.kind,
        "name": item.name,
        "nodes": item.size,
        "ops": [[op, n] for op, n in ops.most_common(MAX_LISTED)],
        "open": item.id in model.expanded,
    }
    if model.style.mode == "device":
        info["devices"] = [[d, n] for d, n in model.style.counts[item.id].most_common(MAX_LISTED)]
    if item.stale:
        info["stale"] = f"{item.stale} stale node(s): re-run the cell(s) that made them"
    return info


def _node_info(model: GraphModel, node: Node) -> dict[str, Any]:
    consumers: dict[int, list[str]] = {}
    for link in model.links:
        if link.src == node.name and link.index >= 0:
            consumers.setdefault(link.index, []).append(link.dst)
    info: dict[str, Any] = {
        "kind": "node",
        "name": node.name,
        "op": node.op,
        "family": model.style.key_of[node.name] if model.style.mode == "family" else _family(node),
        "inputs": [{"name": t.name, "shape": fmt(t.shape), "dtype": t.dtype} for t in node.inputs],
        "outputs": [
            {
                "name": f"{node.name}:{i}",
                "shape": fmt(spec.shape),
                "dtype": spec.dtype,
                "consumers": consumers.get(i, [])[:MAX_LISTED],
                "more": max(0, len(consumers.get(i, [])) - MAX_LISTED),
            }
            for i, spec in enumerate(node.specs)
        ],
        "control_inputs": [c.name for c in node.control_inputs],
        "cell": node.where(),
        "requested_device": node.device,
    }
    if model.placement is not None:
        info["device"] = model.placement.device_of[node.name]
        info["reason"] = model.placement.reasons.get(node.name, "")
    if node.stale:
        info["stale"] = node.stale
    return info


def _family(node: Node) -> str:
    try:
        return node.opdef.family
    except LookupError:
        return "other"


def search(model: GraphModel, query: str, limit: int | None = MAX_MATCHES) -> list[str]:
    """Names of nodes whose name contains ``query`` or whose op is ``query`` (any case), in graph order."""
    if not isinstance(query, str):
        raise TypeError(f"search query must be a str, got {type(query).__name__}")
    q = query.strip().lower()
    if not q:
        return []
    out = []
    for name in model.tree.names:
        if q in name.lower() or model.tree.items["n:" + name].op.lower() == q:
            out.append(name)
            if len(out) == limit:
                break
    return out
