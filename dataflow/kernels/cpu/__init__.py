"""Numba CPU kernels, one module per op family.

Every kernel is ``@njit(nogil=True, cache=True)``: it releases the GIL (Dask
workers must keep their heartbeat while a step runs) and its machine code is
cached on disk, so only the first run of a new install pays for compilation,
and that once per machine: processes that need the same kernel at the same
time take turns on its cache's lock, so one compiles and the others load
(``compile_once``). The cache's folder is named by a digest of this folder's
sources (``source_cache.py``): Numba alone would keep a kernel's old code
after a helper it inlines from another file changed.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from numba import njit

from ..compile_once import compile_once
from ..source_cache import numba_cache_for

_njit = njit(nogil=True, cache=True)
SOURCES = Path(__file__).parent  # a kernel inlines helpers from any file here: their digest names its cache


def kernel(function: Callable[..., Any]) -> Any:
    """The decorator of every CPU kernel, so the policy above lives in one place."""
    with numba_cache_for(SOURCES):
        return compile_once(_njit(function))
