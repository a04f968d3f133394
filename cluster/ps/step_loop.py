"""The process's one event loop for held Step streams, run by the thread that waits on it.

gRPC's asyncio layer completes each call on the event loop it was made on,
and a held stream outlives the step that opened it and serves whichever
thread steps next: so every held stream of a process lives on one loop (a
thread per stream thrashed with 256 replica threads in one process). When
that loop ran on a thread of its own, each step crossed threads twice, caller
to loop and back:
a 1 KB step took 0.64 ms at p50 against 0.55 ms when the waiting thread ran
the loop itself, and a bare unary call 0.50 ms (this machine, same run).

So the loop has no thread of its own while somebody waits on it. A thread
that waits for a step runs the loop itself until its step is done (it
*leads*); threads that wait meanwhile sleep until their step is done or the
loop is free again, when one of them leads. A leader whose step nobody else
waits for (no fan-out) runs it as a plain task, with no future between
threads: each of those took a lock a few times a step. Work that needs the loop while
nobody waits on it (a streamed step's messages and answer, a stream's
cancel, a channel's close, a step abandoned at its deadline) is *live*: a
background thread runs the loop while any is live and no caller does.

A thread that already runs an event loop of its own (a notebook kernel's
thread) cannot run this one: it waits, and the background thread runs the
loop for it. A leader on the main thread defers Ctrl-C until the loop is
between callbacks (a KeyboardInterrupt inside gRPC's own callbacks could lose
a completion), then cancels its step and raises it.

Examples
--------
>>> import asyncio
>>> loop = StepLoop()
>>> async def double(x):
...     await asyncio.sleep(0)
...     return 2 * x
>>> loop.run(double(21), seconds=5.0)
42
>>> future = loop.submit(double(4))  # run by the background thread: nobody waits on it
>>> loop.wait(future, seconds=5.0); future.result()
8
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]
import asyncio
import concurrent.futures
import contextlib
import functools
import os
import signal
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar

T = TypeVar("T")
_BACKGROUND = -1  # the driver id of the background thread (thread idents are positive)


class LoopTimeout(TimeoutError):
    """A coroutine ``StepLoop.run`` gave up on at its deadline (and cancelled)."""


class StepLoop:
    """Runs coroutines on the process's step loop (see the module); one per process, made again after a fork."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pid = -1
        self._process: _Driven | None = None

    def _driven(self) -> _Driven:
        with self._lock:
            if self._pid != os.getpid() or self._process is None:  # a forked child: a loop and a thread of its own
                self._process, self._pid = _Driven(), os.getpid()
            return self._process

    def run(self, coroutine: Coroutine[Any, Any, T], seconds: float, scope: Any = None) -> T:
        """Run ``coroutine`` on the loop; its result, or ``LoopTimeout`` after ``seconds`` (it is cancelled).

        ``scope`` (a client fan-out) may cancel it from another thread: then
        ``concurrent.futures.CancelledError``.
        """
        driven = self._driven()
        deadline = time.monotonic() + seconds
        try:
            lead = driven.claim()  # before the coroutine is scheduled: the background thread must not start it
        except RuntimeError:
            coroutine.close()  # never to run: no "never awaited" warning on top of the error
            raise
        if lead and scope is None:  # nobody else waits for it: run it here, no future between threads
            task, in_time = driven.run_here(coroutine, deadline)
            if not in_time:  # cancelled (run_here): whoever runs the loop next ends it
                raise LoopTimeout(f"not done within {seconds:g} s (cancelled)")
            if task.cancelled():  # from inside (its gRPC call cancelled): as a cancelled future says it
                raise concurrent.futures.CancelledError()
            return task.result()
        try:
            future = driven.schedule(coroutine, here=lead)
        except BaseException:
            if lead:
                driven.release()
            raise
        if scope is not None:
            scope.track(future)
        try:
            try:
                driven.wait(future, deadline, lead)
            except KeyboardInterrupt:  # a follower's sleep interrupted: nobody waits for the step any more
                future.cancel()
                raise
            if not future.done():
                future.cancel()
                raise LoopTimeout(f"not done within {seconds:g} s (cancelled)")
            return future.result()
        finally:
            if scope is not None:
                scope.untrack(future)

    def submit(self, coroutine: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Start ``coroutine`` on the loop and return at once; the loop is run for it until it ends."""
        driven = self._driven()
        return driven.schedule(coroutine)

    def wait(self, future: concurrent.futures.Future[Any], seconds: float) -> None:
        """Wait up to ``seconds`` for ``future`` (from ``submit``), running the loop when nobody else does."""
        self._driven().wait(future, time.monotonic() + seconds, lead=False)

    def soon(self, callback: Callable[..., Any], *args: Any) -> None:
        """Call ``callback(*args)`` on the loop, from any thread; the loop is run for it."""
        self._driven().soon(callback, *args)

    def drive(
        self,
        start: Callable[[Callable[[Coroutine[Any, Any, T]], concurrent.futures.Future[T]], bool], None],
        started: concurrent.futures.Future[Any],
        seconds: float,
    ) -> None:
        """Start work that this thread will wait for soon, running the loop here until ``started`` is done.

        ``start(submit, here)`` starts the work: ``submit(coroutine)`` makes
        its task; ``here`` says whether this thread holds the loop (then it may
        touch the loop's objects directly). ``started`` is done once the work
        no longer needs this thread (a streamed step's message is written),
        or ``seconds`` pass. The work is not live: the background thread is
        not woken for it. It goes on whenever anybody runs the loop, and at
        the latest when this thread waits for it (``wait``), as a streamed
        step's replica does before it reads a pulled value. So a message of a
        streamed step costs no wake-up of another thread. A caller that cannot
        run the loop now (another thread runs it, or this one runs an event
        loop of its own) hands the work over as live work instead.
        """
        driven = self._driven()
        if not driven.claim():
            start(driven.schedule, False)
            return
        try:
            start(functools.partial(driven.schedule, here=True, driven_by_caller=True), True)
        except BaseException:
            driven.release()
            raise
        driven.lead(started, time.monotonic() + seconds)  # frees the loop when it returns


class _Driven:
    """One process's step loop, who runs it now, and how much live work it has."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        # ``changed`` is waited on and notified; code that only reads or writes the fields below holds its lock
        # (``_mutex``) directly, without the Condition's Python-level wrappers (a few a step).
        self._mutex = threading.Lock()
        self.changed = threading.Condition(self._mutex)
        self.driver: int | None = None  # the thread running the loop now (_BACKGROUND for the background one)
        self.live = 0  # scheduled coroutines and callbacks not finished yet
        self.waiting: list[threading.Event] = []  # threads that wait to lead, woken when the loop is free
        threading.Thread(target=self._background, name="cellgraph-psclient-steps", daemon=True).start()

    # ------------------------------------------------------------------ live work
    def schedule(
        self, coroutine: Coroutine[Any, Any, T], here: bool = False, driven_by_caller: bool = False
    ) -> concurrent.futures.Future[T]:
        """Start ``coroutine`` as a task of the loop; its future, settled on the loop.

        ``here``: by the thread that claimed the loop, which makes the task at
        once (the loop is not running): no wake-up through the loop's self-pipe,
        a syscall and a pass of the loop less per step than from another thread.
        The work stays live until its future is settled, so that the background
        thread never stops between the task's end and its result.
        ``driven_by_caller``: the work is not live (see ``StepLoop.drive``).
        """
        live = not driven_by_caller
        if live:
            self._add_live(wake=not here)
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        tasks: list[asyncio.Task[None]] = []

        async def settled() -> None:  # the future is settled inside the task's last step: no loop pass more
            try:
                try:
                    result = await coroutine
                except asyncio.CancelledError:
                    future.cancel()
                    raise
                except BaseException as error:  # handed to the waiter, who raises it
                    if future.set_running_or_notify_cancel():  # False: cancelled by its waiter meanwhile
                        future.set_exception(error)
                else:
                    if future.set_running_or_notify_cancel():
                        future.set_result(result)
            finally:
                if live:
                    self._end_live()

        def start() -> None:  # on the loop
            if future.cancelled():  # given up on before it began
                coroutine.close()
                if live:
                    self._end_live()
                return
            tasks.append(self.loop.create_task(settled()))

        def cancel_task(done: concurrent.futures.Future[T]) -> None:  # on any thread
            if done.cancelled():
                self.loop.call_soon_threadsafe(lambda: tasks and tasks[0].cancel())

        if here:
            start()
        else:
            self.loop.call_soon_threadsafe(start)
        future.add_done_callback(cancel_task)
        return future

    def soon(self, callback: Callable[..., Any], *args: Any) -> None:
        """Call ``callback(*args)`` on the loop, from any thread, as live work."""

        def call() -> None:
            try:
                callback(*args)
            finally:
                self._end_live()

        self._add_live()
        self.loop.call_soon_threadsafe(call)

    def _add_live(self, wake: bool = True) -> None:
        """One more piece of live work; ``wake``: the background thread runs it unless a caller claimed the loop
        (False: this thread claimed it and runs it)."""
        with self._mutex:
            self.live += 1
            if wake and self.driver is None:
                self.changed.notify_all()  # the background thread runs it unless a caller claimed the loop

    def _end_live(self) -> None:  # on the loop
        with self._mutex:
            self.live -= 1
            if self.live == 0 and self.driver == _BACKGROUND:
                self.loop.stop()

    # ------------------------------------------------------------------ who runs the loop
    def claim(self) -> bool:
        """Take the loop for this thread if it is free and this thread can run it; whether it did."""
        running = _running_loop()
        if running is not None:
            if running is self.loop:
                raise RuntimeError("a step was waited for on the step loop itself: it would never end")
            return False  # this thread runs a loop of its own: the background thread runs ours
        with self._mutex:
            if self.driver is None:
                self.driver = threading.get_ident()
                return True
            return False

    def release(self) -> None:
        """Free the loop (this thread claimed it): wake the threads that wait to run it, or the background one."""
        with self._mutex:
            self.driver = None
            waiting, self.waiting = self.waiting, []
            if self.live:
                self.changed.notify_all()
        for event in waiting:
            event.set()

    def wait(self, future: concurrent.futures.Future[Any], deadline: float, lead: bool) -> None:
        """Until ``future`` is done or ``deadline`` passes: lead when the loop is free, else sleep."""
        can_lead = lead or _running_loop() is None
        woken: threading.Event | None = None  # made only if this thread has to sleep (a leader never does)
        try:
            while not future.done():
                if lead:
                    lead = False
                    self.lead(future, deadline)  # frees the loop when it returns
                    continue
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                with self.changed:
                    if future.done():
                        return
                    if can_lead and self.driver is None:
                        self.driver, lead = threading.get_ident(), True
                        continue
                    if woken is None:
                        woken = threading.Event()
                        future.add_done_callback(functools.partial(_set, woken))
                    woken.clear()
                    if future.done():  # done between the check and the clear: its callback's set was cleared
                        return
                    if can_lead:
                        self.waiting.append(woken)
                woken.wait(left)
        finally:
            if lead:  # claimed, and the future was done before this thread ran the loop
                self.release()

    def lead(self, future: concurrent.futures.Future[Any], deadline: float) -> None:
        """Run the loop on this thread until ``future`` is done or ``deadline`` passes, then free it."""
        me, loop = threading.get_ident(), self.loop

        def stop(_: object) -> None:
            if threading.get_ident() == me:
                loop.stop()
            else:  # cancelled from another thread (a fan-out's failure)
                loop.call_soon_threadsafe(loop.stop)

        try:
            future.add_done_callback(stop)
        except BaseException:
            self.release()
            raise
        self._run_until(future.done, deadline, future.cancel)

    def run_here(self, coroutine: Coroutine[Any, Any, T], deadline: float) -> tuple[asyncio.Task[T], bool]:
        """Run ``coroutine`` as a task on this thread, which claimed the loop, until it ends or ``deadline``
        passes, then free the loop; the task, and whether it ended in time.

        One not done by then is cancelled, and stays live until its
        cancellation has run: whoever runs the loop next runs it to its end.
        (Its first step was queued before the cancel, so it has begun by then
        and its ``finally`` ends the live work.)"""
        me, loop = threading.get_ident(), self.loop

        async def stopping() -> T:  # stops the loop inside the task's last step: no loop pass more
            try:
                return await coroutine
            finally:
                self._end_live()
                if threading.get_ident() == me:  # still run by its caller, not by whoever took over after it
                    loop.stop()

        self._add_live(wake=False)  # live until it ends: given up on, it is run to its end by the next runner
        try:
            task = loop.create_task(stopping())
        except BaseException:
            coroutine.close()
            self._end_live()
            self.release()
            raise
        try:
            self._run_until(task.done, deadline, lambda: loop.call_soon_threadsafe(task.cancel))
        except BaseException:  # a Ctrl-C (cancelled already) or the loop's own failure: nobody waits for it now
            loop.call_soon_threadsafe(task.cancel)
            raise
        if task.done():
            return task, True
        loop.call_soon_threadsafe(task.cancel)  # read once: the next runner may end it any moment now
        return task, False

    def _run_until(self, done: Callable[[], bool], deadline: float, cancel: Callable[[], object]) -> None:
        """Run the loop here (this thread claimed it) until ``done()`` or ``deadline``, then free it; a Ctrl-C
        meanwhile calls ``cancel()`` and is raised once the loop is still."""
        loop = self.loop
        interrupted: list[tuple[Any, Any]] = []  # (the handler Ctrl-C would have run, its frame)
        try:
            timer = loop.call_later(max(0.0, deadline - time.monotonic()), loop.stop)
            try:
                with _sigint_deferred(loop, interrupted):
                    while not done() and time.monotonic() < deadline:
                        loop.run_forever()  # until stopped: the step is done, its deadline, a Ctrl-C, a stale stop
                        if interrupted:  # the loop is still: run the handler Ctrl-C would have run
                            handler, frame = interrupted[0]
                            interrupted.clear()
                            try:
                                handler(signal.SIGINT, frame)  # Python's own raises KeyboardInterrupt
                            except BaseException:
                                cancel()
                                raise
            finally:
                timer.cancel()
        finally:
            self.release()

    def _background(self) -> None:
        """Run the loop while work is live and no caller runs it."""
        while True:
            with self.changed:
                while not (self.live and self.driver is None):
                    self.changed.wait()
                self.driver = _BACKGROUND
            try:
                self.loop.run_forever()  # stopped when the last live work ends
            finally:
                self.release()


def _set(event: threading.Event, _: object) -> None:
    event.set()


def _running_loop() -> asyncio.AbstractEventLoop | None:
    """The event loop this thread is running, if any. (asyncio's own low-level getter, which event loops and
    libraries use: ``get_running_loop`` raises where there is none, an exception every step.)"""
    return asyncio.events._get_running_loop()


@contextlib.contextmanager
def _sigint_deferred(loop: asyncio.AbstractEventLoop, interrupted: list[tuple[Any, Any]]) -> Iterator[None]:
    """On the main thread, a Ctrl-C while the loop runs stops it between callbacks: ``interrupted`` gets the
    handler it would have run and its frame, for the caller to run once the loop is still."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    # ``_signal`` is the C module under ``signal``, whose wrappers (enum conversions, a ValueError caught for
    # every function handler) cost 8 us a step here; these two calls cost under 1 us.
    previous = _signal.getsignal(signal.SIGINT)
    if not callable(previous):  # ignored, or the default (the process ends): nothing to defer
        yield
        return

    def defer(signum: int, frame: Any) -> None:
        interrupted.append((previous, frame))
        loop.call_soon_threadsafe(loop.stop)  # wakes the selector too: a bare stop() would wait for its timeout

    _signal.signal(signal.SIGINT, defer)
    try:
        yield
    finally:
        _signal.signal(signal.SIGINT, previous)
