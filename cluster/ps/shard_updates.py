"""How pushed gradients change a shard's tensors: the sync sum and its mean, and the update group by group.

``ParameterStore`` decides which pushes count (registration, steps,
staleness, non-finite values) and when a step is complete; ``ShardUpdates``
does the arithmetic on its ``TensorTable``. In sync mode each step's
gradients are summed (a group's sum is one buffer, its members' sums views of
it) and their mean applied; in async mode each push is applied as it comes.
The optimizer runs once per group of small variables (tensor_table.py) and
once per other variable; a moving statistic moves towards its pushed value.
A gradient that arrived fused with exactly a group's members, in its order
(``fused``: the chunk's content as one flat array), is summed or applied as
it lies.

Examples
--------
>>> import numpy as np
>>> from .config import OptimizerConfig, VariableSpec
>>> from .shard_layout import ShardLayout
>>> from .tensor_table import TensorTable
>>> shard = ShardLayout([VariableSpec("w", np.dtype("float32"), (2,)), VariableSpec("b", np.dtype("float32"), ())], "sgd")
>>> table = TensorTable(shard, {"w": np.zeros(2, np.float32), "b": np.float32(0)})
>>> updates = ShardUpdates(shard, table, OptimizerConfig("sgd", learning_rate=1.0), sync=True)
>>> for g in (1.0, 3.0):
...     updates.add({"w": np.full(2, g, np.float32), "b": np.array(g, np.float32)}, None)
>>> updates.apply_mean(2, step=0)
>>> table.lend("w"), table.lend("b")
(array([-2., -2.], dtype=float32), array(-2., dtype=float32))
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from .config import OptimizerConfig
from .pieces import Gradient, Pieced, add_in_parts, parts, update_in_parts
from .shard_layout import ShardLayout
from .tensor_table import VALUE, TensorTable
from .updates import StepUpdates

Fused = Mapping[tuple[str, ...], np.ndarray]  # gradients that arrived side by side: by their names in order


class ShardUpdates:
    """The sync sums of one shard and the updates of its tensors (see the module)."""

    def __init__(self, shard: ShardLayout, table: TensorTable, optimizer: OptimizerConfig, sync: bool) -> None:
        self.shard, self.table = shard, table
        self._step_updates = StepUpdates(optimizer)  # the registry entry and hyperparameters, read once
        self._group_sums = [np.zeros(group.size, group.dtype) for group in table.groups] if sync else []
        self.sums: dict[str, np.ndarray] = {}  # sync mode: this step's sum of each variable's gradients
        if sync:
            grouped = {
                name: total[where].reshape(shard.specs[name].shape)
                for group, total in zip(table.groups, self._group_sums, strict=True)
                for name, where in zip(group.names, group.bounds, strict=True)
            }
            for name in shard.specs:
                self.sums[name] = grouped[name] if name in grouped else np.zeros_like(table.tensors[name])

    # ------------------------------------------------------------------ sync mode
    def add(self, grads: Mapping[str, Gradient], fused: Fused | None) -> None:
        """Add one push's gradients (checked) to this step's sums."""
        for group, total in zip(self.table.groups, self._group_sums, strict=True):
            flat = _arrived_whole(group.names, group.size, group.dtype, fused) if fused else None
            if flat is not None:
                np.add(total, flat, out=total)
            else:
                for name in group.names:
                    add_in_parts(self.sums[name], grads[name])
        for name in self.table.ungrouped:
            add_in_parts(self.sums[name], grads[name])

    def apply_mean(self, contributed: int, step: int) -> None:
        """Apply the mean of the ``contributed`` gradients summed, as the update of global step ``step``."""
        for total in self._whole_sums():
            np.divide(total, contributed, out=total)
        self.apply(self.sums, step, self._group_sums)

    def discard(self) -> None:
        """Start the next step's sums from zero."""
        for total in self._whole_sums():
            total.fill(0)

    def _whole_sums(self) -> list[np.ndarray]:
        """The sums as arrays that cover them once: each group's, then each ungrouped variable's."""
        if not self.sums:  # async mode keeps none
            return []
        return [*self._group_sums, *(self.sums[name] for name in self.table.ungrouped)]

    # ------------------------------------------------------------------ the update
    def apply_push(self, grads: Mapping[str, Gradient], fused: Fused | None, step: int) -> None:
        """Async mode: apply one push's gradients as the update of global step ``step``."""
        group_grads = []
        for group in self.table.groups:  # each group's gradient as one array: as it arrived, or its members' joined
            flat = _arrived_whole(group.names, group.size, group.dtype, fused) if fused else None
            group_grads.append(flat if flat is not None else np.concatenate([_flat(grads[n]) for n in group.names]))
        self.apply({name: _contiguous(grads[name]) for name in self.shard.specs}, step, group_grads)

    def apply(self, grads: Mapping[str, Gradient], step: int, group_grads: Sequence[np.ndarray]) -> None:
        """One update of every variable (``group_grads``: each group's gradient as one flat array, the same values
        as its members' in ``grads``) with the optimizer's settings at global step ``step``."""
        update = self._step_updates.at(step)
        table = self.table
        for g, group in enumerate(table.groups):
            if not table.uniform[g]:
                continue  # updated member by member below
            slots = {slot: table.own_flat(g, slot) for slot in group.elementwise_slots}
            # A slot of one value per member, all equal: the first moves, the others follow it.
            counts = [table.own_flat(g, slot) for slot in group.scalar_slots]
            slots |= {slot: each[0:1].reshape(()) for slot, each in zip(group.scalar_slots, counts, strict=True)}
            update(table.own_flat(g, VALUE), slots, group_grads[g])
            for each in counts:
                each[1:] = each[0]
        for name in table.apart:
            if self.shard.specs[name].moving:  # towards the step's value (the mean of the replicas' in sync mode)
                kept, taken = self.shard.moving_weights[name]
                moved = table.own(name).reshape(-1)
                for where, piece in parts(grads[name]):
                    np.multiply(moved[where], kept, out=moved[where])
                    moved[where] += piece * taken
            else:
                slots = {slot: table.own(f"{name}/{slot}") for slot in self.shard.slots_of[name]}
                update_in_parts(update, table.own(name), slots, grads[name])


def _arrived_whole(names: tuple[str, ...], size: int, dtype: np.dtype, fused: Fused) -> np.ndarray | None:
    """The gradients of ``names`` as one flat array when they arrived so, else None."""
    flat = fused.get(names)
    return flat if flat is not None and flat.size == size and flat.dtype == dtype else None


def _flat(grad: Gradient) -> np.ndarray:
    """A gradient's elements as one flat array (a view when it is one array already)."""
    return grad.whole().reshape(-1) if isinstance(grad, Pieced) else np.ravel(grad)


def _contiguous(grad: Gradient) -> Gradient:
    """A gradient whose pieces are C-contiguous, as the update kernels read them."""
    return grad if isinstance(grad, Pieced) else np.ascontiguousarray(grad)
