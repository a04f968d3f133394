"""``%%graph [NAME]`` builds a cell into a graph and shows it; ``%graph NAME`` shows it again."""

from __future__ import annotations

import re
import sys
from typing import Any

import pytest
from IPython.core.interactiveshell import InteractiveShell

import cellgraph as cg
from cellgraph.kernel_ext import named_graphs

from .shells import names, ok, refused, run

ENCODER = "%%graph enc\nx = cg.placeholder((None, 4), name='x')\nh = cg.layers.dense(x, 2, name='dense')"


def graph_view() -> Any:
    try:
        from cellgraph.widgets.graph_view import GraphView
    except ImportError:
        return None
    return GraphView


def test_a_named_graph_is_made_built_and_shown(shell: InteractiveShell, shown: list[Any]) -> None:
    ok(shell, "import cellgraph as cg")
    ok(shell, ENCODER, "a")
    encoder = named_graphs(shell)["enc"]
    assert names(encoder) == ["x", "dense/kernel", "dense/matmul", "dense/bias", "dense/bias_add"]
    assert len(cg.get_default_graph()) == 0
    assert shell.user_ns["h"].graph is encoder
    # Re-running the cell replaces its nodes; the graph is the same object.
    ok(shell, ENCODER, "a")
    assert named_graphs(shell)["enc"] is encoder and len(encoder) == 5
    assert encoder.node("dense/matmul").cell_label == f"[{shell.execution_count - 1}]"
    assert encoder.node("dense/matmul").line == 3  # the cell's line, "%%graph enc" being line 1
    widget = graph_view()
    assert len(shown) == 2
    for item in shown:
        assert isinstance(item, widget) and item.graph is encoder if widget else item is encoder


def test_without_a_name_the_cell_builds_into_the_default_graph(shell: InteractiveShell, shown: list[Any]) -> None:
    ok(shell, "import cellgraph as cg")
    ok(shell, "%%graph --no-show\nx = cg.placeholder((2,), name='x')\nx.shape", "a")
    assert names(cg.get_default_graph()) == ["x"] and named_graphs(shell) == {}
    assert shown == [(2,)]  # the last expression's value; --no-show: no graph


def test_without_the_graph_widget_the_graph_itself_is_shown(
    shell: InteractiveShell, shown: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "cellgraph.widgets.graph_view", None)  # as if it were not there
    ok(shell, "import cellgraph as cg")
    ok(shell, ENCODER, "a")
    assert shown == [named_graphs(shell)["enc"]]
    ok(shell, "%graph enc")
    assert shown[-1] is named_graphs(shell)["enc"]


def test_a_failing_graph_cell_changes_no_graph(shell: InteractiveShell, shown: list[Any]) -> None:
    ok(shell, "import cellgraph as cg")
    ok(shell, ENCODER + "\n", "a")
    encoder = named_graphs(shell)["enc"]
    before = list(encoder.nodes)
    result = run(shell, ENCODER + "\nbad = cg.matmul(x, cg.placeholder((3, 2), name='w'))", "a")
    assert isinstance(result.error_in_exec, cg.ShapeError)
    assert "MatMul 'matmul' (cell [" in str(result.error_in_exec) and "line 4" in str(result.error_in_exec)
    assert encoder.nodes == before and "bad" not in shell.user_ns
    # A new graph whose first cell fails is not kept.
    result = run(shell, "%%graph dec\ny = cg.placeholder((2,), name='y')\n1 / 0", "b")
    assert isinstance(result.error_in_exec, ZeroDivisionError)
    assert set(named_graphs(shell)) == {"enc"}
    assert len(shown) == 1


def test_a_cell_moved_to_another_graph_takes_its_nodes_along(shell: InteractiveShell, shown: list[Any]) -> None:
    ok(shell, "import cellgraph as cg")
    ok(shell, ENCODER, "a")
    ok(shell, ENCODER.replace("%%graph enc", "%%graph other"), "a")
    assert len(named_graphs(shell)["enc"]) == 0 and len(named_graphs(shell)["other"]) == 5
    ok(shell, ENCODER.replace("%%graph enc\n", ""), "a")  # now a plain cell: into the default graph
    assert len(named_graphs(shell)["other"]) == 0 and len(cg.get_default_graph()) == 5


def test_help_and_bad_arguments(shell: InteractiveShell, capsys: pytest.CaptureFixture[str], shown: list[Any]) -> None:
    ok(shell, "%%graph --help\nq = 1")
    out = capsys.readouterr().out
    assert (
        out.startswith("usage: %%graph [-h] [--no-show] [NAME]\n") and "--no-show" in out and "Re-running a cell" in out
    )
    assert "q" not in shell.user_ns  # --help does nothing else
    ok(shell, "%graph -h")
    assert capsys.readouterr().out.startswith("usage: %graph [-h] [--no-show] [NAME]\n")
    err = refused(shell, capsys, "%%graph --bogus\nq = 1")
    assert err == (
        "UsageError: %%graph: unrecognized arguments: --bogus\n"
        "usage: %%graph [-h] [--no-show] [NAME]\n(see %%graph --help)\n"
    )
    err = refused(shell, capsys, "%%graph a b\nq = 1")
    assert "%%graph: unrecognized arguments: b" in err
    err = refused(shell, capsys, "%graph nope")
    assert "%graph: no graph named 'nope'; named graphs: none yet (a %%graph NAME cell makes one)" in err
    assert "q" not in shell.user_ns and named_graphs(shell) == {} and shown == []


def test_a_tensor_of_another_graph_in_a_named_graph_cell_is_the_one_named(
    shell: InteractiveShell, shown: list[Any]
) -> None:
    # Building in graph 'mlp2' on x from the default graph: the error blames x (from elsewhere) and calls the
    # graph being built by its name, not the new layer's own kernel and a number.
    ok(shell, "import cellgraph as cg")
    ok(shell, "%%graph\nx = cg.placeholder((None, 3), name='x')")
    result = run(shell, "%%graph mlp2\nq = cg.layers.dense(x, 4, name='other')")
    error = result.error_in_exec
    assert isinstance(error, cg.GraphError)
    assert re.fullmatch(
        r"MatMul 'other/matmul' \(cell \[\d+\], line 2\): input 'x' \(cell \[\d+\], line 2\) belongs to another "
        r"graph, graph #\d+ \(\d+ nodes?\), not to graph 'mlp2' \(#\d+, 1 node, the default graph\); build both in "
        r"one graph \(with graph.as_default\(\)\)",
        str(error),
    ), str(error)
    assert "mlp2" not in named_graphs(shell)  # a failed first cell leaves no graph behind


def test_a_named_graph_is_bound_to_its_name_in_the_notebook(
    shell: InteractiveShell, shown: list[Any], capsys: pytest.CaptureFixture[str]
) -> None:
    ok(shell, "import cellgraph as cg\nenc = 'an older value'")
    ok(shell, ENCODER, "a")
    assert shell.user_ns["enc"] is named_graphs(shell)["enc"]  # as %%capture NAME binds its output
    ok(shell, "n = len(enc)")
    assert shell.user_ns["n"] == 5
    # A cell that binds NAME itself keeps its value, and says where the graph is.
    capsys.readouterr()
    ok(shell, "%%graph dec\ny = cg.placeholder((2,), name='y')\ndec = 'my decoder'", "b")
    assert shell.user_ns["dec"] == "my decoder"
    assert capsys.readouterr().out == (
        "%%graph dec: the cell bound dec itself (a str), so dec stays that; "
        "the graph is cellgraph.kernel_ext.named_graphs()['dec']\n"
    )
    # A name no variable can have is only a named graph; a failed first cell binds nothing.
    ok(shell, "%%graph my-model\nz = cg.placeholder((2,), name='z')", "c")
    assert "my-model" in named_graphs(shell) and "my-model" not in shell.user_ns
    run(shell, "%%graph broken\nw = cg.placeholder((2,), name='w')\n1 / 0", "d")
    assert "broken" not in shell.user_ns


def test_a_view_drawn_before_a_re_run_that_replaced_its_nodes_says_so(
    shell: InteractiveShell, shown: list[Any]
) -> None:
    # A view in another cell's output went on showing the replaced nodes as if current until it was clicked.
    from cellgraph.widgets.graph_view import GraphView

    model = "%%graph g\nimport cellgraph as cg\nx = cg.placeholder((None, 4), name='x')\nh = cg.layers.dense(x, {n}, name='h')"
    ok(shell, model.format(n=4), cell_id="model")
    ok(shell, "%graph g")
    earlier = shown[-1]
    assert isinstance(earlier, GraphView) and earlier.error == ""
    ok(shell, "%%graph g\nout = cg.layers.dense(h, 2, name='out')")  # adds nodes, replaces none
    assert earlier.error == ""
    number = ok(shell, model.format(n=8), cell_id="model").execution_count
    redrawn = shown[-1]
    assert earlier.error == (
        f"cell [{number}] was re-run after this view was drawn and replaced nodes of the graph: click the view (or "
        "display the graph again) to see the graph as it is now"
    )
    assert redrawn is not earlier and redrawn.error == ""  # the re-run's own view is current
    # A click (any request from the browser) redraws it from the graph as it is now, and the note goes.
    earlier._handle_msg(
        {"content": {"data": {"method": "custom", "content": {"type": "select", "id": "s:h"}}}, "buffers": []}
    )
    assert earlier.error == "" and earlier.selected == "h"
