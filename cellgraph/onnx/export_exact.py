"""Exported formulas that keep cellgraph's numbers where a plain ONNX translation loses them.

Expm1 and Log1p (which ONNX lacks) with Kahan's corrections near 0; Elu and Selu through that
expm1 (ONNX Runtime's Elu kernel computes exp(x) - 1); Python's floored division and modulo from
C's exact remainder; silu and tanh-gelu as ``x / (1 + exp(-z))`` (ONNX Runtime's Sigmoid is an
approximation); and the NaN test that max, min, argmax, argmin and max pools add to their float
exports. Each was a wrong number in ONNX Runtime, checked in tests/export/test_onnx_export_edges.py.

Examples
--------
>>> import numpy as np
>>> import onnxruntime as ort
>>> import cellgraph as cg
>>> from cellgraph.dataflow.ops import math_unary as mu
>>> from cellgraph.onnx.exporter import to_onnx
>>> g = cg.Graph()
>>> with g.as_default():
...     x = cg.placeholder([2], "float32", name="x")
...     y = mu.expm1(x)
>>> model = to_onnx(x, y, cg.Session(g))
>>> ort.InferenceSession(model.SerializeToString()).run(None, {"x": np.array([1e-10, 2.0], np.float32)})[0]
array([1.000000e-10, 6.389056e+00], dtype=float32)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from cellgraph.dataflow.dtypes import is_float
from cellgraph.dataflow.graph import Node
from cellgraph.dataflow.kernels.cpu.activations import GELU_CUBIC, SELU_ALPHA, SELU_SCALE, SQRT_2_OVER_PI, SQRT_HALF

from .common import DTYPE_TO_ONNX

if TYPE_CHECKING:
    from .export_ops import Row
    from .exporter import Emitter


def scalar(e: Emitter, node: Node, value: float) -> str:
    """A scalar constant of the node's first input dtype."""
    return e.const(np.array(value, np.dtype(node.inputs[0].dtype)))


# cellgraph's max, min, argmax, argmin and max pools see a NaN wherever it stands (NumPy's rule); ONNX
# leaves it open and ONNX Runtime's kernels compare past it (ReduceMax([1, NaN, 3]) is 3 there, or 1).
# Their float exports add the NaN test, so that every runtime gives cellgraph's answer.
NAN_AWARE = ("ReduceMax", "ReduceMin", "ArgMax", "ArgMin", "MaxPool")


def sees_nan(op_type: str, node: Node) -> bool:
    return op_type in NAN_AWARE and is_float(node.inputs[0].dtype)


def nan_mask(e: Emitter, node: Node, x: str) -> str:
    """1 where ``x`` is NaN, else 0, in ``x``'s dtype."""
    return e.node("Where", [e.node("IsNaN", [x])[0], scalar(e, node, 1.0), scalar(e, node, 0.0)])[0]


def positive(e: Emitter, node: Node, x: str) -> str:
    return e.node("Greater", [x, scalar(e, node, 0.0)])[0]


def expm1(e: Emitter, node: Node, x: str, out: list[str] | None = None) -> str:
    """``exp(x) - 1``, accurate near 0 (Kahan): see ``plus_one``."""
    one = scalar(e, node, 1.0)
    u = e.node("Exp", [x])[0]
    um1 = e.node("Sub", [u, one])[0]
    corrected = e.node("Div", [e.node("Mul", [um1, x])[0], e.node("Log", [u])[0]])[0]
    return near_zero(e, node, x, u, corrected, um1, out)


def near_zero(e: Emitter, node: Node, x: str, u: str, corrected: str, plain: str, out: list[str] | None) -> str:
    """``x`` where ``u`` rounds to 1, ``corrected`` elsewhere below |x| = 0.5, ``plain`` above."""
    at_one = e.node("Equal", [u, scalar(e, node, 1.0)])[0]
    near = e.node("Where", [at_one, x, corrected])[0]
    small = e.node("Less", [e.node("Abs", [x])[0], scalar(e, node, 0.5)])[0]
    return e.node("Where", [small, near, plain], out)[0]


def plus_one(op_type: str, inner_first: bool) -> Row:
    """Expm1 and Log1p, which ONNX lacks, accurate near 0 (Kahan's corrections).

    ``exp(x) - 1`` and ``log(1 + x)`` alone lose every digit there: expm1(1e-10) was 0 in float32.
    With ``u = exp(x)``, ``(u - 1) * x / log(u)`` is within a few ulps (``u = 1 + x`` and
    ``log(u) * x / (u - 1)`` for log1p), and ``x`` itself where ``u`` rounds to 1. Away from 0
    (``|x| >= 0.5``) the plain form is as accurate and has no 0 / 0.
    """

    def row(e: Emitter, node: Node) -> None:
        x = e.ins(node)[0]
        if inner_first:
            expm1(e, node, x, e.outs(node))
            return
        one = scalar(e, node, 1.0)
        u = e.node("Add", [x, one])[0]
        plain = e.node(op_type, [u])[0]
        corrected = e.node("Div", [e.node("Mul", [plain, x])[0], e.node("Sub", [u, one])[0]])[0]
        near_zero(e, node, x, u, corrected, plain, e.outs(node))

    return row


def elu(scale: float | None) -> Row:
    """Elu (``scale`` None) and Selu as ``where(x > 0, x, alpha * expm1(x)) * scale``: ONNX Runtime's
    own kernels compute exp(x) - 1, 20% off near 0 (elu(-1e-7) gave -1.2e-7)."""

    def row(e: Emitter, node: Node) -> None:
        x = e.ins(node)[0]
        alpha = float(node.attrs["alpha"]) if scale is None else SELU_ALPHA
        negative = e.node("Mul", [expm1(e, node, x), scalar(e, node, alpha)])[0]
        positive = e.node("Greater", [x, scalar(e, node, 0.0)])[0]
        if scale is None:
            e.node("Where", [positive, x, negative], e.outs(node))
            return
        y = e.node("Where", [positive, x, negative])[0]
        e.node("Mul", [y, scalar(e, node, scale)], e.outs(node))

    return row


def floor_div(e: Emitter, node: Node) -> None:
    a, b = e.ins(node)
    dtype = node.inputs[0].dtype
    if is_float(dtype):
        e.node("Floor", [e.node("Div", [a, b])[0]], e.outs(node))
        return
    # Integers, exactly: ONNX's Div truncates, one more down where the remainder is not 0 and the
    # signs differ. (Through float64 an int64 past 2**53 rounded: (2**60 + 1) // 1 gave 2**60.)
    q = e.node("Div", [a, b])[0]
    r = e.node("Mod", [a, b], fmod=1)[0]
    e.node("Sub", [q, e.node("Cast", [floor_shift(e, node, r, b)], to=DTYPE_TO_ONNX[dtype])[0]], e.outs(node))


def floor_shift(e: Emitter, node: Node, r: str, b: str) -> str:
    """Where C's remainder ``r`` of a division by ``b`` is not 0 and its sign is not ``b``'s: there the
    floored quotient is one below the truncated one, and Python's remainder is ``r + b``."""
    zero = scalar(e, node, 0.0)
    signs_differ = e.node("Xor", [e.node("Less", [r, zero])[0], e.node("Less", [b, zero])[0]])[0]
    nonzero = e.node("Not", [e.node("Equal", [r, zero])[0]])[0]
    return e.node("And", [nonzero, signs_differ])[0]


def floor_mod(e: Emitter, node: Node) -> None:
    a, b = e.ins(node)
    if is_float(node.inputs[0].dtype):
        # Python's % (the divisor's sign) as NumPy computes it: C's fmod, exact, plus b where that is
        # not 0 and its sign is not b's. (a - floor(a / b) * b rounded the quotient: 1e20 % 3 gave 0,
        # not 1, and 5 % inf NaN, not 5; ONNX's Mod reads floats with fmod=0 only from version 28.)
        r = e.node("Mod", [a, b], fmod=1)[0]
        e.node("Where", [floor_shift(e, node, r, b), e.node("Add", [r, b])[0], r], e.outs(node))
    else:
        e.node("Mod", [a, b], e.outs(node), fmod=0)


def gelu(tanh_form: bool) -> Row:
    def row(e: Emitter, node: Node) -> None:
        x = e.ins(node)[0]
        if tanh_form:
            # 0.5 x (1 + tanh(u)) is x / (1 + exp(-2u)), u = sqrt(2 / pi) (x + 0.044715 x^3): 1 + tanh(u)
            # cancels in the negative tail (gelu_tanh(-5) was 30% off in float32); the quotient does not.
            cube = e.node("Mul", [e.node("Mul", [x, x])[0], x])[0]
            inner = e.node("Add", [x, e.node("Mul", [cube, scalar(e, node, GELU_CUBIC)])[0]])[0]
            x_sigmoid(e, node, x, e.node("Mul", [inner, scalar(e, node, 2.0 * SQRT_2_OVER_PI)])[0])
            return
        # 0.5 x (1 + erf(x / sqrt(2))). Below x = -1, 1 + erf cancels: the relative error grows (4e-6
        # at -2.5, 4% at -5), the absolute one stays under 1e-7. ONNX has no erfc to avoid it (its Gelu
        # op, from opset 20, is outside the opsets exported by default, and ONNX Runtime's is 2.8e-5 off).
        t = e.node("Erf", [e.node("Mul", [x, scalar(e, node, SQRT_HALF)])[0]])[0]
        half_x = e.node("Mul", [x, scalar(e, node, 0.5)])[0]
        e.node("Mul", [half_x, e.node("Add", [t, scalar(e, node, 1.0)])[0]], e.outs(node))

    return row


def x_sigmoid(e: Emitter, node: Node, x: str, z: str) -> None:
    """``x * sigmoid(z)`` as ``x / (1 + exp(-z))``: ONNX Runtime's Sigmoid kernel is an approximation,
    1e-5 off at -5 and twice the value at -11 (silu(-5) and gelu_tanh(-5) were that far off); its
    Exp is exact to an ulp, and exp(-z) overflowing to inf gives x / inf, the -0 that is right."""
    exp = e.node("Exp", [e.node("Neg", [z])[0]])[0]
    e.node("Div", [x, e.node("Add", [exp, scalar(e, node, 1.0)])[0]], e.outs(node))


def silu(e: Emitter, node: Node) -> None:
    x = e.ins(node)[0]
    x_sigmoid(e, node, x, x)


EXACT_EXPORTERS: dict[str, Row] = {
    "Expm1":    plus_one("Exp", inner_first=True),
    "Log1p":    plus_one("Log", inner_first=False),
    "FloorDiv": floor_div,
    "FloorMod": floor_mod,
    "Elu":      elu(None),
    "Selu":     elu(SELU_SCALE),
    "Gelu":     gelu(tanh_form=False),
    "GeluTanh": gelu(tanh_form=True),
    "Silu":     silu,
}  # fmt: skip
