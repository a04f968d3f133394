"""Optimizer update ops: one op applies one step to one variable and its slots.

They are ops (not Python code around a session) so that an update runs where
its variable lives: on a parameter server, once variables are distributed.
Each returns the updated variable. One op per optimizer kind of
``dataflow/optimizer_registry.py``: its inputs are the variable, the kind's
slots, the learning rate and the gradient; its attributes are the kind's other
hyperparameters; its CPU kernel is the kind's ``update``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ..errors import GraphError
from ..graph import Node, Tensor
from ..kernels.cpu import training as k
from ..kernels.cuda import cuda_kernel
from ..opdef import InferContext, KernelContext, OpDef, TensorSpec, not_differentiable, register_op
from ..optimizer_registry import OPTIMIZER_KINDS, OptimizerDef, Slot, Value, kinds
from ..shapes import fmt
from .base import apply, shapes_checked

FAMILY = "training"


def _infer_apply(ctx: InferContext) -> TensorSpec:
    """Variable and slots first, then the learning rate (a scalar), then the gradient."""
    definition = _BY_OP[ctx.node.op]
    slots = definition.slots_for(_flags(definition, ctx.attrs))
    scalars = {slot.input for slot in slots if slot.scalar}
    updated = {"var"} | {slot.input for slot in slots if not slot.scalar}
    names = ctx.attrs["_inputs"]
    expected = _input_names(slots)
    if tuple(names) != expected:
        raise ctx.graph_error(f"takes inputs {', '.join(expected)} with these hyperparameters, got {', '.join(names)}")
    specs = dict(zip(names, ctx.inputs))
    var = specs["var"]
    for i, (name, spec) in enumerate(zip(names, ctx.inputs)):
        if name in updated:
            target = ctx.node.inputs[i].node
            if target.op != "Variable":
                raise ctx.graph_error(f"{name} must be a variable, got {target.op} '{target.name}'")
        # A scalar slot (Adam's step count) may be float64 whatever the variable's dtype: the parameter servers
        # keep it so, exact far beyond float32's 2**24 steps.
        if spec.dtype != var.dtype and not (name in scalars and spec.dtype == "float64"):
            raise ctx.dtype_error(f"{name} has dtype {spec.dtype}, the variable has {var.dtype}")
        if name == "lr":
            if spec.shape != ():
                raise ctx.shape_error(f"learning rate must be a scalar, got shape {fmt(spec.shape)}")
        elif name not in scalars and spec.shape != var.shape and not (name == "grad" and _fits(spec.shape, var.shape)):
            raise ctx.shape_error(f"{name} has shape {fmt(spec.shape)}, the variable has {fmt(var.shape)}")
    return var


def _flags(definition: OptimizerDef, attrs: Mapping[str, Any]) -> dict[str, Value]:
    """The hyperparameters among ``attrs`` (a node's), which say which slots it takes (absent ones: defaults)."""
    return {name: attrs[name] for name in definition.names() if name in attrs}


def _input_names(slots: tuple[Slot, ...]) -> tuple[str, ...]:
    return ("var", *(slot.input for slot in slots), "lr", "grad")


def _fits(shape: tuple[int | None, ...], target: tuple[int | None, ...]) -> bool:
    return len(shape) == len(target) and all(a is None or a == b for a, b in zip(shape, target))


# ------------------------------------------------------------------ NumPy references (the op table's truth)
def _ref_sgd(attrs: dict[str, Any], var: np.ndarray, lr: np.ndarray, grad: np.ndarray) -> np.ndarray:
    return var - lr * grad


def _ref_momentum(
    attrs: dict[str, Any], var: np.ndarray, accum: np.ndarray, lr: np.ndarray, grad: np.ndarray
) -> np.ndarray:
    accum = attrs["momentum"] * accum + grad
    step = grad + attrs["momentum"] * accum if attrs["nesterov"] else accum
    return (var - lr * step).astype(var.dtype)


def _ref_adam(attrs: dict[str, Any], var: np.ndarray, m: np.ndarray, v: np.ndarray, t: np.ndarray,
              *rest: np.ndarray) -> np.ndarray:  # fmt: skip
    """``rest``: ``vhat, lr, grad`` with amsgrad, else ``lr, grad``."""
    *vhat, lr, grad = rest
    b1, b2, eps = attrs["beta1"], attrs["beta2"], attrs["epsilon"]
    step = float(t) + 1.0
    var = var * (1 - lr * attrs.get("weight_decay", 0.0))
    m = b1 * m + (1 - b1) * grad
    v = b2 * v + (1 - b2) * grad * grad
    root = np.sqrt(np.maximum(vhat[0], v) if vhat else v)
    lr_t = k.adam_step_size(float(lr), b1, b2, step)
    return (var - lr_t * m / (root + eps)).astype(var.dtype)


def _ref_adamax(attrs: dict[str, Any], var: np.ndarray, m: np.ndarray, u: np.ndarray, t: np.ndarray, lr: np.ndarray,
                grad: np.ndarray) -> np.ndarray:  # fmt: skip
    b1 = attrs["beta1"]
    m = b1 * m + (1 - b1) * grad
    u = np.maximum(attrs["beta2"] * u, np.abs(grad))
    return (var - lr / (1 - b1 ** (float(t) + 1)) * m / (u + attrs["epsilon"])).astype(var.dtype)


def _ref_nadam(attrs: dict[str, Any], var: np.ndarray, m: np.ndarray, v: np.ndarray, t: np.ndarray,
               product: np.ndarray, lr: np.ndarray, grad: np.ndarray) -> np.ndarray:  # fmt: skip
    b1, b2, step = attrs["beta1"], attrs["beta2"], float(t) + 1
    mu = [b1 * (1 - 0.5 * 0.96 ** (s * attrs["momentum_decay"])) for s in (step, step + 1)]
    before = float(product) if step > 1 else 1.0
    m = b1 * m + (1 - b1) * grad
    v = b2 * v + (1 - b2) * grad * grad
    # torch.optim.NAdam's update, its epsilon written as this one: eps / sqrt(1 - beta2^t).
    denom = np.sqrt(v / (1 - b2**step)) + attrs["epsilon"] / np.sqrt(1 - b2**step)
    change = (1 - mu[0]) / (1 - before * mu[0]) * grad + mu[1] / (1 - before * mu[0] * mu[1]) * m
    return (var - lr * change / denom).astype(var.dtype)


def _ref_adadelta(attrs: dict[str, Any], var: np.ndarray, accum: np.ndarray, accum_update: np.ndarray, lr: np.ndarray,
                  grad: np.ndarray) -> np.ndarray:  # fmt: skip
    rho, eps = attrs["rho"], attrs["epsilon"]
    accum = rho * accum + (1 - rho) * grad * grad
    return (var - lr * np.sqrt(accum_update + eps) / np.sqrt(accum + eps) * grad).astype(var.dtype)


def _ref_rmsprop(attrs: dict[str, Any], var: np.ndarray, ms: np.ndarray, *rest: np.ndarray) -> np.ndarray:
    """``rest``: ``mg, mom, lr, grad`` when centered, else ``mom, lr, grad``."""
    *mg, mom, lr, grad = rest
    decay = attrs["decay"]
    ms = decay * ms + (1 - decay) * grad * grad
    square = (decay * mg[0] + (1 - decay) * grad) ** 2 if mg else 0.0
    mom = attrs["momentum"] * mom + lr * grad / np.sqrt(ms - square + attrs["epsilon"])
    return (var - mom).astype(var.dtype)


def _ref_adagrad(
    attrs: dict[str, Any], var: np.ndarray, accum: np.ndarray, lr: np.ndarray, grad: np.ndarray
) -> np.ndarray:
    accum = accum + grad * grad + attrs["initial_accumulator_value"]
    return (var - lr * grad / (np.sqrt(accum) + attrs["epsilon"])).astype(var.dtype)


def _cpu_kernel(node: Node, ctx: KernelContext) -> Any:
    """The kind's ``update``, the parameter server's too: inputs by name, hyperparameters from the attributes."""
    definition = _BY_OP[node.op]
    names = node.attrs["_inputs"]
    # A flag added since a graph was saved (Adam's amsgrad) is absent from its nodes: its default is what they ran.
    hyper = {h.name: node.attrs.get(h.name, h.default) for h in definition.hyperparameters[1:]}
    slot_inputs = [(slot.name, names.index(slot.input)) for slot in definition.slots_for(hyper)]

    def run(*arrays: np.ndarray) -> np.ndarray:
        var, lr, grad = arrays[0], arrays[-2], arrays[-1]
        definition.update(var, {slot: arrays[i] for slot, i in slot_inputs}, lr, grad, hyper)
        return var

    return run


def _gradient_problem(node: Node, var: Any, *rest: Any) -> str | None:
    """A gradient of unknown dims passes the shape rule (a reduction's output, a fed one); each kernel reads one
    gradient element per variable element, so a (1,) gradient for a (3,) variable moved the first element and read
    past the gradient's end for the others (garbage, NaN) without a word."""
    grad = rest[-1]
    if tuple(grad.shape) == tuple(var.shape):
        return None
    return (
        f"the gradient has shape {fmt(tuple(grad.shape))} but the variable {node.inputs[0].node.name!r} has "
        f"{fmt(tuple(var.shape))}; an update needs one gradient element per element of the variable"
    )


# op -> (NumPy reference, CUDA kernel factory in kernels/cuda/training.py)
_KERNELS: dict[str, tuple[Any, str]] = {
    "ApplyGradientDescent": (_ref_sgd,      "sgd_op"),
    "ApplyMomentum":        (_ref_momentum, "momentum_op"),
    "ApplyAdam":            (_ref_adam,     "adam_op"),
    "ApplyRMSProp":         (_ref_rmsprop,  "rmsprop_op"),
    "ApplyAdagrad":         (_ref_adagrad,  "adagrad_op"),
    "ApplyAdamW":           (_ref_adam,     "adam_op"),
    "ApplyAdaMax":          (_ref_adamax,   "adamax_op"),
    "ApplyNadam":           (_ref_nadam,    "nadam_op"),
    "ApplyAdadelta":        (_ref_adadelta, "adadelta_op"),
}  # fmt: skip
_BY_OP: dict[str, OptimizerDef] = {}
for _kind in kinds():
    _def = OPTIMIZER_KINDS.lookup(_kind)
    _ref, _cuda = _KERNELS[_def.op]
    _BY_OP[_def.op] = _def
    register_op(OpDef(
        name=_def.op, family=FAMILY, infer=_infer_apply, reference=_ref, grad=not_differentiable,
        kernels={"cpu": shapes_checked(_cpu_kernel, _gradient_problem),
                 "cuda": shapes_checked(cuda_kernel("training", _cuda), _gradient_problem)},
        stateful=True, view=True,
    ))  # fmt: skip


def apply_optimizer(
    kind: str,
    var: Tensor,
    slots: Mapping[str, Tensor],
    lr: Tensor,
    grad: Tensor,
    hyperparameters: Mapping[str, Value],
    name: str | None = None,
) -> Tensor:
    """The ``Apply*`` op of optimizer ``kind``: ``slots`` by slot name, ``hyperparameters`` but the learning rate."""
    definition = OPTIMIZER_KINDS.lookup(kind)
    attrs: dict[str, Any] = {}
    for hyper in definition.hyperparameters[1:]:  # the learning rate is an input
        value = hyperparameters.get(hyper.name, hyper.default)
        attrs[hyper.name] = bool(value) if isinstance(hyper.default, bool) else float(value)
    kept = definition.slots_for(attrs)  # a flag may add one (AMSGrad's vhat, centered RMSProp's mg)
    missing = [slot.name for slot in kept if slot.name not in slots]
    if missing:
        flags = ", ".join(f"{name}={attrs[name]}" for name in definition.names() if isinstance(attrs[name], bool))
        raise GraphError(
            f"{definition.op} ({kind}{', ' + flags if flags else ''}) keeps slots {', '.join(s.name for s in kept)}; "
            f"{', '.join(missing)} not given (given: {', '.join(slots) or 'none'})"
        )
    attrs["_inputs"] = _input_names(kept)
    inputs = [var, *(slots[slot.name] for slot in kept), lr, grad]
    return apply(definition.op, inputs, attrs, name=name or f"apply_{kind}")


def apply_gradient_descent(var: Tensor, lr: Tensor, grad: Tensor, name: str = "apply_gradient_descent") -> Tensor:
    """``var -= lr * grad`` in place."""
    return apply_optimizer("sgd", var, {}, lr, grad, {}, name=name)


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
    hyper = {"momentum": momentum, "nesterov": nesterov}
    return apply_optimizer("momentum", var, {"momentum": accum}, lr, grad, hyper, name=name)


def apply_adam(
    var: Tensor, m: Tensor, v: Tensor, t: Tensor, lr: Tensor, grad: Tensor,
    beta1: float = 0.9, beta2: float = 0.999, epsilon: float = 1e-8, name: str = "apply_adam",
) -> Tensor:  # fmt: skip
    """One Adam step (Kingma & Ba, 2015) with bias correction; ``t`` counts steps."""
    hyper = {"beta1": beta1, "beta2": beta2, "epsilon": epsilon}
    return apply_optimizer("adam", var, {"m": m, "v": v, "t": t}, lr, grad, hyper, name=name)


def apply_adamw(
    var: Tensor, m: Tensor, v: Tensor, t: Tensor, lr: Tensor, grad: Tensor,
    beta1: float = 0.9, beta2: float = 0.999, epsilon: float = 1e-8, weight_decay: float = 0.01,
    name: str = "apply_adamw",
) -> Tensor:  # fmt: skip
    """``var *= 1 - lr * weight_decay``, then one Adam step: AdamW's decoupled weight decay."""
    hyper = {"beta1": beta1, "beta2": beta2, "epsilon": epsilon, "weight_decay": weight_decay}
    return apply_optimizer("adamw", var, {"m": m, "v": v, "t": t}, lr, grad, hyper, name=name)


def apply_rmsprop(
    var: Tensor, ms: Tensor, mom: Tensor, lr: Tensor, grad: Tensor,
    decay: float = 0.9, momentum: float = 0.0, epsilon: float = 1e-10, name: str = "apply_rmsprop",
) -> Tensor:  # fmt: skip
    """TensorFlow's RMSProp: ``ms`` averages squared gradients, ``mom`` carries ``lr * g / sqrt(ms + epsilon)``."""
    hyper = {"decay": decay, "momentum": momentum, "epsilon": epsilon}
    return apply_optimizer("rmsprop", var, {"ms": ms, "mom": mom}, lr, grad, hyper, name=name)


def apply_adagrad(
    var: Tensor, accumulator: Tensor, lr: Tensor, grad: Tensor,
    initial_accumulator_value: float = 0.1, epsilon: float = 1e-7, name: str = "apply_adagrad",
) -> Tensor:  # fmt: skip
    """Adagrad: ``accumulator`` sums squared gradients (from 0; the initial value is added as it is read)."""
    hyper = {"initial_accumulator_value": initial_accumulator_value, "epsilon": epsilon}
    return apply_optimizer("adagrad", var, {"accumulator": accumulator}, lr, grad, hyper, name=name)


__all__ = [
    "apply_adagrad",
    "apply_adam",
    "apply_adamw",
    "apply_gradient_descent",
    "apply_momentum",
    "apply_optimizer",
    "apply_rmsprop",
]
