"""The layers import downwards only: the IR never imports the cluster, widgets or the notebook extension.

The packages stack as protos < dataflow < cluster < widgets < kernel_ext; the
``cellgraph`` package itself (the front door: ``cg.layers``, ``cg.optim``,
...) sits over all of them and wires them together (it points
``dataflow.display`` at the widgets' reprs), so no layer imports it either. Every import in a
layer's modules, those inside functions included, is read from the source;
an import under ``if TYPE_CHECKING:`` (types only, never run) is allowed.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import cellgraph as cg
from cellgraph.dataflow import display

REPO = Path(__file__).resolve().parents[1]
LAYERS = ("protos", "dataflow", "cluster", "widgets", "kernel_ext")
FRONT_DOOR = "cellgraph"  # the package itself and its own modules (cg.layers, cg.optim, ...): above every layer


def _type_checking_only(tree: ast.Module) -> set[int]:
    """The ids of the nodes under an ``if TYPE_CHECKING:``."""
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            inside.update(id(child) for child in ast.walk(node))
    return inside


def imported_layers(source: str, package: tuple[str, ...]) -> list[tuple[int, str]]:
    """(line, layer) for every import in ``source``, a module of ``package`` (e.g. ``("cluster", "ps")``), that
    reaches a layer of cellgraph, absolute or relative; in line order."""
    tree = ast.parse(source)
    skip = _type_checking_only(tree)
    found = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                base = node.module or ""
            elif node.level > len(package):  # above the layer's own folder: the cellgraph package
                base = ".".join(["cellgraph", *([node.module] if node.module else [])])
            else:
                base = "cellgraph." + ".".join(package[: len(package) - node.level + 1])
            # `from cellgraph import x`: x may be a layer's package or one of the front door's modules.
            names = [f"{base}.{alias.name}" for alias in node.names] if base == "cellgraph" else [base]
        for name in names:
            parts = name.split(".")
            if parts[0] == "cellgraph":
                found.append((node.lineno, parts[1] if len(parts) > 1 and parts[1] in LAYERS else FRONT_DOOR))
    return sorted(found)


@pytest.mark.parametrize("layer", LAYERS[:-1])
def test_a_layer_imports_no_layer_above_it(layer: str) -> None:
    above = {*LAYERS[LAYERS.index(layer) + 1 :], FRONT_DOOR}
    wrong = [
        f"{path.relative_to(REPO)}:{line} imports cellgraph.{target}"
        for path in sorted((REPO / layer).rglob("*.py"))
        if "_pb2" not in path.name
        for line, target in imported_layers(path.read_text(encoding="utf-8"), path.relative_to(REPO).parent.parts)
        if target in above
    ]
    assert wrong == []


def test_the_scan_sees_imports_inside_functions_and_relative_ones() -> None:
    """The scan itself: a lazy import and relative ones are found; one for type checking only is not."""
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from cellgraph.widgets import reprs\n"
        "def show():\n    from cellgraph.widgets.reprs import job_bundle\n"
        "from ...kernel_ext import magics_train\n"
        "from ..job import Job\n"
        "from . import store\n"
        "import cellgraph as cg\n"
        "from cellgraph import layers, protos\n"
    )
    assert imported_layers(source, ("cluster", "ps")) == [
        (5, "widgets"),
        (6, "kernel_ext"),
        (7, "cluster"),
        (8, "cluster"),
        (9, "cellgraph"),
        (10, "cellgraph"),
        (10, "protos"),
    ]


def test_a_graph_shows_through_what_the_package_registered() -> None:
    g = cg.Graph()
    with g.as_default():
        cg.placeholder((None, 2), name="x")
    assert g._repr_mimebundle_() == {"text/plain": "Graph: 1 node\nops: Placeholder ×1"}
    display.unregister("graph")
    try:
        assert g._repr_mimebundle_() == {"text/plain": repr(g)}  # nothing registered: the plain repr
    finally:
        display.register("graph", cg._widget_bundler("graph_bundle"))
    assert g._repr_mimebundle_()["text/plain"].startswith("Graph: 1 node")
