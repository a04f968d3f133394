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
    until,
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


# Each band of a mixed scope: its fill as the person sees it (the computed style), its width and its device.
BANDS = "els => els.map((r) => [getComputedStyle(r).fill, +r.getAttribute('width'), r.dataset.key])"


def filled(bands: list[list[Any]]) -> list[list[Any]] | None:
    """``bands`` once each has its fill, else None (to read them again)."""
    return bands if bands and all(fill for fill, _, _ in bands) else None


def read_bands(scope: Any) -> list[list[Any]] | None:
    """The bands of ``scope`` scrolled into view, or None while the view is being drawn again."""
    from playwright.sync_api import Error as PlaywrightError

    try:
        # In view first: one reading with every fill "" was of a view drawn below the page's fold.
        scope.scroll_into_view_if_needed(timeout=STEP_TIMEOUT_MS)
        return filled(scope.locator("rect.cgv-band").evaluate_all(BANDS))
    except PlaywrightError as err:
        if "not attached to the DOM" in str(err):
            return None  # replaced by the next drawing between finding it and scrolling: read the new one
        raise


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
    # The view is drawn again when the scopes' layouts arrive from the kernel: read it after that. A reading taken
    # while it was drawn again found every fill "" (a detached element has no computed style), and a scroll found
    # the element gone from the page.
    output(page, 1).locator('.cgv[data-structure="1"]').wait_for(timeout=STEP_TIMEOUT_MS)
    bands = until(lambda: read_bands(logits), "the logits scope's bands")
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


# WCAG's contrast ratio of each text a person reads in the view against what is behind it (an alpha colour, as
# JupyterLab's dark font colours are, blended over that background first).
CONTRASTS = """view => {
  const rgba = (s) => { const m = s.match(/[\\d.]+/g).map(Number); return m.length === 3 ? [...m, 1] : m; };
  const behind = (el) => {
    for (let e = el; e; e = e.parentElement) {
      const bg = rgba(getComputedStyle(e).backgroundColor);
      if (bg[3] > 0) return bg;
    }
    return [255, 255, 255, 1];
  };
  const lum = ([r, g, b]) => {
    const f = (c) => ((c /= 255) <= 0.03928 ? c / 12.92 : ((c + 0.055) / 1.055) ** 2.4);
    return 0.2126 * f(r) + 0.7152 * f(g) + 0.0722 * f(b);
  };
  const ratio = (el, colour) => {
    const bg = behind(el), fg = rgba(colour), a = fg[3];
    const mixed = [0, 1, 2].map((i) => fg[i] * a + bg[i] * (1 - a));
    const [hi, lo] = [lum(mixed), lum(bg)].sort((x, y) => y - x);
    return Math.round(((hi + 0.05) / (lo + 0.05)) * 100) / 100;
  };
  const texts = [".cgv-count", ".cgv-legend span", ".cgv-panel h4", ".cgv-panel td", ".cgv-info > div"];
  const out = texts.flatMap((sel) => [...view.querySelectorAll(sel)].map((el) => [sel, ratio(el, getComputedStyle(el).color)]));
  const svg = view.querySelector(".cgv-svg");
  for (const sel of ['[data-open="1"] > text', ".cgv-elabel"]) {
    for (const el of view.querySelectorAll(sel)) out.push([sel, ratio(svg, getComputedStyle(el).fill)]);
  }
  return out;
}"""


def test_every_text_of_the_view_is_readable_in_the_dark_theme(tmp_path: Path) -> None:
    """JupyterLab Dark: the count, the device legend and the info panel were #222 on the theme's black (a
    ratio of 1.1), the panel's labels #666; the view takes the theme's colours now, in the light theme as before."""
    from playwright.sync_api import sync_playwright

    shots = artifacts()
    source = f"""from cellgraph.examples.models import mlp
from cellgraph.widgets import GraphView
import cellgraph as cg
m = mlp().graph
view = GraphView(m, cg.placement.place(m, [{PS!r}, {WORKER!r}]))
view"""
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source)], metadata=KERNEL)
    write_settings(tmp_path, "@jupyterlab/apputils-extension:notification", {"fetchNews": "false"})
    write_settings(tmp_path, "@jupyterlab/apputils-extension:themes", {"theme": "JupyterLab Dark"})
    with jupyter_lab(tmp_path) as lab:
        nbformat.write(nb, lab.notebooks / "dark.ipynb")
        try:
            with sync_playwright() as p:
                browser = chromium(p)
                try:
                    page = browser.new_page(viewport=VIEWPORT)
                    try:
                        open_notebook(page, lab, "dark.ipynb")
                        page.wait_for_selector(
                            'body[data-jp-theme-light="false"]', state="attached", timeout=STEP_TIMEOUT_MS
                        )
                        run_cell(page, 0)
                        wait_ran(page, 0)
                        view = output(page, 0).locator(".cgv")
                        view.locator('.cgv-svg [data-id="s:logits"]').wait_for(timeout=STEP_TIMEOUT_MS)
                        hint = view.evaluate(CONTRASTS)
                        view.locator('.cgv-svg [data-id="s:logits"]').click()  # opened: its title on the canvas
                        view.locator('.cgv-svg [data-id="s:logits"][data-open="1"]').wait_for(timeout=STEP_TIMEOUT_MS)
                        view.locator('.cgv-svg [data-id="n:x"]').click()  # selected: its details in the panel
                        view.locator(".cgv-panel td").first.wait_for(timeout=STEP_TIMEOUT_MS)
                        view.screenshot(path=str(shots / "graph_view_dark.png"))
                        ratios = hint + view.evaluate(CONTRASTS)
                    except BaseException:
                        page.screenshot(path=str(shots / "graph_view_dark_failure.png"), full_page=True)
                        raise
                finally:
                    browser.close()
        finally:
            shutdown_kernels(lab)
    seen = {sel for sel, _ in ratios}
    assert seen >= {".cgv-count", ".cgv-legend span", ".cgv-panel td", ".cgv-info > div", '[data-open="1"] > text'}, (
        seen
    )
    faint = sorted({(sel, r) for sel, r in ratios if r < 4.5})
    assert not faint, f"text below WCAG's 4.5:1 against its background in JupyterLab Dark: {faint}"
