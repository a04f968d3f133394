"""What a running job's handle (``Job``) and its supervisor share: one ``JobState``.

The handle reads it (status, metrics, events, checkpoints) and asks for
changes (stop, scale, close); the supervisor's thread and the Dask event
callbacks write it. ``lock`` guards the lists that several threads append
to; the rest is written by one thread at a time (the supervisor's, or the
caller's before the supervisor starts and after it has ended).

Examples
--------
>>> from types import SimpleNamespace
>>> lost_with_worker(SimpleNamespace(status="cancelled")), lost_with_worker(SimpleNamespace(status="finished"))
(True, False)
"""

from __future__ import annotations

import dataclasses
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from .cluster import Cluster
from .errors import ParameterServerError
from .job_spec import JobSpec
from .job_tasks import ReplicaFailure
from .placed_training import PlacedTraining
from .ps import ParameterClient, TrainingConfig
from .replica import ReplicaSpec

Status = Literal["starting", "running", "finished", "failed", "stopped"]
# The deadline of fetching a finished replica task's result from its worker.
RESULT_TIMEOUT_S = 10.0


@dataclass(eq=False)
class JobState:
    """One job's shared state; see the module's docstring for who writes what."""

    job_id: str
    cluster: Cluster = field(repr=False)
    spec: JobSpec = field(repr=False)
    checkpoint_dir: Path
    token: str = field(repr=False)
    stop_name: str
    log_path: Path
    training: TrainingConfig
    replicas: int
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    metrics: list[dict[str, Any]] = field(default_factory=list, repr=False)
    events: list[str] = field(default_factory=list, repr=False)
    checkpoints: list[str] = field(default_factory=list)
    ps: ParameterClient | None = field(default=None, repr=False)
    addresses: list[str] = field(default_factory=list)
    placed: PlacedTraining | None = field(default=None, repr=False)  # the placed step (supervisor.start)
    # The ps tasks the placement gave a part of the model: the job's servers are the first this many.
    ps_shards: int = 0
    generation: int = 0
    futures: list[Any] = field(default_factory=list, repr=False)
    shards: list[list[Any]] = field(default_factory=list, repr=False)
    specs: list[ReplicaSpec] = field(default_factory=list, repr=False)
    removed: set[int] = field(default_factory=set)  # replicas job.scale told to leave
    # Replicas that did not end once the job had reached its last step (hung): their tasks cancelled, the job ended
    # without them (ReplicaSet.abandon_hung).
    abandoned: set[int] = field(default_factory=set)
    stopping: bool = False
    starting: bool = False  # the job's start thread runs (Job._start): servers, model, replicas
    compiling: str = ""  # while job_compile compiles the step here: 'compiling kernels 12 (conv.im2col)'
    closed: threading.Event = field(default_factory=threading.Event, repr=False)
    error: BaseException | None = None
    # Where the servers were last saved (what a restarted one restores), and the global step as last read.
    restore_point: str = ""
    restore_step: int = -1
    step: int = 0
    step_time: float = field(default_factory=time.monotonic)
    step_rate: float = 0.0
    recovering: bool = False  # the supervisor waits for a lost parameter server's restart (ps_recovery)
    # The job failed because its parameter servers stopped answering for good: nothing asks them anything again (each
    # call would wait its whole deadline), and job.global_step()/ps_stats() answer at once from what was known.
    servers_lost: bool = False
    # The supervisor's thread follows the job: once the replicas have ended it writes the final checkpoint, which
    # may fail the job (a PS lost at the end), so until it is done the job is running, not finished.
    watching: bool = False
    k_unsent: str | None = None  # why set_replicas_to_aggregate's k has not yet reached every server, if so
    _failures: dict[str, ReplicaFailure | None] = field(default_factory=dict, repr=False)

    def event(self, text: str) -> None:
        """Add a line to ``job.events``, stamped with the time of day."""
        with self.lock:
            self.events.append(f"{time.strftime('%H:%M:%S')} {text}")

    def scheduler_lost(self) -> bool:
        """Whether the cluster's Dask scheduler is gone; if so, the job has failed saying so (once).

        Dask's client cancels every task it holds when it loses its scheduler, and nothing the job would ask of the
        cluster can be answered: the job fails at once. Before, it took the cancelled tasks for replicas lost with
        their workers, waited for idle ones, and failed at its deadline on an ``AttributeError`` of Dask's.
        """
        from .training_graph import TrainingError

        gone = self.cluster.scheduler_gone()
        if gone is None:
            return False
        if self.error is None:
            again = (
                f"cg.train(..., resume_from={self.restore_point!r}) goes on from its last checkpoint"
                if self.restore_point
                else "cg.train(...) starts it again"
            )
            self.error = TrainingError(
                f"job {self.job_id} has failed: {gone}, and the job's replica tasks with it. Is the scheduler still "
                f"running? Once it and its workers are back, join it again (Cluster.connect) and {again}"
            )
            self.event(str(self.error))
        return True

    def failure(self, i: int) -> ReplicaFailure | None:
        """Replica ``i``'s own error, if its task ended with one (``job_tasks.ReplicaFailure``)."""
        future = self.futures[i]
        if future.status != "finished":
            return None
        # Fetched once per task: a finished task's result comes from its worker, and status is read often.
        if future.key not in self._failures:
            try:
                result = future.result(timeout=RESULT_TIMEOUT_S)
            except Exception:  # noqa: BLE001 - the cluster closing: its result is gone, and it is not a failure
                return None
            self._failures[future.key] = result if isinstance(result, ReplicaFailure) else None
        return self._failures[future.key]

    def ended(self) -> bool:
        """Whether every replica has ended; one whose task was lost with its worker will run again, unless the job
        is stopping, has failed or is closed."""
        settled = self.stopping or self.error is not None or self.closed.is_set()
        return all(
            f.done() and (settled or f.status != "cancelled" or i in self.abandoned) for i, f in enumerate(self.futures)
        )

    @property
    def status(self) -> Status:
        if self.starting and self.error is None:
            return "starting"
        failed = any(f.status == "error" and not lost_with_worker(f) for f in self.futures)
        if self.error is not None or failed:
            return "failed"
        if any(self.failure(i) for i in range(len(self.futures))):
            return "failed"
        if not self.ended() or (self.watching and not self.closed.is_set()):
            return "running"  # not "finished" and then "failed" when the final checkpoint fails
        return "stopped" if self.stopping else "finished"

    def active_replicas(self) -> list[int]:
        """The replicas that are part of the job now (not told to leave), in the order they were started."""
        return [i for i in range(len(self.futures)) if i not in self.removed]

    def signal_stop(self) -> None:
        """Tell every replica to finish its step and end."""
        import distributed

        distributed.Event(self.stop_name, client=self.cluster.client).set()

    def set_replicas_to_aggregate(self, k: int, why: str) -> None:
        """Sync mode: tell every shard that ``k`` gradients make a step from now on.

        The job's own config takes ``k`` first, whether or not the servers answer: a server restarted later is
        given it (``ps_recovery`` inits with ``training``). Servers that did not answer are told again at each of
        the supervisor's looks (``resend_replicas_to_aggregate``); the first failure is an event. Before, a
        ``job.scale(1)`` while a server restarted left the restarted server waiting for two gradients a step
        from the one replica left, until the replica gave up.
        """
        if self.training.mode != "sync" or self.ps is None:
            return
        if k == self.training.replicas_to_aggregate and self.k_unsent is None:
            return
        self.training = dataclasses.replace(self.training, replicas_to_aggregate=k)
        try:
            self.ps.reconfigure(k)
        except ParameterServerError as err:
            if self.k_unsent is None:
                self.event(
                    f"could not make steps of {k} gradient(s) ({why}) now: {err}; the job tells the parameter "
                    "servers again until they answer (a restarted one starts with it)"
                )
            self.k_unsent = why
            return
        self.k_unsent = None
        self.event(f"{k} gradient(s) make a step from now on: {why}")

    def resend_replicas_to_aggregate(self) -> None:
        """Tell the servers the job's gradients per step again, if they did not answer the last time."""
        if self.k_unsent is not None:
            self.set_replicas_to_aggregate(self.training.replicas_to_aggregate, self.k_unsent)

    def global_step(self) -> int:
        """The parameter servers' global step (the lowest over the shards)."""
        from .training_graph import TrainingError

        if self.ps is None:
            raise TrainingError(f"job {self.job_id} has no parameter servers")
        return min(s.global_step for s in self.ps.stats())


def lost_with_worker(future: Any) -> bool:
    """Whether a replica's task ended because its worker was lost: Dask forgot it (its data went with the worker)
    or gave it up (``KilledWorker``, the type, not a name: a replica's own error of that name is not one)."""
    if future.status == "cancelled":
        return True
    if future.status != "error":
        return False
    from distributed import KilledWorker

    return isinstance(future.exception(), KilledWorker)


__all__ = ["JobState", "Status", "lost_with_worker"]
