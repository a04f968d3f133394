"""ops/normalization.py: layer_norm and batch_norm errors in the words a user reads, the
moving statistics a training step updates, inference, and the training switch as a tensor."""

from __future__ import annotations

import numpy as np
import pytest

import cellgraph as cg
from cellgraph.dataflow.ops.base import apply_node
from cellgraph.dataflow.ops.normalization import fused_batch_norm

from .errors_helpers import ph, raises

pytestmark = pytest.mark.usefixtures("fresh_graph")

X = np.random.default_rng(5).normal(1.5, 2.0, (8, 3)).astype(np.float32)


def _run(fetches, feeds=None):  # noqa: ANN001, ANN202
    return cg.Session(cg.get_default_graph()).run(fetches, feeds or {})


def _moving(channels: int = 3) -> tuple[cg.Tensor, cg.Tensor]:
    mean = cg.variable(np.zeros(channels, np.float32), name="moving_mean", trainable=False)
    var = cg.variable(np.ones(channels, np.float32), name="moving_variance", trainable=False)
    return mean, var


# ------------------------------------------------------------ layer_norm errors
@pytest.mark.parametrize(
    ("build", "error", "words"),
    [
        (lambda x, i: cg.layer_norm(x, np.ones(4, np.float32), np.zeros(4, np.float32), begin_axis=2),
         cg.ShapeError, "LayerNorm 'layer_norm'"),
        (lambda x, i: cg.layer_norm(x, np.ones(4, np.float32), np.zeros(4, np.float32), begin_axis=2),
         cg.ShapeError, "begin_axis 2 is out of range for shape (3, 4)"),
        (lambda x, i: cg.layer_norm(x, np.ones(3, np.float32), np.zeros(4, np.float32)),
         cg.ShapeError, "gamma has shape (3,), expected (4,)"),
        (lambda x, i: cg.layer_norm(x, np.ones((3, 4), np.float32), np.zeros(4, np.float32), begin_axis=0),
         cg.ShapeError, "beta has shape (4,), expected (3, 4)"),
        (lambda x, i: cg.layer_norm(i, [1, 1, 1, 1], [0, 0, 0, 0]),
         cg.DTypeError, "expects float tensors, got int32"),
        (lambda x, i: cg.layer_norm(x, np.ones(4, np.float32), np.zeros(4, np.float32), epsilon=-1.0),
         ValueError, "layer_norm: epsilon must be 0 or more, got -1.0"),
        (lambda x, i: cg.layer_norm(x, np.ones(4, np.float32), np.zeros(4, np.float32), begin_axis=(0, 1)),
         TypeError, "layer_norm: begin_axis must be one int, got (0, 1)"),
    ],
)  # fmt: skip
def test_layer_norm_errors(build, error, words) -> None:  # noqa: ANN001
    x, i = ph(3, 4), ph(3, 4, dtype="int32", name="i")
    before = len(cg.get_default_graph().nodes)
    with raises(error, words):
        build(x, i)
    assert len(cg.get_default_graph().nodes) == before


def test_layer_norm_with_a_gamma_of_another_dtype_names_the_dtypes() -> None:
    gamma = ph(4, dtype="float64", name="gamma")
    with raises(cg.DTypeError, "operands have different dtypes: float32, float64, float32"):
        cg.layer_norm(ph(3, 4), gamma, np.zeros(4, np.float32))


def test_layer_norm_of_constant_rows_with_epsilon_zero_is_nan_as_numpy_says() -> None:
    x = ph(2, 3)
    y = cg.layer_norm(x, np.ones(3, np.float32), np.zeros(3, np.float32), epsilon=0.0)
    assert np.isnan(_run(y, {x: np.full((2, 3), 2.0, np.float32)})).all()


def test_layer_norm_gradient_is_one_fused_op() -> None:
    x = ph(4, 3)
    gamma = cg.variable(np.ones(3, np.float32), name="gamma")
    loss = cg.reduce_sum(cg.layer_norm(x, gamma, np.zeros(3, np.float32)) * np.arange(3, dtype=np.float32))
    dx, dgamma = cg.gradients(loss, [x, gamma])
    assert dx.node is dgamma.node and dx.node.op == "LayerNormGrad"


# ------------------------------------------------------------ batch_norm errors
@pytest.mark.parametrize(
    ("build", "error", "words"),
    [
        (lambda x, m, v: cg.batch_norm(x, np.ones(3, np.float32), np.zeros(3, np.float32), m, v, True, axis=2),
         cg.ShapeError, "batch_norm: axis 2 is out of range for shape (None, 3)"),
        (lambda x, m, v: cg.batch_norm(x, np.ones(4, np.float32), np.zeros(3, np.float32), m, v, True),
         cg.ShapeError, "batch_norm: gamma has shape (4,), expected (3,) (the channels of (None, 3))"),
        (lambda x, m, v: cg.batch_norm(x, np.ones(3, np.float32), np.zeros(3, np.float32), np.zeros(3), v, True),
         TypeError, "batch_norm: moving_mean must be a variable (its value is updated in training)"),
        (lambda x, m, v: cg.batch_norm(x, np.ones(3, np.float32), np.zeros(3, np.float32), m, v, True, momentum=1.5),
         ValueError, "batch_norm: momentum must be in [0, 1], got 1.5"),
        (lambda x, m, v: cg.batch_norm(x, np.ones(3, np.float32), np.zeros(3, np.float32), m, v, ph(dtype="int32")),
         TypeError, "batch_norm: training must be a bool or a scalar bool tensor, got int32 ()"),
        (lambda x, m, v: cg.batch_norm(cg.cast(x, "int32"), [1, 1, 1], [0, 0, 0], m, v, True),
         cg.DTypeError, "batch_norm: expects a float tensor, got int32"),
    ],
)  # fmt: skip
def test_batch_norm_errors(build, error, words) -> None:  # noqa: ANN001
    x = ph(None, 3)
    m, v = _moving()
    with raises(error, words):
        build(x, m, v)


# ------------------------------------------------------------ batch_norm semantics
def test_training_normalizes_with_the_batch_and_moves_the_moving_statistics() -> None:
    x = ph(None, 3)
    m, v = _moving()
    gamma, beta = np.array([1.0, 2.0, 0.5], np.float32), np.array([0.0, 1.0, -1.0], np.float32)
    y = cg.batch_norm(x, gamma, beta, m, v, training=True, momentum=0.9)
    sess = cg.Session(cg.get_default_graph())
    got = sess.run(y, {x: X})
    want = (X - X.mean(0)) / np.sqrt(X.var(0) + 1e-3) * gamma + beta
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(sess.run(m), 0.1 * X.mean(0), rtol=1e-5)
    np.testing.assert_allclose(sess.run(v), 0.9 + 0.1 * X.var(0), rtol=1e-5)
    sess.run(y, {x: X})  # a second step moves them again
    np.testing.assert_allclose(sess.run(m), 0.19 * X.mean(0), rtol=1e-5)


def test_inference_uses_the_moving_statistics_and_changes_nothing() -> None:
    x = ph(None, 3)
    m = cg.variable(np.array([1.0, 2.0, 3.0], np.float32), name="moving_mean", trainable=False)
    v = cg.variable(np.array([4.0, 1.0, 0.25], np.float32), name="moving_variance", trainable=False)
    y = cg.batch_norm(x, np.ones(3, np.float32), np.zeros(3, np.float32), m, v, training=False, epsilon=0.0)
    sess = cg.Session(cg.get_default_graph())
    np.testing.assert_allclose(sess.run(y, {x: X}), (X - [1.0, 2.0, 3.0]) / np.sqrt([4.0, 1.0, 0.25]), rtol=1e-5)
    np.testing.assert_array_equal(sess.run(m), [1.0, 2.0, 3.0])
    assert not [n for n in cg.get_default_graph().nodes if n.op == "Assign"]


def test_a_training_switch_tensor_serves_training_and_evaluation_in_one_graph() -> None:
    x, training = ph(None, 3), ph(dtype="bool", name="training")
    m, v = _moving()
    y = cg.batch_norm(x, np.ones(3, np.float32), np.zeros(3, np.float32), m, v, training=training, momentum=0.5)
    sess = cg.Session(cg.get_default_graph())
    evaluated = sess.run(y, {x: X, training: False})
    np.testing.assert_allclose(evaluated, X / np.sqrt(1.0 + 1e-3), rtol=1e-5)
    np.testing.assert_array_equal(sess.run(m), np.zeros(3))  # evaluation moved nothing
    trained = sess.run(y, {x: X, training: True})
    np.testing.assert_allclose(trained, (X - X.mean(0)) / np.sqrt(X.var(0) + 1e-3), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(sess.run(m), 0.5 * X.mean(0), rtol=1e-5)


def test_a_training_step_trains_gamma_and_updates_the_moving_mean() -> None:
    x = ph(None, 3)
    m, v = _moving()
    gamma = cg.variable(np.ones(3, np.float32), name="gamma")
    beta = cg.variable(np.zeros(3, np.float32), name="beta")
    y = cg.batch_norm(x, gamma, beta, m, v, training=True)
    loss = cg.reduce_mean(cg.square(y - 2.0))
    step = cg.optim.SGD(0.1).minimize(loss)
    sess = cg.Session(cg.get_default_graph())
    first = sess.run(loss, {x: X})
    for _ in range(5):
        sess.run([step, loss], {x: X})
    assert sess.run(loss, {x: X}) < first
    assert not np.allclose(sess.run(m), 0.0)
    assert not np.allclose(sess.run(beta), 0.0)  # and beta, trained


# ------------------------------------------------------------ cg.layers
def test_the_batch_norm_layer_makes_its_variables_and_trains_only_gamma_and_beta() -> None:
    x, labels = ph(None, 4, 4, 2), ph(None, dtype="int32", name="labels")
    training = ph(dtype="bool", name="training")
    h = cg.layers.batch_norm(cg.layers.conv2d(x, 3, 3, name="conv"), training=training)
    logits = cg.layers.dense(cg.layers.flatten(cg.relu(h)), 2)
    loss = cg.reduce_mean(cg.sparse_softmax_cross_entropy(logits, labels))
    g = cg.get_default_graph()
    names = {n.name: n.attrs.get("trainable", True) for n in g.nodes if n.op == "Variable"}
    assert {k: v for k, v in names.items() if k.startswith("batch_norm/")} == {
        "batch_norm/gamma": True,
        "batch_norm/beta": True,
        "batch_norm/moving_mean": False,
        "batch_norm/moving_variance": False,
    }
    step = cg.optim.SGD(0.5).minimize(loss)
    rng = np.random.default_rng(6)
    data = rng.normal(size=(16, 4, 4, 2)).astype(np.float32)
    target = (data[:, :, :, 0].sum(axis=(1, 2)) > 0).astype(np.int32)
    sess = cg.Session(g)
    before = sess.run(loss, {x: data, labels: target, training: False})
    for _ in range(20):
        sess.run([step, loss], {x: data, labels: target, training: True})
    moving = sess.run(g.node("batch_norm/moving_mean").output(0))
    assert not np.allclose(moving, 0.0)
    frozen = sess.run(loss, {x: data, labels: target, training: False})
    np.testing.assert_array_equal(sess.run(g.node("batch_norm/moving_mean").output(0)), moving)
    assert frozen < before


def test_the_layer_norm_layer_normalizes_the_last_axes() -> None:
    x = ph(None, 3, 4)
    y = cg.layers.layer_norm(x, begin_axis=1)
    g = cg.get_default_graph()
    assert g.node("layer_norm/gamma").specs[0].shape == (3, 4)
    data = np.random.default_rng(7).normal(3.0, 2.0, (2, 3, 4)).astype(np.float32)
    got = _run(y, {x: data})
    want = (data - data.mean((1, 2), keepdims=True)) / np.sqrt(data.var((1, 2), keepdims=True) + 1e-5)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    ("build", "words"),
    [
        (lambda x: cg.layers.batch_norm(x, True), "batch_norm layer 'batch_norm' needs a known channel axis -1, got (2, None)"),
        (lambda x: cg.layers.batch_norm(x, True, axis=3), "batch_norm layer 'batch_norm' needs a known channel axis 3, got (2, None)"),
        (lambda x: cg.layers.layer_norm(x, name="ln"), "layer_norm layer 'ln' needs known sizes from axis -1 on, got (2, None)"),
        (lambda x: cg.layers.layer_norm(x, begin_axis=-3), "layer_norm layer 'layer_norm' needs known sizes from axis -3 on"),
    ],
)  # fmt: skip
def test_normalization_layers_need_known_sizes_and_add_nothing_when_refused(build, words) -> None:  # noqa: ANN001
    x = ph(2, None)
    before = len(cg.get_default_graph().nodes)
    with raises(cg.ShapeError, words):
        build(x)
    assert len(cg.get_default_graph().nodes) == before


# ---------------------------------------------------------------------- run-time shapes
def _layer_norm_grad(dy, x, gamma):  # noqa: ANN001, ANN202
    return apply_node("LayerNormGrad", [dy, x, gamma], {"axis": -1, "begin_axis": 1, "epsilon": 1e-3}).output(0)


def _batch_norm_grad(dy, x, gamma, mean, var):  # noqa: ANN001, ANN202
    return apply_node(
        "BatchNormGrad", [dy, x, gamma, mean, var], {"axis": 1, "channel_axis": 1, "epsilon": 1e-3}
    ).output(0)


RUN_TIME_SHAPES = [
    ("layer_norm", lambda x, g, b: cg.layer_norm(x, g, b), [(2, 3), (1,), (3,)],
     "LayerNorm 'layer_norm'", "gamma has shape (1,) but x (2, 3) is normalized over (3,)"),
    ("layer_norm-beta", lambda x, g, b: cg.layer_norm(x, g, b), [(2, 3), (3,), (4,)],
     "LayerNorm 'layer_norm'", "beta has shape (4,) but x (2, 3) is normalized over (3,)"),
    ("layer_norm_grad", _layer_norm_grad, [(2, 3), (2, 3), (2,)],
     "LayerNormGrad", "gamma has shape (2,) but x (2, 3) is normalized over (3,)"),
    ("layer_norm_grad-dy", _layer_norm_grad, [(1, 3), (2, 3), (3,)],
     "LayerNormGrad", "dy has shape (1, 3) but x has (2, 3)"),
    ("batch_norm", lambda x, g, b: fused_batch_norm(x, g, b)[0], [(4, 3), (1,), (3,)],
     "FusedBatchNorm", "gamma has shape (1,) but x (4, 3) has 3 channels"),
    ("batch_norm_grad", _batch_norm_grad, [(4, 3), (4, 3), (3,), (3,), (2,)],
     "BatchNormGrad", "variance has shape (2,) but x (4, 3) has 3 channels"),
]  # fmt: skip


@pytest.mark.parametrize(("build", "shapes", "node", "words"), [r[1:] for r in RUN_TIME_SHAPES],
                         ids=[r[0] for r in RUN_TIME_SHAPES])  # fmt: skip
def test_a_per_channel_input_of_another_run_time_shape_fails_the_run(build, shapes, node, words) -> None:  # noqa: ANN001
    """Unknown dims pass the shape rules, and the kernels read gamma, beta and the statistics by x's shape: a
    (1,) gamma for 3 features gave what memory held past its end (3.7e-322) without a word."""
    feeds = {ph(*(None,) * len(s), dtype="float64", name=f"in{i}"): np.ones(s) for i, s in enumerate(shapes)}
    out = build(*feeds)
    with pytest.raises(cg.ExecutionError) as err:
        _run(out, feeds)
    assert node in str(err.value) and f"failed while running: ValueError: {words}" in str(err.value)
