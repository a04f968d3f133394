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
>>> UPDATES["sgd"](var, {}, np.full(3, 2.0, np.float32), OptimizerConfig("sgd", learning_rate=0.25), 0)
>>> var
array([0.5, 0.5, 0.5], dtype=float32)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from cellgraph.dataflow.optimizer_registry import OPTIMIZER_KINDS, OptimizerDef, kinds

from .config import OptimizerConfig

# A scalar slot (Adam's step count) is float64, whatever the variable's dtype.
STEP_COUNT_DTYPE = np.dtype(np.float64)

# (variable, its slots, gradient, config, global step the update is applied at) -> None: in place.
Update = Callable[[np.ndarray, Mapping[str, np.ndarray], np.ndarray, OptimizerConfig, int], None]


def _server_update(definition: OptimizerDef) -> Update:
    def update(
        var: np.ndarray, slots: Mapping[str, np.ndarray], grad: np.ndarray, opt: OptimizerConfig, step: int
    ) -> None:
        definition.update(var, slots, opt.learning_rate_at(step), grad, opt.hyperparameters)

    return update


UPDATES: dict[str, Update] = {kind: _server_update(OPTIMIZER_KINDS.lookup(kind)) for kind in kinds()}
