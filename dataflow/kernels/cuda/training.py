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
def _amsgrad(var, m, v, vhat, t, lr, grad, beta1, beta2, epsilon, beta1_64, beta2_64, weight_decay):  # type: ignore[no-untyped-def]
    i = cuda.grid(1)
    if i < var.size:
        var[i] *= 1 - lr[0] * weight_decay
        step = t[0] + 1.0
        lr_t = lr[0] * math.sqrt(1.0 - beta2_64**step) / (1.0 - beta1_64**step)
        g = grad[i]
        m[i] = beta1 * m[i] + (1 - beta1) * g
        v[i] = beta2 * v[i] + (1 - beta2) * g * g
        h = max(vhat[i], v[i])
        vhat[i] = h
        var[i] -= lr_t * m[i] / (math.sqrt(h) + epsilon)


@cuda.jit
def _adamax(var, m, u, t, lr, grad, beta1, beta2, epsilon, beta1_64):  # type: ignore[no-untyped-def]
    i = cuda.grid(1)
    if i < var.size:
        step = lr[0] / (1.0 - beta1_64 ** (t[0] + 1.0))
        g = grad[i]
        m[i] = beta1 * m[i] + (1 - beta1) * g
        b = max(beta2 * u[i], abs(g))
        u[i] = b
        var[i] -= step * m[i] / (b + epsilon)


@cuda.jit
def _nadam(var, m, v, t, product, lr, grad, beta1, beta2, epsilon, beta1_64, beta2_64, decay_64):  # type: ignore[no-untyped-def]
    i = cuda.grid(1)
    if i < var.size:
        # The schedule in float64, as the CPU's nadam_steps computes it; the product before this step is 1 at t = 1.
        step = t[0] + 1.0
        mu = beta1_64 * (1.0 - 0.5 * 0.96 ** (step * decay_64))
        mu_next = beta1_64 * (1.0 - 0.5 * 0.96 ** ((step + 1.0) * decay_64))
        before = product[0] if step > 1.0 else 1.0
        root = math.sqrt(1.0 - beta2_64**step)
        step_g = lr[0] * root * (1.0 - mu) / (1.0 - before * mu)
        step_m = lr[0] * root * mu_next / (1.0 - before * mu * mu_next)
        g = grad[i]
        m[i] = beta1 * m[i] + (1 - beta1) * g
        v[i] = beta2 * v[i] + (1 - beta2) * g * g
        var[i] -= (step_g * g + step_m * m[i]) / (math.sqrt(v[i]) + epsilon)


@cuda.jit
def _nadam_count(t, product, beta1_64, decay_64):  # type: ignore[no-untyped-def]
    # After the update, as _count_step: the schedule's product takes this step's factor, then t counts it.
    step = t[0] + 1.0
    mu = beta1_64 * (1.0 - 0.5 * 0.96 ** (step * decay_64))
    product[0] = mu if step == 1.0 else product[0] * mu
    t[0] = step


@cuda.jit
def _adadelta(var, accum, accum_update, lr, grad, rho, epsilon):  # type: ignore[no-untyped-def]
    i = cuda.grid(1)
    if i < var.size:
        g = grad[i]
        a = rho * accum[i] + (1 - rho) * g * g
        accum[i] = a
        d = math.sqrt(accum_update[i] + epsilon) / math.sqrt(a + epsilon) * g
        accum_update[i] = rho * accum_update[i] + (1 - rho) * d * d
        var[i] -= lr[0] * d


@cuda.jit
def _centered_rmsprop(var, ms, mg, mom, lr, grad, decay, mu, epsilon):  # type: ignore[no-untyped-def]
    i = cuda.grid(1)
    if i < var.size:
        g = grad[i]
        s = decay * ms[i] + (1 - decay) * g * g
        ms[i] = s
        c = decay * mg[i] + (1 - decay) * g
        mg[i] = c
        a = mu * mom[i] + lr[0] * g / math.sqrt(s - c * c + epsilon)
        mom[i] = a
        var[i] -= a


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
    """ApplyAdam, and ApplyAdamW (its ``weight_decay``); with ``amsgrad``, a ``vhat`` input after ``t``."""
    b1, b2, eps = node.attrs["beta1"], node.attrs["beta2"], node.attrs["epsilon"]
    decay = node.attrs.get("weight_decay", 0.0)

    def run(var: Any, m: Any, v: Any, t: Any, *rest: Any) -> Any:
        *vhat, lr, grad = rest
        cast = var.dtype.type
        blocks, threads = launch(var.size)
        scalars = (cast(b1), cast(b2), cast(eps), np.float64(b1), np.float64(b2), cast(decay))
        if vhat:
            _amsgrad[blocks, threads](
                flat(var), flat(m), flat(v), flat(vhat[0]), flat(t), flat(lr), flat(grad), *scalars
            )
        else:
            _adam[blocks, threads](flat(var), flat(m), flat(v), flat(t), flat(lr), flat(grad), *scalars)
        _count_step[1, 1](flat(t))
        return var

    return run


def adamax_op(node: Any, ctx: Any) -> Callable[..., Any]:
    b1, b2, eps = node.attrs["beta1"], node.attrs["beta2"], node.attrs["epsilon"]

    def run(var: Any, m: Any, u: Any, t: Any, lr: Any, grad: Any) -> Any:
        cast = var.dtype.type
        blocks, threads = launch(var.size)
        _adamax[blocks, threads](
            flat(var), flat(m), flat(u), flat(t), flat(lr), flat(grad), cast(b1), cast(b2), cast(eps), np.float64(b1)
        )
        _count_step[1, 1](flat(t))
        return var

    return run


def nadam_op(node: Any, ctx: Any) -> Callable[..., Any]:
    b1, b2, eps, decay = (node.attrs[name] for name in ("beta1", "beta2", "epsilon", "momentum_decay"))

    def run(var: Any, m: Any, v: Any, t: Any, product: Any, lr: Any, grad: Any) -> Any:
        cast = var.dtype.type
        blocks, threads = launch(var.size)
        _nadam[blocks, threads](
            flat(var), flat(m), flat(v), flat(t), flat(product), flat(lr), flat(grad),
            cast(b1), cast(b2), cast(eps), np.float64(b1), np.float64(b2), np.float64(decay),
        )  # fmt: skip
        _nadam_count[1, 1](flat(t), flat(product), np.float64(b1), np.float64(decay))
        return var

    return run


def adadelta_op(node: Any, ctx: Any) -> Callable[..., Any]:
    rho, eps = node.attrs["rho"], node.attrs["epsilon"]

    def run(var: Any, accum: Any, accum_update: Any, lr: Any, grad: Any) -> Any:
        cast = var.dtype.type
        blocks, threads = launch(var.size)
        _adadelta[blocks, threads](
            flat(var), flat(accum), flat(accum_update), flat(lr), flat(grad), cast(rho), cast(eps)
        )
        return var

    return run


def rmsprop_op(node: Any, ctx: Any) -> Callable[..., Any]:
    decay, mu, eps = node.attrs["decay"], node.attrs["momentum"], node.attrs["epsilon"]

    def run(var: Any, ms: Any, *rest: Any) -> Any:
        *mg, mom, lr, grad = rest  # mg only when centered
        cast = var.dtype.type
        blocks, threads = launch(var.size)
        scalars = (cast(decay), cast(mu), cast(eps))
        if mg:
            _centered_rmsprop[blocks, threads](
                flat(var), flat(ms), flat(mg[0]), flat(mom), flat(lr), flat(grad), *scalars
            )
        else:
            _rmsprop[blocks, threads](flat(var), flat(ms), flat(mom), flat(lr), flat(grad), *scalars)
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
