"""Optimizer updates, in place on the device arrays of a variable and its slots.

One thread per element. The learning rate and Adam's step count are read on
the device (0-d arrays), so an update never waits for a copy to the host.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
from numba import cuda

from . import flat, launch


@cuda.jit
def _sgd(var, lr, grad):  # type: ignore[no-untyped-def]
    i = cuda.grid(1)
    if i < var.size:
        var[i] -= lr[0] * grad[i]


@cuda.jit
def _momentum(var, accum, lr, grad, mu, nesterov):  # type: ignore[no-untyped-def]
    i = cuda.grid(1)
    if i < var.size:
        a = mu * accum[i] + grad[i]
        accum[i] = a
        if nesterov:
            var[i] -= lr[0] * (grad[i] + mu * a)
        else:
            var[i] -= lr[0] * a


@cuda.jit
def _adam(var, m, v, t, lr, grad, beta1, beta2, epsilon, beta1_64, beta2_64, weight_decay):  # type: ignore[no-untyped-def]
    i = cuda.grid(1)
    if i < var.size:
        # AdamW's decoupled decay first, as the CPU kernel does (weight_decay 0: Adam).
        var[i] *= 1 - lr[0] * weight_decay
        # The step size in float64: 1 - beta2**t cancels badly in float32.
        step = t[0] + 1.0
        lr_t = lr[0] * math.sqrt(1.0 - beta2_64**step) / (1.0 - beta1_64**step)
        g = grad[i]
        m[i] = beta1 * m[i] + (1 - beta1) * g
        v[i] = beta2 * v[i] + (1 - beta2) * g * g
        var[i] -= lr_t * m[i] / (math.sqrt(v[i]) + epsilon)


@cuda.jit
def _rmsprop(var, ms, mom, lr, grad, decay, mu, epsilon):  # type: ignore[no-untyped-def]
    i = cuda.grid(1)
    if i < var.size:
        g = grad[i]
        s = decay * ms[i] + (1 - decay) * g * g
        ms[i] = s
        a = mu * mom[i] + lr[0] * g / math.sqrt(s + epsilon)
        mom[i] = a
        var[i] -= a


@cuda.jit
def _adagrad(var, accum, lr, grad, initial, epsilon):  # type: ignore[no-untyped-def]
    i = cuda.grid(1)
    if i < var.size:
        g = grad[i]
        a = accum[i] + g * g
        accum[i] = a
        var[i] -= lr[0] * g / (math.sqrt(a + initial) + epsilon)


@cuda.jit
def _count_step(t):  # type: ignore[no-untyped-def]
    # Its own launch, after the update: no thread of `_adam` may see it half done.
    t[0] += 1


def sgd_op(node: Any, ctx: Any) -> Callable[..., Any]:
    def run(var: Any, lr: Any, grad: Any) -> Any:
        blocks, threads = launch(var.size)
        _sgd[blocks, threads](flat(var), flat(lr), flat(grad))
        return var

    return run


def momentum_op(node: Any, ctx: Any) -> Callable[..., Any]:
    mu, nesterov = node.attrs["momentum"], node.attrs["nesterov"]

    def run(var: Any, accum: Any, lr: Any, grad: Any) -> Any:
        blocks, threads = launch(var.size)
        _momentum[blocks, threads](flat(var), flat(accum), flat(lr), flat(grad), var.dtype.type(mu), nesterov)
        return var

    return run


def adam_op(node: Any, ctx: Any) -> Callable[..., Any]:
    """ApplyAdam, and ApplyAdamW (its ``weight_decay``)."""
    b1, b2, eps = node.attrs["beta1"], node.attrs["beta2"], node.attrs["epsilon"]
    decay = node.attrs.get("weight_decay", 0.0)

    def run(var: Any, m: Any, v: Any, t: Any, lr: Any, grad: Any) -> Any:
        cast = var.dtype.type
        blocks, threads = launch(var.size)
        _adam[blocks, threads](
            flat(var), flat(m), flat(v), flat(t), flat(lr), flat(grad),
            cast(b1), cast(b2), cast(eps), np.float64(b1), np.float64(b2), cast(decay),
        )  # fmt: skip
        _count_step[1, 1](flat(t))
        return var

    return run


def rmsprop_op(node: Any, ctx: Any) -> Callable[..., Any]:
    decay, mu, eps = node.attrs["decay"], node.attrs["momentum"], node.attrs["epsilon"]

    def run(var: Any, ms: Any, mom: Any, lr: Any, grad: Any) -> Any:
        cast = var.dtype.type
        blocks, threads = launch(var.size)
        _rmsprop[blocks, threads](
            flat(var), flat(ms), flat(mom), flat(lr), flat(grad), cast(decay), cast(mu), cast(eps)
        )
        return var

    return run


def adagrad_op(node: Any, ctx: Any) -> Callable[..., Any]:
    initial, eps = node.attrs["initial_accumulator_value"], node.attrs["epsilon"]

    def run(var: Any, accum: Any, lr: Any, grad: Any) -> Any:
        cast = var.dtype.type
        blocks, threads = launch(var.size)
        _adagrad[blocks, threads](flat(var), flat(accum), flat(lr), flat(grad), cast(initial), cast(eps))
        return var

    return run
