"""What the TrainingMonitor shows, computed from a job's plain data: curves, progress, replica rates, stragglers.

No widgets here: every figure is a pure function of the metrics messages a
job collected (``cellgraph.cluster.replica.METRIC_KEYS``), so it is tested
without a kernel and shared with the text summary outside Jupyter.

Examples
--------
>>> series = MetricSeries()
>>> series.extend([
...     {"replica": 0, "step": 10, "steps": 10, "loss": 1.0, "time": 100.0},
...     {"replica": 0, "step": 30, "steps": 30, "loss": 0.5, "time": 101.0},
...     {"replica": 1, "step": 30, "steps": 10, "loss": 0.6, "time": 101.0, "step_time_s": 0.1},
... ])
>>> series.column(0, "loss")
[1.0, 0.5]
>>> series.rates()
{0: 20.0, 1: 10.0}
>>> stragglers({0: 20.0, 1: 10.0, 2: 19.0})
[1]
>>> p = series.progress(target=100)
>>> p.step, p.rate, p.eta_s
(30, 20.0, 3.5)
>>> series.replica_set(expected=3, running=True).describe()
'3 replica(s): 2 training, 1 starting'
>>> tick_format(0.0019, 0.0025), tick_format(1.0001, 1.0005)
('.3~g', '.6~g')
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# The numeric keys of a metrics message that the monitor plots or computes with.
COLUMNS = ("step", "loss", "examples_per_s", "step_time_s", "staleness", "steps", "time")
# Rates are slopes over the last few seconds of messages: long enough to smooth a metrics interval's jitter,
# short enough that a replica slowing down shows within a few refreshes.
RATE_WINDOW_S = 5.0
# The most points a curve sends to the browser: every update sends a line whole, and hours of metrics would make
# each one a large message (the shape of a curve shows at this many points).
MAX_POINTS = 2000
# The most per-step losses kept per replica (then thinned to half): the curve is drawn from at most MAX_POINTS.
KEPT_LOSSES = 100_000
# A replica more than this fraction below the median rate is a straggler.
STRAGGLER_MARGIN = 0.2
# About as many ticks as bqplot draws on a 260-pixel axis: the format must tell neighbouring ticks apart.
TICKS = 5
# Significant digits of a tick label: at least enough to read, at most what a float64 holds.
MIN_DIGITS, MAX_DIGITS = 2, 15


def _number(value: Any) -> float:
    return math.nan if value is None else float(value)


class MetricSeries:
    """Metrics messages split by replica into columns, appended as they arrive (the monitor never re-reads old ones)."""

    def __init__(self) -> None:
        self._columns: dict[int, dict[str, list[float]]] = {}
        self._final: dict[int, bool] = {}
        # Per replica, every step's loss the messages carried (``step_losses``): the loss curve's points.
        self._losses: dict[int, tuple[list[float], list[float]]] = {}
        self.count = 0

    def extend(self, messages: Iterable[Mapping[str, Any]]) -> None:
        """Append ``messages`` (dicts with ``replica`` and some of ``COLUMNS``)."""
        for message in messages:
            columns = self._columns.setdefault(int(message["replica"]), {key: [] for key in COLUMNS})
            for key in COLUMNS:
                columns[key].append(_number(message.get(key)))
            # A replica that left (scaled down, or the job ended) sent its last message; one run again sends more.
            self._final[int(message["replica"])] = bool(message.get("final"))
            per_step = message.get("step_losses")
            if per_step:
                steps, losses = self._losses.setdefault(int(message["replica"]), ([], []))
                steps.extend(float(s) for s in per_step["step"])
                losses.extend(float(v) for v in per_step["loss"])
                if len(steps) > KEPT_LOSSES:  # hours of steps: every other point, the latest kept
                    self._losses[int(message["replica"])] = thin(steps, losses, KEPT_LOSSES // 2)
            self.count += 1

    @property
    def replicas(self) -> list[int]:
        """The replicas that sent a message, in order."""
        return sorted(self._columns)

    @property
    def active(self) -> list[int]:
        """The replicas whose latest message was not their last."""
        return [r for r in self.replicas if not self._final[r]]

    def replica_set(self, expected: int, running: bool) -> ReplicaSet:
        """Which replicas train, which left, and how many of the ``expected`` (``job.replicas``) have not yet
        sent a message (a replica ``job.scale`` just started): the job's replica set as its metrics show it."""
        training = self.active if running else []
        left = [r for r in self.replicas if r not in training]
        starting = max(0, expected - len(training)) if running else 0
        leaving = max(0, len(training) - expected) if running else 0
        return ReplicaSet(training, left, starting, leaving)

    def column(self, replica: int, key: str) -> list[float]:
        """``key``'s values of ``replica``'s messages, in arrival order (NaN where a message lacked it)."""
        if key not in COLUMNS:
            raise KeyError(f"no metric column {key!r}: the monitor keeps {', '.join(COLUMNS)}")
        return list(self._columns.get(replica, {}).get(key, []))

    def curve(self, replica: int, key: str) -> tuple[list[float], list[float]]:
        """``(global steps, values)`` of ``key`` for ``replica``, leaving out messages without a value; for the
        loss, every step's the messages carried."""
        if key == "loss" and replica in self._losses:
            steps, losses = self._losses[replica]
            return list(steps), list(losses)
        points = [(s, v) for s, v in zip(self.column(replica, "step"), self.column(replica, key)) if not math.isnan(v)]
        return [s for s, _ in points], [v for _, v in points]

    def _slope(self, replica: int, key: str) -> float:
        """Growth of ``key`` per second over ``replica``'s last ``RATE_WINDOW_S`` of messages; NaN if unknown."""
        times, values = self.column(replica, "time"), self.column(replica, key)
        end = len(times) - 1
        if end < 1 or math.isnan(times[end]):
            return math.nan
        start = end
        # Back through the window (always to the message before the last), but not past a drop: a replica that
        # Dask ran again counts its steps from 0.
        while (
            start > 0
            and values[start - 1] <= values[start]
            and (start == end or times[end] - times[start - 1] <= RATE_WINDOW_S)
        ):
            start -= 1
        elapsed = times[end] - times[start]
        return (values[end] - values[start]) / elapsed if elapsed > 0 else math.nan

    def rates(self) -> dict[int, float]:
        """Each replica's own steps per second (from its ``steps`` counter; ``1 / step_time_s`` after one message)."""
        rates = {}
        for replica in self.replicas:
            rate = self._slope(replica, "steps")
            if math.isnan(rate):
                step_time = self.column(replica, "step_time_s")[-1]
                rate = 1.0 / step_time if step_time > 0 else 0.0
            rates[replica] = rate
        return rates

    def progress(self, target: int, step: int | None = None) -> Progress:
        """The job's progress toward ``target`` global steps: ``step`` if known, else the highest step reported."""
        reported = max((int(s) for r in self.replicas for s in self.column(r, "step") if not math.isnan(s)), default=0)
        slopes = [s for s in (self._slope(r, "step") for r in self.replicas) if not math.isnan(s)]
        # Every replica sees the same global step advance: their slopes agree up to jitter, so take the middle one.
        rate = statistics.median(slopes) if slopes else 0.0
        return Progress(max(reported, step or 0), target, rate)


@dataclass(frozen=True)
class ReplicaSet:
    """A job's replicas as the monitor shows them.

    ``training``: those whose latest message was not their last (while the job
    runs); ``left``: the others (all of them once the job has ended);
    ``starting``: replicas asked for that have sent nothing yet; ``leaving``:
    replicas told to leave that have not sent their last message.
    """

    training: list[int]
    left: list[int]
    starting: int
    leaving: int

    def describe(self) -> str:
        """``3 replica(s): 2 training, 1 starting`` (the count is what the job asked for)."""
        parts = [f"{len(self.training)} training"]
        parts += [f"{self.starting} starting"] if self.starting else []
        parts += [f"{self.leaving} leaving"] if self.leaving else []
        return f"{len(self.training) + self.starting - self.leaving} replica(s): {', '.join(parts)}"


@dataclass(frozen=True)
class Progress:
    """How far a job is: ``step`` of ``target`` global steps, moving at ``rate`` steps per second (0 if unknown)."""

    step: int
    target: int
    rate: float

    @property
    def fraction(self) -> float:
        return min(1.0, self.step / self.target) if self.target > 0 else 1.0

    @property
    def eta_s(self) -> float | None:
        """Seconds left at the current rate; None while the rate is unknown."""
        if self.step >= self.target:
            return 0.0
        return (self.target - self.step) / self.rate if self.rate > 0 else None

    def describe(self, running: bool = True) -> str:
        """``step 150 of 300 (50%), 24.1 steps/s, ETA 6 s``; the step alone once the job is not ``running``."""
        text = f"step {self.step} of {self.target} ({self.fraction:.0%})"
        if not running:
            return text
        if self.rate > 0:
            text += f", {self.rate:.3g} steps/s"
        eta = self.eta_s
        return text + (f", ETA {format_duration(eta)}" if eta is not None and eta > 0 else "")


def thin(xs: Sequence[float], ys: Sequence[float], limit: int = MAX_POINTS) -> tuple[list[float], list[float]]:
    """At most ``limit`` evenly spaced points of a curve, its first and last (the latest) always among them."""
    if len(xs) <= limit:
        return list(xs), list(ys)
    last = len(xs) - 1
    keep = [round(i * last / (limit - 1)) for i in range(limit)]
    return [xs[i] for i in keep], [ys[i] for i in keep]


def tick_format(lo: float, hi: float) -> str:
    """A d3 format for axis ticks between ``lo`` and ``hi``, at any magnitude: enough significant digits to tell
    neighbouring ticks apart (``.3~g`` for 0.0019 to 0.0025, ``.6~g`` for 1.0001 to 1.0005), trailing zeros trimmed.

    bqplot's own choice fails below 1 (``invalid format: .undefinedg``), which leaves the axis without labels and
    the figure without updates: the monitor always sets one. On a log axis too: over less than a decade its ticks
    are a linear axis's, and over several, 1 to 9 times each power of ten, which these digits also tell apart.
    """
    magnitude = max(abs(lo), abs(hi))
    if not math.isfinite(magnitude) or magnitude == 0:
        return f".{MIN_DIGITS + 1}~g"
    span = hi - lo if math.isfinite(hi - lo) and hi > lo else magnitude
    digits = math.ceil(math.log10(magnitude * TICKS / span)) + 1
    return f".{min(MAX_DIGITS, max(MIN_DIGITS + 1, digits))}~g"


def nice_ticks(lo: float, hi: float, count: int = TICKS) -> list[float]:
    """About ``count`` round tick values within ``[lo, hi]``: a step of 1, 2 or 5 times a power of ten.

    >>> nice_ticks(0.0019, 0.00202)
    [0.0019, 0.00192, 0.00194, 0.00196, 0.00198, 0.002, 0.00202]
    """
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        return [lo] if math.isfinite(lo) else []
    raw = (hi - lo) / count
    power = 10.0 ** math.floor(math.log10(raw))
    error = raw / power  # d3's rule: the multiple of the power of ten nearest (geometrically) the raw step
    step = power * (
        10 if error >= math.sqrt(50) else 5 if error >= math.sqrt(10) else 2 if error >= math.sqrt(2) else 1
    )
    first = math.ceil(lo / step - 1e-9)
    # Rounded to the step's digits: 0.0019 + 0.00002 is 0.0019200000000000000001 in binary.
    digits = max(0, -math.floor(math.log10(step)) + 1)
    return [round(k * step, digits) for k in range(first, math.floor(hi / step + 1e-9) + 1)]


def stragglers(rates: Mapping[int, float], margin: float = STRAGGLER_MARGIN) -> list[int]:
    """The replicas more than ``margin`` below the median rate (none with fewer than two replicas)."""
    if len(rates) < 2:
        return []
    median = statistics.median(rates.values())
    return sorted(r for r, rate in rates.items() if rate < (1.0 - margin) * median)


def format_duration(seconds: float) -> str:
    """``42 s``, ``3 min 5 s``, ``2 h 10 min``."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60} min"


def format_bytes(count: float) -> str:
    """``512 B``, ``1.5 KiB``, ``3.2 MiB``, ``1.1 GiB``."""
    units = ("B", "KiB", "MiB", "GiB")
    unit = 0
    while abs(count) >= 1024 and unit < len(units) - 1:
        count /= 1024
        unit += 1
    return f"{count:.0f} B" if unit == 0 else f"{count:.1f} {units[unit]}"
