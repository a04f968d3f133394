"""cg.optim.mixed_precision: float32 master weights, half compute, a dynamic loss scale that skips bad steps."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import cellgraph as cg
from cellgraph.examples import digits

from .errors_helpers import raises


def _mlp(
    mp: cg.optim.MixedPrecision | None, hidden: int = 64
) -> tuple[cg.Graph, cg.Tensor, cg.Tensor, cg.Node, cg.Tensor]:
    """The digits MLP (64 -> hidden ReLU -> 10) on float32 variables; with ``mp``, computed in its dtype."""
    g = cg.Graph()
    half = mp.cast if mp is not None else (lambda t, name="half": t)
    with g.as_default():
        x = cg.placeholder((None, 64), name="x")
        y = cg.placeholder((None,), "int32", name="y")
        w1 = cg.variable(cg.init.glorot_uniform, (64, hidden), name="w1", seed=1)
        b1 = cg.variable(cg.init.zeros, (hidden,), name="b1")
        w2 = cg.variable(cg.init.glorot_uniform, (hidden, 10), name="w2", seed=2)
        b2 = cg.variable(cg.init.zeros, (10,), name="b2")
        h = cg.relu(cg.matmul(half(x), half(w1)) + half(b1))
        logits = cg.cast(cg.matmul(h, half(w2)) + half(b2), "float32")
        loss = cg.reduce_mean(cg.sparse_softmax_cross_entropy(logits, y))
        train = cg.optim.Adam(1e-2).minimize(loss) if mp is None else mp.minimize(loss)
        correct = cg.cast(cg.equal(cg.argmax(logits, axis=1), y), "float32")
        accuracy = cg.reduce_mean(correct)
    return g, x, y, train, accuracy


def _train(mp: cg.optim.MixedPrecision | None) -> float:
    data = digits.load()
    g, x, y, train, accuracy = _mlp(mp)
    sess = cg.Session(g)
    order = np.random.default_rng(0).permutation
    for _epoch in range(8):
        idx = order(len(data.x_train))
        for start in range(0, len(idx), 64):
            batch = idx[start : start + 64]
            sess.run(train, {x: data.x_train[batch], y: data.y_train[batch]})
    return float(sess.run(accuracy, {x: data.x_test, y: data.y_test}))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_mixed_precision_trains_the_digits_mlp_as_well_as_float32(dtype: str) -> None:
    full = _train(None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", cg.optim.LossScaleWarning)  # the first steps may halve the scale
        mixed = _train(cg.optim.mixed_precision(cg.optim.Adam(1e-2), compute_dtype=dtype))
    assert full > 0.9
    assert abs(mixed - full) <= 0.01, (mixed, full)


def _overflowing(initial_scale: float, growth_interval: int = 2000) -> tuple[cg.Graph, cg.Tensor, cg.Node, cg.Tensor]:
    """w (float32) read as float16; the loss's gradient, times the scale, passes 65504 when x is large."""
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((2,), name="x")
        w = cg.variable([1.0, -1.0], name="w")
        mp = cg.optim.mixed_precision(cg.optim.Adam(0.1), initial_scale=initial_scale, growth_interval=growth_interval)
        loss = cg.reduce_sum(cg.cast(mp.cast(x) * mp.cast(w), "float32"))
        train = mp.minimize(loss)
    assert mp.loss_scale is not None
    return g, x, train, mp.loss_scale


def test_a_non_finite_gradient_skips_the_step_halves_the_scale_and_says_so() -> None:
    g, x, train, scale = _overflowing(1024.0)
    sess = cg.Session(g)
    sess.run(train, {x: np.array([1.0, 2.0], np.float32)})  # 2 * 1024: finite, applied
    before = sess.variable_values()
    assert before["w"].tolist() != [1.0, -1.0]
    with pytest.warns(cg.optim.LossScaleWarning) as caught:
        sess.run(train, {x: np.array([100.0, 1.0], np.float32)})  # 100 * 1024 > 65504: inf in float16
    (warning,) = caught
    assert str(warning.message) == (
        "mixed precision: step 2 skipped (a gradient is inf or NaN: float16 overflowed); "
        "the loss scale goes from 1024 to 512"
    )
    message = warning.message
    assert isinstance(message, cg.optim.LossScaleWarning)
    assert (message.step, message.previous, message.scale) == (2, 1024.0, 512.0)
    after = sess.variable_values()
    # The variable and every Adam slot (m, v, t) are as they were before the skipped step.
    for name, value in before.items():
        if "loss_scale" not in name:
            np.testing.assert_array_equal(after[name], value, err_msg=name)
    assert float(sess.run(scale)) == 512.0
    sess.run(train, {x: np.array([100.0, 1.0], np.float32)})  # 100 * 512 fits: applied
    assert sess.variable_values()["w"].tolist() != before["w"].tolist()


def test_the_scale_doubles_after_growth_interval_finite_steps() -> None:
    g, x, train, scale = _overflowing(4.0, growth_interval=3)
    sess = cg.Session(g)
    seen = []
    for _ in range(7):
        sess.run(train, {x: np.array([1.0, 2.0], np.float32)})
        seen.append(float(sess.run(scale)))
    assert seen == [4.0, 4.0, 8.0, 8.0, 8.0, 16.0, 16.0]


def test_global_step_counts_every_step_skipped_or_not() -> None:
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((1,), name="x")
        w = cg.variable([1.0], name="w")
        step = cg.variable(0, dtype="int64", name="global_step", trainable=False)
        mp = cg.optim.mixed_precision(cg.optim.SGD(0.1), initial_scale=1024.0)
        train = mp.minimize(cg.reduce_sum(cg.cast(mp.cast(x) * mp.cast(w), "float32")), global_step=step)
    sess = cg.Session(g)
    sess.run(train, {x: np.array([1.0], np.float32)})
    with pytest.warns(cg.optim.LossScaleWarning):
        sess.run(train, {x: np.array([1000.0], np.float32)})
    assert int(sess.run(step)) == 2
    np.testing.assert_allclose(sess.run(w), [0.9], rtol=1e-3)


def test_a_plain_optimizer_refuses_a_half_variable_and_points_to_mixed_precision() -> None:
    g = cg.Graph()
    with g.as_default():
        w = cg.variable([1.0, 2.0], dtype="float16", name="w")
        loss = cg.reduce_sum(cg.cast(w * w, "float32"))
        before = len(g.nodes)
        with raises(
            cg.DTypeError,
            "SGD: variable 'w' is float16; optimizers update float32 or float64 variables: keep it float32 and "
            "train with cg.optim.mixed_precision (float32 master weights, float16 compute)",
        ):
            cg.optim.SGD(0.1).minimize(loss)
        assert len(g.nodes) == before


def test_mixed_precision_refuses_a_half_loss_naming_it() -> None:
    g = cg.Graph()
    with g.as_default():
        w = cg.variable([1.0], name="w")
        mp = cg.optim.mixed_precision(cg.optim.SGD(0.1))
        loss = cg.reduce_sum(mp.cast(w), name="loss")
        before = len(g.nodes)
        with raises(
            cg.DTypeError,
            "mixed_precision(SGD): the loss 'loss:0' must be a float32 or float64 scalar, got float16 of shape (); "
            "cast the logits to float32 (cg.cast(logits, 'float32')) before the loss",
        ):
            mp.minimize(loss)
        assert len(g.nodes) == before


@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        ({"initial_scale": 0.0}, ValueError, "mixed_precision: initial_scale must be a finite number more than 0, got 0.0"),
        ({"initial_scale": float("inf")}, ValueError, "initial_scale must be a finite number more than 0, got inf"),
        ({"growth_interval": 0}, ValueError, "mixed_precision: growth_interval must be an int of at least 1, got 0"),
        ({"growth_interval": 2.5}, ValueError, "growth_interval must be an int of at least 1, got 2.5"),
        ({"compute_dtype": "int8"}, cg.DTypeError, "mixed_precision: compute_dtype must be float16 or bfloat16, got int8"),
    ],
)  # fmt: skip
def test_bad_settings_are_refused_with_their_words(
    kwargs: dict[str, object], error: type[Exception], words: str
) -> None:
    with raises(error, words):
        cg.optim.mixed_precision(cg.optim.SGD(0.1), **kwargs)  # type: ignore[arg-type]


def test_only_an_optimizer_can_be_wrapped() -> None:
    with raises(TypeError, "mixed_precision wraps a cg.optim optimizer, got float"):
        cg.optim.mixed_precision(0.1)  # type: ignore[arg-type]


def test_the_loss_scale_op_has_no_cuda_kernel_and_says_so() -> None:
    g, _, _, scale = _overflowing(8.0)
    node = next(n for n in g.nodes if n.op == "UpdateLossScale")
    assert "cuda" not in node.opdef.kernels
    assert node.opdef.stateful and scale.dtype == "float32"


def test_partitioned_mixed_precision_moves_half_tensors_as_they_are_and_trains_as_one_device() -> None:
    ps, worker = "/job:ps/task:0/device:cpu:0", "/job:worker/task:0/device:cpu:0"

    def run(partitioned: bool) -> tuple[np.ndarray, list[str]]:
        g, x, y, train, _ = _mlp(cg.optim.mixed_precision(cg.optim.Adam(1e-2)), hidden=16)
        if partitioned:
            # The state and the casts of the weights to float16 on the PS, a colocated node with its target (as
            # placement does), the rest on the worker: float16 tensors cross to the worker.
            places: dict[str, str] = {}
            for n in g.nodes:  # in creation order: a colocation target comes first
                target = n.attrs.get("_colocate")
                if n.opdef.stateful or n.name.startswith("half"):
                    places[n.name] = ps
                else:
                    places[n.name] = places[target] if target in places else worker
            sess: cg.Session | cg.PartitionedSession = cg.PartitionedSession(g, places, timeout=20)
            crossing = [e.tensor.dtype for e in cg.partition(g, places).edges]
        else:
            sess, crossing = cg.Session(g), []
        data = digits.load()
        for start in range(0, 192, 64):
            sess.run(train, {x: data.x_train[start : start + 64], y: data.y_train[start : start + 64]})
        return sess.run(g.tensor("w2:0")), crossing

    alone, _ = run(False)
    split, crossing = run(True)
    assert "float16" in crossing
    np.testing.assert_array_equal(split, alone)


def test_placement_over_two_ps_tasks_keeps_each_slot_with_its_variable_and_trains_as_one_device() -> None:
    # Mixed precision puts every slot back after a step it skips (an Assign of the slot): that made the slots
    # look like trained variables of their own, placed apart from theirs, and ApplyAdam got its m through a Recv.
    devices = ["/job:ps/task:0/device:cpu:0", "/job:ps/task:1/device:cpu:0", "/job:worker/task:0/device:cpu:0"]

    def run(partitioned: bool) -> dict[str, np.ndarray]:
        g, x, y, train, _ = _mlp(cg.optim.mixed_precision(cg.optim.Adam(1e-2)), hidden=16)
        sess: cg.Session | cg.PartitionedSession = cg.Session(g)
        if partitioned:
            placement = cg.placement.place(g, devices)
            for name in ("w1", "b1", "w2", "b2"):
                for slot in "mvt":
                    where = placement.device_of[f"mixed_precision_Adam/{name}/{slot}"]
                    assert where == placement.device_of[name], (name, slot)
            assert {placement.device_of[v] for v in ("w1", "b1", "w2", "b2")} == set(devices[:2])
            sess = cg.PartitionedSession(g, placement, timeout=20)
        data = digits.load()
        for start in range(0, 192, 64):
            sess.run(train, {x: data.x_train[start : start + 64], y: data.y_train[start : start + 64]})
        return {v: sess.run(g.tensor(f"{v}:0")) for v in ("w1", "b1", "w2", "b2")}

    alone, split = run(False), run(True)
    for name in alone:
        np.testing.assert_array_equal(split[name], alone[name])


def _train_op_names(split: bool, name: str | None = None) -> tuple[str, list[str]]:
    """The training op's name and every node name, from ``minimize`` or from compute_gradients + apply_gradients."""
    g = cg.Graph()
    with g.as_default():
        w = cg.variable([[3.0], [4.0]], name="w")
        mp = cg.optim.mixed_precision(cg.optim.Adam(0.1))
        loss = cg.reduce_sum(cg.cast(cg.matmul(mp.cast(cg.constant([[1.0, 1.0]])), mp.cast(w)), "float32"))
        train = mp.apply_gradients(mp.compute_gradients(loss), name=name) if split else mp.minimize(loss)
    return train.name, sorted(n.name for n in g.nodes)


def test_apply_gradients_builds_in_the_scope_of_compute_gradients() -> None:
    # A second scope of its own ("mixed_precision_Adam_1") showed in GraphView as a stray box beside the first.
    name, names = _train_op_names(split=True)
    assert name == "mixed_precision_Adam/update"
    assert (name, names) == _train_op_names(split=False)
    forward = {"w", "const", "half", "half_1", "matmul", "cast", "reduce_sum"}
    assert {n.split("/")[0] for n in names} - forward == {"mixed_precision_Adam"}


def test_apply_gradients_given_a_name_builds_the_update_under_it() -> None:
    # As the plain optimizer's apply_gradients(name=...): the update is the named scope's.
    name, names = _train_op_names(split=True, name="train")
    assert name == "train/update"
    assert any(n.startswith("train/apply_adam") for n in names)
