"""cg.resize against torch.nn.functional.interpolate over a grid of sizes, up and down, odd and even.

cg.resize's ``bilinear`` is torch's ``bilinear`` with ``align_corners=False``
(half-pixel centres, no antialias) and its ``nearest`` torch's
``nearest-exact`` (half-pixel centres, ties up), not torch's legacy
``nearest`` (``floor(j * in / out)``). Output positions that land exactly on
a tie (7 to 9, 5 to 2, ...) are where a float rounding of the scale picks the
other pixel, so every pair of sizes from 1 to 12 is checked, forwards and
gradients.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import cellgraph as cg

SIZES = [(h, w, oh, ow) for h in range(1, 8) for w in (3, 7) for oh in range(1, 13) for ow in (2, 5, 9)]
TORCH_MODE = {"bilinear": {"mode": "bilinear", "align_corners": False}, "nearest": {"mode": "nearest-exact"}}


@pytest.mark.parametrize("method", ["bilinear", "nearest"])
def test_resize_is_torchs_interpolate_for_every_pair_of_sizes(method: str) -> None:
    for h, w, oh, ow in SIZES:
        x = np.random.default_rng(h * 10 + w).standard_normal((2, h, w, 3))
        weights = np.random.default_rng(oh).standard_normal((2, oh, ow, 3))
        g = cg.Graph()
        with g.as_default():
            images = cg.placeholder((2, h, w, 3), "float64", name="x")
            y = cg.resize(images, (oh, ow), method)
            [dx] = cg.gradients(cg.reduce_sum(y * cg.constant(weights, dtype="float64")), [images])
        ours, our_grad = cg.Session(g).run([y, dx], {images: x})
        tx = torch.tensor(x).permute(0, 3, 1, 2).requires_grad_(True)
        ty = torch.nn.functional.interpolate(tx, size=(oh, ow), **TORCH_MODE[method])  # type: ignore[arg-type]
        (ty * torch.tensor(weights).permute(0, 3, 1, 2)).sum().backward()
        where = f"{method} {h}x{w} -> {oh}x{ow}"
        np.testing.assert_allclose(ours, ty.detach().permute(0, 2, 3, 1).numpy(), rtol=1e-12, atol=1e-12, err_msg=where)
        assert tx.grad is not None
        np.testing.assert_allclose(our_grad, tx.grad.permute(0, 2, 3, 1).numpy(), rtol=1e-12, atol=1e-12, err_msg=where)
