"""Streamed steps: gradients leave as backprop produces them (issue 15, overlap), and the result is the
same as one push_pull's."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from cellgraph.cluster.errors import ParameterServerError
from cellgraph.cluster.ps import OptimizerConfig, TrainingConfig
from cellgraph.cluster.ps.streaming import FLUSH_BYTES

from .conftest import Servers
from .test_waits import eventually

F32 = np.dtype(np.float32)
VALUES = {
    "w": np.arange(24, dtype=F32).reshape(6, 4),
    "b": np.ones(3, F32),
    "big": np.zeros(FLUSH_BYTES // 4 + 10, F32),
}


def grads(scale: float) -> dict[str, np.ndarray]:
    return {name: np.full_like(value, scale) for name, value in VALUES.items()}


def test_a_streamed_sync_step_gives_what_push_pull_gives(ps: Servers) -> None:
    ps.start(2)
    streamed, fused = ps.client(), ps.client()
    sync = TrainingConfig("sync", replicas_to_aggregate=2)
    streamed.init("streamed", VALUES, OptimizerConfig("momentum", 0.1, momentum=0.9), sync, split_threshold=64)
    assert len(streamed.layout["w"]) == 2  # type: ignore[index]  # w is split over both shards
    fused.register(1)
    streamed.register(0)
    for step in range(3):
        other: list[object] = []
        thread = threading.Thread(
            target=lambda s=step, other=other: other.append(
                fused.push_pull(grads(2.0), step=s, replica_id=1, min_step=s + 1)
            )
        )
        thread.start()
        streaming = streamed.start_step(step=step, replica_id=0, min_step=step + 1)
        for name in ("big", "b", "w"):  # backprop order: last layer first
            streaming.push(name, grads(1.0)[name])
        result = streaming.finish()
        thread.join(30)
        assert result.pushed.by_shard in (
            ("applied", "aggregated"),
            ("aggregated", "applied"),
            ("applied", "applied"),
            ("aggregated", "aggregated"),
        )
        assert result.pulled.global_step == step + 1
        assert 0.0 <= result.overlap <= 1.0 and result.communication_s > 0
        _, theirs = other[0]  # type: ignore[misc]
        for name in VALUES:
            np.testing.assert_array_equal(result.pulled.values[name], theirs.values[name], err_msg=name)
    # momentum 0.9, lr 0.1, mean gradient 1.5: v = 1.5, 2.85, 4.065; w moves by -0.1 * (1.5 + 2.85 + 4.065)
    np.testing.assert_allclose(streamed.pull().values["w"], VALUES["w"] - 0.8415, rtol=1e-5)


def test_a_gradient_leaves_before_the_step_finishes(ps: Servers) -> None:
    ps.start(1)
    client = ps.client()
    client.init("early", VALUES, OptimizerConfig("sgd", 1.0), TrainingConfig("async"))
    client.register(0)
    before = ps.servicer().counters.bytes_in
    step = client.start_step(step=0, replica_id=0)
    step.push("big", grads(1.0)["big"])  # more than FLUSH_BYTES: sent now, while the replica would compute on
    eventually(lambda: ps.servicer().counters.bytes_in >= before + VALUES["big"].nbytes, "the big gradient arrived")
    assert client.pull().global_step == 0  # ... but nothing is applied until the push is whole
    step.push("w", grads(1.0)["w"])
    step.push("b", grads(1.0)["b"])
    result = step.finish()
    assert result.pushed.status == "applied" and result.pulled.global_step == 1
    assert result.overlap > 0.0  # bytes were on their way before finish()
    np.testing.assert_array_equal(result.pulled.values["w"], VALUES["w"] - 1)


def test_a_streamed_step_refuses_what_push_refuses_and_the_next_step_works(ps: Servers) -> None:
    ps.start(1)
    client = ps.client()
    client.init("refused", VALUES, OptimizerConfig("sgd", 1.0), TrainingConfig("async"))
    client.register(0)
    step = client.start_step(step=0, replica_id=0)
    with pytest.raises(ParameterServerError, match="gradient for unknown variable\\(s\\) 'nope'") as err:
        step.push("nope", np.ones(2, F32))
    assert err.value.code == "NOT_FOUND"
    step.push("w", grads(1.0)["w"])
    with pytest.raises(ParameterServerError, match="no gradient was pushed for 'b', 'big'") as err:
        step.finish()
    assert err.value.code == "INVALID_ARGUMENT"
    bad = client.start_step(step=0, replica_id=0)
    for name, value in grads(1.0).items():
        bad.push(name, value if name != "b" else np.array([np.nan, 0, 0], F32))
    with pytest.raises(ParameterServerError, match="gradient for 'b' at step 0 holds 1 NaN") as err:
        bad.finish()
    assert err.value.code == "INVALID_ARGUMENT"
    good = client.start_step(step=0, replica_id=0)
    for name, value in grads(1.0).items():
        good.push(name, value)
    assert good.finish().pushed.status == "applied"
    assert client.pull().global_step == 1


def test_a_gradient_bigger_than_one_message_goes_in_several(ps: Servers) -> None:
    # 5 MiB of gradient for one variable: more than gRPC takes in one message (4 MiB). Before the fix, a
    # streamed step put all of its chunks in one message and the server's gRPC refused it ("Internal error").
    ps.start(1)
    client = ps.client()
    big = np.arange(5 * 1024 * 1024 // 4, dtype=F32)
    client.init("big", {"big": big, "b": np.zeros(3, F32)}, OptimizerConfig("sgd", 1.0), TrainingConfig("async"))
    client.register(0)
    step = client.start_step(step=0, replica_id=0)
    step.push("big", np.ones_like(big))
    step.push("b", np.ones(3, F32))
    result = step.finish()
    assert result.pushed.status == "applied"
    np.testing.assert_array_equal(result.pulled.values["big"], big - 1)
    np.testing.assert_array_equal(result.pulled.values["b"], np.full(3, -1, F32))
