"""The step loop is run by the thread that waits on it, by a background thread when nobody does, and is never
left stuck: deadlines cancel, Ctrl-C on the main thread cancels the step and leaves the loop usable."""

from __future__ import annotations

import asyncio
import concurrent.futures
import signal
import subprocess
import sys
import threading
import time

import pytest

from cellgraph.cluster.ps.step_loop import LoopTimeout, StepLoop

DEADLINE_S = 10.0


async def where_run(pause: float = 0.0) -> int:
    """The thread the coroutine ran on (after ``pause`` seconds)."""
    await asyncio.sleep(pause)
    return threading.get_ident()


async def sleep_until_cancelled(cancelled: threading.Event) -> None:
    """A step that never ends by itself; ``cancelled`` is set when it is cancelled."""
    try:
        await asyncio.sleep(3600)
    except asyncio.CancelledError:
        cancelled.set()
        raise


def leads_again(loop: StepLoop) -> bool:
    """Whether a step of this thread is run by this thread again once the loop's leftover work is done (until
    then the background thread may still be running the loop, and runs the step for it)."""
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        if loop.run(where_run(), DEADLINE_S) == threading.get_ident():
            return True
        time.sleep(0.01)
    return False


def test_the_waiting_thread_runs_its_own_step() -> None:
    loop = StepLoop()
    assert loop.run(where_run(), DEADLINE_S) == threading.get_ident()
    ran_on: list[int] = []
    worker = threading.Thread(target=lambda: ran_on.append(loop.run(where_run(), DEADLINE_S)))
    worker.start()
    worker.join(DEADLINE_S)
    assert ran_on == [worker.ident]


def test_a_thread_running_its_own_event_loop_is_served_by_the_background_thread() -> None:
    loop = StepLoop()

    async def from_inside_a_loop() -> int:
        return loop.run(where_run(), DEADLINE_S)  # blocks this loop: a notebook cell calling a step

    ran_on = asyncio.run(from_inside_a_loop())
    assert ran_on != threading.get_ident()
    assert threading.current_thread().ident != ran_on


def drive_then_wait(loop: StepLoop) -> tuple[int, int]:
    """Start, through ``drive``, work that records its thread before and after a pause; wait for it.

    The pause comes after ``drive`` returned: whoever runs the loop then finishes the work."""
    started: concurrent.futures.Future[None] = concurrent.futures.Future()
    futures: list[concurrent.futures.Future[tuple[int, int]]] = []

    async def work() -> tuple[int, int]:
        first = threading.get_ident()
        started.set_result(None)
        await asyncio.sleep(0.05)
        return first, threading.get_ident()

    loop.drive(lambda submit, here: futures.append(submit(work())), started, DEADLINE_S)
    loop.wait(futures[0], DEADLINE_S)
    return futures[0].result()


def test_work_started_by_drive_is_run_by_the_thread_that_then_waits_for_it() -> None:
    """A streamed step sent in one message: the sender writes it and reads the answer itself, with no wake-up
    of the background thread, although the work was left unfinished between ``drive`` and ``wait``."""
    loop = StepLoop()
    assert drive_then_wait(loop) == (threading.get_ident(), threading.get_ident())


def test_drive_from_a_thread_running_its_own_event_loop_hands_the_work_to_the_background_thread() -> None:
    loop = StepLoop()

    async def from_inside_a_loop() -> tuple[int, int]:
        return drive_then_wait(loop)

    first, last = asyncio.run(from_inside_a_loop())
    assert first == last != threading.get_ident()


def test_many_threads_stepping_at_once_all_finish_with_their_own_results() -> None:
    loop = StepLoop()

    async def echo(i: int) -> int:
        await asyncio.sleep(0.001 * (i % 3))
        return i

    results: dict[int, list[int]] = {}

    def replica(r: int) -> None:
        results[r] = [loop.run(echo(100 * r + k), DEADLINE_S) for k in range(50)]

    threads = [threading.Thread(target=replica, args=(r,)) for r in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(4 * DEADLINE_S)
    assert not any(t.is_alive() for t in threads)
    assert results == {r: [100 * r + k for k in range(50)] for r in range(16)}


def test_a_step_past_its_deadline_is_cancelled_even_though_nobody_waits_any_more() -> None:
    loop = StepLoop()
    cancelled = threading.Event()
    started = time.monotonic()
    with pytest.raises(LoopTimeout, match=r"not done within 0.2 s \(cancelled\)"):
        loop.run(sleep_until_cancelled(cancelled), 0.2)
    assert time.monotonic() - started < DEADLINE_S
    assert cancelled.wait(DEADLINE_S), "the background thread did not run the cancellation"
    assert leads_again(loop)


def test_submitted_work_is_run_by_the_background_thread_while_the_caller_does_something_else() -> None:
    loop = StepLoop()
    future = loop.submit(where_run(0.01))
    ran_on = future.result(DEADLINE_S)  # not waiting through the loop: the background thread ran it
    assert ran_on != threading.get_ident()
    done: list[int] = []
    loop.soon(lambda: done.append(threading.get_ident()))
    deadline = time.monotonic() + DEADLINE_S
    while not done and time.monotonic() < deadline:
        time.sleep(0.001)
    assert done and done[0] != threading.get_ident()


def test_a_fan_out_cancelling_a_waiting_step_ends_the_wait_at_once() -> None:
    loop = StepLoop()

    class Scope:
        def track(self, future: concurrent.futures.Future[None]) -> None:
            threading.Timer(0.05, future.cancel).start()

        def untrack(self, future: concurrent.futures.Future[None]) -> None:
            pass

    started = time.monotonic()
    with pytest.raises(concurrent.futures.CancelledError):
        loop.run(asyncio.sleep(3600), DEADLINE_S, Scope())
    assert time.monotonic() - started < DEADLINE_S / 2


def test_ctrl_c_while_the_main_thread_runs_the_loop_cancels_the_step_and_keeps_the_loop_usable() -> None:
    assert threading.current_thread() is threading.main_thread()
    loop = StepLoop()
    cancelled = threading.Event()
    main = threading.main_thread().ident
    assert main is not None
    threading.Timer(0.1, signal.pthread_kill, (main, signal.SIGINT)).start()
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        loop.run(sleep_until_cancelled(cancelled), DEADLINE_S)
    assert time.monotonic() - started < DEADLINE_S / 2
    assert cancelled.wait(DEADLINE_S)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # Python's own handler is back
    assert leads_again(loop)


def test_a_ctrl_c_handler_that_does_not_raise_lets_the_step_finish() -> None:
    loop = StepLoop()
    seen: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: seen.append(signum))
    try:
        main = threading.main_thread().ident
        assert main is not None
        threading.Timer(0.05, signal.pthread_kill, (main, signal.SIGINT)).start()
        assert loop.run(where_run(0.3), DEADLINE_S) == threading.get_ident()
    finally:
        signal.signal(signal.SIGINT, previous)
    assert seen == [signal.SIGINT]


def test_waiting_for_a_step_on_the_step_loop_itself_is_refused() -> None:
    loop = StepLoop()

    async def nested() -> None:
        loop.run(where_run(), DEADLINE_S)

    with pytest.raises(RuntimeError, match="a step was waited for on the step loop itself: it would never end"):
        loop.run(nested(), DEADLINE_S)


def test_waiting_for_work_already_done_leaves_the_loop_free_for_the_next_step() -> None:
    loop = StepLoop()
    future = loop.submit(where_run())
    future.result(DEADLINE_S)
    loop.wait(future, DEADLINE_S)  # done already: this thread must not keep the loop
    ran_on: list[int] = []
    worker = threading.Thread(target=lambda: ran_on.append(loop.run(where_run(), 2.0)))
    worker.start()
    worker.join(DEADLINE_S)
    assert ran_on == [worker.ident]


SERVER_BESIDE_AN_IDLE_STEP_LOOP = """
from cellgraph.cluster.ps import create_server, new_token
from cellgraph.cluster.ps.held import STEP_LOOP
import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

async def first_aio_use():  # the step loop is the first loop of this process to use grpc.aio
    channel = grpc.aio.insecure_channel("127.0.0.1:1")
    await channel.close()

STEP_LOOP.run(first_aio_use(), 5.0)
server, port = create_server("127.0.0.1:0", token=new_token())
with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
    statuses = [health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5.0).status
                for _ in range(20)]  # nobody runs the step loop meanwhile
print("statuses", sorted(set(statuses)))
server.stop(None)
"""


def test_a_parameter_server_beside_an_idle_step_loop_answers_without_it() -> None:
    """gRPC's asyncio layer hands its completions to whichever of its loops runs: a server in a process whose
    step loop used grpc.aio first (a colocated worker's second job) must not wait for a step to be answered."""
    done = subprocess.run(
        [sys.executable, "-c", SERVER_BESIDE_AN_IDLE_STEP_LOOP], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "statuses [1]" in done.stdout  # SERVING, 20 times, each within its 5 s deadline


def test_a_step_run_by_its_own_thread_reports_its_error_or_its_cancellation_as_a_shared_one_would() -> None:
    loop = StepLoop()

    async def fails() -> None:
        await asyncio.sleep(0)
        raise ValueError("the step's own error")

    async def cancelled_inside() -> None:  # as a held stream's read does when its call is cancelled from outside
        await asyncio.sleep(0)
        raise asyncio.CancelledError()

    with pytest.raises(ValueError, match="the step's own error"):
        loop.run(fails(), DEADLINE_S)
    with pytest.raises(concurrent.futures.CancelledError):
        loop.run(cancelled_inside(), DEADLINE_S)
    assert leads_again(loop)  # neither left the loop claimed or stopped


def test_a_step_given_up_before_its_first_turn_is_run_to_its_end_and_frees_the_loop() -> None:
    loop = StepLoop()
    with pytest.raises(LoopTimeout):
        loop.run(where_run(), 0.0)  # past its deadline before the loop ran once
    assert leads_again(loop)  # its cancellation ran, and the live work it was ended
