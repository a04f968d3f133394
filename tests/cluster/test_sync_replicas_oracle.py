"""Two sync replicas of batch b train, step by step, as one ``cg.Session`` on their combined batch 2b.

The loss is a mean over the batch, so the mean of the two replicas' gradients
is the gradient of the mean over all 2b rows (torch DDP's averaged gradient).
Each replica's block of rows is one whole batch (``batch_size`` = rows per
replica), so the per-epoch shuffle only reorders a sum. After every step
count in ``CHECKED`` the servers' variables must be the local session's after
as many full-batch steps: SGD, momentum, Nesterov, Adam, AdamW and Adam under
a schedule (its rate read at the servers' global step, which counts a step of
two gradients once).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import pytest

import cellgraph as cg
from cellgraph.cluster.cluster import Cluster
from cellgraph.cluster.job import train

ROWS, INPUTS, HIDDEN, OUTPUTS = 12, 3, 5, 2
REPLICAS = 2
STEPS = 6
TIMEOUT = 120.0
F32 = np.float32
# The same float32 kernels on the same gradient, up to the order in which rows and the two gradients are summed.
RTOL, ATOL = 2e-5, 2e-6


def _data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(3)
    return rng.normal(size=(ROWS, INPUTS)).astype(F32), rng.normal(size=(ROWS, OUTPUTS)).astype(F32)


def _initial() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(4)
    return {
        "w1": (rng.normal(size=(INPUTS, HIDDEN)) * 0.7).astype(F32),
        "b1": (rng.normal(size=HIDDEN) * 0.1).astype(F32),
        "w2": (rng.normal(size=(HIDDEN, OUTPUTS)) * 0.7).astype(F32),
        "b2": (rng.normal(size=OUTPUTS) * 0.1).astype(F32),
    }


def _model() -> tuple[cg.Tensor, cg.Tensor, cg.Tensor, dict[str, cg.Tensor]]:
    """``mean((tanh(x w1 + b1) w2 + b2 - y)^2)`` in a new graph: (loss, x, y, variables)."""
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((None, INPUTS), "float32", name="x")
        y = cg.placeholder((None, OUTPUTS), "float32", name="y")
        v = {name: cg.variable(value, name=name) for name, value in _initial().items()}
        out = cg.matmul(cg.tanh(cg.matmul(x, v["w1"]) + v["b1"]), v["w2"]) + v["b2"]
        loss = cg.reduce_mean((out - y) ** 2.0, name="loss")
    return loss, x, y, v


def _local(optimizer: cg.optim.Optimizer, steps: int) -> dict[str, np.ndarray]:
    """The variables after ``steps`` steps on the combined batch (every row) in one session."""
    loss, x, y, v = _model()
    with loss.graph.as_default():
        step = cg.variable(0, dtype="int64", name="global_step", trainable=False)
        update = optimizer.minimize(loss, global_step=step)
    sess = cg.Session(loss.graph)
    xs, ys = _data()
    for _ in range(steps):
        sess.run(update, {x: xs, y: ys})
    return dict(zip(v, sess.run(list(v.values()))))


def _distributed(cluster: Cluster, optimizer: cg.optim.Optimizer, steps: int) -> dict[str, np.ndarray]:
    loss, *_ = _model()
    job = train(
        loss, _data(), cluster=cluster, optimizer=optimizer, replicas=REPLICAS, batch_size=ROWS // REPLICAS,
        steps=steps, mode="sync", timeout_s=TIMEOUT, checkpoint_every=None,
    )  # fmt: skip
    try:
        job.wait(TIMEOUT)
        assert job.status == "finished" and job.global_step() == steps
        return job.variables()
    finally:
        job.close()


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with Cluster.local(workers=REPLICAS, ps=1) as local:
        yield local


SCHEDULE = cg.optim.exponential_decay(0.05, decay_steps=2, decay_rate=0.5)
OPTIMIZERS: dict[str, Callable[[], cg.optim.Optimizer]] = {
    "sgd": lambda: cg.optim.SGD(0.3),
    "momentum": lambda: cg.optim.Momentum(0.1, momentum=0.8),
    "nesterov": lambda: cg.optim.Momentum(0.1, momentum=0.7, nesterov=True),
    "adam": lambda: cg.optim.Adam(0.02, beta1=0.8, beta2=0.95, epsilon=1e-3),
    "adamw": lambda: cg.optim.AdamW(0.02, weight_decay=0.5),
    "adam-exponential": lambda: cg.optim.Adam(SCHEDULE),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_two_sync_replicas_train_as_one_session_on_the_combined_batch(cluster: Cluster, name: str) -> None:
    make = OPTIMIZERS[name]
    found = _distributed(cluster, make(), STEPS)
    expected = _local(make(), STEPS)
    moved = max(float(np.abs(expected[n] - _initial()[n]).max()) for n in expected)
    assert moved > 1e-2, f"{name}: the parameters hardly moved ({moved}); the comparison would show nothing"
    # One replica's gradient alone (half the rows) would land elsewhere: the comparison can tell them apart.
    assert set(found) == set(expected)
    for key in expected:
        np.testing.assert_allclose(found[key], expected[key], rtol=RTOL, atol=ATOL, err_msg=f"{name}: {key}")
