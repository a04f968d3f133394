"""Parameter servers beside the replicas: a shard in each of the job's training workers (ps_placement="colocated").

The placement spreads the variables over as many ``ps`` tasks as the job has
replicas, and shard ``i`` runs inside replica ``i``'s worker process, so the
servers' bandwidth grows with the job. A killed training worker takes both its
replica and its shard: Dask restarts it (same name), the job's plugin starts
the shard there again, the job restores the last checkpoint and the replica
rejoins.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import pytest

import cellgraph as cg
from cellgraph.cluster.cluster import Cluster, ClusterError
from cellgraph.cluster.ps_plugin import server_address
from cellgraph.cluster.training_graph import TrainingError
from cellgraph.examples import digits, models

TIMEOUT = 180.0


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with Cluster.local(workers=2, ps="colocated") as local:
        yield local


def test_local_refuses_a_ps_that_is_neither_a_count_nor_colocated() -> None:
    with pytest.raises(ClusterError, match=r"needs workers >= 1, ps >= 0 \(or 'colocated'\)"):
        Cluster.local(workers=1, ps="beside")  # type: ignore[arg-type]


@pytest.mark.slow
def test_a_colocated_job_runs_a_shard_in_each_training_worker(cluster: Cluster) -> None:
    assert cluster.ps_workers() == [] and cluster.ps_placement == "colocated"
    data = digits.load()
    model = models.mlp()
    job = cg.train(
        model.loss, (data.x_train, data.y_train), cluster=cluster, optimizer=cg.optim.Adam(1e-2), replicas=2,
        batch_size=32, steps=300, checkpoint_every=None,
    )  # fmt: skip
    try:
        job.wait(TIMEOUT)
        assert job.status == "finished", job.events
        # Each training worker hosts one of the job's servers, in shard order.
        workers = cluster.training_workers()
        hosted = cluster.client.run(server_address, job.job_id, workers=workers)
        assert [hosted[w] for w in workers] == job._state.addresses
        placement = job.placement
        load = placement.ps_load_bytes()
        assert [s["held_bytes"] for s in job.ps_stats()] == [load[f"/job:ps/task:{i}/device:cpu:0"] for i in (0, 1)]
        assert all(n > 0 for n in load.values())  # the variables are spread over both
        assert any("(a shard in each replica's worker)" in e for e in job.events)
        logits = job.evaluate(model.logits, {model.x: data.x_test})
        assert float((logits.argmax(axis=1) == data.y_test).mean()) >= 0.9
    finally:
        job.close()


def test_a_dedicated_job_on_a_cluster_without_ps_workers_is_refused(cluster: Cluster) -> None:
    model = models.mlp()
    data = digits.load()
    with pytest.raises(TrainingError, match=r"the cluster has no parameter-server worker: .* or pass "
                       r"ps_placement='colocated' \(a shard in each training worker\)"):  # fmt: skip
        cg.train(model.loss, (data.x_train, data.y_train), cluster=cluster, ps_placement="dedicated")
    with pytest.raises(TrainingError, match="ps_placement must be 'dedicated' or 'colocated', got 'beside'"):
        cg.train(model.loss, (data.x_train, data.y_train), cluster=cluster, ps_placement="beside")  # type: ignore[arg-type]


@pytest.mark.slow
def test_a_killed_training_worker_brings_back_its_replica_and_its_shard(cluster: Cluster) -> None:
    data = digits.load()
    model = models.mlp()
    job = cg.train(
        model.loss, (data.x_train, data.y_train), cluster=cluster, optimizer=cg.optim.Adam(1e-2), replicas=2,
        batch_size=32, steps=600, checkpoint_every=50,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + TIMEOUT
        while job.global_step() < 120:
            assert time.monotonic() < deadline and job.status == "running", job.events
            time.sleep(0.1)
        victim = cluster.training_workers()[1]
        os.kill(cluster.client.run(os.getpid, workers=[victim])[victim], signal.SIGKILL)
        job.wait(TIMEOUT)
        assert job.status == "finished" and job.global_step() == 600, job.events
        assert any("restores" in e or "restored" in e for e in job.events), job.events
        logits = job.evaluate(model.logits, {model.x: data.x_test})
        assert float((logits.argmax(axis=1) == data.y_test).mean()) >= 0.9
        # The restarted worker hosts the shard again.
        workers = cluster.training_workers()
        hosted = cluster.client.run(server_address, job.job_id, workers=workers)
        assert sorted(hosted[w] for w in workers) == sorted(job._state.addresses)
    finally:
        job.close()
