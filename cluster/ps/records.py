"""What a parameter-server shard's store reports and keeps per caller: outcomes, counters, state, waiters.

Plain records, apart from ``Waiter`` (a call awaiting a step, settled from any
thread on its event loop) and ``Replica`` (what the store has seen of one
replica). ``store.py`` holds the rules that produce them.

Examples
--------
>>> replica = Replica()
>>> replica.saw_push(0); replica.saw_push(1)
>>> replica.stats(7).pushes, replica.stats(7).last_step
(2, 1)
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from ..errors import ParameterServerError

# Weight of the newest interval in a replica's smoothed push interval: recent
# enough to show a straggler within a few steps, smooth enough not to flicker.
RATE_SMOOTHING = 0.2


@dataclass(frozen=True)
class PushOutcome:
    """What became of one pushed gradient.

    ``status`` is ``"applied"`` when this push caused an update,
    ``"aggregated"`` when (sync) it was counted and the update waits for other
    replicas, ``"stale"`` when it was dropped, and ``"skipped"`` (``nonfinite="skip_step"``)
    when its step's update was dropped for a NaN or Inf gradient. ``global_step`` is the
    shard's step after the push; ``staleness`` is how many steps behind the
    push's step was (0 when fresh).
    """

    status: Literal["applied", "aggregated", "stale", "skipped"]
    global_step: int
    staleness: int


@dataclass(frozen=True)
class ReplicaStats:
    """What the store has seen of one replica; ``steps_per_second`` is 0.0 until its second push."""

    replica_id: int
    last_step: int
    pushes: int
    last_seen: float
    steps_per_second: float


@dataclass(frozen=True)
class StoreStats:
    """Counters and versions of a shard, for monitoring (one consistent snapshot)."""

    global_step: int
    versions: dict[str, int]
    pushes_applied: int
    pushes_stale: int
    pushes_rejected: int
    updates: int
    replicas: dict[int, ReplicaStats]
    steps_skipped: int = 0  # nonfinite="skip_step": updates dropped for a NaN or Inf gradient
    last_skipped: str = ""  # which step, replica and variable the last one was


@dataclass(frozen=True)
class StoreState:
    """What a checkpoint holds: the step, the versions, and every variable and slot.

    ``tensors`` is keyed by variable name and by ``"name/slot"`` for slots
    (``"w/momentum"``, ``"w/m"``, ``"w/v"``, ``"w/t"``).
    """

    global_step: int
    versions: dict[str, int]
    tensors: dict[str, np.ndarray]


@dataclass(eq=False)
class Waiter:
    """A call awaiting global step ``step`` on ``loop``: ``future`` gets the global step, or the error that ended the wait."""

    step: int
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[int]

    def settle(self, outcome: int | ParameterServerError) -> None:
        """Resolve the future from any thread (once; a cancelled call's future is left alone)."""

        def settle() -> None:
            if self.future.done():
                return
            if isinstance(outcome, ParameterServerError):
                self.future.set_exception(outcome)
            else:
                self.future.set_result(outcome)

        if not self.loop.is_closed():
            self.loop.call_soon_threadsafe(settle)


@dataclass
class Replica:
    """The mutable record behind ``ReplicaStats``."""

    last_step: int = -1
    pushes: int = 0
    last_seen: float = field(default_factory=time.time)
    last_tick: float = 0.0  # perf_counter() at the last push: wall-clock time can jump
    interval: float = 0.0  # smoothed seconds between pushes

    def saw_push(self, step: int) -> None:
        now = time.perf_counter()
        if self.pushes == 1:
            self.interval = now - self.last_tick
        elif self.pushes > 1:
            self.interval += RATE_SMOOTHING * (now - self.last_tick - self.interval)
        self.last_step, self.last_tick, self.last_seen = step, now, time.time()
        self.pushes += 1

    def stats(self, replica_id: int) -> ReplicaStats:
        rate = 1.0 / self.interval if self.pushes >= 2 and self.interval > 0 else 0.0
        return ReplicaStats(replica_id, self.last_step, self.pushes, self.last_seen, rate)
