"""Array kernels: data movement as index mapping, one thread per element moved.

Reshape, ExpandDims and Squeeze reshape the (C-contiguous) device array and
launch nothing. Every other copy reads or writes through element strides: a
slice, a strided slice, a split piece or a transpose is an offset plus strides
into the flat input (``_read``), and a concat piece or a strided-slice gradient
the same into the flat output (``_write``); ``_view`` finds offset and strides
from the NumPy basic index the op stands for, so negative steps, new axes and
dropped dims need no kernel of their own. Pad reads ``x`` or the constant in
one pass over the output. Gather, ScatterAddLike and OneHot view their operands
as ``(outer, n, inner)`` blocks around the indexed axis; scatter-add sums
repeated indices with atomic adds. Gather and ScatterAddLike check indices on
the device and read one flag back (the policy's one exception, see
``_raise_outside``). Rank-0 shapes reach a kernel as one dim of size 1 (its
tuples are never empty).
"""

from __future__ import annotations

import builtins
import math
from collections.abc import Callable
from typing import Any

import numpy as np
from numba import cuda, int64

from ..cpu import array as cpu
from . import launch
from .elementwise import fill, offset

Index = tuple[Any, ...]  # a NumPy basic index: ints, slices and None
Layout = tuple[int, tuple[int, ...], tuple[int, ...]]  # element offset, shape, element strides


# ------------------------------------------------------------------- kernels
@cuda.jit
def _read(x, out, base, shape, strides):  # type: ignore[no-untyped-def]
    i = cuda.grid(1)
    if i < out.size:
        out[i] = x[base + offset(i, shape, strides)]


@cuda.jit
def _write(src, out, base, shape, strides):  # type: ignore[no-untyped-def]
    i = cuda.grid(1)
    if i < src.size:
        out[base + offset(i, shape, strides)] = src[i]


@cuda.jit
def _pad(x, out, out_shape, x_shape, before, value):  # type: ignore[no-untyped-def]
    """Each output element reads ``x`` where it falls inside, else is ``value``."""
    i = cuda.grid(1)
    if i < out.size:
        j = i
        src = 0
        step = 1
        inside = True
        for d in range(len(out_shape) - 1, -1, -1):
            c = j % out_shape[d] - before[d]
            j //= out_shape[d]
            if c < 0 or c >= x_shape[d]:
                inside = False
            src += c * step
            step *= x_shape[d]
        out[i] = x[src] if inside else value


@cuda.jit(device=True)
def _flag_outside(indices, n, flag, i):  # type: ignore[no-untyped-def]
    """Thread ``i`` checks index ``i``: the first position outside [0, n) ends up in ``flag[0]``."""
    if i < indices.size:
        k = indices[i]
        if k < 0 or k >= n:
            cuda.atomic.min(flag, 0, int64(i))


@cuda.jit
def _gather_rows(params, indices, out, n, inner, flag):  # type: ignore[no-untyped-def]
    """out (outer, m, inner) = rows ``indices`` of params (outer, n, inner); bad indices flagged."""
    i = cuda.grid(1)
    _flag_outside(indices, n, flag, i)
    if i < out.size:
        m = indices.size
        k = indices[(i // inner) % m]
        if 0 <= k < n:
            out[i] = params[((i // (inner * m)) * n + k) * inner + i % inner]


@cuda.jit
def _scatter_add_rows(updates, indices, out, n, inner, flag):  # type: ignore[no-untyped-def]
    """updates (outer, m, inner) summed into rows ``indices`` of out (outer, n, inner) zeros.

    Repeated indices make several threads add into one element: the atomic add
    makes every update count (in no fixed order, so floats agree with the CPU
    loop to rounding).
    """
    i = cuda.grid(1)
    _flag_outside(indices, n, flag, i)
    if i < updates.size:
        m = indices.size
        k = indices[(i // inner) % m]
        if 0 <= k < n:
            cuda.atomic.add(out, ((i // (inner * m)) * n + k) * inner + i % inner, updates[i])


@cuda.jit
def _one_hot(indices, out, depth, on, off):  # type: ignore[no-untyped-def]
    i = cuda.grid(1)
    if i < out.size:
        # An index outside [0, depth) matches no column: a row of off (TensorFlow).
        out[i] = on if indices[i // depth] == i % depth else off


# ------------------------------------------------------------------- layouts
def _flat(x: Any) -> Any:
    """A 1-D view of a C-contiguous device array, zero-size ones included (``kernels.cuda.flat``
    makes those length 1): a pad or a gather may read nothing from an input it must still pass."""
    return x.reshape(x.size)


def _c_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(math.prod(shape[i + 1 :]) for i in range(len(shape)))


def _grid(shape: tuple[int, ...], strides: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    return (shape, strides) if shape else ((1,), (0,))


def _view(shape: tuple[int, ...], key: Index) -> Layout:
    """Offset, shape and strides of ``x[key]`` in a C-contiguous ``x`` of ``shape`` (NumPy's rules)."""
    strides = _c_strides(shape)
    base, dims, steps, axis = 0, [], [], 0
    for item in key:
        if item is None:
            dims.append(1)
            steps.append(0)
            continue
        d, s = shape[axis], strides[axis]
        if isinstance(item, builtins.slice):
            start, stop, step = item.indices(d)
            dims.append(len(range(start, stop, step)))
            steps.append(step * s)
            base += start * s  # an empty slice may start past the end: nothing is read there
        else:
            if not -d <= item < d:
                raise IndexError(f"index {item} is out of bounds for axis {axis} with size {d}")
            base += (item % d) * s
        axis += 1
    return base, tuple(dims) + shape[axis:], tuple(steps) + strides[axis:]


def _copy(x: Any, layout: Layout) -> Any:
    """A fresh C-contiguous array of the elements of ``x`` at ``layout``."""
    base, shape, strides = layout
    out = cuda.device_array(shape, x.dtype)
    if out.size:
        blocks, threads = launch(out.size)
        _read[blocks, threads](_flat(x), _flat(out), base, *_grid(shape, strides))
    return out


def read(x: Any, key: Index) -> Any:
    """``x[key]`` as a fresh C-contiguous array."""
    return _copy(x, _view(tuple(x.shape), key))


def write(out: Any, key: Index, src: Any) -> Any:
    """``out[key] = src`` in place (``src`` has exactly the shape of ``out[key]``)."""
    base, shape, strides = _view(tuple(out.shape), key)
    if shape != tuple(src.shape):
        raise ValueError(f"could not broadcast input array from shape {tuple(src.shape)} into shape {shape}")
    if src.size:
        blocks, threads = launch(src.size)
        _write[blocks, threads](_flat(src), _flat(out), base, *_grid(shape, strides))
    return out


def _along(axis: int, start: int, stop: int) -> Index:
    return (builtins.slice(None),) * axis + (builtins.slice(start, stop),)


def _raise_outside(flag: Any, indices: Any, n: int, axis: int, what: str) -> None:
    """Raise the CPU kernel's IndexError if a kernel flagged an index outside [0, n).

    Reading the flag back is the one host copy an array kernel makes, and it
    waits for the kernel: an out-of-range index must fail at the node that read
    it, naming the index, as on the CPU, not as garbage further on. The indices
    are copied only to word the error.
    """
    bad = int(flag.copy_to_host()[0])
    if bad < indices.size:
        host = _flat(indices).copy_to_host()
        raise cpu._bad_index(host.reshape(indices.shape), host, bad, n, axis, what)


# ------------------------------------------------------------ kernel factories
def reshape_op(node: Any, ctx: Any) -> Callable[[Any], Any]:
    shape = node.attrs["shape"]  # one dim may be -1: device arrays infer it like NumPy
    return lambda x: x.reshape(shape)


def reshape_like_op(node: Any, ctx: Any) -> Callable[[Any, Any], Any]:
    return lambda x, like: x.reshape(tuple(like.shape))


def expand_dims_op(node: Any, ctx: Any) -> Callable[[Any], Any]:
    axes = node.attrs["axes"]

    def run(x: Any) -> Any:
        dims = iter(x.shape)
        return x.reshape(tuple(1 if i in axes else next(dims) for i in range(x.ndim + len(axes))))

    return run


def squeeze_op(node: Any, ctx: Any) -> Callable[[Any], Any]:
    axes = node.attrs["axes"]

    def run(x: Any) -> Any:
        # A dim unknown when building is checked now, with np.squeeze's words.
        if any(x.shape[a] != 1 for a in axes):
            raise ValueError("cannot select an axis to squeeze out which has size not equal to one")
        return x.reshape(tuple(d for i, d in enumerate(x.shape) if i not in axes))

    return run


def transpose_op(node: Any, ctx: Any) -> Callable[[Any], Any]:
    perm = node.attrs["perm"]

    def run(x: Any) -> Any:
        shape = tuple(x.shape[p] for p in perm)
        moved = [p for p in perm if x.shape[p] != 1]
        if moved == sorted(moved):  # only size-1 dims move: same element order
            return x.reshape(shape)
        strides = _c_strides(tuple(x.shape))
        return _copy(x, (0, shape, tuple(strides[p] for p in perm)))

    return run


def concat_op(node: Any, ctx: Any) -> Callable[..., Any]:
    axis = node.attrs["axis"]

    def run(*xs: Any) -> Any:
        first = xs[0]
        total = sum(x.shape[axis] for x in xs)
        out = cuda.device_array(first.shape[:axis] + (total,) + first.shape[axis + 1 :], first.dtype)
        start = 0
        for x in xs:  # one launch per input, each writing its block of the output
            write(out, _along(axis, start, start + x.shape[axis]), x)
            start += x.shape[axis]
        return out

    return run


def split_like_op(node: Any, ctx: Any) -> Callable[..., Any]:
    axis = node.attrs["axis"]

    def run(g: Any, *likes: Any) -> Any:
        sizes = [like.shape[axis] for like in likes]
        if sum(sizes) != g.shape[axis]:
            raise ValueError(f"pieces of sizes {tuple(sizes)} do not add up to {g.shape[axis]} on axis {axis}")
        cuts = np.cumsum([0, *sizes])
        pieces = tuple(read(g, _along(axis, int(a), int(b))) for a, b in zip(cuts[:-1], cuts[1:]))
        return pieces[0] if len(pieces) == 1 else pieces

    return run


def slice_op(node: Any, ctx: Any) -> Callable[[Any], Any]:
    begin, size = node.attrs["begin"], node.attrs["size"]
    key = tuple(builtins.slice(b, None if s == -1 else b + s) for b, s in zip(begin, size))

    def run(x: Any) -> Any:
        for axis, (b, s, d) in enumerate(zip(begin, size, x.shape)):
            if b > d or (s != -1 and b + s > d):
                raise IndexError(f"slice begin {begin} size {size} is out of bounds for {x.shape} on axis {axis}")
        return read(x, key)

    return run


def pad_op(node: Any, ctx: Any) -> Callable[[Any], Any]:
    paddings, value = node.attrs["paddings"], node.attrs["constant_values"]
    before = tuple(b for b, _ in paddings)

    def run(x: Any) -> Any:
        shape = tuple(d + b + a for d, (b, a) in zip(x.shape, paddings))
        out = cuda.device_array(shape, x.dtype)
        if out.size:
            blocks, threads = launch(out.size)
            grid, x_grid, before_grid = (shape, tuple(x.shape), before) if shape else ((1,), (1,), (0,))
            _pad[blocks, threads](_flat(x), _flat(out), grid, x_grid, before_grid, np.dtype(x.dtype).type(value))
        return out

    return run


def strided_slice_op(node: Any, ctx: Any, key: Index) -> Callable[[Any], Any]:
    return lambda x: read(x, key)


def strided_slice_grad_op(node: Any, ctx: Any, key: Index) -> Callable[[Any, Any], Any]:
    # Steps are never 0, so no two elements of g land on one element of the output.
    return lambda g, like: write(fill(tuple(like.shape), g.dtype, 0), key, g)


def _blocks(shape: tuple[int, ...], axis: int) -> tuple[int, int]:
    """``(n, inner)``: the size of ``axis`` and of the dims after it."""
    return shape[axis], math.prod(shape[axis + 1 :])


def gather_op(node: Any, ctx: Any) -> Callable[[Any, Any], Any]:
    axis = node.attrs["axis"]

    def run(params: Any, indices: Any) -> Any:
        shape = tuple(params.shape)
        n, inner = _blocks(shape, axis)
        out = cuda.device_array(shape[:axis] + tuple(indices.shape) + shape[axis + 1 :], params.dtype)
        flag = fill((1,), np.int64, indices.size)  # no index is bad until one is found
        work = max(out.size, indices.size)  # every index is checked, even when nothing is copied
        if work:
            blocks, threads = launch(work)
            _gather_rows[blocks, threads](_flat(params), _flat(indices), _flat(out), n, max(inner, 1), flag)
        _raise_outside(flag, indices, n, axis, f"params {shape}")
        return out

    return run


def scatter_add_like_op(node: Any, ctx: Any) -> Callable[[Any, Any, Any], Any]:
    axis = node.attrs["axis"]

    def run(updates: Any, indices: Any, like: Any) -> Any:
        shape = tuple(like.shape)
        n, inner = _blocks(shape, axis)
        out = fill(shape, updates.dtype, 0)
        flag = fill((1,), np.int64, indices.size)
        work = max(updates.size, indices.size)
        if work:
            blocks, threads = launch(work)
            _scatter_add_rows[blocks, threads](_flat(updates), _flat(indices), _flat(out), n, max(inner, 1), flag)
        _raise_outside(flag, indices, n, axis, f"output {shape}")
        return out

    return run


def one_hot_op(node: Any, ctx: Any) -> Callable[[Any], Any]:
    depth, dtype = node.attrs["depth"], np.dtype(node.attrs["dtype"])
    on, off = dtype.type(node.attrs["on_value"]), dtype.type(node.attrs["off_value"])

    def run(indices: Any) -> Any:
        out = cuda.device_array(tuple(indices.shape) + (depth,), dtype)
        if out.size:
            blocks, threads = launch(out.size)
            _one_hot[blocks, threads](_flat(indices), _flat(out), depth, on, off)
        return out

    return run
