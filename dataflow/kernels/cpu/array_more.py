"""Kernels of ``ops/array_more.py``: split, tile and its gradient, broadcast_to.

All data movement or a sum over whole blocks, so NumPy's C loops do it (the
reasoning of ``array.py``); each hands out a C-contiguous array.

Examples
--------
>>> split_sizes((2, -1), 2, 5)
(2, 3)
>>> split_sizes((), 2, 5)
'5 does not split into 2 equal pieces'
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


def check_mirror(shape: tuple[int, ...], paddings: tuple[tuple[int, int], ...], mode: str) -> None:
    """A ValueError if a pad is too long for its dim (a dim unknown when building is checked here)."""
    edge = 0 if mode == "REFLECT" else 1
    for axis, (d, (b, a)) in enumerate(zip(shape, paddings)):
        if d < 0 or max(b, a) > max(d - 1 + edge, 0):
            raise ValueError(f"{mode} padding {(b, a)} of axis {axis} of {tuple(shape)} does not fit its size {d}")


def mirror_pad(paddings: tuple[tuple[int, int], ...], mode: str) -> Callable[[np.ndarray], np.ndarray]:
    # A dim unknown when building is checked here: np.pad would mirror a
    # too-long REFLECT pad again and again instead of failing as TensorFlow does.
    def run(x: np.ndarray) -> np.ndarray:
        check_mirror(x.shape, paddings, mode)
        return np.pad(x, paddings, mode=mode.lower())  # type: ignore[call-overload]  # numpy's stubs want a literal

    return run


def mirror_fold(g: np.ndarray, paddings: tuple[tuple[int, int], ...], mode: str) -> np.ndarray:
    """MirrorPad's gradient: each padded strip of ``g`` added back, mirrored, onto the
    elements it copied, one axis at a time."""
    edge = 0 if mode == "REFLECT" else 1
    check_mirror(tuple(d - b - a for d, (b, a) in zip(g.shape, paddings)), paddings, mode)
    out = np.array(g)
    for axis, (b, a) in enumerate(paddings):
        d = out.shape[axis] - b - a
        moved = np.moveaxis(out, axis, 0)
        middle = np.array(moved[b : b + d])
        if b:
            # REFLECT: before-pad element j copied x[b - j]; SYMMETRIC: x[b - 1 - j].
            middle[1 - edge : b + 1 - edge] += moved[:b][::-1]
        if a:
            middle[d - 1 + edge - a : d - 1 + edge] += moved[b + d :][::-1]
        out = np.moveaxis(middle, 0, axis)
    return np.ascontiguousarray(out)


def mirror_pad_grad(paddings: tuple[tuple[int, int], ...], mode: str) -> Callable[[np.ndarray], np.ndarray]:
    return lambda g: mirror_fold(g, paddings, mode)
