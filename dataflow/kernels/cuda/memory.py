"""A caching allocator for device memory: a freed block waits for the next allocation of its size.

Every CUDA kernel returns fresh device arrays (the package's policy), so a
training step allocates and frees each intermediate once. Numba's own manager
asks the driver each time: ``cuMemAlloc`` maps fresh pages, and ``cuMemFree``,
run in batches, waits for the device. On an H200 that cost about 0.3 ms an op
on 256 MiB tensors, more than the op itself (``benchmarks/gpu_kernels.py``:
the unfused chain took 3.8 ms for about 1.2 ms of memory traffic). Like
PyTorch's and CuPy's pools, this one keeps freed blocks by size class and hands
them out again; a block's reuse is safe because every kernel runs on the
default stream, in order: the kernel that last read a freed block has been
queued before the one that writes it next.

It is Numba's External Memory Management plugin interface, installed by
``install()`` when cellgraph first touches CUDA, before the process's CUDA
context exists (a context keeps the manager it was created with: arrays made
with ``numba.cuda`` before cellgraph's first CUDA use live in Numba's default
manager, and ``active()`` says so). ``CELLGRAPH_CUDA_POOL=0`` turns it off,
for a memory checker or to compare. ``release_cached()`` gives the kept blocks
back to the driver; the pool does so by itself when an allocation runs out of
memory, then tries once more. The simulator has no plugins: there it is off.
"""

from __future__ import annotations

import os
import weakref
from functools import cache
from typing import Any

POOL_ENV = "CELLGRAPH_CUDA_POOL"
SMALL_STEP = 512  # bytes: blocks up to 1 MiB are rounded to this (cudaMalloc's own alignment)
LARGE_STEP = 2 << 20  # above 1 MiB, to 2 MiB steps, so that nearby sizes share blocks


def size_class(size: int) -> int:
    """The block size that serves an allocation of ``size`` bytes."""
    step = SMALL_STEP if size <= (1 << 20) else LARGE_STEP
    return -(-size // step) * step


@cache
def pool_class() -> type:
    """The plugin class (made on first use: ``numba.cuda`` is imported lazily)."""
    from numba.cuda.cudadrv import driver as drv

    class CachingMemoryManager(drv.NumbaCUDAMemoryManager):  # type: ignore[misc, name-defined]
        """Numba's manager, with freed device blocks kept by size class instead of freed."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.free_blocks: dict[int, list[Any]] = {}
            self.cached_bytes = 0
            self.reused = 0  # allocations served from the pool: a test and the benchmark read it

        def memalloc(self, size: int) -> Any:
            block = size_class(size)
            try:  # list.pop is atomic: two threads (a PartitionedSession's) never take the same block
                ptr = self.free_blocks.get(block, []).pop()
            except IndexError:
                ptr = self._fresh(block)
            else:
                self.cached_bytes -= block
                self.reused += 1
            key = int(ptr)
            mem = drv.AutoFreePointer(weakref.proxy(self.context), ptr, size, finalizer=self._keeper(ptr, key, block))
            self.allocations[key] = mem
            return mem.own()

        def _fresh(self, block: int) -> Any:
            try:
                return drv.driver.cuMemAlloc(block)
            except drv.CudaAPIError as err:
                if err.code != drv.binding.CUresult.CUDA_ERROR_OUT_OF_MEMORY:
                    raise
                self.release_cached()  # the kept blocks may be what the device lacks
                self.deallocations.clear()
                return drv.driver.cuMemAlloc(block)

        def _keeper(self, ptr: Any, key: int, block: int) -> Any:
            free_blocks, allocations = self.free_blocks, self.allocations
            manager = weakref.ref(self)

            def keep() -> None:  # the block's last array is gone: keep it for the next allocation
                allocations.pop(key, None)
                owner = manager()
                if owner is None:  # the context is gone, and its memory with it
                    return
                free_blocks.setdefault(block, []).append(ptr)
                owner.cached_bytes += block

            return keep

        def release_cached(self) -> int:
            """Free every kept block; the bytes given back to the driver."""
            released = self.cached_bytes
            for blocks in self.free_blocks.values():
                for ptr in blocks:
                    drv.driver.cuMemFree(ptr)
            self.free_blocks.clear()
            self.cached_bytes = 0
            return released

        def reset(self) -> None:
            self.release_cached()
            super().reset()

    return CachingMemoryManager


def enabled() -> bool:
    """True when this process should use the pool: a real GPU, and not turned off."""
    from . import simulator

    return not simulator() and os.environ.get(POOL_ENV, "1") != "0"


@cache
def install() -> bool:
    """Make the pool the manager of every CUDA context this process creates from now on; True if it is."""
    if not enabled():
        return False
    from numba import cuda

    cuda.set_memory_manager(pool_class())
    return True


def active() -> bool:
    """True when the current CUDA context allocates from the pool."""
    if not enabled():
        return False
    from numba import cuda

    return isinstance(cuda.current_context().memory_manager, pool_class())


def release_cached() -> int:
    """Give the current context's kept blocks back to the driver (as ``torch.cuda.empty_cache``); the bytes freed."""
    if not active():
        return 0
    from numba import cuda

    return int(cuda.current_context().memory_manager.release_cached())
