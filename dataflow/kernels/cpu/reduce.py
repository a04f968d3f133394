"""Reductions over any set of axes, as one (outer, reduced, inner) loop nest.

The reduced axes are made one contiguous block (transposing only when they
are not already), so a kernel only ever reduces the middle axis of a 3-D view.

Over an empty set (a reduced axis of size 0), sum, prod, max and min give
their identity, as TensorFlow and ONNX define them: sum 0, prod 1, max the
dtype's lowest value (-inf, the int's min, False), min its highest (+inf, the
int's max, True) where NumPy raises; logsumexp is log(0) = -inf. mean is
0 / 0 = NaN, NumPy's answer. argmax and argmin have no index to give and raise.
The kernels never see an empty reduced axis (max, min and the arg kernels start
from its first element): ``reducer`` answers for them, and the CUDA kernels and
the ops' NumPy references use the same definitions, from the functions here.

max, min, argmax and argmin see a NaN wherever it stands, as NumPy's and
PyTorch's do: the max of a set holding one is NaN, argmax is the first NaN's
index.

logsumexp is computed stably, as ``m + log(sum(exp(x - m)))`` with ``m`` the
maximum of the reduced elements (0 where that is infinite, so that a set of
-inf gives -inf and one +inf gives +inf rather than NaN).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from . import kernel

# A float sum's rounding error grows with the number of additions into one
# accumulator: summed one by one in float32, 2**24 + 2**20 ones gave 16777216 and
# a million uniform numbers were 1e-6 off. So float32 sums, means and products
# accumulate in float64, and every sum runs in blocks of this many reduced elements,
# each block's partial sum added to the total once (error O(BLOCK + mid / BLOCK) ulps
# of the accumulator, not O(mid)), as NumPy's pairwise and PyTorch's cascade sums
# bound it.
BLOCK = 1024


@kernel
def _sum_mid_into(x, out):  # type: ignore[no-untyped-def]
    """Add the sum over ``x``'s middle axis into ``out`` (outer, inner), in ``out``'s dtype."""
    outer, mid, inner = x.shape
    part = np.empty(inner, out.dtype)
    for o in range(outer):
        for start in range(0, mid, BLOCK):
            part[:] = 0
            for m in range(start, min(start + BLOCK, mid)):
                for i in range(inner):
                    part[i] += x[o, m, i]
            for i in range(inner):
                out[o, i] += part[i]
    return out


def accumulator(dtype: Any) -> np.dtype:
    """The dtype a sum of ``dtype`` is accumulated in: float64 for float32 (and the half floats, which arrive as
    float32), the dtype itself otherwise (integer sums wrap in their dtype, as TensorFlow's do)."""
    dtype = np.dtype(dtype)
    return np.dtype(np.float64) if dtype == np.float32 else dtype


@kernel
def _sum_rows_into(x, out):  # type: ignore[no-untyped-def]
    """Add each row's sum of ``x`` (outer, mid) into ``out`` (outer,), a float64 array, in blocks of ``BLOCK``.

    The sum over a last axis: ``_sum_mid_into`` with one inner element adds every value into the same
    ``part[0]``, one add waiting for the last (12x NumPy's time for 256 rows of 1024). Eight accumulators are
    eight independent chains the CPU overlaps, and each block of a row still reaches the total once.
    """
    outer, mid = x.shape
    for o in range(outer):
        total = 0.0
        for start in range(0, mid, BLOCK):
            stop = min(start + BLOCK, mid)
            a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = 0.0
            m = start
            while m + 8 <= stop:
                a0 += x[o, m]
                a1 += x[o, m + 1]
                a2 += x[o, m + 2]
                a3 += x[o, m + 3]
                a4 += x[o, m + 4]
                a5 += x[o, m + 5]
                a6 += x[o, m + 6]
                a7 += x[o, m + 7]
                m += 8
            while m < stop:
                a0 += x[o, m]
                m += 1
            total += ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7))
        out[o] += total
    return out


def _sum_mid(x: np.ndarray) -> np.ndarray:
    """The sum over the middle axis in the accumulator's dtype (``reducer`` rounds it to ``x``'s once, after a mean's
    division)."""
    out = np.zeros((x.shape[0], x.shape[2]), accumulator(x.dtype))
    if x.shape[2] == 1 and out.dtype == np.float64:  # a last axis of floats
        _sum_rows_into(x.reshape(x.shape[0], x.shape[1]), out.reshape(-1))
        return out
    return _sum_mid_into(x, out)


# _max_mid and _argmax_mid start from element 0 of the middle axis: they are
# never called on an empty one (``reducer`` answers for those itself).
@kernel
def _max_mid(x):  # type: ignore[no-untyped-def]
    outer, mid, inner = x.shape
    out = np.empty((outer, inner), x.dtype)
    for o in range(outer):
        for i in range(inner):
            out[o, i] = x[o, 0, i]
        for m in range(1, mid):
            for i in range(inner):
                v = x[o, m, i]
                if v > out[o, i] or v != v:
                    out[o, i] = v
    return out


@kernel
def _argmax_mid(x):  # type: ignore[no-untyped-def]
    outer, mid, inner = x.shape
    out = np.zeros((outer, inner), np.int32)
    for o in range(outer):
        for i in range(inner):
            best = x[o, 0, i]
            for m in range(1, mid):
                v = x[o, m, i]
                if best == best and (v > best or v != v):
                    best = v
                    out[o, i] = m
    return out


@kernel
def _min_mid(x):  # type: ignore[no-untyped-def]
    outer, mid, inner = x.shape
    out = np.empty((outer, inner), x.dtype)
    for o in range(outer):
        for i in range(inner):
            out[o, i] = x[o, 0, i]
        for m in range(1, mid):
            for i in range(inner):
                v = x[o, m, i]
                if v < out[o, i] or v != v:
                    out[o, i] = v
    return out


@kernel
def _argmin_mid(x):  # type: ignore[no-untyped-def]
    outer, mid, inner = x.shape
    out = np.zeros((outer, inner), np.int32)
    for o in range(outer):
        for i in range(inner):
            best = x[o, 0, i]
            for m in range(1, mid):
                v = x[o, m, i]
                if best == best and (v < best or v != v):
                    best = v
                    out[o, i] = m
    return out


@kernel
def _prod_mid_into(x, out):  # type: ignore[no-untyped-def]
    outer, mid, inner = x.shape
    for o in range(outer):
        for m in range(mid):
            for i in range(inner):
                out[o, i] *= x[o, m, i]
    return out


def _prod_mid(x: np.ndarray) -> np.ndarray:
    """The product over the middle axis in the accumulator's dtype, as cumprod's (kernels/cpu/cumulative.py): in
    float32, a million factors near 1 were 5e-5 off, and reduce_prod disagreed with cumprod's last element."""
    return _prod_mid_into(x, np.ones((x.shape[0], x.shape[2]), accumulator(x.dtype)))


@kernel
def _logsumexp_mid(x):  # type: ignore[no-untyped-def]
    outer, mid, inner = x.shape
    shift = _max_mid(x)
    for o in range(outer):
        for i in range(inner):
            if not np.isfinite(shift[o, i]):
                shift[o, i] = 0  # all -inf, or a +inf: exp(x - 0) says it without NaN
    # The exponentials are summed in float64, as softmax's are (kernels/cpu/nn.py).
    total = np.zeros((outer, inner), np.float64)
    for o in range(outer):
        for m in range(mid):
            for i in range(inner):
                total[o, i] += np.exp(x[o, m, i] - shift[o, i])
    return (np.log(total) + shift).astype(x.dtype)


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


def highest(dtype: Any) -> Any:
    """The min of an empty set of ``dtype``: the identity of min (+inf, the int's max, True)."""
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        return dtype.type(np.inf)
    if dtype.kind == "b":
        return np.True_
    return dtype.type(np.iinfo(dtype).max)


def lowest(dtype: Any) -> Any:
    """The max of an empty set of ``dtype``: the identity of max (-inf, the int's min, False)."""
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        return dtype.type(-np.inf)
    if dtype.kind == "b":
        return np.False_
    return dtype.type(np.iinfo(dtype).min)


def empty_value(kind: str, dtype: Any) -> Any:
    """What reduction ``kind`` (sum, mean, prod, max, min, logsumexp) gives over an empty set of ``dtype``."""
    if kind == "max":
        return lowest(dtype)
    if kind == "min":
        return highest(dtype)
    value = {"sum": 0, "mean": np.nan, "prod": 1, "logsumexp": -np.inf}[kind]
    return np.dtype(dtype).type(value)


INDEX_KINDS = ("argmax", "argmin")


def empty_index(kind: str, shape: tuple[int, ...], axes: tuple[int, ...]) -> ValueError:
    """The error of an argmax or argmin (``kind``) over an empty axis: there is no index to give."""
    axis = next(a for a in axes if shape[a] == 0)
    return ValueError(f"{kind} over an empty axis: axis {axis} of {tuple(shape)} has no elements to pick from")


def reducer(kind: str, axes: tuple[int, ...], keepdims: bool) -> Callable[[np.ndarray], np.ndarray]:
    """A kernel reducing ``axes`` with ``kind`` in {sum, mean, prod, max, min, logsumexp, argmax, argmin}."""
    mid_kernel = {
        "sum": _sum_mid, "mean": _sum_mid, "prod": _prod_mid, "max": _max_mid, "min": _min_mid,
        "logsumexp": _logsumexp_mid, "argmax": _argmax_mid, "argmin": _argmin_mid,
    }[kind]  # fmt: skip

    def run(x: np.ndarray) -> np.ndarray:
        out_shape = _out_shape(x.shape, axes, keepdims)
        if any(x.shape[a] == 0 for a in axes):
            if kind in INDEX_KINDS:
                raise empty_index(kind, x.shape, axes)
            return np.full(out_shape, empty_value(kind, x.dtype), x.dtype)
        x3 = _as_3d(x, axes)
        out = mid_kernel(x3)
        if kind == "mean":
            out = out / x3.shape[1]
        if kind in ("sum", "mean", "prod"):  # from the accumulator's dtype
            out = out.astype(x.dtype, copy=False)
        return out.reshape(out_shape)

    return run
