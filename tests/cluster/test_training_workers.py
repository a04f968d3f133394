"""A job on a cluster without enough training workers: refused at once or waited for with a deadline, and the
default number of replicas (one per training worker). Real Dask schedulers and workers."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

import cellgraph as cg
from cellgraph.cluster.cluster import Cluster
from cellgraph.cluster.training_graph import TrainingError
from cellgraph.examples import digits, models

from .test_faults import TIMEOUT, local_cluster, start_job
from .test_scheduler_gone import OwnScheduler, joined, own_scheduler

__all__ = ["local_cluster", "own_scheduler"]  # the fixtures, used by name


@pytest.mark.slow
def test_a_cluster_of_parameter_servers_only_is_refused_then_one_replica_per_training_worker_by_default(
    own_scheduler: OwnScheduler, data: digits.Split
) -> None:
    own_scheduler.add_worker("ps")
    cluster = joined(own_scheduler, 1)
    model = models.mlp()
    try:
        for replicas, asked in ((None, "a replica needs"), (2, "2 replica(s) need")):
            with pytest.raises(TrainingError) as info:
                cg.train(model.loss, (data.x_train, data.y_train), cluster=cluster, replicas=replicas, steps=20)
            # Before: 'cg.train: 2 replicas need 2 training workers and the cluster has 0: pass replicas=0, ...'.
            assert str(info.value) == (
                f"cg.train: the cluster at {own_scheduler.address} has no training worker (0 training workers and 1 "
                f"parameter-server worker(s), which never train): {asked} a Dask worker without the 'ps' resource; "
                f"start one with dask worker {own_scheduler.address} --resources worker=1"
            )
        own_scheduler.add_worker("worker")
        joined(own_scheduler, 2)
        # One replica per training worker, as %train: before, two, refused on a cluster of one training worker.
        job = cg.train(model.loss, (data.x_train, data.y_train), cluster=cluster, batch_size=32, steps=20)
        try:
            assert job.replicas == 1
            job.wait(TIMEOUT)
            assert job.status == "finished" and job.global_step() == 20, job.events
        finally:
            job.close()
    finally:
        cluster.close()


@pytest.mark.slow
def test_a_job_whose_training_workers_are_gone_at_its_start_waits_for_them_then_fails_saying_so(
    local_cluster: Callable[..., Cluster], data: digits.Split, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster = local_cluster(workers=1, ps=1)
    counted = cluster.training_workers()
    # What the job's start sees when the one training worker left between cg.train's count and the start (the
    # window is too short to hit with a real kill every time): the scheduler lists no training worker.
    calls = iter([counted])
    monkeypatch.setattr(cluster, "training_workers", lambda: next(calls, []))
    job = start_job(cluster, data, replicas=1, aggregate=None, steps=20, timeout_s=3.0)
    try:
        deadline = time.monotonic() + TIMEOUT
        while not (said := [e for e in job.events if "the job waits for training workers" in e]):
            assert time.monotonic() < deadline and job.status == "starting", job.events
            time.sleep(0.05)
        [waits] = said
        assert waits.endswith(
            f"the job waits for training workers: its 1 replica(s) need 1 and the cluster at "
            f"{cluster.scheduler_address} has 0 now; it waits up to 3 s for them to join, then fails"
        ), waits
        # Before: no replica started, no word, and the job 'finished' at global step 0.
        with pytest.raises(TrainingError) as info:
            job.wait(TIMEOUT)
        assert str(info.value) == (
            f"job {job.job_id} could not start: its 1 replica(s) need 1 training worker(s), and none more joined "
            f"within timeout_s=3 s: the cluster at {cluster.scheduler_address} has no training worker (0 training "
            "workers and 1 parameter-server worker(s), which never train): 1 replica(s) need a Dask worker without "
            "the 'ps' resource; start the cluster with Cluster.local(workers=1) or more"
        )
        assert job.status == "failed"
        # Before: 'job J has no parameter servers', and ps_stats() said the job 'is closed'.
        for what, ask in (("job.global_step()", job.global_step), ("job.ps_stats()", job.ps_stats)):
            with pytest.raises(TrainingError) as asked:
                ask()
            assert str(asked.value) == f"{info.value}. {what} has nothing to read: the job has no parameter servers"
    finally:
        job.close()
