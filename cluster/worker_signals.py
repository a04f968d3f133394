"""A local cluster's worker processes ignore Ctrl-C: the process that started them decides when they stop.

Jupyter interrupts a kernel by sending SIGINT to the kernel's whole process
group, and a terminal sends Ctrl-C to its foreground process group. The worker
processes of ``Cluster.local`` (Dask's nannies spawn them) are in that group:
interrupting a cell that waits for a job (``job.wait()``) killed every worker
and parameter server with a ``KeyboardInterrupt``, and the job with them.
Dask runs this module in each worker process as it starts (a worker
``preload``), and the worker then ignores SIGINT. The kernel or the command
still gets its ``KeyboardInterrupt``; the cluster stops when its owner closes
it (``%cluster down``, the command's own shutdown), and SIGTERM and SIGKILL
still reach the workers as before.

Examples
--------
>>> import signal
>>> before = signal.getsignal(signal.SIGINT)
>>> dask_setup(worker=None)  # as Dask calls it in a starting worker process
>>> signal.getsignal(signal.SIGINT) is signal.SIG_IGN
True
>>> _ = signal.signal(signal.SIGINT, before)
"""

from __future__ import annotations

import signal
import threading
from typing import Any

PRELOAD = __name__  # what a worker's ``preload`` option names


def dask_setup(worker: Any) -> None:
    """Dask's preload hook, called in the worker process as the worker starts."""
    if threading.current_thread() is threading.main_thread():  # only the main thread may set a handler
        signal.signal(signal.SIGINT, signal.SIG_IGN)


__all__ = ["PRELOAD", "dask_setup"]
