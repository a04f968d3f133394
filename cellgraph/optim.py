"""Optimizers: ``cg.optim.SGD``, ``cg.optim.Momentum``, ``cg.optim.Adam``."""

from __future__ import annotations

from cellgraph.dataflow.optimizers import SGD, Adam, Momentum, Optimizer

__all__ = ["SGD", "Adam", "Momentum", "Optimizer"]
