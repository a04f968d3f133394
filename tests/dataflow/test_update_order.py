"""Every gradient of a step reads the values from before the step.

An optimizer step computes all its gradients first and updates afterwards
(PyTorch's ``backward()`` then ``step()``). The expected values here come from
NumPy: hand-derived gradients and the update formulas written out, never from
cellgraph itself. Each model couples its variables (one's gradient reads the
others), so an update that ran before a gradient that reads its variable
changes the result, and ``var_list`` in every order must give the same one.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import numpy as np
import pytest

import cellgraph as cg

PS0, PS1 = "/job:ps/task:0/device:cpu:0", "/job:ps/task:1/device:cpu:0"
WORKER = "/job:worker/task:0/device:cpu:0"


def test_the_issue_reproduction() -> None:
    g = cg.Graph()
    with g.as_default():
        a = cg.variable([2.0], name="a")
        b = cg.variable([3.0], name="b")
        train = cg.optim.SGD(0.1).minimize(cg.reduce_sum(a * b))
    sess = cg.Session(g)
    sess.run(train)
    np.testing.assert_allclose(sess.run(a), [1.7], rtol=1e-6)
    np.testing.assert_allclose(sess.run(b), [2.8], rtol=1e-6)


# ------------------------------------------------- the model, in NumPy
# loss = sum(s * (X @ A) * (X @ B)): A's gradient reads B and s, B's reads A
# and s, s's reads both.
X = np.random.default_rng(0).normal(size=(6, 4))
INIT = {
    "A": np.random.default_rng(1).normal(size=(4, 3)) * 0.5,
    "B": np.random.default_rng(2).normal(size=(4, 3)) * 0.5,
    "s": np.array(0.7),
}


def _numpy_grads(v: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    xa, xb = X @ v["A"], X @ v["B"]
    return {"A": v["s"] * X.T @ xb, "B": v["s"] * X.T @ xa, "s": np.sum(xa * xb)}


def _sgd(lr: float) -> Callable[[dict, dict, dict, int], None]:
    def step(v: dict, g: dict, slots: dict, t: int) -> None:
        for k in v:
            v[k] = v[k] - lr * g[k]

    return step


def _momentum(lr: float, mu: float, nesterov: bool) -> Callable[[dict, dict, dict, int], None]:
    def step(v: dict, g: dict, slots: dict, t: int) -> None:
        for k in v:
            acc = slots[k] = mu * slots.get(k, 0.0) + g[k]
            v[k] = v[k] - lr * (g[k] + mu * acc if nesterov else acc)

    return step


def _adam(lr: float, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8) -> Callable[[dict, dict, dict, int], None]:
    # TensorFlow's placement of epsilon, as cellgraph documents it.
    def step(v: dict, g: dict, slots: dict, t: int) -> None:
        lr_t = lr * np.sqrt(1 - b2**t) / (1 - b1**t)
        for k in v:
            m, s = slots.get(k, (0.0, 0.0))
            m, s = b1 * m + (1 - b1) * g[k], b2 * s + (1 - b2) * g[k] ** 2
            slots[k] = (m, s)
            v[k] = v[k] - lr_t * m / (np.sqrt(s) + eps)

    return step


OPTIMIZERS = {
    "sgd": (lambda: cg.optim.SGD(0.05), _sgd(0.05)),
    "momentum": (lambda: cg.optim.Momentum(0.05, 0.9), _momentum(0.05, 0.9, False)),
    "nesterov": (lambda: cg.optim.Momentum(0.05, 0.9, nesterov=True), _momentum(0.05, 0.9, True)),
    "adam": (lambda: cg.optim.Adam(0.05), _adam(0.05)),
}
STEPS = 5


def _numpy_trajectory(step: Callable[[dict, dict, dict, int], None]) -> dict[str, np.ndarray]:
    values = {k: v.copy() for k, v in INIT.items()}
    slots: dict = {}
    for t in range(1, STEPS + 1):
        step(values, _numpy_grads(values), slots, t)
    return values


def _build(optimizer: cg.optim.Optimizer, order: tuple[str, ...]) -> tuple[cg.Graph, dict[str, cg.Tensor], cg.Node]:
    g = cg.Graph()
    with g.as_default():
        with cg.device(PS0):
            a = cg.variable(INIT["A"], dtype="float64", name="A")
            s = cg.variable(INIT["s"], dtype="float64", name="s")
        with cg.device(PS1):
            b = cg.variable(INIT["B"], dtype="float64", name="B")
        x = cg.constant(X, "float64", name="X")
        loss = cg.reduce_sum(s * (x @ a) * (x @ b), name="loss")
        variables = {"A": a, "B": b, "s": s}
        train = optimizer.minimize(loss, var_list=[variables[k] for k in order])
    return g, variables, train


ORDERS = list(itertools.permutations(["A", "B", "s"]))


@pytest.mark.parametrize("order", ORDERS, ids=["-".join(o) for o in ORDERS])
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("fuse", [True, False], ids=["fused", "unfused"])
def test_session_steps_read_the_values_from_before_the_step(name: str, order: tuple[str, ...], fuse: bool) -> None:
    make, numpy_step = OPTIMIZERS[name]
    g, variables, train = _build(make(), order)
    sess = cg.Session(g, fuse=fuse)
    for _ in range(STEPS):
        sess.run(train)
    want = _numpy_trajectory(numpy_step)
    for k, t in variables.items():
        np.testing.assert_allclose(sess.run(t), want[k], rtol=1e-10, atol=1e-12, err_msg=k)


@pytest.mark.parametrize("order", [ORDERS[0], ORDERS[-1]], ids=["A-B-s", "s-B-A"])
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_partitioned_steps_read_the_values_from_before_the_step(name: str, order: tuple[str, ...]) -> None:
    # The variables and their updates on two ps tasks, the gradients on the
    # worker: the updates wait for every gradient across the partitions.
    make, numpy_step = OPTIMIZERS[name]
    g, variables, train = _build(make(), order)
    placement = cg.placement.place(g, [PS0, PS1, WORKER])
    sess = cg.PartitionedSession(g, placement)
    for _ in range(STEPS):
        sess.run(train)
    want = _numpy_trajectory(numpy_step)
    for k, t in variables.items():
        np.testing.assert_allclose(sess.run(t), want[k], rtol=1e-10, atol=1e-12, err_msg=k)


def test_updates_wait_for_every_gradient_in_the_graph() -> None:
    g, variables, train = _build(cg.optim.Adam(0.1), ("A", "B", "s"))
    ready = g.node("Adam/gradients_ready")
    updates = [n for n in g.nodes if n.op == "ApplyAdam"]
    assert len(updates) == 3 and all(ready in n.control_inputs for n in updates)
    # Slots and the learning rate are made outside the dependency: they stay
    # plain variables and a constant.
    assert not g.node("Adam/A/m").control_inputs and not g.node("Adam/learning_rate").control_inputs
