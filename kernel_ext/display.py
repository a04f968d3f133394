"""How the magics show things: the widget when its module imports, else the object itself (its text summary)."""

from __future__ import annotations

import html
import importlib
import sys
from typing import Any

from IPython.display import display

from cellgraph.dataflow.placement import Placement


def widget(module: str, name: str, *args: Any, **kwargs: Any) -> Any | None:
    """``cellgraph.widgets.<module>.<name>(*args, **kwargs)``, or ``None`` when that module cannot be imported.

    A widget module that is simply not there is expected (a build without it);
    one that fails to import says why on stderr, so the text summary shown in
    its place is not a silent fallback.
    """
    full = f"cellgraph.widgets.{module}"
    try:
        found = importlib.import_module(full)
    except ImportError as err:
        if not (isinstance(err, ModuleNotFoundError) and err.name in (full, "cellgraph.widgets")):
            print(f"cellgraph: {name} is unavailable ({err}); showing a text summary instead", file=sys.stderr)
        return None
    return getattr(found, name)(*args, **kwargs)


def show(obj: Any) -> None:
    """Display ``obj`` in the notebook (its text form outside one)."""
    display(obj)


def show_as(module: str, name: str, obj: Any, *args: Any, **kwargs: Any) -> Any:
    """Display ``obj`` as the widget ``name(obj, *args, **kwargs)`` of ``module``, or as itself; return what was shown."""
    shown = widget(module, name, obj, *args, **kwargs)
    if shown is None:
        shown = obj
    show(shown)
    return shown


class PlacementTable:
    """Each node of a placement with its op, device and the reason it went there: HTML in Jupyter, text elsewhere."""

    def __init__(self, placement: Placement) -> None:
        self.placement = placement

    def rows(self) -> list[tuple[str, str, str, str]]:
        """``(node, op, device, reason)`` in graph order."""
        p = self.placement
        return [(name, p.ops[name], device, p.reasons[name]) for name, device in p.device_of.items()]

    def __repr__(self) -> str:
        return str(self.placement)

    def _repr_html_(self) -> str:
        head = "".join(f"<th style='text-align:left'>{h}</th>" for h in ("node", "op", "device", "reason"))
        body = "".join(
            "<tr>" + "".join(f"<td style='text-align:left'>{html.escape(cell)}</td>" for cell in row) + "</tr>"
            for row in self.rows()
        )
        notes = [
            f"partitions of {html.escape(name)}: " + ", ".join(f"rows {a}:{b} on {html.escape(d)}" for d, a, b in parts)
            for name, parts in self.placement.partitions.items()
        ]
        notes += [f"ps load {html.escape(d)}: {n:,} bytes" for d, n in self.placement.ps_load_bytes().items()]
        footer = "".join(f"<div>{note}</div>" for note in notes)
        return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>{footer}"
