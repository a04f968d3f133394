"""Every error the layers raise, with its words; a rejected layer adds no nodes."""

from __future__ import annotations

from collections.abc import Callable

import pytest

import cellgraph as cg

from .dataflow.errors_helpers import ph, raises

Layer = Callable[..., cg.Tensor]


def _conv2d_3x3(x: cg.Tensor, filters: int, **kwargs: object) -> cg.Tensor:
    return cg.layers.conv2d(x, filters, 3, **kwargs)  # type: ignore[arg-type]


# The layers that take an activation, each with an input it accepts.
WITH_ACTIVATION = [(cg.layers.dense, (None, 4)), (_conv2d_3x3, (None, 8, 8, 3))]


@pytest.mark.parametrize(
    ("shape", "shown"),
    [((None,), "(None,)"), ((None, 4, None), "(None, 4, None)"), ((None, None), "(None, None)"), ((), "()")],
)
def test_dense_needs_a_batch_then_known_features(shape: tuple[int | None, ...], shown: str) -> None:
    g = cg.Graph()
    with g.as_default():
        x = ph(*shape)
        with raises(
            cg.ShapeError,
            f"dense layer 'hidden' needs a (batch, ..., features) input with known features, got {shown}",
        ):
            cg.layers.dense(x, 3, name="hidden")
    assert g.nodes == [x.node]


@pytest.mark.parametrize(
    ("shape", "shown"), [((None, 8, 8), "(None, 8, 8)"), ((None, 8, 8, None), "(None, 8, 8, None)")]
)
def test_conv2d_layer_needs_an_nhwc_input_with_known_channels(shape: tuple[int | None, ...], shown: str) -> None:
    g = cg.Graph()
    with g.as_default():
        x = ph(*shape)
        with raises(cg.ShapeError, f"conv2d layer 'stem' needs an NHWC input with known channels, got {shown}"):
            cg.layers.conv2d(x, 16, 3, name="stem")
    assert g.nodes == [x.node]


@pytest.mark.parametrize(
    ("shape", "shown"), [((None, None, 4), "(None, None, 4)"), ((None, 2, 2, None), "(None, 2, 2, None)")]
)
def test_flatten_needs_known_non_batch_dims(shape: tuple[int | None, ...], shown: str) -> None:
    g = cg.Graph()
    with g.as_default():
        x = ph(*shape)
        with raises(cg.ShapeError, f"flatten 'flat' needs known non-batch dims, got {shown}"):
            cg.layers.flatten(x, name="flat")
    assert g.nodes == [x.node]


@pytest.mark.parametrize(("layer", "shape"), WITH_ACTIVATION, ids=["dense", "conv2d"])
def test_unknown_activation_lists_the_known_ones(layer: Layer, shape: tuple[int | None, ...]) -> None:
    g = cg.Graph()
    with g.as_default():
        x = ph(*shape)
        with raises(
            cg.GraphError, "unknown activation 'swish'; known: gelu, relu, sigmoid, softmax, tanh, or a callable"
        ):
            layer(x, 3, activation="swish")


@pytest.mark.parametrize(("layer", "shape"), WITH_ACTIVATION, ids=["dense", "conv2d"])
def test_a_layer_with_an_unknown_activation_adds_no_nodes(layer: Layer, shape: tuple[int | None, ...]) -> None:
    g = cg.Graph()
    with g.as_default():
        x = ph(*shape)
        with raises(cg.GraphError, "unknown activation 'swish'"):
            layer(x, 3, activation="swish")
    assert g.nodes == [x.node]
