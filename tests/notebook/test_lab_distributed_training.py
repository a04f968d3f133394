"""Notebook 3 in a real JupyterLab, as a person uses it: run the cells, look at the widgets, press Stop.

JupyterLab (127.0.0.1, a token, a temporary root) serves a copy of
``notebooks/03_distributed_training.ipynb``, and Debian's Chromium, driven by
Playwright, runs its cells one by one with Shift+Enter. What is checked is
what a person sees: the cluster's workers, the placement drawn in device
colours, a scope that opens on a click, the monitor's loss curve growing while
the job trains, the Stop button stopping it (the monitor says so, and so does
the kernel in the notebook's next cell), every cell run in order without an
error, and, once the kernel is shut down, none of the processes it started left.

Screenshots go to ``$CELLGRAPH_TEST_ARTIFACTS/browser`` (else
``test-artifacts/browser`` in the repository): the placement before and after
opening a scope, the monitor while training and after Stop, the notebook with
both (the README's picture), and the whole page when the test fails.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import nbformat
import psutil
import pytest
from nbformat.notebooknode import NotebookNode

from cellgraph.testing.jupyterlab import (
    STEP_TIMEOUT_MS,
    Lab,
    chromium,
    chromium_path,
    jupyter_lab,
    open_notebook,
    run_cell,
    server_pid,
    shutdown_kernels,
    wait_ran,
    write_settings,
)
from cellgraph.widgets.graph_style import DEVICE_COLORS

REPO = Path(__file__).resolve().parents[2]
NOTEBOOK = REPO / "notebooks" / "03_distributed_training.ipynb"
VIEWPORT = {"width": 1400, "height": 1000}
TALL_HEIGHT = 2300  # for screenshots of the whole monitor, and of the placement with the monitor below it
FAILURE_FILES = ("03_failure.png", "03_failure.ipynb", "03_failure_lab.log")
GROWTH = 4  # points each loss line must gain while the test watches: about two seconds of training
EXIT_TIMEOUT_S = 60  # for the cluster's and the kernel's processes to go
# Cells that train or stop a job (and evaluate it) take longer than a step of the page.
CELL_TIMEOUT_MS = 2 * STEP_TIMEOUT_MS

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        chromium_path() is None,
        reason="Debian's chromium is not installed (apt-get install chromium); needed to drive JupyterLab",
    ),
]

# The loss figure's lines, not their legend's icons: the number of points of each (one per metrics message).
LINE_POINTS = """fig => [...fig.querySelectorAll('g.curve > path.line')]
    .map((p) => (p.getAttribute('d') || '').split(/[ML]/).length - 1)"""
# The fill a person sees on each closed box (nodes and closed scopes): the computed style, not the attribute.
BOX_FILLS = """svg => [...svg.querySelectorAll('[data-id]:not([data-open="1"]) > rect:first-of-type')]
    .map((r) => getComputedStyle(r).fill)"""
# JupyterLab renders an error output (a traceback) and a stream to stderr alike: what tells them apart is the text.
STDERR = '.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]'
# A traceback, or a magic's UsageError (printed to stderr, with no error output); a warning is no failure.
EXCEPTION = re.compile(r"^\w*(Error|Exception)\b|Traceback \(most recent call last\)", re.M)


def artifacts() -> Path:
    base = os.environ.get("CELLGRAPH_TEST_ARTIFACTS")
    folder = (Path(base) if base else REPO / "test-artifacts") / "browser"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def code_cell(nb: NotebookNode, source: str) -> int:
    """The index of the first code cell whose source holds ``source``."""
    found = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and source in c.source]
    assert found, f"expected a code cell with {source!r} in {NOTEBOOK.name}; there is none"
    return found[0]


def rgb(hex_colour: str) -> str:
    """``#e69f00`` as the browser's computed style writes it: ``rgb(230, 159, 0)``."""
    r, g, b = (int(hex_colour[i : i + 2], 16) for i in (1, 3, 5))
    return f"rgb({r}, {g}, {b})"


def describe(processes: list[psutil.Process]) -> list[str]:
    """``pid: command line`` of each process, for a message; one that has just gone says so."""
    found = []
    for process in processes:
        try:
            found.append(f"{process.pid}: {' '.join(process.cmdline())}")
        except psutil.Error:
            found.append(f"{process.pid}: (gone)")
    return found


def reap(processes: list[psutil.Process]) -> list[str]:
    """Wait (with a deadline) for ``processes`` to exit; kill those still running and return their descriptions."""
    _, alive = psutil.wait_procs(processes, timeout=EXIT_TIMEOUT_S)
    left = describe(alive)
    for process in alive:  # ours to stop: started by this test's server
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    return left


def cell(page: Any, index: int) -> Any:
    return page.locator(".jp-Notebook .jp-Cell").nth(index)


def run(page: Any, index: int, timeout_ms: int = STEP_TIMEOUT_MS) -> str:
    """Run cell ``index`` as a person does, wait until it has run, and return the text of its output area.

    A cell that failed fails the test at once, with what it showed (the saved notebook is checked again at the end).
    """
    run_cell(page, index)
    wait_ran(page, index, timeout_ms)
    for stderr in cell(page, index).locator(STDERR).all_inner_texts():
        assert not EXCEPTION.search(stderr), f"expected cell {index} to run without an error, it showed:\n{stderr}"
    return str(cell(page, index).locator(".jp-OutputArea").inner_text())


def wait_for_text(locator: Any, pattern: str, what: str, timeout_ms: int = STEP_TIMEOUT_MS) -> re.Match[str]:
    """Until ``locator``'s text matches ``pattern``; fail saying what was expected and what was shown."""
    deadline = time.monotonic() + timeout_ms / 1000
    while True:
        text = str(locator.inner_text(timeout=timeout_ms)) if locator.count() else "(nothing shown)"
        found = re.search(pattern, text)
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(
                f"{what}: expected text matching {pattern!r} within {timeout_ms / 1000:.0f} s, saw:\n{text}"
            )
        time.sleep(0.2)


def loss_points(figure: Any) -> list[int]:
    return [int(n) for n in figure.evaluate(LINE_POINTS)]


def save_notebook(page: Any, lab: Lab, name: str, index: int) -> NotebookNode:
    """Save with Ctrl+S, as a person does, and read the file once it holds cell ``index``'s execution."""
    path = lab.notebooks / name
    cell(page, index).locator(".jp-InputPrompt").click()
    page.keyboard.press("Control+s")
    deadline = time.monotonic() + STEP_TIMEOUT_MS / 1000
    while True:
        nb = nbformat.read(path, as_version=4)
        if nb.cells[index].get("execution_count") is not None:
            return nb
        if time.monotonic() > deadline:
            raise AssertionError(f"expected {path} saved with cell {index} run after Ctrl+S; the file shows it not run")
        time.sleep(0.2)


def exceptions(nb: NotebookNode) -> list[str]:
    """Each error output, and each stderr text that reports an exception (warnings are fine), as ``cell i: text``."""
    found = []
    for i, c in enumerate(nb.cells):
        for out in c.get("outputs", []):
            if out.output_type == "error":
                found.append(f"cell {i}: {out.ename}: {out.evalue}")
            elif out.output_type == "stream" and out.name == "stderr":
                # A magic's UsageError and a traceback printed by hand reach stderr without an error output.
                if EXCEPTION.search(out.text):
                    found.append(f"cell {i} (stderr): {out.text.strip()}")
    return found


def keep_evidence(page: Any, lab: Lab, shots: Path) -> None:
    """After a failure: the page, the notebook with its outputs (saved with Ctrl+S) and the server's log."""
    page.screenshot(path=str(shots / "03_failure.png"), full_page=True)
    notebook = lab.notebooks / NOTEBOOK.name
    before = notebook.stat().st_mtime_ns
    page.keyboard.press("Control+s")
    deadline = time.monotonic() + 10
    while notebook.stat().st_mtime_ns == before and time.monotonic() < deadline:
        time.sleep(0.2)
    if notebook.stat().st_mtime_ns == before:
        print("the notebook was not saved after the failure: 03_failure.ipynb holds no outputs")
    shutil.copy(notebook, shots / "03_failure.ipynb")
    shutil.copy(lab.notebooks.parent / "lab.log", shots / "03_failure_lab.log")
    print(f"the test failed: see {', '.join(FAILURE_FILES)} in {shots}")


def test_notebook_3_runs_in_jupyterlab_and_its_widgets_answer(tmp_path: Path) -> None:
    began = time.monotonic()
    shots = artifacts()
    for name in FAILURE_FILES:  # an earlier run's
        (shots / name).unlink(missing_ok=True)
    nb = nbformat.read(NOTEBOOK, as_version=4)
    # No news prompt over the notebook (and no request for it).
    write_settings(tmp_path, "@jupyterlab/apputils-extension:notification", {"fetchNews": "false"})
    # The jobs' checkpoint folders and Dask's scratch space: in this test's folder, not the machine's /tmp.
    kernel_tmp = tmp_path / "kernel-tmp"
    kernel_tmp.mkdir()
    started: dict[int, psutil.Process] = {}  # every process the server started (kernel, cluster), as seen

    try:
        with jupyter_lab(tmp_path, env={"TMPDIR": str(kernel_tmp)}) as lab:
            shutil.copy(NOTEBOOK, lab.notebooks / NOTEBOOK.name)
            server = psutil.Process(server_pid(lab))

            def note_processes() -> list[psutil.Process]:
                now = server.children(recursive=True)
                for process in now:
                    started.setdefault(process.pid, process)
                return now

            try:
                browse(lab, shots, lambda page: drive(page, lab, server, nb, shots, note_processes))
            finally:
                note_processes()
                # Closes the cluster too (the extension closes it at the kernel's exit) if a failure left it up.
                shutdown_kernels(lab, timeout_s=EXIT_TIMEOUT_S)
    finally:
        # Whatever happened, every process the server started goes: after a failure too (then killed if need be).
        left = reap(list(started.values()))
    assert not left, f"expected no process of the kernel or its cluster after the kernel's shutdown; saw {left}"
    print(f"notebook 3 in JupyterLab: {time.monotonic() - began:.1f} s; screenshots in {shots}")


def browse(lab: Lab, shots: Path, act: Callable[[Any], None]) -> None:
    """``act(page)`` on a new page of Debian's Chromium; after a failure, keep the evidence; close the browser."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = chromium(p)
        try:
            page = browser.new_page(viewport=VIEWPORT)
            try:
                act(page)
            except BaseException:
                keep_evidence(page, lab, shots)
                raise
        finally:
            browser.close()


def drive(
    page: Any,
    lab: Lab,
    server: psutil.Process,
    nb: NotebookNode,
    shots: Path,
    note_processes: Callable[[], list[psutil.Process]],
) -> None:
    """Everything a person does in the notebook, checked as it goes."""
    up = code_cell(nb, "%cluster up")
    placement = code_cell(nb, "%placement mlp")
    train = code_cell(nb, "%train loss --data x_train,y_train --replicas 2")
    watch = code_cell(nb, "job.global_step() >= 150")
    stop = code_cell(nb, "job.stop(timeout=60)")
    down = code_cell(nb, "%cluster down")
    code = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"]

    open_notebook(page, lab, NOTEBOOK.name)
    cell(page, 0).click()
    page.keyboard.press("Control+b")  # the file browser closed: the notebook gets the width
    for index in [i for i in code if i < up]:
        run(page, index)

    # %cluster up: the ClusterView lists one parameter-server process and two training processes.
    run(page, up, CELL_TIMEOUT_MS)
    view = cell(page, up).locator(".jp-OutputArea")
    wait_for_text(view, r"Cluster tcp://127\.0\.0\.1:\d+", "the ClusterView's title")
    roles = {role: view.locator(f".cellgraph-role-{role}").count() for role in ("ps", "worker")}
    assert roles == {"ps": 1, "worker": 2}, f"expected the ClusterView to show 1 ps and 2 workers, saw {roles}"
    note_processes()
    kernels = server.children()
    assert len(kernels) == 1, f"expected one process under the server, the kernel; saw {describe(kernels)}"
    kernel = kernels[0]
    # The worker processes (their nannies run in the kernel); multiprocessing's resource tracker, which their
    # start left, is the kernel's own and goes with it.
    cluster = [p for p in kernel.children(recursive=True) if "resource_tracker" not in " ".join(p.cmdline())]
    assert len(cluster) == 3, (
        f"expected the cluster's 3 worker processes (1 ps, 2 workers) under the kernel, saw {describe(cluster)}"
    )

    for index in [i for i in code if up < i < placement]:
        run(page, index)
    check_placement(page, placement, run(page, placement), shots)

    for index in [i for i in code if placement < i < train]:
        run(page, index)
    run(page, train)
    monitor = cell(page, train).locator(".jp-OutputArea-output", has=page.locator(".bqplot")).first
    title = monitor.locator(".cg-monitor-title")
    wait_for_text(title, r"^Job job-\w+ · running · 2 replica\(s\)", "the monitor's title while the job trains")
    note_processes()

    for index in [i for i in code if train < i < watch]:
        run(page, index)
    watched = run(page, watch, CELL_TIMEOUT_MS)
    step = re.search(r"running at global step (\d+)", watched)
    assert step and int(step.group(1)) >= 150, f"expected 'running at global step N' with N >= 150, saw:\n{watched}"

    # The loss curve grows while the job trains: a few more points (one per metrics message, two a second).
    monitor.scroll_into_view_if_needed()
    figure = monitor.locator(".bqplot.figure").first
    # Each figure's title is the line of HTML above it (with its key), out of the curves' and the toolbar's way.
    heading = monitor.locator(".widget-html-content", has=page.locator("b", has_text="loss")).first.inner_text()
    assert heading.startswith("loss"), f"expected the monitor's first figure to be the loss curve, saw {heading!r}"
    first = loss_points(figure)
    assert len(first) == 2 and min(first) >= 1, (
        f"expected a loss line with points for each of 2 replicas, saw lines of {first} point(s)"
    )
    deadline = time.monotonic() + STEP_TIMEOUT_MS / 1000
    later = first
    while not all(n >= m + GROWTH for n, m in zip(later, first)):
        assert time.monotonic() < deadline, (
            f"expected each replica's loss line to gain {GROWTH}+ points while the job trains: {first}, still {later} "
            f"after {STEP_TIMEOUT_MS / 1000:.0f} s"
        )
        time.sleep(0.5)
        later = loss_points(figure)
    tall_screenshot(page, monitor, monitor, shots / "03_monitor_training.png")
    tall_screenshot(page, cell(page, placement), page, shots / "03_notebook.png")

    # Stop, as a person does: the button; the monitor says the job stopped and greys its buttons out.
    button = monitor.get_by_role("button", name="Stop")
    assert button.is_enabled(), "expected the Stop button enabled while the job trains, saw it disabled"
    button.click()
    wait_for_text(title, r"^Job job-\w+ · stopped · ", "the monitor's title after Stop", CELL_TIMEOUT_MS)
    message = monitor.locator(".widget-html-content", has_text="stop job")
    wait_for_text(message, r"stop job job-\w+: done; the job is stopped", "the monitor's message after Stop")
    assert button.is_disabled(), "expected the Stop button disabled once the job has stopped, saw it enabled"
    # Once stopped, the monitor shows the final counters: the servers' step is the one the job stopped at.
    stopped_at = wait_for_text(monitor.locator("pre"), r"stopped at global step (\d+)", "the monitor's events")[1]
    ps_step = monitor.locator("table tr").nth(1).locator("td").nth(2)
    wait_for_text(ps_step, rf"^{stopped_at}$", f"the PS table's step once the job stopped at {stopped_at}")
    tall_screenshot(page, monitor, monitor, shots / "03_monitor_stopped.png")

    # The kernel agrees: the notebook's next cells stop the job again (nothing to do) and print its status.
    outputs = {index: run(page, index, CELL_TIMEOUT_MS) for index in code if index > watch}
    assert re.search(r"status: stopped, global step \d+", outputs[stop]), (
        f"expected cell {stop} to print 'status: stopped, global step N' after Stop, saw:\n{outputs[stop]}"
    )
    assert re.search(r"closed the cluster at tcp://127\.0\.0\.1:\d+", outputs[down]), (
        f"expected %cluster down (cell {down}) to say 'closed the cluster at tcp://127.0.0.1:PORT', "
        f"saw:\n{outputs[down]}"
    )
    # %cluster down took the cluster's processes with it; the kernel itself goes on.
    _, alive = psutil.wait_procs(cluster, timeout=EXIT_TIMEOUT_S)
    assert not alive, f"expected no cluster process after %cluster down, saw {describe(alive)}"
    # The ClusterView %cluster up showed says so: it went on listing the closed cluster's workers.
    view.scroll_into_view_if_needed()  # far above by now: JupyterLab draws only the cells in sight
    wait_for_text(view, r"Cluster tcp://127\.0\.0\.1:\d+ \(local\), closed", "the ClusterView after %cluster down")
    listed = view.locator(".cellgraph-role-worker").count()
    assert listed == 0, f"expected the ClusterView to list no worker after %cluster down, saw {listed}"

    saved = save_notebook(page, lab, NOTEBOOK.name, down)
    counts = [saved.cells[i].get("execution_count") for i in code]
    assert None not in counts and all(a < b for a, b in zip(counts, counts[1:])), (
        f"expected every code cell run once, in order (increasing execution counts), saw {counts}"
    )
    errors = exceptions(saved)
    assert not errors, "expected no cell to fail, saw:\n" + "\n".join(errors)


def check_placement(page: Any, index: int, shown: str, shots: Path) -> None:
    """The placement drawing: boxes in at least two device colours, and a scope that opens on a click."""
    graph = cell(page, index).locator(".cgv").first
    svg = graph.locator(".cgv-svg")
    svg.locator("[data-id]").first.wait_for(timeout=STEP_TIMEOUT_MS)
    ids = svg.locator("[data-id]").evaluate_all("els => els.map((e) => e.dataset.id)")
    fills = set(svg.evaluate(BOX_FILLS))
    devices = fills & {rgb(c) for c in DEVICE_COLORS}
    assert len(devices) >= 2, (
        f"expected the boxes in at least two device colours of {DEVICE_COLORS}, saw the fills {sorted(fills)}"
    )
    legend = graph.locator(".cgv-legend").inner_text()
    for device in ("/job:ps/task:0", "/job:worker/task:0"):
        assert device in legend, f"expected {device} in the drawing's legend, saw {legend!r}"
    assert "/job:ps/task:0" in shown, f"expected the placement table to name the ps device, saw:\n{shown}"
    graph.screenshot(path=str(shots / "03_placement_collapsed.png"))

    closed = svg.locator('[data-open="0"]')
    assert closed.count() >= 1, f"expected a closed scope in the drawing, saw only {ids}"
    scope = closed.first.get_attribute("data-id")
    closed.first.click()
    svg.locator(f'[data-id="{scope}"][data-open="1"]').wait_for(timeout=STEP_TIMEOUT_MS)
    after = svg.locator("[data-id]").evaluate_all("els => els.map((e) => e.dataset.id)")
    assert len(after) > len(ids), (
        f"expected more boxes once {scope} is open: {len(ids)} before ({ids}), {len(after)} after ({after})"
    )
    graph.screenshot(path=str(shots / "03_placement_expanded.png"))


def tall_screenshot(page: Any, top: Any, subject: Any, path: Path) -> None:
    """A screenshot of ``subject`` (an element, or the page) in a window tall enough for it, ``top`` at its top.

    The notebook scrolls inside the page, under a toolbar that stays put: a window taller than the monitor
    (or than the placement cell down to the monitor, the README's picture) shows it whole.
    """
    page.set_viewport_size({"width": VIEWPORT["width"], "height": TALL_HEIGHT})
    try:
        top.evaluate("el => el.scrollIntoView({block: 'start'})")
        page.mouse.move(0, TALL_HEIGHT - 1)  # off the figures: no bqplot toolbar shown on hover
        page.wait_for_timeout(500)  # the cells scrolled in paint (content-visibility), bqplot redraws at the new size
        subject.screenshot(path=str(path))
    finally:
        page.set_viewport_size(VIEWPORT)
