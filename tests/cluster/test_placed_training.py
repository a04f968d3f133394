"""One model of distribution: cg.train places and partitions the step, and runs what the placement says.

The step graph (loss, gradients, update ops) is placed with ``cg.placement``;
a replica runs its worker partition (variables fed at their Recv, gradients
pushed from their Send), the parameter servers hold what the placement put on
their ``ps`` task, and ``job.placement`` is that placement.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

import cellgraph as cg
from cellgraph.cluster.cluster import Cluster
from cellgraph.cluster.placed_training import place_training
from cellgraph.cluster.ps import OptimizerConfig
from cellgraph.cluster.training_graph import WORKER_CPU, TrainingError, load, prepare
from cellgraph.dataflow.errors import PlacementError
from cellgraph.dataflow.graphdef import from_graphdef
from cellgraph.examples import digits, models
from cellgraph.protos import graph_pb2

TIMEOUT = 120.0
PS0, PS1 = "/job:ps/task:0/device:cpu:0", "/job:ps/task:1/device:cpu:0"


def pinned_model() -> tuple[cg.Tensor, cg.Tensor, cg.Tensor]:
    """A two-layer classifier of the digits whose first kernel a device scope pins to ps task 1."""
    rng = np.random.default_rng(0)
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((None, 64), "float32", name="x")
        y = cg.placeholder((None,), "int32", name="y")
        with cg.device("/job:ps/task:1"):
            w1 = cg.variable(rng.normal(0, 0.1, (64, 32)).astype(np.float32), name="w1")
        b1 = cg.variable(np.zeros(32, np.float32), name="b1")
        w2 = cg.variable(rng.normal(0, 0.1, (32, 10)).astype(np.float32), name="w2")
        b2 = cg.variable(np.zeros(10, np.float32), name="b2")
        h = cg.relu(cg.matmul(x, w1) + b1)
        logits = cg.matmul(h, w2) + b2
        loss = cg.losses.sparse_softmax_cross_entropy(logits, y)
    return loss, logits, x


def test_the_step_is_placed_with_its_updates_and_the_users_scope() -> None:
    loss, _, _ = pinned_model()
    placed = place_training(prepare(loss), OptimizerConfig("momentum", 0.1), ps_tasks=2)
    where = placed.placement.device_of
    assert where["w1"] == PS1 and "explicit device scope" in placed.placement.reasons["w1"]
    # Slots and update ops live with their variable; compute on the worker every replica runs.
    for name in ("w1", "b1", "w2", "b2"):
        assert where[f"{name}/momentum"] == where[name] == where[f"update/{name}/apply"], name
        assert where[f"update/{name}/learning_rate"] == where[name]
    assert {where[n] for n in ("w2", "b1", "b2")} <= {PS0, PS1}
    assert where["loss"] == WORKER_CPU
    # The placement's load is exactly the variables and their momentum slots.
    held = {name: 2 * value.nbytes for name, value in prepare(loss).initial.items()}
    load = placed.placement.ps_load_bytes()
    assert sum(load.values()) == sum(held.values()) and load[PS1] >= held["w1"]
    # The worker partition receives every variable and sends every gradient.
    assert sorted(placed.pulls) == sorted(placed.pushes) == ["b1", "b2", "w1", "w2"]
    worker = placed.worker.graphdef
    ops = {node.op for node in from_graphdef(graph_pb2.GraphDef.FromString(worker)).nodes}
    assert {"Recv", "Send"} <= ops and "Variable" not in ops and "ApplyMomentum" not in ops


def test_the_worker_partition_computes_what_the_whole_graph_does() -> None:
    loss, _, _ = pinned_model()
    tg = prepare(loss)
    placed = place_training(tg, OptimizerConfig("sgd", 0.1), ps_tasks=2)
    data = digits.load()
    batch = [data.x_train[:32], data.y_train[:32].astype(np.int32)]
    whole_loss, whole = load(tg).compute(tg.initial, batch)
    part_loss, part = load(placed.worker).compute(tg.initial, batch)
    assert part_loss == pytest.approx(whole_loss, rel=1e-6)
    assert sorted(part) == sorted(whole)
    for name in whole:
        np.testing.assert_allclose(part[name], whole[name], rtol=1e-5, atol=1e-7)


def test_compute_in_a_ps_scope_runs_on_the_worker_and_says_why() -> None:
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((None, 2), "float32", name="x")
        with cg.device("/job:ps/task:0"):
            w = cg.variable([[1.0], [2.0]], name="w")
            y = cg.matmul(x, w, name="scores")
        loss = cg.reduce_mean(y, name="loss")
    placed = place_training(prepare(loss), OptimizerConfig("sgd", 0.1), ps_tasks=1)
    assert placed.placement.device_of["w"] == PS0
    assert placed.placement.device_of["scores"] == WORKER_CPU
    assert placed.placement.reasons["scores"] == (
        "explicit device scope '/job:ps/task:0' (completed from the devices); on the replica's worker instead: parameter servers hold variables "
        "and apply their updates, compute runs where the replicas are"
    )
    # Its gradient ops (colocated with it) moved too: the only thing the worker receives is the variable.
    assert list(placed.pulls) == ["w"] and list(placed.pushes) == ["w"]


def test_a_scope_naming_a_ps_task_the_cluster_lacks_is_refused() -> None:
    loss, _, _ = pinned_model()
    with pytest.raises(PlacementError, match=r"Variable 'w1' \(test_placed_training.py:\d+\) asks for device "
                       r"'/job:ps/task:1', which matches none of the devices: /job:ps/task:0/device:cpu:0, "
                       r"/job:worker/task:0/device:cpu:0"):  # fmt: skip
        place_training(prepare(loss), OptimizerConfig("sgd", 0.1), ps_tasks=1)


def test_a_cluster_job_needs_a_parameter_server() -> None:
    loss, _, _ = pinned_model()
    with pytest.raises(TrainingError, match="a cluster job needs at least one parameter server, got ps_tasks=0"):
        place_training(prepare(loss), OptimizerConfig("sgd", 0.1), ps_tasks=0)


@pytest.fixture(scope="module")
def two_ps() -> Iterator[Cluster]:
    with Cluster.local(workers=2, ps=2) as local:
        yield local


@pytest.mark.slow
def test_a_cluster_job_runs_its_placement(two_ps: Cluster) -> None:
    data = digits.load()
    loss, logits, x = pinned_model()
    job = cg.train(
        loss, (data.x_train, data.y_train.astype(np.int32)), cluster=two_ps, optimizer=cg.optim.Momentum(0.1, 0.9),
        replicas=2, batch_size=64, steps=200, checkpoint_every=None,
    )  # fmt: skip
    try:
        job.wait(TIMEOUT)
        assert job.status == "finished", job.events
        placement = job.placement
        assert placement.device_of["w1"] == PS1
        # What each shard holds (variables and slots) is what the placement put on its ps task.
        load = placement.ps_load_bytes()
        assert [s["held_bytes"] for s in job.ps_stats()] == [load[PS0], load[PS1]]
        # The variable pinned to task 1 is on shard 1.
        assert "w1" in {v.name for v in job._state.ps.stats()[1].variables}
        # The job's step graph is what the placement places, and it trains.
        assert set(placement.device_of) == {node.name for node in job.step_graph.nodes}
        predictions = job.evaluate(logits, {x: data.x_test}).argmax(axis=1)
        assert float((predictions == data.y_test).mean()) >= 0.9
    finally:
        job.close()


@pytest.mark.slow
def test_mini_inception_trains_on_its_placement(two_ps: Cluster) -> None:
    data = digits.load()
    model = models.mini_inception()
    job = cg.train(
        model.loss, (data.images(data.x_train), data.y_train), cluster=two_ps, optimizer=cg.optim.Adam(3e-3),
        replicas=2, batch_size=64, steps=150, checkpoint_every=None,
    )  # fmt: skip
    try:
        job.wait(TIMEOUT * 2)
        assert job.status == "finished", job.events
        shards = job.ps_stats()
        assert all(s["held_bytes"] > 0 for s in shards), shards  # both shards hold part of the model
        logits = job.evaluate(model.logits, {model.x: data.images(data.x_test)})
        assert float((logits.argmax(axis=1) == data.y_test).mean()) >= 0.9
    finally:
        job.close()


def test_overlap_must_be_a_bool() -> None:
    loss, _, _ = pinned_model()
    with pytest.raises(TrainingError, match="cg.train: overlap must be True or False, got 'no'"):
        cg.train(loss, [], cluster=None, overlap="no")  # type: ignore[arg-type]


@pytest.mark.slow
def test_without_overlap_every_gradient_leaves_after_the_backward_pass(two_ps: Cluster) -> None:
    data = digits.load()
    loss, _, _ = pinned_model()
    job = cg.train(
        loss, (data.x_train, data.y_train.astype(np.int32)), cluster=two_ps, replicas=2, batch_size=64, steps=60,
        checkpoint_every=None, metrics_interval_s=0.1, overlap=False,
    )  # fmt: skip
    try:
        job.wait(TIMEOUT)
        assert job.status == "finished" and job.global_step() == 60
        # Nothing was sent while the step computed: no communication overlapped it.
        assert job.metrics and all(m["overlap_fraction"] == 0.0 for m in job.metrics)
    finally:
        job.close()
