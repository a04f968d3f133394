"""Batched matrix multiply: one BLAS GEMM per matrix of the broadcast batch.

``op(a) @ op(b)`` over the last two dims, ``op`` transposing where asked; the
dims before them broadcast as NumPy's do. Broadcasting never copies an
operand: each output matrix reads its operands' matrices through an index map
(``batch_index``), so a weight shared by the whole batch is one buffer. When
``b`` has no batch dims and ``a`` is not transposed, the batch is one tall
GEMM over ``a`` seen as ``(batch * m, k)``, which BLAS runs faster than many
small ones (the dense layers of a Transformer, ``(batch, tokens, d) @ (d, e)``).

>>> import numpy as np
>>> a = np.arange(12.0).reshape(2, 2, 3)
>>> b = np.ones((3, 1))
>>> batch_matmul(False, False)(a, b)[:, :, 0]
array([[ 3., 12.],
       [21., 30.]])
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from . import kernel


@kernel
def _gemm_each(a3, b3, ia, ib, ta, tb, out):  # type: ignore[no-untyped-def]
    # a3[j] is a C-contiguous matrix and a3[j].T a Fortran-contiguous one: BLAS takes
    # either as it is (its transpose flag), so no transpose is ever copied.
    for i in range(out.shape[0]):
        if ta and tb:
            np.dot(a3[ia[i]].T, b3[ib[i]].T, out[i])
        elif ta:
            np.dot(a3[ia[i]].T, b3[ib[i]], out[i])
        elif tb:
            np.dot(a3[ia[i]], b3[ib[i]].T, out[i])
        else:
            np.dot(a3[ia[i]], b3[ib[i]], out[i])
    return out


# At or below this many multiply-adds per matrix NumPy's matmul loop beats one BLAS call per matrix, whose
# fixed cost is several times an 8x8x8 product's arithmetic (attention over 8 tokens made 256 such calls).
SMALL = 16 * 16 * 16


def batch_index(batch: tuple[int, ...], full: tuple[int, ...]) -> np.ndarray:
    """For each matrix of the broadcast batch ``full`` (C order), the flat index of the
    matrix of an operand with batch dims ``batch`` that it reads."""
    count = math.prod(batch)
    padded = (1,) * (len(full) - len(batch)) + batch
    ids = np.arange(count, dtype=np.int64).reshape(padded)
    return np.ascontiguousarray(np.broadcast_to(ids, full)).reshape(-1)


def _matrices(x: np.ndarray) -> np.ndarray:
    """``x`` as a C-contiguous stack of matrices (a view when it already is one)."""
    return np.ascontiguousarray(x).reshape(-1, *x.shape[-2:])


def batch_matmul(transpose_a: bool, transpose_b: bool) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    def run(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        full = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
        m = a.shape[-1] if transpose_a else a.shape[-2]
        k = a.shape[-2] if transpose_a else a.shape[-1]
        n = b.shape[-2] if transpose_b else b.shape[-1]
        shape = (*full, m, n)
        if a.dtype.kind != "f":  # Numba's np.dot is float-only; ints are rare here
            return np.matmul(np.swapaxes(a, -1, -2) if transpose_a else a, np.swapaxes(b, -1, -2) if transpose_b else b)
        if math.prod(shape) == 0 or k == 0:
            return np.zeros(shape, a.dtype)
        if b.ndim == 2 and not transpose_a:
            flat_a = np.ascontiguousarray(a).reshape(-1, k)
            rhs = np.ascontiguousarray(b.T if transpose_b else b)
            out2 = np.empty((flat_a.shape[0], n), a.dtype)
            np.dot(flat_a, rhs, out2)
            return out2.reshape(shape)  # b has no batch dims: a's are the whole batch
        if m * n * k <= SMALL:  # broadcasts by strides, without a copy, as the index map does
            return np.matmul(np.swapaxes(a, -1, -2) if transpose_a else a, np.swapaxes(b, -1, -2) if transpose_b else b)
        out = np.empty((math.prod(full), m, n), a.dtype)
        ia, ib = batch_index(a.shape[:-2], full), batch_index(b.shape[:-2], full)
        _gemm_each(_matrices(a), _matrices(b), ia, ib, transpose_a, transpose_b, out)
        return out.reshape(shape)

    return run
