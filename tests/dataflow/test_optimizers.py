"""Optimizers follow the same trajectory as PyTorch's on the same problem."""

from __future__ import annotations

import numpy as np
import pytest

import cellgraph as cg

torch = pytest.importorskip("torch", reason="compares against PyTorch: pip install torch==2.13.0")

X = np.random.default_rng(0).normal(size=(16, 5))
Y = np.random.default_rng(1).normal(size=(16, 3))
W0 = np.random.default_rng(2).normal(size=(5, 3))


def _cellgraph_trajectory(optimizer: cg.optim.Optimizer, steps: int) -> np.ndarray:
    g = cg.Graph()
    with g.as_default():
        w = cg.variable(W0, dtype="float64", name="w")
        loss = cg.reduce_mean(cg.square(cg.constant(X, "float64") @ w - cg.constant(Y, "float64")))
        train = optimizer.minimize(loss)
    sess = cg.Session(g)
    for _ in range(steps):
        sess.run(train)
    return sess.run(w)


def _torch_trajectory(make, steps: int) -> np.ndarray:  # noqa: ANN001
    w = torch.tensor(W0, requires_grad=True)
    opt = make([w])
    x, y = torch.tensor(X), torch.tensor(Y)
    for _ in range(steps):
        opt.zero_grad()
        ((x @ w - y) ** 2).mean().backward()
        opt.step()
    return w.detach().numpy()


@pytest.mark.parametrize(
    ("ours", "theirs"),
    [
        (lambda: cg.optim.SGD(0.1), lambda p: torch.optim.SGD(p, lr=0.1)),
        (lambda: cg.optim.Momentum(0.05, 0.9), lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9)),
        (
            lambda: cg.optim.Momentum(0.05, 0.9, nesterov=True),
            lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, nesterov=True),
        ),
        (lambda: cg.optim.Adam(0.01), lambda p: torch.optim.Adam(p, lr=0.01, eps=1e-8)),
    ],
    ids=["sgd", "momentum", "nesterov", "adam"],
)
def test_matches_pytorch_over_ten_steps(ours, theirs) -> None:  # noqa: ANN001
    # Adam adds epsilon after bias correction here (TensorFlow's "epsilon hat"
    # form) and before it in PyTorch: the two differ by O(epsilon) per step.
    rtol = 1e-5 if isinstance(ours(), cg.optim.Adam) else 1e-6
    np.testing.assert_allclose(_cellgraph_trajectory(ours(), 10), _torch_trajectory(theirs, 10), rtol=rtol, atol=1e-9)


def test_bad_hyperparameters_are_rejected() -> None:
    with pytest.raises(ValueError, match=r"SGD: learning_rate must be positive, got 0"):
        cg.optim.SGD(0)
    with pytest.raises(ValueError, match=r"Momentum: momentum must be in \[0, 1\), got 1.5"):
        cg.optim.Momentum(0.1, 1.5)
    with pytest.raises(ValueError, match=r"Adam: beta2 must be in \[0, 1\), got 1.0"):
        cg.optim.Adam(0.1, beta2=1.0)


def test_minimize_without_variables_is_an_error() -> None:
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((3,), name="x")
        with pytest.raises(
            cg.GradientError, match=r"SGD: 'reduce_sum:0' depends on no trainable variable; nothing to optimise"
        ):
            cg.optim.SGD(0.1).minimize(cg.reduce_sum(x))


def test_global_step_counts_updates_and_slots_are_named_after_variables() -> None:
    g = cg.Graph()
    with g.as_default():
        w = cg.variable([1.0, 2.0], name="w")
        step = cg.variable(0, dtype="int32", name="global_step", trainable=False)
        train = cg.optim.Adam(0.1).minimize(cg.reduce_sum(w * w), global_step=step)
    sess = cg.Session(g)
    for _ in range(3):
        sess.run(train)
    assert sess.run(step) == 3
    assert {"Adam/w/m", "Adam/w/v", "Adam/w/t"} <= {n.name for n in g.variables()}
    assert sess.run(g.tensor("Adam/w/t:0")) == 3.0
