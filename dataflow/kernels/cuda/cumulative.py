"""CUDA kernels of ``ops/cumulative.py``: one thread per line along the axis.

Each thread owns one (outer, inner) line and walks it in order, as the CPU
kernel does (``kernels/cpu/cumulative.py`` explains the product's gradient),
so the sums come in the same order, in the same accumulator (float64 for
float32), and the two agree to the last bit on integers. A scan over very long axes would want a parallel prefix within the
line; the axes these models scan (sequence lengths, a few hundred) do not.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from numba import cuda

from ..cpu.cumulative import lines
from ..cpu.reduce import accumulator
from . import flat, launch


@cuda.jit
def _scan(x, out, zero, outer, n, inner, product, exclusive, reverse):  # type: ignore[no-untyped-def]
    # The running total starts from ``zero``, whose type is the CPU kernel's accumulator: float64 for float32
    # lines, the dtype's own otherwise (an integer total wraps to the same low bits when stored).
    line = cuda.grid(1)
    if line < outer * inner:
        o, i = line // inner, line % inner
        carry = zero
        for t in range(n):
            j = n - 1 - t if reverse else t
            p = j + 1 if reverse else j - 1
            at, before = (o * n + j) * inner + i, (o * n + p) * inner + i
            if t == 0:
                if exclusive:
                    carry = zero + 1 if product else zero
                else:
                    carry = zero + x[at]
            else:
                v = x[before] if exclusive else x[at]
                carry = carry * v if product else carry + v
            out[at] = carry


@cuda.jit
def _cumprod_grad(x, dy, out, outer, n, inner, exclusive, reverse):  # type: ignore[no-untyped-def]
    line = cuda.grid(1)
    if line < outer * inner:
        o, i = line // inner, line % inner
        for t in range(n):
            j = n - 1 - t if reverse else t
            p = j + 1 if reverse else j - 1
            at, before = (o * n + j) * inner + i, (o * n + p) * inner + i
            out[at] = 1 if t == 0 else out[before] * x[before]
        carry = out[0] * 0  # only its type matters: set at the first step below
        for t in range(n - 1, -1, -1):
            j = n - 1 - t if reverse else t
            q = j - 1 if reverse else j + 1
            at, after = (o * n + j) * inner + i, (o * n + q) * inner + i
            if t == n - 1:
                carry = 0 if exclusive else dy[at]
            elif exclusive:
                carry = dy[after] + x[after] * carry
            else:
                carry = dy[at] + x[after] * carry
            out[at] = out[at] * carry


def scan_op(node: Any, ctx: Any, product: bool) -> Callable[[Any], Any]:
    axis, exclusive, reverse = node.attrs["axis"], node.attrs["exclusive"], node.attrs["reverse"]

    def run(x: Any) -> Any:
        out = cuda.device_array(x.shape, x.dtype)
        outer, n, inner = lines(tuple(x.shape), axis)
        if out.size:
            blocks, threads = launch(outer * inner)
            zero = accumulator(x.dtype).type(0)
            _scan[blocks, threads](flat(x), flat(out), zero, outer, n, inner, product, exclusive, reverse)
        return out

    return run


def cumprod_grad_op(node: Any, ctx: Any) -> Callable[[Any, Any], Any]:
    axis, exclusive, reverse = node.attrs["axis"], node.attrs["exclusive"], node.attrs["reverse"]

    def run(x: Any, dy: Any) -> Any:
        if tuple(x.shape) != tuple(dy.shape):
            raise ValueError(f"gradient shape {tuple(dy.shape)} is not the input's {tuple(x.shape)}")
        out = cuda.device_array(x.shape, x.dtype)
        outer, n, inner = lines(tuple(x.shape), axis)
        if out.size:
            blocks, threads = launch(outer * inner)
            _cumprod_grad[blocks, threads](flat(x), flat(dy), flat(out), outer, n, inner, exclusive, reverse)
        return out

    return run
