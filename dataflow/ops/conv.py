"""Convolution and pooling over NHWC images with HWIO filters, as in TensorFlow.

Gradients are ops of their own (``Conv2DBackpropInput``, ``MaxPoolGrad``, ...),
each a full registry entry with a NumPy reference and a gradient of its own,
so second derivatives work and every kernel is checked.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..graph import Node, Tensor
from ..kernels.cpu import conv as conv_kernels
from ..kernels.cpu import pool as pool_kernels
from ..kernels.cpu.conv import Padding, axis_padding, window
from ..kernels.cuda import cuda_kernel
from ..opdef import InferContext, KernelContext, OpDef, Shape, TensorSpec, register_op
from ..shapes import fmt
from .base import TensorLike, apply, as_tensor, check_fits, graph_of, require_float, rule_checked
from .windows import crop, explicit_pads, grouped, pad_for_windows, window_pair, window_taps

FAMILY = "conv"
Dys = list[Tensor | None]
Grads = list[Tensor | None]
HW = tuple[int, int]


# ---------------------------------------------------- attr checks for windows
def _window_attr(ctx: InferContext, key: str) -> HW:
    value = window_pair(ctx.attrs[key])
    if value is None:
        raise ctx.shape_error(
            f"{key} must be a positive int, a (height, width) pair or (1, height, width, 1), got {ctx.attrs[key]!r}"
        )
    return value


def _padding_attr(ctx: InferContext, explicit: bool = False) -> Padding:
    """The padding mode, or (where ``explicit``, for convolutions) per-side pads."""
    padding = ctx.attrs["padding"]
    if isinstance(padding, str) and padding in ("SAME", "VALID"):
        return str(padding)
    if explicit and not isinstance(padding, str):
        pads = explicit_pads(padding)
        if pads is None:
            raise ctx.shape_error(
                f"explicit padding must be ((top, bottom), (left, right)) of ints >= 0, got {padding!r}"
            )
        return pads
    raise ctx.shape_error(f"padding must be 'SAME' or 'VALID', got {padding!r}")


def _nhwc(ctx: InferContext, what: str, spec: TensorSpec) -> None:
    if spec.rank != 4:
        raise ctx.shape_error(f"{what} must be 4-D NHWC (batch, height, width, channels), got {fmt(spec.shape)}")


def _spatial(
    ctx: InferContext, x: Shape, k: tuple[int | None, int | None], what: str, shapes: str, conv: bool = False
) -> Shape:
    """Output (height, width) of windows ``k`` sliding over NHWC ``x``."""
    strides, padding = _window_attr(ctx, "strides"), _padding_attr(ctx, explicit=conv)
    dilations = _window_attr(ctx, "dilations") if "dilations" in ctx.attrs else (1, 1)
    if not conv and dilations != (1, 1) and padding != "VALID":
        # A dilated SAME window can straddle a small input and read no real pixel.
        raise ctx.shape_error(f"a dilated pool takes VALID padding only, got {padding!r}")
    out: list[int | None] = []
    for axis, name in ((1, "height"), (2, "width")):
        size, kk, s, d = x[axis], k[axis - 1], strides[axis - 1], dilations[axis - 1]
        if size is None or kk is None:
            out.append(None)
            continue
        span = (kk - 1) * d + 1
        dilated = f" dilated by {d} (spanning {span})" if d > 1 else ""
        pads = axis_padding(padding, axis - 1)
        if pads == "VALID" and span > size:
            raise ctx.shape_error(
                f"{what} {name} {kk}{dilated} is larger than the input {name} {size} with VALID padding: {shapes}"
            )
        if isinstance(pads, tuple) and span > size + pads[0] + pads[1]:
            raise ctx.shape_error(
                f"{what} {name} {kk}{dilated} is larger than the input {name} {size} padded by "
                f"{pads[0]} + {pads[1]}: {shapes}"
            )
        out.append(window(size, kk, s, pads, d)[0])
    return tuple(out)


def _strides_padding(node: Node) -> tuple[HW, Any]:
    """The validated attrs of a node that exists (its shape rule checked them)."""
    strides = window_pair(node.attrs["strides"])
    assert strides is not None
    return strides, node.attrs["padding"]


# ---------------------------------------------------------------- convolution
def _groups_attr(ctx: InferContext) -> int:
    groups = ctx.attrs.get("groups", 1)
    if not isinstance(groups, (int, np.integer)) or isinstance(groups, bool) or groups < 1:
        raise ctx.shape_error(f"groups must be a positive int, got {groups!r}")
    return int(groups)


def _conv_output(ctx: InferContext, x: TensorSpec, f: TensorSpec) -> Shape:
    """The NHWC output shape of conv2d(x, f), checking every shape and attr involved."""
    shapes = f"{fmt(x.shape)} * {fmt(f.shape)}"
    _nhwc(ctx, "input", x)
    if f.rank != 4:
        raise ctx.shape_error(f"filter must be 4-D HWIO (height, width, in, out), got {fmt(f.shape)}")
    groups = _groups_attr(ctx)
    c, i, o = x.shape[3], f.shape[2], f.shape[3]
    if groups == 1 and c is not None and i is not None and c != i:
        raise ctx.shape_error(f"input has {c} channels but the filter expects {i}: {shapes}")
    if groups > 1 and c is not None and i is not None and c != i * groups:
        raise ctx.shape_error(
            f"input has {c} channels but the filter expects {i} per group, {i * groups} in {groups} groups: {shapes}"
        )
    if o is not None and o % groups:
        raise ctx.shape_error(f"the filter's {o} output channels do not split into {groups} groups: {shapes}")
    oh, ow = _spatial(ctx, x.shape, (f.shape[0], f.shape[1]), "filter", shapes, conv=True)
    return (x.shape[0], oh, ow, o)


def _infer_conv2d(ctx: InferContext) -> TensorSpec:
    x, f = ctx.inputs
    dtype = require_float(ctx, x, f)
    return TensorSpec(_conv_output(ctx, x, f), dtype)


def _infer_conv2d_backprop_input(ctx: InferContext) -> TensorSpec:
    like, f, dy = ctx.inputs
    dtype = require_float(ctx, like, f, dy)
    check_fits(ctx, "out_backprop", dy, _conv_output(ctx, like, f))
    return TensorSpec(like.shape, dtype)


def _infer_conv2d_backprop_filter(ctx: InferContext) -> TensorSpec:
    x, like, dy = ctx.inputs
    dtype = require_float(ctx, x, like, dy)
    check_fits(ctx, "out_backprop", dy, _conv_output(ctx, x, like))
    return TensorSpec(like.shape, dtype)


def _conv_attrs(attrs: dict[str, Any]) -> tuple[HW, Any, HW, int]:
    """(strides, padding, dilations, groups); graphs saved before dilations and groups existed lack them."""
    return attrs["strides"], attrs["padding"], attrs.get("dilations", (1, 1)), attrs.get("groups", 1)


def _ref_conv2d(attrs: dict[str, Any], x: np.ndarray, f: np.ndarray) -> np.ndarray:
    strides, padding, dilations, groups = _conv_attrs(attrs)
    xp, oh, ow, _, _ = pad_for_windows(x, f.shape[:2], strides, padding, dilations=dilations)
    out = np.zeros((x.shape[0], oh, ow, groups, f.shape[3] // groups), x.dtype)
    for p, q, index in window_taps(f.shape[:2], strides, oh, ow, dilations):
        out += np.einsum("nhwgc,cgo->nhwgo", grouped(xp[index], groups), grouped(f[p, q], groups))
    return out.reshape(*out.shape[:3], f.shape[3])


def _ref_conv2d_backprop_input(attrs: dict[str, Any], like: np.ndarray, f: np.ndarray, dy: np.ndarray) -> np.ndarray:
    strides, padding, dilations, groups = _conv_attrs(attrs)
    dxp, oh, ow, top, left = pad_for_windows(np.zeros_like(like), f.shape[:2], strides, padding, dilations=dilations)
    dyg = grouped(dy, groups)
    for p, q, index in window_taps(f.shape[:2], strides, oh, ow, dilations):
        part = np.einsum("nhwgo,cgo->nhwgc", dyg, grouped(f[p, q], groups))
        dxp[index] += part.reshape(*part.shape[:3], like.shape[3])
    return crop(dxp, top, left, like.shape).copy()


def _ref_conv2d_backprop_filter(attrs: dict[str, Any], x: np.ndarray, like: np.ndarray, dy: np.ndarray) -> np.ndarray:
    strides, padding, dilations, groups = _conv_attrs(attrs)
    xp, oh, ow, _, _ = pad_for_windows(x, like.shape[:2], strides, padding, dilations=dilations)
    df = np.zeros_like(like)
    dyg = grouped(dy, groups)
    for p, q, index in window_taps(like.shape[:2], strides, oh, ow, dilations):
        df[p, q] = np.einsum("nhwgc,nhwgo->cgo", grouped(xp[index], groups), dyg).reshape(like.shape[2:])
    return df


def _conv_kwargs(node: Node) -> dict[str, Any]:
    """The attrs a gradient rule passes on to the convolutions it builds."""
    strides, padding, dilations, groups = _conv_attrs(node.attrs)
    return {"strides": strides, "padding": padding, "dilations": dilations, "groups": groups}


def _grad_conv2d(node: Node, dys: Dys) -> Grads:
    (x, f), g = node.inputs, dys[0]
    assert g is not None
    kw = _conv_kwargs(node)
    return [conv2d_backprop_input(x, f, g, **kw), conv2d_backprop_filter(x, f, g, **kw)]


def _grad_conv2d_backprop_input(node: Node, dys: Dys) -> Grads:
    # dx is bilinear in (f, dy): its adjoints are the other two convolutions.
    (_, f, dy), z = node.inputs, dys[0]
    assert z is not None
    kw = _conv_kwargs(node)
    return [None, conv2d_backprop_filter(z, f, dy, **kw), conv2d(z, f, **kw)]


def _grad_conv2d_backprop_filter(node: Node, dys: Dys) -> Grads:
    (x, _, dy), z = node.inputs, dys[0]
    assert z is not None
    kw = _conv_kwargs(node)
    return [conv2d_backprop_input(x, z, dy, **kw), None, conv2d(x, z, **kw)]


def _conv_kernel(make: Any) -> Any:
    def factory(node: Node, ctx: KernelContext) -> Any:
        return make(*_conv_attrs(node.attrs))

    return factory


register_op(OpDef(
    name="Conv2D", family=FAMILY, infer=_infer_conv2d, reference=_ref_conv2d,
    grad=_grad_conv2d,
    kernels={"cpu": rule_checked(_conv_kernel(conv_kernels.conv2d)),
             "cuda": rule_checked(cuda_kernel("conv", "conv_op", "conv2d"))},
))  # fmt: skip
register_op(OpDef(
    name="Conv2DBackpropInput", family=FAMILY, infer=_infer_conv2d_backprop_input,
    reference=_ref_conv2d_backprop_input, grad=_grad_conv2d_backprop_input,
    kernels={
        "cpu": rule_checked(_conv_kernel(conv_kernels.conv2d_input_grad)),
        "cuda": rule_checked(cuda_kernel("conv", "conv_op", "conv2d_input_grad")),
    },
))  # fmt: skip
register_op(OpDef(
    name="Conv2DBackpropFilter", family=FAMILY, infer=_infer_conv2d_backprop_filter,
    reference=_ref_conv2d_backprop_filter, grad=_grad_conv2d_backprop_filter,
    kernels={
        "cpu": rule_checked(_conv_kernel(conv_kernels.conv2d_filter_grad)),
        "cuda": rule_checked(cuda_kernel("conv", "conv_op", "conv2d_filter_grad")),
    },
))  # fmt: skip


def _window_attrs(strides: Any, padding: Any, ksize: Any = None, dilations: Any = None) -> dict[str, Any]:
    # Normalised when valid; kept as given otherwise, for the shape rule to
    # report with the node's name and cell.
    attrs = {"strides": window_pair(strides) or strides, "padding": padding}
    if ksize is not None:
        attrs["ksize"] = window_pair(ksize) or ksize
    if dilations is not None:
        attrs["dilations"] = window_pair(dilations) or dilations
    return attrs


def conv_attrs(strides: Any, padding: Any, dilations: Any, groups: Any) -> dict[str, Any]:
    """A convolution node's attrs, normalised where valid (as ``_window_attrs``)."""
    if not isinstance(padding, str):
        padding = explicit_pads(padding) or padding
    return {**_window_attrs(strides, padding, dilations=dilations), "groups": groups}


def conv2d(
    x: TensorLike,
    filters: TensorLike,
    strides: int | Sequence[int] = 1,
    padding: str | int | Sequence[Sequence[int]] = "SAME",
    dilations: int | Sequence[int] = 1,
    groups: int = 1,
    name: str = "conv2d",
) -> Tensor:
    """2-D convolution of NHWC ``x`` with HWIO ``filters`` (cross-correlation, as in TensorFlow).

    ``strides`` and ``dilations`` are an int, (height, width) or (1, height,
    width, 1); ``padding`` is "SAME" (output size ``ceil(input / stride)``),
    "VALID" (only whole windows), or explicit pads: an int for every side,
    ((top, bottom), (left, right)), or TensorFlow's four NHWC pairs. With
    ``groups`` > 1 the channels split into that many groups, each convolved
    with its own slice of the filter's outputs: ``filters`` is then
    (height, width, channels / groups, out).

    Examples
    --------
    >>> import numpy as np
    >>> import cellgraph as cg
    >>> g = cg.Graph()
    >>> with g.as_default():
    ...     x = cg.placeholder((None, 8, 8, 3), name="images")
    ...     y = cg.conv2d(x, cg.constant(np.ones((3, 3, 3, 16), np.float32)), strides=2)
    ...     z = cg.conv2d(y, cg.constant(np.ones((3, 3, 4, 16), np.float32)), padding=((1, 1), (2, 2)),
    ...                   dilations=2, groups=4)
    >>> y.shape, z.shape
    ((None, 4, 4, 16), (None, 2, 4, 16))
    """
    g = graph_of([x, filters])
    attrs = conv_attrs(strides, padding, dilations, groups)
    return apply("Conv2D", [as_tensor(x, graph=g), as_tensor(filters, graph=g)], attrs, name=name)


def conv2d_backprop_input(
    x: Tensor,
    filters: TensorLike,
    dy: Tensor,
    strides: int | Sequence[int] = 1,
    padding: Any = "SAME",
    dilations: int | Sequence[int] = 1,
    groups: int = 1,
    name: str = "conv2d_backprop_input",
) -> Tensor:
    """The gradient of ``conv2d(x, filters)`` for ``x``, given the output's gradient ``dy``.

    ``x`` only lends its (run-time) shape; its values are not read.
    """
    attrs = conv_attrs(strides, padding, dilations, groups)
    return apply("Conv2DBackpropInput", [x, as_tensor(filters, graph=x.graph), dy], attrs, name=name)


def conv2d_backprop_filter(
    x: TensorLike,
    filters: Tensor,
    dy: Tensor,
    strides: int | Sequence[int] = 1,
    padding: Any = "SAME",
    dilations: int | Sequence[int] = 1,
    groups: int = 1,
    name: str = "conv2d_backprop_filter",
) -> Tensor:
    """The gradient of ``conv2d(x, filters)`` for ``filters``, given the output's gradient ``dy``.

    ``filters`` only lends its shape; its values are not read.
    """
    attrs = conv_attrs(strides, padding, dilations, groups)
    return apply("Conv2DBackpropFilter", [as_tensor(x, graph=filters.graph), filters, dy], attrs, name=name)


# ---------------------------------------------------------------------- pooling
def _pool_output(ctx: InferContext, x: TensorSpec) -> Shape:
    _nhwc(ctx, "input", x)
    ksize = _window_attr(ctx, "ksize")
    shapes = f"window {fmt(ksize)} over {fmt(x.shape)}"
    oh, ow = _spatial(ctx, x.shape, ksize, "window", shapes)
    return (x.shape[0], oh, ow, x.shape[3])


def _infer_pool(ctx: InferContext) -> TensorSpec:
    x = ctx.inputs[0]
    return TensorSpec(_pool_output(ctx, x), require_float(ctx, x))


def _infer_pool_grad(ctx: InferContext) -> TensorSpec:
    """(x or its stand-in, dy) -> dx."""
    x, dy = ctx.inputs
    dtype = require_float(ctx, x, dy)
    check_fits(ctx, "out_backprop", dy, _pool_output(ctx, x))
    return TensorSpec(x.shape, dtype)


def _infer_max_pool_grad_grad(ctx: InferContext) -> TensorSpec:
    """(x, ddx) -> ddy."""
    x, ddx = ctx.inputs
    dtype = require_float(ctx, x, ddx)
    check_fits(ctx, "gradient", ddx, x.shape)
    return TensorSpec(_pool_output(ctx, x), dtype)


def _pool_attrs(attrs: dict[str, Any]) -> tuple[HW, HW, str, HW]:
    return attrs["ksize"], attrs["strides"], attrs["padding"], attrs.get("dilations", (1, 1))


def _windows(x: np.ndarray, attrs: dict[str, Any], fill: float) -> tuple[np.ndarray, int, int, int, int]:
    """Every window tap of ``x``'s pooling as one (taps, n, oh, ow, c) stack, plus the geometry."""
    k, strides, padding, dilations = _pool_attrs(attrs)
    xp, oh, ow, top, left = pad_for_windows(x, k, strides, padding, fill, dilations)
    return np.stack([xp[index] for _, _, index in window_taps(k, strides, oh, ow, dilations)]), oh, ow, top, left


def _scatter_taps(values: np.ndarray, like: np.ndarray, attrs: dict[str, Any]) -> np.ndarray:
    """The adjoint of ``_windows``: add each tap's (n, oh, ow, c) values back onto its pixels."""
    k, strides, padding, dilations = _pool_attrs(attrs)
    dxp, oh, ow, top, left = pad_for_windows(np.zeros_like(like), k, strides, padding, dilations=dilations)
    for t, (_, _, index) in enumerate(window_taps(k, strides, oh, ow, dilations)):
        dxp[index] += values[t]
    return crop(dxp, top, left, like.shape).copy()


def _ref_max_pool(attrs: dict[str, Any], x: np.ndarray) -> np.ndarray:
    return _windows(x, attrs, -np.inf)[0].max(axis=0)


def _ref_max_pool_grad(attrs: dict[str, Any], x: np.ndarray, dy: np.ndarray) -> np.ndarray:
    taps = _windows(x, attrs, -np.inf)[0]
    first_max = taps.argmax(axis=0) == np.arange(len(taps)).reshape(-1, 1, 1, 1, 1)
    return _scatter_taps(np.where(first_max, dy, 0).astype(x.dtype), x, attrs)


def _ref_max_pool_grad_grad(attrs: dict[str, Any], x: np.ndarray, ddx: np.ndarray) -> np.ndarray:
    taps = _windows(x, attrs, -np.inf)[0]
    first_max = taps.argmax(axis=0) == np.arange(len(taps)).reshape(-1, 1, 1, 1, 1)
    return np.where(first_max, _windows(ddx, attrs, 0.0)[0], 0).sum(axis=0).astype(x.dtype)


def _avg_pool_counts(like: np.ndarray, attrs: dict[str, Any]) -> np.ndarray:
    """How many real (unpadded) pixels each output's window covers."""
    return _windows(np.ones((1, *like.shape[1:3], 1), like.dtype), attrs, 0.0)[0].sum(axis=0)


def _ref_avg_pool(attrs: dict[str, Any], x: np.ndarray) -> np.ndarray:
    return (_windows(x, attrs, 0.0)[0].sum(axis=0) / _avg_pool_counts(x, attrs)).astype(x.dtype)


def _ref_avg_pool_grad(attrs: dict[str, Any], like: np.ndarray, dy: np.ndarray) -> np.ndarray:
    share = (dy / _avg_pool_counts(like, attrs)).astype(dy.dtype)
    return _scatter_taps(np.broadcast_to(share, (attrs["ksize"][0] * attrs["ksize"][1], *share.shape)), like, attrs)


def _pool_args(node: Node) -> tuple[HW, HW, str, HW]:
    ksize, (strides, padding) = window_pair(node.attrs["ksize"]), _strides_padding(node)
    assert ksize is not None
    return ksize, strides, padding, node.attrs.get("dilations", (1, 1))


def _grad_max_pool(node: Node, dys: Dys) -> Grads:
    return [max_pool_grad(node.inputs[0], dys[0], *_pool_args(node))]


def _grad_max_pool_grad(node: Node, dys: Dys) -> Grads:
    # dx is linear in dy (routed through x's maxima, which move only at ties).
    return [None, max_pool_grad_grad(node.inputs[0], dys[0], *_pool_args(node))]


def _grad_max_pool_grad_grad(node: Node, dys: Dys) -> Grads:
    return [None, max_pool_grad(node.inputs[0], dys[0], *_pool_args(node))]


def _grad_avg_pool(node: Node, dys: Dys) -> Grads:
    return [avg_pool_grad(node.inputs[0], dys[0], *_pool_args(node))]


def _grad_avg_pool_grad(node: Node, dys: Dys) -> Grads:
    assert dys[0] is not None
    ksize, strides, padding, dilations = _pool_args(node)
    return [None, avg_pool(dys[0], ksize, strides, padding, dilations=dilations)]


def _pool_kernel(make: Any) -> Any:
    def factory(node: Node, ctx: KernelContext) -> Any:
        return make(*_pool_args(node))

    return factory


# name, shape rule, reference, gradient, CPU kernel, CUDA kernel (a function of kernels/cuda/conv.py)
_POOLS: list[tuple[str, Any, Any, Any, Any, str]] = [
    ("MaxPool",         _infer_pool,               _ref_max_pool,           _grad_max_pool,           pool_kernels.max_pool_forward,           "max_pool"),
    ("MaxPoolGrad",     _infer_pool_grad,          _ref_max_pool_grad,      _grad_max_pool_grad,      pool_kernels.max_pool_backprop,          "max_pool_grad"),
    ("MaxPoolGradGrad", _infer_max_pool_grad_grad, _ref_max_pool_grad_grad, _grad_max_pool_grad_grad, pool_kernels.max_pool_backprop_backprop, "max_pool_grad_grad"),
    ("AvgPool",         _infer_pool,               _ref_avg_pool,           _grad_avg_pool,           pool_kernels.avg_pool_forward,           "avg_pool"),
    ("AvgPoolGrad",     _infer_pool_grad,          _ref_avg_pool_grad,      _grad_avg_pool_grad,      pool_kernels.avg_pool_backprop,          "avg_pool_grad"),
]  # fmt: skip
# The shape rule runs again on the arrays' shapes: the kernels index x by dy's (or ddx's) shape, and with dims
# unknown when building, a dy of another batch or size read past the end of x (a segfault for MaxPoolGrad) or
# returned numbers without a word; a forward window wider than a fed image is refused in the rule's words too.
for _name, _infer, _ref, _grad, _cpu, _cuda in _POOLS:
    register_op(OpDef(
        name=_name, family=FAMILY, infer=_infer, reference=_ref, grad=_grad,
        kernels={"cpu": rule_checked(_pool_kernel(_cpu)), "cuda": rule_checked(cuda_kernel("conv", "pool_op", _cuda))},
    ))  # fmt: skip


def _pool(
    op: str, inputs: Sequence[TensorLike], ksize: Any, strides: Any, padding: Any, name: str, dilations: Any = 1
) -> Tensor:
    return apply(op, inputs, _window_attrs(strides, padding, ksize, dilations), name=name)


def max_pool(
    x: TensorLike,
    ksize: int | Sequence[int] = 2,
    strides: int | Sequence[int] = 2,
    padding: str = "VALID",
    name: str = "max_pool",
    dilations: int | Sequence[int] = 1,
) -> Tensor:
    """The largest value of each ``ksize`` window of NHWC ``x``, per channel.

    ``ksize``, ``strides`` and ``dilations`` are an int, (height, width) or
    (1, h, w, 1); with "SAME" padding the padded pixels never win. A dilated
    window (taps ``dilations`` apart) takes VALID padding.
    """
    return _pool("MaxPool", [x], ksize, strides, padding, name, dilations)


def avg_pool(
    x: TensorLike,
    ksize: int | Sequence[int] = 2,
    strides: int | Sequence[int] = 2,
    padding: str = "VALID",
    name: str = "avg_pool",
    dilations: int | Sequence[int] = 1,
) -> Tensor:
    """The mean of each ``ksize`` window of NHWC ``x``, per channel; with "SAME"
    padding a window averages only the real pixels it covers. A dilated window
    takes VALID padding."""
    return _pool("AvgPool", [x], ksize, strides, padding, name, dilations)


def max_pool_grad(
    x: Tensor,
    dy: Tensor | None,
    ksize: Any,
    strides: Any,
    padding: str,
    dilations: Any = 1,
    name: str = "max_pool_grad",
) -> Tensor:
    """The gradient of ``max_pool(x)``: ``dy`` routed to each window's first maximum."""
    assert dy is not None
    return _pool("MaxPoolGrad", [x, dy], ksize, strides, padding, name, dilations)


def max_pool_grad_grad(
    x: Tensor,
    ddx: Tensor | None,
    ksize: Any,
    strides: Any,
    padding: str,
    dilations: Any = 1,
    name: str = "max_pool_grad_grad",
) -> Tensor:
    """The gradient of ``max_pool_grad`` for its ``dy``: ``ddx`` read at each window's first maximum."""
    assert ddx is not None
    return _pool("MaxPoolGradGrad", [x, ddx], ksize, strides, padding, name, dilations)


def avg_pool_grad(
    like: Tensor,
    dy: Tensor | None,
    ksize: Any,
    strides: Any,
    padding: str,
    dilations: Any = 1,
    name: str = "avg_pool_grad",
) -> Tensor:
    """The gradient of ``avg_pool``: ``dy`` spread evenly over each window; ``like`` lends its shape."""
    assert dy is not None
    return _pool("AvgPoolGrad", [like, dy], ksize, strides, padding, name, dilations)


__all__ = ["avg_pool", "conv2d", "conv2d_backprop_filter", "conv2d_backprop_input", "max_pool"]
