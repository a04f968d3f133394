"""Numba CPU kernels, one module per op family.

Every kernel is ``@njit(nogil=True, cache=True)``: it releases the GIL (Dask
workers must keep their heartbeat while a step runs) and its machine code is
cached on disk, so only the first run of a new install pays for compilation.
"""

from __future__ import annotations

from numba import njit

# One decorator for every CPU kernel, so the policy above lives in one place.
kernel = njit(nogil=True, cache=True)
