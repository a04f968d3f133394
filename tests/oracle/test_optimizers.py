"""Every optimizer, 20 steps (30 for the later kinds) on a small MLP, against the same updates over torch tensors.

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


# ------------------------------------------------------------ the kinds a PyTorch or Keras user expects besides
# AMSGrad (Adam's and AdamW's amsgrad=True), centered RMSProp, Adamax, Nadam and Adadelta: 30 steps on the MLP in
# float64 (within 1e-10 of torch) and float32 (within rounding of torch's float32). Where cellgraph places epsilon
# as TensorFlow does, torch is told the exact conversion each step (Adam's kinds: eps / sqrt(1 - beta2^t)), runs
# at epsilon 0 (where the two forms are one), or the TensorFlow form is written out over torch tensors.
NEW_STEPS = 30
# One step's torch.optim hyperparameters, set before each step: (param group, 1-based step) -> None.
Adjust = Callable[[dict[str, Any], int], None]


def _tf_epsilon(epsilon: float, beta2: float) -> Adjust:
    """torch's eps for cellgraph's: cellgraph adds it to sqrt(v), torch to sqrt(v / (1 - beta2^t))."""

    def adjust(group: dict[str, Any], step: int) -> None:
        group["eps"] = epsilon / math.sqrt(1 - beta2**step)

    return adjust


class TFAdamax:
    """TensorFlow's ApplyAdaMax over torch tensors: u = max(beta2 u, |g|), epsilon added to u (torch adds it to |g|)."""

    def __init__(self, params: list[Any], lr: float, beta1: float, beta2: float, eps: float) -> None:
        self.params, self.lr, self.b1, self.b2, self.eps = params, lr, beta1, beta2, eps
        self.m = [torch.zeros_like(p) for p in params]
        self.u = [torch.zeros_like(p) for p in params]
        self.t = 0

    @torch.no_grad()
    def step(self) -> None:
        self.t += 1
        for p, m, u in zip(self.params, self.m, self.u):
            m.mul_(self.b1).add_((1 - self.b1) * p.grad)
            torch.maximum(u * self.b2, p.grad.abs(), out=u)
            p.sub_(self.lr / (1 - self.b1**self.t) * m / (u + self.eps))

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None


class TFCenteredRMSProp(TFRMSProp):
    """TensorFlow's ApplyCenteredRMSProp: mom = momentum mom + lr g / sqrt(ms - mg^2 + epsilon), var -= mom."""

    def __init__(self, params: list[Any], lr: float, decay: float, momentum: float, eps: float) -> None:
        super().__init__(params, lr, decay, momentum, eps)
        self.mg = [torch.zeros_like(p) for p in params]

    @torch.no_grad()
    def step(self) -> None:
        for p, ms, mg, mom in zip(self.params, self.ms, self.mg, self.mom):
            ms.mul_(self.decay).add_((1 - self.decay) * p.grad * p.grad)
            mg.mul_(self.decay).add_((1 - self.decay) * p.grad)
            mom.mul_(self.momentum).add_(self.lr * p.grad / (ms - mg * mg + self.eps).sqrt())
            p.sub_(mom)


# name: (cellgraph optimizer, torch optimizer of a parameter list, what torch is told before each step)
NEW: dict[str, tuple[Callable[[], Any], Callable[[list[Any]], Any], Adjust | None]] = {
    "amsgrad": (
        lambda: cg.optim.Adam(0.02, beta1=0.8, beta2=0.99, epsilon=1e-3, amsgrad=True),
        lambda ps: torch.optim.Adam(ps, lr=0.02, betas=(0.8, 0.99), amsgrad=True),
        _tf_epsilon(1e-3, 0.99),
    ),
    "adamw-amsgrad": (
        lambda: cg.optim.AdamW(0.02, beta2=0.95, epsilon=1e-3, weight_decay=0.3, amsgrad=True),
        lambda ps: torch.optim.AdamW(ps, lr=0.02, betas=(0.9, 0.95), weight_decay=0.3, amsgrad=True),
        _tf_epsilon(1e-3, 0.95),
    ),
    "rmsprop-centered": (
        lambda: cg.optim.RMSProp(0.01, decay=0.8, epsilon=0.0, centered=True),
        lambda ps: torch.optim.RMSprop(ps, lr=0.01, alpha=0.8, eps=0.0, centered=True),
        None,
    ),
    "rmsprop-centered-momentum": (
        lambda: cg.optim.RMSProp(0.01, decay=0.8, momentum=0.6, epsilon=0.0, centered=True),
        lambda ps: torch.optim.RMSprop(ps, lr=0.01, alpha=0.8, momentum=0.6, eps=0.0, centered=True),
        None,
    ),
    # A large epsilon: inside the square root (TensorFlow's), which torch.optim.RMSprop does not do.
    "rmsprop-centered-large-epsilon": (
        lambda: cg.optim.RMSProp(0.01, decay=0.7, momentum=0.5, epsilon=0.05, centered=True),
        lambda ps: TFCenteredRMSProp(ps, 0.01, 0.7, 0.5, 0.05),
        None,
    ),
    "adamax": (
        lambda: cg.optim.Adamax(0.02, beta1=0.8, beta2=0.99, epsilon=0.0),
        lambda ps: torch.optim.Adamax(ps, lr=0.02, betas=(0.8, 0.99), eps=0.0),
        None,
    ),
    # A large epsilon, added to u (TensorFlow's) where torch adds it to |g| inside the maximum.
    "adamax-large-epsilon": (
        lambda: cg.optim.Adamax(0.02, epsilon=0.1),
        lambda ps: TFAdamax(ps, 0.02, 0.9, 0.999, 0.1),
        None,
    ),
    "nadam": (
        lambda: cg.optim.Nadam(0.02, beta1=0.85, beta2=0.99, epsilon=1e-3, momentum_decay=0.05),
        lambda ps: torch.optim.NAdam(ps, lr=0.02, betas=(0.85, 0.99), momentum_decay=0.05),
        _tf_epsilon(1e-3, 0.99),
    ),
    "nadam-defaults": (
        lambda: cg.optim.Nadam(),
        lambda ps: torch.optim.NAdam(ps),
        _tf_epsilon(1e-8, 0.999),
    ),
    "adadelta": (
        lambda: cg.optim.Adadelta(1.0, rho=0.8, epsilon=1e-3),
        lambda ps: torch.optim.Adadelta(ps, lr=1.0, rho=0.8, eps=1e-3),
        None,
    ),
    "adadelta-defaults": (lambda: cg.optim.Adadelta(), lambda ps: torch.optim.Adadelta(ps), None),
}
# float32 against torch's float32: each step rounds differently (sums in another order), and dividing by a
# root of a small second moment magnifies that; the largest difference seen over these rows is 5.4e-7 (Nadam).
F32_RTOL, F32_ATOL = 1e-5, 2e-6


def _torch_new(name: str, dtype: str, order: tuple[str, ...]) -> dict[str, np.ndarray]:
    # torch keeps NAdam's mu_product and every step count in its default dtype: float64 for a float64 run.
    before = torch.get_default_dtype()
    torch.set_default_dtype(getattr(torch, dtype))
    try:
        params = {k: torch.tensor(v.astype(dtype), requires_grad=k in order) for k, v in _init().items()}
        _, make, adjust = NEW[name]
        opt = make([params[k] for k in order])
        for step in range(NEW_STEPS):
            xb, yb = _batches()[step % 4]
            if adjust is not None:
                for group in opt.param_groups:
                    adjust(group, step + 1)
            opt.zero_grad()
            logits = _logits(torch.from_numpy(xb.astype(dtype)), params, torch.tanh)
            F.cross_entropy(logits, torch.from_numpy(yb).long()).backward()
            opt.step()
    finally:
        torch.set_default_dtype(before)
    return {k: v.detach().numpy() for k, v in params.items()}


def _cg_new(name: str, dtype: str, order: tuple[str, ...]) -> dict[str, np.ndarray]:
    g = cg.Graph()
    with g.as_default():
        params = {k: cg.variable(v, dtype=dtype, name=k) for k, v in _init().items()}
        x = cg.placeholder((None, 8), dtype, name="x")
        y = cg.placeholder((None,), "int32", name="y")
        loss = cg.reduce_mean(cg.sparse_softmax_cross_entropy(_logits(x, params, cg.tanh), y))
        train = NEW[name][0]().minimize(loss, var_list=[params[k] for k in order])
    sess = cg.Session(g)
    for step in range(NEW_STEPS):
        xb, yb = _batches()[step % 4]
        sess.run(train, {x: xb.astype(dtype), y: yb})
    return {k: sess.run(v) for k, v in params.items()}


@pytest.mark.parametrize("order", ["forward", "shuffled"])
@pytest.mark.parametrize("name", list(NEW))
def test_a_new_kind_trains_the_mlp_as_torch_does_in_float64(name: str, order: str) -> None:
    names = ORDERS[order] or NAMES
    want, got = _torch_new(name, "float64", names), _cg_new(name, "float64", names)
    moved = max(float(np.abs(want[k] - _init()[k]).max()) for k in NAMES)
    assert moved > 1e-2, f"{name}: the parameters hardly moved ({moved}); the comparison would show nothing"
    for k in NAMES:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-10, atol=1e-12, err_msg=f"{k} after {NEW_STEPS} steps")


@pytest.mark.parametrize("name", list(NEW))
def test_a_new_kind_trains_the_mlp_as_torch_does_in_float32(name: str) -> None:
    want, got = _torch_new(name, "float32", NAMES), _cg_new(name, "float32", NAMES)
    for k in NAMES:
        assert got[k].dtype == np.float32
        np.testing.assert_allclose(got[k], want[k], rtol=F32_RTOL, atol=F32_ATOL, err_msg=f"{k} in float32")


def test_the_written_out_forms_are_not_torchs_at_a_large_epsilon() -> None:
    """TFAdamax and TFCenteredRMSProp differ from torch.optim's at a large epsilon: the rows above test a placement."""
    start = torch.tensor([1.0, -2.0], dtype=torch.float64)
    for ours, theirs in (
        (lambda p: TFAdamax([p], 0.1, 0.9, 0.999, 0.5), lambda p: torch.optim.Adamax([p], 0.1, eps=0.5)),
        (
            lambda p: TFCenteredRMSProp([p], 0.1, 0.9, 0.0, 0.5),
            lambda p: torch.optim.RMSprop([p], 0.1, alpha=0.9, eps=0.5, centered=True),
        ),
    ):
        ends = []
        for make in (ours, theirs):
            p = start.clone().requires_grad_()
            opt = make(p)
            for _ in range(3):  # Adamax's first step is the same in both: u = |g| (+ epsilon) either way
                opt.zero_grad()
                (p * p).sum().backward()
                opt.step()
            ends.append(p.detach().numpy())
        # Far beyond the 1e-10 of the rows (Adamax: 6e-5 apart after 3 steps, centered RMSProp: 2e-2).
        assert not np.allclose(ends[0], ends[1], rtol=1e-6, atol=0)
