"""The TrainingMonitor's events panel: checkpoints folded into one line that updates, every other event in view.

A fast job writes a checkpoint every ``checkpoint_every`` steps, several a
second: listed one per line they push a scale, a join, a lost worker or a
failure out of sight. The panel shows them as one line (how many, the latest,
how often) above the other events, newest first.

Examples
--------
>>> events = [
...     "12:00:00 worker tcp://127.0.0.1:40001 joined (name w0, role worker, task 0)",
...     "12:00:01 checkpoint ckpt-0000000100 written (every 100 steps) in /tmp/c",
...     "12:00:02 scaled to 3 replica(s): replica(s) 2 start on tcp://127.0.0.1:40002",
...     "12:00:03 checkpoint ckpt-0000000200 written (every 100 steps) in /tmp/c",
...     "12:00:05 checkpoint ckpt-0000000300 written (every 100 steps) in /tmp/c",
... ]
>>> folded = fold_checkpoints(events)
>>> folded.summary
'12:00:05 checkpoints: 3 written, latest ckpt-0000000300 (every 100 steps), about one every 2 s, in /tmp/c'
>>> [e[9:25] for e in folded.others]
['worker tcp://127', 'scaled to 3 repl']
"""

from __future__ import annotations

import html
import re
from collections.abc import Sequence
from dataclasses import dataclass

# Other events shown at most (newest first): the panel's HTML is sent whole on each change.
MAX_EVENTS = 200
# How the job words a checkpoint written (cellgraph.cluster.supervisor): time of day, name, why, folder.
CHECKPOINT = re.compile(
    r"^(?P<time>\d\d):(?P<min>\d\d):(?P<sec>\d\d) checkpoint (?P<name>\S+) written \((?P<why>[^)]*)\) in (?P<dir>.+)$"
)
DAY_S = 24 * 3600


@dataclass(frozen=True)
class FoldedEvents:
    """``summary``: the checkpoints' line (None before the first); ``others``: every other event, in order."""

    summary: str | None
    checkpoints: int
    others: list[str]


def fold_checkpoints(events: Sequence[str]) -> FoldedEvents:
    """Fold the "checkpoint ... written" events into one summary line; keep the rest as they are."""
    others: list[str] = []
    found: list[re.Match[str]] = []
    for event in events:
        match = CHECKPOINT.match(event)
        if match:
            found.append(match)
        else:
            others.append(event)
    if not found:
        return FoldedEvents(None, 0, others)
    latest = found[-1]
    summary = f"{latest['time']}:{latest['min']}:{latest['sec']} checkpoints: {len(found)} written, latest "
    summary += f"{latest['name']} ({latest['why']})"
    if len(found) > 1:
        # Times of day, to the second: the mean gap over all of them (a midnight between them counts a day).
        elapsed = (_seconds(latest) - _seconds(found[0])) % DAY_S
        # Times to the second cannot tell a gap within one second: "one every 0 s" said nothing true.
        summary += f", about one every {elapsed / (len(found) - 1):.2g} s" if elapsed else ", all within one second"
    return FoldedEvents(summary + f", in {latest['dir']}", len(found), others)


def _seconds(match: re.Match[str]) -> int:
    return int(match["time"]) * 3600 + int(match["min"]) * 60 + int(match["sec"])


def events_html(events: Sequence[str]) -> str:
    """The panel: the checkpoints' line first, then the latest ``MAX_EVENTS`` other events, newest first."""
    folded = fold_checkpoints(events)
    shown = folded.others[-MAX_EVENTS:][::-1]
    hidden = len(folded.others) - len(shown)
    more = f"<div><i>{hidden} earlier event(s) not shown</i></div>" if hidden else ""
    summary = (
        f'<div class="cg-checkpoints" style="font-family:monospace;white-space:pre-wrap">'
        f"{html.escape(folded.summary)}</div>"
        if folded.summary
        else ""
    )
    lines = "\n".join(html.escape(e) for e in shown)
    return (
        f"<details open><summary>events ({len(folded.others)}, newest first"
        f"{f'; {folded.checkpoints} checkpoint(s) in one line' if folded.checkpoints else ''})</summary>"
        f'{summary}<pre class="cg-events" style="max-height:12em;overflow:auto;margin:0">{lines}</pre>{more}</details>'
    )
