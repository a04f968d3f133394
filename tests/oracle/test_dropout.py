"""Dropout against torch.nn.functional.dropout's conventions: what training and evaluation compute, and its masks.

torch (and Keras) zero each element with probability ``p`` in training and
scale the rest by ``1 / (1 - p)``; in evaluation dropout is the identity. The
gradient of a training step goes through the very mask its forward pass drew;
every step draws a new mask; the same seed draws the same masks; fusion
changes nothing. Each is checked on a real Session, fused and unfused.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import cellgraph as cg

X = np.random.default_rng(0).standard_normal((200, 300)).astype(np.float32)
WEIGHTS = (np.arange(X.size, dtype=np.float32).reshape(X.shape) % 7) + 1  # a loss whose gradient is not all ones
RATE = 0.3


def training_step(rate: float = RATE, training: bool | None = True) -> tuple[cg.Graph, cg.Tensor, cg.Tensor]:
    """(graph, dropout output, gradient of sum(output * WEIGHTS) to x); ``training`` None: a training_switch."""
    g = cg.Graph()
    with g.as_default():
        x = cg.variable(lambda shape, dtype, seed: X.copy(), shape=X.shape, name="x")
        switch = cg.layers.training_switch() if training is None else training
        y = cg.layers.dropout(x, rate, training=switch, name="drop")
        [dx] = cg.gradients(cg.reduce_sum(y * cg.constant(WEIGHTS)), [x])
    return g, y, dx


@pytest.mark.parametrize("fuse", [True, False])
def test_training_keeps_1_minus_p_scaled_by_its_inverse_and_the_gradient_uses_the_forward_mask(fuse: bool) -> None:
    g, y, dx = training_step()
    out, grad = cg.Session(g, fuse=fuse).run([y, dx])
    kept = out != 0
    # A binomial count of 60,000 draws: 5 standard deviations either side.
    assert abs(kept.mean() - (1 - RATE)) < 5 * math.sqrt(RATE * (1 - RATE) / X.size)
    np.testing.assert_allclose(out[kept], X[kept] / (1 - RATE), rtol=1e-6)
    # torch's kept values of ones: the same scale.
    theirs = torch.nn.functional.dropout(torch.ones(X.shape), RATE, training=True).numpy()
    np.testing.assert_allclose(np.unique(theirs[theirs != 0]), [1 / (1 - RATE)], rtol=1e-6)
    np.testing.assert_array_equal(grad != 0, kept)
    np.testing.assert_allclose(grad[kept], WEIGHTS[kept] / (1 - RATE), rtol=1e-6)


@pytest.mark.parametrize("fuse", [True, False])
def test_evaluation_is_the_identity(fuse: bool) -> None:
    g, y, dx = training_step(training=False)
    out, grad = cg.Session(g, fuse=fuse).run([y, dx])
    np.testing.assert_array_equal(out, X)
    np.testing.assert_array_equal(grad, WEIGHTS)
    g, y, dx = training_step(training=None)
    switch = g.node("training").output(0)
    out, grad = cg.Session(g, fuse=fuse).run([y, dx], {switch: False})
    np.testing.assert_array_equal(out, X)
    np.testing.assert_array_equal(grad, WEIGHTS)


def test_each_step_draws_a_new_mask_and_a_session_replays_them_fused_or_not() -> None:
    g, y, _ = training_step()
    fused, unfused = cg.Session(g, fuse=True).run(y), cg.Session(g, fuse=False).run(y)
    session = cg.Session(g)
    first, second = session.run(y), session.run(y)
    assert not np.array_equal(first != 0, second != 0)
    again = cg.Session(g)
    np.testing.assert_array_equal(again.run(y), first)
    np.testing.assert_array_equal(again.run(y), second)
    np.testing.assert_array_equal(fused, unfused)
    np.testing.assert_array_equal(fused, first)
