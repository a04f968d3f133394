"""Host copies at the device boundary: pinned buffers, a copy stream, and Sends that do not hold up the launches.

Every copy between host and GPU that a run makes (a partition's feeds and
fetches, a Recv on the GPU, a Send from it) goes through here:

- **Pinned buffers.** The driver moves page-locked memory by DMA at the
  bus's speed; a pageable array is first copied, piece by piece, into a
  buffer of the driver's own. ``PinnedPool`` keeps page-locked buffers by
  shape and dtype and hands them out again, so a training step pins nothing
  new after its first. A buffer is handed out again only after the copy that
  last used it has finished (its event is waited on first). Past
  ``CELLGRAPH_PINNED_MIB`` (default 1024) of pinned memory, copies go
  through pageable memory as before, rather than starve the host.
- **A copy stream.** Copies are queued on a stream of their own. It is an
  ordinary (blocking) stream, so the legacy default stream, where every
  kernel runs, orders it: a copy from the GPU starts after the kernels queued
  before it (its value exists), and a kernel queued after a copy to the GPU
  starts after it (its input has arrived). That is also what keeps
  ``memory.py``'s block reuse safe: no copy and no kernel ever see the same
  block out of order.
- **Sends that return at once.** A Send from the GPU queues its copy into a
  pinned buffer and returns; one sender thread per process waits for the
  copy and hands the buffer to the transport (which copies what it keeps:
  ``Transport.send``'s contract), in the order the Sends ran. The thread
  that launches kernels goes on launching the rest of the step meanwhile,
  so the GPU's queue does not drain at every Send. ``wait_sent`` ends a
  partition's run: every Send it made has been delivered, or its error is
  raised there.

On Numba's simulator every copy is synchronous and the same code runs, so the
simulator checks the values and the order, not the overlap.

Examples
--------
>>> import numpy as np
>>> from cellgraph.dataflow.kernels.cuda import available, staging
>>> available()  # doctest: +SKIP
True
>>> on_device = staging.to_device(np.arange(4, dtype=np.float32))  # doctest: +SKIP
>>> staging.to_host(on_device)  # doctest: +SKIP
array([0., 1., 2., 3.], dtype=float32)
"""

from __future__ import annotations

import concurrent.futures
import os
import threading
from collections import deque
from collections.abc import Callable
from functools import cache
from typing import Any

import numpy as np

from ...errors import ExecutionError
from . import simulator

PINNED_LIMIT_ENV = "CELLGRAPH_PINNED_MIB"
DEFAULT_PINNED_MIB = 1024
SEND_DEADLINE_S = 60.0  # how long a partition's end waits for its Sends' copies from the GPU


def pinned_limit_bytes() -> int:
    """The most page-locked memory the pool may hold: ``CELLGRAPH_PINNED_MIB``, in MiB."""
    text = os.environ.get(PINNED_LIMIT_ENV, str(DEFAULT_PINNED_MIB))
    try:
        mib = int(text)
    except ValueError:
        raise ExecutionError(f"{PINNED_LIMIT_ENV}={text!r} is not a whole number of MiB") from None
    if mib < 0:
        raise ExecutionError(f"{PINNED_LIMIT_ENV}={text!r} is negative: give 0 to pin nothing")
    return mib << 20


class PinnedPool:
    """Page-locked host buffers by shape and dtype; a buffer is lent again once its last copy has finished."""

    def __init__(self, limit_bytes: int) -> None:
        self.limit_bytes = limit_bytes
        self.pinned_bytes = 0
        self.allocated = 0  # buffers pinned: a test and the benchmark read these two
        self.reused = 0
        self._free: dict[tuple[tuple[int, ...], str], deque[tuple[np.ndarray, Any]]] = {}
        self._lock = threading.Lock()

    def take(self, shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray | None:
        """A buffer of ``shape`` and ``dtype`` that no copy uses, or None when the pool is at its limit."""
        key = (tuple(shape), np.dtype(dtype).str)
        if 0 in key[0]:
            return None  # nothing to copy, and the driver refuses to pin 0 bytes: the plain copy handles it
        with self._lock:
            free = self._free.get(key)
            if free:
                buffer, done = free.popleft()  # the oldest: its copy was queued first, so it finishes first
                self.reused += 1
            else:
                size = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
                if self.pinned_bytes + size > self.limit_bytes:
                    return None
                self.pinned_bytes += size
                self.allocated += 1
                buffer, done = None, None
        if buffer is None:
            from numba import cuda

            return cuda.pinned_array(shape, dtype)  # type: ignore[no-any-return]
        if done is not None:
            done.synchronize()  # the copy to the GPU that read this buffer last has finished
        return buffer

    def give(self, buffer: np.ndarray, done: Any = None) -> None:
        """Lend ``buffer`` again once ``done`` (an event after its last copy; None: no copy pending) has passed."""
        with self._lock:
            self._free.setdefault((buffer.shape, buffer.dtype.str), deque()).append((buffer, done))


@cache
def pool() -> PinnedPool:
    """This process's pool (one CUDA context per process: cellgraph uses its device 0)."""
    return PinnedPool(pinned_limit_bytes())


@cache
def copy_stream() -> Any:
    """The stream every boundary copy is queued on (see the module's docstring for why a blocking one)."""
    from numba import cuda

    return cuda.stream()


def _event() -> Any:
    from numba import cuda

    return cuda.event() if simulator() else cuda.event(timing=False)  # type: ignore[call-arg]


def to_device(host: np.ndarray) -> Any:
    """A device copy of ``host``, queued on the copy stream from a pinned buffer; kernels queued after it see it."""
    from numba import cuda

    host = np.asarray(host, order="C")  # not ascontiguousarray: it makes a 0-d array 1-d
    buffer = pool().take(host.shape, host.dtype)
    if buffer is None:
        return cuda.to_device(host)
    np.copyto(buffer, host)
    stream = copy_stream()
    device = cuda.to_device(buffer, stream=stream)
    done = _event()
    done.record(stream)
    pool().give(buffer, done)
    return device


def to_host(device: Any) -> np.ndarray:
    """A new host array holding ``device``'s value (once the kernels queued before this call have written it)."""
    buffer = pool().take(device.shape, device.dtype)
    if buffer is None:
        return device.copy_to_host()  # type: ignore[no-any-return]
    stream = copy_stream()
    device.copy_to_host(buffer, stream=stream)
    stream.synchronize()
    host = buffer.copy()
    pool().give(buffer)
    return host


# ----------------------------------------------------------------------- Sends
_pending = threading.local()  # the Sends a thread (one partition's run) has queued and not yet seen delivered


@cache
def _sender() -> concurrent.futures.ThreadPoolExecutor:
    """One thread, so that Sends are delivered in the order they ran (a Recv takes its key's values in order)."""
    from numba import cuda

    device = getattr(cuda.get_current_device(), "id", 0)  # the simulator's one device has no id
    # The sender waits on events of this context's stream: it works in the same device's context.
    return concurrent.futures.ThreadPoolExecutor(
        1, "cellgraph-gpu-send", initializer=cuda.select_device, initargs=(device,)
    )


def send_async(device: Any, deliver: Callable[[np.ndarray], object]) -> None:
    """Queue ``device``'s copy to a pinned buffer and return; the sender thread calls ``deliver`` with it once copied.

    ``deliver`` must copy what it keeps (the buffer is lent again after it
    returns), as ``Transport.send`` does.
    """
    buffer = pool().take(device.shape, device.dtype)
    if buffer is None:
        deliver(device.copy_to_host())
        return
    stream = copy_stream()
    device.copy_to_host(buffer, stream=stream)
    copied = _event()
    copied.record(stream)
    queued: list[concurrent.futures.Future[None]] = _pending.__dict__.setdefault("futures", [])
    queued.append(_sender().submit(_hand_over, copied, buffer, device, deliver))


def _hand_over(copied: Any, buffer: np.ndarray, source: Any, deliver: Callable[[np.ndarray], object]) -> None:
    """On the sender thread: wait for the copy, deliver, lend the buffer again.

    ``source`` (the device array) is held until its copy has finished, so its
    block is not freed, and so not reused, while the copy reads it.
    """
    try:
        copied.synchronize()
        deliver(buffer)
    finally:
        del source  # held until here: see above
        pool().give(buffer)


def wait_sent(timeout: float = SEND_DEADLINE_S, report: bool = True) -> None:
    """Wait until every Send this thread queued has been delivered; raise the first one's error.

    ``report=False`` (the run failed already, with its own error): wait the
    same, and raise nothing. The thread's list is cleared whatever happens,
    so a failed run leaves nothing for the next one to wait on.
    """
    queued: list[concurrent.futures.Future[None]] = _pending.__dict__.pop("futures", [])
    _, late = concurrent.futures.wait(queued, timeout=timeout)
    if not report:
        return
    if late:
        raise ExecutionError(
            f"{len(late)} of this run's {len(queued)} Sends from the GPU were not delivered within {timeout:g} s"
        )
    for future in queued:  # in the order they ran: the first error is the one to report
        error = future.exception()
        if error is not None:
            raise ExecutionError(f"a Send from the GPU failed: {error}") from error


__all__ = [
    "PinnedPool",
    "copy_stream",
    "pinned_limit_bytes",
    "pool",
    "send_async",
    "to_device",
    "to_host",
    "wait_sent",
]
