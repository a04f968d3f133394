"""The register-blocked GEMM every matrix product on the GPU runs: MatMul and the convolutions.

``out[i, j] = sum_kk A[i, kk] * B[kk, j]`` for a C-contiguous ``(m, n)`` output.
The operands are never formed: each is a flat device array plus an *index
function* ``index(i, kk, geo)`` (``i`` along M for A, along N for B) giving the
flat position of an element, or -1 for an implicit zero. MatMul's index
functions read a row-major or transposed matrix; the convolutions' gather a
patch of the image on the fly (an implicit GEMM, ``conv.py``).

How a launch is laid out (``Tiles``): a block computes a ``bm x bn`` tile of
the output with ``(bm / tm) * (bn / tn)`` threads, each thread a ``tm x tn``
block held in registers. The inner dimension is walked ``bk`` at a time
through two shared-memory buffers: while the block multiplies out of one, each
thread fetches its share of the next tile from global memory into registers,
then writes it to the other buffer, so one barrier per tile suffices and the
global loads overlap the arithmetic.

A thread owns its rows and columns in runs of ``VECTOR`` (4) adjacent ones:
rows ``4 * ty + q + g * 4 * (bm / tm)`` for ``q < 4`` and each of ``tm / 4``
groups ``g``, and columns likewise. The shared buffers are aligned to 16
bytes on a GPU and every row of them is a multiple of 16 bytes long (``PAD``),
so each run is one aligned 16-byte read, and LLVM merges the four reads of a
run into one vector load (``ld.shared.v4.f32``): 64 shared loads a thread per
16-deep tile instead of 256. A scalar read for every 4 FMAs is what shared
memory just keeps up with: the likeliest limit of the kernel that ran at 0.45
of cuBLAS on an H200 (BENCHMARKS.md section 8). A warp's 16-byte reads of one row are
adjacent (B) or the same (A, broadcast), so they meet no bank conflicts;
Numba's simulator refuses an alignment, so it runs the same kernel without
one. Shared rows are padded by ``PAD`` so that k-major stores (a row-major A)
spread over the banks too.

Numba has no unroll pragma, and a local array indexed in a loop it does not
unroll lives in slow local memory; so the kernel's source is generated with
the ``tm * tn`` accumulators and the ``tm + tn`` operand values as named
scalars (registers), like ``fusion.py`` generates its fused kernels, and the
``bk`` steps of a tile written out one by one, so every shared-memory read
is a per-thread base plus a constant. The thread index is taken unsigned,
and so is each global index once it is known to be in its operand: Numba
wraps negative indices around, and only an index the compiler can see is
non-negative loses that check (and the instructions it costs). Global loads
are scalar (an operand's index function may gather, as a convolution's does);
the tile loads of each warp still touch consecutive addresses along the
operand's contiguous dimension (``Operand.fast`` says which that is). Row
tiles run along the grid's x (up to 2**31 - 1 blocks, for the many output
pixels of a convolution), column tiles along its y (up to 65,535).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np

from . import simulator

PAD = 4  # shared-memory row padding: a k-major store of 8 k values by 4 rows hits 32 banks; rows stay 16-byte multiples
VECTOR = 4  # a thread's rows and columns come in runs of this many adjacent ones: one 16-byte shared read each
ALIGNMENT = 16  # bytes, of each shared buffer on a GPU: what a vector read of a run needs


@dataclass(frozen=True)
class Tiles:
    """A block's output tile (``bm x bn``), its step along K (``bk``) and each thread's block (``tm x tn``)."""

    bm: int
    bn: int
    bk: int
    tm: int
    tn: int
    max_registers: int | None = None  # a cap for the compiler: more blocks an SM, at the price of spills

    @property
    def threads(self) -> int:
        return (self.bm // self.tm) * (self.bn // self.tn)

    def __post_init__(self) -> None:
        if self.bm % self.tm or self.bn % self.tn:
            raise ValueError(f"Tiles: the thread block {self.tm}x{self.tn} must divide the tile {self.bm}x{self.bn}")
        if self.tm % VECTOR or self.tn % VECTOR:
            raise ValueError(f"Tiles: the thread block {self.tm}x{self.tn} must be made of runs of {VECTOR}")
        if (self.bm * self.bk) % self.threads or (self.bk * self.bn) % self.threads:
            raise ValueError(f"Tiles: {self.threads} threads cannot share the loads of a {self.bk}-deep tile evenly")


# 64 outputs a thread on 128x128 tiles, 16 deep along K: the most work per byte loaded, for float32 products that
# fill the GPU. On an H200 (4096^3, gpu_kernels.py, 2026-12-04) it ran 23.6 TFLOP/s, the 8-deep SHALLOW 22.6.
LARGE = Tiles(bm=128, bn=128, bk=16, tm=8, tn=8)
SHALLOW = Tiles(bm=128, bn=128, bk=8, tm=8, tn=8)
# 16 outputs a thread on 64x64 tiles: four times the blocks for small products, and half the registers for float64.
SMALL = Tiles(bm=64, bn=64, bk=8, tm=4, tn=4)
# SHALLOW compiles to 146 registers a thread for sm_90 (one block an SM); capped at 128, two blocks fit and ptxas
# spills 16 bytes: 22.1 TFLOP/s on the H200. Half as wide a tile (two blocks an SM uncapped): 19.5.
SHALLOW_CAPPED = Tiles(bm=128, bn=128, bk=8, tm=8, tn=8, max_registers=128)
HALF = Tiles(bm=128, bn=64, bk=8, tm=8, tn=8)
# Every shape benchmarks/gpu_kernels.py times on the same product, for choose_tiles to learn from.
TIMED = (LARGE, SHALLOW, SHALLOW_CAPPED, SMALL, HALF)
# A GPU has about a hundred multiprocessors: below this many large tiles it would sit partly idle.
LARGE_MIN_BLOCKS = 128


def choose_tiles(m: int, n: int, dtype: np.dtype) -> Tiles:
    """LARGE for float32 products big enough to fill a GPU with its tiles, else SMALL."""
    if np.dtype(dtype) == np.float32 and (m // LARGE.bm) * (n // LARGE.bn) >= LARGE_MIN_BLOCKS:
        return LARGE
    return SMALL


def _fetcher(index: Callable[..., int], rows_fast: bool, span: int, depth: int, dtype: np.dtype) -> Any:
    """Device function: the value of tile element ``e`` (of ``span x depth``) at ``(base, k0)`` of the
    matrix that starts at ``x[start]``; 0 outside it."""
    import numba
    from numba import cuda, from_dtype

    zero_type = from_dtype(dtype)
    unsigned = numba.uint64

    @cuda.jit(device=True, inline=True)
    def fetch(x, start, e, base, k0, limit, k, geo):  # type: ignore[no-untyped-def]
        if rows_fast:
            i, kk = base + e % span, k0 + e // span
        else:
            i, kk = base + e // depth, k0 + e % depth
        if i < limit and kk < k:
            at = index(i, kk, geo)
            if at >= 0:
                return x[unsigned(start + at)]  # known non-negative: no wraparound code
        return zero_type(0)

    return fetch


def _putter(rows_fast: bool, span: int, depth: int) -> Any:
    """Device function: store tile element ``e`` into shared buffer ``buf`` as ``s[buf, kk, i]``."""
    from numba import cuda

    @cuda.jit(device=True, inline=True)
    def put(s, buf, e, value):  # type: ignore[no-untyped-def]
        if rows_fast:
            s[buf, e // span, e % span] = value
        else:
            s[buf, e % depth, e // depth] = value

    return put


def kernel_source(tiles: Tiles, aligned: bool = True) -> str:
    """Python source of ``gemm(a, b, out, m, n, k, geo, a_starts, b_starts)`` for ``tiles``.

    ``aligned``: the shared buffers are declared 16-byte aligned (a GPU; the simulator refuses alignments).

    ``out`` is a ``(batch, m, n)`` stack; matrix ``z`` of it reads its A and B
    from ``a[a_starts[z]:]`` and ``b[b_starts[z]:]``.
    """
    t = tiles
    rows, cols = t.bm // t.tm, t.bn // t.tn  # threads down and across the block

    def row(i: int) -> str:
        """Row ``i`` of a thread's block, from the tile's first: its run's start plus its place in the run."""
        return f"ty * {VECTOR} + {(i // VECTOR) * VECTOR * rows + i % VECTOR}"

    def col(j: int) -> str:
        return f"tx * {VECTOR} + {(j // VECTOR) * VECTOR * cols + j % VECTOR}"

    align = f", alignment={ALIGNMENT}" if aligned else ""
    loads_a, loads_b = t.bm * t.bk // t.threads, t.bk * t.bn // t.threads
    acc = [[f"c{i}_{j}" for j in range(t.tn)] for i in range(t.tm)]

    def stage(k0: str, indent: str) -> list[str]:
        return [
            *(
                f"{indent}ra{r} = fetch_a(a, a_at, tid + {r * t.threads}, row0, {k0}, m, k, geo)"
                for r in range(loads_a)
            ),
            *(
                f"{indent}rb{r} = fetch_b(b, b_at, tid + {r * t.threads}, col0, {k0}, n, k, geo)"
                for r in range(loads_b)
            ),
        ]

    def store(buf: str, indent: str) -> list[str]:
        return [
            *(f"{indent}put_a(sa, {buf}, tid + {r * t.threads}, ra{r})" for r in range(loads_a)),
            *(f"{indent}put_b(sb, {buf}, tid + {r * t.threads}, rb{r})" for r in range(loads_b)),
        ]

    def multiply(kk: int) -> list[str]:
        """Step ``kk`` of a tile: the thread's column of A and row of B from shared memory, tm x tn FMAs."""
        return [
            *(f"        a{i} = sa[cur, {kk}, {row(i)}]" for i in range(t.tm)),
            *(f"        b{j} = sb[cur, {kk}, {col(j)}]" for j in range(t.tn)),
            *(f"        {acc[i][j]} += a{i} * b{j}" for i in range(t.tm) for j in range(t.tn)),
        ]

    lines = [
        "def gemm(a, b, out, m, n, k, geo, a_starts, b_starts):",
        f"    sa = cuda.shared.array((2, {t.bk}, {t.bm + PAD}), DT{align})",
        f"    sb = cuda.shared.array((2, {t.bk}, {t.bn + PAD}), DT{align})",
        "    tid = cuda.threadIdx.x",
        "    z = cuda.blockIdx.z  # the matrix of a batch",
        "    a_at, b_at = a_starts[z], b_starts[z]",
        # Unsigned only for the shared-memory reads: the operands' index functions subtract (padding).
        f"    ty, tx = U32(tid) // {cols}, U32(tid) % {cols}",
        f"    row0, col0 = cuda.blockIdx.x * {t.bm}, cuda.blockIdx.y * {t.bn}",
        *(f"    {name} = DT(0)" for row in acc for name in row),
        *stage("0", "    "),
        *store("0", "    "),
        "    cuda.syncthreads()",
        f"    tiles = (k + {t.bk - 1}) // {t.bk}",
        "    for kt in range(tiles):",
        "        cur = kt & 1",
        "        more = kt + 1 < tiles",
        "        if more:",
        *stage(f"(kt + 1) * {t.bk}", "            "),
        *(line for kk in range(t.bk) for line in multiply(kk)),
        "        if more:",
        *store("1 - cur", "            "),
        "        cuda.syncthreads()",
    ]
    for i in range(t.tm):
        lines += [f"    r = row0 + {row(i)}", "    if r < m:"]
        for j in range(t.tn):
            lines += [
                f"        c = col0 + {col(j)}",
                "        if c < n:",
                f"            out[z, r, c] = {acc[i][j]}",
            ]
    return "\n".join(lines) + "\n"


@cache
def gemm_kernel(tiles: Tiles, dtype: np.dtype, a_index: Any, a_rows_fast: bool, b_index: Any, b_cols_fast: bool) -> Any:
    """The compiled GEMM for ``tiles`` and ``dtype`` whose operands ``index`` functions place.

    ``a_rows_fast``: A's elements along M are adjacent in memory (a transposed
    matrix, a patch of one image position's channels); else along K.
    ``b_cols_fast``: B's elements along N are adjacent; else along K.
    """
    import numba
    from numba import cuda, from_dtype

    namespace: dict[str, Any] = {
        "cuda": cuda,
        "U32": numba.uint32,
        "DT": from_dtype(dtype),
        "fetch_a": _fetcher(a_index, a_rows_fast, tiles.bm, tiles.bk, dtype),
        "fetch_b": _fetcher(b_index, b_cols_fast, tiles.bn, tiles.bk, dtype),
        "put_a": _putter(a_rows_fast, tiles.bm, tiles.bk),
        "put_b": _putter(b_cols_fast, tiles.bn, tiles.bk),
    }
    source = kernel_source(tiles, aligned=not simulator())
    exec(compile(source, f"<gemm {tiles}>", "exec"), namespace)  # noqa: S102
    # A register cap means nothing to the simulator, whose jit refuses the option.
    capped = tiles.max_registers is not None and not simulator()
    options = {"max_registers": tiles.max_registers} if capped else {}
    return cuda.jit(**options)(namespace["gemm"])


@dataclass(frozen=True)
class Operand:
    """A GEMM operand: a flat device array and how to find element ``(i, kk)`` in it."""

    data: Any
    index: Any  # a ``cuda.jit(device=True)`` function (i, kk, geo) -> flat position, -1 for zero
    fast: bool  # True when consecutive i (not kk) are adjacent in memory


MAX_BATCH = 65_535  # blocks along a grid's z: a larger batch takes several launches


@cache
def _no_offset() -> Any:
    """The one-matrix batch's start offsets: one device zero, made once a process."""
    from numba import cuda

    return cuda.to_device(np.zeros(1, np.int64))


def gemm(
    a: Operand,
    b: Operand,
    out: Any,
    k: int,
    geo: tuple[int, ...],
    tiles: Tiles | None = None,
    starts: tuple[Any, Any] | None = None,
) -> Any:
    """Fill the C-contiguous device array ``out`` with ``A @ B`` (inner dimension ``k``); return ``out``.

    ``out`` is one ``(m, n)`` matrix, or a ``(batch, m, n)`` stack with
    ``starts``: device int64 arrays of where each matrix's A and B begin in
    ``a.data`` and ``b.data`` (an operand broadcast over the batch repeats its start).
    """
    stack = out if out.ndim == 3 else out.reshape(1, *out.shape)
    batch, m, n = stack.shape
    if batch == 0 or m == 0 or n == 0:
        return out
    if starts is None and batch != 1:
        raise ValueError(f"gemm: a stack of {batch} output matrices needs the starts of their operands")
    a_starts, b_starts = starts or (_no_offset(), _no_offset())
    tiles = tiles or choose_tiles(m, n, out.dtype)
    run = gemm_kernel(tiles, np.dtype(out.dtype), a.index, a.fast, b.index, b.fast)
    grid = (math.ceil(m / tiles.bm), math.ceil(n / tiles.bn))
    geo = tuple(int(v) for v in geo)
    for z0 in range(0, batch, MAX_BATCH):
        z1 = min(z0 + MAX_BATCH, batch)
        run[(*grid, z1 - z0), tiles.threads](
            a.data, b.data, stack[z0:z1], m, n, k, geo, a_starts[z0:z1], b_starts[z0:z1]
        )
    return out
