"""A parameter server's own checkpoints: every ``checkpoint_every`` global steps, written in the background.

The store copies its shard at exactly each multiple of the step (under its
lock, so every shard of a sync job copies the same step); this writer puts the
copy on disk on a thread of its own, so pushes are not held up by the disk.
One copy waits at most: when the disk is slower than the steps, a newer copy
replaces the waiting one (the checkpoint that matters after a crash is the
newest complete one).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from ..errors import CellgraphError
from .store import StoreState

# How long close() lets a write in progress finish.
CLOSE_TIMEOUT_S = 30.0


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

    def offer(self, state: StoreState) -> None:
        """Write ``state`` soon; it replaces a state offered earlier and not yet started."""
        with self._wake:
            if self._closed:
                return
            self._pending = state
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
            else:
                self.error = ""
            finally:
                with self._wake:
                    self._busy = False
                    self._wake.notify_all()

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
        if self._thread is not None:
            self._thread.join(timeout)
