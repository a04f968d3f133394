"""Normalization: layer normalization (one fused op, forward and backward) and batch normalization.

``layer_norm(x, gamma, beta, begin_axis=-1)`` normalizes over the axes from
``begin_axis`` on (the last one by default), then scales by ``gamma`` and
shifts by ``beta``, both of the normalized axes' shape. It is one LayerNorm
node with a fused CPU kernel (``kernels/cpu/normalization.py``); its gradient
is one LayerNormGrad node giving ``dx``, ``dgamma`` and ``dbeta`` together.

``batch_norm`` normalizes over every axis but the channel axis. With
``training`` true it uses the batch's mean and (biased) variance and moves
the moving statistics towards them (``moving = momentum * moving + (1 -
momentum) * batch``, TensorFlow's convention) by Assign nodes that the output
depends on, so any step that computes the output updates them; with
``training`` false it uses the moving statistics and changes nothing.
``training`` may be a Python bool, or a bool tensor (a placeholder with a
default) so that one graph serves training and evaluation: then both
normalizations are built, the output picks one, and the moving statistics
are assigned their new values only where ``training`` is true. The
normalization itself is elementwise arithmetic over the statistics, which
elementwise fusion runs as one loop.

>>> import cellgraph as cg
>>> import numpy as np
>>> x = cg.constant(np.array([[1.0, 2.0, 3.0], [2.0, 4.0, 6.0]], np.float32))
>>> y = cg.layer_norm(x, np.ones(3, np.float32), np.zeros(3, np.float32), epsilon=0.0)
>>> cg.Session().run(y).round(4)
array([[-1.2247,  0.    ,  1.2247],
       [-1.2247,  0.    ,  1.2247]], dtype=float32)
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..dtypes import is_float
from ..errors import DTypeError, ShapeError
from ..graph import Node, Tensor
from ..kernels.cpu.normalization import layer_norm as layer_norm_kernel
from ..kernels.cpu.normalization import layer_norm_grad as layer_norm_grad_kernel
from ..kernels.cuda import cuda_kernel
from ..opdef import InferContext, OpDef, TensorSpec, not_differentiable, register_op
from ..shapes import fmt
from .base import TensorLike, apply, apply_node, as_tensor, check_fits, require_float
from .math_unary import rsqrt, where
from .reductions import moments
from .state import assign, identity

FAMILY = "nn"
Dys = list[Tensor | None]


# ---------------------------------------------------------------- LayerNorm
def _normalized(ctx: InferContext, x: TensorSpec) -> tuple[int | None, ...]:
    begin = ctx.attrs["begin_axis"]
    if not 0 <= begin < x.rank:
        raise ctx.shape_error(f"begin_axis {ctx.attrs['axis']} is out of range for shape {fmt(x.shape)}")
    return x.shape[begin:]


def _infer_layer_norm(ctx: InferContext) -> TensorSpec:
    x, gamma, beta = ctx.inputs
    require_float(ctx, x, gamma, beta)
    normalized = _normalized(ctx, x)
    check_fits(ctx, "gamma", gamma, normalized)
    check_fits(ctx, "beta", beta, normalized)
    return x


def _infer_layer_norm_grad(ctx: InferContext) -> list[TensorSpec]:
    dy, x, gamma = ctx.inputs
    require_float(ctx, dy, x, gamma)
    check_fits(ctx, "dy", dy, x.shape)
    check_fits(ctx, "gamma", gamma, _normalized(ctx, x))
    return [x, gamma, gamma]


def _stats(attrs: dict[str, Any], x: np.ndarray) -> tuple[np.ndarray, np.ndarray, tuple[int, ...]]:
    axes = tuple(range(attrs["begin_axis"], x.ndim))
    x64 = x.astype(np.float64)
    mean = x64.mean(axis=axes, keepdims=True) if x.size else np.zeros([1] * x.ndim)
    var = x64.var(axis=axes, keepdims=True) if x.size else np.zeros([1] * x.ndim)
    return mean, 1.0 / np.sqrt(var + attrs["epsilon"]), axes


def _ref_layer_norm(attrs: dict[str, Any], x: np.ndarray, gamma: np.ndarray, beta: np.ndarray) -> np.ndarray:
    mean, rstd, _ = _stats(attrs, x)
    return ((x - mean) * rstd * gamma + beta).astype(x.dtype)


def _ref_layer_norm_grad(
    attrs: dict[str, Any], dy: np.ndarray, x: np.ndarray, gamma: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    mean, rstd, axes = _stats(attrs, x)
    xhat = (x - mean) * rstd
    g = dy * gamma
    n = max(int(np.prod([x.shape[a] for a in axes])), 1)
    dx = rstd * (g - g.sum(axis=axes, keepdims=True) / n - xhat * (g * xhat).sum(axis=axes, keepdims=True) / n)
    rows = tuple(range(attrs["begin_axis"]))
    dgamma, dbeta = (dy * xhat).sum(axis=rows), dy.sum(axis=rows)
    return dx.astype(x.dtype), np.asarray(dgamma, x.dtype), np.asarray(dbeta, x.dtype)


def _grad_layer_norm(node: Node, dys: Dys) -> list[Tensor | None]:
    x, gamma, _ = node.inputs
    assert dys[0] is not None
    grads = apply_node("LayerNormGrad", [dys[0], x, gamma], dict(node.attrs), name="layer_norm_grad")
    return [grads.output(0), grads.output(1), grads.output(2)]


def _kernel(fn: Any) -> Any:
    return lambda node, ctx: lambda *xs: fn(*xs, node.attrs["epsilon"], node.attrs["begin_axis"])


register_op(OpDef(
    name="LayerNorm", family=FAMILY, infer=_infer_layer_norm, reference=_ref_layer_norm, grad=_grad_layer_norm,
    kernels={"cpu": _kernel(layer_norm_kernel), "cuda": cuda_kernel("normalization", "layer_norm_op")},
))  # fmt: skip
# Recorded: the second derivative of layer normalization is not needed to train.
register_op(OpDef(
    name="LayerNormGrad", family=FAMILY, infer=_infer_layer_norm_grad, reference=_ref_layer_norm_grad,
    grad=not_differentiable,
    kernels={"cpu": _kernel(layer_norm_grad_kernel), "cuda": cuda_kernel("normalization", "layer_norm_grad_op")},
))  # fmt: skip


def layer_norm(
    x: TensorLike,
    gamma: TensorLike,
    beta: TensorLike,
    begin_axis: int = -1,
    epsilon: float = 1e-5,
    name: str = "layer_norm",
) -> Tensor:
    """``(x - mean) / sqrt(var + epsilon) * gamma + beta``, mean and variance over the axes from ``begin_axis`` on.

    ``gamma`` and ``beta`` have the shape of those axes (``x.shape[begin_axis:]``).
    """
    t = as_tensor(x)
    if not isinstance(begin_axis, (int, np.integer)) or isinstance(begin_axis, bool):
        raise TypeError(f"{name}: begin_axis must be one int, got {begin_axis!r}")
    if not epsilon >= 0:
        raise ValueError(f"{name}: epsilon must be 0 or more, got {epsilon!r}")
    rank = len(t.shape)
    # An out-of-range axis is reported by the shape rule, with the node's name.
    begin = begin_axis % rank if rank and -rank <= begin_axis < rank else rank
    attrs = {"axis": int(begin_axis), "begin_axis": begin, "epsilon": float(epsilon)}
    # A tensor goes to the shape rule as it is (a wrong dtype is reported there, naming the
    # node); a Python or NumPy value takes x's dtype.
    g, b = (v if isinstance(v, Tensor) else as_tensor(v, t.dtype, t.graph, "LayerNorm") for v in (gamma, beta))
    return apply("LayerNorm", [t, g, b], attrs, name=name)


# ---------------------------------------------------------------- batch norm
def batch_norm(
    x: TensorLike,
    gamma: TensorLike,
    beta: TensorLike,
    moving_mean: Tensor,
    moving_variance: Tensor,
    training: bool | Tensor,
    momentum: float = 0.99,
    epsilon: float = 1e-3,
    axis: int = -1,
    name: str = "batch_norm",
) -> Tensor:
    """Batch normalization over every axis of ``x`` but ``axis`` (the channels).

    ``gamma``, ``beta`` and the moving statistics (variables) have shape
    ``(channels,)``. In training (``training`` true) the batch's statistics
    normalize and the moving ones are updated when the output is computed;
    otherwise the moving ones normalize. See the module docstring.
    """
    t = as_tensor(x)
    rank = len(t.shape)
    if not -rank <= axis < rank:
        raise ShapeError(f"{name}: axis {axis} is out of range for shape {fmt(t.shape)}")
    if not is_float(t.dtype):
        raise DTypeError(f"{name}: expects a float tensor, got {t.dtype}")
    if not 0.0 <= momentum <= 1.0:
        raise ValueError(f"{name}: momentum must be in [0, 1], got {momentum!r}")
    channel = axis % rank
    channels = t.shape[channel]
    for what, v in (
        ("gamma", gamma),
        ("beta", beta),
        ("moving_mean", moving_mean),
        ("moving_variance", moving_variance),
    ):
        shape = v.shape if isinstance(v, Tensor) else np.shape(v)
        if len(shape) != 1 or (channels is not None and shape[0] not in (None, channels)):
            raise ShapeError(
                f"{name}: {what} has shape {fmt(shape)}, expected ({channels},) (the channels of {fmt(t.shape)})"
            )
    for what, v in (("moving_mean", moving_mean), ("moving_variance", moving_variance)):
        if not isinstance(v, Tensor) or v.node.op != "Variable":
            raise TypeError(f"{name}: {what} must be a variable (its value is updated in training), got {v!r}")
    reduced = [a for a in range(rank) if a != channel]
    # Statistics of shape (channels,) broadcast against x from the right: put the channel axis last.
    tail = (1,) * (rank - 1 - channel)

    def normalize(mean: Tensor, variance: Tensor) -> Tensor:
        from .array import reshape

        shape = (-1, *tail) if tail else None
        m, v = (reshape(mean, shape), reshape(variance, shape)) if shape else (mean, variance)
        g = reshape(as_tensor(gamma, t.dtype, t.graph), shape) if shape else as_tensor(gamma, t.dtype, t.graph)
        b = reshape(as_tensor(beta, t.dtype, t.graph), shape) if shape else as_tensor(beta, t.dtype, t.graph)
        return (t - m) * (rsqrt(v + epsilon) * g) + b

    if isinstance(training, np.bool_):
        training = bool(training)
    if training is False:
        return identity(normalize(moving_mean, moving_variance), name=name)
    mean, variance = moments(t, reduced, name=f"{name}_moments")
    new_mean = moving_mean * momentum + mean * (1.0 - momentum)
    new_variance = moving_variance * momentum + variance * (1.0 - momentum)
    if training is True:
        y = normalize(mean, variance)
    else:
        switch = as_tensor(training)
        if switch.dtype != "bool" or switch.shape != ():
            raise TypeError(
                f"{name}: training must be a bool or a scalar bool tensor, got {switch.dtype} {fmt(switch.shape)}"
            )
        y = where(switch, normalize(mean, variance), normalize(moving_mean, moving_variance))
        new_mean = where(switch, new_mean, moving_mean)
        new_variance = where(switch, new_variance, moving_variance)
    updates = [assign(moving_mean, new_mean, name=f"{name}_update_mean"),
               assign(moving_variance, new_variance, name=f"{name}_update_variance")]  # fmt: skip
    with t.graph.control_dependencies(updates):
        return identity(y, name=name)


__all__ = ["batch_norm", "layer_norm"]
