"""cg.optim.mixed_precision step by step against torch.amp.GradScaler (PyTorch 2.13, CPU) on a float16 model.

Same float32 master weights, same float16 forward, Adam under a dynamic loss scale that starts too high: the
steps torch skips (an inf in a float16 gradient), the scale after every step (halved on a skip, doubled after
``growth_interval`` finite steps) and the weights (untouched by a skipped step, Adam's moments and step count
included) must be torch's.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import cellgraph as cg

from ..oracle import NO_TORCH

torch = pytest.importorskip("torch", reason=NO_TORCH)

STEPS, INITIAL_SCALE, GROWTH_INTERVAL = 8, 2.0**14, 2
_rng = np.random.default_rng(0)
X = _rng.uniform(0.5, 1.5, (4, 3)).astype(np.float32)
TARGET = _rng.uniform(20, 30, (4, 2)).astype(np.float32)
W0 = _rng.uniform(-1, 1, (3, 2)).astype(np.float32)
# The weight's gradient peaks near 25 (2 * 25 / 8 per row, four rows of x near 1): scaled by 4096 it is ~1e5,
# past float16's 65504 (skipped); by 2048, ~5e4 (kept). Neither side of the line is within float16's rounding.


def _torch_steps() -> tuple[list[float], list[np.ndarray]]:
    w = torch.tensor(W0, requires_grad=True)
    opt = torch.optim.Adam([w], lr=0.01, eps=1e-8)
    scaler = torch.amp.GradScaler("cpu", init_scale=INITIAL_SCALE, growth_interval=GROWTH_INTERVAL)
    scales, weights = [], []
    for _ in range(STEPS):
        opt.zero_grad()
        y = (torch.from_numpy(X).half() @ w.half()).float()
        scaler.scale(((y - torch.from_numpy(TARGET)) ** 2).mean()).backward()
        scaler.step(opt)
        scaler.update()
        scales.append(float(scaler.get_scale()))
        weights.append(w.detach().numpy().copy())
    return scales, weights


def _cellgraph_steps() -> tuple[list[float], list[np.ndarray], int]:
    g = cg.Graph()
    with g.as_default():
        w = cg.variable(W0, name="w")
        mp = cg.optim.mixed_precision(
            cg.optim.Adam(0.01, epsilon=1e-8), initial_scale=INITIAL_SCALE, growth_interval=GROWTH_INTERVAL
        )
        y = cg.cast(cg.matmul(mp.cast(cg.constant(X)), mp.cast(w)), "float32")
        train = mp.minimize(cg.reduce_mean(cg.square(y - TARGET)))
    sess = cg.Session(g)
    assert mp.loss_scale is not None
    scales, weights = [], []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", cg.optim.LossScaleWarning)
        for _ in range(STEPS):
            sess.run(train)
            scales.append(float(sess.run(mp.loss_scale)))
            weights.append(sess.run(w))
    return scales, weights, sum(isinstance(c.message, cg.optim.LossScaleWarning) for c in caught)


def test_skips_scales_and_adam_updates_follow_torch_grad_scaler() -> None:
    want_scales, want_weights = _torch_steps()
    scales, weights, skipped = _cellgraph_steps()
    # Three skips from 2**14 down to 2048, two good steps double it, one skip, two good steps, one doubling.
    assert want_scales == [8192.0, 4096.0, 2048.0, 2048.0, 4096.0, 2048.0, 2048.0, 4096.0], want_scales
    assert scales == want_scales
    assert skipped == 4
    np.testing.assert_array_equal(weights[2], W0)  # nothing moved while every step was skipped
    for step, (got, want) in enumerate(zip(weights, want_weights)):
        # Both compute the float16 products from float32 sums; Adam's update is float32 on either side.
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6, err_msg=f"step {step + 1}")


# Two losses trained by turns with one wrapper: the small one (x = 0.5) never overflows here; the large one's
# gradient (x = 4, so 4 * scale) overflows float16 at 2**14 (65536 > 65504) and fits at 2**13.
SMALL_X, LARGE_X = np.float32(0.5), np.float32(4.0)
TURNS, TURN_SCALE, TURN_GROWTH = 6, 2.0**14, 3


def _torch_turns() -> tuple[list[float], np.ndarray]:
    w = torch.tensor(W0[:, 0], requires_grad=True)
    opt = torch.optim.SGD([w], lr=0.01)
    scaler = torch.amp.GradScaler("cpu", init_scale=TURN_SCALE, growth_interval=TURN_GROWTH)
    scales = []
    for _ in range(TURNS):
        for x in (SMALL_X, LARGE_X):
            opt.zero_grad()
            scaler.scale((w.half() * torch.tensor(x).half()).float().sum()).backward()
            scaler.step(opt)
            scaler.update()
            scales.append(float(scaler.get_scale()))
    return scales, w.detach().numpy()


def _cellgraph_turns() -> tuple[list[float], np.ndarray]:
    g = cg.Graph()
    with g.as_default():
        w = cg.variable(W0[:, 0], name="w")
        mp = cg.optim.mixed_precision(cg.optim.SGD(0.01), initial_scale=TURN_SCALE, growth_interval=TURN_GROWTH)
        trains = [mp.minimize(cg.reduce_sum(cg.cast(mp.cast(w) * mp.cast(cg.constant(x)), "float32"))) for x in
                  (SMALL_X, LARGE_X)]  # fmt: skip
    sess = cg.Session(g)
    assert mp.loss_scale is not None
    scales = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", cg.optim.LossScaleWarning)
        for _ in range(TURNS):
            for train in trains:
                sess.run(train)
                scales.append(float(sess.run(mp.loss_scale)))
    return scales, sess.run(w)


def test_one_wrapper_on_two_losses_by_turns_keeps_one_scale_as_one_grad_scaler_does() -> None:
    """Each minimize made its own scale before: the small loss's grew while the large one's shrank, the skips
    fell elsewhere than one GradScaler's, and the weights landed elsewhere, without a word."""
    want_scales, want_w = _torch_turns()
    scales, w = _cellgraph_turns()
    # The large loss's turn at 2**14 is skipped; three good turns at 2**13 double the one scale, and again.
    assert want_scales[:5] == [16384.0, 8192.0, 8192.0, 8192.0, 16384.0], want_scales
    assert scales == want_scales
    np.testing.assert_allclose(w, want_w, rtol=0, atol=1e-6)


def test_one_wrapper_makes_its_scale_and_counters_once() -> None:
    g = cg.Graph()
    with g.as_default():
        w = cg.variable(W0[:, 0], name="w")
        mp = cg.optim.mixed_precision(cg.optim.SGD(0.01))
        for x in (SMALL_X, LARGE_X):
            mp.minimize(cg.reduce_sum(cg.cast(mp.cast(w) * mp.cast(cg.constant(x)), "float32")))
    assert sorted(n.name for n in g.variables() if "loss_scale" in n.name) == [
        "mixed_precision_SGD/loss_scale", "mixed_precision_SGD/loss_scale/good_steps",
        "mixed_precision_SGD/loss_scale/steps",
    ]  # fmt: skip
