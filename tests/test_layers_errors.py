"""Every error the layers raise, with its words; a rejected layer adds no nodes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
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


@pytest.mark.parametrize(
    ("build", "layer", "what"),
    [
        (lambda a: cg.layers.dense(a, 4), "dense", "input"),
        (lambda a: cg.layers.conv2d(a, 4, 3), "conv2d", "input"),
        (lambda a: cg.layers.batch_norm(a, True), "batch_norm", "input"),
        (lambda a: cg.layers.layer_norm(a), "layer_norm", "input"),
        (lambda a: cg.layers.flatten(a), "flatten", "input"),
        (lambda a: cg.layers.lstm(a, 3), "lstm", "input"),
        (lambda a: cg.layers.gru(a, 3), "gru", "input"),
        (lambda a: cg.layers.multi_head_attention(a, num_heads=2), "multi_head_attention", "query"),
    ],
)
def test_a_numpy_array_given_to_a_layer_is_refused_saying_how_data_reaches_a_graph(
    build: Any, layer: str, what: str
) -> None:
    """It ended in "AttributeError: 'numpy.ndarray' object has no attribute 'graph'" (as Keras takes arrays)."""
    g = cg.Graph()
    with g.as_default(), pytest.raises(TypeError) as err:
        build(np.ones((2, 3, 4), np.float32))
    assert str(err.value) == (
        f"{layer} layer {layer!r}: its {what} must be a cellgraph Tensor (a cg.placeholder or an op's output), got "
        "a numpy.ndarray of shape (2, 3, 4); feed data through a placeholder (session.run(..., {x: data})), or "
        "make it part of the graph with cg.constant(data)"
    )
    assert not g.nodes  # nothing added


def test_ids_given_to_an_embedding_as_a_list_are_refused() -> None:
    g = cg.Graph()
    with g.as_default(), pytest.raises(TypeError, match=r"^embedding layer 'embedding': its ids must be a cellgraph "
                                       r"Tensor \(a cg.placeholder or an op's output\), got a list; feed"):  # fmt: skip
        cg.layers.embedding([1, 2], 3, 4)
