"""Normalization: layer normalization (one fused op, forward and backward) and batch normalization.

``layer_norm(x, gamma, beta, begin_axis=-1)`` normalizes over the axes from
``begin_axis`` on (the last one by default), then scales by ``gamma`` and
shifts by ``beta``, both of the normalized axes' shape. It is one LayerNorm
node with a fused CPU kernel (``kernels/cpu/normalization.py``); its gradient
is one LayerNormGrad node giving ``dx``, ``dgamma`` and ``dbeta`` together.

``batch_norm`` normalizes over every axis but the channel axis. With
``training`` true it uses the batch's mean and (biased) variance, computed
with the normalization in one FusedBatchNorm node (per-channel statistics and
output in three passes of one CPU kernel; its gradient one BatchNormGrad node),
and moves the moving statistics towards them (``moving = momentum * moving +
(1 - momentum) * batch``, TensorFlow's convention) by Assign nodes that the
output depends on, so any step that computes the output updates them. With
``training`` false it uses the moving statistics, as elementwise arithmetic
that fusion runs as one loop, and changes nothing. ``training`` may be a
Python bool, or a scalar bool tensor (a placeholder) so that one graph serves
training and evaluation: then both normalizations are built, the output picks
one, and the moving statistics are assigned new values only where
``training`` is true.

Mixed precision: a half ``x`` (float16, bfloat16) with float32 moving
statistics is normalized in float32, its statistics computed in float32 and
the moving ones kept in float32, and the output is in ``x``'s dtype (what
Keras's BatchNormalization and ``torch.autocast`` do); so is a half ``x`` of
``layer_norm`` with float32 ``gamma``. Parameters of ``x``'s own dtype work
as before.

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

from ..dtypes import is_float, is_half
from ..errors import DTypeError, ShapeError
from ..graph import Node, Tensor
from ..kernels.cpu import normalization as kernels
from ..kernels.cuda import cuda_kernel
from ..opdef import InferContext, OpDef, TensorSpec, register_op
from ..shapes import fmt
from .base import TensorLike, apply, apply_node, as_tensor, check_fits, require_float, shapes_checked
from .math import broadcast_like, cast, reduce_mean, reduce_sum, square, zeros_like
from .math_unary import rsqrt, where
from .state import identity

# The attribute that marks batch norm's update of a moving statistic, ``var * momentum + stat * (1 - momentum)``,
# with its momentum: a cluster job sends ``stat`` to the parameter server, which moves the variable itself.
MOVING_AVERAGE_MOMENTUM = "moving_average_momentum"

FAMILY = "nn"
Dys = list[Tensor | None]


# ------------------------------------------------------ second derivatives
# LayerNormGrad and BatchNormGrad are differentiated through the same math written in primitive ops: a
# gradient penalty through a normalization (WGAN-GP, MAML) needs the second derivative. It was
# not_differentiable, and cg.gradients of a first gradient silently gave None (no penalty at all), where
# TensorFlow (a composite LayerNorm, _FusedBatchNormGradGrad) and PyTorch give the true one.
def _differentiated_by_composite(math: Any) -> Any:
    """A grad op's gradient rule: ``math(attrs, *inputs)`` rebuilds its outputs from primitives, and autodiff
    differentiates those against the upstream gradients. The inputs enter as identity copies, fresh leaves: a
    batch's mean and variance are computed from x, and their paths back to x are the outer autodiff's to take."""

    def rule(node: Node, dys: Dys) -> list[Tensor | None]:
        from ..autodiff import gradients  # autodiff imports the op registry: import it when a rule runs

        leaves = [identity(t) for t in node.inputs]
        pairs = [(out, dy) for out, dy in zip(math(node.attrs, *leaves), dys) if dy is not None]
        return gradients([out for out, _ in pairs], leaves, grad_ys=[dy for _, dy in pairs])

    return rule


def _layer_norm_grad_math(attrs: dict[str, Any], dy: Tensor, x: Tensor, gamma: Tensor) -> list[Tensor]:
    """LayerNormGrad's (dx, dgamma, dbeta), as _ref_layer_norm_grad computes them."""
    axes, rows = list(range(attrs["begin_axis"], len(x.shape))), list(range(attrs["begin_axis"]))
    centered = x - reduce_mean(x, axes, keepdims=True)
    rstd = rsqrt(reduce_mean(square(centered), axes, keepdims=True) + attrs["epsilon"])
    xhat = centered * rstd
    g = dy * gamma
    dx = rstd * (g - reduce_mean(g, axes, keepdims=True) - xhat * reduce_mean(g * xhat, axes, keepdims=True))
    if not rows:  # the whole tensor is one row
        return [dx, dy * xhat, dy]
    return [dx, reduce_sum(dy * xhat, rows), reduce_sum(dy, rows)]


def _batch_norm_grad_math(
    attrs: dict[str, Any], dy: Tensor, x: Tensor, gamma: Tensor, mean: Tensor, var: Tensor
) -> list[Tensor]:
    """BatchNormGrad's (dx, dgamma, dbeta) from the batch statistics, as _ref_batch_norm_grad computes them."""
    axes = [a for a in range(len(x.shape)) if a != attrs["channel_axis"]]

    def per_channel(v: Tensor) -> Tensor:
        return broadcast_like(v, x, axes, keepdims=False)

    rstd = rsqrt(var + attrs["epsilon"])
    xhat = (x - per_channel(mean)) * per_channel(rstd)
    dbeta, dgamma = reduce_sum(dy, axes), reduce_sum(dy * xhat, axes)
    centered_dy = dy - per_channel(reduce_mean(dy, axes)) - xhat * per_channel(reduce_mean(dy * xhat, axes))
    return [per_channel(gamma * rstd) * centered_dy, dgamma, dbeta]


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


def _per_element_problem(node: Node, *arrays: Any) -> str | None:
    """LayerNorm's (x, gamma, beta) and LayerNormGrad's (dy, x, gamma) at run time: the shape rule lets unknown
    dims through, and the kernels read gamma and beta by x's normalized shape (a (1,) gamma for 3 features gave
    what memory held past it, 3.7e-322, without a word)."""
    names = ("x", "gamma", "beta") if node.op == "LayerNorm" else ("dy", "x", "gamma")
    given = dict(zip(names, (tuple(a.shape) for a in arrays)))
    x = given["x"]
    if given.get("dy", x) != x:
        return f"dy has shape {fmt(given['dy'])} but x has {fmt(x)}"
    normalized = x[node.attrs["begin_axis"] :]
    for what in ("gamma", "beta"):
        if what in given and given[what] != normalized:
            return f"{what} has shape {fmt(given[what])} but x {fmt(x)} is normalized over {fmt(normalized)}"
    return None


register_op(OpDef(
    name="LayerNorm", family=FAMILY, infer=_infer_layer_norm, reference=_ref_layer_norm, grad=_grad_layer_norm,
    kernels={"cpu": shapes_checked(_kernel(kernels.layer_norm), _per_element_problem),
             "cuda": shapes_checked(cuda_kernel("normalization", "layer_norm_op"), _per_element_problem)},
))  # fmt: skip
register_op(OpDef(
    name="LayerNormGrad", family=FAMILY, infer=_infer_layer_norm_grad, reference=_ref_layer_norm_grad,
    grad=_differentiated_by_composite(_layer_norm_grad_math),
    kernels={"cpu": shapes_checked(_kernel(kernels.layer_norm_grad), _per_element_problem),
             "cuda": shapes_checked(cuda_kernel("normalization", "layer_norm_grad_op"), _per_element_problem)},
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
    if is_half(t.dtype) and isinstance(gamma, Tensor) and gamma.dtype == "float32":
        # Mixed precision: float32 gamma and beta normalize a half x in float32; the result is x's dtype.
        wide = layer_norm(cast(t, "float32", name=f"{name}_float32"), gamma, beta, begin_axis, epsilon, f"{name}_wide")
        return cast(wide, t.dtype, name=name)
    # A tensor goes to the shape rule as it is (a wrong dtype is reported there, naming the
    # node); a Python or NumPy value takes x's dtype.
    g, b = (v if isinstance(v, Tensor) else as_tensor(v, t.dtype, t.graph, "LayerNorm") for v in (gamma, beta))
    return apply("LayerNorm", [t, g, b], attrs, name=name)


# ---------------------------------------------------------------- batch norm
def _channels(ctx: InferContext, x: TensorSpec) -> tuple[int | None]:
    axis = ctx.attrs["channel_axis"]
    if not 0 <= axis < x.rank:
        raise ctx.shape_error(f"axis {ctx.attrs['axis']} is out of range for shape {fmt(x.shape)}")
    return (x.shape[axis],)


def _infer_batch_norm(ctx: InferContext) -> list[TensorSpec]:
    x, gamma, beta = ctx.inputs
    dtype = require_float(ctx, x, gamma, beta)
    channels = _channels(ctx, x)
    check_fits(ctx, "gamma", gamma, channels)
    check_fits(ctx, "beta", beta, channels)
    stats = TensorSpec(channels, dtype)
    return [x, stats, stats]


def _infer_batch_norm_grad(ctx: InferContext) -> list[TensorSpec]:
    dy, x, gamma, mean, var = ctx.inputs
    require_float(ctx, dy, x, gamma, mean, var)
    check_fits(ctx, "dy", dy, x.shape)
    channels = _channels(ctx, x)
    for what, spec in (("gamma", gamma), ("mean", mean), ("variance", var)):
        check_fits(ctx, what, spec, channels)
    return [x, gamma, gamma]


def _batch_axes(attrs: dict[str, Any], x: np.ndarray) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The reduced axes, and the shape that puts a per-channel vector against ``x``."""
    axis = attrs["channel_axis"]
    return tuple(a for a in range(x.ndim) if a != axis), tuple(-1 if a == axis else 1 for a in range(x.ndim))


def _ref_batch_norm(
    attrs: dict[str, Any], x: np.ndarray, gamma: np.ndarray, beta: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    axes, col = _batch_axes(attrs, x)
    x64 = x.astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):  # an empty batch: NaN statistics, as reduce_mean's
        count = x.size // max(x.shape[attrs["channel_axis"]], 1)
        mean = x64.sum(axis=axes) / count if count else np.full(x.shape[attrs["channel_axis"]], np.nan)
        var = ((x64 - mean.reshape(col)) ** 2).sum(axis=axes) / count if count else mean.copy()
        y = (x64 - mean.reshape(col)) / np.sqrt(var.reshape(col) + attrs["epsilon"]) * gamma.reshape(col)
    return (y + beta.reshape(col)).astype(x.dtype), mean.astype(x.dtype), var.astype(x.dtype)


def _ref_batch_norm_grad(
    attrs: dict[str, Any], dy: np.ndarray, x: np.ndarray, gamma: np.ndarray, mean: np.ndarray, var: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    axes, col = _batch_axes(attrs, x)
    count = max(x.size // max(x.shape[attrs["channel_axis"]], 1), 1)
    rstd = 1.0 / np.sqrt(var.astype(np.float64) + attrs["epsilon"])
    xhat = (x - mean.reshape(col)) * rstd.reshape(col)
    dbeta, dgamma = dy.sum(axis=axes), (dy * xhat).sum(axis=axes)
    dx = (gamma * rstd).reshape(col) * (dy - dbeta.reshape(col) / count - xhat * dgamma.reshape(col) / count)
    return dx.astype(x.dtype), dgamma.astype(x.dtype), dbeta.astype(x.dtype)


def _grad_batch_norm(node: Node, dys: Dys) -> list[Tensor | None]:
    x, gamma, _ = node.inputs
    dy, dmean, dvar = dys
    mean, var = node.output(1), node.output(2)
    grads = apply_node(
        "BatchNormGrad", [dy if dy is not None else zeros_like(x), x, gamma, mean, var], dict(node.attrs),
        name="batch_norm_grad",
    )  # fmt: skip
    dx = grads.output(0)
    # The statistics are outputs too: mean = sum(x) / count, var = sum((x - mean)^2) / count.
    axes = [a for a in range(len(x.shape)) if a != node.attrs["channel_axis"]]
    if dmean is not None:
        dx = dx + broadcast_like(dmean, x, axes, keepdims=False, mean=True)
    if dvar is not None:
        centered = x - broadcast_like(mean, x, axes, keepdims=False)
        dx = dx + broadcast_like(dvar, x, axes, keepdims=False, mean=True) * centered * 2.0
    return [dx, grads.output(1), grads.output(2)]


def _bn_kernel(fn: Any) -> Any:
    return lambda node, ctx: lambda *xs: fn(*xs, node.attrs["epsilon"], node.attrs["channel_axis"])


def _per_channel_problem(node: Node, *arrays: Any) -> str | None:
    """FusedBatchNorm's (x, gamma, beta) and BatchNormGrad's (dy, x, gamma, mean, variance) at run time: the
    kernels read each per-channel input by x's channel count (a (1,) gamma for 3 channels gave garbage)."""
    names = ("x", "gamma", "beta") if node.op == "FusedBatchNorm" else ("dy", "x", "gamma", "mean", "variance")
    given = dict(zip(names, (tuple(a.shape) for a in arrays)))
    x = given["x"]
    if given.get("dy", x) != x:
        return f"dy has shape {fmt(given['dy'])} but x has {fmt(x)}"
    channels = (x[node.attrs["channel_axis"]],)
    for what in names:
        if what not in ("x", "dy") and given[what] != channels:
            return f"{what} has shape {fmt(given[what])} but x {fmt(x)} has {channels[0]} channels"
    return None


register_op(OpDef(
    name="FusedBatchNorm", family=FAMILY, infer=_infer_batch_norm, reference=_ref_batch_norm, grad=_grad_batch_norm,
    kernels={"cpu": shapes_checked(_bn_kernel(kernels.batch_norm_training), _per_channel_problem),
             "cuda": shapes_checked(cuda_kernel("normalization", "batch_norm_training_op"), _per_channel_problem)},
))  # fmt: skip
register_op(OpDef(
    name="BatchNormGrad", family=FAMILY, infer=_infer_batch_norm_grad, reference=_ref_batch_norm_grad,
    grad=_differentiated_by_composite(_batch_norm_grad_math),
    kernels={"cpu": shapes_checked(_bn_kernel(kernels.batch_norm_grad), _per_channel_problem),
             "cuda": shapes_checked(cuda_kernel("normalization", "batch_norm_grad_op"), _per_channel_problem)},
))  # fmt: skip


def fused_batch_norm(
    x: TensorLike,
    gamma: TensorLike,
    beta: TensorLike,
    epsilon: float = 1e-3,
    axis: int = -1,
    name: str = "fused_batch_norm",
) -> tuple[Tensor, Tensor, Tensor]:
    """``(y, mean, variance)``: ``x`` normalized per channel (``axis``) by its batch statistics, in one pass
    of a fused kernel, and those statistics (the variance biased, as ``moments`` gives it)."""
    t = as_tensor(x)
    rank = len(t.shape)
    channel = axis % rank if rank and -rank <= axis < rank else rank  # out of range: the shape rule says so
    g, b = (v if isinstance(v, Tensor) else as_tensor(v, t.dtype, t.graph, "FusedBatchNorm") for v in (gamma, beta))
    attrs = {"axis": int(axis), "channel_axis": channel, "epsilon": float(epsilon)}
    node = apply_node("FusedBatchNorm", [t, g, b], attrs, name=name)
    return node.output(0), node.output(1), node.output(2)


def normalized(
    x: Tensor, gamma: TensorLike, beta: TensorLike, mean: Tensor, variance: Tensor, epsilon: float, channel: int
) -> Tensor:
    """``x`` normalized per channel (axis ``channel``, 0 or more) by the given statistics: batch norm at
    inference, ``(x - mean) * rsqrt(variance + epsilon) * gamma + beta``."""
    from .array import reshape

    # Statistics of shape (channels,) broadcast against x from the right: put the channel axis last.
    tail = (1,) * (len(x.shape) - 1 - channel)
    shape = (-1, *tail) if tail else None
    m, v = (reshape(mean, shape), reshape(variance, shape)) if shape else (mean, variance)
    g = reshape(as_tensor(gamma, x.dtype, x.graph), shape) if shape else as_tensor(gamma, x.dtype, x.graph)
    b = reshape(as_tensor(beta, x.dtype, x.graph), shape) if shape else as_tensor(beta, x.dtype, x.graph)
    return (x - m) * (rsqrt(v + epsilon) * g) + b


def moving_average_input(assign: Node) -> Tensor | None:
    """The value a moving average's assignment moves its variable towards (``stat`` in batch norm's
    ``var * momentum + stat * (1 - momentum)``, the Add of two Muls that ``batch_norm`` builds); None when
    ``assign``'s value is not of that form (a switch fed with data picks it, for one)."""
    average = assign.inputs[1].node
    if average.op == "Add" and all(t.node.op == "Mul" for t in average.inputs):
        kept, taken = (t.node for t in average.inputs)
        if kept.inputs[0].node is assign.inputs[0].node:
            return taken.inputs[0]
    return None


def moving_statistics(fused: Node) -> tuple[Tensor, Tensor] | None:
    """The moving mean and variance (variables) that ``batch_norm`` keeps from FusedBatchNorm node ``fused``'s
    batch statistics (outputs 1 and 2); None unless both are found (``fused_batch_norm`` alone keeps none)."""
    found: dict[int, Tensor] = {}
    for node in fused.graph.nodes if fused.graph is not None else ():
        if node.op != "Assign" or MOVING_AVERAGE_MOMENTUM not in node.attrs:
            continue
        stat = moving_average_input(node)
        if stat is not None and stat.node is fused and stat.index in (1, 2):
            found[stat.index] = node.inputs[0]
    return (found[1], found[2]) if len(found) == 2 else None


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
    if is_half(t.dtype) and moving_mean.dtype == "float32":
        # Mixed precision: the statistics of a half x are computed, and kept, in float32; y is x's dtype.
        wide = cast(t, "float32", name=f"{name}_float32")
        y = batch_norm(
            wide, gamma, beta, moving_mean, moving_variance, training, momentum, epsilon, axis, f"{name}_wide"
        )
        return cast(y, t.dtype, name=name)

    def normalize(mean: Tensor, variance: Tensor) -> Tensor:
        return normalized(t, gamma, beta, mean, variance, epsilon, channel)

    if isinstance(training, np.bool_):
        training = bool(training)
    if training is False:
        return identity(normalize(moving_mean, moving_variance), name=name)
    y, mean, variance = fused_batch_norm(t, gamma, beta, epsilon, axis, name=f"{name}_fused")
    new_mean = moving_mean * momentum + mean * (1.0 - momentum)
    new_variance = moving_variance * momentum + variance * (1.0 - momentum)
    if training is not True:
        switch = as_tensor(training)
        if switch.dtype != "bool" or switch.shape != ():
            raise TypeError(
                f"{name}: training must be a bool or a scalar bool tensor, got {switch.dtype} {fmt(switch.shape)}"
            )
        y = where(switch, y, normalize(moving_mean, moving_variance))
        new_mean = where(switch, new_mean, moving_mean)
        new_variance = where(switch, new_variance, moving_variance)
    marked = {MOVING_AVERAGE_MOMENTUM: float(momentum)}
    updates = [apply("Assign", [moving_mean, new_mean], marked, name=f"{name}_update_mean"),
               apply("Assign", [moving_variance, new_variance], marked, name=f"{name}_update_variance")]  # fmt: skip
    with t.graph.control_dependencies(updates):
        return identity(y, name=name)


__all__ = [
    "batch_norm",
    "fused_batch_norm",
    "layer_norm",
    "moving_average_input",
    "moving_statistics",
    "normalized",
]
