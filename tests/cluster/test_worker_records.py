"""A worker's log records about itself while it runs a replica (a heartbeat the busy scheduler did not answer)
go to the job's events and log file, not to the stderr that a notebook shows in whatever cell runs."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import pytest

import cellgraph as cg
from cellgraph.cluster.cluster import Cluster
from cellgraph.examples import digits, models

TIMEOUT = 120.0
HEARTBEAT = "Failed to communicate with scheduler during heartbeat"


def log_heartbeat_failure() -> None:
    """Run on a worker: what Dask's worker logs when a heartbeat gets no answer."""
    logging.getLogger("distributed.worker").error(HEARTBEAT + ".")


def log_something_else() -> None:
    logging.getLogger("distributed.worker").error("an unrelated worker record")


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with Cluster.local(workers=1, ps=1) as local:
        yield local


@pytest.mark.slow
def test_a_heartbeat_failure_on_a_replicas_worker_goes_to_the_job(cluster: Cluster) -> None:
    data = digits.load()
    model = models.mlp()
    job = cg.train(
        model.loss, (data.x_train, data.y_train), cluster=cluster, replicas=1, steps=1_000_000, mode="async",
        checkpoint_every=None,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + TIMEOUT
        while job.status != "running" or job.global_step() < 5:
            assert time.monotonic() < deadline and job.status in ("starting", "running"), job.events
            time.sleep(0.1)
        [worker] = cluster.training_workers()
        # The unrelated record first: had it been routed, it would reach the events before the heartbeat's.
        cluster.client.run(log_something_else, workers=[worker])
        cluster.client.run(log_heartbeat_failure, workers=[worker])
        while not any(HEARTBEAT in e for e in job.events):
            assert time.monotonic() < deadline, job.events
            time.sleep(0.1)
        assert any(f"worker {worker} logged ERROR (distributed.worker): {HEARTBEAT}" in e for e in job.events)
        # A record about neither a replica nor the worker's own trouble stays Dask's (its handler prints it).
        assert not any("an unrelated worker record" in e for e in job.events)
    finally:
        job.close()
