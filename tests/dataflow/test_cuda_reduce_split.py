"""A reduction with few outputs shares each one's elements among several blocks (``kernels/cuda/reduce.py``).

One block per output left a GPU nearly idle for a whole-tensor sum, so few
outputs with many elements are cut into slices, one block each, and a second
launch folds the slices in order. The split thresholds are lowered here so
that the simulator's small shapes take that path; every kind must give what
NumPy gives, with NaN and ties placed on the slices' edges (the first index
wins a tie, a NaN wins everything and the first NaN's index is the answer).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from cellgraph.dataflow.kernels.cuda import reduce as cuda_reduce

RNG = np.random.default_rng(23)
KINDS = ("sum", "mean", "prod", "max", "min", "argmax", "argmin", "logsumexp")
NUMPY: dict[str, Callable[..., Any]] = {
    "sum": np.sum,
    "mean": np.mean,
    "prod": np.prod,
    "max": np.max,
    "min": np.min,
    "argmax": np.argmax,
    "argmin": np.argmin,
}


def test_few_outputs_with_many_elements_are_split_and_the_rest_are_not(monkeypatch: pytest.MonkeyPatch) -> None:
    split = cuda_reduce.split_slices
    assert cuda_reduce.SPLIT_BLOCKS == 512 and cuda_reduce.MIN_SLICE == 4096
    assert split("sum", 1, 64 * 1024 * 1024) == 512  # a whole tensor: enough blocks to fill a GPU
    assert split("sum", 32, 32 * 149 * 149) == 16  # batch norm's 32 channels of a large image: 512 blocks
    assert split("sum", 1, 8191) == 1  # too few elements to share
    assert split("sum", 512, 1 << 20) == 1  # enough outputs already
    assert split("logsumexp", 1, 1 << 20) == 1  # its two passes need the whole maximum first
    monkeypatch.setattr(cuda_reduce, "MIN_SLICE", 8)
    monkeypatch.setattr(cuda_reduce, "SPLIT_BLOCKS", 8)
    assert split("argmax", 2, 100) == 4


def test_adjacent_reduced_dims_are_one_dim_read_without_division() -> None:
    # A run of adjacent reduced dims of a C-contiguous array is one dim (its elements one stride apart), which
    # the kernel reads with one multiplication per element instead of a 64-bit division per dim.
    dims = cuda_reduce._dims
    strides = (60, 20, 5, 1)
    assert dims((2, 3, 4, 5), strides, [0, 1, 2]) == ((24,), (5,))  # N, H, W of NHWC: a channel's elements
    assert dims((2, 3, 4, 5), strides, [2, 3]) == ((20,), (1,))  # the last axes: contiguous
    assert dims((2, 3, 4, 5), strides, [0, 2]) == ((2, 4), (60, 5))  # not adjacent: two dims
    assert dims((2, 3, 4, 5), strides, []) == ((1,), (0,))


def _reduce(kind: str, x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    from numba import cuda

    return cuda_reduce.reduce(kind, cuda.to_device(x), axes, False).copy_to_host()


def _expected(kind: str, x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    if kind == "logsumexp":
        m = np.max(x, axis=axes, keepdims=True)
        m = np.where(np.isfinite(m), m, 0)
        return np.squeeze(np.log(np.sum(np.exp(x - m), axis=axes, keepdims=True)) + m, axis=axes)
    if kind in ("argmax", "argmin"):
        (axis,) = axes
        return NUMPY[kind](x, axis=axis)
    return NUMPY[kind](x, axis=axes)


@pytest.fixture
def small_splits(monkeypatch: pytest.MonkeyPatch) -> None:
    """Thresholds the simulator's shapes cross: slices of at least 8 elements, about 8 blocks in all."""
    monkeypatch.setattr(cuda_reduce, "MIN_SLICE", 8)
    monkeypatch.setattr(cuda_reduce, "SPLIT_BLOCKS", 8)


@pytest.mark.cuda
@pytest.mark.usefixtures("small_splits")
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("shape", "axes"), [((37,), (0,)), ((3, 29), (1,)), ((29, 3), (0,))])
def test_a_split_reduction_is_numpys(kind: str, shape: tuple[int, ...], axes: tuple[int, ...]) -> None:
    x = RNG.uniform(0.5, 1.5, size=shape).astype(np.float32)  # products stay near 1
    got, want = _reduce(kind, x, axes), _expected(kind, x, axes)
    assert cuda_reduce.split_slices(kind, want.size, x.size // want.size) > 1 or kind == "logsumexp"
    np.testing.assert_allclose(got, want, rtol=2e-5)


@pytest.mark.cuda
@pytest.mark.usefixtures("small_splits")
def test_a_split_reduction_over_every_axis_of_a_tensor() -> None:
    x = RNG.standard_normal((4, 5, 6)).astype(np.float64)
    for kind in ("sum", "mean", "max", "min"):
        np.testing.assert_allclose(_reduce(kind, x, (0, 1, 2)), _expected(kind, x, (0, 1, 2)), rtol=1e-12)


@pytest.mark.cuda
@pytest.mark.usefixtures("small_splits")
@pytest.mark.parametrize("kind", ["argmax", "argmin", "max", "min"])
def test_ties_and_nans_across_slices_keep_the_first_index(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    combined: list[tuple[Any, ...]] = []  # the second launch runs: the slices are folded there, not in one block
    make = cuda_reduce._combine_kernel

    def counted(*key: Any) -> Any:
        combined.append(key)
        return make(*key)

    monkeypatch.setattr(cuda_reduce, "_combine_kernel", counted)
    # 40 elements in 5 slices of 8: equal best values at 7 (the end of slice 0) and 8 (the start of slice 1);
    # then a NaN in slice 3 and another in slice 2, which must win (the first NaN).
    x = np.zeros(40, np.float32)
    best = 5.0 if kind in ("argmax", "max") else -5.0
    x[[7, 8, 30]] = best
    tie = _reduce(kind, x, (0,))
    assert tie == (7 if kind.startswith("arg") else best)
    x[[27, 20]] = np.nan
    with_nan = _reduce(kind, x, (0,))
    if kind.startswith("arg"):
        assert with_nan == 20 == NUMPY[kind](x)
    else:
        assert np.isnan(with_nan)
    assert len(combined) == 2
