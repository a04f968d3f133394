"""The optimizer updates a parameter server applies: the optimizer registry's, as the executor runs them.

Each kind's ``update`` (``dataflow/optimizer_registry.py``) is the function the
executor's ``Apply*`` op calls, with the scalars cast the same way, so a
variable trained on a server moves exactly as it would locally. A scheduled
learning rate is taken at the global step the update is applied in, as the
local ``LearningRateSchedule`` op takes it from ``global_step`` before the
step's ``assign_add``.

Examples
--------
>>> var = np.ones(3, np.float32)
>>> update = step_update(OptimizerConfig("sgd", learning_rate=0.25), 0)
>>> update(var, {}, np.full(3, 2.0, np.float32))
>>> var
array([0.5, 0.5, 0.5], dtype=float32)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from cellgraph.dataflow.optimizer_registry import OPTIMIZER_KINDS, OptimizerDef

from .config import OptimizerConfig

# A scalar slot (Adam's step count) is float64, whatever the variable's dtype.
STEP_COUNT_DTYPE = np.dtype(np.float64)

# (variable, its slots, gradient) -> None: in place.
Update = Callable[[np.ndarray, Mapping[str, np.ndarray], np.ndarray], None]


class StepUpdates:
    """One optimizer config's updates, step by step: its registry entry and hyperparameters are read once (a
    store makes one), the learning rate at each step."""

    def __init__(self, opt: OptimizerConfig) -> None:
        self.opt = opt
        self.definition: OptimizerDef = OPTIMIZER_KINDS.lookup(opt.kind)
        self.hyperparameters = opt.hyperparameters

    def at(self, step: int) -> Update:
        """The update of every variable of a shard at global step ``step``."""
        definition, rate, hyperparameters = self.definition, self.opt.learning_rate_at(step), self.hyperparameters

        def update(var: np.ndarray, slots: Mapping[str, np.ndarray], grad: np.ndarray) -> None:
            definition.update(var, slots, rate, grad, hyperparameters)

        return update


def step_update(opt: OptimizerConfig, step: int) -> Update:
    """The update of every variable of a shard at global step ``step``: the kind's registry entry, with the
    learning rate (at that step) and the hyperparameters read once, not once per variable."""
    return StepUpdates(opt).at(step)
