"""Progress for the examples: a tqdm bar on a terminal, a plain line every few seconds anywhere else.

A tqdm bar redraws itself with a carriage return several times a second. In a
CI log or a pipe there is nothing to redraw: each redraw is one more line (or
one endless line) saying the same thing. There, ``LineProgress`` prints one
newline-terminated line, in tqdm's words, at most every ``LINE_INTERVAL_S``
seconds and only when something changed, and always the last state when it
closes.

Examples
--------
>>> import io
>>> out = io.StringIO()  # not a terminal
>>> bar = progress_bar(4, "training mlp", out)
>>> bar.update(4)
>>> bar.close()
>>> out.getvalue().splitlines()[-1].startswith("training mlp: 100%")
True
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

LINE_INTERVAL_S = 5.0  # the most often a non-terminal gets a line


def progress_bar(total: int, label: str, stream: TextIO | None = None) -> Any:
    """A progress display of ``total`` steps on ``stream`` (default stderr): a tqdm bar on a terminal, else lines.

    Either has tqdm's ``n``, ``update``, ``set_postfix``, ``set_postfix_str``,
    ``refresh`` and ``close``.
    """
    stream = sys.stderr if stream is None else stream
    isatty = getattr(stream, "isatty", None)
    if isatty is not None and isatty():
        from tqdm import tqdm

        return tqdm(total=total, desc=label, unit="step", leave=True, file=stream)
    return LineProgress(total, label, stream)


class LineProgress:
    """tqdm's progress text as whole lines, at most one per ``interval`` seconds, for logs and pipes."""

    def __init__(
        self,
        total: int,
        label: str,
        stream: TextIO,
        interval: float = LINE_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.total, self.label, self.stream, self.interval, self.clock = total, label, stream, interval, clock
        self.n = 0
        self.postfix = ""
        self.start = clock()
        self._last_at: float | None = None  # when the last line was printed; None before the first
        self._last_state: tuple[int, str] | None = None
        self.closed = False

    def update(self, steps: int = 1) -> None:
        self.n += steps
        self.refresh()

    def set_postfix(self, **values: Any) -> None:
        self.set_postfix_str(", ".join(f"{key}={value}" for key, value in values.items()))

    def set_postfix_str(self, text: str = "", refresh: bool = True) -> None:
        self.postfix = str(text)
        if refresh:
            self.refresh()

    def refresh(self) -> None:
        """Print the state if it changed and the last line is ``interval`` seconds old (the first one at once)."""
        now = self.clock()
        if self._last_at is not None and now - self._last_at < self.interval:
            return
        self._print(now)

    def close(self) -> None:
        """Print the final state (unless that very line was printed last); later calls do nothing."""
        if not self.closed:
            self._print(self.clock())
            self.closed = True

    def line(self, now: float) -> str:
        """The progress as tqdm words it (ASCII, no terminal width), e.g. ``training mlp:  30%|###  | 3/10 [...]``."""
        from tqdm import tqdm

        return tqdm.format_meter(
            self.n, self.total, now - self.start, ncols=100, prefix=self.label, ascii=True, unit="step",
            postfix=self.postfix or None,
        )  # fmt: skip

    def _print(self, now: float) -> None:
        state = (self.n, self.postfix)
        if state == self._last_state:
            return
        self._last_at, self._last_state = now, state
        self.stream.write(self.line(now) + "\n")
        self.stream.flush()
