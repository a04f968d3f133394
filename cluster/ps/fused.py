"""Fused chunks: a step's small tensors of one dtype travel as one chunk (Horovod's tensor fusion, on the wire).

A model's biases, batch-norm scales and small filters are each a few hundred
bytes, but every tensor of a step costs a fixed amount of work on both sides
(its chunk's framing, an assembler, a NaN check, an arrival to report): for
the mini-Inception's 16 variables of 32 KB in all, about 20 us of client and
20 us of server CPU each, per step, more than their bytes cost. So the tensors
of at most ``FUSE_TENSOR_BYTES`` that go to one shard in one message are
joined into one ``TensorChunk`` whose ``members`` name them: its content is
their bytes one after the other, each whole, in that order (no copy on the
sending side: the join of the message is the one copy, as for any chunk).

The receiver checks a fused chunk against what it expects before it takes a
byte (``checked``): every member known, of the chunk's dtype, named once and not
received already, and the content exactly as long as the members together.
Pushes on every RPC may carry fused chunks; a pull's answer on the Step stream
carries them when its request says ``fuse``.

Examples
--------
>>> import numpy as np
>>> from cellgraph.protos import tensor_pb2
>>> from .config import VariableSpec
>>> a, b = np.arange(3, dtype=np.float32), np.ones((2, 2), np.float32)
>>> specs = {"a": VariableSpec("a", a.dtype, a.shape), "b": VariableSpec("b", b.dtype, b.shape)}
>>> [parts] = list(tensor_chunk_parts([(specs["a"], a), (specs["b"], b)]))
>>> chunk = tensor_pb2.TensorChunk.FromString(b"".join(parts))
>>> list(chunk.members), len(chunk.content)
(['a', 'b'], 28)
>>> layout, flat = checked(chunk, memoryview(chunk.content), specs.get, "push")
>>> [(name, view.tolist()) for name, view in members(layout, flat)], flat.size
([('a', [0.0, 1.0, 2.0]), ('b', [[1.0, 1.0], [1.0, 1.0]])], 7)
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, TypeVar

import numpy as np

from cellgraph.protos import tensor_pb2

from ..errors import ParameterServerError
from .chunks import MAX_CHUNK_BYTES, dtype_enum, dtype_of, wire_view
from .config import VariableSpec, listed
from .frames import chunk_heads, varint

# A tensor this small (or smaller) travels fused with the others of its dtype. Measured on an Inception-v3-sized
# model (ps_throughput.py's, 100 MB), 256 KiB against 64 KiB fuses its 120 kernels of 72 KB too: a pull of the
# model took 35-36 ms against 41-42, a push 41-44 against 43-44, one shard on loopback.
FUSE_TENSOR_BYTES = 256 * 1024
# A fused chunk holds at most this many bytes (and at most the chunk size): a larger group starts another.
FUSE_GROUP_BYTES = 1024 * 1024
T = TypeVar("T")
_CONTENT = tensor_pb2.TensorChunk.DESCRIPTOR.fields_by_name["content"].number


def fusable(nbytes: int) -> bool:
    """Whether a tensor of ``nbytes`` bytes travels fused (an empty one goes alone: it has nothing to join)."""
    return 0 < nbytes <= FUSE_TENSOR_BYTES


Entry = tuple[str, np.dtype, tuple[int, ...]]  # a tensor as a chunk plan sees it: name, dtype, shape


@dataclass(frozen=True)
class ChunkPlan:
    """One chunk of a list of tensors, without their values: its serialized fields up to its content (the
    content's tag and length included), and where the content comes from: (tensor index, first byte, end
    byte) of each tensor's bytes, in order."""

    head: bytes
    sources: tuple[tuple[int, int, int], ...]

    @property
    def nbytes(self) -> int:
        """The chunk's serialized size."""
        return len(self.head) + sum(end - start for _, start, end in self.sources)


def tensor_chunk_parts(
    tensors: Sequence[tuple[VariableSpec, np.ndarray]], max_bytes: int = MAX_CHUNK_BYTES
) -> Iterator[list[Any]]:
    """The chunks of ``tensors`` (spec, array), each as the pieces of a serialized ``TensorChunk``: its head,
    then views of the tensors' bytes (``chunk_plans`` says which)."""
    arrays = [array for _, array in tensors]
    for plan in chunk_plans(entries(tensors), max_bytes):
        parts: list[Any] = [plan.head]
        for i, start, end in plan.sources:
            parts.append(wire_view(arrays[i], start, end))
        yield parts


def entries(tensors: Sequence[tuple[VariableSpec, np.ndarray]]) -> tuple[Entry, ...]:
    """What ``chunk_plans`` needs of ``tensors``: each one's name, dtype and shape."""
    return tuple([(spec.name, array.dtype, array.shape) for spec, array in tensors])  # a list: no generator


@lru_cache(maxsize=1024)
def chunk_plans(tensors: tuple[Entry, ...], max_bytes: int = MAX_CHUNK_BYTES) -> tuple[ChunkPlan, ...]:
    """The chunks tensors of these names, dtypes and shapes travel in: the small ones of each dtype fused (in
    groups of at most ``FUSE_GROUP_BYTES``; a group of one is an ordinary chunk), the others cut into chunks
    of at most ``max_bytes``. The order is kept as far as fusing allows: the groups so far go before each big
    tensor. A replica sends the same tensors step after step, so this is worked out once for them."""
    plans: list[ChunkPlan] = []
    groups: dict[np.dtype, list[int]] = {}
    sizes: dict[np.dtype, int] = {}
    limit = min(FUSE_GROUP_BYTES, max_bytes)
    lengths = [int(np.prod(shape, dtype=np.int64)) * dtype.itemsize for _, dtype, shape in tensors]

    def group_plan(group: list[int]) -> ChunkPlan:
        if len(group) == 1:  # a group of one is that tensor's own chunk
            [i] = group
            name, dtype, shape = tensors[i]
            [(_, head)] = chunk_heads(name, dtype, shape, lengths[i], max_bytes)
            return ChunkPlan(head, ((i, 0, lengths[i]),))
        names = tuple(tensors[i][0] for i in group)
        head = fused_head(names, tensors[group[0]][1], sum(lengths[i] for i in group))
        return ChunkPlan(head, tuple((i, 0, lengths[i]) for i in group))

    for i, (name, dtype, shape) in enumerate(tensors):
        nbytes = lengths[i]
        if not fusable(nbytes) or nbytes > limit:
            if nbytes:  # the small ones before a big one go first: a receiver may wait for them in this order
                plans += (group_plan(group) for group in groups.values())
                groups.clear()
                sizes.clear()
            for offset, head in chunk_heads(name, dtype, shape, nbytes, max_bytes):
                plans.append(ChunkPlan(head, ((i, offset, min(offset + max_bytes, nbytes)),)))
            continue
        if sizes.get(dtype, 0) + nbytes > limit:
            plans.append(group_plan(groups.pop(dtype)))
            sizes[dtype] = 0
        groups.setdefault(dtype, []).append(i)
        sizes[dtype] = sizes.get(dtype, 0) + nbytes
    plans += (group_plan(group) for group in groups.values())
    return tuple(plans)


def fused_parts(tensors: Sequence[tuple[str, np.ndarray]]) -> list[Any]:
    """``tensors`` (name, array; one dtype, together at most a chunk) as the pieces of one fused
    ``TensorChunk``: its head, then each tensor's bytes as a view."""
    views = [wire_view(array, 0, array.nbytes) for _, array in tensors]
    nbytes = sum(view.nbytes for view in views)
    return [fused_head(tuple(name for name, _ in tensors), tensors[0][1].dtype, nbytes), *views]


def answer_groups(
    values: Mapping[str, tuple[int, np.ndarray]], max_bytes: int
) -> Iterator[tuple[int, list[tuple[str, np.ndarray]]]]:
    """A pull's values (name: (version, array)) in the groups its answer sends them in: (version, members),
    the small values of one dtype and one version together (a version is per message), each other value
    alone, in the order of ``values`` as far as the groups allow (``fusion_groups``; a replica uses its values
    in the order it asked for them, the first layer's first)."""
    items = [
        ((name, version, value), (value.dtype, version), value.nbytes) for name, (version, value) in values.items()
    ]
    for group in fusion_groups(items, min(FUSE_GROUP_BYTES, max_bytes)):
        yield group[0][1], [(name, value) for name, _, value in group]


def fusion_groups(items: Sequence[tuple[T, Hashable, int]], limit: int) -> Iterator[list[T]]:
    """``items`` (item, fusion key, bytes) in the groups a message carries them in: the small ones
    (``fusable``) of one key together, in groups of at most ``limit`` bytes, each other one alone. The order
    is kept as far as the groups allow: the groups so far go before each big item (a receiver may wait for
    them in this order). A pull's answer groups by dtype and version, and a client lays out the arrays it
    pulls into by the same rule (``destinations.py``)."""
    groups: dict[Hashable, list[T]] = {}
    sizes: dict[Hashable, int] = {}
    for item, key, nbytes in items:
        if not fusable(nbytes) or nbytes > limit:
            if nbytes:
                yield from groups.values()
                groups.clear()
                sizes.clear()
            yield [item]
            continue
        if sizes.get(key, 0) + nbytes > limit:
            yield groups.pop(key)
            sizes[key] = 0
        groups.setdefault(key, []).append(item)
        sizes[key] = sizes.get(key, 0) + nbytes
    yield from groups.values()


@lru_cache(maxsize=1024)
def fused_head(members: tuple[str, ...], dtype: np.dtype, nbytes: int) -> bytes:
    """A fused chunk's fields up to its content (the content's tag and length included): a replica sends the
    same groups step after step, so each is serialized once."""
    meta = tensor_pb2.TensorChunk(dtype=dtype_enum(np.dtype(dtype)), members=members)  # type: ignore[arg-type]
    meta.shape.dim.append(nbytes // np.dtype(dtype).itemsize)
    return meta.SerializeToString() + varint(_CONTENT << 3 | 2) + varint(nbytes)


@dataclass(frozen=True)
class FusedLayout:
    """A fused chunk's members as checked against their specs: their names, and each one's element count and
    shape in the chunk's content, which is ``nbytes`` long."""

    names: tuple[str, ...]
    dtype: np.dtype
    counts: tuple[int, ...]
    shapes: tuple[tuple[int, ...], ...]
    nbytes: int


# Layouts a receiver keeps (``checked``'s ``layouts``): a replica sends the same groups step after step, and the
# checks of their members against the specs give the same answer every time. At most this many: a sender that
# varies its groups costs the checks again, not memory.
LAYOUTS_KEPT = 64


def checked(
    chunk: tensor_pb2.TensorChunk,
    content: memoryview,
    spec_of: Callable[[str], VariableSpec | None],
    what: str,
    received: Callable[[str], bool] = lambda name: False,
    layouts: dict[tuple[tuple[str, ...], int], FusedLayout] | None = None,
) -> tuple[FusedLayout, np.ndarray]:
    """A fused chunk's layout and its content as one flat array of the members' dtype (``members`` cuts it into
    each member's view), after checking the chunk completely: nothing is taken from a chunk that is wrong
    anywhere. A receiver that copies the content at once needs no view of each member.

    ``spec_of(name)``: the spec the receiver expects for ``name`` (None: it
    expects no such tensor, NOT_FOUND); ``received(name)``: whether it has
    that tensor already (then the chunk repeats it). ``what`` names the
    message in errors (``"replica 0's push for step 3"``). ``layouts``: the
    receiver's kept ``FusedLayout`` of each member list and dtype already
    checked, for a receiver whose ``spec_of`` never changes.
    """
    names = tuple(chunk.members)

    def where() -> str:  # made only for an error: a chunk that is right costs no formatting
        shown = listed(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        return f"the fused chunk of {shown} in {what}"

    key = (names, chunk.dtype)
    layout = layouts.get(key) if layouts is not None else None
    dtype = layout.dtype if layout is not None else dtype_of(chunk.dtype, f"the fused chunk in {what}")
    if chunk.offset != 0:
        raise ParameterServerError(
            f"{where()} has offset {chunk.offset}; a fused chunk is whole, at offset 0", "INVALID_ARGUMENT"
        )
    if layout is None:
        layout = _checked_layout(names, dtype, spec_of, where)
        if layouts is not None and len(layouts) < LAYOUTS_KEPT:
            layouts[key] = layout
    for name in names:
        if received(name):
            raise ParameterServerError(f"{where()} carries {listed([name])} a second time", "INVALID_ARGUMENT")
    if layout.nbytes != content.nbytes:
        raise ParameterServerError(
            f"{where()} carries {content.nbytes:,} bytes; its members are {layout.nbytes:,} bytes together",
            "INVALID_ARGUMENT",
        )
    raw = np.frombuffer(content, dtype=np.uint8)
    if raw.ctypes.data % dtype.alignment:  # cut out of the received bytes at an odd place: one aligned copy
        raw = raw.copy()
    return layout, raw.view(dtype)


def members(layout: FusedLayout, flat: np.ndarray) -> list[tuple[str, np.ndarray]]:
    """Each member of a checked fused chunk (``checked``), as a view of its shape over ``flat``."""
    out, at = [], 0
    for name, count, shape in zip(layout.names, layout.counts, layout.shapes, strict=True):
        out.append((name, flat[at : at + count].reshape(shape)))
        at += count
    return out


def _checked_layout(
    members: tuple[str, ...], dtype: np.dtype, spec_of: Callable[[str], VariableSpec | None], where: Callable[[], str]
) -> FusedLayout:
    """The layout of ``members`` after checking each against its spec: known, named once, of ``dtype``."""
    specs: list[VariableSpec] = []
    seen: set[str] = set()
    for name in members:
        spec = spec_of(name)
        if spec is None:
            raise ParameterServerError(f"{where()} names {listed([name])}, which was not expected here", "NOT_FOUND")
        if name in seen:
            raise ParameterServerError(f"{where()} carries {listed([name])} a second time", "INVALID_ARGUMENT")
        if spec.dtype != dtype:
            raise ParameterServerError(
                f"{where()} is {dtype.name}, but {listed([name])} is {np.dtype(spec.dtype).name}", "INVALID_ARGUMENT"
            )
        seen.add(name)
        specs.append(spec)
    return FusedLayout(
        members,
        dtype,
        tuple(spec.nbytes // dtype.itemsize for spec in specs),
        tuple(tuple(spec.shape) for spec in specs),
        sum(spec.nbytes for spec in specs),
    )
