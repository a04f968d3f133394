"""Elementwise fusion on a GPU: a segment becomes one generated ``@cuda.jit`` kernel.

The CUDA twin of ``dataflow/fusion.py``, which finds the segments and whose
helpers this module reuses: the same scalar expressions (``OpDef.elementwise``),
the same embedded constants, the same cast of every temporary to the segment's
dtype, and the same rule for inputs (the output's shape or a single value;
anything else runs the member kernels one by one). The kernel runs one thread
per element (``launch`` covers the output, up to 2**31 - 1 blocks), and each
thread reads a one-value input once.

``numba.cuda`` is imported when a kernel is compiled or launched, never when
this module is imported (see ``kernels/cuda/__init__.py``): the executor
imports this module for every plan.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, cast

import numpy as np

from ..fused_source import (
    Key,
    Segment,
    compile_loop,
    embeddable,
    embedded_layout,
    fills,
    loop_body,
    loop_shape,
    tensor_key,
)
from . import flat, launch


def _host(value: Any) -> np.ndarray:
    """A constant's value on the host: plans on a GPU hold constants as device arrays."""
    return value.copy_to_host() if hasattr(value, "copy_to_host") else np.asarray(value)


def kernel_source(
    segment: Segment, constants: dict[Key, np.ndarray] | None = None, scalars: Sequence[bool] | None = None
) -> str:
    """Python source of the fused CUDA kernel: ``fused(n, out, x0, x1, ...)``.

    ``constants`` (host arrays) and ``scalars`` mean what they mean for the CPU
    loop (``fused_source.loop_source``). ``tanh_`` is ``math.tanh``: the GPU has a
    fast one, so the CPU loop's vectorisable approximation is not needed;
    ``sigmoid_`` is the same tail-exact formula as the CPU loop's.
    Division by zero gives inf: outside debug mode, Numba compiles CUDA kernels
    with NumPy's error model.
    """
    dtype = segment.output.dtype
    parts = loop_body(segment, constants, scalars)
    header = [
        "import numpy as np",
        "from numba import cuda",
        "",
        "from cellgraph.dataflow.kernels.cuda import device_math",
        "",
        "math = device_math()",
        "tanh_ = math.tanh",
        f"DT = np.{dtype}",
        "",
        "",
        # The logistic function with neither tail cancelled (see kernels/cpu/scalar.py).
        "@cuda.jit(device=True, inline=True)",
        "def sigmoid_(x):",
        "    e = math.exp(-abs(x))",
        "    r = DT(1.0) / (DT(1.0) + e)",
        "    return r if x >= DT(0.0) else e * r",
    ]
    # Module-level arrays are constants of the kernel (Numba puts them in constant memory).
    lines = [*header, *parts.constants, "", "", "@cuda.jit(cache=True)", f"def fused(n, out{parts.params}):"]
    # One thread an element, as every other kernel here: a grid-stride loop (range(cuda.grid(1), n,
    # cuda.gridsize(1))) made each thread compute its trip count, a 64-bit division: 237 PTX instructions
    # a thread where the body needs about 40, and the 8-op chain moved 0.59 of copy bandwidth on an H200.
    lines += [*parts.prologue, "    i = cuda.grid(1)", "    if i < n:", *parts.body]
    return "\n".join(lines) + "\n"


def segment_kernel(
    segment: Segment, node_kernels: Sequence[Callable[..., Any]], constants: dict[Key, Any] | None = None
) -> Callable[..., Any]:
    """The callable a CUDA plan runs for ``segment``: device arrays in, a fresh
    device array out; the member kernels one by one when the inputs' shapes
    need real broadcasting (or an input is not C-contiguous)."""
    # Device constants small enough to embed: their host values go into the source,
    # the device arrays stay for the op-by-op path.
    embedded = embeddable(segment, constants or {})
    host = {k: _host(v) for k, v in embedded.items()}
    inputs = segment.inputs()
    dynamic = [t for t in inputs if tensor_key(t) not in embedded]
    required, rank = embedded_layout([tuple(v.shape) for v in host.values()])
    kernels: dict[tuple[bool, ...], Any] = {}
    dtype = np.dtype(segment.output.dtype)
    members = list(zip(segment.nodes, node_kernels, strict=True))
    strict = segment.strict()  # as the CPU's: a single-value input to an op that does not broadcast goes one by one

    def one_by_one(*xs: Any) -> Any:
        env: dict[Key, Any] = dict(embedded)
        env.update((tensor_key(t), x) for t, x in zip(dynamic, xs, strict=True))
        for node, kernel in members:
            env[tensor_key(node.output(0))] = kernel(*(env[tensor_key(t)] for t in segment.reads(node)))
        return env[tensor_key(segment.output)]

    def run(*xs: Any) -> Any:
        shape = loop_shape([tuple(x.shape) for x in xs], required, rank)
        if shape is None:
            return one_by_one(*xs)
        args = []
        pattern = []
        for x in xs:
            if fills(tuple(x.shape), shape) and x.is_c_contiguous():
                args.append(flat(x))
                pattern.append(False)
            elif x.size == 1 and x.ndim <= len(shape) and not strict:
                args.append(flat(x))
                pattern.append(True)
            else:
                return one_by_one(*xs)
        key = tuple(pattern)
        kernel = kernels.get(key)
        if kernel is None:
            # compile_loop loads the source's `fused` from a file, so Numba can cache its code.
            kernel = kernels[key] = cast(Any, compile_loop(kernel_source(segment, host, key)))
        from numba import cuda

        out = cuda.device_array(shape, dtype)
        if out.size:
            blocks, threads = launch(out.size)
            kernel[blocks, threads](out.size, flat(out), *args)
        return out

    run.inputs = dynamic  # type: ignore[attr-defined]
    return run
