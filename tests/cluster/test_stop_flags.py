"""A replica's stop flags (the job's and its own, ``distributed.Event``s) are read by a thread of their own.

Each read is a call to the scheduler; the replica's training thread only looks at a flag.
"""

from __future__ import annotations

import threading
import time

import distributed
import pytest

from cellgraph.cluster.job_tasks import STOP_POLL_S, _PolledEvents

DEADLINE_S = 30.0


def watch_flags(job: str, own: str) -> dict[str, object]:
    """In a task, as a replica does: poll both flags until one is set; what the replica's thread saw."""
    stop = _PolledEvents(job, own)
    try:
        began, seen_unset = time.monotonic(), stop.is_set()
        while not stop.is_set():
            if time.monotonic() - began > DEADLINE_S:
                return {"seen": False}
            time.sleep(0.01)
        return {"seen": True, "first": seen_unset, "pollers": _pollers()}
    finally:
        stop.close()


def _pollers() -> int:
    return sum(t.name == "cellgraph-stop-poll" and t.is_alive() for t in threading.enumerate())


def test_a_flag_set_by_the_client_is_seen_by_the_task_and_the_poller_ends(client: distributed.Client) -> None:
    future = client.submit(watch_flags, "job-stop", "job-stop-replica-0", pure=False)
    time.sleep(3 * STOP_POLL_S)  # the task polls a few times, finding nothing
    assert not future.done()
    distributed.Event("job-stop-replica-0", client=client).set()  # what job.scale does to one replica
    result = future.result(timeout=DEADLINE_S)
    assert result["seen"] and result["first"] is False
    deadline = time.monotonic() + DEADLINE_S
    while client.run(_pollers)[next(iter(client.scheduler_info()["workers"]))] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert client.run(_pollers) == {address: 0 for address in client.scheduler_info()["workers"]}


def test_a_read_that_fails_is_raised_on_the_replicas_thread(client: distributed.Client) -> None:
    # A client that was closed cannot ask the scheduler: the poller's error reaches the replica's thread.
    dead = distributed.Client(client.cluster)
    dead.close()
    stop = _PolledEvents("job-stop", client=dead)
    try:
        deadline = time.monotonic() + DEADLINE_S
        with pytest.raises(Exception) as caught:  # noqa: PT011 - whatever distributed raises, the replica sees it
            while time.monotonic() < deadline:
                stop.is_set()
                time.sleep(0.01)
        assert caught.value is stop._error
    finally:
        stop.close()
