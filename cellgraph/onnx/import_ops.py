"""ONNX op -> cellgraph ops: one row per ONNX op that cellgraph can compute.

A row names the attributes it understands (with their defaults), the inputs
whose values must be known when the graph is built (a reshape's shape, a
slice's starts), an optional ``check`` that returns why a node's attribute
values cannot be expressed (checked for every node before anything is built),
and ``build``, which makes the cellgraph ops. An ONNX op without a row, or an
attribute a row does not list, is an ``OnnxError`` naming it, the node and the
opset.

ONNX images are NCHW with OIHW filters; cellgraph's are NHWC with HWIO, so
the convolution and pooling rows transpose around the cellgraph op.

Examples
--------
>>> row = IMPORTERS["Reshape"]
>>> row.attrs, row.static
({'allowzero': 0}, (1,))
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

import cellgraph as cg
from cellgraph.dataflow.dtypes import is_float
from cellgraph.dataflow.graph import Tensor
from cellgraph.dataflow.ops import activations as act
from cellgraph.dataflow.ops import logic, nn
from cellgraph.dataflow.ops import math_unary as mu
from cellgraph.dataflow.ops import reductions as red

from .common import Build, ImportRow, OnnxError
from .import_activations import ACTIVATIONS
from .import_arrays import ARRAYS
from .import_cast import CAST
from .import_losses import LOSSES
from .import_math import MATH, float_fmod
from .import_more import MORE
from .import_normalization import NORMALIZATION
from .import_norms import NORMS
from .import_recurrent import RECURRENT
from .import_resize import RESIZE
from .import_shapes import SHAPES
from .import_symbolic import reshape_target
from .import_windows import check_avg_pool, check_conv, check_conv_transpose, check_max_pool, conv, conv_transpose, pool
from .import_wrappers import check_coerced, coerced_to_2d, in_float32, same_shapes_before
from .importer_checks import tensor_array

if TYPE_CHECKING:
    from .importer import Builder
    from .node_info import NodeInfo


# ------------------------------------------------------------------ helpers
def _binary(fn: Callable[[Tensor, Tensor], Tensor]) -> Build:
    return lambda b, n: [fn(*b.ins(n, 2))]


def _unary(fn: Callable[[Tensor], Tensor]) -> Build:
    return lambda b, n: [fn(b.ins(n, 1)[0])]


def _variadic(fn: Callable[[Tensor, Tensor], Tensor]) -> Build:
    def build(b: Builder, n: NodeInfo) -> list[Tensor]:
        ins = b.ins(n)
        out = ins[0]
        for t in ins[1:]:
            out = fn(out, t)
        return [out if len(ins) > 1 else cg.identity(out)]

    return build


def _int_quotient_and_remainder(x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
    """ONNX's integer Div and Mod(fmod=1), truncated toward zero as C's: exact for every value.

    Python's floored ``x // y`` is one below the truncated quotient, and its ``x % y`` has
    ``y``'s sign instead of ``x``'s, where the remainder is not 0 and the signs differ.
    (Through float64 an int64 above 2**53 would round: 2**60 + 1 divided by 1 gave 2**60.)
    """
    floored, remainder = mu.floordiv(x, y), mu.mod(x, y)
    zero = cg.zeros_like(x)
    apart = logic.logical_and(logic.not_equal(remainder, zero), logic.logical_xor(cg.less(x, zero), cg.less(y, zero)))
    one = cg.cast(apart, x.dtype)
    return floored + one, remainder - y * one


def _div(b: Builder, n: NodeInfo) -> list[Tensor]:
    x, y = b.ins(n, 2)
    return [cg.div(x, y) if is_float(x.dtype) else _int_quotient_and_remainder(x, y)[0]]


def _axes_of(b: Builder, n: NodeInfo, position: int) -> list[int] | None:
    """``axes`` from the attribute (older opsets) or the input (newer ones); None when absent."""
    if n.attrs.get("axes") is not None:
        return [int(a) for a in n.attrs["axes"]]
    if len(n.inputs) > position and n.inputs[position]:
        return [int(a) for a in b.static(n.inputs[position]).reshape(-1)]
    return None


# -------------------------------------------------------------------- rows
def _matmul(b: Builder, n: NodeInfo) -> list[Tensor]:
    a, c = b.ins(n, 2)
    if len(a.shape) >= 2 and len(c.shape) >= 2:
        return [cg.matmul(a, c)]  # a MatMul, or a BatchMatMul whose batch dims broadcast as ONNX's do
    # A 1-D operand (NumPy's matmul): it gets a unit dim (dropped again), batch dims broadcast,
    # and each product is a broadcast multiply summed over the shared axis.
    # (Half floats in float32: in_float32. Each product rounded to float16 lost digits that the sum
    # then exposed, 10 units in the last place, where ONNX Runtime's matmul accumulates in float32.)
    a2 = cg.expand_dims(a, 0) if len(a.shape) == 1 else a
    c2 = cg.expand_dims(c, -1) if len(c.shape) == 1 else c
    y = cg.reduce_sum(cg.expand_dims(a2, -1) * cg.expand_dims(c2, -3), axis=-2)
    if len(c.shape) == 1:
        y = cg.squeeze(y, -1)
    if len(a.shape) == 1:
        y = cg.squeeze(y, -1 if len(c.shape) == 1 else -2)
    return [y]


def _gemm(b: Builder, n: NodeInfo) -> list[Tensor]:
    ins = b.ins(n)
    a = n.attrs
    y = cg.matmul(ins[0], ins[1], transpose_a=bool(a["transA"]), transpose_b=bool(a["transB"]))
    if a["alpha"] != 1.0:
        y = y * float(a["alpha"])
    # beta = 0 leaves C unread, as BLAS, ONNX Runtime and PyTorch's addmm do: an inf or NaN in it was
    # 0 * inf = NaN in every row.
    if len(ins) > 2 and a["beta"] != 0.0:
        y = y + (ins[2] * float(a["beta"]) if a["beta"] != 1.0 else ins[2])
    return [y]


def _reduce(fn: Callable[..., Tensor]) -> Build:
    def build(b: Builder, n: NodeInfo) -> list[Tensor]:
        x = b.ins(n)[0]
        axes = _axes_of(b, n, 1)
        if not axes:
            if n.attrs["noop_with_empty_axes"]:
                return [cg.identity(x)]
            axes = None
        return [fn(x, axis=axes, keepdims=bool(n.attrs["keepdims"]))]

    return build


def _check_reduce(n: NodeInfo) -> str | None:
    rank = n.rank(0)
    if rank == 0:
        return f"{n.op} of a scalar"
    return None


def _arg(fn: Callable[..., Tensor]) -> Build:
    return lambda b, n: _arg_build(fn, b, n)


def _arg_build(fn: Callable[..., Tensor], b: Builder, n: NodeInfo) -> list[Tensor]:
    x = b.ins(n)[0]
    axis = int(n.attrs["axis"]) % len(x.shape)
    if n.attrs["select_last_index"]:
        # The last extreme is the first one of the reversed axis, counted from the end.
        key = tuple(slice(None, None, -1) if i == axis else slice(None) for i in range(len(x.shape)))
        size = x.shape[axis]
        y = (size - 1) - cg.cast(fn(x[key], axis=axis), "int64")  # type: ignore[operator]
    else:
        y = cg.cast(fn(x, axis=axis), "int64")
    return [cg.expand_dims(y, axis % len(x.shape)) if n.attrs["keepdims"] else y]


def _check_argmax(n: NodeInfo) -> str | None:
    shape = n.shape(0)
    if n.attrs["select_last_index"] and (shape is None or shape[int(n.attrs["axis"])] is None):
        return "ArgMax with select_last_index=1 along an axis of unknown size"
    return None


def _softmax(fn: Callable[..., Tensor]) -> Build:
    return lambda b, n: [fn(b.ins(n)[0], axis=int(n.attrs["axis"]))]


def _reshape(b: Builder, n: NodeInfo) -> list[Tensor]:
    x = b.ins(n)[0]
    dims = _reshape_dims(x.shape, [int(d) for d in b.static(n.inputs[1]).reshape(-1)], bool(n.attrs["allowzero"]))
    assert dims is not None  # the check refused it otherwise
    return [cg.reshape(x, [-1 if d is None else d for d in dims])]


def _reshape_dims(shape: Sequence[int | None], dims: list[int], allowzero: bool) -> list[int | None] | None:
    """ONNX's Reshape target with each 0 copied from ``shape`` (unless ``allowzero``); None for a dim known
    only at run time. A -1 beside a copied run-time dim (a batch kept in place, ``[0, 0, -1]``) is worked
    out here: the run-time dims cancel when each is copied to its own place. None when more than one dim
    stays unknown (cellgraph's reshape infers one)."""
    out: list[int | None] = [shape[i] if d == 0 and not allowzero and i < len(shape) else d for i, d in enumerate(dims)]
    if -1 in out and None in out:
        copied = {i for i, d in enumerate(dims) if d == 0 and not allowzero and i < len(shape) and shape[i] is None}
        rest = [s for i, s in enumerate(shape) if i not in copied]
        if None in rest or len(copied) != out.count(None):
            return None
        known = [v for v in out if v is not None and v != -1]
        out[out.index(-1)] = math.prod(rest) // max(math.prod(known), 1)  # type: ignore[arg-type]
    return out if out.count(None) + out.count(-1) <= 1 else None


def _check_reshape(n: NodeInfo) -> str | None:
    dims = n.static_value(1)
    shape = n.shape(0)
    if dims is not None and not n.attrs["allowzero"] and 0 in dims:
        if shape is None or _reshape_dims(shape, [int(d) for d in dims], False) is None:
            return "Reshape copying a dim (0) that is unknown until run time, beside another unknown dim"
    return None


def _flatten_axis(n: NodeInfo, rank: int) -> int:
    axis = int(n.attrs["axis"])
    return axis + rank if axis < 0 else axis


def _flatten(b: Builder, n: NodeInfo) -> list[Tensor]:
    x = b.ins(n)[0]
    axis = _flatten_axis(n, len(x.shape))
    head, tail = x.shape[:axis], x.shape[axis:]
    if None not in x.shape:
        # Both sizes known: no -1, which cannot stand beside a 0 (a (0, 3, 2) input at axis 1).
        return [cg.reshape(x, (math.prod(head), math.prod(tail)))]  # type: ignore[arg-type]
    if None not in head:
        return [cg.reshape(x, (math.prod(head), -1))]  # type: ignore[arg-type]
    return [cg.reshape(x, (-1, math.prod(tail)))]  # type: ignore[arg-type]


def _check_flatten(n: NodeInfo) -> str | None:
    shape = n.shape(0)
    if shape is None:
        return "Flatten of an input of unknown rank"
    axis = _flatten_axis(n, len(shape))
    if None in shape[:axis] and None in shape[axis:]:
        return "Flatten with unknown dims on both sides of the axis"
    return None


def _unsqueeze(b: Builder, n: NodeInfo) -> list[Tensor]:
    axes = _axes_of(b, n, 1) or []
    return [cg.expand_dims(b.ins(n)[0], axes)]


def _squeeze(b: Builder, n: NodeInfo) -> list[Tensor]:
    return [cg.squeeze(b.ins(n)[0], _axes_of(b, n, 1))]


def _transpose(b: Builder, n: NodeInfo) -> list[Tensor]:
    perm = n.attrs["perm"]
    return [cg.transpose(b.ins(n)[0], None if perm is None else [int(p) for p in perm])]


def _slice(b: Builder, n: NodeInfo) -> list[Tensor]:
    x = b.ins(n)[0]
    starts, ends = (b.static(n.inputs[i]).reshape(-1) for i in (1, 2))
    rank = len(x.shape)
    axes = _optional_ints(b, n, 3, list(range(len(starts))))
    steps = _optional_ints(b, n, 4, [1] * len(starts))
    key: list[Any] = [slice(None)] * rank
    for start, end, axis, step in zip(starts, ends, axes, steps, strict=True):
        key[int(axis) % rank] = slice(_clip(start), _clip(end), int(step))
    return [x[tuple(key)]]


def _optional_ints(b: Builder, n: NodeInfo, i: int, default: list[int]) -> list[int]:
    if len(n.inputs) > i and n.inputs[i]:
        return [int(v) for v in b.static(n.inputs[i]).reshape(-1)]
    return default


def _clip(v: Any) -> int:
    # INT64 extremes mean "to the end"; Python slices clip any large bound the same way.
    return int(max(min(int(v), 2**62), -(2**62)))


def _pad(b: Builder, n: NodeInfo) -> list[Tensor]:
    x = b.ins(n)[0]
    rank = len(x.shape)
    pads = [int(p) for p in b.static(n.inputs[1]).reshape(-1)]
    value: Any = 0
    if len(n.inputs) > 2 and n.inputs[2]:
        value = b.static(n.inputs[2]).reshape(-1)[0].item()
    axes = [a % rank for a in _optional_ints(b, n, 3, list(range(rank)))]
    pairs = [(0, 0)] * rank
    for j, axis in enumerate(axes):
        pairs[axis] = (pads[j], pads[j + len(axes)])
    mode = _mode(n)
    if mode == "constant":
        return [cg.pad(x, pairs, constant_values=value)]
    # edge, reflect and wrap read the input's own elements: a gather of each padded axis
    # at the indices NumPy's np.pad of a range gives (ONNX's modes are NumPy's).
    for axis, (before, after) in enumerate(pairs):
        if before or after:
            size = x.shape[axis]
            assert size is not None  # the check refused it otherwise
            index = np.pad(np.arange(size, dtype=np.int64), (before, after), mode=mode)  # type: ignore[call-overload]
            x = cg.gather(x, cg.constant(index, "int64"), axis=axis)
    return [cg.identity(x) if not any(p for pair in pairs for p in pair) else x]


def _mode(n: NodeInfo) -> str:
    return n.text("mode")


def _check_pad(n: NodeInfo) -> str | None:
    mode = _mode(n)
    if mode not in ("constant", "edge", "reflect", "wrap"):
        return f"Pad mode {mode!r}"
    pads = n.static_value(1)
    if pads is not None and any(p < 0 for p in pads):
        return "Pad with negative pads (cropping)"
    shape = n.shape(0)
    if mode == "constant":
        return None
    if shape is None:
        return f"Pad mode {mode!r} of an input whose shape is unknown until the graph runs"
    # Only the padded axes' sizes are needed (their gather indices); a batch axis left as it is may be unknown.
    rank = len(shape)
    given = n.static_value(3) if len(n.inputs) > 3 and n.inputs[3] else None
    axes = list(range(rank)) if given is None else [int(a) % rank for a in np.reshape(given, -1)]
    padded = axes if pads is None else [a for j, a in enumerate(axes) if pads[j] or pads[j + len(axes)]]
    unknown = [a for a in padded if shape[a] is None]
    if unknown:
        return f"Pad mode {mode!r} of axis {unknown[0]}, whose size is unknown until the graph runs"
    return None


def _gather(b: Builder, n: NodeInfo) -> list[Tensor]:
    x = b.ins(n)[0]
    axis = int(n.attrs["axis"])
    known = n.static_value(1, shaped=True)
    if known is not None:
        # ONNX counts a negative index from the end; cellgraph's indices are in [0, size).
        size = x.shape[axis]
        indices: Any = np.where(known < 0, known + (size or 0), known).astype(np.int64)
        return [cg.gather(x, cg.constant(indices, "int64"), axis=axis)]
    indices, size = b.ins(n)[1], x.shape[axis]
    if size is not None:
        # Negative indices count from the end: add the size where an index is in [-size, 0). One below
        # -size is left as it is, so the kernel's error names the index the model gave (-3, not -1).
        lowest = cg.constant(np.array(-size, indices.dtype), dtype=indices.dtype)
        from_end = cg.logical_and(cg.less(indices, cg.zeros_like(indices)), cg.greater_equal(indices, lowest))
        indices = indices + cg.cast(from_end, indices.dtype) * size
    return [cg.gather(x, indices, axis=axis)]


def _comparison(fn: Callable[[Tensor, Tensor], Tensor], swap: bool = False) -> Build:
    def build(b: Builder, n: NodeInfo) -> list[Tensor]:
        x, y = b.ins(n, 2)
        return [fn(y, x) if swap else fn(x, y)]

    return build


def _known_output(b: Builder, n: NodeInfo) -> list[Tensor]:
    return [b.tensor(n.outputs[0])]


def _constant_value(n: NodeInfo) -> np.ndarray | None:
    for key, kind in (("value_float", np.float32), ("value_floats", np.float32), ("value_int", np.int64),
                      ("value_ints", np.int64)):  # fmt: skip
        if n.attrs.get(key) is not None:
            return np.array(n.attrs[key], kind)
    value = n.attrs.get("value")
    # Checked as an initializer is: to_array took dims [-2] as [1] and read an external file from the working folder.
    return None if value is None else tensor_array(value, f"attribute 'value' of {n.describe()}")


def _check_constant(n: NodeInfo) -> str | None:
    set_attrs = [k for k, v in n.attrs.items() if v is not None]
    if len(set_attrs) > 1:
        # Which one to read is not the file's to leave open: the first found was kept without a word.
        raise OnnxError(
            f"{n.describe()} is given {len(set_attrs)} values ({', '.join(set_attrs)}): ONNX's Constant takes "
            "exactly one (onnx.checker refuses this model too)"
        )
    if _constant_value(n) is None:
        return f"Constant given as {', '.join(set_attrs) or 'nothing'}"
    return None


def _shape_value(n: NodeInfo) -> np.ndarray | None:
    shape = n.shape(0)
    if shape is None or None in shape:
        return None
    rank = len(shape)
    start, end = int(n.attrs["start"]), n.attrs["end"]
    end = rank if end is None else int(end)
    return np.array(shape[start + rank if start < 0 else start : end + rank if end < 0 else end], np.int64)


def _check_shape(n: NodeInfo) -> str | None:
    return "Shape of an input whose shape is unknown until the graph runs" if _shape_value(n) is None else None


def _training(n: NodeInfo) -> tuple[bool, float]:
    """Whether a Dropout node is in training mode, and its ratio (inputs known at build time)."""
    mode, ratio = n.static_value(2), n.static_value(1)
    return mode is not None and bool(mode.reshape(-1)[0]), 0.5 if ratio is None else float(ratio.reshape(-1)[0])


def _dropout(b: Builder, n: NodeInfo) -> list[Tensor]:
    x = b.ins(n)[0]
    training, ratio = _training(n)
    if not training or ratio == 0.0:
        # Inference (or nothing to drop): every unit kept, unscaled, and the mask all true.
        return [cg.identity(x), cg.cast(cg.ones_like(x), "bool")]
    # Training mode: cellgraph's Dropout draws a fresh mask each run (seeded by the node's seed
    # attribute when it has one), scales the kept units by 1 / (1 - ratio), and gives the scaled
    # mask as its second output, whose nonzeros are ONNX's boolean mask.
    seed = n.attrs["seed"]
    y = nn.dropout(x, ratio, seed=None if seed is None else int(seed), name="dropout")
    scaled = y.node.output(1)
    return [y, logic.not_equal(scaled, cg.zeros_like(scaled))]


def _mod(b: Builder, n: NodeInfo) -> list[Tensor]:
    a, c = b.ins(n, 2)
    if not n.attrs["fmod"]:
        return [mu.mod(a, c)]  # Python's %: the divisor's sign
    if not is_float(a.dtype):
        return [_int_quotient_and_remainder(a, c)[1]]
    return [float_fmod(a, c)]


def _is_inf(b: Builder, n: NodeInfo) -> list[Tensor]:
    x = b.ins(n)[0]
    inf = logic.logical_not(logic.logical_or(logic.is_finite(x), logic.is_nan(x)))
    if not n.attrs["detect_positive"]:
        inf = logic.logical_and(inf, cg.less(x, cg.zeros_like(x)))
    if not n.attrs["detect_negative"]:
        inf = logic.logical_and(inf, logic.greater(x, cg.zeros_like(x)))
    return [inf]


def _selu(b: Builder, n: NodeInfo) -> list[Tensor]:
    x, alpha, gamma = b.ins(n)[0], float(n.attrs["alpha"]), float(n.attrs["gamma"])
    return [mu.where(logic.greater(x, cg.zeros_like(x)), x * gamma, mu.expm1(x) * (alpha * gamma))]


def _hard_sigmoid(b: Builder, n: NodeInfo) -> list[Tensor]:
    x = b.ins(n)[0]
    return [mu.clip_by_value(x * float(n.attrs["alpha"]) + float(n.attrs["beta"]), 0.0, 1.0)]


def _hard_swish(b: Builder, n: NodeInfo) -> list[Tensor]:
    x = b.ins(n)[0]
    return [x * act.hard_sigmoid(x)]


def _gelu(b: Builder, n: NodeInfo) -> list[Tensor]:
    approximate = n.text("approximate")
    return [act.gelu(b.ins(n)[0], approximate=approximate == "tanh")]


def _alpha_act(fn: Callable[..., Tensor]) -> Build:
    return lambda b, n: [fn(b.ins(n)[0], float(n.attrs["alpha"]))]


_WINDOW = {"auto_pad": "NOTSET", "dilations": None, "kernel_shape": None, "pads": None, "strides": None}
_REDUCE = {"axes": None, "keepdims": 1, "noop_with_empty_axes": 0}

# One row per ONNX op, aligned: op -> build, attributes (defaults), static inputs, check.
IMPORTERS: dict[str, ImportRow] = {
    "Add":            ImportRow(_binary(cg.add), check=same_shapes_before(7)),
    "Sub":            ImportRow(_binary(cg.sub), check=same_shapes_before(7)),
    "Mul":            ImportRow(_binary(cg.mul), check=same_shapes_before(7)),
    "Div":            ImportRow(_div, check=same_shapes_before(7)),
    "Max":            ImportRow(_variadic(cg.maximum), check=same_shapes_before(8)),
    "Min":            ImportRow(_variadic(cg.minimum), check=same_shapes_before(8)),
    "Sum":            ImportRow(in_float32(_variadic(cg.add)), check=same_shapes_before(8)),
    "Neg":            ImportRow(_unary(cg.neg)),
    "Sqrt":           ImportRow(_unary(cg.sqrt)),
    "Exp":            ImportRow(_unary(cg.exp)),
    "Log":            ImportRow(_unary(cg.log)),
    "Sigmoid":        ImportRow(_unary(cg.sigmoid)),
    "Tanh":           ImportRow(_unary(cg.tanh)),
    "Identity":       ImportRow(_unary(cg.identity), strings=True),
    "Equal":          ImportRow(_comparison(cg.equal), strings=True),
    "Less":           ImportRow(_comparison(cg.less)),
    "LessOrEqual":    ImportRow(_comparison(cg.less_equal)),
    "Greater":        ImportRow(_comparison(cg.less, swap=True)),
    "GreaterOrEqual": ImportRow(_comparison(cg.greater_equal)),
    "MatMul":         ImportRow(in_float32(_matmul)),
    "Gemm":           ImportRow(in_float32(_gemm), {"alpha": 1.0, "beta": 1.0, "transA": 0, "transB": 0}),
    "ReduceSum":      ImportRow(_reduce(cg.reduce_sum), _REDUCE, (1,), _check_reduce),
    "ReduceMean":     ImportRow(_reduce(cg.reduce_mean), _REDUCE, (1,), _check_reduce),
    "ReduceMax":      ImportRow(_reduce(cg.reduce_max), _REDUCE, (1,), _check_reduce),
    "ArgMax":         ImportRow(_arg(cg.argmax), {"axis": 0, "keepdims": 1, "select_last_index": 0},
                                check=_check_argmax),
    "ArgMin":         ImportRow(_arg(red.argmin), {"axis": 0, "keepdims": 1, "select_last_index": 0},
                                check=_check_argmax),
    "ReduceProd":     ImportRow(_reduce(red.reduce_prod), _REDUCE, (1,), _check_reduce),
    "ReduceLogSumExp": ImportRow(_reduce(red.reduce_logsumexp), _REDUCE, (1,), _check_reduce),
    # Before version 13 these flattened the input to 2-D around the axis (default 1).
    "Softmax":        ImportRow(coerced_to_2d(_softmax(cg.softmax)), {"axis": -1}, check=check_coerced),
    "LogSoftmax":     ImportRow(coerced_to_2d(_softmax(cg.log_softmax)), {"axis": -1}, check=check_coerced),
    "Reshape":        ImportRow(_reshape, {"allowzero": 0}, (1,), _check_reshape, strings=True,
                                partial=lambda node, i, value: reshape_target(value) if i == 1 else None),
    "Flatten":        ImportRow(_flatten, {"axis": 1}, check=_check_flatten, strings=True),
    "Concat":         ImportRow(lambda b, n: [cg.concat(b.ins(n), int(n.attrs["axis"]))], {"axis": None}, strings=True),
    "Unsqueeze":      ImportRow(_unsqueeze, {"axes": None}, (1,), strings=True),
    "Squeeze":        ImportRow(_squeeze, {"axes": None}, (1,), strings=True),
    "Transpose":      ImportRow(_transpose, {"perm": None}, strings=True),
    "Slice":          ImportRow(_slice, {}, (1, 2, 3, 4)),
    "Pad":            ImportRow(_pad, {"mode": "constant"}, (1, 2, 3), _check_pad),
    "Gather":         ImportRow(_gather, {"axis": 0}, strings=True),
    "Conv":           ImportRow(in_float32(conv), {**_WINDOW, "group": 1}, check=check_conv),
    "ConvTranspose":  ImportRow(in_float32(conv_transpose), {**_WINDOW, "group": 1, "output_padding": None, "output_shape": None},
                                check=check_conv_transpose),
    "MaxPool":        ImportRow(pool, {**_WINDOW, "ceil_mode": 0, "storage_order": 0}, check=check_max_pool),
    "AveragePool":    ImportRow(pool, {**_WINDOW, "ceil_mode": 0, "count_include_pad": 0}, check=check_avg_pool),
    "Dropout":        ImportRow(_dropout, {"seed": None, "ratio": None}, (1, 2)),  # ratio in [0, 1): import_limits.py
    "Constant":       ImportRow(_known_output, dict.fromkeys(("value", "value_float", "value_floats", "value_int",
                                "value_ints", "sparse_value", "value_string", "value_strings")), check=_check_constant,
                                fold=_constant_value),
    "Shape":          ImportRow(_known_output, {"start": 0, "end": None}, check=_check_shape, fold=_shape_value, strings=True),
    # math_unary.py, logic.py, activations.py
    "Abs":            ImportRow(_unary(mu.abs)),
    "Ceil":           ImportRow(_unary(mu.ceil)),
    "Floor":          ImportRow(_unary(mu.floor)),
    "Round":          ImportRow(_unary(mu.round)),
    "Sin":            ImportRow(_unary(mu.sin)),
    "Cos":            ImportRow(_unary(mu.cos)),
    "Tan":            ImportRow(_unary(mu.tan)),
    "Erf":            ImportRow(_unary(mu.erf)),
    "Reciprocal":     ImportRow(_unary(lambda x: 1.0 / x)),
    "Mod":            ImportRow(_mod, {"fmod": 0}),
    "Where":          ImportRow(lambda b, n: [mu.where(*b.ins(n, 3))], strings=True),
    "And":            ImportRow(_binary(logic.logical_and)),
    "Or":             ImportRow(_binary(logic.logical_or)),
    "Xor":            ImportRow(_binary(logic.logical_xor)),
    "Not":            ImportRow(_unary(logic.logical_not)),
    "IsNaN":          ImportRow(_unary(logic.is_nan)),
    "IsInf":          ImportRow(_is_inf, {"detect_negative": 1, "detect_positive": 1}),
    "LeakyRelu":      ImportRow(_alpha_act(act.leaky_relu), {"alpha": 0.01}),
    "Elu":            ImportRow(_alpha_act(act.elu), {"alpha": 1.0}),
    "Selu":           ImportRow(in_float32(_selu), {"alpha": 1.67326319217681884765625, "gamma": 1.05070102214813232421875}),
    "Gelu":           ImportRow(_gelu, {"approximate": "none"}),
    "Softplus":       ImportRow(_unary(act.softplus)),
    "Softsign":       ImportRow(_unary(act.softsign)),
    "HardSigmoid":    ImportRow(in_float32(_hard_sigmoid), {"alpha": 0.2, "beta": 0.5}),
    "HardSwish":      ImportRow(in_float32(_hard_swish)),
    **CAST,
    **MATH,
    **RECURRENT,
    **NORMALIZATION,
    **SHAPES,
    **ARRAYS,
    **MORE,
    **RESIZE,
    **ACTIVATIONS,
    **NORMS,
    **LOSSES,
}  # fmt: skip
