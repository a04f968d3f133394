"""GraphView's model on real graphs: scopes, folding, layout, colours, edges."""

from __future__ import annotations

import doctest
from types import ModuleType
from typing import Any

import pytest

import cellgraph as cg
from cellgraph.examples.models import mini_inception, mlp
from cellgraph.testing.graph_synthetic import WORKERS, synthetic_graph
from cellgraph.widgets import graph_info, graph_layout, graph_view
from cellgraph.widgets.graph_layered import GRANDALF_MAX, layered
from cellgraph.widgets.graph_layout import GraphModel
from cellgraph.widgets.graph_style import DEVICE_COLORS, OTHER_COLOR
from cellgraph.widgets.graph_tree import GraphViewError, series_of

PS = "/job:ps/task:0/device:cpu:0"
WORKER = "/job:worker/task:0/device:cpu:0"


def ids(scene: dict[str, Any]) -> set[str]:
    return {n["id"] for n in scene["nodes"]}


def by_id(scene: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {n["id"]: n for n in scene["nodes"]}


def edge(scene: dict[str, Any], src: str, dst: str) -> dict[str, Any]:
    found = [e for e in scene["edges"] if (e["s"], e["t"]) == (src, dst)]
    assert len(found) == 1, f"edges {src} -> {dst}: {found}"
    return found[0]


def dense_stack(layers: int = 10) -> cg.Graph:
    g = cg.Graph()
    with g.as_default():
        h = cg.placeholder((None, 8), name="x")
        for _ in range(layers):
            h = cg.layers.dense(h, 8, activation="relu")
    return g


def no_overlap(scene: dict[str, Any]) -> None:
    """Boxes drawn side by side never overlap: only an open scope contains others."""
    boxes = scene["nodes"]
    for i, a in enumerate(boxes):
        for b in boxes[i + 1 :]:
            inside = a.get("open") and a["x"] <= b["x"] and b["x"] + b["w"] <= a["x"] + a["w"] + 0.5
            apart = (
                a["x"] + a["w"] <= b["x"] + 0.5
                or b["x"] + b["w"] <= a["x"] + 0.5
                or a["y"] + a["h"] <= b["y"] + 0.5
                or b["y"] + b["h"] <= a["y"] + 0.5
            )
            assert inside or apart, f"{a['id']} and {b['id']} overlap"


def test_scopes_are_collapsed_by_default() -> None:
    model = GraphModel(mlp().graph)
    scene = model.scene()
    assert {"s:hidden", "s:logits", "s:gradients", "s:Adam", "n:x", "n:y", "n:loss"} <= ids(scene)
    assert not any(i.startswith("n:hidden/") for i in ids(scene))
    hidden = by_id(scene)["s:hidden"]
    assert hidden["open"] is False and hidden["sub"] == "5 nodes"
    assert scene["total"] == len(mlp().graph)
    no_overlap(scene)


def test_expand_and_collapse_change_what_is_visible() -> None:
    model = GraphModel(mini_inception().graph)
    model.expand("inception")
    scene = model.scene()
    assert {"s:inception/b1x1", "s:inception/b3x3", "n:inception/concat"} <= ids(scene)
    assert by_id(scene)["s:inception"]["open"] is True
    # The open scope frames its children.
    frame = by_id(scene)["s:inception"]
    concat = by_id(scene)["n:inception/concat"]
    assert frame["x"] < concat["x"] and concat["y"] + concat["h"] <= frame["y"] + frame["h"]
    no_overlap(scene)

    model.expand("inception/b3x3")  # a scope inside
    assert "n:inception/b3x3/conv2d" in ids(model.scene()) or any(
        i.startswith("n:inception/b3x3/") for i in ids(model.scene())
    )
    model.collapse("inception")
    scene = model.scene()
    assert not any(i.startswith(("s:inception/", "n:inception/")) for i in ids(scene))
    # What was open inside is remembered for when the scope reopens.
    model.expand("inception")
    assert any(i.startswith("n:inception/b3x3/") for i in ids(model.scene()))


def test_expanding_a_scope_opens_the_scopes_around_it() -> None:
    model = GraphModel(mini_inception().graph)
    model.expand("inception/b5x5")
    assert {"s:inception", "s:inception/b5x5"} <= model.expanded
    assert model.expanded_names() == ["inception", "inception/b5x5"]


def test_series_of_identical_scopes_fold_and_unfold() -> None:
    model = GraphModel(dense_stack(10))
    scene = model.scene()
    assert ids(scene) == {"n:x", "f:dense_*"}
    fold = by_id(scene)["f:dense_*"]
    assert fold["kind"] == "fold" and fold["label"] == "dense..dense_9 ×10" and fold["sub"] == "50 nodes"
    model.expand("dense_*")
    scene = model.scene()
    assert {f"s:dense_{i}" for i in range(1, 10)} | {"s:dense"} <= ids(scene)
    # Unfolded, the series is a chain again: dense_3 feeds dense_4 with its (None, 8) activations.
    assert edge(scene, "s:dense_3", "s:dense_4")["label"] == "(None, 8)"
    model.expand("dense_4")
    assert "n:dense_4/matmul" in ids(model.scene())


def test_folds_need_three_identical_members() -> None:
    assert series_of("dense_7") == ("dense", 7) and series_of("dense") == ("dense", 0)
    assert series_of("conv2d") == ("conv2d", 0) and series_of("block_a") == ("block_a", 0)
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((None, 4), name="x")
        a = cg.layers.dense(x, 4, activation="relu")
        b = cg.layers.dense(a, 4)  # no relu: not identical to the first
        cg.layers.dense(b, 4)
    scene = GraphModel(g).scene()
    # dense (with relu) differs; dense_1 and dense_2 are only two of a kind.
    assert ids(scene) == {"n:x", "s:dense", "s:dense_1", "s:dense_2"}


def test_mlp_gradients_fold_their_matmuls() -> None:
    model = GraphModel(mlp().graph)
    model.expand("gradients")
    scene = model.scene()
    assert by_id(scene)["f:gradients/matmul_*"]["label"] == "matmul..matmul_3 ×4"
    assert "n:gradients/matmul_2" not in ids(scene)
    model.expand("gradients/matmul_*")
    assert {f"n:gradients/matmul_{i}" for i in (1, 2, 3)} <= ids(model.scene())


def test_shapes_on_edges() -> None:
    model = GraphModel(mlp().graph)
    scene = model.scene()
    assert edge(scene, "n:x", "s:hidden")["label"] == "(None, 64)"
    assert edge(scene, "s:hidden", "s:logits")["label"] == "(None, 128)"
    model.expand("hidden")
    scene = model.scene()
    assert edge(scene, "n:hidden/kernel", "n:hidden/matmul")["label"] == "(64, 128)"
    assert edge(scene, "n:hidden/matmul", "n:hidden/bias_add")["label"] == "(None, 128)"


def test_edges_between_collapsed_scopes_merge_and_control_edges_are_marked() -> None:
    model = GraphModel(mlp().graph)
    scene = model.scene()
    # hidden feeds gradients several tensors (activations, kernel, relu output): one edge, counted.
    merged = edge(scene, "s:hidden", "s:gradients")
    assert merged["n"] > 1 and merged["label"].endswith("tensors")
    g = cg.Graph()
    with g.as_default():
        a = cg.placeholder((2,), name="a")
        with cg.control_dependencies([a]):
            cg.constant(1.0, name="b")
    assert edge(GraphModel(g).scene(), "n:a", "n:b") == {"s": "n:a", "t": "n:b", "n": 1, "ctl": True}


def test_colours_by_op_family_without_a_placement() -> None:
    scene = GraphModel(mlp().graph).scene()
    assert scene["mode"] == "family"
    families = {row["label"] for row in scene["legend"] if row["count"]}
    assert {"nn", "math", "state", "training"} <= families
    assert by_id(scene)["n:x"]["color"] != by_id(scene)["n:loss"]["color"]  # state vs math


def test_device_colours_and_cross_device_edges_from_a_real_placement() -> None:
    graph = mlp().graph
    placement = cg.placement.place(graph, [PS, WORKER])
    model = GraphModel(graph, placement)
    model.expand("hidden")
    scene = model.scene()
    assert scene["mode"] == "device"
    legend = {row["label"]: row for row in scene["legend"]}
    assert set(legend) == {PS, WORKER}
    assert legend[PS]["color"] == DEVICE_COLORS[0] and legend[WORKER]["color"] == DEVICE_COLORS[1]
    assert legend[PS]["count"] + legend[WORKER]["count"] == len(graph)
    nodes = by_id(scene)
    assert placement.device_of["hidden/kernel"] == PS and placement.device_of["hidden/matmul"] == WORKER
    assert nodes["n:hidden/kernel"]["color"] == DEVICE_COLORS[0]
    assert nodes["n:hidden/matmul"]["color"] == DEVICE_COLORS[1]
    # The variable on the PS feeds the matmul on the worker: a Send/Recv pair.
    assert edge(scene, "n:hidden/kernel", "n:hidden/matmul")["cross"] == [[PS, WORKER]]
    assert "cross" not in edge(scene, "n:hidden/matmul", "n:hidden/bias_add")
    # A closed scope split across devices shows its mix: a band per device, as wide as its share of the ops.
    logits = by_id(model.scene())["s:logits"]
    devices = [placement.device_of[n.name] for n in graph if n.name.startswith("logits/")]
    assert sorted(logits["mix"], key=lambda band: band[2]) == [
        [DEVICE_COLORS[0], devices.count(PS) / len(devices), PS, devices.count(PS)],
        [DEVICE_COLORS[1], devices.count(WORKER) / len(devices), WORKER, devices.count(WORKER)],
    ]
    assert devices.count(PS) == devices.count(WORKER)  # half on each: the box's one colour alone would hide that
    assert "mix" not in nodes["n:hidden/kernel"]


def test_a_scope_of_many_devices_shows_its_four_largest_shares_and_the_rest() -> None:
    devices = [f"/job:worker/task:{i}/device:cpu:0" for i in range(6)]
    graph = cg.Graph()
    with graph.as_default(), cg.name_scope("spread"):
        for i, device in enumerate(devices):
            with cg.device(device):
                for j in range(6 - i):  # 6 ops on task 0, 5 on task 1, ... 1 on task 5
                    cg.constant(1.0, name=f"c{i}_{j}")
    placement = cg.placement.place(graph, devices)
    mix = by_id(GraphModel(graph, placement).scene())["s:spread"]["mix"]
    assert [(band[2], band[3]) for band in mix] == [(devices[0], 6), (devices[1], 5), (devices[2], 4), ("other", 6)]
    assert mix[-1][0] == OTHER_COLOR and sum(band[1] for band in mix) == pytest.approx(1.0)


def test_a_placement_for_another_graph_is_refused() -> None:
    placement = cg.placement.place(mlp().graph, [PS, WORKER])
    with pytest.raises(GraphViewError, match=r"placement has no device for \d+ node\(s\) of this graph .*place\(graph"):
        GraphModel(mini_inception().graph, placement)
    with pytest.raises(GraphViewError, match="placement must be what cg.placement.place"):
        GraphModel(mlp().graph, {"x": PS})  # type: ignore[arg-type]


def test_bad_names_are_refused_and_change_nothing() -> None:
    model = GraphModel(mini_inception().graph)
    model.expand("inception")
    before = (set(model.expanded), model.scene())
    with pytest.raises(
        GraphViewError, match="no name scope or folded series named 'incept' .*did you mean 'inception'"
    ):
        model.expand("incept")
    with pytest.raises(GraphViewError, match="named 'nowhere' in this graph; top-level names: 'stem', 'inception'"):
        model.collapse("nowhere")
    with pytest.raises(GraphViewError, match="no name scope or folded series named 'loss'"):
        model.expand("loss")  # a node: nothing to open
    with pytest.raises(GraphViewError, match="no name scope or folded series named 'stem/nope'"):
        model.set_expanded(["stem", "stem/nope"])  # all are checked before any is opened
    with pytest.raises(GraphViewError, match="expected a node or scope name \\(a str\\), got int 3"):
        model.expand(3)  # type: ignore[arg-type]
    assert (set(model.expanded), model.scene()) == before


def test_a_non_graph_is_refused_with_a_hint() -> None:
    m = mlp()
    with pytest.raises(TypeError, match="GraphView needs a cellgraph Graph, got Tensor .*pass its .graph"):
        GraphModel(m.loss)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="GraphView needs a cellgraph Graph, got str 'model'"):
        GraphModel("model")  # type: ignore[arg-type]


def test_each_container_is_laid_out_once_and_restacked_around_open_scopes() -> None:
    model = GraphModel(mini_inception().graph)
    model.expand("inception")
    first = model.scene()
    bases = dict(model._bases)
    model.expand("gradients")
    no_overlap(model.scene())
    model.collapse("gradients")
    # Reopening the same state gives the same boxes, from the same base layouts (never laid out again).
    assert model.scene() == first
    for key, box in bases.items():
        assert model._bases[key] is box
    # An open scope pushes what is right of it right, and what is below it down, by its growth.
    closed = by_id(GraphModel(mini_inception().graph).scene())
    opened = by_id(first)
    grow_w = opened["s:inception"]["w"] - closed["s:inception"]["w"]
    grow_h = opened["s:inception"]["h"] - closed["s:inception"]["h"]
    for item_id, box in closed.items():
        inception = closed["s:inception"]
        right = box["x"] >= inception["x"] + inception["w"] - 0.1
        below = box["y"] >= inception["y"] + inception["h"] - 0.1
        assert opened[item_id]["x"] == pytest.approx(box["x"] + (grow_w if right else 0), abs=0.11)
        assert opened[item_id]["y"] == pytest.approx(box["y"] + (grow_h if below else 0), abs=0.11)


def test_cycles_between_collapsed_scopes_are_laid_out() -> None:
    # hidden -> gradients -> Adam -> (updates) hidden's variables: a cycle once scopes are closed.
    scene = GraphModel(mlp().graph).scene()
    assert {"s:hidden", "s:gradients", "s:Adam"} <= ids(scene)
    no_overlap(scene)


def test_large_pieces_use_the_iterative_layering() -> None:
    n = GRANDALF_MAX + 50
    children = [f"v{i}" for i in range(n)]
    sizes = {c: (60.0, 28.0) for c in children}
    edges = {(f"v{i}", f"v{i + 1}") for i in range(n - 1)} | {(f"v{n - 1}", "v0")}  # one long cycle
    box = layered(children, sizes, edges)
    ys = [box.pos[f"v{i}"][1] for i in range(n)]
    assert ys == sorted(ys) and len(set(ys)) == n  # one layer per step of the chain


def test_ten_thousand_nodes_show_only_the_top_level() -> None:
    graph = synthetic_graph()
    assert len(graph) == 10_001
    model = GraphModel(graph, cg.placement.place(graph, list(WORKERS)))
    scene = model.scene()
    assert len(scene["nodes"]) == 21 and scene["total"] == 10_001
    assert sum(1 for e in scene["edges"] if "cross" in e) == 19  # the stages alternate workers
    model.expand("stage07/block03")
    scene = model.scene()
    assert len(scene["nodes"]) == 21 + 10 + 50
    no_overlap(scene)


# tests/test_docstrings.py walks cellgraph, dataflow and cluster; the widgets' examples run here.
@pytest.mark.parametrize("module", [graph_layout, graph_view], ids=lambda m: m.__name__)
def test_docstring_examples(module: ModuleType) -> None:
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0, f"{result.failed} of {result.attempted} failed"


def stale_graph() -> cg.Graph:
    """Cell 1 makes ``x``; cell 2 reads it in scope ``head``; cell 1 run again without ``x`` leaves ``head/y`` stale."""
    g = cg.Graph()
    with g.as_default():
        with cg.cell_scope("c1", label="[1]"):
            x = cg.placeholder((None, 3), name="x")
        with cg.cell_scope("c2", label="[2]"), cg.name_scope("head"):
            y = cg.relu(x, name="y")
            cg.reduce_sum(y, name="total")
        with cg.cell_scope("c1", label="[1]"):
            cg.placeholder((None, 3), name="inputs")
    return g


def test_stale_nodes_and_the_scopes_around_them_are_marked() -> None:
    # A re-run cell left nodes that raise when run: the view marks them (and a closed scope holding them), not
    # only the info panel of a node someone clicks.
    g = stale_graph()
    assert g.node("head/y").stale is not None and g.node("head/total").stale is None
    model = GraphModel(g)
    assert by_id(model.scene())["s:head"]["stale"] == 1
    model.expand("head")
    boxes = by_id(model.scene())
    assert boxes["n:head/y"]["stale"] == 1 and "stale" not in boxes["n:head/total"]
    structure = model.structure()
    assert {structure["id"][k]: n for k, n in enumerate(structure["stale"]) if n} == {"s:head": 1, "n:head/y": 1}
    info = graph_info.describe(model, model.tree.resolve("head", openable=True))
    assert info["stale"] == "1 stale node(s): re-run the cell(s) that made them"
