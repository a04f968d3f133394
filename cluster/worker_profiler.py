"""Dask's statistical profiler paused on a worker while a replica trains there.

A Dask worker samples the stack of every thread running a task, every 10 ms
(``distributed.worker.profile.interval``), on its event loop's thread: it
wakes, takes the GIL from the thread computing, and walks that thread's
stack twice. A replica is one task that runs the whole job, so the samples
say nothing a user can act on, and the cost is paid a hundred times a
second: measured on a mini-Inception job (2 sync replicas, 2 cores), each
training worker's event-loop thread used 0.17 ms of CPU per global step
with the profiler on (about 31 ms a second, against 15 ms idle) and woke
about once a step.

``paused(worker)`` stops the worker's ``"profile"`` periodic callback while
the first replica on it runs and starts it again when the last one ends,
whatever the deployment (a ``LocalCluster`` or ``dask worker`` processes
started by hand). A worker whose profiler is off (``profile.enabled:
false``) or not running is left as it is. Tornado's callbacks belong to the
worker's event loop, so they are stopped and started from there.

Examples
--------
>>> from types import SimpleNamespace
>>> class Callback:
...     running = True
...     def is_running(self): return self.running
...     def stop(self): self.running = False
...     def start(self): self.running = True
>>> class Loop:
...     def add_callback(self, fn): fn()  # the worker's loop runs it (here, at once)
>>> worker = SimpleNamespace(periodic_callbacks={"profile": Callback()}, loop=Loop())
>>> with paused(worker):
...     worker.periodic_callbacks["profile"].is_running()
False
>>> worker.periodic_callbacks["profile"].is_running()
True
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

_lock = threading.Lock()
# Per worker (by id: a worker holds no attribute of ours): how many replicas hold the pause, and whether the
# profiler ran before the first of them stopped it.
_pauses: dict[int, tuple[int, bool]] = {}


@contextlib.contextmanager
def paused(worker: Any) -> Iterator[None]:
    """The worker's statistical profiler stopped for the duration (see the module)."""
    callback = getattr(worker, "periodic_callbacks", {}).get("profile")
    if callback is None:  # the profiler is off in this worker's config
        yield
        return
    key = id(worker)
    with _lock:
        holders, was_running = _pauses.get(key, (0, False))
        if holders == 0:
            was_running = callback.is_running()
            if was_running:
                worker.loop.add_callback(callback.stop)
        _pauses[key] = (holders + 1, was_running)
    try:
        yield
    finally:
        with _lock:
            holders, was_running = _pauses.pop(key)
            if holders > 1:
                _pauses[key] = (holders - 1, was_running)
            elif was_running:
                # A worker closing has stopped its loop: then there is nothing to start again.
                with contextlib.suppress(Exception):
                    worker.loop.add_callback(callback.start)


__all__ = ["paused"]
