"""A joined cluster whose Dask scheduler process is killed under a running job: real ``dask scheduler`` and
``dask worker`` processes, nothing mocked."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cellgraph.cluster.cluster import Cluster
from cellgraph.cluster.training_graph import TrainingError
from cellgraph.examples import digits

from .test_faults import TIMEOUT, start_job, wait_for_step


class OwnScheduler:
    """A Dask user's own scheduler and workers, started by hand (``dask scheduler``, ``dask worker``)."""

    def __init__(self, folder: Path) -> None:
        scheduler_file = folder / "scheduler.json"
        self.scheduler = subprocess.Popen(
            [sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1", "--port", "0",
             "--dashboard-address", "127.0.0.1:0", "--scheduler-file", str(scheduler_file)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        self.workers: list[subprocess.Popen[bytes]] = []
        deadline = time.monotonic() + TIMEOUT
        while not scheduler_file.exists():
            assert time.monotonic() < deadline, f"the scheduler wrote no {scheduler_file.name} within {TIMEOUT} s"
            time.sleep(0.1)
        self.address: str = json.loads(scheduler_file.read_text())["address"]

    def add_worker(self, resource: str) -> None:
        """A worker of one thread with the resource ``worker=1`` (training) or ``ps=1`` (a parameter server)."""
        self.workers.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "distributed.cli.dask_worker",
                    self.address,
                    "--nthreads",
                    "1",
                    "--resources",
                    f"{resource}=1",
                    "--no-dashboard",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )  # fmt: skip
        )

    def close(self) -> None:
        for process in (*self.workers, self.scheduler):
            process.kill()
            process.wait(TIMEOUT)


@pytest.fixture
def own_scheduler(tmp_path: Path) -> Iterator[OwnScheduler]:
    started = OwnScheduler(tmp_path)
    try:
        yield started
    finally:
        started.close()


def joined(own: OwnScheduler, workers: int) -> Cluster:
    """``Cluster.connect`` to ``own`` once its ``workers`` workers have all joined."""
    cluster = Cluster.connect(own.address, timeout=TIMEOUT)
    deadline = time.monotonic() + TIMEOUT
    while len(cluster.workers()) < workers:
        assert time.monotonic() < deadline, f"only {cluster.workers()} joined within {TIMEOUT} s"
        time.sleep(0.2)
    return cluster


@pytest.mark.slow
def test_a_job_whose_scheduler_is_killed_fails_at_once_saying_the_scheduler_is_gone(
    own_scheduler: OwnScheduler, data: digits.Split
) -> None:
    for resource in ("worker", "worker", "ps"):
        own_scheduler.add_worker(resource)
    cluster = joined(own_scheduler, 3)
    job = start_job(cluster, data, replicas=2, aggregate=None, timeout_s=TIMEOUT)
    try:
        wait_for_step(job, 20)
        own_scheduler.scheduler.send_signal(signal.SIGKILL)
        # Before: 'running' for the whole restart deadline (the cancelled tasks taken for lost workers, the PS for
        # one to restart), then "its supervisor failed: AttributeError: 'NoneType' object has no attribute ...".
        with pytest.raises(TrainingError) as info:
            job.wait(TIMEOUT / 2)  # well inside the job's deadline (timeout_s)
        said = (
            f"job {job.job_id} has failed: the Dask scheduler at {own_scheduler.address} is gone (Dask's client lost "
            "its connection to it and is "
        )
        message = str(info.value)
        assert message.startswith(said), message
        assert message.endswith(
            "), and the job's replica tasks with it. Is the scheduler still running? Once it and its workers are "
            "back, join it again (Cluster.connect) and cg.train(...) starts it again"
        ), message
        assert job.status == "failed"
        assert [e for e in job.events if said in e], job.events
        # The step it had reached, not a raw gRPC error of the servers that went with the scheduler.
        assert job.global_step() >= 20
        # ps_stats() and variables() say the job's error, not the servers' raw CANCELLED or UNAVAILABLE.
        for ask in (job.ps_stats, job.variables):
            with pytest.raises(TrainingError) as asked:
                ask()
            assert str(asked.value).startswith(f"{said}"), str(asked.value)
            assert "has nothing to read: the job's parameter servers are gone with it" in str(asked.value)
        job.close()  # quiet: before, Dask's ClosedClientError came out of it
        assert not [e for e in job.events if "AttributeError" in e], job.events
    finally:
        job.close()
        cluster.close()
