"""Rows for ops/activations.py. Random inputs keep clear of each kink (0, +-3, 6) by far more
than the finite-difference step."""

from __future__ import annotations

import numpy as np

import cellgraph as cg
from cellgraph.dataflow.ops import activations

from . import OpCase, rand

x = rand(3, 4, seed=51) * 3
TAILS = np.array([-100.0, -30.0, -1e-3, 0.0, 1e-3, 30.0, 100.0, np.nan], np.float32)

CASES = [
    OpCase("LeakyRelu", lambda t: cg.leaky_relu(t), [x]),
    OpCase("LeakyRelu", lambda t: cg.leaky_relu(t, alpha=0.01), [x], static_shapes=[(None, 4)], id="alpha"),
    OpCase("Elu", lambda t: cg.elu(t), [x]),
    OpCase("Elu", lambda t: cg.elu(t, alpha=0.5), [x], id="alpha"),
    OpCase("Selu", lambda t: cg.selu(t), [x]),
    OpCase("Gelu", lambda t: cg.gelu(t), [x]),
    OpCase("Gelu", lambda t: cg.gelu(t), [TAILS], grad=False, id="tails"),
    OpCase("GeluGrad", lambda g, t: activations.gelu_grad(g, t), [rand(3, 4, seed=52), x]),
    OpCase("GeluGrad", lambda g, t: activations.gelu_grad(g, t), [rand(8, seed=53), TAILS], grad=False, id="tails"),
    OpCase("GeluTanh", lambda t: cg.gelu(t, approximate=True), [x]),
    OpCase("GeluTanh", lambda t: cg.gelu(t, approximate="tanh"), [TAILS], grad=False, id="tails"),
    OpCase("Softplus", lambda t: cg.softplus(t), [x]),
    OpCase("Softplus", lambda t: cg.softplus(t), [TAILS], grad=False, id="tails"),
    OpCase("Softsign", lambda t: cg.softsign(t), [x]),
    OpCase("Silu", lambda t: cg.silu(t), [x]),
    OpCase("Silu", lambda t: cg.swish(t), [TAILS], grad=False, id="tails"),
    OpCase("Relu6", lambda t: cg.relu6(t), [x * 3]),
    OpCase(
        "Relu6",
        lambda t: cg.relu6(t),
        [np.array([-1.0, 0.0, 3.0, 6.0, 7.5, np.nan], np.float32)],
        grad=False,
        id="edges",
    ),
    OpCase("HardSigmoid", lambda t: cg.hard_sigmoid(t), [x * 2]),
    OpCase(
        "HardSigmoid",
        lambda t: cg.hard_sigmoid(t),
        [np.array([-4.0, -3.0, 0.0, 1.5, 3.0, 9.0], np.float32)],
        grad=False,
        id="edges",
    ),
]
