"""Progress in a log or a pipe: whole lines, at most one every few seconds; a tqdm bar only on a terminal."""

from __future__ import annotations

import io
import os
import subprocess
import sys

from tqdm import tqdm

from cellgraph.examples.progress import LINE_INTERVAL_S, LineProgress, progress_bar


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_non_terminal_gets_a_line_at_most_every_interval_and_the_last_state_at_close() -> None:
    out, clock = io.StringIO(), Clock()
    bar = LineProgress(400, "training mlp", out, interval=LINE_INTERVAL_S, clock=clock)
    printed_at = []
    for step in range(400):  # 8 refreshes a second for 50 s, as a polling loop would ask
        clock.now = step / 8
        before = out.getvalue().count("\n")
        bar.update(1)
        bar.set_postfix_str(f"loss={1 / (step + 1):.4f}", refresh=False)
        bar.refresh()
        if out.getvalue().count("\n") > before:
            printed_at.append(clock.now)
    bar.close()
    bar.close()  # a second close says nothing more
    lines = out.getvalue().split("\n")
    assert lines[-1] == "" and "\r" not in out.getvalue()
    lines = lines[:-1]
    assert len(lines) == len(printed_at) + 1  # and the final state at close
    assert all(b - a >= LINE_INTERVAL_S for a, b in zip(printed_at, printed_at[1:], strict=False)), printed_at
    assert lines[0].startswith("training mlp:   0%|") and "1/400" in lines[0]
    assert lines[-1].startswith("training mlp: 100%|") and "400/400" in lines[-1] and "loss=0.0025" in lines[-1]


def test_no_line_while_nothing_changes() -> None:
    out, clock = io.StringIO(), Clock()
    bar = LineProgress(10, "training", out, clock=clock)
    bar.set_postfix_str("replicas starting (a first run compiles the kernels: about a minute)")
    for tick in range(1, 480):  # a minute of compiling: the same words
        clock.now = tick / 8
        bar.refresh()
    assert out.getvalue().count("\n") == 1
    bar.update(10)
    bar.close()
    assert out.getvalue().count("\n") == 2


def test_a_terminal_gets_the_tqdm_bar() -> None:
    leader, follower = os.openpty()
    with os.fdopen(follower, "w") as terminal:
        try:
            bar = progress_bar(10, "training", terminal)
            assert isinstance(bar, tqdm)
            bar.close()
        finally:
            os.close(leader)
    assert isinstance(progress_bar(10, "training", io.StringIO()), LineProgress)


def test_the_demo_in_a_pipe_prints_whole_lines() -> None:
    ran = subprocess.run(
        [sys.executable, "-m", "cellgraph", "demo", "--local", "--models", "mlp", "--epochs", "2"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "\r" not in ran.stderr, ran.stderr  # no bar redrawn over itself
    progress = [line for line in ran.stderr.splitlines() if line.startswith("training mlp:")]
    assert progress and progress[-1].startswith("training mlp: 100%|") and "loss=" in progress[-1], ran.stderr
    assert len(progress) == len(set(progress))  # no line repeats the one before
