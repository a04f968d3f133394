"""Reductions over any set of axes, as one (outer, reduced, inner) loop nest.

The reduced axes are made one contiguous block (transposing only when they
are not already), so a kernel only ever reduces the middle axis of a 3-D view.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from . import kernel


@kernel
def _sum_mid(x):  # type: ignore[no-untyped-def]
    outer, mid, inner = x.shape
    out = np.zeros((outer, inner), x.dtype)
    for o in range(outer):
        for m in range(mid):
            for i in range(inner):
                out[o, i] += x[o, m, i]
    return out


@kernel
def _max_mid(x):  # type: ignore[no-untyped-def]
    outer, mid, inner = x.shape
    out = np.empty((outer, inner), x.dtype)
    for o in range(outer):
        for i in range(inner):
            out[o, i] = x[o, 0, i]
        for m in range(1, mid):
            for i in range(inner):
                if x[o, m, i] > out[o, i]:
                    out[o, i] = x[o, m, i]
    return out


@kernel
def _argmax_mid(x):  # type: ignore[no-untyped-def]
    outer, mid, inner = x.shape
    out = np.zeros((outer, inner), np.int32)
    for o in range(outer):
        for i in range(inner):
            best = x[o, 0, i]
            for m in range(1, mid):
                if x[o, m, i] > best:
                    best = x[o, m, i]
                    out[o, i] = m
    return out


def _as_3d(x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    """``x`` viewed as (outer, reduced, inner) with ``axes`` in the middle."""
    rank = x.ndim
    if axes and axes != tuple(range(axes[0], axes[-1] + 1)):
        keep = [a for a in range(rank) if a not in axes]
        x = np.transpose(x, keep + list(axes))
        axes = tuple(range(len(keep), rank))
    first = axes[0] if axes else rank
    last = axes[-1] + 1 if axes else rank
    shape = x.shape
    outer = math.prod(shape[:first])
    mid = math.prod(shape[first:last])
    inner = math.prod(shape[last:])
    return np.ascontiguousarray(x).reshape(outer, mid, inner)


def _out_shape(shape: tuple[int, ...], axes: tuple[int, ...], keepdims: bool) -> tuple[int, ...]:
    if keepdims:
        return tuple(1 if i in axes else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in axes)


def reducer(kind: str, axes: tuple[int, ...], keepdims: bool) -> Callable[[np.ndarray], np.ndarray]:
    """A kernel reducing ``axes`` with ``kind`` in {sum, mean, max, argmax}."""
    mid_kernel = {"sum": _sum_mid, "mean": _sum_mid, "max": _max_mid, "argmax": _argmax_mid}[kind]

    def run(x: np.ndarray) -> np.ndarray:
        x3 = _as_3d(x, axes)
        out = mid_kernel(x3)
        if kind == "mean":
            out /= max(x3.shape[1], 1)
        return out.reshape(_out_shape(x.shape, axes, keepdims))

    return run
