"""Elementwise fusion gives the same numbers as running the ops one by one."""

from __future__ import annotations

import numpy as np
import pytest

import cellgraph as cg
from cellgraph.dataflow.fusion import find_segments
from cellgraph.dataflow.kernels.fused_source import loop_source


def _both(g: cg.Graph, fetches, feeds):  # noqa: ANN001, ANN202
    fused, plain = cg.Session(g), cg.Session(g, fuse=False)
    return fused.run(fetches, feeds), plain.run(fetches, feeds), fused


def _chain(x: cg.Tensor, y: cg.Tensor) -> cg.Tensor:
    h = cg.relu(x * 2.0 - y) + cg.sigmoid(y)
    h = cg.maximum(cg.tanh(h), cg.minimum(x, 0.5)) / (cg.exp(-cg.square(y)) + 1.0)
    h = cg.pow(cg.sqrt(h * h + 1.0), 1.5) - cg.log(y * y + 1.0)
    return -h


def test_a_chain_becomes_a_few_loops_with_the_same_values() -> None:
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((None, 5), name="x")
        y = cg.placeholder((None, 5), name="y")
        out = _chain(x, y)
    rng = np.random.default_rng(0)
    feeds = {x: rng.normal(size=(4, 5)), y: rng.normal(size=(4, 5))}
    got, want, sess = _both(g, out, feeds)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    plan = sess.make_callable([out], [x, y])
    calls = [s for s in plan.steps if not s.constant]  # constants are computed when the plan is built
    # 22 elementwise ops run as a few loops: runs are split where a value is
    # read twice (`h * h`) or where the schedule moves to another branch.
    assert sum(len(c.nodes) for c in calls) == 22
    assert len(calls) <= 6 and all(len(c.nodes) >= 2 for c in calls)


def test_scalars_and_true_broadcasting_are_both_handled() -> None:
    g = cg.Graph()
    with g.as_default():
        col = cg.placeholder((None, 1), name="col")
        row = cg.placeholder((1, None), name="row")
        s = cg.placeholder((), name="s")
        out = cg.relu(col * s + row) * 3.0 - s
    feeds = {col: np.arange(3.0).reshape(3, 1), row: np.arange(4.0).reshape(1, 4) - 2, s: 0.5}
    got, want, _ = _both(g, out, feeds)  # (3, 1) with (1, 4): runs op by op
    assert got.shape == (3, 4)
    np.testing.assert_allclose(got, want)
    feeds[row] = np.ones((1, 1))
    got, want, _ = _both(g, out, feeds)  # now everything is one value or the output's shape
    np.testing.assert_allclose(got, want)


def test_fetched_and_shared_intermediates_stay_materialised() -> None:
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((3,), name="x")
        a = x * 2.0
        b = a + 1.0  # fetched
        c = cg.exp(b) + b  # b used twice
    plan = cg.Session(g).make_callable([b, c], [x])
    segments = find_segments(plan.order, {(id(b.node), 0), (id(c.node), 0)})
    # b is fetched and read twice, so it ends a segment; exp(b) + b is a second one.
    assert [[n.name for n in s.nodes] for s in segments] == [["mul", "add"], ["exp", "add_1"]]
    got = plan(np.array([0.0, 1.0, 2.0], np.float32))
    want = cg.Session(g, fuse=False).run([b, c], {x: np.array([0.0, 1.0, 2.0], np.float32)})
    np.testing.assert_allclose(got[0], want[0])
    np.testing.assert_allclose(got[1], want[1], rtol=1e-6)


def test_integer_and_comparison_ops_are_not_fused() -> None:
    g = cg.Graph()
    with g.as_default():
        i = cg.placeholder((3,), "int32", name="i")
        out = cg.equal(i * 2, i + i)
    plan = cg.Session(g).make_callable([out], [i])
    assert all(len(s.nodes) == 1 for s in plan.steps)  # int and bool results never fuse
    assert plan(np.array([1, 2, 3], np.int32))[0].all()


def test_the_loop_reads_each_input_once_per_element() -> None:
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((4,), name="x")
        s = cg.placeholder((), name="s")
        out = cg.square(x + s)
    [segment] = find_segments([n for n in g.nodes if n.op != "Placeholder"], set())
    source = loop_source(segment, scalars=[False, True])
    assert "def fused(n, out, x0, x1):" in source
    assert "    v1 = x1[0]" in source  # a one-value input is read once, before the loop
    assert "t0 = DT((x0[i] + v1))" in source and "t1 = DT((t0 * t0))" in source
    assert 'error_model="numpy"' in source
    assert out.node is segment.nodes[-1]


def test_division_by_zero_gives_inf_fused_as_unfused() -> None:
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((3,), name="x")
        z = cg.placeholder((3,), name="z")
        out = (x * 2.0) / z + 1.0
    feeds = {x: np.array([1.0, -1.0, 0.0]), z: np.array([0.0, 0.0, 2.0])}
    with np.errstate(divide="ignore", invalid="ignore"):
        got, want, _ = _both(g, out, feeds)
    np.testing.assert_array_equal(got, want)
    assert np.isinf(got[:2]).all()


def test_a_failing_segment_names_its_last_node() -> None:
    g = cg.Graph()
    with g.as_default():
        a = cg.placeholder((None, 3), name="a")
        b = cg.placeholder((None, 3), name="b")
        out = cg.exp(a + b)
    with pytest.raises(
        cg.ExecutionError, match=r"Exp 'exp' \(test_fusion.py:\d+\) \(fused with 1 elementwise ops before it\) failed"
    ):
        cg.Session(g).run(out, {a: np.ones((2, 3)), b: np.ones((4, 3))})


def test_training_is_the_same_with_and_without_fusion() -> None:
    from cellgraph.examples import models

    rng = np.random.default_rng(0)
    xb, yb = rng.random((16, 8, 8, 1), dtype=np.float32), rng.integers(0, 10, 16).astype(np.int32)
    losses = []
    for fuse in (True, False):
        m = models.mini_inception(cg.optim.SGD(0.05))
        sess = cg.Session(m.graph, fuse=fuse)
        losses.append([float(sess.run([m.train_op, m.loss], {m.x: xb, m.y: yb})[1]) for _ in range(5)])
    np.testing.assert_allclose(losses[0], losses[1], rtol=1e-4)


def test_infinite_and_nan_constants_are_written_as_numpy_names() -> None:
    # repr(inf) is "inf", not a name in the generated loop's module: the fused kernel failed with NameError.
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((None,), name="x")
        y = cg.maximum(x * 2.0, np.float32(-np.inf)) + cg.minimum(x, np.float32(np.inf)) + np.float32(np.nan) * 0.0
    got = cg.Session(g).run(y, {x: np.array([1.0, -2.0, 3.0], np.float32)})
    want = cg.Session(g, fuse=False).run(y, {x: np.array([1.0, -2.0, 3.0], np.float32)})
    np.testing.assert_array_equal(got, want)
    assert np.isnan(got).all()  # nan * 0 is nan: the constant reached the loop as nan


def test_constants_of_one_value_and_empty_constants_shape_the_fused_output() -> None:
    # A one-value constant is written into the loop as a literal, but its rank still counts; an empty constant
    # makes an empty output. The fused loop returned a 0-d 9.0 for (1, 1), and read an empty constant's
    # element 0 (memory it does not own) for (0, 3).
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((), name="x")
        v = cg.placeholder((None,), name="v")
        cases = {
            "one value of rank 2": (x + cg.constant(np.array([[2.0]], np.float32))) * 3.0,
            "a fed (1,) against (1, 1)": cg.exp(v * cg.constant(np.ones((1, 1), np.float32))) + 1.0,
            "an empty constant": cg.exp(x + cg.constant(np.zeros((0, 3), np.float32))) * 2.0,
            "constants only": -(cg.abs(cg.constant(np.array([1.0], np.float32))) + 1.0),
        }
    feeds = {x: np.float32(1.0), v: np.array([0.5], np.float32)}
    fused, plain, _ = _both(g, list(cases.values()), feeds)
    want = {
        "one value of rank 2": np.array([[9.0]], np.float32),
        "a fed (1,) against (1, 1)": np.exp(np.array([[0.5]], np.float32)) + 1.0,
        "an empty constant": np.zeros((0, 3), np.float32),
        "constants only": np.array([-2.0], np.float32),
    }
    for (name, expected), got, reference in zip(want.items(), fused, plain, strict=True):
        assert got.shape == expected.shape == reference.shape, name
        np.testing.assert_allclose(got, expected, rtol=1e-6, err_msg=name)
        np.testing.assert_array_equal(got, reference, err_msg=name)
