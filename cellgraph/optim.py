"""Optimizers: ``cg.optim.SGD``, ``Momentum``, ``Adam``, ``AdamW``, ``RMSProp``, ``Adagrad``; ``clip_by_global_norm``.

Each is an entry of ``cellgraph.dataflow.optimizer_registry``, which the
parameter servers read too.
"""

from __future__ import annotations

from cellgraph.dataflow.optimizers import SGD, Adagrad, Adam, AdamW, Momentum, Optimizer, RMSProp, clip_by_global_norm

__all__ = ["SGD", "Adagrad", "Adam", "AdamW", "Momentum", "Optimizer", "RMSProp", "clip_by_global_norm"]
