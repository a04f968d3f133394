"""Rows for the optimizer update ops (stateful: variables are inputs)."""

from __future__ import annotations

import numpy as np

import cellgraph as cg
from cellgraph.dataflow.ops.training import apply_optimizer

from . import OpCase, rand

var, grad = rand(3, 4, seed=1), rand(3, 4, seed=2)
slot = rand(3, 4, seed=3)
lr = np.array(0.1, np.float32)

CASES = [
    OpCase(
        "ApplyGradientDescent",
        lambda v, lr_, g: cg.apply_gradient_descent(v, lr_, g),
        [var, lr, grad],
        variables=(0,),
        grad=False,
    ),
    OpCase(
        "ApplyMomentum",
        lambda v, a, lr_, g: cg.apply_momentum(v, a, lr_, g, 0.9),
        [var, slot, lr, grad],
        variables=(0, 1),
        grad=False,
    ),
    OpCase(
        "ApplyMomentum",
        lambda v, a, lr_, g: cg.apply_momentum(v, a, lr_, g, 0.9, nesterov=True),
        [var, slot, lr, grad],
        variables=(0, 1),
        grad=False,
        id="nesterov",
    ),
    OpCase(
        "ApplyAdam",
        lambda v, m, s, t, lr_, g: cg.apply_adam(v, m, s, t, lr_, g),
        [var, slot, np.abs(slot), np.array(3.0, np.float32), lr, grad],
        variables=(0, 1, 2, 3),
        grad=False,
    ),
    OpCase(
        "ApplyAdamW",
        lambda v, m, s, t, lr_, g: cg.apply_adamw(v, m, s, t, lr_, g, weight_decay=0.1),
        [var, slot, np.abs(slot), np.array(3.0, np.float32), lr, grad],
        variables=(0, 1, 2, 3),
        grad=False,
    ),
    OpCase(
        "ApplyRMSProp",
        lambda v, ms, mom, lr_, g: cg.apply_rmsprop(v, ms, mom, lr_, g, decay=0.8, momentum=0.5, epsilon=1e-3),
        [var, np.abs(slot), rand(3, 4, seed=4), lr, grad],
        variables=(0, 1, 2),
        grad=False,
    ),
    OpCase(
        "ApplyAdam",
        lambda v, m, s, t, h, lr_, g: apply_optimizer(
            "adam", v, {"m": m, "v": s, "t": t, "vhat": h}, lr_, g, {"amsgrad": True}
        ),
        [var, slot, np.abs(slot), np.array(3.0, np.float32), np.abs(rand(3, 4, seed=5)), lr, grad],
        variables=(0, 1, 2, 3, 4),
        grad=False,
        id="amsgrad",
    ),
    OpCase(
        "ApplyRMSProp",
        lambda v, ms, mg, mom, lr_, g: apply_optimizer(
            "rmsprop",
            v,
            {"ms": ms, "mg": mg, "mom": mom},
            lr_,
            g,
            {"decay": 0.8, "momentum": 0.5, "epsilon": 1e-3, "centered": True},
        ),
        [var, np.abs(slot) + 1.0, rand(3, 4, seed=5) * 0.1, rand(3, 4, seed=4), lr, grad],
        variables=(0, 1, 2, 3),
        grad=False,
        id="centered",
    ),
    OpCase(
        "ApplyAdaMax",
        lambda v, m, u, t, lr_, g: apply_optimizer("adamax", v, {"m": m, "u": u, "t": t}, lr_, g, {"epsilon": 1e-3}),
        [var, slot, np.abs(slot), np.array(3.0, np.float32), lr, grad],
        variables=(0, 1, 2, 3),
        grad=False,
    ),
    OpCase(
        "ApplyNadam",
        lambda v, m, s, t, p, lr_, g: apply_optimizer(
            "nadam", v, {"m": m, "v": s, "t": t, "mu_product": p}, lr_, g, {}
        ),
        [var, slot, np.abs(slot), np.array(3.0, np.float32), np.array(0.6, np.float32), lr, grad],
        variables=(0, 1, 2, 3, 4),
        grad=False,
    ),
    OpCase(
        "ApplyNadam",
        lambda v, m, s, t, p, lr_, g: apply_optimizer(
            "nadam", v, {"m": m, "v": s, "t": t, "mu_product": p}, lr_, g, {}
        ),
        [var, slot, np.abs(slot), np.array(0.0, np.float32), np.array(0.0, np.float32), lr, grad],
        variables=(0, 1, 2, 3, 4),
        grad=False,
        id="first-step",
    ),
    OpCase(
        "ApplyAdadelta",
        lambda v, a, u, lr_, g: apply_optimizer("adadelta", v, {"accum": a, "accum_update": u}, lr_, g, {"rho": 0.8}),
        [var, np.abs(slot), np.abs(rand(3, 4, seed=5)), lr, grad],
        variables=(0, 1, 2),
        grad=False,
    ),
    OpCase(
        "ApplyAdagrad",
        lambda v, acc, lr_, g: cg.apply_adagrad(v, acc, lr_, g, initial_accumulator_value=0.2, epsilon=1e-3),
        [var, np.abs(slot), lr, grad],
        variables=(0, 1),
        grad=False,
    ),
]
