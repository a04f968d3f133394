"""Optimizer updates, in place on the variable and its slots.

Each kernel walks the flat (C-ordered) buffers once, so an update is one pass
over memory however many slots the optimizer keeps.
"""

from __future__ import annotations

import math

import numpy as np

from . import kernel

# A float is NaN or Inf exactly when its exponent bits are all ones: the unsigned view of each float dtype, and
# the mask of those bits.
_EXPONENT_BITS = {
    np.dtype(np.float32): (np.uint32, 0x7F800000),
    np.dtype(np.float64): (np.uint64, 0x7FF0000000000000),
}


def all_finite(x: np.ndarray) -> bool:
    """Whether flat C-contiguous ``x`` holds no NaN or Inf (the parameter server checks every gradient it receives).

    One pass that allocates nothing (``np.isfinite(x).all()`` makes a bool
    array as big as ``x``), counting the values whose exponent bits are all
    ones in integer arithmetic, which the compiler vectorises: 8.6 ms for 25M
    float32 values here, against 40 ms for a float loop that stops at the first
    NaN (the exit and ``isfinite`` on each value kept it scalar).

    >>> all_finite(np.array([1.0, -2.5, 3e38], np.float32)), all_finite(np.array([0.0, np.nan]))
    (True, False)
    """
    bits = _EXPONENT_BITS.get(x.dtype)
    if bits is None or not x.flags.c_contiguous:  # another dtype, or strided: NumPy's check
        return bool(np.isfinite(x).all())
    unsigned, mask = bits
    return int(_count_all_ones(x.view(unsigned), unsigned(mask))) == 0


@kernel
def _count_all_ones(bits, mask):  # type: ignore[no-untyped-def]
    count = 0
    for i in range(bits.size):
        count += (bits[i] & mask) == mask
    return count


@kernel
def sgd(var, lr, grad):  # type: ignore[no-untyped-def]
    for i in range(var.size):
        var[i] -= lr * grad[i]


@kernel
def momentum(var, accum, lr, grad, mu, nesterov):  # type: ignore[no-untyped-def]
    for i in range(var.size):
        accum[i] = mu * accum[i] + grad[i]
        if nesterov:
            var[i] -= lr * (grad[i] + mu * accum[i])
        else:
            var[i] -= lr * accum[i]


@kernel
def adam(var, m, v, lr_t, grad, beta1, beta2, epsilon, keep):  # type: ignore[no-untyped-def]
    # keep = 1 - lr * weight_decay: AdamW's decoupled decay, applied before the step as PyTorch does (1 for Adam).
    for i in range(var.size):
        g = grad[i]
        var[i] *= keep
        m[i] = beta1 * m[i] + (1.0 - beta1) * g
        v[i] = beta2 * v[i] + (1.0 - beta2) * g * g
        var[i] -= lr_t * m[i] / (math.sqrt(v[i]) + epsilon)


@kernel
def rmsprop(var, ms, mom, lr, grad, decay, mu, epsilon):  # type: ignore[no-untyped-def]
    for i in range(var.size):
        g = grad[i]
        ms[i] = decay * ms[i] + (1.0 - decay) * g * g
        mom[i] = mu * mom[i] + lr * g / math.sqrt(ms[i] + epsilon)
        var[i] -= mom[i]


@kernel
def adagrad(var, accum, lr, grad, initial, epsilon):  # type: ignore[no-untyped-def]
    for i in range(var.size):
        g = grad[i]
        accum[i] += g * g
        var[i] -= lr * g / (math.sqrt(accum[i] + initial) + epsilon)


def flat(x: np.ndarray) -> np.ndarray:
    """A 1-D view of a C-contiguous buffer (variables and slots always are)."""
    return x.reshape(-1)


def adam_step_size(lr: float, beta1: float, beta2: float, t: float) -> float:
    """Adam's bias-corrected step size for step ``t`` (1-based)."""
    return lr * math.sqrt(1.0 - beta2**t) / (1.0 - beta1**t)


# The updates as the executor's Apply* ops and the parameter server's store
# both run them: hyperparameters cast to the variable's dtype (a local learning
# rate is a constant of that dtype), flat views of C-contiguous buffers, Adam's
# step count incremented before its update (the first step is t = 1).
def sgd_update(var: np.ndarray, lr: float | np.ndarray, grad: np.ndarray) -> None:
    sgd(flat(var), var.dtype.type(lr), flat(np.ascontiguousarray(grad)))


def momentum_update(
    var: np.ndarray, accum: np.ndarray, lr: float | np.ndarray, grad: np.ndarray, mu: float, nesterov: bool
) -> None:
    cast = var.dtype.type
    momentum(flat(var), flat(accum), cast(lr), flat(np.ascontiguousarray(grad)), cast(mu), nesterov)


def adam_update(
    var: np.ndarray,
    m: np.ndarray,
    v: np.ndarray,
    t: np.ndarray,
    lr: float | np.ndarray,
    grad: np.ndarray,
    beta1: float,
    beta2: float,
    epsilon: float,
    weight_decay: float = 0.0,
) -> None:
    """Adam, or AdamW with ``weight_decay`` (Loshchilov & Hutter: the decay is not part of the gradient)."""
    cast = var.dtype.type
    t += 1
    rate = cast(lr)
    lr_t = cast(adam_step_size(float(rate), beta1, beta2, float(t)))
    keep = cast(1) - rate * cast(weight_decay)
    g = flat(np.ascontiguousarray(grad))
    adam(flat(var), flat(m), flat(v), lr_t, g, cast(beta1), cast(beta2), cast(epsilon), keep)


def rmsprop_update(
    var: np.ndarray,
    ms: np.ndarray,
    mom: np.ndarray,
    lr: float | np.ndarray,
    grad: np.ndarray,
    decay: float,
    momentum: float,
    epsilon: float,
) -> None:
    """TensorFlow's RMSProp: epsilon inside the square root, the learning rate inside the momentum."""
    cast = var.dtype.type
    g = flat(np.ascontiguousarray(grad))
    rmsprop(flat(var), flat(ms), flat(mom), cast(lr), g, cast(decay), cast(momentum), cast(epsilon))


def adagrad_update(
    var: np.ndarray,
    accum: np.ndarray,
    lr: float | np.ndarray,
    grad: np.ndarray,
    initial_accumulator_value: float,
    epsilon: float,
) -> None:
    """Adagrad; ``accum`` sums the squared gradients and the initial value is added as it is read.

    So the slot starts at zero like every other slot, on a parameter server too.
    """
    cast = var.dtype.type
    g = flat(np.ascontiguousarray(grad))
    adagrad(flat(var), flat(accum), cast(lr), g, cast(initial_accumulator_value), cast(epsilon))
