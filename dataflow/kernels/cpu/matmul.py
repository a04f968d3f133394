"""Matrix multiply: BLAS GEMM through ``np.dot`` inside jitted code."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from . import kernel


@kernel
def _dot(a, b):  # type: ignore[no-untyped-def]
    return np.dot(a, b)


def _blas_layout(x: np.ndarray) -> np.ndarray:
    # BLAS takes C- or Fortran-ordered operands (a transpose is free); anything
    # else (a strided slice) is copied once.
    if x.flags.c_contiguous or x.flags.f_contiguous:
        return x
    return np.ascontiguousarray(x)


def matmul(transpose_a: bool, transpose_b: bool) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    def run(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        if a.dtype.kind != "f":  # Numba's np.dot is float-only; ints are rare here
            return np.dot(a.T if transpose_a else a, b.T if transpose_b else b)
        return _dot(_blas_layout(a.T if transpose_a else a), _blas_layout(b.T if transpose_b else b))

    return run
