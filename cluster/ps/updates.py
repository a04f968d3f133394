"""The optimizer updates a parameter server applies: the executor's own kernels.

The same update functions as the executor's ``Apply*`` kernels, with the
scalars cast the same way, so a variable trained on a server moves exactly as
it would locally.

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

from ...dataflow.kernels.cpu import training as k
from .config import OptimizerConfig

# Adam's step count is a float64 scalar per variable, whatever the variable's dtype.
STEP_COUNT_SLOT = "t"
STEP_COUNT_DTYPE = np.dtype(np.float64)


def _sgd(var: np.ndarray, slots: Mapping[str, np.ndarray], grad: np.ndarray, opt: OptimizerConfig) -> None:
    k.sgd_update(var, opt.learning_rate, grad)


def _momentum(var: np.ndarray, slots: Mapping[str, np.ndarray], grad: np.ndarray, opt: OptimizerConfig) -> None:
    k.momentum_update(var, slots["momentum"], opt.learning_rate, grad, opt.momentum, opt.nesterov)


def _adam(var: np.ndarray, slots: Mapping[str, np.ndarray], grad: np.ndarray, opt: OptimizerConfig) -> None:
    m, v, t = slots["m"], slots["v"], slots[STEP_COUNT_SLOT]
    k.adam_update(var, m, v, t, opt.learning_rate, grad, opt.beta1, opt.beta2, opt.epsilon)


Update = Callable[[np.ndarray, Mapping[str, np.ndarray], np.ndarray, OptimizerConfig], None]
UPDATES: dict[str, Update] = {"sgd": _sgd, "momentum": _momentum, "adam": _adam}
