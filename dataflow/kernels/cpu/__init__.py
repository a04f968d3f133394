"""Numba CPU kernels, one module per op family.

Every kernel is ``@njit(nogil=True, cache=True)``: it releases the GIL (Dask
workers must keep their heartbeat while a step runs) and its machine code is
cached on disk, so only the first run of a new install pays for compilation,
and that once per machine: processes that need the same kernel at the same
time take turns on its cache's lock, so one compiles and the others load
(``compile_once``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from numba import njit

from ..compile_once import compile_once

_njit = njit(nogil=True, cache=True)


def kernel(function: Callable[..., Any]) -> Any:
    """The decorator of every CPU kernel, so the policy above lives in one place."""
    return compile_once(_njit(function))
