"""Kernels of ``ops/array_more.py``: split, tile and its gradient, broadcast_to.

All data movement or a sum over whole blocks, so NumPy's C loops do it (the
reasoning of ``array.py``); each hands out a C-contiguous array.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .array import contiguous


def split_sizes(sizes: tuple[int, ...], num: int, dim: int) -> tuple[int, ...] | str:
    """The piece sizes along an axis of size ``dim``, or why they do not fit it.

    ``sizes`` empty means ``num`` equal pieces; otherwise one entry may be -1,
    the rest of the axis (TensorFlow's SplitV). Shared by the shape rule (for a
    known dim) and the kernels (for one known only at run time).
    """
    if not sizes:
        if dim % num:
            return f"{dim} does not split into {num} equal pieces"
        return (dim // num,) * num
    known = sum(s for s in sizes if s != -1)
    if -1 in sizes:
        if known > dim:
            return f"sizes {sizes} need more than the {dim} there are"
        return tuple(dim - known if s == -1 else s for s in sizes)
    if known != dim:
        return f"sizes {sizes} add up to {known}, not {dim}"
    return sizes


def split(axis: int, sizes: tuple[int, ...], num: int) -> Callable[[np.ndarray], Any]:
    """``x`` cut along ``axis`` into pieces of ``sizes`` (one may be -1), or ``num`` equal ones."""

    def run(x: np.ndarray) -> Any:
        fitted = split_sizes(sizes, num, x.shape[axis])
        if isinstance(fitted, str):
            raise ValueError(f"cannot split {x.shape} on axis {axis}: {fitted}")
        index: list[Any] = [slice(None)] * x.ndim
        pieces, start = [], 0
        for size in fitted:
            index[axis] = slice(start, start + size)
            pieces.append(contiguous(x[tuple(index)]))
            start += size
        return pieces[0] if len(pieces) == 1 else tuple(pieces)

    return run


def tile(multiples: tuple[int, ...]) -> Callable[[np.ndarray], np.ndarray]:
    # np.tile copies once through a broadcast view: a fresh C-ordered array, rank 0 kept.
    return lambda x: np.tile(x, multiples)


def untile(g: np.ndarray, shape: tuple[int, ...], multiples: tuple[int, ...]) -> np.ndarray:
    """The sum of the ``multiples`` tiles of ``g``, each of ``shape``: Tile's gradient.

    ``g`` seen as (m0, d0, m1, d1, ...) and summed over the m axes.
    """
    if g.shape != tuple(d * m for d, m in zip(shape, multiples)):
        raise ValueError(f"gradient {g.shape} is not {tuple(shape)} tiled {multiples}")
    pairs = tuple(n for d, m in zip(shape, multiples) for n in (m, d))
    summed = np.sum(g.reshape(pairs), axis=tuple(range(0, len(pairs), 2)), dtype=g.dtype)
    return np.asarray(summed, g.dtype).reshape(shape)


def tile_grad(multiples: tuple[int, ...]) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    return lambda g, x: untile(g, x.shape, multiples)


def broadcast_to(shape: tuple[int, ...]) -> Callable[[np.ndarray], np.ndarray]:
    # np.broadcast_to checks dims unknown when building, with NumPy's words.
    return lambda x: np.array(np.broadcast_to(x, shape))
