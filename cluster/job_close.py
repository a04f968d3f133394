"""Ending a job in order: its replicas told to stop and given a moment to end their step, the supervisor's thread
ended, the tasks left cancelled, the Dask topics and variable removed, the servers stopped.

``Supervisor.close`` runs ``close_job``; so does ``Cluster.close`` (through
the job's ``close``) before it shuts the workers down. Each step has a
deadline, and one that fails does not keep the next from running: the
cluster may be closing under the job (a Ctrl-C ends both), so the errors of
a cluster that is going (``CLOSE_ERRORS``) are let pass. Not
``AttributeError``: a closed cluster is asked (``cluster.closed``), never
guessed from a missing attribute, so a bug here is raised.

Examples
--------
>>> STOP_GRACE_S, WATCHER_JOIN_S  # seconds the replicas get to end their step; the thread, to end
(5.0, 10.0)
>>> AttributeError in CLOSE_ERRORS
False
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any

from .calls import CALL_TIMEOUT_S, call_with_deadline
from .errors import ClusterError, ParameterServerError
from .job_state import JobState
from .job_tasks import ps_variable, replicas_topic, worker_log_topic
from .replica import metrics_topic

# How long close_job waits for the supervisor's thread to end; it is busy with at most one call, each with a
# deadline.
WATCHER_JOIN_S = 10.0
# How long close_job lets the replicas end their step before it cancels their tasks.
STOP_GRACE_S = 5.0
# How long close_job waits for the servers' plugin to be taken off the workers when the servers stopped answering:
# the scheduler forgets it at once and live workers answer in milliseconds, while a stopped (SIGSTOP) or cut-off
# worker would hold the call for CALL_TIMEOUT_S (a close took 30 s).
LOST_SERVERS_STOP_S = 2.0
# What close_job lets pass while it ends the job: see the module's docstring.
CLOSE_ERRORS = (ClusterError, ParameterServerError, OSError, TimeoutError, RuntimeError)


def close_job(state: JobState, thread: threading.Thread | None) -> None:
    """End the job of ``state``, whose supervisor runs on ``thread`` (None: not started), in order: replicas told
    to stop, the supervisor's thread ended, tasks cancelled, servers stopped. Closing twice does nothing more."""
    if state.closed.is_set():
        return
    # Closed while it trains (job.close(), %cluster down, the cluster closing): its replicas end early, so the job
    # is stopped; without this its status read "finished" at whatever step it had reached.
    training = bool(state.futures) and not state.ended()
    if training:
        state.stopping = True
    # Servers that stopped answering (the job failed of it, or waits for their restart) are asked nothing: each call
    # would wait its whole deadline (a close during a hung server's recovery took 40 s with timeout_s=5).
    unanswered = state.servers_lost or state.recovering
    state.closed.set()
    cluster = state.cluster
    client, name = cluster.client, ps_variable(state.job_id)
    # A closed cluster took the tasks and the servers with it; a lost scheduler cannot be asked anything (Dask's
    # client raised ClosedClientError from cancel, out of job.close()).
    live = not cluster.closed and cluster.scheduler_gone() is None
    if live and not all(f.done() for f in state.futures):
        let_replicas_end(state, ask_servers=not unanswered)
    # The thread ends at its next look; waited for (not forever) so that it cannot take the cancelled tasks
    # below for lost ones and submit them again.
    if thread is not None and thread is not threading.current_thread():
        thread.join(timeout=WATCHER_JOIN_S)
    if live:
        with contextlib.suppress(*CLOSE_ERRORS):
            # Only those still running: cancelling a finished task would turn its future's status to cancelled.
            running = [f for f in state.futures if not f.done()]
            call_with_deadline(lambda: client.cancel(running), f"cancel job {state.job_id}'s replicas")
        # A finished replica's result (a few numbers, already read) is pinned on its worker while its future is
        # held; should that worker go later, Dask would run the replica again to get it back.
        for i in range(len(state.futures)):
            state.failure(i)  # kept for job.wait() and job.status
            state.futures[i].release()
        for topic in (metrics_topic(state.job_id), replicas_topic(state.job_id), worker_log_topic(state.job_id)):
            with contextlib.suppress(*CLOSE_ERRORS, ValueError):
                client.unsubscribe_topic(topic)
    if training:
        # The step it stopped at, read from the servers once its replicas have ended: the supervisor's last look
        # (state.step) is up to a second old, and the monitor had shown a later step than the event told.
        with contextlib.suppress(*CLOSE_ERRORS):
            if live and state.ps is not None and not unanswered:
                state.step = call_with_deadline(state.global_step, f"read job {state.job_id}'s global step", 5.0)
        state.event(f"closed while training, at global step {state.step}: the job is stopped")
    with contextlib.suppress(*CLOSE_ERRORS):
        if state.ps is not None:
            state.ps.close()
    if live:
        with contextlib.suppress(*CLOSE_ERRORS):
            if state.addresses:
                call_with_deadline(
                    lambda: distributed_variable(name, client).delete(), f"delete the Dask variable {name}"
                )
        with contextlib.suppress(*CLOSE_ERRORS):
            cluster.stop_parameter_servers(state.job_id, LOST_SERVERS_STOP_S if unanswered else CALL_TIMEOUT_S)
    state.ps = None


def let_replicas_end(state: JobState, ask_servers: bool = True) -> None:
    """Tell the replicas to stop and give them ``STOP_GRACE_S`` to end their step: a task cancelled while it
    runs makes its worker log a warning (into the user's cells), and one cut off with its worker, a kill. Without
    ``ask_servers`` (they stopped answering) the servers are not told to make steps of one gradient."""
    with contextlib.suppress(*CLOSE_ERRORS):
        call_with_deadline(state.signal_stop, f"tell job {state.job_id}'s replicas to stop")
    if ask_servers:
        with contextlib.suppress(*CLOSE_ERRORS):
            # A sync replica that has pushed waits for the others' gradients: one makes a step from now on.
            call_with_deadline(
                lambda: state.set_replicas_to_aggregate(1, "the job is closing"), f"reconfigure job {state.job_id}"
            )
    deadline = time.monotonic() + STOP_GRACE_S
    while not all(f.done() for f in state.futures) and time.monotonic() < deadline:
        time.sleep(0.05)


def distributed_variable(name: str, client: Any) -> Any:
    """The ``distributed.Variable`` ``name`` (where the job publishes its servers' addresses) on ``client``."""
    import distributed

    return distributed.Variable(name, client=client)


__all__ = [
    "CLOSE_ERRORS",
    "LOST_SERVERS_STOP_S",
    "STOP_GRACE_S",
    "WATCHER_JOIN_S",
    "close_job",
    "distributed_variable",
    "let_replicas_end",
]
