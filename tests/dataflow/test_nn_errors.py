"""Every error the nn family raises, with the words a user reads."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest

import cellgraph as cg
from cellgraph.dataflow.ops import conv, nn

from .errors_helpers import ph, raises

pytestmark = pytest.mark.usefixtures("fresh_graph")


# ------------------------------------------------------------------ Conv2D
def test_conv2d_names_the_op_node_and_line() -> None:
    with pytest.raises(cg.ShapeError, match=r"^Conv2D 'stem' \(test_nn_errors\.py:\d+\): input has 3 channels"):
        cg.conv2d(ph(None, 8, 8, 3), ph(3, 3, 4, 16, name="f"), name="stem")


def test_conv2d_channels_differ() -> None:
    message = "input has 3 channels but the filter expects 4: (None, 8, 8, 3) * (3, 3, 4, 16)"
    with raises(cg.ShapeError, message):
        cg.conv2d(ph(None, 8, 8, 3), ph(3, 3, 4, 16, name="f"))


def test_conv2d_bad_padding() -> None:
    with raises(cg.ShapeError, "padding must be 'SAME' or 'VALID', got 'same'"):
        cg.conv2d(ph(None, 8, 8, 3), ph(3, 3, 3, 4, name="f"), padding="same")


@pytest.mark.parametrize("strides", [0, (1, 2, 3), (2, 0), (2, 2, 2, 2), (1.5, 1), True])
def test_conv2d_bad_strides(strides: Any) -> None:
    message = f"strides must be a positive int, a (height, width) pair or (1, height, width, 1), got {strides!r}"
    with raises(cg.ShapeError, message):
        cg.conv2d(ph(None, 8, 8, 3), ph(3, 3, 3, 4, name="f"), strides=strides)


def test_conv2d_input_must_be_nhwc() -> None:
    with raises(cg.ShapeError, "input must be 4-D NHWC (batch, height, width, channels), got (8, 8, 3)"):
        cg.conv2d(ph(8, 8, 3), ph(3, 3, 3, 4, name="f"))


def test_conv2d_filter_must_be_hwio() -> None:
    with raises(cg.ShapeError, "filter must be 4-D HWIO (height, width, in, out), got (3, 3, 3)"):
        cg.conv2d(ph(None, 8, 8, 3), ph(3, 3, 3, name="f"))


def test_conv2d_valid_filter_larger_than_input() -> None:
    message = "filter height 5 is larger than the input height 3 with VALID padding: (None, 3, 3, 1) * (5, 5, 1, 4)"
    with raises(cg.ShapeError, message):
        cg.conv2d(ph(None, 3, 3, 1), ph(5, 5, 1, 4, name="f"), padding="VALID")


def test_conv2d_valid_filter_wider_than_input() -> None:
    message = "filter width 4 is larger than the input width 3 with VALID padding: (None, 8, 3, 1) * (2, 4, 1, 4)"
    with raises(cg.ShapeError, message):
        cg.conv2d(ph(None, 8, 3, 1), ph(2, 4, 1, 4, name="f"), padding="VALID")


def test_conv2d_same_filter_larger_than_input_is_fine() -> None:
    assert cg.conv2d(ph(None, 3, 3, 1), ph(5, 5, 1, 4, name="f")).shape == (None, 3, 3, 4)


def test_conv2d_needs_floats() -> None:
    with raises(cg.DTypeError, "expects float tensors, got int32"):
        cg.conv2d(ph(None, 8, 8, 3, dtype="int32"), ph(3, 3, 3, 4, dtype="int32", name="f"))


def test_conv2d_dtypes_differ() -> None:
    with raises(cg.DTypeError, "operands have different dtypes: float32, float64"):
        cg.conv2d(ph(None, 8, 8, 3), ph(3, 3, 3, 4, dtype="float64", name="f"))


def test_conv2d_backprop_input_gradient_of_the_wrong_shape() -> None:
    x, f = ph(None, 8, 8, 3), ph(3, 3, 3, 4, name="f")
    with raises(cg.ShapeError, "out_backprop has shape (None, 8, 8, 5), expected (None, 4, 4, 4)"):
        cg.conv2d_backprop_input(x, f, ph(None, 8, 8, 5, name="dy"), strides=2)


def test_conv2d_backprop_filter_gradient_of_the_wrong_shape() -> None:
    x, f = ph(None, 8, 8, 3), ph(3, 3, 3, 4, name="f")
    with raises(cg.ShapeError, "out_backprop has shape (None, 6, 6, 4), expected (None, 8, 8, 4)"):
        cg.conv2d_backprop_filter(x, f, ph(None, 6, 6, 4, name="dy"))


# ----------------------------------------------------------------- pooling
def test_max_pool_window_larger_than_input() -> None:
    message = "window height 3 is larger than the input height 2 with VALID padding: window (3, 3) over (None, 2, 2, 1)"
    with pytest.raises(cg.ShapeError, match=r"^MaxPool 'pool' \(test_nn_errors\.py:\d+\): " + re.escape(message)):
        cg.max_pool(ph(None, 2, 2, 1), 3, 1, name="pool")


def test_avg_pool_bad_ksize() -> None:
    message = "ksize must be a positive int, a (height, width) pair or (1, height, width, 1), got (2, 2, 2)"
    with raises(cg.ShapeError, message):
        cg.avg_pool(ph(None, 8, 8, 1), (2, 2, 2))


def test_avg_pool_bad_padding() -> None:
    with raises(cg.ShapeError, "padding must be 'SAME' or 'VALID', got 'FULL'"):
        cg.avg_pool(ph(None, 8, 8, 1), 2, 2, "FULL")


def test_max_pool_input_must_be_nhwc() -> None:
    with raises(cg.ShapeError, "input must be 4-D NHWC (batch, height, width, channels), got (None, 8)"):
        cg.max_pool(ph(None, 8))


def test_max_pool_needs_floats() -> None:
    with raises(cg.DTypeError, "expects float tensors, got int32"):
        cg.max_pool(ph(None, 4, 4, 1, dtype="int32"))


def test_max_pool_grad_of_the_wrong_shape() -> None:
    with raises(cg.ShapeError, "out_backprop has shape (None, 4, 4, 1), expected (None, 2, 2, 1)"):
        conv.max_pool_grad(ph(None, 4, 4, 1), ph(None, 4, 4, 1, name="dy"), 2, 2, "VALID")


def test_max_pool_grad_grad_of_the_wrong_shape() -> None:
    with raises(cg.ShapeError, "gradient has shape (None, 2, 2, 1), expected (None, 4, 4, 1)"):
        conv.max_pool_grad_grad(ph(None, 4, 4, 1), ph(None, 2, 2, 1, name="ddx"), 2, 2, "VALID")


# ------------------------------------------------------------- activations
def test_activations_need_floats() -> None:
    with raises(cg.DTypeError, "Sigmoid 'sigmoid' (test_nn_errors.py"):
        cg.sigmoid(ph(3, dtype="int32"))
    with raises(cg.DTypeError, "expects a float tensor, got int32"):
        cg.relu(ph(3, dtype="int32"))


def test_activation_gradient_shapes_differ() -> None:
    with raises(cg.ShapeError, "gradient and output shapes differ: (3, 4) and (4, 3)"):
        nn.relu_grad(ph(3, 4, name="dy"), ph(4, 3, name="y"))


def test_activation_gradient_dtypes_differ() -> None:
    with raises(cg.DTypeError, "operands have different dtypes: float32, float64"):
        nn.tanh_grad(ph(3, name="dy"), ph(3, dtype="float64", name="y"))


# ----------------------------------------------------------------- softmax
def test_softmax_axis_out_of_range() -> None:
    with raises(cg.ShapeError, "axis 2 is out of range for shape (3, 4)"):
        cg.softmax(ph(3, 4), axis=2)


def test_log_softmax_of_a_scalar() -> None:
    with raises(cg.ShapeError, "axis -1 is out of range for shape ()"):
        cg.log_softmax(ph())


# ----------------------------------------------------------- cross-entropy
def test_xent_labels_must_be_ints() -> None:
    with raises(cg.DTypeError, "labels must be int32 or int64 class indices, got float32"):
        cg.sparse_softmax_cross_entropy(ph(None, 10), ph(None, name="labels"))


def test_xent_logits_must_be_float() -> None:
    with raises(cg.DTypeError, "logits must be float, got int32"):
        cg.sparse_softmax_cross_entropy(ph(None, 10, dtype="int32"), ph(None, dtype="int32", name="labels"))


def test_xent_logits_must_be_a_matrix() -> None:
    with raises(cg.ShapeError, "logits must be 2-D (batch, classes), got (None, 3, 10)"):
        cg.sparse_softmax_cross_entropy(ph(None, 3, 10), ph(None, dtype="int32", name="labels"))


def test_xent_labels_must_be_a_vector() -> None:
    with raises(cg.ShapeError, "labels must be 1-D (batch,), got (None, 1)"):
        cg.sparse_softmax_cross_entropy(ph(None, 10), ph(None, 1, dtype="int32", name="labels"))


def test_xent_batch_sizes_differ() -> None:
    with raises(cg.ShapeError, "logits have 3 rows but labels have 4: (3, 10) and (4,)"):
        cg.sparse_softmax_cross_entropy(ph(3, 10), ph(4, dtype="int32", name="labels"))


def test_xent_unknown_batch_takes_the_known_one() -> None:
    loss = cg.sparse_softmax_cross_entropy(ph(None, 10), ph(4, dtype="int64", name="labels"))
    assert loss.shape == (4,)
    assert loss.node.output(1).shape == (4, 10)


def test_xent_label_out_of_range_at_run_time_names_node_label_and_range() -> None:
    logits, labels = ph(None, 5), ph(None, dtype="int32", name="labels")
    loss = cg.sparse_softmax_cross_entropy(logits, labels, name="loss")
    message = "label 7 of example 1 is outside the valid range [0, 5)"
    with pytest.raises(
        cg.ExecutionError, match=r"^SparseSoftmaxCrossEntropyWithLogits 'loss' \(test_nn_errors\.py:\d+\)"
    ):
        cg.Session().run(loss, {logits: np.zeros((2, 5)), labels: [0, 7]})
    with raises(cg.ExecutionError, message):
        cg.Session().run(loss, {logits: np.zeros((2, 5)), labels: [0, 7]})
    with raises(cg.ExecutionError, "label -1 of example 0"):
        cg.Session().run(loss, {logits: np.zeros((2, 5)), labels: [-1, 0]})


# -------------------------------------------------------------------- bias
def test_bias_add_sizes_differ() -> None:
    with raises(cg.ShapeError, "bias has 10 elements but the input's last axis has 16: (None, 16) + (10,)"):
        cg.bias_add(ph(None, 16), ph(10, name="b"))


def test_bias_add_bias_must_be_a_vector() -> None:
    with raises(cg.ShapeError, "bias must be 1-D, got (1, 16)"):
        cg.bias_add(ph(None, 16), ph(1, 16, name="b"))


def test_bias_add_of_a_scalar() -> None:
    with raises(cg.ShapeError, "input must have at least one axis (the channels), got ()"):
        cg.bias_add(ph(), ph(1, name="b"))


def test_bias_add_dtypes_differ() -> None:
    with raises(cg.DTypeError, "input and bias have different dtypes: float32 and float64"):
        cg.bias_add(ph(None, 4), ph(4, dtype="float64", name="b"))


def test_bias_add_of_bools() -> None:
    with raises(cg.DTypeError, "expects numeric tensors, got bool"):
        cg.bias_add(ph(None, 4, dtype="bool"), ph(4, dtype="bool", name="b"))


def test_bias_add_grad_of_a_scalar() -> None:
    with raises(cg.ShapeError, "gradient must have at least one axis (the channels), got ()"):
        nn.bias_add_grad(ph())


# ----------------------------------------------------------------- dropout
@pytest.mark.parametrize("rate", [1.0, 1.5, -0.1, float("nan"), "0.5"])
def test_dropout_rate_outside_zero_one(rate: Any) -> None:
    with raises(cg.ShapeError, f"rate must be a number in [0, 1), got {rate!r}"):
        cg.dropout(ph(3), rate)


def test_dropout_needs_floats() -> None:
    with raises(cg.DTypeError, "Dropout 'dropout' (test_nn_errors.py"):
        cg.dropout(ph(3, dtype="int32"), 0.5)


@pytest.mark.parametrize("fed", [1, 5], ids=["fewer", "more"])
def test_labels_fed_for_another_number_of_rows_fail_the_run(fed: int) -> None:
    """The shape rule lets (None,) labels meet (None, C) logits; fed 5 labels for 3 rows, the kernel read the
    first 3 and returned their loss without a word (1 label for 3 rows read past its end)."""
    logits = ph(None, 4, dtype="float64", name="logits")
    labels = ph(None, dtype="int32", name="labels")
    loss = cg.sparse_softmax_cross_entropy(logits, labels)
    with pytest.raises(cg.ExecutionError) as err:
        cg.Session(cg.get_default_graph()).run(loss, {logits: np.zeros((3, 4)), labels: np.zeros(fed, np.int32)})
    assert (f"failed while running: ValueError: logits have 3 rows but labels have {fed}: (3, 4) and ({fed},)") in str(
        err.value
    )


BACKPROP_SHAPES = [
    ("input-small-dy", cg.conv2d_backprop_input, (1, 4, 4, 1), (2, 2, 1, 1), (1, 2, 2, 1),
     "out_backprop has shape (1, 2, 2, 1), expected (1, 3, 3, 1)"),
    ("input-batch", cg.conv2d_backprop_input, (2, 4, 4, 1), (2, 2, 1, 1), (1, 3, 3, 1),
     "out_backprop has shape (1, 3, 3, 1), expected (2, 3, 3, 1)"),
    ("filter-large-dy", cg.conv2d_backprop_filter, (1, 4, 4, 1), (2, 2, 1, 1), (1, 4, 4, 1),
     "out_backprop has shape (1, 4, 4, 1), expected (1, 3, 3, 1)"),
    ("filter-channels", cg.conv2d_backprop_filter, (1, 4, 4, 2), (2, 2, 1, 1), (1, 3, 3, 1),
     "input has 2 channels but the filter expects 1: (1, 4, 4, 2) * (2, 2, 1, 1)"),
]  # fmt: skip


@pytest.mark.parametrize(("op", "x", "f", "dy", "words"), [b[1:] for b in BACKPROP_SHAPES],
                         ids=[b[0] for b in BACKPROP_SHAPES])  # fmt: skip
def test_a_conv_backprop_of_other_run_time_shapes_fails_the_run(op, x, f, dy, words) -> None:  # noqa: ANN001
    """Unknown dims pass the shape rule, and the kernels read out_backprop by the output input and filter make:
    a (1, 2, 2, 1) dy for a (1, 3, 3, 1) output gave a gradient from the overlap (and an input of 2 channels a
    filter gradient of 2) without a word."""
    feeds = {ph(None, None, None, None, dtype="float64", name=n): np.ones(s) for n, s in zip("xfd", (x, f, dy))}
    out = op(*feeds, padding="VALID")
    with pytest.raises(cg.ExecutionError) as err:
        cg.Session(cg.get_default_graph()).run(out, feeds)
    assert f"failed while running: ValueError: {words}" in str(err.value)


def test_a_conv_or_transpose_of_other_run_time_shapes_fails_the_run() -> None:
    """conv2d with groups read an input of 4 channels as 2 per group without a word, and conv2d_transpose of a
    3x3 input into an 8x8 output (made by a 4x4 one) filled what it could and left zeros."""
    x, f = (ph(None, None, None, None, dtype="float64", name=n) for n in "xf")
    grouped = cg.conv2d(x, f, padding="VALID", groups=2, name="grouped")
    up = cg.conv2d_transpose(x, f, (1, 8, 8, 1), strides=2, padding="SAME", name="up")
    sess = cg.Session(cg.get_default_graph())
    for out, shapes, words in (
        (grouped, ((1, 4, 4, 4), (2, 2, 1, 2)), "input has 4 channels but the filter expects 1 per group, 2 in 2 "
         "groups: (1, 4, 4, 4) * (2, 2, 1, 2)"),
        (up, ((1, 3, 3, 1), (2, 2, 1, 1)), "an output height of 8 convolves back to 4, not the input's 3"),
    ):  # fmt: skip
        with pytest.raises(cg.ExecutionError) as err:
            sess.run(out, {x: np.ones(shapes[0]), f: np.ones(shapes[1])})
        assert f"failed while running: ValueError: {words}" in str(err.value)


def test_a_bias_fed_for_other_channels_fails_the_run() -> None:
    """A (1,) bias fed for 3 channels was broadcast over them, and its gradient came back (3,), without a word."""
    x, b = ph(None, None, dtype="float64", name="x"), ph(None, dtype="float64", name="b")
    y = cg.bias_add(x, b)
    with pytest.raises(cg.ExecutionError) as err:
        cg.Session(cg.get_default_graph()).run(y, {x: np.ones((2, 3)), b: np.ones(1)})
    assert (
        "failed while running: ValueError: bias has 1 elements but the input's last axis has 3: (2, 3) + (1,)"
        in str(err.value)
    )
