"""Re-running a cell replaces its nodes; consumers in other cells follow or go stale."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import cellgraph as cg


def _run(cell: str, label: str, body):  # noqa: ANN001, ANN202
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with cg.cell_scope(cell, label=label):
            result = body()
    return result, [str(w.message) for w in caught]


def test_rerun_replaces_nodes_without_name_pileup() -> None:
    g = cg.Graph()
    with g.as_default():
        for _ in range(3):
            _run("a", "1", lambda: cg.layers.dense(cg.placeholder((None, 4), name="x"), 3, name="dense"))
    names = [n.name for n in g.nodes]
    assert "dense/kernel" in names and not any(n.startswith("dense_1") for n in names)
    assert len(names) == len(set(names)) == len(g.cells["a"])


def test_variables_keep_values_when_shape_is_unchanged() -> None:
    g = cg.Graph()
    with g.as_default():
        w, _ = _run("a", "1", lambda: cg.variable(np.ones(3, np.float32), name="w"))
        sess = cg.Session(g)
        sess.run(cg.assign(w, [5.0, 5.0, 5.0]))
        w2, notes = _run("a", "1", lambda: cg.variable(np.ones(3, np.float32), name="w"))
        assert notes == []
        np.testing.assert_array_equal(sess.run(w2), [5.0, 5.0, 5.0])
        w3, notes = _run("a", "2", lambda: cg.variable(np.ones(4, np.float32), name="w"))
    assert notes == [
        "variable 'w' (cell 2) changed from (3,) float32 to (4,) float32; it is re-initialised",
        "re-running cell 2 made node(s) 'assign', made outside any cell, stale; build them again",
    ]
    np.testing.assert_array_equal(sess.run(w3), np.ones(4))


def test_a_new_initial_value_reinitialises_the_variable_and_its_optimizer_slots() -> None:
    # Before, a re-run that changed only the initial value kept the trained value (and the momentum),
    # silently: the session went on from numbers the cell no longer says.
    g = cg.Graph()
    with g.as_default():

        def model(start: float) -> tuple[cg.Tensor, cg.Tensor, cg.Tensor]:
            x = cg.placeholder((None, 3), name="x")
            w = cg.variable(np.full(3, start, np.float32), name="w")
            return x, w, cg.reduce_sum((x * w - 1.0) ** 2.0, name="loss")

        (x, w, loss), _ = _run("model", "1", lambda: model(0.0))
        train, _ = _run("train", "2", lambda: cg.optim.Momentum(0.1, 0.9).minimize(loss))
        sess = cg.Session(g)
        feed = np.ones((2, 3), np.float32)
        for _ in range(3):
            sess.run(train, {x: feed})
        trained = sess.variable_values()
        assert not (trained["Momentum/w/momentum"] == 0).any()
        (x, w, loss), notes = _run("model", "1", lambda: model(0.0))  # the same definition: training goes on
        assert notes == []
        np.testing.assert_array_equal(sess.run(w), trained["w"])
        (x, w, loss), notes = _run("model", "3", lambda: model(0.25))
        assert notes == [
            "variable 'w' (cell 3) has a new initial value; it is re-initialised, and its optimizer slots with it"
        ]
        values = sess.variable_values()
        np.testing.assert_array_equal(values["w"], [0.25, 0.25, 0.25])
        np.testing.assert_array_equal(values["Momentum/w/momentum"], [0.0, 0.0, 0.0])
        sess.run(train, {x: feed})  # one step from the new start, as a fresh session takes it
        fresh = cg.Session(g)
        fresh.run(train, {x: feed})
        np.testing.assert_array_equal(sess.run(w), fresh.run(w))


def test_seeded_initializers_and_nan_initial_values_count_as_the_same_definition() -> None:
    g = cg.Graph()
    with g.as_default():
        _run("a", "1", lambda: cg.layers.dense(cg.placeholder((None, 4), name="x"), 3, name="dense"))
        _run("b", "2", lambda: cg.variable(np.array([np.nan, 1.0], np.float32), name="v"))
        sess = cg.Session(g)
        sess.run(cg.assign(g.tensor("dense/kernel:0"), np.full((4, 3), 7.0, np.float32)))
        _, notes = _run("a", "1", lambda: cg.layers.dense(cg.placeholder((None, 4), name="x"), 3, name="dense"))
        _, more = _run("b", "2", lambda: cg.variable(np.array([np.nan, 1.0], np.float32), name="v"))
        assert notes == more == []
        assert np.isnan(sess.run("v")[0])
        np.testing.assert_array_equal(sess.run("dense/kernel:0"), np.full((4, 3), 7.0))


def test_consumers_in_other_cells_are_rebound() -> None:
    g = cg.Graph()
    with g.as_default():
        x, _ = _run("a", "1", lambda: cg.placeholder((None, 2), name="x") * 2.0)
        y, _ = _run("b", "2", lambda: x + 1.0)
        # Re-run cell a with a different body of the same shape: y follows it.
        x2, notes = _run("a", "3", lambda: cg.placeholder((None, 2), name="x") * 10.0)
    assert notes == []
    assert y.node.inputs[0].node is x2.node
    feed = {g.tensor("x:0"): np.ones((1, 2), np.float32)}
    np.testing.assert_array_equal(cg.Session(g).run(y, feed), [[11.0, 11.0]])


def test_consumers_that_no_longer_fit_are_stale_until_their_cell_reruns() -> None:
    g = cg.Graph()
    with g.as_default():
        h, _ = _run("a", "1", lambda: cg.layers.dense(cg.placeholder((None, 4), name="x"), 8, name="hidden"))
        logits, _ = _run("b", "2", lambda: cg.layers.dense(h, 3, name="out"))
        h2, notes = _run("a", "3", lambda: cg.layers.dense(cg.placeholder((None, 4), name="x"), 16, name="hidden"))
        assert "re-running cell 3 made nodes in cell(s) 2 stale; re-run cell(s) 2" in notes
        feed = {g.tensor("x:0"): np.ones((1, 4), np.float32)}
        with pytest.raises(
            cg.StaleNodeError, match=r"MatMul 'out/matmul' \(cell 2, line \d+\) is stale: .*re-run cell 2"
        ):
            cg.Session(g).run(logits, feed)
        logits2, _ = _run("b", "4", lambda: cg.layers.dense(h2, 3, name="out"))
    assert cg.Session(g).run(logits2, feed).shape == (1, 3)


def test_removed_input_makes_consumer_stale() -> None:
    g = cg.Graph()
    with g.as_default():
        x, _ = _run("a", "1", lambda: cg.placeholder((2,), name="x"))
        y, _ = _run("b", "2", lambda: x * 3.0)
        _, notes = _run("a", "3", lambda: cg.placeholder((2,), name="other"))
    assert y.node.stale == "its input 'x:0' was removed when cell 3 was re-run"
    assert notes == ["re-running cell 3 made nodes in cell(s) 2 stale; re-run cell(s) 2"]


def test_a_failing_cell_leaves_the_graph_as_it_was() -> None:
    g = cg.Graph()
    with g.as_default():
        _run("a", "1", lambda: cg.layers.dense(cg.placeholder((None, 4), name="x"), 3))
        before = [(n.name, n) for n in g.nodes]

        def broken() -> None:
            cg.layers.dense(cg.placeholder((None, 4), name="x"), 5)
            raise RuntimeError("user bug")

        with pytest.raises(RuntimeError, match="user bug"):
            _run("a", "2", broken)
    assert [(n.name, n) for n in g.nodes] == before


def test_cell_scopes_do_not_nest() -> None:
    g = cg.Graph()
    with g.as_default(), cg.cell_scope("a"):
        with pytest.raises(cg.GraphError, match=r"cell_scope\('b'\) inside cell_scope\('a'\): cell scopes do not nest"):
            with cg.cell_scope("b"):
                pass


def test_training_cell_rerun_keeps_trained_weights() -> None:
    g = cg.Graph()
    rng = np.random.default_rng(0)
    xv = rng.normal(size=(32, 4)).astype(np.float32)
    yv = (xv.sum(1) > 0).astype(np.int32)
    with g.as_default():
        (x, y, logits), _ = _run("model", "1", lambda: _model())
        train, _ = _run(
            "train", "2", lambda: cg.optim.Adam(0.05).minimize(cg.losses.sparse_softmax_cross_entropy(logits, y))
        )
        sess = cg.Session(g)
        for _ in range(30):
            sess.run(train, {x: xv, y: yv})
        trained = sess.run(g.tensor("dense/kernel:0"))
        # Re-running the optimizer cell rebuilds the update ops, not the model.
        train, _ = _run(
            "train", "3", lambda: cg.optim.Adam(0.05).minimize(cg.losses.sparse_softmax_cross_entropy(logits, y))
        )
    np.testing.assert_array_equal(sess.run(g.tensor("dense/kernel:0")), trained)
    assert len([n for n in g.nodes if n.name.startswith("Adam_1")]) == 0
    sess.run(train, {x: xv, y: yv})


def _model():  # noqa: ANN202
    x = cg.placeholder((None, 4), name="x")
    y = cg.placeholder((None,), "int32", name="y")
    return x, y, cg.layers.dense(x, 2)


def test_removed_control_input_makes_consumer_stale() -> None:
    g = cg.Graph()
    with g.as_default():
        v, _ = _run("a", "1", lambda: cg.variable([1.0], name="v"))
        step, _ = _run("a", "1", lambda: cg.assign_add(cg.variable([1.0], name="v"), [1.0], name="bump"))
        grp, _ = _run("b", "2", lambda: cg.group(step))
        _run("a", "3", lambda: cg.variable([1.0], name="v"))  # no 'bump' any more
    assert grp.stale == "its control input 'bump' was removed when cell 3 was re-run"
    with pytest.raises(cg.StaleNodeError, match=r"NoOp 'group' \(cell 2, line \d+\) is stale"):
        cg.Session(g).run(grp)


def test_consumer_stays_stale_while_another_input_is_gone() -> None:
    g = cg.Graph()
    with g.as_default():
        x, _ = _run("a", "1", lambda: cg.placeholder((2,), name="x"))
        y, _ = _run("b", "2", lambda: cg.placeholder((2,), name="y"))
        z, _ = _run("c", "3", lambda: x + y)
        _run("a", "4", lambda: cg.placeholder((2,), name="not_x"))
        _run("b", "5", lambda: cg.placeholder((2,), name="y"))
    assert z.node.stale == "its input(s) 'x:0' are no longer in the graph"


def test_integer_labels_are_strings() -> None:
    g = cg.Graph()
    with g.as_default(), cg.cell_scope("a", label=7):  # type: ignore[arg-type]
        x = cg.placeholder((2,), name="x")
    assert x.node.cell_label == "7"


def test_a_cell_scope_on_a_new_empty_graph_is_on_that_graph_not_the_default() -> None:
    empty, default = cg.Graph(), cg.Graph()
    with default.as_default():
        with cg.cell_scope("cell-a", graph=empty):
            with empty.as_default():
                cg.placeholder((None, 2), "float32", name="x")
        assert [n.name for n in empty.nodes] == ["x"] and list(default.nodes) == []
        assert empty.node("x").cell == "cell-a"


@pytest.mark.cuda
def test_a_new_initial_value_reaches_a_variable_held_on_the_gpu() -> None:
    # The device copy was keyed by shape and dtype only: a new initial value of the same shape stayed on the host.
    gpu = "/job:worker/task:0/device:gpu:0"
    g = cg.Graph()
    with g.as_default():

        def model(start: float) -> tuple[cg.Tensor, cg.Tensor]:
            with cg.device(gpu):
                w = cg.variable(np.full(2, start, np.float32), name="w")
                return w, cg.assign_add(w, np.ones(2, np.float32), name="bump")

        (w, bump), _ = _run("model", "1", lambda: model(0.0))
        sess = cg.PartitionedSession(g, cg.placement.place(g, [gpu]), timeout=600)
        sess.run(bump)
        np.testing.assert_array_equal(sess.run(w), [1.0, 1.0])
        (w, bump), notes = _run("model", "2", lambda: model(10.0))
        assert notes == [
            "variable 'w' (cell 2) has a new initial value; it is re-initialised, and its optimizer slots with it"
        ]
        sess.run(bump)
        np.testing.assert_array_equal(sess.run(w), [11.0, 11.0])
