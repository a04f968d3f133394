"""One optimizer keeps one state per variable, however many training ops it builds: as torch.optim does.

A variable trained on two losses by turns with one optimizer (``train_a =
opt.minimize(loss_a)``, ``train_b = opt.minimize(loss_b)``) must move as one
``torch.optim`` optimizer stepping on each loss in turn: one set of moments,
one step count for Adam's bias correction, one momentum. Each ``minimize``
used to make its own slots, so Adam's ``t`` restarted for the second loss and
each op's moments saw half the gradients, without a word. Two optimizer
objects keep two states, in both libraries. Epsilon is 0 where cellgraph
places it otherwise than torch (see test_optimizers.py), so the rules agree.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from . import NO_TORCH

torch = pytest.importorskip("torch", reason=NO_TORCH)

import cellgraph as cg  # noqa: E402

STEPS = 8
START = np.array([1.0, -2.0, 0.5])

KINDS: dict[str, tuple[Callable[[], cg.optim.Optimizer], Callable[[list[Any]], Any]]] = {
    "adam": (lambda: cg.optim.Adam(0.1, epsilon=0.0), lambda ps: torch.optim.Adam(ps, lr=0.1, eps=0.0)),
    "adamw": (
        lambda: cg.optim.AdamW(0.1, epsilon=0.0, weight_decay=0.3),
        lambda ps: torch.optim.AdamW(ps, lr=0.1, eps=0.0, weight_decay=0.3),
    ),
    "nesterov": (
        lambda: cg.optim.Momentum(0.05, momentum=0.8, nesterov=True),
        lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.8, nesterov=True),
    ),
    "rmsprop-centered": (
        lambda: cg.optim.RMSProp(0.02, decay=0.8, momentum=0.5, epsilon=0.0, centered=True),
        lambda ps: torch.optim.RMSprop(ps, lr=0.02, alpha=0.8, momentum=0.5, eps=0.0, centered=True),
    ),
    "adagrad": (
        lambda: cg.optim.Adagrad(0.3, initial_accumulator_value=0.2, epsilon=1e-3),
        lambda ps: torch.optim.Adagrad(ps, lr=0.3, initial_accumulator_value=0.2, eps=1e-3),
    ),
    "nadam": (
        lambda: cg.optim.Nadam(0.05, epsilon=0.0, momentum_decay=0.05),
        lambda ps: torch.optim.NAdam(ps, lr=0.05, eps=0.0, momentum_decay=0.05),
    ),
}


def _losses(w: Any, sin: Callable[[Any], Any], total: Callable[[Any], Any]) -> tuple[Any, Any]:
    return total(w * w * w), total(sin(w) * 3.0)


def _cellgraph(make: Callable[[], cg.optim.Optimizer], shared: bool) -> np.ndarray:
    g = cg.Graph()
    with g.as_default():
        w = cg.variable(START, dtype="float64", name="w")
        loss_a, loss_b = _losses(w, cg.sin, cg.reduce_sum)
        first = make()
        train_a = first.minimize(loss_a)
        train_b = (first if shared else make()).minimize(loss_b)
    sess = cg.Session(g)
    for _ in range(STEPS):
        sess.run(train_a)
        sess.run(train_b)
    return np.asarray(sess.run(w))


def _torch(make: Callable[[list[Any]], Any], shared: bool) -> np.ndarray:
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)  # torch keeps NAdam's mu_product and step in it (float32 otherwise)
    try:
        return _torch_steps(make, shared)
    finally:
        torch.set_default_dtype(before)


def _torch_steps(make: Callable[[list[Any]], Any], shared: bool) -> np.ndarray:
    w = torch.tensor(START, dtype=torch.float64, requires_grad=True)
    first = make([w])
    second = first if shared else make([w])
    for _ in range(STEPS):
        for opt, which in ((first, 0), (second, 1)):
            opt.zero_grad()
            _losses(w, torch.sin, torch.sum)[which].backward()  # from w as the previous step left it
            opt.step()
    return w.detach().numpy()


@pytest.mark.parametrize("kind", list(KINDS))
def test_one_optimizer_on_two_losses_by_turns_keeps_one_state_as_torch_does(kind: str) -> None:
    make, make_torch = KINDS[kind]
    found = _cellgraph(make, shared=True)
    np.testing.assert_allclose(found, _torch(make_torch, shared=True), rtol=1e-12, atol=1e-12)
    # The two ways land apart, so the comparison above tells a shared state from two.
    assert np.abs(found - _torch(make_torch, shared=False)).max() > 1e-4


@pytest.mark.parametrize("kind", list(KINDS))
def test_two_optimizers_on_one_variable_keep_two_states_as_torch_does(kind: str) -> None:
    make, make_torch = KINDS[kind]
    np.testing.assert_allclose(_cellgraph(make, shared=False), _torch(make_torch, shared=False), rtol=1e-12, atol=1e-12)


def test_one_optimizer_makes_a_variables_slots_once() -> None:
    """The second minimize reads and updates the first one's slots: no second set is made."""
    g = cg.Graph()
    with g.as_default():
        w = cg.variable(START, dtype="float64", name="w")
        adam = cg.optim.Adam(0.1)
        adam.minimize(cg.reduce_sum(w * w))
        adam.minimize(cg.reduce_sum(cg.sin(w)))
    assert sorted(n.name for n in g.variables()) == ["Adam/w/m", "Adam/w/t", "Adam/w/v", "w"]


def test_a_rerun_cell_makes_the_slots_it_took_out_again() -> None:
    """The optimizer made in one cell and ``minimize`` in another: re-running the second takes its slots out of
    the graph, and the re-run makes them anew under the same names (not reading the removed ones)."""
    g = cg.Graph()
    with cg.cell_scope("c1", graph=g), g.as_default():
        w = cg.variable(START, dtype="float64", name="w")
        adam = cg.optim.Adam(0.1)
    for _ in range(2):
        with cg.cell_scope("c2", graph=g), g.as_default():
            train = adam.minimize(cg.reduce_sum(w * w))
    assert sorted(n.name for n in g.variables()) == ["Adam/w/m", "Adam/w/t", "Adam/w/v", "w"]
    assert all(slot in g for slot in adam._slots[w.node].values())
    sess = cg.Session(g)
    sess.run(train)
    # Adam's first step (t = 1) moves every element by the rate: m / sqrt(v) is the gradient's sign.
    np.testing.assert_allclose(sess.run(w), START - 0.1 * np.sign(START), rtol=1e-6)


@pytest.mark.parametrize("kind", ["sgd", "adam"])
def test_two_gradients_of_one_variable_in_one_step_are_refused(kind: str) -> None:
    """Applied one after the other they were two Adam steps (t moved twice) where torch takes one of their sum."""
    g = cg.Graph()
    with g.as_default():
        w = cg.variable(START, dtype="float64", name="w")
        opt = cg.optim.SGD(0.1) if kind == "sgd" else cg.optim.Adam(0.1)
        pairs = opt.compute_gradients(cg.reduce_sum(w * w)) + opt.compute_gradients(cg.reduce_sum(w * 3.0))
        with pytest.raises(cg.GraphError) as err:
            opt.apply_gradients(pairs)
        with pytest.raises(cg.GraphError, match="variable 'w' has two gradients in one apply_gradients"):
            opt.minimize(cg.reduce_sum(w * w), var_list=[w, w])
    assert str(err.value) == (
        f"{opt.name}: variable 'w' has two gradients in one apply_gradients; one step applies one gradient per "
        "variable: add them first (cg.add(g1, g2)), or give each loss its own training op"
    )
    assert not any(n.op.startswith("Apply") for n in g.nodes)  # refused before anything was built
