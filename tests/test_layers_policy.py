"""Dtype policies of the layers (``cg.layers.policy``), half inputs without one, half batch norm and losses,
mixed precision's compute/apply split, saving and exporting a policy model; every new refusal with its words.
Training against torch is in ``tests/oracle/test_mixed_precision_models.py``."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable

import numpy as np
import pytest

import cellgraph as cg
from cellgraph.dataflow.dtypes import DTYPES

from .dataflow.errors_helpers import ph, raises

LAYERS: dict[str, tuple[tuple[int | None, ...], Callable[[cg.Tensor], cg.Tensor]]] = {
    "dense": ((None, 4), lambda x: cg.layers.dense(x, 3)),
    "conv2d": ((None, 6, 6, 2), lambda x: cg.layers.conv2d(x, 3, 3)),
    "batch_norm": ((None, 4), lambda x: cg.layers.batch_norm(x, training=True)),
    "layer_norm": ((None, 4), lambda x: cg.layers.layer_norm(x)),
    "attention": ((None, 5, 4), lambda x: cg.layers.multi_head_attention(x, num_heads=2)),
    "lstm": ((None, 5, 4), lambda x: cg.layers.lstm(x, 3)[0]),
}


def _variable_dtypes(g: cg.Graph) -> set[str]:
    return {n.output(0).dtype for n in g.variables()}


@pytest.mark.parametrize("layer", sorted(LAYERS))
@pytest.mark.parametrize(
    ("policy", "given", "out"),
    [("mixed_float16", "float32", "float16"), ("mixed_bfloat16", "float16", "bfloat16"),
     ("float32", "float16", "float32"), ("float32", "bfloat16", "float32")],
)  # fmt: skip
def test_a_layer_keeps_float32_variables_and_computes_in_the_policy_dtype(
    layer: str, policy: str, given: str, out: str
) -> None:
    shape, make = LAYERS[layer]
    g = cg.Graph()
    with g.as_default(), cg.layers.policy(policy):
        x = ph(*shape, dtype=given)
        y = make(x)
    assert y.dtype == out
    assert _variable_dtypes(g) == {"float32"}
    feed = np.random.default_rng(0).normal(size=[2 if d is None else d for d in shape]).astype(np.float32)
    value = cg.Session(g).run(y, {x: feed.astype(DTYPES[given])})
    assert np.isfinite(value.astype(np.float32)).all()


@pytest.mark.parametrize("layer", sorted(LAYERS))
def test_the_float32_path_builds_no_cast(layer: str) -> None:
    shape, make = LAYERS[layer]
    for dtype in ("float32", "float64"):
        g = cg.Graph()
        with g.as_default():
            y = make(ph(*shape, dtype=dtype))
        assert y.dtype == dtype and _variable_dtypes(g) == {dtype}
        assert not [n.name for n in g.nodes if n.op == "Cast"]


def test_embedding_casts_the_rows_it_gathers_not_its_table() -> None:
    g = cg.Graph()
    with g.as_default(), cg.layers.policy("mixed_float16"):
        rows = cg.layers.embedding(ph(None, 3, dtype="int32", name="ids"), 10, 4, name="emb")
    assert (rows.dtype, rows.node.name, g.node("emb/embeddings").output(0).dtype) == (
        "float16",
        "emb/lookup_float16",
        "float32",
    )


def test_scopes_nest_and_end_with_their_block_even_when_it_raises() -> None:
    with cg.layers.policy("mixed_float16"):
        with cg.layers.policy("float32"):
            assert cg.layers.current_policy().name == "float32"
        assert cg.layers.current_policy().compute_dtype == "float16"
        with pytest.raises(RuntimeError), cg.layers.policy("mixed_bfloat16"):
            raise RuntimeError
        assert cg.layers.current_policy().name == "mixed_float16"
    assert cg.layers.current_policy() == cg.layers.Policy("float32", "float32", "float32")


def test_attention_masks_half_scores_in_float32_so_a_fully_masked_row_is_uniform_not_nan() -> None:
    g = cg.Graph()
    with g.as_default(), cg.layers.policy("mixed_float16"):
        x = ph(None, 3, 4)
        mask = cg.constant(np.array([[True, True, False], [False, False, False], [True, True, True]]))
        y = cg.layers.multi_head_attention(x, num_heads=2, mask=mask, name="mha")
    assert g.node("mha/weights").output(0).dtype == "float32"
    assert np.isfinite(cg.Session(g).run(y, {x: np.ones((2, 3, 4), np.float32)}).astype(np.float32)).all()


def test_batch_norm_of_a_half_input_keeps_float32_statistics_computed_in_float32() -> None:
    rng = np.random.default_rng(0)
    value = (rng.normal(size=(64, 3)) * 300 + 1000).astype(np.float16)  # its squares overflow float16
    g = cg.Graph()
    with g.as_default():
        x = ph(None, 3, dtype="float16")
        mean, var = (cg.variable(np.full(3, v, np.float32), name=n, trainable=False) for v, n in ((0, "m"), (1, "v")))
        y = cg.batch_norm(x, np.ones(3, np.float32), np.zeros(3, np.float32), mean, var, True, momentum=0.0)
    sess = cg.Session(g)
    got = sess.run(y, {x: value})
    wide = value.astype(np.float32)
    assert got.dtype == np.float16 and sess.run(mean).dtype == np.float32
    np.testing.assert_allclose(sess.run(mean), wide.mean(0), rtol=1e-6)
    np.testing.assert_allclose(sess.run(var), wide.var(0), rtol=1e-4)
    np.testing.assert_allclose(got, (wide - wide.mean(0)) / np.sqrt(wide.var(0) + 1e-3), atol=2e-3)


@pytest.mark.parametrize(
    "loss",
    [lambda p, t: cg.losses.mean_squared_error(p, t), lambda p, t: cg.losses.huber(p, t),
     lambda p, t: cg.losses.sigmoid_cross_entropy_with_logits(p, cg.sigmoid(t)),
     lambda p, t: cg.losses.softmax_cross_entropy_with_logits(p, cg.softmax(t))],
    ids=["mse", "huber", "sigmoid_xent", "softmax_xent"],
)  # fmt: skip
def test_a_loss_of_half_predictions_is_float32_and_equals_the_float32_loss(loss: Callable[..., cg.Tensor]) -> None:
    values = np.random.default_rng(0).normal(size=(4, 3)).astype(np.float16)
    g = cg.Graph()
    with g.as_default():
        targets = cg.constant(np.ones((4, 3), np.float32))
        half, wide = loss(cg.constant(values), targets), loss(cg.constant(values.astype(np.float32)), targets)
    assert half.dtype == "float32"
    np.testing.assert_array_equal(*cg.Session(g).run([half, wide]))


def test_sparse_cross_entropy_widens_half_logits_and_takes_their_weights() -> None:
    g = cg.Graph()
    with g.as_default():
        logits = cg.constant(np.array([[0.0, 60000.0], [1.0, 0.0]], np.float16))
        weights = cg.constant(np.array([1.0, 3.0], np.float16))
        loss = cg.losses.sparse_softmax_cross_entropy(logits, cg.constant([0, 1]), weights=weights)
    assert loss.dtype == "float32"
    assert np.isclose(cg.Session(g).run(loss), (60000.0 + 3 * (1 + np.log1p(np.exp(-1.0)))) / 4)


# ------------------------------------------------------------------ mixed precision: compute, clip, apply
def _half_model() -> tuple[cg.Graph, cg.Tensor, cg.optim.MixedPrecision, cg.Tensor]:
    g = cg.Graph()
    with g.as_default(), cg.layers.policy("mixed_float16"):
        x = cg.constant(np.ones((2, 3), np.float32))
        loss = cg.losses.mean_squared_error(cg.layers.dense(x, 1, name="d"), cg.constant(np.zeros((2, 1), np.float32)))
        return g, loss, cg.optim.mixed_precision(cg.optim.SGD(0.1)), g.node("d/kernel").output(0)


def test_compute_gradients_gives_unscaled_float32_gradients_and_a_finite_flag() -> None:
    g, loss, mp, kernel = _half_model()
    with g.as_default():
        pairs = mp.compute_gradients(loss)
        plain = cg.optim.SGD(0.1).compute_gradients(loss)
    assert [v.node.name for _, v in pairs] == ["d/kernel", "d/bias"]
    assert all(grad is not None and grad.dtype == "float32" for grad, _ in pairs)
    sess = cg.Session(g)
    for (got, _), (want, _) in zip(pairs, plain):
        np.testing.assert_allclose(sess.run(got), sess.run(want), rtol=1e-3)
    assert mp.gradients_finite is not None and bool(sess.run(mp.gradients_finite))


def test_apply_gradients_needs_compute_gradients_first() -> None:
    _, _, mp, kernel = _half_model()
    with raises(
        cg.GraphError,
        "mixed_precision(SGD).apply_gradients: no loss scale yet: call compute_gradients(loss) on this wrapper "
        "first (it scales the loss and gives the unscaled gradients to clip and apply)",
    ):
        mp.apply_gradients([(kernel, kernel)])


def test_apply_gradients_refuses_gradients_of_another_graph() -> None:
    g, loss, mp, kernel = _half_model()
    with g.as_default():
        mp.compute_gradients(loss)
    other = cg.Graph()
    with other.as_default():
        w = cg.variable([1.0], name="w")
    with raises(cg.GraphError, "gradient 'w:0' of 'w:0' is not in the graph of the loss scale"):
        mp.apply_gradients([(w, w)])


def test_mixed_precision_points_a_half_variable_to_the_policy() -> None:
    g = cg.Graph()
    with g.as_default():
        w = cg.variable(np.ones(2, np.float16), dtype="float16", name="w")
        loss = cg.reduce_sum(cg.cast(w, "float32"))
        with raises(cg.DTypeError, "or build the layers under cg.layers.policy('mixed_float16')"):
            cg.optim.mixed_precision(cg.optim.SGD(0.1)).compute_gradients(loss)


# ------------------------------------------------------------------ refusals
def test_an_unknown_policy_lists_the_known_ones() -> None:
    with raises(ValueError, "unknown dtype policy 'mixed_float32'; known: float32, mixed_bfloat16, mixed_float16"):
        with cg.layers.policy("mixed_float32"):
            pass


def test_a_mixed_policy_refuses_an_integer_input_to_a_float_layer() -> None:
    g = cg.Graph()
    with g.as_default(), cg.layers.policy("mixed_float16"):
        x = ph(None, 4, dtype="int32")
        with raises(
            cg.DTypeError,
            "dense layer 'd' under dtype policy 'mixed_float16' needs a float input, got int32 ('x:0'); "
            "cast it (cg.cast(x, 'float16'))",
        ):
            cg.layers.dense(x, 2, name="d")
    assert g.nodes == [x.node]


def test_a_half_loss_label_of_the_other_half_dtype_is_refused() -> None:
    g = cg.Graph()
    with g.as_default():
        logits, labels = ph(2, 3, dtype="float16"), ph(2, 3, dtype="bfloat16", name="z")
        with raises(cg.DTypeError, "labels has dtype bfloat16 but logits have float16; they must match"):
            cg.losses.softmax_cross_entropy_with_logits(logits, labels)


# ------------------------------------------------------------------ saved models and ONNX
def _policy_model(policy: str) -> tuple[cg.Graph, cg.Tensor, cg.Tensor, cg.Tensor]:
    g = cg.Graph()
    with g.as_default(), cg.layers.policy(policy):
        x = ph(None, 6, 6, 1)
        training = cg.layers.training_switch()
        h = cg.layers.batch_norm(cg.layers.conv2d(x, 2, 3, name="conv"), training=training, name="bn")
        with cg.layers.policy("float32"):  # the logits in float32, as Keras advises
            return g, x, training, cg.layers.dense(cg.layers.flatten(cg.relu(h)), 2, name="out")


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_a_policy_model_saves_loads_and_its_weights_serve_a_float32_graph(policy: str) -> None:
    g, x, training, y = _policy_model(policy)
    sess = cg.Session(g)
    value = np.random.default_rng(0).normal(size=(2, 6, 6, 1)).astype(np.float32)
    want = sess.run(y, {x: value, training: False})  # a saved model is the inference graph
    with tempfile.TemporaryDirectory() as d:
        loaded = cg.load_model(cg.save_model(os.path.join(d, "m"), x, y, sess))
        np.testing.assert_array_equal(loaded(value), want)
        # The same layers in float32 have the same variables: the mixed model's values load into them.
        _, x32, _, y32 = _policy_model("float32")
        cg.save_model(os.path.join(d, "f32"), x32, y32, sess.variable_values())
        np.testing.assert_allclose(cg.load_model(os.path.join(d, "f32"))(value), want, atol=0.05)


def test_a_float16_policy_model_exports_to_onnx_and_runs_there() -> None:
    ort = pytest.importorskip("onnxruntime")
    g, x, training, y = _policy_model("mixed_float16")
    sess = cg.Session(g)
    value = np.random.default_rng(0).normal(size=(2, 6, 6, 1)).astype(np.float32)
    with tempfile.TemporaryDirectory() as d:
        cg.onnx.export(os.path.join(d, "m.onnx"), x, y, sess)
        got = ort.InferenceSession(os.path.join(d, "m.onnx")).run(None, {"x": value})[0]
    np.testing.assert_allclose(
        got, sess.run(y, {x: value, training: False}), atol=5e-3
    )  # ONNX Runtime computes in float16
