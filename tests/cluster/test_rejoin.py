"""A replica rejoins at the servers' current step after the statuses a restore, restart or stop can cause."""

from __future__ import annotations

import re
import threading
from typing import Any

import pytest

from cellgraph.cluster import replica as replica_module
from cellgraph.cluster.errors import ParameterServerError
from cellgraph.cluster.ps import TrainingConfig
from cellgraph.cluster.ps.streaming import StreamedStep
from cellgraph.cluster.replica import ReplicaSpec, run_replica
from cellgraph.cluster.training_graph import prepare

from .test_replica import TIMEOUT, linear_problem, ps_job


def test_a_sync_replica_that_waited_past_its_deadline_rejoins(monkeypatch: pytest.MonkeyPatch) -> None:
    loss, data, _ = linear_problem()
    tg = prepare(loss)
    codes: list[str] = []
    waited = threading.Event()
    rejoin = replica_module._Link.rejoin

    def recording(self: Any, err: ParameterServerError, step: int, stop: Any) -> Any:
        codes.append(err.code)
        waited.set()
        return rejoin(self, err, step, stop)

    monkeypatch.setattr(replica_module._Link, "rejoin", recording)
    with ps_job(tg, training=TrainingConfig("sync", replicas_to_aggregate=2)) as (addrs, token, _):
        specs = [
            ReplicaSpec(
                "job", i, tg, addrs, token, mode="sync", batch_size=16, steps=20, timeout_s=0.5 if i == 0 else TIMEOUT
            )
            for i in range(2)
        ]
        summaries: dict[int, Any] = {}
        errors: list[BaseException] = []

        def replica(i: int) -> None:
            try:
                summaries[i] = run_replica(specs[i], [d[i::2] for d in data])
            except BaseException as err:  # re-raised below
                errors.append(err)

        first = threading.Thread(target=replica, args=(0,))
        first.start()
        # Replica 0 waits alone for a step that needs two gradients, past its deadline; then replica 1 comes.
        assert waited.wait(TIMEOUT)
        second = threading.Thread(target=replica, args=(1,))
        second.start()
        for thread in (first, second):
            thread.join(TIMEOUT * 2)
        assert not errors, errors[0]
        assert codes[0] == "DEADLINE_EXCEEDED"
        assert summaries[0]["rejoins"] >= 1
        assert summaries[0]["global_step"] == summaries[1]["global_step"] == 20


# ABORTED is what a restore wakes waiting calls with; the others, what a lost or slow server gives.
@pytest.mark.parametrize("code", ["ABORTED", "DEADLINE_EXCEEDED", "UNAVAILABLE", "FAILED_PRECONDITION"])
def test_a_restore_status_makes_the_replica_rejoin_at_the_servers_step(
    monkeypatch: pytest.MonkeyPatch, code: str
) -> None:
    loss, data, _ = linear_problem()
    tg = prepare(loss)
    result = StreamedStep.result
    failed: list[int] = []

    def restored_once(self: StreamedStep, next_started: float | None = None) -> Any:
        if self.step == 5 and not failed:
            failed.append(self.step)
            self.abort()
            address = self.client.addresses[0]
            raise ParameterServerError(f"parameter server {address} (shard 0): restored to step 0", code)
        return result(self, next_started)

    monkeypatch.setattr(StreamedStep, "result", restored_once)
    with ps_job(tg, training=TrainingConfig("async")) as (addrs, token, _):
        spec = ReplicaSpec("job", 0, tg, addrs, token, mode="async", batch_size=16, steps=20, timeout_s=TIMEOUT)
        summary = run_replica(spec, data, locate=lambda: (0, addrs))
    assert failed == [5]
    assert summary["rejoins"] == 1 and summary["global_step"] == 20


def test_a_replica_gives_up_after_rejoining_again_and_again_naming_the_shard(monkeypatch: pytest.MonkeyPatch) -> None:
    code = "ABORTED"
    loss, data, _ = linear_problem()
    tg = prepare(loss)

    def always_aborted(self: StreamedStep, next_started: float | None = None) -> Any:
        self.abort()
        address = self.client.addresses[0]
        raise ParameterServerError(f"parameter server {address} (shard 0) refused PushPull: restored", code)

    monkeypatch.setattr(StreamedStep, "result", always_aborted)
    with ps_job(tg, training=TrainingConfig("async")) as (addrs, token, _):
        spec = ReplicaSpec("job", 0, tg, addrs, token, mode="async", batch_size=16, steps=20, timeout_s=TIMEOUT)
        with pytest.raises(ParameterServerError) as err:
            run_replica(spec, data)
    assert err.value.code == code
    message = str(err.value)
    # Each refused answer came after its push was sent (and applied): the step named is the last one sent.
    assert re.search(
        re.escape(
            f"replica 0 of job 'job': rejoined the parameter server(s) {addrs[0]} {replica_module.REJOIN_ATTEMPTS} "
            "times in a row without training a step (global step "
        )
        + r"\d+\)",
        message,
    ), message
    assert f"parameter server {addrs[0]} (shard 0) refused PushPull: restored" in message
    # Dask runs no replica task again (retries=0): the job fails with it, as the replica says.
    assert message.endswith("The replica gives up, and the job fails with it (Dask never runs a replica task again)")
