"""The cases of the ONNX import sweep for ops that index, rearrange or multiply arrays: negative
indices, negative steps and clamped ends, broadcasting shapes, empty dims, and each version's form
of the inputs that must be known when the graph is built (``Const``).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .onnx_sweep import FLOATS, Case, Cases, Const, allowed, since, tolerance, values

I64 = np.iinfo(np.int64)


# ------------------------------------------------------------------ arrays
def gather(rng: np.random.Generator) -> Cases:
    for version in since("Gather"):
        for dtype in allowed("Gather", version, "T"):
            x = values(rng, dtype, (4, 3, 2))
            for itype in (np.int64, np.int32):
                for axis in (0, 1, -1, -3) if version >= 11 else (0, 1):
                    size = x.shape[axis]
                    idx = (
                        np.array([[0, -1], [size - 1, -size]], itype)
                        if version >= 11
                        else np.array([0, size - 1], itype)
                    )
                    yield Case("Gather", version, [x, idx], {"axis": axis})
                    yield Case("Gather", version, [x, Const(idx)], {"axis": axis}, note="known indices")
            yield Case("Gather", version, [x, np.array(-2, np.int64)], {"axis": 0}, note="scalar index")
        # Out of range, past either end: ONNX Runtime fails, and so must cellgraph (no numbers).
        for bad in (4, -5):
            yield Case("Gather", version, [x[:, 0, 0], np.array([0, bad], np.int64)], note="out of range")


def slice_(rng: np.random.Generator) -> Cases:
    x = values(rng, np.dtype(np.float32), (5, 6))
    edges = [
        ([1], [4], [0], [1]), ([-1], [-6], [1], [-1]), ([4], [I64.min], [0], [-2]), ([0], [I64.max], [-1], [2]),
        ([10], [0], [1], [-1]), ([-10], [10], [0], [1]), ([5], [0], [0], [-1]), ([0, 5], [5, 0], [0, 1], [1, -3]),
        ([3], [3], [1], [1]), ([-100], [-90], [1], [1]), ([I64.max], [I64.min], [0], [-1]),
    ]  # fmt: skip
    for version in since("Slice"):
        if version < 10:
            continue  # starts and ends as attributes: the row refuses them
        for dtype in allowed("Slice", version, "T")[:4]:
            y = x.astype(dtype)
            for starts, ends, axes, steps in edges:
                ins = [Const(np.array(v, np.int64)) for v in (starts, ends, axes, steps)]
                yield Case("Slice", version, [y, *ins])
            yield Case("Slice", version, [y, Const(np.array([1, -2], np.int32)), Const(np.array([-1, 0], np.int32))])


def expand(rng: np.random.Generator) -> Cases:
    for version in since("Expand"):
        for dtype in allowed("Expand", version, "T")[:6]:
            for shape, target in (((3, 1), [2, 3, 4]), ((2, 3), [1, 1]), ((1,), [0, 3]), ((4, 1), [1, 5]), ((), [2])):
                yield Case("Expand", version, [values(rng, dtype, shape), Const(np.array(target, np.int64))])


def pad(rng: np.random.Generator) -> Cases:
    for version in since("Pad"):
        if version < 11:
            continue  # pads as an attribute: the row refuses it
        modes = ["constant", "edge", "reflect"] + (["wrap"] if version >= 19 else [])
        for dtype in allowed("Pad", version, "T")[:10]:
            x = values(rng, dtype, (3, 4))
            for mode in modes:
                pads = Const(np.array([1, 0, 2, 3], np.int64))
                value = Const(np.array(7, dtype)) if mode == "constant" else None
                yield Case("Pad", version, [x, pads, value], {"mode": mode})
                if version >= 18:
                    yield Case("Pad", version, [x, Const(np.array([2, 1], np.int64)), value, Const(np.array([-1]))],
                               {"mode": mode})  # fmt: skip


def cumsum(rng: np.random.Generator) -> Cases:
    for version in since("CumSum"):
        for dtype in allowed("CumSum", version, "T"):
            x = values(rng, dtype, (3, 4), special=False, low=-5, high=5)
            for axis in (0, 1, -1, -2):
                for exclusive in (0, 1):
                    for reverse in (0, 1):
                        yield Case("CumSum", version, [x, Const(np.array(axis, np.int32))],
                                   {"exclusive": exclusive, "reverse": reverse}, **tolerance(dtype))  # fmt: skip


def top_k(rng: np.random.Generator) -> Cases:
    for version in since("TopK"):
        for dtype in allowed("TopK", version, "T"):
            x = values(rng, dtype, (3, 5), special=False, low=-3, high=3, ties=True)
            for axis in (-1, 0, 1):
                for largest in (1, 0) if version >= 11 else (1,):
                    k = Const(np.array([2], np.int64))
                    yield Case("TopK", version, [x, k], {"axis": axis, "largest": largest}, outputs=2)
            if dtype in FLOATS:
                yield Case("TopK", version, [values(rng, dtype, (2, 6)), Const(np.array([3], np.int64))], outputs=2,
                           note="NaN and infinities")  # fmt: skip


def one_hot(rng: np.random.Generator) -> Cases:
    for version in since("OneHot"):
        for itype in (np.int64, np.int32, np.float32):
            idx = np.array([[0, -1, 3], [-4, 5, 2]], itype)  # 5 and below -4: all off
            for axis in (-1, 0, 1):
                yield Case("OneHot", version, [idx, Const(np.array(4, np.int64)), Const(np.array([0.5, 2.0], np.float32))],
                           {"axis": axis})  # fmt: skip


def trilu(rng: np.random.Generator) -> Cases:
    for version in since("Trilu"):
        for dtype in allowed("Trilu", version, "T")[:6]:
            x = values(rng, dtype, (2, 3, 5))
            for upper in (0, 1):
                for k in (None, -1, 2, 7, -9):
                    yield Case(
                        "Trilu", version, [x, None if k is None else Const(np.array(k, np.int64))], {"upper": upper}
                    )


def split(rng: np.random.Generator) -> Cases:
    x = values(rng, np.dtype(np.float32), (7, 4))
    for version in since("Split"):
        if version < 13:
            continue  # split as an attribute: the row refuses it
        yield Case("Split", version, [x, Const(np.array([2, 5], np.int64))], {"axis": 0}, outputs=2)
        yield Case("Split", version, [x, Const(np.array([1, 3], np.int64))], {"axis": -1}, outputs=2)
        # Three outputs of 7: 3, 3 and 1 (ceil(7 / 3) each, the last smaller).
        yield Case("Split", version, [x], {"axis": 0} if version < 18 else {"axis": 0, "num_outputs": 3}, outputs=3)


def shapes(rng: np.random.Generator) -> Cases:
    x = values(rng, np.dtype(np.int16), (2, 3, 4))
    for v in since("Flatten"):
        for axis in (0, 1, -1, 3, -3) if v >= 11 else (0, 1, 3):
            yield Case("Flatten", v, [x], {"axis": axis})
    for v in since("Concat"):
        for axis in (0, -1, -2) if v >= 11 else (0, 2):
            yield Case("Concat", v, [x, x[:, :, :1] if axis in (-1, 2) else x], {"axis": axis})
    for v in since("Transpose"):
        yield Case("Transpose", v, [x], {"perm": [2, 0, 1]})
        yield Case("Transpose", v, [x])
    for v in since("Reshape"):
        if v < 5:
            continue
        for shape in ([4, -1], [0, -1], [-1], [0, 0, 2, 2], [2, 3, 4]):
            yield Case("Reshape", v, [x, Const(np.array(shape, np.int64))])
        if v >= 14:
            yield Case("Reshape", v, [x[:0], Const(np.array([0, 5], np.int64))], {"allowzero": 1})
    for v in since("Unsqueeze"):
        for axes in ([0], [-1], [1, -1], [3, 0]):
            yield Case(
                "Unsqueeze",
                v,
                [x, Const(np.array(axes, np.int64))] if v >= 13 else [x],
                {} if v >= 13 else {"axes": axes},
            )
    y = x[:1, :, :1]
    for v in since("Squeeze"):
        for axes in ([0], [-1], [0, -1], None):
            inputs = [y] if axes is None or v < 13 else [y, Const(np.array(axes, np.int64))]
            yield Case("Squeeze", v, inputs, {"axes": axes} if axes is not None and v < 13 else {})
    for v in since("Tile"):
        if v >= 6:
            yield Case("Tile", v, [x, Const(np.array([2, 1, 3], np.int64))])


def nd(rng: np.random.Generator) -> Cases:
    x = values(rng, np.dtype(np.float32), (3, 4, 2))
    for v in since("GatherND"):
        yield Case("GatherND", v, [x, np.array([[0, -1], [-3, 2]], np.int64)])
        yield Case("GatherND", v, [x, np.array([[[1]], [[-1]]], np.int64)])
        if v >= 12:
            yield Case("GatherND", v, [x, np.array([[1, -1], [0, 0], [-1, 1]], np.int64)], {"batch_dims": 1})
        for bad in ([[3, 0]], [[0, -5]]):
            yield Case("GatherND", v, [x, np.array(bad, np.int64)], note="out of range")
    for v in since("ScatterND"):
        reductions = ["none"] + (["add", "mul"] if v >= 16 else []) + (["max", "min"] if v >= 18 else [])
        for reduction in reductions:
            attrs = {"reduction": reduction} if reduction != "none" else {}
            idx = np.array([[0, -1], [2, 1]], np.int64)
            # No NaN for max and min: cellgraph's tensor_scatter_reduce (a dataflow kernel) skips a NaN
            # where NumPy's maximum.at and ONNX Runtime keep it (reported, not this sweep's file).
            nan = reduction not in ("max", "min")
            updates = [values(rng, np.dtype(np.float32), shape, special=nan) for shape in ((2, 2), (1, 4, 2))]
            data = x if nan else np.nan_to_num(x)
            yield Case("ScatterND", v, [data, idx, updates[0]], attrs)
            yield Case("ScatterND", v, [data, np.array([[-1]], np.int64), updates[1]], attrs)
            yield Case("ScatterND", v, [data, np.array([[3]], np.int64), updates[1]], attrs, note="out of range")


def matmul(rng: np.random.Generator) -> Cases:
    for v in since("MatMul"):
        for dtype in allowed("MatMul", v, "T"):
            for sa, sb in (((2, 3), (3, 4)), ((3,), (3, 2)), ((2, 3), (3,)), ((2, 1, 2, 3), (4, 3, 2)), ((3,), (3,)),
                           ((0, 3), (3, 2))):  # fmt: skip
                a = values(rng, dtype, sa, special=False, low=-3, high=3)
                yield Case(
                    "MatMul", v, [a, values(rng, dtype, sb, special=False, low=-3, high=3)], **tolerance(dtype, 4e-6)
                )
    for v in since("Gemm"):
        for dtype in allowed("Gemm", v, "T"):
            a = values(rng, dtype, (3, 2), special=False, low=-3, high=3)
            b = values(rng, dtype, (4, 3), special=False, low=-3, high=3)
            for c_shape in ((4,), (2, 1), (), None):
                c = None if c_shape is None else values(rng, dtype, c_shape, special=False, low=-3, high=3)
                attrs = (
                    {"transA": 1, "transB": 1, "alpha": 2.0, "beta": 0.5}
                    if dtype in FLOATS
                    else {"transA": 1, "transB": 1}
                )
                if c_shape is not None and dtype in FLOATS:  # beta = 0: C unread, its inf and NaN too
                    edges = np.full(c_shape, np.inf, dtype)
                    edges.reshape(-1)[:1] = np.nan
                    yield Case("Gemm", v, [a, b, edges], {"beta": 0.0}, **tolerance(dtype, 4e-6))
                if c_shape is None or v >= 7:
                    yield Case("Gemm", v, [a, b] + ([] if c is None else [c]), attrs, **tolerance(dtype, 4e-6))


def empties(rng: np.random.Generator) -> Cases:
    """Empty inputs, empty outputs and sizes of 0 (a k of 0, repeats of 0, a split of 0), one per op."""
    x, none = values(rng, np.dtype(np.float32), (3, 4)), np.zeros((0, 3), np.float32)
    i64 = lambda *v: Const(np.array(v, np.int64))  # noqa: E731 - a table's shorthand
    yield from (
        Case("Tile", 13, [x, i64(0, 2)]),
        Case("Pad", 18, [none, i64(1, 1, 0, 0), Const(np.array(5.0, np.float32))]),
        Case("Split", 18, [x, i64(0, 3)], {"axis": 0}, outputs=2),
        Case("Slice", 13, [x, i64(0), i64(4), i64(1), i64(10)]),
        Case("Gather", 13, [x, np.zeros((0,), np.int64)], {"axis": 1}),
        Case("Concat", 13, [x, np.zeros((0, 4), np.float32)], {"axis": 0}),
        Case("CumSum", 14, [none, Const(np.array(0, np.int64))]),
        Case("TopK", 11, [x, i64(0)], outputs=2),
        Case("TopK", 11, [x, i64(4)], {"largest": 0}, outputs=2),
        Case("Trilu", 14, [x, Const(np.array(-5, np.int64))]),
        Case("Expand", 13, [np.ones((1, 3), np.float32), i64(0, 1)]),
        Case("ReduceSum", 13, [none], {"keepdims": 0}),
        Case("ReduceProd", 18, [none, i64(0)]),
        Case("ArgMax", 13, [none], {"axis": 1}),
        Case("Softmax", 13, [none]),
        Case("MatMul", 13, [np.zeros((2, 0), np.float32), np.zeros((0, 3), np.float32)]),
        Case("Gemm", 13, [np.zeros((2, 0), np.float32), np.zeros((0, 3), np.float32), np.ones((3,), np.float32)]),
        Case("Unsqueeze", 13, [np.zeros((), np.float32), i64(0)]),
        Case("Reshape", 14, [x, i64(-1, 0)]),
    )


ARRAY_FAMILIES: dict[str, Callable[[np.random.Generator], Cases]] = {
    "Gather": gather, "Slice": slice_, "Expand": expand, "Pad": pad, "CumSum": cumsum, "TopK": top_k,
    "OneHot": one_hot, "Trilu": trilu, "Split": split, "shapes": shapes, "nd": nd, "matmul": matmul,
    "empties": empties,
}  # fmt: skip
