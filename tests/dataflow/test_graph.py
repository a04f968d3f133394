from __future__ import annotations

import re

import numpy as np
import pytest

import cellgraph as cg


def test_names_are_unique_per_scope() -> None:
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((None, 2), name="x")
        a, b = x + 1.0, x + 2.0
        with cg.name_scope("hidden"):
            c = x * 2.0
        with cg.name_scope("hidden"):
            d = x * 3.0
    assert a.node.name == "add" and b.node.name == "add_1"
    assert c.node.name == "hidden/mul" and d.node.name == "hidden_1/mul"
    assert a.name == "add:0"


def test_device_scope_and_control_dependencies_are_recorded() -> None:
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((2,), name="x")
        with cg.device("/job:worker/task:0/device:cpu:0"):
            y = x * 2.0
        with cg.control_dependencies([y]):
            z = x + 1.0
    assert y.node.device == "/job:worker/task:0/device:cpu:0"
    assert x.node.device == ""
    assert z.node.control_inputs == [y.node]


def test_node_records_the_line_that_made_it() -> None:
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((2,), name="x")  # this line
    assert x.node.file is not None and x.node.file.endswith("test_graph.py")
    assert x.node.where().startswith("test_graph.py:")


def test_shape_error_names_op_node_location_and_shapes() -> None:
    g = cg.Graph()
    with g.as_default(), cg.cell_scope("c7", label="7"):
        x = cg.placeholder((None, 64), name="x")
        w = cg.variable(np.zeros((128, 10), np.float32), name="w")
        with cg.name_scope("dense_1"), pytest.raises(cg.ShapeError) as err:
            cg.matmul(x, w)
    assert str(err.value).startswith("MatMul 'dense_1/matmul' (cell 7, line ")
    assert str(err.value).endswith("inner dimensions differ: (None, 64) @ (128, 10)")
    assert [n.name for n in g.nodes] == ["x", "w"]  # nothing half-built was added


def test_dtype_and_broadcast_errors() -> None:
    g = cg.Graph()
    with g.as_default():
        a = cg.placeholder((3, 4), "float32", name="a")
        i = cg.placeholder((3, 4), "int32", name="i")
        with pytest.raises(
            cg.DTypeError, match=r"Add 'add' \(test_graph.py:\d+\): operands have different dtypes: float32 and int32"
        ):
            cg.add(a, i)
        with pytest.raises(cg.ShapeError, match=r"shapes do not broadcast: \(3, 4\) and \(5,\)"):
            a + cg.placeholder((5,), name="b")
        with pytest.raises(cg.DTypeError, match=r"Sqrt 'sqrt' .*expects a float tensor, got int32"):
            cg.sqrt(i)
        with pytest.raises(cg.ShapeError, match=r"ReduceSum 'reduce_sum' .*axis 2 is out of range for shape \(3, 4\)"):
            cg.reduce_sum(a, axis=2)


def test_foreign_tensor_is_rejected() -> None:
    g1, g2 = cg.Graph(), cg.Graph()
    with g1.as_default():
        x = cg.placeholder((2,), name="x")
    with g2.as_default():
        y = cg.placeholder((2,), name="y")
    with pytest.raises(cg.GraphError) as info:
        g1.create_node("Add", [x, y])
    # The op being built, where, the foreign input, where it was made, and both graphs.
    assert re.fullmatch(
        rf"Add 'add' \(test_graph\.py:\d+\): input 'y' \(test_graph\.py:\d+\) belongs to another graph, "
        rf"graph #{g2.number} \(1 node\), not to graph #{g1.number} \(1 node\); build both in one graph "
        r"\(with graph\.as_default\(\)\)",
        str(info.value),
    ), str(info.value)
    with g1.as_default():
        with pytest.raises(cg.GraphError, match=rf"graph #{g1.number} \(1 node, the default graph\)"):
            x + y
    assert len(g1) == 1  # nothing was added


def test_a_node_of_a_cell_that_raised_says_so() -> None:
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((2,), name="x")
        with pytest.raises(ValueError, match="the cell's own error"), cg.cell_scope("c", label="6"):
            w = cg.identity(x, name="w")
            raise ValueError("the cell's own error")
        with pytest.raises(cg.GraphError) as info:
            cg.identity(w, name="again")
    assert re.fullmatch(
        r"Identity 'again' \(test_graph\.py:\d+\): input 'w' \(cell 6, line \d+\) was removed from the graph "
        r"\(cell 6 raised an error, and the nodes it had made were rolled back; fix and re-run that cell\)",
        str(info.value),
    ), str(info.value)


def test_tensor_truth_value_is_an_error() -> None:
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((2,), name="x")
    with pytest.raises(cg.GraphError, match=r"the truth value of tensor 'x:0' is unknown until the graph runs"):
        bool(x)


def test_bad_name_scope() -> None:
    g = cg.Graph()
    with pytest.raises(cg.GraphError, match=r"bad name scope 'a/b'"):
        with g.name_scope("a/b"):
            pass


@pytest.mark.parametrize(
    "make",
    [
        lambda: cg.constant(1.0, name="a:b"),
        lambda: cg.placeholder((2,), name="x:0"),
        lambda: cg.variable(cg.init.zeros, shape=(2,), name="w:0"),
        lambda: cg.neg(cg.constant(1.0, name="c"), name="n:1"),
    ],
)
def test_a_node_name_with_a_colon_is_refused_where_the_node_is_made(make) -> None:  # type: ignore[no-untyped-def]
    # It was accepted, then failed later with "no node named 'a'": a tensor is named node:index.
    g = cg.Graph()
    with g.as_default():
        before = {n.name for n in g.nodes}
        with pytest.raises(cg.GraphError, match=r"bad node name '\w:\w': use a name without ':' \(a tensor is named"):
            make()
        assert {n.name for n in g.nodes} - before <= {"c"}
        assert cg.constant(2.0, name="a").node.name == "a"


def test_python_operators_build_ops() -> None:
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((2, 2), name="x")
        w = cg.placeholder((2, 2), name="w")
        y = -(2.0 * x - 1.0) / (x + 1.0) @ w
    xv = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)
    wv = np.eye(2, dtype=np.float32) * 3
    np.testing.assert_allclose(cg.Session(g).run(y, {x: xv, w: wv}), (-(2 * xv - 1) / (xv + 1)) @ wv, rtol=1e-6)


def test_default_graph_and_reset() -> None:
    g = cg.reset_default_graph()
    x = cg.placeholder((1,), name="x")
    assert x.graph is g is cg.get_default_graph()
    with cg.Graph().as_default(), pytest.raises(cg.GraphError, match="reset_default_graph\\(\\) inside"):
        cg.reset_default_graph()


def test_iterating_needs_a_known_first_dim() -> None:
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((None, 2), name="x")
        y = cg.placeholder((3, 2), name="y")
        with pytest.raises(
            cg.GraphError,
            match=r"cannot iterate over tensor 'x:0' of shape \(None, 2\): its first dimension must be known",
        ):
            list(x)
        rows = list(y)
    assert [r.shape for r in rows] == [(2,)] * 3


def test_an_op_of_tensors_from_two_graphs_blames_the_one_not_in_the_graph_being_built() -> None:
    # The default graph is the one being built: the tensor from elsewhere is named, whatever the argument order.
    g1, g2 = cg.Graph(), cg.Graph()
    g2.label = "mlp2"
    with g1.as_default():
        x = cg.placeholder((2,), name="x")
    with g2.as_default():
        y = cg.placeholder((2,), name="y")
        with pytest.raises(cg.GraphError) as info:
            x + y
    assert "input 'x' (test_graph.py:" in str(info.value)
    assert f"not to graph 'mlp2' (#{g2.number}, 1 node, the default graph)" in str(info.value)
    assert len(g1) == 1 and len(g2) == 1  # nothing was added


def test_a_missing_node_name_says_what_it_may_have_meant() -> None:
    """A layer's name is a scope: sess.run("logits") said only "no node named 'logits'" (a new user's try)."""
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((None, 3), name="x")
        cg.layers.dense(x, 2, name="logits")
    with pytest.raises(cg.GraphError) as info:
        cg.Session(g).run("logits", {x: [[1.0, 2.0, 3.0]]})
    assert str(info.value) == (
        "no node named 'logits' in this graph; 'logits' is a scope of 4 node(s), the last 'logits/matmul', "
        "'logits/bias', 'logits/bias_add': name one of them"
    )
    with pytest.raises(cg.GraphError) as info:
        g.node("logits/bias_ad")
    assert str(info.value) == "no node named 'logits/bias_ad' in this graph; did you mean 'logits/bias_add' or " \
        "'logits/bias'?"  # fmt: skip
    with pytest.raises(cg.GraphError) as info:
        g.node("zzz")
    assert str(info.value) == "no node named 'zzz' in this graph"


def test_reopened_name_scope_adds_no_suffix() -> None:
    g = cg.Graph()
    with g.as_default():
        with cg.name_scope("outer"), cg.name_scope("inner") as scope:
            cg.constant(1.0, name="a")
        with g.name_scope(scope, reopen=True):
            b = cg.constant(2.0, name="b")
    assert b.name == "outer/inner/b:0"
    with pytest.raises(cg.GraphError, match=r"bad name scope 'outer//inner' to reopen: use a scope that name_scope"):
        with g.name_scope("outer//inner", reopen=True):
            pass


def test_a_freed_name_is_given_again_after_later_ones_were_taken() -> None:
    # unique_name starts its search where the last one ended (a hint): freeing a lower suffix must lower it.
    g = cg.Graph()
    with g.as_default():
        with cg.cell_scope("cell-a"):
            first = cg.constant(1.0, name="c")
        with cg.cell_scope("cell-b"):
            second = cg.constant(2.0, name="c")
        later = [cg.constant(3.0, name="c") for _ in range(3)]
        assert [first.name, second.name, *(t.name for t in later)] == ["c:0", "c_1:0", "c_2:0", "c_3:0", "c_4:0"]
        with cg.cell_scope("cell-b"):  # the re-run frees c_1, then makes its node again: the same name
            assert cg.constant(2.0, name="c").name == "c_1:0"
        with pytest.raises(ValueError, match="rolled back"), g.atomic():
            assert cg.constant(4.0, name="c").name == "c_5:0"
            raise ValueError("rolled back")
        assert cg.constant(4.0, name="c").name == "c_5:0"  # freed by the rollback, given again
        with g.name_scope("s") as scope, g.name_scope("s") as inner:
            assert (scope, inner) == ("s", "s/s")
        with g.name_scope("s") as again:  # a scope that made no node is free once it closes
            assert again == "s"
