"""Layers: each makes a name scope holding its variables and ops.

``cg.layers.dense(x, 128, activation="relu")`` makes ``dense/kernel``,
``dense/bias`` and the ops between; a second dense layer gets ``dense_1``,
unless its cell is being re-run, where it replaces the first run's nodes.

A dtype policy (``with cg.layers.policy("mixed_float16"):``, see
``cellgraph/precision.py``) decides the dtype of a layer's variables and of
its computation: float32 variables and float16 compute for a mixed model.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from cellgraph import init as initializers
from cellgraph.dataflow.errors import GraphError, ShapeError
from cellgraph.dataflow.graph import Tensor, name_scope
from cellgraph.dataflow.ops import activations, array, conv, math, math_unary, nn, normalization
from cellgraph.dataflow.ops.placeholder_default import placeholder_with_default
from cellgraph.dataflow.ops.state import variable
from cellgraph.dataflow.shapes import fmt
from cellgraph.precision import Policy, current_policy, layer_dtypes, layer_input, policy, read, to_compute

Initializer = Callable[..., object]

ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "relu": lambda x: nn.relu(x),
    "sigmoid": lambda x: nn.sigmoid(x),
    "tanh": lambda x: nn.tanh(x),
    "softmax": lambda x: nn.softmax(x),
    "gelu": lambda x: activations.gelu(x),
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


def _kernel_then_bias(
    x: Tensor,
    kernel_shape: tuple[int, ...],
    kernel_init: Initializer,
    apply_kernel: Callable[[Tensor, Tensor], Tensor],
    bias_init: Initializer | None,
    dtypes: tuple[str, str],
) -> Tensor:
    """``apply_kernel(x, kernel)``, plus a bias over its last axis unless ``bias_init`` is None.

    The ``kernel`` and ``bias`` variables of every weighted layer, made in the
    caller's name scope in this order (a checkpoint or a PS layout lists them so),
    in ``dtypes[0]``, and read (with ``x``) in compute dtype ``dtypes[1]``.
    """
    kept, compute = dtypes
    x = to_compute(x, compute, name=f"input_{compute}")
    kernel = variable(kernel_init, shape=kernel_shape, dtype=kept, name="kernel")
    y = apply_kernel(x, read(kernel, compute))
    if bias_init is None:
        return y
    return nn.bias_add(y, read(variable(bias_init, shape=(kernel_shape[-1],), dtype=kept, name="bias"), compute))


def dense(
    x: Tensor,
    units: int,
    activation: str | Callable[[Tensor], Tensor] | None = None,
    use_bias: bool = True,
    kernel_init: Initializer = initializers.glorot_uniform,
    bias_init: Initializer = initializers.zeros,
    name: str = "dense",
) -> Tensor:
    """``activation(x @ kernel + bias)`` for ``x`` of shape (batch, ..., features): the same kernel
    for every position of the middle axes (each token of a sequence, say)."""
    x = layer_input(x, "dense", name)
    if len(x.shape) < 2 or x.shape[-1] is None:
        raise ShapeError(
            f"dense layer {name!r} needs a (batch, ..., features) input with known features, got {fmt(x.shape)}"
        )
    activate = _activation(activation)
    dtypes = layer_dtypes(x, "dense", name)
    with x.graph.atomic(), name_scope(name):
        kernel_shape = (x.shape[-1], units)
        y = _kernel_then_bias(x, kernel_shape, kernel_init, math.matmul, bias_init if use_bias else None, dtypes)
        return activate(y)


def conv2d(
    x: Tensor,
    filters: int,
    kernel_size: int | Sequence[int],
    strides: int | Sequence[int] = 1,
    padding: str | int | Sequence[Sequence[int]] = "SAME",
    activation: str | Callable[[Tensor], Tensor] | None = None,
    use_bias: bool = True,
    kernel_init: Initializer = initializers.he_normal,
    name: str = "conv2d",
    dilations: int | Sequence[int] = 1,
    groups: int = 1,
) -> Tensor:
    """2-D convolution over NHWC ``x`` with ``filters`` output channels.

    ``dilations``, ``groups`` and explicit ``padding`` are ``cg.conv2d``'s; with
    ``groups`` > 1 the kernel is (kh, kw, channels / groups, filters).
    """
    x = layer_input(x, "conv2d", name)
    sizes = (kernel_size, kernel_size) if isinstance(kernel_size, int) else tuple(kernel_size)
    if len(sizes) != 2:
        raise ShapeError(f"conv2d layer {name!r}: kernel_size must be an int or (height, width), got {kernel_size!r}")
    kh, kw = sizes
    if len(x.shape) != 4 or x.shape[3] is None:
        raise ShapeError(f"conv2d layer {name!r} needs an NHWC input with known channels, got {fmt(x.shape)}")
    activate = _activation(activation)
    dtypes = layer_dtypes(x, "conv2d", name)
    with x.graph.atomic(), name_scope(name):
        per_group = x.shape[3] // groups if isinstance(groups, int) and groups > 0 else x.shape[3]

        def convolve(x: Tensor, kernel: Tensor) -> Tensor:
            return conv.conv2d(x, kernel, strides=strides, padding=padding, dilations=dilations, groups=groups)

        shape = (kh, kw, per_group, filters)
        y = _kernel_then_bias(x, shape, kernel_init, convolve, initializers.zeros if use_bias else None, dtypes)
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
    As in Keras (whose ``momentum`` and ``epsilon`` these are) and ONNX, the
    batch variance that normalizes and moves ``moving_variance`` is the
    biased one (divided by the count n); PyTorch's ``running_var`` moves by
    the unbiased one (n - 1), so the two differ by a factor n / (n - 1).
    A channel with one value in the batch (a batch of 1 without spatial
    axes) normalizes to ``beta`` in training, as in Keras; PyTorch refuses it.

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
    x = layer_input(x, "batch_norm", name)
    rank = len(x.shape)
    if not -rank <= axis < rank or x.shape[axis] is None:
        raise ShapeError(f"batch_norm layer {name!r} needs a known channel axis {axis}, got {fmt(x.shape)}")
    channels = x.shape[axis]
    kept, compute = layer_dtypes(x, "batch_norm", name)
    with x.graph.atomic(), name_scope(name):
        # Under a mixed policy every variable is float32 and so are the statistics: the op normalizes a half
        # input in float32 and returns it in its own dtype (Keras's BatchNormalization and torch.autocast do).
        x = to_compute(x, compute, name=f"input_{compute}")
        gamma = variable(initializers.ones, shape=(channels,), dtype=kept, name="gamma")
        beta = variable(initializers.zeros, shape=(channels,), dtype=kept, name="beta")
        mean = variable(initializers.zeros, shape=(channels,), dtype=kept, name="moving_mean", trainable=False)
        var = variable(initializers.ones, shape=(channels,), dtype=kept, name="moving_variance", trainable=False)
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
    x = layer_input(x, "layer_norm", name)
    rank = len(x.shape)
    normalized = x.shape[begin_axis:] if -rank <= begin_axis < rank else None
    if normalized is None or None in normalized:
        raise ShapeError(f"layer_norm layer {name!r} needs known sizes from axis {begin_axis} on, got {fmt(x.shape)}")
    shape = tuple(d for d in normalized if d is not None)
    kept, compute = layer_dtypes(x, "layer_norm", name)
    with x.graph.atomic(), name_scope(name):
        x = to_compute(x, compute, name=f"input_{compute}")
        gamma = variable(initializers.ones, shape=shape, dtype=kept, name="gamma")
        beta = variable(initializers.zeros, shape=shape, dtype=kept, name="beta")
        # A half input with float32 gamma and beta is normalized in float32 (as batch_norm's statistics are).
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
    x = layer_input(x, "flatten", name)
    features = 1
    for d in x.shape[1:]:
        if d is None:
            raise ShapeError(f"flatten {name!r} needs known non-batch dims, got {fmt(x.shape)}")
        features *= d
    return array.reshape(x, (-1, features), name=name)


def training_switch(default: bool = True, name: str = "training") -> Tensor:
    """A scalar bool tensor that is ``default`` unless fed: the ``training`` argument of
    ``dropout`` and ``batch_norm``, so one graph trains (fed nothing) and evaluates (fed ``False``).

    Examples
    --------
    >>> import numpy as np
    >>> import cellgraph as cg
    >>> g = cg.Graph()
    >>> with g.as_default():
    ...     training = cg.layers.training_switch()
    ...     y = cg.layers.dropout(cg.constant(np.ones(4, np.float32)), 0.5, training=training)
    >>> cg.Session(g).run(y, {training: False})
    array([1., 1., 1., 1.], dtype=float32)
    """
    if not isinstance(default, bool):
        raise GraphError(f"training_switch {name!r}: default must be True or False, got {default!r}")
    return placeholder_with_default(default, (), name=name)


def _check_training(training: object, name: str) -> None:
    """The words of batch_norm's own check (dataflow/ops/normalization.py), for the dropout layer."""
    if isinstance(training, bool):
        return
    if not isinstance(training, Tensor) or training.dtype != "bool" or training.shape != ():
        shown = f"{training.dtype} {fmt(training.shape)}" if isinstance(training, Tensor) else repr(training)
        raise TypeError(f"dropout layer {name!r}: training must be a bool or a scalar bool tensor, got {shown}")


def dropout(
    x: Tensor, rate: float, seed: int | None = None, training: bool | Tensor = True, name: str = "dropout"
) -> Tensor:
    """Zero each element of ``x`` with probability ``rate``; scale the rest by ``1 / (1 - rate)``.

    Only in training: with ``training`` false ``x`` passes unchanged; with a
    bool tensor (``training_switch()``) the output is the dropped-out ``x``
    where it holds true and ``x`` where it is fed false.

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
    _check_training(training, name)
    if training is False:
        return x
    if training is True:
        return nn.dropout(x, rate, seed=seed, name=name)
    assert isinstance(training, Tensor)
    with x.graph.atomic(), name_scope(name):
        dropped = nn.dropout(x, rate, seed=seed, name="dropout")
        return math_unary.where(training, dropped, x, name="output")


# The sequence and recurrent layers live in their own modules (this one holds the per-position layers).
from cellgraph.recurrent import gru, lstm  # noqa: E402
from cellgraph.sequence_layers import embedding, multi_head_attention  # noqa: E402

__all__ = [
    "Policy", "avg_pool2d", "batch_norm", "conv2d", "current_policy", "dense", "dropout", "embedding", "flatten",
    "gru", "layer_norm", "lstm", "max_pool2d", "multi_head_attention", "policy", "training_switch",
]  # fmt: skip


def __dir__() -> list[str]:
    """What ``cg.layers.<Tab>`` offers: its public names, not the modules and types it imports for itself."""
    return sorted(__all__)
