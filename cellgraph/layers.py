"""Layers: each makes a name scope holding its variables and ops.

``cg.layers.dense(x, 128, activation="relu")`` makes ``dense/kernel``,
``dense/bias`` and the ops between; a second dense layer gets ``dense_1``,
unless its cell is being re-run, where it replaces the first run's nodes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from cellgraph import init as initializers
from cellgraph.dataflow.errors import GraphError, ShapeError
from cellgraph.dataflow.graph import Tensor, name_scope
from cellgraph.dataflow.ops import array, conv, math, nn, normalization
from cellgraph.dataflow.ops.state import variable
from cellgraph.dataflow.shapes import fmt

Initializer = Callable[..., object]

ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "relu": lambda x: nn.relu(x),
    "sigmoid": lambda x: nn.sigmoid(x),
    "tanh": lambda x: nn.tanh(x),
    "softmax": lambda x: nn.softmax(x),
}


Activation = str | Callable[[Tensor], Tensor] | None


def _activation(activation: Activation) -> Callable[[Tensor], Tensor]:
    """The activation function, checked before a layer builds anything."""
    if activation is None:
        return lambda x: x
    if callable(activation):
        return activation
    if activation not in ACTIVATIONS:
        raise GraphError(f"unknown activation {activation!r}; known: {', '.join(sorted(ACTIVATIONS))}, or a callable")
    return ACTIVATIONS[activation]


def dense(
    x: Tensor,
    units: int,
    activation: str | Callable[[Tensor], Tensor] | None = None,
    use_bias: bool = True,
    kernel_init: Initializer = initializers.glorot_uniform,
    bias_init: Initializer = initializers.zeros,
    name: str = "dense",
) -> Tensor:
    """``activation(x @ kernel + bias)`` for ``x`` of shape (batch, features)."""
    if len(x.shape) != 2 or x.shape[1] is None:
        raise ShapeError(
            f"dense layer {name!r} needs a (batch, features) input with known features, got {fmt(x.shape)}"
        )
    activate = _activation(activation)
    with x.graph.atomic(), name_scope(name):
        kernel = variable(kernel_init, shape=(x.shape[1], units), dtype=x.dtype, name="kernel")
        y = math.matmul(x, kernel)
        if use_bias:
            y = nn.bias_add(y, variable(bias_init, shape=(units,), dtype=x.dtype, name="bias"))
        return activate(y)


def conv2d(
    x: Tensor,
    filters: int,
    kernel_size: int | Sequence[int],
    strides: int | Sequence[int] = 1,
    padding: str = "SAME",
    activation: str | Callable[[Tensor], Tensor] | None = None,
    use_bias: bool = True,
    kernel_init: Initializer = initializers.he_normal,
    name: str = "conv2d",
) -> Tensor:
    """2-D convolution over NHWC ``x`` with ``filters`` output channels."""
    sizes = (kernel_size, kernel_size) if isinstance(kernel_size, int) else tuple(kernel_size)
    if len(sizes) != 2:
        raise ShapeError(f"conv2d layer {name!r}: kernel_size must be an int or (height, width), got {kernel_size!r}")
    kh, kw = sizes
    if len(x.shape) != 4 or x.shape[3] is None:
        raise ShapeError(f"conv2d layer {name!r} needs an NHWC input with known channels, got {fmt(x.shape)}")
    activate = _activation(activation)
    with x.graph.atomic(), name_scope(name):
        kernel = variable(kernel_init, shape=(kh, kw, x.shape[3], filters), dtype=x.dtype, name="kernel")
        y = conv.conv2d(x, kernel, strides=strides, padding=padding)
        if use_bias:
            y = nn.bias_add(y, variable(initializers.zeros, shape=(filters,), dtype=x.dtype, name="bias"))
        return activate(y)


def batch_norm(
    x: Tensor,
    training: bool | Tensor,
    momentum: float = 0.99,
    epsilon: float = 1e-3,
    axis: int = -1,
    name: str = "batch_norm",
) -> Tensor:
    """Batch normalization of ``x`` over every axis but ``axis`` (the channels, which must be known).

    Makes ``gamma`` (ones) and ``beta`` (zeros), trained, and ``moving_mean``
    (zeros) and ``moving_variance`` (ones), not trained: in training
    (``training`` true, or a bool tensor holding true) the batch's statistics
    normalize and every step that computes the output moves the moving ones
    towards them by ``momentum``; otherwise the moving ones normalize.
    ``training`` may be a bool placeholder, so one graph trains and evaluates.

    Examples
    --------
    >>> import numpy as np
    >>> import cellgraph as cg
    >>> g = cg.Graph()
    >>> with g.as_default():
    ...     x = cg.constant(np.array([[1.0, 10.0], [3.0, 30.0]], np.float32))
    ...     y = cg.layers.batch_norm(x, training=True, momentum=0.5, epsilon=0.0)
    >>> sess = cg.Session(g)
    >>> sess.run(y)
    array([[-1., -1.],
           [ 1.,  1.]], dtype=float32)
    >>> sess.run(g.node("batch_norm/moving_mean").output(0))
    array([ 1., 10.], dtype=float32)
    """
    rank = len(x.shape)
    if not -rank <= axis < rank or x.shape[axis] is None:
        raise ShapeError(f"batch_norm layer {name!r} needs a known channel axis {axis}, got {fmt(x.shape)}")
    channels = x.shape[axis]
    with x.graph.atomic(), name_scope(name):
        gamma = variable(initializers.ones, shape=(channels,), dtype=x.dtype, name="gamma")
        beta = variable(initializers.zeros, shape=(channels,), dtype=x.dtype, name="beta")
        mean = variable(initializers.zeros, shape=(channels,), dtype=x.dtype, name="moving_mean", trainable=False)
        var = variable(initializers.ones, shape=(channels,), dtype=x.dtype, name="moving_variance", trainable=False)
        return normalization.batch_norm(x, gamma, beta, mean, var, training, momentum, epsilon, axis, name="output")


def layer_norm(x: Tensor, begin_axis: int = -1, epsilon: float = 1e-5, name: str = "layer_norm") -> Tensor:
    """Layer normalization of ``x`` over the axes from ``begin_axis`` on (their sizes must be known),
    with a trained ``gamma`` (ones) and ``beta`` (zeros) of those axes' shape.

    Examples
    --------
    >>> import numpy as np
    >>> import cellgraph as cg
    >>> g = cg.Graph()
    >>> with g.as_default():
    ...     y = cg.layers.layer_norm(cg.constant(np.array([[1.0, 3.0]], np.float32)), epsilon=0.0)
    >>> cg.Session(g).run(y)
    array([[-1.,  1.]], dtype=float32)
    """
    rank = len(x.shape)
    normalized = x.shape[begin_axis:] if -rank <= begin_axis < rank else None
    if normalized is None or None in normalized:
        raise ShapeError(f"layer_norm layer {name!r} needs known sizes from axis {begin_axis} on, got {fmt(x.shape)}")
    shape = tuple(d for d in normalized if d is not None)
    with x.graph.atomic(), name_scope(name):
        gamma = variable(initializers.ones, shape=shape, dtype=x.dtype, name="gamma")
        beta = variable(initializers.zeros, shape=shape, dtype=x.dtype, name="beta")
        return normalization.layer_norm(x, gamma, beta, begin_axis, epsilon, name="output")


def max_pool2d(
    x: Tensor, pool_size: int = 2, strides: int | None = None, padding: str = "VALID", name: str = "max_pool"
) -> Tensor:
    """The largest value of each ``pool_size`` window of NHWC ``x``; ``strides`` defaults to ``pool_size``."""
    return conv.max_pool(x, pool_size, strides or pool_size, padding, name=name)


def avg_pool2d(
    x: Tensor, pool_size: int = 2, strides: int | None = None, padding: str = "VALID", name: str = "avg_pool"
) -> Tensor:
    """The mean of each ``pool_size`` window of NHWC ``x``; ``strides`` defaults to ``pool_size``.

    With ``padding="SAME"`` a window at the edge averages only the pixels it covers.

    Examples
    --------
    >>> import numpy as np
    >>> import cellgraph as cg
    >>> g = cg.Graph()
    >>> with g.as_default():
    ...     x = cg.constant(np.arange(16, dtype=np.float32).reshape(1, 4, 4, 1))
    ...     y = cg.layers.avg_pool2d(x)
    >>> cg.Session(g).run(y)[0, :, :, 0]
    array([[ 2.5,  4.5],
           [10.5, 12.5]], dtype=float32)
    """
    return conv.avg_pool(x, pool_size, strides or pool_size, padding, name=name)


def flatten(x: Tensor, name: str = "flatten") -> Tensor:
    """(batch, ...) -> (batch, features)."""
    features = 1
    for d in x.shape[1:]:
        if d is None:
            raise ShapeError(f"flatten {name!r} needs known non-batch dims, got {fmt(x.shape)}")
        features *= d
    return array.reshape(x, (-1, features), name=name)


def dropout(x: Tensor, rate: float, seed: int | None = None, name: str = "dropout") -> Tensor:
    """Zero each element of ``x`` with probability ``rate``; scale the rest by ``1 / (1 - rate)``.

    The same op as ``cg.dropout``, seeded the same way: each run draws a new
    mask from a generator seeded by ``seed``, by default derived from the
    node's full name (as a variable's initial value is). So two dropout layers
    drop different elements, and the same model draws the same masks in every
    session and after its cell is re-run. Give ``seed`` to choose the masks.

    Examples
    --------
    >>> import numpy as np
    >>> import cellgraph as cg
    >>> g = cg.Graph()
    >>> with g.as_default():
    ...     y = cg.layers.dropout(cg.constant(np.ones(8, np.float32)), rate=0.5, name="drop")
    >>> mask = cg.Session(g).run(y)
    >>> sorted(set(mask.tolist())) == [0.0, 2.0] and np.array_equal(mask, cg.Session(g).run(y))
    True
    """
    return nn.dropout(x, rate, seed=seed, name=name)
