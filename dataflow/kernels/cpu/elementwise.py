"""Elementwise kernels; NumPy broadcasting comes from Numba's array expressions."""

from __future__ import annotations

import numpy as np

from . import kernel


@kernel
def add(a, b):  # type: ignore[no-untyped-def]
    return a + b


@kernel
def sub(a, b):  # type: ignore[no-untyped-def]
    return a - b


@kernel
def mul(a, b):  # type: ignore[no-untyped-def]
    return a * b


@kernel
def div(a, b):  # type: ignore[no-untyped-def]
    return a / b


@kernel
def int_div(a, b):  # type: ignore[no-untyped-def]
    return a // b


@kernel
def maximum(a, b):  # type: ignore[no-untyped-def]
    return np.maximum(a, b)


@kernel
def minimum(a, b):  # type: ignore[no-untyped-def]
    return np.minimum(a, b)


@kernel
def power(a, b):  # type: ignore[no-untyped-def]
    return a**b


@kernel
def equal(a, b):  # type: ignore[no-untyped-def]
    return a == b


@kernel
def less(a, b):  # type: ignore[no-untyped-def]
    return a < b


@kernel
def greater_equal(a, b):  # type: ignore[no-untyped-def]
    return a >= b


@kernel
def neg(x):  # type: ignore[no-untyped-def]
    return -x


@kernel
def square(x):  # type: ignore[no-untyped-def]
    return x * x


@kernel
def sqrt(x):  # type: ignore[no-untyped-def]
    return np.sqrt(x)


@kernel
def exp(x):  # type: ignore[no-untyped-def]
    return np.exp(x)


@kernel
def log(x):  # type: ignore[no-untyped-def]
    return np.log(x)
