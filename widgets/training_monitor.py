"""``TrainingMonitor(job)``: a training job's curves, progress, replica rates, PS load, events, and its controls.

Where each part comes from:

- loss and metric curves, replica step rates, progress and ETA: the job's
  metrics messages (``job.metrics``), read from the index last seen, so a
  refresh costs the new messages only;
- parameter-server load and bytes: ``job.ps_stats()``, a call to the servers,
  made on a worker thread so that a slow or lost server never blocks the
  kernel; the monitor shows the latest answer;
- events: ``job.events``; Stop and Scale: ``job.stop()`` and ``job.scale(n)``,
  on a worker thread too (both wait for replicas), their outcome shown in the
  monitor's message line.

Inside a kernel the monitor refreshes itself every ``interval`` seconds on the
kernel's event loop (``kernel_loop``), throttled to at most ten updates a
second, until the job has ended (then once more, with the final counters) or
the monitor is closed. Elsewhere it shows what ``refresh()`` last read.

Examples
--------
>>> job = cg.train(loss, (x, y), cluster=cluster, steps=300)  # doctest: +SKIP
>>> monitor = TrainingMonitor(job)  # doctest: +SKIP
>>> monitor  # the last value of a cell: the widget  # doctest: +SKIP
>>> monitor.refresh()  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import html
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol

import anywidget
import ipywidgets as widgets
import traitlets

from .kernel_loop import Throttle, Ticker, kernel_loop
from .training_monitor_data import MetricSeries, format_bytes, stragglers
from .training_monitor_events import events_html
from .training_monitor_figures import CurveFigure, RateFigure, ShardFigure, close_figure

# Updates at most ten a second: IOPub drops floods, and a browser draws no faster.
MIN_INTERVAL_S = 0.1
# After the job ends, its watcher still writes the final checkpoint and event: keep refreshing this long.
FINAL_GRACE_S = 2.0
# job.stop() waits for every replica to finish its step (and, in sync mode, its peers).
STOP_TIMEOUT_S = 120.0
METRICS = {"examples_per_s": "examples / s", "step_time_s": "seconds per step", "staleness": "staleness (steps)"}
# What the monitor keeps refreshing for: a job that cg.train returned while it starts, and a running one.
LIVE = ("starting", "running")
STATUS_STYLE = {"starting": "info", "running": "info", "finished": "success", "stopped": "warning", "failed": "danger"}


class MonitoredJob(Protocol):
    """What the monitor reads and calls on a job: ``cellgraph.cluster.job.Job`` has all of it."""

    job_id: str
    metrics: list[dict[str, Any]]
    events: list[str]
    checkpoints: list[str]
    steps: int
    replicas: int

    @property
    def status(self) -> str: ...

    @property
    def abandoned(self) -> list[int]: ...

    def ps_stats(self) -> list[dict[str, Any]]: ...

    def stop(self, timeout: float = ...) -> Any: ...

    def scale(self, n: int) -> Any: ...


class MonitorTitle(anywidget.AnyWidget):
    """The monitor's header line (``value``, HTML); once its kernel is gone (restarted, shut down) the page shows
    ``gone`` instead, so that a job last seen running does not stay "running" on a page no kernel updates."""

    _esm = Path(__file__).with_name("training_monitor_title.js")
    value = traitlets.Unicode("").tag(sync=True)
    gone = traitlets.Unicode("").tag(sync=True)


class TrainingMonitor(widgets.VBox):
    """A live view of a training job, with Stop and Scale controls.

    Parameters
    ----------
    job
        The ``Job`` that ``cg.train`` returned.
    interval
        Seconds between refreshes inside a kernel (at least ``MIN_INTERVAL_S``).

    Examples
    --------
    >>> monitor = TrainingMonitor(job)  # doctest: +SKIP
    >>> monitor.stop_button.click()  # what the Stop button does: job.stop() on a worker thread  # doctest: +SKIP
    >>> monitor.action.result(timeout=120)  # doctest: +SKIP
    'stop job job-1a2b3c4d: done; the job is stopped with 2 replica(s)'
    """

    def __init__(self, job: MonitoredJob, interval: float = 0.5) -> None:
        self.job = job
        self.series = MetricSeries()
        self.updates = 0
        """How many times the monitor updated its widgets."""
        self.action: Future[str] | None = None
        """The latest Stop or Scale, running on a worker thread; its result is the message it showed."""
        self._seen = 0  # job.metrics[: self._seen] are in self.series
        self._events_shown = -1
        self._drawn_set: tuple[str, int] | None = None  # (status, job.replicas) the replica figures show
        self._ps: list[dict[str, Any]] = []
        self._ps_drawn: list[dict[str, Any]] | None = None
        self._ps_note = "waiting for the parameter servers' counters"
        self._ps_fetch: Future[None] | None = None
        self._note = ""  # set by worker threads, shown by the next update
        self._ended_at: float | None = None
        self._executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix=f"cellgraph-monitor-{job.job_id}")
        self._loop = kernel_loop()
        self._throttle = Throttle(
            self._update, MIN_INTERVAL_S, call_later=self._loop.call_later if self._loop else None
        )
        self._ticker = Ticker(self._loop, max(interval, MIN_INTERVAL_S), self._tick) if self._loop else None
        super().__init__(children=self._build())
        self._update()
        if self._ticker is not None and self.job.status in LIVE:
            self._ticker.start()
            self._fetch_ps_soon()
        elif self._loop is not None:
            # Shown for a job that has ended: its servers' counters read once, off the kernel's thread (a closed
            # job's servers may take their deadline to fail), then shown; not "waiting for" them for ever.
            self._fetch_ps_soon()
            if self._ps_fetch is not None:
                self._ps_fetch.add_done_callback(lambda _: self._show_soon())

    # ------------------------------------------------------------------ layout
    def _build(self) -> list[widgets.Widget]:
        self.title = MonitorTitle()
        self.progress = widgets.IntProgress(min=0, max=max(self.job.steps, 1), layout={"width": "40%"})
        self.progress_label = widgets.HTML()
        self.loss = CurveFigure("loss", "loss", log_option=True)
        self.metric = CurveFigure(METRICS["examples_per_s"], METRICS["examples_per_s"])
        self.metric_choice = widgets.Dropdown(
            options=[(label, key) for key, label in METRICS.items()],
            value="examples_per_s",
            description="metric",
            layout={"width": "230px"},
        )
        self.metric_choice.observe(lambda _: self._draw_metric(), names="value")
        self.rates = RateFigure()
        self.rates_label = widgets.HTML()
        self.shards = ShardFigure()
        self.ps_table = widgets.HTML()
        self.events_html = widgets.HTML()
        self.stop_button = widgets.Button(description="Stop", button_style="danger", icon="stop")
        self.stop_button.on_click(lambda _: self.stop())
        self.scale_input = widgets.BoundedIntText(
            value=max(self.job.replicas, 1), min=1, max=1024, description="replicas", layout={"width": "160px"}
        )
        self.scale_button = widgets.Button(description="Scale", icon="arrows-h")
        self.scale_button.on_click(lambda _: self.scale(self.scale_input.value))
        self.message = widgets.HTML()
        row = {"width": "100%", "flex_flow": "row wrap"}
        head = self.metric.widget.children[0]  # the metric's title and key, then its choice
        head.children = (*head.children, self.metric_choice)
        return [
            self.title,
            widgets.HBox([self.progress, self.progress_label]),
            widgets.HBox([self.loss.widget, self.metric.widget], layout=row),
            widgets.HBox([self.rates.widget, self.shards.widget], layout=row),
            widgets.HBox([self.rates_label, self.ps_table], layout=row),
            self.events_html,
            widgets.HBox([self.stop_button, self.scale_input, self.scale_button, self.message]),
        ]

    # ------------------------------------------------------------------ refreshing
    @property
    def live(self) -> bool:
        """Whether the monitor refreshes itself (inside a kernel, until the job has ended or it is closed)."""
        return self._ticker is not None and self._ticker.running

    def refresh(self) -> None:
        """Read the job now, the parameter servers' counters included (a call to them, in this thread), and show it."""
        self._fetch_ps()
        self._update()

    def request_refresh(self) -> bool:
        """Ask for an update, throttled to one per ``MIN_INTERVAL_S``; True if it happened now."""
        return self._throttle.request()

    def _tick(self) -> bool:
        """One beat of the kernel-loop refresh; False once the final update is shown."""
        self.request_refresh()
        if self.job.status in LIVE:
            self._ended_at = None
        elif self._ended_at is None:
            self._ended_at = time.monotonic()
        elif time.monotonic() - self._ended_at >= FINAL_GRACE_S and self._ps_fetch_done():
            self._throttle.cancel()
            self._update()  # the final state: the last metrics, events and counters
            return False
        self._fetch_ps_soon()
        return True

    def _show_soon(self) -> None:
        """An update on the kernel's loop, from any thread (nothing once the loop is closed)."""
        if self._loop is not None:
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._update)

    def _fetch_ps(self) -> None:
        try:
            self._ps, self._ps_note = self.job.ps_stats(), ""
        except Exception as err:  # the servers gone or the job closed: keep the last counters, say why
            if self.job.status in LIVE:
                self._ps_note = f"parameter servers not answering ({type(err).__name__}: {err}); counters as last seen"
            else:  # a closed job's servers are gone by design: its error says so, and where its checkpoint is
                self._ps_note = f"{err}; counters as last seen"

    def _ps_fetch_done(self) -> bool:
        return self._ps_fetch is None or self._ps_fetch.done()

    def _fetch_ps_soon(self) -> None:
        """Start a read of the PS counters on a worker thread, unless one is under way."""
        if self._ps_fetch_done():
            try:
                self._ps_fetch = self._executor.submit(self._fetch_ps)
            except RuntimeError:  # the executor was shut down: the monitor is closed
                self._ps_fetch = None

    def _update(self) -> None:
        """Show what is new since the last update. Runs on the kernel's loop (or the caller's thread)."""
        new = self.job.metrics[self._seen :]  # the job only appends: a slice is a consistent snapshot
        self._seen += len(new)
        self.series.extend(new)
        status = self.job.status
        progress = self.series.progress(self.job.steps, max((s["global_step"] for s in self._ps), default=0))
        running = status == "running"
        replica_set = self.series.replica_set(self.job.replicas, running)
        replicas = replica_set.describe() if running else f"{self.job.replicas} replica(s)"  # none trains now
        # A replica hung after the last step that the job gave up on: its last message was not its last, so the
        # figures alone drew it as one still training (job.events says it).
        abandoned = _abandoned(self.job.abandoned)
        replicas += f", {abandoned}" if abandoned else ""
        job = f"<b>Job {html.escape(self.job.job_id)}</b>"
        with self.title.hold_sync():
            self.title.value = f"{job} · {status} · {replicas}"
            self.title.gone = (
                f"{job} · no longer followed: the notebook's kernel restarted or stopped, so nothing here updates "
                f"(last seen {status} · {replicas})"
            )
        with self.progress.hold_sync():
            self.progress.value = min(progress.step, self.progress.max)
            self.progress.bar_style = STATUS_STYLE.get(status, "")
        self.progress_label.value = html.escape(progress.describe(running=status == "running"))
        if new or self._drawn_set != (status, self.job.replicas):
            self._drawn_set = (status, self.job.replicas)
            left = replica_set.left if running else []  # once the job has ended, no line is one that left
            self.loss.draw({r: self.series.curve(r, "loss") for r in self.series.replicas}, left)
            self._draw_metric()
            # Only replicas still training are compared: one that left (scaled down, or the job ended) is no
            # straggler, and one that job.scale started shows as starting until its first message.
            # Once the job has ended, every replica's last rate, none compared.
            rates = self.series.rates()
            rates = {r: rates[r] for r in replica_set.training} if running else rates
            slow = stragglers(rates) if running else []
            self.rates.draw(rates, slow, replica_set.starting)
            self.rates_label.value = _describe_rates(rates, slow, running) + (f"; {abandoned}" if abandoned else "")
        if self._ps is not self._ps_drawn:  # each read of the counters makes a new list
            self._ps_drawn = self._ps
            self.shards.draw(self._ps)
        self.ps_table.value = _ps_table(self._ps, self._ps_note)
        if len(self.job.events) != self._events_shown:
            events = list(self.job.events)
            self._events_shown = len(events)
            self.events_html.value = events_html(events)
        # One action at a time, and none on an ended job (a starting one can be stopped: job.stop waits for its start).
        busy = status not in LIVE or (self.action is not None and not self.action.done())
        self.stop_button.disabled = self.scale_button.disabled = busy
        if self._note:
            self.message.value, self._note = html.escape(self._note), ""
        self.updates += 1

    def _draw_metric(self) -> None:
        key = str(self.metric_choice.value)
        self.metric.retitle(METRICS[key], METRICS[key])
        running = self.job.status == "running"
        left = self.series.replica_set(self.job.replicas, running).left if running else []
        self.metric.draw({r: self.series.curve(r, key) for r in self.series.replicas}, left)

    # ------------------------------------------------------------------ controls
    def stop(self) -> Future[str]:
        """Ask the job to stop (each replica finishes its step; then a final checkpoint); returns at once.

        ``job.stop()`` waits for the replicas, so it runs on a worker thread;
        the returned future's result is the message the monitor shows.
        """
        self.message.value = "stopping: each replica finishes its step, then a final checkpoint is written"
        return self._act(f"stop job {self.job.job_id}", lambda: self.job.stop(timeout=STOP_TIMEOUT_S))

    def scale(self, replicas: int) -> Future[str]:
        """Ask the job to go on with ``replicas`` replicas (``job.scale``); returns at once, as ``stop`` does."""
        self.message.value = f"scaling job {html.escape(self.job.job_id)} to {replicas} replica(s)"
        return self._act(f"scale job {self.job.job_id} to {replicas} replica(s)", lambda: self.job.scale(replicas))

    def _act(self, what: str, call: Callable[[], Any]) -> Future[str]:
        if self.action is not None and not self.action.done():
            busy: Future[str] = Future()
            busy.set_result(f"could not {what}: the monitor is still waiting for the previous action to finish")
            self.message.value = html.escape(busy.result())
            return busy
        self.action = self._executor.submit(self._run_action, what, call)
        self.stop_button.disabled = self.scale_button.disabled = True
        return self.action

    def _run_action(self, what: str, call: Callable[[], Any]) -> str:
        """On a worker thread: run ``call``; leave the outcome for the next update, and wake the loop for it."""
        try:
            call()
            note = f"{what}: done; the job is {self.job.status} with {self.job.replicas} replica(s)"
        except Exception as err:  # shown in the widget: the user pressed a button, there is no cell to raise into
            note = f"could not {what}: {type(err).__name__}: {err}"
        self._note = note
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self.request_refresh)
        return note

    # ------------------------------------------------------------------ lifetime
    def close(self) -> None:
        """Stop refreshing, and close this widget and every widget inside it."""
        if self._ticker is not None:
            self._ticker.stop()
        self._throttle.cancel()
        self._executor.shutdown(wait=False, cancel_futures=True)
        self.loss.close()
        self.metric.close()
        for figure in (self.rates.figure, self.shards.figure):
            close_figure(figure)
        _close_boxes(self.children)
        super().close()

    def __repr__(self) -> str:
        head = f"<TrainingMonitor of job {self.job.job_id}: {self.job.status}, {self.updates} update(s)"
        if self.comm is None:  # closed: IPython shows only this text now, where the monitor was (ipywidgets' close)
            return head + ", closed: display the job itself again for a new monitor>"
        return head + ">"


def _close_boxes(children: Sequence[widgets.Widget]) -> None:
    for child in children:
        if isinstance(child, widgets.Box):
            _close_boxes(child.children)
        child.close()


def _abandoned(replicas: Sequence[int]) -> str:
    """``replica 1 abandoned (hung after the last step: its task cancelled)``, or ``""`` for none."""
    if not replicas:
        return ""
    return f"replica {', '.join(map(str, replicas))} abandoned (hung after the last step: its task cancelled)"


def _describe_rates(rates: dict[int, float], slow: Sequence[int], running: bool) -> str:
    if not running:
        return "the job has ended: each replica's last rate, none compared" if rates else ""
    if not rates:
        return ""
    if not slow:
        return f"{len(rates)} replica(s) keep pace"
    fast = max(rates.values())
    words = ", ".join(f"replica {r} ({rates[r]:.3g} steps/s)" for r in slow)
    return f'<span style="color:#e15759">straggler: {words}; the fastest does {fast:.3g} steps/s</span>'


PS_COLUMNS = ("shard", "address", "step", "updates", "applied", "stale", "rejected", "in", "out", "load")


def _ps_row(s: dict[str, Any], total: int) -> tuple[object, ...]:
    """One shard's cells, as ``PS_COLUMNS``; load is its share of all bytes in and out (a hot shard stands out)."""
    moved = s["bytes_in"] + s["bytes_out"]
    counts = (s["global_step"], s["updates"], s["pushes_applied"], s["pushes_stale"], s["pushes_rejected"])
    return (
        s["shard"],
        s["address"],
        *counts,
        format_bytes(s["bytes_in"]),
        format_bytes(s["bytes_out"]),
        f"{moved / total:.0%}",
    )


def _ps_table(stats: Sequence[dict[str, Any]], note: str) -> str:
    total = sum(s["bytes_in"] + s["bytes_out"] for s in stats) or 1
    head = "".join(f"<th>{c}</th>" for c in PS_COLUMNS)
    rows = "".join(
        "<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in _ps_row(s, total)) + "</tr>" for s in stats
    )
    caption = f"<div><i>{html.escape(note)}</i></div>" if note else ""
    return f"<table><tr>{head}</tr>{rows}</table>{caption}"
