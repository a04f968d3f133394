"""Oracle rows of the convolution variants: dilations, explicit pads, groups
(depthwise included), conv1d, conv2d_transpose and max pooling's argmax.

The torch side is ``torch.nn.functional.conv2d`` with its own ``dilation``,
``groups`` and ``padding`` arguments (TensorFlow's SAME, which pads the odd
pixel after, becomes an explicit ``F.pad``); the gradient ops are torch's
autograd of that forward op. Rows follow ``rows.py``'s conventions and are
appended to its ``ROWS``.
"""

from __future__ import annotations

from typing import Any

import cellgraph as cg

from .rows import ZERO, Row, x

try:
    import torch
    import torch.nn.functional as F  # noqa: N812 - PyTorch's own spelling
except ImportError:  # the comparisons skip (test_ops.py); the table still loads
    torch = F = None  # type: ignore[assignment]

HW = tuple[int, int]


def _pair(v: Any) -> HW:
    return (v, v) if isinstance(v, int) else (v[0], v[1])


def _pads(size: int, k: int, stride: int, dilation: int, padding: Any, axis: int) -> tuple[int, int]:
    """(before, after) along one axis, from the semantics documented for cg.conv2d."""
    if padding == "VALID":
        return 0, 0
    if padding == "SAME":
        out = -(-size // stride)
        total = max((out - 1) * stride + (k - 1) * dilation + 1 - size, 0)
        return total // 2, total - total // 2
    if isinstance(padding, int):
        return padding, padding
    return padding[axis][0], padding[axis][1]


def torch_conv2d(a: Any, f: Any, strides: Any = 1, padding: Any = "SAME", dilations: Any = 1, groups: int = 1) -> Any:
    """cg.conv2d's semantics on torch: NHWC ``a``, HWIO ``f`` (in = channels / groups)."""
    s, d = _pair(strides), _pair(dilations)
    (top, bottom), (left, right) = (_pads(a.shape[1 + i], f.shape[i], s[i], d[i], padding, i) for i in range(2))
    xn = a.permute(0, 3, 1, 2)
    if top == bottom and left == right:  # torch pads symmetrically itself
        pad: Any = (top, left)
    else:
        xn, pad = F.pad(xn, (left, right, top, bottom)), 0
    y = F.conv2d(xn, f.permute(3, 2, 0, 1), stride=s, padding=pad, dilation=d, groups=groups)
    return y.permute(0, 2, 3, 1)


def torch_conv2d_backprop_input(like: Any, f: Any, dy: Any, **kw: Any) -> Any:
    z = torch.zeros(like.shape, dtype=like.dtype, requires_grad=True)
    (dx,) = torch.autograd.grad(torch_conv2d(z, f, **kw), z, dy, create_graph=True)
    return dx


def torch_conv2d_backprop_filter(a: Any, like: Any, dy: Any, **kw: Any) -> Any:
    z = torch.zeros(like.shape, dtype=like.dtype, requires_grad=True)
    (df,) = torch.autograd.grad(torch_conv2d(a, z, **kw), z, dy, create_graph=True)
    return df


def _conv(id_: str, xs: Any, fs: Any, dys: Any, **kw: Any) -> list[Row]:
    variants = kw.pop("variants", ())
    return [
        Row("Conv2D", lambda a, f: cg.conv2d(a, f, **kw), lambda a, f: torch_conv2d(a, f, **kw), [xs, fs], id=id_,
            variants=variants),
        Row("Conv2DBackpropInput", lambda a, f, dy: cg.conv2d_backprop_input(a, f, dy, **kw),
            lambda a, f, dy: torch_conv2d_backprop_input(a, f, dy, **kw), [xs, fs, dys], id=id_),
        Row("Conv2DBackpropFilter", lambda a, f, dy: cg.conv2d_backprop_filter(a, f, dy, **kw),
            lambda a, f, dy: torch_conv2d_backprop_filter(a, f, dy, **kw), [xs, fs, dys], id=id_),
    ]  # fmt: skip


CONV_ROWS: list[Row] = [
    *_conv("dilated-same", x("n", 6, 6, 2), x(3, 3, 2, 3), x("n", 6, 6, 3), dilations=2, variants=ZERO),
    *_conv("dilated-valid-stride", x("n", 7, 8, 2), x(2, 2, 2, 2), x("n", 3, 5, 2), strides=(2, 1),
           padding="VALID", dilations=(2, 3)),
    *_conv("pads-asymmetric", x("n", 4, 5, 2), x(3, 2, 2, 3), x("n", 3, 7, 3), padding=((1, 0), (2, 1)),
           variants=ZERO),
    *_conv("pads-symmetric-stride2", x("n", 5, 5, 2), x(3, 3, 2, 2), x("n", 3, 3, 2), strides=2, padding=1),
    *_conv("groups2", x("n", 4, 4, 4), x(3, 3, 2, 6), x("n", 4, 4, 6), groups=2, variants=ZERO),
    *_conv("depthwise-stride2", x("n", 5, 5, 3), x(3, 3, 1, 3), x("n", 3, 3, 3), strides=2, groups=3),
    *_conv("depthwise-mult2-dilated", x("n", 6, 5, 2), x(2, 2, 1, 4), x("n", 4, 3, 4), padding="VALID",
           dilations=2, groups=2),
    *_conv("groups-pads-stride-dilated", x("n", 6, 5, 4), x(2, 3, 2, 2), x("n", 3, 2, 2), strides=2,
           padding=((1, 1), (0, 1)), dilations=(2, 1), groups=2),
]  # fmt: skip


def torch_conv2d_transpose(a: Any, f: Any, size: HW, **kw: Any) -> Any:
    """The gradient of the forward convolution for its input, applied to ``a``."""
    like = torch.zeros((a.shape[0], *size, f.shape[2] * kw.get("groups", 1)), dtype=a.dtype)
    return torch_conv2d_backprop_input(like, f, a, **kw)


def torch_max_pool_with_argmax(a: Any, k: HW, s: HW) -> Any:
    """Values and TensorFlow's index ((y * width + x) * channels + c) from torch's per-plane (y * width + x)."""
    values, at = F.max_pool2d(a.permute(0, 3, 1, 2), k, s, return_indices=True)
    at = at * a.shape[3] + torch.arange(a.shape[3]).reshape(1, -1, 1, 1)
    return values.permute(0, 2, 3, 1), at.permute(0, 2, 3, 1).to(a.dtype)


def _transpose(id_: str, xs: Any, fs: Any, size: HW, **kw: Any) -> Row:
    return Row("Conv2DTranspose", lambda a, f: cg.conv2d_transpose(a, f, size, **kw),
               lambda a, f: torch_conv2d_transpose(a, f, size, **kw), [xs, fs], id=id_)  # fmt: skip


CONV_ROWS += [
    _transpose("same-stride2", x("n", 3, 3, 3), x(3, 3, 2, 3), (6, 5), strides=2),
    _transpose("valid-stride21", x("n", 3, 4, 2), x(2, 3, 3, 2), (6, 6), strides=(2, 1), padding="VALID"),
    _transpose("pads-dilated-groups", x("n", 5, 6, 2), x(2, 2, 2, 2), (6, 6), padding=((1, 0), (1, 1)),
               dilations=2, groups=2),
    Row("MaxPoolWithArgmax", lambda a: cg.nn.max_pool_with_argmax(a, (2, 3), (2, 1))[0],
        lambda a: torch_max_pool_with_argmax(a, (2, 3), (2, 1))[0], [x("n", 5, 6, 2)], id="values", variants=ZERO),
    Row("MaxPoolWithArgmax", lambda a: cg.cast(cg.nn.max_pool_with_argmax(a, 2, 2)[1], "float64"),
        lambda a: torch_max_pool_with_argmax(a, (2, 2), (2, 2))[1], [x("n", 4, 6, 3)], id="argmax"),
]  # fmt: skip


def torch_avg_pool_dilated(a: Any, k: HW, s: HW, d: HW) -> Any:
    """The mean of each VALID dilated window: torch's unfold gathers the taps."""
    n, h, w, c = a.shape
    oh, ow = ((h - (k[0] - 1) * d[0] - 1) // s[0] + 1, (w - (k[1] - 1) * d[1] - 1) // s[1] + 1)
    taps = F.unfold(a.permute(0, 3, 1, 2), k, dilation=d, stride=s).reshape(n, c, k[0] * k[1], oh, ow)
    return taps.mean(2).permute(0, 2, 3, 1)


def _torch_max_dilated(a: Any, k: HW, s: HW, d: HW) -> Any:
    return F.max_pool2d(a.permute(0, 3, 1, 2), k, s, dilation=d).permute(0, 2, 3, 1)


CONV_ROWS += [
    Row("MaxPool", lambda a: cg.max_pool(a, (2, 3), (1, 2), dilations=(2, 2)),
        lambda a: _torch_max_dilated(a, (2, 3), (1, 2), (2, 2)), [x("n", 6, 8, 2)], id="dilated", variants=ZERO),
    Row("AvgPool", lambda a: cg.avg_pool(a, 2, (2, 1), dilations=(3, 2)),
        lambda a: torch_avg_pool_dilated(a, (2, 2), (2, 1), (3, 2)), [x("n", 7, 6, 2)], id="dilated", variants=ZERO),
]  # fmt: skip
