"""CUDA kernels of ``ops/array_shape.py``: shape, size and range.

Shape and Size write host metadata into a device array through a kernel's
arguments (no copy). Range must read its three scalar operands back to size
its output: like the index flag of ``array.py``, the one host copy these
kernels make, and TensorFlow's GPU Range keeps its operands in host memory
for the same reason.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from numba import cuda

from ..cpu.array_shape import range_length
from . import launch


@cuda.jit
def _write(out, values):  # type: ignore[no-untyped-def]
    i = cuda.grid(1)
    if i < out.size:
        out[i] = values[i]


@cuda.jit
def _arange(out, start, delta):  # type: ignore[no-untyped-def]
    i = cuda.grid(1)
    if i < out.size:
        out[i] = start + i * delta


def _ints(values: tuple[int, ...], shape: tuple[int, ...], dtype: str) -> Any:
    out = cuda.device_array(shape, np.dtype(dtype))
    if values:
        blocks, threads = launch(len(values))
        _write[blocks, threads](out.reshape(len(values)), values)
    return out


def shape_op(node: Any, ctx: Any) -> Callable[[Any], Any]:
    dtype = node.attrs["out_type"]
    return lambda x: _ints(tuple(x.shape), (len(x.shape),), dtype)


def size_op(node: Any, ctx: Any) -> Callable[[Any], Any]:
    dtype = node.attrs["out_type"]
    return lambda x: _ints((int(x.size),), (), dtype)


def range_op(node: Any, ctx: Any) -> Callable[[Any, Any, Any], Any]:
    def run(start: Any, limit: Any, delta: Any) -> Any:
        dtype = np.dtype(start.dtype)
        s, lim, d = (a.copy_to_host().item() for a in (start, limit, delta))
        out = cuda.device_array((range_length(s, lim, d),), dtype)
        if out.size:
            blocks, threads = launch(out.size)
            _arange[blocks, threads](out, dtype.type(s), dtype.type(d))
        return out

    return run
