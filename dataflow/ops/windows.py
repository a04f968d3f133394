"""Window geometry shared by the convolution and pooling ops: attr parsing and the
NumPy helpers their reference implementations slide windows with.

Kept apart from ``conv.py`` so that each stays one readable size; the kernels'
own geometry (``kernels/cpu/conv.py``'s ``window``) is the one rule both use.

Examples
--------
>>> from cellgraph.dataflow.ops.windows import explicit_pads, window_pair
>>> window_pair((1, 2, 3, 1)), explicit_pads(1), explicit_pads([[0, 0], [1, 2], [3, 4], [0, 0]])
((2, 3), ((1, 1), (1, 1)), ((1, 2), (3, 4)))
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..kernels.cpu.conv import Padding, axis_padding, window

HW = tuple[int, int]


def window_pair(value: Any) -> HW | None:
    """(height, width) from an int, a pair, or TensorFlow's (1, h, w, 1); None if none of these."""
    if isinstance(value, (int, np.integer)):
        dims: tuple[Any, ...] = (value, value)
    elif isinstance(value, (tuple, list)) and len(value) == 2:
        dims = tuple(value)
    elif isinstance(value, (tuple, list)) and len(value) == 4 and value[0] == 1 and value[3] == 1:
        dims = (value[1], value[2])
    else:
        return None
    if not all(isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d >= 1 for d in dims):
        return None
    return int(dims[0]), int(dims[1])


def explicit_pads(value: Any) -> Padding | None:
    """((top, bottom), (left, right)) from an int, that pair of pairs, or TensorFlow's
    NHWC [[0, 0], [top, bottom], [left, right], [0, 0]]; None if none of these."""

    def ok(v: Any) -> bool:
        return isinstance(v, (int, np.integer)) and not isinstance(v, bool) and bool(v >= 0)

    if ok(value):
        return ((int(value), int(value)), (int(value), int(value)))
    if not isinstance(value, (tuple, list)) or len(value) not in (2, 4):
        return None
    pairs = list(value)
    if not all(isinstance(v, (tuple, list)) and len(v) == 2 and all(ok(e) for e in v) for v in pairs):
        return None
    if len(pairs) == 4:
        if any(pairs[i][0] or pairs[i][1] for i in (0, 3)):
            return None
        pairs = pairs[1:3]
    return ((int(pairs[0][0]), int(pairs[0][1])), (int(pairs[1][0]), int(pairs[1][1])))


def pad_amounts(size: int, k: int, stride: int, padding: Any, dilation: int = 1) -> tuple[int, int, int]:
    """(output size, pad before, pad after) along one dim: as much as the windows reach."""
    out, before = window(size, k, stride, padding, dilation)
    return out, before, max((out - 1) * stride + (k - 1) * dilation + 1 - size - before, 0)


def pad_for_windows(
    x: np.ndarray, k: HW, strides: HW, padding: Any, fill: float = 0.0, dilations: HW = (1, 1)
) -> tuple[np.ndarray, int, int, int, int]:
    """``x`` padded for windows ``k``: (padded x, out height, out width, pad top, pad left)."""
    oh, top, bottom = pad_amounts(x.shape[1], k[0], strides[0], axis_padding(padding, 0), dilations[0])
    ow, left, right = pad_amounts(x.shape[2], k[1], strides[1], axis_padding(padding, 1), dilations[1])
    padded = np.pad(x, ((0, 0), (top, bottom), (left, right), (0, 0)), constant_values=fill)
    return padded, oh, ow, top, left


def window_taps(
    k: HW, strides: HW, oh: int, ow: int, dilations: HW = (1, 1)
) -> list[tuple[int, int, tuple[slice, slice, slice, slice]]]:
    """For each window tap (p, q), the index of the padded pixels it reads, output-shaped."""
    (sh, sw), (dh, dw) = strides, dilations
    every = slice(None)
    rows = [slice(p * dh, p * dh + sh * (oh - 1) + 1, sh) for p in range(k[0])]
    cols = [slice(q * dw, q * dw + sw * (ow - 1) + 1, sw) for q in range(k[1])]
    return [(p, q, (every, rows[p], cols[q], every)) for p in range(k[0]) for q in range(k[1])]


def crop(padded: np.ndarray, top: int, left: int, like: tuple[int, ...]) -> np.ndarray:
    return padded[:, top : top + like[1], left : left + like[2], :]


def grouped(a: np.ndarray, groups: int) -> np.ndarray:
    """The last axis split as (groups, per group)."""
    return a.reshape(*a.shape[:-1], groups, a.shape[-1] // groups)
