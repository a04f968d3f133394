"""A shard's tensors in memory: small variables grouped into one buffer each, and copy on write for readers.

Every optimizer update is elementwise, so the variables of one dtype can be
updated as one flat array: a model's biases and small filters (the
mini-Inception's 16 variables are 32 KB in all) then cost one kernel call,
one division of the sync sum and one reset of it per step, not one each.
``TensorTable`` keeps the small variables of each dtype (up to
``fused.FUSE_GROUP_BYTES`` a group, in the shard's order, the sizes that
travel fused) side by side in one buffer, and each of their optimizer slots
likewise; every tensor is still reachable by its checkpoint key (``"w"``,
``"w/m"``) as a view. A slot that is one value per variable (Adam's step
count) is a buffer of one value per member: the group's update advances the
first and copies it to the others, which is exact only while they are all
equal (``uniform``: always, unless a checkpoint says otherwise; a group that
is not is updated member by member). A moving statistic is never grouped.

Readers get read-only views and no copy (``lend``). While a reader holds a
view, the next update writes into a copy (``own``): for a grouped tensor
the whole group's buffer is copied. A lent group buffer is made with
``np.frombuffer`` over a ``memoryview``, so that every view cut from it (a
member, its bytes for the wire) keeps it alive and visible to the weak
reference that says whether it is still read; a view of an ordinary view
would point past it to the buffer that owns the memory.

Examples
--------
>>> import numpy as np
>>> from .config import VariableSpec
>>> from .shard_layout import ShardLayout
>>> specs = [VariableSpec("w", np.dtype("float32"), (2,)), VariableSpec("b", np.dtype("float32"), ())]
>>> table = TensorTable(ShardLayout(specs, "sgd"), {"w": np.ones(2, np.float32), "b": np.float32(5)})
>>> [group.names for group in table.groups]
[('w', 'b')]
>>> table.own_flat(0, "")
array([1., 1., 5.], dtype=float32)
>>> seen = table.lend("b")
>>> table.own_flat(0, "")[:] = 0  # a reader holds b: the group is copied first
>>> seen, table.lend("b")
(array(5., dtype=float32), array(0., dtype=float32))
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from .fused import FUSE_GROUP_BYTES, fusable
from .shard_layout import ShardLayout

VALUE = ""  # the part of a group that is its variables' values (the others are named by their slot)


@dataclass(frozen=True)
class TensorGroup:
    """Small variables of one dtype held side by side: ``names`` in the shard's order, each one's flat
    elements ``bounds`` in the group's buffers, and the optimizer's slots, elementwise and one-per-variable."""

    names: tuple[str, ...]
    dtype: np.dtype
    bounds: tuple[slice, ...]
    size: int
    elementwise_slots: tuple[str, ...]
    scalar_slots: tuple[str, ...]


def tensor_groups(shard: ShardLayout) -> list[TensorGroup]:
    """The groups of ``shard``'s small variables (at least two members each), in the shard's order by dtype."""
    pending: dict[np.dtype, list[str]] = {}
    sizes: dict[np.dtype, int] = {}
    closed: list[list[str]] = []
    for name, spec in shard.specs.items():
        nbytes = spec.nbytes
        if spec.moving or not fusable(nbytes):
            continue
        dtype = np.dtype(spec.dtype)
        if sizes.get(dtype, 0) + nbytes > FUSE_GROUP_BYTES:
            closed.append(pending.pop(dtype))
            sizes[dtype] = 0
        pending.setdefault(dtype, []).append(name)
        sizes[dtype] = sizes.get(dtype, 0) + nbytes
    closed.extend(pending.values())
    position = {name: i for i, name in enumerate(shard.specs)}
    groups = []
    for names in sorted((names for names in closed if len(names) > 1), key=lambda names: position[names[0]]):
        bounds, at = [], 0
        for name in names:
            count = math.prod(shard.specs[name].shape)
            bounds.append(slice(at, at + count))
            at += count
        slots = shard.slots_of[names[0]]
        scalar = tuple(slot for slot in slots if slot in shard.scalar_slots)
        elementwise = tuple(slot for slot in slots if slot not in scalar)
        groups.append(
            TensorGroup(tuple(names), np.dtype(shard.specs[names[0]].dtype), tuple(bounds), at, elementwise, scalar)
        )
    return groups


@dataclass(frozen=True)
class Prepared:
    """A table's tensors copied into new buffers, not installed yet (``TensorTable.prepare``)."""

    flats: dict[tuple[int, str], np.ndarray]
    tensors: dict[str, np.ndarray]


class TensorTable:
    """Every tensor of a shard by checkpoint key, the small variables' in group buffers (see the module)."""

    def __init__(self, shard: ShardLayout, values: Mapping[str, np.ndarray]) -> None:
        self.shard = shard
        self.groups = tensor_groups(shard)
        # A grouped key's home: (group, part, its elements in the part's buffer, its shape).
        self._home: dict[str, tuple[int, str, slice, tuple[int, ...]]] = {}
        for g, group in enumerate(self.groups):
            for i, name in enumerate(group.names):
                shape = tuple(shard.specs[name].shape)
                self._home[name] = (g, VALUE, group.bounds[i], shape)
                for slot in group.elementwise_slots:
                    self._home[f"{name}/{slot}"] = (g, slot, group.bounds[i], shape)
                for slot in group.scalar_slots:
                    self._home[f"{name}/{slot}"] = (g, slot, slice(i, i + 1), ())
        self._grouped = {name for group in self.groups for name in group.names}
        self.ungrouped = [name for name in shard.specs if name not in self._grouped]
        self.tensors: dict[str, np.ndarray] = {}
        self._flat: dict[tuple[int, str], np.ndarray] = {}
        self._lent: dict[object, weakref.ref[np.ndarray]] = {}  # by key, or by (group, part) for a group's buffer
        self.install(self.prepare(values))  # ``values``: one for every key of the shard, checked by the caller

    def prepare(self, values: Mapping[str, np.ndarray]) -> Prepared:
        """Copy ``values`` into new buffers laid out as this table's, changing nothing yet: the copy of a big
        checkpoint is made before the store's lock is taken (``install`` then only swaps)."""
        flats: dict[tuple[int, str], np.ndarray] = {}
        for g, group in enumerate(self.groups):
            flats[(g, VALUE)] = np.empty(group.size, group.dtype)
            for slot in group.elementwise_slots:
                flats[(g, slot)] = np.empty(group.size, group.dtype)
            for slot in group.scalar_slots:
                flats[(g, slot)] = np.empty(len(group.names), self.shard.tensors[f"{group.names[0]}/{slot}"][0])
        tensors = {}
        for key in self.shard.tensors:
            home = self._home.get(key)
            if home is None:
                tensors[key] = np.array(values[key], order="C")
                continue
            g, part, where, _ = home
            flats[(g, part)][where] = np.asarray(values[key]).reshape(-1)
        return Prepared(flats, tensors)

    def install(self, prepared: Prepared) -> None:
        """Make ``prepared``'s buffers the tensors (the views lent before stay views of the ones replaced)."""
        flats = prepared.flats
        self._flat, self._lent, self.tensors = flats, {}, prepared.tensors
        for g in range(len(self.groups)):
            for part in self.parts(g):
                self._point(g, part)
        # A one-per-variable slot runs once for the group only while its members agree (see the module).
        self.uniform = [
            all(bool(np.all(flats[(g, slot)] == flats[(g, slot)][0])) for slot in group.scalar_slots)
            for g, group in enumerate(self.groups)
        ]
        # The variables updated one by one: the ungrouped, and the members of a group that is not uniform.
        split = {name for g, group in enumerate(self.groups) if not self.uniform[g] for name in group.names}
        self.apart = [name for name in self.shard.specs if name not in self._grouped or name in split]

    def parts(self, g: int) -> tuple[str, ...]:
        group = self.groups[g]
        return (VALUE, *group.elementwise_slots, *group.scalar_slots)

    def _point(self, g: int, part: str) -> None:
        """Make the keys of group ``g``'s ``part`` views of its current buffer."""
        flat = self._flat[(g, part)]
        for name in self.groups[g].names:
            key = name if part == VALUE else f"{name}/{part}"
            _, _, where, shape = self._home[key]
            self.tensors[key] = flat[where].reshape(shape)

    def lend(self, key: str) -> np.ndarray:
        """A read-only view of tensor ``key``, no copy; readers between two updates share its buffer."""
        home = self._home.get(key)
        if home is None:
            tensor = self.tensors[key]
            return self._lent_flat(key, tensor).reshape(tensor.shape)
        g, part, where, shape = home
        return self._lent_flat((g, part), self._flat[(g, part)])[where].reshape(shape)

    def _lent_flat(self, owner: object, tensor: np.ndarray) -> np.ndarray:
        """The read-only flat view of ``tensor`` that its readers share, the one the weak reference watches:
        every view cut from it keeps it alive (see the module)."""
        ref = self._lent.get(owner)
        view = ref() if ref is not None else None
        if view is None:
            buffer = memoryview(tensor.reshape(-1))  # type: ignore[arg-type]
            view = np.frombuffer(buffer, tensor.dtype)
            view.flags.writeable = False
            self._lent[owner] = weakref.ref(view)
        return view

    def own(self, key: str) -> np.ndarray:
        """Tensor ``key``, safe to write in place: its buffer copied first if a reader still holds a view of it."""
        home = self._home.get(key)
        if home is not None:
            self.own_flat(home[0], home[1])
        elif self._still_read(key):
            self.tensors[key] = self.tensors[key].copy()
        return self.tensors[key]

    def own_flat(self, g: int, part: str) -> np.ndarray:
        """Group ``g``'s buffer of ``part`` (``VALUE`` or a slot), safe to write in place (see ``own``)."""
        if self._still_read((g, part)):
            self._flat[(g, part)] = self._flat[(g, part)].copy()
            self._point(g, part)
        return self._flat[(g, part)]

    def _still_read(self, owner: object) -> bool:
        ref = self._lent.pop(owner, None)
        return ref is not None and ref() is not None

    def lend_all(self) -> dict[str, np.ndarray]:
        """Every tensor, lent (what a checkpoint saves)."""
        return {key: self.lend(key) for key in self.shard.tensors}

    def nbytes(self, key: str) -> int:
        return int(self.tensors[key].nbytes)
