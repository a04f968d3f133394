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
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

import cellgraph as cg
from cellgraph.dataflow.graph import Tensor

from .common import ONNX_TO_DTYPE

if TYPE_CHECKING:
    from .importer import Builder, NodeInfo

Build = Callable[["Builder", "NodeInfo"], list[Tensor]]
Check = Callable[["NodeInfo"], "str | None"]


@dataclass(frozen=True)
class ImportRow:
    build: Build
    attrs: dict[str, Any] = field(default_factory=dict)  # understood attributes and their defaults
    static: tuple[int, ...] = ()  # inputs whose values must be known at build time
    check: Check | None = None


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


def _pow(b: Builder, n: NodeInfo) -> list[Tensor]:
    x, y = b.ins(n, 2)
    # ONNX lets the exponent have its own type; cellgraph's Pow takes one dtype.
    return [cg.pow(x, y if y.dtype == x.dtype else cg.cast(y, x.dtype))]


def _check_float(n: NodeInfo) -> str | None:
    t = n.types.get(n.inputs[0])
    code = t.tensor_type.elem_type if t is not None else None
    return None if code in (1, 11) else f"{n.op} of {n.dtype_name(code)} tensors (cellgraph's {n.op} is for floats)"


def _rank_is(*ranks: int, what: str = "input") -> Check:
    def check(n: NodeInfo) -> str | None:
        rank = n.rank(0)
        if rank is not None and rank not in ranks:
            return f"{n.op} of a rank-{rank} {what} (cellgraph's is rank {' or '.join(map(str, ranks))})"
        return None

    return check


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
    if len(a.shape) == 2 and len(c.shape) == 2:
        return [cg.matmul(a, c)]
    # NumPy's matmul for other ranks: 1-D operands get a unit dim (dropped again), batch dims
    # broadcast, and each product is a broadcast multiply summed over the shared axis.
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
    if len(ins) > 2:
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


def _argmax(b: Builder, n: NodeInfo) -> list[Tensor]:
    x = b.ins(n)[0]
    axis = int(n.attrs["axis"]) % len(x.shape)
    if n.attrs["select_last_index"]:
        # The last maximum is the first one of the reversed axis, counted from the end.
        key = tuple(slice(None, None, -1) if i == axis else slice(None) for i in range(len(x.shape)))
        size = x.shape[axis]
        y = (size - 1) - cg.cast(cg.argmax(x[key], axis=axis), "int64")  # type: ignore[operator]
    else:
        y = cg.cast(cg.argmax(x, axis=axis), "int64")
    return [cg.expand_dims(y, axis % len(x.shape)) if n.attrs["keepdims"] else y]


def _check_argmax(n: NodeInfo) -> str | None:
    shape = n.shape(0)
    if n.attrs["select_last_index"] and (shape is None or shape[int(n.attrs["axis"])] is None):
        return "ArgMax with select_last_index=1 along an axis of unknown size"
    return None


def _softmax(fn: Callable[..., Tensor]) -> Build:
    return lambda b, n: [fn(b.ins(n)[0], axis=int(n.attrs["axis"]))]


def _check_softmax(n: NodeInfo) -> str | None:
    # Before opset 13 Softmax flattened the input to 2-D around the axis.
    return None if n.opset >= 13 else f"{n.op} before opset 13 (it flattened around the axis)"


def _cast(b: Builder, n: NodeInfo) -> list[Tensor]:
    return [cg.cast(b.ins(n)[0], ONNX_TO_DTYPE[int(n.attrs["to"])])]


def _check_cast(n: NodeInfo) -> str | None:
    to = int(n.attrs["to"]) if n.attrs["to"] is not None else None
    return None if to in ONNX_TO_DTYPE else f"Cast to {n.dtype_name(to)}"


def _reshape(b: Builder, n: NodeInfo) -> list[Tensor]:
    x = b.ins(n)[0]
    dims = [int(d) for d in b.static(n.inputs[1]).reshape(-1)]
    if not n.attrs["allowzero"]:
        dims = [x.shape[i] if d == 0 else d for i, d in enumerate(dims)]  # type: ignore[misc]
    return [cg.reshape(x, [-1 if d is None else d for d in dims])]


def _check_reshape(n: NodeInfo) -> str | None:
    dims = n.static_value(1)
    shape = n.shape(0)
    if dims is not None and not n.attrs["allowzero"] and 0 in dims:
        if shape is None or any(shape[i] is None for i, d in enumerate(dims) if d == 0):
            return "Reshape copying a dim (0) that is unknown until run time"
    return None


def _flatten_axis(n: NodeInfo, rank: int) -> int:
    axis = int(n.attrs["axis"])
    return axis + rank if axis < 0 else axis


def _flatten(b: Builder, n: NodeInfo) -> list[Tensor]:
    x = b.ins(n)[0]
    axis = _flatten_axis(n, len(x.shape))
    head, tail = x.shape[:axis], x.shape[axis:]
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
    axes = _optional_ints(b, n, 3, list(range(rank)))
    pairs = [[0, 0] for _ in range(rank)]
    for j, axis in enumerate(axes):
        pairs[axis % rank] = [pads[j], pads[j + len(axes)]]
    return [cg.pad(x, pairs, constant_values=value)]


def _check_pad(n: NodeInfo) -> str | None:
    if n.attrs["mode"] not in ("constant", b"constant"):
        return f"Pad mode {n.attrs['mode']!r} (cellgraph pads with a constant)"
    pads = n.static_value(1)
    if pads is not None and any(p < 0 for p in pads):
        return "Pad with negative pads (cropping)"
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
        # Negative indices count from the end: add the size where an index is below 0.
        below = cg.cast(cg.less(indices, cg.zeros_like(indices)), indices.dtype)
        indices = indices + below * size
    return [cg.gather(x, indices, axis=axis)]


def _comparison(fn: Callable[[Tensor, Tensor], Tensor], swap: bool = False) -> Build:
    def build(b: Builder, n: NodeInfo) -> list[Tensor]:
        x, y = b.ins(n, 2)
        return [fn(y, x) if swap else fn(x, y)]

    return build


# ------------------------------------------------------ convolution, pooling
def _auto_pad(n: NodeInfo) -> str:
    value = n.attrs["auto_pad"]
    return value.decode() if isinstance(value, bytes) else str(value)


def _strides(n: NodeInfo) -> tuple[int, int]:
    s = n.attrs["strides"] or [1, 1]
    return int(s[0]), int(s[1])


def _kernel(n: NodeInfo) -> tuple[int, int] | None:
    if n.attrs.get("kernel_shape") is not None:
        k = n.attrs["kernel_shape"]
        return int(k[0]), int(k[1])
    w = n.shape(1)  # Conv's OIHW weights
    if w is None or len(w) != 4 or w[2] is None or w[3] is None:
        return None
    return int(w[2]), int(w[3])


def _explicit_pads(n: NodeInfo) -> list[int] | None:
    """(top, left, bottom, right) padding, or None when it needs dims unknown until run time."""
    pad = _auto_pad(n)
    if pad == "VALID":
        return [0, 0, 0, 0]
    if pad == "NOTSET":
        pads = [int(p) for p in (n.attrs["pads"] or [0, 0, 0, 0])]
        if n.attrs.get("ceil_mode"):
            return _ceil_pads(n, pads)
        return [pads[0], pads[1], pads[2], pads[3]]
    shape, kernel = n.shape(0), _kernel(n)
    if shape is None or kernel is None or shape[2] is None or shape[3] is None:
        return None
    before, after = [], []
    for size, k, s in zip(shape[2:], kernel, _strides(n), strict=True):
        total = max((-(-size // s) - 1) * s + k - size, 0)  # type: ignore[operator]
        small = total // 2
        before.append(small if pad == "SAME_UPPER" else total - small)
        after.append(total - before[-1])
    return [before[0], before[1], after[0], after[1]]


def _ceil_pads(n: NodeInfo, pads: list[int]) -> list[int]:
    """Pads with extra pixels at the end so that a floor-mode pool gives ceil mode's windows.

    A window that would start in the end padding is dropped, as ONNX does.
    """
    shape, kernel = n.shape(0), _kernel(n)
    assert shape is not None and kernel is not None
    out = list(pads)
    for i, (size, k, s) in enumerate(zip(shape[2:], kernel, _strides(n), strict=True)):
        padded = size + pads[i] + pads[i + 2]  # type: ignore[operator]
        count = -(-(padded - k) // s) + 1
        if (count - 1) * s >= size + pads[i]:  # type: ignore[operator]
            count -= 1
        out[i + 2] += max((count - 1) * s + k - padded, 0)
    return out


def _window_check(n: NodeInfo) -> str | None:
    if n.rank(0) is not None and n.rank(0) != 4:
        return f"{n.op} over a rank-{n.rank(0)} input (cellgraph convolves and pools 2-D images only)"
    dilations = n.attrs.get("dilations")
    if dilations is not None and any(int(d) != 1 for d in dilations):
        return f"{n.op} with dilations {list(dilations)}"
    if n.attrs.get("ceil_mode"):
        if n.op == "AveragePool" and n.attrs["count_include_pad"]:
            return "AveragePool with ceil_mode=1 counting padded pixels"
        if _auto_pad(n) != "NOTSET" or None in (n.shape(0) or (None,))[2:]:
            return f"{n.op} with ceil_mode=1 and auto_pad {_auto_pad(n)} or unknown height or width"
    if _auto_pad(n) != "SAME_UPPER" and _explicit_pads(n) is None:
        return f"{n.op} with auto_pad {_auto_pad(n)} over an input whose height or width is unknown"
    return None


def _pad_nhwc(x: Tensor, pads: list[int], value: float) -> Tensor:
    if not any(pads):
        return x
    return cg.pad(x, [[0, 0], [pads[0], pads[2]], [pads[1], pads[3]], [0, 0]], constant_values=value)


def _nhwc_window(n: NodeInfo, x: Tensor, value: float) -> tuple[Tensor, str]:
    """NHWC ``x`` padded as the node says, and the cellgraph padding that remains to apply."""
    if _auto_pad(n) == "SAME_UPPER":
        return x, "SAME"  # TensorFlow's SAME: the odd pixel goes last, as in SAME_UPPER
    pads = _explicit_pads(n)
    assert pads is not None  # the check refused it otherwise
    return _pad_nhwc(x, pads, value), "VALID"


def _conv(b: Builder, n: NodeInfo) -> list[Tensor]:
    x = cg.transpose(b.ins(n)[0], (0, 2, 3, 1))
    w = b.filter_hwio(n.inputs[1])
    x, padding = _nhwc_window(n, x, 0.0)
    y = cg.conv2d(x, w, strides=_strides(n), padding=padding)
    if len(n.inputs) > 2 and n.inputs[2]:
        y = cg.bias_add(y, b.tensor(n.inputs[2]))
    return [cg.transpose(y, (0, 3, 1, 2))]


def _check_conv(n: NodeInfo) -> str | None:
    if int(n.attrs["group"]) != 1:
        return f"Conv with group={n.attrs['group']} (cellgraph's conv2d is not grouped)"
    return _window_check(n)


def _max_pool(b: Builder, n: NodeInfo) -> list[Tensor]:
    x = cg.transpose(b.ins(n)[0], (0, 2, 3, 1))
    x, padding = _nhwc_window(n, x, -np.inf)
    y = cg.max_pool(x, ksize=_kernel(n), strides=_strides(n), padding=padding)  # type: ignore[arg-type]
    return [cg.transpose(y, (0, 3, 1, 2))]


def _avg_pool(b: Builder, n: NodeInfo) -> list[Tensor]:
    x = cg.transpose(b.ins(n)[0], (0, 2, 3, 1))
    k, s = _kernel(n), _strides(n)
    if _auto_pad(n) == "SAME_UPPER" and not n.attrs["count_include_pad"]:
        y = cg.avg_pool(x, ksize=k, strides=s, padding="SAME")  # type: ignore[arg-type]
    else:
        pads = _explicit_pads(n)
        assert pads is not None
        y = cg.avg_pool(_pad_nhwc(x, pads, 0.0), ksize=k, strides=s, padding="VALID")  # type: ignore[arg-type]
        if any(pads) and not n.attrs["count_include_pad"]:
            # The mean over real pixels only: each window's mean over the padded input,
            # divided by the share of real pixels in it.
            real = _pad_nhwc(cg.ones_like(x), pads, 0.0)
            y = y / cg.avg_pool(real, ksize=k, strides=s, padding="VALID")  # type: ignore[arg-type]
    return [cg.transpose(y, (0, 3, 1, 2))]


def _check_max_pool(n: NodeInfo) -> str | None:
    if n.attrs["storage_order"]:
        return "MaxPool with storage_order=1"
    if len(n.outputs) > 1 and n.outputs[1]:
        return "MaxPool's Indices output"
    return _window_check(n)


def _constant(b: Builder, n: NodeInfo) -> list[Tensor]:
    return [b.tensor(n.outputs[0])]


def _check_constant(n: NodeInfo) -> str | None:
    value = n.static_output
    if value is None:
        set_attrs = [k for k, v in n.attrs.items() if v is not None]
        return f"Constant given as {', '.join(set_attrs) or 'nothing'}"
    return None


def _dropout(b: Builder, n: NodeInfo) -> list[Tensor]:
    # Imported for inference: every unit kept, unscaled, and the mask all true.
    x = b.ins(n)[0]
    return [cg.identity(x), cg.cast(cg.ones_like(x), "bool")]


def _check_dropout(n: NodeInfo) -> str | None:
    mode = n.static_value(2)
    if mode is not None and bool(mode.reshape(-1)[0]):
        return "Dropout in training mode"
    return None


_WINDOW = {"auto_pad": "NOTSET", "dilations": None, "kernel_shape": None, "pads": None, "strides": None}
_REDUCE = {"axes": None, "keepdims": 1, "noop_with_empty_axes": 0}

# One row per ONNX op, aligned: op -> build, attributes (defaults), static inputs, check.
IMPORTERS: dict[str, ImportRow] = {
    "Add":            ImportRow(_binary(cg.add)),
    "Sub":            ImportRow(_binary(cg.sub)),
    "Mul":            ImportRow(_binary(cg.mul)),
    "Div":            ImportRow(_binary(cg.div), check=_check_float),
    "Pow":            ImportRow(_pow, check=_check_float),
    "Max":            ImportRow(_variadic(cg.maximum)),
    "Min":            ImportRow(_variadic(cg.minimum)),
    "Sum":            ImportRow(_variadic(cg.add)),
    "Neg":            ImportRow(_unary(cg.neg)),
    "Sqrt":           ImportRow(_unary(cg.sqrt)),
    "Exp":            ImportRow(_unary(cg.exp)),
    "Log":            ImportRow(_unary(cg.log)),
    "Relu":           ImportRow(_unary(cg.relu)),
    "Sigmoid":        ImportRow(_unary(cg.sigmoid)),
    "Tanh":           ImportRow(_unary(cg.tanh)),
    "Identity":       ImportRow(_unary(cg.identity)),
    "Equal":          ImportRow(_comparison(cg.equal)),
    "Less":           ImportRow(_comparison(cg.less)),
    "LessOrEqual":    ImportRow(_comparison(cg.less_equal)),
    "Greater":        ImportRow(_comparison(cg.less, swap=True)),
    "GreaterOrEqual": ImportRow(_comparison(cg.greater_equal)),
    "Cast":           ImportRow(_cast, {"to": None, "saturate": 1, "round_mode": "up"}, check=_check_cast),
    "MatMul":         ImportRow(_matmul),
    "Gemm":           ImportRow(_gemm, {"alpha": 1.0, "beta": 1.0, "transA": 0, "transB": 0}),
    "ReduceSum":      ImportRow(_reduce(cg.reduce_sum), _REDUCE, (1,), _check_reduce),
    "ReduceMean":     ImportRow(_reduce(cg.reduce_mean), _REDUCE, (1,), _check_reduce),
    "ReduceMax":      ImportRow(_reduce(cg.reduce_max), _REDUCE, (1,), _check_reduce),
    "ArgMax":         ImportRow(_argmax, {"axis": 0, "keepdims": 1, "select_last_index": 0},
                                check=_check_argmax),
    "Softmax":        ImportRow(_softmax(cg.softmax), {"axis": -1}, check=_check_softmax),
    "LogSoftmax":     ImportRow(_softmax(cg.log_softmax), {"axis": -1}, check=_check_softmax),
    "Reshape":        ImportRow(_reshape, {"allowzero": 0}, (1,), _check_reshape),
    "Flatten":        ImportRow(_flatten, {"axis": 1}, check=_check_flatten),
    "Concat":         ImportRow(lambda b, n: [cg.concat(b.ins(n), int(n.attrs["axis"]))], {"axis": None}),
    "Unsqueeze":      ImportRow(_unsqueeze, {"axes": None}, (1,)),
    "Squeeze":        ImportRow(_squeeze, {"axes": None}, (1,)),
    "Transpose":      ImportRow(_transpose, {"perm": None}),
    "Slice":          ImportRow(_slice, {}, (1, 2, 3, 4)),
    "Pad":            ImportRow(_pad, {"mode": "constant"}, (1, 2, 3), _check_pad),
    "Gather":         ImportRow(_gather, {"axis": 0}),
    "Conv":           ImportRow(_conv, {**_WINDOW, "group": 1}, check=_check_conv),
    "MaxPool":        ImportRow(_max_pool, {**_WINDOW, "ceil_mode": 0, "storage_order": 0}, check=_check_max_pool),
    "AveragePool":    ImportRow(_avg_pool, {**_WINDOW, "ceil_mode": 0, "count_include_pad": 0}, check=_window_check),
    "Dropout":        ImportRow(_dropout, {"seed": None, "ratio": None}, (1, 2), _check_dropout),
    "Constant":       ImportRow(_constant, dict.fromkeys(("value", "value_float", "value_floats", "value_int",
                                "value_ints", "sparse_value", "value_string", "value_strings")), check=_check_constant),
}  # fmt: skip
