"""The cases of the ONNX import sweep for the normalizations, global pools and the block
rearrangements (SpaceToDepth, DepthToSpace): axes counted from either end, a bias or none,
inference and training mode, each version's attributes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .onnx_sweep import Case, Cases, Const, allowed, since, tolerance, values


def _params(rng: np.random.Generator, dtype: np.dtype[Any], channels: int) -> list[Const]:
    """BatchNormalization's scale, bias, mean and (positive) variance, stored in the model."""
    scale, bias, mean = (values(rng, dtype, (channels,), special=False) for _ in range(3))
    var = values(rng, dtype, (channels,), special=False, low=0.1, high=3.0)
    return [Const(v) for v in (scale, bias, mean, var)]


def batch_norm(rng: np.random.Generator) -> Cases:
    for version in since("BatchNormalization"):
        for dtype in allowed("BatchNormalization", version, "T"):
            tol = tolerance(dtype, 4e-6)
            if dtype == np.float32:
                # (x - mean) * scale / sd + bias cancels where y is near 0: ONNX Runtime and cellgraph are
                # both within 7e-7 of float64 there, a unit in the last place of the terms (up to 12).
                tol["atol"] = 4e-6
            for shape in ((2, 3), (2, 3, 4), (2, 3, 2, 2)):
                x = values(rng, dtype, shape, special=False)
                params = _params(rng, dtype, 3)
                yield Case("BatchNormalization", version, [x, *params], {"epsilon": 1e-3}, **tol)
                if version >= 14:
                    # Training mode: the batch's statistics, and the running ones moved toward them.
                    attrs = {"training_mode": 1, "momentum": 0.8}
                    yield Case("BatchNormalization", version, [x, *params], attrs, outputs=3, **tol)


def layer_norm(rng: np.random.Generator) -> Cases:
    for version in since("LayerNormalization"):
        for dtype in allowed("LayerNormalization", version, "T"):
            x = values(rng, dtype, (2, 3, 4), special=False)
            for axis in (-1, 1, -2, 0):
                tail = x.shape[axis:]
                scale, bias = values(rng, dtype, tail, special=False), values(rng, dtype, tail, special=False)
                tol = tolerance(dtype, 1e-5)
                yield Case("LayerNormalization", version, [x, scale, bias], {"axis": axis}, **tol)
                yield Case("LayerNormalization", version, [x, scale], {"axis": axis, "epsilon": 0.5}, outputs=3, **tol)


def rms_norm(rng: np.random.Generator) -> Cases:
    for version in since("RMSNormalization"):
        for dtype in allowed("RMSNormalization", version, "T"):
            x = values(rng, dtype, (2, 3, 4), special=False)
            for axis in (-1, 1):
                scale = values(rng, dtype, x.shape[axis:], special=False)
                yield Case("RMSNormalization", version, [x, scale], {"axis": axis}, **tolerance(dtype, 1e-5))


def blocks(rng: np.random.Generator) -> Cases:
    for op in ("SpaceToDepth", "DepthToSpace"):
        for version in since(op):
            modes = [None] + (["DCR", "CRD"] if op == "DepthToSpace" and version >= 11 or version >= 28 else [])
            for dtype in allowed(op, version, "T")[:4]:
                x = values(rng, dtype, (2, 4, 4, 6) if op == "SpaceToDepth" else (2, 8, 2, 3))
                for mode in modes:
                    attrs: dict[str, Any] = {"blocksize": 2}
                    if mode is not None:
                        attrs["mode"] = mode
                    yield Case(op, version, [x], attrs)


def global_pools(rng: np.random.Generator) -> Cases:
    for op in ("GlobalAveragePool", "GlobalMaxPool"):
        for version in since(op):
            for dtype in allowed(op, version, "T"):
                for shape in ((2, 3, 4), (2, 3, 4, 5), (1, 2, 3, 2, 2)):
                    # No NaN: ONNX Runtime's max pool skips one by where it stands (as its ReduceMax).
                    x = values(rng, dtype, shape, special=op == "GlobalAveragePool")
                    yield Case(op, version, [x], **tolerance(dtype, 4e-6))


NN_FAMILIES: dict[str, Callable[[np.random.Generator], Cases]] = {
    "BatchNormalization": batch_norm, "LayerNormalization": layer_norm, "RMSNormalization": rms_norm,
    "blocks": blocks, "global_pools": global_pools,
}  # fmt: skip
