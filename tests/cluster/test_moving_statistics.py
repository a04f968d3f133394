"""Batch norm on a cluster: the moving statistics live on the parameter servers, moved by the replicas' changes.

In sync mode a step's moving mean is ``momentum * m + (1 - momentum) * (mean
of the replicas' batch means)``: each replica pushes its batch's mean, and the
server moves the variable towards their mean. In async mode it moves towards
each batch mean as it arrives, always from its current value: an earlier
version pushed each replica's change from the value it had pulled, which a
stale replica then added to a newer value (TensorFlow's ``assign_sub`` on a
parameter server does that), and at momentum 0.5 with a staleness of 3 updates
the moving mean diverged. Before that, each replica kept its own moving
statistics and the job evaluated with the initial ones, without a word.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

import cellgraph as cg
from cellgraph.cluster.cluster import Cluster
from cellgraph.cluster.errors import ParameterServerError
from cellgraph.cluster.placed_training import place_training
from cellgraph.cluster.ps import OptimizerConfig, TrainingConfig
from cellgraph.cluster.ps.config import VariableSpec
from cellgraph.cluster.ps.messages import spec_from_proto, spec_to_proto
from cellgraph.cluster.ps.store import ParameterStore
from cellgraph.cluster.training_graph import TrainingError, load, prepare

TIMEOUT = 120.0
F32 = np.float32
MOMENTUM = 0.9


def bn_model(momentum: float = MOMENTUM) -> tuple[cg.Tensor, cg.Tensor, cg.Tensor, cg.Tensor]:
    """Batch norm right on the input (so a batch's mean is the data's), then a trained scale; and its switch."""
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((None, 2), "float32", name="x")
        training = cg.layers.training_switch()
        normalized = cg.layers.batch_norm(x, training=training, momentum=momentum, name="bn")
        w = cg.variable(np.ones(2, F32), name="w")
        loss = cg.reduce_mean((normalized * w - 1.0) ** 2.0, name="loss")
    return loss, normalized, x, training


def test_prepare_finds_the_moving_statistics_and_the_batch_statistics_they_move_towards() -> None:
    loss, *_ = bn_model()
    tg = prepare(loss)
    assert tg.variables == ["bn/gamma", "bn/beta", "w"]
    assert tg.states == ["bn/moving_mean", "bn/moving_variance"] and tg.state_momenta == [MOMENTUM, MOMENTUM]
    assert tg.held == [*tg.variables, *tg.states] and set(tg.initial) == set(tg.held)
    placed = place_training(tg, OptimizerConfig("sgd", 0.1), ps_tasks=1)
    # The assignment and the average it assigns stay with the variable on the ps task; the worker sends the batch's
    # statistic there, and pulls no moving statistic (training normalizes with the batch's own).
    ps = "/job:ps/task:0/device:cpu:0"
    update = placed.graph.node("bn/output_update_mean")
    average = update.inputs[1].node
    assert placed.placement.device_of[update.name] == ps and average.op == "Add"
    assert all(placed.placement.device_of[t.node.name] == ps for t in average.inputs)
    assert "moves the variable from its current value" in placed.placement.reasons[average.name]
    assert set(placed.pushes) == set(tg.held)
    assert placed.worker.unread == tg.states and placed.worker.pulled == tg.variables
    batch = [np.array([[1.0, 2.0], [3.0, 6.0]], F32)]
    _, pushed = load(placed.worker).compute({name: tg.initial[name] for name in tg.variables}, batch)
    np.testing.assert_allclose(pushed["bn/moving_mean"], [2.0, 4.0], rtol=1e-6)  # the batch's mean
    np.testing.assert_allclose(pushed["bn/moving_variance"], [1.0, 4.0], rtol=1e-6)  # and its variance


def test_another_in_place_update_of_an_untrained_variable_is_refused() -> None:
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((None,), "float32", name="x")
        count = cg.variable(0.0, name="count", trainable=False)
        w = cg.variable(1.0, name="w")
        bump = cg.assign_add(count, 1.0, name="bump")
        with g.control_dependencies([bump]):
            loss = cg.reduce_mean(x * w, name="loss")
    with pytest.raises(TrainingError, match=r"AssignAdd 'bump' \(test_moving_statistics.py:\d+\) updates the "
                       r"untrained variable 'count' in place on the way to the loss; a cluster job can carry "
                       r"assigned values \(batch norm's moving statistics\) to the parameter servers, not other "
                       r"in-place updates: compute it outside the loss"):  # fmt: skip
        prepare(loss)


def test_the_store_moves_a_moving_statistic_towards_the_mean_pushed_value_and_keeps_no_slots() -> None:
    specs = [VariableSpec("w", np.dtype(F32), (2,)), VariableSpec("m", np.dtype(F32), (2,), moving=True, momentum=0.75)]
    initial = {"w": np.ones(2, F32), "m": np.full(2, 10.0, F32)}
    store = ParameterStore("j", specs, initial, OptimizerConfig("adam", 0.1), TrainingConfig("sync", 2))
    store.register(0)
    store.register(1)
    store.push(0, 0, {"w": np.ones(2, F32), "m": np.array([2.0, 4.0], F32)})
    store.push(1, 0, {"w": np.ones(2, F32), "m": np.array([6.0, 12.0], F32)})
    _, values = store.read(["m"])
    np.testing.assert_array_equal(values["m"][1], [8.5, 9.5])  # 0.75 * 10 + 0.25 * the mean value, no optimizer
    assert set(store.state().tensors) == {"w", "w/m", "w/v", "w/t", "m"}
    assert store.slot_nbytes("m") == 0 and store.slot_nbytes("w") == 2 * 8 + 8


def test_an_async_store_moves_a_moving_statistic_from_its_current_value_whatever_the_pusher_pulled() -> None:
    # Replica 1 pulled m = 0, then replica 0's push moved it; replica 1's push still moves it from where it is now.
    spec = VariableSpec("m", np.dtype(F32), (1,), moving=True, momentum=0.5)
    store = ParameterStore("j", [spec], {"m": np.zeros(1, F32)}, OptimizerConfig("sgd", 0.1), TrainingConfig("async"))
    store.register(0)
    store.register(1)
    store.push(0, 0, {"m": np.array([4.0], F32)})
    store.push(1, 0, {"m": np.array([4.0], F32)})  # computed at step 0, applied at step 1
    _, values = store.read(["m"])
    # 0 -> 2 -> 3: an average of what came, never past it (pushing changes from the pulled 0 gave 2 + 2 = 4).
    np.testing.assert_array_equal(values["m"][1], [3.0])


def test_a_plain_assignment_of_an_untrained_variable_takes_the_pushed_value() -> None:
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((None,), "float32", name="x")
        last = cg.variable(0.0, name="last", trainable=False)
        w = cg.variable(1.0, name="w")
        keep = cg.assign(last, cg.reduce_mean(x), name="keep")
        with g.control_dependencies([keep]):
            loss = cg.reduce_mean(x * w, name="loss")
    tg = prepare(loss)
    assert tg.states == ["last"] and tg.state_momenta == [0.0]
    _, pushed = load(tg).compute(tg.initial, [np.array([1.0, 5.0], F32)])
    assert float(pushed["last"]) == 3.0  # the value itself: the server sets the variable to it (momentum 0)


def test_a_moving_momentum_out_of_range_is_refused_with_the_variable_named() -> None:
    proto = spec_to_proto(VariableSpec("bn/m", np.dtype(F32), (2,), moving=True, momentum=0.5))
    proto.moving_momentum = float("nan")
    with pytest.raises(ParameterServerError, match=r"variable 'bn/m': moving_momentum must be in \[0, 1\], got nan"):
        spec_from_proto(proto)
    proto.moving, proto.moving_momentum = False, 0.5
    with pytest.raises(ParameterServerError, match=r"variable 'bn/m': moving_momentum 0.5 is given for a variable "
                       "that is not a moving statistic"):  # fmt: skip
        spec_from_proto(proto)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with Cluster.local(workers=2, ps=1) as local:
        yield local


@pytest.mark.slow
def test_a_sync_step_moves_the_moving_mean_by_the_mean_of_the_replicas_batch_means(cluster: Cluster) -> None:
    # Replica 0 gets the first half of the rows, replica 1 the second: every batch of each has one mean.
    rows = 64
    x = np.concatenate([np.tile([[1.0, 2.0]], (rows, 1)), np.tile([[3.0, 10.0]], (rows, 1))]).astype(F32)
    loss, *_ = bn_model()
    job = cg.train(
        loss, (x,), cluster=cluster, optimizer=cg.optim.SGD(0.01), replicas=2, batch_size=rows, steps=1,
        checkpoint_every=None,
    )  # fmt: skip
    try:
        job.wait(TIMEOUT)
        values = job.variables()
        means = [x[:rows].mean(axis=0), x[rows:].mean(axis=0)]
        expected = (1 - MOMENTUM) * (means[0] + means[1]) / 2
        np.testing.assert_allclose(values["bn/moving_mean"], expected, rtol=1e-5)
        [shard] = job.ps_stats()
        assert shard["held_bytes"] == sum(job.placement.ps_load_bytes().values())
    finally:
        job.close()


@pytest.mark.slow
def test_a_trained_batch_norm_model_evaluates_with_the_servers_moving_statistics(cluster: Cluster) -> None:
    rng = np.random.default_rng(1)
    x = (rng.normal(5.0, 1.0, (512, 2))).astype(F32)
    # The moving mean's spread around the data's mean: with momentum 0.8 and a batch mean's spread of 0.12, about
    # 0.04, 7 of them inside the tolerance below. (With momentum 0.5 and data of spread 2 it was 0.14 with the
    # average made on the server, and 0.18 to 0.3 when stale replicas pushed changes from the values they had
    # pulled: that failed about one run in ten.)
    loss, normalized, x_in, training = bn_model(momentum=0.8)
    for mode in ("sync", "async"):
        job = cg.train(
            loss, (x,), cluster=cluster, optimizer=cg.optim.SGD(0.05), replicas=2, batch_size=64, steps=40,
            mode=mode, checkpoint_every=None,
        )  # fmt: skip
        try:
            job.wait(TIMEOUT)
            values = job.variables()
            # Forty steps of momentum 0.8 bring the moving statistics to the data's own (0.8 ** 40 < 1e-3).
            np.testing.assert_allclose(values["bn/moving_mean"], x.mean(axis=0), atol=0.3, err_msg=mode)
            np.testing.assert_allclose(values["bn/moving_variance"], x.var(axis=0), rtol=0.3, err_msg=mode)
            # Evaluated as inference, the output is normalized by the servers' statistics, not the initial 0 and 1.
            out = job.evaluate(normalized, {x_in: x[:5], training: False})
            scale = values["bn/gamma"] / np.sqrt(values["bn/moving_variance"] + 1e-3)
            expected = (x[:5] - values["bn/moving_mean"]) * scale + values["bn/beta"]
            np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-5, err_msg=mode)
        finally:
            job.close()


def test_a_batch_norm_whose_training_switch_is_fed_with_data_is_refused_with_words() -> None:
    # Fed, the switch is not folded: the assigned value is a `where`, and no batch statistic can be pushed alone.
    loss, _, x, training = bn_model()
    with pytest.raises(TrainingError, match=r"Assign 'bn/output_update_mean' \(test_moving_statistics.py:\d+\) is "
                       r"marked as a moving average of variable 'bn/moving_mean', but its value comes from \w+ "
                       r"'[^']+', not from `var \* momentum \+ stat \* \(1 - momentum\)`; a batch norm whose training "
                       r"switch is fed with data cannot train on a cluster: leave the switch unfed"):  # fmt: skip
        prepare(loss, data_feeds=[x, training])
