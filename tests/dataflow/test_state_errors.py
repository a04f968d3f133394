"""Every error the state family (placeholders, variables, assignment) raises, with its words."""

from __future__ import annotations

import re
from collections.abc import Callable

import numpy as np
import pytest

import cellgraph as cg

from .errors_helpers import ph, raises

Assign = Callable[..., cg.Tensor]


# ------------------------------------------------------------ Placeholder
@pytest.mark.parametrize(("shape", "shown"), [((2, -3), "(2, -3)"), ((-2,), "(-2,)"), ((None, 4, -5), "(None, 4, -5)")])
def test_placeholder_negative_dimension(fresh_graph: cg.Graph, shape: tuple[int | None, ...], shown: str) -> None:
    with raises(cg.ShapeError, f"placeholder 'x': negative dimension in shape {shown}"):
        cg.placeholder(shape, name="x")
    assert fresh_graph.nodes == []


def test_placeholder_minus_one_means_unknown_not_negative(fresh_graph: cg.Graph) -> None:
    assert cg.placeholder((-1, 3), name="x").shape == (None, 3)


# ---------------------------------------------------------------- Variable
def test_variable_initializer_needs_a_shape(fresh_graph: cg.Graph) -> None:
    with raises(cg.ShapeError, "variable 'w': an initializer needs a shape"):
        cg.variable(cg.init.zeros, name="w")
    assert fresh_graph.nodes == []


@pytest.mark.parametrize(
    ("value", "shape", "message"),
    [
        ([1.0, 2.0], (3,), "initial value has shape (2,), expected (3,)"),
        (np.ones((2, 3)), (3, 2), "initial value has shape (2, 3), expected (3, 2)"),
        (1.0, (1,), "initial value has shape (), expected (1,)"),
    ],
)
def test_variable_initial_value_has_the_wrong_shape(
    fresh_graph: cg.Graph, value: object, shape: tuple[int, ...], message: str
) -> None:
    with raises(cg.ShapeError, f"variable 'w': {message}"):
        cg.variable(value, shape=shape, name="w")
    assert fresh_graph.nodes == []


# ------------------------------------------------------- Assign, AssignAdd
@pytest.mark.parametrize(("assign", "op"), [(cg.assign, "Assign"), (cg.assign_add, "AssignAdd")])
def test_can_only_assign_to_a_variable(fresh_graph: cg.Graph, assign: Assign, op: str) -> None:
    x = ph(3)
    before = fresh_graph.nodes
    with pytest.raises(cg.GraphError, match=rf"^{op} '\w+' \(test_state_errors\.py:\d+\): "):
        assign(x, x)
    with raises(cg.GraphError, "can only assign to a variable, not to Placeholder 'x'"):
        assign(x, x)
    assert fresh_graph.nodes == before


def test_assign_dtype_mismatch_names_the_variable(fresh_graph: cg.Graph) -> None:
    # cg.assign converts the value to the variable's dtype first (see
    # test_core_errors.py); a node built directly reaches the shape rule.
    w = cg.variable([1.0, 2.0, 3.0], name="w")
    i = ph(3, dtype="int32", name="i")
    before = fresh_graph.nodes
    for op in ("Assign", "AssignAdd"):
        with pytest.raises(cg.DTypeError, match=rf"^{op} '\w+' \(test_state_errors\.py:\d+\): "):
            fresh_graph.create_node(op, [w, i])
        with raises(cg.DTypeError, "value has dtype int32, variable 'w' has float32"):
            fresh_graph.create_node(op, [w, i])
    assert fresh_graph.nodes == before


@pytest.mark.parametrize(
    ("assign", "node"), [(cg.assign, "Assign 'assign'"), (cg.assign_add, "AssignAdd 'assign_add'")]
)
@pytest.mark.parametrize(("value_shape", "shown"), [((2,), "(2,)"), ((3, 1), "(3, 1)"), ((), "()"), ((4,), "(4,)")])
def test_assign_shape_mismatch_names_the_node_and_the_variable(
    fresh_graph: cg.Graph, assign: Assign, node: str, value_shape: tuple[int, ...], shown: str
) -> None:
    w = cg.variable([1.0, 2.0, 3.0], name="w")
    value = ph(*value_shape, name="v")
    before = fresh_graph.nodes
    words = re.escape(f"value has shape {shown}, variable 'w' has (3,)")
    with pytest.raises(cg.ShapeError, match=rf"^{re.escape(node)} \(test_state_errors\.py:\d+\): {words}$"):
        assign(w, value)
    assert fresh_graph.nodes == before


def test_assign_accepts_an_unknown_dim_that_may_fit(fresh_graph: cg.Graph) -> None:
    w = cg.variable([1.0, 2.0, 3.0], name="w")
    assert cg.assign(w, ph(None, name="v")).shape == (3,)


@pytest.mark.parametrize("assign", [cg.assign, cg.assign_add])
def test_a_rejected_assign_of_a_python_value_leaves_the_graph_unchanged(fresh_graph: cg.Graph, assign: Assign) -> None:
    w = cg.variable([1.0, 2.0, 3.0], name="w")
    before = fresh_graph.nodes
    with raises(cg.ShapeError, "value has shape (2,), variable 'w' has (3,)"):
        assign(w, [1.0, 2.0])
    assert fresh_graph.nodes == before


def test_a_value_fed_for_another_shape_fails_assign_and_assign_add() -> None:
    """The shape rule lets a value of unknown dims through; fed (1,) for a (3,) variable, assign filled all three
    (a broadcast) without a word. Now the rule runs again over the arrays and the variable keeps its value."""
    g = cg.Graph()
    with g.as_default():
        v = cg.variable(np.zeros(3), dtype="float64", name="v")
        value = cg.placeholder((None,), "float64", name="value")
        ops = [cg.assign(v, value, name="set"), cg.assign_add(v, value, name="add")]
    sess = cg.Session(g)
    for op, kind in zip(ops, ("Assign 'set'", "AssignAdd 'add'")):
        with pytest.raises(cg.ExecutionError) as err:
            sess.run(op, {value: np.ones(1)})
        assert str(err.value).startswith(kind)
        assert "failed while running: ValueError: value has shape (1,), variable 'v' has (3,)" in str(err.value)
    np.testing.assert_array_equal(sess.run(v), np.zeros(3))


@pytest.mark.parametrize(
    ("value", "words"),
    [
        (np.array([5, 2**40]), "it holds 1099511627776, outside int32's range [-2147483648, 2147483647], and "
         "without a dtype its int64 numbers are made int32: pass dtype='int64' to keep them"),
        ([1.0, 1e300], "it holds 1e+300, past float32's largest finite value 3.40282e+38, and without a dtype its "
         "float64 numbers are made float32: pass dtype='float64' to keep them"),
    ],
)  # fmt: skip
def test_a_constant_whose_numbers_its_default_dtype_cannot_hold_is_refused(
    fresh_graph: cg.Graph, value: object, words: str
) -> None:
    """Without a dtype, 2**40 was held as 0 and 1e300 as inf (NumPy's int32 cast wraps round; its float32 cast
    only warns); the narrowing of float64 and int64 to float32 and int32 stays for the numbers that fit."""
    before = len(fresh_graph.nodes)
    with raises(cg.DTypeError, f"constant 'big': {words}"):
        cg.constant(value, name="big")
    assert len(fresh_graph.nodes) == before  # nothing added
    kept = cg.constant(value, dtype=str(np.asarray(value).dtype), name="kept")
    np.testing.assert_array_equal(cg.Session(fresh_graph).run(kept), value)
    small = cg.constant(np.array([5, 2**31 - 1]), name="small")
    assert small.dtype == "int32" and cg.Session(fresh_graph).run(small).tolist() == [5, 2**31 - 1]
