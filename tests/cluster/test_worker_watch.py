"""What the job says about a lost worker: which replicas ran there, even when it was lost in the job's first moments."""

from __future__ import annotations

from types import SimpleNamespace

from cellgraph.cluster.cluster import WorkerInfo
from cellgraph.cluster.ps import TrainingConfig
from cellgraph.cluster.worker_watch import WorkerWatch


def worker(address: str, task: int) -> WorkerInfo:
    return WorkerInfo(address, "worker", task, f"worker-{task}", 1, 2**30, 0, "127.0.0.1")


def test_a_worker_lost_before_any_look_saw_its_replica_is_said_to_have_run_it() -> None:
    # The job's state as the watch reads it: three replicas' futures, still running, and the training config.
    running = SimpleNamespace(status="pending", done=lambda: False)
    state = SimpleNamespace(job_id="job-1", futures=[running] * 3, training=TrainingConfig("sync", 2))
    watch = WorkerWatch(state)  # type: ignore[arg-type]
    a, b, c = (worker(f"tcp://127.0.0.1:{port}", task) for task, port in enumerate((1001, 1002, 1003)))
    # Each replica's task said where it runs, but the watch has not looked since (its last look knew nothing).
    watch.replica_at.update({0: a.address, 1: b.address, 2: c.address})
    said = watch._lost_worker(b, now=0.0, gone=[b.address])
    assert said.endswith(
        "which ran replica 1: the job runs it again on an idle training worker (the restarted one once it is back) "
        "or else the least loaded, where it rejoins at the servers' global step; meanwhile 2 replica(s) go on "
        "(2 gradients make a step)"
    ), said
    # A look placed replica 1 there; since then it said it runs elsewhere: the last look's place is the lost one.
    watch._placed = {1: b.address}
    watch.replica_at[1] = c.address
    assert "which ran replica 1:" in watch._lost_worker(b, now=0.0, gone=[b.address])
    assert "which ran replica 0:" in watch._lost_worker(a, now=0.0, gone=[a.address])
    # A worker where no replica ran, at the last look or since, has nothing to do.
    idle = worker("tcp://127.0.0.1:1004", 3)
    assert watch._lost_worker(idle, now=0.0, gone=[idle.address]).endswith(
        "which ran no replica of job job-1: nothing to do"
    )
