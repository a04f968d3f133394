"""%placement on the graph of a running job draws the job's own placement: what its replicas and servers run."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from IPython.core.interactiveshell import InteractiveShell

from cellgraph.kernel_ext.display import PlacementTable

from .shells import new_shell, ok

TIMEOUT = 120.0
# The digits MLP with its first kernel pinned to the second parameter server, built in a cell.
MODEL = """\
import cellgraph as cg
from cellgraph.examples import digits
data = digits.load()
x = cg.placeholder((None, 64), "float32", name="x")
y = cg.placeholder((None,), "int32", name="y")
with cg.device("/job:ps/task:1"):
    hidden = cg.layers.dense(x, 32, activation="relu", name="hidden")
logits = cg.layers.dense(hidden, 10, name="logits")
loss = cg.losses.sparse_softmax_cross_entropy(logits, y)
"""


@pytest.fixture(scope="module")
def notebook() -> Iterator[InteractiveShell]:
    for shell in new_shell():
        try:
            ok(shell, MODEL)
            ok(shell, "%cluster up --workers 2 --ps 2")
            yield shell
        finally:
            ok(shell, "%cluster down")


@pytest.mark.slow
def test_placement_of_a_running_jobs_graph_is_the_jobs(
    notebook: InteractiveShell, capsys: pytest.CaptureFixture[str], shown: list[Any]
) -> None:
    ok(notebook, "%train loss --data data.x_train,data.y_train --mode async --steps 1000000 --batch-size 32 --no-show")
    job = notebook.user_ns["job"]
    try:
        deadline = 60.0
        import time

        start = time.monotonic()
        while job.status in ("starting", "running") and time.monotonic() - start < deadline:
            if job.status == "running" and job.global_step() >= 5:
                break
            time.sleep(0.1)
        assert job.status == "running", job.events
        shown.clear()
        ok(notebook, "%placement")
        assert f"the default graph is training as job {job.job_id}: its step graph as placed and running" in (
            capsys.readouterr().out
        )
        view, table = shown
        assert isinstance(table, PlacementTable) and table.placement is job.placement
        rows = {node: (op, device) for node, op, device, _ in table.rows()}
        # The scope's variable on ps task 1, its momentum-free Adam slots with it, its update op there too.
        assert rows["hidden/kernel"] == ("Variable", "/job:ps/task:1/device:cpu:0")
        assert rows["hidden/kernel/m"][1] == rows["update/hidden/kernel/apply"][1] == "/job:ps/task:1/device:cpu:0"
        assert rows["hidden/matmul"] == ("MatMul", "/job:worker/task:0/device:cpu:0")
        # The step graph has the gradients the replicas compute, which the user's graph does not.
        assert any(op == "MatMul" and "gradients" in node for node, (op, _) in rows.items())
        load = job.placement.ps_load_bytes()
        assert [s["held_bytes"] for s in job.ps_stats()] == list(load.values())
    finally:
        job.close()
