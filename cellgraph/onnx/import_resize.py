"""The import rows of ONNX's Resize (opset 10 to 19) and Upsample (9): one resampling per resized axis.

Each resized axis becomes Gathers of the input rows its outputs read,
weighted and summed (``cg.dataflow.ops.resize.resample_axis``), with the
rows and weights worked out when the graph is built from ONNX's sampling
rules (``resize_taps.py``: every coordinate transformation, nearest rounding,
linear, cubic, antialias, exclude_outside, tf_crop_and_resize's
extrapolation). So the sizes of the resized axes, and the scales, sizes and
region of interest, must be known then; any other axis (a dynamic batch) is
left as it is. The gradient is Gather's: an imported upsampling trains.

Resize-10 and Upsample sample ``asymmetric``ally; their nearest rounding is
ONNX Runtime's for those versions (down when upsampling, up when
downsampling). Linear and cubic resample floats; half floats are computed in
float32 and rounded once.

Examples
--------
>>> import numpy as np
>>> from onnx import TensorProto, helper
>>> import cellgraph as cg
>>> node = helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="linear")
>>> graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 1, 2])],
...     [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
...     [helper.make_tensor("scales", TensorProto.FLOAT, [4], [1, 1, 1, 2])])
>>> model = cg.onnx.import_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)]))
>>> model(np.array([[[[0.0, 4.0]]]], np.float32))
array([[[[0., 1., 3., 4.]]]], dtype=float32)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from onnx import helper

from cellgraph.dataflow.graph import Tensor
from cellgraph.dataflow.ops.resize import resample_axis
from cellgraph.dataflow.ops.resize_taps import COORDINATES, MODES, NEAREST_MODES, Taps, axis_taps

from .common import FLOAT_CODES, ImportRow
from .import_symbolic import Dim
from .import_wrappers import in_float32

if TYPE_CHECKING:
    import onnx

    from .importer import Builder
    from .node_info import NodeInfo

POLICIES = ("stretch", "not_larger", "not_smaller")


@dataclass(frozen=True)
class AxisPlan:
    """How one axis is resized: its input and output lengths, its scale, its region of interest."""

    axis: int
    size: int
    out: int
    scale: float
    roi: tuple[float, float]


def _legacy(n: NodeInfo) -> bool:
    """Resize-10 and Upsample: scales only, asymmetric sampling, ONNX Runtime's old nearest rounding."""
    return n.op == "Upsample" or n.version < 11


def _inputs(n: NodeInfo) -> tuple[np.ndarray | None, np.ndarray | None, np.ndarray | None]:
    """(roi, scales, sizes), each None when absent or empty."""

    def value(i: int) -> np.ndarray | None:
        v = n.static_value(i)
        return None if v is None or v.size == 0 else v

    if _legacy(n):
        return None, value(1), None
    return value(1), value(2), value(3)


def _plan(n: NodeInfo) -> list[AxisPlan] | str:
    """The axes the node resizes (not those it keeps as they are), or why it cannot be built."""
    shape = n.shape(0)
    if shape is None:
        return "Resize of an input whose rank is unknown until the graph runs"
    rank = len(shape)
    axes = [int(a) % rank for a in n.attrs.get("axes") or range(rank)]
    roi, scales, sizes = _inputs(n)
    if (scales is None) == (sizes is None):
        return "Resize given both scales and sizes, or neither: it takes exactly one"
    given = scales if scales is not None else sizes
    assert given is not None
    if len(given) != len(axes):
        return f"Resize with {len(given)} {'scales' if scales is not None else 'sizes'} for {len(axes)} axes"
    if scales is not None and not np.all(scales > 0):
        return f"Resize by scales {scales.tolist()}: every scale must be above 0"
    policy = n.text("keep_aspect_ratio_policy", "stretch")
    if policy not in POLICIES:
        return f"keep_aspect_ratio_policy {policy!r} (ONNX's are {', '.join(POLICIES)})"
    regions = [(0.0, 1.0)] * len(axes)
    if roi is not None:
        if len(roi) != 2 * len(axes):
            return f"Resize with a region of interest of {len(roi)} values for {len(axes)} axes (it takes 2 per axis)"
        regions = [(float(roi[i]), float(roi[len(axes) + i])) for i in range(len(axes))]
    # An axis kept as it is (scale 1, or a size that is the input's own run-time dim: -1 from _partial_sizes)
    # is left out, so a dynamic batch may pass; crops and tf_half_pixel_for_nn move even such an axis.
    coordinate = "asymmetric" if _legacy(n) else n.text("coordinate_transformation_mode")
    moving = coordinate in ("tf_crop_and_resize", "tf_half_pixel_for_nn")
    kept = [
        not moving and (float(given[k]) == 1.0 if scales is not None else int(given[k]) in (-1, shape[a]))
        for k, a in enumerate(axes)
    ]
    if policy != "stretch" and sizes is not None and -1 in sizes:
        return f"Resize with keep_aspect_ratio_policy {policy!r} and sizes {sizes.tolist()} that keep a run-time dim"
    lengths = [shape[a] for a in axes]
    unknown = [a for a, d, keep in zip(axes, lengths, kept, strict=True) if not keep and not d]
    if unknown:
        return f"Resize of axes {unknown} of an input of shape {list(shape)}: their sizes must be known and above 0"
    known = [int(d) if d else 0 for d in lengths]
    if scales is not None:
        factors = [float(s) for s in scales]
        # In float32, as ONNX Runtime: 0.7 * 10 is 7 there, 6.99999988 in float64 of the float32 scale.
        outs = [int(np.float32(f) * np.float32(d)) for f, d in zip(factors, known, strict=True)]
    else:
        assert sizes is not None
        factors = [int(s) / d if keep is False else 1.0 for s, d, keep in zip(sizes, known, kept, strict=True)]
        outs = [int(s) for s in sizes]
        if policy != "stretch":
            scale = min(factors) if policy == "not_larger" else max(factors)
            factors = [scale] * len(axes)
            outs = [int(scale * d + 0.5) for d in known]
            kept = [False] * len(axes)
    plans = [
        AxisPlan(*plan)
        for plan, keep in zip(zip(axes, known, outs, factors, regions, strict=True), kept, strict=True)
        if not keep
    ]
    if plans and min(p.out for p in plans) < 1:
        return f"Resize of axes {axes} to sizes {[p.out for p in plans]}: every output size must be at least 1"
    return plans


def _partial_sizes(node: onnx.NodeProto, position: int, value: np.ndarray) -> np.ndarray | None:
    """Resize's sizes computed from the input's own shape (PyTorch's export of ``interpolate(size=...)`` with a
    dynamic batch): each run-time entry that is the input's own dim at that axis becomes -1 (kept as it is)."""
    if position != 3:
        return None
    axes = next((list(a.ints) for a in node.attribute if a.name == "axes"), list(range(len(value))))
    stand_in = []
    for k, v in enumerate(value.tolist()):
        if isinstance(v, Dim) and v.tensor == node.input[0] and v.axis == axes[k]:
            stand_in.append(-1)
        elif isinstance(v, int):
            stand_in.append(v)
        else:
            return None
    return np.array(stand_in, np.int64)


def _taps(n: NodeInfo, plan: AxisPlan) -> Taps:
    mode = n.text("mode")
    if _legacy(n):
        # ONNX Runtime's rounding for the versions without nearest_mode: up when downsampling, else down.
        rounding = "ceil" if plan.scale < 1 else "floor"
        return axis_taps(plan.size, plan.out, plan.scale, mode=mode, coordinate="asymmetric", nearest_mode=rounding)
    return axis_taps(
        plan.size,
        plan.out,
        plan.scale,
        mode=mode,
        coordinate=n.text("coordinate_transformation_mode"),
        nearest_mode=n.text("nearest_mode"),
        cubic_a=float(n.attrs["cubic_coeff_a"]),
        exclude_outside=bool(n.attrs["exclude_outside"]),
        antialias=bool(n.attrs.get("antialias", 0)),
        roi=plan.roi,
    )


def _identity(taps: Taps) -> bool:
    """Whether ``taps`` give every output its own input position unchanged."""
    out = len(taps.index)
    at_itself = np.where(taps.index == np.arange(out)[:, None], taps.weight, 0.0).sum(axis=1)
    return taps.outside is None and bool(np.all(at_itself == 1) and np.all(np.abs(taps.weight).sum(axis=1) == 1))


def _build_resize(b: Builder, n: NodeInfo) -> list[Tensor]:
    x = b.ins(n, 1)[0]
    plans = _plan(n)
    assert not isinstance(plans, str)  # _check_resize refused it before anything was built
    extrapolation = 0.0 if _legacy(n) else float(n.attrs["extrapolation_value"])
    for plan in plans:
        taps = _taps(n, plan)
        if plan.size == plan.out and _identity(taps):  # scale 1 of a known size, or a resize to the same size
            continue
        x = resample_axis(x, plan.axis, taps, extrapolation, name="resize")
    return [x]


def _check_resize(n: NodeInfo) -> str | None:
    mode = n.text("mode")
    if mode not in MODES:
        return f"Resize mode {mode!r} (ONNX's are {', '.join(MODES)})"
    if not _legacy(n):
        coordinate = n.text("coordinate_transformation_mode")
        if coordinate not in COORDINATES:
            return f"coordinate_transformation_mode {coordinate!r}"
        if n.text("nearest_mode") not in NEAREST_MODES:
            return f"nearest_mode {n.text('nearest_mode')!r} (ONNX's are {', '.join(NEAREST_MODES)})"
        if n.attrs.get("antialias") and mode == "nearest":
            return "Resize with antialias in nearest mode (antialias is for linear and cubic)"
        if coordinate == "tf_crop_and_resize" and _inputs(n)[0] is None:
            return "Resize by tf_crop_and_resize without a region of interest (input 1)"
    plans = _plan(n)
    if isinstance(plans, str):
        return plans
    if mode != "nearest":
        code = n.elem_type(0)
        if code not in FLOAT_CODES:  # weights of an integer tensor would be cast to 0 and 1
            name = np.dtype(helper.tensor_dtype_to_np_dtype(code)).name if code else n.dtype_name(code)
            return f"{mode} Resize of {name} (cellgraph resamples floats this way; nearest takes any dtype)"
    return None


_ATTRS: dict[str, Any] = {
    "mode": "nearest",
    "coordinate_transformation_mode": "half_pixel",
    "cubic_coeff_a": -0.75,
    "exclude_outside": 0,
    "extrapolation_value": 0.0,
    "nearest_mode": "round_prefer_floor",
    "antialias": 0,
    "axes": None,
    "keep_aspect_ratio_policy": "stretch",
}

RESIZE: dict[str, ImportRow] = {
    "Resize": ImportRow(in_float32(_build_resize), _ATTRS, (1, 2, 3), _check_resize, since=10, partial=_partial_sizes),
    "Upsample": ImportRow(in_float32(_build_resize), {"mode": "nearest"}, (1,), _check_resize, since=9),
}  # fmt: skip
