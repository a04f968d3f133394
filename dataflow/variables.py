"""The values of a session's variables, created from their initial values on first use."""

from __future__ import annotations

import numpy as np

from .graph import Node
from .opdef import TensorSpec


class VariableStore:
    """Variable values by node name.

    A value lives as long as the store and is updated in place by assign and
    optimizer ops. A variable whose shape or dtype changed (its cell was re-run
    with a new definition) is re-initialised; the graph has warned about that.
    """

    def __init__(self) -> None:
        self._values: dict[str, np.ndarray] = {}
        self._specs: dict[str, TensorSpec] = {}

    def value(self, node: Node) -> np.ndarray:
        """The live array of variable ``node``, initialising it if needed."""
        spec = node.specs[0]
        if self._specs.get(node.name) != spec:
            self._values[node.name] = np.array(node.attrs["initial_value"], dtype=spec.dtype, copy=True)
            self._specs[node.name] = spec
        return self._values[node.name]

    def load(self, node: Node, value: np.ndarray) -> None:
        target = self.value(node)
        target[...] = value

    def __contains__(self, name: object) -> bool:
        return name in self._values
