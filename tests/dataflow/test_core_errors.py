"""Every error of the core (dtypes, tensors, graph, autodiff, executor, cells), with its words."""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest

import cellgraph as cg
from cellgraph.dataflow.opdef import OPS, OpDef, register_op
from cellgraph.dataflow.ops.base import apply, infer_same

from .errors_helpers import ph, raises

KNOWN_DTYPES = "float16, bfloat16, float32, float64, int8, uint8, int16, int32, int64, bool, string"


@contextmanager
def _temporary_op(name: str, **fields: Any) -> Iterator[None]:
    """Register a test-only op for the block, then take it out of the registry again."""
    register_op(OpDef(name=name, family="test", infer=infer_same, reference=lambda attrs, x: x, **fields))
    try:
        yield
    finally:
        OPS._values.pop(name)
        OPS._where.pop(name)


def _in_cell(cell: str, label: str, body: Callable[[], Any]) -> Any:
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        with cg.cell_scope(cell, label=label):
            return body()


# ------------------------------------------------------------------ dtypes
@pytest.mark.parametrize("dtype", ["complex64", "uint32", "bytes"])
def test_unsupported_dtype_lists_the_known_ones(fresh_graph: cg.Graph, dtype: str) -> None:
    with raises(cg.DTypeError, f"unsupported dtype {dtype!r}; cellgraph knows {KNOWN_DTYPES}"):
        cg.placeholder((2,), dtype, name="x")
    assert fresh_graph.nodes == []


# --------------------------------------------------------------- as_tensor
def test_a_tensor_of_the_wrong_dtype_is_not_converted(fresh_graph: cg.Graph) -> None:
    w = cg.variable([1.0, 2.0, 3.0], name="w")
    i = ph(3, dtype="int32", name="i")
    before = fresh_graph.nodes
    with raises(cg.DTypeError, "value has dtype int32, variable 'w' has float32"):
        cg.assign(w, i)
    assert fresh_graph.nodes == before
    with raises(cg.DTypeError, "tensor 'i:0' has dtype int32, expected float32"):
        cg.dataflow.ops.base.as_tensor(i, "float32")


def test_a_fractional_scalar_is_not_truncated_for_an_int_tensor(fresh_graph: cg.Graph) -> None:
    i = ph(3, dtype="int32", name="i")
    before = fresh_graph.nodes
    with raises(cg.DTypeError, "cannot use 1.5 as an int32 value: it is not a whole number"):
        i + 1.5
    assert fresh_graph.nodes == before  # the rejected constant is gone too
    assert (i + 2.0).dtype == "int32"


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("op", [lambda x, a: x * a, lambda x, a: x + a, lambda x, a: a - x, lambda x, a: a / x])
def test_a_numpy_array_operand_takes_the_tensors_float_dtype(fresh_graph: cg.Graph, dtype: str, op: Any) -> None:
    x = ph(3, dtype=dtype, name="x")
    values = np.array([1.0, 2.0, 4.0], dtype)
    for array in (
        np.array([0.5, 0.25, 3.0]),
        np.array([0.5, 0.25, 3.0], np.float32),
        np.array([1, 2, 3]),
        [1.5, 2.0, 3.0],
    ):
        y = op(x, array)
        assert y.dtype == dtype
        want = op(values, np.asarray(array, dtype))
        np.testing.assert_array_equal(cg.Session(fresh_graph).run(y, {x: values}), want)


def test_an_int_array_operand_takes_the_tensors_int_dtype_when_it_fits(fresh_graph: cg.Graph) -> None:
    i = ph(3, dtype="int32", name="i")
    y = i + np.array([1, 2, 3], np.int64)
    assert y.dtype == "int32"
    np.testing.assert_array_equal(cg.Session(fresh_graph).run(y, {i: np.array([10, 20, 30], np.int32)}), [11, 22, 33])


def test_an_array_operand_that_would_change_kind_or_overflow_is_refused(fresh_graph: cg.Graph) -> None:
    i = ph(3, dtype="int32", name="i")
    b = ph(3, dtype="bool", name="b")
    before = fresh_graph.nodes
    with raises(cg.DTypeError, "Mul: cannot use a float64 array as an int32 operand: that changes its kind"):
        i * np.ones(3)
    with raises(cg.DTypeError, "Add: cannot use a float64 array as an int32 operand: that changes its kind"):
        i + [1.0, 2.0, 3.0]
    with raises(cg.DTypeError, "Equal: cannot use an int64 array as a bool operand: that changes its kind"):
        cg.equal(b, np.array([1, 0, 1]))
    with raises(
        cg.DTypeError,
        "Sub: cannot use an int64 array as an int32 value: it holds 2147483648, outside int32's range [-2147483648, 2147483647]",
    ):
        i - np.array([2**31, 0, 0])
    with raises(cg.DTypeError, "Add: cannot use 1.5 as an int32 value: it is not a whole number"):
        1.5 + i
    with raises(cg.DTypeError, "Mul: cannot use 'abc' (<U3) as an int32 value"):
        i * "abc"
    with raises(cg.DTypeError, "Maximum: cannot use an object array (object) as an int32 value"):
        cg.maximum(i, np.array([None, 1, 2]))
    assert fresh_graph.nodes == before  # no constant left behind by a refused operand


# ---------------------------------------------------------------- autodiff
def test_gradients_needs_one_grad_y_per_y(fresh_graph: cg.Graph) -> None:
    x = ph(2)
    y = cg.reduce_sum(x)
    before = fresh_graph.nodes
    with raises(cg.GradientError, "gradients() got 1 ys but 2 grad_ys"):
        cg.gradients([y], [x], grad_ys=[None, None])
    with raises(cg.GradientError, "gradients() got 2 ys but 1 grad_ys"):
        cg.gradients([y, y], [x], grad_ys=[None])
    assert fresh_graph.nodes == before


def test_a_gradient_rule_must_return_one_gradient_per_input(fresh_graph: cg.Graph) -> None:
    def two_for_one(node: cg.Node, dys: list[cg.Tensor | None]) -> list[cg.Tensor | None]:
        return [dys[0], dys[0]]

    with _temporary_op("TestCoreErrorsGradCount", grad=two_for_one, kernels={"cpu": lambda n, c: lambda x: x}):
        x = ph(2)
        y = apply("TestCoreErrorsGradCount", [x], name="twice")
        with pytest.raises(
            cg.GradientError,
            match=r"^gradient rule of TestCoreErrorsGradCount 'twice' \(test_core_errors\.py:\d+\) "
            r"returned 2 gradients for 1 inputs$",
        ):
            cg.gradients(y, [x])


# ---------------------------------------------------------------- executor
@pytest.mark.parametrize(("kernels", "have"), [({"cuda": lambda n, c: lambda x: x}, "cuda"), ({}, "none")])
def test_missing_cpu_kernel_names_the_node_and_the_kernels_there_are(
    fresh_graph: cg.Graph, kernels: dict[str, Any], have: str
) -> None:
    with _temporary_op("TestCoreErrorsNoCpu", grad=lambda node, dys: [dys[0]], kernels=kernels):
        x = ph(2)
        y = apply("TestCoreErrorsNoCpu", [x], name="accel")
        with pytest.raises(
            cg.KernelNotFound,
            match=r"^TestCoreErrorsNoCpu 'accel' \(test_core_errors\.py:\d+\) has no cpu kernel; "
            rf"kernels exist for: {have}$",
        ):
            cg.Session(fresh_graph).run(y, {x: np.ones(2, np.float32)})


def test_a_cycle_names_a_node_on_it(fresh_graph: cg.Graph) -> None:
    x = ph(2)
    a = cg.identity(x, name="a")
    b = cg.identity(a, name="b")
    a.node.inputs[0] = b  # by hand: the graph API cannot make a cycle
    with pytest.raises(
        cg.ExecutionError, match=r"^the graph has a cycle through Identity 'b' \(test_core_errors\.py:\d+\)$"
    ):
        cg.Session(fresh_graph).run(b)


def test_a_cycle_through_a_control_input_is_found(fresh_graph: cg.Graph) -> None:
    a = cg.identity(ph(2), name="a")
    b = cg.identity(a, name="b")
    a.node.control_inputs.append(b.node)
    with pytest.raises(cg.ExecutionError, match=r"the graph has a cycle through Identity 'b' "):
        cg.Session(fresh_graph).run(b)


# ------------------------------------------------------------------- graph
@pytest.mark.parametrize("index", [1, 7])
def test_tensor_by_name_with_a_bad_output_index(fresh_graph: cg.Graph, index: int) -> None:
    ph(2)
    with raises(cg.GraphError, f"node 'x' has 1 output, not index {index}"):
        fresh_graph.tensor(f"x:{index}")


@pytest.mark.parametrize("name", ["x:-1", "x:abc"])
def test_tensor_by_name_that_is_not_node_colon_index(fresh_graph: cg.Graph, name: str) -> None:
    ph(2)
    with raises(cg.GraphError, f"bad tensor name {name!r}: use 'node' or 'node:index'"):
        fresh_graph.tensor(name)


def test_a_handle_from_before_a_cell_rerun_is_refused(fresh_graph: cg.Graph) -> None:
    old = _in_cell("a", "1", lambda: cg.placeholder((2,), name="x"))
    _in_cell("a", "2", lambda: cg.placeholder((2,), name="x"))
    before = fresh_graph.nodes
    removed = r"'x' \(cell 1, line \d+\)" + re.escape(
        " was removed from the graph (its cell was re-run; use the new handle)"
    )
    message = "node " + removed
    with pytest.raises(cg.GraphError, match=r"^Identity 'identity' \([^)]*\): input " + removed + "$"):
        cg.identity(old)
    with pytest.raises(cg.GraphError, match=rf"^{message}$"):
        with cg.control_dependencies([old]):
            pass
    with pytest.raises(cg.GraphError, match=rf"^{message}$"):
        with cg.colocate_with(old):
            pass
    assert fresh_graph.nodes == before


def test_control_dependency_on_a_node_of_another_graph(fresh_graph: cg.Graph) -> None:
    other = cg.Graph()
    with other.as_default():
        y = cg.placeholder((2,), name="y")
    with raises(
        cg.GraphError, f"belongs to another graph, graph #{other.number} (1 node), not to graph #{fresh_graph.number}"
    ):
        with fresh_graph.control_dependencies([y]):
            pass
    with raises(cg.GraphError, "node 'y' ("):
        with fresh_graph.control_dependencies([y.node]):
            pass
    assert fresh_graph.nodes == []


@pytest.mark.parametrize(("value", "shown"), [(1.5, "1.5"), ([1.0, 2.0], "[1.0, 2.0]"), ("x:0", "'x:0'")])
def test_create_node_takes_only_tensors(fresh_graph: cg.Graph, value: object, shown: str) -> None:
    x = ph(2)
    with raises(cg.GraphError, f"Identity input {shown} is not a Tensor"):
        fresh_graph.create_node("Identity", [value])  # type: ignore[list-item]
    with raises(cg.GraphError, f"Add input {shown} is not a Tensor"):
        fresh_graph.create_node("Add", [x, value])  # type: ignore[list-item]
    assert fresh_graph.nodes == [x.node]


# ------------------------------------------------------------------- cells
def test_rerun_that_changes_a_consumers_output_makes_it_stale(fresh_graph: cg.Graph) -> None:
    x = _in_cell("a", "1", lambda: cg.placeholder((None, 2), name="x"))
    y = _in_cell("b", "2", lambda: cg.identity(x, name="y"))
    _in_cell("a", "3", lambda: cg.placeholder((None, 5), name="x"))
    assert y.node.stale == "re-running cell 3 changed its output from (None, 2) to (None, 5)"
    feed = {fresh_graph.tensor("x:0"): np.ones((1, 5), np.float32)}
    with pytest.raises(
        cg.StaleNodeError,
        match=r"^Identity 'y' \(cell 2, line \d+\) is stale: "
        + re.escape("re-running cell 3 changed its output from (None, 2) to (None, 5); re-run cell 2")
        + "$",
    ):
        cg.Session(fresh_graph).run(y, feed)


def test_rerun_whose_outputs_no_longer_fit_a_consumer_makes_it_stale(fresh_graph: cg.Graph) -> None:
    x = _in_cell("a", "1", lambda: cg.placeholder((None, 4), name="x"))
    y = _in_cell("b", "2", lambda: cg.matmul(x, cg.variable(cg.init.zeros, shape=(4, 3), name="w"), name="mm"))
    _in_cell("a", "3", lambda: cg.placeholder((None, 5), name="x"))
    # The node's own prefix is said once, by whoever reports the staleness.
    rule = re.escape("inner dimensions differ: (None, 5) @ (4, 3)")
    assert y.node.stale is not None
    assert re.fullmatch(r"its inputs from cell 3 no longer fit: " + rule, y.node.stale)
    feed = {fresh_graph.tensor("x:0"): np.ones((1, 5), np.float32)}
    with pytest.raises(
        cg.StaleNodeError,
        match=r"^MatMul 'mm' \(cell 2, line \d+\) is stale: its inputs from cell 3 no longer fit: "
        + rule
        + "; re-run cell 2$",
    ):
        cg.Session(fresh_graph).run(y, feed)
