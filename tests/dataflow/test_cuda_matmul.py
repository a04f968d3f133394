"""The register-blocked GEMM (``kernels/cuda/gemm.py``) behind MatMul and the convolutions.

The op table checks each op's CUDA kernel on small shapes inside one tile;
these shapes cross every tile edge (rows, columns and the inner dimension
stop part-way through a tile), on both tile shapes, in float32 and float64,
with every transpose, and the convolutions on several blocks of output
pixels and channels. Run on a GPU or, with ``NUMBA_ENABLE_CUDASIM=1``, on
Numba's simulator (small shapes: it runs every thread as a Python thread).
"""

from __future__ import annotations

import numpy as np
import pytest

from cellgraph.dataflow.kernels.cpu import conv as cpu_conv
from cellgraph.dataflow.kernels.cuda import gemm
from cellgraph.dataflow.kernels.cuda.gemm import LARGE, SMALL, Tiles, choose_tiles, kernel_source

RNG = np.random.default_rng(19)


def _rand(*shape: int, dtype: type = np.float32) -> np.ndarray:
    return RNG.standard_normal(shape).astype(dtype)


def _tol(dtype: type, k: int) -> dict[str, float]:
    """Sums of k products of unit normals: float32 rounding grows like sqrt(k)."""
    return {"rtol": 1e-5, "atol": 1e-5 * np.sqrt(k)} if dtype == np.float32 else {"rtol": 1e-12, "atol": 1e-12}


# ----------------------------------------------------------------- without a GPU
def test_tiles_are_chosen_by_size_and_dtype() -> None:
    assert choose_tiles(4096, 4096, np.dtype(np.float32)) == LARGE
    assert choose_tiles(4096, 4096, np.dtype(np.float64)) == SMALL  # 64 float64 accumulators would spill
    assert choose_tiles(67, 33, np.dtype(np.float32)) == SMALL  # one large tile would leave the GPU idle
    assert LARGE.threads == SMALL.threads == 256


def test_bad_tiles_are_refused_with_the_reason() -> None:
    with pytest.raises(ValueError, match=r"the thread block 3x4 must divide the tile 64x64"):
        Tiles(bm=64, bn=64, bk=8, tm=3, tn=4)
    with pytest.raises(ValueError, match=r"the thread block 2x4 must be made of runs of 4"):
        Tiles(bm=64, bn=64, bk=8, tm=2, tn=4)
    with pytest.raises(ValueError, match=r"256 threads cannot share the loads of a 2-deep tile evenly"):
        Tiles(bm=64, bn=64, bk=2, tm=4, tn=4)


def test_kernel_keeps_each_threads_block_in_named_registers() -> None:
    # Numba puts a local array it cannot unroll into slow local memory: the
    # generated kernel holds accumulators and operands as scalars instead.
    source = kernel_source(LARGE)
    assert "cuda.local" not in source
    assert source.count(" = DT(0)") == LARGE.tm * LARGE.tn
    assert source.count("cuda.syncthreads()") == 2  # after the first tile, then once a tile (double buffered)
    # The bk steps of a tile written out (each shared read a base plus a constant), read through
    # unsigned thread coordinates (no negative-index wraparound in front of every read).
    assert "for kk" not in source and source.count("a0 = sa[cur, ") == LARGE.bk
    assert "ty, tx = U32(tid) // 16, U32(tid) % 16" in source
    compile(source, "<gemm>", "exec")


def test_each_thread_reads_shared_memory_in_aligned_runs_of_four() -> None:
    # A thread's rows (and columns) come in runs of 4 adjacent ones, 16-byte aligned on a GPU, which LLVM
    # turns into one vector load a run (ld.shared.v4.f32: 64 shared loads a tile, not 256).
    source = kernel_source(LARGE)
    rows = [f"a{i} = sa[cur, 3, ty * 4 + {offset}]" for i, offset in enumerate([0, 1, 2, 3, 64, 65, 66, 67])]
    cols = [f"b{j} = sb[cur, 3, tx * 4 + {offset}]" for j, offset in enumerate([0, 1, 2, 3, 64, 65, 66, 67])]
    assert all(read in source for read in rows + cols)
    assert "r = row0 + ty * 4 + 65" in source and "c = col0 + tx * 4 + 67" in source  # the output, the same
    assert source.count("alignment=16)") == 2  # both shared buffers
    # 128 + PAD floats a row: every row starts 16-byte aligned too.
    assert (LARGE.bm + gemm.PAD) * 4 % 16 == 0 and (SMALL.bn + gemm.PAD) * 8 % 16 == 0
    assert "alignment" not in kernel_source(LARGE, aligned=False)  # the simulator refuses alignments
    small = kernel_source(SMALL)  # 4x4 a thread: one run each way
    assert "a3 = sa[cur, 0, ty * 4 + 3]" in small and "b3 = sb[cur, 0, tx * 4 + 3]" in small


# ------------------------------------------------------------------ the kernels
@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("transpose_a", [False, True])
@pytest.mark.parametrize("transpose_b", [False, True])
def test_matmul_crosses_tile_edges(dtype: type, transpose_a: bool, transpose_b: bool) -> None:
    from numba import cuda

    from cellgraph.dataflow.kernels.cuda.matmul import matmul

    m, k, n = 67, 45, 33  # 2 row tiles of 64, a part column tile, 6 steps of 8 along K, the last part-full
    a = _rand(k, m, dtype=dtype) if transpose_a else _rand(m, k, dtype=dtype)
    b = _rand(n, k, dtype=dtype) if transpose_b else _rand(k, n, dtype=dtype)
    got = matmul(cuda.to_device(a), cuda.to_device(b), transpose_a, transpose_b).copy_to_host()
    want = (a.T if transpose_a else a).astype(np.float64) @ (b.T if transpose_b else b).astype(np.float64)
    assert got.dtype == dtype and got.shape == (m, n)
    np.testing.assert_allclose(got, want, **_tol(dtype, k))


@pytest.mark.cuda
@pytest.mark.parametrize(("transpose_a", "transpose_b"), [(False, False), (True, True)])
def test_matmul_on_large_tiles_crosses_their_edges(transpose_a: bool, transpose_b: bool) -> None:
    from numba import cuda

    from cellgraph.dataflow.kernels.cuda.matmul import matmul

    m, k, n = 130, 11, 129  # 2 x 2 tiles of 128, the second of each a sliver; 2 steps along K
    a = _rand(k, m) if transpose_a else _rand(m, k)
    b = _rand(n, k) if transpose_b else _rand(k, n)
    got = matmul(cuda.to_device(a), cuda.to_device(b), transpose_a, transpose_b, LARGE).copy_to_host()
    want = (a.T if transpose_a else a).astype(np.float64) @ (b.T if transpose_b else b).astype(np.float64)
    np.testing.assert_allclose(got, want, **_tol(np.float32, k))


@pytest.mark.cuda
def test_matmul_of_empty_operands() -> None:
    from numba import cuda

    from cellgraph.dataflow.kernels.cuda.matmul import matmul

    no_k = matmul(cuda.to_device(_rand(5, 0)), cuda.to_device(_rand(0, 3)), False, False).copy_to_host()
    np.testing.assert_array_equal(no_k, np.zeros((5, 3), np.float32))  # an empty sum is 0
    no_rows = matmul(cuda.to_device(_rand(0, 4)), cuda.to_device(_rand(4, 3)), False, False)
    assert no_rows.shape == (0, 3)


def _device(*arrays: np.ndarray) -> list:  # type: ignore[type-arg]
    from numba import cuda

    return [cuda.to_device(x) for x in arrays]


# (x shape, filter shape, strides, padding): output pixels and channels over several 64-wide tiles
CONVOLUTIONS = [
    ((2, 9, 9, 5), (3, 3, 5, 70), (1, 1), "SAME"),  # 162 pixels x 70 channels, K = 45
    ((2, 9, 8, 3), (3, 2, 3, 66), (2, 1), "VALID"),
    ((1, 11, 11, 4), (5, 5, 4, 9), (2, 2), "SAME"),  # pads on both sides
]


@pytest.mark.cuda
@pytest.mark.parametrize(("x_shape", "f_shape", "strides", "padding"), CONVOLUTIONS)
def test_conv2d_is_the_cpu_kernels_convolution(x_shape: tuple, f_shape: tuple, strides: tuple, padding: str) -> None:  # type: ignore[type-arg]
    from cellgraph.dataflow.kernels.cuda import conv

    x, f = _rand(*x_shape), _rand(*f_shape)
    want = cpu_conv.conv2d(strides, padding)(x, f)
    got = conv.conv2d(*_device(x, f), strides, padding).copy_to_host()
    np.testing.assert_allclose(got, want, **_tol(np.float32, int(np.prod(f_shape[:3]))))


@pytest.mark.cuda
@pytest.mark.parametrize(("x_shape", "f_shape", "strides", "padding"), CONVOLUTIONS)
def test_conv2d_gradients_are_the_cpu_kernels(x_shape: tuple, f_shape: tuple, strides: tuple, padding: str) -> None:  # type: ignore[type-arg]
    from cellgraph.dataflow.kernels.cuda import conv

    x, f = _rand(*x_shape), _rand(*f_shape)
    dy = _rand(*cpu_conv.conv2d(strides, padding)(x, f).shape)
    dx = conv.conv2d_input_grad(*_device(x, f, dy), strides, padding).copy_to_host()
    np.testing.assert_allclose(dx, cpu_conv.conv2d_input_grad(strides, padding)(x, f, dy), **_tol(np.float32, dy.size))
    df = conv.conv2d_filter_grad(*_device(x, f, dy), strides, padding).copy_to_host()
    np.testing.assert_allclose(df, cpu_conv.conv2d_filter_grad(strides, padding)(x, f, dy), **_tol(np.float32, dy.size))


@pytest.mark.cuda
def test_conv2d_input_gradient_crosses_channel_tiles_in_float64() -> None:
    from cellgraph.dataflow.kernels.cuda import conv

    x, f = _rand(2, 7, 7, 67, dtype=np.float64), _rand(3, 3, 67, 5, dtype=np.float64)  # 98 pixels x 67 channels
    dy = _rand(2, 4, 4, 5, dtype=np.float64)
    dx = conv.conv2d_input_grad(*_device(x, f, dy), (2, 2), "SAME").copy_to_host()
    assert dx.dtype == np.float64
    np.testing.assert_allclose(dx, cpu_conv.conv2d_input_grad((2, 2), "SAME")(x, f, dy), rtol=1e-12, atol=1e-12)


def test_gemm_module_imports_without_numba_cuda() -> None:
    # import cellgraph must not choose between GPU and simulator (kernels/cuda/__init__.py):
    # the tile engine imports numba.cuda only when it compiles a kernel.
    assert "cuda" not in vars(gemm)


@pytest.mark.cuda
@pytest.mark.parametrize(("transpose_a", "transpose_b"), [(False, False), (True, True)])
def test_batched_matmul_is_one_gemm_over_broadcast_operands(
    transpose_a: bool, transpose_b: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    from numba import cuda

    from cellgraph.dataflow.kernels.cuda.matmul import batched_matmul

    # 5 products read 3 matrices of a and 2 of b; batches of 2 a launch, so the
    # last launch holds one matrix and the batch's slices of starts line up across launches.
    monkeypatch.setattr(gemm, "MAX_BATCH", 2)
    m, k, n = 67, 13, 65
    a = _rand(3, k, m) if transpose_a else _rand(3, m, k)
    b = _rand(2, n, k) if transpose_b else _rand(2, k, n)
    a_ids, b_ids = np.array([0, 1, 2, 2, 0]), np.array([1, 0, 1, 0, 0])
    got = batched_matmul(cuda.to_device(a), cuda.to_device(b), a_ids, b_ids, transpose_a, transpose_b).copy_to_host()
    ops_a = np.swapaxes(a, 1, 2) if transpose_a else a
    ops_b = np.swapaxes(b, 1, 2) if transpose_b else b
    want = np.stack([ops_a[i].astype(np.float64) @ ops_b[j] for i, j in zip(a_ids, b_ids)])
    assert got.shape == (5, m, n)
    np.testing.assert_allclose(got, want, **_tol(np.float32, k))


@pytest.mark.cuda
def test_a_stack_of_products_without_starts_is_refused() -> None:
    from numba import cuda

    from cellgraph.dataflow.kernels.cuda.matmul import _row_major_a, _row_major_b

    a, b, out = cuda.to_device(_rand(8)), cuda.to_device(_rand(8)), cuda.device_array((2, 2, 2), np.float32)
    left, right = gemm.Operand(a, _row_major_a, fast=False), gemm.Operand(b, _row_major_b, fast=True)
    with pytest.raises(ValueError, match=r"gemm: a stack of 2 output matrices needs the starts of their operands"):
        gemm.gemm(left, right, out, 2, (2, 2, 2))
