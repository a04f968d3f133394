"""A start of worker processes that Kernel > Interrupt may cut short: one line in the cell, and nothing left running.

Jupyter interrupts a kernel by sending SIGINT to its whole process group.
During ``%cluster up`` that cuts ``Cluster.local`` short, which closes what it
had started (its own cleanup); but the cell filled with some 300 lines: the
``KeyboardInterrupt`` through Dask's insides, the ``KeyboardInterrupt`` of
each worker process still importing Dask (it ignores SIGINT only once started,
``cluster/worker_signals.py``), each worker's traceback as its start was
cancelled ("Process Dask Worker process (from Nanny): ... CancelledError ...
Queue not closed"), and the kernel's Dask and Tornado loggers' errors about
workers that died while starting.

``InterruptibleStart`` is the context a start runs in. The processes spawned
within it get a pipe as their stderr, which a relay thread copies to the
kernel's own stderr (the cell, as before) for as long as they live, each
chunk held ``HOLD_S`` while the start lasts; Dask's log handlers hold their
records until the start ends. SIGINT first marks the start interrupted, then
raises ``KeyboardInterrupt`` as before: from then on the relay drops what
those processes print, the held records are dropped, and logging is off until
the context exits. ``cleanup()`` then waits for the worker processes spawned
within (``multiprocessing``'s ``spawn_main``) to end, stops any left after
``EXIT_TIMEOUT_S``, and says so in words.

Examples
--------
>>> with InterruptibleStart() as start:
...     pass  # Cluster.local(...) in %cluster up
>>> start.interrupted, start.cleanup()
(False, 'its worker processes have ended')
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import threading
import time
from collections.abc import Callable
from types import FrameType, TracebackType
from typing import Any

import psutil

# How long the worker processes of an interrupted start have to end after its own cleanup; then they are stopped.
EXIT_TIMEOUT_S = 10.0
RELAY_CHUNK = 65536  # bytes read from the pipe at a time
# How long the spawned processes' output waits, while the start lasts, for an interrupt that would drop it.
HOLD_S = 0.5
# After an interrupted scale has settled, how long Dask's task gets to log the workers that died (logging off).
SETTLE_S = 1.0
HELD_LOGGERS = ("distributed", "tornado")  # whose handlers (Dask's) hold their records while the start lasts


class InterruptibleStart:
    """The context of a start that spawns worker processes (see the module's docstring)."""

    def __init__(self) -> None:
        self.interrupted = False
        self._before: set[int] = set()
        self._spawned: dict[int, psutil.Process] = {}  # the worker processes alive when the interrupt came
        self._previous_handler: Any = None
        self._handler_set = False
        self._saved_stderr = -1
        self._disabled: int | None = None  # logging's level of disable() before the interrupt
        self._starting = False  # within the context: the relay holds what it reads for HOLD_S
        # Dask's log handlers (on its loggers and Tornado's), each with the filter that holds its records.
        self._held_logs: list[tuple[logging.Handler, logging.LogRecord]] = []
        self._log_filters: list[tuple[logging.Handler, Callable[[logging.LogRecord], bool]]] = []

    def __enter__(self) -> InterruptibleStart:
        self._before = {p.pid for p in psutil.Process().children(recursive=True)}
        if threading.current_thread() is threading.main_thread():  # only the main thread gets and sets signals
            self._previous_handler = signal.signal(signal.SIGINT, self._on_interrupt)
            self._handler_set = True
        self._starting = True
        self._hold_logs()
        if os.name == "posix":  # select() on a pipe; elsewhere the workers write to the kernel's stderr as before
            self._relay_stderr()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self._starting = False
        if self._saved_stderr >= 0:
            os.dup2(self._saved_stderr, 2)  # processes spawned from now on write to the kernel's stderr again
            os.close(self._saved_stderr)
            self._saved_stderr = -1
        if self._handler_set:
            signal.signal(signal.SIGINT, self._previous_handler)
            self._handler_set = False
        if self._disabled is not None:
            logging.disable(self._disabled)
            self._disabled = None
        for handler, hold in self._log_filters:
            handler.removeFilter(hold)
        self._log_filters = []
        held, self._held_logs = self._held_logs, []
        if not self.interrupted:  # a start that went through: its records, in order, now
            for handler, record in held:
                handler.handle(record)

    def _hold_logs(self) -> None:
        """Hold what Dask's handlers get until the context ends: a worker's death is logged by the kernel's
        Nanny as the SIGINT kills it, which may be before the kernel's own handler has run."""
        names = [n for n in list(logging.Logger.manager.loggerDict) if n.split(".")[0] in HELD_LOGGERS]
        handlers = {id(h): h for name in names for h in logging.getLogger(name).handlers}
        for handler in handlers.values():

            def hold(record: logging.LogRecord, handler: logging.Handler = handler) -> bool:
                self._held_logs.append((handler, record))
                return False

            handler.addFilter(hold)
            self._log_filters.append((handler, hold))

    def _on_interrupt(self, signum: int, frame: FrameType | None) -> None:
        if not self.interrupted:
            self.interrupted = True
            self._spawned = {p.pid: p for p in self._workers()}
            # The start's own cleanup logs each worker that dies while it starts: that is the interrupt's doing.
            self._disabled = logging.root.manager.disable
            logging.disable(logging.CRITICAL)
        raise KeyboardInterrupt

    def _relay_stderr(self) -> None:
        """Put a pipe on fd 2, which processes spawned from now on inherit, and copy it to the real fd 2."""
        read_end, write_end = os.pipe()
        self._saved_stderr = os.dup(2)
        target = os.dup(2)  # the relay's own copy: it outlives the context, as the processes do
        os.dup2(write_end, 2)
        os.close(write_end)
        threading.Thread(
            target=self._relay, args=(read_end, target), name="cellgraph-start-stderr", daemon=True
        ).start()

    def _relay(self, read_end: int, target: int) -> None:
        # Runs until every process holding the pipe has exited. It always reads, so that no process ever blocks
        # on a full pipe; a write that fails drops that chunk. SIGINT reaches the workers and the kernel at once,
        # but the kernel's handler runs only when its main thread next runs Python: while the start lasts, each
        # chunk waits HOLD_S before it is copied, so that a worker's KeyboardInterrupt traceback is dropped too.
        held: list[tuple[float, bytes]] = []
        try:
            while True:
                ready, _, _ = select.select([read_end], [], [], HOLD_S / 4 if held else None)
                if ready:
                    chunk = os.read(read_end, RELAY_CHUNK)
                    if not chunk:
                        break
                    held.append((time.monotonic(), chunk))
                if self.interrupted:
                    held.clear()
                    continue
                due = time.monotonic() - (HOLD_S if self._starting else 0.0)
                while held and held[0][0] <= due:
                    with contextlib.suppress(OSError):
                        os.write(target, held.pop(0)[1])
        finally:
            os.close(read_end)
            os.close(target)

    def settle(self, done: Callable[[list[psutil.Process]], bool]) -> None:
        """After an interrupt, within the context: until ``done(alive)`` holds for the worker processes spawned
        within that are still alive (at most ``EXIT_TIMEOUT_S``), then ``SETTLE_S`` more. An interrupted scale
        leaves Dask's own task starting the workers, which logs each one that died of the SIGINT a moment later:
        logging is still off meanwhile."""
        deadline = time.monotonic() + EXIT_TIMEOUT_S
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):  # a question to the cluster that failed: not settled yet
                if done(self._workers()):
                    break
            time.sleep(0.1)
        time.sleep(SETTLE_S)

    def _workers(self) -> list[psutil.Process]:
        return [p for p in _children() if p.pid not in self._before and _is_worker(p)]

    def cleanup(self) -> str:
        """Wait for the worker processes spawned within to end (kill those left after ``EXIT_TIMEOUT_S``); what
        happened to them, in words. (A worker that SIGINT ended before the kernel's handler ran is not counted:
        the words give no count but of those killed.)"""
        spawned = list({**self._spawned, **{p.pid: p for p in self._workers()}}.values())
        _, alive = psutil.wait_procs(spawned, timeout=EXIT_TIMEOUT_S)
        for process in alive:
            with contextlib.suppress(psutil.Error):
                process.kill()
        psutil.wait_procs(alive, timeout=EXIT_TIMEOUT_S)
        killed = f" ({len(alive)} still running after {EXIT_TIMEOUT_S:g} s were killed)" if alive else ""
        return f"its worker processes have ended{killed}"


def _children() -> list[psutil.Process]:
    try:
        return list(psutil.Process().children(recursive=True))
    except psutil.Error:
        return []


def _is_worker(process: psutil.Process) -> bool:
    """A process that ``multiprocessing`` spawned (a Dask worker), not its resource tracker, which stays."""
    try:
        return any("spawn_main" in part for part in process.cmdline())
    except psutil.Error:  # it has ended meanwhile
        return False


__all__ = ["EXIT_TIMEOUT_S", "InterruptibleStart"]
