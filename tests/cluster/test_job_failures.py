"""A job that fails, and a cluster closed under a job: at once, with the error, quietly, in every state.

Each test starts its own cluster inside the test, so that the worker
processes write to the file descriptors pytest captures (``capfd``): what a
notebook cell would show.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

import cellgraph as cg
from cellgraph.cluster.cluster import Cluster
from cellgraph.cluster.job import Job
from cellgraph.cluster.training_graph import TrainingError
from cellgraph.examples import digits, models

TIMEOUT = 90.0  # seconds: the deadline of every wait in these tests


def nan_loss() -> cg.Tensor:
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((None, 2), "float64", name="x")
        w = cg.variable(np.array([1.0, 2.0]), dtype="float64", name="w")
        return cg.reduce_sum(x * w, name="loss")


@pytest.mark.slow
def test_a_replica_failing_on_its_own_error_fails_the_job_at_once_and_prints_nothing(
    capfd: pytest.CaptureFixture[str],
) -> None:
    data = np.array([[1.0, 1.0], [np.nan, 1.0]] * 4)  # every batch holds a NaN: the servers refuse its gradient
    with Cluster.local(workers=1, ps=1) as cluster:
        job = cg.train(
            nan_loss(), (data,), cluster=cluster, optimizer=cg.optim.SGD(0.1), replicas=1, batch_size=2, steps=50,
            checkpoint_every=None, nonfinite="reject",
        )  # fmt: skip
        try:
            with pytest.raises(TrainingError) as err:
                job.wait(TIMEOUT)
            message = str(err.value)
            assert message.startswith(f"replica 0 of job {job.job_id} failed on tcp://"), message
            assert "ParameterServerError: " in message and "non-finite" in message, message
            assert "The job has failed at once (the same error would come back wherever it ran); the replica's " in (
                message
            )
            assert message.endswith(f"traceback is in {job.log_path}")
            assert job.status == "failed"
            log = Path(job.log_path).read_text()
            assert "Traceback (most recent call last)" in log and "ParameterServerError" in log
            events = "\n".join(job.events)
            assert f"replica 0 of job {job.job_id} failed on tcp://" in events
            # No retry, no lost worker: the task ran once.
            assert "runs again" not in events and "lost worker" not in events and "submitted again" not in events
            assert job._state.futures[0].key == f"cellgraph-replica-{job.job_id}-0"
        finally:
            job.close()
    out, errors = capfd.readouterr()
    assert "Compute Failed" not in out + errors, errors[-3000:]
    assert "Traceback" not in out + errors, errors[-3000:]
    Path(job.log_path).unlink()


@pytest.mark.slow
def test_a_workers_log_record_about_a_replica_goes_to_the_job_not_to_the_cell(
    capfd: pytest.CaptureFixture[str], data: digits.Split
) -> None:
    with Cluster.local(workers=1, ps=1) as cluster:
        model = models.mlp()
        job = cg.train(
            model.loss, (data.x_train, data.y_train), cluster=cluster, replicas=1, batch_size=32, steps=1_000_000,
            checkpoint_every=None,
        )  # fmt: skip
        try:
            wait_until(lambda: job.global_step() >= 5, "step 5", job)
            key = job._state.futures[0].key

            def log_on_the_worker() -> None:
                # What Dask's worker logs when a task raises: here about the running replica, and one about nothing.
                logging.getLogger("distributed.worker").error(
                    "Compute Failed\nKey:       %s\nState:     executing", key
                )
                logging.getLogger("distributed.worker").warning("a record about no replica (xyzzy)")

            cluster.client.run(log_on_the_worker, workers=cluster.training_workers())
            words = f"logged ERROR (distributed.worker): Compute Failed; the whole record is in {job.log_path}"
            wait_until(lambda: any(words in e for e in job.events), "the worker's record in the events", job)
            assert f"Key:       {key}" in Path(job.log_path).read_text()
        finally:
            job.close()
    _, printed = capfd.readouterr()
    assert "Compute Failed" not in printed and "xyzzy" in printed  # only the record about the replica was routed
    Path(job.log_path).unlink()


class Quiet:
    """Collects what shutdown must not produce: an exception in any thread, a warning or error of Dask."""

    def __init__(self) -> None:
        self.crashes: list[str] = []
        self.records: list[str] = []
        self.armed = False  # from the shutdown on: the faults a state is made of log warnings of their own

    def arm(self, capfd: pytest.CaptureFixture[str]) -> None:
        capfd.readouterr()
        self.armed = True

    def hook(self, args: threading.ExceptHookArgs) -> None:
        self.crashes.append(f"{args.thread.name if args.thread else '?'}: {args.exc_type.__name__}: {args.exc_value}")

    def emit(self, record: logging.LogRecord) -> None:
        if self.armed:
            self.records.append(f"{record.name} {record.levelname}: {record.getMessage()}")


@pytest.fixture
def quiet(monkeypatch: pytest.MonkeyPatch) -> Iterator[Quiet]:
    found = Quiet()
    monkeypatch.setattr(threading, "excepthook", found.hook)
    handler = logging.Handler(logging.WARNING)
    handler.emit = found.emit  # type: ignore[method-assign]
    # On Dask's own logger: its records may not reach the root logger (its config decides propagation).
    logger = logging.getLogger("distributed")
    logger.addHandler(handler)
    try:
        yield found
    finally:
        logger.removeHandler(handler)


def wait_until(check: Callable[[], bool], what: str, job: Job) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not check():
        assert time.monotonic() < deadline, f"still waiting for {what}; events: {job.events}"
        time.sleep(0.05)


def kill(cluster: Cluster, address: str) -> None:
    pid = cluster.client.run(os.getpid, workers=[address])[address]
    os.kill(pid, signal.SIGKILL)


def mlp_job(cluster: Cluster, data: digits.Split) -> Job:
    model = models.mlp()
    return cg.train(
        model.loss, (data.x_train, data.y_train), cluster=cluster, optimizer=cg.optim.Adam(1e-2), replicas=2,
        batch_size=32, steps=1_000_000, checkpoint_every=5,
    )  # fmt: skip


def running(cluster: Cluster, data: digits.Split) -> Job:
    """A job in the middle of training."""
    job = mlp_job(cluster, data)
    wait_until(lambda: job.global_step() >= 10, "step 10", job)
    return job


def failed(cluster: Cluster, data: digits.Split) -> Job:
    """A job whose replica failed on an error of its own (a NaN gradient, refused), the other replica stopping."""
    rows = np.tile(np.array([[1.0, 1.0], [np.nan, 1.0]]), (20, 1))
    job = cg.train(
        nan_loss(), (rows,), cluster=cluster, optimizer=cg.optim.SGD(0.1), replicas=2, batch_size=2, steps=1000,
        checkpoint_every=None,
    )  # fmt: skip
    wait_until(lambda: job.status == "failed", "the job to fail", job)
    return job


def replacing_a_replica(cluster: Cluster, data: digits.Split) -> Job:
    """A job whose training worker was just lost: its replica waits to run again."""
    job = running(cluster, data)
    kill(cluster, cluster.training_workers()[1])
    wait_until(lambda: any("lost worker" in e for e in job.events), "the lost worker", job)
    return job


def restarting_a_server(cluster: Cluster, data: digits.Split) -> Job:
    """A job whose parameter server was just lost: the supervisor waits for Dask to restart it."""
    job = running(cluster, data)
    kill(cluster, cluster.ps_workers()[0])
    wait_until(lambda: any("did not answer" in e for e in job.events), "the silent server", job)
    return job


@pytest.mark.slow
@pytest.mark.parametrize("state", [running, failed, replacing_a_replica, restarting_a_server])
def test_closing_the_cluster_under_a_job_is_quiet_in_every_state(
    quiet: Quiet, capfd: pytest.CaptureFixture[str], data: digits.Split, state: Callable[[Cluster, digits.Split], Job]
) -> None:
    cluster = Cluster.local(workers=2, ps=1)
    try:
        job = state(cluster, data)
        quiet.arm(capfd)
    finally:
        cluster.close()  # what `%cluster down` does: the job is closed with it
    _, printed = capfd.readouterr()  # what the worker processes printed meanwhile (into the user's cell)
    assert [line for line in printed.splitlines() if "WARNING" in line or "ERROR" in line] == [], printed
    assert job._state.closed.is_set() and job._state.ps is None
    thread = job._supervisor.thread
    assert thread is not None
    thread.join(TIMEOUT)
    assert not thread.is_alive()
    assert quiet.crashes == []
    assert quiet.records == []
    job.close()  # again, on a closed cluster: nothing to do, and nothing raised
