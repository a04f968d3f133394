"""A job's view of its parameter servers' ``Stats``: the global step and its rate, the checkpoints they write,
and the updates they skip; and the checkpoints the job asks for itself (``save``).

The supervisor's thread calls ``read()`` every ``WATCH_S``. The servers
checkpoint by themselves at every multiple of ``checkpoint_every``, and each
``Stats`` names only a shard's newest checkpoint: the restore point (what a
restarted server restores, ``ps_recovery``) is the newest one every shard
has written, and ``job.checkpoints`` lists those complete on every shard.
What changed since the last look becomes one event, said once: a checkpoint
written, a checkpoint that failed, updates a shard skipped for a NaN or Inf
gradient (``nonfinite="skip_step"``).

Examples
--------
>>> from types import SimpleNamespace
>>> from cellgraph.protos import parameter_service_pb2 as pb
>>> said = []
>>> watch = StepWatch(SimpleNamespace(event=said.append))  # a stand-in for the job's JobState
>>> stats = [pb.StatsResponse(shard=0, steps_skipped=2, last_skipped="step 7, replica 1, variable w")]
>>> watch.note(stats); watch.note(stats)  # the same count at the next look: said once
>>> print(*said)
parameter server 0 skipped 2 update(s) for a non-finite gradient (2 in all; last: step 7, replica 1, variable w); ...
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from cellgraph.dataflow.errors import CellgraphError
from cellgraph.protos import parameter_service_pb2 as pb

from .job_state import JobState
from .ps_recovery import complete_checkpoints
from .training_graph import TrainingError

# A global step that has not moved for this long, while replicas train, is said as an event (and when it moves
# again): a stopped or hung worker (SIGSTOP, a swapping machine) is not lost, so nothing else would tell.
STALL_S = 10.0


class StepWatch:
    """The servers' step, checkpoints and skipped updates as of the last look; one per job, the supervisor's."""

    def __init__(self, state: JobState) -> None:
        self.state = state
        self._skipped_seen: dict[int, int] = {}  # per shard: the steps_skipped already reported as an event
        self._written_seen = 0  # the checkpoints every shard had written at the last look
        self._checkpoint_errors: set[str] = set()
        self._moved: tuple[int, float] | None = None  # the global step, and when it was first seen (monotonic)
        self._stalled = False  # said that the step stands still, and not yet that it moves again

    def read(self) -> list[pb.StatsResponse]:
        """Every shard's ``Stats``, after noting the global step, how fast it moves (steps per second, smoothed),
        and what ``note`` says; a ``ParameterServerError`` when a shard does not answer."""
        state = self.state
        if state.ps is None:
            raise TrainingError(f"job {state.job_id} has no parameter servers")
        stats = state.ps.stats()
        step, now = min(s.global_step for s in stats), time.monotonic()
        if step > state.step and now > state.step_time:
            rate = (step - state.step) / (now - state.step_time)
            state.step_rate = rate if state.step_rate == 0 else 0.5 * (state.step_rate + rate)
        state.step, state.step_time = step, now
        self.note(stats)
        self._note_stall(stats, step, now)
        return stats

    def _note_stall(self, stats: Sequence[pb.StatsResponse], step: int, now: float) -> None:
        """Say when the global step stands still for ``STALL_S`` while the job trains, naming when each replica
        was last heard from (a push or a join; the one holding it up first), and again when it moves."""
        state = self.state
        if self._moved is None or step != self._moved[0]:
            if self._stalled:
                stood = now - self._moved[1] if self._moved else 0.0
                state.event(f"the global step moves again ({step}), after {stood:.0f} s")
            self._moved, self._stalled = (step, now), False
            return
        if self._stalled or step == 0 or now - self._moved[1] < STALL_S or state.stopping or state.ended():
            return  # step 0: the replicas may still compile their kernels
        self._stalled = True
        seen: dict[int, float] = {}
        for shard in stats:
            for r in shard.replicas:
                seen[r.replica_id] = max(seen.get(r.replica_id, 0.0), r.last_seen_unix)
        active = [i for i in state.active_replicas() if not state.futures[i].done()]
        wall = time.time()
        pushed = sorted((seen.get(i, 0.0), i) for i in active)
        who = ", ".join(
            f"replica {i} last heard from {wall - at:.1f} s ago" if at else f"replica {i} not heard from"
            for at, i in pushed
        )
        training = state.training
        waits = (
            f"in sync mode a step waits for {training.replicas_to_aggregate} gradient(s)"
            if training.mode == "sync"
            else "in async mode each gradient makes a step"
        )
        if step >= state.spec.steps:  # the job's last step is taken: it waits for the replicas to end
            state.event(
                f"the job reached its last step ({step}) {now - self._moved[1]:.0f} s ago and waits for its "
                f"replicas to end: {who}; a stopped or hung worker holds the job's end up (a lost one is replaced), "
                f"until timeout_s={state.spec.timeout_s:g} s after the last step: then the job abandons it"
            )
            return
        state.event(
            f"the global step has stayed at {step} for {now - self._moved[1]:.0f} s: {who or 'no replica runs'}; "
            f"{waits}, so a stopped or hung worker holds the job up (a lost one is replaced); each replica's "
            f"calls give up after timeout_s={state.spec.timeout_s:g} s"
        )

    def note(self, stats: Sequence[pb.StatsResponse]) -> None:
        """Say what changed in the servers' checkpoints and skipped updates since the last look."""
        self._note_checkpoints(stats)
        self._note_skipped_steps(stats)

    def _note_skipped_steps(self, stats: Sequence[pb.StatsResponse]) -> None:
        """Say when a shard dropped an update for a NaN or Inf gradient (``nonfinite="skip_step"``)."""
        for shard, s in enumerate(stats):
            seen = self._skipped_seen.get(shard, 0)
            if s.steps_skipped > seen:
                self._skipped_seen[shard] = s.steps_skipped
                self.state.event(
                    f"parameter server {shard} skipped {s.steps_skipped - seen} update(s) for a non-finite gradient "
                    f"({s.steps_skipped} in all; last: {s.last_skipped}); nonfinite='skip_step' keeps training"
                )

    def _note_checkpoints(self, stats: Sequence[pb.StatsResponse]) -> None:
        """Record the newest checkpoint every shard has written (the restore point), and say why one failed."""
        state = self.state
        written = [(s.latest_checkpoint_step, s.latest_checkpoint) for s in stats]
        if all(name for _, name in written):
            step, name = min(written)  # the shards keep their last few: the oldest newest one is on all of them
            if step > state.restore_step:
                state.restore_point, state.restore_step = name, step
                self._add_checkpoint(name)
                # Each look sees only the newest: a fast job writes several between two looks, so say how many.
                count = min(s.checkpoints_written for s in stats)
                since = f"; {count - self._written_seen} since the last look" if count - self._written_seen > 1 else ""
                self._written_seen = count  # a restarted server counts from 0 again
                state.event(
                    f"checkpoint {name} written (every {state.spec.checkpoint_every} steps{since}) in "
                    f"{state.checkpoint_dir}"
                )
        for s in stats:
            if s.checkpoint_error and s.checkpoint_error not in self._checkpoint_errors:
                self._checkpoint_errors.add(s.checkpoint_error)
                state.event(
                    f"parameter server shard {s.shard}: {s.checkpoint_error}; the job goes on, and a lost server "
                    f"would restart from {state.restore_point or 'the initial values'}"
                )

    def _add_checkpoint(self, name: str) -> None:
        """Refresh ``job.checkpoints`` after the servers wrote ``name``: the checkpoints complete on every shard in
        the folder (the servers' retention deletes old ones), oldest first; where this process cannot read the
        folder (it lives on the PS machines only), the names the servers reported."""
        state = self.state
        existing = complete_checkpoints(state)
        with state.lock:
            if existing is not None:
                state.checkpoints[:] = existing
            elif name not in state.checkpoints:
                state.checkpoints.append(name)

    def save(self, why: str) -> bool:
        """Checkpoint every shard; whether it worked (a failure is an event, and the next look tries again)."""
        state = self.state
        if state.ps is None:
            return False
        try:
            name = state.ps.save()
            state.step = state.global_step()
        except CellgraphError as err:
            state.event(f"checkpoint ({why}) failed: {err}")
            return False
        if "," not in name:  # shards at different steps save under different names: no restore point then
            state.restore_point, state.restore_step = name, max(state.restore_step, state.step)
        self._add_checkpoint(name)
        state.event(f"checkpoint {name} written ({why}) in {state.checkpoint_dir}")
        return True


__all__ = ["StepWatch"]
