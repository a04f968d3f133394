"""Jobs that lose processes mid-training: real worker processes are killed with SIGKILL, nothing is mocked."""

from __future__ import annotations

import multiprocessing.resource_tracker
import os
import re
import signal
import time
from collections.abc import Callable, Iterator

import numpy as np
import psutil
import pytest

import cellgraph as cg
from cellgraph.cluster import replica_set
from cellgraph.cluster.cluster import Cluster
from cellgraph.cluster.job import Job
from cellgraph.examples import digits, models

TIMEOUT = 90.0  # seconds: the deadline of every wait in these tests


def children() -> dict[int, str]:
    """This process's child processes (recursively), pid -> command line."""
    found = {}
    for child in psutil.Process().children(recursive=True):
        try:
            found[child.pid] = " ".join(child.cmdline())
        except psutil.NoSuchProcess:
            pass
    return found


@pytest.fixture
def local_cluster() -> Iterator[Callable[..., Cluster]]:
    """``Cluster.local(...)`` for one test: closed at its end, leaving no process behind (restarted ones included)."""
    multiprocessing.resource_tracker.ensure_running()  # lives as long as this process: count it before too
    before = children()
    started: list[Cluster] = []

    def start(**kwargs: int) -> Cluster:
        started.append(Cluster.local(**kwargs))
        return started[-1]

    try:
        yield start
    finally:
        for cluster in started:
            cluster.close()
    deadline = time.monotonic() + TIMEOUT
    while (left := {p: c for p, c in children().items() if p not in before}) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert left == {}, f"processes outlived close(): {left}"


def kill_worker(cluster: Cluster, address: str) -> None:
    """SIGKILL the worker process at ``address`` (its nanny stays, and starts a new one)."""
    pid = cluster.client.run(os.getpid, workers=[address])[address]
    os.kill(pid, signal.SIGKILL)


def start_job(cluster: Cluster, data: digits.Split, replicas: int, aggregate: int | None, **options: object) -> Job:
    """The MLP trained with Adam(1e-2), batch 32, on ``replicas`` replicas (``aggregate`` gradients a step)."""
    settings: dict[str, object] = dict(steps=100_000, checkpoint_every=None)
    settings.update(options)
    model = models.mlp()
    return cg.train(
        model.loss, (data.x_train, data.y_train), cluster=cluster, optimizer=cg.optim.Adam(1e-2), replicas=replicas,
        replicas_to_aggregate=aggregate, batch_size=32, **settings,  # type: ignore[arg-type]
    )  # fmt: skip


def kill_at_step(cluster: Cluster, job: Job, address: str, step: int) -> float:
    """Once ``job`` reaches ``step``, SIGKILL the worker at ``address``; when it was killed (``time.time()``)."""
    wait_for_step(job, step)
    killed_at = time.time()
    kill_worker(cluster, address)
    return killed_at


def wait_for_step(job: Job, step: int) -> None:
    deadline = time.monotonic() + TIMEOUT
    while job.global_step() < step:
        assert time.monotonic() < deadline, f"job stuck below step {step}: {job.events}"
        assert job.status == "running", job.events
        time.sleep(0.05)


@pytest.mark.slow
def test_a_lost_training_worker_is_replaced_and_no_gradient_counts_twice(
    local_cluster: Callable[..., Cluster], data: digits.Split
) -> None:
    cluster = local_cluster(workers=3, ps=1)
    victim = cluster.training_workers()[1]  # replica 1 runs there
    # More steps than the test waits for: the job runs until replica 1 is back and has trained with the others.
    job = start_job(cluster, data, replicas=3, aggregate=2)
    try:
        killed_at = kill_at_step(cluster, job, victim, 40)
        wait_for_event(job, "replica 1 runs again")
        wait_for_step(job, job.global_step() + 20)
        # Replica 1 ran again and pushed again (the servers saw it after the kill); on a loaded machine the
        # restarted worker may take a while to load its kernels, while the two others carry the steps.
        deadline = time.monotonic() + TIMEOUT
        while True:
            [stats] = job._state.ps.stats()  # type: ignore[union-attr]
            again = {r.replica_id: r for r in stats.replicas}[1]
            if again.last_seen_unix > killed_at:
                break
            assert time.monotonic() < deadline, f"replica 1 never pushed after the kill: {job.events}"
            time.sleep(0.2)
        assert stats.pushes_applied == 2 * stats.updates  # no gradient applied twice
        job.stop(TIMEOUT)
        assert job.status == "stopped", job.events
        assert job._state.futures[1].result()["replica"] == 1
        events = "\n".join(job.events)
        assert f"lost worker {victim} (name worker-1, role worker, task 1; last seen " in events
        assert (
            "which ran replica 1: the job runs it again on an idle training worker (the restarted one once it is "
            "back) or else the least loaded, where it rejoins at the servers' global step; meanwhile 2 replica(s) "
            "go on (2 gradients make a step)"
        ) in events
        assert "replica 1's task was lost with its worker (cancelled): submitted again on idle worker tcp://" in events
        assert re.search(r"replica 1 runs again, on tcp://\S+ \(name worker-\d, role worker, task \d\)", events)
        assert re.search(r"worker tcp://\S+ joined \(name worker-1, role worker, task \d\)", events), events
        # In the order things happened: the worker was lost, then its replica ran again elsewhere.
        assert event_index(job, f"lost worker {victim}") < event_index(job, "replica 1 runs again"), job.events
    finally:
        job.close()


@pytest.mark.slow
def test_a_lost_parameter_server_is_restarted_from_the_last_checkpoint(
    local_cluster: Callable[..., Cluster], data: digits.Split
) -> None:
    steps, every = 400, 20
    cluster = local_cluster(workers=2, ps=1)
    [ps_worker] = cluster.ps_workers()
    job = start_job(cluster, data, replicas=2, aggregate=None, steps=steps, checkpoint_every=every)
    try:
        job.global_step()  # waits for the job's start (its own thread): then its servers' addresses are known
        [old_address] = job._state.addresses
        kill_at_step(cluster, job, ps_worker, 60)
        job.wait(TIMEOUT)
        assert job.status == "finished", job.events
        assert job.global_step() == steps
        assert job._state.addresses != [old_address] and job._state.generation == 1
        assert [f.result()["rejoins"] for f in job._state.futures] == [1, 1]  # each replica found the new server
        events = "\n".join(job.events)
        assert (
            f"parameter server {old_address} (shard 0; worker {ps_worker}, name ps-0, role ps, task 0) "
            "did not answer (last seen at global step "
        ) in events, events
        assert "The job waits up to 60 s for Dask to restart it, then restores ckpt-" in events, events
        assert f"lost worker {ps_worker} (name ps-0, role ps, task 0; last seen " in events
        assert (
            "which hosted shard 0 of the job's parameter servers: once Dask restarts the worker (its nanny does when "
            "the process died; a worker cut off stays away), the job restarts the server there and restores the last "
            "checkpoint; it waits up to timeout_s="
        ) in events
        restarted = re.search(r"restarted at (\S+); restored (\S+) at global step (\d+): (\d+) step\(s\) lost", events)
        assert restarted, events
        assert restarted[1] == job._state.addresses[0]
        # The server checkpoints by itself at every multiple of `every`: no more than that is lost.
        assert 0 <= int(restarted[4]) <= every, events
        assert int(restarted[3]) % every == 0
        assert f"(checkpoints at most every {every} steps); the replicas rejoin there" in events
        assert "finished at global step 400" in events
        trained = job.variables()
    finally:
        job.close()
    # Sync with every replica's gradient in each step: the restored server and the replicas, which rejoin with the
    # batch of the restored step, train the lost steps again as they were, so the values are those of a job that
    # lost nothing (as a resumed job's are).
    undisturbed = start_job(cluster, data, replicas=2, aggregate=None, steps=steps, checkpoint_every=every)
    try:
        undisturbed.wait(TIMEOUT)
        assert undisturbed.status == "finished", undisturbed.events
        for name, value in undisturbed.variables().items():
            np.testing.assert_array_equal(trained[name], value, err_msg=name)
    finally:
        undisturbed.close()


def wait_for_event(job: Job, words: str) -> str:
    """The first of ``job.events`` that contains ``words``, once there is one (within ``TIMEOUT``)."""
    deadline = time.monotonic() + TIMEOUT
    while not (found := [e for e in job.events if words in e]):
        assert time.monotonic() < deadline, f"no event with {words!r}: {job.events}"
        assert job.status == "running", job.events
        time.sleep(0.05)
    return found[0]


def running_at(cluster: Cluster, key: str) -> str:
    """The worker the scheduler runs the task ``key`` on, once it has placed it (within ``TIMEOUT``)."""
    deadline = time.monotonic() + TIMEOUT
    while not (where := [a for a, keys in cluster.client.processing().items() if key in keys]):
        assert time.monotonic() < deadline, f"the scheduler placed no task {key}"
        time.sleep(0.05)
    return where[0]


def event_index(job: Job, words: str) -> int:
    return next(n for n, e in enumerate(job.events) if words in e)


@pytest.mark.slow
def test_a_lost_replica_runs_again_on_the_idle_restarted_worker(
    local_cluster: Callable[..., Cluster], data: digits.Split
) -> None:
    cluster = local_cluster(workers=3, ps=1)
    victim = cluster.training_workers()[1]  # replica 1 runs there
    # Every replica's gradient makes a step: the job cannot end before replica 1 runs again.
    job = start_job(cluster, data, replicas=3, aggregate=3)
    try:
        wait_for_step(job, 10)
        others = {running_at(cluster, job._state.futures[j].key) for j in (0, 2)}
        kill_at_step(cluster, job, victim, 10)
        wait_for_event(job, "replica 1's task was lost with its worker")
        at = running_at(cluster, job._state.futures[1].key)
        names = {w.address: w.name for w in cluster.workers()}
        assert names.get(at) == "worker-1" and at != victim and at not in others, (at, names, others, job.events)
        again = wait_for_event(job, "replica 1 runs again")
        assert f"replica 1 runs again, on {at} (name worker-1, role worker, task 1)" in again
        lost = event_index(job, f"lost worker {victim}")
        submitted = event_index(job, f"submitted again on idle worker {at}: no replica runs there")
        assert lost < submitted < event_index(job, "replica 1 runs again"), job.events
        wait_for_step(job, job.global_step() + 5)  # all three make steps again
    finally:
        job.close()


@pytest.mark.slow
def test_a_lost_replica_goes_to_the_least_loaded_worker_when_none_is_idle(
    local_cluster: Callable[..., Cluster], data: digits.Split, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(replica_set, "IDLE_WORKER_WAIT_S", 0.0)  # no wait for the restarted worker
    cluster = local_cluster(workers=2, ps=1, threads_per_worker=2)  # two replicas fit on one worker
    survivor, victim = cluster.training_workers()
    job = start_job(cluster, data, replicas=2, aggregate=2)
    try:
        kill_at_step(cluster, job, victim, 10)
        submitted = wait_for_event(job, "replica 1's task was lost with its worker")
        futures = job._state.futures
        assert running_at(cluster, futures[1].key) == survivor == running_at(cluster, futures[0].key)
        assert (
            f"submitted again on {survivor}, the least loaded: every training worker runs a replica "
            f"(tasks per worker: {survivor} 1)"
        ) in submitted
        wait_for_event(job, f"replica 1 runs again, on {survivor}")
        assert event_index(job, f"lost worker {victim}") < event_index(job, "replica 1's task was lost"), job.events
    finally:
        job.close()


@pytest.mark.slow
def test_events_keep_the_order_things_happened_when_dask_reruns_a_replica_itself(
    local_cluster: Callable[..., Cluster], data: digits.Split
) -> None:
    import dask.array as da

    cluster = local_cluster(workers=3, ps=1)
    victim = cluster.training_workers()[1]  # replica 1 runs there
    rows, features = data.x_train.shape
    # Data with lineage: a lost worker's shard can be computed again, so the scheduler runs the replica again by
    # itself, at once, before the job's next look at the workers.
    x = da.from_array(data.x_train, chunks=(rows // 4, features))
    y = da.from_array(data.y_train, chunks=rows // 4)
    job = cg.train(
        models.mlp().loss, (x, y), cluster=cluster, optimizer=cg.optim.Adam(1e-2), replicas=3, replicas_to_aggregate=2,
        batch_size=32, steps=100_000, checkpoint_every=None,
    )  # fmt: skip
    try:
        kill_at_step(cluster, job, victim, 10)
        wait_for_event(job, "replica 1 runs again")
        assert event_index(job, f"lost worker {victim}") < event_index(job, "replica 1 runs again"), job.events
    finally:
        job.close()
