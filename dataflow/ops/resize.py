"""``resize``: images resized to a new height and width, nearest or bilinear, as
TensorFlow 2's ``tf.image.resize`` (half-pixel centres, no antialiasing).

A resize is a composition, as fast as an op of its own would be: each
output row (and column) reads at most two input rows at positions and
weights fixed when the graph is built, so one axis is one Gather of those
rows (nearest) or two Gathers and a weighted sum (bilinear), and the two
axes are done one after the other. The gradients are those of Gather (a
scatter-add of each output row back to the rows it read) and of the sum.

Coordinates are half-pixel: output index i reads input position
``(i + 0.5) * in / out - 0.5``. Bilinear clamps that to the first row
below 0 and blends rows ``floor`` and ``floor + 1`` (the last row past the
end), as PyTorch's ``interpolate(mode="bilinear", align_corners=False)``;
nearest takes row ``floor((i + 0.5) * in / out)``, PyTorch's
``"nearest-exact"``.

>>> import cellgraph as cg
>>> import numpy as np
>>> x = cg.constant(np.array([0.0, 4.0], np.float32).reshape(1, 1, 2, 1))
>>> cg.Session().run(cg.resize(x, (1, 4))).reshape(-1)
array([0., 1., 3., 4.], dtype=float32)
"""

from __future__ import annotations

import operator
from typing import Any

import numpy as np

from ..dtypes import FLOATS
from ..errors import DTypeError, ShapeError
from ..graph import Tensor
from ..shapes import fmt
from .array_gather import gather
from .base import TensorLike, as_tensor, graph_of
from .math_unary import where
from .resize_taps import Taps, axis_taps
from .state import constant

__all__ = ["resample_axis", "resize"]

METHODS = ("bilinear", "nearest")


def resample_axis(
    x: Tensor, axis: int, taps: Taps, extrapolation: float = 0.0, lerp: bool = False, name: str = "resample"
) -> Tensor:
    """``x`` resampled along ``axis`` by ``taps`` (``resize_taps.axis_taps``): a Gather per tap, weighted, summed.

    A tap whose weights are all 1 is a plain Gather (nearest). Every other
    tap is multiplied in, a zero weight too, so an infinity there gives NaN
    as in ONNX Runtime and ONNX's reference. ``lerp`` (two taps whose weights
    add to 1): ``low + (high - low) * w`` instead, one product fewer and no
    cancellation between two rounded products where the rows are close
    (``resize``'s bilinear form). Outputs ``taps.outside`` takes
    ``extrapolation``.
    """
    g = x.graph
    shape = [1] * len(x.shape)
    shape[axis] = len(taps.index)

    def weight(column: np.ndarray) -> Tensor:
        return constant(column.reshape(shape).astype(x.dtype), dtype=x.dtype)

    with g.name_scope(name):
        picked = [gather(x, constant(taps.index[:, k]), axis=axis, name="rows") for k in range(taps.index.shape[1])]
        if lerp:
            if len(picked) != 2 or not np.allclose(taps.weight.sum(axis=1), 1, rtol=0, atol=1e-12):
                raise ValueError(f"lerp needs two taps whose weights add to 1, got {taps.index.shape[1]} taps")
            total = picked[0] + (picked[1] - picked[0]) * weight(taps.weight[:, 1])
        else:
            terms = [p if np.all(w == 1) else p * weight(w) for p, w in zip(picked, taps.weight.T, strict=True)]
            total = terms[0]
            for term in terms[1:]:
                total = total + term
        if taps.outside is not None and taps.outside.any():
            value = constant(np.array(extrapolation, x.dtype), dtype=x.dtype)
            total = where(constant(taps.outside.reshape(shape)), value, total)
    return total


def _resize_axis(x: Tensor, axis: int, out: int, method: str) -> Tensor:
    size = x.shape[axis]
    assert size is not None
    if size == out:
        return x
    # TensorFlow 2's half-pixel rules in ONNX's words (the module docstring): bilinear is ONNX's linear,
    # nearest rounds half-pixel positions with ties up.
    mode = "linear" if method == "bilinear" else "nearest"
    # Positions in float64: weights exact to the image's own precision (ONNX's import uses float32, as runtimes do).
    taps = axis_taps(
        size, out, mode=mode, coordinate="half_pixel", nearest_mode="round_prefer_ceil", precision=np.float64
    )
    return resample_axis(x, axis, taps, lerp=method == "bilinear", name="rows" if method == "nearest" else "blend")


def resize(images: TensorLike, size: Any, method: str = "bilinear", name: str = "resize") -> Tensor:
    """``images`` (NHWC, or HWC) resized to ``size = (height, width)``.

    Parameters
    ----------
    images : TensorLike
        A float tensor of rank 3 (height, width, channels) or 4 (batch first),
        its height and width known when the graph is built.
    size : tuple of two ints
        The output's height and width, each at least 1.
    method : {"bilinear", "nearest"}
        How output pixels are made from the input's (see the module docstring).

    Examples
    --------
    >>> import cellgraph as cg
    >>> g = cg.Graph()
    >>> with g.as_default():
    ...     x = cg.placeholder((None, 8, 8, 3), name="x")
    ...     cg.resize(x, (32, 32)).shape
    (None, 32, 32, 3)
    """
    g = graph_of([images])
    x = as_tensor(images, graph=g)
    if method not in METHODS:
        raise ShapeError(f"{name}: method {method!r} is not one of {', '.join(METHODS)}")
    try:
        out = tuple(operator.index(d) for d in size)
    except TypeError:
        raise ShapeError(f"{name}: size must be (height, width) ints, got {size!r}") from None
    if len(out) != 2 or min(out) < 1:
        raise ShapeError(f"{name}: size must be two ints >= 1 (height, width), got {size!r}")
    if len(x.shape) not in (3, 4):
        raise ShapeError(f"{name}: expects images of rank 3 (HWC) or 4 (NHWC), got shape {fmt(x.shape)}")
    if x.dtype not in FLOATS:
        raise DTypeError(f"{name}: expects float images, got {x.dtype}")
    h_axis = len(x.shape) - 3
    hw = x.shape[h_axis : h_axis + 2]
    if None in hw or 0 in hw:
        raise ShapeError(
            f"{name}: the height and width of {fmt(x.shape)} must be known and >= 1 when the graph is built"
        )
    with g.name_scope(name):
        y = _resize_axis(x, h_axis, out[0], method)
        return _resize_axis(y, h_axis + 1, out[1], method)
