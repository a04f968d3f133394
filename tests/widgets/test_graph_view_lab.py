"""Issue 18, items 10 and 11, in a real JupyterLab and Debian's Chromium: GraphView while the kernel is busy.

A notebook shows a 10,001-node graph placed on two workers, and the MLP placed
on a parameter server and a worker; then a cell keeps the kernel busy (it waits
for a file the test writes at the end). While it runs, scopes are opened and
closed by clicks: each must be drawn without the kernel (which today answers
only once the cell has ended). The time from the click to the painted frame is
measured in the browser and printed; it is no assertion (the machine is
shared). The placement view must show the MLP's ``logits`` scope, half on each
device, in both colours.

Screenshots go to ``$CELLGRAPH_TEST_ARTIFACTS/browser`` (else ``test-artifacts/browser``): ``graph_view_*.png``.
"""

from __future__ import annotations

import os
import re
import statistics
from pathlib import Path
from typing import Any

import nbformat
import pytest

from cellgraph.testing.jupyterlab import (
    STEP_TIMEOUT_MS,
    chromium,
    chromium_path,
    jupyter_lab,
    kernels,
    open_notebook,
    run_cell,
    shutdown_kernels,
    wait_ran,
    write_settings,
)
from cellgraph.widgets.graph_style import DEVICE_COLORS

REPO = Path(__file__).resolve().parents[2]
VIEWPORT = {"width": 1400, "height": 1000}
KERNEL = {"kernelspec": {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}}
BUSY_S = 240  # the busy cell's own deadline: it ends when the test writes its file, or then
MARK = "cellgraph-graphview-paint"
PS = "/job:ps/task:0/device:cpu:0"
WORKER = "/job:worker/task:0/device:cpu:0"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        chromium_path() is None,
        reason="Debian's chromium is not installed (apt-get install chromium); needed to drive JupyterLab",
    ),
]


def cells(flag: Path) -> list[str]:
    return [
        """import cellgraph as cg
from cellgraph.widgets import GraphView
from cellgraph.testing.graph_synthetic import WORKERS, synthetic_graph
g = synthetic_graph()
view = GraphView(g, cg.placement.place(g, WORKERS))
view""",
        f"""from cellgraph.examples.models import mlp
m = mlp().graph
GraphView(m, cg.placement.place(m, [{PS!r}, {WORKER!r}]))""",
        f"""import os, time
deadline = time.monotonic() + {BUSY_S}
while not os.path.exists({str(flag)!r}) and time.monotonic() < deadline:
    time.sleep(0.05)
print("busy cell done")""",
        "print(view.expanded)",
    ]


def artifacts() -> Path:
    base = os.environ.get("CELLGRAPH_TEST_ARTIFACTS")
    folder = (Path(base) if base else REPO / "test-artifacts") / "browser"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def rgb(hex_colour: str) -> str:
    r, g, b = (int(hex_colour[i : i + 2], 16) for i in (1, 3, 5))
    return f"rgb({r}, {g}, {b})"


def output(page: Any, index: int) -> Any:
    return page.locator(".jp-Notebook .jp-Cell").nth(index).locator(".jp-OutputArea")


def toggle(page: Any, view: Any, item_id: str, opening: bool) -> float:
    """Click ``item_id`` (its header when closing) and wait for it drawn open (or closed); the milliseconds from
    the click to the painted frame, measured in the page."""
    view.locator(".cgv-fit").click()
    target = view.locator(f'.cgv-svg [data-id="{item_id}"]').first
    box = (target if opening else target.locator("text").first).bounding_box()
    before = page.evaluate(f"performance.getEntriesByName('{MARK}').length")
    page.evaluate("window.cgT0 = null")
    page.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    state = "1" if opening else "0"
    view.locator(f'.cgv-svg [data-id="{item_id}"][data-open="{state}"]').wait_for(timeout=STEP_TIMEOUT_MS)
    page.wait_for_function(f"performance.getEntriesByName('{MARK}').length > {before}", timeout=STEP_TIMEOUT_MS)
    return float(page.evaluate(f"performance.getEntriesByName('{MARK}').at(-1).startTime - window.cgT0"))


def test_scopes_open_and_close_while_the_kernel_is_busy(tmp_path: Path) -> None:
    from playwright.sync_api import sync_playwright

    shots = artifacts()
    flag = tmp_path / "done"
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells(flag)], metadata=KERNEL)
    write_settings(tmp_path, "@jupyterlab/apputils-extension:notification", {"fetchNews": "false"})
    with jupyter_lab(tmp_path) as lab:
        nbformat.write(nb, lab.notebooks / "graph.ipynb")
        try:
            with sync_playwright() as p:
                browser = chromium(p)
                try:
                    page = browser.new_page(viewport=VIEWPORT)
                    try:
                        check(page, lab, shots, flag)
                    except BaseException:
                        page.screenshot(path=str(shots / "graph_view_failure.png"), full_page=True)
                        raise
                finally:
                    flag.touch()  # the busy cell ends, whatever happened
                    browser.close()
        finally:
            shutdown_kernels(lab)


def check(page: Any, lab: Any, shots: Path, flag: Path) -> None:
    open_notebook(page, lab, "graph.ipynb")
    page.evaluate("window.addEventListener('pointerdown', () => { window.cgT0 = performance.now(); }, true)")
    run_cell(page, 0)
    wait_ran(page, 0, 2 * STEP_TIMEOUT_MS)
    view = output(page, 0).locator(".cgv")
    view.locator('.cgv-svg [data-id="s:stage03"]').wait_for(timeout=STEP_TIMEOUT_MS)
    # The layouts of every scope follow the first drawing, computed on a thread of the kernel.
    output(page, 0).locator('.cgv[data-structure="1"]').wait_for(timeout=STEP_TIMEOUT_MS)

    # Item 11: the placement view shows a mixed scope's mix.
    run_cell(page, 1)
    wait_ran(page, 1)
    placed = output(page, 1).locator(".cgv")
    logits = placed.locator('.cgv-svg [data-id="s:logits"]')
    logits.wait_for(timeout=STEP_TIMEOUT_MS)
    bands = logits.locator("rect.cgv-band").evaluate_all(
        "els => els.map((r) => [getComputedStyle(r).fill, +r.getAttribute('width'), r.dataset.key])"
    )
    width = float(logits.locator("rect").first.get_attribute("width"))
    assert sorted(key for _, _, key in bands) == [PS, WORKER], bands
    assert {fill for fill, _, _ in bands} == {rgb(DEVICE_COLORS[0]), rgb(DEVICE_COLORS[1])}
    assert all(abs(w - width / 2) < 0.5 for _, w, _ in bands), (bands, width)  # two ops on each
    placed.screenshot(path=str(shots / "graph_view_placement_mixed.png"))

    # Item 10: the kernel runs a cell; scopes open and close all the same.
    run_cell(page, 2)
    page.locator(".jp-Notebook .jp-Cell").nth(2).locator(".jp-InputPrompt", has_text="[*]").wait_for()
    opened, closed = [], []
    for stage, block in (("s:stage03", "s:stage03/block04"), ("s:stage08", "s:stage08/block01")):
        opened.append(toggle(page, view, stage, opening=True))
        opened.append(toggle(page, view, block, opening=True))
        if stage == "s:stage03":
            view.screenshot(path=str(shots / "graph_view_busy_kernel_open.png"))
        closed.append(toggle(page, view, stage, opening=False))
    states = {k.get("execution_state") for k in kernels(lab)}
    assert states == {"busy"}, f"expected the kernel still busy with the cell after the clicks, it is {states}"
    print(
        "GraphView, 10,001 nodes, kernel busy: click to painted frame (ms) "
        f"open {[round(t, 1) for t in opened]} (median {statistics.median(opened):.1f}), "
        f"close {[round(t, 1) for t in closed]} (median {statistics.median(closed):.1f})"
    )

    # The kernel, free again, has heard of every change: what is open there is what the page shows.
    flag.touch()
    wait_ran(page, 2, STEP_TIMEOUT_MS)
    run_cell(page, 3)
    wait_ran(page, 3)
    text = output(page, 3).inner_text()
    assert re.search(r"\['stage03/block04', 'stage08/block01'\]", text), text
