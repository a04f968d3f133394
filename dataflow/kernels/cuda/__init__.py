"""Numba-CUDA kernels, one module per op family (the twins of ``kernels/cpu``).

The policy every CUDA kernel follows:

- A kernel factory binds a node to a callable that takes Numba device arrays
  and returns device arrays (a tuple for several outputs). Nothing is copied
  to or from the host inside a kernel: scalars an op reads at run time (a
  learning rate, Adam's step count) are read on the device. Host copies
  happen only at device boundaries (Send/Recv), which are not the kernels'
  business.
- Outputs are fresh C-contiguous device arrays, except for ops that update a
  variable in place (assign, optimizer updates), which return the variable.
- Device memory comes from a caching pool (``memory.py``): a freed block is
  reused by the next allocation of its size, without the driver.
- ``numba.cuda`` is imported when the first CUDA kernel is bound, not on
  ``import cellgraph``: it costs a quarter of a second, and it reads
  ``NUMBA_ENABLE_CUDASIM`` once, when imported, so a process chooses between
  a real GPU and Numba's simulator at that moment.
"""

from __future__ import annotations

import importlib
import math
import os
import types
import weakref
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ...graph import Node
    from ...opdef import KernelContext, KernelFactory

# Threads per block for one-dimensional launches. The simulator runs every CUDA
# thread as a Python thread and blocks one after another, so there blocks are
# sized to the work, however small; on a GPU a block is at least one warp.
MAX_THREADS = 256
WARP = 32


def simulator() -> bool:
    """True when this process runs CUDA kernels on Numba's simulator."""
    return os.environ.get("NUMBA_ENABLE_CUDASIM", "0") == "1"


def device_math() -> Any:
    """``math`` as device code should see it.

    On a GPU, the ``math`` module itself (Numba compiles its functions). On
    the simulator, kernels run as Python, where ``math.exp(1e4)`` raises
    OverflowError and ``math.log(-1.0)`` ValueError; a GPU answers inf and
    NaN. There, the functions that raise are replaced by NumPy's, which follow
    IEEE 754 as the device does, so the simulator column checks the same
    numbers a GPU gives, special values included.
    """
    if not simulator():
        return math
    import numpy as np

    def ieee(fn: Any) -> Any:
        def call(*args: Any) -> Any:
            with np.errstate(all="ignore"):
                return fn(*args)

        return call

    # floor and ceil too: Python's return an int (and raise for inf and NaN), the device's a float; fmod(inf, y)
    # raises too.
    names = ("exp", "expm1", "log", "log1p", "log10", "log2", "sqrt", "sin", "cos", "tan", "floor", "ceil", "fmod")
    overrides = {name: ieee(getattr(np, name)) for name in names}
    return types.SimpleNamespace(**{**vars(math), **overrides})


def available() -> bool:
    """True when ``numba.cuda`` sees a GPU, or the simulator is on."""
    from numba import cuda

    from .memory import install

    install()  # before the first context: device arrays come from the caching pool (memory.py)
    return bool(cuda.is_available())


def launch(n: int, max_threads: int = MAX_THREADS) -> tuple[int, int]:
    """``(blocks, threads)`` covering ``n`` work items, one thread each."""
    threads = min(max_threads, 1 << max(n - 1, 0).bit_length())
    if not simulator():
        threads = max(threads, WARP)
    return max(math.ceil(n / threads), 1), threads


def cuda_kernel(module: str, name: str, *args: Any) -> KernelFactory:
    """The kernel factory ``name`` of ``kernels/cuda/<module>.py``, imported on first bind.

    ``name(node, ctx, *args)`` returns the bound callable.
    """

    def bind(node: Node, ctx: KernelContext) -> Any:
        from .memory import install

        install()  # before the first context: device arrays come from the caching pool (memory.py)
        family = importlib.import_module(f"{__name__}.{module}")
        return getattr(family, name)(node, ctx, *args)

    return bind


# Device copies of variables, per variable store, so that every plan of one
# session reads and updates the same device array. Writing them back to the
# host store happens at a device boundary (Send/Recv), like any other copy.
_DEVICE_VALUES: weakref.WeakKeyDictionary[Any, dict[str, tuple[Any, Any]]] = weakref.WeakKeyDictionary()


def device_value(store: Any, node: Node) -> Any:
    """The device array of variable ``node`` in ``store``, copied from its host value on first use."""
    from numba import cuda

    values = _DEVICE_VALUES.setdefault(store, {})
    # Keyed by the host array itself: the store makes a new one when the variable is re-initialised
    # (its cell re-run with another shape, dtype or initial value), and only then.
    host = store.value(node)
    if node.name not in values or values[node.name][0] is not host:
        values[node.name] = (host, cuda.to_device(host))
    return values[node.name][1]


def flat(x: Any) -> Any:
    """A 1-D view of a C-contiguous device array (a 0-d one becomes length 1, an empty one length 0)."""
    return x.reshape(x.size if x.shape else 1)


def broadcast_strides(shape: tuple[int, ...], out_shape: tuple[int, ...]) -> tuple[int, ...]:
    """Element strides that read a C-contiguous ``shape`` broadcast to ``out_shape``:
    0 along every dimension that broadcasting stretches or adds."""
    padded = (1,) * (len(out_shape) - len(shape)) + tuple(shape)
    strides, step = [], 1
    for d in reversed(padded):
        strides.append(step if d != 1 else 0)
        step *= d
    return tuple(reversed(strides))
