"""Where a pull writes its values: the caller's arrays, or new ones laid side by side as a shard sends them.

A shard answers a replica's pull with its small variables fused, one chunk
per dtype and group, their bytes one after the other in the order the pull
asked for them (fused.py). New arrays for a pull (``destinations``) are
therefore cut from one buffer per group, in that order: a fused chunk then
lands in one copy into the ``span`` its members cover, instead of one copy
and one bookkeeping round per member. A replica keeps pulling into the
arrays of its first pull (a kept ``PullPlan``), so every later step gains.

Examples
--------
>>> import numpy as np
>>> from .config import VariableSpec
>>> f4 = np.dtype("float32")
>>> layout = {"b": [(0, VariableSpec("b", f4, (2,)))], "w": [(0, VariableSpec("w", f4, (2, 3)))]}
>>> arrays = destinations(layout, ["w", "b"], None)
>>> [name for name in arrays], arrays["w"].shape
(['w', 'b'], (2, 3))
>>> whole = span([arrays["w"], arrays["b"]], f4)
>>> whole[:] = np.arange(8)
>>> arrays["b"].tolist()
[6.0, 7.0]
>>> span([arrays["b"], arrays["w"]], f4) is None  # not in the order they lie
True
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence

import numpy as np

from cellgraph.dataflow.shapes import fmt

from ..errors import ParameterServerError
from . import fused
from .chunks import MAX_CHUNK_BYTES
from .sharding import Layout


def destinations(
    layout: Layout, wanted: Sequence[str], out: Mapping[str, np.ndarray] | None, max_chunk: int = MAX_CHUNK_BYTES
) -> dict[str, np.ndarray]:
    """Where each variable of ``wanted`` is pulled to, in that order: ``out[name]`` when given (checked), else a
    new array. The new arrays of the variables that a shard's answer fuses (``fused.fusion_groups``, chunks of
    at most ``max_chunk`` bytes) are views of one buffer per group, side by side in the group's order; every
    other one (big, split, or alone in its group) is an array of its own. A kept value thus holds at most its
    group's buffer (``FUSE_GROUP_BYTES``) alive, not its shard's."""
    whole: dict[str, np.ndarray] = {}
    by_shard: dict[int, list[tuple[str, Hashable, int]]] = {}
    for name in wanted:
        pieces = layout[name]
        spec = pieces[0][1]
        if out is not None and name in out:
            whole[name] = _given(name, spec.whole_shape, np.dtype(spec.dtype), out[name])
        elif len(pieces) == 1:
            by_shard.setdefault(pieces[0][0], []).append((name, np.dtype(spec.dtype), spec.nbytes))
            whole[name] = _NOT_YET  # keeps ``wanted``'s order
        else:
            whole[name] = np.empty(spec.whole_shape, spec.dtype)
    limit = min(fused.FUSE_GROUP_BYTES, max_chunk)
    for items in by_shard.values():
        for group in fused.fusion_groups(items, limit):
            if len(group) == 1:  # travels as a chunk of its own
                spec = layout[group[0]][0][1]
                whole[group[0]] = np.empty(spec.whole_shape, spec.dtype)
                continue
            specs = [layout[name][0][1] for name in group]
            dtype = np.dtype(specs[0].dtype)
            counts = [spec.nbytes // dtype.itemsize for spec in specs]
            buffer = np.empty(sum(counts), dtype)
            at = 0
            for name, spec, count in zip(group, specs, counts):
                whole[name] = buffer[at : at + count].reshape(spec.whole_shape)
                at += count
    return whole


def span(arrays: Sequence[np.ndarray | None], dtype: np.dtype) -> np.ndarray | None:
    """One flat writable view covering ``arrays`` when they lie side by side, in this order, in one buffer of
    ``dtype`` (as ``destinations`` makes them); else None."""
    if not arrays or arrays[0] is None:
        return None
    base = arrays[0].base
    if not isinstance(base, np.ndarray) or base.dtype != dtype or base.ndim != 1 or not base.flags.writeable:
        return None
    start = arrays[0].__array_interface__["data"][0]
    at = start
    for array in arrays:
        if (
            array is None
            or array.base is not base
            or not array.flags.c_contiguous
            or array.__array_interface__["data"][0] != at
        ):
            return None
        at += array.nbytes
    first = (start - base.__array_interface__["data"][0]) // dtype.itemsize
    return base[first : first + (at - start) // dtype.itemsize]


# A placeholder that keeps ``destinations``' order while the buffers are cut.
_NOT_YET = np.empty(0)


def _given(name: str, shape: tuple[int, ...], dtype: np.dtype, array: object) -> np.ndarray:
    """``out[name]``, checked: a writable C-contiguous array of the variable's dtype and shape."""
    if (
        isinstance(array, np.ndarray)
        and array.shape == shape
        and array.dtype == dtype
        and array.flags.c_contiguous
        and array.flags.writeable
    ):
        return array
    found = (
        f"a {'read-only ' if not array.flags.writeable else ''}"
        f"{'' if array.flags.c_contiguous else 'non-contiguous '}{array.dtype} array of shape {fmt(array.shape)}"
        if isinstance(array, np.ndarray)
        else f"a {type(array).__name__}"
    )
    raise ParameterServerError(
        f"pull(out=...): out['{name}'] is {found}; it must be a writable C-contiguous "
        f"{dtype.name} array of shape {fmt(shape)}",
        "INVALID_ARGUMENT",
    )
