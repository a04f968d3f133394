"""Optimizers: ``cg.optim.SGD``, ``Momentum``, ``Adam``, ``AdamW`` (both with ``amsgrad``), ``RMSProp`` (with
``centered``), ``Adagrad``, ``Adamax``, ``Nadam``, ``Adadelta``; ``clip_by_global_norm``;
learning-rate schedules ``piecewise_constant``, ``exponential_decay`` and ``cosine_decay`` (with warm-up);
``mixed_precision`` (float32 master weights, float16 or bfloat16 compute, a dynamic loss scale).

Each optimizer is an entry of ``cellgraph.dataflow.optimizer_registry``, which
the parameter servers read too; a schedule (``cellgraph.dataflow.schedules``)
is accepted wherever a learning rate is, locally and on the parameter servers.
"""

from __future__ import annotations

from cellgraph.dataflow.mixed_precision import LossScaleWarning, MixedPrecision, mixed_precision
from cellgraph.dataflow.optimizers import (
    SGD,
    Adadelta,
    Adagrad,
    Adam,
    Adamax,
    AdamW,
    Momentum,
    Nadam,
    Optimizer,
    RMSProp,
    clip_by_global_norm,
)
from cellgraph.dataflow.schedules import (
    CosineDecay,
    ExponentialDecay,
    PiecewiseConstant,
    Schedule,
    cosine_decay,
    exponential_decay,
    piecewise_constant,
)

__all__ = [
    "SGD",
    "Adadelta",
    "Adagrad",
    "Adam",
    "AdamW",
    "Adamax",
    "CosineDecay",
    "ExponentialDecay",
    "LossScaleWarning",
    "MixedPrecision",
    "Momentum",
    "Nadam",
    "Optimizer",
    "PiecewiseConstant",
    "RMSProp",
    "Schedule",
    "clip_by_global_norm",
    "cosine_decay",
    "exponential_decay",
    "mixed_precision",
    "piecewise_constant",
]


def __dir__() -> list[str]:
    """What ``cg.optim.<Tab>`` offers: its public names, not the modules and types it imports for itself."""
    return sorted(__all__)
