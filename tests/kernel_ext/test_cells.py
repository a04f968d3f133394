"""Cells run inside cell scopes: a re-run replaces its nodes, a failing cell changes nothing, no cell id is told once."""

from __future__ import annotations

import warnings

import pytest
from IPython.core.interactiveshell import InteractiveShell

import cellgraph as cg
from cellgraph.kernel_ext.cells import NO_CELL_IDS

from .shells import names, ok, run

DENSE = "x = cg.placeholder((None, 4), name='x')\nh = cg.layers.dense(x, 3, name='dense')"


def test_rerunning_a_cell_replaces_its_nodes(shell: InteractiveShell) -> None:
    ok(shell, "import cellgraph as cg")
    ok(shell, DENSE, cell_id="a")
    first = names(cg.get_default_graph())
    for _ in range(3):
        last = ok(shell, DENSE, cell_id="a")
    graph = cg.get_default_graph()
    assert names(graph) == first == ["x", "dense/kernel", "dense/matmul", "dense/bias", "dense/bias_add"]
    assert graph.cells == {"a": first}
    # The nodes say which run of the cell made them, and on which line, as Jupyter numbers them.
    node = graph.node("dense/matmul")
    assert (node.cell, node.cell_label, node.line) == ("a", f"[{last.execution_count}]", 2)
    assert shell.user_ns["h"].node is graph.node("dense/bias_add")


def test_an_edited_cell_replaces_what_it_made_and_other_cells_keep_theirs(shell: InteractiveShell) -> None:
    ok(shell, "import cellgraph as cg")
    ok(shell, DENSE, cell_id="a")
    ok(shell, "y = cg.placeholder((2,), name='y')", cell_id="b")
    ok(shell, "x = cg.placeholder((None, 4), name='x')", cell_id="a")
    assert names(cg.get_default_graph()) == ["y", "x"]


def test_a_cell_that_raises_leaves_the_graph_as_it_was(shell: InteractiveShell) -> None:
    ok(shell, "import cellgraph as cg")
    ok(shell, DENSE, cell_id="a")
    graph = cg.get_default_graph()
    before = list(graph.nodes)
    version = graph.version
    # A re-run of the same cell that fails half way: its old nodes come back, its new ones go.
    result = run(shell, "x = cg.placeholder((None, 4), name='x')\nz = cg.placeholder((1,), name='z')\n1 / 0", "a")
    assert isinstance(result.error_in_exec, ZeroDivisionError)
    assert graph.nodes == before
    # A new cell that fails at build time (a shape error), and one that does not even parse.
    result = run(shell, "w = cg.placeholder((3,), name='w')\ncg.matmul(w, w)", "b")
    assert isinstance(result.error_in_exec, cg.ShapeError)
    assert f"MatMul 'matmul' (cell [{result.execution_count}], line 2): expects two matrices" in str(
        result.error_in_exec
    )
    result = run(shell, "w = cg.placeholder((3,), name='w'", "c")
    assert result.error_before_exec is not None
    assert graph.nodes == before and "b" not in graph.cells and "c" not in graph.cells
    assert graph.version >= version
    # The graph still takes cells afterwards.
    ok(shell, "w = cg.placeholder((3,), name='w')", "b")
    assert names(graph)[-1] == "w"


MODEL_WITH_ADAM = """\
x = cg.placeholder((None, 4), name='x')
h = cg.layers.dense(x, {units}, name='hidden')
loss = cg.reduce_mean(h)
train_op = cg.optim.Adam(1e-3).minimize(loss)"""


def test_rerunning_a_cell_says_once_at_that_cell_what_it_reinitialised_and_made_stale(shell: InteractiveShell) -> None:
    ok(shell, "import cellgraph as cg")
    ok(shell, MODEL_WITH_ADAM.format(units=8), "a")
    b = ok(shell, "out = cg.layers.dense(h, 3, name='out')", "b").execution_count
    stale = f"made nodes in cell(s) [{b}] stale; re-run cell(s) [{b}]"
    # Python shows a warning once per place and text; a notebook must see it on each re-run.
    for resized in (True, False):  # 8 -> 16 units, then 16 again
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("default")  # as a kernel has it: once per place and text
            a = ok(shell, MODEL_WITH_ADAM.format(units=16), "a").execution_count
        said = [w for w in caught if w.category is cg.CellgraphWarning]
        # One warning for the cell (not one per variable and Adam slot), at the user's cell, not this extension.
        assert len(said) == 1, [str(w.message) for w in said]
        warning = said[0]
        assert shell.compile._filename_map.get(warning.filename) == a, warning.filename
        shown = warnings.formatwarning(warning.message, warning.category, warning.filename, warning.lineno)
        # Named as a traceback names the cell, not by the file the cell was compiled into.
        assert shown.startswith(f"Cell In[{a}], line {warning.lineno}: CellgraphWarning: re-running cell [{a}]")
        if resized:  # at the line that made the variables
            assert warning.lineno == 2 and shown.splitlines()[1].strip() == "h = cg.layers.dense(x, 16, name='hidden')"
            assert str(warning.message) == (
                f"re-running cell [{a}] re-initialised 2 variable(s) whose shape changed: "
                "'hidden/kernel' (4, 8) float32 to (4, 16) float32, 'hidden/bias' (8,) float32 to (16,) float32 "
                f"(and 4 optimizer slot(s) of them); it {stale}"
            )
        else:  # the same shapes: only what is still stale, at the cell's first line
            assert warning.lineno == 1 and shown.splitlines()[1].strip() == "x = cg.placeholder((None, 4), name='x')"
            assert str(warning.message) == f"re-running cell [{a}] {stale}"


def test_rerunning_a_cell_with_a_new_initial_value_says_it_restarted_those_variables(shell: InteractiveShell) -> None:
    ok(shell, "import cellgraph as cg, numpy as np")
    cell = (
        "w = cg.variable(np.full(3, {start}, np.float32), name='w')\nv = cg.variable(np.zeros(2, np.float32), name='v')"
    )
    ok(shell, cell.format(start=0.0), "w")
    ok(shell, "sess = cg.Session(cg.get_default_graph()); sess.run(cg.assign(w, [5.0, 5.0, 5.0]))")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        again = ok(shell, cell.format(start=1.0), "w").execution_count
    said = [str(w.message) for w in caught if w.category is cg.CellgraphWarning]
    assert said == [
        f"re-running cell [{again}] re-initialised 1 variable(s) whose initial value changed, and their "
        "optimizer slots: 'w'"
    ]
    assert shell.user_ns["sess"].run(shell.user_ns["w"]).tolist() == [1.0, 1.0, 1.0]


def test_without_cell_ids_the_source_is_the_cell_and_the_user_is_told_once(
    shell: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    ok(shell, "import cellgraph as cg", cell_id=None)
    assert NO_CELL_IDS in capsys.readouterr().err
    ok(shell, DENSE, cell_id=None)
    ok(shell, DENSE, cell_id=None)
    assert names(cg.get_default_graph()) == ["x", "dense/kernel", "dense/matmul", "dense/bias", "dense/bias_add"]
    ok(shell, "y = cg.placeholder((2,), name='y')", cell_id=None)
    assert names(cg.get_default_graph())[-1] == "y"
    assert "cell ids" not in capsys.readouterr().err


def test_a_cell_run_from_inside_a_cell_belongs_to_the_outer_one(shell: InteractiveShell) -> None:
    ok(shell, "import cellgraph as cg")
    # %%capture runs its body with run_cell: pre_run_cell fires again inside the cell.
    source = "%%capture\nx = cg.placeholder((2,), name='x')"
    ok(shell, source, "a")
    ok(shell, source, "a")
    assert cg.get_default_graph().cells == {"a": ["x"]}
    ok(shell, "", "b")  # an empty cell sends post_run_cell without pre_run_cell
    ok(shell, "y = cg.placeholder((2,), name='y')", "c")
    assert names(cg.get_default_graph()) == ["x", "y"]


def test_cell_labels_follow_in_numbers_whenever_ipython_counts(shell: InteractiveShell) -> None:
    from cellgraph.kernel_ext.extension import extension_of

    tracker = extension_of(shell).tracker
    tracker._count_offset += 1  # as if this IPython counted cells at the other moment
    ok(shell, "import cellgraph as cg")
    first = ok(shell, "x = cg.placeholder((2,), name='x')", "a")
    assert cg.get_default_graph().node("x").cell_label == f"[{first.execution_count}]"  # put right afterwards
    second = ok(shell, "y = cg.placeholder((2,), name='y')", "b")
    assert cg.get_default_graph().node("y").cell_label == f"[{second.execution_count}]"


def test_a_cell_building_into_its_own_graph_with_as_default_is_a_cell_there_too(shell: InteractiveShell) -> None:
    # A Keras/TF1 user makes a graph in one cell and builds into it from others with `with g.as_default():`.
    # Those cells' nodes were "made outside any cell": a re-run added dense_1, and a stale one was not named.
    ok(shell, "import cellgraph as cg\ng = cg.Graph()")
    model = "with g.as_default():\n    x = cg.placeholder((None, 4), name='x')\n    h = cg.layers.dense(x, {units}, name='hidden')"
    loss = "with g.as_default():\n    train_op = cg.optim.Adam(1e-3).minimize(cg.reduce_mean(h))"
    ok(shell, model.format(units=3), cell_id="model")
    ok(shell, loss, cell_id="loss")
    graph = shell.user_ns["g"]
    first = names(graph)
    ok(shell, loss, cell_id="loss")
    assert names(graph) == first and "Adam_1" not in {n.split("/")[0] for n in names(graph)}
    assert set(graph.cells) == {"model", "loss"}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        last = ok(shell, model.format(units=5), cell_id="model")
    said = " ".join(str(w.message) for w in caught)
    loss_label = graph.node("Adam/update").cell_label
    assert said.startswith(f"re-running cell [{last.execution_count}] re-initialised 2 variable(s)"), said
    assert said.endswith(f"it made nodes in cell(s) {loss_label} stale; re-run cell(s) {loss_label}"), said
    assert "outside any cell" not in said, said
    # The default graph got none of it.
    assert names(cg.get_default_graph()) == []
    # Edited to build nothing there any more, the cell takes its old nodes away from that graph too.
    ok(shell, "with g.as_default():\n    pass", cell_id="loss")
    assert "loss" not in graph.cells and not any(n.startswith("Adam") for n in names(graph))


def test_a_cell_scope_of_the_users_own_inside_as_default_still_works(shell: InteractiveShell) -> None:
    # README's "Cells that can be re-run" and notebook 01 call cg.cell_scope by hand inside `with g.as_default():`.
    by_hand = """by_hand = cg.Graph()
with by_hand.as_default():
    for run in range(3):
        with cg.cell_scope("cell-1", label=str(run + 1)):
            inputs = cg.placeholder((None, 4), name="inputs")
            cg.layers.dense(inputs, 8, name="layer")"""
    ok(shell, "import cellgraph as cg")
    ok(shell, by_hand)
    assert names(shell.user_ns["by_hand"]) == ["inputs", "layer/kernel", "layer/matmul", "layer/bias", "layer/bias_add"]
