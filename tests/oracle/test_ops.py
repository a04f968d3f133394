"""Every row of the oracle table against torch: static shapes, and ``None`` dims fed
at each of the row's sizes (1, n, 0, one side 1 and the other n), fused and unfused."""

from __future__ import annotations

import numpy as np
import pytest

from . import NO_TORCH

torch = pytest.importorskip("torch", reason=NO_TORCH)

import cellgraph as cg  # noqa: E402

from .harness import check_row  # noqa: E402
from .rows import ROWS, Row  # noqa: E402

CASES = [
    pytest.param(row, sizes, dynamic, id=f"{row.label}-{label}-{'none' if dynamic else 'static'}")
    for row in ROWS
    for label, sizes in row.size_sets()
    for dynamic in ((False, True) if row.names else (False,))
]


@pytest.mark.parametrize("fuse", [True, False], ids=["fused", "unfused"])
@pytest.mark.parametrize(("row", "sizes", "dynamic"), CASES)
def test_op_matches_torch(row: Row, sizes: dict[str, int], dynamic: bool, fuse: bool) -> None:
    check_row(row, sizes, dynamic, fuse)


# float32 where a fused loop has its own formula: relative accuracy in the tails, as torch has it.
TAILS32 = np.array([-80, -60, -35, -20, -5, -0.5, -1e-3, 0, 1e-3, 0.5, 5, 20, 35, 60, 80], np.float32)
ACTIVATIONS = {
    "sigmoid": (cg.sigmoid, torch.sigmoid),
    "tanh": (cg.tanh, torch.tanh),
    "exp": (lambda t: cg.exp(t * 0.5), lambda t: torch.exp(t * 0.5)),
}


@pytest.mark.parametrize("fuse", [True, False], ids=["fused", "unfused"])
@pytest.mark.parametrize("name", list(ACTIVATIONS))
def test_float32_activation_tails_match_torch(name: str, fuse: bool) -> None:
    cg_fn, torch_fn = ACTIVATIONS[name]
    weights = np.linspace(0.5, 1.5, TAILS32.size, dtype=np.float32)
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((None,), "float32", name="x")
        w = cg.placeholder((None,), "float32", name="w")
        probe = cg_fn(x) * w  # read by nothing else: one fused loop
        (dx,) = cg.gradients(cg.reduce_sum(probe), [x])
    sess = cg.Session(g, fuse=fuse)
    got = sess.run(probe, {x: TAILS32, w: weights})
    got_dx = sess.run(dx, {x: TAILS32, w: weights})
    t = torch.tensor(TAILS32, requires_grad=True)
    want = torch_fn(t) * torch.from_numpy(weights)
    (want_dx,) = torch.autograd.grad(want.sum(), t)
    np.testing.assert_allclose(got, want.detach().numpy(), rtol=2e-6, atol=0, err_msg=f"{name} forward")
    # A gradient from the float32 output y (1 - y * y near y = 1) keeps fewer digits, in torch as here.
    np.testing.assert_allclose(got_dx, want_dx.numpy(), rtol=1e-4, atol=0, err_msg=f"{name} gradient")
