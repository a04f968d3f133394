"""The float32 GELU loops (kernels/cpu/gelu_f32.py) against float64's math.erfc, and the kernels that use them."""

from __future__ import annotations

import math

import numpy as np
import pytest

from cellgraph.dataflow.kernels.cpu import activations, gelu_f32

TINY = float(np.finfo(np.float32).tiny) * 2**10  # below this the result is subnormal: fewer digits to compare
GRID = np.linspace(-14.0, 8.0, 44001).astype(np.float32)


def _phi_erfc(x: np.ndarray) -> np.ndarray:
    return np.vectorize(math.erfc)(-x.astype(np.float64) * math.sqrt(0.5))


def _density(x: np.ndarray) -> np.ndarray:
    v = x.astype(np.float64)
    return v * np.exp(-0.5 * v * v) / math.sqrt(2 * math.pi)


def test_gelu_is_within_a_few_ulp_over_the_normal_range() -> None:
    want = 0.5 * GRID.astype(np.float64) * _phi_erfc(GRID)
    got = gelu_f32.gelu(GRID)
    assert got.dtype == np.float32
    normal = np.abs(want) > TINY
    relative = np.abs(got[normal] - want[normal]) / np.abs(want[normal])
    assert relative.max() < 6e-7  # 2^-24 is 6e-8: within 10 ulp, 4 measured
    assert np.all(np.abs(got[~normal]) <= TINY)


def test_gelu_grad_is_within_a_few_ulp_of_its_terms() -> None:
    # gelu'(x) = Phi(x) + x phi(x) crosses 0 near x = -0.75: the error is measured against the terms' size.
    dy = np.random.default_rng(3).normal(size=GRID.shape).astype(np.float32)
    terms = 0.5 * _phi_erfc(GRID) + np.abs(_density(GRID))
    want = dy.astype(np.float64) * (0.5 * _phi_erfc(GRID) + _density(GRID))
    got = gelu_f32.gelu_grad(dy, GRID)
    scale = np.abs(dy.astype(np.float64)) * terms
    normal = scale > TINY
    assert (np.abs(got[normal] - want[normal]) / scale[normal]).max() < 6e-7


def test_special_values_are_the_libm_loops() -> None:
    special = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 100.0, -100.0, 1e-30, -1e-30], np.float32)
    ones = np.ones_like(special)
    np.testing.assert_array_equal(gelu_f32.gelu(special), activations._gelu_libm(special))
    np.testing.assert_array_equal(gelu_f32.gelu_grad(ones, special), activations._gelu_grad_libm(ones, special))


def test_kernels_take_float32_through_the_loops_and_float64_through_libm() -> None:
    x = np.random.default_rng(4).normal(size=(5, 7)) * 3
    dy = np.random.default_rng(5).normal(size=(5, 7))
    np.testing.assert_array_equal(activations.gelu(x), activations._gelu_libm(x))
    np.testing.assert_array_equal(activations.gelu_grad(dy, x), activations._gelu_grad_libm(dy, x))
    x32, dy32 = x.astype(np.float32), dy.astype(np.float32)
    np.testing.assert_array_equal(activations.gelu(x32), gelu_f32.gelu(x32))
    np.testing.assert_array_equal(activations.gelu_grad(dy32, x32), gelu_f32.gelu_grad(dy32, x32))
    # A transposed (non-contiguous) input gives the values of its contiguous copy, in its shape.
    np.testing.assert_array_equal(activations.gelu(x32.T), gelu_f32.gelu(np.ascontiguousarray(x32.T)))


def test_gelu_grad_refuses_shapes_that_differ() -> None:
    with pytest.raises(ValueError, match=r"gelu_grad: gradient shape \(3,\) differs from input shape \(4,\)"):
        gelu_f32.gelu_grad(np.ones(3, np.float32), np.ones(4, np.float32))
