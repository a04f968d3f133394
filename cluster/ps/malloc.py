"""glibc's malloc thresholds for processes that move tensors.

By default glibc serves an allocation above its mmap threshold (128 KiB at
first, raised dynamically up to 32 MiB) with a fresh ``mmap`` and gives it
back to the kernel when freed, and trims the heap top above its trim
threshold. A process that receives and sends 4 MiB messages (every chunk, in
gRPC's own buffers and ours) then maps, faults in and unmaps the same memory
message after message: measured with bare gRPC on this project's machines,
that alone held it to 0.65 of raw TCP, 0.79 to 0.90 with the thresholds
below. Setting them fixes the threshold at its ceiling (32 MiB), so message
buffers come from the heap and are reused, and lets up to 1 GiB of freed heap
stay mapped.

Examples
--------
>>> tune_malloc() in (True, False)  # False where the C library is not glibc
True
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading

# mallopt's parameter numbers (glibc's malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 32 * 1024 * 1024  # glibc's ceiling on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX)
TRIM_THRESHOLD_BYTES = 1024 * 1024 * 1024

_lock = threading.Lock()
_done: list[bool] = []


def tune_malloc() -> bool:
    """Set the thresholds once per process; whether they are set (False where there is no glibc ``mallopt``)."""
    with _lock:
        if not _done:
            _done.append(_set_thresholds())
        return _done[0]


def _set_thresholds() -> bool:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    # mallopt returns 1 on success, 0 on error.
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(
        mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)
    )
