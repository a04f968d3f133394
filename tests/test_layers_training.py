"""The training switch: ``cg.placeholder_with_default`` and ``cg.layers.training_switch``, taken by the dropout
and batch_norm layers so that one graph trains (nothing fed) and evaluates (``False`` fed)."""

from __future__ import annotations

import numpy as np

import cellgraph as cg

from .dataflow.errors_helpers import ph, raises

RNG = np.random.default_rng(7)


def test_placeholder_with_default_passes_on_its_default_unless_fed() -> None:
    g = cg.Graph()
    default = RNG.normal(size=(2, 3)).astype(np.float32)
    with g.as_default():
        x = cg.placeholder_with_default(default, (None, 3), name="x")
        y = x * 2.0
    assert x.shape == (None, 3) and x.dtype == "float32" and x.node.op == "PlaceholderWithDefault"
    sess = cg.Session(g)
    np.testing.assert_array_equal(sess.run(y), default * 2)
    fed = RNG.normal(size=(5, 3)).astype(np.float32)  # another batch size: the relaxed dim takes it
    np.testing.assert_array_equal(sess.run(y, {x: fed}), fed * 2)
    np.testing.assert_array_equal(sess.run(y), default * 2)  # a feed lasts one run


def test_placeholder_with_default_gradient_reaches_the_default() -> None:
    g = cg.Graph()
    with g.as_default():
        v = cg.variable(np.array([1.0, 2.0], np.float32), name="v")
        x = cg.placeholder_with_default(v * 3.0)
        (d_v,) = cg.gradients(cg.reduce_sum(x * x), [v])
    # d/dv sum((3v)^2) = 18 v
    np.testing.assert_allclose(cg.Session(g).run(d_v), [18.0, 36.0])


def test_placeholder_with_default_errors() -> None:
    g = cg.Graph()
    with g.as_default():
        with raises(cg.ShapeError, "the default has shape (2, 3), expected (None, 4)"):
            cg.placeholder_with_default(np.zeros((2, 3), np.float32), (None, 4), name="x")
        with raises(cg.ShapeError, "placeholder_with_default 'y': negative dimension in shape (-2,)"):
            cg.placeholder_with_default(np.zeros(2, np.float32), (-2,), name="y")
    assert g.nodes == []
    with g.as_default():
        x = cg.placeholder_with_default(np.zeros((2, 3), np.float32), (None, 3), name="x")
    with raises(cg.ShapeError, f"feed for 'x:0' ({x.node.where()}) has shape (2, 4), expected (None, 3)"):
        cg.Session(g).run(x, {x: np.zeros((2, 4), np.float32)})


def test_training_switch_is_a_scalar_bool_with_a_default() -> None:
    g = cg.Graph()
    with g.as_default():
        on, off = cg.layers.training_switch(), cg.layers.training_switch(False, name="evaluating")
        with raises(cg.GraphError, "training_switch 'training': default must be True or False, got 1"):
            cg.layers.training_switch(1)  # type: ignore[arg-type]
    assert on.name == "training:0" and on.shape == () and on.dtype == "bool"
    sess = cg.Session(g)
    assert sess.run(on) and not sess.run(off) and sess.run(off, {off: True})


def test_dropout_drops_in_training_and_passes_through_when_fed_false() -> None:
    g = cg.Graph()
    x_value = np.ones((64, 32), np.float32)
    with g.as_default():
        training = cg.layers.training_switch()
        x = cg.placeholder((None, 32), name="x")
        y = cg.layers.dropout(x, 0.5, training=training)
        off = cg.layers.dropout(x, 0.5, training=False, name="off")
        loss = cg.reduce_sum(y * 3.0)
        (d_x,) = cg.gradients(loss, [x])
    sess = cg.Session(g)
    dropped, grad = sess.run([y, d_x], {x: x_value})
    assert set(np.unique(dropped)) == {0.0, 2.0} and 0.3 < (dropped == 0).mean() < 0.7
    np.testing.assert_array_equal(grad, dropped * 3.0)  # the gradient goes through the same mask
    evaluated, grad = sess.run([y, d_x], {x: x_value, training: False})
    np.testing.assert_array_equal(evaluated, x_value)
    np.testing.assert_array_equal(grad, np.full_like(x_value, 3.0))
    assert off is x  # training=False builds nothing


def test_dropout_rejects_a_training_that_is_not_a_scalar_bool() -> None:
    g = cg.Graph()
    with g.as_default():
        x = ph(None, 4)
        with raises(TypeError, "dropout layer 'drop': training must be a bool or a scalar bool tensor, got int32 ()"):
            cg.layers.dropout(x, 0.5, training=ph(dtype="int32", name="flag"), name="drop")
        with raises(TypeError, "dropout layer 'dropout': training must be a bool or a scalar bool tensor, got 'yes'"):
            cg.layers.dropout(x, 0.5, training="yes")  # type: ignore[arg-type]
    assert [n.op for n in g.nodes] == ["Placeholder", "Placeholder"]


def test_batch_norm_layer_trains_by_default_and_evaluates_with_the_switch_fed_false() -> None:
    g = cg.Graph()
    x_value = RNG.normal(3.0, 2.0, size=(32, 4)).astype(np.float32)
    with g.as_default():
        training = cg.layers.training_switch()
        x = cg.placeholder((None, 4), name="x")
        y = cg.layers.batch_norm(x, training=training, momentum=0.5, epsilon=0.0)
    sess = cg.Session(g)
    moving_mean = g.node("batch_norm/moving_mean").output(0)
    normalized = sess.run(y, {x: x_value})
    np.testing.assert_allclose(normalized.mean(axis=0), 0.0, atol=1e-5)
    np.testing.assert_allclose(sess.run(moving_mean), 0.5 * x_value.mean(axis=0), rtol=1e-5)
    # The biased batch variance (n, as Keras and ONNX), not PyTorch's unbiased one (n - 1): the docstring says so.
    moving_variance = g.node("batch_norm/moving_variance").output(0)
    np.testing.assert_allclose(sess.run(moving_variance), 0.5 + 0.5 * x_value.var(axis=0, ddof=0), rtol=1e-5)
    # Evaluation: the moving statistics normalize, and stay as they were.
    before = sess.run(moving_mean)
    evaluated = sess.run(y, {x: x_value, training: False})
    moving_var = sess.run(g.node("batch_norm/moving_variance").output(0))
    np.testing.assert_allclose(evaluated, (x_value - before) / np.sqrt(moving_var), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(sess.run(moving_mean), before)


def test_the_switch_survives_a_graphdef_round_trip_as_a_cluster_ships_it() -> None:
    g = cg.Graph()
    with g.as_default():
        cg.layers.training_switch()
        cg.placeholder_with_default(np.zeros((2, 3), np.float32), (None, 3), name="x")
    g2 = cg.from_graphdef(cg.to_graphdef(g))
    training, x = g2.tensor("training:0"), g2.tensor("x:0")
    assert training.shape == () and x.shape == (None, 3)
    sess = cg.Session(g2)
    assert sess.run(training) and not sess.run(training, {training: False})
    np.testing.assert_array_equal(sess.run(x, {x: np.ones((4, 3), np.float32)}), np.ones((4, 3)))
