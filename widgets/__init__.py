"""Notebook widgets: GraphView, TrainingMonitor and ClusterView (a Python class and an ES module each)."""

from __future__ import annotations

from importlib import import_module
from typing import Any

# Imported on first use: bqplot and anywidget take a while to import, and plain training code never needs them.
_LAZY = {
    "GraphView": ".graph_view",
    "TrainingMonitor": ".training_monitor",
    "ClusterView": ".cluster_view",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["ClusterView", "GraphView", "TrainingMonitor"]
