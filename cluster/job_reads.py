"""What a ``Job`` asks its parameter servers (the global step, their counters, the trained values), in the
job's words when they cannot answer.

``ServerReads`` is a part of ``Job`` (``cluster/job.py``), kept apart so that
the handle's start, controls and results read on their own: while a server
restarts, and once the job has failed, ``global_step()`` returns the step last
read; the other reads say the server is restarting, or raise the job's error
once it has failed (its scheduler gone, a PS worker lost for good: at once,
without asking servers that would not answer), and a closed job's name its
last checkpoint, never the servers' raw gRPC error.

Examples
--------
>>> from cellgraph.cluster.job import Job
>>> from cellgraph.cluster.job_reads import ServerReads
>>> issubclass(Job, ServerReads), [m for m in ("global_step", "ps_stats", "variables") if hasattr(ServerReads, m)]
(True, ['global_step', 'ps_stats', 'variables'])
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from .errors import ParameterServerError
from .ps import ParameterClient
from .training_graph import TrainingError

if TYPE_CHECKING:
    from .job_state import JobState


class ServerReads:
    """``Job``'s reads of its parameter servers (see the module's docstring)."""

    _state: JobState
    job_id: str
    _read: tuple[int, float]  # global_step()'s last reading, and when (monotonic)

    if TYPE_CHECKING:

        def _started(self, timeout: float | None, what: str) -> None: ...

        def _start_deadline(self) -> float: ...

    def global_step(self) -> int:
        """The parameter servers' global step (the lowest over the shards); waits for a start under way.

        While a parameter server is lost and restarting, or does not answer (gone with its worker or its
        cluster), the step the job last read: as in Ray's or Horovod's elastic jobs, asking how far the job got
        does not fail while it recovers, and ``job.events`` says what happened to the server (a restored
        server goes on from its checkpoint's step, which the next call returns). Once the job has failed, the step
        it last read, at once (its servers may be gone with it). ``TrainingError`` once the job is closed.
        """
        self._started(self._start_deadline(), "job.global_step()")
        state = self._state
        if state.ps is None and state.error is not None and not state.closed.is_set():
            self._client("job.global_step()")  # raises the job's error: it could not start
        # Restarting: the servers' calls would wait up to timeout_s for the one restarting. Failed: the step the job
        # followed until its replicas ended, at once, where servers lost with it made this wait timeout_s.
        if not state.recovering and (state.error is None or state.closed.is_set()):
            try:
                step = state.global_step()
            except ParameterServerError:
                pass  # before, the raw error of the restarting server ('did not answer Stats after 5 attempt(s)')
            else:
                self._read = (step, time.monotonic())
                return step
        # The newer of this handle's last reading and the supervisor's (a restored step may be lower).
        return self._read[0] if self._read[1] > state.step_time else state.step

    def ps_stats(self) -> list[dict[str, Any]]:
        """Each parameter-server shard's counters, in shard order, as plain dicts (for tables and widgets).

        Keys: ``shard``, ``address``, ``global_step``, ``held_bytes`` (its variables and their optimizer slots:
        ``placement.ps_load_bytes()`` of its ``ps`` task), ``bytes_in``, ``bytes_out``, ``updates``,
        ``pushes_applied``, ``pushes_stale``, ``pushes_rejected``, ``steps_skipped`` (dropped for a NaN or Inf
        gradient, ``nonfinite="skip_step"``), ``calls`` (answered calls by RPC name) and ``checkpoints_written``
        (by this server for the job, old ones since deleted included).
        """
        with self._servers_answer("job.ps_stats()"):
            stats = self._client("job.ps_stats()").stats()
        return [
            {
                "shard": s.shard,
                "address": address,
                "global_step": s.global_step,
                "held_bytes": sum(v.bytes + v.slot_bytes for v in s.variables),
                "bytes_in": s.bytes_in,
                "bytes_out": s.bytes_out,
                "updates": s.updates,
                "pushes_applied": s.pushes_applied,
                "pushes_stale": s.pushes_stale,
                "pushes_rejected": s.pushes_rejected,
                "steps_skipped": s.steps_skipped,
                "calls": dict(s.calls),
                "checkpoints_written": s.checkpoints_written,
            }
            for address, s in zip(self._state.addresses, stats, strict=True)
        ]

    @contextlib.contextmanager
    def _servers_answer(self, what: str) -> Iterator[None]:
        """Around a call to the servers: a job that has failed, or a server that restarts, in the job's words.

        The servers of a job whose scheduler is gone (or whose PS worker was lost for good) answer ``CANCELLED`` or
        ``UNAVAILABLE``: the job's own error says what happened, where the servers' raw error named only a socket.
        """
        state = self._state
        restarting = TrainingError(
            f"{what}: a parameter server of job {self.job_id} is restarting (job.events says which); ask again "
            f"once it is back, within timeout_s={state.spec.timeout_s:g} s"
        )
        if state.recovering:  # else the call would wait up to timeout_s for the server that restarts
            raise restarting
        if state.error is not None and state.servers_lost:  # at once: a call would wait timeout_s for no answer
            raise TrainingError(self._gone(what))
        try:
            yield
        except ParameterServerError as err:
            if state.error is None and not state.scheduler_lost() and not state.recovering:
                raise
            if state.error is not None:
                raise TrainingError(self._gone(what)) from err
            raise restarting from err

    def _gone(self, what: str) -> str:
        """The words of a read of a failed job whose servers are gone."""
        return (
            f"{self._state.error}. {what} has nothing to read: the job's parameter servers are gone with it"
            f"{self._kept()}"
        )

    def _kept(self) -> str:
        """Where the job's last checkpoint is, for an error that says its servers are gone."""
        state = self._state
        if not state.checkpoints:
            return ""
        return (
            f"; its last checkpoint is {state.checkpoints[-1]} in {state.checkpoint_dir} (cg.save_model, "
            "cg.onnx.export and %export read values from that folder; cg.train(..., resume_from=) goes on from it)"
        )

    def _client(self, what: str) -> ParameterClient:
        self._started(self._start_deadline(), what)
        state = self._state
        if state.ps is None and state.error is not None and not state.closed.is_set():
            # A job that could not start: its own error, where 'is closed' (or 'has no parameter servers') misled.
            raise TrainingError(f"{state.error}. {what} has nothing to read: the job has no parameter servers")
        if state.ps is None:
            raise TrainingError(f"job {self.job_id} is closed: its parameter servers are gone{self._kept()}")
        return state.ps

    def variables(self) -> dict[str, np.ndarray]:
        """The trained values of every variable, from the parameter servers."""
        with self._servers_answer("job.variables()"):
            return self._client("job.variables()").pull().values


__all__ = ["ServerReads"]
