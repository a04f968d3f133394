"""cg.init's random initializers against the conventions they name: torch.nn.init's fans and bounds, on our layouts.

Our kernels are (in, out) for dense and (kh, kw, in / groups, out) for conv2d
(HWIO); PyTorch's are (out, in) and (out, in / groups, kh, kw). A fan computed
on the wrong axes would still give plausible numbers and train differently, so
the fans are checked against torch's own ``_calculate_fan_in_and_fan_out`` of
the same kernel in PyTorch's layout, and the draws' moments against the
bounds and standard deviations torch.nn.init uses, on a million samples.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import cellgraph as cg

# (our shape, the same kernel in PyTorch's layout)
KERNELS = [
    ((300, 200), (200, 300)),  # dense: (in, out) / Linear's (out, in)
    ((3, 3, 16, 32), (32, 16, 3, 3)),  # conv2d HWIO / Conv2d's OIHW
    ((5, 1, 8, 24), (24, 8, 5, 1)),  # a grouped conv's kernel: in / groups channels
    ((7, 64), (64, 7)),
]
SAMPLES = 1_000_000


def torch_fans(shape: tuple[int, ...]) -> tuple[int, int]:
    fan_in, fan_out = torch.nn.init._calculate_fan_in_and_fan_out(torch.empty(shape))
    return int(fan_in), int(fan_out)


def draws(init: cg.init.GlorotUniform | cg.init.HeNormal, shape: tuple[int, ...]) -> np.ndarray:
    """About a million draws of ``init`` for a kernel of ``shape`` (ours), from seeds 0, 1, ..."""
    repeats = math.ceil(SAMPLES / math.prod(shape))
    return np.concatenate([init(shape, "float64", seed=s).ravel() for s in range(repeats)])


@pytest.mark.parametrize(("ours", "theirs"), KERNELS)
def test_glorot_uniform_has_torchs_xavier_bound_for_the_same_kernel(
    ours: tuple[int, ...], theirs: tuple[int, ...]
) -> None:
    fan_in, fan_out = torch_fans(theirs)
    limit = math.sqrt(6.0 / (fan_in + fan_out))  # xavier_uniform_ with gain 1, Keras's glorot_uniform
    assert cg.init.glorot_uniform(ours, "float64", seed=0).shape == ours
    many = draws(cg.init.glorot_uniform, ours)
    assert np.abs(many).max() <= limit and np.abs(many).max() > 0.999 * limit
    assert abs(many.mean()) < 0.005 * limit
    assert many.var() == pytest.approx(limit**2 / 3, rel=0.005)


@pytest.mark.parametrize(("ours", "theirs"), KERNELS)
def test_he_normal_is_torchs_kaiming_normal_fan_in_relu_untruncated(
    ours: tuple[int, ...], theirs: tuple[int, ...]
) -> None:
    fan_in, _ = torch_fans(theirs)
    std = math.sqrt(2.0) / math.sqrt(fan_in)  # kaiming_normal_(mode="fan_in", nonlinearity="relu")
    assert cg.init.he_normal(ours, "float64", seed=0).shape == ours
    many = draws(cg.init.he_normal, ours)
    assert abs(many.mean()) < 0.005 * std
    assert many.std() == pytest.approx(std, rel=0.003)
    # Untruncated, as torch's: a million normal draws reach past 4 std; Keras's he_normal stops at 2 std.
    assert np.abs(many).max() > 4 * std
    assert ((many / std) ** 4).mean() == pytest.approx(3.0, rel=0.02)


def test_conv2d_and_dense_layers_draw_their_kernels_on_torchs_fans() -> None:
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((None, 8, 8, 32), name="x")
        cg.layers.conv2d(x, 64, (5, 3), groups=4, name="conv")
        cg.layers.dense(cg.placeholder((None, 400), name="v"), 300, name="fc")
    session = cg.Session(g)
    conv = session.run(g.node("conv/kernel").output(0))
    assert conv.shape == (5, 3, 8, 64)
    fan_in, _ = torch_fans((64, 8, 5, 3))  # Conv2d(32, 64, (5, 3), groups=4).weight
    assert fan_in == 120 and conv.std() == pytest.approx(math.sqrt(2 / fan_in), rel=0.03)
    dense = session.run(g.node("fc/kernel").output(0))
    fan_in, fan_out = torch_fans((300, 400))  # Linear(400, 300).weight
    limit = math.sqrt(6 / (fan_in + fan_out))
    assert np.abs(dense).max() <= limit and dense.var() == pytest.approx(limit**2 / 3, rel=0.02)


def test_the_same_seed_draws_the_same_kernel_and_two_variables_draw_two() -> None:
    a = cg.init.glorot_uniform((3, 3, 4, 5), "float32", seed=7)
    assert np.array_equal(a, cg.init.glorot_uniform((3, 3, 4, 5), "float32", seed=7))
    assert not np.array_equal(a, cg.init.glorot_uniform((3, 3, 4, 5), "float32", seed=8))
    g = cg.Graph()
    with g.as_default():
        w1 = cg.variable(cg.init.he_normal, shape=(64, 64), name="w")
        w2 = cg.variable(cg.init.he_normal, shape=(64, 64), name="w")  # named w_1: another seed
    first, second = cg.Session(g).run([w1, w2])
    assert not np.array_equal(first, second)
    assert np.array_equal(first, cg.Session(g).run(w1))
