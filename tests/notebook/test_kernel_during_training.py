"""A real IPython kernel training on a real LocalCluster: it stays responsive, survives a fork, leaves nothing behind.

Driven through ``jupyter_client`` exactly as JupyterLab drives a kernel. Cell
latencies are printed, not asserted (the machine is shared); what is asserted
is that cells are answered while the job runs, that ``!echo`` (which forks
the kernel) does not break the job's gRPC traffic, and that a kernel restart
leaves none of the cluster's processes alive.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator
from typing import Any

import psutil
import pytest
from jupyter_client.manager import KernelManager

TIMEOUT = 180.0  # seconds: the deadline of every cell

pytestmark = pytest.mark.slow


class Kernel:
    """A started kernel and a blocking client; ``run`` executes a cell and returns its stdout, raising on error."""

    def __init__(self) -> None:
        self.manager = KernelManager(kernel_name="python3")
        self.manager.start_kernel(extra_arguments=["--HistoryManager.enabled=False"])
        self.client = self.manager.blocking_client()
        self.client.start_channels()
        self.client.wait_for_ready(timeout=TIMEOUT)

    def run(self, code: str, timeout: float = TIMEOUT) -> str:
        out: list[str] = []

        def collect(message: dict[str, Any]) -> None:
            if message["msg_type"] == "stream":
                out.append(message["content"]["text"])
            elif message["msg_type"] == "error":
                out.append("\n".join(message["content"]["traceback"]))

        reply = self.client.execute_interactive(code, timeout=timeout, output_hook=collect)
        text = "".join(out)
        if reply["content"]["status"] != "ok":
            raise AssertionError(f"cell failed ({reply['content']['status']}):\n{code}\n{text}")
        return text

    def pid(self) -> int:
        return int(self.run("import os; print(os.getpid())").strip())

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


START_JOB = """
import cellgraph as cg
from cellgraph.examples import digits, models
data = digits.load()
model = models.mlp()
cluster = cg.Cluster.local(workers=2, ps=1)
job = cg.train(model.loss, (data.x_train, data.y_train), cluster=cluster, optimizer=cg.optim.Adam(1e-2),
               replicas=2, batch_size=32, steps={steps}, checkpoint_every=100)
"""

WAIT_FOR_STEP = """
import time
deadline = time.monotonic() + 120
while job.global_step() < {step}:
    assert time.monotonic() < deadline, job.events
    time.sleep(0.05)
print(job.status)
"""


def test_cells_are_answered_and_a_fork_is_harmless_while_a_job_trains(kernel: Kernel) -> None:
    kernel.run(START_JOB.format(steps=100_000))
    try:
        assert kernel.run(WAIT_FOR_STEP.format(step=20)).strip() == "running"
        latencies = []
        for _ in range(20):
            began = time.perf_counter()
            assert kernel.run("print(1 + 1)").strip() == "2"
            latencies.append(time.perf_counter() - began)
        print(f"trivial cell while training: median {statistics.median(latencies) * 1e3:.1f} ms, "
              f"max {max(latencies) * 1e3:.1f} ms")  # fmt: skip
        assert kernel.run("print(job.status)").strip() == "running"  # answered during training, not after it
        # `!echo` forks the kernel: the job's gRPC channels live in this process and must go on working.
        step = int(kernel.run("print(job.global_step())"))
        assert kernel.run("!echo hi").strip() == "hi"
        assert kernel.run(WAIT_FOR_STEP.format(step=step + 50)).strip() == "running"
        assert kernel.run("job.stop(timeout=60); print(job.status, job.ps_stats()[0]['pushes_rejected'])").split() == [
            "stopped",
            "0",
        ]
    finally:
        kernel.run("job.close(); cluster.close()")


def test_a_kernel_restart_leaves_no_cluster_process_behind(kernel: Kernel) -> None:
    kernel.run(START_JOB.format(steps=100_000))
    kernel.run(WAIT_FOR_STEP.format(step=10))
    processes = psutil.Process(kernel.pid()).children(recursive=True)
    assert len(processes) >= 4  # the scheduler runs in the kernel; 3 nannies and their 3 workers do not
    kernel.manager.restart_kernel(now=True)
    kernel.client.wait_for_ready(timeout=TIMEOUT)
    _, alive = psutil.wait_procs(processes, timeout=60)
    assert not alive, f"still running after the kernel restart: {[(p.pid, p.name()) for p in alive]}"


def test_interrupting_a_cell_that_waits_for_the_job_leaves_the_job_training(kernel: Kernel) -> None:
    # Jupyter's interrupt is SIGINT to the kernel's whole process group, where Cluster.local's worker processes
    # are too: it used to kill every worker and the parameter server, and the job with them.
    kernel.run("%load_ext cellgraph")
    kernel.run(START_JOB.format(steps=100_000))
    try:
        kernel.run(WAIT_FOR_STEP.format(step=10))
        workers = psutil.Process(kernel.pid()).children(recursive=True)
        # stop_on_error=False: an interrupted cell's error must not abort the next cells, which the kernel does to
        # requests that arrive just after an error otherwise (CI saw the next cell answered 'aborted', no output).
        waiting = kernel.client.execute("print('waiting', flush=True); job.wait()", stop_on_error=False)
        # Interrupt only once the cell is in job.wait(): on a loaded machine the cell may start seconds later, and
        # an interrupt before it would leave it waiting for 100,000 steps.
        deadline = time.monotonic() + TIMEOUT
        while True:
            message = kernel.client.get_iopub_msg(timeout=max(deadline - time.monotonic(), 0.1))
            if message["parent_header"].get("msg_id") == waiting and message["msg_type"] == "stream":
                break
        time.sleep(0.5)
        kernel.manager.interrupt_kernel()
        reply = kernel.client.get_shell_msg(timeout=TIMEOUT)
        while reply["parent_header"].get("msg_id") != waiting:
            reply = kernel.client.get_shell_msg(timeout=TIMEOUT)
        assert reply["content"]["status"] == "error" and reply["content"]["ename"] == "KeyboardInterrupt"
        assert reply["content"]["evalue"].startswith("job.wait() interrupted; job job-")
        assert "is still running (global step" in reply["content"]["evalue"], reply["content"]["evalue"]
        # The cell's line and the message only: it showed job.wait()'s own code in cluster/job.py above them.
        shown = "\n".join(reply["content"]["traceback"])
        assert "job.wait()" in shown and "job.py" not in shown and "raise KeyboardInterrupt" not in shown, shown
        step = int(kernel.run("print(job.global_step())"))
        assert kernel.run(WAIT_FOR_STEP.format(step=step + 20)).strip() == "running"
        assert all(p.is_running() for p in workers)
    finally:
        kernel.run("job.close(); cluster.close()")
