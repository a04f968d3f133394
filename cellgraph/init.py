"""Variable initializers: ``cg.variable(cg.init.glorot_uniform, shape=(64, 128))``.

An initializer is called with ``(shape, dtype, seed)`` and returns an array.
The parametrised ones are classes (``cg.init.Normal(stddev=0.1)``); the
lower-case names are instances with the usual defaults. The random ones draw
from ``numpy.random.default_rng(seed)``: the same seed, the same values.
``cg.variable`` passes a seed derived from the variable's full name unless
given one.

Examples
--------
>>> import cellgraph as cg
>>> cg.init.ones((2, 3), "float32")
array([[1., 1., 1.],
       [1., 1., 1.]], dtype=float32)
>>> w = cg.init.Normal(mean=1.0, stddev=0.1)((3,), "float64", seed=0)
>>> w.dtype, w.shape
(dtype('float64'), (3,))
>>> bool((w == cg.init.Normal(mean=1.0, stddev=0.1)((3,), "float64", seed=0)).all())
True
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


def _fans(shape: tuple[int, ...]) -> tuple[int, int]:
    """(fan_in, fan_out) for a dense (in, out) or a conv (h, w, in, out) kernel."""
    if len(shape) < 2:
        size = int(np.prod(shape)) if shape else 1
        return size, size
    receptive = int(np.prod(shape[:-2]))
    return shape[-2] * receptive, shape[-1] * receptive


@dataclass(frozen=True)
class Zeros:
    """All zeros."""

    def __call__(self, shape: tuple[int, ...], dtype: str = "float32", seed: int | None = None) -> np.ndarray:
        return np.zeros(shape, dtype)


@dataclass(frozen=True)
class Ones:
    """All ones."""

    def __call__(self, shape: tuple[int, ...], dtype: str = "float32", seed: int | None = None) -> np.ndarray:
        return np.ones(shape, dtype)


@dataclass(frozen=True)
class Normal:
    """Normal with mean ``mean`` and standard deviation ``stddev``."""

    mean: float = 0.0
    stddev: float = 0.05

    def __call__(self, shape: tuple[int, ...], dtype: str = "float32", seed: int | None = None) -> np.ndarray:
        return np.random.default_rng(seed).normal(self.mean, self.stddev, shape).astype(dtype)


@dataclass(frozen=True)
class GlorotUniform:
    """Uniform in ±sqrt(6 / (fan_in + fan_out)) (Glorot & Bengio, 2010): Keras's ``glorot_uniform``, PyTorch's
    ``xavier_uniform_``. The fans count the receptive field: a conv kernel (kh, kw, in, out) has fan_in
    ``kh * kw * in`` and fan_out ``kh * kw * out``, as PyTorch's of its (out, in, kh, kw) weight."""

    def __call__(self, shape: tuple[int, ...], dtype: str = "float32", seed: int | None = None) -> np.ndarray:
        fan_in, fan_out = _fans(shape)
        limit = math.sqrt(6.0 / max(fan_in + fan_out, 1))
        return np.random.default_rng(seed).uniform(-limit, limit, shape).astype(dtype)


@dataclass(frozen=True)
class HeNormal:
    """Normal with stddev sqrt(2 / fan_in), for ReLU layers (He et al., 2015).

    Untruncated: PyTorch's ``kaiming_normal_(mode="fan_in", nonlinearity="relu")``.
    Keras's ``he_normal`` has the same stddev but draws from a normal truncated at
    two stddevs (and widened by 1 / 0.8796 to keep the stddev): no draw past 2
    stddevs there, about 5% of them here. Use ``Normal`` or your own initializer
    for Keras's draws."""

    def __call__(self, shape: tuple[int, ...], dtype: str = "float32", seed: int | None = None) -> np.ndarray:
        fan_in, _ = _fans(shape)
        return np.random.default_rng(seed).normal(0.0, math.sqrt(2.0 / max(fan_in, 1)), shape).astype(dtype)


zeros = Zeros()
ones = Ones()
normal = Normal()
glorot_uniform = GlorotUniform()
he_normal = HeNormal()

__all__ = [
    "GlorotUniform",
    "HeNormal",
    "Normal",
    "Ones",
    "Zeros",
    "glorot_uniform",
    "he_normal",
    "normal",
    "ones",
    "zeros",
]


def __dir__() -> list[str]:
    """What ``cg.init.<Tab>`` offers: its public names, not the modules and types it imports for itself."""
    return sorted(__all__)
