from __future__ import annotations

import re

import numpy as np
import pytest

import cellgraph as cg


@pytest.fixture
def model():  # noqa: ANN201
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((None, 3), "float32", name="x")
        w = cg.variable(np.ones((3, 2), np.float32), name="w")
        y = x @ w
        loss = cg.reduce_mean(cg.square(y))
        train = cg.optim.SGD(0.1).minimize(loss)
    return g, x, w, y, loss, train


def test_fetch_structures(model) -> None:  # noqa: ANN001
    g, x, w, y, loss, train = model
    sess = cg.Session(g)
    feed = {x: np.ones((2, 3), np.float32)}
    out = sess.run({"y": y, "pair": (loss, [w])}, feed)
    assert out["y"].shape == (2, 2)
    assert isinstance(out["pair"], tuple) and isinstance(out["pair"][1], list)
    assert sess.run(train, feed) is None
    assert sess.run("w:0").shape == (3, 2)
    assert sess.run("x:0", feed).shape == (2, 3)


def test_fetched_variable_is_a_copy(model) -> None:  # noqa: ANN001
    g, x, w, *_ = model
    sess = cg.Session(g)
    value = sess.run(w)
    value[...] = 42
    assert sess.run(w)[0, 0] == 1.0


def _bad(sess, fetch, feed, error, match, w):  # noqa: ANN001, ANN202
    before = sess.run(w)
    with pytest.raises(error, match=match):
        sess.run(fetch, feed)
    np.testing.assert_array_equal(sess.run(w), before)  # a rejected run changes nothing


def test_bad_feeds_are_rejected_before_anything_runs(model) -> None:  # noqa: ANN001
    g, x, w, y, loss, train = model
    sess = cg.Session(g)
    good = np.ones((2, 3), np.float32)
    _bad(
        sess,
        [train],
        {x: np.ones((2, 4), np.float32)},
        cg.ShapeError,
        r"feed for 'x:0' \(test_session\.py:\d+\) has shape \(2, 4\), expected \(None, 3\)",
        w,
    )
    _bad(
        sess,
        [train],
        {x: good.astype(np.complex64)},
        cg.DTypeError,
        r"feed for 'x:0' \(test_session\.py:\d+\) has dtype complex64, expected float32",
        w,
    )
    _bad(
        sess,
        [train],
        {},
        cg.GraphError,
        r"placeholder 'x' \(test_session.py:\d+\) needs a value: pass it in feed_dict",
        w,
    )
    _bad(sess, [train], {"nope:0": good}, cg.GraphError, r"no node named 'nope' in this graph", w)
    other = cg.Graph()
    with other.as_default():
        z = cg.placeholder((1,), name="z")
    _bad(sess, [z], {x: good}, cg.GraphError, r"fetch 'z:0' is not in this session's graph", w)
    _bad(sess, [42], {x: good}, cg.GraphError, r"cannot fetch 42: fetch a Tensor, a node, or a name", w)


def test_int_feed_to_float_is_converted_but_float_to_int_is_not() -> None:
    g = cg.Graph()
    with g.as_default():
        f = cg.placeholder((2,), "float32", name="f")
        i = cg.placeholder((2,), "int32", name="i")
    sess = cg.Session(g)
    assert sess.run(f, {f: [1, 2]}).dtype == np.float32
    with pytest.raises(
        cg.DTypeError, match=r"feed for 'i:0' \(test_session\.py:\d+\) has dtype float64, expected int32"
    ):
        sess.run(i, {i: [1.5, 2.0]})


def test_a_bad_feed_names_the_cell_and_line_its_placeholder_was_made_in() -> None:
    # A notebook has many placeholders called x: the error says which one, as a node error does.
    g = cg.Graph()
    with g.as_default(), cg.cell_scope("cell-a", label="[3]"):
        x = cg.placeholder((None, 3), name="x")
    with pytest.raises(cg.ShapeError) as refused:
        cg.Session(g).run(x, {x: np.ones((2, 4), np.float32)})
    assert str(refused.value) == f"feed for 'x:0' (cell [3], line {x.node.line}) has shape (2, 4), expected (None, 3)"
    unplaced = cg.Graph()  # made by no user code that cellgraph can see: no location to give
    with unplaced.as_default():
        y = cg.placeholder((2,), name="y")
    y.node.file = y.node.line = None
    with pytest.raises(cg.ShapeError, match=r"^feed for 'y:0' has shape \(3,\), expected \(2,\)$"):
        cg.Session(unplaced).run(y, {y: np.ones(3, np.float32)})


def test_a_callable_checks_its_feeds_as_run_does() -> None:
    # make_callable's plan took any array: float64 data reached a float32 kernel and failed inside Numba, and a
    # (3, 1) column for a (3,) vector broadcast into a (3, 3) result without a word.
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((3,), name="x")
        y = x * cg.constant([1.0, 2.0, 3.0])
        z = cg.reduce_sum(cg.matmul(cg.reshape(x, (1, 3)), cg.constant(np.ones((3, 2), np.float32))))
    sess = cg.Session(g)
    plan = sess.make_callable([y, z], [x])
    wide = np.array([1.0, 2.0, 3.0])  # float64: cast, as run() casts it
    for got, want in zip(plan(wide), sess.run([y, z], {x: wide}), strict=True):
        np.testing.assert_array_equal(got, want)
        assert got.dtype == np.float32
    with pytest.raises(
        cg.ShapeError, match=r"^feed for 'x:0' \(test_session\.py:\d+\) has shape \(3, 1\), expected \(3,\)$"
    ):
        plan(np.ones((3, 1), np.float32))
    with pytest.raises(cg.ShapeError, match=r"has shape \(3, 1\), expected \(3,\)$"):
        plan.stream(lambda i, v: None, np.ones((3, 1), np.float32))
    with pytest.raises(cg.DTypeError, match=r"^feed for 'x:0' \(test_session\.py:\d+\) has dtype complex128"):
        plan(np.ones(3, np.complex128))
    with pytest.raises(cg.GraphError, match=r"^this plan takes 1 feed\(s\) \('x:0'\), got 2$"):
        plan(wide, wide)


def test_kernel_failure_names_the_node() -> None:
    g = cg.Graph()
    with g.as_default():
        a = cg.placeholder((None, 3), name="a")
        b = cg.placeholder((None, 3), name="b")
        c = a + b
    with pytest.raises(cg.ExecutionError, match=r"Add 'add' \(test_session.py:\d+\) failed while running: "):
        cg.Session(g).run(c, {a: np.ones((2, 3)), b: np.ones((4, 3))})


def test_training_reduces_the_loss(model) -> None:  # noqa: ANN001
    g, x, w, y, loss, train = model
    sess = cg.Session(g)
    feed = {x: np.random.default_rng(0).normal(size=(8, 3)).astype(np.float32)}
    first = sess.run(loss, feed)
    for _ in range(20):
        sess.run(train, feed)
    assert sess.run(loss, feed) < first * 0.1


def test_make_callable_matches_run(model) -> None:  # noqa: ANN001
    g, x, w, y, loss, train = model
    sess = cg.Session(g)
    xv = np.ones((2, 3), np.float32)
    fn = sess.make_callable([y, loss], [x])
    got = fn(xv)
    np.testing.assert_allclose(got[0], sess.run(y, {x: xv}))


def test_trace_reports_live_bytes_of_intermediates(model) -> None:  # noqa: ANN001
    g, x, w, y, loss, train = model
    sess = cg.Session(g)
    plan = sess.make_callable([loss], [x])
    xv = np.ones((64, 3), np.float32)
    (value,), peak = plan.trace(xv)
    np.testing.assert_allclose(value, sess.run(loss, {x: xv}))
    # y and its square are (64, 2) float32 each and live together at the square.
    assert peak == 2 * 64 * 2 * 4


def test_a_node_name_fetches_its_value_when_it_has_one() -> None:
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((2,), name="x")
        with g.name_scope("hidden"):
            k = cg.variable(np.array([1.0, 2.0], np.float32), name="kernel")
        y = cg.reduce_sum(x * k, name="y")
        train = cg.optim.SGD(0.5).minimize(y)
    sess = cg.Session(g)
    # The same string graph.tensor resolves: a value, never a silent None.
    np.testing.assert_array_equal(sess.run("hidden/kernel"), sess.run(g.tensor("hidden/kernel")))
    assert sess.run(["y", "hidden/kernel:0"], {"x": [1.0, 1.0]})[0] == 3.0
    # A node with no output (the training op) runs and fetches as None.
    assert sess.run(train.name, {x: [1.0, 1.0]}) is None
    np.testing.assert_array_equal(sess.run("hidden/kernel"), [0.5, 1.5])


def test_a_node_name_with_several_outputs_is_ambiguous() -> None:
    g = cg.Graph()
    with g.as_default():
        logits = cg.placeholder((None, 3), name="logits")
        labels = cg.placeholder((None,), "int32", name="labels")
        cg.losses.sparse_softmax_cross_entropy(logits, labels)
    feeds = {"logits": np.zeros((2, 3), np.float32), "labels": np.array([0, 1], np.int32)}
    message = "fetch 'xent' is ambiguous: SparseSoftmaxCrossEntropyWithLogits 'xent' ("
    with pytest.raises(cg.GraphError, match=re.escape(message)) as info:
        cg.Session(g).run("xent", feeds)
    assert str(info.value).endswith("has 2 outputs; fetch one of 'xent:0', 'xent:1'")
    assert cg.Session(g).run("xent:0", feeds).shape == (2,)


@pytest.mark.parametrize("order", ["fetches first", "train first"])
def test_every_read_of_a_variable_in_a_step_sees_one_value(order: str) -> None:
    # identity(w) is a view of w's buffer: copied at the end of the step, it showed the step's own update, where
    # w * 1 (a new array) and the partitioned session (a Send copies) showed the value before it.
    g = cg.Graph()
    with g.as_default():
        w = cg.variable(np.array([1.0, 2.0], np.float32), name="w")
        x = cg.placeholder((2,), "float32", name="x")
        train = cg.optim.SGD(0.5).minimize(cg.reduce_sum(w * x))
        reads = [cg.identity(w), w * 1.0, cg.reshape(w, (2, 1))]
    fetches = [*reads, train] if order == "fetches first" else [train, *reads]
    feed = {x: np.ones(2, np.float32)}
    placement = cg.placement.place(g, ["/job:worker/task:0/device:cpu:0", "/job:ps/task:0/device:cpu:0"])
    for sess in (cg.Session(g), cg.PartitionedSession(g, placement)):
        got = [v for v in sess.run(fetches, feed) if v is not None]
        for value in got:
            np.testing.assert_array_equal(np.ravel(value), [1.0, 2.0], err_msg=type(sess).__name__)
        np.testing.assert_array_equal(sess.run(w), [0.5, 1.5])  # one step of SGD(0.5) on a gradient of ones


def test_a_plan_with_no_feeds_streams_and_gates_its_fetches() -> None:
    """Its generated function once began ``def run(, _on):``, a SyntaxError (a partition holding only
    variables, a parameter server's, streamed with the rest of a step)."""
    g = cg.Graph()
    with g.as_default():
        w = cg.variable([1.0, 2.0], name="w")
        doubled = w * 2.0
    plan = cg.Session(g).make_callable([doubled, w], [])
    seen: list[int] = []
    streamed = plan.stream(lambda i, v: seen.append(i))
    assert sorted(seen) == [0, 1] and streamed[0].tolist() == [2.0, 4.0]
    gated = plan.stream_gated(lambda i, v: None, lambda i: None)
    assert gated[1].tolist() == [1.0, 2.0]


def test_a_partitioned_stream_hands_a_tensor_fetched_twice_over_once_at_each_position() -> None:
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((2,), name="x")
        halved = cg.mul(x, 0.5, name="halved")
    sess = cg.PartitionedSession(g, {n.name: "/job:worker/task:0/device:cpu:0" for n in g.nodes})
    handed: list[int] = []
    out = sess.stream([halved, halved], {x: np.ones(2, np.float32)}, lambda i, v: handed.append(i))
    assert sorted(handed) == [0, 1] and [v.tolist() for v in out] == [[0.5, 0.5], [0.5, 0.5]]
