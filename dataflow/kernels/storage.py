"""Storage-only dtypes: the one wrapper that lets every kernel take them.

Numba computes in neither float16 nor bfloat16, so half floats are stored, not
computed in. A node that reads or makes a half tensor gets its ordinary kernel
wrapped: half inputs are read as float32, the float32 kernel runs, and each
half output is rounded back (round to nearest even, NumPy's and ml_dtypes'
cast). Reductions, matmul and convolution therefore accumulate in float32.

The narrow integers (int8, uint8, int16) are computed in by Numba, but its
reductions and NumPy's promote them (a sum of int8 comes back int64); their
outputs are cast to the node's dtype, wrapping as TensorFlow's do.

Nodes that involve none of these dtypes keep their kernel as it is: the wrapper
costs nothing on the float32 path. Ops that update state in place (variables,
assignments, optimizer updates) are never wrapped: they move values with NumPy,
which stores half floats exactly, and an upcast copy would lose the update. Nor
are Send and Recv: a half tensor crosses between partitions in its own dtype.

String tensors (object arrays of str) are read by no Numba kernel: the few
ops that take them (``OpDef.strings``) run their NumPy reference instead, on
the CPU.

On the CUDA device a half-float node is refused when its kernel is bound, with
the node named: the device kernels are float32/float64 only.

Examples
--------
Summed in float16, 4096 ones would stop at 2048 (2048 + 1 rounds to 2048):

>>> import numpy as np
>>> import cellgraph as cg
>>> g = cg.Graph()
>>> with g.as_default():
...     x = cg.placeholder((4096,), "float16", name="x")
...     total = cg.reduce_sum(x)
>>> float(cg.Session(g).run(total, {x: np.ones(4096, np.float16)}))
4096.0
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from ..dtypes import COMPUTE_DTYPE, DTYPES, HALF_FLOATS, STRING, is_half
from ..errors import KernelNotFound

if TYPE_CHECKING:
    from ..graph import Node
    from ..opdef import KernelContext, KernelFactory, OpDef

NARROW_INTS = frozenset({"int8", "uint8", "int16"})
_NARROW = HALF_FLOATS | NARROW_INTS


def _dtypes_of(node: Node) -> set[str]:
    return {t.dtype for t in node.inputs} | {s.dtype for s in node.specs}


def _strings(node: Node) -> Callable[..., Any]:
    """The NumPy reference of a node on string tensors (object arrays, which Numba cannot read)."""
    reference, attrs = node.opdef.reference, node.attrs

    def run(*arrays: Any) -> Any:
        result = reference(attrs, *arrays)
        if isinstance(result, tuple):
            return tuple(np.asarray(r, dtype=DTYPES[s.dtype]) for r, s in zip(result, node.specs, strict=True))
        return np.asarray(result, dtype=DTYPES[node.specs[0].dtype])

    return run


def kernel_keys(node: Node) -> set[str]:
    """The kernel kinds ("cpu", "cuda") that can run ``node``: its op's, less cuda for a string tensor
    (placement asks, to keep such a node off a GPU; a cuda kernel bound to one is refused below)."""
    keys = set(node.opdef.kernels)
    if STRING in _dtypes_of(node):
        keys.discard("cuda")
    return keys


def _cpu(factory: KernelFactory) -> KernelFactory:
    def bind(node: Node, ctx: KernelContext) -> Callable[..., Any]:
        # A stateful op with no inputs or no outputs (Recv, Send) moves a value between partitions as it is.
        moves_only = node.opdef.stateful and not (node.inputs and node.specs)
        if node.inputs and STRING in _dtypes_of(node) and not moves_only:
            return _strings(node)
        kernel = factory(node, ctx)
        if moves_only or not _dtypes_of(node) & _NARROW:
            return kernel
        # Upcast the half inputs only; int inputs (indices, labels) pass as they are.
        upcast = [np.dtype(COMPUTE_DTYPE[t.dtype]) if is_half(t.dtype) else None for t in node.inputs]
        stored = [DTYPES[s.dtype] for s in node.specs]

        def run(*arrays: Any) -> Any:
            args = [a if u is None else np.asarray(a).astype(u) for a, u in zip(arrays, upcast, strict=True)]
            result = kernel(*args)
            # Past float16's range the rounded value is inf, as IEEE 754 says (a loss scale watches for it).
            with np.errstate(over="ignore"):
                if isinstance(result, tuple):
                    return tuple(np.asarray(r).astype(d, copy=False) for r, d in zip(result, stored, strict=True))
                return np.asarray(result).astype(stored[0], copy=False)

        return run

    return bind


def _cuda(factory: KernelFactory) -> KernelFactory:
    def bind(node: Node, ctx: KernelContext) -> Callable[..., Any]:
        if STRING in _dtypes_of(node):
            raise KernelNotFound(
                f"{node.describe()} has no cuda kernel for string tensors: strings are computed on the cpu device"
            )
        half = sorted(_dtypes_of(node) & HALF_FLOATS)
        if half:
            raise KernelNotFound(
                f"{node.describe()} has no cuda kernel for {', '.join(half)}: half floats are storage-only and "
                "computed on the cpu device (cast to float32 to run it on a GPU)"
            )
        return factory(node, ctx)

    return bind


def wrap(opdef: OpDef) -> None:
    """Give ``opdef``'s kernels the storage-dtype handling above (once; in place)."""
    if opdef.stateful and opdef.view:
        return
    for device, wrapper in (("cpu", _cpu), ("cuda", _cuda)):
        factory = opdef.kernels.get(device)
        if factory is not None and not getattr(factory, "_storage", False):
            wrapped = wrapper(factory)
            wrapped._storage = True  # type: ignore[attr-defined]
            opdef.kernels[device] = wrapped
