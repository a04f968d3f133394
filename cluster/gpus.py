"""How many GPUs each worker has: counted on the worker itself (``client.run``), once per worker.

Counting imports ``numba.cuda`` in the worker, which takes a few tenths of a
second the first time; ``cg.train`` asks at every call and must hand the
notebook back at once, so the counts are kept by worker address (a restarted
worker has a new address and is counted again), and a cluster counts its
training workers when it starts (``Cluster.local``, ``Cluster.connect``).

Examples
--------
>>> counts = GpuCounts()
>>> counts.of(["tcp://a:1", "tcp://b:1"], lambda workers: {w: 1 for w in workers})
{'tcp://a:1': 1, 'tcp://b:1': 1}
>>> counts.of(["tcp://b:1"], lambda workers: {w: 0 for w in workers})  # known: not asked again
{'tcp://b:1': 1}
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence


def visible_gpus() -> int:
    """How many GPUs numba.cuda sees in this (worker) process; run there by ``client.run``."""
    from cellgraph.dataflow.kernels import cuda

    if not cuda.available():
        return 0
    from numba import cuda as numba_cuda

    return len(numba_cuda.gpus)


class GpuCounts:
    """GPU counts by worker address, asked of the workers not counted yet."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}

    def of(self, workers: Sequence[str], ask: Callable[[list[str]], dict[str, int]]) -> dict[str, int]:
        """The counts of ``workers``; ``ask(addresses)`` counts those not known yet (on the workers)."""
        with self._lock:
            missing = [address for address in workers if address not in self._counts]
        if missing:
            found = ask(missing)
            with self._lock:
                self._counts.update(found)
        with self._lock:
            return {address: self._counts.get(address, 0) for address in workers}
