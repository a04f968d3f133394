"""Kernel > Interrupt while ``%cluster up`` (or ``scale``) starts workers: one line in the cell, nothing left running.

A real kernel, driven through ``jupyter_client`` as JupyterLab drives one; its
interrupt is JupyterLab's (SIGINT to the kernel's process group, which holds
the worker processes too). Before, the cell filled with some 300 lines: the
workers' ``KeyboardInterrupt`` and ``CancelledError`` tracebacks and the
kernel's Dask logs about workers that died while starting.
"""

from __future__ import annotations

import queue
import re
import socket
import time
from collections.abc import Iterator
from typing import Any

import psutil
import pytest
from jupyter_client.manager import KernelManager

TIMEOUT_S = 120.0  # the deadline of each cell, and of the wait for the first worker process
CELL_IDS_NOTE = "cellgraph: this front end sends no cell ids"  # jupyter_client sends none: said once, not checked

pytestmark = pytest.mark.slow


class Kernel:
    def __init__(self) -> None:
        self.manager = KernelManager(kernel_name="python3")
        self.manager.start_kernel(extra_arguments=["--HistoryManager.enabled=False", "--colors=NoColor"])
        self.client = self.manager.blocking_client()
        self.client.start_channels()
        self.client.wait_for_ready(timeout=TIMEOUT_S)

    def run(self, code: str, interrupt_when: Any = None) -> tuple[str, list[str]]:
        """Run a cell (interrupting the kernel once ``interrupt_when()`` holds); its status and what it printed."""
        msg_id = self.client.execute(code)
        deadline = time.monotonic() + TIMEOUT_S
        out: list[str] = []
        while time.monotonic() < deadline:
            if interrupt_when is not None and interrupt_when():
                self.manager.interrupt_kernel()
                interrupt_when = None
            try:
                message = self.client.get_iopub_msg(timeout=0.05)
            except queue.Empty:
                continue
            if message["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = message["msg_type"], message["content"]
            if kind == "stream" and not content["text"].startswith(CELL_IDS_NOTE):
                out.append(content["text"])
            elif kind == "error":
                out.append("\n".join(content["traceback"]))
            elif kind == "status" and content["execution_state"] == "idle":
                reply = self.client.get_shell_msg(timeout=TIMEOUT_S)
                return reply["content"]["status"], out
        raise TimeoutError(f"the cell did not finish within {TIMEOUT_S:g} s:\n{code}\n{''.join(out)}")

    def stop(self) -> None:
        self.client.stop_channels()
        self.manager.shutdown_kernel(now=True)


@pytest.fixture
def kernel() -> Iterator[Kernel]:
    started = Kernel()
    try:
        yield started
    finally:
        started.stop()


def workers_of(process: psutil.Process) -> list[psutil.Process]:
    """The worker processes ``multiprocessing`` spawned under ``process`` (Dask's nannies start them so)."""
    found = []
    for child in process.children(recursive=True):
        try:
            if any("spawn_main" in part for part in child.cmdline()):
                found.append(child)
        except psutil.Error:  # it ended meanwhile
            pass
    return found


def listening(process: psutil.Process) -> set[int]:
    return {c.laddr.port for c in process.net_connections(kind="tcp") if c.status == psutil.CONN_LISTEN}


def test_interrupting_cluster_up_or_scale_says_so_in_one_line_and_leaves_nothing_running(kernel: Kernel) -> None:
    status, out = kernel.run("%load_ext cellgraph\nimport os\nprint(os.getpid())")
    assert status == "ok"
    process = psutil.Process(int(out[-1].split()[-1]))
    ports = listening(process)

    # Interrupted once a worker process runs (the workers get the SIGINT too, some still importing Dask).
    status, out = kernel.run("%cluster up --workers 2 --ps 1", interrupt_when=lambda: workers_of(process))
    assert status == "error"
    text = "".join(out)
    assert re.fullmatch(
        r"UsageError: %cluster up: interrupted while the local cluster started: its scheduler is closed and its "
        r"worker processes have ended; nothing of it is left running \(%cluster up starts one again\)\n",
        text,
    ), text
    assert workers_of(process) == [] and listening(process) == ports  # no worker, and no scheduler's port
    # Nothing of the interrupted start comes later either, and no cluster is bound.
    status, out = kernel.run("import time\ntime.sleep(2)\nprint('cluster' in dir())")
    assert (status, out) == ("ok", ["False\n"])

    # And %cluster up starts one again.
    status, out = kernel.run("%cluster up --workers 1 --ps 1\nprint(len(cluster.training_workers()))")
    assert status == "ok" and out[-1] == "1\n", out

    # %cluster scale starts workers too: interrupted once one more runs, it says so in one line as well.
    started = len(workers_of(process))
    status, out = kernel.run("%cluster scale 3", interrupt_when=lambda: len(workers_of(process)) > started)
    assert status == "error"
    text = "".join(out)
    assert re.fullmatch(
        r"UsageError: %cluster scale: interrupted while the training workers went from 1 to 3: the cluster has "
        r"[1-3] now \(%cluster scale 3 asks again\)\n",
        text,
    ), text
    status, out = kernel.run("%cluster down")
    assert status == "ok" and out[-1].startswith("closed the cluster at tcp://127.0.0.1:"), out
    assert workers_of(process) == []


def test_interrupting_cluster_connect_to_a_silent_port_says_so_in_one_line(kernel: Kernel) -> None:
    # A port that takes the connection and never speaks Dask: the wait lasts --timeout, unless interrupted.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        address = f"tcp://127.0.0.1:{silent.getsockname()[1]}"
        assert kernel.run("%load_ext cellgraph")[0] == "ok"
        started = time.monotonic()
        status, out = kernel.run(
            f"%cluster connect {address} --timeout 60", interrupt_when=lambda: time.monotonic() > started + 2
        )
    assert status == "error"
    assert "".join(out) == (
        f"UsageError: %cluster connect: interrupted while waiting for the Dask scheduler at {address} to answer; not "
        "connected (--timeout 60 s gives up by itself)\n"
    )
    assert kernel.run("print('cluster' in dir())") == ("ok", ["False\n"])
