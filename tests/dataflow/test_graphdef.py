"""Graph <-> GraphDef: exact round trips, training after import, and the errors of bad GraphDefs."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import cellgraph as cg
from cellgraph.dataflow.graphdef import (
    GRAPHDEF_VERSION,
    from_graphdef,
    from_tensor_proto,
    to_graphdef,
    to_tensor_proto,
)
from cellgraph.protos import graph_pb2, tensor_pb2

WORKER = "/job:worker/task:0/device:cpu:0"


# ----------------------------------------------------------------- helpers
def _quiet_cell(cell: str, label: str, body: Callable[[], Any]) -> Any:
    """Run ``body`` as notebook cell ``cell``, ignoring the re-run warnings."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", cg.CellgraphWarning)
        with cg.cell_scope(cell, label=label):
            return body()


def _same_attr(a: Any, b: Any) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (
            type(a) is type(b)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and a.tobytes() == b.tobytes()  # bit-exact: NaN payloads and -0.0 too
        )
    if isinstance(a, (tuple, list)):
        return type(a) is type(b) and len(a) == len(b) and all(_same_attr(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def _assert_same_graph(g1: cg.Graph, g2: cg.Graph) -> None:
    """Node by node, everything a node records (inputs and control inputs by name)."""
    assert [n.name for n in g1.nodes] == [n.name for n in g2.nodes]
    for a, b in zip(g1.nodes, g2.nodes):
        assert (a.op, a.device, a.cell, a.cell_label, a.file, a.line, a.stale) == (
            b.op, b.device, b.cell, b.cell_label, b.file, b.line, b.stale,
        ), a.name  # fmt: skip
        assert [t.name for t in a.inputs] == [t.name for t in b.inputs], a.name
        assert [t.spec for t in a.inputs] == [t.spec for t in b.inputs], a.name
        assert [c.name for c in a.control_inputs] == [c.name for c in b.control_inputs], a.name
        assert a.specs == b.specs, a.name
        assert sorted(a.attrs) == sorted(b.attrs), a.name
        for key in a.attrs:
            assert _same_attr(a.attrs[key], b.attrs[key]), (a.name, key, a.attrs[key], b.attrs[key])
        assert b.graph is g2
    assert g1.cells == g2.cells


def _round_trip(g: cg.Graph) -> cg.Graph:
    gd = to_graphdef(g)
    g2 = from_graphdef(gd)
    _assert_same_graph(g, g2)
    again = to_graphdef(g2)
    assert again == gd
    assert again.SerializeToString(deterministic=True) == gd.SerializeToString(deterministic=True)
    # And through bytes, as it travels to a worker.
    g3 = from_graphdef(graph_pb2.GraphDef.FromString(gd.SerializeToString()))
    _assert_same_graph(g, g3)
    return g2


def _model_graph() -> cg.Graph:
    """State and math ops in every configuration the GraphDef must carry."""
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((None, 3), "float32", name="x")
        labels = cg.placeholder((None,), "int32", name="labels")
        with cg.cell_scope("c1", label="7"):
            with cg.name_scope("dense"), cg.device(WORKER):
                w = cg.variable(np.arange(6, dtype=np.float32).reshape(3, 2) / 7, name="kernel")
                b = cg.variable(np.zeros(2, np.float32), name="bias")
                y = cg.matmul(x, w, name="matmul") + b
            count = cg.variable(np.array([1, -2, 2**31 - 1]), dtype="int32", name="count", trainable=False)
        special = cg.constant(np.array([np.nan, -0.0, np.inf, 1e-45], np.float32), name="special")
        wide = cg.constant([[1.5, -2.25]], dtype="float64", name="wide")
        flags = cg.constant(np.array([True, False]), name="flags")
        scalar = cg.constant(3, name="scalar")
        with cg.colocate_with(w):
            t = cg.matmul(y, y, transpose_a=True, name="gram")
        loss = cg.reduce_mean(cg.square(y), axis=[0, 1], name="loss")
        cg.reduce_sum(t, axis=None, keepdims=True, name="total")
        cg.reduce_max(y, axis=1, name="row_max")
        cg.argmax(y, name="pred")
        cg.cast(labels, "float64", name="labels_f")
        cg.equal(cg.cast(special, "float64"), cg.cast(special, "float64"), name="not_nan")
        cg.reduce_sum(cg.cast(flags, "int32") + scalar, name="flag_sum")
        cg.add(wide, wide, name="wide_sum")
        bump = cg.assign_add(count, [1, 1, 1], name="bump")
        with cg.control_dependencies([bump]):
            cg.identity(loss, name="loss_after_bump")
        cg.group(bump, loss, name="step")
    return g


# ------------------------------------------------------------- round trips
def test_round_trip_of_state_and_math_ops_is_exact() -> None:
    g = _model_graph()
    g2 = _round_trip(g)
    kernel = g2.node("dense/kernel")
    assert kernel.device == WORKER and kernel.cell == "c1" and kernel.cell_label == "7"
    assert kernel.where().startswith("cell 7, line ")
    assert g2.node("x").specs[0].shape == (None, 3)
    assert g2.node("x").attrs["shape"] == (None, 3)
    assert g2.node("loss").attrs["axis"] == [0, 1]  # a list stays a list
    assert g2.node("total").attrs["axis"] is None
    assert g2.node("gram").attrs["_colocate"] == "dense/kernel"
    assert [c.name for c in g2.node("step").control_inputs] == ["bump", "loss"]
    assert g2.cells == {"c1": ["dense/kernel", "dense/bias", "dense/matmul", "dense/add", "count"]}


@pytest.mark.parametrize(
    ("node", "attr", "dtype"),
    [("dense/kernel", "initial_value", "float32"), ("count", "initial_value", "int32"),
     ("special", "value", "float32"), ("wide", "value", "float64"), ("flags", "value", "bool"),
     ("scalar", "value", "int32")],
)  # fmt: skip
def test_array_attrs_come_back_bit_exact_and_read_only(node: str, attr: str, dtype: str) -> None:
    g = _model_graph()
    before = g.node(node).attrs[attr]
    after = from_graphdef(to_graphdef(g)).node(node).attrs[attr]
    assert after.dtype == np.dtype(dtype) and after.dtype == before.dtype
    assert after.shape == before.shape
    assert after.tobytes() == before.tobytes()
    assert not after.flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        after[...] = 0


def test_nested_tuples_lists_and_scalars_survive() -> None:
    attrs = {
        "pads": ((0, 0), (1, 1)),
        "empty": (),
        "empty_list": [],
        "mixed": [1, (2.5, None), "SAME", [True, np.zeros((2, 0), np.float64)]],
        "none": None,
        "big": 2**62,
        "neg": -(2**63),
        "tiny": 5e-324,
        "text": "padding é",
        "flag": False,
    }
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((2,), name="x")
        g.create_node("Identity", [x], attrs, name="attrs")
    node = _round_trip(g).node("attrs")
    assert node.attrs["pads"] == ((0, 0), (1, 1)) and isinstance(node.attrs["pads"][0], tuple)
    assert node.attrs["empty"] == () and node.attrs["empty_list"] == []
    assert node.attrs["mixed"][3][1].shape == (2, 0)


def test_numpy_scalar_attrs_come_back_as_python_scalars() -> None:
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((2,), name="x")
        g.create_node("Identity", [x], {"i": np.int64(3), "f": np.float32(0.1), "b": np.bool_(True)}, name="n")
    attrs = from_graphdef(to_graphdef(g)).node("n").attrs
    assert attrs == {"i": 3, "f": float(np.float32(0.1)), "b": True}
    assert [type(attrs[k]) for k in ("i", "f", "b")] == [int, float, bool]


def test_nodes_out_of_topological_order_import_in_the_graphs_order() -> None:
    g = cg.Graph()
    with g.as_default():
        _quiet_cell("a", "1", lambda: cg.placeholder((None, 2), name="x"))
        _quiet_cell("b", "2", lambda: cg.reduce_sum(g.tensor("x:0") * 2.0, name="y"))
        # Re-running cell a makes x anew after y, which is re-bound to it.
        _quiet_cell("a", "3", lambda: cg.placeholder((None, 2), name="x"))
    gd = to_graphdef(g)
    names = [n.name for n in gd.node]
    assert names.index("x") > names.index("mul")  # the consumer comes first
    g2 = _round_trip(g)
    assert [n.name for n in g2.nodes] == names
    assert g2.node("x").cell_label == "3" and g2.node("y").cell_label == "2"
    np.testing.assert_array_equal(cg.Session(g2).run("y:0", {"x:0": [[1.0, 2.0]]}), 6.0)


def test_stale_nodes_keep_their_marker_types_and_removed_inputs() -> None:
    g = cg.Graph()
    with g.as_default():

        def cell_a() -> None:
            cg.placeholder((None, 3), name="x")
            cg.variable(np.ones((3, 2), np.float32), name="w")

        _quiet_cell("a", "1", cell_a)
        _quiet_cell("b", "2", lambda: cg.matmul(g.tensor("x:0"), g.tensor("w:0"), name="y"))
        _quiet_cell("c", "3", lambda: cg.group(g.tensor("w:0"), name="after_w"))
        _quiet_cell("d", "4", lambda: cg.reduce_sum(g.tensor("x:0"), axis=1, name="s"))
        # Re-run cell a: x changes shape (y and s go stale) and w is gone.
        _quiet_cell("a", "5", lambda: cg.placeholder((None, 4), name="x"))
    assert g.node("y").stale and g.node("y").inputs[1].node not in g
    assert g.node("after_w").control_inputs[0] not in g
    gd = to_graphdef(g)
    y = next(n for n in gd.node if n.name == "y")
    assert y.HasField("stale") and list(y.removed_input) == [1] and y.removed_input[1].op == "Variable"
    g2 = _round_trip(g)
    assert g2.node("y").stale == g.node("y").stale
    assert g2.node("y").specs == g.node("y").specs  # the types it had, not what its inputs give now
    assert g2.node("y").inputs[1].node not in g2 and g2.node("y").inputs[1].shape == (3, 2)
    with pytest.raises(cg.StaleNodeError, match=r"MatMul 'y' \(cell 2.*is stale.*re-run cell 2"):
        cg.Session(g2).run("y:0", {"x:0": np.ones((1, 4), np.float32)})


def test_rerun_after_import_rebinds_like_the_original() -> None:
    g = cg.Graph()
    with g.as_default():
        _quiet_cell("a", "1", lambda: cg.placeholder((None, 2), name="x"))
        _quiet_cell("b", "2", lambda: cg.reduce_sum(g.tensor("x:0"), name="y"))
    g2 = from_graphdef(to_graphdef(g))
    with g2.as_default():
        _quiet_cell("a", "3", lambda: cg.placeholder((None, 5), name="x"))
    assert g2.node("y").inputs[0].node is g2.node("x") and g2.node("y").stale is None
    np.testing.assert_array_equal(cg.Session(g2).run("y:0", {"x:0": np.ones((2, 5), np.float32)}), 10.0)


def test_empty_graph_and_deep_chain() -> None:
    assert len(from_graphdef(to_graphdef(cg.Graph()))) == 0
    g = cg.Graph()
    with g.as_default():
        t = cg.placeholder((), name="x")
        for _ in range(3000):  # deeper than Python's recursion limit
            t = cg.identity(t)
    gd = to_graphdef(g)
    reversed_gd = graph_pb2.GraphDef(node=list(reversed(gd.node)), versions=gd.versions)
    g2 = from_graphdef(reversed_gd)
    assert [n.name for n in g2.nodes] == [n.name for n in reversed(g.nodes)]
    assert to_graphdef(g2) == reversed_gd


def test_training_after_import_matches_the_original() -> None:
    rng = np.random.default_rng(0)
    data = rng.normal(size=(32, 3)).astype(np.float32)
    target = (data @ np.array([[1.0], [-2.0], [0.5]], np.float32) + 0.25).astype(np.float32)

    g = cg.Graph()
    with g.as_default(), cg.cell_scope("model", label="1"):
        x = cg.placeholder((None, 3), name="x")
        y = cg.placeholder((None, 1), name="y")
        w = cg.variable(rng.normal(size=(3, 1)).astype(np.float32), name="w")
        b = cg.variable(np.zeros(1, np.float32), name="b")
        loss = cg.reduce_mean(cg.square(cg.matmul(x, w) + b - y), name="loss")
        grads = cg.gradients(loss, [w, b])
        lr = cg.constant(0.1, name="lr")
        cg.group(*[cg.apply_gradient_descent(v, lr, dv) for v, dv in zip([w, b], grads)], name="train")
    g2 = _round_trip(g)

    def train(graph: cg.Graph) -> tuple[list[float], dict[str, np.ndarray]]:
        sess = cg.Session(graph)
        losses = []
        for _ in range(25):
            losses.append(float(sess.run("loss:0", {"x:0": data, "y:0": target})))
            sess.run("train", {"x:0": data, "y:0": target})
        return losses, sess.variable_values()

    losses, values = train(g)
    losses2, values2 = train(g2)
    assert losses2 == losses and losses[-1] < losses[0] / 10
    assert values2.keys() == values.keys()
    for name in values:
        assert values2[name].tobytes() == values[name].tobytes(), name


def test_optimizer_graph_round_trips() -> None:
    g = cg.Graph()
    with g.as_default():
        w = cg.variable(np.array([3.0, -1.0], np.float32), name="w")
        step = cg.variable(0, dtype="int32", name="step", trainable=False)
        adam = cg.optim.Adam(0.1).minimize(cg.reduce_sum(w * w), global_step=step)
        momentum = cg.optim.Momentum(0.1, nesterov=True).minimize(cg.reduce_sum(w * w))
    g2 = _round_trip(g)
    s1, s2 = cg.Session(g), cg.Session(g2)
    for _ in range(3):
        for train in (adam, momentum):
            s1.run(train)
            s2.run(train.name)
    assert s1.run(w).tobytes() == s2.run("w:0").tobytes()
    assert s2.run("step:0") == 3


def test_array_ops_round_trip_and_run_the_same() -> None:
    from cellgraph.dataflow.ops import array, array_gather, array_slice

    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((None, 4, 3), name="x")
        labels = cg.placeholder((None,), "int32", name="labels")
        parts = [
            array.reshape(x, (-1, 12)),
            array.transpose(x, (0, 2, 1)),
            array.concat([x, x], axis=1),
            array_slice.pad(x, ((0, 0), (1, 1), (2, 0))),  # nested tuples
            x[:, 1:3, ::-1],
            x[..., 0, None],
            array_gather.gather(x, cg.constant([0, 2]), axis=1),
            array.squeeze(array.expand_dims(x, 0), 0),
            array_slice.slice(x, (0, 1, 0), (-1, 2, 3)),
        ]
        loss = cg.reduce_sum(parts[0], name="loss")
        for part in parts[1:]:
            loss = loss + cg.reduce_sum(part)
        hot = array_gather.one_hot(labels, 3)
        [dx] = cg.gradients(loss, [x])
    g2 = _round_trip(g)
    assert g2.node("pad").attrs["paddings"] == ((0, 0), (1, 1), (2, 0))
    value = np.random.default_rng(1).normal(size=(2, 4, 3)).astype(np.float32)
    feeds = {"x:0": value, "labels:0": np.array([2, 0], np.int32)}
    fetches = [loss.name, dx.name, hot.name]
    for a, b in zip(cg.Session(g).run(fetches, feeds), cg.Session(g2).run(fetches, feeds)):
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes()


# --------------------------------------------------------- tensor protos
@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int64", "bool"])
def test_tensor_proto_round_trip(dtype: str) -> None:
    value = (np.arange(24).reshape(2, 3, 4) % 3).astype(dtype)
    proto = to_tensor_proto(value)
    assert tensor_pb2.DataType.Name(proto.dtype) == f"DT_{dtype.upper()}"
    assert list(proto.shape.dim) == [2, 3, 4]
    back = from_tensor_proto(proto)
    assert back.dtype == value.dtype and back.tobytes() == value.tobytes()


def test_tensor_proto_is_little_endian_c_order() -> None:
    big = np.array([[1, 2], [3, 4]], dtype=">i4").T  # big-endian and not C-contiguous
    proto = to_tensor_proto(big)
    assert proto.content == np.array([[1, 3], [2, 4]], "<i4").tobytes()
    back = from_tensor_proto(proto)
    assert back.dtype == np.dtype("int32") and back.dtype.isnative
    np.testing.assert_array_equal(back, big)
    scalar = from_tensor_proto(to_tensor_proto(np.array(2.5)))
    assert scalar.shape == () and scalar.dtype == np.float64


# ------------------------------------------------------------------ errors
def _small_graphdef() -> graph_pb2.GraphDef:
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((None, 3), name="x")
        w = cg.variable(np.ones((3, 2), np.float32), name="w")
        cg.matmul(x, w, name="y")
    return to_graphdef(g)


def _node(gd: graph_pb2.GraphDef, name: str) -> graph_pb2.NodeDef:
    return next(n for n in gd.node if n.name == name)


@pytest.mark.parametrize(
    ("value", "type_name"),
    [({1, 2}, "set"), ({"a": 1}, "dict"), (object(), "object"), ((1, {2}), "set"), (b"raw", "bytes")],
)
def test_unsupported_attr_type_names_node_attr_and_type(value: Any, type_name: str) -> None:
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((2,), name="x")
        g.create_node("Identity", [x], {"odd": value}, name="odd_node")
    with pytest.raises(cg.GraphError) as info:
        to_graphdef(g)
    message = str(info.value)
    assert "attr 'odd'" in message and "Identity 'odd_node'" in message
    assert f"type {type_name} is not supported" in message


def test_unsupported_array_dtype_and_huge_int_are_rejected() -> None:
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((2,), name="x")
        g.create_node("Identity", [x], {"half": np.zeros(2, np.complex64)}, name="n")
    with pytest.raises(cg.DTypeError, match=r"attr 'half' of Identity 'n'.*unsupported dtype complex64"):
        to_graphdef(g)
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((2,), name="x")
        g.create_node("Identity", [x], {"huge": (1, 2**64)}, name="n")
    with pytest.raises(cg.GraphError, match=r"attr 'huge'\[1\] of Identity 'n'.*does not fit in 64 bits"):
        to_graphdef(g)


def test_unknown_op_names_the_node_and_the_known_ops() -> None:
    gd = _small_graphdef()
    _node(gd, "y").op = "Conv9D"
    with pytest.raises(cg.RegistryError, match=r"GraphDef node 'y': no op named 'Conv9D'; known: .*MatMul"):
        from_graphdef(gd)


def test_missing_input_names_the_node_and_the_input() -> None:
    gd = _small_graphdef()
    _node(gd, "y").input[1] = "v:0"
    with pytest.raises(cg.GraphError, match=r"GraphDef node 'y' \(MatMul\): input 'v:0' names no node"):
        from_graphdef(gd)
    gd = _small_graphdef()
    _node(gd, "y").control_input.append("ghost")
    with pytest.raises(cg.GraphError, match=r"node 'y' \(MatMul\): control input 'ghost' names no node"):
        from_graphdef(gd)


def test_bad_input_reference_and_output_index() -> None:
    gd = _small_graphdef()
    _node(gd, "y").input[0] = "x:first"
    with pytest.raises(cg.GraphError, match=r"node 'y' \(MatMul\): input 'x:first' is not 'node:index'"):
        from_graphdef(gd)
    gd = _small_graphdef()
    _node(gd, "y").input[0] = "x:1"
    with pytest.raises(cg.GraphError, match=r"input 'x:1' asks for output 1, but Placeholder 'x' has 1 output"):
        from_graphdef(gd)


def test_cycle_names_the_nodes_on_it() -> None:
    gd = _small_graphdef()
    _node(gd, "w").op = "Identity"
    _node(gd, "w").input.append("y:0")
    with pytest.raises(cg.GraphError, match=r"cycle \(each reads the next\): 'w' -> 'y' -> 'w'"):
        from_graphdef(gd)
    gd = _small_graphdef()
    _node(gd, "x").control_input.append("x")
    with pytest.raises(cg.GraphError, match=r"cycle .*'x' -> 'x'"):
        from_graphdef(gd)


def test_duplicate_and_missing_names() -> None:
    gd = _small_graphdef()
    gd.node.add().CopyFrom(_node(gd, "x"))
    with pytest.raises(cg.GraphError, match=r"two nodes named 'x' \(Placeholder #0 and Placeholder #3\)"):
        from_graphdef(gd)
    gd = _small_graphdef()
    _node(gd, "w").name = ""
    with pytest.raises(cg.GraphError, match=r"GraphDef node #1 \(Variable\) has no name"):
        from_graphdef(gd)


def test_shape_rules_run_again_on_import() -> None:
    gd = _small_graphdef()
    _node(gd, "y").attr["transpose_b"].b = True
    del _node(gd, "y").output[:]  # as a GraphDef from elsewhere might come, without output types
    with pytest.raises(cg.ShapeError, match=r"MatMul 'y' \(.*\): inner dimensions differ: \(None, 3\) @ \(3, 2\)"):
        from_graphdef(gd)


def test_recorded_outputs_must_match_the_shape_rule() -> None:
    gd = _small_graphdef()
    _node(gd, "y").output[0].shape.dim[1] = 5
    with pytest.raises(
        cg.GraphError, match=r"MatMul 'y'.*records outputs \(None, 5\) float32 but the shape rule gives "
    ):
        from_graphdef(gd)


def test_unreadable_attr_values_name_node_and_attr() -> None:
    gd = _small_graphdef()
    _node(gd, "w").attr["initial_value"].tensor.content = b"\x00" * 5
    with pytest.raises(
        cg.GraphError, match=r"Variable 'w'.*attr 'initial_value': a float32 tensor of shape \(3, 2\) needs 24 bytes"
    ):
        from_graphdef(gd)
    gd = _small_graphdef()
    _node(gd, "w").attr["initial_value"].tensor.dtype = 42  # type: ignore[assignment]
    with pytest.raises(cg.GraphError, match=r"attr 'initial_value': DataType 42 is not a tensor dtype"):
        from_graphdef(gd)
    gd = _small_graphdef()
    _node(gd, "y").attr["transpose_a"].Clear()
    with pytest.raises(cg.GraphError, match=r"MatMul 'y'.*attr 'transpose_a' has no value"):
        from_graphdef(gd)


def test_graphdef_from_a_newer_format_is_refused() -> None:
    gd = _small_graphdef()
    assert gd.versions.producer == GRAPHDEF_VERSION
    gd.versions.producer = gd.versions.min_consumer = GRAPHDEF_VERSION + 1
    with pytest.raises(cg.GraphError, match=r"needs a reader of format version 2 or later.*upgrade cellgraph"):
        from_graphdef(gd)
