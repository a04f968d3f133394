"""Where each output of a resize reads its input, and with what weights: one axis at a time, in NumPy.

A resize is separable: resizing an image is resizing its rows, then its
columns. Along one axis, output ``j`` is a weighted sum of a few input
positions (its *taps*), fixed by the sizes and the sampling rule alone, so
they are worked out here, once, when the graph is built; ``resize.py`` turns
them into Gathers and a weighted sum. The rules are ONNX's Resize (opset 10 to
19), which also covers TensorFlow's and PyTorch's resizes:

- **Coordinate transformation.** Output ``j`` sits at input position ``x``:
  ``half_pixel`` ``(j + 0.5) / scale - 0.5``; ``half_pixel_symmetric`` the
  same, shifted so that the output's centre lands on the input's centre when
  the size was rounded; ``pytorch_half_pixel`` as half_pixel but 0 for a
  length-1 output; ``align_corners`` ``j * (in - 1) / (out - 1)``;
  ``asymmetric`` ``j / scale``; ``tf_half_pixel_for_nn`` ``(j + 0.5) / scale``;
  ``tf_crop_and_resize`` the region of interest ``[start, end]`` (fractions of
  ``in - 1``) spread over the output, and a position outside the input takes
  ``extrapolation_value``. ``scale`` is ``out / in`` when sizes were given.
- **Kernel.** ``nearest`` reads one position, rounded as ``nearest_mode``
  says (ties by ``round_prefer_floor`` or ``round_prefer_ceil``, or always
  ``floor`` or ``ceil``); ``linear`` the two around ``x`` (a tent);
  ``cubic`` the four around it (Keys' cubic with ``a = cubic_coeff_a``).
  With ``antialias`` and a scale below 1, the linear or cubic kernel is
  stretched by ``1 / scale`` (more taps) and its weights normalised: a
  downsampling that averages what it drops, as PIL does.
- **Edges.** A tap before the first position or past the last reads the edge
  value; with ``exclude_outside`` such taps get weight 0 and the rest are
  normalised to sum to 1.

>>> taps = axis_taps(2, 4, mode="linear")  # output 0 sits at -0.25: both its taps read the edge
>>> taps.index.tolist(), taps.weight.tolist()
([[0, 0], [0, 1], [0, 1], [1, 1]], [[0.25, 0.75], [0.75, 0.25], [0.25, 0.75], [0.75, 0.25]])
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

MODES = ("nearest", "linear", "cubic")
COORDINATES = (
    "half_pixel",
    "half_pixel_symmetric",
    "pytorch_half_pixel",
    "align_corners",
    "asymmetric",
    "tf_half_pixel_for_nn",
    "tf_crop_and_resize",
)
NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")


@dataclass(frozen=True)
class Taps:
    """One axis's resampling: output ``j`` is ``sum_k weight[j, k] * input[index[j, k]]`` (or the
    extrapolation value where ``outside[j]``)."""

    index: np.ndarray  # (out, taps) int32, every entry a valid input position
    weight: np.ndarray  # (out, taps) float64
    outside: np.ndarray | None = None  # (out,) bool; only tf_crop_and_resize has such outputs


def positions(
    size: int,
    out: int,
    scale: float,
    coordinate: str,
    roi: tuple[float, float] = (0.0, 1.0),
    precision: type[np.floating[Any]] = np.float32,
) -> tuple[np.ndarray, np.ndarray | None]:
    """The input position each of the ``out`` outputs sits at, and which fall outside (tf_crop_and_resize).

    A scale that is a ratio of two ints (sizes were given: ``out / size``, or
    another axis's under a keep_aspect_ratio_policy; ``cg.resize``) is that
    ratio exactly, and the positions are the formulas' exact values (then
    rounded to float64, which keeps every floor and tie, as a position is a
    fraction of small denominator): 7 to 4 asymmetric puts output 2
    at 3.5, a tie, as onnx's reference implementation and ONNX Runtime do,
    where float32 puts it at 3.4999998 and rounds it down. ONNX Runtime
    computes in float32 and lands just below an exact integer in a few cases
    (half_pixel and half_pixel_symmetric, floor, 5 to 3: output 1 sits at exactly
    2, ONNX Runtime reads 1); onnx's reference, in float64, in others (7 to 9:
    output 4 at exactly 3, the reference reads 2); the exact value is the
    spec's, and cellgraph follows it in both.

    Otherwise (scales were given) in float32 by default, as ONNX Runtime and PyTorch compute them: a
    position that is exactly a tie there (``4 / 1.6`` is 2.5) is one here,
    where float64 of the float32 scale would put it just below; ``precision``
    float64 where the weights should be exact (``cg.resize``). The lengths in the formulas are
    the output's integer length, as ONNX's text says (its reference
    implementation uses ``scale * size`` for align_corners and
    tf_crop_and_resize, and -0.5 for pytorch_half_pixel's length-1 output;
    ONNX Runtime and PyTorch follow the text).
    """
    ratio = _as_ratio(scale)
    if ratio is not None and coordinate != "tf_crop_and_resize":
        return _exact_positions(size, out, coordinate, ratio), None
    f = precision
    j = np.arange(out, dtype=f)
    scale32, size32, out32 = f(scale), f(size), f(out)
    half = f(0.5)
    if coordinate == "half_pixel_symmetric":
        shift = size32 / f(2) * (f(1) - out32 / (scale32 * size32))  # scale * size: the unrounded output length
        return (shift + (j + half) / scale32 - half).astype(np.float64), None
    if coordinate in ("half_pixel", "pytorch_half_pixel"):
        x = np.zeros(1, f) if coordinate == "pytorch_half_pixel" and out == 1 else (j + half) / scale32 - half
        return x.astype(np.float64), None
    if coordinate == "align_corners":
        x = np.zeros(out, f) if out == 1 else j * f(size - 1) / f(out - 1)
        return x.astype(np.float64), None
    if coordinate == "asymmetric":
        return (j / scale32).astype(np.float64), None
    if coordinate == "tf_half_pixel_for_nn":
        return ((j + half) / scale32).astype(np.float64), None
    if coordinate == "tf_crop_and_resize":
        start, end = f(roi[0]), f(roi[1])
        last = f(size - 1)
        if out == 1:
            x = np.full(1, half * (start + end) * last, f)
        else:
            x = start * last + j * (end - start) * last / f(out - 1)
        return x.astype(np.float64), (x < 0) | (x > last)
    raise ValueError(f"coordinate transformation {coordinate!r} is not one of {', '.join(COORDINATES)}")


def _as_ratio(scale: float) -> Fraction | None:
    """``scale`` as p / q, q at most 2**20, where it is the float64 of one (``out / size``), else None.

    Sizes up to 2**20 give their own ratio back: another fraction of such denominators differs from it by
    at least 2**-40, far more than float64's rounding of it. A float32 scale (1.6 is 1.60000002384...) is the
    float64 of no such fraction unless it is one exactly (0.5, 1.5), where both computations agree.
    """
    ratio = Fraction(scale).limit_denominator(1 << 20)
    return ratio if ratio > 0 and float(ratio) == scale else None


def _exact_positions(size: int, out: int, coordinate: str, scale: Fraction) -> np.ndarray:
    """``positions`` for the exact ``scale``, in fractions, as float64."""
    ratio = 1 / scale
    half = Fraction(1, 2)
    if coordinate in ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel"):
        if coordinate == "pytorch_half_pixel" and out == 1:
            return np.zeros(1)
        # half_pixel_symmetric's shift: 0 when out is scale * size exactly.
        shift = Fraction(size, 2) * (1 - out / (scale * size)) if coordinate == "half_pixel_symmetric" else 0
        x = [shift + (j + half) * ratio - half for j in range(out)]
    elif coordinate == "align_corners":
        x = [Fraction(0)] * out if out == 1 else [Fraction(j * (size - 1), out - 1) for j in range(out)]
    elif coordinate == "asymmetric":
        x = [j * ratio for j in range(out)]
    elif coordinate == "tf_half_pixel_for_nn":
        x = [(j + half) * ratio for j in range(out)]
    else:
        raise ValueError(f"coordinate transformation {coordinate!r} is not one of {', '.join(COORDINATES)}")
    return np.array([float(v) for v in x], np.float64)


def _nearest(x: np.ndarray, rounding: str) -> np.ndarray:
    below = np.floor(x)
    fraction = x - below
    if rounding == "round_prefer_floor":
        up = fraction > 0.5
    elif rounding == "round_prefer_ceil":
        up = fraction >= 0.5
    elif rounding == "floor":
        up = np.zeros_like(x, dtype=bool)
    elif rounding == "ceil":
        up = fraction > 0
    else:
        raise ValueError(f"nearest_mode {rounding!r} is not one of {', '.join(NEAREST_MODES)}")
    return below + up


def _keys_cubic(d: np.ndarray, a: float) -> np.ndarray:
    """Keys' cubic convolution kernel at distances ``d``."""
    d = np.abs(d)
    near = ((a + 2) * d - (a + 3)) * d * d + 1
    far = ((a * d - 5 * a) * d + 8 * a) * d - 4 * a
    return np.where(d <= 1, near, np.where(d < 2, far, 0.0))


def axis_taps(
    size: int,
    out: int,
    scale: float | None = None,
    *,
    mode: str = "nearest",
    coordinate: str = "half_pixel",
    nearest_mode: str = "round_prefer_floor",
    cubic_a: float = -0.75,
    exclude_outside: bool = False,
    antialias: bool = False,
    roi: tuple[float, float] = (0.0, 1.0),
    precision: type[np.floating[Any]] = np.float32,
) -> Taps:
    """The taps that resample an axis of ``size`` positions to ``out`` (``scale`` defaults to ``out / size``;
    ``precision``: that of the positions, see ``positions``)."""
    if mode not in MODES:
        raise ValueError(f"resize mode {mode!r} is not one of {', '.join(MODES)}")
    scale = out / size if scale is None else float(scale)
    x, outside = positions(size, out, scale, coordinate, roi, precision)
    if mode == "nearest":
        index = _nearest(x, nearest_mode)[:, None]
        weight = np.ones((out, 1))
    else:
        # The taps around x: x's position among them is `fraction` past tap `base`. An x exactly on a
        # position reads it at fraction 0 (its neighbours get weight 0).
        base = np.floor(x)
        fraction = x - base
        stretch = min(scale, 1.0) if antialias else 1.0
        reach = 1.0 if mode == "linear" else 2.0  # the kernel's half-width, in input positions at scale 1
        first = math.floor(-reach / stretch) + 1  # the taps before x and after it that the kernel reaches
        offsets = np.arange(first, 2 - first)
        distance = (offsets[None, :] - fraction[:, None]) * stretch
        weight = np.clip(1 - np.abs(distance), 0, 1) if mode == "linear" else _keys_cubic(distance, cubic_a)
        if antialias:
            weight = weight / weight.sum(axis=1, keepdims=True)
        index = base[:, None] + offsets[None, :]
    index = index.astype(np.int64)
    if exclude_outside and mode != "nearest":
        weight = np.where((index < 0) | (index >= size), 0.0, weight)
        total = weight.sum(axis=1, keepdims=True)
        weight = weight / np.where(total == 0, 1.0, total)
    return Taps(np.clip(index, 0, size - 1).astype(np.int32), weight, outside)


__all__ = ["COORDINATES", "MODES", "NEAREST_MODES", "Taps", "axis_taps", "positions"]
