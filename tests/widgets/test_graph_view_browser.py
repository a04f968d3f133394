"""GraphView's ES module in Debian's Chromium, driven by the Python widget's own state.

The page imports graph_view.js and renders it with a model object that has
anywidget's interface (get, on, off, send). Its state is ``view.get_state()``;
what the module sends is handed to the widget as a comm message would be, and
the widget's new state is pushed back into the page. This is the kernel's
round trip without JupyterLab (the notebook browser test covers that), and with
a ``send`` that throws it is the static page of an exported notebook.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import cellgraph as cg
from cellgraph.examples.models import mini_inception, mlp
from cellgraph.testing.graph_synthetic import WORKERS, synthetic_graph
from cellgraph.widgets import graph_view
from cellgraph.widgets.graph_style import DEVICE_COLORS
from cellgraph.widgets.graph_view import GraphView

CHROMIUM = shutil.which("chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run"]
ORIGIN = "http://cellgraph.test"
PS = "/job:ps/task:0/device:cpu:0"
WORKER = "/job:worker/task:0/device:cpu:0"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        CHROMIUM is None,
        reason="Debian's chromium is not installed (apt-get install chromium); needed to run the ES module",
    ),
]

PAGE = """<!doctype html><html><body><div id="out" style="width: 1100px"></div>
<script type="module">
import widget from "/graph_view.js";
const state = window.cgState;
const listeners = {};
window.cgSent = [];
window.cgModel = {
  get: (key) => state[key],
  on: (event, fn) => (listeners[event] ||= []).push(fn),
  off: (event, fn) => (listeners[event] = (listeners[event] || []).filter((f) => f !== fn)),
  send: (msg) => {
    if (window.cgStatic) throw new Error("no kernel");
    window.cgSent.push(msg);
  },
  set: (key, value) => {
    state[key] = value;
    window.cgChanged[key] = value;
    for (const fn of listeners["change:" + key] || []) fn();
  },
  save_changes: () => {
    if (window.cgStatic) throw new Error("no kernel");
    window.cgSaved.push({ ...window.cgChanged });
    window.cgChanged = {};
  },
};
window.cgChanged = {};
window.cgSaved = [];
window.cgPush = (patch) => {
  Object.assign(state, patch);
  for (const key of Object.keys(patch)) for (const fn of listeners["change:" + key] || []) fn();
};
widget.render({ model: window.cgModel, el: document.getElementById("out") });
window.cgReady = true;
</script></body></html>"""


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


def open_view(browser: Any, view: GraphView, static: bool = False) -> Any:
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    esm = Path(graph_view.__file__).with_name("graph_view.js").read_text()
    page.route(f"{ORIGIN}/", lambda route: route.fulfill(body=PAGE, content_type="text/html"))
    page.route(f"{ORIGIN}/graph_view.js", lambda route: route.fulfill(body=esm, content_type="text/javascript"))
    state = json.dumps({k: v for k, v in view.get_state().items() if not k.startswith("_")})
    page.add_init_script(f"window.cgState = {state}; window.cgStatic = {json.dumps(static)};")
    page.goto(f"{ORIGIN}/")
    page.wait_for_function("window.cgReady === true")
    return page


def round_trip(page: Any, view: GraphView) -> list[dict[str, Any]]:
    """Hand what the page sent (messages, and trait changes it saved) to the widget, as the kernel would, and
    push its new state back; return the messages."""
    for changes in page.evaluate("window.cgSaved.splice(0)"):
        view.set_state(changes)
    sent = page.evaluate("window.cgSent.splice(0)")
    for msg in sent:
        view._handle_msg({"content": {"data": {"method": "custom", "content": msg}}, "buffers": []})
    keys = ("scene", "expanded", "selected", "info", "query", "matches", "hits", "error")
    page.evaluate("(patch) => window.cgPush(patch)", {k: view.get_state()[k] for k in keys})
    return sent


def click(page: Any, item_id: str) -> None:
    page.locator(f'.cgv-svg [data-id="{item_id}"]').first.click(force=True)


def test_draws_the_scene_with_device_colours_and_send_recv(browser: Any) -> None:
    graph = mlp().graph
    view = GraphView(graph, placement=cg.placement.place(graph, [PS, WORKER]))
    view.expand("hidden")
    page = open_view(browser, view)
    drawn = page.eval_on_selector_all(".cgv-svg [data-id]", "els => els.map(e => e.dataset.id)")
    assert sorted(drawn) == sorted(n["id"] for n in view.scene["nodes"])
    fills = page.eval_on_selector_all(
        '.cgv-svg [data-kind="node"] > rect:first-child', "els => els.map(e => e.getAttribute('fill'))"
    )
    assert {DEVICE_COLORS[0], DEVICE_COLORS[1]} <= set(fills)
    legend = page.locator(".cgv-legend").inner_text()
    assert PS in legend and WORKER in legend
    # hidden/kernel (PS) -> hidden/matmul (worker): dashed, with its Send and its Recv.
    assert page.locator(".cgv-cross").count() >= 1
    assert page.locator(".cgv-sr", has_text="Send").count() == page.locator(".cgv-sr", has_text="Recv").count() >= 1
    # Shapes on edges: the kernel's (64, 128) goes to the matmul, the gradients and Adam.
    labelled = sum(1 for e in view.scene["edges"] if e.get("label") == "(64, 128)")
    assert page.locator(".cgv-elabel", has_text="(64, 128)").count() == labelled == 3
    assert page.evaluate("performance.getEntriesByName('cellgraph-graphview-paint').length") >= 1
    page.close()


def test_click_expands_and_selects_through_the_widget(browser: Any) -> None:
    graph = mlp().graph
    view = GraphView(graph, placement=cg.placement.place(graph, [PS, WORKER]))
    page = open_view(browser, view)
    assert page.locator('[data-id="s:logits"]').get_attribute("data-open") == "0"
    click(page, "s:logits")
    # Opened in the page at once, before the kernel hears of it: no message, a change of expanded (and selected).
    page.wait_for_selector('[data-id="s:logits"][data-open="1"]')
    assert page.locator('[data-id="n:logits/matmul"]').count() == 1
    assert round_trip(page, view) == []
    assert view.expanded == ["logits"] and view.selected == "logits"

    click(page, "n:logits/matmul")
    assert round_trip(page, view) == [{"type": "select", "id": "n:logits/matmul"}]
    assert view.selected == "logits/matmul"
    panel = page.locator(".cgv-info").inner_text()
    assert "logits/matmul" in panel and "MatMul" in panel and "(None, 128)" in panel
    assert WORKER in panel and view.info["reason"] in panel
    assert page.locator('[data-id="n:logits/matmul"]').get_attribute("class").split() == ["cgv-item", "cgv-sel"]
    page.close()


def test_search_box_and_matches(browser: Any) -> None:
    view = GraphView(mlp().graph)
    page = open_view(browser, view)
    page.fill(".cgv-search", "relu")
    page.wait_for_function("window.cgSent.length > 0")
    assert round_trip(page, view)[-1] == {"type": "search", "query": "relu"}
    assert page.locator(".cgv-matches [data-match]").all_inner_texts() == ["hidden/relu", "gradients/relu_grad"]
    assert page.locator(".cgv-hit").count() == 2  # the closed scopes holding them: hidden, gradients
    page.locator('.cgv-matches [data-match="gradients/relu_grad"]').click()
    assert round_trip(page, view) == [{"type": "reveal", "name": "gradients/relu_grad"}]
    page.wait_for_selector('[data-id="n:gradients/relu_grad"].cgv-sel')
    page.close()


def test_pan_and_zoom(browser: Any) -> None:
    page = open_view(browser, GraphView(mlp().graph))
    vp = page.locator(".cgv-vp")
    start = vp.get_attribute("transform")
    box = page.locator(".cgv-svg").bounding_box()
    page.mouse.move(box["x"] + 20, box["y"] + 20)
    page.mouse.down()
    page.mouse.move(box["x"] + 120, box["y"] + 70, steps=5)
    page.mouse.up()
    panned = vp.get_attribute("transform")
    assert panned != start and page.evaluate("window.cgSent.length") == 0  # a drag is not a click
    page.keyboard.down("Control")
    page.mouse.wheel(0, -300)
    page.keyboard.up("Control")
    page.wait_for_function(f"document.querySelector('.cgv-vp').getAttribute('transform') !== {json.dumps(panned)}")
    assert "scale(" in vp.get_attribute("transform")
    page.close()


def test_a_static_page_shows_the_last_state_without_a_kernel(browser: Any) -> None:
    view = GraphView(mlp().graph)
    view.expand("gradients")
    view.selected = "gradients/mul"
    page = open_view(browser, view, static=True)
    assert page.locator('[data-id="s:gradients"]').get_attribute("data-open") == "1"
    assert "gradients/mul" in page.locator(".cgv-info").inner_text()
    click(page, "s:hidden")  # a scope opens without a kernel too
    page.wait_for_selector('[data-id="s:hidden"][data-open="1"]')
    click(page, "n:hidden/matmul")  # a node's details need the kernel
    assert "static (no kernel)" in page.locator(".cgv-error").inner_text()
    page.close()


DRAWN = """els => els.map((g) => {
    const m = g.getAttribute('transform').match(/translate\\(([-\\d.]+),([-\\d.]+)\\)/);
    const r = g.querySelector('rect');
    return [g.dataset.id, +m[1], +m[2], +r.getAttribute('width'), +r.getAttribute('height'), g.dataset.open || ''];
})"""


def drawn(page: Any) -> dict[str, tuple[float, ...]]:
    return {row[0]: tuple(row[1:]) for row in page.locator(".cgv-svg g[data-id]").evaluate_all(DRAWN)}


def assert_drawn_as_python_lays_out(page: Any, view: GraphView) -> None:
    boxes = drawn(page)
    expected = {n["id"]: n for n in view.scene["nodes"]}
    assert sorted(boxes) == sorted(expected)
    for item_id, (x, y, w, h, is_open) in boxes.items():
        n = expected[item_id]
        assert (x, y, w, h) == pytest.approx((n["x"], n["y"], n["w"], n["h"]), abs=0.11), item_id
        assert is_open == ("" if n["kind"] == "node" else str(int(n["open"])))
    labels = sorted(page.locator(".cgv-elabel").evaluate_all("els => els.map((e) => e.textContent)"))
    assert labels == sorted(e["label"] for e in view.scene["edges"] if e.get("label"))
    assert page.locator("path.cgv-edge").count() == len(view.scene["edges"])
    assert page.locator("path.cgv-cross").count() == sum(1 for e in view.scene["edges"] if e.get("cross"))


@pytest.mark.parametrize(
    ("model", "opened"),
    [
        ("mini_inception", ["inception", "gradients", "inception/b3x3", "Adam", "Adam/inception"]),
        ("mlp", ["hidden", "Adam", "gradients"]),
    ],
)
def test_the_page_draws_what_python_lays_out_as_scopes_open_and_close(
    browser: Any, model: str, opened: list[str]
) -> None:
    graph = (mini_inception if model == "mini_inception" else mlp)().graph
    view = GraphView(graph, placement=cg.placement.place(graph, [PS, WORKER]) if model == "mlp" else None)
    page = open_view(browser, view)
    assert_drawn_as_python_lays_out(page, view)
    for name in opened:  # each opened in the page, by a click on its box; Python told afterwards
        item = view._model.tree.resolve(name, openable=True)
        page.locator(".cgv-fit").click()  # all of it in view: what grew may have pushed the box out
        click(page, item.id)
        page.wait_for_selector(f'[data-id="{item.id}"][data-open="1"]')
        round_trip(page, view)
        assert name in view.expanded
        assert_drawn_as_python_lays_out(page, view)
    first = view._model.tree.resolve(opened[0], openable=True).id
    page.locator(".cgv-fit").click()
    page.locator(f'[data-id="{first}"] > text').first.click(force=True)  # an open scope closes from its header
    page.wait_for_selector(f'[data-id="{first}"][data-open="0"]')
    round_trip(page, view)
    assert opened[0] not in view.expanded
    assert_drawn_as_python_lays_out(page, view)
    page.close()


def test_a_scope_opens_and_closes_with_no_answer_from_the_kernel(browser: Any) -> None:
    # The kernel busy running a cell: nothing the page sends is answered, and nothing is pushed to it.
    graph = synthetic_graph()
    view = GraphView(graph, placement=cg.placement.place(graph, WORKERS))
    page = open_view(browser, view)
    times = []
    for stage in ("s:stage03", "s:stage08"):
        for item_id, state in ((stage, "1"), (f"{stage}/block04", "1"), (stage, "0")):
            page.locator(".cgv-fit").click()
            page.evaluate("window.cgT0 = performance.now()")
            target = page.locator(f'.cgv-svg [data-id="{item_id}"]').first
            (target.locator("text").first if state == "0" else target).click(force=True)
            page.wait_for_selector(f'.cgv-svg [data-id="{item_id}"][data-open="{state}"]')
            page.wait_for_function(
                "performance.getEntriesByName('cellgraph-graphview-paint').at(-1).startTime > window.cgT0"
            )
            times.append(
                page.evaluate(
                    "performance.getEntriesByName('cellgraph-graphview-paint').at(-1).startTime - window.cgT0"
                )
            )
    assert page.evaluate("window.cgSent.length") == 0  # nothing asked of the kernel
    print(f"open/close with the kernel silent, click to painted frame (ms): {[round(t, 1) for t in times]}")
    round_trip(page, view)  # the kernel, idle again, hears of what is open, and lays out the same
    assert view.expanded == ["stage03/block04", "stage08/block04"]  # closed stages remember their open blocks
    assert_drawn_as_python_lays_out(page, view)
    page.close()


def test_stale_nodes_are_drawn_dashed_with_a_tooltip_that_says_why(browser: Any) -> None:
    from tests.widgets.test_graph_layout import stale_graph

    page = open_view(browser, GraphView(stale_graph()))
    closed = page.locator('[data-id="s:head"]')
    assert closed.locator("rect.cgv-stale").count() == 1
    assert "1 stale node(s): re-run their cells" in closed.locator("title").first.text_content()
    assert page.locator('[data-id="n:x"] rect.cgv-stale').count() == 0
    # The header says so too: a stale scope below the first view's fold was only found by scrolling.
    said = " · 1 stale (dashed red): re-run the cells that made them"
    assert page.locator(".cgv-count").text_content().endswith(" nodes" + said)
    click(page, "s:head")  # opens it: the stale node inside is marked, its neighbour is not
    page.locator('[data-id="n:head/y"]').wait_for()
    assert page.locator(".cgv-count").text_content().endswith(" nodes" + said)  # counted once, open or closed
    assert page.locator('[data-id="n:head/y"] rect.cgv-stale').count() == 1
    assert "stale: re-run its cell" in page.locator('[data-id="n:head/y"] title').text_content()
    assert page.locator('[data-id="n:head/total"] rect.cgv-stale').count() == 0
    page.close()


def test_a_mixed_scope_shows_its_mix(browser: Any) -> None:
    graph = mlp().graph
    placement = cg.placement.place(graph, [PS, WORKER])
    view = GraphView(graph, placement=placement)
    page = open_view(browser, view)
    bands = page.locator('[data-id="s:logits"] rect.cgv-band').evaluate_all(
        "els => els.map((r) => [getComputedStyle(r).fill, +r.getAttribute('width'), r.dataset.key])"
    )
    width = float(page.locator('[data-id="s:logits"] > rect').first.get_attribute("width"))
    devices = [placement.device_of[n.name] for n in graph if n.name.startswith("logits/")]
    assert {key for _, _, key in bands} == {PS, WORKER}
    for fill, band_width, key in bands:  # each device's colour, as wide as its share of the scope's ops
        assert fill == rgb(DEVICE_COLORS[0] if key == PS else DEVICE_COLORS[1])
        assert band_width == pytest.approx(width * devices.count(key) / len(devices), abs=0.5)
    # A scope on one device alone is one colour, with no bands.
    assert page.locator('[data-id="s:gradients"] rect.cgv-band').count() == 0
    tip = page.locator('[data-id="s:logits"] > title').text_content()
    assert f"{devices.count(PS)} on {PS} (50%)" in tip and f"{devices.count(WORKER)} on {WORKER} (50%)" in tip
    page.close()


def rgb(hex_colour: str) -> str:
    r, g, b = (int(hex_colour[i : i + 2], 16) for i in (1, 3, 5))
    return f"rgb({r}, {g}, {b})"
