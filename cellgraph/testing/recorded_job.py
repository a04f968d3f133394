"""A job that plays back metrics and events as a real one records them, for the TrainingMonitor's tests.

What the monitor reads of a job is plain data (``job.metrics``, ``job.events``,
``job.status``, ``job.replicas``): ``RecordedJob`` holds the same, and a test
(or a notebook cell in the browser tests) appends to it in the job's own
formats, so that a resumed job's tiny losses, an hour of metrics, a scale to
three replicas or a flood of checkpoints can be shown without training for
that long. The monitor's behaviour on real jobs is tested on a LocalCluster
(tests/widgets/test_training_monitor.py).

Examples
--------
>>> job = RecordedJob(replicas=2, steps=1000)
>>> job.play(replica=0, steps=range(0, 300, 100), loss=lambda s: 0.002)
>>> [m["step"] for m in job.metrics], job.metrics[-1]["loss"]
([0, 100, 200], 0.002)
>>> job.event("checkpoint ckpt-0000000100 written (every 100 steps) in /tmp/c", at="12:00:01")
>>> job.events
['12:00:01 checkpoint ckpt-0000000100 written (every 100 steps) in /tmp/c']
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any


class RecordedJob:
    """Plain data with a job's public reading interface (``MonitoredJob``); Stop and Scale change the status and
    the replica count as a job's would."""

    def __init__(self, replicas: int, steps: int, job_id: str = "job-recorded") -> None:
        self.job_id = job_id
        self.replicas = replicas
        self.steps = steps
        self.metrics: list[dict[str, Any]] = []
        self.events: list[str] = []
        self.checkpoints: list[str] = []
        self.status = "running"
        self.abandoned: list[int] = []  # replicas hung after the last step that the job gave up on
        self._counts: dict[int, int] = {}

    def play(
        self,
        replica: int,
        steps: Iterable[int],
        loss: Callable[[int], float],
        rate: float = 10.0,
        start: float = 1_000.0,
        final: bool = False,
    ) -> None:
        """Append ``replica``'s messages at global ``steps`` (one each), its own counter moving ``rate`` steps a
        second from ``start`` (a wall-clock time); the last one ``final`` (the replica left) if asked."""
        steps = list(steps)
        for i, step in enumerate(steps):
            count = self._counts.get(replica, 0) + 1
            self._counts[replica] = count
            self.metrics.append(
                {
                    "job": self.job_id,
                    "replica": replica,
                    "step": step,
                    "loss": loss(step),
                    "examples_per_s": 64 * rate,
                    "step_time_s": 1.0 / rate,
                    "staleness": 0,
                    "ps_bytes": 1000 * count,
                    "steps": count,
                    "final": final and i == len(steps) - 1,
                    "time": start + count / rate,
                }
            )

    def event(self, text: str, at: str | None = None) -> None:
        """Append an event as the job words them: the time of day, then ``text``."""
        self.events.append(f"{at or time.strftime('%H:%M:%S')} {text}")

    def ps_stats(self) -> list[dict[str, Any]]:
        return []

    def stop(self, timeout: float = 60.0) -> RecordedJob:
        self.status = "stopped"
        return self

    def scale(self, n: int) -> RecordedJob:
        self.replicas = n
        return self


__all__ = ["RecordedJob"]
