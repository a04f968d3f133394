"""The cases of the ONNX import sweep for the windowed ops (Conv, ConvTranspose, MaxPool,
AveragePool) over 1-D, 2-D and 3-D images: explicit and automatic padding, strides, dilations,
groups, ceil_mode, count_include_pad and MaxPool's Indices; and the ops whose value is known at
import (Shape, Size, Range, ConstantOfShape, Dropout outside training).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from .onnx_sweep import Case, Cases, Const, allowed, since, tolerance, values

# (kernel, strides, dilations, pads) of a 2-D window; 1-D and 3-D cases take the first one or add one.
GEOMETRIES = [
    ([3, 3], [1, 1], [1, 1], [0, 0, 0, 0]),
    ([3, 2], [2, 1], [1, 1], [1, 0, 2, 1]),
    ([2, 2], [2, 2], [1, 1], [0, 0, 1, 1]),
    ([2, 3], [1, 2], [2, 1], [1, 1, 1, 1]),
    ([3, 3], [3, 2], [1, 2], [2, 1, 0, 2]),
]
AUTO_PADS = ["SAME_UPPER", "SAME_LOWER", "VALID"]


def _for_rank(values_2d: list[int], rank: int, pads: bool = False) -> list[int]:
    if rank == 2:
        return values_2d
    if rank == 1:
        return [values_2d[0], values_2d[2]] if pads else values_2d[:1]
    return [*values_2d[:2], values_2d[0], *values_2d[2:], values_2d[2]] if pads else [*values_2d, values_2d[0]]


def _windows(rank: int) -> Iterator[dict[str, Any]]:
    for kernel, strides, dilations, pads in GEOMETRIES:
        yield {"kernel_shape": _for_rank(kernel, rank), "strides": _for_rank(strides, rank),
               "dilations": _for_rank(dilations, rank), "pads": _for_rank(pads, rank, pads=True)}  # fmt: skip
    for auto in AUTO_PADS:
        yield {"kernel_shape": _for_rank([3, 2], rank), "strides": _for_rank([2, 2], rank), "auto_pad": auto}


IMAGES = {1: (2, 3, 9), 2: (2, 3, 7, 8), 3: (1, 2, 5, 6, 5)}


def _sums(dtype: np.dtype[Any]) -> dict[str, float]:
    """A sum of products in another order than ONNX Runtime's (im2col, Winograd): a few units in
    the last place of the largest term, so an absolute part beside the relative one."""
    tol = tolerance(dtype, 1e-5)
    return {**tol, "atol": max(tol["atol"], 1e-5 if dtype == np.float32 else 1e-12 if dtype == np.float64 else 2e-3)}


def _means(dtype: np.dtype[Any]) -> dict[str, float]:
    """A mean of up to 27 values summed in another order than ONNX Runtime's: where it is near 0 the
    two differ by a few units in the last place of the terms (3.5e-8 of terms up to 4 in float32)."""
    tol = tolerance(dtype, 4e-6)
    return {**tol, "atol": 4e-7} if dtype == np.float32 else tol


def conv(rng: np.random.Generator) -> Cases:
    for version in since("Conv"):
        for dtype in allowed("Conv", version, "T"):
            for rank, shape in IMAGES.items():
                x = values(rng, dtype, shape, special=False)
                for window in _windows(rank):
                    kernel = window.pop("kernel_shape")
                    for group in (1, 3) if shape[1] == 3 else (1,):
                        w = values(rng, dtype, (6, shape[1] // group, *kernel), special=False)
                        bias = values(rng, dtype, (6,), special=False)
                        attrs = {**window, "group": group}
                        yield Case("Conv", version, [x, Const(w), bias], attrs, **_sums(dtype))


def conv_transpose(rng: np.random.Generator) -> Cases:
    for version in since("ConvTranspose"):
        for dtype in allowed("ConvTranspose", version, "T"):
            for rank, shape in list(IMAGES.items())[:2]:
                x = values(rng, dtype, shape, special=False)
                for kernel, strides, dilations, pads in GEOMETRIES:
                    w = values(rng, dtype, (shape[1], 2, *_for_rank(kernel, rank)), special=False)
                    attrs: dict[str, Any] = {"strides": _for_rank(strides, rank), "dilations": _for_rank(dilations, rank),
                                             "pads": _for_rank(pads, rank, pads=True)}  # fmt: skip
                    yield Case("ConvTranspose", version, [x, Const(w)], attrs, **_sums(dtype))
                    if strides[0] > 1:
                        extra = {"output_padding": _for_rank([1, 0], rank)}
                        yield Case("ConvTranspose", version, [x, Const(w)], {**attrs, **extra}, **_sums(dtype))


def pools(rng: np.random.Generator) -> Cases:
    for op in ("MaxPool", "AveragePool"):
        for version in since(op):
            for dtype in allowed(op, version, "T")[:4]:
                if dtype.kind not in "f" and dtype.name != "bfloat16" and op == "AveragePool":
                    continue
                for rank, shape in IMAGES.items():
                    x = values(rng, dtype, shape, special=False)
                    for window in _windows(rank):
                        if "dilations" in window and op == "AveragePool" and version < 19:
                            del window["dilations"]  # AveragePool reads dilations from version 19
                        if "dilations" in window and op == "MaxPool" and version < 10:
                            del window["dilations"]
                        for ceil in (0, 1) if version >= 10 else (0,):
                            attrs = {**window, "ceil_mode": ceil} if ceil else dict(window)
                            if op == "AveragePool":
                                for count in (0, 1):
                                    a = {**attrs, "count_include_pad": count} if count else attrs
                                    yield Case(op, version, [x], a, **_means(dtype))
                            else:
                                outputs = 2 if version >= 8 and rank == 2 and "dilations" not in window else 1
                                yield Case(op, version, [x], attrs, outputs=outputs, **tolerance(dtype))


def known(rng: np.random.Generator) -> Cases:
    """Ops whose value is computed at import: checked as any other (their inputs are stored)."""
    x = values(rng, np.dtype(np.float32), (2, 0, 3))
    for version in since("Shape"):
        ends: list[dict[str, Any]] = [{}] if version < 15 else [{}, {"start": -2}, {"start": -9, "end": 9},
                                                                  {"start": 2, "end": 1}, {"end": -1}]  # fmt: skip
        for attrs in ends:
            yield Case("Shape", version, [x], attrs)
    for version in since("Size"):
        yield Case("Size", version, [x])
        yield Case("Size", version, [np.zeros((), np.int8)])
    for version in since("ConstantOfShape"):
        yield Case("ConstantOfShape", version, [Const(np.array([2, 0], np.int64))])
        yield Case("ConstantOfShape", version, [Const(np.array([3], np.int64))],
                   {"value": _tensor(np.array([-7], np.int32))})  # fmt: skip
    for version in since("Range"):
        for start, limit, delta in ((0.1, 1.0, 0.3), (10, -3, -4), (5, 5, 1), (1, 8, 3), (2.5, -1.0, -0.75)):
            dtype = np.int64 if isinstance(start, int) else np.float32
            ins = [Const(np.array(v, dtype)) for v in (start, limit, delta)]
            yield Case("Range", version, ins)
        # ONNX Runtime adds delta n times (6000001.5 for the 7th element); the spec's start + i * delta,
        # in float32 as ONNX's reference computes it too, is expected (6000002.0).
        start, limit, delta = np.float32(1.0), np.float32(1e7 + 3), np.float32(1e6 + 0.125)
        want = start + np.arange(11, dtype=np.float32) * delta
        yield Case("Range", version, [Const(np.array(v)) for v in (start, limit, delta)], expect=[want],
                   note="start + i * delta; ONNX Runtime accumulates")  # fmt: skip
    for version in since("Constant"):
        yield Case("Constant", version, [], {"value": _tensor(np.array([[1.5, -2.0]], np.float16))})
        if version >= 12:
            yield Case("Constant", version, [], {"value_ints": [3, -1]})
            yield Case("Constant", version, [], {"value_float": 0.1})
    for version in since("Dropout"):
        if version >= 12:
            yield Case("Dropout", version, [x[:, :0], Const(np.array(0.3, np.float32))], outputs=2)
            yield Case("Dropout", version, [values(rng, np.dtype(np.float32), (3, 4))], outputs=2)


def _tensor(value: np.ndarray) -> Any:
    from onnx import numpy_helper

    return numpy_helper.from_array(value)


WINDOW_FAMILIES: dict[str, Callable[[np.random.Generator], Cases]] = {
    "Conv": conv, "ConvTranspose": conv_transpose, "pools": pools, "known": known,
}  # fmt: skip
