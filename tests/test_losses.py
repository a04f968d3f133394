"""``cg.losses``: semantics the oracle rows cannot show (torch's ``weight=``, extreme logits,
a bad label at run time) and every error message, with the graph left as it was."""

from __future__ import annotations

import numpy as np
import pytest

import cellgraph as cg
from cellgraph.dataflow.errors import DTypeError, ExecutionError, ShapeError

from .oracle import NO_TORCH


def _run(fn, *arrays, **kw):  # type: ignore[no-untyped-def]
    g = cg.Graph()
    with g.as_default():
        out = fn(*(cg.constant(a, dtype=np.asarray(a).dtype.name) for a in arrays), **kw)
    return cg.Session(g).run(out)


def test_sparse_weights_as_class_weights_match_torch_cross_entropy_weight() -> None:
    torch = pytest.importorskip("torch", reason=NO_TORCH)
    rng = np.random.default_rng(3)
    logits = rng.normal(size=(7, 2, 4))
    labels = np.array([[0, 3], [-1, 2], [1, 1], [3, -1], [2, 0], [0, 0], [1, 3]], np.int64)
    class_weights = rng.uniform(0.5, 2.0, 4)
    safe = np.clip(labels, 0, 3)
    got = _run(
        lambda z, y, w: cg.losses.sparse_softmax_cross_entropy(z, y, weights=w, ignore_index=-1),
        logits,
        labels,
        class_weights[safe],
    )
    want = torch.nn.functional.cross_entropy(
        torch.from_numpy(logits).movedim(-1, 1),
        torch.from_numpy(labels),
        weight=torch.from_numpy(class_weights),
        ignore_index=-1,
    )
    np.testing.assert_allclose(got, want.item(), rtol=1e-12)


def test_sparse_mean_of_only_ignored_examples_is_nan_as_in_torch() -> None:
    got = _run(
        lambda z, y: cg.losses.sparse_softmax_cross_entropy(z, y, ignore_index=-100),
        np.zeros((2, 3)),
        np.array([-100, -100]),
    )
    assert np.isnan(got)


def test_sparse_label_out_of_range_fails_the_run_naming_it() -> None:
    g = cg.Graph()
    with g.as_default():
        loss = cg.losses.sparse_softmax_cross_entropy(
            cg.constant(np.zeros((2, 3))), cg.constant([1, 7]), ignore_index=-100
        )
    with pytest.raises(ExecutionError, match=r"label 7 of example 1 is outside the valid range \[0, 3\)"):
        cg.Session(g).run(loss)


def test_sparse_plain_mean_is_one_fused_op_and_a_mean() -> None:
    g = cg.Graph()
    with g.as_default():
        loss = cg.losses.sparse_softmax_cross_entropy(cg.placeholder((None, 3)), cg.placeholder((None,), "int32"))
    assert loss.name == "loss:0"
    assert [n.op for n in g.nodes if n.op not in ("Placeholder", "Const")] == [
        "SparseSoftmaxCrossEntropyWithLogits",
        "ReduceMean",
    ]


def test_sigmoid_cross_entropy_is_finite_for_extreme_logits() -> None:
    g = cg.Graph()
    with g.as_default():
        z = cg.constant(np.array([-1e4, -50.0, 0.0, 50.0, 1e4], np.float32))
        loss = cg.losses.sigmoid_cross_entropy_with_logits(z, cg.constant([1.0, 0.0, 1.0, 1.0, 0.0]), reduction="none")
        (dz,) = cg.gradients(cg.reduce_sum(loss), [z])
    value, grad = cg.Session(g).run([loss, dz])
    np.testing.assert_allclose(value, [1e4, 0.0, np.log(2), 0.0, 1e4], rtol=1e-6, atol=1e-20)
    np.testing.assert_allclose(grad, [-1.0, 0.0, -0.5, 0.0, 1.0], atol=1e-6)


def test_l2_loss_and_huber_against_numpy() -> None:
    a = np.array([[1.0, -2.0], [0.5, 3.0]])
    np.testing.assert_allclose(_run(cg.losses.l2_loss, a), np.sum(a**2) / 2)
    d = a.ravel()
    want = np.where(np.abs(d) <= 1.2, 0.5 * d**2, 1.2 * (np.abs(d) - 0.6))
    np.testing.assert_allclose(_run(lambda p, t: cg.losses.huber(p, t, 1.2, "sum"), d, np.zeros(4)), want.sum())
    np.testing.assert_allclose(_run(lambda p, t: cg.losses.mean_squared_error(p, t, "none"), d, np.zeros(4)), d**2)


# ------------------------------------------------------------------ errors
F32 = np.zeros((4, 3), np.float32)
ERRORS = [
    (lambda: cg.losses.huber(F32, F32, reduction="avg"), ValueError,
     "huber: reduction must be one of 'mean', 'sum', 'none', got 'avg'"),
    (lambda: cg.losses.huber(F32, F32, delta=0.0), ValueError,
     "huber: delta must be a finite number more than 0, got 0.0"),
    (lambda: cg.losses.huber(F32, np.zeros((4, 2), np.float32)), ShapeError,
     "huber: targets has shape (4, 2) but predictions has (4, 3); they must match"),
    # Broadcast, a (4, 1) column against (4,) targets was a (4, 4) table whose mean was returned as the loss.
    (lambda: cg.losses.mean_squared_error(cg.placeholder((None, 1)), cg.placeholder((None,))), ShapeError,
     "mean_squared_error: targets has shape (None,) but predictions has (None, 1); they must match"),
    (lambda: cg.losses.mean_squared_error(cg.constant([1, 2]), cg.constant([1, 2])), DTypeError,
     "mean_squared_error: predictions must be a float tensor, got int32"),
    (lambda: cg.losses.sparse_softmax_cross_entropy(F32, cg.constant([0.0, 1.0, 2.0, 0.0])), DTypeError,
     "sparse_softmax_cross_entropy: labels must be int32 or int64 class indices, got float32"),
    (lambda: cg.losses.sparse_softmax_cross_entropy(F32, cg.constant([0, 1, 2])), ShapeError,
     "sparse_softmax_cross_entropy: labels have shape (3,) but logits (4, 3) need labels of shape (4,)"),
    (lambda: cg.losses.sparse_softmax_cross_entropy(F32[0], cg.constant(0)), ShapeError,
     "sparse_softmax_cross_entropy: logits must have a batch axis and a class axis (last), got (3,)"),
    (lambda: cg.losses.sparse_softmax_cross_entropy(F32, cg.constant([0, 1, 2, 0]), weights=cg.constant([1.0, 2.0])),
     ShapeError, "sparse_softmax_cross_entropy: weights has shape (2,) but labels has (4,); they must match"),
    (lambda: cg.losses.sparse_softmax_cross_entropy(F32, cg.constant([0, 1, 2, 0]), weights=cg.constant([1, 1, 1, 1])),
     DTypeError, "sparse_softmax_cross_entropy: weights must be a float tensor, got int32"),
    (lambda: cg.losses.sparse_softmax_cross_entropy(F32, cg.constant([0, 1, 2, 0]), ignore_index=1.5), ValueError,
     "sparse_softmax_cross_entropy: ignore_index must be an int or None, got 1.5"),
    (lambda: cg.losses.sparse_softmax_cross_entropy(cg.placeholder((2, 2, None)), cg.constant([[0, 1], [1, 0]])),
     ShapeError, "logits of rank > 2 need a known class count (last axis), got (2, 2, None)"),
    (lambda: cg.losses.softmax_cross_entropy_with_logits(F32, np.zeros((4, 5), np.float32)), ShapeError,
     "softmax_cross_entropy_with_logits: labels have 5 classes but logits have 3: (4, 5) and (4, 3)"),
    (lambda: cg.losses.softmax_cross_entropy_with_logits(F32, cg.constant(np.zeros((4, 3)), dtype="float64")),
     DTypeError, "softmax_cross_entropy_with_logits: labels has dtype float64 but logits have float32; they must match"),
    (lambda: cg.losses.softmax_cross_entropy_with_logits(F32, F32, axis=2), ShapeError,
     "softmax_cross_entropy_with_logits: axis 2 is out of range for logits of shape (4, 3)"),
    (lambda: cg.losses.sigmoid_cross_entropy_with_logits(cg.constant([1, 2]), cg.constant([1.0, 0.0])), DTypeError,
     "sigmoid_cross_entropy_with_logits: logits must be a float tensor, got int32"),
    (lambda: cg.losses.sigmoid_cross_entropy_with_logits(F32, cg.constant(np.zeros((4, 1), np.float32))), ShapeError,
     "sigmoid_cross_entropy_with_logits: labels has shape (4, 1) but logits has (4, 3); they must match"),
    (lambda: cg.losses.l2_loss(cg.constant([1, 2])), DTypeError, "l2_loss: x must be a float tensor, got int32"),
]  # fmt: skip


@pytest.mark.parametrize(("build", "error", "words"), ERRORS, ids=[e[2][:48] for e in ERRORS])
def test_bad_arguments_are_named_and_leave_the_graph_unchanged(build, error, words) -> None:  # type: ignore[no-untyped-def]
    g = cg.Graph()
    with g.as_default():
        cg.placeholder((None, 3), name="x")
        before = [n.name for n in g.nodes]
        version = g.version
        with pytest.raises(error) as caught:
            build()
    assert words in str(caught.value)
    # Constants made on the way (inside the loss) are gone again; the test's own arguments are outside it.
    inside = [n.name for n in g.nodes if n.name not in before and n.op not in ("Const", "Placeholder")]
    assert inside == [], f"{words}: left {inside} behind (graph version {version} -> {g.version})"


FED_LOSSES = [
    ("mse", lambda p, t: cg.losses.mean_squared_error(p, t), "targets_in_the_shape_of_predictions"),
    ("huber", lambda p, t: cg.losses.huber(p, t), "targets_in_the_shape_of_predictions"),
    ("sigmoid", lambda p, t: cg.losses.sigmoid_cross_entropy_with_logits(p, t), "labels_in_the_shape_of_logits"),
    ("softmax", lambda p, t: cg.losses.softmax_cross_entropy_with_logits(p, t), "labels_in_the_shape_of_logits"),
    ("weights", lambda p, t: cg.losses.sparse_softmax_cross_entropy(p, cg.constant([0, 1, 2]), weights=t[:, 0]),
     "weights_in_the_shape_of_labels"),
]  # fmt: skip


@pytest.mark.parametrize(("build", "node"), [f[1:] for f in FED_LOSSES], ids=[f[0] for f in FED_LOSSES])
def test_targets_fed_for_another_batch_fail_the_run(build, node) -> None:  # type: ignore[no-untyped-def]
    """Placeholders of unknown batch pass the shape check; targets fed for 1 example against 3 predictions
    broadcast, and the loss of every prediction against that one target came back without a word."""
    g = cg.Graph()
    with g.as_default():
        p = cg.placeholder((None, 3), "float64", name="p")
        t = cg.placeholder((None, 3), "float64", name="t")
        loss = build(p, t)
    sess = cg.Session(g)
    good = sess.run(loss, {p: np.zeros((3, 3)), t: np.full((3, 3), 0.5)})
    assert np.isfinite(good)
    with pytest.raises(
        cg.ExecutionError,
        match=rf"ReshapeLike '{node}'.* has shape \(1,( 3)?\) but must have the shape of '(p|const):0', \(3,( 3)?\)",
    ):
        sess.run(loss, {p: np.zeros((3, 3)), t: np.full((1, 3), 0.5)})


@pytest.mark.parametrize(("build", "node"), [f[1:] for f in FED_LOSSES[:4]], ids=[f[0] for f in FED_LOSSES[:4]])
def test_targets_fed_transposed_fail_the_run_naming_both_shapes(build, node) -> None:  # type: ignore[no-untyped-def]
    """Of the same size, (3, 2) targets for (2, 3) predictions passed the reshape and were read in the wrong
    order: a loss came back, of other numbers, without a word."""
    g = cg.Graph()
    with g.as_default():
        p = cg.placeholder((None, None), "float64", name="p")
        t = cg.placeholder((None, None), "float64", name="t")
        loss = build(p, t)
    sess = cg.Session(g)
    targets = np.array([[0.1, 0.2, 0.3], [0.6, 0.5, 0.4]])
    assert np.isfinite(sess.run(loss, {p: np.zeros((2, 3)), t: targets}))
    with pytest.raises(cg.ExecutionError) as err:
        sess.run(loss, {p: np.zeros((2, 3)), t: targets.T})
    assert f"ReshapeLike '{node}'" in str(err.value)
    assert str(err.value).endswith("'t:0' has shape (3, 2) but must have the shape of 'p:0', (2, 3)")
