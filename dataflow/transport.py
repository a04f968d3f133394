"""Moving tensors between partitions: the ``Transport`` that Send and Recv use.

A partitioned graph exchanges tensors under string keys: the Send on the
producing device calls ``send(key, value)``, the Recv on the consuming device
``recv(key, timeout)``. Inside one process that is a queue per key
(``InProcessTransport``, what the tests and single-machine multi-device runs
use); across machines the cluster issue plugs in gRPC behind the same two
methods.
"""

from __future__ import annotations

import queue
import threading
from typing import Protocol

import numpy as np

from .errors import ExecutionError


class Transport(Protocol):
    def send(self, key: str, value: np.ndarray) -> None:
        """Hand ``value`` to whoever receives ``key``; never blocks for long."""

    def recv(self, key: str, timeout: float) -> np.ndarray:
        """The next value sent under ``key``; raise ``ExecutionError`` after ``timeout`` seconds."""


class InProcessTransport:
    """A FIFO queue per key: the n-th ``recv(key)`` gets the n-th ``send(key)``.

    A run that fails is cancelled (``cancel``): from then on a send is
    dropped and a receive fails at once, until ``reset`` starts afresh with
    no queue at all. A partition still running when another failed may send
    after the cancel; were that value kept, the next run's Recv of the same
    key would take it, a value of the failed run, without a word.
    """

    def __init__(self) -> None:
        self._queues: dict[str, queue.Queue[np.ndarray | None]] = {}
        self._lock = threading.Lock()
        self._closed: str | None = None

    def _queue(self, key: str) -> queue.Queue[np.ndarray | None]:
        """``key``'s queue (the caller holds the lock)."""
        return self._queues.setdefault(key, queue.Queue())

    def send(self, key: str, value: np.ndarray) -> None:
        # A copy: the sender may reuse or update its buffer (a variable) after sending.
        copied = np.array(value, copy=True)
        with self._lock:
            if self._closed is None:  # else the run was cancelled: nobody takes it, and the next run must not
                self._queue(key).put(copied)

    def recv(self, key: str, timeout: float) -> np.ndarray:
        with self._lock:
            closed, waiting_on = self._closed, self._queue(key)
        if closed is not None:
            raise ExecutionError(f"Recv of {key!r}: the run was cancelled ({closed})")
        try:
            value = waiting_on.get(timeout=timeout)
        except queue.Empty:
            raise ExecutionError(f"Recv of {key!r}: nothing was sent within {timeout:g} s") from None
        if value is None:
            raise ExecutionError(f"Recv of {key!r}: the run was cancelled ({self._closed})")
        return value

    def cancel(self, reason: str) -> None:
        """Wake every waiting ``recv`` with an error (a partition failed), forget what was queued, drop what comes."""
        with self._lock:
            self._closed = reason
            queues, self._queues = list(self._queues.values()), {}
        for q in queues:
            q.put(None)

    def reset(self) -> None:
        """Start afresh once every partition of a cancelled run has stopped: no queue, nothing cancelled."""
        with self._lock:
            self._closed, self._queues = None, {}
