"""The vectorised float32 loops (kernels/cpu/vector_f32.py) against float64 NumPy, over float32's whole range."""

from __future__ import annotations

import numpy as np
import pytest

from cellgraph.dataflow.kernels.cpu import activations as ak
from cellgraph.dataflow.kernels.cpu import nn as nnk
from cellgraph.dataflow.kernels.cpu import vector_f32 as f32

TINY = float(np.finfo(np.float32).tiny)
ULP = 2.0**-24  # half the spacing of float32 at 1: a relative error of 1 ulp is at most 2 * ULP
GRID = np.linspace(-110.0, 90.0, 400_001, dtype=np.float32)
SPECIAL = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 88.72, 88.73, -87.33, -103.0, -103.97, -104.5], np.float32)


def _exact(fn, x: np.ndarray) -> np.ndarray:  # noqa: ANN001
    with np.errstate(over="ignore", under="ignore"):
        return fn(x.astype(np.float64))


def _check_relative(x: np.ndarray, got: np.ndarray, want: np.ndarray, ulps: float, what: str) -> None:
    """Relative error within ``ulps`` where the result is a normal float32; within one subnormal step below."""
    got = got.astype(np.float64)
    normal = (np.abs(want) >= TINY) & (np.abs(want) <= float(np.finfo(np.float32).max))
    rel = np.abs(got[normal] - want[normal]) / np.abs(want[normal])
    assert rel.max() <= ulps * 2 * ULP, f"{what}: relative error {rel.max():.3g} at x = {x[normal][rel.argmax()]}"
    small = np.abs(want) < TINY
    assert np.abs(got[small] - want[small]).max(initial=0) <= 2.0**-149, f"{what}: subnormals off by more than 1 step"


def test_exp_is_within_two_ulp_and_rounds_into_the_subnormals() -> None:
    _check_relative(GRID, f32.exp(GRID), _exact(np.exp, GRID), 2, "exp")
    got = f32.exp(SPECIAL)
    with np.errstate(over="ignore"):
        want = _exact(np.exp, SPECIAL).astype(np.float32)
    assert np.isnan(got[0]) and got[1] == np.inf and got[2] == 0.0 and got[6] == np.inf and got[10] == 0.0
    np.testing.assert_allclose(got[3:], want[3:], rtol=3 * ULP, atol=2.0**-149)


@pytest.mark.parametrize(
    ("name", "kernel", "exact", "ulps", "low"),
    [
        ("sigmoid", nnk.sigmoid, lambda x: 1 / (1 + np.exp(-x)), 4, -110),
        # x * sigmoid(x): below -87 sigmoid(x) is subnormal and has few digits left (in PyTorch too).
        ("silu", ak.silu, lambda x: x / (1 + np.exp(-x)), 4, -87),
        ("tanh", nnk.tanh, np.tanh, 8, -110),  # scalar.tanh_f32's rational function: 3.8e-7 relative
        ("elu", lambda x: ak.elu(x, np.float32(0.7)), lambda x: np.where(x > 0, x, 0.7 * np.expm1(x)), 4, -110),
        ("selu", ak.selu, lambda x: ak.SELU_SCALE * np.where(x > 0, x, ak.SELU_ALPHA * np.expm1(x)), 4, -110),
        ("softplus", ak.softplus, lambda x: np.logaddexp(0, x), 4, -110),
    ],
)
def test_float32_kernels_keep_their_tails(name: str, kernel, exact, ulps: int, low: float) -> None:  # noqa: ANN001
    x = GRID[(np.abs(GRID) > 1e-30) & (GRID >= low)]
    got = kernel(x)
    assert got.dtype == np.float32
    _check_relative(x, got, _exact(exact, x), ulps, name)
    special = kernel(SPECIAL)
    assert np.isnan(special[0]), f"{name}: NaN must stay NaN"
    np.testing.assert_array_equal(special[3:5], _exact(exact, SPECIAL[3:5]).astype(np.float32))


@pytest.mark.parametrize(
    "kernel",
    [nnk.sigmoid, nnk.tanh, ak.silu, ak.selu, ak.softplus, lambda x: ak.elu(x, x.dtype.type(0.5))],
    ids=["sigmoid", "tanh", "silu", "selu", "softplus", "elu"],
)
def test_shapes_and_float64_are_served(kernel) -> None:  # noqa: ANN001
    x = np.linspace(-3, 3, 24, dtype=np.float32).reshape(2, 3, 4)
    assert kernel(x).shape == (2, 3, 4)
    assert kernel(np.zeros((0, 5), np.float32)).shape == (0, 5)
    assert np.asarray(kernel(np.array(0.5, np.float32))).shape == ()
    np.testing.assert_allclose(kernel(x), kernel(x.astype(np.float64)), rtol=1e-6)  # float64: the libm loop
    assert kernel(x.astype(np.float64)).dtype == np.float64
