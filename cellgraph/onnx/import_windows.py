"""The import rows of ONNX's windowed ops (Conv, MaxPool, AveragePool) over 1-D and 2-D images.

ONNX images are NCHW (NCL in 1-D) with OIHW filters; cellgraph's are NHWC with
HWIO filters. A 1-D op is imported as the 2-D op over an image of height 1.
Explicit, SAME_LOWER and ceil-mode padding become a ``cg.pad`` before a VALID
window (with -inf for max pooling, so that padding never wins); SAME_UPPER is
cellgraph's (TensorFlow's) SAME.
Pools of other ranks, or with dilations, are the max (or mean) of one strided
slice of the padded input per kernel offset.

Examples
--------
>>> import numpy as np
>>> from onnx import TensorProto, helper
>>> import cellgraph as cg
>>> node = helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2], dilations=[2, 2])
>>> x_info = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 4, 4])
>>> graph = helper.make_graph([node], "g", [x_info], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
>>> model = cg.onnx.import_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
>>> model(np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4))
array([[[[10., 11.],
         [14., 15.]]]], dtype=float32)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

import cellgraph as cg
from cellgraph.dataflow.graph import Tensor

if TYPE_CHECKING:
    from .importer import Builder, NodeInfo

Pair = tuple[int, int]


def _auto_pad(n: NodeInfo) -> str:
    value = n.attrs["auto_pad"]
    return value.decode() if isinstance(value, bytes) else str(value)


def _one_d(n: NodeInfo) -> bool:
    return n.rank(0) == 3


def _kernel(n: NodeInfo) -> Pair | None:
    if n.attrs.get("kernel_shape") is not None:
        k = [int(d) for d in n.attrs["kernel_shape"]]
        return (1, k[0]) if _one_d(n) else (k[0], k[1])
    w = n.shape(1)  # Conv's OIHW (OIL) weights
    if w is None or None in w[2:]:
        return None
    return (1, int(w[2])) if len(w) == 3 else (int(w[2]), int(w[3]))  # type: ignore[arg-type]


def _strides(n: NodeInfo) -> Pair:
    s = n.attrs["strides"]
    if s is None:
        return (1, 1)
    return (1, int(s[0])) if _one_d(n) else (int(s[0]), int(s[1]))


def _dilations(n: NodeInfo) -> Pair:
    d = n.attrs.get("dilations")
    if d is None:
        return (1, 1)
    return (1, int(d[0])) if _one_d(n) else (int(d[0]), int(d[1]))


def _hw(n: NodeInfo) -> tuple[int | None, int | None] | None:
    shape = n.shape(0)
    if shape is None:
        return None
    return (1, shape[2]) if len(shape) == 3 else (shape[2], shape[3])


def _explicit_pads(n: NodeInfo) -> list[int] | None:
    """(top, left, bottom, right) padding, or None when it needs dims unknown until the graph runs."""
    pad = _auto_pad(n)
    if pad == "VALID":
        return [0, 0, 0, 0]
    if pad == "NOTSET":
        p = [int(x) for x in (n.attrs["pads"] or [0, 0, 0, 0])]
        pads = [0, p[0], 0, p[1]] if _one_d(n) else p
        return _ceil_pads(n, pads) if n.attrs.get("ceil_mode") else pads
    hw, kernel = _hw(n), _kernel(n)
    if hw is None or kernel is None or None in hw:
        return None
    before, after = [], []
    spans = [(k - 1) * d + 1 for k, d in zip(kernel, _dilations(n), strict=True)]
    for size, k, s in zip(hw, spans, _strides(n), strict=True):
        total = max((-(-size // s) - 1) * s + k - size, 0)  # type: ignore[operator]
        small = total // 2
        before.append(small if pad == "SAME_UPPER" else total - small)
        after.append(total - before[-1])
    return [before[0], before[1], after[0], after[1]]


def _ceil_pads(n: NodeInfo, pads: list[int]) -> list[int]:
    """Pads with extra pixels at the end so that a floor-mode window gives ceil mode's windows.

    A window that would start in the end padding is dropped, as ONNX does.
    """
    hw, kernel = _hw(n), _kernel(n)
    assert hw is not None and kernel is not None
    out = list(pads)
    for i, (size, k, s) in enumerate(zip(hw, kernel, _strides(n), strict=True)):
        padded = size + pads[i] + pads[i + 2]  # type: ignore[operator]
        count = -(-(padded - k) // s) + 1
        if (count - 1) * s >= size + pads[i]:  # type: ignore[operator]
            count -= 1
        out[i + 2] += max((count - 1) * s + k - padded, 0)
    return out


def _native(n: NodeInfo) -> bool:
    """Whether cellgraph's own conv2d / pool ops compute the node (1-D or 2-D, no dilation)."""
    dilations = n.attrs.get("dilations")
    return n.rank(0) in (3, 4) and (dilations is None or all(int(d) == 1 for d in dilations))


def _window_check(n: NodeInfo) -> str | None:
    rank = n.rank(0)
    if not _native(n):
        if n.op == "Conv":
            if rank not in (3, 4):
                return f"Conv over a rank-{rank} input (cellgraph convolves 1-D and 2-D images)"
            hw = _hw(n)
            if hw is None or None in hw or _kernel(n) is None:
                return "Conv with dilations over an input whose height or width is unknown until the graph runs"
            return None
        return _check_sliced(n)
    if n.attrs.get("ceil_mode"):
        if n.op == "AveragePool" and n.attrs["count_include_pad"]:
            return "AveragePool with ceil_mode=1 counting padded pixels"
        hw = _hw(n)
        if _auto_pad(n) != "NOTSET" or hw is None or None in hw:
            return f"{n.op} with ceil_mode=1 and auto_pad {_auto_pad(n)} or an unknown height or width"
    if _kernel(n) is None:
        return f"{n.op} whose kernel size is unknown until the graph runs"
    if _auto_pad(n) != "SAME_UPPER" and _explicit_pads(n) is None:
        return f"{n.op} with auto_pad {_auto_pad(n)} over an input whose height or width is unknown"
    return None


def check_conv(n: NodeInfo) -> str | None:
    if int(n.attrs["group"]) != 1:
        shape = n.shape(0)
        if shape is None or shape[1] is None:
            return f"Conv with group={n.attrs['group']} over an input whose channels are unknown"
    return _window_check(n)


def check_max_pool(n: NodeInfo) -> str | None:
    if n.attrs["storage_order"]:
        return "MaxPool with storage_order=1"
    if len(n.outputs) > 1 and n.outputs[1]:
        return "MaxPool's Indices output"
    return _window_check(n)


def check_avg_pool(n: NodeInfo) -> str | None:
    return _window_check(n)


def _pad_nhwc(x: Tensor, pads: list[int], value: float) -> Tensor:
    if not any(pads):
        return x
    return cg.pad(x, [[0, 0], [pads[0], pads[2]], [pads[1], pads[3]], [0, 0]], constant_values=value)


def _to_nhwc(n: NodeInfo, x: Tensor) -> Tensor:
    return cg.transpose(cg.expand_dims(x, 2) if _one_d(n) else x, (0, 2, 3, 1))


def _from_nhwc(n: NodeInfo, y: Tensor) -> Tensor:
    y = cg.transpose(y, (0, 3, 1, 2))
    return cg.squeeze(y, 2) if _one_d(n) else y


def _padded(n: NodeInfo, x: Tensor, value: float) -> tuple[Tensor, str]:
    """NHWC ``x`` padded as the node says, and the cellgraph padding that remains to apply."""
    if _auto_pad(n) == "SAME_UPPER":
        return x, "SAME"  # TensorFlow's SAME puts the odd pixel last, as SAME_UPPER does
    pads = _explicit_pads(n)
    assert pads is not None  # the check refused the node otherwise
    return _pad_nhwc(x, pads, value), "VALID"


def conv(b: Builder, n: NodeInfo) -> list[Tensor]:
    x = _to_nhwc(n, b.ins(n)[0])
    w = b.filter_hwio(n.inputs[1])
    x, padding = _padded(n, x, 0.0)
    groups = int(n.attrs["group"])
    if groups == 1:
        y = _conv_one(n, x, w, padding)
    else:
        # A grouped convolution is one convolution per group of channels, concatenated.
        c, o = int(x.shape[3]) // groups, int(w.shape[3]) // groups  # type: ignore[arg-type]
        y = cg.concat(
            [_conv_one(n, x[..., g * c : (g + 1) * c], w[..., g * o : (g + 1) * o], padding) for g in range(groups)],
            axis=3,
        )
    if len(n.inputs) > 2 and n.inputs[2]:
        y = cg.bias_add(y, b.tensor(n.inputs[2]))
    return [_from_nhwc(n, y)]


def _conv_one(n: NodeInfo, x: Tensor, w: Tensor, padding: str) -> Tensor:
    """NHWC ``x`` (already padded) convolved with HWIO ``w``: cellgraph's conv2d, or by slices when dilated."""
    if _dilations(n) == (1, 1):
        return cg.conv2d(x, w, strides=_strides(n), padding=padding)
    # Dilated: one strided slice of the input per kernel offset, times that offset's (in, out) matrix.
    (kh, kw), (dh, dw), (sh, sw) = _kernel(n), _dilations(n), _strides(n)  # type: ignore[misc]
    height, width, channels = (int(d) for d in x.shape[1:])  # type: ignore[arg-type]
    oh, ow = (height - (kh - 1) * dh - 1) // sh + 1, (width - (kw - 1) * dw - 1) // sw + 1
    total: Tensor | None = None
    for a in range(kh):
        for c in range(kw):
            part = x[:, a * dh : a * dh + (oh - 1) * sh + 1 : sh, c * dw : c * dw + (ow - 1) * sw + 1 : sw, :]
            term = cg.matmul(cg.reshape(part, (-1, channels)), w[a, c])
            total = term if total is None else total + term
    assert total is not None
    return cg.reshape(total, (-1, oh, ow, int(w.shape[3])))  # type: ignore[arg-type]


def pool(b: Builder, n: NodeInfo) -> list[Tensor]:
    source = b.ins(n)[0]
    if source.dtype not in ("float32", "float64"):
        # cellgraph's pools are for floats: integers pool in float64 (exact for every int32) and come back.
        return [cg.cast(y, source.dtype) for y in _pool(n, cg.cast(source, "float64"))]
    return _pool(n, source)


def _pool(n: NodeInfo, source: Tensor) -> list[Tensor]:
    if not _native(n):
        return [_sliced_pool(n, source)]
    x = _to_nhwc(n, source)
    k, s = _kernel(n), _strides(n)
    assert k is not None
    if n.op == "MaxPool":
        x, padding = _padded(n, x, -np.inf)
        return [_from_nhwc(n, cg.max_pool(x, ksize=k, strides=s, padding=padding))]
    if _auto_pad(n) == "SAME_UPPER" and not n.attrs["count_include_pad"]:
        return [_from_nhwc(n, cg.avg_pool(x, ksize=k, strides=s, padding="SAME"))]
    pads = _explicit_pads(n)
    assert pads is not None
    y = cg.avg_pool(_pad_nhwc(x, pads, 0.0), ksize=k, strides=s, padding="VALID")
    if any(pads) and not n.attrs["count_include_pad"]:
        # The mean over real pixels only: the mean over the padded window, divided by
        # the share of real pixels in it.
        real = _pad_nhwc(cg.ones_like(x), pads, 0.0)
        y = y / cg.avg_pool(real, ksize=k, strides=s, padding="VALID")
    return [_from_nhwc(n, y)]


# --------------------------------------- pools of any rank or dilation, by slices
def _check_sliced(n: NodeInfo) -> str | None:
    shape = n.shape(0)
    if shape is None or None in shape[2:]:
        return f"{n.op} over {len(shape or ()) - 2 or 'unknown'}-D windows or with dilations, of unknown spatial size"
    if n.attrs.get("kernel_shape") is None:
        return f"{n.op} without kernel_shape"
    if n.op == "AveragePool" and n.attrs["count_include_pad"] and n.attrs["ceil_mode"]:
        return "AveragePool with ceil_mode=1 counting padded pixels"
    return None


def _sliced_geometry(n: NodeInfo) -> tuple[list[int], list[int], list[int], list[int], list[int], list[int]]:
    """Spatial sizes, kernel, strides, dilations, pads before and after, for a pool of any rank."""
    shape = n.shape(0)
    assert shape is not None
    sizes = [int(d) for d in shape[2:]]  # type: ignore[arg-type]
    rank = len(sizes)
    kernel = [int(k) for k in n.attrs["kernel_shape"]]
    strides = [int(s) for s in (n.attrs["strides"] or [1] * rank)]
    dilations = [int(d) for d in (n.attrs.get("dilations") or [1] * rank)]
    span = [(k - 1) * d + 1 for k, d in zip(kernel, dilations, strict=True)]
    pad = _auto_pad(n)
    if pad in ("SAME_UPPER", "SAME_LOWER"):
        totals = [max((-(-size // s) - 1) * s + e - size, 0) for size, s, e in zip(sizes, strides, span, strict=True)]
        small = [t // 2 for t in totals]
        before = small if pad == "SAME_UPPER" else [t - m for t, m in zip(totals, small, strict=True)]
        after = [t - b for t, b in zip(totals, before, strict=True)]
    elif pad == "VALID":
        before, after = [0] * rank, [0] * rank
    else:
        p = [int(v) for v in (n.attrs["pads"] or [0] * (2 * rank))]
        before, after = p[:rank], p[rank:]
    if n.attrs.get("ceil_mode"):
        for i in range(rank):
            padded = sizes[i] + before[i] + after[i]
            count = -(-(padded - span[i]) // strides[i]) + 1
            if (count - 1) * strides[i] >= sizes[i] + before[i]:  # a window may not start in the end padding
                count -= 1
            after[i] += max((count - 1) * strides[i] + span[i] - padded, 0)
    return sizes, kernel, strides, dilations, before, after


def _sliced_pool(n: NodeInfo, x: Tensor) -> Tensor:
    """A pool as the max (or mean) of one strided slice of the padded input per kernel offset."""
    sizes, kernel, strides, dilations, before, after = _sliced_geometry(n)
    is_max = n.op == "MaxPool"
    pairs = [(0, 0), (0, 0), *zip(before, after, strict=True)]
    padded = cg.pad(x, pairs, constant_values=-np.inf if is_max else 0.0) if any(before + after) else x
    outs = [
        (size + b + a - ((k - 1) * d + 1)) // s + 1
        for size, b, a, k, d, s in zip(sizes, before, after, kernel, dilations, strides, strict=True)
    ]
    total: Tensor | None = None
    real = np.pad(np.ones(sizes), list(zip(before, after, strict=True)))
    count = np.zeros(outs)
    for offset in np.ndindex(*kernel):
        key = tuple(
            slice(o * d, o * d + (m - 1) * s + 1, s)
            for o, d, m, s in zip(offset, dilations, outs, strides, strict=True)
        )
        part = padded[(slice(None), slice(None), *key)]
        total = part if total is None else (cg.maximum(total, part) if is_max else total + part)
        count += real[key]
    assert total is not None
    if is_max:
        return total
    # The mean's divisor: every window position, or only the real pixels under it.
    divisor = np.full(outs, float(np.prod(kernel))) if n.attrs["count_include_pad"] else count
    return total / cg.constant(divisor.astype(np.dtype(x.dtype)))
