"""The import rows of ONNX's windowed ops (Conv, ConvTranspose, MaxPool, AveragePool) over 1-D and 2-D images.

ONNX images are NCHW (NCL in 1-D) with OIHW filters; cellgraph's are NHWC with
HWIO filters. A 1-D op is imported as the 2-D op over an image of height 1.
Convolutions map onto ``cg.conv2d`` / ``cg.conv2d_transpose`` whole: group,
dilations and explicit pads are their own attrs (SAME_LOWER becomes explicit
pads); SAME_UPPER is cellgraph's (TensorFlow's) SAME. For pools, explicit,
SAME_LOWER and ceil-mode padding become a ``cg.pad`` before a VALID window
(with -inf for max pooling, so that padding never wins); MaxPool's Indices
come from ``max_pool_with_argmax``, renumbered from NHWC to ONNX's NCHW order.
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
from cellgraph.dataflow.dtypes import is_float
from cellgraph.dataflow.graph import Tensor

from .common import HALF_FLOATS

if TYPE_CHECKING:
    from .importer import Builder
    from .node_info import NodeInfo

Pair = tuple[int, int]


def _auto_pad(n: NodeInfo) -> str:
    return n.text("auto_pad")


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
        pads = _stated_pads(n)
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


def _stated_pads(n: NodeInfo) -> list[int]:
    """(top, left, bottom, right) as the node's ``pads`` state them, without ceil mode's extra pixels."""
    p = [int(x) for x in (n.attrs["pads"] or [0, 0, 0, 0])]
    return [0, p[0], 0, p[1]] if _one_d(n) else p


def _covered(padded: int, kernel: int, stride: int, extended: int) -> np.ndarray:
    """How many of each window's ``kernel`` positions fall inside the first ``padded`` of ``extended`` pixels
    (the windows at stride ``stride`` over ``extended``, VALID)."""
    starts = np.arange((extended - kernel) // stride + 1) * stride
    return np.minimum(starts + kernel, padded) - starts


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
    if n.op in ("Conv", "ConvTranspose"):
        if rank not in (3, 4):
            return f"{n.op} over a rank-{rank} input (cellgraph convolves 1-D and 2-D images)"
    elif not _native(n):
        return _check_sliced(n)
    if n.attrs.get("ceil_mode"):
        hw = _hw(n)
        if _auto_pad(n) != "NOTSET" or hw is None or None in hw:
            return f"{n.op} with ceil_mode=1 and auto_pad {_auto_pad(n)} or an unknown height or width"
    if _kernel(n) is None:
        return f"{n.op} whose kernel size is unknown until the graph runs"
    if _auto_pad(n) != "SAME_UPPER" and _explicit_pads(n) is None:
        return f"{n.op} with auto_pad {_auto_pad(n)} over an input whose height or width is unknown"
    return None


def check_conv(n: NodeInfo) -> str | None:
    return _window_check(n)


def check_conv_transpose(n: NodeInfo) -> str | None:
    why = _window_check(n)
    if why is not None:
        return why
    if _auto_pad(n) not in ("NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER"):
        return f"ConvTranspose with auto_pad {_auto_pad(n)}"
    hw = _hw(n)
    if hw is None or None in hw:
        return "ConvTranspose over an input whose height or width is unknown until the graph runs"
    if _kernel(n) is None:
        return "ConvTranspose whose kernel size is unknown until the graph runs"
    geometry = _transpose_geometry(n)
    return geometry if isinstance(geometry, str) else None


def _wants_indices(n: NodeInfo) -> bool:
    return len(n.outputs) > 1 and bool(n.outputs[1])


def check_max_pool(n: NodeInfo) -> str | None:
    if _wants_indices(n):
        shape = n.shape(0)
        if not _native(n) or n.attrs.get("ceil_mode"):
            return "MaxPool's Indices output with dilations, ceil_mode or over other than 1-D and 2-D images"
        if shape is None or None in shape[1:]:
            return "MaxPool's Indices output over an input whose channels, height or width are unknown"
    elif n.attrs["storage_order"]:
        return _window_check(n)  # the order of the indices only: no Indices, nothing to order
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


def _conv_padding(n: NodeInfo) -> str | tuple[Pair, Pair]:
    """cellgraph's padding for the node: SAME, or explicit ((top, bottom), (left, right)) pads."""
    if _auto_pad(n) == "SAME_UPPER":
        return "SAME"  # TensorFlow's SAME puts the odd pixel last, as SAME_UPPER does
    pads = _explicit_pads(n)
    assert pads is not None  # the check refused SAME_LOWER over sizes unknown until the graph runs
    return ((pads[0], pads[2]), (pads[1], pads[3]))


def conv(b: Builder, n: NodeInfo) -> list[Tensor]:
    x = _to_nhwc(n, b.ins(n)[0])
    w = b.filter_hwio(n.inputs[1])
    y = cg.conv2d(x, w, _strides(n), _conv_padding(n), dilations=_dilations(n), groups=int(n.attrs["group"]))
    if len(n.inputs) > 2 and n.inputs[2]:
        y = cg.bias_add(y, b.tensor(n.inputs[2]))
    return [_from_nhwc(n, y)]


def _per_axis(n: NodeInfo, name: str, default: int) -> list[int]:
    """A per-spatial-axis attribute as (height, width); a 1-D node's height is 1 (0 for pads)."""
    rank = 1 if _one_d(n) else 2
    values = [int(v) for v in (n.attrs[name] or [default] * rank)][-rank:]
    return [default if name != "output_shape" else 1, values[0]] if _one_d(n) else values


def _transpose_geometry(n: NodeInfo) -> tuple[Pair, tuple[Pair, Pair]] | str:
    """(output height and width, explicit pads) of a ConvTranspose by ONNX's rules, or why not.

    ONNX's output is the full transposed convolution, ``stride * (in - 1) +
    span``, plus ``output_padding`` at the end, less the pads at each end.
    cellgraph's output starts at the same pixel (its pad before); its pad after
    only has to make the forward convolution give back ``in``.
    """
    kernel, strides, dilations, hw = _kernel(n), _strides(n), _dilations(n), _hw(n)
    assert kernel is not None and hw is not None
    extra = _per_axis(n, "output_padding", 0)
    raw = [int(v) for v in (n.attrs["pads"] or [0] * (2 if _one_d(n) else 4))]
    pads = [0, raw[0], 0, raw[1]] if _one_d(n) else raw
    mode = _auto_pad(n)
    sizes, pairs = [], []
    for i in range(2):
        span, size = (kernel[i] - 1) * dilations[i] + 1, int(hw[i])  # type: ignore[arg-type]
        full = strides[i] * (size - 1) + extra[i] + span
        if n.attrs["output_shape"] is not None or mode in ("SAME_UPPER", "SAME_LOWER"):
            out = _per_axis(n, "output_shape", 1)[i] if n.attrs["output_shape"] is not None else size * strides[i]
            total = full - out
            before = total // 2 if mode == "SAME_UPPER" else total - total // 2
        elif mode == "VALID":
            out, before = full, 0
        else:
            out, before = full - pads[i] - pads[i + 2], pads[i]
        if before < 0 or out < 1:
            return f"ConvTranspose whose output ({out}) starts before or is wider than the full transposed convolution"
        sizes.append(out)
        pairs.append((before, max(0, (size - 1) * strides[i] + span - out - before)))
    return (sizes[0], sizes[1]), (pairs[0], pairs[1])


def conv_transpose(b: Builder, n: NodeInfo) -> list[Tensor]:
    x = _to_nhwc(n, b.ins(n)[0])
    w = b.filter_hwio(n.inputs[1])  # ONNX's (in, out / group, kh, kw) is the forward filter's OIHW
    geometry = _transpose_geometry(n)
    assert not isinstance(geometry, str)  # the check refused it
    size, pads = geometry
    y = cg.conv2d_transpose(x, w, size, _strides(n), pads, dilations=_dilations(n), groups=int(n.attrs["group"]))
    if len(n.inputs) > 2 and n.inputs[2]:
        y = cg.bias_add(y, b.tensor(n.inputs[2]))
    return [_from_nhwc(n, y)]


def pool(b: Builder, n: NodeInfo) -> list[Tensor]:
    source = b.ins(n)[0]
    # cellgraph's pools are for floats: integers pool in float64 (exact for every int32), and half
    # floats in float32 (a mean of several slices, each add rounded to float16, was 10 units in the
    # last place off); the values come back to the input's type, MaxPool's Indices stay int64
    # (an int8 input's were cast to int8).
    wide = "float64" if not is_float(source.dtype) else "float32" if source.dtype in HALF_FLOATS else None
    if wide is None:
        return _pool(n, source)
    y, *indices = _pool(n, cg.cast(source, wide))
    return [cg.cast(y, source.dtype), *indices]


def _pool(n: NodeInfo, source: Tensor) -> list[Tensor]:
    if not _native(n):
        return [_sliced_pool(n, source)]
    x = _to_nhwc(n, source)
    k, s = _kernel(n), _strides(n)
    assert k is not None
    if n.op == "MaxPool":
        padded, padding = _padded(n, x, -np.inf)
        if _wants_indices(n):
            y, at = cg.nn.max_pool_with_argmax(padded, k, s, padding, include_batch_in_index=True)
            return [_from_nhwc(n, y), _onnx_indices(n, at, padded, x)]
        return [_from_nhwc(n, cg.max_pool(padded, ksize=k, strides=s, padding=padding))]
    if _auto_pad(n) == "SAME_UPPER" and not n.attrs["count_include_pad"]:
        return [_from_nhwc(n, cg.avg_pool(x, ksize=k, strides=s, padding="SAME"))]
    pads = _explicit_pads(n)
    assert pads is not None
    y = cg.avg_pool(_pad_nhwc(x, pads, 0.0), ksize=k, strides=s, padding="VALID")
    if n.attrs["count_include_pad"] and n.attrs.get("ceil_mode"):
        # The pads count, ceil mode's extra pixels past them do not: a last window that overhangs the padded
        # input is the mean of the pixels and pads it covers (ONNX Runtime's rule).
        hw = _hw(n)
        assert hw is not None
        stated = _stated_pads(n)
        covered = [
            _covered(int(size) + stated[i] + stated[i + 2], k[i], s[i], int(size) + pads[i] + pads[i + 2])  # type: ignore[arg-type]
            for i, size in enumerate(hw)
        ]
        divisor = np.outer(covered[0], covered[1])[None, :, :, None]
        return [_from_nhwc(n, y * cg.constant((float(np.prod(k)) / divisor).astype(np.dtype(x.dtype))))]
    if any(pads) and not n.attrs["count_include_pad"]:
        # The mean over real pixels only: the mean over the padded window, divided by
        # the share of real pixels in it.
        real = _pad_nhwc(cg.ones_like(x), pads, 0.0)
        y = y / cg.avg_pool(real, ksize=k, strides=s, padding="VALID")
    return [_from_nhwc(n, y)]


def _onnx_indices(n: NodeInfo, at: Tensor, padded: Tensor, x: Tensor) -> Tensor:
    """NHWC flat indices into ``padded`` (batch included) as ONNX's: NCHW flat indices into the
    unpadded input, row-major (or with storage_order=1 column-major) within each image plane."""
    hp, wp, c = (int(d) for d in padded.shape[1:])  # type: ignore[arg-type]
    h, w = int(x.shape[1]), int(x.shape[2])  # type: ignore[arg-type]
    top, left = 0, 0  # SAME_UPPER: max_pool_with_argmax pads itself and counts the input's pixels
    if _auto_pad(n) != "SAME_UPPER":
        pads = _explicit_pads(n)
        assert pads is not None
        top, left = pads[0], pads[1]
    channel, pixel = cg.mod(at, c), cg.floordiv(at, c)
    col, rest = cg.mod(pixel, wp) - left, cg.floordiv(pixel, wp)
    row, image = cg.mod(rest, hp) - top, cg.floordiv(rest, hp)
    plane = row * w + col if not n.attrs["storage_order"] else col * h + row
    index = (image * c + channel) * (h * w) + plane
    return _from_nhwc(n, index)


# --------------------------------------- pools of any rank or dilation, by slices
def _check_sliced(n: NodeInfo) -> str | None:
    shape = n.shape(0)
    if shape is None or None in shape[2:]:
        return f"{n.op} over {len(shape or ()) - 2 or 'unknown'}-D windows or with dilations, of unknown spatial size"
    if n.attrs.get("kernel_shape") is None:
        return f"{n.op} without kernel_shape"
    return None


def _sliced_geometry(
    n: NodeInfo,
) -> tuple[list[int], list[int], list[int], list[int], list[int], list[int], list[int]]:
    """Spatial sizes, kernel, strides, dilations, pads before and after (as stated or auto), and ceil mode's extra
    pixels after those, for a pool of any rank."""
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
    extra = [0] * rank  # ceil mode's pixels past the stated end pads
    if n.attrs.get("ceil_mode"):
        for i in range(rank):
            padded = sizes[i] + before[i] + after[i]
            count = -(-(padded - span[i]) // strides[i]) + 1
            if (count - 1) * strides[i] >= sizes[i] + before[i]:  # a window may not start in the end padding
                count -= 1
            extra[i] = max((count - 1) * strides[i] + span[i] - padded, 0)
    return sizes, kernel, strides, dilations, before, after, extra


def _sliced_pool(n: NodeInfo, x: Tensor) -> Tensor:
    """A pool as the max (or mean) of one strided slice of the padded input per kernel offset."""
    sizes, kernel, strides, dilations, before, stated_after, extra = _sliced_geometry(n)
    after = [a + e for a, e in zip(stated_after, extra, strict=True)]
    is_max = n.op == "MaxPool"
    pairs = [(0, 0), (0, 0), *zip(before, after, strict=True)]
    padded = cg.pad(x, pairs, constant_values=-np.inf if is_max else 0.0) if any(before + after) else x
    outs = [
        (size + b + a - ((k - 1) * d + 1)) // s + 1
        for size, b, a, k, d, s in zip(sizes, before, after, kernel, dilations, strides, strict=True)
    ]
    total: Tensor | None = None
    # What a window's mean divides by: the pixels under it, and the stated pads with count_include_pad (ceil
    # mode's extra pixels past them never count: ONNX Runtime's rule).
    if not is_max and n.attrs["count_include_pad"]:
        stated = [size + b + a for size, b, a in zip(sizes, before, stated_after, strict=True)]
        real = np.pad(np.ones(stated), [(0, e) for e in extra])
    else:
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
    return total / cg.constant(count.astype(np.dtype(x.dtype)))
