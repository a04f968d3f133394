"""A parameter server's own checkpoints: every ``checkpoint_every`` global steps, written in the background.

The store copies its shard at exactly each multiple of the step (under its
lock, so every shard of a sync job copies the same step); this writer puts the
copy on disk on a thread of its own, so the pushes of that step are not held
up by the disk. One copy waits at most: a newer copy replaces the waiting one
(the checkpoint that matters after a crash is the newest complete one).

The step after a checkpoint's waits for it (``before_push``): a push that
would move the global step past step ``s`` while the copy of ``s`` is still
being written waits until it is on disk (at most ``WRITTEN_WAIT_S``; a write
that fails or takes longer lets training go on, and says so in ``error``).
So a server killed at any moment has a checkpoint at most
``checkpoint_every`` steps old: its replicas lose at most that many steps.
Training pauses only when the disk is slower than the step it overlaps.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

from ..errors import CellgraphError
from .store import StoreState

# How long close() lets a write in progress finish.
CLOSE_TIMEOUT_S = 30.0
# How long a push waits for the checkpoint of the step it would leave behind (see the module).
WRITTEN_WAIT_S = 60.0


class CheckpointWriter:
    """Writes the states it is offered, newest first, one at a time, on a daemon thread.

    ``write`` turns a state into a checkpoint and returns its name; its errors
    are kept in ``error`` (and cleared by the next good write) rather than
    raised, since nobody waits for a background write.
    """

    def __init__(self, write: Callable[[StoreState], str], name: str) -> None:
        self._write = write
        self._name = name
        self._wake = threading.Condition()
        self._pending: StoreState | None = None
        self._busy = False
        self._closed = False
        self._thread: threading.Thread | None = None
        self.error = ""
        # The global steps of the newest state offered, and of the newest written (or given up on: failed,
        # replaced by a newer one, closed). Pushes of an offered step not yet written wait for it on the server's
        # event loop (before_push): futures there, released from the writer's thread.
        self._offered = self._written = -1
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []

    def offer(self, state: StoreState) -> None:
        """Write ``state`` soon; it replaces a state offered earlier and not yet started."""
        with self._wake:
            if self._closed:
                return
            self._pending = state
            self._offered = state.global_step
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            self._wake.notify()

    def _run(self) -> None:
        while True:
            with self._wake:
                while self._pending is None and not self._closed:
                    self._wake.wait()
                if self._pending is None:  # closed, nothing left to write
                    return
                state, self._pending, self._busy = self._pending, None, True
            try:
                self._write(state)
            except (CellgraphError, OSError) as err:
                self.error = f"checkpoint at global step {state.global_step} failed: {err}"
            except Exception as err:  # noqa: BLE001 - this thread must outlive any write: see below
                # A thread that died here would leave every later checkpoint unwritten, and each step after one
                # waiting WRITTEN_WAIT_S for it (before_push), with no word of why.
                self.error = f"checkpoint at global step {state.global_step} failed: {type(err).__name__}: {err}"
            else:
                self.error = ""
            finally:
                with self._wake:
                    self._busy = False
                    self._written = max(self._written, state.global_step)
                    self._wake.notify_all()
                self._release()

    def _release(self) -> None:
        """Wake the pushes waiting for a step written now (from any thread: on the loop they wait on)."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._wake_written)

    def _wake_written(self) -> None:  # on the event loop
        with self._wake:
            written, closed = self._written, self._closed
        still = []
        for step, future in self._waiters:
            if step <= written or closed:
                if not future.done():
                    future.set_result(None)
            else:
                still.append((step, future))
        self._waiters = still

    async def before_push(self, global_step: int, timeout: float = WRITTEN_WAIT_S) -> None:
        """On the server's event loop, before a push at ``global_step``: wait until the checkpoint of that step
        is written, if one was offered and is not yet (see the module); at most ``timeout`` seconds."""
        with self._wake:
            if self._offered != global_step or self._written >= global_step or self._closed:
                return
            self._loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = self._loop.create_future()
        self._waiters.append((global_step, future))
        self._wake_written()  # written meanwhile (between the look above and the future): released at once
        try:
            await asyncio.wait_for(asyncio.shield(future), timeout)
        except TimeoutError:
            self.error = (
                f"the checkpoint at global step {global_step} was not written within {timeout:g} s; "
                "training went on without it"
            )

    def flush(self, timeout: float = CLOSE_TIMEOUT_S) -> bool:
        """Wait until nothing is waiting or being written (at most ``timeout`` s); False on timeout."""
        with self._wake:
            return self._wake.wait_for(lambda: self._pending is None and not self._busy, timeout)

    def close(self, timeout: float = CLOSE_TIMEOUT_S) -> None:
        """Finish what was offered (at most ``timeout`` s), then end the thread."""
        self.flush(timeout)
        with self._wake:
            self._closed = True
            self._wake.notify_all()
        self._release()  # a push waiting for a write that will not come goes on
        if self._thread is not None:
            self._thread.join(timeout)
