"""The values of a session's variables, created from their initial values on first use."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar, cast

import numpy as np

from .graph import Graph, Node

T = TypeVar("T")


class VariableStore:
    """Variable values by node name.

    A value lives as long as the store and is updated in place by assign and
    optimizer ops. A variable whose definition changed (its cell was re-run
    with another shape, dtype or initial value) is re-initialised, and so are
    the optimizer slots that update it; the graph has warned about that. A
    re-run that defines it exactly as before (the same seeded initial value)
    keeps its trained value.
    """

    def __init__(self, seed: int | None = None) -> None:
        # The session's seed, mixed into each random op's own (KernelContext.stream); None keeps the ops' seeds.
        self.seed = seed
        self._values: dict[str, np.ndarray] = {}
        # The initial value each stored value was made from: the node's own array, compared by identity on every
        # run (the hot path) and by content only when a re-run cell brought a new node of the same name.
        self._initial: dict[str, np.ndarray] = {}
        self._synced_version: int | None = None
        # Random streams the session's kernels draw from (dropout's masks), one per key, shared by every plan.
        self._streams: dict[str, Any] = {}

    def stream(self, key: str, make: Callable[[], T]) -> T:
        """The session's random stream ``key``, made by ``make`` the first time it is asked for. Every plan of
        the session draws from the same one: a run with another fetch list goes on with the sequence rather
        than start it again (a training loop alternating two fetch lists would replay its dropout masks)."""
        found = self._streams.get(key)
        if found is None:
            found = self._streams[key] = make()
        return cast(T, found)

    def value(self, node: Node) -> np.ndarray:
        """The live array of variable ``node``, initialising it if needed."""
        initial = node.attrs["initial_value"]
        if self._initial.get(node.name) is not initial:
            self._adopt(node, initial)
        return self._values[node.name]

    def sync(self, graph: Graph) -> None:
        """Re-initialise, before anything reads them, the variables of ``graph`` whose definition changed
        since they were stored, and their slots (reading them one by one as ops run could hand an op a
        slot's old value before its variable was seen to change)."""
        if self._synced_version == graph.version:
            return
        for node in graph.variables():
            initial = node.attrs["initial_value"]
            if node.name in self._values and self._initial.get(node.name) is not initial:
                self._adopt(node, initial)
        self._synced_version = graph.version

    def load(self, node: Node, value: np.ndarray) -> None:
        target = self.value(node)
        target[...] = value

    def __contains__(self, name: object) -> bool:
        return name in self._values

    def _adopt(self, node: Node, initial: np.ndarray) -> None:
        dtype = node.specs[0].dtype
        known, value = self._initial.get(node.name), self._values.get(node.name)
        self._initial[node.name] = initial
        fresh = np.array(initial, dtype=dtype, copy=True)
        if value is not None and known is not None and value.dtype == fresh.dtype and _equal(known, fresh):
            return
        self._values[node.name] = fresh
        if value is not None:
            self._forget_slots(node)

    def _forget_slots(self, node: Node) -> None:
        """Drop the values of the other variables that an optimizer op updates together with ``node``:
        its slots (momentum, Adam's moments), which would otherwise carry the old training into the new
        value. They start again from their own initial values on next use."""
        graph = node.graph
        for consumer in graph.nodes if graph is not None else []:
            if consumer.inputs and consumer.inputs[0].node is node and consumer.op.startswith("Apply"):
                for t in consumer.inputs[1:]:
                    if t.node.op == "Variable":
                        self._values.pop(t.node.name, None)
                        self._initial.pop(t.node.name, None)


def _equal(known: np.ndarray, fresh: np.ndarray) -> bool:
    """Whether the earlier initial value ``known`` is ``fresh`` (NaN equal to NaN), in ``fresh``'s dtype."""
    if np.shape(known) != fresh.shape:
        return False
    return bool(np.array_equal(np.asarray(known, dtype=fresh.dtype), fresh, equal_nan=fresh.dtype.kind not in "biu"))
