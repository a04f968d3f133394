"""Every error the optimizer update ops and the optimizers raise, with its words."""

from __future__ import annotations

import re

import numpy as np
import pytest

import cellgraph as cg
from cellgraph.dataflow.ops import training

from .errors_helpers import ph, raises


def _var(name: str = "w", shape: tuple[int, ...] = (3,), dtype: str = "float32") -> cg.Tensor:
    return cg.variable(np.zeros(shape, dtype), dtype=dtype, name=name)


def _lr(value: object = 0.1, dtype: str = "float32") -> cg.Tensor:
    return cg.constant(value, dtype=dtype, name="lr")


# --------------------------------------------------- the update ops' shape rule
def test_update_error_names_the_op_node_and_line(fresh_graph: cg.Graph) -> None:
    w, lr = _var(), _lr()
    with pytest.raises(
        cg.ShapeError,
        match=r"^ApplyGradientDescent 'step' \(test_training_errors\.py:\d+\): grad has shape \(4,\), the variable has \(3,\)$",
    ):
        training.apply_gradient_descent(w, lr, ph(4, name="g"), name="step")


def test_var_must_be_a_variable(fresh_graph: cg.Graph) -> None:
    x, lr = ph(3), _lr()
    before = fresh_graph.nodes
    with raises(cg.GraphError, "var must be a variable, got Placeholder 'x'"):
        training.apply_gradient_descent(x, lr, x)
    assert fresh_graph.nodes == before


@pytest.mark.parametrize("slot", ["accum", "m", "v"])
def test_slot_must_be_a_variable(fresh_graph: cg.Graph, slot: str) -> None:
    w, lr, grad = _var(), _lr(), ph(3, name="g")
    fake = cg.identity(_var(name=slot), name=f"{slot}_read")  # a tensor, not the variable itself
    slots = {"accum": _var("accum"), "m": _var("m"), "v": _var("v"), slot: fake}
    t = cg.variable(0.0, name="t")
    before = fresh_graph.nodes
    with raises(cg.GraphError, f"{slot} must be a variable, got Identity '{slot}_read'"):
        if slot == "accum":
            training.apply_momentum(w, slots["accum"], lr, grad, momentum=0.9)
        else:
            training.apply_adam(w, slots["m"], slots["v"], t, lr, grad)
    assert fresh_graph.nodes == before


@pytest.mark.parametrize("which", ["lr", "grad"])
def test_input_dtype_must_match_the_variable(fresh_graph: cg.Graph, which: str) -> None:
    w = _var()
    lr = _lr(dtype="float64" if which == "lr" else "float32")
    grad = ph(3, dtype="float64" if which == "grad" else "float32", name="g")
    before = fresh_graph.nodes
    with raises(cg.DTypeError, f"{which} has dtype float64, the variable has float32"):
        training.apply_gradient_descent(w, lr, grad)
    assert fresh_graph.nodes == before


def test_adam_step_count_dtype_must_match_the_variable(fresh_graph: cg.Graph) -> None:
    w, m, v, lr = _var(), _var("m"), _var("v"), _lr()
    t = cg.variable(0, dtype="int32", name="t")
    grad = ph(3, name="g")
    before = fresh_graph.nodes
    with raises(cg.DTypeError, "t has dtype int32, the variable has float32"):
        training.apply_adam(w, m, v, t, lr, grad)
    assert fresh_graph.nodes == before


@pytest.mark.parametrize(("value", "shown"), [([0.1], "(1,)"), ([[0.1, 0.2]], "(1, 2)")])
def test_learning_rate_must_be_a_scalar(fresh_graph: cg.Graph, value: object, shown: str) -> None:
    w, lr, grad = _var(), _lr(value), ph(3, name="g")
    before = fresh_graph.nodes
    with raises(cg.ShapeError, f"learning rate must be a scalar, got shape {shown}"):
        training.apply_gradient_descent(w, lr, grad)
    assert fresh_graph.nodes == before


@pytest.mark.parametrize(("grad_shape", "shown"), [((4,), "(4,)"), ((3, 1), "(3, 1)"), ((None, 3), "(None, 3)")])
def test_gradient_shape_must_fit_the_variable(
    fresh_graph: cg.Graph, grad_shape: tuple[int | None, ...], shown: str
) -> None:
    w, lr = _var(), _lr()
    grad = ph(*grad_shape, name="g")
    before = fresh_graph.nodes
    with raises(cg.ShapeError, f"grad has shape {shown}, the variable has (3,)"):
        training.apply_gradient_descent(w, lr, grad)
    assert fresh_graph.nodes == before


def test_slot_shape_must_match_the_variable(fresh_graph: cg.Graph) -> None:
    w, lr = _var(), _lr()
    accum, grad = _var("accum", shape=(2, 3)), ph(3, name="g")
    before = fresh_graph.nodes
    with raises(cg.ShapeError, "accum has shape (2, 3), the variable has (3,)"):
        training.apply_momentum(w, accum, lr, grad, momentum=0.9)
    assert fresh_graph.nodes == before


# ---------------------------------------------------------------- optimizers
@pytest.mark.parametrize("optimizer", [cg.optim.Momentum(0.1), cg.optim.Adam(0.1)], ids=["Momentum", "Adam"])
def test_optimizer_can_only_update_variables(fresh_graph: cg.Graph, optimizer: cg.optim.Optimizer) -> None:
    x = cg.placeholder((3,), name="x")  # made here, so the message points at this file
    with pytest.raises(
        cg.GraphError,
        match=rf"^{optimizer.name}: can only update variables, not Placeholder 'x' \(test_training_errors\.py:\d+\)$",
    ):
        optimizer.apply_gradients([(x, x)])


def test_no_gradient_flows_lists_the_variables(fresh_graph: cg.Graph) -> None:
    w, v = _var(), _var("v", shape=(1,))
    before = fresh_graph.nodes
    with raises(cg.GradientError, "SGD: no gradient flows to any of w:0, v:0"):
        cg.optim.SGD(0.1).apply_gradients([(None, w), (None, v)])
    assert fresh_graph.nodes == before


def test_minimize_over_variables_the_loss_ignores(fresh_graph: cg.Graph) -> None:
    w = _var()
    loss = cg.reduce_sum(ph(3, name="x"))
    with pytest.raises(cg.GradientError, match=r"^" + re.escape("Adam: no gradient flows to any of w:0") + "$"):
        cg.optim.Adam(0.1).minimize(loss, var_list=[w])


@pytest.mark.parametrize("optimizer", [cg.optim.SGD(0.1), cg.optim.Momentum(0.1)], ids=["SGD", "Momentum"])
def test_a_rejected_apply_gradients_leaves_the_graph_unchanged(
    fresh_graph: cg.Graph, optimizer: cg.optim.Optimizer
) -> None:
    x = ph(3)
    before = fresh_graph.nodes
    with pytest.raises((cg.GraphError, cg.ShapeError), match="variable"):
        optimizer.apply_gradients([(x, x)])
    assert fresh_graph.nodes == before
