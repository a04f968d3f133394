"""Every optimizer, 20 steps on a small MLP, against the same updates over torch tensors.

The MLP is 8-6-4 with a learned scalar logit scale, float64, trained on four
fixed batches in turn, with ``var_list`` given in several orders (and as a
subset). SGD, Momentum and Nesterov are torch.optim's (their rules are
TensorFlow's: ``accum = mu * accum + g``, ``var -= lr * accum``, or
``var -= lr * (g + mu * accum)``). Adam is written out: cellgraph places
epsilon as TensorFlow does (``lr_t = lr * sqrt(1 - b2^t) / (1 - b1^t)``,
``var -= lr_t * m / (sqrt(v) + eps)``), where torch.optim.Adam adds epsilon
to the bias-corrected ``sqrt(v_hat)``; AdamW is that Adam after
torch.optim.AdamW's decoupled decay. RMSProp is written out in TensorFlow's
form (epsilon inside the square root); Adagrad is torch.optim.Adagrad's.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from . import NO_TORCH

torch = pytest.importorskip("torch", reason=NO_TORCH)

import torch.nn.functional as F  # noqa: E402, N812

import cellgraph as cg  # noqa: E402

STEPS = 20
NAMES = ("w1", "b1", "w2", "b2", "scale")
ORDERS = {
    "default": None,
    "forward": NAMES,
    "reversed": tuple(reversed(NAMES)),
    "shuffled": ("b2", "w1", "scale", "b1", "w2"),
    "subset": ("scale", "w2"),
}


def _init() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(13)
    return {
        "w1": rng.normal(0, 0.5, (8, 6)),
        "b1": rng.normal(0, 0.1, (6,)),
        "w2": rng.normal(0, 0.5, (6, 4)),
        "b2": rng.normal(0, 0.1, (4,)),
        "scale": np.array(1.5),
    }


def _batches() -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(14)
    return [(rng.normal(size=(n, 8)), rng.integers(0, 4, n).astype(np.int32)) for n in (16, 16, 1, 9)]


def _logits(x: Any, p: dict[str, Any], tanh: Callable[[Any], Any]) -> Any:
    return (tanh(x @ p["w1"] + p["b1"]) @ p["w2"] + p["b2"]) * p["scale"]


# ------------------------------------------------------------ the torch side
class TFAdam:
    """Adam with TensorFlow's epsilon placement, over torch tensors (AdamW with ``weight_decay``)."""

    def __init__(
        self, params: list[Any], lr: float, beta1: float, beta2: float, eps: float, weight_decay: float = 0.0
    ) -> None:
        self.params, self.lr, self.b1, self.b2, self.eps = params, lr, beta1, beta2, eps
        self.weight_decay = weight_decay
        self.m = [torch.zeros_like(p) for p in params]
        self.v = [torch.zeros_like(p) for p in params]
        self.t = 0

    @torch.no_grad()
    def step(self) -> None:
        self.t += 1
        lr_t = self.lr * math.sqrt(1 - self.b2**self.t) / (1 - self.b1**self.t)
        for p, m, v in zip(self.params, self.m, self.v):
            p.mul_(1 - self.lr * self.weight_decay)  # decoupled, before the step, as torch.optim.AdamW does
            m.mul_(self.b1).add_((1 - self.b1) * p.grad)
            v.mul_(self.b2).add_((1 - self.b2) * p.grad * p.grad)
            p.sub_(lr_t * m / (v.sqrt() + self.eps))

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None


class TFRMSProp:
    """RMSProp as TensorFlow writes it (epsilon inside the square root, lr inside the momentum), over torch tensors."""

    def __init__(self, params: list[Any], lr: float, decay: float, momentum: float, eps: float) -> None:
        self.params, self.lr, self.decay, self.momentum, self.eps = params, lr, decay, momentum, eps
        self.ms = [torch.zeros_like(p) for p in params]
        self.mom = [torch.zeros_like(p) for p in params]

    @torch.no_grad()
    def step(self) -> None:
        for p, ms, mom in zip(self.params, self.ms, self.mom):
            ms.mul_(self.decay).add_((1 - self.decay) * p.grad * p.grad)
            mom.mul_(self.momentum).add_(self.lr * p.grad / (ms + self.eps).sqrt())
            p.sub_(mom)

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None


# name: (cellgraph optimizer, torch optimizer of a parameter list)
OPTIMIZERS: dict[str, tuple[Callable[[], Any], Callable[[list[Any]], Any]]] = {
    "sgd": (lambda: cg.optim.SGD(0.1), lambda ps: torch.optim.SGD(ps, lr=0.1)),
    "momentum": (lambda: cg.optim.Momentum(0.05, 0.9), lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9)),
    "nesterov": (
        lambda: cg.optim.Momentum(0.05, 0.9, nesterov=True),
        lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, nesterov=True),
    ),
    "adam": (lambda: cg.optim.Adam(0.02), lambda ps: TFAdam(ps, 0.02, 0.9, 0.999, 1e-8)),
    # A large epsilon makes its placement matter to the first digit.
    "adam-eps0.1": (
        lambda: cg.optim.Adam(0.02, beta1=0.8, beta2=0.99, epsilon=0.1),
        lambda ps: TFAdam(ps, 0.02, 0.8, 0.99, 0.1),
    ),
    "adamw": (
        lambda: cg.optim.AdamW(0.02, weight_decay=0.3),
        lambda ps: TFAdam(ps, 0.02, 0.9, 0.999, 1e-8, weight_decay=0.3),
    ),
    # A large epsilon makes its placement (inside the square root) matter.
    "rmsprop": (
        lambda: cg.optim.RMSProp(0.01, decay=0.8, momentum=0.6, epsilon=0.01),
        lambda ps: TFRMSProp(ps, 0.01, 0.8, 0.6, 0.01),
    ),
    "adagrad": (
        lambda: cg.optim.Adagrad(0.1, initial_accumulator_value=0.2, epsilon=1e-3),
        lambda ps: torch.optim.Adagrad(ps, lr=0.1, initial_accumulator_value=0.2, eps=1e-3),
    ),
}


def _torch_train(name: str, order: tuple[str, ...] | None) -> tuple[dict[str, np.ndarray], list[float]]:
    params = {k: torch.tensor(v, requires_grad=k in (order or NAMES)) for k, v in _init().items()}
    opt = OPTIMIZERS[name][1]([params[k] for k in (order or NAMES)])
    losses = []
    for step in range(STEPS):
        xb, yb = _batches()[step % 4]
        opt.zero_grad()
        loss = F.cross_entropy(_logits(torch.from_numpy(xb), params, torch.tanh), torch.from_numpy(yb).long())
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return {k: v.detach().numpy() for k, v in params.items()}, losses


# -------------------------------------------------------- the cellgraph side
def _cg_train(name: str, order: tuple[str, ...] | None, fuse: bool) -> tuple[dict[str, np.ndarray], list[float]]:
    g = cg.Graph()
    with g.as_default():
        params = {k: cg.variable(v, dtype="float64", name=k) for k, v in _init().items()}
        x = cg.placeholder((None, 8), "float64", name="x")
        y = cg.placeholder((None,), "int32", name="y")
        loss = cg.reduce_mean(cg.sparse_softmax_cross_entropy(_logits(x, params, cg.tanh), y))
        var_list = None if order is None else [params[k] for k in order]
        train = OPTIMIZERS[name][0]().minimize(loss, var_list=var_list)
    sess = cg.Session(g, fuse=fuse)
    losses = []
    for step in range(STEPS):
        xb, yb = _batches()[step % 4]
        _, value = sess.run([train, loss], {x: xb, y: yb})
        losses.append(float(value))
    return {k: sess.run(v) for k, v in params.items()}, losses


@pytest.mark.parametrize("fuse", [True, False], ids=["fused", "unfused"])
@pytest.mark.parametrize("order", list(ORDERS), ids=list(ORDERS))
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_optimizer_trains_the_mlp_as_torch_does(name: str, order: str, fuse: bool) -> None:
    want, want_losses = _torch_train(name, ORDERS[order])
    got, got_losses = _cg_train(name, ORDERS[order], fuse)
    np.testing.assert_allclose(got_losses, want_losses, rtol=1e-9, atol=1e-12, err_msg="loss at each step")
    for k in NAMES:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-9, atol=1e-12, err_msg=f"{k} after {STEPS} steps")


def test_adam_oracle_places_epsilon_as_tensorflow_does() -> None:
    """The hand-written Adam is not torch.optim.Adam: with a large epsilon one step tells them apart."""
    start = torch.tensor([1.0, -2.0], dtype=torch.float64)
    ends = []
    for make in (lambda p: TFAdam([p], 0.1, 0.9, 0.999, 0.5), lambda p: torch.optim.Adam([p], 0.1, eps=0.5)):
        p = start.clone().requires_grad_()
        opt = make(p)
        (p * p).sum().backward()
        opt.step()
        ends.append(p.detach().numpy())
    # TensorFlow: lr_t = 0.1 * sqrt(0.001) / 0.1; var -= lr_t * 0.1 g / (sqrt(0.001) |g| + 0.5).
    g = 2 * start.numpy()
    lr_t = 0.1 * math.sqrt(1 - 0.999) / (1 - 0.9)
    np.testing.assert_allclose(ends[0], start.numpy() - lr_t * 0.1 * g / (math.sqrt(0.001) * np.abs(g) + 0.5))
    assert not np.allclose(ends[0], ends[1], rtol=1e-3)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("reverse", [False, True], ids=["ab", "ba"])
def test_one_sgd_step_reads_the_values_before_it(dtype: str, reverse: bool) -> None:
    """a=[2], b=[3], SGD(0.1) on sum(a * b): a = 2 - 0.1 * 3 = 1.7 and b = 3 - 0.1 * 2 = 2.8."""
    g = cg.Graph()
    with g.as_default():
        a = cg.variable([2.0], dtype=dtype, name="a")
        b = cg.variable([3.0], dtype=dtype, name="b")
        var_list = [b, a] if reverse else [a, b]
        train = cg.optim.SGD(0.1).minimize(cg.reduce_sum(a * b), var_list=var_list)
    sess = cg.Session(g)
    sess.run(train)
    ta, tb = (torch.tensor([v], dtype=getattr(torch, dtype), requires_grad=True) for v in (2.0, 3.0))
    opt = torch.optim.SGD([tb, ta] if reverse else [ta, tb], lr=0.1)
    (ta * tb).sum().backward()
    opt.step()
    rtol = 1e-6 if dtype == "float32" else 1e-12
    np.testing.assert_allclose(sess.run(a), [1.7], rtol=rtol)
    np.testing.assert_allclose(sess.run(b), [2.8], rtol=rtol)
    np.testing.assert_allclose(sess.run(a), ta.detach().numpy(), rtol=rtol)
    np.testing.assert_allclose(sess.run(b), tb.detach().numpy(), rtol=rtol)
