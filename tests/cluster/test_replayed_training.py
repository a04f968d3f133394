"""``cg.train`` on a LocalCluster with two parameter servers against an independent PyTorch replay.

The replay takes, step by step, exactly the batches each replica takes by the
rules ``cg.train`` documents (not by calling cellgraph): replica ``i`` trains
on the ``i``-th contiguous block of rows (the first ``rows % replicas`` blocks
one row longer); epoch ``e`` of its block is ordered by
``np.random.default_rng([seed + i, e]).permutation(len(block))`` and cut into
``len(block) // batch_size`` batches; a replica that joins at global step
``g`` starts at batch ``g``. A sync step applies the mean of the replicas'
gradients, with the learning rate of the global step before the update
(TensorFlow's ``SyncReplicasOptimizer`` and ``LearningRateSchedule``).
Adam's epsilon is 1e-16, where TensorFlow's form (the one cellgraph uses) and
PyTorch's agree to rounding.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import cellgraph as cg
from cellgraph.cluster.cluster import Cluster
from cellgraph.cluster.training_graph import TrainingError
from cellgraph.inference import checkpoint_values, trained_values

TIMEOUT = 120.0
ROWS, D, OUT = 11, 6, 3
RNG = np.random.default_rng(3)
X, Y = RNG.normal(size=(ROWS, D)), RNG.normal(size=(ROWS, OUT))
W0, B0 = RNG.normal(size=(D, OUT)) * 0.5, RNG.normal(size=(OUT,)) * 0.1

Batch = tuple[np.ndarray, np.ndarray]


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with Cluster.local(workers=2, ps=2) as local:
        yield local


def _loss(reduce: str = "mean") -> cg.Tensor:
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((None, D), "float64", name="x")
        y = cg.placeholder((None, OUT), "float64", name="y")
        w = cg.variable(W0, dtype="float64", name="w")
        b = cg.variable(B0, dtype="float64", name="b")
        return getattr(cg, f"reduce_{reduce}")(cg.square(cg.tanh(x @ w + b) - y), name="loss")


def replica_batches(replicas: int, batch_size: int, seed: int, first: int, count: int) -> list[list[Batch]]:
    """``[step][replica]``: batches ``first .. first + count - 1`` of every replica, by the documented rule."""
    per, extra = divmod(ROWS, replicas)
    steps: list[list[Batch]] = [[] for _ in range(count)]
    start = 0
    for i in range(replicas):
        stop = start + per + (1 if i < extra else 0)
        block_x, block_y = X[start:stop], Y[start:stop]
        start = stop
        per_epoch = len(block_x) // batch_size
        for n in range(count):
            epoch, within = divmod(first + n, per_epoch)
            order = np.random.default_rng([seed + i, epoch]).permutation(len(block_x))
            rows = order[within * batch_size : (within + 1) * batch_size]
            steps[n].append((block_x[rows], block_y[rows]))
    return steps


def torch_replay(
    make: Callable[[list[torch.Tensor]], torch.optim.Optimizer],
    steps: list[list[Batch]],
    rate: Callable[[int], float] | None = None,
    reduce: str = "mean",
) -> dict[str, np.ndarray]:
    """Each step: the mean of the replicas' gradients, at the rate of the global step before the update."""
    w, b = (torch.tensor(v, requires_grad=True) for v in (W0, B0))
    opt = make([w, b])
    for step, batches in enumerate(steps):
        grads = []
        for bx, by in batches:
            losses = (torch.tanh(torch.tensor(bx) @ w + b) - torch.tensor(by)).square()
            gw, gb = torch.autograd.grad(getattr(losses, reduce)(), [w, b])
            grads.append((gw, gb))
        w.grad = sum(g for g, _ in grads) / len(grads)  # type: ignore[assignment]
        b.grad = sum(g for _, g in grads) / len(grads)  # type: ignore[assignment]
        if rate is not None:
            for group in opt.param_groups:
                group["lr"] = rate(step)
        opt.step()
    return {"w": w.detach().numpy(), "b": b.detach().numpy()}


def train(cluster: Cluster, data: tuple[np.ndarray, ...] = (X, Y), **options: object) -> dict[str, np.ndarray]:
    job = cg.train(_loss(), data, cluster=cluster, **options)
    try:
        job.wait(TIMEOUT)
        assert job.status == "finished", job.events
        return job.variables()
    finally:
        job.close()


def assert_close(got: dict[str, np.ndarray], want: dict[str, np.ndarray], what: str) -> None:
    for name in ("w", "b"):
        assert not np.allclose(want[name], W0 if name == "w" else B0), f"{name} did not move: the test shows nothing"
        np.testing.assert_allclose(got[name], want[name], rtol=1e-9, atol=1e-12, err_msg=f"{name}: {what}")


def _cosine(peak: float, decay: int, warmup: int, alpha: float) -> Callable[[int], float]:
    def rate(step: int) -> float:
        if step < warmup:
            return peak * step / warmup
        t = min(step - warmup, decay) / decay
        return peak * ((1 - alpha) * 0.5 * (1 + math.cos(math.pi * t)) + alpha)

    return rate


# kind -> (cellgraph's optimizer, torch's, the rate schedule torch follows or None)
OPTIMIZERS: dict[str, tuple[Callable[[], Any], Callable[[list[torch.Tensor]], torch.optim.Optimizer], Any]] = {
    "adam, cosine schedule": (
        lambda: cg.optim.Adam(cg.optim.cosine_decay(0.1, 4, warmup_steps=2, alpha=0.1), epsilon=1e-16),
        lambda p: torch.optim.Adam(p, lr=0.1, eps=1e-16),
        _cosine(0.1, 4, 2, 0.1),
    ),
    "momentum, exponential schedule": (
        lambda: cg.optim.Momentum(cg.optim.exponential_decay(0.2, 2, 0.5), 0.9),
        lambda p: torch.optim.SGD(p, lr=0.2, momentum=0.9),
        lambda step: 0.2 * 0.5 ** (step / 2),
    ),
    "adamw": (
        lambda: cg.optim.AdamW(0.05, weight_decay=0.3, epsilon=1e-16),
        lambda p: torch.optim.AdamW(p, lr=0.05, weight_decay=0.3, eps=1e-16),
        None,
    ),
}


@pytest.mark.parametrize("placement", ["dedicated", "colocated"])
@pytest.mark.parametrize("kind", list(OPTIMIZERS))
def test_a_sync_job_with_a_variable_split_over_two_servers_matches_torch(
    cluster: Cluster, kind: str, placement: str
) -> None:
    """Both halves of ``w`` (one per server: the PS workers', or one in each replica's worker) take the same rate,
    step count and mean gradient each step."""
    make, torch_make, rate = OPTIMIZERS[kind]
    got = train(
        cluster, optimizer=make(), replicas=2, batch_size=2, steps=5, checkpoint_every=None, seed=4,
        ps_placement=placement,
    )  # fmt: skip
    want = torch_replay(torch_make, replica_batches(2, 2, 4, 0, 5), rate)  # type: ignore[arg-type]
    assert_close(got, want, f"{kind}: cluster vs torch")


def test_a_sum_loss_steps_by_the_mean_of_the_replicas_gradients(cluster: Cluster) -> None:
    """A sync step applies the mean of its gradients (TensorFlow's SyncReplicasOptimizer averages too): for a loss
    summed over each batch, that is the gradient of the sum over both replicas' rows divided by two."""
    job = cg.train(_loss("sum"), (X, Y), cluster=cluster, optimizer=cg.optim.SGD(0.05), replicas=2, batch_size=3,
                   steps=4, checkpoint_every=None, seed=6)  # fmt: skip
    try:
        job.wait(TIMEOUT)
        assert job.status == "finished", job.events
        got = job.variables()
    finally:
        job.close()
    want = torch_replay(lambda p: torch.optim.SGD(p, lr=0.05), replica_batches(2, 3, 6, 0, 4), reduce="sum")
    assert_close(got, want, "sum loss, mean of the replicas' gradients, vs torch")


def test_the_placement_splits_w_over_both_servers(cluster: Cluster) -> None:
    """What the test above relies on: ``w``'s rows and its slots are cut across the two servers."""
    job = cg.train(_loss(), (X, Y), cluster=cluster, optimizer=cg.optim.Adam(0.1), replicas=2, batch_size=2, steps=0)
    try:
        parts = job.placement.partitions
    finally:
        job.close()
    for key in ("w", "w/m", "w/v"):
        assert [device for device, _, _ in parts[key]] == [f"/job:ps/task:{i}/device:cpu:0" for i in (0, 1)], key


def test_a_backup_worker_step_applies_one_fresh_gradient_and_drops_the_stale_one(cluster: Cluster) -> None:
    """Sync, ``replicas_to_aggregate=1`` of 2: each step applies the first gradient, computed from that step's
    values, alone (not averaged with, nor followed by, the other replica's, which is stale by then). Both replicas
    hold the same rows and take the whole block, so whichever comes first, every step is one full-batch step."""
    twice = (np.concatenate([X[:10], X[:10]]), np.concatenate([Y[:10], Y[:10]]))
    got = train(
        cluster, twice, optimizer=cg.optim.Momentum(0.1, 0.9), replicas=2, batch_size=10, steps=6,
        replicas_to_aggregate=1, checkpoint_every=None,
    )  # fmt: skip
    want = torch_replay(lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9), [[(X[:10], Y[:10])]] * 6)
    assert_close(got, want, "k=1 of 2 vs torch, one full batch per step")


def test_rows_that_do_not_divide_over_the_replicas_are_all_trained_on(cluster: Cluster) -> None:
    """11 rows over 2 replicas: blocks of 6 and 5 rows (row 10 was silently never trained on before)."""
    got = train(cluster, optimizer=cg.optim.SGD(0.5), replicas=2, batch_size=5, steps=3, checkpoint_every=None, seed=9)
    want = torch_replay(lambda p: torch.optim.SGD(p, lr=0.5), replica_batches(2, 5, 9, 0, 3))
    assert_close(got, want, "11 rows over 2 replicas vs torch")


def test_a_resumed_job_goes_on_exactly_as_one_that_never_stopped(cluster: Cluster, tmp_path: Path) -> None:
    """Adam's moments and step count and the schedule's step come back from the checkpoint, and each replica
    goes on with the batch of the restored global step (before, the data started again from the first batch)."""
    schedule = cg.optim.exponential_decay(0.1, 2, 0.5)
    options: dict[str, Any] = dict(replicas=2, batch_size=2, seed=2)
    straight = train(
        cluster, optimizer=cg.optim.Adam(schedule, epsilon=1e-16), steps=6, checkpoint_every=None, **options
    )
    job = cg.train(
        _loss(), (X, Y), cluster=cluster, optimizer=cg.optim.Adam(schedule, epsilon=1e-16), steps=3,
        checkpoint_every=3, checkpoint_dir=tmp_path, **options,  # type: ignore[arg-type]
    )  # fmt: skip
    try:
        job.wait(TIMEOUT)
        assert job.status == "finished", job.events
        assert job.checkpoints[-1] == "ckpt-0000000003"
        first = job.variables()
    finally:
        job.close()
    # The checkpoint's two halves of w, read back whole, are the values the servers held.
    saved = checkpoint_values(tmp_path)
    for name in ("w", "b"):
        np.testing.assert_array_equal(saved[name], first[name], err_msg=name)
    resumed = train(
        cluster, optimizer=cg.optim.Adam(schedule, epsilon=1e-16), steps=6, checkpoint_every=None,
        checkpoint_dir=tmp_path, resume_from="ckpt-0000000003", **options,
    )  # fmt: skip
    want = torch_replay(
        lambda p: torch.optim.Adam(p, lr=0.1, eps=1e-16), replica_batches(2, 2, 2, 0, 6), lambda s: 0.1 * 0.5 ** (s / 2)
    )
    assert_close(straight, want, "6 steps straight vs torch")
    assert_close(resumed, straight, "3 steps, resumed for 3 more, vs 6 straight")


def test_an_async_staleness_bound_over_two_servers_is_refused_by_cg_train(cluster: Cluster) -> None:
    """Each server would judge a push's staleness by its own global step and could drop half of it (see
    tests/cluster/ps/test_staleness_shards.py); ``cg.train`` refuses before anything starts."""
    with pytest.raises(TrainingError) as refused:
        cg.train(_loss(), (X, Y), cluster=cluster, batch_size=2, mode="async", max_staleness=0)
    assert str(refused.value).startswith(
        "cg.train: max_staleness=0 in async mode needs every variable on one parameter server, but the job's "
        "variables are on 2: each server judges a push's staleness by its own global step"
    )
    assert not cluster.jobs() if hasattr(cluster, "jobs") else True


def test_untrained_variables_the_step_never_assigns_are_kept_by_every_replica(cluster: Cluster) -> None:
    """A frozen layer (float, even in a ps scope) and an int mask: before, each was placed on a server that did not
    hold it, and the replica failed at its first step ("Recv ... needs a transport")."""
    scale0, mask0 = np.array([1.5, -0.5, 2.0]), np.array([1, 0, 3], np.int32)
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((None, D), "float64", name="x")
        y = cg.placeholder((None, OUT), "float64", name="y")
        w = cg.variable(W0, dtype="float64", name="w")
        b = cg.variable(B0, dtype="float64", name="b")
        with cg.device("/job:ps/task:1"):
            scale = cg.variable(scale0, dtype="float64", name="scale", trainable=False)
        mask = cg.variable(mask0, dtype="int32", name="mask", trainable=False)
        h = cg.tanh(x @ w + b) * scale * cg.cast(mask, "float64")
        loss = cg.reduce_mean(cg.square(h - y), name="loss")
    job = cg.train(loss, (X[:10], Y[:10]), cluster=cluster, optimizer=cg.optim.SGD(0.3), replicas=1, batch_size=10,
                   steps=3, checkpoint_every=None)  # fmt: skip
    try:
        job.wait(TIMEOUT)
        assert job.status == "finished", job.events
        got = job.variables()
        for name in ("scale", "mask"):
            assert job.placement.device_of[name] == "/job:worker/task:0/device:cpu:0", name
            assert job.placement.reasons[name].startswith("untrained, and the step never assigns it"), name
        # What an export reads from the job: the frozen ones are their initial values.
        exported = trained_values(job, g)
        np.testing.assert_array_equal(exported["scale"], scale0)
        np.testing.assert_array_equal(exported["mask"], mask0)
        np.testing.assert_array_equal(exported["w"], got["w"])
    finally:
        job.close()
    assert sorted(got) == ["b", "w"]
    tw, tb = (torch.tensor(v, requires_grad=True) for v in (W0, B0))
    opt = torch.optim.SGD([tw, tb], lr=0.3)
    factor = torch.tensor(scale0 * mask0)
    for _ in range(3):
        opt.zero_grad()
        ((torch.tanh(torch.tensor(X[:10]) @ tw + tb) * factor - torch.tensor(Y[:10])).square().mean()).backward()
        opt.step()
    assert_close(got, {"w": tw.detach().numpy(), "b": tb.detach().numpy()}, "frozen scale and mask vs torch")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_a_half_precision_variable_is_refused_by_cg_train_before_anything_starts(cluster: Cluster, dtype: str) -> None:
    """Before, the job started and failed at the servers' Init ("could not start")."""
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((None, D), "float32", name="x")
        w = cg.variable(np.zeros((D, 1), np.float32), dtype=dtype, name="w_half")
        loss = cg.reduce_mean(cg.square(x @ cg.cast(w, "float32")), name="loss")
    with pytest.raises(TrainingError) as refused:
        cg.train(loss, (X.astype(np.float32),), cluster=cluster, batch_size=2)
    assert str(refused.value) == (
        f"cg.train: the parameter servers keep variables in float32 or float64 only, and 'w_half' ({dtype}) would "
        "be trained or updated on them; create them in float32 (with float16 or bfloat16 compute, cast them in the "
        "forward pass)"
    )
    assert not cluster._job_closers


def test_float32_adam_on_the_servers_is_bit_for_bit_the_local_sessions(cluster: Cluster) -> None:
    """float32 variables and slots, Adam's step count in float64, integer labels fed: the servers run the local
    executor's update, rounding where it rounds. One row, so that no shuffle changes a sum's order."""
    x1, labels = X[:1].astype(np.float32), np.array([2], np.int64)

    def build() -> tuple[cg.Graph, cg.Tensor, cg.Tensor, cg.Tensor, cg.Tensor]:
        g = cg.Graph()
        with g.as_default():
            x = cg.placeholder((None, D), "float32", name="x")
            y = cg.placeholder((None,), "int64", name="y")
            w = cg.variable(W0.astype(np.float32), dtype="float32", name="w")
            target = cg.cast(cg.reshape(y, (-1, 1)), "float32")
            loss = cg.reduce_mean(cg.square(cg.tanh(x @ w) - target), name="loss")
        return g, x, y, w, loss

    g, x, y, w, loss = build()
    with g.as_default():
        step = cg.optim.Adam(0.05).minimize(loss)
    session = cg.Session(g)
    for _ in range(4):
        session.run(step, {x: x1, y: labels})
    local = session.run(w)
    *_, loss = build()
    job = cg.train(loss, (x1, labels), cluster=cluster, optimizer=cg.optim.Adam(0.05), replicas=1, batch_size=1,
                   steps=4, checkpoint_every=None)  # fmt: skip
    try:
        job.wait(TIMEOUT)
        assert job.status == "finished", job.events
        got = job.variables()["w"]
    finally:
        job.close()
    assert got.dtype == np.float32 and not np.array_equal(got, W0.astype(np.float32))
    np.testing.assert_array_equal(got, local)


def _scalar_loss(device: str | None = None) -> cg.Tensor:
    """``mean((x . v) s - y)``: linear in ``s``, so its gradient does not depend on ``s``'s value."""
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((None, D), "float64", name="x")
        y = cg.placeholder((None,), "float64", name="y")
        with cg.device(device):
            s = cg.variable(0.5, dtype="float64", name="s")
        return cg.reduce_mean((cg.reduce_sum(x, axis=1) * s - y), name="loss")


def test_a_model_that_fills_one_of_two_servers_trains_and_a_stale_async_push_is_dropped_whole(
    cluster: Cluster,
) -> None:
    """One scalar variable on a cluster of two ps tasks: the second server holds nothing. Before, it was never
    given the job and refused every replica's Register, and the job hung until its replicas gave up. Now the job's
    servers are those the placement used, so an async staleness bound applies: every push is applied or dropped
    whole, and ``s`` moved by exactly one gradient per applied push (each is the same: every replica's block is the
    same ten rows, taken whole)."""
    rows = np.concatenate([X[:10], X[:10]]), np.concatenate([Y[:10, 0], Y[:10, 0]])
    job = cg.train(_scalar_loss(), rows, cluster=cluster, optimizer=cg.optim.SGD(0.1), replicas=2, batch_size=10,
                   steps=12, mode="async", max_staleness=0, checkpoint_every=None)  # fmt: skip
    try:
        job.wait(TIMEOUT)
        assert job.status == "finished", job.events
        got = job.variables()["s"]
        stats = job.ps_stats()
    finally:
        job.close()
    assert len(stats) == 1, stats  # the server the placement left empty is not the job's
    applied = stats[0]["pushes_applied"]
    assert stats[0]["global_step"] == stats[0]["updates"] == applied >= 12
    gradient = X[:10].sum(axis=1).mean()
    np.testing.assert_allclose(got, 0.5 - 0.1 * gradient * applied, rtol=1e-12)


def test_a_placement_that_leaves_the_first_ps_task_empty_is_refused(cluster: Cluster) -> None:
    with pytest.raises(TrainingError) as refused:
        cg.train(_scalar_loss("/job:ps/task:1"), (X, Y[:, 0]), cluster=cluster, batch_size=2)
    assert str(refused.value) == (
        "cg.train: the placement puts no variable on ps task(s) 0 but some on ps task 1 (of 2): a job's parameter "
        "servers are ps tasks 0 to n-1, each holding a part of the model; pin variables to /job:ps/task:0 first"
    )
    assert not cluster._job_closers


def _bn_loss(momentum: float) -> cg.Tensor:
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((None, D), "float64", name="x")
        y = cg.placeholder((None, OUT), "float64", name="y")
        w = cg.variable(W0, dtype="float64", name="w")
        h = cg.layers.batch_norm(x, training=True, momentum=momentum, name="bn")
        return cg.reduce_mean(cg.square(cg.tanh(h @ w) - y), name="loss")


def test_moving_statistics_over_steps_and_a_resume_follow_the_replicas_batch_means(
    cluster: Cluster, tmp_path: Path
) -> None:
    """Each sync step moves the moving mean by ``(1 - momentum)`` times (the mean of the replicas' batch means
    minus it); a resumed job brings it back and goes on with the same batches, as 6 straight steps do."""
    momentum, options = 0.8, dict(optimizer=cg.optim.SGD(0.1), replicas=2, batch_size=2, seed=5)
    straight = cg.train(_bn_loss(momentum), (X, Y), cluster=cluster, steps=6, checkpoint_every=None, **options)
    first = cg.train(_bn_loss(momentum), (X, Y), cluster=cluster, steps=3, checkpoint_every=3,
                     checkpoint_dir=tmp_path, **options)  # fmt: skip
    values = {}
    for name, job in (("straight", straight), ("first", first)):
        try:
            job.wait(TIMEOUT)
            assert job.status == "finished", job.events
            values[name] = job.variables()
        finally:
            job.close()
    resumed = cg.train(_bn_loss(momentum), (X, Y), cluster=cluster, steps=6, checkpoint_every=None,
                       checkpoint_dir=tmp_path, resume_from="ckpt-0000000003", **options)  # fmt: skip
    try:
        resumed.wait(TIMEOUT)
        assert resumed.status == "finished", resumed.events
        values["resumed"] = resumed.variables()
    finally:
        resumed.close()
    mean = np.zeros(D)
    for batches in replica_batches(2, 2, 5, 0, 6):
        mean = momentum * mean + (1 - momentum) * np.mean([bx.mean(axis=0) for bx, _ in batches], axis=0)
    np.testing.assert_allclose(values["straight"]["bn/moving_mean"], mean, rtol=1e-12, atol=1e-15)
    for name in ("bn/moving_mean", "bn/moving_variance", "bn/gamma", "bn/beta", "w"):
        np.testing.assert_allclose(
            values["resumed"][name], values["straight"][name], rtol=1e-9, atol=1e-12, err_msg=name
        )
