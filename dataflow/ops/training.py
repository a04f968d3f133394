"""Optimizer update ops: one op applies one step to one variable and its slots.

They are ops (not Python code around a session) so that an update runs where
its variable lives: on a parameter server, once variables are distributed.
Each returns the updated variable.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..graph import Node, Tensor
from ..kernels.cpu import training as k
from ..kernels.cuda import cuda_kernel
from ..opdef import InferContext, KernelContext, OpDef, TensorSpec, not_differentiable, register_op
from ..shapes import fmt
from .base import apply

FAMILY = "training"


def _infer_apply(ctx: InferContext) -> TensorSpec:
    """Variable and slots first, then the learning rate (a scalar), then the gradient."""
    names = ctx.attrs["_inputs"]
    specs = dict(zip(names, ctx.inputs))
    var = specs["var"]
    for i, (name, spec) in enumerate(zip(names, ctx.inputs)):
        if name in ("var", "accum", "m", "v"):
            target = ctx.node.inputs[i].node
            if target.op != "Variable":
                raise ctx.graph_error(f"{name} must be a variable, got {target.op} '{target.name}'")
        if spec.dtype != var.dtype:
            raise ctx.dtype_error(f"{name} has dtype {spec.dtype}, the variable has {var.dtype}")
        if name == "lr":
            if spec.shape != ():
                raise ctx.shape_error(f"learning rate must be a scalar, got shape {fmt(spec.shape)}")
        elif name != "t" and spec.shape != var.shape and not (name == "grad" and _fits(spec.shape, var.shape)):
            raise ctx.shape_error(f"{name} has shape {fmt(spec.shape)}, the variable has {fmt(var.shape)}")
    return var


def _fits(shape: tuple[int | None, ...], target: tuple[int | None, ...]) -> bool:
    return len(shape) == len(target) and all(a is None or a == b for a, b in zip(shape, target))


def _ref_sgd(attrs: dict[str, Any], var: np.ndarray, lr: np.ndarray, grad: np.ndarray) -> np.ndarray:
    return var - lr * grad


def _ref_momentum(
    attrs: dict[str, Any], var: np.ndarray, accum: np.ndarray, lr: np.ndarray, grad: np.ndarray
) -> np.ndarray:
    accum = attrs["momentum"] * accum + grad
    step = grad + attrs["momentum"] * accum if attrs["nesterov"] else accum
    return (var - lr * step).astype(var.dtype)


def _ref_adam(
    attrs: dict[str, Any],
    var: np.ndarray,
    m: np.ndarray,
    v: np.ndarray,
    t: np.ndarray,
    lr: np.ndarray,
    grad: np.ndarray,
) -> np.ndarray:
    b1, b2, eps = attrs["beta1"], attrs["beta2"], attrs["epsilon"]
    step = float(t) + 1.0
    m = b1 * m + (1 - b1) * grad
    v = b2 * v + (1 - b2) * grad * grad
    lr_t = k.adam_step_size(float(lr), b1, b2, step)
    return (var - lr_t * m / (np.sqrt(v) + eps)).astype(var.dtype)


def _sgd_kernel(node: Node, ctx: KernelContext) -> Any:
    def run(var: np.ndarray, lr: np.ndarray, grad: np.ndarray) -> np.ndarray:
        k.sgd_update(var, lr, grad)
        return var

    return run


def _momentum_kernel(node: Node, ctx: KernelContext) -> Any:
    mu, nesterov = node.attrs["momentum"], node.attrs["nesterov"]

    def run(var: np.ndarray, accum: np.ndarray, lr: np.ndarray, grad: np.ndarray) -> np.ndarray:
        k.momentum_update(var, accum, lr, grad, mu, nesterov)
        return var

    return run


def _adam_kernel(node: Node, ctx: KernelContext) -> Any:
    b1, b2, eps = node.attrs["beta1"], node.attrs["beta2"], node.attrs["epsilon"]

    def run(
        var: np.ndarray, m: np.ndarray, v: np.ndarray, t: np.ndarray, lr: np.ndarray, grad: np.ndarray
    ) -> np.ndarray:
        # The step count is a slot too, so it is saved with the others.
        k.adam_update(var, m, v, t, lr, grad, b1, b2, eps)
        return var

    return run


_APPLY: list[tuple[Any, ...]] = [
    ("ApplyGradientDescent", ("var", "lr", "grad"),                    _ref_sgd,      _sgd_kernel,      "sgd_op"),
    ("ApplyMomentum",        ("var", "accum", "lr", "grad"),           _ref_momentum, _momentum_kernel, "momentum_op"),
    ("ApplyAdam",            ("var", "m", "v", "t", "lr", "grad"),     _ref_adam,     _adam_kernel,     "adam_op"),
]  # fmt: skip
for _name, _inputs, _ref, _kernel, _cuda in _APPLY:
    register_op(OpDef(
        name=_name, family=FAMILY, infer=_infer_apply, reference=_ref, grad=not_differentiable,
        kernels={"cpu": _kernel, "cuda": cuda_kernel("training", _cuda)}, stateful=True, view=True,
    ))  # fmt: skip
INPUTS = {name: inputs for name, inputs, _, _, _ in _APPLY}


def apply_gradient_descent(var: Tensor, lr: Tensor, grad: Tensor, name: str = "apply_gradient_descent") -> Tensor:
    """``var -= lr * grad`` in place."""
    return apply("ApplyGradientDescent", [var, lr, grad], {"_inputs": INPUTS["ApplyGradientDescent"]}, name=name)


def apply_momentum(
    var: Tensor,
    accum: Tensor,
    lr: Tensor,
    grad: Tensor,
    momentum: float,
    nesterov: bool = False,
    name: str = "apply_momentum",
) -> Tensor:
    """``accum = momentum * accum + grad; var -= lr * accum`` (or the Nesterov step)."""
    attrs = {"_inputs": INPUTS["ApplyMomentum"], "momentum": float(momentum), "nesterov": bool(nesterov)}
    return apply("ApplyMomentum", [var, accum, lr, grad], attrs, name=name)


def apply_adam(
    var: Tensor, m: Tensor, v: Tensor, t: Tensor, lr: Tensor, grad: Tensor,
    beta1: float = 0.9, beta2: float = 0.999, epsilon: float = 1e-8, name: str = "apply_adam",
) -> Tensor:  # fmt: skip
    """One Adam step (Kingma & Ba, 2015) with bias correction; ``t`` counts steps."""
    attrs = {"_inputs": INPUTS["ApplyAdam"], "beta1": float(beta1), "beta2": float(beta2), "epsilon": float(epsilon)}
    return apply("ApplyAdam", [var, m, v, t, lr, grad], attrs, name=name)


__all__ = ["apply_adam", "apply_gradient_descent", "apply_momentum"]
