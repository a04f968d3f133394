"""Issue 18, items 6 to 9: what the TrainingMonitor shows must be true, checked on its widgets' state.

A ``RecordedJob`` holds metrics and events in the job's own formats: a resumed
job's losses near 0.002, an hour of metrics, a scale to three replicas, a flood
of checkpoints. The browser test (test_monitor_browser.py) looks at the same
cases drawn in JupyterLab.
"""

from __future__ import annotations

import doctest
import math
from collections.abc import Iterator

import bqplot as bq
import pytest

from cellgraph.testing import recorded_job
from cellgraph.testing.recorded_job import RecordedJob
from cellgraph.widgets import TrainingMonitor, training_monitor_events
from cellgraph.widgets.reprs import job_text
from cellgraph.widgets.training_monitor_data import MAX_POINTS, MetricSeries, nice_ticks, tick_format
from cellgraph.widgets.training_monitor_events import MAX_EVENTS, events_html, fold_checkpoints
from cellgraph.widgets.training_monitor_figures import NORMAL, STARTING, STRAGGLER, CurveFigure


@pytest.fixture
def job() -> RecordedJob:
    return RecordedJob(replicas=2, steps=100_000)


@pytest.fixture
def monitor(job: RecordedJob) -> Iterator[TrainingMonitor]:
    shown = TrainingMonitor(job)
    yield shown
    shown.close()


@pytest.mark.parametrize(
    ("low", "high"), [(0.0019, 0.0025), (1.0001, 1.0005), (0.0, 2.5), (1e-7, 3e-7), (10.0, 5000.0), (-3.0, 4.0)]
)
def test_tick_labels_tell_every_tick_apart_at_any_magnitude(low: float, high: float) -> None:
    fmt = tick_format(low, high)
    digits = int(fmt[1:-2])  # ".3~g": d3's g with trailing zeros trimmed, as Python's g writes it
    ticks = nice_ticks(low, high)
    labels = [f"{t:.{digits}g}" for t in ticks]
    assert len(set(labels)) == len(ticks) >= 3, (fmt, labels)
    assert all(math.isclose(float(label), t, rel_tol=1e-9, abs_tol=1e-12) for label, t in zip(labels, ticks))


def test_a_resumed_job_s_tiny_losses_get_a_tick_format(job: RecordedJob, monitor: TrainingMonitor) -> None:
    # bqplot's own choice below 1 is '.undefinedg': no labels, and the figure stops updating.
    job.play(0, range(5000, 6000, 10), loss=lambda s: 0.0025 - s * 1e-7)
    monitor.refresh()
    axis = monitor.loss.figure.axes[1]
    low, high = 0.0025 - 5990e-7, 0.0025 - 5000e-7
    assert axis.tick_format == tick_format(low, high) == ".4~g"  # 0.00192, 0.00194 ...
    assert list(axis.tick_values) == nice_ticks(low, high) == [0.00192, 0.00194, 0.00196, 0.00198, 0.002]


def test_the_loss_has_a_log_scale_option(job: RecordedJob, monitor: TrainingMonitor) -> None:
    job.play(0, range(0, 1000, 10), loss=lambda s: 2.0 * 0.99**s)
    job.play(1, range(0, 30, 10), loss=lambda s: 0.0)  # a loss of zero: no place on a log axis
    monitor.refresh()
    loss = monitor.loss
    assert isinstance(loss.figure.axes[1].scale, bq.LinearScale) and len(loss.lines[1].y) == 3
    loss.log_scale.value = True
    assert isinstance(loss.figure.axes[1].scale, bq.LogScale) and loss.figure.axes[1].tick_values is None  # decades
    assert all(isinstance(line.scales["y"], bq.LogScale) for line in loss.lines.values())
    assert len(loss.lines[0].y) == 100 and len(loss.lines[1].y) == 0
    assert "3 point(s) at or below 0 not drawn on the log scale" in loss.header.value
    job.play(0, range(1000, 1100, 10), loss=lambda s: 2.0 * 0.99**s)
    monitor.refresh()  # new points go on the log scale too
    assert len(loss.lines[0].y) == 110 and isinstance(loss.lines[0].scales["y"], bq.LogScale)
    loss.log_scale.value = False
    assert isinstance(loss.figure.axes[1].scale, bq.LinearScale) and len(loss.lines[1].y) == 3
    assert "not drawn" not in loss.header.value


def test_after_scale_down_and_stop_no_replica_that_left_is_a_straggler(
    job: RecordedJob, monitor: TrainingMonitor
) -> None:
    job.replicas = 3
    job.play(0, range(0, 100, 10), loss=lambda s: 1.0, rate=10.0)
    job.play(1, range(0, 100, 10), loss=lambda s: 1.0, rate=10.0)
    job.play(2, range(0, 50, 10), loss=lambda s: 1.0, rate=2.0, final=True)  # slow, then scaled away
    job.replicas = 2
    monitor.refresh()
    assert list(monitor.rates.bars.x) == ["replica 0", "replica 1"]
    assert monitor.rates.bars.colors == [NORMAL, NORMAL] and "straggler" not in monitor.rates_label.value
    assert "2 replica(s): 2 training" in monitor.title.value
    assert "replica 2 (left)" in monitor.loss.header.value
    job.play(0, [100], loss=lambda s: 1.0, final=True)
    job.play(1, [100], loss=lambda s: 1.0, final=True)
    job.stop()
    monitor.refresh()
    assert STRAGGLER not in monitor.rates.bars.colors and "straggler" not in monitor.rates_label.value
    assert monitor.rates_label.value == "the job has ended: each replica's last rate, none compared"
    assert monitor.title.value.endswith("· stopped · 2 replica(s)")
    assert "(left)" not in monitor.loss.header.value  # an ended job: every line is drawn alike


def test_a_replica_the_job_abandoned_hung_is_shown_abandoned_not_training(
    job: RecordedJob, monitor: TrainingMonitor
) -> None:
    job.replicas = 3
    for replica in (0, 2):
        job.play(replica, range(0, 160, 10), loss=lambda s: 1.0)
        job.play(replica, [160], loss=lambda s: 1.0, final=True)
    job.play(1, range(0, 30, 10), loss=lambda s: 1.0)  # then its worker was stopped: no last message
    # What the job does once replica 1 has not ended timeout_s after the last step (ReplicaSet.abandon_hung).
    job.abandoned = [1]
    job.event("the job reached its last step (160) and replica 1 on tcp://w1 did not end within timeout_s=10 s: ...")
    job.status = "finished"
    monitor.refresh()
    said = "replica 1 abandoned (hung after the last step: its task cancelled)"
    # Before: 'finished · 3 replica(s)', replica 1's bar and rate as if it had ended as the others.
    assert monitor.title.value.endswith(f"· finished · 3 replica(s), {said}")
    assert monitor.rates_label.value == f"the job has ended: each replica's last rate, none compared; {said}"


def test_a_straggler_among_active_replicas_still_shows(job: RecordedJob, monitor: TrainingMonitor) -> None:
    for replica, rate in [(0, 10.0), (1, 2.0), (2, 9.0)]:
        job.play(replica, range(0, 100, 10), loss=lambda s: 1.0, rate=rate)
    job.replicas = 3
    monitor.refresh()
    assert monitor.rates.bars.colors == [NORMAL, STRAGGLER, NORMAL]
    assert "straggler: replica 1" in monitor.rates_label.value


def test_after_scale_up_the_header_and_charts_show_the_same_replica_set(
    job: RecordedJob, monitor: TrainingMonitor
) -> None:
    job.play(0, range(0, 100, 10), loss=lambda s: 1.0)
    job.play(1, range(0, 100, 10), loss=lambda s: 1.0)
    monitor.refresh()
    job.scale(3)
    monitor.refresh()  # no new metrics: the new replica has not sent its first message
    assert "3 replica(s): 2 training, 1 starting" in monitor.title.value
    assert list(monitor.rates.bars.x) == ["replica 0", "replica 1", "starting 1"]
    assert monitor.rates.bars.colors == [NORMAL, NORMAL, STARTING] and "starting" in monitor.rates.header.value
    job.play(2, [100], loss=lambda s: 1.0)
    monitor.refresh()
    assert "3 replica(s): 3 training" in monitor.title.value
    assert list(monitor.rates.bars.x) == ["replica 0", "replica 1", "replica 2"]
    assert sorted(monitor.loss.lines) == [0, 1, 2] and "replica 2" in monitor.loss.header.value


def test_replica_set_counts_those_leaving() -> None:
    series = MetricSeries()
    series.extend({"replica": r, "step": 1, "steps": 1, "time": 1.0} for r in (0, 1, 2))
    assert series.replica_set(expected=2, running=True).describe() == "2 replica(s): 3 training, 1 leaving"
    assert series.replica_set(expected=2, running=False).left == [0, 1, 2]


def test_an_hour_of_metrics_keeps_between_200_and_max_points_and_the_latest(
    job: RecordedJob, monitor: TrainingMonitor
) -> None:
    job.play(0, range(0, 360_000, 10), loss=lambda s: 1.0 / (1 + s))  # 36,000 messages
    monitor.refresh()
    line = monitor.loss.lines[0]
    assert 200 <= len(line.x) <= MAX_POINTS
    assert float(line.x[-1]) == 359_990.0 and float(line.y[-1]) == 1.0 / (1 + 359_990)
    job.play(0, [360_000], loss=lambda s: 0.5)  # one more: the newest point is drawn at once
    monitor.refresh()
    assert float(line.x[-1]) == 360_000.0 and float(line.y[-1]) == 0.5 and len(line.x) <= MAX_POINTS


def test_legends_and_titles_are_above_the_figures(job: RecordedJob, monitor: TrainingMonitor) -> None:
    job.play(0, range(0, 100, 10), loss=lambda s: 1.0)
    monitor.refresh()
    for figure in (monitor.loss, monitor.metric, monitor.rates, monitor.shards):
        assert figure.figure.title == "" and figure.figure.legend_location  # bqplot draws neither
        assert not any(getattr(mark, "display_legend", False) for mark in figure.figure.marks)
        assert figure.widget.children[-1] is figure.figure  # the HTML line with title and key comes first
    assert "<b>loss</b>" in monitor.loss.header.value and "replica 0" in monitor.loss.header.value
    assert "<b>PS bytes per shard</b>" in monitor.shards.header.value


CKPT = "checkpoint ckpt-{:010d} written (every 100 steps) in /tmp/ckpts"


def test_checkpoints_written_within_one_second_say_so(job: RecordedJob, monitor: TrainingMonitor) -> None:
    for i in range(1, 4):  # a fast job: three checkpoints in the same second read "about one every 0 s"
        job.event(CKPT.format(100 * i), at="12:00:07")
    monitor.refresh()
    assert (
        "12:00:07 checkpoints: 3 written, latest ckpt-0000000300 (every 100 steps), all within one second, "
        "in /tmp/ckpts" in monitor.events_html.value
    )


def test_checkpoints_fold_into_one_line_that_updates(job: RecordedJob, monitor: TrainingMonitor) -> None:
    job.event("scaled to 3 replica(s): replica(s) 2 start on tcp://127.0.0.1:4001", at="12:00:00")
    for i in range(1, 301):  # 300 checkpoints, 3 a second: more than the panel keeps
        job.event(CKPT.format(100 * i), at=f"12:{(i // 3) // 60:02d}:{(i // 3) % 60:02d}")
        if i == 150:
            job.event("replica 1 failed: ValueError: boom", at="12:00:50")
    monitor.refresh()
    shown = monitor.events_html.value
    assert shown.count("ckpt-") == 1  # the summary line names the latest only
    assert (
        "12:01:40 checkpoints: 300 written, latest ckpt-0000030000 (every 100 steps), about one every 0.33 s, "
        "in /tmp/ckpts" in shown
    )
    assert "scaled to 3 replica(s)" in shown and "replica 1 failed: ValueError: boom" in shown
    assert "events (2, newest first; 300 checkpoint(s) in one line)" in shown
    job.event(CKPT.format(30100), at="12:01:41")
    monitor.refresh()
    assert "301 written, latest ckpt-0000030100" in monitor.events_html.value


def test_other_events_past_the_limit_are_counted() -> None:
    events = [f"12:00:00 worker {i} joined" for i in range(MAX_EVENTS + 5)]
    assert "5 earlier event(s) not shown" in events_html(events)
    assert fold_checkpoints(events).summary is None


def test_a_failed_checkpoint_stays_a_line_of_its_own() -> None:
    events = ["12:00:01 " + CKPT.format(100), "12:00:02 checkpoint (final) failed: disk full"]
    folded = fold_checkpoints(events)
    assert folded.checkpoints == 1 and folded.others == ["12:00:02 checkpoint (final) failed: disk full"]


def test_curve_figure_closes_both_scales() -> None:
    figure = CurveFigure("loss", "loss", log_option=True)
    figure.close()
    assert figure.linear.comm is None and figure.log.comm is None and figure.figure.comm is None


@pytest.mark.parametrize("module", [recorded_job, training_monitor_events])
def test_docstring_examples(module: object) -> None:
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)  # type: ignore[arg-type]
    assert result.failed == 0 and result.attempted > 0


def test_the_text_summary_compares_only_training_replicas_and_folds_checkpoints(job: RecordedJob) -> None:
    job.play(0, range(0, 100, 10), loss=lambda s: 1.0, rate=10.0)
    job.play(1, range(0, 100, 10), loss=lambda s: 1.0, rate=10.0)
    job.play(2, range(0, 50, 10), loss=lambda s: 1.0, rate=2.0, final=True)  # slow, then scaled away
    job.event("scaled to 2 replica(s): replica(s) 2 leave after their step", at="12:00:00")
    for i in range(1, 21):
        job.event(CKPT.format(100 * i), at=f"12:00:{i:02d}")
    text = job_text(job)
    assert text.startswith("Job job-recorded: running, 2 replica(s): 2 training\n")
    assert "straggler" not in text
    assert "    12:00:20 checkpoints: 20 written, latest ckpt-0000002000 (every 100 steps), about one every 1 s" in text
    assert "    12:00:00 scaled to 2 replica(s)" in text and text.count("ckpt-") == 1


def test_a_short_job_draws_a_point_per_step_from_the_messages_step_losses() -> None:
    # Two messages for 300 steps (a fast job, messages every half second): the curve has all 300 points.
    series = MetricSeries()
    for first in (1, 151):
        steps = list(range(first, first + 150))
        series.extend(
            [
                {
                    "replica": 0,
                    "step": steps[-1],
                    "loss": 1.0 / steps[-1],
                    "steps": steps[-1],
                    "time": float(first),
                    "step_losses": {"step": steps, "loss": [1.0 / s for s in steps]},
                }
            ]  # fmt: skip
        )
    xs, ys = series.curve(0, "loss")
    assert xs == [float(s) for s in range(1, 301)] and ys[-1] == 1.0 / 300
    assert series.curve(0, "steps")[0] == [150.0, 300.0]  # other metrics: a point per message
