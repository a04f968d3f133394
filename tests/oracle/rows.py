"""The oracle table: one row per differentiable op (or per interesting attr set).

A row builds the op in cellgraph from one tensor per input, and says the same
math in PyTorch. Input shapes may name dims (``"n"``, ``"a"``, ...): the row
then runs with those dims static and as ``None`` in the placeholders, fed at
every size in :meth:`Row.size_sets` (the defaults, all 1, and the row's own
variants: one side 1 and the other n, size 0, ...). ``test_ops.py`` compares
the outputs and the gradients of ``sum(output * random weights)`` for every
float input with torch's autograd, in float64.

Importable without PyTorch, so that ``test_coverage.py`` always runs.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import cellgraph as cg
from cellgraph.dataflow.ops import array, array_gather, array_slice, conv, nn
from cellgraph.dataflow.ops import math as cgmath

try:
    import torch

    from . import torch_math as tm
except ImportError:  # the comparisons skip (test_ops.py); the table still loads
    torch = tm = None  # type: ignore[assignment]

N = 3  # a named dim's size unless the row says otherwise
Dim = int | str


@dataclass(frozen=True)
class In:
    """One input: its shape (ints, or names of dims), and how to draw its values."""

    shape: tuple[Dim, ...]
    kind: str = "float"  # "float" (uniform in [low, high)), "int" (in [0, high)), "fixed"
    low: float = -1.0
    high: float = 1.0
    dtype: str = "float64"
    value: Any = None

    def make(self, rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
        if self.kind == "fixed":
            return np.array(self.value)
        if self.kind == "int":
            return rng.integers(0, int(self.high), shape).astype(self.dtype)
        return rng.uniform(self.low, self.high, shape).astype(self.dtype)

    @property
    def is_float(self) -> bool:
        return np.dtype(self.dtype if self.kind != "fixed" else np.asarray(self.value).dtype).kind == "f"


def x(*shape: Dim, low: float = -1.0, high: float = 1.0) -> In:
    return In(tuple(shape), low=low, high=high)


def pos(*shape: Dim) -> In:
    """Positive values away from 0: bases of log, sqrt, pow and denominators."""
    return In(tuple(shape), low=0.5, high=2.0)


def ints(*shape: Dim, high: int, dtype: str = "int32") -> In:
    return In(tuple(shape), kind="int", high=high, dtype=dtype)


def fixed(value: Any) -> In:
    value = np.asarray(value)
    return In(value.shape, kind="fixed", dtype=value.dtype.name, value=value)


@dataclass
class Row:
    """One op, built in cellgraph and said again in PyTorch."""

    op: str
    build: Callable[..., Any]  # cellgraph tensors -> tensor, or a tuple of them
    torch: Callable[..., Any]  # torch tensors (ints too) -> tensor, or a tuple of them
    inputs: list[In]
    id: str = ""
    sizes: dict[str, int] = field(default_factory=dict)  # named dims' default sizes (else N)
    variants: tuple[dict[str, int], ...] = ()  # further sizes, over the defaults
    unit: bool = True  # also run with every named dim 1
    variables: tuple[int, ...] = ()  # inputs that are float64 variables rather than placeholders
    # The last ``aux`` outputs are not compared: they go to ``torch`` as arrays
    # after the inputs (Dropout's mask, drawn by cellgraph).
    aux: int = 0
    rtol: float = 1e-9
    atol: float = 1e-10

    @property
    def label(self) -> str:
        return f"{self.op}-{self.id}" if self.id else self.op

    @property
    def names(self) -> list[str]:
        """The named dims, in order of first use."""
        seen: dict[str, None] = {}
        for spec in self.inputs:
            for d in spec.shape:
                if isinstance(d, str):
                    seen.setdefault(d)
        return list(seen)

    def size_sets(self) -> list[tuple[str, dict[str, int]]]:
        """(label, sizes) for each size assignment the row runs with."""
        names = self.names
        if not names:
            return [("static", {})]
        base = {d: self.sizes.get(d, N) for d in names}
        sets = [("n", base)]
        if self.unit:
            sets.append(("1", dict.fromkeys(names, 1)))
        for v in self.variants:
            sets.append(("-".join(f"{k}{s}" for k, s in v.items()), {**base, **v}))
        return sets


def concrete(shape: tuple[Dim, ...], sizes: dict[str, int]) -> tuple[int, ...]:
    return tuple(sizes[d] if isinstance(d, str) else d for d in shape)


def static(shape: tuple[Dim, ...], sizes: dict[str, int], dynamic: bool) -> tuple[int | None, ...]:
    """The placeholder's shape: named dims None when ``dynamic``, else their size."""
    return tuple((None if dynamic else sizes[d]) if isinstance(d, str) else d for d in shape)


def build(
    row: Row, arrays: list[np.ndarray], sizes: dict[str, int], dynamic: bool
) -> tuple[cg.Graph, list[cg.Tensor], tuple[cg.Tensor, ...]]:
    """The row's graph: a placeholder per input (a variable holding it for ``row.variables``)."""
    g = cg.Graph()
    with g.as_default():
        tensors = []
        for i, (spec, a) in enumerate(zip(row.inputs, arrays)):
            if i in row.variables:
                tensors.append(cg.variable(a, dtype=a.dtype.name, name=f"v{i}"))
            else:
                tensors.append(cg.placeholder(static(spec.shape, sizes, dynamic), a.dtype.name, name=f"in{i}"))
        out = row.build(*tensors)
    assert any(n.op == row.op for n in g.nodes), f"{row.label}: the graph has no {row.op} node"
    return g, tensors, tuple(out) if isinstance(out, (tuple, list)) else (out,)


# ------------------------------------------------------------------ helpers
ZERO = ({"n": 0},)
# Binary broadcasting: a is (a, c), b is (b, d); one side 1 and the other n
# along a None dim, both sides empty, and 1 against 0.
BROADCAST: dict[str, Any] = {
    "sizes": {"a": 3, "b": 3, "c": 4, "d": 4},
    "variants": ({"a": 1}, {"b": 1}, {"c": 1}, {"a": 1, "d": 1}, {"a": 0, "b": 0}, {"a": 1, "b": 0}),
}
IDS = np.array([2, 0, 2, 1], np.int32)  # a repeated index: the gradient must sum


def _binary(op: str, cg_fn: Any, torch_fn: Any, left: Any = x, right: Any = x) -> list[Row]:
    """A binary elementwise op: the broadcasting rows, against a (4,) row and a scalar."""
    return [
        Row(op, cg_fn, torch_fn, [left("a", "c"), right("b", "d")], id="broadcast", **BROADCAST),
        Row(op, cg_fn, torch_fn, [left("n", 4), right(4)], id="row", variants=ZERO),
        Row(op, cg_fn, torch_fn, [left("n", 4), right()], id="scalar", variants=ZERO),
        Row(op, cg_fn, torch_fn, [left(), right("n", 3)], id="scalar-left"),
    ]


def _unary(op: str, cg_fn: Any, torch_fn: Any, make: Any = x, **kw: Any) -> Row:
    return Row(op, cg_fn, torch_fn, [make("n", "c", **kw)], sizes={"c": 4}, variants=ZERO)


def _ss(id_: str, key: tuple[Any, ...], *shape: Dim, **kw: Any) -> Row:
    """StridedSlice ``x[key]`` (Python indexing); torch indexes by index tensors
    since its slices cannot step backwards."""
    return Row("StridedSlice", lambda t: t[key], lambda t: tm.basic_index(t, key), [x(*shape)], id=id_, **kw)


def _ss_grad(id_: str, key: tuple[Any, ...], g: In, like: In, **kw: Any) -> Row:
    return Row(
        "StridedSliceGrad",
        lambda a, b: array_slice._strided_slice_grad(a, b, b[key].node.attrs),
        lambda a, b: tm.basic_index_adjoint(a, b, key),
        [g, like],
        id=id_,
        **kw,
    )


def _conv(id_: str, xs: In, fs: In, strides: Any = (1, 1), padding: str = "SAME", **kw: Any) -> Row:
    hw = tuple(strides[1:3]) if len(strides) == 4 else tuple(strides)
    return Row(
        "Conv2D",
        lambda a, f: cg.conv2d(a, f, strides, padding),
        lambda a, f: tm.conv2d(a, f, hw, padding),
        [xs, fs],
        id=id_,
        **kw,
    )


def _pool(op: str, id_: str, inputs: list[In], k: Any, s: Any, padding: str, **kw: Any) -> Row:
    cg_fns = {
        "MaxPool": lambda a: cg.max_pool(a, k, s, padding),
        "AvgPool": lambda a: cg.avg_pool(a, k, s, padding),
        "MaxPoolGrad": lambda a, b: conv.max_pool_grad(a, b, k, s, padding),
        "MaxPoolGradGrad": lambda a, b: conv.max_pool_grad_grad(a, b, k, s, padding),
        "AvgPoolGrad": lambda a, b: conv.avg_pool_grad(a, b, k, s, padding),
    }
    kk, ss = (k, k) if isinstance(k, int) else k, (s, s) if isinstance(s, int) else s
    torch_fns = {
        "MaxPool": lambda a: tm.max_pool(a, kk, ss, padding),
        "AvgPool": lambda a: tm.avg_pool(a, kk, ss, padding),
        "MaxPoolGrad": lambda a, b: tm.max_pool_grad(a, b, kk, ss, padding),
        "MaxPoolGradGrad": lambda a, b: tm.max_pool_grad_grad(a, b, kk, ss, padding),
        "AvgPoolGrad": lambda a, b: tm.avg_pool_grad(a, b, kk, ss, padding),
    }
    return Row(op, cg_fns[op], torch_fns[op], inputs, id=id_, **kw)


def _second(t: cg.Tensor) -> cg.Tensor:
    return t.node.output(1)


def _both(t: cg.Tensor) -> tuple[cg.Tensor, cg.Tensor]:
    return t.node.output(0), t.node.output(1)


def _dropout_torch(t: Any, mask: np.ndarray, rate: float) -> Any:
    """``x * mask``, with the mask cellgraph drew in the same run: each element 0 or 1 / (1 - rate)."""
    kept = np.isclose(mask, 1 / (1 - rate), rtol=1e-12, atol=0)
    assert np.all(kept | (mask == 0)), f"dropout mask holds values other than 0 and {1 / (1 - rate)}"
    return t * torch.from_numpy(mask)


def _amax(t: Any, dim: int) -> Any:
    """torch.amax, and over an empty axis the identity of max, -inf (TensorFlow's, ONNX's, cellgraph's)."""
    if t.shape[dim]:
        return t.amax(dim)
    return t.sum(dim) - math.inf  # -inf shaped as the result, still attached to t


TAILS = np.array([-60.0, -35.0, -20.0, -5.0, -0.5, 0.5, 5.0, 20.0, 35.0, 60.0])
CONST = np.array([0.1, -1.5, 1 / 3])

# ------------------------------------------------------------------- the table
ROWS: list[Row] = [
    # ------------------------------------------------------------ math: binary
    *_binary("Add",     lambda a, b: a + b,            lambda a, b: a + b),
    *_binary("Sub",     lambda a, b: a - b,            lambda a, b: a - b),
    *_binary("Mul",     lambda a, b: a * b,            lambda a, b: a * b),
    *_binary("Div",     lambda a, b: a / b,            lambda a, b: a / b,                 right=pos),
    *_binary("Pow",     lambda a, b: cg.pow(a, b),     lambda a, b: torch.pow(a, b),       left=pos),
    *_binary("Maximum", lambda a, b: cg.maximum(a, b), lambda a, b: torch.maximum(a, b)),
    *_binary("Minimum", lambda a, b: cg.minimum(a, b), lambda a, b: torch.minimum(a, b)),
    # Python and NumPy operands take the tensor's dtype: 0.1 and CONST stay float64.
    Row("Mul", lambda a: a * 0.1, lambda a: a * 0.1, [x("n", 4)], id="python-float", variants=ZERO),
    Row("Sub", lambda a: 0.1 - a, lambda a: 0.1 - a, [x("n", 4)], id="python-float-left"),
    Row("Mul", lambda a: a * CONST, lambda a: a * torch.from_numpy(CONST), [x("n", 3)], id="numpy-operand",
        variants=ZERO),
    Row("Sub", lambda a: CONST - a, lambda a: torch.from_numpy(CONST) - a, [x("n", 3)], id="numpy-operand-left"),
    Row("Add", lambda a: a + [0.1, 0.2, 0.3], lambda a: a + torch.tensor([0.1, 0.2, 0.3], dtype=torch.float64),
        [x("n", 3)], id="list-operand"),
    Row("Add", lambda a, b: a + b, lambda a, b: a + b, [x("a", 1), x(1, "d")], id="outer",
        sizes={"d": 4}, variants=({"a": 1}, {"a": 0})),
    # ------------------------------------------------------------- math: unary
    _unary("Neg",    lambda a: -a,           lambda a: -a),
    _unary("Square", lambda a: cg.square(a), lambda a: torch.square(a)),
    _unary("Sqrt",   lambda a: cg.sqrt(a),   lambda a: torch.sqrt(a),   make=pos),
    _unary("Exp",    lambda a: cg.exp(a),    lambda a: torch.exp(a),    low=-3.0, high=3.0),
    _unary("Log",    lambda a: cg.log(a),    lambda a: torch.log(a),    make=pos),
    Row("Cast", lambda a: cg.cast(cg.cast(a, "float32"), "float64"), lambda a: a.float().double(),
        [x("n", 4)], id="float32-roundtrip", variants=ZERO),
    Row("Cast", lambda a: cg.cast(a, "float64"), lambda a: a, [x("n", 4)], id="to-float64"),
    # ------------------------------------------------------------ math: matmul
    Row("MatMul", lambda a, b: a @ b, lambda a, b: a @ b, [x("n", "k"), x("k", 3)],
        sizes={"k": 5}, variants=({"n": 0}, {"k": 0})),
    Row("MatMul", lambda a, b: cg.matmul(a, b, transpose_a=True), lambda a, b: a.T @ b,
        [x("k", "n"), x("k", 2)], id="ta", sizes={"k": 5}, variants=({"k": 0},)),
    Row("MatMul", lambda a, b: cg.matmul(a, b, transpose_b=True), lambda a, b: a @ b.T,
        [x("n", "k"), x(2, "k")], id="tb", sizes={"k": 5}, variants=({"n": 0},)),
    Row("MatMul", lambda a, b: cg.matmul(a, b, transpose_a=True, transpose_b=True), lambda a, b: a.T @ b.T,
        [x("k", "n"), x(2, "k")], id="ta-tb", sizes={"k": 5}),
    # -------------------------------------------------------- math: reductions
    Row("ReduceSum", lambda a: cg.reduce_sum(a), lambda a: a.sum(), [x("n", 3, "c")], id="all", variants=ZERO),
    Row("ReduceSum", lambda a: cg.reduce_sum(a, 1, keepdims=True), lambda a: a.sum(1, keepdim=True),
        [x("n", 3, "c")], id="axis1-keep", variants=ZERO),
    Row("ReduceSum", lambda a: cg.reduce_sum(a, (0, 2)), lambda a: a.sum((0, 2)), [x("n", 3, "c")],
        id="axes02", variants=ZERO),
    Row("ReduceSum", lambda a: cg.reduce_sum(a, 0, keepdims=True), lambda a: a.sum(0, keepdim=True),
        [x("n", 4)], id="batch-keep", variants=ZERO),
    Row("ReduceSum", lambda a: cg.reduce_sum(a, -1), lambda a: a.sum(-1), [x("n", "c")], id="last",
        variants=({"c": 0},)),
    Row("ReduceMean", lambda a: cg.reduce_mean(a, 0), lambda a: a.mean(0), [x("n", 3)], id="axis0", variants=ZERO),
    Row("ReduceMean", lambda a: cg.reduce_mean(a, -1, keepdims=True), lambda a: a.mean(-1, keepdim=True),
        [x("n", 3)], id="last-keep", variants=ZERO),
    Row("ReduceMean", lambda a: cg.reduce_mean(a), lambda a: a.mean(), [x("n", 2, "c")], id="all"),
    Row("ReduceMax", lambda a: cg.reduce_max(a, 1), lambda a: a.amax(1), [x("n", 6)], variants=ZERO),
    Row("ReduceMax", lambda a: cg.reduce_max(a, 0, keepdims=True), lambda a: a.amax(0, keepdim=True),
        [x("n", "c")], id="batch-keep", sizes={"n": 4}),
    Row("ReduceMax", lambda a: cg.reduce_max(a), lambda a: a.amax(), [x("n", 3)], id="all"),
    Row("ReduceMax", lambda a: cg.reduce_max(a, 0), lambda a: _amax(a, 0), [x("n", 3)], id="batch", variants=ZERO),
    # ------------------------------------------------ math: autodiff plumbing
    Row("BroadcastLike", lambda g, like: cgmath.broadcast_like(g, like, (1,), keepdims=False),
        lambda g, like: tm.broadcast_like(g, like, (1,), keepdims=False), [x("n"), x("n", 4)], variants=ZERO),
    Row("BroadcastLike", lambda g, like: cgmath.broadcast_like(g, like, (0,), mean=True),
        lambda g, like: tm.broadcast_like(g, like, (0,), mean=True), [x(1, 4), x("n", 4)], id="mean", variants=ZERO),
    Row("BroadcastLike", lambda g, like: cgmath.broadcast_like(g, like),
        lambda g, like: tm.broadcast_like(g, like, ()), [x("a", 4), x("b", 4)], id="a-to-b",
        variants=({"a": 1, "b": 5}, {"a": 1, "b": 0})),
    Row("SumToShapeOf", lambda g, like: cgmath.sum_to_shape_of(g, like), lambda g, like: tm.sum_to(g, like.shape),
        [x("n", 4), x(4)], variants=ZERO),
    Row("SumToShapeOf", lambda g, like: cgmath.sum_to_shape_of(g, like), lambda g, like: tm.sum_to(g, like.shape),
        [x("n", 4), x("a", 4)], id="batch", variants=({"a": 1}, {"a": 1, "n": 5}, {"a": 1, "n": 0})),
    Row("SumToShapeOf", lambda g, like: cgmath.sum_to_shape_of(g, like), lambda g, like: tm.sum_to(g, like.shape),
        [x("n", 4), x()], id="scalar", variants=ZERO),
    # ---------------------------------------------------------------- array
    Row("Reshape", lambda a: cg.reshape(a, (4, -1)), lambda a: a.reshape(4, -1), [x(2, 3, 4)]),
    Row("Reshape", lambda a: cg.reshape(a, (-1, 12)), lambda a: a.reshape(-1, 12), [x("n", 3, 4)],
        id="unknown-batch", variants=ZERO),
    Row("Reshape", lambda a: cg.reshape(a, (None, 2, 2)), lambda a: a.reshape(-1, 2, 2), [x(2, "m", 4)],
        id="none-as-minus-one"),
    Row("Reshape", lambda a: cg.reshape(a, ()), lambda a: a.reshape(()), [x(1, 1)], id="to-scalar"),
    Row("ReshapeLike", lambda a, like: array.reshape_like(a, like), lambda a, like: a.reshape(like.shape),
        [x("n", 12), x("n", 3, 4)], variants=ZERO),
    Row("ExpandDims", lambda a: cg.expand_dims(a, 1), lambda a: a.unsqueeze(1), [x("n", 3, 4)], variants=ZERO),
    Row("ExpandDims", lambda a: cg.expand_dims(a, -1), lambda a: a.unsqueeze(-1), [x("n", 3)], id="last"),
    Row("ExpandDims", lambda a: cg.expand_dims(a, (0, 2)), lambda a: a.unsqueeze(0).unsqueeze(2), [x("c")],
        id="two-axes"),
    Row("Squeeze", lambda a: cg.squeeze(a, 1), lambda a: a.squeeze(1), [x("n", 1, 4)], variants=ZERO),
    Row("Squeeze", lambda a: cg.squeeze(a), lambda a: a.squeeze(), [x(1, 3, 1)], id="all"),
    Row("Squeeze", lambda a: cg.squeeze(a, -1), lambda a: a.squeeze(-1), [x("n", "one")], id="unknown-dims",
        sizes={"n": 5, "one": 1}),
    Row("Transpose", lambda a: cg.transpose(a), lambda a: a.permute(2, 1, 0), [x("n", 3, 4)], id="reverse",
        variants=ZERO),
    Row("Transpose", lambda a: cg.transpose(a, (0, 2, 1)), lambda a: a.permute(0, 2, 1), [x("n", 3, "c")],
        id="021"),
    Row("Transpose", lambda a: cg.transpose(a, (0, 3, 1, 2)), lambda a: a.permute(0, 3, 1, 2),
        [x("n", 3, 2, 5)], id="nhwc-to-nchw"),
    Row("Concat", lambda a, b, c: cg.concat([a, b, c], 1), lambda a, b, c: torch.cat([a, b, c], 1),
        [x("n", 1), x("n", 3), x("n", 2)], variants=ZERO),
    Row("Concat", lambda a, b, c, d: cg.concat([a, b, c, d], 3), lambda a, b, c, d: torch.cat([a, b, c, d], 3),
        [x("n", 2, 2, 3), x("n", 2, 2, 3), x("n", 2, 2, 3), x("n", 2, 2, 1)], id="nhwc-channels"),
    Row("Concat", lambda a, b: cg.concat([a, b], 0), lambda a, b: torch.cat([a, b], 0), [x("a", 3), x("b", 3)],
        id="axis0", variants=({"a": 0}, {"a": 1, "b": 4})),
    Row("Concat", lambda a, b: cg.concat([a, b], -1), lambda a, b: torch.cat([a, b], -1), [x(3, "c"), x(3, "d")],
        id="negative-axis", variants=({"c": 0},)),
    Row("Concat", lambda a: cg.concat([a], 0), lambda a: torch.cat([a], 0), [x("n", 2)], id="one-input"),
    Row("SplitLike", lambda g, a, b: tuple(array._split_like(g, [a, b], 1)),
        lambda g, a, b: torch.split(g, [a.shape[1], b.shape[1]], 1), [x("n", 5), x("n", 2), x("n", 3)],
        variants=ZERO),
    Row("SplitLike", lambda g, a, b: tuple(array._split_like(g, [a, b], 0)),
        lambda g, a, b: torch.split(g, [a.shape[0], b.shape[0]], 0), [x(5, 2), x("a", 2), x("b", 2)],
        id="axis0", sizes={"a": 2, "b": 3}, unit=False, variants=({"a": 0, "b": 5}, {"a": 5, "b": 0})),
    Row("SplitLike", lambda g, a, b: array._split_like(g, [a, b], 1)[1],
        lambda g, a, b: torch.split(g, [a.shape[1], b.shape[1]], 1)[1], [x("n", 5), x("n", 2), x("n", 3)],
        id="second-piece"),
    Row("Slice", lambda a: cg.slice(a, (0, 1, 1), (2, 2, 3)), lambda a: a[0:2, 1:3, 1:4], [x(2, 3, 4)]),
    Row("Slice", lambda a: cg.slice(a, (1, 0, 2), (-1, 3, -1)), lambda a: a[1:, 0:3, 2:], [x("n", 3, 4)],
        id="size-minus-one"),
    Row("Slice", lambda a: cg.slice(a, (1, 1, 0), (-1, 2, 2)), lambda a: a[1:, 1:3, 0:2], [x("n", 3, "c")],
        id="unknown-dims", sizes={"c": 4}, unit=False, variants=({"n": 1},)),
    Row("Pad", lambda a: cg.pad(a, ((1, 0), (0, 2))), lambda a: tm.pad(a, ((1, 0), (0, 2))), [x("n", 3)],
        variants=ZERO),
    Row("Pad", lambda a: cg.pad(a, ((0, 0), (1, 1), (2, 0)), constant_values=-1.5),
        lambda a: tm.pad(a, ((0, 0), (1, 1), (2, 0)), -1.5), [x("n", 3, 4)], id="constant", variants=ZERO),
    _ss("int", (1,), 2, 3, 4),
    _ss("negative-int", (-1, slice(None), 2), 2, 3, 4),
    _ss("step", (slice(None), slice(1, None), slice(None, None, 2)), "n", 3, 4, variants=ZERO),
    _ss("negative-step", (slice(None), slice(None, None, -1), slice(-1, 0, -2)), "n", 3, 4, variants=ZERO),
    _ss("ellipsis-newaxis", (Ellipsis, None, slice(1, 3)), "n", 3, 4),
    _ss("newaxis-first-numpy-int", (None, 0, Ellipsis, np.int64(1)), 2, 3, 4),
    _ss("unknown-batch", (slice(None), slice(-2, None)), "n", 3, 4),
    _ss("slice-unknown-dim", (slice(1, -1),), "n", 2, sizes={"n": 6}, variants=ZERO),
    _ss("to-scalar", (3,), 5),
    _ss("ellipsis-only", (Ellipsis,), "n", 3, 4),
    _ss("empty", (slice(5, 1),), 2, 3, 4),
    _ss_grad("", (slice(1, None), slice(None, None, -2)), x(1, 2), x(2, 4)),
    _ss_grad("unknown-batch", (slice(None), slice(None, None, -2)), x("n", 2), x("n", 4), variants=ZERO),
    _ss_grad("int-newaxis", (0, None, slice(1, 3)), x(1, 2), x("n", 4)),
    Row("Gather", lambda p, i: cg.gather(p, i), lambda p, i: tm.gather(p, i, 0), [x(3, 4), fixed(IDS)]),
    Row("Gather", lambda p, i: cg.gather(p, i, axis=1), lambda p, i: tm.gather(p, i, 1),
        [x("n", 3, 4), ints("k", high=3)], id="axis1", sizes={"k": 5}, variants=({"k": 0}, {"n": 0})),
    Row("Gather", lambda p, i: cg.gather(p, i, axis=-1), lambda p, i: tm.gather(p, i, 2),
        [x(2, 3, 4), ints(2, 2, high=4, dtype="int64")], id="2d-int64-indices"),
    Row("Gather", lambda p, i: cg.gather(p, i), lambda p, i: tm.gather(p, i, 0),
        [x(3), fixed(np.array(2, np.int32))], id="scalar-index"),
    Row("ScatterAddLike", lambda u, i, like: array_gather._scatter_add_like(u, i, like, 0),
        lambda u, i, like: tm.scatter_add(u, i, like, 0), [x(4, 2), fixed(IDS), x(3, 2)]),
    Row("ScatterAddLike", lambda u, i, like: array_gather._scatter_add_like(u, i, like, 1),
        lambda u, i, like: tm.scatter_add(u, i, like, 1), [x("n", 4, 4), fixed(IDS), x("n", 3, 4)], id="axis1",
        variants=ZERO),
    # -------------------------------------------------------------------- nn
    _unary("Relu",    lambda a: cg.relu(a),    lambda a: torch.relu(a)),
    Row("Relu", lambda a: cg.relu(a), lambda a: torch.relu(a), [x()], id="rank0"),
    _unary("Sigmoid", lambda a: cg.sigmoid(a), lambda a: torch.sigmoid(a), low=-4.0, high=4.0),
    # Relative accuracy in the tails: 1e-26 is not 0 in float64.
    Row("Sigmoid", lambda a: cg.sigmoid(a), lambda a: torch.sigmoid(a), [fixed(TAILS)], id="tails", atol=0.0),
    _unary("Tanh",    lambda a: cg.tanh(a),    lambda a: torch.tanh(a), low=-2.0, high=2.0),
    Row("Tanh", lambda a: cg.tanh(a), lambda a: torch.tanh(a), [fixed(TAILS / 4)], id="tails", atol=0.0),
    # A rank-0 input broadcast against a batch: its gradient is summed back to shape (), then
    # goes through the activation's gradient kernel.
    Row("Tanh", lambda s, v: cg.tanh(s) * v, lambda s, v: torch.tanh(s) * v, [x(), x("n", 4)], id="scalar-broadcast"),
    Row("Sigmoid", lambda s, v: cg.sigmoid(s) * v, lambda s, v: torch.sigmoid(s) * v, [x(), x("n", 4)],
        id="scalar-broadcast"),
    Row("Relu", lambda s, v: cg.relu(s) * v, lambda s, v: torch.relu(s) * v, [x(low=0.1), x("n", 4)],
        id="scalar-broadcast"),
    Row("ReluGrad", lambda g, y: nn.relu_grad(g, y), lambda g, y: torch.where(y > 0, g, 0.0),
        [x("n", 4), x("n", 4)], variants=ZERO),
    Row("SigmoidGrad", lambda g, y: nn.sigmoid_grad(g, y), lambda g, y: g * y * (1 - y),
        [x("n", 4), x("n", 4, low=0.05, high=0.95)], variants=ZERO),
    Row("TanhGrad", lambda g, y: nn.tanh_grad(g, y), lambda g, y: g * (1 - y * y),
        [x("n", 4), x("n", 4, low=-0.9, high=0.9)], variants=ZERO),
    Row("Softmax", lambda a: cg.softmax(a), lambda a: torch.softmax(a, -1), [x("n", "c", low=-3, high=3)],
        variants=({"n": 0}, {"c": 0})),
    Row("Softmax", lambda a: cg.softmax(a, axis=0), lambda a: torch.softmax(a, 0), [x("n", 4, low=-3, high=3)],
        id="batch-axis", variants=ZERO),
    Row("Softmax", lambda a: cg.softmax(a, axis=1), lambda a: torch.softmax(a, 1), [x("n", 3, 4)],
        id="middle-axis"),
    Row("LogSoftmax", lambda a: cg.log_softmax(a), lambda a: torch.log_softmax(a, -1),
        [x("n", "c", low=-3, high=3)], variants=({"n": 0}, {"c": 0})),
    Row("LogSoftmax", lambda a: cg.log_softmax(a, axis=1), lambda a: torch.log_softmax(a, 1), [x("n", 3, 4)],
        id="middle-axis"),
    Row("SparseSoftmaxCrossEntropyWithLogits", lambda z, y: cg.sparse_softmax_cross_entropy(z, y),
        lambda z, y: tm.sparse_xent(z, y)[0], [x("n", 5, low=-3, high=3), ints("n", high=5)], variants=ZERO),
    Row("SparseSoftmaxCrossEntropyWithLogits", lambda z, y: cg.sparse_softmax_cross_entropy(z, y),
        lambda z, y: tm.sparse_xent(z, y)[0], [x("n", 5, low=-3, high=3), ints("n", high=5, dtype="int64")],
        id="int64"),
    Row("SparseSoftmaxCrossEntropyWithLogits", lambda z, y: _both(cg.sparse_softmax_cross_entropy(z, y)),
        lambda z, y: tm.sparse_xent(z, y), [x("n", 5, low=-3, high=3), ints("n", high=5)], id="both-outputs",
        variants=ZERO),
    Row("SparseSoftmaxCrossEntropyWithLogits", lambda z, y: _second(cg.sparse_softmax_cross_entropy(z, y)),
        lambda z, y: tm.sparse_xent(z, y)[1], [x("n", 5, low=-3, high=3), ints("n", high=5)],
        id="through-backprop"),
    Row("BiasAdd", lambda a, b: cg.bias_add(a, b), lambda a, b: a + b, [x("n", 3, 4), x(4)], variants=ZERO),
    Row("BiasAdd", lambda a, b: cg.bias_add(a, b), lambda a, b: a + b, [x("n", 3, 3, 2), x(2)], id="nhwc"),
    Row("BiasAdd", lambda a, b: cg.bias_add(a, b), lambda a, b: a + b, [x("n", "c"), x("c")], id="unknown-channels",
        variants=({"n": 0}, {"c": 0})),
    Row("BiasAddGrad", lambda dy: nn.bias_add_grad(dy), lambda dy: dy.sum((0, 1)), [x("n", 3, 4)], variants=ZERO),
    Row("Dropout", lambda a: cg.dropout(a, 0.0), lambda a: a, [x("n", 4)], id="rate0", variants=ZERO),
    Row("Dropout", lambda a: _both(cg.dropout(a, 0.5, seed=3)), lambda a, mask: _dropout_torch(a, mask, 0.5),
        [x("n", 5)], id="rate-half", aux=1, sizes={"n": 4}, variants=ZERO),
    # ------------------------------------------------------------------ conv
    _conv("same", x("n", 5, 5, 3), x(3, 3, 3, 4), variants=ZERO),
    _conv("valid", x("n", 6, 5, 2), x(3, 2, 2, 3), padding="VALID"),
    _conv("same-stride2", x("n", 6, 7, 2), x(3, 3, 2, 3), strides=(2, 2)),
    _conv("valid-stride21", x("n", 7, 5, 2), x(2, 3, 2, 2), strides=(2, 1), padding="VALID"),
    _conv("1x1-stride2", x(2, 4, 4, 3), x(1, 1, 3, 2), strides=(1, 2, 2, 1)),
    _conv("unknown-spatial", x("n", "h", "w", 3), x(3, 3, 3, 2), sizes={"n": 2, "h": 5, "w": 4},
          variants=({"h": 2, "w": 7},)),
    Row("Conv2DBackpropInput", lambda a, f, dy: cg.conv2d_backprop_input(a, f, dy),
        lambda a, f, dy: tm.conv2d_backprop_input(a, f, dy), [x("n", 5, 5, 3), x(3, 3, 3, 4), x("n", 5, 5, 4)],
        id="same", variants=ZERO),
    Row("Conv2DBackpropInput", lambda a, f, dy: cg.conv2d_backprop_input(a, f, dy, strides=2, padding="VALID"),
        lambda a, f, dy: tm.conv2d_backprop_input(a, f, dy, (2, 2), "VALID"),
        [x(2, 7, 6, 2), x(3, 2, 2, 3), x(2, 3, 3, 3)], id="valid-stride2"),
    Row("Conv2DBackpropFilter", lambda a, f, dy: cg.conv2d_backprop_filter(a, f, dy),
        lambda a, f, dy: tm.conv2d_backprop_filter(a, f, dy), [x("n", 5, 5, 3), x(3, 3, 3, 4), x("n", 5, 5, 4)],
        id="same", variants=ZERO),
    Row("Conv2DBackpropFilter", lambda a, f, dy: cg.conv2d_backprop_filter(a, f, dy, strides=(1, 2), padding="VALID"),
        lambda a, f, dy: tm.conv2d_backprop_filter(a, f, dy, (1, 2), "VALID"),
        [x(2, 5, 6, 2), x(2, 3, 2, 3), x(2, 4, 2, 3)], id="valid-stride12"),
    _pool("MaxPool", "valid-2x2", [x("n", 4, 4, 3)], 2, 2, "VALID", variants=ZERO),
    _pool("MaxPool", "same-3x3-stride1", [x("n", 5, 5, 2)], 3, 1, "SAME"),
    _pool("MaxPool", "same-3x3-stride2-uneven-pad", [x("n", 6, 6, 2)], 3, 2, "SAME"),
    _pool("MaxPool", "valid-2x3", [x(2, 4, 7, 2)], (2, 3), (1, 2), "VALID"),
    _pool("MaxPoolGrad", "same-3x3-stride2", [x("n", 6, 6, 2), x("n", 3, 3, 2)], 3, 2, "SAME", variants=ZERO),
    _pool("MaxPoolGradGrad", "same-3x3-stride2", [x("n", 6, 6, 2), x("n", 6, 6, 2)], 3, 2, "SAME", variants=ZERO),
    _pool("AvgPool", "valid-2x2", [x("n", 4, 4, 3)], 2, 2, "VALID", variants=ZERO),
    _pool("AvgPool", "same-3x3-stride1", [x("n", 5, 5, 2)], 3, 1, "SAME"),
    _pool("AvgPool", "same-3x3-stride2-uneven-pad", [x("n", 6, 6, 2)], 3, 2, "SAME"),
    _pool("AvgPoolGrad", "same-3x3-stride2", [x("n", 6, 6, 2), x("n", 3, 3, 2)], 3, 2, "SAME", variants=ZERO),
    # ----------------------------------------------------------------- state
    Row("Identity", lambda a: cg.identity(a), lambda a: a, [x("n", 3)], variants=ZERO),
    Row("PlaceholderWithDefault", lambda a: cg.placeholder_with_default(a, (None, 3)), lambda a: a, [x("n", 3)],
        variants=ZERO),
    Row("Placeholder", lambda a: a * 1.0, lambda a: a * 1.0, [x("n", 3)], id="fed"),
    Row("Const", lambda a: a * cg.constant(CONST, dtype="float64"), lambda a: a * torch.from_numpy(CONST),
        [x("n", 3)], variants=ZERO),
    Row("Variable", lambda v, a: v * a, lambda v, a: v * a, [x(4), x("n", 4)], variables=(0,), variants=ZERO),
    Row("Variable", lambda v, a: v + a, lambda v, a: v + a, [x(1, 4), x("n", 4)], id="broadcast-row",
        variables=(0,), variants=ZERO),
    Row("Variable", lambda a, w: a @ w, lambda a, w: a @ w, [x("n", 3), x(3, 2)], id="matmul", variables=(1,),
        variants=ZERO),
]  # fmt: skip

# Differentiable ops with no row, and why (test_coverage.py reads this).
NO_ORACLE_ROW: dict[str, str] = {
    "CumprodGrad": "its gradient rule refuses (GradientError: no second derivative of cumprod); "
    "tests/dataflow/test_gradient_oracle.py asserts the words",
}

# The second set of elementwise ops has its rows in a file of its own.
from .rows_elementwise import ELEMENTWISE_ROWS  # noqa: E402
from .rows_losses import LOSS_ROWS  # noqa: E402
from .rows_nn_more import NN_MORE_ROWS  # noqa: E402
from .rows_reductions import REDUCTION_ROWS  # noqa: E402

ROWS += ELEMENTWISE_ROWS + REDUCTION_ROWS + NN_MORE_ROWS + LOSS_ROWS

from .rows_array import ARRAY_ROWS  # noqa: E402

ROWS += ARRAY_ROWS

from .rows_conv import CONV_ROWS  # noqa: E402

ROWS += CONV_ROWS

from .rows_cumulative import CUMULATIVE_ROWS  # noqa: E402

ROWS += CUMULATIVE_ROWS
