"""Running widget updates on the kernel's own event loop, at a bounded rate.

Why the loop: ipykernel 7 runs cells and handles comm messages on the main
thread's asyncio loop, and widget messages sent from any other thread can be
lost or attached to the wrong cell (jupyter-widgets/ipywidgets#4001). So a
live widget schedules its refreshes with ``loop.call_later`` on that loop,
and does slow or blocking work (network calls) on threads that only hand
results back.

Why the throttle: the kernel's IOPub channel drops messages when flooded
(its high-water mark), and a browser cannot draw faster anyway; a widget
updates at most once per ``Throttle.interval``, whatever asks it to.

Examples
--------
>>> now = [0.0]
>>> ran = []
>>> throttle = Throttle(lambda: ran.append(now[0]), interval=0.1, clock=lambda: now[0])
>>> [throttle.request() for _ in range(50)].count(True)  # 50 requests at once: one update, one left pending
1
>>> throttle.pending
True
>>> now[0] = 0.1
>>> throttle.request(), ran
(True, [0.0, 0.1])
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable
from typing import Any, Protocol


class _Handle(Protocol):
    def cancel(self) -> None: ...


CallLater = Callable[[float, Callable[[], None]], _Handle]


def in_kernel() -> bool:
    """Whether this process is an IPython kernel (so widgets have a front end to talk to).

    Asked of IPython only when something imported it already: a kernel always
    has, and a plain process's repr need not pay for the import.
    """
    ipython = sys.modules.get("IPython")
    return ipython is not None and getattr(ipython.get_ipython(), "kernel", None) is not None


def kernel_loop() -> asyncio.AbstractEventLoop | None:
    """The event loop that runs this kernel's cells, or None outside a kernel and outside any running loop.

    Inside a cell that is the running loop of the main thread; from another
    thread of a kernel, ipykernel's ``kernel.io_loop`` (a tornado loop over
    asyncio) names it.
    """
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        pass
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    io_loop = getattr(getattr(get_ipython(), "kernel", None), "io_loop", None)
    loop = getattr(io_loop, "asyncio_loop", None)
    return loop if isinstance(loop, asyncio.AbstractEventLoop) and not loop.is_closed() else None


class Throttle:
    """Run ``action`` at most once per ``interval`` seconds, however often it is requested.

    A request within ``interval`` of the last run is deferred to the end of the
    interval and folded together with any others that come meanwhile: a burst
    of requests gives one run now and one at the end (so the last state is
    shown), never more. ``call_later`` (``loop.call_later``) runs the deferred
    one; without it, the next request after the interval runs it.
    """

    def __init__(
        self,
        action: Callable[[], Any],
        interval: float = 0.1,
        clock: Callable[[], float] = time.monotonic,
        call_later: CallLater | None = None,
    ) -> None:
        if interval <= 0:
            raise ValueError(f"Throttle interval must be positive seconds, got {interval}")
        self.action = action
        self.interval = interval
        self._clock = clock
        self._call_later = call_later
        self._last = -float("inf")
        self._deferred: _Handle | None = None
        self.pending = False
        self.runs = 0

    def request(self) -> bool:
        """Ask for a run; True if it ran now, False if it was deferred (or folded into a deferred one)."""
        wait = self._last + self.interval - self._clock()
        if wait <= 0:
            self._run()
            return True
        if not self.pending:
            self.pending = True
            if self._call_later is not None:
                self._deferred = self._call_later(wait, self._run_deferred)
        return False

    def _run_deferred(self) -> None:
        self._deferred = None
        if self.pending:
            self._run()

    def _run(self) -> None:
        if self._deferred is not None:
            self._deferred.cancel()
            self._deferred = None
        self.pending = False
        self._last = self._clock()
        self.runs += 1
        self.action()

    def cancel(self) -> None:
        """Drop a deferred run."""
        self.pending = False
        if self._deferred is not None:
            self._deferred.cancel()
            self._deferred = None


class Ticker:
    """Call ``tick`` every ``interval`` seconds on ``loop`` until it returns False or ``stop()`` is called.

    Scheduled with ``call_later`` on the loop itself, so each tick runs on the
    loop's thread between cells, never concurrently with one.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, interval: float, tick: Callable[[], bool]) -> None:
        self.loop = loop
        self.interval = interval
        self._tick = tick
        self._handle: asyncio.Handle | None = None
        self.running = False

    def start(self) -> None:
        """Start ticking; safe from any thread (the first tick is scheduled through the loop)."""
        if self.running:
            return
        self.running = True
        self.loop.call_soon_threadsafe(self._schedule)

    def _schedule(self) -> None:
        if self.running:
            self._handle = self.loop.call_later(self.interval, self._run)

    def _run(self) -> None:
        self._handle = None
        if not self.running:
            return
        try:
            again = self._tick()
        except BaseException:
            self.running = False  # a broken tick would fail the same way every interval: asyncio logs it once
            raise
        if again:
            self._schedule()
        else:
            self.running = False

    def stop(self) -> None:
        """Stop ticking (call on the loop's thread, e.g. from a cell or a widget callback)."""
        self.running = False
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
