"""Every optimizer trains a small model to the same numbers locally, on a cluster, and in torch.optim.

The later kinds (AMSGrad, centered RMSProp, Adamax, Nadam, Adadelta) have rows too, and AMSGrad's and Nadam's
slots (vhat; the scalar mu_product beside t) go through a checkpoint and a resumed job.

One 2-layer MLP on fixed data, full batch, 20 steps: (a) a ``cg.Session``
running ``optimizer.minimize``, (b) ``cg.train`` with one replica in sync mode
on a real ``Cluster.local`` (so its one step is the same full-batch gradient,
applied by the parameter server), and (c) PyTorch's ``torch.optim`` on the
same model in float64, the independent oracle. The model also reads a frozen
(``trainable=False``) variable, which must not move and must not be trained.

Where cellgraph's definition differs from torch's by design, the oracle is told
the difference, never the other way round: Adam adds epsilon after the bias
correction (TensorFlow's form), which is torch's epsilon divided by
``sqrt(1 - beta2**t)`` at step ``t``, so torch's ``eps`` is set to that each
step; RMSProp adds epsilon inside the square root and the learning rate inside
the momentum (TensorFlow's form), so it is compared with torch.optim.RMSprop
at a negligible epsilon and a constant rate, and otherwise with that form
written out in torch (``TensorFlowRMSProp``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import cellgraph as cg
from cellgraph.cluster.cluster import Cluster
from cellgraph.cluster.job import Job, train
from cellgraph.cluster.ps.checkpoint import read_shard_checkpoint

torch = pytest.importorskip("torch", reason="compares against PyTorch: pip install torch==2.13.0")

ROWS, INPUTS, HIDDEN, OUTPUTS = 8, 3, 5, 2
STEPS = 20
TIMEOUT = 120.0
F32 = np.float32
# float32 against float64 over 20 steps: each step's rounding (~1e-7 relative) is carried and compounded
# (Adam divides by sqrt(v), which makes a small gradient's rounding a larger change: 2.8e-6 seen at most).
RTOL, ATOL = 1e-5 * STEPS, 2e-7 * STEPS
# Local and cluster run the same float32 kernel on the same gradient; only the order of the batch's rows
# (a sync replica shuffles its rows each epoch) changes the mean's rounding.
SAME_RTOL, SAME_ATOL = 1e-5, 1e-6


def _data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return rng.normal(size=(ROWS, INPUTS)).astype(F32), rng.normal(size=(ROWS, OUTPUTS)).astype(F32)


def _initial() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    return {
        "w1": (rng.normal(size=(INPUTS, HIDDEN)) * 0.7).astype(F32),
        "b1": (rng.normal(size=HIDDEN) * 0.1).astype(F32),
        "w2": (rng.normal(size=(HIDDEN, OUTPUTS)) * 0.7).astype(F32),
        "b2": (rng.normal(size=OUTPUTS) * 0.1).astype(F32),
    }


FROZEN = np.array([1.5, -0.5], F32)  # a per-output scale nobody trains
TRAINED = ("w1", "b1", "w2", "b2")


@dataclass
class Model:
    loss: cg.Tensor
    x: cg.Tensor
    y: cg.Tensor
    variables: dict[str, cg.Tensor]


def _model() -> Model:
    """mean((tanh(x w1 + b1) w2 + b2) * frozen - y)^2), in a new graph."""
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((None, INPUTS), "float32", name="x")
        y = cg.placeholder((None, OUTPUTS), "float32", name="y")
        v = {name: cg.variable(value, name=name) for name, value in _initial().items()}
        v["frozen"] = cg.variable(FROZEN, name="frozen", trainable=False)
        h = cg.tanh(cg.matmul(x, v["w1"]) + v["b1"])
        out = (cg.matmul(h, v["w2"]) + v["b2"]) * v["frozen"]
        loss = cg.reduce_mean((out - y) ** 2.0, name="loss")
    return Model(loss, x, y, v)


# ------------------------------------------------------------------ the three runs
def _local(optimizer: cg.optim.Optimizer, steps: int = STEPS, slots: bool = False) -> dict[str, np.ndarray]:
    """The variables after ``steps`` full-batch steps of ``optimizer.minimize`` in a cg.Session; with ``slots``,
    the optimizer's slots too, keyed as a server's checkpoint keys them (``w1/m``)."""
    model = _model()
    x, y = _data()
    with model.loss.graph.as_default():
        step = cg.variable(0, dtype="int64", name="global_step", trainable=False)
        train = optimizer.minimize(model.loss, global_step=step)
    sess = cg.Session(model.loss.graph)
    for _ in range(steps):
        sess.run(train, {model.x: x, model.y: y})
    assert int(sess.run(step)) == steps
    if slots:
        scope = f"{optimizer.name}/"
        return {k.removeprefix(scope): v for k, v in sess.variable_values().items() if k.startswith(scope)}
    return dict(zip(model.variables, sess.run(list(model.variables.values()))))


def _train(cluster: Cluster, optimizer: cg.optim.Optimizer, steps: int = STEPS, **options: Any) -> Job:
    model = _model()
    return train(
        model.loss, _data(), cluster=cluster, optimizer=optimizer, replicas=1, batch_size=ROWS, steps=steps,
        mode="sync", timeout_s=TIMEOUT, **{"checkpoint_every": None, **options},
    )  # fmt: skip


def _distributed(cluster: Cluster, optimizer: cg.optim.Optimizer, **options: Any) -> dict[str, np.ndarray]:
    """The variables the parameter server holds after a one-replica sync ``cg.train`` job of STEPS steps."""
    job = _train(cluster, optimizer, **options)
    try:
        job.wait(TIMEOUT)
        assert job.status == "finished" and job.global_step() == STEPS
        return job.variables()
    finally:
        job.close()


# One step's torch.optim hyperparameters, set before each step: (param group, 0-based step) -> None.
Adjust = Callable[[dict[str, Any], int], None]


def _torch(make: Callable[[list[Any]], Any], adjust: Adjust | None = None, steps: int = STEPS) -> dict[str, Any]:
    """The same model trained by torch.optim in float64; ``adjust`` sets a step's rate or epsilon."""
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)  # torch keeps NAdam's mu_product in it
    try:
        return _torch_steps(make, adjust, steps)
    finally:
        torch.set_default_dtype(before)


def _torch_steps(make: Callable[[list[Any]], Any], adjust: Adjust | None, steps: int) -> dict[str, Any]:
    x, y = (torch.tensor(a, dtype=torch.float64) for a in _data())
    params = {name: torch.tensor(value, dtype=torch.float64, requires_grad=True) for name, value in _initial().items()}
    frozen = torch.tensor(FROZEN, dtype=torch.float64)
    opt = make(list(params.values()))
    for step in range(steps):
        if adjust is not None:
            for group in opt.param_groups:
                adjust(group, step)
        opt.zero_grad()
        out = (torch.tanh(x @ params["w1"] + params["b1"]) @ params["w2"] + params["b2"]) * frozen
        ((out - y) ** 2).mean().backward()
        opt.step()
    return {name: p.detach().numpy() for name, p in params.items()}


# ------------------------------------------------------------------ what torch is told
def _adam_epsilon(epsilon: float, beta2: float) -> Adjust:
    """Torch's eps for cellgraph's: cellgraph adds it to sqrt(v), torch to sqrt(v / (1 - beta2**t))."""

    def adjust(group: dict[str, Any], step: int) -> None:
        group["eps"] = epsilon / math.sqrt(1 - beta2 ** (step + 1))

    return adjust


def _cosine(peak: float, decay: int, warmup: int, alpha: float) -> Callable[[int], float]:
    def rate(step: int) -> float:
        if step < warmup:
            return peak * step / warmup
        t = min(step - warmup, decay) / decay
        return peak * (alpha + (1 - alpha) * (1 + math.cos(math.pi * t)) / 2)

    return rate


def _scheduled(rate: Callable[[int], float], then: Adjust | None = None) -> Adjust:
    def adjust(group: dict[str, Any], step: int) -> None:
        group["lr"] = rate(step)
        if then is not None:
            then(group, step)

    return adjust


def _piecewise(step: int) -> float:
    """PIECEWISE's rate: 0.2 up to and including step 5, 0.05 up to 12, then 0.01."""
    return 0.2 if step <= 5 else 0.05 if step <= 12 else 0.01


class TensorFlowRMSProp(torch.optim.Optimizer):  # type: ignore[misc,name-defined]
    """RMSProp as TensorFlow defines it, which torch.optim.RMSprop does not: ``ms = decay ms + (1 - decay) g^2``,
    ``mom = momentum mom + lr g / sqrt(ms + epsilon)``, ``p -= mom`` (the rate inside the momentum)."""

    def __init__(self, params: list[Any], lr: float, decay: float, momentum: float, epsilon: float) -> None:
        super().__init__(params, {"lr": lr, "decay": decay, "momentum": momentum, "epsilon": epsilon})

    @torch.no_grad()  # type: ignore[misc]
    def step(self, closure: None = None) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                state = self.state[p]
                if not state:
                    state["ms"], state["mom"] = torch.zeros_like(p), torch.zeros_like(p)
                ms, mom, g = state["ms"], state["mom"], p.grad
                ms.mul_(group["decay"]).add_((1 - group["decay"]) * g * g)
                mom.mul_(group["momentum"]).add_(group["lr"] * g / torch.sqrt(ms + group["epsilon"]))
                p.sub_(mom)


@dataclass(frozen=True)
class Case:
    name: str
    optimizer: Callable[[], cg.optim.Optimizer]
    torch_optimizer: Callable[[list[Any]], Any]
    adjust: Adjust | None = None


COSINE = cg.optim.cosine_decay(0.05, 12, warmup_steps=4, alpha=0.1)
PIECEWISE = cg.optim.piecewise_constant([5, 12], [0.2, 0.05, 0.01])

CASES = [
    Case("sgd", lambda: cg.optim.SGD(0.3), lambda ps: torch.optim.SGD(ps, lr=0.3)),
    Case("momentum", lambda: cg.optim.Momentum(0.1, momentum=0.8),
         lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.8)),
    Case("nesterov", lambda: cg.optim.Momentum(0.1, momentum=0.7, nesterov=True),
         lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.7, nesterov=True)),
    Case("adam", lambda: cg.optim.Adam(0.02, beta1=0.8, beta2=0.95, epsilon=1e-8),
         lambda ps: torch.optim.Adam(ps, lr=0.02, betas=(0.8, 0.95)), _adam_epsilon(1e-8, 0.95)),
    # A large epsilon: where it is added (before or after the bias correction) shows in every step.
    Case("adam-large-epsilon", lambda: cg.optim.Adam(0.02, epsilon=0.1),
         lambda ps: torch.optim.Adam(ps, lr=0.02), _adam_epsilon(0.1, 0.999)),
    Case("adamw", lambda: cg.optim.AdamW(0.02, beta1=0.85, beta2=0.99, weight_decay=0.5),
         lambda ps: torch.optim.AdamW(ps, lr=0.02, betas=(0.85, 0.99), weight_decay=0.5), _adam_epsilon(1e-8, 0.99)),
    # epsilon inside the square root (TensorFlow's) is not torch's: negligible here, large in TensorFlowRMSProp's.
    Case("rmsprop", lambda: cg.optim.RMSProp(0.01, decay=0.8, momentum=0.6, epsilon=1e-20),
         lambda ps: torch.optim.RMSprop(ps, lr=0.01, alpha=0.8, momentum=0.6, eps=0.0)),
    Case("adagrad", lambda: cg.optim.Adagrad(0.2, initial_accumulator_value=0.3, epsilon=1e-3),
         lambda ps: torch.optim.Adagrad(ps, lr=0.2, initial_accumulator_value=0.3, eps=1e-3)),
    # Schedules: the rate of step s is taken at global step s (0 first), before the step's increment.
    Case("adam-cosine-warmup", lambda: cg.optim.Adam(COSINE, epsilon=1e-8),
         lambda ps: torch.optim.Adam(ps, lr=0.0),
         _scheduled(_cosine(0.05, 12, 4, 0.1), _adam_epsilon(1e-8, 0.999))),
    Case("momentum-piecewise", lambda: cg.optim.Momentum(PIECEWISE, momentum=0.5),
         lambda ps: torch.optim.SGD(ps, lr=0.0, momentum=0.5),
         _scheduled(_piecewise)),
    Case("adamw-exponential", lambda: cg.optim.AdamW(cg.optim.exponential_decay(0.03, 4, 0.5), weight_decay=0.2),
         lambda ps: torch.optim.AdamW(ps, lr=0.0, weight_decay=0.2),
         _scheduled(lambda s: 0.03 * 0.5 ** (s / 4), _adam_epsilon(1e-8, 0.999))),
    Case("adagrad-piecewise", lambda: cg.optim.Adagrad(PIECEWISE, initial_accumulator_value=0.05),
         lambda ps: torch.optim.Adagrad(ps, lr=0.0, initial_accumulator_value=0.05, eps=1e-7),
         _scheduled(_piecewise)),
    # TensorFlow's RMSProp (epsilon inside the square root, the rate inside the momentum) written out in torch.
    Case("rmsprop-large-epsilon", lambda: cg.optim.RMSProp(0.01, decay=0.5, momentum=0.3, epsilon=0.05),
         lambda ps: TensorFlowRMSProp(ps, lr=0.01, decay=0.5, momentum=0.3, epsilon=0.05)),
    Case("rmsprop-exponential", lambda: cg.optim.RMSProp(cg.optim.exponential_decay(0.02, 3, 0.6), momentum=0.4),
         lambda ps: TensorFlowRMSProp(ps, lr=0.0, decay=0.9, momentum=0.4, epsilon=1e-10),
         _scheduled(lambda s: 0.02 * 0.6 ** (s / 3))),
    # The later kinds: AMSGrad's slot vhat, centered RMSProp's mg, Adamax's u, Nadam's scalar mu_product beside t,
    # Adadelta's two averages. Epsilon as for Adam (told to torch), or 0 where torch places it otherwise.
    Case("amsgrad", lambda: cg.optim.Adam(0.02, beta1=0.8, beta2=0.95, epsilon=1e-6, amsgrad=True),
         lambda ps: torch.optim.Adam(ps, lr=0.02, betas=(0.8, 0.95), amsgrad=True), _adam_epsilon(1e-6, 0.95)),
    Case("rmsprop-centered", lambda: cg.optim.RMSProp(0.01, decay=0.8, momentum=0.6, epsilon=0.0, centered=True),
         lambda ps: torch.optim.RMSprop(ps, lr=0.01, alpha=0.8, momentum=0.6, eps=0.0, centered=True)),
    Case("adamax", lambda: cg.optim.Adamax(0.02, beta1=0.8, beta2=0.95, epsilon=0.0),
         lambda ps: torch.optim.Adamax(ps, lr=0.02, betas=(0.8, 0.95), eps=0.0)),
    Case("nadam", lambda: cg.optim.Nadam(0.02, beta1=0.85, beta2=0.99, epsilon=1e-6, momentum_decay=0.05),
         lambda ps: torch.optim.NAdam(ps, lr=0.02, betas=(0.85, 0.99), momentum_decay=0.05),
         _adam_epsilon(1e-6, 0.99)),
    Case("adadelta", lambda: cg.optim.Adadelta(1.0, rho=0.8, epsilon=1e-4),
         lambda ps: torch.optim.Adadelta(ps, lr=1.0, rho=0.8, eps=1e-4)),
]  # fmt: skip


def _assert_close(found: dict[str, np.ndarray], expected: dict[str, np.ndarray], rtol: float, atol: float) -> None:
    for name in TRAINED:
        np.testing.assert_allclose(found[name], expected[name], rtol=rtol, atol=atol, err_msg=name)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_a_local_session_trains_as_torch_optim_does(case: Case) -> None:
    local = _local(case.optimizer())
    expected = _torch(case.torch_optimizer, case.adjust)
    moved = max(float(np.abs(expected[n] - _initial()[n]).max()) for n in TRAINED)
    assert moved > 1e-2, f"{case.name}: the parameters hardly moved ({moved}); the comparison would show nothing"
    _assert_close(local, expected, RTOL, ATOL)
    np.testing.assert_array_equal(local["frozen"], FROZEN)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with Cluster.local(workers=1, ps=1) as local:
        yield local


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_a_cluster_job_trains_as_a_local_session_does(cluster: Cluster, case: Case) -> None:
    distributed = _distributed(cluster, case.optimizer())
    # The frozen variable is not the servers' to train: it stays the graph's constant.
    assert set(distributed) == set(TRAINED)
    _assert_close(distributed, _local(case.optimizer()), SAME_RTOL, SAME_ATOL)


RESUMED = [
    c for c in CASES if c.name in ("adam-cosine-warmup", "rmsprop-exponential", "adagrad-piecewise", "amsgrad", "nadam")
]


@pytest.mark.slow
@pytest.mark.parametrize("case", RESUMED, ids=lambda c: c.name)
def test_a_job_resumed_mid_training_keeps_the_slots_the_step_count_and_the_schedules_step(
    cluster: Cluster, tmp_path: Path, case: Case
) -> None:
    """A job resumed from a checkpoint its servers wrote mid-training trains as the straight run (and torch) does."""
    straight = _train(cluster, case.optimizer(), checkpoint_every=5, checkpoint_dir=tmp_path)
    try:
        straight.wait(TIMEOUT)
        # Every 5 steps, but a write still on the disk when the next is due gives way to the newer one
        # (cluster/ps/autosave.py): on a loaded machine step 10's may be skipped. Any checkpoint before the
        # end is a resume mid-training.
        middle = [name for name in straight.checkpoints if 0 < int(name.removeprefix("ckpt-")) < STEPS]
        assert middle, straight.checkpoints
        resumed_at = int(middle[-1].removeprefix("ckpt-"))
        expected = straight.variables()
    finally:
        straight.close()
    # Every slot the kind keeps with its flags (AMSGrad's vhat, Nadam's mu_product) is in the checkpoint, as a
    # local Session holds it after as many steps.
    saved = read_shard_checkpoint(tmp_path, middle[-1], 0, 1)
    slots = saved.optimizer.slots()
    local = _local(case.optimizer(), resumed_at, slots=True)
    assert set(local) == {f"{name}/{slot}" for name in TRAINED for slot in slots}
    for key, value in local.items():
        np.testing.assert_allclose(saved.tensors[key], value, rtol=SAME_RTOL, atol=SAME_ATOL, err_msg=key)
    resumed = _train(cluster, case.optimizer(), checkpoint_dir=tmp_path, resume_from=middle[-1])
    try:
        resumed.wait(TIMEOUT)
        assert resumed.global_step() == STEPS and resumed.ps_stats()[0]["updates"] == STEPS - resumed_at
        found = resumed.variables()
    finally:
        resumed.close()
    _assert_close(found, expected, SAME_RTOL, SAME_ATOL)
    _assert_close(found, _torch(case.torch_optimizer, case.adjust), RTOL, ATOL)
