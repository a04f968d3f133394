"""The PyTorch side of the rows that need more than one line: TensorFlow's
conventions (NHWC images, HWIO filters, SAME padding that puts the odd pixel
after, NumPy basic indexing with negative steps) written over torch ops.

Written from the ops' documented semantics, never from cellgraph's reference
implementations; the gradient ops (``Conv2DBackpropInput``, ``MaxPoolGrad``,
...) are torch's own autograd of the forward op, so they are checked against
what they claim to be.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812 - torch's own spelling

HW = tuple[int, int]


# ------------------------------------------------------------------ windows
def _same(size: int, k: int, stride: int) -> tuple[int, int]:
    """TensorFlow's SAME padding along one dim: ``ceil(size / stride)`` outputs,
    the shortfall split with the odd pixel after."""
    out = -(-size // stride)
    total = max((out - 1) * stride + k - size, 0)
    return total // 2, total - total // 2


def _pad_nchw(x: torch.Tensor, k: HW, strides: HW, padding: str, value: float = 0.0) -> torch.Tensor:
    if padding == "VALID":
        return x
    top, bottom = _same(x.shape[2], k[0], strides[0])
    left, right = _same(x.shape[3], k[1], strides[1])
    return F.pad(x, (left, right, top, bottom), value=value)


def _nchw(x: torch.Tensor) -> torch.Tensor:
    return x.permute(0, 3, 1, 2)


def _nhwc(x: torch.Tensor) -> torch.Tensor:
    return x.permute(0, 2, 3, 1)


def conv2d(x: torch.Tensor, f: torch.Tensor, strides: HW = (1, 1), padding: str = "SAME") -> torch.Tensor:
    """Cross-correlation of NHWC ``x`` with HWIO ``f``."""
    xp = _pad_nchw(_nchw(x), (f.shape[0], f.shape[1]), strides, padding)
    return _nhwc(F.conv2d(xp, f.permute(3, 2, 0, 1), stride=strides))


def conv2d_backprop_input(
    like: torch.Tensor, f: torch.Tensor, dy: torch.Tensor, strides: HW = (1, 1), padding: str = "SAME"
) -> torch.Tensor:
    """d conv2d(x, f) / dx applied to ``dy``; ``like`` lends only its shape."""
    x = torch.zeros(like.shape, dtype=like.dtype, requires_grad=True)
    (dx,) = torch.autograd.grad(conv2d(x, f, strides, padding), x, dy, create_graph=True)
    return dx


def conv2d_backprop_filter(
    x: torch.Tensor, like: torch.Tensor, dy: torch.Tensor, strides: HW = (1, 1), padding: str = "SAME"
) -> torch.Tensor:
    """d conv2d(x, f) / df applied to ``dy``; ``like`` lends only its shape."""
    f = torch.zeros(like.shape, dtype=like.dtype, requires_grad=True)
    (df,) = torch.autograd.grad(conv2d(x, f, strides, padding), f, dy, create_graph=True)
    return df


def max_pool(x: torch.Tensor, k: HW, strides: HW, padding: str) -> torch.Tensor:
    """Each window's largest value; SAME's padded pixels (-inf) never win."""
    return _nhwc(F.max_pool2d(_pad_nchw(_nchw(x), k, strides, padding, -math.inf), k, strides))


def avg_pool(x: torch.Tensor, k: HW, strides: HW, padding: str) -> torch.Tensor:
    """Each window's mean over the real (unpadded) pixels it covers."""
    xn = _nchw(x)
    ones = torch.ones((1, 1, *xn.shape[2:]), dtype=x.dtype)
    sums = F.avg_pool2d(_pad_nchw(xn, k, strides, padding), k, strides, divisor_override=1)
    counts = F.avg_pool2d(_pad_nchw(ones, k, strides, padding), k, strides, divisor_override=1)
    return _nhwc(sums / counts)


def max_pool_grad(x: torch.Tensor, dy: torch.Tensor, k: HW, strides: HW, padding: str) -> torch.Tensor:
    """d max_pool(x) / dx applied to ``dy``: linear in ``dy``, piecewise constant in ``x``."""
    xd = x.detach().requires_grad_()
    (dx,) = torch.autograd.grad(max_pool(xd, k, strides, padding), xd, dy, create_graph=True)
    return dx


def max_pool_grad_grad(x: torch.Tensor, ddx: torch.Tensor, k: HW, strides: HW, padding: str) -> torch.Tensor:
    """``ddx`` read at each window's maximum of ``x`` (the transpose of ``max_pool_grad``)."""
    xp = _pad_nchw(_nchw(x.detach()), k, strides, padding, -math.inf)
    _, where = F.max_pool2d(xp, k, strides, return_indices=True)
    dp = _pad_nchw(_nchw(ddx), k, strides, padding, 0.0)
    return _nhwc(dp.flatten(2).gather(2, where.flatten(2)).reshape(where.shape))


def avg_pool_grad(like: torch.Tensor, dy: torch.Tensor, k: HW, strides: HW, padding: str) -> torch.Tensor:
    x = torch.zeros(like.shape, dtype=dy.dtype, requires_grad=True)
    (dx,) = torch.autograd.grad(avg_pool(x, k, strides, padding), x, dy, create_graph=True)
    return dx


# ----------------------------------------------------------------- indexing
def _advanced(shape: Sequence[int], key: tuple[Any, ...]) -> tuple[tuple[torch.Tensor, ...], list[int], list[int]]:
    """NumPy basic indexing as torch advanced indexing (torch slices cannot step back):
    (index tensors, the shape they pick, the shape of ``x[key]``)."""
    consumed = sum(item is not None and item is not Ellipsis for item in key)
    items: list[Any] = []
    for item in key:
        items += [slice(None)] * (len(shape) - consumed) if item is Ellipsis else [item]
    if Ellipsis not in key:
        items += [slice(None)] * (len(shape) - consumed)
    lists: list[np.ndarray] = []
    out: list[int] = []
    axis = 0
    for item in items:
        if item is None:
            out.append(1)
            continue
        size = shape[axis]
        if isinstance(item, slice):
            picked = np.arange(size)[item]
            out.append(len(picked))
        else:
            picked = np.array([item % size])
        lists.append(picked.astype(np.int64))
        axis += 1
    mesh = np.ix_(*lists) if lists else ()
    return tuple(torch.from_numpy(np.ascontiguousarray(m)) for m in mesh), [len(p) for p in lists], out


def basic_index(x: torch.Tensor, key: tuple[Any, ...]) -> torch.Tensor:
    """``x[key]`` for ints, slices with any step, ``...`` and None."""
    mesh, _, out = _advanced(x.shape, key)
    return (x[mesh] if mesh else x).reshape(out)


def basic_index_adjoint(g: torch.Tensor, like: torch.Tensor, key: tuple[Any, ...]) -> torch.Tensor:
    """``g`` written into zeros shaped like ``like`` where ``key`` indexes it."""
    mesh, picked, _ = _advanced(like.shape, key)
    zeros = torch.zeros(like.shape, dtype=g.dtype)
    return zeros.index_put(mesh, g.reshape(picked)) if mesh else g.reshape(like.shape)


def gather(params: torch.Tensor, indices: torch.Tensor, axis: int) -> torch.Tensor:
    """Slices of ``params`` along ``axis`` at ``indices``, shaped params[:axis] + indices + params[axis+1:]."""
    picked = torch.index_select(params, axis, indices.long().reshape(-1))
    return picked.reshape((*params.shape[:axis], *indices.shape, *params.shape[axis + 1 :]))


def scatter_add(updates: torch.Tensor, indices: torch.Tensor, like: torch.Tensor, axis: int) -> torch.Tensor:
    """``updates`` summed at ``indices`` along ``axis`` into zeros shaped like ``like``."""
    flat = updates.reshape((*like.shape[:axis], indices.numel(), *like.shape[axis + 1 :]))
    return torch.zeros(like.shape, dtype=updates.dtype).index_add(axis, indices.long().reshape(-1), flat)


# ------------------------------------------------------------- broadcasting
def sum_to(g: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
    """Undo NumPy broadcasting: sum ``g`` down to ``shape``."""
    lead = g.dim() - len(shape)
    axes = list(range(lead)) + [lead + i for i, d in enumerate(shape) if d == 1 and g.shape[lead + i] != 1]
    return (g.sum(dim=axes) if axes else g).reshape(tuple(shape))


def broadcast_like(
    g: torch.Tensor, like: torch.Tensor, axes: Sequence[int], keepdims: bool = True, mean: bool = False
) -> torch.Tensor:
    """``g``, reduced over ``axes`` of ``like`` (kept as 1s or dropped), broadcast back to ``like``."""
    if not keepdims and axes:
        g = g.reshape([1 if i in axes else d for i, d in enumerate(like.shape)])
    out = g.expand(like.shape)
    if mean:
        out = out / max(math.prod(like.shape[a] for a in axes), 1)
    return out


def pad(x: torch.Tensor, paddings: Sequence[tuple[int, int]], value: float = 0.0) -> torch.Tensor:
    """``paddings[i] = (before, after)`` around dim ``i``; F.pad lists the last dim first."""
    flat = [v for before, after in reversed(paddings) for v in (before, after)]
    return F.pad(x, flat, value=value)


def sparse_xent(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-example cross-entropy, and its gradient for the logits: softmax minus the one-hot labels."""
    loss = F.cross_entropy(logits, labels.long(), reduction="none")
    backprop = torch.softmax(logits, 1) - F.one_hot(labels.long(), logits.shape[1]).to(logits.dtype)
    return loss, backprop
