"""The CUDA twins of ``test_numeric_edges.py``'s fixes, on small shapes (Numba's simulator, or a GPU).

Each kernel is bound to its node and run on the device; the CPU kernel of the same node is the reference, and
the expected numbers are written out, so a twin that drifts from the CPU rule fails here.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import cellgraph as cg
from cellgraph.dataflow.opdef import KernelContext
from cellgraph.dataflow.variables import VariableStore

pytestmark = pytest.mark.cuda


def _both(build: Callable[..., cg.Tensor], *arrays: np.ndarray) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(CPU results, CUDA results) of the node ``build`` makes from placeholders like ``arrays``."""
    from numba import cuda

    g = cg.Graph()
    with g.as_default():
        node = build(*[cg.placeholder(a.shape, a.dtype.name, name=f"x{i}") for i, a in enumerate(arrays)]).node
    ctx = KernelContext(VariableStore())
    as_list = lambda r: list(r) if isinstance(r, (tuple, list)) else [r]  # noqa: E731
    cpu = as_list(node.opdef.kernels["cpu"](node, ctx)(*arrays))
    gpu = as_list(node.opdef.kernels["cuda"](node, ctx)(*[cuda.to_device(a) for a in arrays]))
    return [np.asarray(r) for r in cpu], [r.copy_to_host() for r in gpu]


NAN_ROWS = np.array([[np.nan, 1, 3, -2], [1, np.nan, 3, -2], [1, 3, -2, np.nan], [1, np.nan, np.nan, 5]], np.float32)


@pytest.mark.parametrize("op", [cg.reduce_max, cg.reduce_min, cg.argmax, cg.argmin])
def test_cuda_reductions_see_a_nan_wherever_it_stands(op: Callable[..., cg.Tensor]) -> None:
    cpu, gpu = _both(lambda t: op(t, 1), NAN_ROWS)
    np.testing.assert_array_equal(gpu[0], cpu[0])
    want: dict[Any, list[float]] = {
        cg.reduce_max: [np.nan] * 4, cg.reduce_min: [np.nan] * 4, cg.argmax: [0, 1, 3, 1], cg.argmin: [0, 1, 3, 1],
    }  # fmt: skip
    np.testing.assert_array_equal(gpu[0], want[op])


def test_cuda_max_pool_sees_a_nan_and_its_gradient_goes_there() -> None:
    x = np.array([1, np.nan, 3, 4, 5, 6, 7, 8], np.float32).reshape(1, 2, 4, 1)
    cpu, gpu = _both(lambda t: cg.max_pool(t, 2, 2, "VALID"), x)
    np.testing.assert_array_equal(gpu[0].ravel(), [np.nan, 8])
    np.testing.assert_array_equal(gpu[0], cpu[0])
    cpu, gpu = _both(lambda t: cg.max_pool_with_argmax(t, 2, 2, "VALID")[0], x)
    np.testing.assert_array_equal(gpu[1].ravel(), [1, 7])
    np.testing.assert_array_equal(gpu[1], cpu[1])


def test_cuda_cumsum_accumulates_float32_in_float64() -> None:
    # 2**24 + 1 is 2**24 in float32: a float32 running total never leaves it; a float64 one reaches 2**24 + 4
    # (each stored total rounded to float32, ties to even: 2**24 + 1 -> 2**24, 2**24 + 3 -> 2**24 + 4).
    x = np.array([2.0**24, 1, 1, 1, 1], np.float32)
    cpu, gpu = _both(lambda t: cg.cumsum(t, axis=0), x)
    np.testing.assert_array_equal(gpu[0], [2**24, 2**24, 2**24 + 2, 2**24 + 4, 2**24 + 4])
    np.testing.assert_array_equal(gpu[0], cpu[0])


def test_cuda_log_softmax_and_cross_entropy_at_huge_logits() -> None:
    x = np.array([[1e30, 1e30, 1e30], [3e38, 3e38, -3e38]], np.float32)
    cpu, gpu = _both(cg.log_softmax, x)
    np.testing.assert_allclose(gpu[0][0], [-math.log(3)] * 3, rtol=1e-6)
    np.testing.assert_allclose(gpu[0][1], [-math.log(2), -math.log(2), -np.inf], rtol=1e-6)
    np.testing.assert_allclose(gpu[0], cpu[0], rtol=1e-6)
    labels = np.array([0, 1], np.int32)
    cpu, gpu = _both(lambda t, y: cg.sparse_softmax_cross_entropy(t, y), x, labels)
    np.testing.assert_allclose(gpu[0], [math.log(3), math.log(2)], rtol=1e-6)
    np.testing.assert_allclose(gpu[0], cpu[0], rtol=1e-6)


@pytest.mark.parametrize("op", [cg.tensor_scatter_nd_max, cg.tensor_scatter_nd_min])
def test_cuda_tensor_scatter_max_and_min_keep_a_nan(op: Callable[..., cg.Tensor]) -> None:
    data = np.array([1.0, 5.0, 2.0, np.nan], np.float32)
    rows = np.array([[0], [1], [1], [3]], np.int32)
    updates = np.array([np.nan, 3.0, np.nan, 4.0], np.float32)
    cpu, gpu = _both(op, data, rows, updates)
    np.testing.assert_array_equal(gpu[0], [np.nan, np.nan, 2.0, np.nan])
    np.testing.assert_array_equal(gpu[0], cpu[0])


def test_cuda_normalization_of_a_row_holding_an_inf_is_nan() -> None:
    from cellgraph.dataflow.ops.normalization import fused_batch_norm

    x = np.random.default_rng(0).standard_normal((4, 6)).astype(np.float32)
    x[0, 2], x[3, 3] = np.inf, -np.inf
    gamma, beta = np.ones(6, np.float32), np.zeros(6, np.float32)
    cpu, gpu = _both(cg.layer_norm, x, gamma, beta)
    np.testing.assert_allclose(gpu[0], cpu[0], rtol=1e-5, atol=1e-6, equal_nan=True)
    assert np.isnan(gpu[0][0]).all() and np.isnan(gpu[0][3]).all() and np.isfinite(gpu[0][1:3]).all()
    cpu, gpu = _both(lambda t, g, b: fused_batch_norm(t, g, b)[0], x, gamma, beta)
    np.testing.assert_allclose(gpu[0], cpu[0], rtol=1e-5, atol=1e-6, equal_nan=True)
    assert np.isnan(gpu[0][:, [2, 3]]).all() and np.isfinite(np.delete(gpu[0], [2, 3], axis=1)).all()


def test_cuda_maximum_minimum_and_clip_keep_a_nan() -> None:
    a = np.array([1.0, np.nan, 2.0, -np.inf, np.nan], np.float32)
    b = np.array([np.nan, 1.0, np.nan, 3.0, np.nan], np.float32)
    for op, want in ((cg.maximum, np.maximum(a, b)), (cg.minimum, np.minimum(a, b))):
        cpu, gpu = _both(op, a, b)
        np.testing.assert_array_equal(gpu[0], want)
        np.testing.assert_array_equal(gpu[0], cpu[0])
    low, high = np.array(-0.5, np.float32), np.array(0.5, np.float32)
    cpu, gpu = _both(cg.clip_by_value, a, low, high)
    np.testing.assert_array_equal(gpu[0], np.clip(a, -0.5, 0.5))
    np.testing.assert_array_equal(gpu[0], cpu[0])


def test_cuda_float_floordiv_is_pythons() -> None:
    a = np.array([1.0, 0.3, -1.0, 7.0, -1e4, 5.0, -0.0], np.float32)
    b = np.array([0.1, 0.1, 0.1, 0.7, np.inf, -np.inf, 2.0], np.float32)
    cpu, gpu = _both(cg.floordiv, a, b)
    np.testing.assert_array_equal(gpu[0], np.floor_divide(a, b))
    np.testing.assert_array_equal(gpu[0], cpu[0])


def test_cuda_float_floordiv_of_large_and_huge_quotients() -> None:
    # The device function floors in floats: an int64 floor (Numba's math.floor) overflows past 2**63.
    a = np.array([3e38, -3e38, 1e30, 7.5, -7.5, 1e-30, -1e-30, np.inf, -np.inf, np.nan, 1.0], np.float32)
    b = np.array([1e-30, 1e-30, 3.0, 2.0, 2.0, -np.inf, np.inf, 2.0, np.inf, 1.0, np.nan], np.float32)
    with np.errstate(all="ignore"):
        cpu, gpu = _both(cg.floordiv, a, b)
        want = np.floor_divide(a, b)
    np.testing.assert_array_equal(gpu[0], want)
    np.testing.assert_array_equal(gpu[0], cpu[0])


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_a_fused_clip_and_relu_keep_a_nan_from_any_operand(device: str) -> None:
    # A fused loop's max/min must not be the builtin: on a GPU that is fmax, which drops a NaN (a fused Relu of
    # NaN was 0 on an H200, where the simulator, running Python's max, kept it).
    from numba import cuda

    from cellgraph.dataflow.executor import Plan

    x = np.array([np.nan, -1.0, 0.25, 2.0, np.nan], np.float32)
    low = np.array([-0.5, np.nan, -0.5, -0.5, -0.5], np.float32)
    g = cg.Graph()
    with g.as_default():
        xs, lows = cg.placeholder((5,), "float32", name="x"), cg.placeholder((5,), "float32", name="low")
        out = cg.relu(cg.clip_by_value(xs * 1.0, lows, 0.5) + 0.0)
    plan = Plan(g, [out], [], [xs, lows], VariableStore(), device=device, fuse=True)
    assert max(len(step.nodes) for step in plan.steps) >= 4, "the chain must fuse"
    feeds = (x, low) if device == "cpu" else (cuda.to_device(x), cuda.to_device(low))
    (got,) = plan(*feeds)
    got = np.asarray(got) if device == "cpu" else got.copy_to_host()
    want = np.maximum(np.minimum(np.maximum(x, low), np.float32(0.5)), 0)
    np.testing.assert_array_equal(got, want)
    assert np.isnan(got[[0, 1, 4]]).all()


def test_cuda_sign_of_an_unsigned_int_is_one_or_zero() -> None:
    x = np.array([0, 1, 200, 255], np.uint8)
    cpu, gpu = _both(cg.sign, x)
    np.testing.assert_array_equal(gpu[0], [0, 1, 1, 1])
    np.testing.assert_array_equal(cpu[0], [0, 1, 1, 1])


def test_cuda_float_floormod_is_pythons() -> None:
    a = np.array([-1e4, 5.0, 7.5, -7.5, 0.0, -0.0, 1.0, 3e38, np.inf, 2.0], np.float32)
    b = np.array([np.inf, -np.inf, 2.0, 2.0, -3.0, 3.0, 0.1, 1e-30, 2.0, np.nan], np.float32)
    with np.errstate(all="ignore"):
        cpu, gpu = _both(cg.floormod, a, b)
        want = np.mod(a, b)
    np.testing.assert_array_equal(gpu[0], want)
    np.testing.assert_array_equal(np.signbit(gpu[0]), np.signbit(want))  # a zero takes the divisor's sign
    np.testing.assert_array_equal(gpu[0], cpu[0])
