"""GraphView, the widget: its traits, the requests the browser sends, and the Graph's rich repr."""

from __future__ import annotations

import json
from typing import Any

import pytest
import traitlets

import cellgraph as cg
from cellgraph.examples.models import mlp
from cellgraph.widgets.graph_view import GraphView, GraphViewError

PS = "/job:ps/task:0/device:cpu:0"
WORKER = "/job:worker/task:0/device:cpu:0"
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"


def browser_sends(view: GraphView, content: dict[str, Any]) -> None:
    """Deliver ``content`` as the ES module's ``model.send`` does: a custom comm message."""
    view._handle_msg({"content": {"data": {"method": "custom", "content": content}}, "buffers": []})


def visible(view: GraphView) -> set[str]:
    return {n["id"] for n in view.scene["nodes"]}


def state(view: GraphView) -> dict[str, Any]:
    return {k: view.get_state()[k] for k in ("scene", "expanded", "selected", "info", "query", "matches")}


def cell_graph() -> cg.Graph:
    """An MLP whose hidden layer was made in a notebook cell labelled [3]."""
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((None, 4), name="x")
        with cg.cell_scope("cell-3", label="3"):
            h = cg.layers.dense(x, 8, activation="relu", name="hidden")
        cg.layers.dense(h, 2, name="out")
    return g


def test_collapsed_view_and_its_state_for_a_static_page() -> None:
    view = GraphView(mlp().graph)
    assert view.expanded == [] and view.selected == "" and view.info == {}
    assert "s:hidden" in visible(view) and "n:hidden/matmul" not in visible(view)
    # Everything the ES module draws is synced state, so a page saved with widget state shows it.
    saved = view.get_state()
    assert {"scene", "expanded", "selected", "info", "matches", "error", "height"} <= set(saved)
    assert json.loads(json.dumps(saved["scene"])) == view.scene
    assert "export default { render }" in view._esm  # the ES module, read from graph_view.js


def test_click_on_a_scope_expands_it_and_selects_it() -> None:
    view = GraphView(mlp().graph)
    browser_sends(view, {"type": "toggle", "id": "s:hidden"})
    assert view.error == ""
    assert view.expanded == ["hidden"] and "n:hidden/matmul" in visible(view)
    assert view.selected == "hidden" and view.info["kind"] == "scope" and view.info["open"] is True
    browser_sends(view, {"type": "toggle", "id": "s:hidden"})
    assert view.expanded == [] and "n:hidden/matmul" not in visible(view)
    assert view.info["open"] is False


def test_selected_node_syncs_back_with_its_details() -> None:
    graph = cell_graph()
    view = GraphView(graph)
    view.expand("hidden")
    browser_sends(view, {"type": "select", "id": "n:hidden/matmul"})
    assert view.selected == "hidden/matmul"
    info = view.info
    assert info["op"] == "MatMul" and info["family"] == "math"
    assert info["inputs"] == [
        {"name": "x:0", "shape": "(None, 4)", "dtype": "float32"},
        {"name": "hidden/kernel:0", "shape": "(4, 8)", "dtype": "float32"},
    ]
    assert info["outputs"][0]["shape"] == "(None, 8)" and info["outputs"][0]["consumers"] == ["hidden/bias_add"]
    assert info["cell"] == "cell 3, line " + str(graph.node("hidden/matmul").line)
    # The front end may also set the trait itself (ipywidgets' state sync).
    view.set_state({"selected": "out/matmul"})
    assert view.info["name"] == "out/matmul" and view.info["inputs"][0]["name"] == "hidden/relu:0"


def test_info_panel_says_where_a_node_runs_and_why() -> None:
    graph = mlp().graph
    placement = cg.placement.place(graph, [PS, WORKER])
    view = GraphView(graph, placement=placement)
    view.selected = "hidden/kernel"
    assert view.info["device"] == PS and view.info["reason"] == placement.reasons["hidden/kernel"]
    assert "ps" in view.info["reason"]
    view.selected = "Adam"
    assert dict((d, n) for d, n in view.info["devices"]) == {
        d: sum(1 for name, dev in placement.device_of.items() if name.startswith("Adam/") and dev == d)
        for d in (PS, WORKER)
        if any(name.startswith("Adam/") and dev == d for name, dev in placement.device_of.items())
    }


def test_search_highlights_hidden_matches_and_reveal_opens_them() -> None:
    view = GraphView(mlp().graph)
    found = view.search("MatMul")  # an op type
    assert found == [
        "hidden/matmul",
        "logits/matmul",
        "gradients/matmul",
        "gradients/matmul_1",
        "gradients/matmul_2",
        "gradients/matmul_3",
    ]
    assert view.matches == found and view.query == "MatMul"
    hits = {n["id"] for n in view.scene["nodes"] if n.get("hit")}
    assert hits == {"s:hidden", "s:logits", "s:gradients"}
    browser_sends(view, {"type": "search", "query": "bias_add_grad"})
    assert view.matches == ["gradients/bias_add_grad", "gradients/bias_add_grad_1"]
    browser_sends(view, {"type": "reveal", "name": "gradients/matmul_2"})
    assert view.selected == "gradients/matmul_2"
    assert view.expanded == ["gradients", "gradients/matmul_*"] and "n:gradients/matmul_2" in visible(view)
    assert view.search("") == [] and not any(n.get("hit") for n in view.scene["nodes"])


def test_bad_requests_from_the_browser_are_answered_and_change_nothing() -> None:
    view = GraphView(mlp().graph)
    view.expand("gradients")
    view.selected = "loss"
    before = state(view)
    browser_sends(view, {"type": "toggle", "id": "s:nowhere"})
    assert view.error == "toggle: no item with id 's:nowhere' in this graph (was it re-run?)"
    browser_sends(view, {"type": "toggle", "id": "n:loss"})
    assert view.error == "toggle: 'loss' is a node, not a name scope; nothing to open"
    browser_sends(view, {"type": "reveal", "name": "gradients/nope"})
    assert view.error.startswith("no node, name scope or folded series named 'gradients/nope'")
    browser_sends(view, {"type": "zoom"})
    assert view.error == "unknown request 'zoom'; GraphView understands toggle, select, reveal, search"
    assert state(view) == before
    browser_sends(view, {"type": "select", "id": "s:hidden"})
    assert view.error == "" and view.selected == "hidden"


def test_bad_requests_from_python_raise_and_change_nothing() -> None:
    view = GraphView(mlp().graph)
    view.expand("hidden")
    before = state(view)
    with pytest.raises(
        GraphViewError, match="no name scope or folded series named 'hiden' in this graph; top-level names: 'hidden'"
    ):
        view.expand("hiden")
    with pytest.raises(GraphViewError, match="no name scope or folded series named 'gradient/x'"):
        view.expanded = ["hidden", "gradient/x"]
    with pytest.raises(GraphViewError, match="no node, name scope or folded series named 'hidden/matmull'"):
        view.selected = "hidden/matmull"
    with pytest.raises(
        traitlets.TraitError, match="'selected' trait of a GraphView instance expected a unicode string, not the int 7"
    ):
        view.selected = 7  # type: ignore[assignment]
    assert state(view) == before


def test_non_graph_and_wrong_placement_are_refused() -> None:
    m = mlp()
    with pytest.raises(TypeError, match="GraphView needs a cellgraph Graph, got Tensor .*GraphView\\(tensor.graph\\)"):
        GraphView(m.loss)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="GraphView needs a cellgraph Graph, got NoneType None"):
        GraphView(None)  # type: ignore[arg-type]
    other = cg.placement.place(cell_graph(), [WORKER])
    with pytest.raises(GraphViewError, match="placement has no device for .* call cg.placement.place"):
        GraphView(m.graph, placement=other)


def test_refresh_after_a_cell_is_rerun_keeps_what_still_exists() -> None:
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((None, 4), name="x")
        with cg.cell_scope("c1"):
            cg.layers.dense(x, 8, name="head")
    view = GraphView(g)
    view.expand("head")
    view.selected = "head/matmul"
    with g.as_default(), cg.cell_scope("c1"):  # the cell, re-run with another layer
        cg.layers.dense(x, 8, name="tail")
    browser_sends(view, {"type": "toggle", "id": "s:tail"})  # a click refreshes first
    assert view.error == ""
    assert view.expanded == ["tail"] and view.selected == "tail"
    assert "n:tail/matmul" in visible(view) and "s:head" not in visible(view)


def test_scopes_the_browser_opened_are_read_against_the_graph_as_it_is_now() -> None:
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((None, 4), name="x")
        with cg.cell_scope("c1"):
            cg.layers.dense(x, 8, name="head")
    view = GraphView(g)
    view.set_state({"expanded": ["head"], "selected": "head"})  # what the page sends once it opened a scope
    assert view.expanded == ["head"] and view.selected == "head" and view.error == ""
    assert "n:head/matmul" in visible(view)
    with g.as_default(), cg.cell_scope("c1"):  # the cell, re-run with another layer: head is gone
        cg.layers.dense(x, 8, name="tail")
    view.set_state({"expanded": ["head", "tail"], "selected": "tail"})  # a page that had not seen the re-run
    assert view.expanded == ["tail"] and view.selected == "tail"
    assert view.error == "'head': no longer in this graph (was its cell re-run?); the view shows the graph as it is now"
    assert "n:tail/matmul" in visible(view) and "s:head" not in visible(view)
    assert [n for n in view.structure["name"] if n.startswith(("head", "tail"))][0].startswith("tail")


def test_graph_repr_outside_a_kernel_is_a_text_summary() -> None:
    graph = mlp().graph
    bundle = graph._repr_mimebundle_()
    assert set(bundle) == {"text/plain"}
    text = bundle["text/plain"]
    # The count is the graph's own (it moves with the gradient rules); the summary must say it.
    assert text.startswith(f"Graph: {len(graph)} nodes, 4 top-level scope(s): hidden, logits, gradients, Adam")
    assert "ops: " in text and "MatMul ×6" in text
    assert cg.Graph()._repr_mimebundle_() == {"text/plain": "Graph: 0 nodes"}


@pytest.mark.slow
def test_graph_is_shown_as_a_graph_view_in_a_kernel() -> None:
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell("from cellgraph.examples.models import mlp\ng = mlp().graph\ng"),
        nbformat.v4.new_code_cell(
            "from cellgraph.widgets.graph_view import GraphView\n"
            "import ipywidgets\n"
            "views = [w for w in ipywidgets.Widget.widgets.values() if isinstance(w, GraphView)]\n"
            "print(len(views), views[0].graph is g)"
        ),
    ]
    NotebookClient(nb, timeout=120, kernel_name="python3").execute()
    data = nb.cells[0].outputs[0]["data"]
    assert "application/vnd.jupyter.widget-view+json" in data
    assert data["text/plain"].startswith(f"Graph: {len(mlp().graph)} nodes")
    assert nb.cells[1].outputs[0]["text"] == "1 True\n"


def test_a_closed_view_displayed_again_says_how_to_draw_a_new_one() -> None:
    # ipywidgets' close() leaves IPython only the text repr, which was '<...GraphView object at 0x7f...>'.
    from IPython.core.formatters import DisplayFormatter

    graph = cell_graph()
    view = GraphView(graph)
    bundle = DisplayFormatter().format(view)[0]
    assert bundle["text/plain"] == f"<GraphView of {graph.describe()}>" and WIDGET_MIME in bundle
    view.close()
    assert DisplayFormatter().format(view)[0] == {
        "text/plain": f"<GraphView of {graph.describe()}, closed: display the graph itself again (or %graph NAME) "
        "for a new view>"
    }
