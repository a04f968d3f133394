"""The convolution variants built on ``conv.py``'s ops: depthwise and 1-D
convolution, the transposed convolution, and max pooling that also returns
where each maximum was.

``depthwise_conv2d`` and ``conv1d`` are views onto ``Conv2D`` (a depthwise
filter reshaped to one input channel per group; a sequence seen as an image of
height 1), so they share its kernels, gradients and checks. ``Conv2DTranspose``
is the input gradient of a convolution run as a forward op: it has an output
shape of its own instead of an input that lends one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import ShapeError
from ..graph import Node, Tensor
from ..kernels.cpu import conv as conv_kernels
from ..kernels.cpu import pool as pool_kernels
from ..kernels.cpu.conv import axis_padding
from ..kernels.cuda import cuda_kernel
from ..opdef import InferContext, KernelContext, OpDef, TensorSpec, register_op
from ..shapes import fmt
from . import array, conv
from .base import TensorLike, apply, apply_node, as_tensor, graph_of, require_float, rule_checked

FAMILY = "conv"
Dys = list[Tensor | None]
Grads = list[Tensor | None]


# ----------------------------------------------------------------- depthwise
def depthwise_conv2d(
    x: TensorLike,
    filters: TensorLike,
    strides: int | Sequence[int] = 1,
    padding: Any = "SAME",
    dilations: int | Sequence[int] = 1,
    name: str = "depthwise_conv2d",
) -> Tensor:
    """Each channel of NHWC ``x`` convolved with its own filters, as TensorFlow's
    ``depthwise_conv2d``: ``filters`` is (height, width, channels, multiplier)
    and output channel ``c * multiplier + m`` is channel ``c`` with filter ``m``.

    It is ``conv2d`` with ``groups`` = channels, the filter seen as
    (height, width, 1, channels * multiplier); ``x``'s channels must be known.

    Examples
    --------
    >>> import numpy as np
    >>> import cellgraph as cg
    >>> g = cg.Graph()
    >>> with g.as_default():
    ...     x = cg.placeholder((None, 8, 8, 3), name="images")
    ...     y = cg.nn.depthwise_conv2d(x, cg.constant(np.ones((3, 3, 3, 2), np.float32)), strides=2)
    >>> y.shape
    (None, 4, 4, 6)
    """
    g = graph_of([x, filters])
    xt, ft = as_tensor(x, graph=g), as_tensor(filters, graph=g)
    if len(xt.shape) != 4 or xt.shape[3] is None:
        raise ShapeError(f"depthwise_conv2d {name!r} needs an NHWC input with known channels, got {fmt(xt.shape)}")
    if len(ft.shape) != 4 or ft.shape[0] is None or ft.shape[1] is None:
        raise ShapeError(
            f"depthwise_conv2d {name!r}: filter must be 4-D (height, width, channels, multiplier) with a known "
            f"height and width, got {fmt(ft.shape)}"
        )
    c = xt.shape[3]
    if ft.shape[2] is not None and ft.shape[2] != c:
        raise ShapeError(
            f"depthwise_conv2d {name!r}: input has {c} channels but the filter has {ft.shape[2]}: "
            f"{fmt(xt.shape)} * {fmt(ft.shape)}"
        )
    with g.atomic():
        grouped = array.reshape(ft, (ft.shape[0], ft.shape[1], 1, -1), name=f"{name}_filter")
        return conv.conv2d(xt, grouped, strides, padding, dilations, groups=c, name=name)


# ---------------------------------------------------------------------- 1-D
def _along_width(value: Any, what: str, name: str) -> Any:
    """A 1-D stride or dilation as conv2d's (1, value)."""
    if isinstance(value, (tuple, list)) and len(value) == 1:
        value = value[0]
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
        raise ShapeError(f"conv1d {name!r}: {what} must be a positive int, got {value!r}")
    return (1, int(value))


def conv1d(
    x: TensorLike,
    filters: TensorLike,
    stride: int = 1,
    padding: Any = "SAME",
    dilation: int = 1,
    groups: int = 1,
    name: str = "conv1d",
) -> Tensor:
    """1-D convolution of (batch, width, channels) ``x`` with (width, in, out) ``filters``.

    ``padding`` is "SAME", "VALID", an int for both sides or (before, after).
    It runs as ``conv2d`` over a height-1 view of both (no copies), with the
    same kernels and gradients.
    """
    g = graph_of([x, filters])
    xt, ft = as_tensor(x, graph=g), as_tensor(filters, graph=g)
    if len(xt.shape) != 3:
        raise ShapeError(f"conv1d {name!r}: input must be 3-D (batch, width, channels), got {fmt(xt.shape)}")
    if len(ft.shape) != 3:
        raise ShapeError(f"conv1d {name!r}: filter must be 3-D (width, in, out), got {fmt(ft.shape)}")
    if padding in ("SAME", "VALID"):
        pads: Any = padding
    elif isinstance(padding, (int, np.integer)) and not isinstance(padding, bool):
        pads = ((0, 0), (padding, padding))
    elif isinstance(padding, (tuple, list)) and len(padding) == 2:
        pads = ((0, 0), tuple(padding))
    else:
        raise ShapeError(
            f"conv1d {name!r}: padding must be 'SAME', 'VALID', an int or (before, after), got {padding!r}"
        )
    strides, dilations = _along_width(stride, "stride", name), _along_width(dilation, "dilation", name)
    with g.atomic():
        y = conv.conv2d(
            array.expand_dims(xt, 1, name=f"{name}_image"),
            array.expand_dims(ft, 0, name=f"{name}_filter"),
            strides, pads, dilations, groups, name=name,
        )  # fmt: skip
        return array.squeeze(y, 1, name=f"{name}_squeeze")


# ------------------------------------------------------- transposed convolution
def _default_size(size: int, k: int, stride: int, padding: Any, dilation: int) -> int:
    """The output size whose convolution gives back ``size``: the largest for VALID and explicit pads."""
    span = (k - 1) * dilation + 1
    if padding == "SAME":
        return size * stride
    before, after = (0, 0) if padding == "VALID" else padding
    return (size - 1) * stride + span - before - after


def _output_size(attrs: dict[str, Any], x: tuple[Any, ...], f: tuple[Any, ...]) -> tuple[Any, Any]:
    """(height, width) of a transposed convolution's output; None where unknown."""
    if attrs["output_size"] is not None:
        return attrs["output_size"]
    strides, padding, dilations, _ = conv._conv_attrs(attrs)
    return tuple(  # type: ignore[return-value]
        None
        if x[1 + i] is None or f[i] is None
        else _default_size(x[1 + i], f[i], strides[i], axis_padding(padding, i), dilations[i])
        for i in range(2)
    )


def _infer_conv2d_transpose(ctx: InferContext) -> TensorSpec:
    x, f = ctx.inputs
    dtype = require_float(ctx, x, f)
    conv._nhwc(ctx, "input", x)
    if f.rank != 4:
        raise ctx.shape_error(f"filter must be 4-D HWIO (height, width, out, in), got {fmt(f.shape)}")
    groups = conv._groups_attr(ctx)
    o, fo = x.shape[3], f.shape[3]
    if o is not None and fo is not None and o != fo:
        raise ctx.shape_error(
            f"input has {o} channels but the filter's last axis (its inputs, transposed) has {fo}: "
            f"{fmt(x.shape)} * {fmt(f.shape)}"
        )
    conv._window_attr(ctx, "strides")
    conv._padding_attr(ctx, explicit=True)
    conv._window_attr(ctx, "dilations")  # all three read by the output size below
    h, w = _output_size(ctx.attrs, x.shape, f.shape)
    out = TensorSpec((x.shape[0], h, w, None if f.shape[2] is None else f.shape[2] * groups), dtype)
    back = conv._conv_output(ctx, out, f)  # also checks strides, padding, dilations and groups
    for axis, label in ((1, "height"), (2, "width")):
        if back[axis] is not None and x.shape[axis] is not None and back[axis] != x.shape[axis]:
            raise ctx.shape_error(
                f"an output {label} of {out.shape[axis]} convolves back to {back[axis]}, not the input's "
                f"{x.shape[axis]}: output {fmt(out.shape)}, input {fmt(x.shape)}, filter {fmt(f.shape)}"
            )
    return out


def _transposed_like(attrs: dict[str, Any], x: Any, f: Any) -> tuple[int, ...]:
    """The (n, h, w, c) of the output at run time."""
    h, w = _output_size(attrs, x.shape, f.shape)
    return (x.shape[0], h, w, f.shape[2] * attrs["groups"])


def _ref_conv2d_transpose(attrs: dict[str, Any], x: np.ndarray, f: np.ndarray) -> np.ndarray:
    return conv._ref_conv2d_backprop_input(attrs, np.zeros(_transposed_like(attrs, x, f), x.dtype), f, x)


def _grad_conv2d_transpose(node: Node, dys: Dys) -> Grads:
    (x, f), z = node.inputs, dys[0]
    assert z is not None
    kw = conv._conv_kwargs(node)
    return [conv.conv2d(z, f, **kw), conv.conv2d_backprop_filter(z, f, x, **kw)]


class _Like:
    """Stands in for the input a transposed convolution has none of: the gradient kernels read only its shape."""

    def __init__(self, shape: tuple[int, ...]) -> None:
        self.shape = shape


def _transpose_kernel(node: Node, ctx: KernelContext) -> Any:
    run, attrs = conv_kernels.conv2d_input_grad(*conv._conv_attrs(node.attrs)), node.attrs
    return lambda x, f: run(_Like(_transposed_like(attrs, x, f)), f, x)


def _transpose_cuda(node: Node, ctx: KernelContext) -> Any:
    run, attrs = cuda_kernel("conv", "conv_op", "conv2d_input_grad")(node, ctx), node.attrs
    return lambda x, f: run(_Like(_transposed_like(attrs, x, f)), f, x)


register_op(OpDef(
    name="Conv2DTranspose", family=FAMILY, infer=_infer_conv2d_transpose, reference=_ref_conv2d_transpose,
    grad=_grad_conv2d_transpose,
    kernels={"cpu": rule_checked(_transpose_kernel), "cuda": rule_checked(_transpose_cuda)},
))  # fmt: skip


def conv2d_transpose(
    x: TensorLike,
    filters: TensorLike,
    output_shape: Sequence[int] | None = None,
    strides: int | Sequence[int] = 1,
    padding: Any = "SAME",
    dilations: int | Sequence[int] = 1,
    groups: int = 1,
    name: str = "conv2d_transpose",
) -> Tensor:
    """The transposed convolution (TensorFlow's ``conv2d_transpose``): the gradient of
    ``conv2d(y, filters, ...)`` for ``y``, applied to NHWC ``x``.

    ``filters`` is HWIO of the forward convolution, (height, width, out, in):
    ``x`` has ``in`` channels and the result ``out * groups``. ``output_shape``
    is the result's (height, width), or TensorFlow's (batch, height, width,
    channels) whose batch is ignored; without it the size is the largest whose
    convolution gives back ``x``'s (``x * stride`` for SAME). Strides, padding,
    dilations and groups are those of the forward convolution.

    Examples
    --------
    >>> import numpy as np
    >>> import cellgraph as cg
    >>> g = cg.Graph()
    >>> with g.as_default():
    ...     x = cg.placeholder((None, 4, 4, 16), name="features")
    ...     y = cg.conv2d_transpose(x, cg.constant(np.ones((3, 3, 8, 16), np.float32)), (7, 7), strides=2)
    >>> y.shape
    (None, 7, 7, 8)
    """
    size: Any = None
    if output_shape is not None:
        shape = tuple(output_shape)
        size = shape[1:3] if len(shape) == 4 else shape
        if len(size) != 2 or not all(isinstance(d, (int, np.integer)) and d >= 0 for d in size):
            raise ShapeError(
                f"conv2d_transpose {name!r}: output_shape must be (height, width) or (batch, height, width, "
                f"channels) of ints >= 0, got {output_shape!r}"
            )
        size = (int(size[0]), int(size[1]))
    g = graph_of([x, filters])
    attrs = {**conv.conv_attrs(strides, padding, dilations, groups), "output_size": size}
    return apply("Conv2DTranspose", [as_tensor(x, graph=g), as_tensor(filters, graph=g)], attrs, name=name)


# ------------------------------------------------------------ max pool + argmax
def _infer_max_pool_with_argmax(ctx: InferContext) -> list[TensorSpec]:
    x = ctx.inputs[0]
    if not isinstance(ctx.attrs["include_batch_in_index"], bool):
        raise ctx.shape_error(f"include_batch_in_index must be a bool, got {ctx.attrs['include_batch_in_index']!r}")
    shape = conv._pool_output(ctx, x)
    return [TensorSpec(shape, require_float(ctx, x)), TensorSpec(shape, "int64")]


def _ref_max_pool_with_argmax(attrs: dict[str, Any], x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    taps = conv._windows(x, attrs, -np.inf)[0]
    first = taps.argmax(axis=0)[None]
    per_image = int(np.prod(x.shape[1:]))
    where = np.arange(x.size, dtype=np.int64).reshape(x.shape)
    if not attrs["include_batch_in_index"]:
        where %= max(per_image, 1)
    at = np.take_along_axis(conv._windows(where, attrs, -1)[0], first, 0)[0]
    return np.take_along_axis(taps, first, 0)[0], at


def _grad_max_pool_with_argmax(node: Node, dys: Dys) -> Grads:
    if dys[0] is None:  # only the argmax was used: it has no gradient
        return [None]
    return [conv.max_pool_grad(node.inputs[0], dys[0], *conv._pool_args(node))]


def _argmax_kernel(node: Node, ctx: KernelContext) -> Any:
    ksize, strides, padding, _ = conv._pool_args(node)  # an argmax pool has no dilations
    return pool_kernels.max_pool_with_argmax(ksize, strides, padding, node.attrs["include_batch_in_index"])


register_op(OpDef(
    name="MaxPoolWithArgmax", family=FAMILY, infer=_infer_max_pool_with_argmax,
    reference=_ref_max_pool_with_argmax, grad=_grad_max_pool_with_argmax,
    kernels={"cpu": _argmax_kernel, "cuda": cuda_kernel("conv", "max_pool_with_argmax_op")},
))  # fmt: skip


def max_pool_with_argmax(
    x: TensorLike,
    ksize: int | Sequence[int] = 2,
    strides: int | Sequence[int] = 2,
    padding: str = "VALID",
    include_batch_in_index: bool = False,
    name: str = "max_pool_with_argmax",
) -> tuple[Tensor, Tensor]:
    """``max_pool(x)`` and, for each output, the flat index (int64) of its window's
    first maximum, as TensorFlow's ``max_pool_with_argmax``: ``(y * width + x) *
    channels + c`` within the image, plus ``batch * height * width * channels``
    with ``include_batch_in_index``. Only the values have a gradient."""
    attrs = {**conv._window_attrs(strides, padding, ksize), "include_batch_in_index": include_batch_in_index}
    node = apply_node("MaxPoolWithArgmax", [x], attrs, name=name)
    return node.output(0), node.output(1)


__all__ = ["conv1d", "conv2d_transpose", "depthwise_conv2d", "max_pool_with_argmax"]
