"""What a job runs on its training workers, and the Dask names (topics, variables, events) it is reached by.

``replica_task`` is the Dask task of one replica. An error of the replica
itself (data that does not fit the graph, a gradient the servers refuse, a
server that never came back) would happen again wherever it ran, so the task
does not raise it: it returns it, with its traceback, in a ``ReplicaFailure``.
Dask then neither retries the task nor logs "Compute Failed" on the worker
(whose log lands in the user's notebook cells), and the job fails at once,
saying that error and where the traceback went. A lost worker is not such an
error: the scheduler sees it and the job's supervisor replaces the replica.

Examples
--------
>>> replica_stop_name(stop_event_name("job-1a2b"), 2)
'cellgraph-stop-job-1a2b-replica-2'
>>> ps_variable("job-1a2b"), replicas_topic("job-1a2b")
('cellgraph-ps-job-1a2b', 'cellgraph-job-1a2b-replicas')
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import worker_profiler
from .replica import ReplicaSpec, run_replica

# How often a replica looks at the job's stop flag (a call to the scheduler), at most.
STOP_POLL_S = 0.25
# The deadline of a replica's look-up of the servers' published addresses.
LOCATE_TIMEOUT_S = 5.0


def replicas_topic(job_id: str) -> str:
    """The Dask event topic on which each replica task says where it runs, as it starts."""
    return f"cellgraph-{job_id}-replicas"


def ps_variable(job_id: str) -> str:
    """The ``distributed.Variable`` holding job ``job_id``'s current PS addresses: ``{"generation", "addresses"}``."""
    return f"cellgraph-ps-{job_id}"


def worker_log_topic(job_id: str) -> str:
    """The Dask event topic on which workers send the job their log records about its replica tasks."""
    return f"cellgraph-{job_id}-worker-log"


def stop_event_name(job_id: str) -> str:
    """The ``distributed.Event`` that tells every replica of job ``job_id`` to finish its step and end."""
    return f"cellgraph-stop-{job_id}"


def replica_stop_name(stop_event: str, replica: int) -> str:
    """The name of the ``distributed.Event`` that tells one replica to leave the job (``job.scale``)."""
    return f"{stop_event}-replica-{replica}"


@dataclass(frozen=True)
class ReplicaFailure:
    """What a replica task returns instead of raising its own error (see the module's docstring)."""

    replica: int
    worker: str
    error: str
    error_type: str
    traceback: str


class _PolledEvents:
    """Whether any of some ``distributed.Event``s is set (the job's stop flag, and this replica's own, which
    ``job.scale`` sets), read every ``STOP_POLL_S`` by a thread of its own until ``close``.

    Each read is a call to the scheduler. Made by the replica's own thread
    between steps, on two busy cores, those calls held it 20% of the time (a
    profile of a training worker), and a sync job's other replicas waited with
    it; now ``is_set`` only looks at a flag. A read that fails is raised by the
    next ``is_set``, on the replica's thread, as before.
    """

    def __init__(self, *names: str, client: Any = None) -> None:
        import distributed

        self._events = [distributed.Event(name, client=client) for name in names]  # by default the task's client
        for event in self._events:
            _ = event.client  # bound here, on the task's thread: the polling thread has no task context
        self._set = threading.Event()
        self._closed = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._poll, name="cellgraph-stop-poll", daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while True:
            try:
                if any(event.is_set() for event in self._events):
                    self._set.set()
                    return
            except BaseException as err:  # noqa: BLE001 - handed to the replica's thread (is_set)
                self._error = err
                return
            if self._closed.wait(STOP_POLL_S):
                return

    def is_set(self) -> bool:
        if self._error is not None:
            raise self._error
        return self._set.is_set()

    def close(self) -> None:
        """Stop polling; a read under way ends on its own (its thread is a daemon)."""
        self._closed.set()


class _PublishedAddresses:
    """A replica's ``locate``: the addresses the job published in its ``distributed.Variable``."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self) -> tuple[int, list[str]]:
        import distributed

        value = distributed.Variable(self.name).get(timeout=LOCATE_TIMEOUT_S)
        return int(value["generation"]), [str(a) for a in value["addresses"]]


# A replica task's key names its job (ReplicaSet.submit): how a worker's log record is known to be about one.
REPLICA_KEY = re.compile(r"cellgraph-replica-(job-[0-9a-f]+)")
# How Dask's worker log records about itself begin when they are routed to the jobs running on it.
WORKER_TROUBLE = ("Failed to communicate with scheduler during heartbeat",)


class RouteJobRecords(logging.Filter):
    """On a worker: Dask's log records about a replica task go to that task's job (``worker_log_topic``, which the
    job's supervisor writes to its log file and events), not to the worker's stderr, which a notebook shows in
    whatever cell runs at the time."""

    def __init__(self, worker: Any) -> None:
        super().__init__()
        self.worker = worker

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            text = record.getMessage()
        except Exception:  # noqa: BLE001 - a record that cannot be formatted is left to the handler as it is
            return True
        found = REPLICA_KEY.search(text)
        if found is None and text.startswith(WORKER_TROUBLE):
            # About the worker, not a task (a heartbeat the busy scheduler did not answer; Dask tries again): the
            # jobs running here hear it rather than whatever notebook cell runs.
            found = next(
                (REPLICA_KEY.search(str(key)) for key in self._running_keys() if REPLICA_KEY.search(str(key))), None
            )
        if found is None:
            return True
        if record.exc_info:
            text += "\n" + "".join(traceback.format_exception(*record.exc_info))
        message = {"worker": str(self.worker.address), "level": record.levelname, "logger": record.name, "text": text}
        with contextlib.suppress(Exception):  # a worker closing: the record is dropped rather than printed
            self.worker.log_event(worker_log_topic(found[1]), message)
        return False

    def _running_keys(self) -> list[Any]:
        try:
            return list(self.worker.state.tasks)
        except Exception:  # noqa: BLE001 - a worker closing has no state to ask: the record is printed as it is
            return []


def route_job_records(worker: Any) -> None:
    """Put ``RouteJobRecords`` on the handlers of Dask's logger (and the root's) in this worker process, once."""
    for handler in [*logging.getLogger("distributed").handlers, *logging.getLogger().handlers]:
        if not any(isinstance(f, RouteJobRecords) for f in handler.filters):
            handler.addFilter(RouteJobRecords(worker))


def replica_task(
    spec: ReplicaSpec, data: Sequence[np.ndarray], stop_event: str, addresses: str
) -> dict[str, Any] | ReplicaFailure:
    """What runs on a training worker: one replica, until the job's last step or its stop flag."""
    from distributed import get_worker

    worker = get_worker()
    route_job_records(worker)
    worker.log_event(replicas_topic(spec.job_id), {"replica": spec.replica_id, "worker": worker.address})
    stop = _PolledEvents(stop_event, replica_stop_name(stop_event, spec.replica_id))
    try:
        with worker_profiler.paused(worker):  # its samples every 10 ms cost the replica's step (worker_profiler.py)
            return run_replica(spec, data, stop=stop, locate=_PublishedAddresses(addresses))
    except Exception as err:  # noqa: BLE001 - every error of the replica's own goes back to the job, as a value
        return ReplicaFailure(spec.replica_id, worker.address, str(err), type(err).__name__, traceback.format_exc())
    finally:
        stop.close()


__all__ = [
    "ReplicaFailure",
    "ps_variable",
    "replica_stop_name",
    "replica_task",
    "replicas_topic",
    "route_job_records",
    "stop_event_name",
    "worker_log_topic",
]
