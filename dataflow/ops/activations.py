"""Activations beyond relu, sigmoid and tanh (those are in ``nn.py``).

One table row per op, with its gradient written over other ops (each of
them differentiable, so second derivatives work) and the scalar expression
that elementwise fusion uses; ``{alpha!r}`` in it is the node's attr.

``hard_sigmoid`` is PyTorch's (and Keras 3's): ``relu6(x + 3) / 6``, that is
``clip(x / 6 + 0.5, 0, 1)``; TensorFlow 1's Keras used ``clip(0.2 x + 0.5, 0, 1)``.
``gelu`` is exact (with ``erf``) unless ``approximate=True`` (PyTorch's
``approximate="tanh"`` is accepted too), which builds ``GeluTanh``.

Examples
--------
>>> import numpy as np
>>> import cellgraph as cg
>>> g = cg.Graph()
>>> with g.as_default():
...     x = cg.placeholder((3,), name="x")
...     y = cg.relu6(x)
>>> cg.Session(g).run(y, {x: np.array([-1.0, 2.0, 9.0], np.float32)})
array([0., 2., 6.], dtype=float32)
"""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np
from scipy import special

from ..graph import Node, Tensor
from ..kernels.cpu import activations as ak
from ..kernels.cpu.activations import GELU_CUBIC, INV_SQRT_2PI, SELU_ALPHA, SELU_SCALE, SQRT_2_OVER_PI, SQRT_HALF
from ..kernels.cuda import cuda_kernel
from ..opdef import InferContext, OpDef, TensorSpec, register_op
from ..shapes import fmt
from .base import TensorLike, apply, elementwise_kernel, fits, infer_float_unary, merge_shapes, require_float
from .logic import greater, logical_and
from .math import exp, less, minimum, square, zeros_like
from .math_unary import abs as abs_
from .math_unary import typed_kernel, where
from .nn import sigmoid, tanh

FAMILY = "nn"

_x = lambda n: n.inputs[0]  # noqa: E731
_z = lambda n: n.output(0)  # noqa: E731


def _inside(x: Tensor, low: float, high: float, g: Tensor) -> Tensor:
    """``g`` where ``low < x < high``, else 0: the slope-1 part of a clipped activation."""
    return where(logical_and(greater(x, low), less(x, high)), g, zeros_like(g))


def _exp_below_0(x: Tensor) -> Tensor:
    """``exp(min(x, 0))``: Elu's and Selu's slope over ``alpha`` for x <= 0. Not ``y + alpha``, which cancels: Elu's
    gradient at -30 was 0 in float32 (exp(-30) is 9.4e-14), Selu's at -17 2**-23 (twice the truth). The min keeps
    exp from overflowing on the side ``where`` does not take. The constant comes first: Minimum gives a tie's
    gradient to its first operand, so at x = 0 this factor's own slope is 0 and Elu's and Selu's second derivative
    there is 0, as TensorFlow's EluGradGrad (``x < 0``) and PyTorch have it, not the left branch's alpha."""
    return exp(minimum(0.0, x))


def _phi(x: Tensor) -> Tensor:
    """The standard normal density at ``x``."""
    return exp(square(x) * -0.5) * INV_SQRT_2PI


def _grad_gelu_tanh(n: Node, g: Tensor) -> list[Tensor | None]:
    x = _x(n)
    t = tanh((x + x * x * x * GELU_CUBIC) * SQRT_2_OVER_PI)
    inner = (square(x) * (3.0 * GELU_CUBIC) + 1.0) * SQRT_2_OVER_PI
    return [g * ((t + 1.0) * 0.5 + x * (1.0 - square(t)) * inner * 0.5)]


def _grad_silu(n: Node, g: Tensor) -> list[Tensor | None]:
    s = sigmoid(_x(n))
    return [g * s * (_x(n) * (1.0 - s) + 1.0)]


def _ref_sigmoid(x: np.ndarray) -> np.ndarray:
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e))


_SELU = f"({SELU_SCALE!r} * ({{0}} if {{0}} > 0.0 else {SELU_ALPHA!r} * math.expm1({{0}})))"
# 0.5 (1 + tanh(u)) = sigmoid(2u), and erf's 1 + erf(z) = erfc(-z): both without the cancellation
# that turns gelu(-10) into 0 (sigmoid_ is tail-exact; kernels/cpu/scalar.py).
_GELU_TANH = f"({{0}} * sigmoid_({2 * SQRT_2_OVER_PI!r} * ({{0}} + {GELU_CUBIC!r} * {{0}} * {{0}} * {{0}})))"

# name, kernel, reference (attrs, x), gradient (g: upstream), fusion expression
_ACTIVATIONS: list[tuple[Any, ...]] = [
    ("LeakyRelu",   typed_kernel(ak.leaky_relu, "alpha"), lambda a, x: np.where(x > 0, x, x * a["alpha"]),
     lambda n, g: [where(greater(_x(n), 0.0), g, g * n.attrs["alpha"])],            "({0} if {0} > 0.0 else {0} * {alpha!r})"),
    ("Elu",         typed_kernel(ak.elu, "alpha"), lambda a, x: np.where(x > 0, x, a["alpha"] * np.expm1(x)),
     lambda n, g: [where(greater(_x(n), 0.0), g, g * (_exp_below_0(_x(n)) * n.attrs["alpha"]))], "({0} if {0} > 0.0 else {alpha!r} * math.expm1({0}))"),
    ("Selu",        elementwise_kernel(ak.selu), lambda a, x: SELU_SCALE * np.where(x > 0, x, SELU_ALPHA * np.expm1(x)),
     lambda n, g: [where(greater(_x(n), 0.0), g * SELU_SCALE, g * (_exp_below_0(_x(n)) * (SELU_SCALE * SELU_ALPHA)))], _SELU),
    ("Gelu",        elementwise_kernel(ak.gelu), lambda a, x: 0.5 * x * special.erfc(-x * SQRT_HALF),
     lambda n, g: [gelu_grad(g, _x(n))],                                              f"(0.5 * {{0}} * math.erfc(-{{0}} * {SQRT_HALF!r}))"),
    ("GeluTanh",    elementwise_kernel(ak.gelu_tanh), lambda a, x: x * _ref_sigmoid(2 * SQRT_2_OVER_PI * (x + GELU_CUBIC * x**3)),
     _grad_gelu_tanh,                                                                 _GELU_TANH),
    ("Softplus",    elementwise_kernel(ak.softplus), lambda a, x: np.maximum(x, 0) + np.log1p(np.exp(-np.abs(x))),
     lambda n, g: [g * sigmoid(_x(n))],                                               "(({0} if {0} > 0.0 else 0.0) + math.log1p(math.exp(-abs({0}))))"),
    ("Softsign",    elementwise_kernel(ak.softsign), lambda a, x: x / (1 + np.abs(x)),
     lambda n, g: [g / square(abs_(_x(n)) + 1.0)],                                     "({0} / (1.0 + abs({0})))"),
    ("Silu",        elementwise_kernel(ak.silu), lambda a, x: x * _ref_sigmoid(x),
     _grad_silu,                                                                      "({0} * sigmoid_({0}))"),
    ("Relu6",       elementwise_kernel(ak.relu6), lambda a, x: np.minimum(np.maximum(x, 0), 6),
     lambda n, g: [_inside(_x(n), 0.0, 6.0, g)],                                      "(0.0 if {0} <= 0.0 else (6.0 if {0} >= 6.0 else {0}))"),
    ("HardSigmoid", elementwise_kernel(ak.hard_sigmoid), lambda a, x: np.clip(x / 6 + 0.5, 0, 1),
     lambda n, g: [_inside(_x(n), -3.0, 3.0, g * (1.0 / 6.0))],                        "(0.0 if {0} <= -3.0 else (1.0 if {0} >= 3.0 else {0} / 6.0 + 0.5))"),
]  # fmt: skip
_ATTRS = {"LeakyRelu": "alpha", "Elu": "alpha"}


def _one_upstream(rule: Any) -> Any:
    return lambda node, dys: rule(node, dys[0])


for _name, _kernel, _ref, _rule, _expr in _ACTIVATIONS:
    register_op(OpDef(
        name=_name, family=FAMILY, infer=infer_float_unary,
        reference=lambda attrs, x, _f=_ref: np.asarray(_f(attrs, x), x.dtype),
        grad=_one_upstream(_rule), elementwise=_expr,
        kernels={"cpu": _kernel, "cuda": cuda_kernel("elementwise", "unary_attr_op", _name, _ATTRS.get(_name))},
    ))  # fmt: skip


# ------------------------------------------------------------- GeluGrad
# Gelu's gradient as one op of (dy, x): one pass instead of a dozen ops, as nn.py's ReluGrad.
def _infer_gelu_grad(ctx: InferContext) -> TensorSpec:
    dy, x = ctx.inputs
    dtype = require_float(ctx, dy, x)
    if not fits(dy.shape, x.shape):
        raise ctx.shape_error(f"gradient and input shapes differ: {fmt(dy.shape)} and {fmt(x.shape)}")
    return TensorSpec(merge_shapes(dy.shape, x.shape), dtype)


def _ref_gelu_grad(attrs: dict[str, Any], dy: np.ndarray, x: np.ndarray) -> np.ndarray:
    return np.asarray(dy * (0.5 * special.erfc(-x * SQRT_HALF) + x * np.exp(-0.5 * x * x) * INV_SQRT_2PI), dy.dtype)


def _grad_gelu_grad(n: Node, dys: list[Tensor | None]) -> list[Tensor | None]:
    z, (dy, x) = dys[0], n.inputs
    assert z is not None
    # d/dx [Phi(x) + x phi(x)] = phi(x) (2 - x^2)
    return [gelu_grad(z, x), z * dy * _phi(x) * (2.0 - square(x))]


_GELU_GRAD = (
    f"({{0}} * (0.5 * math.erfc(-{{1}} * {SQRT_HALF!r}) + {{1}} * math.exp(-0.5 * {{1}} * {{1}}) * {INV_SQRT_2PI!r}))"
)
register_op(OpDef(
    name="GeluGrad", family=FAMILY, infer=_infer_gelu_grad, reference=_ref_gelu_grad, grad=_grad_gelu_grad,
    kernels={"cpu": elementwise_kernel(ak.gelu_grad), "cuda": cuda_kernel("elementwise", "binary_op", "GeluGrad")},
    elementwise=_GELU_GRAD,
))  # fmt: skip


def gelu_grad(dy: TensorLike, x: TensorLike, name: str = "gelu_grad") -> Tensor:
    """``dy * (Phi(x) + x phi(x))``: the gradient of exact gelu at its input ``x``."""
    return apply("GeluGrad", [dy, x], name=name)


def _alpha(op: str, alpha: Any) -> float:
    if isinstance(alpha, bool) or not isinstance(alpha, numbers.Real):
        raise TypeError(f"{op}: alpha must be a real number, got {alpha!r} ({type(alpha).__name__})")
    return float(alpha)


def leaky_relu(x: TensorLike, alpha: float = 0.2, name: str = "leaky_relu") -> Tensor:
    """``x`` where positive, else ``alpha * x`` (TensorFlow's default alpha, 0.2)."""
    return apply("LeakyRelu", [x], {"alpha": _alpha("leaky_relu", alpha)}, name=name)


def elu(x: TensorLike, alpha: float = 1.0, name: str = "elu") -> Tensor:
    """``x`` where positive, else ``alpha * (exp(x) - 1)``."""
    return apply("Elu", [x], {"alpha": _alpha("elu", alpha)}, name=name)


def selu(x: TensorLike, name: str = "selu") -> Tensor:
    """``scale * elu(x, alpha)`` with the self-normalising constants (alpha 1.6733, scale 1.0507)."""
    return apply("Selu", [x], name=name)


def gelu(x: TensorLike, approximate: bool | str = False, name: str = "gelu") -> Tensor:
    """``x * Phi(x)``, Phi the standard normal CDF; ``approximate=True`` (or ``"tanh"``) uses
    ``0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))``, as TensorFlow and PyTorch do."""
    if approximate not in (False, True, "none", "tanh"):
        raise ValueError(f"gelu: approximate must be False, True, 'none' or 'tanh', got {approximate!r}")
    tanh_form = approximate is True or approximate == "tanh"
    return apply("GeluTanh" if tanh_form else "Gelu", [x], name=name)


def softplus(x: TensorLike, name: str = "softplus") -> Tensor:
    """``log(1 + exp(x))``, computed as ``max(x, 0) + log1p(exp(-|x|))``: no overflow, no lost tail."""
    return apply("Softplus", [x], name=name)


def softsign(x: TensorLike, name: str = "softsign") -> Tensor:
    """``x / (1 + |x|)``."""
    return apply("Softsign", [x], name=name)


def silu(x: TensorLike, name: str = "silu") -> Tensor:
    """``x * sigmoid(x)`` (also called swish)."""
    return apply("Silu", [x], name=name)


swish = silu


def relu6(x: TensorLike, name: str = "relu6") -> Tensor:
    """``min(max(x, 0), 6)``."""
    return apply("Relu6", [x], name=name)


def hard_sigmoid(x: TensorLike, name: str = "hard_sigmoid") -> Tensor:
    """PyTorch's piecewise-linear sigmoid: ``clip(x / 6 + 0.5, 0, 1)`` (= ``relu6(x + 3) / 6``)."""
    return apply("HardSigmoid", [x], name=name)


__all__ = [
    "elu", "gelu", "hard_sigmoid", "leaky_relu", "relu6", "selu", "silu", "softplus", "softsign", "swish",
]  # fmt: skip
