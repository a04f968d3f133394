"""The TrainingMonitor's bqplot figures: curves per replica, replica step rates, parameter-server bytes.

Each class owns one ``bqplot.Figure`` and knows how to redraw it from plain
data; the monitor decides when. Data goes out as arrays in one message per
mark (``hold_sync``), and only when it changed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import bqplot as bq
import ipywidgets as widgets
import numpy as np

from .training_monitor_data import thin

# Tableau 10: one colour per replica, in order, reused past ten.
PALETTE = (
    "#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2",
    "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac",
)  # fmt: skip
NORMAL, STRAGGLER = "#4e79a7", "#e15759"
BYTES_IN, BYTES_OUT = "#4e79a7", "#f28e2b"
MARGIN = {"top": 30, "bottom": 40, "left": 60, "right": 15}


# d3's SI format ("12k", "450M") for axes of large counts (steps, bytes), whose full numbers run into each other.
COUNT_FORMAT = ".3~s"


def _figure(
    title: str,
    x: bq.Scale,
    y: bq.Scale,
    x_label: str,
    y_label: str,
    marks: Sequence[bq.Mark] = (),
    x_format: str | None = None,
    y_format: str | None = None,
    **kwargs: Any,
) -> bq.Figure:
    axes = [
        bq.Axis(scale=x, label=x_label, side="bottom", tick_format=x_format),
        bq.Axis(scale=y, label=y_label, side="left", tick_format=y_format),
    ]
    return bq.Figure(
        title=title,
        marks=list(marks),
        axes=axes,
        fig_margin=MARGIN,
        # Two to a row, sharing it; one to a row when the output area is narrower than two minimums.
        layout=widgets.Layout(flex="1 1 320px", min_width="280px", height="260px"),
        **kwargs,
    )


def close_figure(figure: bq.Figure) -> None:
    """Close a figure and the marks, axes and scales it holds (their comms stay open otherwise)."""
    for mark in figure.marks:
        for scale in mark.scales.values():
            scale.close()
        mark.close()
    for axis in figure.axes:
        axis.close()
    figure.close()


class CurveFigure:
    """One line per replica of a metric against the global step."""

    def __init__(self, title: str, y_label: str) -> None:
        self.x_scale, self.y_scale = bq.LinearScale(), bq.LinearScale()
        self.figure = _figure(
            title,
            self.x_scale,
            self.y_scale,
            "global step",
            y_label,
            x_format=COUNT_FORMAT,
            legend_location="top-right",
        )
        self.lines: dict[int, bq.Lines] = {}

    def draw(self, curves: Mapping[int, tuple[Sequence[float], Sequence[float]]]) -> None:
        """Set each replica's ``(steps, values)``; a replica seen for the first time gets a line of its own."""
        for replica in sorted(curves):
            if replica not in self.lines:
                self.lines[replica] = bq.Lines(
                    x=[],
                    y=[],
                    scales={"x": self.x_scale, "y": self.y_scale},
                    colors=[PALETTE[replica % len(PALETTE)]],
                    labels=[f"replica {replica}"],
                    display_legend=True,
                )
                self.figure.marks = [self.lines[r] for r in sorted(self.lines)]
            x, y = thin(*curves[replica])
            line = self.lines[replica]
            with line.hold_sync():
                line.x, line.y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)

    def retitle(self, title: str, y_label: str) -> None:
        self.figure.title = title
        self.figure.axes[1].label = y_label


class RateFigure:
    """A bar per replica: its own steps per second, stragglers in red."""

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
        self.figure = _figure(
            "step rate per replica", self.bars.scales["x"], self.bars.scales["y"], "", "steps / s", marks=[self.bars]
        )

    def draw(self, rates: Mapping[int, float], slow: Sequence[int]) -> None:
        replicas = sorted(rates)
        with self.bars.hold_sync():
            self.bars.x = [f"replica {r}" for r in replicas]
            self.bars.y = np.asarray([rates[r] for r in replicas], dtype=np.float64)
            self.bars.colors = [STRAGGLER if r in slow else NORMAL for r in replicas] or [NORMAL]


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
        # Said in the title: bqplot's legend box for stacked bars shows one entry only.
        title = "PS bytes per shard: in (blue), out (orange)"
        self.figure = _figure(
            title, self.bars.scales["x"], self.bars.scales["y"], "", "bytes", [self.bars], y_format=COUNT_FORMAT
        )

    def draw(self, stats: Sequence[Mapping[str, Any]]) -> None:
        with self.bars.hold_sync():
            self.bars.x = [f"shard {s['shard']}" for s in stats]
            counts = [[s["bytes_in"] for s in stats], [s["bytes_out"] for s in stats]] if stats else []
            self.bars.y = np.asarray(counts, dtype=np.float64)
