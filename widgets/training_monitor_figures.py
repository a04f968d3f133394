"""The TrainingMonitor's bqplot figures: curves per replica, replica step rates, parameter-server bytes.

Each class owns one ``bqplot.Figure`` and knows how to redraw it from plain
data; the monitor decides when. Data goes out as arrays in one message per
mark (``hold_sync``), and only when it changed.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any

import bqplot as bq
import ipywidgets as widgets
import numpy as np

from .training_monitor_data import nice_ticks, thin, tick_format

# Tableau 10: one colour per replica, in order, reused past ten.
PALETTE = (
    "#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2",
    "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac",
)  # fmt: skip
NORMAL, STRAGGLER, STARTING = "#4e79a7", "#e15759", "#bab0ac"
BYTES_IN, BYTES_OUT = "#4e79a7", "#f28e2b"
# bqplot's toolbar (shown on hover) sits in the top margin: the title is above the figure, in HTML, out of its way.
MARGIN = {"top": 30, "bottom": 40, "left": 72, "right": 15}
# Two figures to a row, sharing it; one to a row when the output area is narrower than two minimums.
COLUMN = widgets.Layout(flex="1 1 320px", min_width="280px", margin="0 12px 0 0")
HEAD = widgets.Layout(justify_content="space-between", align_items="center", min_height="28px")
# A replica that left the job: its line stays, faint.
LEFT_OPACITY = 0.35


# d3's SI format ("12k", "450M") for axes of large counts (steps, bytes), whose full numbers run into each other.
COUNT_FORMAT = ".3~s"


def _figure(
    x: bq.Scale,
    y: bq.Scale,
    x_label: str,
    y_label: str,
    marks: Sequence[bq.Mark] = (),
    x_format: str | None = None,
    y_format: str | None = None,
) -> bq.Figure:
    axes = [
        bq.Axis(scale=x, label=x_label, side="bottom", tick_format=x_format),
        # As many ticks as tick_format tells apart; the label clear of the widest tick labels ("0.00202").
        bq.Axis(scale=y, label=y_label, side="left", tick_format=y_format, label_offset="58px"),
    ]
    return bq.Figure(
        marks=list(marks), axes=axes, fig_margin=MARGIN, layout=widgets.Layout(width="100%", height="260px")
    )


def _titled(header: widgets.HTML, figure: bq.Figure, *more: widgets.Widget) -> widgets.VBox:
    """The figure below a line of HTML (its title and key) and any controls, in a column of a row."""
    return widgets.VBox([widgets.HBox([header, *more], layout=HEAD), figure], layout=COLUMN)


def _swatch(colour: str, text: str, opacity: float = 1.0, bar: bool = False) -> str:
    size = "width:10px;height:10px" if bar else "width:14px;height:3px"
    return (
        f'<span style="white-space:nowrap;opacity:{opacity:g}"><i style="display:inline-block;{size};'
        f'vertical-align:middle;background:{colour}"></i> {html.escape(text)}</span>'
    )


def close_figure(figure: bq.Figure, *scales: bq.Scale) -> None:
    """Close a figure and the marks, axes and scales it holds (their comms stay open otherwise), and ``scales``."""
    for mark in figure.marks:
        for scale in mark.scales.values():
            scale.close()
        mark.close()
    for axis in figure.axes:
        axis.close()
    for scale in scales:
        scale.close()
    figure.close()


class CurveFigure:
    """One line per replica of a metric against the global step, titled and keyed above the plot.

    The title and the legend are HTML above the figure, not bqplot's: its
    legend box sits on the curves, and its toolbar on the title. With
    ``log_option`` a "log scale" box switches the y axis to a log scale.
    """

    def __init__(self, title: str, y_label: str, log_option: bool = False) -> None:
        self.x_scale, self.linear, self.log = bq.LinearScale(), bq.LinearScale(), bq.LogScale()
        self.y_scale: bq.Scale = self.linear
        self.figure = _figure(self.x_scale, self.y_scale, "global step", y_label, x_format=COUNT_FORMAT)
        self.title = title
        self.header = widgets.HTML()
        self.log_scale = widgets.Checkbox(value=False, description="log scale", indent=False, layout={"width": "auto"})
        self.log_scale.observe(lambda _: self._switch_scale(), names="value")
        self.widget = _titled(self.header, self.figure, *([self.log_scale] if log_option else []))
        self.lines: dict[int, bq.Lines] = {}
        self._curves: dict[int, tuple[Sequence[float], Sequence[float]]] = {}
        self._left: set[int] = set()
        self._legend()

    def draw(self, curves: Mapping[int, tuple[Sequence[float], Sequence[float]]], left: Sequence[int] = ()) -> None:
        """Set each replica's ``(steps, values)``; a replica seen for the first time gets a line of its own.

        Replicas in ``left`` have left the job: their lines stay (faint), and the legend says so.
        """
        self._curves = {**self._curves, **curves}
        self._left = set(left)
        for replica in sorted(curves):
            if replica not in self.lines:
                self.lines[replica] = self._new_line(replica)
                self.figure.marks = [self.lines[r] for r in sorted(self.lines)]
            self._set_line(replica)
        self._set_ticks()
        self._legend()

    def _set_line(self, replica: int) -> None:
        xs, ys = self._curves[replica]
        if self.y_scale is self.log:  # a log axis has no place for zero or less
            kept = [(x, y) for x, y in zip(xs, ys, strict=True) if y > 0]
            xs, ys = [x for x, _ in kept], [y for _, y in kept]
        x, y = thin(xs, ys)
        line = self.lines[replica]
        with line.hold_sync():
            line.x, line.y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
            line.opacities = [LEFT_OPACITY if replica in self._left else 1.0]

    def _set_ticks(self) -> None:
        values = [float(v) for line in self.lines.values() for v in line.y]
        low, high = (min(values), max(values)) if values else (0.0, 0.0)
        axis = self.figure.axes[1]
        with axis.hold_sync():
            axis.tick_format = tick_format(low, high)
            # Round values, a few: bqplot's own are a dozen on 260 pixels. A log axis over a decade or more keeps
            # d3's (1 to 9 times each power of ten); under one, d3 lists every hundredth.
            decades = self.y_scale is self.log and low > 0 and high >= 10 * low
            axis.tick_values = None if decades else np.asarray(nice_ticks(low, high), dtype=float)

    def _switch_scale(self) -> None:
        """New lines and a new y axis on the other scale: bqplot's front end does not follow a mark's or an
        axis's change of scale (the axis keeps the old domain)."""
        self.y_scale = self.log if self.log_scale.value else self.linear
        old_lines, old_axis = list(self.lines.values()), self.figure.axes[1]
        self.lines = {}
        for replica in sorted(self._curves):
            self.lines[replica] = self._new_line(replica)
            self._set_line(replica)
        axis = bq.Axis(
            scale=self.y_scale,
            label=old_axis.label,
            side="left",
            label_offset=old_axis.label_offset,
        )
        with self.figure.hold_sync():
            self.figure.marks = [self.lines[r] for r in sorted(self.lines)]
            self.figure.axes = [self.figure.axes[0], axis]
            self._set_ticks()
        for widget in [*old_lines, old_axis]:
            widget.close()
        self._legend()

    def _new_line(self, replica: int) -> bq.Lines:
        return bq.Lines(x=[], y=[], scales={"x": self.x_scale, "y": self.y_scale}, colors=[_colour(replica)])

    def _legend(self) -> None:
        keys = [
            _swatch(_colour(r), f"replica {r} (left)", LEFT_OPACITY)
            if r in self._left
            else _swatch(_colour(r), f"replica {r}")
            for r in sorted(self.lines)
        ]
        dropped = 0
        if self.y_scale is self.log:
            dropped = sum(1 for _, ys in self._curves.values() for y in ys if not y > 0)
        note = (
            f' <i style="color:#888">{dropped} point(s) at or below 0 not drawn on the log scale</i>' if dropped else ""
        )
        self.header.value = f"<b>{html.escape(self.title)}</b> &nbsp; {' '.join(keys)}{note}"

    def retitle(self, title: str, y_label: str) -> None:
        self.title = title
        self.figure.axes[1].label = y_label
        self._legend()

    def close(self) -> None:
        close_figure(self.figure, self.linear, self.log)


def _colour(replica: int) -> str:
    return PALETTE[replica % len(PALETTE)]


class RateFigure:
    """A bar per replica of the job: its own steps per second, stragglers in red, one starting in grey."""

    def __init__(self) -> None:
        self.bars = bq.Bars(
            x=[],
            y=[],
            scales={"x": bq.OrdinalScale(), "y": bq.LinearScale(min=0)},
            color_mode="group",
            colors=[NORMAL],
            label_display=True,
            label_display_format=".3g",
        )
        self.figure = _figure(self.bars.scales["x"], self.bars.scales["y"], "", "steps / s", marks=[self.bars])
        self.header = widgets.HTML("<b>step rate per replica</b>")
        self.widget = _titled(self.header, self.figure)

    def draw(self, rates: Mapping[int, float], slow: Sequence[int], starting: int = 0) -> None:
        """A bar per replica of ``rates``, those in ``slow`` red; then ``starting`` empty bars for those to come."""
        replicas = sorted(rates)
        with self.bars.hold_sync():
            self.bars.x = [f"replica {r}" for r in replicas] + [f"starting {i + 1}" for i in range(starting)]
            self.bars.y = np.asarray([rates[r] for r in replicas] + [0.0] * starting, dtype=np.float64)
            colours = [STRAGGLER if r in slow else NORMAL for r in replicas] + [STARTING] * starting
            self.bars.colors = colours or [NORMAL]
        keys = [_swatch(NORMAL, "keeps pace", bar=True)]
        keys += [_swatch(STRAGGLER, "straggler", bar=True)] if slow else []
        keys += [_swatch(STARTING, "starting (no step yet)", bar=True)] if starting else []
        self.header.value = f"<b>step rate per replica</b> &nbsp; {' '.join(keys)}"


class ShardFigure:
    """Bytes in and out of each parameter-server shard, stacked: a hot shard's bar stands out."""

    def __init__(self) -> None:
        self.bars = bq.Bars(
            x=[],
            y=[],
            scales={"x": bq.OrdinalScale(), "y": bq.LinearScale(min=0)},
            # Stacked, not grouped: bqplot 0.13's front end computes no y range for grouped bars (none are drawn).
            type="stacked",
            colors=[BYTES_IN, BYTES_OUT],
        )
        self.figure = _figure(
            self.bars.scales["x"], self.bars.scales["y"], "", "bytes", [self.bars], y_format=COUNT_FORMAT
        )
        # The key in HTML: bqplot's legend box for stacked bars shows one entry only.
        keys = f"{_swatch(BYTES_IN, 'in', bar=True)} {_swatch(BYTES_OUT, 'out', bar=True)}"
        self.header = widgets.HTML(f"<b>PS bytes per shard</b> &nbsp; {keys}")
        self.widget = _titled(self.header, self.figure)

    def draw(self, stats: Sequence[Mapping[str, Any]]) -> None:
        with self.bars.hold_sync():
            self.bars.x = [f"shard {s['shard']}" for s in stats]
            counts = [[s["bytes_in"] for s in stats], [s["bytes_out"] for s in stats]] if stats else []
            self.bars.y = np.asarray(counts, dtype=np.float64)
