"""Oracle rows of the second set of elementwise ops (ops/math_unary.py, ops/activations.py).

Logic ops have no rows: their outputs are bool, which the harness cannot
weight, and they are not differentiable; the op table checks them against
NumPy. Rows here follow ``rows.py``'s conventions and are appended to its
``ROWS``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

import cellgraph as cg
from cellgraph.dataflow.ops import activations

from .rows import BROADCAST, TAILS, ZERO, Row, fixed, pos, x

try:
    import torch
    import torch.nn.functional as F  # noqa: N812 - PyTorch's own spelling
except ImportError:  # the comparisons skip (test_ops.py); the table still loads
    torch = F = None  # type: ignore[assignment]

MASK = np.array([[True], [False], [True]])


def _floor_divide(a: Any, b: Any) -> Any:
    """torch's floor division, detached: it has no derivative (nor has cellgraph's FloorDiv)."""
    return torch.floor_divide(a.detach(), b.detach())


def _gelu_slope(a: Any) -> Any:
    """d gelu / dx by torch's autograd, kept differentiable (create_graph) for the second derivative."""
    leaf = a if a.requires_grad else a.detach().requires_grad_()
    (slope,) = torch.autograd.grad(F.gelu(leaf).sum(), leaf, create_graph=True)
    return slope


def _unary(op: str, cg_fn: Any, torch_fn: Any, low: float = -1.0, high: float = 1.0, **kw: Any) -> Row:
    return Row(op, cg_fn, torch_fn, [x("n", "c", low=low, high=high)], sizes={"c": 4}, variants=ZERO, **kw)


ELEMENTWISE_ROWS: list[Row] = [
    # ------------------------------------------------------------ unary math
    _unary("Abs",   lambda a: abs(a),      lambda a: torch.abs(a)),
    _unary("Sign",  lambda a: cg.sign(a),  lambda a: torch.sign(a)),
    _unary("Floor", lambda a: cg.floor(a), lambda a: torch.floor(a), low=-3, high=3),
    _unary("Ceil",  lambda a: cg.ceil(a),  lambda a: torch.ceil(a),  low=-3, high=3),
    _unary("Round", lambda a: cg.round(a), lambda a: torch.round(a), low=-3, high=3),
    Row("Round", lambda a: cg.round(a), lambda a: torch.round(a),
        [fixed(np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5]))], id="ties-to-even"),
    _unary("Sin",   lambda a: cg.sin(a),   lambda a: torch.sin(a),   low=-3, high=3),
    _unary("Cos",   lambda a: cg.cos(a),   lambda a: torch.cos(a),   low=-3, high=3),
    _unary("Tan",   lambda a: cg.tan(a),   lambda a: torch.tan(a),   low=-1.2, high=1.2),
    Row("Rsqrt", lambda a: cg.rsqrt(a), lambda a: torch.rsqrt(a), [pos("n", 4)], variants=ZERO),
    _unary("Log1p", lambda a: cg.log1p(a), lambda a: torch.log1p(a), low=-0.5, high=2.0),
    _unary("Expm1", lambda a: cg.expm1(a), lambda a: torch.expm1(a), low=-2, high=2),
    _unary("Erf",   lambda a: cg.erf(a),   lambda a: torch.erf(a),   low=-2, high=2),
    # ------------------------------------------- floor division and modulo
    Row("FloorDiv", lambda a, b: a // b, lambda a, b: _floor_divide(a, b),
        [x("a", "c", low=-5, high=5), x("b", "d", low=-2, high=2)], id="broadcast", **BROADCAST),
    Row("FloorDiv", lambda a: 7.0 // a, lambda a: _floor_divide(torch.tensor(7.0, dtype=a.dtype), a),
        [x("n", 3, low=-2, high=2)], id="python-left", variants=ZERO),
    Row("FloorMod", lambda a, b: a % b, lambda a, b: torch.remainder(a, b),
        [x("a", "c", low=-5, high=5), x("b", "d", low=-2, high=2)], id="broadcast", **BROADCAST),
    Row("FloorMod", lambda a: cg.mod(a, -1.5), lambda a: torch.remainder(a, -1.5), [x("n", 3, low=-4, high=4)],
        id="negative-divisor", variants=ZERO),
    # ------------------------------------------------- clip, where, stop_gradient
    Row("ClipByValue", lambda a, lo, hi: cg.clip_by_value(a, lo, hi), lambda a, lo, hi: torch.clamp(a, lo, hi),
        [x("n", 4, low=-2, high=2), x(4, low=-1, high=-0.5), x("n", 1, low=0.5, high=1)], variants=ZERO),
    Row("ClipByValue", lambda a: cg.clip_by_value(a, -0.5, 0.5), lambda a: torch.clamp(a, -0.5, 0.5),
        [x("n", 4)], id="python-bounds", variants=ZERO),
    Row("Where", lambda c, a, b: cg.where(c, a, b), lambda c, a, b: torch.where(c, a, b),
        [fixed(MASK), x(3, "c"), x("c")], sizes={"c": 4}, variants=({"c": 0}, {"c": 1})),
    Row("Where", lambda a: cg.where(a > 0.0, a, 0.0), lambda a: torch.where(a > 0, a, 0.0), [x("n", 4)],
        id="python-branch", variants=ZERO),
    Row("StopGradient", lambda a: cg.stop_gradient(a) * a, lambda a: a.detach() * a, [x("n", 4)], variants=ZERO),
    # ----------------------------------------------------------- activations
    _unary("LeakyRelu", lambda a: cg.leaky_relu(a), lambda a: F.leaky_relu(a, 0.2), low=-3, high=3),
    _unary("LeakyRelu", lambda a: cg.leaky_relu(a, 0.01), lambda a: F.leaky_relu(a, 0.01), id="alpha"),
    _unary("Elu",       lambda a: cg.elu(a),          lambda a: F.elu(a),              low=-3, high=3),
    _unary("Elu",       lambda a: cg.elu(a, 0.5),     lambda a: F.elu(a, 0.5),         id="alpha"),
    _unary("Selu",      lambda a: cg.selu(a),         lambda a: F.selu(a),             low=-3, high=3),
    _unary("Gelu",      lambda a: cg.gelu(a),         lambda a: F.gelu(a),             low=-4, high=4),
    Row("GeluGrad", lambda g, a: activations.gelu_grad(g, a), lambda g, a: g * _gelu_slope(a),
        [x("n", 4), x("n", 4, low=-4, high=4)], variants=ZERO),
    _unary("GeluTanh",  lambda a: cg.gelu(a, approximate="tanh"), lambda a: F.gelu(a, approximate="tanh"),
           low=-4, high=4),
    _unary("Softplus",  lambda a: cg.softplus(a),     lambda a: F.softplus(a),         low=-4, high=4),
    # torch returns x itself past its threshold (20): within 1e-26 relative of ours.
    Row("Softplus", lambda a: cg.softplus(a), lambda a: F.softplus(a), [fixed(TAILS)], id="tails", atol=0.0),
    _unary("Softsign",  lambda a: cg.softsign(a),     lambda a: F.softsign(a),         low=-3, high=3),
    _unary("Silu",      lambda a: cg.silu(a),         lambda a: F.silu(a),             low=-4, high=4),
    Row("Silu", lambda a: cg.swish(a), lambda a: F.silu(a), [fixed(TAILS)], id="tails", atol=0.0),
    _unary("Relu6",     lambda a: cg.relu6(a),        lambda a: F.relu6(a),            low=-2, high=8),
    # torch's backward multiplies by 1/6 rounded to float32 (2.98e-8 relative off), in float64 too.
    _unary("HardSigmoid", lambda a: cg.hard_sigmoid(a), lambda a: F.hardsigmoid(a),    low=-5, high=5, rtol=1e-7),
]  # fmt: skip
