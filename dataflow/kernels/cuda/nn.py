"""Activations, softmax, cross-entropy, bias and dropout on the GPU.

Activations, their gradients, BiasAdd and Dropout are one thread per element.
Softmax, LogSoftmax and cross-entropy are one block per row: the row max and
then the row sum of ``exp(x - max)`` are shared-memory tree reductions, so no
exponent overflows and no thread walks a whole row alone. A softmax along any
axis reads its rows through strides (``outer x length x inner``), without a
transpose. BiasAddGrad is the tree reduction of ``reduce.py`` over all rows.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from functools import cache
from typing import Any

import numpy as np
from numba import cuda, from_dtype, uint64

from . import MAX_THREADS, device_math, flat, launch
from .elementwise import fill
from .reduce import MAX_BLOCKS, reduce

math = device_math()  # IEEE results (inf, NaN) on the simulator too


def _device(fn: Callable[..., Any]) -> Any:
    return cuda.jit(device=True)(fn)


@_device
def _sigmoid(v):  # type: ignore[no-untyped-def]
    if v >= 0:  # exp of a non-positive number never overflows
        return 1.0 / (1.0 + math.exp(-v))
    e = math.exp(v)
    return e / (1.0 + e)


# Scalar functions, by op name: x -> y, and (dy, y) -> dx.
ACTIVATIONS = {
    "Relu":    _device(lambda v: 0 if v <= 0 else v),  # NaN stays NaN
    "Sigmoid": _sigmoid,
    "Tanh":    _device(lambda v: math.tanh(v)),
}  # fmt: skip
ACTIVATION_GRADS = {
    "ReluGrad":    _device(lambda g, y: g if y > 0 else 0),
    "SigmoidGrad": _device(lambda g, y: g * y * (1 - y)),
    "TanhGrad":    _device(lambda g, y: g * (1 - y * y)),
}  # fmt: skip


@cache
def _unary_kernel(name: str) -> Any:
    fn = ACTIVATIONS[name]

    @cuda.jit
    def run(x, out):  # type: ignore[no-untyped-def]
        i = cuda.grid(1)
        if i < out.size:
            out[i] = fn(x[i])

    return run


@cache
def _binary_kernel(name: str) -> Any:
    fn = ACTIVATION_GRADS[name]

    @cuda.jit
    def run(g, y, out):  # type: ignore[no-untyped-def]
        i = cuda.grid(1)
        if i < out.size:
            out[i] = fn(g[i], y[i])

    return run


def activation(name: str, *args: Any) -> Any:
    """Activation ``name`` of ``x``, or activation gradient ``name`` of ``(dy, y)``, elementwise."""
    out = cuda.device_array(args[0].shape, args[0].dtype)
    if out.size:
        kernel = _unary_kernel(name) if name in ACTIVATIONS else _binary_kernel(name)
        blocks, threads = launch(out.size)
        kernel[blocks, threads](*[flat(a) for a in args], flat(out))
    return out


# ----------------------------------------------------------- row reductions
@cuda.jit(device=True)
def _tree(vals, t, nt, take_max):  # type: ignore[no-untyped-def]
    """Fold ``vals[:nt]`` into ``vals[0]`` (max or sum); every thread of the block calls it."""
    cuda.syncthreads()
    s = nt // 2
    while s > 0:
        if t < s:
            if take_max:
                vals[t] = max(vals[t], vals[t + s])
            else:
                vals[t] += vals[t + s]
        cuda.syncthreads()
        s //= 2


@cuda.jit(device=True)
def _row_max_and_sum(x, base, length, step, vals, t, nt, zero):  # type: ignore[no-untyped-def]
    """(max, sum of exp(v - max)) of the row ``x[base + j * step]``, ``j < length``;
    ``zero`` is the accumulator's zero."""
    top = x[base + min(t, length - 1) * step]
    for j in range(t, length, nt):
        top = max(top, x[base + j * step])
    vals[t] = top
    _tree(vals, t, nt, True)
    top = vals[0]
    cuda.syncthreads()  # everyone has read vals[0] before it is overwritten
    total = zero
    for j in range(t, length, nt):
        total += math.exp(x[base + j * step] - top)
    vals[t] = total
    _tree(vals, t, nt, False)
    total = vals[0]
    cuda.syncthreads()  # shared memory is reused for the next row
    return top, total


@cache
def _softmax_kernel(dtype: np.dtype, log: bool) -> Any:
    acc_type = from_dtype(dtype)

    @cuda.jit
    def run(x, out, rows, length, inner):  # type: ignore[no-untyped-def]
        vals = cuda.shared.array(MAX_THREADS, acc_type)
        t, nt = cuda.threadIdx.x, cuda.blockDim.x
        for r in range(cuda.blockIdx.x, rows, cuda.gridDim.x):
            base = (r // inner) * length * inner + r % inner
            top, total = _row_max_and_sum(x, base, length, inner, vals, t, nt, acc_type(0))
            if log:
                lse = math.log(total)  # (x - top) - lse: top + lse rounds lse off at huge logits (kernels/cpu/nn.py)
                for j in range(t, length, nt):
                    out[base + j * inner] = (x[base + j * inner] - top) - lse
            else:
                inv = 1 / total
                for j in range(t, length, nt):
                    out[base + j * inner] = math.exp(x[base + j * inner] - top) * inv

    return run


def softmax(x: Any, axis: int, log: bool) -> Any:
    """Softmax (or log-softmax) of device array ``x`` along ``axis``."""
    shape = tuple(x.shape)
    length, inner = shape[axis], math.prod(shape[axis + 1 :])
    out = cuda.device_array(shape, x.dtype)
    if out.size:
        rows = out.size // length
        _, threads = launch(length)
        kernel = _softmax_kernel(np.dtype(x.dtype), log)
        kernel[min(rows, MAX_BLOCKS), threads](flat(x), flat(out), rows, length, inner)
    return out


@cache
def _xent_kernel(dtype: np.dtype) -> Any:
    acc_type = from_dtype(dtype)

    @cuda.jit
    def run(logits, labels, loss, backprop):  # type: ignore[no-untyped-def]
        vals = cuda.shared.array(MAX_THREADS, acc_type)
        t, nt = cuda.threadIdx.x, cuda.blockDim.x
        rows, classes = logits.shape
        for r in range(cuda.blockIdx.x, rows, cuda.gridDim.x):
            top, total = _row_max_and_sum(logits[r], 0, classes, 1, vals, t, nt, acc_type(0))
            label = labels[r]
            inside = 0 <= label < classes
            inv = 1 / total
            for j in range(t, classes, nt):
                p = math.exp(logits[r, j] - top) * inv
                backprop[r, j] = (p - 1 if j == label else p) if inside else math.nan
            if t == 0:
                loss[r] = math.log(total) - (logits[r, label] - top) if inside else math.nan

    return run


def sparse_softmax_xent(logits: Any, labels: Any) -> tuple[Any, Any]:
    """(loss per row, softmax - onehot). A label outside ``[0, classes)`` gives NaN
    in its row, as TensorFlow's GPU kernel does: raising would need the labels on the host."""
    rows, classes = logits.shape
    if classes == 0:  # every label is out of range: every row is NaN
        return fill((rows,), logits.dtype, np.nan), cuda.device_array((rows, 0), logits.dtype)
    loss = cuda.device_array((rows,), logits.dtype)
    backprop = cuda.device_array((rows, classes), logits.dtype)
    if backprop.size:
        _, threads = launch(classes)
        _xent_kernel(np.dtype(logits.dtype))[min(rows, MAX_BLOCKS), threads](logits, labels, loss, backprop)
    return loss, backprop


# --------------------------------------------------------------------- bias
@cuda.jit
def _bias_add(x, bias, out):  # type: ignore[no-untyped-def]
    i = cuda.grid(1)
    if i < out.size:
        out[i] = x[i] + bias[i % bias.size]


def bias_add(x: Any, bias: Any) -> Any:
    out = cuda.device_array(x.shape, x.dtype)
    if out.size:
        blocks, threads = launch(out.size)
        _bias_add[blocks, threads](flat(x), bias, flat(out))
    return out


def bias_add_grad(dy: Any) -> Any:
    """``dy`` summed over every axis but the last: a tree reduction over its rows."""
    *rows, c = dy.shape  # (the simulator's shapes take no negative index)
    return reduce("sum", dy.reshape((math.prod(rows), c)), (0,), False)


# ------------------------------------------------------------------ dropout
# A counter-based generator: each element's draw is a hash of (seed, run,
# index), so every thread draws on its own, without a generator state. The
# hash is MurmurHash3's 32-bit finaliser, in 64-bit arithmetic masked to 32
# bits (products of two 32-bit numbers never overflow it).
_M32 = np.uint64(0xFFFFFFFF)
_C1, _C2 = np.uint64(0x85EBCA6B), np.uint64(0xC2B2AE35)
_S8, _S13, _S16 = np.uint64(8), np.uint64(13), np.uint64(16)
_UNIFORM_BITS = 24  # draws are multiples of 2**-24 in [0, 1), as float32 uniforms


@cuda.jit(device=True)
def _fmix32(h):  # type: ignore[no-untyped-def]
    h ^= h >> _S16
    h = (h * _C1) & _M32
    h ^= h >> _S13
    h = (h * _C2) & _M32
    h ^= h >> _S16
    return h


def _fmix32_host(h: int) -> int:
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & 0xFFFFFFFF
    return h ^ (h >> 16)


@cuda.jit
def _dropout(x, out, mask, key, threshold, scale):  # type: ignore[no-untyped-def]
    i = cuda.grid(1)
    if i < out.size:
        h = _fmix32((_fmix32(uint64(i)) + key) & _M32)
        keep = scale if (h >> _S8) >= threshold else scale - scale
        mask[i] = keep
        out[i] = x[i] * keep


def dropout(x: Any, seed: int, run: int, rate: float) -> tuple[Any, Any]:
    """(x * mask, mask) for run number ``run`` of a dropout node seeded with ``seed``:
    the mask is ``1 / (1 - rate)`` where an element's draw is at least ``rate``, else 0."""
    out = cuda.device_array(x.shape, x.dtype)
    mask = cuda.device_array(x.shape, x.dtype)
    if out.size:
        key = _fmix32_host((_fmix32_host(seed & 0xFFFFFFFF) + run) & 0xFFFFFFFF)
        # draw >= rate, for draws d * 2**-24, is d >= ceil(rate * 2**24): integers only.
        threshold = math.ceil(rate * (1 << _UNIFORM_BITS))
        scale = x.dtype.type(1 / (1 - rate))
        blocks, threads = launch(out.size)
        _dropout[blocks, threads](flat(x), flat(out), flat(mask), np.uint64(key), np.uint64(threshold), scale)
    return out, mask


# ------------------------------------------------------------ kernel factories
def activation_op(node: Any, ctx: Any, name: str) -> Callable[..., Any]:
    return lambda *args: activation(name, *args)


def softmax_op(node: Any, ctx: Any, log: bool) -> Callable[[Any], Any]:
    axis = node.attrs["axis"]
    return lambda x: softmax(x, axis, log)


def sparse_softmax_xent_op(node: Any, ctx: Any) -> Callable[[Any, Any], tuple[Any, Any]]:
    return sparse_softmax_xent


def bias_add_op(node: Any, ctx: Any) -> Callable[[Any, Any], Any]:
    return bias_add


def bias_add_grad_op(node: Any, ctx: Any) -> Callable[[Any], Any]:
    return bias_add_grad


def dropout_op(node: Any, ctx: Any) -> Callable[[Any], tuple[Any, Any]]:
    # One run counter per session, like the CPU kernel's generator (KernelContext.stream): each run draws a new
    # mask, whichever plan runs it, and a new session replays the same sequence. The seed is the session's mix.
    rate = float(node.attrs["rate"])
    seed, runs = ctx.stream(node, lambda seed: (seed, itertools.count()))
    return lambda x: dropout(x, seed, next(runs), rate)
