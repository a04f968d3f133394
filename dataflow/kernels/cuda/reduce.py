"""Reductions as parallel tree reductions in shared memory: one block per output.

The threads of a block each fold a strided share of the reduced elements,
then halve the partial results in shared memory (``log2(threads)`` steps).
Any set of axes is reduced in place through strides, without a transpose:
a flat output index gives the base offset over the kept dims, a flat
reduced index the offset over the reduced dims. An empty set gives what the
CPU kernels give (``kernels/cpu/reduce.py`` defines it).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import cache
from typing import Any

import numpy as np
from numba import cuda, from_dtype, int32

from ..cpu.reduce import empty_argmax, empty_value
from . import MAX_THREADS, flat, launch
from .elementwise import fill, offset

# Blocks loop over outputs beyond this many (a grid-stride loop).
MAX_BLOCKS = 4096


@cache
def _tree_kernel(kind: str, dtype: np.dtype) -> Any:
    acc_type = from_dtype(dtype)
    keeps_max = kind in ("max", "argmax")
    gives_index = kind == "argmax"
    divides = kind == "mean"

    @cuda.jit
    def run(x, out, kept_shape, kept_strides, red_shape, red_strides, count):  # type: ignore[no-untyped-def]
        vals = cuda.shared.array(MAX_THREADS, acc_type)
        idxs = cuda.shared.array(MAX_THREADS, int32)
        t = cuda.threadIdx.x
        nt = cuda.blockDim.x
        for o in range(cuda.blockIdx.x, out.size, cuda.gridDim.x):
            base = offset(o, kept_shape, kept_strides)
            # Each thread's share: elements t, t + nt, t + 2 nt, ... in order, so
            # among equal values the first index is kept (NumPy's argmax).
            first = min(t, count - 1)
            best = first
            acc = x[base + offset(first, red_shape, red_strides)] if keeps_max else acc_type(0)
            for r in range(t, count, nt):
                v = x[base + offset(r, red_shape, red_strides)]
                if keeps_max:
                    if v > acc:
                        acc = v
                        best = r
                else:
                    acc += v
            vals[t] = acc
            idxs[t] = best
            cuda.syncthreads()
            s = nt // 2
            while s > 0:
                if t < s:
                    if keeps_max:
                        if vals[t + s] > vals[t] or (vals[t + s] == vals[t] and idxs[t + s] < idxs[t]):
                            vals[t] = vals[t + s]
                            idxs[t] = idxs[t + s]
                    else:
                        vals[t] += vals[t + s]
                cuda.syncthreads()
                s //= 2
            if t == 0:
                if gives_index:
                    out[o] = idxs[0]
                elif divides:
                    out[o] = vals[0] / count
                else:
                    out[o] = vals[0]
            cuda.syncthreads()  # shared memory is reused for the next output

    return run


def _dims(shape: tuple[int, ...], strides: tuple[int, ...], picked: list[int]) -> tuple[tuple[int, ...], ...]:
    # A kernel's tuples are never empty: no dims reads as one dim of size 1.
    if not picked:
        return (1,), (0,)
    return tuple(shape[i] for i in picked), tuple(strides[i] for i in picked)


def reduce(kind: str, x: Any, axes: tuple[int, ...], keepdims: bool) -> Any:
    """Reduce device array ``x`` over ``axes`` with ``kind`` in {sum, mean, max, argmax}."""
    shape, rank = tuple(x.shape), len(x.shape)
    axes = tuple(sorted({a % rank for a in axes})) if rank else ()
    strides = tuple(math.prod(shape[i + 1 :]) for i in range(rank))
    kept = [i for i in range(rank) if i not in axes]
    if keepdims:
        out_shape = tuple(1 if i in axes else d for i, d in enumerate(shape))
    else:
        out_shape = tuple(shape[i] for i in kept)
    dtype = np.dtype(np.int32) if kind == "argmax" else x.dtype
    count = math.prod(shape[i] for i in axes)
    if count == 0:  # the tree kernel starts from the first element: answer for an empty set here
        if kind == "argmax":
            raise empty_argmax(shape, axes)
        return fill(out_shape, dtype, empty_value(kind, dtype))
    out = cuda.device_array(out_shape, dtype)
    if out.size:
        _, threads = launch(count)
        kernel = _tree_kernel(kind, np.dtype(x.dtype))
        kernel[min(out.size, MAX_BLOCKS), threads](flat(x), flat(out), *_dims(shape, strides, kept),
                                                   *_dims(shape, strides, list(axes)), count)  # fmt: skip
    return out


def sum_to_shape(g: Any, shape: tuple[int, ...]) -> Any:
    """Sum ``g`` over the axes NumPy broadcasting added to reach it from ``shape``."""
    if tuple(g.shape) == shape:
        return g
    lead = len(g.shape) - len(shape)
    axes = tuple(range(lead)) + tuple(i + lead for i, d in enumerate(shape) if d == 1 and g.shape[i + lead] != 1)
    return reduce("sum", g, axes, False).reshape(shape) if axes else g.reshape(shape)


# ------------------------------------------------------------ kernel factories
def reduce_op(node: Any, ctx: Any, kind: str) -> Callable[[Any], Any]:
    axes, keepdims = node.attrs["axes"], node.attrs["keepdims"]
    return lambda x: reduce(kind, x, axes, keepdims)


def sum_to_shape_op(node: Any, ctx: Any) -> Callable[[Any, Any], Any]:
    return lambda g, like: sum_to_shape(g, tuple(like.shape))
