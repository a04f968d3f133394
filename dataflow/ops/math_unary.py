"""More math ops: unary functions, floor division and modulo, clip, where, stop_gradient.

``math.py`` holds the arithmetic every model needs; this file holds the rest
of what ``tf.math`` offers, as tables with the same columns: kernel,
reference, gradient (or ``not_differentiable``) and the scalar expression
that elementwise fusion uses (``None``: not fused).

Sign, Floor, Ceil and Round are piecewise constant: their gradient is 0
wherever it exists, and they return that 0 (as PyTorch does) rather than no
gradient at all, so a straight-through estimator can be built over them.
Round rounds half to even (``round(2.5) == 2``), as NumPy and TensorFlow do.
FloorDiv and FloorMod follow Python's ``//`` and ``%`` (TensorFlow's
``floordiv`` and ``floormod``): the quotient is floored, the remainder has
the divisor's sign.

Examples
--------
>>> import numpy as np
>>> import cellgraph as cg
>>> g = cg.Graph()
>>> with g.as_default():
...     x = cg.placeholder((3,), name="x")
...     y = cg.floordiv(x, 2.0), cg.mod(x, 2.0)
>>> cg.Session(g).run(list(y), {x: np.array([-3.0, 3.0, 4.0], np.float32)})
[array([-2.,  1.,  2.], dtype=float32), array([1., 1., 0.], dtype=float32)]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from math import pi, sqrt
from typing import Any

import numpy as np
from scipy import special

from ..dtypes import COMPUTE_DTYPE, FLOATS, INTS
from ..graph import Node, Tensor
from ..kernels.cpu import math_more as mk
from ..kernels.cuda import cuda_kernel
from ..opdef import InferContext, KernelContext, KernelFactory, OpDef, TensorSpec, not_differentiable, register_op
from ..shapes import broadcast, fmt
from .base import (
    TensorLike,
    apply,
    as_tensor,
    binary_inputs,
    elementwise_kernel,
    graph_of,
    infer_broadcast,
    infer_float_unary,
    infer_same,
)
from .logic import logical_and, logical_not, logical_or
from .math import MAX_EXPR, MIN_EXPR, exp, less, maximum, neg, zeros_like

FAMILY = "math"
Dys = list[Tensor | None]

_x = lambda n: n.inputs[0]  # noqa: E731
_y = lambda n: n.inputs[1]  # noqa: E731
_z = lambda n: n.output(0)  # noqa: E731
TWO_OVER_SQRT_PI = 2.0 / sqrt(pi)


def typed_kernel(fn: Callable[..., Any], *constants: float | str) -> KernelFactory:
    """Bind a CPU kernel that takes constants after its inputs: each a number or the
    name of an attr, given in the dtype of the node's last input (a Python float
    would turn a float32 expression into float64). Numba returns a scalar for
    rank-0 operands, so a rank-0 node's result is wrapped back into an array."""

    def factory(node: Node, ctx: KernelContext) -> Callable[..., Any]:
        # A half input reaches the kernel as float32 (kernels/storage.py): so do the constants.
        dtype = np.dtype(COMPUTE_DTYPE.get(node.inputs[-1].dtype, node.inputs[-1].dtype))
        values = [dtype.type(node.attrs[c] if isinstance(c, str) else c) for c in constants]
        out = np.dtype(node.specs[0].dtype)
        if node.specs[0].shape:
            return lambda *xs: fn(*xs, *values)
        return lambda *xs: np.asarray(fn(*xs, *values), out)

    return factory


# ------------------------------------------------------------ shape rules
def infer_signed(ctx: InferContext) -> TensorSpec:
    """Unary ops on numbers (Abs, Sign): float or int, not bool."""
    x = ctx.inputs[0]
    if x.dtype not in FLOATS | INTS:
        raise ctx.dtype_error(f"expects a float or int tensor, got {x.dtype}")
    return x


def infer_numeric_broadcast(ctx: InferContext) -> TensorSpec:
    spec = infer_broadcast(ctx)
    if spec.dtype not in FLOATS | INTS:
        raise ctx.dtype_error(f"expects float or int tensors, got {spec.dtype}")
    return spec


def broadcast_all(ctx: InferContext, specs: Sequence[TensorSpec], names: Sequence[str]) -> tuple[int | None, ...]:
    """The NumPy broadcast of several shapes, or a ShapeError naming each operand's."""
    shape: tuple[int | None, ...] | None = ()
    for spec in specs:
        shape = broadcast(shape, spec.shape) if shape is not None else None
    if shape is None:
        listed = ", ".join(f"{n} {fmt(s.shape)}" for n, s in zip(names, specs))
        raise ctx.shape_error(f"shapes do not broadcast: {listed}")
    return shape


def _infer_clip(ctx: InferContext) -> TensorSpec:
    x, low, high = ctx.inputs
    if {low.dtype, high.dtype} != {x.dtype}:
        raise ctx.dtype_error(
            f"t, clip_value_min and clip_value_max differ in dtype: {x.dtype}, {low.dtype}, {high.dtype}"
        )
    if x.dtype not in FLOATS | INTS:
        raise ctx.dtype_error(f"expects float or int tensors, got {x.dtype}")
    return TensorSpec(broadcast_all(ctx, ctx.inputs, ("t", "clip_value_min", "clip_value_max")), x.dtype)


def _infer_where(ctx: InferContext) -> TensorSpec:
    cond, a, b = ctx.inputs
    if cond.dtype != "bool":
        raise ctx.dtype_error(f"condition must be a bool tensor, got {cond.dtype}")
    if a.dtype != b.dtype:
        raise ctx.dtype_error(f"x and y have different dtypes: {a.dtype} and {b.dtype}")
    return TensorSpec(broadcast_all(ctx, ctx.inputs, ("condition", "x", "y")), a.dtype)


# --------------------------------------------------- unary, as a table
def _zero(n: Node, g: Tensor) -> list[Tensor | None]:
    return [zeros_like(g)]


# name, kernel, reference, gradient (g: upstream), fusion expression, shape rule
_UNARY: list[tuple[Any, ...]] = [
    ("Abs",   elementwise_kernel(mk.abs_),            np.abs,        lambda n, g: [g * sign(_x(n))],                       "abs({0})",              infer_signed),
    ("Sign",  elementwise_kernel(mk.sign),            np.sign,       _zero, "(1.0 if {0} > 0.0 else (-1.0 if {0} < 0.0 else {0}))",              infer_signed),
    ("Floor", elementwise_kernel(mk.floor),           np.floor,      _zero,                                                None,                    infer_float_unary),
    ("Ceil",  elementwise_kernel(mk.ceil),            np.ceil,       _zero,                                                None,                    infer_float_unary),
    ("Round", elementwise_kernel(mk.round_half_even), np.round,      _zero,                                                None,                    infer_float_unary),
    ("Sin",   elementwise_kernel(mk.sin),             np.sin,        lambda n, g: [g * cos(_x(n))],                        "math.sin({0})",         infer_float_unary),
    ("Cos",   elementwise_kernel(mk.cos),             np.cos,        lambda n, g: [neg(g * sin(_x(n)))],                   "math.cos({0})",         infer_float_unary),
    ("Tan",   elementwise_kernel(mk.tan),             np.tan,        lambda n, g: [g * (1.0 + _z(n) * _z(n))],             "math.tan({0})",         infer_float_unary),
    ("Rsqrt", typed_kernel(mk.rsqrt, 1),  lambda x: 1 / np.sqrt(x), lambda n, g: [g * _z(n) * _z(n) * _z(n) * -0.5], "(1.0 / math.sqrt({0}))", infer_float_unary),
    ("Log1p", elementwise_kernel(mk.log1p),           np.log1p,      lambda n, g: [g / (_x(n) + 1.0)],                     "math.log1p({0})",       infer_float_unary),
    ("Expm1", elementwise_kernel(mk.expm1),           np.expm1,      lambda n, g: [g * (_z(n) + 1.0)],                     "math.expm1({0})",       infer_float_unary),
    ("Erf",   elementwise_kernel(mk.erf),             special.erf,   lambda n, g: [g * TWO_OVER_SQRT_PI * exp(neg(_x(n) * _x(n)))], "math.erf({0})", infer_float_unary),
]  # fmt: skip


def _one_upstream(rule: Any) -> Any:
    return lambda node, dys: rule(node, dys[0])


for _name, _kernel, _ref, _rule, _expr, _infer in _UNARY:
    register_op(OpDef(
        name=_name, family=FAMILY, infer=_infer,
        reference=lambda attrs, x, _f=_ref: np.asarray(_f(x), x.dtype),
        grad=_one_upstream(_rule), elementwise=_expr,
        kernels={"cpu": _kernel, "cuda": cuda_kernel("elementwise", "unary_attr_op", _name)},
    ))  # fmt: skip


def abs(x: TensorLike, name: str = "abs") -> Tensor:  # noqa: A001 - TF's name
    """``|x|`` elementwise, for float and int tensors; also ``abs(tensor)``."""
    return apply("Abs", [x], name=name)


def sign(x: TensorLike, name: str = "sign") -> Tensor:
    """-1, 0 or 1 by the sign of each element (NaN stays NaN); its gradient is 0."""
    return apply("Sign", [x], name=name)


def floor(x: TensorLike, name: str = "floor") -> Tensor:
    return apply("Floor", [x], name=name)


def ceil(x: TensorLike, name: str = "ceil") -> Tensor:
    return apply("Ceil", [x], name=name)


def round(x: TensorLike, name: str = "round") -> Tensor:  # noqa: A001 - TF's name
    """Round to the nearest integer, ties to even: ``round([0.5, 1.5, 2.5]) == [0, 2, 2]``."""
    return apply("Round", [x], name=name)


def sin(x: TensorLike, name: str = "sin") -> Tensor:
    return apply("Sin", [x], name=name)


def cos(x: TensorLike, name: str = "cos") -> Tensor:
    return apply("Cos", [x], name=name)


def tan(x: TensorLike, name: str = "tan") -> Tensor:
    return apply("Tan", [x], name=name)


def rsqrt(x: TensorLike, name: str = "rsqrt") -> Tensor:
    """``1 / sqrt(x)`` elementwise."""
    return apply("Rsqrt", [x], name=name)


def log1p(x: TensorLike, name: str = "log1p") -> Tensor:
    """``log(1 + x)``, accurate for ``x`` near 0."""
    return apply("Log1p", [x], name=name)


def expm1(x: TensorLike, name: str = "expm1") -> Tensor:
    """``exp(x) - 1``, accurate for ``x`` near 0."""
    return apply("Expm1", [x], name=name)


def erf(x: TensorLike, name: str = "erf") -> Tensor:
    """The Gauss error function."""
    return apply("Erf", [x], name=name)


# ----------------------------------------------- FloorDiv, FloorMod
def _no_int_zero(fn: Callable[..., Any], what: str) -> Callable[..., Any]:
    """``fn``, refusing an int divisor that holds 0 as Python and TensorFlow do (NumPy would
    quietly give 0). A GPU kernel cannot raise: there the result is NumPy's 0.

    The most negative signed int divided by -1 traps in the CPU's division instruction
    (SIGFPE: the whole process, a notebook's kernel too, dies). Its remainder is 0, so
    modulo divides by 1 there instead; its quotient does not fit the dtype, so division
    is refused, as an integer that would wrap round is elsewhere.
    """

    def checked(a: np.ndarray, b: np.ndarray) -> Any:
        if b.dtype.kind in "iu" and not np.all(b):
            raise ZeroDivisionError(f"integer {what} by zero: the divisor holds 0")
        if b.dtype.kind == "i":
            lowest = np.iinfo(a.dtype).min
            traps = (a == lowest) & (b == -1)
            if traps.any():
                if what == "division":
                    raise OverflowError(
                        f"integer division overflows {a.dtype}: {lowest} // -1 = {-int(lowest)}, "
                        f"above the largest {a.dtype} ({np.iinfo(a.dtype).max})"
                    )
                b = np.where(traps, np.ones_like(b), b)
        return fn(a, b)

    return checked


register_op(OpDef(
    name="FloorDiv", family=FAMILY, infer=infer_numeric_broadcast,
    reference=lambda attrs, a, b: _no_int_zero(np.floor_divide, "division")(a, b),
    grad=not_differentiable, broadcasts=True,
    kernels={"cpu": elementwise_kernel(_no_int_zero(mk.floordiv, "division")),
             "cuda": cuda_kernel("elementwise", "binary_op", "FloorDiv")},
))  # fmt: skip


def _grad_floormod(node: Node, dys: Dys) -> list[Tensor | None]:
    g = dys[0]
    assert g is not None
    # x - floor(x / y) * y: d/dx = 1, d/dy = -floor(x / y).
    return [g, neg(g) * floordiv(_x(node), _y(node))]


register_op(OpDef(
    name="FloorMod", family=FAMILY, infer=infer_numeric_broadcast,
    reference=lambda attrs, a, b: _no_int_zero(np.mod, "modulo")(a, b), broadcasts=True,
    grad=_grad_floormod,
    kernels={"cpu": elementwise_kernel(_no_int_zero(mk.floormod, "modulo")),
             "cuda": cuda_kernel("elementwise", "binary_op", "FloorMod")},
))  # fmt: skip


def floordiv(a: TensorLike, b: TensorLike, name: str = "floordiv") -> Tensor:
    """``a // b``, floored as Python's (``-7 // 2 == -4``); for int and float tensors; not differentiable.

    A float divided by 0 gives ±inf or NaN; an int divided by 0 fails the run, naming the node
    (on a GPU, whose kernels cannot raise, it gives 0, as NumPy does).
    """
    return apply("FloorDiv", binary_inputs(a, b, "FloorDiv"), name=name)


def mod(a: TensorLike, b: TensorLike, name: str = "mod") -> Tensor:
    """``a % b`` with the divisor's sign, as Python's (``-7 % 2 == 1``): TensorFlow's floormod.

    An int modulo 0 fails the run as :func:`floordiv` does; a float one gives NaN.
    """
    return apply("FloorMod", binary_inputs(a, b, "FloorMod"), name=name)


floormod = mod


# ------------------------------------------------------------ ClipByValue
def _grad_clip(node: Node, dys: Dys) -> list[Tensor | None]:
    g, (x, low, high) = dys[0], node.inputs
    assert g is not None
    zero = zeros_like(g)
    # The gradient goes to whichever operand the output is: min(max(x, low), high).
    from_high = less(high, maximum(x, low))
    from_low = logical_and(less(x, low), logical_not(from_high))
    from_x = logical_not(logical_or(from_high, from_low))
    return [where(from_x, g, zero), where(from_low, g, zero), where(from_high, g, zero)]


register_op(OpDef(
    name="ClipByValue", family=FAMILY, infer=_infer_clip,
    reference=lambda attrs, x, low, high: np.minimum(np.maximum(x, low), high),
    grad=_grad_clip, broadcasts=True, elementwise=MIN_EXPR.format(MAX_EXPR.format("{0}", "{1}"), "{2}"),
    kernels={"cpu": elementwise_kernel(mk.clip), "cuda": cuda_kernel("elementwise", "ternary_op", "ClipByValue")},
))  # fmt: skip


def _like(values: Sequence[TensorLike], op: str) -> list[Tensor]:
    """Operands of one dtype: Python values take the first tensor's dtype (as ``binary_inputs``)."""
    g = graph_of(values)
    dtype = next((v.dtype for v in values if isinstance(v, Tensor)), None)
    return [as_tensor(v, dtype if not isinstance(v, Tensor) else None, g, op) for v in values]


def clip_by_value(
    t: TensorLike, clip_value_min: TensorLike, clip_value_max: TensorLike, name: str = "clip_by_value"
) -> Tensor:
    """``t`` with each element clipped into ``[clip_value_min, clip_value_max]`` (all three broadcast).

    The gradient flows to whichever operand an element's output is (``t`` where it is inside).
    """
    return apply("ClipByValue", _like([t, clip_value_min, clip_value_max], "ClipByValue"), name=name)


# ------------------------------------------------------------------ Where
def _grad_where(node: Node, dys: Dys) -> list[Tensor | None]:
    g, cond = dys[0], node.inputs[0]
    assert g is not None
    zero = zeros_like(g)
    return [None, where(cond, g, zero), where(cond, zero, g)]


register_op(OpDef(
    name="Where", strings=True, family=FAMILY, infer=_infer_where,
    reference=lambda attrs, c, a, b: np.where(c, a, b), grad=_grad_where, broadcasts=True,
    elementwise="({1} if {0} else {2})",
    kernels={"cpu": elementwise_kernel(mk.where), "cuda": cuda_kernel("elementwise", "ternary_op", "Where")},
))  # fmt: skip


def where(condition: TensorLike, x: TensorLike, y: TensorLike, name: str = "where") -> Tensor:
    """``x`` where ``condition`` is true, else ``y``; all three broadcast (NumPy's ``np.where``)."""
    g = graph_of([condition, x, y])
    cond = as_tensor(condition, None if isinstance(condition, Tensor) else "bool", g, "Where")
    a, b = binary_inputs(x, y, "Where")
    return apply("Where", [cond, a, b], name=name)


# ----------------------------------------------------------- StopGradient
_identity = lambda node, ctx: lambda x: x  # noqa: E731 - hands on the array it is given, host or device
register_op(OpDef(
    name="StopGradient", strings=True, family=FAMILY, infer=infer_same, reference=lambda attrs, x: x,
    grad=not_differentiable, view=True, kernels={"cpu": _identity, "cuda": _identity},
))  # fmt: skip


def stop_gradient(x: TensorLike, name: str = "stop_gradient") -> Tensor:
    """``x`` itself in the forward pass; no gradient flows back through it."""
    return apply("StopGradient", [x], name=name)


__all__ = [
    "abs", "ceil", "clip_by_value", "cos", "erf", "expm1", "floor", "floordiv", "floormod", "log1p", "mod",
    "round", "rsqrt", "sign", "sin", "stop_gradient", "tan", "where",
]  # fmt: skip
