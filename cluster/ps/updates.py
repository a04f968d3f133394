"""The optimizer updates a parameter server applies: the optimizer registry's, as the executor runs them.

Each kind's ``update`` (``dataflow/optimizer_registry.py``) is the function the
executor's ``Apply*`` op calls, with the scalars cast the same way, so a
variable trained on a server moves exactly as it would locally.

Examples
--------
>>> var = np.ones(3, np.float32)
>>> UPDATES["sgd"](var, {}, np.full(3, 2.0, np.float32), OptimizerConfig("sgd", learning_rate=0.25))
>>> var
array([0.5, 0.5, 0.5], dtype=float32)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from cellgraph.dataflow.optimizer_registry import OPTIMIZER_KINDS, OptimizerDef, kinds

from .config import OptimizerConfig

# Adam's step count is a float64 scalar per variable, whatever the variable's dtype.
STEP_COUNT_SLOT = "t"
STEP_COUNT_DTYPE = np.dtype(np.float64)

Update = Callable[[np.ndarray, Mapping[str, np.ndarray], np.ndarray, OptimizerConfig], None]


def _server_update(definition: OptimizerDef) -> Update:
    def update(var: np.ndarray, slots: Mapping[str, np.ndarray], grad: np.ndarray, opt: OptimizerConfig) -> None:
        assert opt.learning_rate is not None  # OptimizerConfig fills every hyperparameter of its kind
        definition.update(var, slots, opt.learning_rate, grad, opt.hyperparameters)

    return update


UPDATES: dict[str, Update] = {kind: _server_update(OPTIMIZER_KINDS.lookup(kind)) for kind in kinds()}
