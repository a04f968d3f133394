"""TrainingMonitor on real jobs: curves, progress, replica rates, PS bytes, events, Stop and Scale, throttling.

The figures' arithmetic and the throttle are checked on plain data first; then
a real LocalCluster trains the MLP and the monitor must show exactly what the
job reports; last, a real kernel runs a job and the monitor refreshes itself on
the kernel's event loop until the job has ended.
"""

from __future__ import annotations

import asyncio
import doctest
import html
import math
import queue
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest

import cellgraph as cg
from cellgraph.cluster.cluster import Cluster
from cellgraph.cluster.job import Job
from cellgraph.examples import digits, models
from cellgraph.widgets import TrainingMonitor, training_monitor_data
from cellgraph.widgets import kernel_loop as kernel_loop_module
from cellgraph.widgets.kernel_loop import Throttle, Ticker, in_kernel, kernel_loop
from cellgraph.widgets.reprs import job_bundle, job_text
from cellgraph.widgets.training_monitor_data import MetricSeries, Progress, stragglers, thin
from cellgraph.widgets.training_monitor_events import fold_checkpoints
from cellgraph.widgets.training_monitor_figures import NORMAL, STRAGGLER, RateFigure, close_figure

TIMEOUT = 120.0
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"


# ---------------------------------------------------------------------- plain data, no cluster
class Timers:
    """A clock and a call_later that run only when told: time moves when the test says so."""

    def __init__(self) -> None:
        self.now = 0.0
        self.due: list[tuple[float, Callable[[], None], Timers.Handle]] = []

    class Handle:
        def __init__(self) -> None:
            self.cancelled = False

        def cancel(self) -> None:
            self.cancelled = True

    def call_later(self, delay: float, callback: Callable[[], None]) -> Timers.Handle:
        handle = Timers.Handle()
        self.due.append((self.now + delay, callback, handle))
        return handle

    def advance(self, to: float) -> None:
        self.now = to
        for when, callback, handle in sorted(self.due, key=lambda d: d[0]):
            if when <= to and not handle.cancelled:
                self.due.remove((when, callback, handle))
                callback()


def test_a_burst_of_refresh_requests_within_100_ms_gives_one_update() -> None:
    timers, updates = Timers(), []
    throttle = Throttle(lambda: updates.append(timers.now), 0.1, clock=lambda: timers.now, call_later=timers.call_later)
    for i in range(100):  # 100 requests spread over 99 ms
        timers.now = i * 0.00099
        throttle.request()
    assert updates == [0.0]  # one update in the window; the rest wait, folded into one
    assert throttle.pending and len(timers.due) == 1
    timers.advance(0.1)
    assert updates == [0.0, 0.1]  # the deferred one shows the last state, at the window's end
    timers.advance(0.5)
    assert updates == [0.0, 0.1] and not throttle.pending  # nothing more was asked for


def test_throttled_updates_never_come_closer_than_the_interval() -> None:
    timers, updates = Timers(), []
    throttle = Throttle(lambda: updates.append(timers.now), 0.1, clock=lambda: timers.now, call_later=timers.call_later)
    for i in range(1000):  # a request every 3 ms for 3 s
        timers.advance(i * 0.003)
        throttle.request()
    timers.advance(10.0)
    gaps = np.diff(updates)
    assert len(updates) <= 3.0 / 0.1 + 2
    assert gaps.min() >= 0.1 - 1e-9


def test_throttle_refuses_a_non_positive_interval() -> None:
    with pytest.raises(ValueError, match="Throttle interval must be positive seconds, got 0"):
        Throttle(lambda: None, 0)


def test_ticker_runs_on_the_loop_until_its_tick_says_stop() -> None:
    ticks: list[bool] = []

    def tick() -> bool:
        ticks.append(True)
        return len(ticks) < 3

    async def main() -> None:
        loop = asyncio.get_running_loop()
        assert kernel_loop() is loop  # inside a running loop, that loop is the one to use
        ticker = Ticker(loop, 0.01, tick)
        ticker.start()
        deadline = time.monotonic() + 5
        while ticker.running and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert not ticker.running

    asyncio.run(main())
    assert ticks == [True, True, True]
    assert kernel_loop() is None and not in_kernel()  # a plain pytest process: no loop, no kernel


def message(replica: int, step: int, steps: int, t: float, loss: float = 1.0, **more: Any) -> dict[str, Any]:
    return {"replica": replica, "step": step, "steps": steps, "time": t, "loss": loss, **more}


def test_replica_rates_come_from_each_replicas_own_step_counter() -> None:
    series = MetricSeries()
    series.extend(message(0, 10 * i, 10 * i, 100.0 + i) for i in range(4))  # 10 steps/s
    series.extend(message(1, 10 * i, 4 * i, 100.0 + i) for i in range(4))  # 4 steps/s
    series.extend(message(2, 10 * i, 9 * i, 100.0 + i) for i in range(4))
    rates = series.rates()
    assert rates == pytest.approx({0: 10.0, 1: 4.0, 2: 9.0})
    assert stragglers(rates) == [1]  # more than 20% below the median (9)
    assert stragglers({0: 10.0, 1: 8.5}) == []  # within the margin
    assert stragglers({0: 10.0}) == []  # one replica is no straggler
    assert series.active == [0, 1, 2]
    series.extend([message(1, 40, 14, 103.0, final=True)])  # replica 1 left (the job was scaled down)
    assert series.active == [0, 2]


def test_a_replica_run_again_is_rated_from_its_restart() -> None:
    series = MetricSeries()
    # 50 steps, then Dask ran the replica again: its counter starts at 0 and goes 5 steps/s.
    series.extend([message(0, 40, 50, 100.0), message(0, 60, 2, 101.0), message(0, 70, 7, 102.0)])
    assert series.rates() == {0: 5.0}
    # One message only: the rate is 1 / step_time_s.
    single = MetricSeries()
    single.extend([message(3, 5, 5, 100.0, step_time_s=0.25)])
    assert single.rates() == {3: 4.0}


def test_progress_says_step_rate_and_eta() -> None:
    series = MetricSeries()
    series.extend(message(r, 20 * i, 10 * i, 100.0 + i) for r in (0, 1) for i in range(3))
    progress = series.progress(target=200)
    assert (progress.step, progress.rate, progress.eta_s) == (40, 20.0, 8.0)
    assert progress.describe() == "step 40 of 200 (20%), 20 steps/s, ETA 8 s"
    assert series.progress(target=200, step=45).step == 45  # the servers' step, when known, is the floor
    assert progress.describe(running=False) == "step 40 of 200 (20%)"  # a job that ended has no ETA
    assert Progress(0, 100, 0.0).describe() == "step 0 of 100 (0%)"  # no rate yet: no ETA
    assert Progress(10, 3610, 1.0).describe().endswith("ETA 1 h 0 min")
    assert math.isclose(Progress(300, 300, 5.0).fraction, 1.0) and Progress(300, 300, 5.0).eta_s == 0.0


def test_long_curves_are_thinned_to_a_bounded_size_keeping_both_ends() -> None:
    xs = [float(i) for i in range(10_001)]
    assert thin(xs, xs, limit=10_001) == (xs, xs)  # under the limit: every point
    tx, ty = thin(xs, [2 * x for x in xs], limit=101)
    assert len(tx) == 101 and tx[0] == 0.0 and tx[-1] == 10_000.0 and tx[1] == 100.0
    assert ty == [2 * x for x in tx]


def test_a_straggler_s_bar_is_red() -> None:
    figure = RateFigure()
    try:
        figure.draw({0: 10.0, 1: 4.0, 2: 9.0}, stragglers({0: 10.0, 1: 4.0, 2: 9.0}))
        assert list(figure.bars.x) == ["replica 0", "replica 1", "replica 2"]
        assert figure.bars.colors == [NORMAL, STRAGGLER, NORMAL]
    finally:
        close_figure(figure.figure)


@pytest.mark.parametrize("module", [kernel_loop_module, training_monitor_data])
def test_docstring_examples(module: Any) -> None:
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0 and result.attempted > 0


def test_series_names_the_columns_it_keeps() -> None:
    with pytest.raises(KeyError, match="no metric column 'accuracy': the monitor keeps step, loss"):
        MetricSeries().column(0, "accuracy")


# ---------------------------------------------------------------------- a real cluster
def test_a_closed_monitor_displayed_again_says_how_to_get_a_new_one() -> None:
    # ipywidgets' close() leaves IPython only the text repr: it said nothing of the monitor being closed.
    from IPython.core.formatters import DisplayFormatter

    from cellgraph.testing.recorded_job import RecordedJob

    monitor = TrainingMonitor(RecordedJob(replicas=1, steps=100, job_id="job-closed"))
    monitor.close()
    assert DisplayFormatter().format(monitor)[0] == {
        "text/plain": f"<TrainingMonitor of job job-closed: running, {monitor.updates} update(s), closed: display the "
        "job itself again for a new monitor>"
    }


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with Cluster.local(workers=2, ps=1) as local:
        yield local


def train(cluster: Cluster, data: digits.Split, **kwargs: Any) -> Job:
    options: dict[str, Any] = dict(
        optimizer=cg.optim.Adam(1e-2), replicas=2, batch_size=64, steps=300, checkpoint_every=100,
        metrics_interval_s=0.1,
    )  # fmt: skip
    options.update(kwargs)
    return cg.train(models.mlp().loss, (data.x_train, data.y_train), cluster=cluster, **options)


@contextmanager
def monitored(job: Job) -> Iterator[TrainingMonitor]:
    """A monitor of ``job``; both closed at the end, whatever happens."""
    try:
        monitor = TrainingMonitor(job)
        try:
            yield monitor
        finally:
            monitor.close()
    finally:
        job.close()


def wait_for(condition: Callable[[], bool], what: str, timeout: float = TIMEOUT, every: float = 0.2) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout} s")
        time.sleep(every)


def shown_curve(monitor: TrainingMonitor, replica: int) -> tuple[list[float], list[float]]:
    line = monitor.loss.lines[replica]
    return [float(v) for v in line.x], [float(v) for v in line.y]


def job_curve(job: Job, replica: int) -> tuple[list[float], list[float]]:
    """Every step's loss the job's metrics messages carried (``step_losses``), in order."""
    rows = [m for m in job.metrics if m["replica"] == replica and m["loss"] is not None]
    steps = [float(s) for m in rows for s in m["step_losses"]["step"]]
    return steps, [float(v) for m in rows for v in m["step_losses"]["loss"]]


@pytest.mark.slow
def test_the_monitor_shows_what_the_job_reports(cluster: Cluster, data: digits.Split) -> None:
    job = train(cluster, data)
    with monitored(job) as monitor:
        assert not monitor.live  # no kernel: it shows what refresh() reads

        def points_per_replica() -> int:
            monitor.refresh()
            return min(len(line.x) for line in monitor.loss.lines.values()) if len(monitor.loss.lines) == 2 else 0

        wait_for(lambda: points_per_replica() >= 2, "two points per replica")
        early = {r: len(shown_curve(monitor, r)[0]) for r in (0, 1)}
        assert 0 < monitor.progress.value < 300 or job.status == "finished"
        job.wait(TIMEOUT)
        # The replicas' last messages come as Dask events, possibly after the job's status says finished.
        wait_for(lambda: {m["replica"] for m in job.metrics if m["final"]} == {0, 1}, "both replicas' final metrics")
        monitor.refresh()

        for r in (0, 1):  # the curves grew, and hold every step's loss the job received, in order
            assert len(shown_curve(monitor, r)[0]) > early[r]
            assert shown_curve(monitor, r) == job_curve(job, r)
        assert monitor.series.count == len(job.metrics)
        assert (monitor.progress.value, monitor.progress.max, monitor.progress.bar_style) == (300, 300, "success")
        assert monitor.progress_label.value == "step 300 of 300 (100%)"
        assert list(monitor.rates.bars.x) == ["replica 0", "replica 1"]
        rates = monitor.series.rates()
        assert list(monitor.rates.bars.y) == pytest.approx([rates[0], rates[1]]) and min(rates.values()) > 0
        stats = job.ps_stats()  # the job has ended: the counters no longer move
        assert [[int(v) for v in row] for row in monitor.shards.bars.y] == [
            [s["bytes_in"] for s in stats],
            [s["bytes_out"] for s in stats],
        ]
        assert stats[0]["address"] in monitor.ps_table.value and stats[0]["bytes_in"] > 0
        folded = fold_checkpoints(job.events)  # checkpoints are one line: how many, the latest, how often
        assert folded.checkpoints >= 3 and html.escape(str(folded.summary)) in monitor.events_html.value
        assert f"{folded.checkpoints} written, latest {job.checkpoints[-1]} (final)" in monitor.events_html.value
        for event in folded.others:
            assert html.escape(event) in monitor.events_html.value
        assert "finished at global step 300" in monitor.events_html.value
        assert monitor.stop_button.disabled and monitor.scale_button.disabled  # nothing to stop or scale now
        assert f"Job {job.job_id}</b> · finished" in monitor.title.value

        text = job_text(job)
        assert text.startswith(f"Job {job.job_id}: finished, 2 replica(s)\n  step 300 of 300 (100%)\n")
        assert "loss: replica 0 " in text and "step rate: replica 0 " in text and job.events[-1] in text
        assert job_bundle(job) == {"text/plain": text}  # outside a kernel: the text alone
        assert job._repr_mimebundle_() == {"text/plain": text}  # what IPython in a terminal shows
        assert job.stop() is job and job.status == "finished" and job.events[-1] in text  # an ended job stays so
        bundle = job_bundle(job, widget=True)
        assert set(bundle) == {"text/plain", WIDGET_MIME} and bundle[WIDGET_MIME]["model_id"]
        assert set(job_bundle(job, exclude={WIDGET_MIME}, widget=True)) == {"text/plain"}

        # Throttling on a live loop: a burst of 100 requests makes one update now and one at the window's end.
        async def burst() -> tuple[int, int]:
            live = TrainingMonitor(job)  # the job has ended: nothing to tick for, the throttle still applies
            try:
                while not live._ps_fetch_done():  # its one read of the ended job's counters, then its update
                    await asyncio.sleep(0.01)
                await asyncio.sleep(0.05)
                before = live.updates
                ran_now = [live.request_refresh() for _ in range(100)]
                after_burst = live.updates - before
                await asyncio.sleep(0.3)
                assert ran_now.count(True) == 1
                return after_burst, live.updates - before
            finally:
                live.close()

        assert asyncio.run(burst()) == (1, 2)


@pytest.mark.slow
def test_the_stop_button_stops_the_job(cluster: Cluster, data: digits.Split) -> None:
    job = train(cluster, data, mode="async", batch_size=32, steps=1_000_000, checkpoint_every=None)
    with monitored(job) as monitor:
        wait_for(lambda: job.global_step() >= 20, "20 steps of training")
        assert not monitor.stop_button.disabled
        monitor.stop_button.click()  # what the browser's click does: the button's handler
        assert monitor.action is not None and monitor.stop_button.disabled
        assert monitor.message.value.startswith("stopping: each replica finishes its step")
        outcome = monitor.action.result(timeout=TIMEOUT + 10)
        assert job.status == "stopped"
        assert outcome == f"stop job {job.job_id}: done; the job is stopped with 2 replica(s)"
        monitor.refresh()
        assert monitor.message.value == html.escape(outcome)
        assert monitor.progress.bar_style == "warning" and 20 <= monitor.progress.value < 1_000_000
        assert "stop asked: replicas finish their step" in monitor.events_html.value


@pytest.mark.slow
def test_a_job_closed_while_it_trains_is_said_closed_not_its_servers_not_answering(
    cluster: Cluster, data: digits.Split
) -> None:
    # Closing the cluster (or the job) under a running job: the PS table said "parameter servers not answering
    # (TrainingError: job ... is closed: ...)", as if a server had failed.
    job = train(cluster, data, mode="async", batch_size=32, steps=1_000_000, checkpoint_every=50)
    with monitored(job) as monitor:
        wait_for(lambda: job.global_step() >= 60, "60 steps of training")
        job.close()
        monitor.refresh()
        assert job.status == "stopped"
        note = html.unescape(monitor.ps_table.value)
        assert f"job {job.job_id} is closed: its parameter servers are gone; its last checkpoint is" in note, note
        assert note.endswith("counters as last seen</i></div>") and "not answering" not in note, note


@pytest.mark.slow
def test_the_scale_control_scales_the_job_and_shows_a_refusal(cluster: Cluster, data: digits.Split) -> None:
    job = train(cluster, data, mode="async", batch_size=32, steps=1_000_000, checkpoint_every=None)
    with monitored(job) as monitor:
        wait_for(lambda: job.global_step() >= 20, "20 steps of training")
        with pytest.raises(Exception) as refused:  # noqa: B017 - whatever Job.scale raises, the monitor shows it
            job.scale(3)  # the cluster has 2 training workers
        monitor.scale_input.value = 3
        monitor.scale_button.click()
        assert monitor.action is not None
        outcome = monitor.action.result(timeout=TIMEOUT)
        assert outcome.startswith(f"could not scale job {job.job_id} to 3 replica(s): {type(refused.value).__name__}")
        assert str(refused.value) in outcome
        monitor.refresh()
        assert monitor.message.value == html.escape(outcome) and not monitor.scale_button.disabled

        monitor.scale_input.value = 1
        monitor.scale_button.click()
        outcome = monitor.action.result(timeout=TIMEOUT)
        assert outcome == f"scale job {job.job_id} to 1 replica(s): done; the job is running with 1 replica(s)"
        assert job.replicas == 1

        def rated() -> list[str]:
            monitor.refresh()
            return list(monitor.rates.bars.x)

        # Replica 1 left after its last message: the rates show the replica still training, and no straggler.
        wait_for(lambda: rated() == ["replica 0"], "the rates of the replicas still training")
        assert "straggler" not in monitor.rates_label.value


# ---------------------------------------------------------------------- a real kernel
KERNEL_SETUP = """
import cellgraph as cg
from cellgraph.examples import digits, models
from cellgraph.widgets import TrainingMonitor
from cellgraph.widgets import kernel_loop as kernel_loop_module
from cellgraph.widgets import training_monitor_data
from cellgraph.widgets.kernel_loop import in_kernel
from cellgraph.widgets.reprs import job_bundle
cluster = cg.Cluster.connect({address!r})
data = digits.load()
job = cg.train(models.mlp().loss, (data.x_train, data.y_train), cluster=cluster, optimizer=cg.optim.Adam(1e-2),
               replicas=2, batch_size=64, steps=1_000_000, checkpoint_every=None, metrics_interval_s=0.1)
monitor = TrainingMonitor(job)  # made while the job starts: it refreshes from then on
job.global_step()  # waits for the start: the looks below see the job running
print(in_kernel(), monitor.live, sorted(job_bundle(job)), sorted(job._repr_mimebundle_()))
"""
KERNEL_LOOK = "print(monitor.updates, monitor.live, job.status, monitor.series.count == len(job.metrics))"
KERNEL_SHOWN = "print(monitor.progress.value, max(m['step'] for m in job.metrics))"


def execute(client: Any, code: str, timeout: float = TIMEOUT, updates: list[dict[str, Any]] | None = None) -> str:
    """Run ``code`` in the kernel; what it printed, or an AssertionError with the kernel's traceback.

    Widget state updates seen on IOPub meanwhile (whichever cell they belong to) go into ``updates``.
    """
    msg_id = client.execute(code)
    reply = client.get_shell_msg(timeout=timeout)
    while reply["parent_header"].get("msg_id") != msg_id:
        reply = client.get_shell_msg(timeout=timeout)
    out = []
    while True:
        try:
            msg = client.get_iopub_msg(timeout=5)
        except queue.Empty:
            break
        if msg["msg_type"] == "comm_msg" and updates is not None:
            updates.append(msg["content"]["data"].get("state", {}))
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "stream" and msg["content"]["name"] == "stdout":  # not the cluster's log lines
            out.append(msg["content"]["text"])
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            break
    if reply["content"]["status"] != "ok":
        raise AssertionError(f"kernel cell failed: {code!r}\n" + "\n".join(reply["content"].get("traceback", [])))
    return "".join(out)


@pytest.mark.slow
def test_in_a_kernel_the_monitor_refreshes_itself_on_the_kernel_loop_until_the_job_ends(cluster: Cluster) -> None:
    from jupyter_client.manager import start_new_kernel

    manager, client = start_new_kernel(startup_timeout=60)
    try:
        first = execute(client, KERNEL_SETUP.format(address=cluster.scheduler_address))
        # In a kernel the job, shown as a cell's last value, is its monitor (with the text summary beside it).
        assert first.strip() == f"True True ['{WIDGET_MIME}', 'text/plain'] ['{WIDGET_MIME}', 'text/plain']"
        looks: list[tuple[int, bool, str]] = []
        sent: list[dict[str, Any]] = []

        def look() -> tuple[int, bool, str, bool]:
            updates, live, status, complete = execute(client, KERNEL_LOOK, updates=sent).split()
            looks.append((int(updates), live == "True", status))
            return int(updates), live == "True", status, complete == "True"

        # The job runs until this test stops it. Between these cells the kernel is idle, and no cell refreshes
        # the monitor: updates that grow from one look to the next came from the kernel's event loop.
        seen = look()[0]

        def updated_while_idle() -> bool:
            updates, live, status, _ = look()
            assert live and status == "running", looks
            return updates > seen

        wait_for(updated_while_idle, "an update while the kernel was idle and the job running")
        execute(client, "job.stop(timeout=60)")
        wait_for(lambda: not look()[1], "the monitor to stop refreshing once the job ended")
        settled, _, status, complete = look()
        assert status == "stopped" and complete, looks  # the final update read every message
        assert int(execute(client, KERNEL_LOOK).split()[0]) == settled, looks  # and no update came after it
        shown, last_step = map(int, execute(client, KERNEL_SHOWN).split())
        assert shown == last_step > 0  # the progress bar shows the last step the job reported ...
        assert shown in [state.get("value") for state in sent]  # ... and so does the front end's
        # A monitor made for the ended job (the job shown again in a new cell) reads its servers' counters once.
        execute(client, "later = TrainingMonitor(job)")
        wait_for(
            lambda: (
                "waiting for" not in execute(client, "print(later.ps_table.value)")
                and "127.0.0.1" in execute(client, "print(later.ps_table.value)")
            ),
            "the ended job's monitor to show its servers' counters",
        )
    finally:
        try:
            execute(client, "job.close(); cluster.close()", timeout=60)
        finally:
            client.stop_channels()
            manager.shutdown_kernel(now=False)
