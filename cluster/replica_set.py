"""A job's replica tasks: submitted, replaced when their worker is lost, added and removed by ``job.scale``.

A lost training worker. Its replica task is released by the scheduler (a
worker that dies under a task counts against the task's
``allowed-failures``, 3 by default). Its data shard was scattered to that
worker and has no lineage, so Dask forgets the task (its future is
cancelled) rather than run it again; a second copy on another worker would
not help, as the scheduler's active memory manager drops extra replicas
within seconds. So the job submits the replica again itself, with its shard
scattered afresh from this process, on a training worker that runs no task,
as the scheduler sees it (the restarted one, once it is back: the job waits
up to ``IDLE_WORKER_WAIT_S`` for one), else on the least loaded; the event
says which and why. The replica registers again and goes on from the
servers' global step.

Dask never retries a replica task (``retries=0``): a replica's own error
comes back as a value (``job_tasks.ReplicaFailure``) and fails the job.

Examples
--------
>>> MAX_RESUBMITS, IDLE_WORKER_WAIT_S  # a lost replica is submitted again up to 3 times; waits 60 s for an idle worker
(3, 60.0)
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any

from .calls import call_with_deadline
from .job_spec import shard_rows
from .job_state import JobState, lost_with_worker
from .job_tasks import ps_variable, replica_stop_name, replica_task
from .training_graph import TrainingError
from .worker_watch import WorkerWatch

# How many times the job submits a lost replica again before it gives up on the job.
MAX_RESUBMITS = 3
# How long a lost replica waits for an idle training worker (the lost worker's replacement, which its nanny
# starts) before it goes to the least loaded one, where it shares the threads of a running replica.
IDLE_WORKER_WAIT_S = 60.0


class ReplicaSet:
    """The replicas' tasks and where they go; used by the supervisor's thread and by ``job.scale``."""

    def __init__(self, state: JobState, watch: WorkerWatch) -> None:
        self.state = state
        self.watch = watch
        self._resubmits: dict[int, int] = {}
        self._submitted_to: dict[int, str] = {}  # the worker each replica's task was last submitted to
        self._idle_deadline: dict[int, float] = {}  # lost replicas waiting for an idle training worker: until when
        self._pending_k: tuple[int, set[int]] | None = None  # see apply_pending_k
        # Replica tasks that said they started (Dask's event thread appends; the supervisor's thread says so).
        self._started: list[tuple[int, str]] = []
        self._last_step_at: float | None = None  # when the job was first seen at its last step (monotonic)

    def submit(self, i: int, worker: str) -> Any:
        """Send replica ``i``'s shard to ``worker`` and submit its task there (elsewhere if it is gone).

        A NumPy array's rows are scattered from this process; a ``dask.array``'s rows are computed on the
        workers that hold (or load) its partitions, and go from there to the replica's worker.
        """
        state = self.state
        client = state.cluster.client
        where = [worker]
        try:
            held = self._send_shard(i, where)
        except KeyError:
            # The scheduler no longer knows the worker (lost since it was chosen, e.g. while the job starts): the
            # shard goes to the other training workers, and the task with it. Before, the job failed to start with
            # a bare KeyError naming the address.
            where = [w for w in state.cluster.training_workers() if w != worker]
            if not where:
                raise TrainingError(
                    f"replica {i}'s training worker {worker} was lost before its shard reached it, and the cluster "
                    "has no other training worker: start the job again once the worker is back"
                ) from None
            state.event(
                f"replica {i}'s training worker {worker} was lost before its shard reached it: it runs on another "
                "training worker"
            )
            held = self._send_shard(i, where)
        attempt = self._resubmits.get(i, 0)
        self._submitted_to[i] = where[0]
        return client.submit(
            replica_task,
            state.specs[i],
            held,
            state.stop_name,
            ps_variable(state.job_id),
            key=f"cellgraph-replica-{state.job_id}-{i}" + (f"-again-{attempt}" if attempt else ""),
            workers=where,
            allow_other_workers=True,
            pure=False,
            retries=0,
        )

    def _send_shard(self, i: int, workers: list[str]) -> list[Any]:
        """Replica ``i``'s shard, scattered to ``workers`` (a ``dask.array``'s rows computed by the cluster)."""
        import dask.array as da

        client = self.state.cluster.client
        return [
            client.compute(part) if isinstance(part, da.Array) else client.scatter(part, workers=workers, hash=False)
            for part in self.state.shards[i]
        ]

    # ------------------------------------------------------------------ replicas that started
    def on_replica_start(self, event: tuple[float, dict[str, Any]]) -> None:
        """Dask's callback (on its event-loop thread: no blocking call here) when a replica task starts."""
        _, message = event
        with self.state.lock:
            self._started.append((int(message["replica"]), str(message["worker"])))

    def note_starts(self) -> None:
        """Say which replicas run again, after a look at the workers: the lost worker's event comes first."""
        with self.state.lock:
            started, self._started = self._started, []
        if any(i in self.watch.replica_at for i, _ in started) and not self.watch.look():
            with self.state.lock:  # no answer: said at the next look, after what happened before
                self._started[:0] = started
            return
        for i, address in started:
            before, self.watch.replica_at[i] = self.watch.replica_at.get(i), address
            if before is not None:
                self.state.event(
                    f"replica {i} runs again, on {self.watch.describe(address)}: it rejoins the job at the servers' "
                    "global step"
                )

    # ------------------------------------------------------------------ lost replicas
    def replace_lost(self) -> bool:
        """Submit again each replica whose task Dask gave up (it lost its worker); False if the job failed."""
        state = self.state
        for i, future in enumerate(state.futures):
            if state.closed.is_set():
                return True  # close() cancels every replica's task: those are not lost, and not replaced
            if i in state.removed or i in state.abandoned or not lost_with_worker(future):
                continue
            if state.cluster.scheduler_gone() is not None:
                return True  # Dask cancelled every task as it lost its scheduler: the supervisor fails the job
            attempt = self._resubmits.get(i, 0) + 1
            if attempt > MAX_RESUBMITS:
                state.error = TrainingError(
                    f"replica {i} of job {state.job_id} lost its worker {MAX_RESUBMITS + 1} times; the job has failed: "
                    f"job.close() ends it, and cg.train(..., resume_from=...) with a checkpoint of job.checkpoints "
                    "starts again"
                )
                state.event(str(state.error))
                state.signal_stop()
                return False
            first_look = i not in self._idle_deadline
            if first_look:
                self._idle_deadline[i] = time.monotonic() + IDLE_WORKER_WAIT_S
            placement = self._placement(i)
            if placement is None:
                if first_look:
                    state.event(
                        f"replica {i} waits for an idle training worker: every training worker runs a replica; "
                        f"the job waits up to {IDLE_WORKER_WAIT_S:g} s for the lost worker's replacement to join, "
                        "then submits it again on the least loaded one"
                    )
                continue
            target, why = placement
            self._resubmits[i] = attempt
            try:
                state.futures[i] = self.submit(i, target)
            except Exception as err:  # noqa: BLE001 - the scheduler busy: the next look tries again
                self._resubmits[i] -= 1
                state.event(f"could not submit replica {i} again ({err}); the job tries again at its next look")
                continue
            del self._idle_deadline[i]
            state.event(
                f"replica {i}'s task was lost with its worker ({future.status}): submitted again {why}, "
                f"with its shard (attempt {attempt} of {MAX_RESUBMITS})"
            )
        return True

    def _placement(self, i: int) -> tuple[str, str] | None:
        """Where lost replica ``i`` goes, and why: an idle training worker, else (once its wait for one is over)
        the least loaded; None to look again later (no idle one yet, or the scheduler did not answer)."""
        load = self._training_load(i)
        idle = [a for a, tasks in load.items() if tasks == 0]
        if idle:
            return idle[0], f"on idle worker {idle[0]}: no replica runs there"
        if not load or time.monotonic() < self._idle_deadline[i]:
            return None
        least = min(load, key=load.__getitem__)  # the first in task order among equals
        return least, (
            f"on {least}, the least loaded: every training worker runs a replica "
            f"(tasks per worker: {', '.join(f'{a} {n}' for a, n in load.items())})"
        )

    def _training_load(self, i: int) -> dict[str, int]:
        """Tasks per training worker, in task order, as the scheduler sees them now, plus the replicas other than
        ``i`` submitted to a worker that the scheduler has not placed yet; empty when it did not answer."""
        # A look at the workers first: the task was lost because the scheduler removed its worker, and a worker
        # that joined is known by name, so the events say that one left and this one joined before a replica
        # goes there.
        if not self.watch.look():
            return {}
        try:
            processing = self.state.cluster.processing()
        except Exception:  # noqa: BLE001 - the scheduler busy or the cluster closing: look again next time
            return {}
        # Workers in both views: the look keeps its last view when the scheduler does not answer.
        workers = self.watch.workers
        load = {a: len(processing[a]) for a, w in workers.items() if w.role == "worker" and a in processing}
        placed = {key for keys in processing.values() for key in keys}
        for j, future in enumerate(self.state.futures):
            to = self._submitted_to.get(j)
            if j != i and to in load and not future.done() and future.key not in placed:
                load[to] += 1
        return load

    # ------------------------------------------------------------------ hung replicas at the end
    def abandon_hung(self) -> None:
        """Once the job has been at its last step for ``timeout_s``, cancel the replicas still running and end
        without them, saying which and where.

        Every replica that still runs gets an answer within ``timeout_s`` that the last step is taken, and ends:
        one that has not is hung (a stopped worker, a swapping machine), typically a backup worker whose gradients
        the steps did not need. Before, the job stayed ``running`` for as long as it hung (for ever, for a worker
        stopped for good), the trained variables long done.
        """
        state = self.state
        if state.step < state.spec.steps or state.stopping or state.error is not None or state.closed.is_set():
            self._last_step_at = None
            return
        now = time.monotonic()
        if self._last_step_at is None:
            self._last_step_at = now
        hung = [i for i in state.active_replicas() if i not in state.abandoned and not state.futures[i].done()]
        if not hung or now - self._last_step_at < state.spec.timeout_s:
            return
        client = state.cluster.client
        futures = [state.futures[i] for i in hung]
        try:
            call_with_deadline(lambda: client.cancel(futures), f"cancel job {state.job_id}'s hung replicas")
        except Exception as err:  # noqa: BLE001 - the scheduler busy: the next look tries again
            state.event(f"could not cancel hung replica(s) {', '.join(map(str, hung))} ({err}); the job tries again")
            return
        state.abandoned.update(hung)
        where = ", ".join(f"replica {i} on {self.watch.describe(self.watch.replica_at.get(i, '?'))}" for i in hung)
        state.event(
            f"the job reached its last step ({state.step}) and {where} did not end within timeout_s="
            f"{state.spec.timeout_s:g} s: a stopped or hung worker; the job abandons it (its task cancelled) and "
            "ends without it"
        )

    # ------------------------------------------------------------------ job.scale
    def remove(self, leaving: Sequence[int], k: int) -> None:
        """Tell replicas ``leaving`` to leave after their step; ``k`` gradients make a step first."""
        import distributed

        state = self.state
        # Fewer gradients make a step first, so that the replicas that stay never wait for a leaving one.
        state.set_replicas_to_aggregate(k, f"replica(s) {', '.join(map(str, leaving))} leave")
        for i in leaving:
            distributed.Event(replica_stop_name(state.stop_name, i), client=state.cluster.client).set()
            state.removed.add(i)

    def add(self, count: int, replicas: int, k: int, workers: Sequence[str]) -> tuple[list[int], list[str]]:
        """Start ``count`` new replicas on training workers where none runs; ``k`` gradients make a step once
        they have joined. Returns the new replicas and their workers."""
        state = self.state
        active = state.active_replicas()
        busy = {self.watch.replica_at.get(i) for i in active}
        free = [w for w in workers if w not in busy][:count]
        total = state.spec.rows
        per = total // replicas
        if per < state.spec.batch_size:
            raise TrainingError(
                f"job.scale({replicas}): a new replica's shard would have {per} rows ({total} over {replicas}), "
                f"fewer than the batch size {state.spec.batch_size}: ask for fewer replicas"
            )
        added = []
        for n, worker in enumerate(free):
            i = len(state.futures)
            part = (len(active) + n) % replicas
            rows = shard_rows(total, replicas, part)
            state.shards.append([a[rows] for a in state.spec.arrays])
            state.specs.append(dataclasses.replace(state.specs[0], replica_id=i, seed=state.specs[0].seed + i))
            state.futures.append(self.submit(i, worker))
            added.append(i)
        # More gradients make a step once the new replicas have joined (the supervisor sees them register): until
        # then a step does not wait for replicas that are still loading their graph.
        self._pending_k = (k, set(added)) if state.training.mode == "sync" else None
        return added, free

    @property
    def waits_for_k(self) -> bool:
        """Whether ``add`` left a larger number of gradients per step to apply once its replicas have joined."""
        return self._pending_k is not None

    def apply_pending_k(self, stats: Sequence[Any]) -> None:
        """After ``add``: raise the gradients per step once all the new replicas have registered."""
        if self._pending_k is None or self.state.stopping:
            return
        k, waiting = self._pending_k
        joined = {r.replica_id for r in stats[0].replicas}
        if waiting <= joined:
            self._pending_k = None
            self.state.set_replicas_to_aggregate(k, f"replica(s) {', '.join(map(str, sorted(waiting)))} joined")


__all__ = ["IDLE_WORKER_WAIT_S", "MAX_RESUBMITS", "ReplicaSet"]
