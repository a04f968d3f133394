"""The op test table: one ``OpCase`` row per op (or per interesting attr set).

Each family module (``math.py``, ``nn.py``, ...) defines ``CASES``; the table
test (``tests/dataflow/test_op_table.py``) runs every row through the same
checks: the executor's kernels against the NumPy reference, the shape rule
against the actual output, every kernel against the reference, and the
gradient rule against central finite differences in float64.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class OpCase:
    """One row: build ``op`` from inputs, then check it every way the table knows."""

    op: str
    # Builds the op from one tensor per entry of ``inputs`` (placeholders, or
    # variables for the indices in ``variables``) and returns its output.
    build: Callable[..., Any]
    inputs: Sequence[np.ndarray]
    # Check the gradient of every float input (or only those in ``wrt``).
    grad: bool = True
    wrt: tuple[int, ...] | None = None
    variables: tuple[int, ...] = ()
    # Placeholder shapes: None keeps each input's full shape; otherwise a
    # shape per input with None dims, to exercise unknown-dim shape rules.
    static_shapes: Sequence[tuple[int | None, ...]] | None = None
    id: str = ""
    rtol: float = 1e-5
    atol: float = 1e-6
    grad_rtol: float = 1e-4
    grad_atol: float = 1e-6
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.inputs = [np.asarray(x) for x in self.inputs]

    @property
    def label(self) -> str:
        return f"{self.op}-{self.id}" if self.id else self.op


def rand(*shape: int, seed: int = 0, low: float = -1.0, high: float = 1.0) -> np.ndarray:
    """Reproducible float32 test data in [low, high)."""
    return np.random.default_rng(seed + 7 * len(shape)).uniform(low, high, shape).astype(np.float32)


def positive(*shape: int, seed: int = 0) -> np.ndarray:
    return rand(*shape, seed=seed, low=0.5, high=2.0)
