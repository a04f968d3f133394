"""Reductions as parallel tree reductions in shared memory: one block per output, or several.

The threads of a block each fold a strided share of the reduced elements,
then halve the partial results in shared memory (``log2(threads)`` steps).
Any set of axes is reduced in place through strides, without a transpose:
a flat output index gives the base offset over the kept dims, a flat
reduced index the offset over the reduced dims. An empty set gives what the
CPU kernels give (``kernels/cpu/reduce.py`` defines it).

A block per output leaves a GPU nearly idle when there are few outputs and
many elements each (a whole tensor summed: one block, one multiprocessor of
about a hundred). Then each output's elements are cut into consecutive
slices, one block each, enough to fill the GPU (``SPLIT_BLOCKS``) but none
under ``MIN_SLICE`` elements; every block writes its slice's result (and
index) and a second launch folds the slices of each output in order, with
the same rules (a NaN wins, ties keep the first index). logsumexp, whose two
passes need the whole maximum first, keeps one block per output.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import cache
from typing import Any

import numpy as np
from numba import cuda, from_dtype, int32, int64

from ..cpu.reduce import INDEX_KINDS, empty_index, empty_value
from . import MAX_THREADS, device_math, flat, launch
from .elementwise import fill, offset

# Blocks loop over outputs beyond this many (a grid-stride loop).
MAX_BLOCKS = 4096
# Below this many outputs, each output's elements are shared by several blocks, up to about this many in all.
SPLIT_BLOCKS = 512
# The fewest elements a block of a split reduction folds (16 a thread at 256 threads).
MIN_SLICE = 4096


@cuda.jit(device=True, inline=True)
def _at(r, shape, strides):  # type: ignore[no-untyped-def]
    """Offset of reduced element ``r``: one multiplication when the reduced dims are one run (``_dims`` merges
    adjacent ones), where ``offset`` would divide by each dim in 64-bit arithmetic for every element."""
    if len(shape) == 1:  # known when the kernel compiles: the other branch is not generated
        return r * strides[0]
    return offset(r, shape, strides)


@cuda.jit(device=True, inline=True)
def _take(acc, best, v, at, keeps_best, wants_low, multiplies):  # type: ignore[no-untyped-def]
    """``acc`` and its index ``best`` with value ``v`` (at index ``at``) folded in. A NaN beats every number and
    stays (kernels/cpu/reduce.py); a value only replaces a worse one, so among equals the first index stays."""
    if keeps_best:
        if acc == acc and (v != v or ((v < acc) if wants_low else (v > acc))):
            return v, at
        return acc, best
    if multiplies:
        return acc * v, best
    return acc + v, best


@cuda.jit(device=True, inline=True)
def _result(out, o, value, index, count, gives_index, divides):  # type: ignore[no-untyped-def]
    """Write output ``o``: the index for argmax and argmin, a mean's sum over ``count``, else the value."""
    if gives_index:
        out[o] = index
    elif divides:
        out[o] = value / count
    else:
        out[o] = value


def _rules(kind: str) -> tuple[bool, bool, bool, bool, bool, bool]:
    """What ``kind`` does, as the kernels read it (constants when they compile): keeps the best value, the lowest
    one, gives its index, divides by the count, multiplies, or is logsumexp's two passes."""
    return (
        kind in ("max", "argmax", "min", "argmin", "logsumexp"),
        kind in ("min", "argmin"),
        kind in INDEX_KINDS,
        kind == "mean",
        kind == "prod",
        kind == "logsumexp",
    )


@cuda.jit(device=True, inline=True)
def _fold(vals, idxs, t, nt, keeps_best, wants_low, multiplies):  # type: ignore[no-untyped-def]
    """Halve a block's partial results in shared memory until ``vals[0]`` (and ``idxs[0]``) hold the block's."""
    s = nt // 2
    while s > 0:
        if t < s:
            if keeps_best:
                other, mine = vals[t + s], vals[t]
                # A NaN beats every number (kernels/cpu/reduce.py); among NaNs, as among equals, the first index.
                better = mine == mine and (other != other or (other < mine if wants_low else other > mine))
                same = other == mine or (other != other and mine != mine)
                if better or (same and idxs[t + s] < idxs[t]):
                    vals[t] = other
                    idxs[t] = idxs[t + s]
            elif multiplies:
                vals[t] *= vals[t + s]
            else:
                vals[t] += vals[t + s]
        cuda.syncthreads()
        s //= 2


@cache
def _tree_kernel(kind: str, dtype: np.dtype) -> Any:
    acc_type = from_dtype(dtype)
    keeps_best, wants_low, gives_index, divides, multiplies, log_sum = _rules(kind)
    start = acc_type(1) if multiplies else acc_type(0)
    inf = acc_type(np.inf) if log_sum else acc_type(0)
    math = device_math()  # IEEE log(0) = -inf on the simulator too

    @cuda.jit
    def run(x, out, kept_shape, kept_strides, red_shape, red_strides, count, slices, per, part_vals, part_idxs):  # type: ignore[no-untyped-def]
        # Block b folds slice b % slices of output b // slices: reduced elements [lo, hi). With one slice a
        # block writes its output; with several, its slice's result and index (part_*), folded by _combine.
        vals = cuda.shared.array(MAX_THREADS, acc_type)
        idxs = cuda.shared.array(MAX_THREADS, int32)
        t = cuda.threadIdx.x
        nt = cuda.blockDim.x
        for b in range(cuda.blockIdx.x, out.size * slices, cuda.gridDim.x):
            o = b // slices
            lo = (b % slices) * per
            hi = min(count, lo + per)
            base = offset(o, kept_shape, kept_strides)
            # Each thread's share: elements lo + t, lo + t + nt, ... in order, so
            # among equal values the first index is kept (NumPy's argmax and argmin).
            first = min(lo + t, hi - 1)
            best = first
            shift = start
            acc = x[base + _at(first, red_shape, red_strides)] if keeps_best else start
            for r in range(lo + t, hi, nt):
                acc, best = _take(acc, best, x[base + _at(r, red_shape, red_strides)], r, keeps_best, wants_low,
                                  multiplies)  # fmt: skip
            vals[t] = acc
            idxs[t] = best
            cuda.syncthreads()
            _fold(vals, idxs, t, nt, keeps_best, wants_low, multiplies)
            if log_sum:
                # Second pass: sum exp(x - m) with m the maximum just found (0 where it is
                # infinite, as kernels/cpu/reduce.py says), then m + log(sum).
                shift = vals[0]
                if not (-inf < shift < inf):
                    shift = start
                cuda.syncthreads()  # every thread has read vals[0] before it is overwritten
                acc = start
                for r in range(lo + t, hi, nt):
                    acc += math.exp(x[base + _at(r, red_shape, red_strides)] - shift)
                vals[t] = acc
                cuda.syncthreads()
                _fold(vals, idxs, t, nt, False, False, False)
            if t == 0:
                if slices > 1:
                    part_vals[b] = vals[0]
                    part_idxs[b] = idxs[0]
                elif log_sum:
                    out[o] = math.log(vals[0]) + shift
                else:
                    _result(out, o, vals[0], idxs[0], count, gives_index, divides)
            cuda.syncthreads()  # shared memory is reused for the next output

    return run


@cache
def _combine_kernel(kind: str, dtype: np.dtype) -> Any:
    """The second launch of a split reduction: each output's slice results folded in slice order."""
    acc_type = from_dtype(dtype)
    keeps_best, wants_low, gives_index, divides, multiplies, _ = _rules(kind)  # logsumexp is never split
    start = acc_type(1) if multiplies else acc_type(0)

    @cuda.jit
    def combine(part_vals, part_idxs, out, slices, count):  # type: ignore[no-untyped-def]
        vals = cuda.shared.array(MAX_THREADS, acc_type)
        idxs = cuda.shared.array(MAX_THREADS, int32)
        t = cuda.threadIdx.x
        nt = cuda.blockDim.x
        for o in range(cuda.blockIdx.x, out.size, cuda.gridDim.x):
            first = o * slices + min(t, slices - 1)
            acc = part_vals[first] if keeps_best else start
            best = int64(part_idxs[first])
            # In slice order: on a tie the earlier slice, whose index is lower, stays.
            for j in range(o * slices + t, (o + 1) * slices, nt):
                acc, best = _take(acc, best, part_vals[j], int64(part_idxs[j]), keeps_best, wants_low, multiplies)
            vals[t] = acc
            idxs[t] = best
            cuda.syncthreads()
            _fold(vals, idxs, t, nt, keeps_best, wants_low, multiplies)
            if t == 0:
                _result(out, o, vals[0], idxs[0], count, gives_index, divides)
            cuda.syncthreads()

    return combine


def _parts(n: int, dtype: np.dtype) -> tuple[Any, Any]:
    """The slice results (values, indices) of a split reduction's first launch."""
    return cuda.device_array(n, dtype), cuda.device_array(n, np.int32)


@cache
def _no_parts(dtype: np.dtype) -> tuple[Any, Any]:
    """What a reduction of one block per output passes for the slice results it does not write: made once."""
    return _parts(1, dtype)


def split_slices(kind: str, outputs: int, count: int) -> int:
    """How many blocks share each output's ``count`` elements: 1 (a block each) unless there are few outputs
    and many elements, then enough to make about ``SPLIT_BLOCKS`` blocks, each of at least ``MIN_SLICE``."""
    if kind == "logsumexp" or outputs >= SPLIT_BLOCKS or count < 2 * MIN_SLICE:
        return 1
    return min(SPLIT_BLOCKS // outputs, count // MIN_SLICE)  # both at least 1 here


def _dims(shape: tuple[int, ...], strides: tuple[int, ...], picked: list[int]) -> tuple[tuple[int, ...], ...]:
    """The ``picked`` dims of a C-contiguous array, each run of adjacent ones merged into one dim (their sizes
    multiplied, the last one's stride): a reduction over the last axes, or over N, H and W of NHWC, is one dim.

    >>> _dims((2, 3, 4, 5), (60, 20, 5, 1), [0, 1, 2])
    ((24,), (5,))
    >>> _dims((2, 3, 4, 5), (60, 20, 5, 1), [0, 2])
    ((2, 4), (60, 5))
    """
    # A kernel's tuples are never empty: no dims reads as one dim of size 1.
    if not picked:
        return (1,), (0,)
    sizes, steps = [shape[picked[0]]], [strides[picked[0]]]
    for previous, i in zip(picked, picked[1:]):
        if i == previous + 1:  # adjacent in a C-contiguous array: one dim of both
            sizes[-1] *= shape[i]
            steps[-1] = strides[i]
        else:
            sizes.append(shape[i])
            steps.append(strides[i])
    return tuple(sizes), tuple(steps)


def reduce(kind: str, x: Any, axes: tuple[int, ...], keepdims: bool) -> Any:
    """Reduce device array ``x`` over ``axes`` with ``kind`` in {sum, mean, prod, max, min, logsumexp, argmax, argmin}."""
    shape, rank = tuple(x.shape), len(x.shape)
    axes = tuple(sorted({a % rank for a in axes})) if rank else ()
    strides = tuple(math.prod(shape[i + 1 :]) for i in range(rank))
    kept = [i for i in range(rank) if i not in axes]
    if keepdims:
        out_shape = tuple(1 if i in axes else d for i, d in enumerate(shape))
    else:
        out_shape = tuple(shape[i] for i in kept)
    dtype = np.dtype(np.int32) if kind in INDEX_KINDS else x.dtype
    count = math.prod(shape[i] for i in axes)
    if count == 0:  # the tree kernel starts from the first element: answer for an empty set here
        if kind in INDEX_KINDS:
            raise empty_index(kind, shape, axes)
        return fill(out_shape, dtype, empty_value(kind, dtype))
    out = cuda.device_array(out_shape, dtype)
    if out.size:
        slices = split_slices(kind, out.size, count)
        per = math.ceil(count / slices)
        slices = math.ceil(count / per)  # every slice holds at least one element
        parts = _parts(out.size * slices, np.dtype(x.dtype)) if slices > 1 else _no_parts(np.dtype(x.dtype))
        _, threads = launch(min(count, per))
        kernel = _tree_kernel(kind, np.dtype(x.dtype))
        kernel[min(out.size * slices, MAX_BLOCKS), threads](flat(x), flat(out), *_dims(shape, strides, kept),
                                                            *_dims(shape, strides, list(axes)), count, slices, per,
                                                            *parts)  # fmt: skip
        if slices > 1:
            _, threads = launch(slices)
            _combine_kernel(kind, np.dtype(x.dtype))[min(out.size, MAX_BLOCKS), threads](
                *parts, flat(out), slices, count
            )
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
