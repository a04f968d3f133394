"""The client reports a shard that fails as soon as it fails, without waiting for the other shards' answers."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from cellgraph.cluster.errors import ParameterServerError
from cellgraph.cluster.ps import OptimizerConfig, TrainingConfig

from .conftest import TIMEOUT, Servers

# Far longer than the test may take: only the dead shard's early report can end the call before it.
LONG_WAIT_S = 600.0


def call_in_thread(call: object) -> tuple[threading.Thread, list[BaseException]]:
    raised: list[BaseException] = []

    def run() -> None:
        try:
            call()  # type: ignore[operator]
        except BaseException as err:  # inspected by the test
            raised.append(err)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, raised


@pytest.mark.parametrize("fused", [True, False], ids=["push_pull", "pull"])
def test_a_dead_shard_is_reported_while_the_other_shard_still_waits(ps: Servers, fused: bool) -> None:
    live, dead = ps.start(2)
    values = {"a": np.zeros(4, np.float32), "b": np.zeros(4, np.float32)}
    setup = ps.client()
    setup.init("job", values, OptimizerConfig("sgd", 1.0), TrainingConfig("sync", replicas_to_aggregate=2))
    assert {spec.name: shard for shard, spec in (p[0] for p in setup.layout.values())} == {"a": 0, "b": 1}  # type: ignore[union-attr]
    client = ps.client(timeout=LONG_WAIT_S, retries=2)
    client.register(0)
    ps.servers[1].stop(None).wait(TIMEOUT)
    # Shard 0 waits for step 1, which needs a second replica's gradient that never comes.
    if fused:
        grads = {name: np.ones(4, np.float32) for name in values}
        thread, raised = call_in_thread(lambda: client.push_pull(grads, step=0, replica_id=0, min_step=1))
    else:
        thread, raised = call_in_thread(lambda: client.pull(min_step=1))
    thread.join(TIMEOUT * 3)
    try:
        assert not thread.is_alive(), "the call waited for the live shard instead of reporting the dead one"
        [err] = raised
        assert isinstance(err, ParameterServerError) and err.code == "UNAVAILABLE", err
        assert f"parameter server {dead} (shard 1) did not answer" in str(err)
        assert live not in str(err)
    finally:
        ps.servers[0].stop(None).wait(TIMEOUT)  # ends the live shard's wait if the call still runs
