"""The next step starts while the last one's pull is arriving: each variable is waited for at its first use
(issue 15: pulls hidden behind compute)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from cellgraph.cluster.errors import ParameterServerError
from cellgraph.cluster.ps import OptimizerConfig, ParameterClient, TrainingConfig, create_server, new_token
from cellgraph.cluster.replica import ReplicaSpec, run_replica
from cellgraph.cluster.training_graph import load, prepare
from cellgraph.examples import digits, models

from .test_replica import TIMEOUT, linear_problem, ps_job


def test_compute_waits_for_each_variable_just_before_its_first_use() -> None:
    model = models.mlp()
    loaded = load(prepare(model.loss))
    rng = np.random.default_rng(0)
    values = {name: (0.1 * rng.normal(size=t.shape)).astype(t.dtype) for name, t in zip(loaded.names, loaded.variables)}
    split = digits.load()
    batch = [split.x_train[:16], split.y_train[:16]]
    events: list[str] = []
    loss, grads = loaded.compute(
        values, batch, on_gradient=lambda name, g: events.append(f"gradient {name}"),
        wait=lambda name: events.append(f"wait {name}"),
    )  # fmt: skip
    plain_loss, plain = loaded.compute(values, batch)
    assert loss == plain_loss
    for name in plain:
        np.testing.assert_array_equal(grads[name], plain[name])
    waits = [e.removeprefix("wait ") for e in events if e.startswith("wait ")]
    # Every variable is waited for once, in the forward pass's order, and before any gradient leaves.
    assert sorted(waits) == sorted(loaded.names)
    assert waits.index("hidden/kernel") < waits.index("logits/kernel")
    first_gradient = min(i for i, e in enumerate(events) if e.startswith("gradient "))
    assert all(e.startswith("wait ") for e in events[:first_gradient]) and first_gradient == len(waits)


def test_a_variable_is_usable_as_soon_as_its_pull_has_arrived_whole() -> None:
    # Two variables of 3 chunks each: the client reports each whole only when all its chunks are in.
    token = new_token()
    server, port = create_server("127.0.0.1:0", token=token)
    initial = {"a": np.arange(300, dtype=np.float32), "b": np.arange(500, dtype=np.float32)}
    try:
        with ParameterClient([f"127.0.0.1:{port}"], token, timeout=TIMEOUT, max_chunk_bytes=512) as client:
            client.init("job", initial, OptimizerConfig("sgd", 1.0), TrainingConfig("async"))
            client.register(0)
            out = {name: np.empty_like(value) for name, value in initial.items()}
            step = client.start_step(step=0, replica_id=0, out=out)
            step.push("a", np.ones(300, np.float32))
            step.push("b", np.ones(500, np.float32))
            step.send_last()
            assert step.wait_for("b") and step.wait_for("a")
            np.testing.assert_array_equal(out["a"], initial["a"] - 1)
            np.testing.assert_array_equal(out["b"], initial["b"] - 1)
            result = step.result(next_started=step.computed)
            assert result.pulled.global_step == 1 and result.pushed.status == "applied"
            assert 0.0 <= result.overlap <= 1.0
    finally:
        server.stop(None).wait(TIMEOUT)


def test_a_failed_answer_wakes_the_wait_and_the_result_says_why() -> None:
    # Sync, 2 gradients per step: replica 0's pull waits for replica 1, which never pushes; the server stops.
    token = new_token()
    server, port = create_server("127.0.0.1:0", token=token)
    initial = {"w": np.zeros(4, np.float32)}
    try:
        with ParameterClient([f"127.0.0.1:{port}"], token, timeout=TIMEOUT) as client:
            client.init("job", initial, OptimizerConfig("sgd", 1.0), TrainingConfig("sync", replicas_to_aggregate=2))
            client.register(0)
            step = client.start_step(step=0, replica_id=0, min_step=1)
            step.push("w", np.ones(4, np.float32))
            step.send_last()
            threading.Timer(0.5, lambda: server.stop(None)).start()
            assert not step.wait_for("w")
            assert step.arrivals.failed  # woken by the failure, not by the step's deadline
            with pytest.raises(ParameterServerError, match="is stopping; this call's step will not be reached here"):
                step.result()
    finally:
        server.stop(None).wait(TIMEOUT)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_starting_the_next_step_early_changes_no_number(mode: str) -> None:
    # One replica: every step's values are exactly the last update's. Were a variable read before its pulled
    # value had arrived, the run with the overlap would end somewhere else than the baseline's.
    loss, data, _ = linear_problem()
    tg = prepare(loss)
    finals = {}
    for overlap in (True, False):
        with ps_job(tg, training=TrainingConfig(mode)) as (addrs, token, ps):
            spec = ReplicaSpec(
                "job", 0, tg, addrs, token, mode=mode, batch_size=16, steps=40, timeout_s=TIMEOUT, overlap=overlap
            )
            summary = run_replica(spec, data)
            assert summary["global_step"] == 40 and summary["steps"] == 40
            finals[overlap] = ps.pull().values
    for name in finals[False]:
        np.testing.assert_array_equal(finals[True][name], finals[False][name], err_msg=name)
