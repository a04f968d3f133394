"""Dask's statistical profiler is paused on a worker while replicas train there, and runs again after the last."""

from __future__ import annotations

import time

import distributed
import pytest

import cellgraph as cg
from cellgraph.cluster import worker_profiler
from cellgraph.cluster.cluster import Cluster
from cellgraph.examples import digits, models

DEADLINE_S = 30.0


def profiling(dask_worker: distributed.Worker) -> bool:
    return bool(dask_worker.periodic_callbacks["profile"].is_running())


def hold_pause(release: str) -> bool:
    """As a replica does: pause the profiler until ``release`` is set; whether it was paused meanwhile."""
    worker = distributed.get_worker()
    with worker_profiler.paused(worker):
        distributed.Event(release).wait(DEADLINE_S)
        # Stopped from the worker's event loop: give it a moment to have run.
        deadline = time.monotonic() + DEADLINE_S
        while profiling(worker) and time.monotonic() < deadline:
            time.sleep(0.01)
        return not profiling(worker)


def wait_until(client: distributed.Client, running: bool) -> bool:
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        if set(client.run(profiling).values()) == {running}:
            return True
        time.sleep(0.02)
    return False


def test_the_profiler_stops_while_any_replica_runs_and_starts_after_the_last(client: distributed.Client) -> None:
    assert wait_until(client, True)  # Dask's default: on
    first = client.submit(hold_pause, "first-done", pure=False)
    second = client.submit(hold_pause, "second-done", pure=False)
    assert wait_until(client, False)
    distributed.Event("first-done", client=client).set()
    assert first.result(timeout=DEADLINE_S) is True
    time.sleep(0.2)
    assert set(client.run(profiling).values()) == {False}  # the second replica still holds the pause
    distributed.Event("second-done", client=client).set()
    assert second.result(timeout=DEADLINE_S) is True
    assert wait_until(client, True)


def test_a_worker_whose_profiler_is_off_is_left_as_it_is(client: distributed.Client) -> None:
    def without_profiler(dask_worker: distributed.Worker) -> list[str]:
        callbacks = dask_worker.periodic_callbacks
        saved = callbacks.pop("profile")
        try:
            with worker_profiler.paused(dask_worker):
                pass
            return sorted(callbacks)
        finally:
            callbacks["profile"] = saved

    [names] = client.run(without_profiler).values()
    assert "profile" not in names


@pytest.mark.slow
def test_a_training_job_pauses_its_workers_profiler_until_it_ends() -> None:
    # The real path: cg.train's replica task pauses its worker's profiler, and the job's end restores it.
    model = models.mlp()
    data = digits.load()
    with Cluster.local(workers=1, ps=1) as cluster:
        job = cg.train(
            model.loss, (data.x_train, data.y_train), cluster=cluster, replicas=1, batch_size=32, steps=10**6,
            checkpoint_every=None,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 120
            while job.global_step() < 5 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert job.status == "running" and job.global_step() >= 5
            states = cluster.client.run(profiling)
            assert False in states.values(), states  # the worker training the replica does not sample
        finally:
            job.stop()
            job.wait(120)
            job.close()
        assert wait_until(cluster.client, True)
