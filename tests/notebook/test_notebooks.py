"""The example notebooks run top to bottom in a real kernel, as a person would run them, and do their job.

Each notebook runs in a fresh ``python3`` kernel (this environment's Python)
through nbclient, from ``notebooks/``, with a deadline on every cell. Like
JupyterLab, the client sends each cell's id with its execution, which is how
the extension knows a re-run cell from a new one; a cell tagged ``run-twice``
is run a second time right away, as a person pressing Shift+Enter again.
Beyond "no cell failed", each test checks a few outputs that show the
notebook did what it says. Whatever happens, the kernel is shut down and no
process it started may outlive it.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import nbformat
import psutil
import pytest
from jupyter_core.utils import run_sync
from nbclient import NotebookClient
from nbformat.notebooknode import NotebookNode

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
CELL_TIMEOUT_S = 300  # the deadline of one cell; the notebooks' own waits are shorter
STARTUP_TIMEOUT_S = 120
EXIT_TIMEOUT_S = 60  # for the kernel's processes to go after it is shut down


class LabLikeClient(NotebookClient):
    """nbclient, sending each cell's id with its execute request as JupyterLab does (``metadata.cellId``)."""

    cell_id: str | None = None

    async def async_start_new_kernel_client(self) -> Any:
        kc = await super().async_start_new_kernel_client()
        send = kc.shell_channel.send

        def send_with_cell_id(msg: dict[str, Any]) -> None:
            if msg["header"]["msg_type"] == "execute_request" and self.cell_id:
                msg["metadata"]["cellId"] = self.cell_id
            send(msg)

        kc.shell_channel.send = send_with_cell_id
        return kc

    # nbclient's sync wrapper is bound to its own coroutine, not to an override.
    start_new_kernel_client = run_sync(async_start_new_kernel_client)

    def run_cell(self, cell: NotebookNode, index: int) -> None:
        self.cell_id = cell.get("id")
        self.execute_cell(cell, index, execution_count=self.code_cells_executed + 1)


def run_notebook(name: str, tmp: Path) -> NotebookNode:
    """Execute ``notebooks/<name>.ipynb``; raise nbclient's error (with the cell and its traceback) on a failure.

    The kernel's temporary files (the jobs' checkpoint folders, Dask's scratch space) go under ``tmp``.
    """
    nb = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    client = LabLikeClient(
        nb,
        kernel_name="python3",
        timeout=CELL_TIMEOUT_S,
        startup_timeout=STARTUP_TIMEOUT_S,
        # A cell past its deadline is interrupted (so the kernel is free to shut down cleanly) and fails the test.
        interrupt_on_timeout=True,
        error_on_timeout={
            "ename": "CellTimeoutError",
            "evalue": f"the cell ran past {CELL_TIMEOUT_S} s",
            "traceback": [f"CellTimeoutError: the cell ran past {CELL_TIMEOUT_S} s and was interrupted"],
        },
        resources={"metadata": {"path": str(NOTEBOOKS)}},
        extra_arguments=["--HistoryManager.enabled=False"],
    )
    spawned: list[psutil.Process] = []
    began = time.monotonic()
    try:
        with client.setup_kernel(env={**os.environ, "TMPDIR": str(tmp)}):
            kernel = psutil.Process(client.km.provisioner.pid)
            try:
                for index, cell in enumerate(nb.cells):
                    if cell.cell_type != "code":
                        continue
                    client.run_cell(cell, index)
                    if "run-twice" in cell.metadata.get("tags", []):
                        client.run_cell(cell, index)
                client.set_widgets_metadata()  # the widgets' last state, as a saved notebook keeps it
            finally:
                with contextlib.suppress(psutil.NoSuchProcess):  # a kernel that died has no children to list
                    spawned = kernel.children(recursive=True)
    finally:
        # The kernel is gone (nbclient shut it down); so must be everything it started, the cluster's processes too.
        _, alive = psutil.wait_procs(spawned, timeout=EXIT_TIMEOUT_S)
        for process in alive:  # ours to stop: started by this test's kernel
            process.kill()
        print(f"{name}: {time.monotonic() - began:.1f} s")
    assert not alive, f"{name} left processes behind: {[(p.pid, p.name()) for p in alive]}"
    return nb


def text(cell: NotebookNode) -> str:
    """Everything a code cell printed (stdout, stderr) and the plain-text form of what it displayed."""
    parts = []
    for output in cell.get("outputs", []):
        if output.output_type == "stream":
            parts.append(output.text)
        elif output.output_type in ("execute_result", "display_data"):
            parts.append(output.data.get("text/plain", ""))
    return "".join(parts)


def all_text(nb: NotebookNode) -> str:
    return "\n".join(text(cell) for cell in nb.cells if cell.cell_type == "code")


def widgets(nb: NotebookNode) -> list[str]:
    """The widgets displayed, in order: an anywidget by its class name (``GraphView``), others by their model
    name (``VBoxModel``)."""
    state = nb.metadata.get("widgets", {}).get("application/vnd.jupyter.widget-state+json", {}).get("state", {})
    shown = []
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            view = output.get("data", {}).get("application/vnd.jupyter.widget-view+json")
            if view is not None:
                model = state.get(view["model_id"], {})
                anywidget = model.get("state", {}).get("_anywidget_id", "")
                shown.append(anywidget.rsplit(".", 1)[-1] or model.get("model_name", "?"))
    return shown


def cell_with(nb: NotebookNode, source: str) -> NotebookNode:
    [cell] = [c for c in nb.cells if c.cell_type == "code" and source in c.source]
    return cell


# How to put a notebook saved from JupyterLab back the way it is kept: outputs, counts and run metadata dropped,
# the cells' tags (run-twice) and the kernelspec kept.
CLEAN = (
    "jupyter nbconvert --clear-output --ClearMetadataPreprocessor.enabled=True "
    "--ClearMetadataPreprocessor.preserve_cell_metadata_mask=tags "
    "--ClearMetadataPreprocessor.preserve_nb_metadata_mask=kernelspec --inplace"
)


def unclean(nb: NotebookNode) -> list[str]:
    """What keeps ``nb`` from being kept as it is: outputs, execution counts, run metadata, widget state, ids."""
    found = []
    extra = set(nb.metadata) - {"kernelspec", "language_info"}
    if extra or set(nb.metadata.get("language_info", {})) - {"name"}:
        found.append(f"notebook metadata beyond the kernelspec: {sorted(extra) or ['language_info']}")
    ids = [cell.get("id") for cell in nb.cells]
    if None in ids or len(set(ids)) != len(ids):
        found.append("cells without an id, or with the same id")
    for cell in nb.cells:
        if set(cell.metadata) - {"tags"}:
            found.append(f"cell {cell.id}: metadata {sorted(cell.metadata)}")
        if cell.cell_type == "code" and (cell.outputs or cell.execution_count is not None):
            found.append(f"cell {cell.id}: outputs or an execution count")
    return found


def test_committed_notebooks_are_kept_without_outputs() -> None:
    paths = sorted(NOTEBOOKS.glob("*.ipynb"))
    assert [p.stem for p in paths] == [
        "01_quickstart",
        "02_devices_and_placement",
        "03_distributed_training",
        "04_inception_sync_backup",
        "05_kernels",
    ]
    for path in paths:
        nb = nbformat.read(path, as_version=4)
        nbformat.validate(nb)
        assert nb.metadata.kernelspec.name == "python3", path.name
        assert unclean(nb) == [], f"{path.name}: {unclean(nb)}; run: {CLEAN} notebooks/{path.name}"
    # The notebooks are their own source now, edited in JupyterLab: no generator to keep in step.
    assert not (NOTEBOOKS / "make_notebooks.py").exists()


def test_the_clean_command_puts_a_saved_notebook_back_as_kept(tmp_path: Path) -> None:
    nb = nbformat.read(NOTEBOOKS / "01_quickstart.ipynb", as_version=4)
    tagged = [cell.id for cell in nb.cells if "run-twice" in cell.metadata.get("tags", [])]
    assert tagged, "01_quickstart has a run-twice cell"
    # As JupyterLab saves it after a run: outputs, counts, timing metadata, the language's version, widget state.
    for count, cell in enumerate((c for c in nb.cells if c.cell_type == "code"), start=1):
        cell.execution_count = count
        cell.outputs = [nbformat.v4.new_output("stream", text="printed\n")]
        cell.metadata["execution"] = {"iopub.status.busy": "2026-01-01T00:00:00Z"}
    nb.metadata.language_info = {"name": "python", "version": "3.11.7"}
    nb.metadata.widgets = {"application/vnd.jupyter.widget-state+json": {}}
    saved = tmp_path / "saved.ipynb"
    nbformat.write(nb, saved)
    assert unclean(nbformat.read(saved, as_version=4)) != []
    subprocess.run([sys.executable, "-m", *CLEAN.split(), str(saved)], check=True, capture_output=True, timeout=120)
    cleaned = nbformat.read(saved, as_version=4)
    assert unclean(cleaned) == []
    assert [cell.id for cell in cleaned.cells if "run-twice" in cell.metadata.get("tags", [])] == tagged
    assert [cell.source for cell in cleaned.cells] == [cell.source for cell in nb.cells]


def test_quickstart_trains_and_a_rerun_cell_makes_no_duplicates(tmp_path: Path) -> None:
    quickstart = run_notebook("01_quickstart", tmp_path)
    model_cell = cell_with(quickstart, 'hidden = cg.layers.dense(x, 128, activation="relu", name="hidden")')
    check = text(cell_with(quickstart, "layer scopes"))
    # The second run made the nodes (its own In [n]), and they kept their names.
    assert "layer scopes: ['hidden', 'logits']" in check, check
    assert f"hidden/kernel was made by cell [{model_cell.execution_count}], line 2" in check, check
    accuracy = re.search(r"after training: test accuracy ([\d.]+)%", all_text(quickstart))
    assert accuracy and float(accuracy.group(1)) > 90, all_text(quickstart)
    rerun = re.search(r"after the re-run: ([\d.]+)% \(before it: ([\d.]+)%\)", check)
    assert rerun and rerun.group(1) == rerun.group(2), check  # the trained values survived the re-run
    assert "['inputs', 'layer/kernel', 'layer/matmul', 'layer/bias', 'layer/bias_add']" in all_text(quickstart)
    # Today's mixed-precision policy, clipping between compute_gradients and apply_gradients, and Nadam.
    assert "features float16, logits float32, loss float32, conv kernel float32" in all_text(quickstart)
    mixed = re.search(r"mixed precision CNN: test accuracy ([\d.]+)%", all_text(quickstart))
    assert mixed and float(mixed.group(1)) > 90, all_text(quickstart)
    assert widgets(quickstart).count("GraphView") == 2, widgets(quickstart)  # the model cell's and the loss cell's


def test_devices_and_placement(tmp_path: Path) -> None:
    nb = run_notebook("02_devices_and_placement", tmp_path)
    out = all_text(nb)
    assert "ps load /job:ps/task:0/device:cpu:0" in out and "partitions of hidden/kernel" in out, out
    assert re.search(r"round_robin .*busiest / lightest [1-9]\d+\.\dx", out), out  # one server holds nearly all
    assert re.search(r"greedy +\(split allowed\).*busiest / lightest 1\.[01]x", out), out
    assert re.search(r"step 2: one device [\d.]+, partitioned [\d.]+", out), out  # the cell checks they match
    assert re.search(r"fuse=True : 1 kernel call\(s\) of \[8\] node\(s\)", out), out
    assert "GraphView" in widgets(nb), widgets(nb)


@pytest.mark.slow
def test_distributed_training(tmp_path: Path) -> None:
    nb = run_notebook("03_distributed_training", tmp_path)
    out = all_text(nb)
    assert out.count("status: stopped, global step") == 2, out
    assert "scaled to 2 replica(s)" in out and "2 gradient(s) make a step from now on: replica(s) 1 joined" in out, out
    assert re.search(r"latest steps reported by replica: \{0: \d+, 1: \d+\}", out), out  # both trained together
    accuracies = [float(a) for a in re.findall(r"test accuracy ([\d.]+)%", out)]
    assert len(accuracies) == 2 and min(accuracies) > 85, out
    assert re.search(r"checkpoints: \['ckpt-\d+", out), out
    assert "closed the cluster at tcp://127.0.0.1:" in out, out
    shown = widgets(nb)
    assert "ClusterView" in shown and "GraphView" in shown, shown
    for launch in (
        "%train loss --data x_train,y_train --replicas 2",
        "%train loss --data x_train,y_train --replicas 1",
    ):
        outputs = cell_with(nb, launch).outputs  # the TrainingMonitor
        assert any("application/vnd.jupyter.widget-view+json" in o.get("data", {}) for o in outputs), outputs


@pytest.mark.slow
def test_inception_survives_a_killed_worker(tmp_path: Path) -> None:
    nb = run_notebook("04_inception_sync_backup", tmp_path)
    out = all_text(nb)
    assert re.search(r"lost worker tcp://127\.0\.0\.1:\d+ \(name worker-1, role worker", out), out
    assert re.search(r"replica 1 runs again, on tcp://", out), out
    assert "status: finished, global step 300 of 300" in out, out
    accuracy = re.search(r"test accuracy ([\d.]+)% after 300 steps", out)
    assert accuracy and float(accuracy.group(1)) > 90, out


def test_cpu_and_cuda_kernels_agree(tmp_path: Path) -> None:
    nb = run_notebook("05_kernels", tmp_path)
    out = all_text(nb)
    assert "CUDA kernels can run: True" in out, out
    assert re.search(r"fuse=True : 1 CUDA kernel launch\(es\) of \[8\] node\(s\)", out), out
    assert "fused and unfused CUDA plans match the CPU kernels" in out, out
