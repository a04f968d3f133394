"""The cases of the ONNX import sweep for the normalizations, global pools and the block
rearrangements (SpaceToDepth, DepthToSpace): axes counted from either end, a bias or none,
inference and training mode, each version's attributes.
"""

from __future__ import annotations

import itertools
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


def recurrent(rng: np.random.Generator) -> Cases:
    """RNN, GRU and LSTM, each version and float dtype (float32, float16): every direction, weights stored or fed, with and
    without bias and initial state, with a ragged sequence_lens, GRU's two reset placements, LSTM's peepholes.
    (Layout 1 is left to tests/export/test_onnx_recurrent.py: ONNX Runtime's CPU kernels refuse it.)"""
    gates = {"RNN": 1, "GRU": 3, "LSTM": 4}
    hidden, features, steps, batch = 3, 4, 3, 2
    for op, g in gates.items():
        for version in since(op):
            # float64: ONNX Runtime 1.32 has no double GRU ("does not support double yet") or LSTM kernel.
            for dtype in [t for t in allowed(op, version, "T") if t != np.float64]:
                for direction in ("forward", "reverse", "bidirectional"):
                    d = 2 if direction == "bidirectional" else 1

                    def v(*shape: int, dtype: np.dtype[Any] = dtype) -> np.ndarray:
                        return values(rng, dtype, shape, special=False, low=-1.0, high=1.0)

                    x, w, r = v(steps, batch, features), v(d, g * hidden, features), v(d, g * hidden, hidden)
                    bias, h0 = v(d, 2 * g * hidden), v(d, batch, hidden)
                    extra: list[Any] = [Const(bias), None, h0]
                    if op == "LSTM":
                        extra += [v(d, batch, hidden), Const(v(d, 3 * hidden))]
                    outputs = 3 if op == "LSTM" else 2
                    attrs: dict[str, Any] = {"hidden_size": hidden, "direction": direction}
                    tol = tolerance(dtype, 2e-5)
                    if dtype == np.float32:  # sums of products that cancel near 0: ONNX Runtime's order differs
                        tol["atol"] = 1e-6
                    yield Case(op, version, [x, Const(w), Const(r)], attrs, outputs=outputs, **tol)
                    yield Case(op, version, [x, w, r, *extra], attrs, outputs=outputs, **tol)
                    # A ragged sequence_lens: the second row's one step (the reverse pass starts there).
                    ragged = [extra[0], np.array([steps, 1], np.int32), *extra[2:]]
                    yield Case(op, version, [x, w, r, *ragged], attrs, outputs=outputs, **tol)
                    if op == "GRU":
                        reset = {**attrs, "linear_before_reset": 1}
                        yield Case(op, version, [x, w, r, *extra], reset, outputs=outputs, **tol)


def resize(rng: np.random.Generator) -> Cases:
    """Resize at each version and dtype (nearest for every dtype, linear and cubic for floats), up and down by scales
    and by sizes, each version's coordinate rules; and Upsample. Linear and cubic take finite values: a zero-weight
    tap of an infinity is NaN in both, but ONNX Runtime's taps per output differ from ONNX's own at the edges."""
    image = (1, 2, 5, 7)
    grids = [(np.array([1, 1, 1.6, 0.6], np.float32), None), (None, np.array([1, 2, 3, 9], np.int64))]
    for version in since("Resize"):
        coordinates = ["asymmetric"] if version == 10 else ["half_pixel", "align_corners", "asymmetric"]
        for dtype in allowed("Resize", version, "T" if version == 10 else "T1"):
            floats = dtype.kind == "f"
            for mode, coordinate, (scales, sizes) in itertools.product(
                ("nearest", "linear", "cubic") if floats and version > 10 else ("nearest", "linear")[: 1 + floats],
                coordinates,
                grids if version > 10 else grids[:1],
            ):
                if mode == "cubic" and dtype == np.float16:
                    continue  # ONNX Runtime 1.32 computes float16 cubic in float16 steps: it differs by more than a unit
                x = values(rng, dtype, image, special=mode == "nearest")
                attrs: dict[str, Any] = {"mode": mode}
                tol = tolerance(dtype, 1e-5)
                if mode != "nearest" and dtype in (np.float32, np.float64):
                    # Sums of up to 16 products of values up to 4 that cancel near 0: ONNX Runtime's order and
                    # float32 weights (for every dtype) differ from cellgraph's by float32 noise there.
                    tol = {"rtol": 1e-5, "atol": 1e-5}
                if version == 10:
                    yield Case("Resize", version, [x, Const(scales)], attrs, **tol)
                    continue
                attrs["coordinate_transformation_mode"] = coordinate
                roi = Const(np.array([], np.float32)) if version == 11 else None
                given = [Const(scales) if scales is not None else Const(np.array([], np.float32)) if version == 11
                         else None, *([Const(sizes)] if sizes is not None else [])]  # fmt: skip
                yield Case("Resize", version, [x, roi, *given], attrs, **tol)
    for version in since("Upsample"):
        for dtype in allowed("Upsample", version, "T"):
            x = values(rng, dtype, image)
            yield Case("Upsample", version, [x, Const(np.array([1, 1, 2, 3], np.float32))], {"mode": "nearest"})


NN_FAMILIES: dict[str, Callable[[np.random.Generator], Cases]] = {
    "BatchNormalization": batch_norm, "LayerNormalization": layer_norm, "RMSNormalization": rms_norm,
    "blocks": blocks, "global_pools": global_pools, "recurrent": recurrent, "resize": resize,
}  # fmt: skip
