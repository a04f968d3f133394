"""Placement: every rule on small graphs and on the mini-Inception with 2 PS tasks and a GPU worker."""

from __future__ import annotations

import warnings
from collections.abc import Iterator

import numpy as np
import pytest

import cellgraph as cg
from cellgraph.dataflow.graphdef import from_graphdef, to_graphdef
from cellgraph.dataflow.opdef import OPS, OpDef, register_op
from cellgraph.dataflow.ops.base import apply, infer_same
from cellgraph.examples.models import Model, mini_inception

from .errors_helpers import raises

PS0, PS1, PS2 = (f"/job:ps/task:{i}/device:cpu:0" for i in range(3))
CPU, GPU = "/job:worker/task:0/device:cpu:0", "/job:worker/task:0/device:gpu:0"
CPU1 = "/job:worker/task:1/device:cpu:0"
CLUSTER = [PS0, PS1, CPU, GPU]


@pytest.fixture(scope="module")
def inception() -> Model:
    return mini_inception()


@pytest.fixture
def test_ops() -> Iterator[None]:
    """``TestCpuOnly`` (a CPU kernel only) and ``TestCudaOnly`` (a CUDA kernel only), for this test."""
    kernel = {"cpu": lambda n, c: lambda x: x}
    for name, kernels in (("TestCpuOnly", kernel), ("TestCudaOnly", {"cuda": kernel["cpu"]})):
        register_op(OpDef(name=name, family="test", infer=infer_same, reference=lambda a, x: x,
                          grad=lambda n, dys: [dys[0]], kernels=kernels))  # fmt: skip
    try:
        yield
    finally:
        for name in ("TestCpuOnly", "TestCudaOnly"):
            OPS._values.pop(name)
            OPS._where.pop(name)


# ------------------------------------------------------------ the example
def test_place_leaves_the_graph_unchanged(inception: Model) -> None:
    g = inception.graph
    before = (g.version, [(n.name, n.device, sorted(n.attrs)) for n in g])
    placement = cg.placement.place(g, CLUSTER)
    assert (g.version, [(n.name, n.device, sorted(n.attrs)) for n in g]) == before
    assert list(placement.device_of) == [n.name for n in g]  # every node, in graph order
    assert set(placement.reasons) == set(placement.device_of)
    assert placement.graph_version == g.version


def test_variables_are_balanced_by_bytes_across_ps_tasks(inception: Model) -> None:
    placement = cg.placement.place(inception.graph, CLUSTER)
    for var in inception.graph.variables():
        assert placement.device_of[var.name] in (PS0, PS1), var.name
    load = placement.ps_load_bytes()
    total = sum(v.attrs["initial_value"].nbytes for v in inception.graph.variables())
    # Adam's scalar step count of a split variable is held once per partition, as the parameter servers hold it.
    copies = sum(
        placement.variable_bytes[slot] * (len(placement.partitions[owner]) - 1)
        for slot, owner in placement.scalar_slot_of.items()
    )
    assert placement.scalar_slot_of and copies > 0
    assert set(load) == {PS0, PS1} and sum(load.values()) == total + copies
    assert abs(load[PS0] - load[PS1]) <= 0.10 * total / 2, load
    # The largest variable is bigger than a fair share, so it is split to balance.
    assert [d for d, _, _ in placement.partitions["logits/kernel"]] == [PS0, PS1]


def test_round_robin_is_there_to_compare_and_overloads_one_task(inception: Model) -> None:
    load = cg.placement.place(inception.graph, CLUSTER, strategy="round_robin").ps_load_bytes()
    assert abs(load[PS0] - load[PS1]) > 0.10 * sum(load.values()) / 2  # tensorflow#24953


def test_slots_and_update_ops_go_where_their_variable_lives(inception: Model) -> None:
    placement = cg.placement.place(inception.graph, CLUSTER)
    updates = [n for n in inception.graph if n.op == "ApplyAdam"]
    assert len(updates) == 16
    for update in updates:
        var, *slots = (t.node.name for t in update.inputs[:4])
        assert placement.device_of[update.name] == placement.device_of[var]
        assert "updates variable" in placement.reasons[update.name]
        for slot in slots:
            assert placement.device_of[slot] == placement.device_of[var], slot
            assert placement.reasons[slot].startswith(f"slot of variable '{var}'")
    # Slots of a split variable are split the same way; its scalar step count sits with the first part.
    cut = placement.partitions["logits/kernel"]
    assert placement.partitions["Adam/logits/kernel/m"] == cut == placement.partitions["Adam/logits/kernel/v"]
    assert "Adam/logits/kernel/t" not in placement.partitions


def test_gradient_ops_are_colocated_with_their_forward_ops(inception: Model) -> None:
    placement = cg.placement.place(inception.graph, CLUSTER)
    colocated = [n for n in inception.graph if "_colocate" in n.attrs]
    assert len(colocated) > 30 and all(n.name.startswith("gradients/") for n in colocated)
    for node in colocated:
        forward = node.attrs["_colocate"]
        assert placement.device_of[node.name] == placement.device_of[forward]
        assert placement.reasons[node.name] == f"colocated with {inception.graph.node(forward).op} '{forward}'"


def test_everything_else_goes_to_the_first_worker(inception: Model) -> None:
    placement = cg.placement.place(inception.graph, CLUSTER)
    # The worker's GPU for ops with a CUDA kernel, its CPU for the rest, and the reason says which.
    for name in ("x", "stem/conv2d", "logits/matmul", "loss"):
        node = inception.graph.node(name)
        if "cuda" in node.opdef.kernels:
            assert placement.device_of[name] == GPU
            assert placement.reasons[name] == f"default: first worker GPU ({node.op} has a cuda kernel)"
        else:
            assert placement.device_of[name] == CPU
            assert placement.reasons[name] == f"default: first worker CPU ({node.op} has no cuda kernel)"
    assert cg.placement.place(inception.graph, [PS0, CPU]).reasons["x"] == "default: first worker CPU"


def test_the_placement_prints_as_an_aligned_table(inception: Model) -> None:
    text = str(cg.placement.place(inception.graph, CLUSTER))
    lines = text.splitlines()
    assert lines[0].split() == ["node", "op", "device", "reason"]
    column = lines[0].index("device")
    rows = [line for line in lines[2:] if not line.startswith(("partitions of", "ps load"))]
    assert len(rows) == len(inception.graph)
    assert all(line[column:].startswith("/job:") for line in rows)
    assert "partitions of logits/kernel: rows 0:256 on /job:ps/task:0/device:cpu:0, rows 256:512 on" in text
    assert f"ps load {PS0}: " in text and f"ps load {PS1}: " in text


def test_graphdef_round_trip_of_placed_devices(inception: Model) -> None:
    g = inception.graph
    placement = cg.placement.place(g, CLUSTER)
    graphdef = to_graphdef(g)
    placed = placement.apply_to_graphdef(graphdef)
    assert all(proto.device == "" for proto in graphdef.node)  # the input is not changed
    assert {p.name: p.device for p in placed.node} == placement.device_of
    g2 = from_graphdef(placed)
    assert {n.name: n.device for n in g2} == placement.device_of
    # Placing the loaded graph again keeps every device: explicit devices win.
    assert cg.placement.place(g2, CLUSTER).device_of == placement.device_of
    assert all(n.device == "" for n in g)


def test_a_placement_of_another_graph_does_not_apply() -> None:
    g = cg.Graph()
    with g.as_default():
        cg.placeholder((2,), name="x")
    placement = cg.placement.place(g, [CPU])
    with g.as_default():
        cg.placeholder((2,), name="z")
    with raises(cg.PlacementError, "GraphDef node 'z' (Placeholder) has no placement: this placement was made for "
                "another graph or an older version of it; call cg.placement.place() on the graph again"):  # fmt: skip
        placement.apply_to_graphdef(to_graphdef(g))


# ------------------------------------------------------- explicit devices
def test_explicit_devices_win_and_partial_ones_are_completed(fresh_graph: cg.Graph) -> None:
    x = cg.placeholder((2,), name="x")
    with cg.device("/job:worker/task:1"):
        a = x * 2.0
    with cg.device("/job:ps/task:1"):
        cg.variable(np.zeros(2, np.float32), name="w")
    with cg.device(CPU):
        b = x * 3.0
    placement = cg.placement.place(fresh_graph, [PS0, PS1, CPU, GPU, CPU1])
    assert placement.device_of[a.node.name] == CPU1
    assert placement.reasons[a.node.name] == "explicit device scope '/job:worker/task:1' (completed from the devices)"
    assert placement.device_of["w"] == PS1
    assert placement.device_of[b.node.name] == CPU
    assert placement.reasons[b.node.name] == f"explicit device scope '{CPU}'"


def test_an_explicit_device_that_matches_none_is_an_error(fresh_graph: cg.Graph) -> None:
    with cg.device("/job:worker/task:3"):
        cg.placeholder((2,), name="x")
    with raises(cg.PlacementError, "asks for device '/job:worker/task:3', which matches none of the devices: "
                f"{PS0}, {CPU}"):  # fmt: skip
        cg.placement.place(fresh_graph, [PS0, CPU])


def test_user_colocate_with(fresh_graph: cg.Graph) -> None:
    x = cg.placeholder((2,), name="x")
    with cg.device("/job:worker/task:1"):
        a = x * 2.0
    with cg.colocate_with(a):
        b = a + 1.0
    placement = cg.placement.place(fresh_graph, [CPU, CPU1])
    assert placement.device_of[b.node.name] == CPU1
    assert placement.reasons[b.node.name] == f"colocated with Mul '{a.node.name}'"


def test_a_malformed_node_device_from_a_graphdef_names_the_node(fresh_graph: cg.Graph) -> None:
    cg.placeholder((2,), name="x")
    graphdef = to_graphdef(fresh_graph)
    graphdef.node[0].device = "gpu0"
    with raises(cg.PlacementError, "Placeholder 'x' (test_placement.py:"):
        cg.placement.place(from_graphdef(graphdef), [CPU])
    with raises(cg.PlacementError, "): malformed device name 'gpu0': it must start with '/'"):
        cg.placement.place(from_graphdef(graphdef), [CPU])


# ------------------------------------------------------------- kernels
def test_soft_placement_moves_an_op_without_a_gpu_kernel_to_cpu(fresh_graph: cg.Graph, test_ops: None) -> None:
    x = cg.placeholder((2,), name="x")
    with cg.device("/job:worker/task:0/device:gpu:0"):
        y = apply("TestCpuOnly", [x], name="cpu_only")
    placement = cg.placement.place(fresh_graph, CLUSTER)
    assert placement.device_of[y.node.name] == CPU
    assert placement.reasons[y.node.name] == (
        f"explicit device scope '{GPU}'; TestCpuOnly has no cuda kernel, so soft placement moved it to {CPU}"
    )


def test_without_soft_placement_a_missing_kernel_is_an_error(fresh_graph: cg.Graph, test_ops: None) -> None:
    x = cg.placeholder((2,), name="x")
    with cg.device("/device:gpu:0"):
        apply("TestCpuOnly", [x], name="cpu_only")
    with raises(cg.PlacementError, f"is placed on {GPU} (explicit device scope '/device:gpu:0' (completed from "
                f"the devices)), but TestCpuOnly has no cuda kernel; devices with a kernel for TestCpuOnly: {PS0}, "
                f"{PS1}, {CPU}. Place it on one of them, or pass soft=True to move it to a CPU"):  # fmt: skip
        cg.placement.place(fresh_graph, CLUSTER, soft=False)


def test_an_op_with_a_cuda_kernel_goes_to_the_worker_gpu(fresh_graph: cg.Graph, test_ops: None) -> None:
    x = cg.placeholder((2,), name="x")
    y = apply("TestCudaOnly", [x], name="cuda_only")
    placement = cg.placement.place(fresh_graph, CLUSTER)
    assert placement.device_of[y.node.name] == GPU
    assert placement.reasons[y.node.name] == "default: first worker GPU (TestCudaOnly has a cuda kernel)"
    with raises(cg.PlacementError, "TestCudaOnly has no kernel for any of the devices "
                f"({PS0}, {CPU}); its kernels: cuda"):  # fmt: skip
        cg.placement.place(fresh_graph, [PS0, CPU])


# ------------------------------------------------------ no GPU at all
def _gpu_graph() -> cg.Graph:
    g = cg.Graph()
    with g.as_default():
        with cg.device("/device:gpu:0"):
            for i in range(5):
                cg.placeholder((2,), name=f"p{i}")
    return g


def test_without_a_gpu_gpu_placements_fall_back_with_one_warning() -> None:
    g = _gpu_graph()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        placement = cg.placement.place(g, [PS0, CPU])
    assert len(caught) == 1 and caught[0].category is cg.CellgraphWarning
    assert str(caught[0].message) == (
        f"placement: 5 node(s) asked for a GPU, but no GPU is among the devices ({PS0}, {CPU}); they run on CPU "
        "instead ('p0', 'p1', 'p2', ...). Pass strict=True to make this an error."
    )
    assert caught[0].filename == __file__  # points at the caller's place() line
    assert all(placement.device_of[n.name] == CPU for n in g)
    assert placement.reasons["p0"] == "explicit device scope '/device:gpu:0'; no GPU among the devices, so on CPU"


def test_strict_placement_refuses_the_fallback() -> None:
    with raises(cg.PlacementError, "Placeholder 'p0' (test_placement.py:"):
        cg.placement.place(_gpu_graph(), [CPU], strict=True)
    with raises(cg.PlacementError, f"asks for '/device:gpu:0', but no GPU is among the devices ({CPU}); strict "
                "placement does not fall back to CPU (pass strict=False to allow it)"):  # fmt: skip
        cg.placement.place(_gpu_graph(), [CPU], strict=True)


# ------------------------------------------------------ partitioning
def test_a_big_variable_is_split_along_axis_0_covering_every_row_once(fresh_graph: cg.Graph) -> None:
    x = cg.placeholder((None, 1000), name="x")
    big = cg.variable(cg.init.zeros, shape=(1000, 4), name="big")
    small = cg.variable(cg.init.zeros, shape=(4,), name="small")
    train = cg.optim.Adam().minimize(cg.reduce_sum(x @ big + small))
    placement = cg.placement.place(fresh_graph, [PS0, PS1, PS2, CPU], split_threshold_bytes=4000)
    parts = placement.partitions["big"]
    assert len(parts) == 3 and len({d for d, _, _ in parts}) == 3
    covered = np.zeros(1000, int)
    for _, start, stop in parts:
        covered[start:stop] += 1
    assert (covered == 1).all()
    assert [b - a for _, a, b in parts] == [334, 333, 333]
    assert "small" not in placement.partitions
    assert placement.reasons["big"].startswith(
        "variable of 16,000 bytes, over the split threshold of 4,000: split along axis 0 into 3 partitions (rows 0:334"
    )
    # The scalar slot "Adam/big/t" is held once with each of big's 3 partitions.
    assert placement.scalar_slot_of == {"Adam/big/t": "big"}
    assert placement.reasons["Adam/big/t"] == "slot of variable 'big': a copy with each of its partitions"
    assert (
        sum(placement.ps_load_bytes().values())
        == sum(v.attrs["initial_value"].nbytes for v in fresh_graph.variables())
        + 2 * placement.variable_bytes["Adam/big/t"]
    )
    assert placement.device_of[train.name] == CPU
    assert cg.placement.place(fresh_graph, [PS0, PS1, PS2, CPU], split_threshold_bytes=10**6).partitions == {}


def test_without_ps_tasks_variables_go_to_the_worker(fresh_graph: cg.Graph) -> None:
    w = cg.variable(np.zeros(3, np.float32), name="w")
    placement = cg.placement.place(fresh_graph, [CPU])
    assert placement.device_of[w.node.name] == CPU
    assert placement.reasons["w"] == "variable, but no ps task among the devices: first worker CPU"
    assert placement.ps_load_bytes() == {}


@pytest.mark.parametrize(
    ("devices", "kwargs", "message"),
    [
        ([],                     {},                                 "place() needs at least one device, e.g. ['/job:worker/task:0/device:cpu:0']"),
        (CPU,                    {},                                 f"devices must be a list of device names, not the string '{CPU}'"),
        (["/job:worker"],        {},                                 "device '/job:worker' is partial; place() needs full names like '/job:worker/task:0/device:cpu:0'"),
        ([CPU, CPU],             {},                                 f"device '{CPU}' is listed twice"),
        (["worker:0"],           {},                                 "malformed device name 'worker:0': it must start with '/'"),
        ([CPU],                  {"strategy": "random"},             "unknown placement strategy 'random'; known: greedy, round_robin"),
        ([CPU],                  {"split_threshold_bytes": 0},       "split_threshold_bytes must be positive, got 0"),
    ],
)  # fmt: skip
def test_bad_arguments(fresh_graph: cg.Graph, devices: list[str], kwargs: dict[str, object], message: str) -> None:
    cg.placeholder((2,), name="x")
    with raises(cg.PlacementError, message):
        cg.placement.place(fresh_graph, devices, **kwargs)  # type: ignore[arg-type]
