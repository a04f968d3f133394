"""Import rows of the ONNX ops that map onto issue 16's newer cellgraph ops: CumSum
(``cg.cumsum``), TopK (``cg.top_k``) and Einsum (``cg.einsum``, its ``...`` spelled out as letters at import;
a diagonal, a label repeated within one operand, is refused).

CumSum's axis and TopK's K must be known when the graph is built (they are
attrs of cellgraph's ops). TopK along another axis than the last is moved
there and back by transposes; ``largest=0`` is the top k of an order-reversing
key (``-x`` for floats with NaN last, ``-1 - x`` or ``max - x`` for integers,
which never overflow), which keeps ONNX's tie rule (the lower index first), and
the values are gathered from ``x`` at the indices found. ``sorted=0`` leaves the
order to the runtime, and cellgraph's sorted order is one such order.

Examples
--------
>>> import numpy as np
>>> from onnx import TensorProto, helper
>>> import cellgraph as cg
>>> node = helper.make_node("CumSum", ["x", "axis"], ["y"], exclusive=1)
>>> graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
...     [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
...     [helper.make_tensor("axis", TensorProto.INT32, [], [0])])
>>> model = cg.onnx.import_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
>>> model(np.array([1.0, 2.0, 3.0], np.float32))
array([0., 1., 3.], dtype=float32)
"""

from __future__ import annotations

import string
from typing import TYPE_CHECKING

import numpy as np

import cellgraph as cg
from cellgraph.dataflow.dtypes import is_float
from cellgraph.dataflow.graph import Tensor
from cellgraph.dataflow.ops import logic
from cellgraph.dataflow.ops import math_unary as mu

from .common import ImportRow
from .import_wrappers import in_float32

if TYPE_CHECKING:
    from .importer import Builder
    from .node_info import NodeInfo


def _cumsum(b: Builder, n: NodeInfo) -> list[Tensor]:
    x = b.ins(n)[0]
    axis = int(b.static(n.inputs[1]).reshape(-1)[0])
    return [cg.cumsum(x, axis, exclusive=bool(n.attrs["exclusive"]), reverse=bool(n.attrs["reverse"]))]


def _check_cumsum(n: NodeInfo) -> str | None:
    # Its axis's range: import_limits.py.
    return "CumSum of an input whose rank is unknown until the graph runs" if n.rank(0) is None else None


def _top_k(b: Builder, n: NodeInfo) -> list[Tensor]:
    x = b.ins(n)[0]
    k = int(b.static(n.inputs[1]).reshape(-1)[0])
    rank = len(x.shape)
    axis = int(n.attrs["axis"]) % rank
    perm = [*(i for i in range(rank) if i != axis), axis]
    moved = x if axis == rank - 1 else cg.transpose(x, perm)
    if n.attrs["largest"]:
        values, indices = cg.top_k(moved, k)
    else:
        _, indices = cg.top_k(_reversed_order(moved), k)
        values = cg.gather(moved, indices, axis=rank - 1, batch_dims=rank - 1)
    indices = cg.cast(indices, "int64")
    if axis != rank - 1:
        back = [perm.index(i) for i in range(rank)]
        values, indices = cg.transpose(values, back), cg.transpose(indices, back)
    return [values, indices]


def _reversed_order(x: Tensor) -> Tensor:
    """A key whose largest are ``x``'s smallest, ties kept in place."""
    if not is_float(x.dtype):
        # ~x, as arithmetic: -1 - x (max - x unsigned) reverses the order and never overflows, where
        # -x of the lowest int does.
        top = np.iinfo(np.dtype(x.dtype)).max if x.dtype.startswith("uint") else -1
        return cg.constant(np.array(top, x.dtype), dtype=x.dtype) - x
    # NaN counted as the largest x (last among the smallest), as with largest=1 and in NumPy's order:
    # -NaN is NaN, the "largest" of -x, so NaN came first among the smallest.
    return mu.where(logic.is_nan(x), _minus_infinity(x), cg.neg(x))


def _minus_infinity(t: Tensor) -> Tensor:
    """-inf in ``t``'s shape and dtype, made when the graph runs (a constant -inf does not survive
    elementwise fusion: see import_cast._special)."""
    wide = cg.cast(cg.zeros_like(t), "float64") - 1e300
    return cg.cast(wide * 1e300, t.dtype)


def _check_top_k(n: NodeInfo) -> str | None:
    shape = n.shape(0)
    if shape is None or not shape:
        return "TopK of an input whose rank is unknown until the graph runs, or of rank 0"
    return None


def _einsum_equation(n: NodeInfo) -> str:
    """Einsum's equation with ``...`` spelled out as letters of its own (the ranks are known at import): the
    broadcast dims, aligned from the right, as NumPy and ONNX align them; an output left implicit made explicit."""
    equation = n.text("equation").replace(" ", "")
    lhs, arrow, out = equation.partition("->")
    terms = lhs.split(",")
    free = [c for c in string.ascii_letters if c not in equation]
    widest = 0
    for i, term in enumerate(terms):
        if "..." in term:
            rank = n.rank(i)
            if rank is None:
                raise ValueError(f"Einsum {equation!r}: operand {i}'s rank is unknown until the graph runs")
            widest = max(widest, rank - len(term.replace("...", "")))
    spelled = "".join(free[:widest])
    for i, term in enumerate(terms):
        if "..." in term:
            count = (n.rank(i) or 0) - len(term.replace("...", ""))
            terms[i] = term.replace("...", spelled[widest - count :])
    if not arrow:
        every = "".join(t for t in terms)
        once = sorted(c for c in set(every) if every.count(c) == 1 and c not in spelled)
        out = spelled + "".join(once)
    return ",".join(terms) + "->" + out.replace("...", spelled)


def _einsum(b: Builder, n: NodeInfo) -> list[Tensor]:
    return [cg.einsum(_einsum_equation(n), *b.ins(n))]


def _check_einsum(n: NodeInfo) -> str | None:
    try:
        equation = _einsum_equation(n)
    except ValueError as err:
        return str(err)
    terms = equation.partition("->")[0].split(",")
    sizes: dict[str, int | None] = {}
    for i, term in enumerate(terms):
        shape = n.shape(i)
        if shape is None or len(shape) != len(term):
            return f"Einsum {n.text('equation')!r}: operand {i} has rank {None if shape is None else len(shape)}"
        for label, size in zip(term, shape, strict=True):
            if term.count(label) > 1:
                return f"Einsum {n.text('equation')!r}: a label repeats in operand {i} (a diagonal or trace)"
            seen = sizes.setdefault(label, size)
            if seen is not None and size is not None and seen != size:
                return f"Einsum {n.text('equation')!r}: sizes {seen} and {size} of one axis (broadcast dims)"
    return None


MORE: dict[str, ImportRow] = {
    "CumSum": ImportRow(_cumsum, {"exclusive": 0, "reverse": 0}, (1,), _check_cumsum),
    "TopK":   ImportRow(_top_k, {"axis": -1, "largest": 1, "sorted": 1}, (1,), _check_top_k, since=10),
    "Einsum": ImportRow(in_float32(_einsum), {"equation": ""}, check=_check_einsum, since=12),
}  # fmt: skip
