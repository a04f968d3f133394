"""Python operators on tensors that ``graph.Tensor`` does not define itself, installed from one table.

Each entry names the dunder and the op function it builds: ``x < y`` is
``less(x, y)``, ``2.0 ** x`` is ``pow(2.0, x)``, ``m & n`` is
``logical_and(m, n)`` (bool tensors only). ``==`` and ``!=`` stay identity
comparisons, as in TensorFlow 1: tensors are dict keys (feeds, fetches);
use ``cg.equal`` and ``cg.not_equal``.

Examples
--------
>>> import numpy as np
>>> import cellgraph as cg
>>> g = cg.Graph()
>>> with g.as_default():
...     x = cg.placeholder((3,), name="x")
...     y = abs(x) ** 2 // 2
>>> cg.Session(g).run(y, {x: np.array([-3.0, 1.0, 2.0], np.float32)})
array([4., 0., 2.], dtype=float32)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..graph import Tensor
from . import logic, math, math_unary


def _reflected(fn: Callable[[Any, Any], Tensor]) -> Callable[[Tensor, Any], Tensor]:
    return lambda self, other: fn(other, self)


OPERATORS: dict[str, Callable[..., Tensor]] = {
    "__rpow__":      _reflected(math.pow),
    "__abs__":       math_unary.abs,
    "__lt__":        math.less,
    "__le__":        math.less_equal,
    "__gt__":        logic.greater,
    "__ge__":        math.greater_equal,
    "__floordiv__":  math_unary.floordiv,
    "__rfloordiv__": _reflected(math_unary.floordiv),
    "__mod__":       math_unary.mod,
    "__rmod__":      _reflected(math_unary.mod),
    "__and__":       logic.logical_and,
    "__rand__":      _reflected(logic.logical_and),
    "__or__":        logic.logical_or,
    "__ror__":       _reflected(logic.logical_or),
    "__xor__":       logic.logical_xor,
    "__rxor__":      _reflected(logic.logical_xor),
    "__invert__":    logic.logical_not,
}  # fmt: skip


def install() -> None:
    for dunder, fn in OPERATORS.items():
        if dunder in vars(Tensor):
            raise RuntimeError(f"Tensor already has {dunder}: one definition per operator")
        setattr(Tensor, dunder, fn)
