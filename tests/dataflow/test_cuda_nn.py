"""CUDA nn kernels the op table cannot compare with a NumPy reference.

Dropout's GPU mask is a counter-based hash of (seed, run, index), not NumPy's
generator, so its values cannot equal the reference's; these tests check what
holds on any device: mask values, ``y == x * mask``, the kept fraction, a new
mask per run, the same sequence for a new kernel, and the hash itself. Also
the cross-entropy's GPU answer to a bad label (NaN, where the CPU raises).
"""

from __future__ import annotations

import numpy as np
import pytest

import cellgraph as cg
from cellgraph.dataflow.opdef import KernelContext
from cellgraph.dataflow.variables import VariableStore

pytestmark = pytest.mark.cuda


def _bound(build, x: np.ndarray):  # noqa: ANN001, ANN202
    """The CUDA kernel of the node ``build`` makes from a placeholder like ``x``."""
    g = cg.Graph()
    with g.as_default():
        node = build(cg.placeholder(x.shape, x.dtype.name)).node
    return node.opdef.kernels["cuda"](node, KernelContext(VariableStore()))


def _run(kernel, *args: np.ndarray) -> list[np.ndarray]:  # noqa: ANN001
    from numba import cuda

    return [r.copy_to_host() for r in kernel(*[cuda.to_device(a) for a in args])]


def _host_mask(seed: int, run: int, size: int, rate: float) -> np.ndarray:
    """The documented draw, computed on the host: keep where hash >> 8 >= ceil(rate * 2**24)."""
    from cellgraph.dataflow.kernels.cuda import nn as cuda_nn  # imports numba.cuda: only in cuda tests

    key = cuda_nn._fmix32_host((cuda_nn._fmix32_host(seed) + run) & 0xFFFFFFFF)
    i = np.arange(size, dtype=np.uint64)
    h = cuda_nn._fmix32_host((cuda_nn._fmix32_host(i) + np.uint64(key)) & np.uint64(0xFFFFFFFF))
    return (h >> np.uint64(8)) >= np.uint64(np.ceil(rate * 2**24))


@pytest.mark.parametrize("rate", [0.25, 0.5])
def test_dropout_mask_values_output_and_kept_fraction(rate: float) -> None:
    x = np.random.default_rng(0).uniform(-1, 1, (64, 64)).astype(np.float32)
    y, mask = _run(_bound(lambda t: cg.dropout(t, rate, seed=7), x), x)
    scale = np.float32(1 / (1 - rate))
    assert y.dtype == mask.dtype == np.float32 and y.shape == mask.shape == x.shape
    assert np.all((mask == 0) | (mask == scale)), np.unique(mask)
    np.testing.assert_array_equal(y, x * mask)
    kept = np.mean(mask != 0)  # 4096 draws: one standard deviation is under 0.008
    assert abs(kept - (1 - rate)) < 0.04, kept


def test_dropout_draws_a_new_mask_each_run_and_replays_for_a_new_kernel() -> None:
    x = np.ones((8, 32), np.float32)
    build = lambda t: cg.dropout(t, 0.5, seed=3)  # noqa: E731
    kernel = _bound(build, x)
    first, second = _run(kernel, x)[1], _run(kernel, x)[1]
    assert not np.array_equal(first, second)
    again = _bound(build, x)
    np.testing.assert_array_equal(_run(again, x)[1], first)
    np.testing.assert_array_equal(_run(again, x)[1], second)


def test_dropout_mask_is_the_documented_hash() -> None:
    # The same integers on a GPU as on the host: no float or signed promotion
    # crept into the kernel's 32-bit arithmetic.
    x = np.ones(1000, np.float32)
    kernel = _bound(lambda t: cg.dropout(t, 0.3, seed=12345), x)
    for run in range(2):
        mask = _run(kernel, x)[1]
        np.testing.assert_array_equal(mask != 0, _host_mask(12345, run, x.size, 0.3))


def test_dropout_rate_zero_keeps_everything() -> None:
    x = np.random.default_rng(1).uniform(-1, 1, (4, 5)).astype(np.float32)
    y, mask = _run(_bound(lambda t: cg.dropout(t, 0.0), x), x)
    np.testing.assert_array_equal(mask, np.ones_like(x))
    np.testing.assert_array_equal(y, x)


def test_cross_entropy_gives_nan_for_a_label_out_of_range() -> None:
    logits = np.zeros((3, 4), np.float32)
    labels = np.array([1, 4, -1], np.int32)
    g = cg.Graph()
    with g.as_default():
        node = cg.sparse_softmax_cross_entropy(cg.placeholder((3, 4)), cg.placeholder((3,), "int32")).node
    kernel = node.opdef.kernels["cuda"](node, KernelContext(VariableStore()))
    loss, backprop = _run(kernel, logits, labels)
    np.testing.assert_allclose(loss[0], np.log(4), rtol=1e-6)
    np.testing.assert_allclose(backprop[0], [0.25, -0.75, 0.25, 0.25], rtol=1e-6)
    assert np.isnan(loss[1:]).all() and np.isnan(backprop[1:]).all()


def test_a_seeded_session_draws_other_masks_and_replays_its_own() -> None:
    x = np.ones((8, 32), np.float32)
    build = lambda t: cg.dropout(t, 0.5, seed=3)  # noqa: E731
    g = cg.Graph()
    with g.as_default():
        node = build(cg.placeholder(x.shape, "float32")).node

    def first_mask(seed: int | None) -> np.ndarray:
        return _run(node.opdef.kernels["cuda"](node, KernelContext(VariableStore(seed))), x)[1]

    unseeded, one, two = first_mask(None), first_mask(1), first_mask(2)
    assert not np.array_equal(one, unseeded) and not np.array_equal(one, two)
    np.testing.assert_array_equal(first_mask(1), one)
    np.testing.assert_array_equal(unseeded, _run(_bound(build, x), x)[1])  # no seed: the op's own, as before
