"""Faults in combinations and at moments the other fault tests leave out: real processes, nothing mocked but the
nanny's pace (a PS worker that Dask restarts only later)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from cellgraph.cluster.cluster import Cluster
from cellgraph.examples import digits

from .test_faults import TIMEOUT, kill_worker, local_cluster, start_job, wait_for_event, wait_for_step

__all__ = ["local_cluster"]  # the fixture, used by name


def restart_later(cluster: Cluster, name: str, delay: float) -> None:
    """Make the nanny of worker ``name`` start a new worker process ``delay`` s after the old one died."""
    nanny: Any = cluster._local_cluster.workers[name]  # type: ignore[union-attr]
    instantiate = nanny.instantiate

    async def later() -> Any:
        await asyncio.sleep(delay)
        return await instantiate()

    nanny.instantiate = later


@pytest.mark.slow
def test_a_job_closed_while_its_lost_server_restarts_stays_stopped_and_leaves_nothing_running(
    local_cluster: Callable[..., Cluster], data: digits.Split
) -> None:
    cluster = local_cluster(workers=2, ps=1)
    [ps_worker] = cluster.ps_workers()
    # The job waits up to timeout_s for the PS worker to come back; it comes back later than the close.
    job = start_job(cluster, data, replicas=2, aggregate=None, checkpoint_every=20, timeout_s=TIMEOUT)
    wait_for_step(job, 30)
    restart_later(cluster, "ps-0", TIMEOUT)
    kill_worker(cluster, ps_worker)
    wait_for_event(job, "did not answer")
    job.close()
    # close() ended the supervisor's wait for the new server: nothing of the job goes on after it.
    thread = job._supervisor.thread
    assert thread is not None and not thread.is_alive(), job.events
    assert job.status == "stopped", job.events
    assert job._state.ps is None and job._state.error is None
    events = "\n".join(job.events)
    assert (
        f"the job was closed while its parameter server(s) {job._state.addresses[0]} restarted: they are not "
        "restarted, and the job stays stopped" in events
    ), events
    assert "could not be restarted" not in events
    assert job.events[-1].endswith("the job is stopped"), job.events
