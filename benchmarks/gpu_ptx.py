"""The GEMM's instructions, counted in its PTX: what a GPU would run, read without one.

``numba.cuda.compile_ptx`` compiles a kernel for a compute capability without
a device when NVIDIA's NVRTC and NVVM libraries are installed (on a GPU
machine they are; elsewhere ``pip install nvidia-cuda-nvrtc-cu12
nvidia-cuda-nvcc-cu12``). This script compiles the float32 GEMM of
``dataflow/kernels/cuda/gemm.py`` (``a @ b`` of row-major matrices, each tile
shape that ``gpu_kernels.py`` times, and the float64 product's ``SMALL``) for
sm_90 and counts, in the loop over
K tiles alone (between its two barriers), the FMAs, the shared-memory loads
(scalar and vector), the global loads and the integer arithmetic. One tile's
FMAs are ``bk * tm * tn``; the kernel is bound by shared memory when its
loads come close to one for every 4 FMAs, as scalar loads do at 8x8 a
thread.

    python benchmarks/gpu_ptx.py

The last line of stdout is one JSON object: ``tiles`` (per tile shape: the
counts), and ``skipped`` with the reason where NVRTC or NVVM is missing.
``gpu_kernels.py`` adds the same counts to its own line on a GPU.
"""

from __future__ import annotations

import collections
import os
import re
import time
from typing import Any

from _common import emit, machine, source, versions

COMPUTE_CAPABILITY = (9, 0)  # Hopper: the H100 and H200 of the device machines
SIGNATURE = "{t}[::1], {t}[::1], {t}[:, :, ::1], int64, int64, int64, UniTuple(int64, 3), int64[::1], int64[::1]"
NVRTC_HINT = "pip install nvidia-cuda-nvrtc-cu12 nvidia-cuda-nvcc-cu12"
_INSTRUCTION = re.compile(r"^\s+(?:@!?%p\d+\s+)?([a-z][\w.]*)", re.M)


def tile_loop(ptx: str) -> str:
    """The PTX between the kernel's first two barriers: the loop over K tiles (``gemm.kernel_source``)."""
    parts = ptx.split("bar.sync")
    if len(parts) < 3:
        raise ValueError(f"expected two barriers in the GEMM's PTX, found {len(parts) - 1}")
    return parts[1]


def counts(ptx: str) -> dict[str, int]:
    """The tile loop's instructions of interest, by kind."""
    ops = collections.Counter(_INSTRUCTION.findall(tile_loop(ptx)))
    of = lambda prefix: sum(n for op, n in ops.items() if op.startswith(prefix))  # noqa: E731
    return {
        "fma": of("fma."),
        "shared_loads_scalar": ops["ld.shared.f32"] + ops["ld.shared.f64"],
        "shared_loads_vector": of("ld.shared.v"),
        "shared_stores": of("st.shared"),
        "global_loads": of("ld.global"),
        "integer_ops": of("add.s") + of("mul.lo") + of("shl.") + of("shr.") + of("and.") + of("or.b"),
    }


def gemm_counts() -> dict[str, Any]:
    """Counts for each timed tile shape of the float32 row-major GEMM and for float64's, or why there are none."""
    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
        return {"skipped": "Numba's CUDA simulator compiles no PTX"}
    import numpy as np
    from numba import cuda

    from cellgraph.dataflow.kernels.cuda import gemm, matmul

    result: dict[str, Any] = {}
    shapes: list[tuple[gemm.Tiles, np.dtype[Any]]] = [(t, np.dtype(np.float32)) for t in gemm.TIMED]
    for tiles, dtype in [*shapes, (gemm.SMALL, np.dtype(np.float64))]:
        kernel = gemm.gemm_kernel(tiles, dtype, matmul._row_major_a, False, matmul._row_major_b, True)
        try:
            ptx, _ = cuda.compile_ptx(kernel.py_func, SIGNATURE.format(t=dtype.name), cc=COMPUTE_CAPABILITY)
        except Exception as e:  # noqa: BLE001  (NVRTC or NVVM missing: cuda-pathfinder's own error type)
            return {"skipped": f"cannot compile PTX here ({type(e).__name__}: {str(e)[:200]}); {NVRTC_HINT}"}
        name = f"{dtype.name} {tiles.bm}x{tiles.bn}x{tiles.bk}/{tiles.tm}x{tiles.tn}" + (
            f"/regs{tiles.max_registers}" if tiles.max_registers else ""
        )
        result[name] = counts(ptx) | {"fma_expected": tiles.bk * tiles.tm * tiles.tn}
    return {"tiles": result}


def main() -> None:
    started = time.perf_counter()
    found = gemm_counts()
    for name, c in found.get("tiles", {}).items():
        loads = c["shared_loads_scalar"] + c["shared_loads_vector"]
        print(
            f"{name:>22}: {c['fma']} FMAs, {loads} shared loads ({c['shared_loads_vector']} vector), "
            f"{c['global_loads']} global loads, {c['integer_ops']} integer ops per K tile"
        )
    if "skipped" in found:
        print(found["skipped"])
    emit(
        {
            "benchmark": "gpu_ptx",
            "compute_capability": ".".join(map(str, COMPUTE_CAPABILITY)),
            **found,
            "total_s": time.perf_counter() - started,
            "machine": machine(),
            "versions": versions(),
            "source": source(),
        }
    )


if __name__ == "__main__":
    main()
