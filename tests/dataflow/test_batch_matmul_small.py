"""Small batched products (attention over a few tokens) take NumPy's matmul loop instead of a BLAS call each."""

from __future__ import annotations

import numpy as np
import pytest

from cellgraph.dataflow.kernels.cpu import batch_matmul as bm


@pytest.mark.parametrize("ta", [False, True])
@pytest.mark.parametrize("tb", [False, True])
@pytest.mark.parametrize(
    ("a_shape", "b_shape"),
    [((6, 4, 8, 8), (6, 4, 8, 8)), ((6, 1, 8, 5), (3, 5, 8)), ((2, 16, 16), (16, 16)), ((2, 17, 16), (2, 16, 16))],
)
def test_small_and_blas_paths_agree_with_numpy(
    a_shape: tuple[int, ...], b_shape: tuple[int, ...], ta: bool, tb: bool
) -> None:
    rng = np.random.default_rng(11)
    a = rng.normal(size=a_shape).astype(np.float32)
    b = rng.normal(size=b_shape).astype(np.float32)
    if ta:
        a = np.ascontiguousarray(np.swapaxes(a, -1, -2))
    if tb:
        b = np.ascontiguousarray(np.swapaxes(b, -1, -2))
    want = np.matmul(
        np.swapaxes(a, -1, -2).astype(np.float64) if ta else a.astype(np.float64),
        np.swapaxes(b, -1, -2).astype(np.float64) if tb else b.astype(np.float64),
    )
    got = bm.batch_matmul(ta, tb)(a, b)
    assert got.shape == want.shape and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    m, k = want.shape[-2], a.shape[-2] if ta else a.shape[-1]
    # The last case is above the threshold (17 * 16 * 16): the per-matrix BLAS path.
    assert (m * want.shape[-1] * k <= bm.SMALL) == (a_shape[-2] != 17)
