"""The ranges ONNX's operator spec gives a node's attributes and constant inputs, checked against its input's rank
and shape before anything is built: ``LIMITS``, one row per op.

An ArgMax's axis is in [-r, r-1], a Flatten's in [-r, r], a Transpose's perm
is a permutation of range(r), a Split's sizes sum to the dim it splits, a
window's kernel, strides and dilations are positive and one per spatial axis,
its pads two per axis and not negative, a Conv's group divides the channels.
ONNX Runtime refuses a node outside these; the import rows read an axis modulo
the rank, so such a node imported and ran, computing what nobody asked for
(Flatten's axis -99, ArgMax's axis 7 of a rank-1 input). ``refuse_out_of_range``
raises an ``OnnxError`` naming the node, the attribute or input, its value and
the range ONNX allows. A limit whose input's rank or size is unknown until the
graph runs has nothing to check: the row's own check says what it needs.

Examples
--------
>>> import numpy as np
>>> from onnx import helper
>>> node = helper.make_node("Flatten", ["x"], ["y"], name="f", axis=-99)
>>> info = NodeInfo(node, 17, {"axis": -99}, {"x": np.zeros((2, 3), np.float32)}, {})
>>> try:
...     refuse_out_of_range(info)
... except OnnxError as err:
...     print(err)
attribute 'axis' is -99, outside [-2, 2], what ONNX's Flatten allows for a rank-2 input (Flatten node 'f', opset 17)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import onnx

from .common import FLOAT_CODES, OnnxError
from .node_info import NodeInfo

Limit = Callable[[NodeInfo], "str | None"]
Bounds = Callable[[int], tuple[int, int]]


def refuse_out_of_range(n: NodeInfo) -> None:
    """An ``OnnxError`` for the first of ``n``'s attributes or constant inputs outside ONNX's range for its input."""
    for limit in LIMITS.get(n.op, ()):
        try:
            why = limit(n)
        except (TypeError, ValueError, ArithmeticError, IndexError) as err:  # an attribute of the wrong kind
            raise OnnxError(f"{n.describe()} has attributes or constant inputs ONNX does not define: {err}") from None
        if why is not None:
            raise OnnxError(f"{why} ({n.describe()})")


# ------------------------------------------------------------------ reading
def _input_name(n: NodeInfo, i: int) -> str:
    """ONNX's name of input ``i`` of the node's op (``'split'``, ``'axes'``), from its schema."""
    try:
        formal = onnx.defs.get_schema(n.op, n.opset, "").inputs
    except onnx.defs.SchemaError:
        return f"#{i}"
    return formal[min(i, len(formal) - 1)].name if formal else f"#{i}"


def _given(n: NodeInfo, attr: str, position: int | None) -> tuple[str, list[int] | None]:
    """(how it is named, its values) of a list given as attribute ``attr`` or, in newer versions, constant input
    ``position``; values None when neither is given (or the input is not known at import)."""
    if n.attrs.get(attr) is not None:
        value = n.attrs[attr]
        return f"attribute {attr!r}", [int(v) for v in (value if isinstance(value, Sequence) else [value])]
    if position is not None and position < len(n.inputs) and n.inputs[position]:
        label = f"input {position} ({_input_name(n, position)!r})"
        known = n.static_value(position)
        return label, None if known is None else [int(v) for v in known]
    return f"attribute {attr!r}", None


def _rank_bounds(r: int) -> tuple[int, int]:
    return -r, r - 1


# ------------------------------------------------------------------ limit kinds
def axis(attr: str = "axis", bounds: Bounds = _rank_bounds, required: bool = False) -> Limit:
    """A single axis attribute in ``bounds(rank)`` (ONNX's [-r, r-1] unless said otherwise)."""

    def limit(n: NodeInfo) -> str | None:
        if n.attrs.get(attr) is None:
            return f"attribute {attr!r} is missing: ONNX's {n.op} requires it" if required else None
        rank = n.rank(0)
        if rank is None:
            return None
        low, high = bounds(rank)
        value = int(n.attrs[attr])
        if low > high and attr not in {a.name for a in n.proto.attribute}:  # a scalar, its axis the default
            return f"input 0 ({_input_name(n, 0)!r}) is a scalar: ONNX's {n.op} needs rank at least 1 (an axis)"
        if not low <= value <= high:
            return (
                f"attribute {attr!r} is {value}, outside [{low}, {high}], what ONNX's {n.op} allows for a rank-{rank} "
                "input"
            )
        return None

    return limit


def axes(attr: str = "axes", position: int | None = None, grows: bool = False, unique: bool = True) -> Limit:
    """A list of axes (attribute ``attr`` or constant input ``position``) each in [-r, r-1], none twice; with
    ``grows``, r is the output's rank (Unsqueeze's: the input's plus one per axis)."""

    def limit(n: NodeInfo) -> str | None:
        label, values = _given(n, attr, position)
        rank = n.rank(0)
        if values is None or rank is None:
            return None
        r = rank + len(values) if grows else rank
        out = [v for v in values if not -r <= v < r]
        if out:
            return (
                f"{label} is {values}: axis {out[0]} is outside [{-r}, {r - 1}], what ONNX's {n.op} allows for "
                f"{'an output' if grows else 'an input'} of rank {r}"
            )
        if unique and len({v % r for v in values}) < len(values):
            return f"{label} is {values}: ONNX's {n.op} names no axis twice"
        return None

    return limit


def _perm(n: NodeInfo) -> str | None:
    perm, rank = n.attrs.get("perm"), n.rank(0)
    if perm is None or rank is None:
        return None
    values = [int(p) for p in perm]
    if sorted(values) != list(range(rank)):
        return (
            f"attribute 'perm' is {values}: ONNX's Transpose needs a permutation of range({rank}) for a "
            f"rank-{rank} input"
        )
    return None


def _dim(n: NodeInfo, attr: str = "axis") -> int | None:
    """The size of the input's dim at attribute ``attr`` (already in range), or None when unknown."""
    shape = n.shape(0)
    if shape is None or n.attrs.get(attr) is None:
        return None
    return shape[int(n.attrs[attr]) % len(shape)] if shape else None


def _split(n: NodeInfo) -> str | None:
    outputs = len(n.outputs)
    if n.attrs.get("num_outputs") is not None and int(n.attrs["num_outputs"]) != outputs:
        return (
            f"attribute 'num_outputs' is {n.attrs['num_outputs']}, but ONNX's Split has {outputs} outputs: they "
            "must be equal"
        )
    label, sizes = _given(n, "split", 1)
    if sizes is None:
        return None
    if any(s < 0 for s in sizes):
        return f"{label} is {sizes}: ONNX's Split takes sizes that are not negative"
    if len(sizes) != outputs:
        return f"{label} is {sizes}: ONNX's Split needs one size for each of its {outputs} outputs"
    size = _dim(n)
    if size is not None and sum(sizes) != size:
        return f"{label} is {sizes}: ONNX's Split needs sizes that sum to {size}, the size of axis {n.attrs['axis']}"
    return None


def _concat(n: NodeInfo) -> str | None:
    ranks = {n.rank(i) for i in range(len(n.inputs))} - {None}
    if len(ranks) > 1:
        return f"inputs of ranks {sorted(ranks)} (ONNX's Concat joins inputs of one rank)"  # type: ignore[type-var]
    return None


def _gather_indices(n: NodeInfo) -> str | None:
    size, indices = _dim(n), n.static_value(1)
    if size is None or indices is None or indices.size == 0:
        return None
    out = [int(i) for i in indices if not -size <= int(i) < size]
    if out:
        return (
            f"input 1 ('indices') holds {out[0]}, outside [{-size}, {size - 1}], what ONNX's {n.op} allows for "
            f"axis {n.attrs['axis']} of size {size}"
        )
    return None


def _same_rank(n: NodeInfo) -> str | None:
    data, indices = n.rank(0), n.rank(1)
    if data is not None and indices is not None and data != indices:
        return f"input 1 ('indices') has rank {indices}: ONNX's {n.op} needs the data's rank, {data}"
    return None


def _nd_depth(batch: bool) -> Limit:
    """GatherND's and ScatterND's indices: a last dim of 1 to r - batch_dims (and batch_dims below both ranks)."""

    def limit(n: NodeInfo) -> str | None:
        data, indices = n.shape(0), n.shape(1)
        if data is None or indices is None or not indices:
            return None
        b = int(n.attrs["batch_dims"]) if batch else 0
        top = min(len(data), len(indices)) - 1
        if batch and not 0 <= b <= top:
            return (
                f"attribute 'batch_dims' is {b}, outside [0, {top}], what ONNX's {n.op} allows for data of rank "
                f"{len(data)} and indices of rank {len(indices)}"
            )
        depth = indices[-1]
        if depth is not None and not 1 <= depth <= len(data) - b:
            less = f" less {b} batch dims" if b else ""
            return (
                f"input 1 ('indices') has a last dim of {depth}: ONNX's {n.op} needs at least 1 and at most "
                f"{len(data) - b} (the data's rank {len(data)}{less})"
            )
        return None

    return limit


def _slice(n: NodeInfo) -> str | None:
    starts, rank = n.static_value(1), n.rank(0)
    for i in (2, 3, 4):
        given = n.static_value(i) if i < len(n.inputs) and n.inputs[i] else None
        if given is not None and starts is not None and len(given) != len(starts):
            return (
                f"input {i} ({_input_name(n, i)!r}) has {len(given)} values: ONNX's Slice needs one per start, "
                f"and starts has {len(starts)}"
            )
    steps = n.static_value(4) if len(n.inputs) > 4 and n.inputs[4] else None
    if steps is not None and any(int(s) == 0 for s in steps):
        return f"input 4 ('steps') is {[int(s) for s in steps]}: ONNX's Slice takes steps that are not 0"
    return None if rank is None else axes(position=3)(n)


def _pad(n: NodeInfo) -> str | None:
    rank, pads = n.rank(0), n.static_value(1)
    if rank is None or pads is None:
        return None
    given = n.static_value(3) if len(n.inputs) > 3 and n.inputs[3] else None
    count = rank if given is None else len(given)
    if len(pads) != 2 * count:
        axes_said = f"{count} axes" if given is not None else f"a rank-{rank} input"
        return f"input 1 ('pads') has {len(pads)} values: ONNX's Pad needs {2 * count}, two for each of {axes_said}"
    return None


def _tile(n: NodeInfo) -> str | None:
    rank, repeats = n.rank(0), n.static_value(1)
    if rank is None or repeats is None:
        return None
    if len(repeats) != rank:
        return f"input 1 ('repeats') has {len(repeats)} values: ONNX's Tile needs one per dim of its rank-{rank} input"
    if any(int(r) < 0 for r in repeats):
        return f"input 1 ('repeats') is {[int(r) for r in repeats]}: ONNX's Tile takes repeats that are not negative"
    return None


def _top_k(n: NodeInfo) -> str | None:
    k, size = n.static_value(1), _dim(n)
    if k is None or size is None or len(k) != 1:
        return None
    if not 0 <= int(k[0]) <= size:
        return (
            f"input 1 ('K') is {int(k[0])}, outside [0, {size}], what ONNX's TopK allows along axis "
            f"{n.attrs['axis']} of size {size}"
        )
    return None


def _scalar_at_least(position: int, low: int) -> Limit:
    def limit(n: NodeInfo) -> str | None:
        value = n.static_value(position)
        if value is not None and value.size == 1 and int(value[0]) < low:
            return (
                f"input {position} ({_input_name(n, position)!r}) is {int(value[0])}: ONNX's {n.op} needs at "
                f"least {low}"
            )
        return None

    return limit


def _blocks(n: NodeInfo) -> str | None:
    size = n.attrs.get("blocksize")
    if size is None:
        return f"attribute 'blocksize' is missing: ONNX's {n.op} requires it"
    if int(size) < 1:
        return f"attribute 'blocksize' is {size}: ONNX's {n.op} needs at least 1"
    shape, s = n.shape(0), int(size)
    if shape is None or len(shape) != 4:
        return None
    c, h, w = shape[1:]
    if n.op == "SpaceToDepth" and any(d is not None and d % s for d in (h, w)):
        return f"attribute 'blocksize' is {s}: ONNX's SpaceToDepth needs it to divide the height {h} and width {w}"
    if n.op == "DepthToSpace" and c is not None and c % (s * s):
        return f"attribute 'blocksize' is {s}: ONNX's DepthToSpace needs its square {s * s} to divide the {c} channels"
    return None


def _fmod(n: NodeInfo) -> str | None:
    if not int(n.attrs["fmod"]) and n.elem_type(0) in FLOAT_CODES and n.version < 28:
        return f"attribute 'fmod' is 0: ONNX's Mod-{n.version} of floats needs fmod=1 (C's fmod; Mod-28 floors floats)"
    return None


def _min_rank(low: int) -> Limit:
    def limit(n: NodeInfo) -> str | None:
        rank = n.rank(0)
        if rank is not None and rank < low:
            return f"input 0 ({_input_name(n, 0)!r}) has rank {rank}: ONNX's {n.op} needs rank at least {low}"
        return None

    return limit


def _groups(n: NodeInfo) -> str | None:
    shape, groups = n.shape(0), int(n.attrs["num_groups"])
    channels = shape[1] if shape is not None and len(shape) > 1 else None
    if groups < 1 or (channels is not None and channels % groups):
        return (
            f"attribute 'num_groups' is {groups}: ONNX's GroupNormalization needs it to divide the {channels} channels"
        )
    return None


def _cumsum_axis(n: NodeInfo) -> str | None:
    rank, value = n.rank(0), n.static_value(1)
    if rank is None or value is None or value.size != 1:
        return None
    if not -rank <= int(value[0]) < rank:
        return (
            f"input 1 ('axis') is {int(value[0])}, outside [{-rank}, {rank - 1}], what ONNX's CumSum allows for "
            f"a rank-{rank} input"
        )
    return None


def _reshape(n: NodeInfo) -> str | None:
    """Reshape's target: dims of -1 (at most one, and not beside a 0 kept as 0 by allowzero) or more."""
    target = n.static_value(1)
    if target is None:
        return None
    dims = [int(d) for d in target]
    if any(d < -1 for d in dims) or dims.count(-1) > 1:
        return f"input 1 ('shape') is {dims}: ONNX's Reshape takes dims of at least -1, and at most one -1"
    if int(n.attrs["allowzero"]) and -1 in dims and 0 in dims:
        return f"input 1 ('shape') is {dims}: ONNX's Reshape with allowzero=1 cannot infer a -1 beside a 0"
    return None


def _one_hot_values(n: NodeInfo) -> str | None:
    values = n.static_value(2)
    if values is not None and values.size != 2:
        return f"input 2 ('values') has {values.size} values: ONNX's OneHot needs 2, [off_value, on_value]"
    return None


def _dropout_ratio(n: NodeInfo) -> str | None:
    ratio = n.static_value(1) if len(n.inputs) > 1 and n.inputs[1] else None
    if ratio is not None and ratio.size == 1 and not 0.0 <= float(ratio[0]) < 1.0:
        return f"input 1 ('ratio') is {float(ratio[0])}, outside [0, 1), what ONNX's Dropout allows"
    return None


def _recurrent(gates: int) -> Limit:
    def limit(n: NodeInfo) -> str | None:
        hidden, w = n.attrs.get("hidden_size"), n.shape(1)
        if hidden is None:
            return None
        if int(hidden) < 1:
            return f"attribute 'hidden_size' is {hidden}: ONNX's {n.op} needs at least 1"
        if w is not None and len(w) == 3 and w[1] is not None and w[1] != gates * int(hidden):
            return (
                f"attribute 'hidden_size' is {hidden}, but input 1 ('W') has shape {tuple(w)}: ONNX's {n.op} "
                f"needs its dim 1 to be {gates} x hidden_size"
            )
        return _sequence_lens(n)

    return limit


def _sequence_lens(n: NodeInfo) -> str | None:
    """``sequence_lens`` is integers of shape (batch_size,), and a known one lies in [0, seq_length]: ONNX Runtime
    refuses any other when it runs (the unrolled steps failed to build naming none of it, or broadcast one length
    over every row)."""
    code, shape, x = n.elem_type(4), n.shape(4), n.shape(0)
    if code is not None and code not in (onnx.TensorProto.INT32, onnx.TensorProto.INT64):
        return f"input 4 ('sequence_lens') is {n.dtype_name(code)}: ONNX's {n.op} needs int32 lengths, one per row"
    if shape is not None and len(shape) != 1:
        return f"input 4 ('sequence_lens') has shape {shape}: ONNX's {n.op} needs shape (batch_size,), one per row"
    if shape is not None and x is not None and len(x) == 3:
        batch = x[0] if n.attrs.get("layout") else x[1]
        if batch is not None and shape[0] is not None and shape[0] != batch:
            return (
                f"input 4 ('sequence_lens') has shape {shape}, but input 0 ('X') has shape {x}: ONNX's {n.op} "
                f"needs one length per row, shape ({batch},)"
            )
    lengths = n.static_value(4)
    if lengths is None or x is None or len(x) != 3 or not lengths.size:
        return None
    seq = x[1] if n.attrs.get("layout") else x[0]
    if seq is not None and (int(lengths.min()) < 0 or int(lengths.max()) > seq):
        return (
            f"input 4 ('sequence_lens') is {lengths.tolist()}: ONNX's {n.op} needs each in [0, {seq}], "
            "the input's sequence length"
        )
    return None


_PADS = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")


def window(n: NodeInfo) -> str | None:
    """Conv's, ConvTranspose's and the pools' auto_pad, kernel_shape, strides, dilations, pads, group and filter."""
    shape = n.shape(0)
    if shape is None or len(shape) < 3:
        return None  # the row's check refuses what it cannot window
    spatial, op = len(shape) - 2, n.op
    if n.text("auto_pad") not in _PADS:
        return f"attribute 'auto_pad' is {n.text('auto_pad')!r}: ONNX's {op} takes {', '.join(_PADS)}"
    if n.attrs.get("kernel_shape") is None and op in ("MaxPool", "AveragePool"):
        return f"attribute 'kernel_shape' is missing: ONNX's {op} requires it"
    lists = {a: [int(v) for v in n.attrs[a]] for a in ("kernel_shape", "strides", "dilations", "pads",
             "output_padding", "output_shape") if n.attrs.get(a) is not None}  # fmt: skip
    for attr, values in lists.items():
        count = 2 * spatial if attr == "pads" else spatial
        if len(values) != count:
            return (
                f"attribute {attr!r} has {len(values)} values: ONNX's {op} needs {count}, "
                f"{'two' if attr == 'pads' else 'one'} per spatial axis of its rank-{len(shape)} input"
            )
        if attr in ("kernel_shape", "strides", "dilations", "output_shape") and any(v < 1 for v in values):
            return f"attribute {attr!r} is {values}: ONNX's {op} takes positive values"
        if attr in ("pads", "output_padding") and any(v < 0 for v in values):
            return f"attribute {attr!r} is {values}: ONNX's {op} takes values that are not negative"
    kernel, pads = lists.get("kernel_shape"), lists.get("pads")
    if op in ("MaxPool", "AveragePool") and kernel is not None and pads is not None:
        if any(p >= k for p, k in zip(pads, kernel * 2, strict=True)):
            return f"attribute 'pads' is {pads}: ONNX's {op} needs each pad below the kernel {kernel}"
    if "output_padding" in lists:
        strides, dilations = lists.get("strides", [1] * spatial), lists.get("dilations", [1] * spatial)
        most = [max(s, d) for s, d in zip(strides, dilations, strict=True)]
        if any(p >= m for p, m in zip(lists["output_padding"], most, strict=True)):
            return (
                f"attribute 'output_padding' is {lists['output_padding']}: ONNX's ConvTranspose needs each value "
                f"below the stride or dilation of its axis, the larger of them {most}"
            )
    return _filter(n, shape, kernel) if op in ("Conv", "ConvTranspose") else None


def _filter(n: NodeInfo, shape: tuple[int | None, ...], kernel: list[int] | None) -> str | None:
    """A convolution's group and filter W against the input's channels and the kernel_shape."""
    group, channels, w = int(n.attrs["group"]), shape[1], n.shape(1)
    if group < 1 or (channels is not None and channels % group):
        return f"attribute 'group' is {group}: ONNX's {n.op} needs it to divide the {channels} channels"
    if w is None:
        return None
    if len(w) != len(shape):
        return f"input 1 ('W') has rank {len(w)}: ONNX's {n.op} needs its input's rank, {len(shape)}"
    if kernel is not None and None not in w[2:] and list(w[2:]) != kernel:
        return (
            f"attribute 'kernel_shape' is {kernel}, but input 1 ('W') has shape {tuple(w)}: ONNX's {n.op} needs "
            f"the filter's spatial dims, {list(w[2:])}"
        )
    if channels is None or None in w[:2]:
        return None
    if n.op == "Conv" and (w[1] * group != channels or w[0] % group):  # type: ignore[operator]
        return (
            f"input 1 ('W') has shape {tuple(w)}: ONNX's Conv of {channels} channels in {group} groups needs "
            f"dim 1 to be {channels // group} and dim 0 a multiple of {group}"
        )
    if n.op == "ConvTranspose" and w[0] != channels:
        return f"input 1 ('W') has shape {tuple(w)}: ONNX's ConvTranspose needs dim 0 to be the {channels} channels"
    return None


def _squeezed(n: NodeInfo) -> str | None:
    """Squeeze's axes are dims of size 1 (ONNX Runtime refuses another)."""
    label, values = _given(n, "axes", 1)
    shape = n.shape(0)
    if values is None or shape is None:
        return None
    wide = [(v, shape[v % len(shape)]) for v in values if shape[v % len(shape)] not in (1, None)]
    if wide:
        return (
            f"{label} is {values}: axis {wide[0][0]} has size {wide[0][1]}, not 1, and ONNX's Squeeze removes "
            "only dims of 1"
        )
    return None


_NORM_AXES: tuple[Limit, ...] = (axis(),)
_REDUCE = (axes(position=1, unique=False),)

# One row per ONNX op whose attributes or constant inputs ONNX bounds by its input.
LIMITS: dict[str, tuple[Limit, ...]] = {
    "ArgMax":             (axis(),),
    "ArgMin":             (axis(),),
    "Softmax":            (axis(),),
    "LogSoftmax":         (axis(),),
    "Hardmax":            (axis(),),
    "Flatten":            (axis(bounds=lambda r: (-r, r)),),
    "Concat":             (axis(required=True), _concat),
    "Gather":             (axis(), _gather_indices),
    "GatherElements":     (axis(), _same_rank),
    "GatherND":           (_nd_depth(batch=True),),
    "ScatterND":          (_nd_depth(batch=False),),
    "Split":              (axis(), _split),
    "Transpose":          (_perm,),
    "Unsqueeze":          (axes(position=1, grows=True),),
    "Squeeze":            (axes(position=1, unique=False), _squeezed),  # a repeat: ONNX Runtime squeezes it once
    "Slice":              (_slice,),
    "Pad":                (axes(position=3), _pad),
    "Tile":               (_tile,),
    "TopK":               (axis(), _top_k, _scalar_at_least(1, 0)),
    "CumSum":             (_cumsum_axis,),
    "OneHot":             (axis(bounds=lambda r: (-r - 1, r)), _scalar_at_least(1, 1), _one_hot_values),
    "Reshape":            (_reshape,),
    "Dropout":            (_dropout_ratio,),
    "LayerNormalization": _NORM_AXES,
    "LpNormalization":    _NORM_AXES,
    "MeanVarianceNormalization": (axes(unique=False),),
    "GroupNormalization": (_groups,),
    "SpaceToDepth":       (_blocks,),
    "DepthToSpace":       (_blocks,),
    "Trilu":              (_min_rank(2),),
    "Mod":                (_fmod,),
    "Resize":             (axes(),),  # its scales and sizes: import_resize.py's _plan
    "Conv":               (window,),
    "ConvTranspose":      (window,),
    "MaxPool":            (window,),
    "AveragePool":        (window,),
    "RNN":                (_recurrent(1),),
    "GRU":                (_recurrent(3),),
    "LSTM":               (_recurrent(4),),
    **{op: _REDUCE for op in ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceLogSumExp",
                              "ReduceL1", "ReduceL2", "ReduceSumSquare", "ReduceLogSum")},
}  # fmt: skip


def attrs_of(node: onnx.NodeProto, defaults: dict[str, Any]) -> dict[str, Any]:
    """``node``'s attributes over the row's ``defaults`` (none refused here: the plan's check does that)."""
    attrs = dict(defaults)
    attrs.update({a.name: onnx.helper.get_attribute_value(a) for a in node.attribute})
    return attrs


__all__ = ["LIMITS", "attrs_of", "axes", "axis", "refuse_out_of_range"]
