"""``cellgraph ps`` as a real child process: started, waited for with deadlines, always killed."""

from __future__ import annotations

import contextlib
import os
import queue
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest

from .conftest import TIMEOUT

COMMAND = [sys.executable, "-m", "cellgraph.cli", "ps", "--host", "127.0.0.1"]
SERVING = re.compile(r"cellgraph ps: serving on 127\.0\.0\.1:(\d+) \((.*)\)")
GRPC_LOG = re.compile(r"[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ \S+:\d+\] ")  # gRPC core's own log lines
START_S = 30.0  # seconds for the process to import cellgraph and listen
STOP_S = 15.0  # seconds for it to stop after a signal (it polls every 0.5 s, then a 5 s grace)


class PsProcess:
    """A running ``cellgraph ps``; its output is read by threads, so no read can block a test."""

    def __init__(self, *args: str | os.PathLike[str]) -> None:
        self.proc = subprocess.Popen(
            [*COMMAND, *map(str, args)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.stdout: queue.Queue[str | None] = queue.Queue()  # None: stdout closed
        self.stderr: list[str] = []
        self._readers = [
            threading.Thread(target=self._read_stdout, daemon=True),
            threading.Thread(target=self._read_stderr, daemon=True),
        ]
        for reader in self._readers:
            reader.start()
        self.port = 0
        self.settings = ""

    def _read_stdout(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.stdout.put(line.rstrip("\n"))
        self.stdout.put(None)

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr.append(line.rstrip("\n"))

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def line(self, timeout: float) -> str:
        """The next line it prints, failing the test when none comes within ``timeout`` seconds."""
        try:
            line = self.stdout.get(timeout=timeout)
        except queue.Empty:
            pytest.fail(f"cellgraph ps printed nothing within {timeout} s; stderr: {self.stderr_text()}")
        if line is None:
            self.proc.wait(TIMEOUT)
            pytest.fail(
                f"cellgraph ps exited with {self.proc.returncode} before printing; stderr: {self.stderr_text()}"
            )
        return line

    def serving(self) -> PsProcess:
        """Wait for its "serving on" line and learn its port."""
        line = self.line(START_S)
        match = SERVING.fullmatch(line)
        assert match, line
        self.port, self.settings = int(match[1]), match[2]
        assert self.port > 0
        return self

    def stop(self, signum: int = signal.SIGTERM) -> tuple[int, str]:
        """Send ``signum``; its exit code and the next line it printed."""
        self.proc.send_signal(signum)
        line = self.line(STOP_S)
        return self.proc.wait(STOP_S), line

    def stderr_text(self) -> str:
        """What it wrote to stderr: all of it once it has exited, what has arrived so far before."""
        if self.proc.poll() is not None:
            self._readers[1].join(TIMEOUT)
        return "\n".join(self.stderr)

    def python_stderr(self) -> str:
        """``stderr_text`` without gRPC core's log lines: what Python printed (warnings, tracebacks)."""
        return "\n".join(line for line in self.stderr_text().splitlines() if not GRPC_LOG.match(line))

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(TIMEOUT)
        for reader in self._readers:
            reader.join(TIMEOUT)


@contextlib.contextmanager
def cellgraph_ps(*args: str | os.PathLike[str]) -> Iterator[PsProcess]:
    """A ``cellgraph ps`` that is listening; killed at the end however the test went."""
    ps = PsProcess(*args)
    try:
        yield ps.serving()
    finally:
        ps.kill()


def run_ps(*args: str | os.PathLike[str]) -> subprocess.CompletedProcess[str]:
    """``cellgraph ps`` for a run that must end by itself (bad arguments)."""
    return subprocess.run([*COMMAND, *map(str, args)], capture_output=True, text=True, timeout=START_S, check=False)
