"""The convolution variants: their values from first principles, the layer and
GraphDef round trip, and every error they raise, with the words a user reads.

The op table (op_cases/conv.py) checks kernels, shapes and gradients; the
oracle (tests/oracle/rows_conv.py) checks against PyTorch; here the expected
values are computed in float64 NumPy from the documented definitions.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import cellgraph as cg
from cellgraph.dataflow.graphdef import from_graphdef, to_graphdef

from .errors_helpers import ph, raises

pytestmark = pytest.mark.usefixtures("fresh_graph")
RNG = np.random.default_rng(77)


def _c(a: np.ndarray) -> cg.Tensor:
    return cg.constant(a, dtype="float64")


def _run(fetch: Any, feeds: dict[Any, np.ndarray] | None = None) -> Any:
    return cg.Session(cg.get_default_graph()).run(fetch, feeds or {})


def _direct_conv(x: np.ndarray, f: np.ndarray, stride: int, pads: tuple[int, int, int, int], dil: int, groups: int):
    """out[n, i, j, o] = sum over taps and its group's channels, one output at a time."""
    top, bottom, left, right = pads
    xp = np.pad(x, ((0, 0), (top, bottom), (left, right), (0, 0)))
    kh, kw, cg_, o = f.shape
    oh = (xp.shape[1] - (kh - 1) * dil - 1) // stride + 1
    ow = (xp.shape[2] - (kw - 1) * dil - 1) // stride + 1
    out = np.zeros((x.shape[0], oh, ow, o))
    for oc in range(o):
        g = oc // (o // groups)
        for i in range(oh):
            for j in range(ow):
                for p in range(kh):
                    for q in range(kw):
                        px = xp[:, i * stride + p * dil, j * stride + q * dil, g * cg_ : (g + 1) * cg_]
                        out[:, i, j, oc] += px @ f[p, q, :, oc]
    return out


# ------------------------------------------------------------------- values
@pytest.mark.parametrize(("stride", "pads", "dil", "groups"), [(1, (1, 0, 2, 1), 2, 1), (2, (1, 1, 0, 1), 1, 2)])
def test_conv2d_is_the_direct_sum_over_dilated_taps_of_its_group(
    stride: int, pads: tuple[int, int, int, int], dil: int, groups: int
) -> None:
    x_data, f_data = RNG.normal(size=(2, 7, 6, 4)), RNG.normal(size=(3, 2, 4 // groups, 6))
    x, f = cg.placeholder((None, 7, 6, 4), "float64", name="x"), _c(f_data)
    y = cg.conv2d(x, f, stride, ((pads[0], pads[1]), (pads[2], pads[3])), dilations=dil, groups=groups)
    want = _direct_conv(x_data, f_data, stride, pads, dil, groups)
    assert y.shape == (None, *want.shape[1:])
    np.testing.assert_allclose(_run(y, {x: x_data}), want, rtol=1e-12, atol=1e-12)


def test_depthwise_conv2d_convolves_each_channel_with_its_own_filters() -> None:
    x_data, f_data = RNG.normal(size=(2, 5, 5, 3)), RNG.normal(size=(3, 3, 3, 2))
    y = cg.nn.depthwise_conv2d(_c(x_data), _c(f_data), strides=2)
    got = _run(y)
    assert got.shape == (2, 3, 3, 6)
    for c in range(3):
        for m in range(2):
            one = _direct_conv(x_data[..., c : c + 1], f_data[:, :, c : c + 1, m : m + 1], 2, (1, 1, 1, 1), 1, 1)
            np.testing.assert_allclose(got[..., c * 2 + m], one[..., 0], rtol=1e-12)


def test_conv1d_is_conv2d_along_the_width() -> None:
    x_data, f_data = RNG.normal(size=(2, 9, 3)), RNG.normal(size=(3, 3, 4))
    x = cg.placeholder((None, None, 3), "float64", name="x")
    y = cg.conv1d(x, _c(f_data), stride=2, padding=(2, 1), dilation=2)
    xp = np.pad(x_data, ((0, 0), (2, 1), (0, 0)))
    want = np.stack([sum(xp[:, j * 2 + q * 2] @ f_data[q] for q in range(3)) for j in range(4)], axis=1)
    assert y.shape == (None, None, 4)
    np.testing.assert_allclose(_run(y, {x: x_data}), want, rtol=1e-12)
    (dx,) = cg.gradients(cg.reduce_sum(y), [x])
    assert _run(dx, {x: x_data}).shape == x_data.shape


def test_conv2d_transpose_is_the_input_gradient_of_conv2d() -> None:
    x_data, f_data = RNG.normal(size=(2, 3, 3, 4)), RNG.normal(size=(3, 3, 2, 4))
    x = cg.placeholder((None, 3, 3, 4), "float64", name="x")
    y = cg.conv2d_transpose(x, _c(f_data), (2, 6, 5, 2), strides=2)
    assert y.shape == (None, 6, 5, 2)
    # <conv2d_transpose(x), z> == <x, conv2d(z)> for every z: the adjoint's definition.
    z_data = RNG.normal(size=(2, 6, 5, 2))
    forward = _run(cg.conv2d(_c(z_data), _c(f_data), strides=2))
    assert np.vdot(_run(y, {x: x_data}), z_data) == pytest.approx(np.vdot(x_data, forward), rel=1e-12)
    assert cg.conv2d_transpose(x, _c(f_data), strides=2, padding="VALID").shape == (None, 7, 7, 2)


def test_max_pool_with_argmax_gives_tensorflows_flat_indices() -> None:
    x_data = RNG.permutation(2 * 4 * 4 * 3).astype(np.float64).reshape(2, 4, 4, 3)
    x = cg.placeholder((None, 4, 4, 3), "float64", name="x")
    values, at = cg.nn.max_pool_with_argmax(x, 2, 2)
    _, at_batch = cg.nn.max_pool_with_argmax(x, 2, 2, include_batch_in_index=True)
    (dx,) = cg.gradients(cg.reduce_sum(values), [x])
    got_values, got_at, got_batch, got_dx = _run([values, at, at_batch, dx], {x: x_data})
    assert got_at.dtype == np.int64 and got_at.shape == (2, 2, 2, 3)
    for n, i, j, c in np.ndindex(*got_at.shape):
        window = x_data[n, 2 * i : 2 * i + 2, 2 * j : 2 * j + 2, c]
        y, x = divmod(int(window.argmax()), 2)
        assert got_at[n, i, j, c] == ((2 * i + y) * 4 + 2 * j + x) * 3 + c
        assert got_batch[n, i, j, c] == got_at[n, i, j, c] + n * 4 * 4 * 3
        assert got_values[n, i, j, c] == window.max()
    # The gradient of the values lands on the maxima: one 1 per window, 0 elsewhere.
    assert got_dx.sum() == got_at.size and set(np.flatnonzero(got_dx)) == set(got_batch.ravel())


def test_conv2d_layer_takes_dilations_and_groups() -> None:
    x = cg.placeholder((None, 8, 8, 4), name="x")
    y = cg.layers.conv2d(x, 6, 3, dilations=2, groups=2, name="grouped")
    kernel = next(v for v in cg.get_default_graph().nodes if v.name == "grouped/kernel")
    assert y.shape == (None, 8, 8, 6) and kernel.output(0).shape == (3, 3, 2, 6)
    conv = y.node.inputs[0].node if y.node.op != "Conv2D" else y.node
    assert conv.attrs["dilations"] == (2, 2) and conv.attrs["groups"] == 2


def test_graphdef_round_trip_keeps_explicit_pads_dilations_and_groups() -> None:
    y = cg.conv2d(ph(None, 6, 6, 4), ph(3, 3, 2, 4, name="f"), padding=((1, 2), (0, 1)), dilations=(2, 1), groups=2)
    back = from_graphdef(to_graphdef(cg.get_default_graph())).node(y.node.name)
    assert back.attrs["padding"] == ((1, 2), (0, 1))
    assert back.attrs["dilations"] == (2, 1) and back.attrs["groups"] == 2
    assert back.output(0).shape == y.shape == (None, 5, 5, 4)


# ------------------------------------------------------------------- errors
def test_groups_must_be_a_positive_int() -> None:
    with raises(cg.ShapeError, "groups must be a positive int, got 0"):
        cg.conv2d(ph(None, 8, 8, 4), ph(3, 3, 4, 4, name="f"), groups=0)


def test_grouped_channels_must_match_the_filter() -> None:
    message = "input has 6 channels but the filter expects 2 per group, 4 in 2 groups: (None, 8, 8, 6) * (3, 3, 2, 4)"
    with raises(cg.ShapeError, message):
        cg.conv2d(ph(None, 8, 8, 6), ph(3, 3, 2, 4, name="f"), groups=2)


def test_output_channels_must_split_into_the_groups() -> None:
    message = "the filter's 5 output channels do not split into 2 groups: (None, 8, 8, 4) * (3, 3, 2, 5)"
    with raises(cg.ShapeError, message):
        cg.conv2d(ph(None, 8, 8, 4), ph(3, 3, 2, 5, name="f"), groups=2)


@pytest.mark.parametrize("dilations", [0, (1, 2, 3), True])
def test_bad_dilations(dilations: Any) -> None:
    message = f"dilations must be a positive int, a (height, width) pair or (1, height, width, 1), got {dilations!r}"
    with raises(cg.ShapeError, message):
        cg.conv2d(ph(None, 8, 8, 3), ph(3, 3, 3, 4, name="f"), dilations=dilations)


@pytest.mark.parametrize(
    "padding", [((1, 2),), ((1, -1), (0, 0)), ((1, 1), (0, 0), (0, 0)), [[1, 0], [0, 0], [1, 1], [0, 0]]]
)
def test_bad_explicit_padding(padding: Any) -> None:
    message = f"explicit padding must be ((top, bottom), (left, right)) of ints >= 0, got {padding!r}"
    with raises(cg.ShapeError, message):
        cg.conv2d(ph(None, 8, 8, 3), ph(3, 3, 3, 4, name="f"), padding=padding)


def test_tensorflows_four_explicit_pairs_are_accepted() -> None:
    y = cg.conv2d(ph(None, 8, 8, 3), ph(3, 3, 3, 4, name="f"), padding=[[0, 0], [1, 1], [2, 2], [0, 0]])
    assert y.node.attrs["padding"] == ((1, 1), (2, 2)) and y.shape == (None, 8, 10, 4)


def test_dilated_filter_larger_than_valid_input() -> None:
    message = (
        "filter height 3 dilated by 2 (spanning 5) is larger than the input height 4 with VALID padding: "
        "(None, 4, 8, 1) * (3, 3, 1, 2)"
    )
    with raises(cg.ShapeError, message):
        cg.conv2d(ph(None, 4, 8, 1), ph(3, 3, 1, 2, name="f"), padding="VALID", dilations=2)


def test_filter_larger_than_the_explicitly_padded_input() -> None:
    message = "filter width 4 is larger than the input width 2 padded by 0 + 1: (None, 8, 2, 1) * (3, 4, 1, 2)"
    with raises(cg.ShapeError, message):
        cg.conv2d(ph(None, 8, 2, 1), ph(3, 4, 1, 2, name="f"), padding=((1, 1), (0, 1)))


def test_pools_take_no_explicit_padding() -> None:
    with raises(cg.ShapeError, "padding must be 'SAME' or 'VALID', got ((1, 1), (1, 1))"):
        cg.max_pool(ph(None, 8, 8, 3), 2, 2, ((1, 1), (1, 1)))  # type: ignore[arg-type]


def test_depthwise_needs_known_channels() -> None:
    with raises(cg.ShapeError, "depthwise_conv2d 'dw' needs an NHWC input with known channels, got (None, 8, 8, None)"):
        cg.nn.depthwise_conv2d(ph(None, 8, 8, None), ph(3, 3, 3, 1, name="f"), name="dw")


def test_depthwise_filter_must_be_4d_with_known_window() -> None:
    message = (
        "depthwise_conv2d 'depthwise_conv2d': filter must be 4-D (height, width, channels, multiplier) with a known "
        "height and width, got (3, 3, 3)"
    )
    with raises(cg.ShapeError, message):
        cg.nn.depthwise_conv2d(ph(None, 8, 8, 3), ph(3, 3, 3, name="f"))


def test_depthwise_channels_must_match() -> None:
    message = (
        "depthwise_conv2d 'depthwise_conv2d': input has 3 channels but the filter has 4: (None, 8, 8, 3) * (3, 3, 4, 2)"
    )
    with raises(cg.ShapeError, message):
        cg.nn.depthwise_conv2d(ph(None, 8, 8, 3), ph(3, 3, 4, 2, name="f"))


def test_conv1d_shapes_and_attrs() -> None:
    with raises(cg.ShapeError, "conv1d 'conv1d': input must be 3-D (batch, width, channels), got (None, 8, 8, 3)"):
        cg.conv1d(ph(None, 8, 8, 3), ph(3, 3, 4, name="f"))
    with raises(cg.ShapeError, "conv1d 'conv1d': filter must be 3-D (width, in, out), got (3, 3, 3, 4)"):
        cg.conv1d(ph(None, 8, 3), ph(3, 3, 3, 4, name="f"))
    with raises(
        cg.ShapeError, "conv1d 'conv1d': padding must be 'SAME', 'VALID', an int or (before, after), got 'FULL'"
    ):
        cg.conv1d(ph(None, 8, 3), ph(3, 3, 4, name="f"), padding="FULL")
    with raises(cg.ShapeError, "conv1d 'conv1d': stride must be a positive int, got 0"):
        cg.conv1d(ph(None, 8, 3), ph(3, 3, 4, name="f"), stride=0)


def test_a_rejected_conv1d_leaves_the_graph_unchanged() -> None:
    x, f = ph(None, 8, 4), ph(3, 3, 4, name="f")
    before = [n.name for n in cg.get_default_graph().nodes]
    with raises(cg.ShapeError, "input has 4 channels but the filter expects 3 per group, 6 in 2 groups"):
        cg.conv1d(x, f, groups=2)
    assert [n.name for n in cg.get_default_graph().nodes] == before


def test_conv2d_transpose_channels_must_match_the_filters_last_axis() -> None:
    message = (
        "input has 3 channels but the filter's last axis (its inputs, transposed) has 4: (None, 4, 4, 3) * (3, 3, 2, 4)"
    )
    with raises(cg.ShapeError, message):
        cg.conv2d_transpose(ph(None, 4, 4, 3), ph(3, 3, 2, 4, name="f"))


def test_conv2d_transpose_output_shape_must_convolve_back_to_the_input() -> None:
    message = (
        "an output height of 9 convolves back to 5, not the input's 4: output (None, 9, 8, 2), "
        "input (None, 4, 4, 3), filter (3, 3, 2, 3)"
    )
    with raises(cg.ShapeError, message):
        cg.conv2d_transpose(ph(None, 4, 4, 3), ph(3, 3, 2, 3, name="f"), (9, 8), strides=2)


def test_conv2d_transpose_output_shape_must_be_ints() -> None:
    message = (
        "conv2d_transpose 'up': output_shape must be (height, width) or (batch, height, width, channels) of ints "
        ">= 0, got (8,)"
    )
    with raises(cg.ShapeError, message):
        cg.conv2d_transpose(ph(None, 4, 4, 3), ph(3, 3, 2, 3, name="f"), (8,), name="up")


def test_max_pool_with_argmax_include_batch_in_index_must_be_a_bool() -> None:
    with raises(cg.ShapeError, "include_batch_in_index must be a bool, got 1"):
        cg.nn.max_pool_with_argmax(ph(None, 4, 4, 3), include_batch_in_index=1)  # type: ignore[arg-type]


def test_a_dilated_pool_takes_valid_padding_only() -> None:
    with raises(cg.ShapeError, "a dilated pool takes VALID padding only, got 'SAME'"):
        cg.max_pool(ph(None, 8, 8, 3), 2, 1, "SAME", dilations=2)
