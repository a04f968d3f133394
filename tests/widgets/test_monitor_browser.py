"""Issue 18, items 6 to 9, in a real JupyterLab and Debian's Chromium: what a person sees on the TrainingMonitor.

A notebook's cells drive a ``RecordedJob`` (metrics and events in the job's own
formats) under a TrainingMonitor that refreshes itself on the kernel's loop, as
it does for a real job: a resumed job's losses near 0.002 (y-axis numbers, the
chart keeps updating, no "invalid format" in the console, a log scale), a scale
to three replicas (the header and the charts agree), a straggler, a scale-down
and Stop (no replica that left is red), an hour of metrics (at least 200 points
and the latest), and a flood of checkpoints (one line; the others in view).
Titles and keys sit above the figures, out of the curves' and toolbar's way. After Kernel > Restart Kernel, each
monitor's header says its job is no longer followed (a running one said "running" on), and a ClusterView that it
no longer follows the cluster (it listed the workers of a cluster closed with the kernel).

Screenshots go to ``$CELLGRAPH_TEST_ARTIFACTS/browser`` (else ``test-artifacts/browser``): ``monitor_*.png``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import nbformat
import pytest

from cellgraph.testing.jupyterlab import (
    STEP_TIMEOUT_MS,
    chromium,
    chromium_path,
    jupyter_lab,
    open_notebook,
    restart_kernel,
    run_cell,
    shutdown_kernels,
    until,
    wait_ran,
    write_settings,
)
from cellgraph.widgets.training_monitor_figures import NORMAL, STRAGGLER

REPO = Path(__file__).resolve().parents[2]
VIEWPORT = {"width": 1400, "height": 1400}
KERNEL = {"kernelspec": {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}}

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        chromium_path() is None,
        reason="Debian's chromium is not installed (apt-get install chromium); needed to drive JupyterLab",
    ),
]

CELLS = [
    # 0: a resumed job (global steps from 5000), its losses near 0.002.
    """from cellgraph.testing.recorded_job import RecordedJob
from cellgraph.widgets import TrainingMonitor
job = RecordedJob(replicas=2, steps=100_000, job_id="job-resumed")
def resumed(replica, start, stop, rate=10.0, final=False):
    job.play(replica, range(start, stop, 10), loss=lambda s: 0.0025 - 1e-7 * s + 2e-5 * replica, rate=rate,
             final=final)
resumed(0, 5000, 5400); resumed(1, 5000, 5400, rate=9.5)
monitor = TrainingMonitor(job, interval=0.2)
monitor""",
    # 1: more training: the chart keeps updating.
    "resumed(0, 5400, 6000); resumed(1, 5400, 6000, rate=9.5)",
    # 2: what the log-scale box did, on the Python side.
    "print(type(monitor.loss.figure.axes[1].scale).__name__, len(monitor.loss.lines[0].y))",
    # 3: scale to three replicas; the third has sent nothing yet.
    "job.scale(3)",
    # 4: the third trains, slowly: a straggler.
    "resumed(2, 6000, 6100, rate=2.0); resumed(0, 6000, 6100); resumed(1, 6000, 6100, rate=9.5)",
    # 5: scaled down to two: replica 2 sends its last message and leaves.
    "resumed(2, 6100, 6110, rate=2.0, final=True); job.scale(2); resumed(0, 6100, 6200); resumed(1, 6100, 6200)",
    # 6: Stop: every replica sends its last message.
    "resumed(0, 6200, 6210, final=True); resumed(1, 6200, 6210, rate=9.5, final=True); job.stop()",
    # 7: an hour of metrics and a flood of checkpoints, between a scale and a failure.
    """long = RecordedJob(replicas=1, steps=1_000_000, job_id="job-long")
long.play(0, range(0, 360_000, 10), loss=lambda s: 1 / (1 + s / 1000))
long.event("scaled to 2 replica(s): replica(s) 1 start on tcp://127.0.0.1:4001", at="12:00:00")
for i in range(1, 301):
    long.event(f"checkpoint ckpt-{100 * i:010d} written (every 100 steps) in /tmp/ckpts",
               at=f"12:{i // 3 // 60:02d}:{i // 3 % 60:02d}")
long.event("replica 1 failed: ValueError: boom", at="12:01:41")
TrainingMonitor(long, interval=0.2)""",
    # 8: a local cluster, shown: after a restart its view must not read as a cluster still up.
    "%load_ext cellgraph\n%cluster up --workers 1 --ps 0",
]

# The points of each line of a figure (not the legend's), and the tick labels of its y axis (the second axis).
LINE_POINTS = """fig => [...fig.querySelectorAll('g.curve > path.line')]
    .map((p) => (p.getAttribute('d') || '').split(/[ML]/).length - 1)"""
Y_TICKS = """fig => { const axes = fig.querySelectorAll('g.axis');
    return [...axes[axes.length - 1].querySelectorAll('g.tick text')].map((t) => t.textContent); }"""
BAR_FILLS = "fig => [...fig.querySelectorAll('rect.bar')].map((r) => getComputedStyle(r).fill)"


def artifacts() -> Path:
    base = os.environ.get("CELLGRAPH_TEST_ARTIFACTS")
    folder = (Path(base) if base else REPO / "test-artifacts") / "browser"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def rgb(hex_colour: str) -> str:
    r, g, b = (int(hex_colour[i : i + 2], 16) for i in (1, 3, 5))
    return f"rgb({r}, {g}, {b})"


def run(page: Any, index: int) -> Any:
    run_cell(page, index)
    wait_ran(page, index)
    return page.locator(".jp-Notebook .jp-Cell").nth(index)


def test_the_monitor_tells_the_truth_in_jupyterlab(tmp_path: Path) -> None:
    from playwright.sync_api import sync_playwright

    shots = artifacts()
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in CELLS], metadata=KERNEL)
    write_settings(tmp_path, "@jupyterlab/apputils-extension:notification", {"fetchNews": "false"})
    with jupyter_lab(tmp_path) as lab:
        nbformat.write(nb, lab.notebooks / "monitor.ipynb")
        try:
            with sync_playwright() as p:
                browser = chromium(p)
                try:
                    page = browser.new_page(viewport=VIEWPORT)
                    console: list[str] = []
                    page.on("console", lambda msg: console.append(msg.text))
                    try:
                        check(page, lab, shots, console)
                    except BaseException:
                        page.screenshot(path=str(shots / "monitor_failure.png"), full_page=True)
                        (shots / "monitor_failure_console.txt").write_text("\n".join(console))
                        raise
                finally:
                    browser.close()
        finally:
            shutdown_kernels(lab)


def check(page: Any, lab: Any, shots: Path, console: list[str]) -> None:
    open_notebook(page, lab, "monitor.ipynb")
    monitor = run(page, 0).locator(".jp-OutputArea")
    figures = monitor.locator(".bqplot.figure")
    figures.nth(3).wait_for(timeout=STEP_TIMEOUT_MS)
    loss, rates = figures.nth(0), figures.nth(2)
    title = monitor.locator(".cg-monitor-title")

    # Item 6: y-axis numbers near 0.002, told apart; the chart keeps updating; no bad format in the console.
    until(lambda: min(loss.evaluate(LINE_POINTS) or [0]) >= 40, "40 points per loss line")
    ticks = until(lambda: loss.evaluate(Y_TICKS), "tick labels on the loss chart's y axis")
    values = [float(t) for t in ticks]
    assert len(set(ticks)) == len(ticks) >= 3 and all(0.0018 < v < 0.0026 for v in values), ticks
    run(page, 1)
    until(lambda: min(loss.evaluate(LINE_POINTS)) >= 100, "the loss chart updated to 100 points per line")
    monitor.screenshot(path=str(shots / "monitor_small_losses.png"))
    monitor.locator("label", has_text="log scale").locator("input").check()
    assert "LogScale 100" in run(page, 2).locator(".jp-OutputArea").inner_text()
    log_ticks = until(lambda: loss.evaluate(Y_TICKS) != ticks and loss.evaluate(Y_TICKS), "the log axis's ticks")
    assert len(set(log_ticks)) == len(log_ticks) >= 3 and all(0.0018 < float(v) < 0.0026 for v in log_ticks), log_ticks
    assert min(loss.evaluate(LINE_POINTS)) >= 100
    loss.screenshot(path=str(shots / "monitor_log_scale.png"))
    bad = [m for m in console if "invalid format" in m or "Error setting state" in m]
    assert not bad, f"expected no widget state error in the console, saw {bad}"

    # Item 8: titles and keys above the figures; bqplot draws no legend on the curves, its toolbar no title over.
    for i in range(4):
        figure = figures.nth(i)
        assert figure.locator("g.legend g.legend").count() == 0 and figure.locator(".mainheading").text_content() == ""
    header = monitor.locator(".widget-html-content", has_text="replica 0").first.bounding_box()
    plot = loss.bounding_box()
    assert header["y"] + header["height"] <= plot["y"] + 1, (header, plot)
    loss.hover()
    toolbar = loss.locator(".toolbar_div")
    if toolbar.is_visible():
        box = toolbar.bounding_box()
        assert box["y"] >= header["y"] + header["height"] - 1, (box, header)
    page.mouse.move(0, VIEWPORT["height"] - 1)

    # Item 7: the header and the charts follow the replica set.
    run(page, 3)
    until(lambda: "3 replica(s): 2 training, 1 starting" in title.inner_text(), "the header after job.scale(3)")
    until(lambda: len(rates.evaluate(BAR_FILLS)) == 3, "three bars (one starting) after job.scale(3)")
    monitor.screenshot(path=str(shots / "monitor_scaled_up_starting.png"))
    run(page, 4)
    until(lambda: "3 replica(s): 3 training" in title.inner_text(), "the header once replica 2 trains")
    until(lambda: rates.evaluate(BAR_FILLS).count(rgb(STRAGGLER)) == 1, "replica 2, slow, in red")
    assert len(loss.evaluate(LINE_POINTS)) == 3
    run(page, 5)
    until(lambda: "2 replica(s): 2 training" in title.inner_text(), "the header after the scale-down")
    until(lambda: rates.evaluate(BAR_FILLS) == [rgb(NORMAL)] * 2, "two bars, none red, after replica 2 left")
    assert "replica 2 (left)" in monitor.locator(".widget-html-content", has_text="replica 0").first.inner_text()
    monitor.screenshot(path=str(shots / "monitor_scaled_down.png"))
    run(page, 6)
    until(lambda: re.search(r"· stopped · ", title.inner_text()), "the header after Stop")
    fills = until(lambda: rates.evaluate(BAR_FILLS), "the rates after Stop")
    assert rgb(STRAGGLER) not in fills, f"expected no red bar after Stop, saw {fills}"
    monitor.screenshot(path=str(shots / "monitor_stopped.png"))

    # Items 8 and 9: an hour of metrics, and a flood of checkpoints.
    long = run(page, 7).locator(".jp-OutputArea")
    long_loss = long.locator(".bqplot.figure").first
    long_loss.wait_for(timeout=STEP_TIMEOUT_MS)
    points = until(lambda: long_loss.evaluate(LINE_POINTS), "the long job's loss line")
    assert 200 <= points[0] <= 2000, points
    events = long.locator("details")
    summary = events.locator(".cg-checkpoints")
    assert summary.is_visible()
    assert re.fullmatch(
        r"12:01:40 checkpoints: 300 written, latest ckpt-0000030000 \(every 100 steps\), about one every 0\.33 s, "
        r"in /tmp/ckpts",
        summary.inner_text().strip(),
    )
    lines = events.locator("pre.cg-events")
    assert lines.inner_text().splitlines() == [
        "12:01:41 replica 1 failed: ValueError: boom",
        "12:00:00 scaled to 2 replica(s): replica(s) 1 start on tcp://127.0.0.1:4001",
    ]
    assert lines.is_visible() and "ckpt-" not in lines.inner_text()
    long.screenshot(path=str(shots / "monitor_long_job_and_checkpoints.png"))

    # A kernel restart: the page's widgets stay drawn as last synced. The running job's header said "running" on;
    # now both headers say that nothing follows their job any more, and what each was when last seen.
    long_title = long.locator(".cg-monitor-title")
    assert " · running · 1 replica(s)" in long_title.inner_text()
    view = run(page, 8).locator(".cellgraph-cluster-view")
    until(lambda: view.locator("tr[data-address]").count() == 1, "the cluster's worker in its view")
    restart_kernel(page, lab)
    until(lambda: long_title.get_attribute("data-kernel") == "gone", "the running job's header after a restart")
    assert long_title.inner_text() == (
        "Job job-long · no longer followed: the notebook's kernel restarted or stopped, so nothing here updates "
        "(last seen running · 1 replica(s): 1 training)"
    )
    assert re.search(r"no longer followed: .* \(last seen stopped · 2 replica\(s\)\)$", title.inner_text())
    long.screenshot(path=str(shots / "monitor_after_kernel_restart.png"))
    until(lambda: view.get_attribute("data-kernel") == "gone", "the cluster's view after a restart")
    assert view.locator(".cellgraph-kernel-gone").inner_text() == (
        "the notebook's kernel restarted or stopped, so this view no longer follows the cluster (as last seen "
        "below); a local cluster closes with the kernel that started it: %cluster up starts another"
    )
    assert view.locator(".cellgraph-refresh").is_disabled()
