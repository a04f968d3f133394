"""The calls a parameter-server shard parks until its global step reaches theirs.

A parked call is a future on the caller's event loop (``records.Waiter``), not
a thread: thousands of replicas' pulls can wait for the next step on one
server. The store releases them as its step advances, and ends them all with
an error when a restore or a stopping server makes their step meaningless.

Examples
--------
>>> import asyncio, threading
>>> waiters = StepWaiters(threading.Condition())
>>> async def wait_then_release() -> int:
...     waiter = waiters.park(3)
...     waiters.release(3)
...     return await waiters.outcome(waiter, timeout=1.0)
>>> asyncio.run(wait_then_release()), len(waiters)
(3, 0)
"""

from __future__ import annotations

import asyncio
import math
import threading

from ..errors import ParameterServerError
from .records import Waiter


def check_timeout(timeout: float) -> None:
    """Refuse a wait's ``timeout`` unless it is a finite number of seconds, 0 or more."""
    if not (math.isfinite(timeout) and timeout >= 0):
        raise ParameterServerError(
            f"timeout must be a finite number of seconds, 0 or more, got {timeout}", "INVALID_ARGUMENT"
        )


class StepWaiters:
    """The calls awaiting a later global step of one store.

    They share the store's lock (a re-entrant ``Condition``), so the store
    checks its step and parks a call in one critical section, and releases the
    waiters in the one that advances the step: no call can park in between
    and miss its step.
    """

    def __init__(self, lock: threading.Condition) -> None:
        self._lock = lock
        self._waiters: set[Waiter] = set()

    def __len__(self) -> int:
        """How many calls are parked now."""
        with self._lock:
            return len(self._waiters)

    def park(self, step: int) -> Waiter:
        """Park the running coroutine's call until global step ``step``; the caller checked it is ahead."""
        loop = asyncio.get_running_loop()
        waiter = Waiter(step, loop, loop.create_future())
        with self._lock:
            self._waiters.add(waiter)
        return waiter

    async def outcome(self, waiter: Waiter, timeout: float) -> int:
        """The global step that released ``waiter``, or raise the error that ended its wait.

        Raises ``TimeoutError`` after ``timeout`` seconds (the store words the
        deadline). The waiter is forgotten however the wait ends, a cancelled
        call included.
        """
        try:
            async with asyncio.timeout(timeout):
                return await waiter.future
        finally:
            with self._lock:
                self._waiters.discard(waiter)

    def release(self, global_step: int) -> None:
        """Settle every waiter whose step ``global_step`` has reached."""
        with self._lock:
            for waiter in [w for w in self._waiters if global_step >= w.step]:
                self._waiters.discard(waiter)
                waiter.settle(global_step)

    def abort(self, error: ParameterServerError) -> int:
        """End every parked call with ``error``; return how many there were."""
        with self._lock:
            waiters, self._waiters = self._waiters, set()
            for waiter in waiters:
                waiter.settle(error)
            return len(waiters)
