"""A job's view of the cluster's workers: which one was lost or joined, and what ran there.

The supervisor asks ``look()`` every ``WORKERS_POLL_S`` (and before it acts on
a lost replica, so that "lost worker" comes before what the job did about
it). Polling the scheduler (two small calls) rather than a SchedulerPlugin:
it needs no code of ours on the scheduler, which a cluster someone else
started (``Cluster.connect``, ``from_client``) may not have, and nothing to
remove when the job ends.

Examples
--------
>>> WORKERS_POLL_S  # seconds between two looks
0.5
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from .cluster import WorkerInfo
from .job_state import JobState

# How often the job looks at the cluster's workers, to say which one was lost or joined.
WORKERS_POLL_S = 0.5


class WorkerWatch:
    """The workers as of the last look, when each was last seen, and where each replica runs."""

    def __init__(self, state: JobState) -> None:
        self.state = state
        self.workers: dict[str, WorkerInfo] = {}
        self.lost: dict[str, WorkerInfo] = {}  # the workers found gone, as they were last seen
        self.replica_at: dict[int, str] = {}  # where each replica's task said it runs, as it started
        self._placed: dict[int, str] = {}  # replica_at as of the last look
        self._last_seen: dict[str, float] = {}

    def look(self) -> bool:
        """Compare the cluster's workers and where the replicas run with the last look; say what changed.

        False when the scheduler did not answer: what depends on the look (a lost replica's new place, the
        event that it runs again) waits for the next one, so that events keep the order things happened in.
        """
        try:
            rows = self.state.cluster.workers()
        except Exception:  # noqa: BLE001 - the scheduler busy or the cluster closing: look again next time
            return False
        now = time.monotonic()
        current = {w.address: w for w in rows}
        gone = [a for a in self.workers if a not in current]
        for address in gone:
            self.lost[address] = self.workers[address]
            self.state.event(self._lost_worker(self.workers[address], now, gone))
        for address, info in current.items():
            if self.workers and address not in self.workers:
                self.state.event(f"worker {address} joined (name {info.name}, role {info.role}, task {info.task})")
        self.workers = current
        self._placed = dict(self.replica_at)
        self._last_seen.update(dict.fromkeys(current, now))
        return True

    def describe(self, address: str) -> str:
        """``tcp://... (name worker-1, role worker, task 1)``, as far as the last look knows it."""
        there = self.workers.get(address)
        return f"{address} (name {there.name}, role {there.role}, task {there.task})" if there else address

    def ps_host(self, shard: int) -> WorkerInfo | None:
        """The PS worker of ``shard`` (the last one lost first: it may have gone before its server was found silent;
        an earlier one lost hosted an earlier server)."""
        lost = reversed(self.lost.values())
        found = [w for w in (*lost, *self.workers.values()) if w.role == "ps" and w.task == shard]
        return found[0] if found else None

    def _lost_worker(self, info: WorkerInfo, now: float, gone: Sequence[str]) -> str:
        """The event for a lost worker: who it was, what ran there, and what happens next."""
        state = self.state
        ago = now - self._last_seen.get(info.address, now)
        text = (
            f"lost worker {info.address} (name {info.name}, role {info.role}, task {info.task}; "
            f"last seen {ago:.1f} s ago)"
        )
        if info.role == "ps":
            return (
                text + f", which hosted shard {info.task} of the job's parameter servers: once Dask restarts the "
                f"worker (its nanny does when the process died; a worker cut off stays away), the job restarts the "
                f"server there and restores the last checkpoint; it waits up to timeout_s={state.spec.timeout_s:g} s"
            )
        # Where the replicas ran at the last look: a lost replica may be running again elsewhere by now. A replica
        # that said where it runs only since then (a worker lost in the job's first moments) is where it said.
        futures = state.futures
        placed = {**self.replica_at, **self._placed}
        lost = sorted(i for i, a in placed.items() if a == info.address and futures[i].status != "finished")
        if not lost:
            return text + f", which ran no replica of job {state.job_id}: nothing to do"
        running = [i for i, f in enumerate(futures) if i not in lost and not f.done() and placed.get(i) not in gone]
        text += (
            f", which ran replica {', '.join(map(str, lost))}: the job runs it again on an idle training worker "
            "(the restarted one once it is back) or else the least loaded, where it rejoins at the servers' "
            f"global step; meanwhile {len(running)} replica(s) go on"
        )
        k = state.training.replicas_to_aggregate
        if state.training.mode == "sync":
            text += f" ({k} gradients make a step" + (", so the job waits for it)" if len(running) < k else ")")
        return text


__all__ = ["WORKERS_POLL_S", "WorkerWatch"]
