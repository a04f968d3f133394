"""A plan with an unfed training switch runs only the branch the switch's default takes (dataflow/switch_fold.py)."""

from __future__ import annotations

import numpy as np
import pytest

import cellgraph as cg
from cellgraph.dataflow.switch_fold import cannot_stretch, keep_shape

RNG = np.random.default_rng(7)


def _bn_model(default: bool = True) -> tuple[cg.Graph, cg.Tensor, cg.Tensor, cg.Tensor, list[cg.Tensor]]:
    """dense -> batch norm -> dropout -> sum of squares, on a switch; the gradients of every trainable
    variable and of the input."""
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((None, 4), "float32", name="x")
        training = cg.layers.training_switch(default)
        h = cg.layers.dense(x, 3, name="dense")
        h = cg.layers.batch_norm(h, training, momentum=0.5, name="bn")
        h = cg.layers.dropout(h, 0.5, seed=3, training=training, name="drop")
        loss = cg.reduce_sum(h * h, name="loss")
        wrt = [x] + [v.output(0) for v in g.variables() if v.attrs.get("trainable", True)]
        grads = cg.gradients(loss, wrt)
    return g, x, training, loss, grads


def _fresh_run(default: bool, feed_switch: bool | None, xs: np.ndarray) -> tuple[list[np.ndarray], list[str]]:
    """The loss and gradients of a new model's first run, and the ops of its plan."""
    g, x, training, loss, grads = _bn_model(default)
    sess = cg.Session(g)
    feeds = [x] if feed_switch is None else [x, training]
    plan = sess.make_callable([loss, *grads], feeds)
    values = [xs] if feed_switch is None else [xs, np.asarray(feed_switch)]
    return list(plan(*values)), [n.name for n in plan.order]


def test_unfed_switch_plans_only_the_training_branch() -> None:
    xs = RNG.normal(size=(6, 4)).astype(np.float32)
    _, folded = _fresh_run(True, None, xs)
    _, both = _fresh_run(True, True, xs)
    # Inference-mode batch norm is (x - moving_mean) * rsqrt(moving_variance + eps) * gamma + beta:
    # its rsqrt and sub exist only on the untaken branch, and its backward pass only on zeros.
    for name in ("bn/rsqrt", "bn/sub", "bn/where", "drop/output"):
        assert name in both and name not in folded
    assert not any(n.startswith("gradients/where") or n.startswith("gradients/zeros_like") for n in folded)
    assert len(folded) < len(both) - 15


def test_unfed_inference_default_plans_only_the_inference_branch() -> None:
    g, x, _, loss, _ = _bn_model(default=False)
    folded = [n.name for n in cg.Session(g).make_callable([loss], [x]).order]
    assert "bn/output_fused" not in folded and "drop/dropout" not in folded
    assert "bn/rsqrt" in folded


@pytest.mark.parametrize("default", [True, False])
def test_folded_gradients_equal_the_unfolded_ones(default: bool) -> None:
    xs = RNG.normal(size=(6, 4)).astype(np.float32)
    folded, _ = _fresh_run(default, None, xs)
    fed, _ = _fresh_run(default, default, xs)  # fed: both branches run, as before folding
    for a, b in zip(folded, fed, strict=True):
        np.testing.assert_array_equal(a, b)


def test_feeding_the_switch_gives_both_modes_as_numpy() -> None:
    g, x, training, loss, _ = _bn_model()
    y = g.node("bn/output").output(0)
    sess = cg.Session(g)
    xs = RNG.normal(size=(8, 4)).astype(np.float32)
    kernel, bias = (sess.variable_values()[f"dense/{n}"] for n in ("kernel", "bias"))
    h = xs @ kernel + bias
    trained = sess.run(y, {x: xs, training: True})
    mean, var = h.mean(0), h.var(0)
    np.testing.assert_allclose(trained, (h - mean) / np.sqrt(var + 1e-3), rtol=1e-4, atol=1e-5)
    # The training run moved the moving statistics halfway (momentum 0.5) from (0, 1).
    evaluated = sess.run(y, {x: xs, training: False})
    np.testing.assert_allclose(evaluated, (h - mean / 2) / np.sqrt((1 + var) / 2 + 1e-3), rtol=1e-4, atol=1e-5)
    # Unfed, the switch is True: the training normalization, and the moving statistics move again.
    np.testing.assert_allclose(sess.run(y, {x: xs}), trained, rtol=1e-6)
    np.testing.assert_allclose(sess.variable_values()["bn/moving_mean"], mean * 0.75, rtol=1e-5, atol=1e-6)


def test_fetching_a_folded_where_returns_a_copy_of_its_branch() -> None:
    g = cg.Graph()
    with g.as_default():
        a = cg.placeholder((3,), "float32", name="a")
        training = cg.layers.training_switch()
        y = cg.where(training, a * 2.0, a, name="y")
    plan = cg.Session(g).make_callable([y, g.node("mul").output(0)], [a])
    assert [n.op for n in plan.order] == ["Const", "Mul"]
    first, second = plan(np.ones(3, np.float32))
    np.testing.assert_array_equal(first, [2.0, 2.0, 2.0])
    assert first is not second


def test_a_fed_where_or_switch_is_never_folded() -> None:
    g = cg.Graph()
    with g.as_default():
        a = cg.placeholder((3,), "float32", name="a")
        training = cg.layers.training_switch()
        y = cg.where(training, a * 2.0, a - 1.0, name="y")
    sess = cg.Session(g)
    ones = np.ones(3, np.float32)
    np.testing.assert_array_equal(sess.run(y, {a: ones, training: False}), [0.0, 0.0, 0.0])
    np.testing.assert_array_equal(sess.run(y * 1.0, {a: ones, y: [5.0, 5.0, 5.0]}), [5.0, 5.0, 5.0])


def test_a_broadcasting_where_keeps_both_branches() -> None:
    g = cg.Graph()
    with g.as_default():
        a = cg.placeholder((3,), "float32", name="a")
        training = cg.layers.training_switch()
        y = cg.where(training, cg.constant(1.0), a, name="y")  # the taken branch is broadcast to (3,)
    plan = cg.Session(g).make_callable([y], [a])
    assert "Where" in [n.op for n in plan.order]
    np.testing.assert_array_equal(plan(np.zeros(3, np.float32))[0], [1.0, 1.0, 1.0])


def test_adds_of_zeros_keep_their_operands_shapes() -> None:
    # The where broadcasts p (batch 1) against q (batch 5): p's gradient from it is zeros of the where's
    # shape summed to p's, and the add that accumulates them must keep p's (1, 3).
    g = cg.Graph()
    with g.as_default():
        p = cg.placeholder((None, 3), "float32", name="p")
        q = cg.placeholder((None, 3), "float32", name="q")
        training = cg.layers.training_switch(False)
        y = cg.where(training, p, q, name="y")
        loss = cg.reduce_sum(y) + cg.reduce_sum(p * 3.0)
        dp, dq = cg.gradients(loss, [p, q])
    sess = cg.Session(g)
    ps, qs = np.ones((1, 3), np.float32), np.ones((5, 3), np.float32)
    got = sess.run([dp, dq], {p: ps, q: qs})
    want = sess.run([dp, dq], {p: ps, q: qs, training: False})
    for a, b in zip(got, want, strict=True):
        assert a.shape == b.shape
        np.testing.assert_array_equal(a, b)
    assert got[0].shape == (1, 3) and got[1].shape == (5, 3)


def test_keep_shape_and_cannot_stretch() -> None:
    x = np.arange(3, dtype=np.float32)
    assert keep_shape(x, np.zeros(3)) is x
    np.testing.assert_array_equal(keep_shape(x, np.zeros((2, 1))), np.broadcast_to(x, (2, 3)))
    with pytest.raises(ValueError, match="cannot be broadcast"):
        keep_shape(x, np.zeros(4))
    assert cannot_stretch((3,), (None, 3)) and cannot_stretch((1, 3), (5, 3)) and cannot_stretch((), (None,))
    assert not cannot_stretch((None, 3), (None, 3)) and not cannot_stretch((2, 3), (3,))


def test_an_optimizer_step_waits_only_for_the_taken_gradients() -> None:
    # minimize() makes every update wait for all gradients (gradients_ready): a folded gradient add
    # stands for the node computing its value, so the untaken backward pass stays out of the step.
    xs = RNG.normal(size=(6, 4)).astype(np.float32)
    after = []
    for feed_switch in (None, True):
        g, x, training, loss, _ = _bn_model()
        with g.as_default():
            train = cg.optim.SGD(0.1).minimize(loss)
        sess = cg.Session(g)
        feeds = [x] if feed_switch is None else [x, training]
        plan = sess.make_callable([train, loss], feeds)
        plan(*([xs] if feed_switch is None else [xs, np.asarray(True)]))
        ops = [n.op for n in plan.order]
        assert ("ZerosLike" in ops) == (feed_switch is not None) and ("Rsqrt" in ops) == (feed_switch is not None)
        after.append(sess.variable_values())
    for name, value in after[0].items():
        np.testing.assert_array_equal(value, after[1][name], err_msg=name)


@pytest.mark.cuda
def test_a_cuda_plan_folds_the_switch_and_gives_the_cpu_plans_gradients() -> None:
    # A GPU plan folds wheres and the adds of zeros static shapes prove; keep_shape (NumPy) is CPU-only.
    from numba import cuda

    from cellgraph.dataflow.executor import Plan
    from cellgraph.dataflow.variables import VariableStore

    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((4, 3), "float32", name="x")
        training = cg.layers.training_switch()
        y = cg.where(training, x * 2.0, cg.sqrt(x * x + 1.0), name="y")
        (dx,) = cg.gradients(cg.reduce_sum(y * y), [x])
    xs = RNG.normal(size=(4, 3)).astype(np.float32)
    plan = Plan(g, [dx], [], [x], VariableStore(), device="cuda")
    assert "Sqrt" not in [n.op for n in plan.order] and not plan.folding.guarded
    (got,) = plan(cuda.to_device(xs))
    np.testing.assert_allclose(got.copy_to_host(), 8.0 * xs, rtol=1e-6)


def test_partitions_keep_every_send_received() -> None:
    # The untaken branch on one device feeds the where on another: its value is sent whatever the switch,
    # so the receiving partition must receive it too, or the next fed run would read a stale value.
    ps, worker = "/job:ps/task:0/device:cpu:0", "/job:worker/task:0/device:cpu:0"
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((3,), "float32", name="x")
        training = cg.layers.training_switch()
        taken = x * 2.0
        untaken = x + 100.0
        y = cg.where(training, taken, untaken, name="y")
    placement = {n.name: ps if n is untaken.node else worker for n in g.nodes}
    sess = cg.PartitionedSession(g, placement, timeout=20)
    ones = np.ones(3, np.float32)
    for _ in range(2):
        np.testing.assert_array_equal(sess.run(y, {x: ones}), [2.0, 2.0, 2.0])
    np.testing.assert_array_equal(sess.run(y, {x: ones * 3, training: False}), [103.0, 103.0, 103.0])
    assert all(q.empty() for q in sess.transport._queues.values())


def test_a_state_change_on_the_untaken_branch_still_happens() -> None:
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((), "float32", name="x")
        counter = cg.variable(0.0, name="counter")
        training = cg.layers.training_switch()
        y = cg.where(training, x * 2.0, cg.assign_add(counter, 1.0) + x, name="y")
    sess = cg.Session(g)
    assert sess.run(y, {x: 1.0}) == 2.0
    assert sess.run(y, {x: 1.0, training: False}) == 3.0
    assert sess.variable_values()["counter"] == 2.0


def test_an_add_of_zeros_shaped_like_its_other_operand_folds_without_a_check() -> None:
    # p's gradient from the where is zeros shaped by p (unknown batch); the other, from p * 3, is an
    # elementwise op of p with a scalar: the same run-time shape, so the add is p's gradient outright.
    g = cg.Graph()
    with g.as_default():
        p = cg.placeholder((None, 3), "float32", name="p")
        training = cg.layers.training_switch(False)
        y = cg.where(training, p * 5.0, cg.sqrt(p * p + 1.0), name="y")
        loss = cg.reduce_sum(y) + cg.reduce_sum(p * 3.0)
        (dp,) = cg.gradients(loss, [p])
    plan = cg.Session(g).make_callable([dp], [p])
    assert not plan.folding.guarded
    ps = RNG.normal(size=(4, 3)).astype(np.float32)
    np.testing.assert_allclose(plan(ps)[0], ps / np.sqrt(ps * ps + 1.0) + 3.0, rtol=1e-6)
