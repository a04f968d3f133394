"""Learning-rate schedules on parameter servers: the rate at the server's global step, the same
definition and the same numbers as the local executor, the protobuf and checkpoint forms, the door."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import grpc
import numpy as np
import pytest

import cellgraph as cg
from cellgraph.cluster.errors import ParameterServerError
from cellgraph.cluster.job_spec import optimizer_config
from cellgraph.cluster.ps.checkpoint import read_shard_checkpoint, write_shard_checkpoint
from cellgraph.cluster.ps.config import OptimizerConfig, TrainingConfig, VariableSpec
from cellgraph.cluster.ps.messages import optimizer_from_proto, optimizer_to_proto
from cellgraph.cluster.ps.store import ParameterStore
from cellgraph.protos import parameter_service_pb2 as pb

from .conftest import Servers
from .test_limits import init_chunk, job, refused

PEAK, WARMUP, DECAY, ALPHA = 0.4, 3, 6, 0.1
COSINE = cg.optim.cosine_decay(PEAK, DECAY, warmup_steps=WARMUP, alpha=ALPHA)
SCHEDULES = [
    COSINE,
    cg.optim.exponential_decay(0.3, 2, 0.7, staircase=True),
    cg.optim.piecewise_constant([1, 4], [0.5, 0.25, 0.125]),
]


def _cosine_numpy(step: np.ndarray) -> np.ndarray:
    t = np.clip(step - WARMUP, 0, DECAY) / DECAY
    return np.where(step < WARMUP, PEAK * step / WARMUP, PEAK * ((1 - ALPHA) * 0.5 * (1 + np.cos(np.pi * t)) + ALPHA))


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_servers_apply_the_rate_of_their_global_step(ps: Servers, mode: str) -> None:
    """Two shards (w is split), one replica: each push moves w by -lr(global step) * g, step 0 to past the end."""
    ps.start(2)
    rng = np.random.default_rng(0)
    init = {"w": rng.normal(size=(40, 30)), "b": rng.normal(size=(30,))}
    grad = {"w": np.full((40, 30), 2.0), "b": np.full(30, -1.0)}
    client = ps.client()
    client.init(f"sched-{mode}", init, OptimizerConfig("sgd", COSINE), TrainingConfig(mode), split_threshold=4_000)
    assert len({shard for pieces in client.layout.values() for shard, _ in pieces}) == 2  # type: ignore[union-attr]
    client.register(0)
    steps = WARMUP + DECAY + 3
    before = client.pull().values
    rates = []
    for step in range(steps):
        outcome = client.push(grad, step=step, replica_id=0)
        assert (outcome.status, outcome.global_step) == ("applied", step + 1)
        after = client.pull().values
        moved = {name: (before[name] - after[name]) / grad[name] for name in init}
        np.testing.assert_allclose(moved["b"], moved["b"][0], rtol=1e-12)  # one rate for every element
        np.testing.assert_allclose(moved["w"], moved["b"][0], rtol=1e-12)  # and for both shards
        rates.append(moved["b"][0])
        before = after
    np.testing.assert_allclose(rates, _cosine_numpy(np.arange(steps, dtype=np.float64)), rtol=1e-12, atol=1e-15)
    assert rates[0] == 0.0 and rates[WARMUP] == pytest.approx(PEAK) and rates[-1] == pytest.approx(ALPHA * PEAK)


def _local(optimizer: cg.optim.Optimizer, init: np.ndarray, gradients: list[np.ndarray]) -> np.ndarray:
    """The variable after a cg.Session ran ``optimizer``'s update once per gradient, global_step from 0."""
    g = cg.Graph()
    with g.as_default():
        w = cg.variable(init, dtype=init.dtype.name, name="w")
        fed = cg.placeholder(init.shape, init.dtype.name, name="grad")
        step = cg.variable(0, dtype="int64", name="global_step", trainable=False)
        train = optimizer.minimize(cg.reduce_sum(w * fed), global_step=step)  # d loss / d w = the fed gradient
    sess = cg.Session(g)
    for gradient in gradients:
        sess.run(train, {fed: gradient})
    return sess.run(w)


@pytest.mark.parametrize("schedule", SCHEDULES, ids=lambda s: s.kind)
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
def test_the_store_moves_a_variable_exactly_as_a_local_session_does(schedule: object, dtype: type) -> None:
    rng = np.random.default_rng(4)
    init = rng.normal(size=(3, 4)).astype(dtype)
    gradients = [rng.normal(size=(3, 4)).astype(dtype) for _ in range(8)]
    local = cg.optim.Momentum(schedule, momentum=0.5)  # type: ignore[arg-type]
    opt = optimizer_config(local)  # what cg.train sends the servers
    assert opt == OptimizerConfig("momentum", schedule, momentum=0.5, nesterov=False)  # type: ignore[arg-type]
    store = ParameterStore("j", [VariableSpec("w", np.dtype(dtype), (3, 4))], {"w": init}, opt, TrainingConfig())
    store.register(0)
    for step, gradient in enumerate(gradients):
        store.push(0, step, {"w": gradient})
    np.testing.assert_array_equal(store.state().tensors["w"], _local(local, init, gradients))


@pytest.mark.parametrize("schedule", SCHEDULES, ids=lambda s: s.kind)
def test_a_schedule_goes_through_the_protobuf_and_the_checkpoint_manifest_unchanged(schedule: object) -> None:
    config = OptimizerConfig("adam", schedule, beta1=0.8)  # type: ignore[arg-type]
    assert optimizer_from_proto(optimizer_to_proto(config)) == config
    assert OptimizerConfig.from_fields(dataclasses.asdict(config)) == config
    # A manifest is JSON: tuples come back as lists.
    assert OptimizerConfig.from_fields(json.loads(json.dumps(dataclasses.asdict(config)))) == config
    assert optimizer_from_proto(optimizer_to_proto(OptimizerConfig("sgd", 0.5))).learning_rate == 0.5


BAD = [
    ("zero decay steps", pb.LearningRateScheduleProto(kind="cosine_decay", initial_learning_rate=0.1),
     "sgd optimizer: cosine_decay: decay_steps must be an int, 1 or more, got 0"),
    ("negative rate", pb.LearningRateScheduleProto(kind="exponential_decay", initial_learning_rate=-1, decay_steps=5,
                                                   decay_rate=0.5),
     "sgd optimizer: exponential_decay: initial_learning_rate must be 0 or more, got -1.0"),
    ("NaN value", pb.LearningRateScheduleProto(kind="piecewise_constant", boundaries=[3], values=[0.1, float("nan")]),
     "sgd optimizer: piecewise_constant: values[1] must be a finite number, got nan"),
    ("unknown kind", pb.LearningRateScheduleProto(kind="linear"),
     "sgd optimizer: learning-rate schedule 'linear' is not one of piecewise_constant, exponential_decay, cosine_decay"),
]  # fmt: skip


@pytest.mark.parametrize(("what", "schedule", "words"), BAD, ids=[b[0] for b in BAD])
def test_a_bad_schedule_is_refused_at_the_servers_door(
    ps: Servers, what: str, schedule: pb.LearningRateScheduleProto, words: str
) -> None:
    ps.start(1)
    proto = pb.OptimizerConfigProto(kind="sgd", learning_rate_schedule=schedule)
    with pytest.raises(ParameterServerError) as caught:
        optimizer_from_proto(proto)
    assert str(caught.value).startswith(words), caught.value
    err = refused(ps, [job(optimizer=proto), init_chunk()])  # and the server stays empty
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err.details()
    assert words in (err.details() or "")


def test_a_damaged_schedule_in_a_manifest_is_named() -> None:
    fields = dataclasses.asdict(OptimizerConfig("sgd", COSINE))
    fields["learning_rate"]["alpha"] = 3.0
    with pytest.raises(
        ParameterServerError, match=r"^sgd optimizer: cosine_decay: alpha must be in \[0, 1\], got 3.0$"
    ):
        OptimizerConfig.from_fields(fields)


@pytest.mark.slow
def test_cg_train_with_a_schedule_matches_the_local_session_step_by_step() -> None:
    """cg.train sends the schedule with the optimizer; one replica on all rows gives the local run's
    gradients, so the servers' variables after each step equal the session's at the same global step."""
    from cellgraph.cluster.cluster import Cluster

    rng = np.random.default_rng(7)
    x_data, w0 = rng.normal(size=(8, 5)), rng.normal(size=(5, 3)) * 0.5
    steps = 7
    schedule = cg.optim.cosine_decay(0.2, decay_steps=4, warmup_steps=2, alpha=0.25)

    def build() -> tuple[cg.Graph, cg.Tensor, cg.Tensor, cg.Tensor]:
        g = cg.Graph()
        with g.as_default():
            x = cg.placeholder((None, 5), "float64", name="x")
            w = cg.variable(w0, dtype="float64", name="w")
            loss = cg.reduce_sum(cg.square(cg.tanh(x @ w)), name="loss")
        return g, x, w, loss

    g, x, w, loss = build()
    with g.as_default():
        step = cg.variable(0, dtype="int64", name="global_step", trainable=False)
        train = cg.optim.Momentum(schedule, momentum=0.5).minimize(loss, global_step=step)
    sess = cg.Session(g)
    for _ in range(steps):
        sess.run(train, {x: x_data})
    local = sess.run(w)

    _, _, _, loss = build()
    with Cluster.local(workers=1, ps=2) as cluster:
        job_ = cg.train(
            loss, (x_data,), cluster=cluster, optimizer=cg.optim.Momentum(schedule, momentum=0.5), replicas=1,
            batch_size=len(x_data), steps=steps, checkpoint_every=None,
        )  # fmt: skip
        try:
            job_.wait(120.0)
            assert job_.status == "finished", job_.events
            got = job_.variables()
        finally:
            job_.close()
    np.testing.assert_allclose(got["w"], local, rtol=1e-9, atol=1e-12)
    constant = cg.optim.Momentum(0.2, momentum=0.5)  # the schedule changed the result: it was applied
    g2, x2, w2, loss2 = build()
    with g2.as_default():
        train2 = constant.minimize(loss2)
    sess2 = cg.Session(g2)
    for _ in range(steps):
        sess2.run(train2, {x2: x_data})
    assert not np.allclose(sess2.run(w2), local, rtol=1e-3)


def test_a_checkpoint_keeps_the_schedule(tmp_path: Path) -> None:
    w = np.full(4, 2.0, np.float32)
    config = OptimizerConfig("momentum", SCHEDULES[2], momentum=0.5)
    info = write_shard_checkpoint(
        tmp_path, tensors={"w": w, "w/momentum": np.zeros_like(w)}, versions={"w": 3},
        specs=[VariableSpec("w", w.dtype, w.shape)], global_step=3, shard=0, num_shards=1, job_id="sched",
        optimizer=config, training=TrainingConfig(),
    )  # fmt: skip
    assert read_shard_checkpoint(tmp_path, info.name, 0, 1).optimizer == config
