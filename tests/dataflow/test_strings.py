"""String tensors: the ops that take them compute what NumPy does on the same text, and every other
op, a variable, a GPU and a wrong feed refuse them with words that say so."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import cellgraph as cg
from cellgraph.dataflow.errors import DTypeError

WORDS = np.array(["cat", "cow", "eel", "ünïcode ✓"], dtype=object)
WORKER_CPU = "/job:worker/task:0/device:cpu:0"
GPU = "/job:worker/task:0/device:gpu:0"


def _string_graph() -> tuple[cg.Graph, cg.Tensor, dict[str, tuple[cg.Tensor, object]]]:
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder([None], "string", name="x")
        grid = cg.reshape(x, [2, 2])
        cases = {
            "equal": (cg.equal(x, "cat"), WORDS == "cat"),
            "equal_broadcast": (cg.equal(grid, cg.constant(["cat", "eel"])), WORDS.reshape(2, 2) == ["cat", "eel"]),
            "not_equal": (cg.not_equal(x, cg.constant(list(WORDS[::-1]))), WORDS != WORDS[::-1]),
            "reshape": (grid, WORDS.reshape(2, 2)),
            "transpose": (cg.transpose(grid, (1, 0)), WORDS.reshape(2, 2).T),
            "concat": (cg.concat([x, cg.constant(["z"])], 0), np.concatenate([WORDS, ["z"]])),
            "gather": (cg.gather(x, cg.constant([3, 0, 3])), WORDS[[3, 0, 3]]),
            "where": (
                cg.where(cg.equal(x, "eel"), cg.constant(["yes"] * 4), x),
                np.where(WORDS == "eel", "yes", WORDS),
            ),
            "tile": (cg.tile(grid, [1, 2]), np.tile(WORDS.reshape(2, 2), (1, 2))),
            "expand_squeeze": (cg.squeeze(cg.expand_dims(x, 0), [0]), WORDS),
            "identity": (cg.identity(x), WORDS),
            "stop_gradient": (cg.stop_gradient(x), WORDS),
            "shape": (cg.shape(grid), np.array([2, 2], np.int32)),
            "size": (cg.size(x), np.int32(4)),
            "default": (cg.placeholder_with_default(cg.constant(["a", "b"]), [None], name="d"), np.array(["a", "b"])),
        }
    return g, x, cases


def test_every_op_that_takes_strings_computes_what_numpy_does() -> None:
    g, x, cases = _string_graph()
    got = cg.Session(g).run([t for t, _ in cases.values()], {x: WORDS})
    for (name, (t, want)), value in zip(cases.items(), got, strict=True):
        want = np.asarray(want)
        assert value.dtype == (object if t.dtype == "string" else want.dtype), name
        assert value.shape == want.shape and value.tolist() == want.tolist(), name
    # A '<U' array and a list of str feed as well as an object array.
    assert cg.Session(g).run(cases["equal"][0], {x: ["cat", "dog"]}).tolist() == [True, False]
    assert cg.Session(g).run(cases["identity"][0], {x: np.array(["a", "b"])}).dtype == object


def test_a_string_tensor_survives_a_graphdef_and_a_saved_model_in_a_new_process(tmp_path: Path) -> None:
    g, x, cases = _string_graph()
    again = cg.from_graphdef(cg.to_graphdef(g))
    t = again.tensor(cases["equal_broadcast"][0].name)
    assert cg.Session(again).run(t, {again.tensor("x:0"): WORDS}).tolist() == cases["equal_broadcast"][1].tolist()
    outputs = [cases["not_equal"][0], cases["concat"][0]]
    cg.save_model(tmp_path / "words", [x], outputs, cg.Session(g))
    script = (
        "import numpy as np, cellgraph as cg\n"
        f"m = cg.load_model({str(tmp_path / 'words')!r})\n"
        f"a, b = m(np.array({WORDS.tolist()!r}, dtype=object))\n"
        "print(a.tolist(), b.tolist())\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    want = f"{(WORDS != WORDS[::-1]).tolist()} {[*WORDS.tolist(), 'z']}"
    assert out.stdout.strip() == want


def test_an_op_that_takes_no_strings_refuses_them_when_built_and_the_graph_is_unchanged() -> None:
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder([2], "string", name="x")
        before = len(g)
        with pytest.raises(
            DTypeError,
            match=r"Add 'add' .* does not take string tensors \(string: input 0 'x:0', "
            r"input 1 'x:0', output 0\); the ops that do: Concat, Const, Equal, ",
        ):
            cg.add(x, x)
        with pytest.raises(DTypeError, match=r"Cast 'cast' .* does not take string tensors \(string: input 0 'x:0'\)"):
            cg.cast(x, "float32")
        assert len(g) == before


def test_text_where_numbers_belong_and_numbers_where_text_belongs_are_refused_with_words() -> None:
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder([2], "string", name="x")
        f = cg.placeholder([2], "float32", name="f")
        with pytest.raises(DTypeError, match="variable 'v': a variable holds numbers, not text"):
            cg.variable(np.array(["a"], dtype=object), name="v")
        with pytest.raises(DTypeError, match=r"Mul: cannot use 'cat' \(<U3\) as a float32 value"):
            cg.mul(f, "cat")
        with pytest.raises(DTypeError, match=r"Equal: operand 3: a string tensor holds str, got a int64 array"):
            cg.equal(x, 3)
        with pytest.raises(DTypeError, match=r"Cast 'to_text' .* does not take string tensors \(string: output 0\)"):
            cg.cast(f, "string", name="to_text")
        e = cg.equal(x, "a")
    sess = cg.Session(g)
    with pytest.raises(
        DTypeError,
        match=r"feed for 'x:0' \(test_strings\.py:\d+\): a string tensor holds str, but element \[1\] is bytes "
        r"b'b' \(decode bytes first\)",
    ):
        sess.run(e, {x: np.array(["a", b"b"], dtype=object)})
    with pytest.raises(
        DTypeError,
        match=r"feed for 'x:0' \(test_strings\.py:\d+\): a string tensor holds str, got bytes \(\|S1\); decode them",
    ):
        sess.run(e, {x: [b"a", b"b"]})
    with pytest.raises(
        DTypeError, match=r"feed for 'x:0' \(test_strings\.py:\d+\): a string tensor holds str, got a float64 array"
    ):
        sess.run(e, {x: np.array([1.0, 2.0])})
    with pytest.raises(
        DTypeError, match=r"feed for 'f:0' \(test_strings\.py:\d+\) holds text \(<U1\), expected float32"
    ):
        sess.run(f, {f: np.array(["a", "b"])})
    with pytest.raises(DTypeError, match="constant 'c': a string tensor holds str, but element \\[0\\] is int 1"):
        cg.constant(np.array([1, "a"], dtype=object), name="c", graph=g)


def test_string_ops_are_placed_on_a_cpu_beside_a_gpu_and_refused_by_a_cuda_kernel() -> None:
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder([2], "string", name="x")
        e = cg.equal(x, "a", name="same")
        n = cg.placeholder([2], "float32", name="n")
        cg.add(n, n, name="sum")
    placement = cg.placement.place(g, [WORKER_CPU, GPU])
    assert placement.device_of["same"] == WORKER_CPU
    assert placement.device_of["sum"] == GPU  # an op with a cuda kernel on numbers still goes to the GPU
    from cellgraph.dataflow.errors import KernelNotFound

    with pytest.raises(KernelNotFound, match="has no cuda kernel for string tensors: strings are computed on the cpu"):
        e.node.opdef.kernels["cuda"](e.node, None)


def test_a_string_tensor_crosses_between_devices_of_a_partitioned_graph() -> None:
    ps = "/job:ps/task:0/device:cpu:0"
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder([None], "string", name="x")
        shout = cg.where(cg.equal(x, "cat"), cg.constant(["CAT"] * 4), x, name="shout")
        again = cg.concat([shout, x], 0, name="again")
    device_of = {n.name: WORKER_CPU for n in g.nodes}
    device_of["shout"] = ps
    sess = cg.PartitionedSession(g, device_of, timeout=20)
    assert any(e.tensor.name == "shout:0" for e in sess.parts.edges)  # a string tensor crossed to the worker
    got = sess.run(again, {x: WORDS})
    assert got.tolist() == [*np.where(WORDS == "cat", "CAT", WORDS).tolist(), *WORDS.tolist()]
