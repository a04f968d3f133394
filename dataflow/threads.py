"""How many threads cellgraph's kernels may use.

NumPy and SciPy each bring their own OpenBLAS, and Numba's ``np.dot`` calls
SciPy's. Two BLAS thread pools spinning on the same few cores fight each
other: on a 2-core machine a 64x64 @ 64x128 GEMM took 350 µs instead of 10 µs.
cellgraph's parallelism is across replicas and Dask workers (one process per
device, as in Horovod and distributed TensorFlow), so kernels run on one
thread per process unless asked otherwise: ``CELLGRAPH_NUM_THREADS=n`` or
``cg.set_num_threads(n)``.
"""

from __future__ import annotations

import os

from .errors import CellgraphError

_state = {"threads": 0}


def set_num_threads(n: int) -> None:
    """Use ``n`` threads in BLAS calls (both NumPy's and SciPy's OpenBLAS)."""
    if not isinstance(n, int) or n < 1:
        raise CellgraphError(f"set_num_threads: n must be a positive int, got {n!r}")
    import scipy.linalg.cython_blas  # noqa: F401 - load the BLAS Numba kernels call, so it is limited too
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=n, user_api="blas")
    _state["threads"] = n


def get_num_threads() -> int:
    ensure_configured()
    return _state["threads"]


def ensure_configured() -> None:
    """Apply ``CELLGRAPH_NUM_THREADS`` (default 1) once per process."""
    if _state["threads"]:
        return
    raw = os.environ.get("CELLGRAPH_NUM_THREADS", "1")
    try:
        n = int(raw)
    except ValueError:
        raise CellgraphError(f"CELLGRAPH_NUM_THREADS must be a positive integer, got {raw!r}") from None
    set_num_threads(n)
