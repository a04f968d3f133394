"""CUDA kernels on a real GPU: matmul vs cuBLAS, a fused elementwise chain vs copy bandwidth.

- Matmul: 4096 x 4096 float32, ``a @ b`` as a cellgraph plan on a GPU device
  (the register-blocked GEMM of ``dataflow/kernels/cuda/gemm.py``; cuBLAS
  backs no cellgraph op), against CuPy's ``matmul`` (cuBLAS, full float32:
  ``CUPY_TF32=0``) in the same run. CuPy is optional: without it the script
  says how to install it and reports cellgraph's figure alone. Each tile shape
  of ``gemm.py`` is timed on the same product too (``matmul_tiles``), so a
  run on a GPU says which shape ``choose_tiles`` should pick.
- Fused chain: ``max(exp(max(x * 0.5 + b, 0) - 0.25) * d, -0.5) + 1.0`` on
  64M float32 elements, 8 elementwise ops fused into one generated CUDA
  kernel (``dataflow/kernels/cuda/fusion.py``), as a cellgraph plan called
  with device arrays. It is the chain of ``benchmarks/fusion.py`` with ``relu``
  written as ``maximum(., 0)`` and ``tanh`` as ``exp``, ops that have CUDA
  kernels. One pass reads x, b, d and writes y: its GB/s counts those four
  arrays. The yardstick is a device-to-device copy of the same bytes (half
  read, half written), ``copy_to_device`` between two device arrays.

Every timing is wall-clock over a block of back-to-back calls, the device
synchronised before and after, so plan dispatch and output allocation count.

    python benchmarks/gpu_kernels.py [--quick] [--simulate]

The last line of stdout is one JSON object with ``matmul_tflops``,
``cublas_tflops`` (null without CuPy), ``matmul_ratio`` (target: at least
0.5), ``fused_gb_per_s``, ``copy_gb_per_s``, ``fused_ratio`` (target: at
least 0.7), ``fused_dispatch_ms`` (the host's time to issue one fused call:
near ``fused_ms``, the host sets the pace), the host copies' GB/s plain and
through the pinned buffers of ``staging.py`` (``h2d_pinned_over_pageable``,
``d2h_pinned_over_pageable``; no target) and ``gpu``. Without a GPU (or on Numba's simulator) it says so,
prints ``{"gpu": null, "skipped": "no CUDA GPU"}`` and exits 0. ``--simulate``
runs every step on Numba's CUDA simulator instead, on tiny shapes and without
cuBLAS: it checks the script (``tests/test_gpu_check.py``), it measures nothing.
"""

from __future__ import annotations

import functools
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

from _common import emit, machine, parser, setup_threads, source, versions

MATMUL_N = 4096
SIZE = 64 * 1024 * 1024  # float32 elements: 256 MiB per array
OPS = 8
ARRAYS_TOUCHED = 4  # a fused pass reads x, b, d and writes y
TARGET_MATMUL = 0.5
TARGET_FUSED = 0.7
CUPY_HINT = "pip install cupy-cuda12x"
CHAIN = "max(exp(max(x * 0.5 + b, 0) - 0.25) * d, -0.5) + 1.0"
SIMULATED_MATMUL_N = 40  # the simulator runs every CUDA thread as a Python thread
SIMULATED_SIZE = 512


def gpu_seconds(fn: Callable[[], Any], cuda: Any, *, repeats: int, number: int) -> float:
    """Median seconds per call of ``fn`` over ``repeats`` blocks of ``number`` calls, after one warmup call."""
    fn()
    cuda.synchronize()
    per_call = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(number):
            fn()
        cuda.synchronize()
        per_call.append((time.perf_counter() - start) / number)
    return statistics.median(per_call)


def host_seconds(fn: Callable[[], Any], cuda: Any, *, number: int) -> float:
    """Host seconds per call of ``fn``, not waiting for the device: what a call costs the CPU to issue.

    When it is near the call's time with the device synchronised (``gpu_seconds``), the host, not the
    kernel, sets the pace.
    """
    fn()
    cuda.synchronize()
    start = time.perf_counter()
    for _ in range(number):
        fn()
    seconds = (time.perf_counter() - start) / number
    cuda.synchronize()
    return seconds


def plan(cg: Any, out: Any, feeds: list[Any], fuse: bool = True) -> Any:
    """The plan that computes ``out`` from ``feeds`` on the GPU: device arrays in and out."""
    from cellgraph.dataflow.executor import Plan
    from cellgraph.dataflow.variables import VariableStore

    return Plan(out.graph, [out], [], feeds, VariableStore(), device="cuda", fuse=fuse)


def bench_matmul(cg: Any, np: Any, cuda: Any, n: int, repeats: int, number: int, simulate: bool) -> dict[str, Any]:
    """cellgraph's MatMul kernel on ``n`` x ``n`` float32, and cuBLAS through CuPy if installed."""
    g = cg.Graph()
    with g.as_default():
        a, b = cg.placeholder((n, n), "float32", name="a"), cg.placeholder((n, n), "float32", name="b")
        product = cg.matmul(a, b)
    matmul = plan(cg, product, [a, b])
    rng = np.random.default_rng(0)
    a_host, b_host = (rng.standard_normal((n, n), dtype=np.float32) for _ in range(2))
    a_dev, b_dev = cuda.to_device(a_host), cuda.to_device(b_host)
    (got,) = matmul(a_dev, b_dev)
    rows = min(n, 8)
    want = a_host[:rows].astype(np.float64) @ b_host.astype(np.float64)
    if not np.allclose(got[:rows].copy_to_host(), want, rtol=1e-3, atol=1e-3 * np.sqrt(n)):
        raise SystemExit("cellgraph's CUDA matmul disagrees with NumPy")
    flop = 2.0 * n**3
    seconds = gpu_seconds(lambda: matmul(a_dev, b_dev), cuda, repeats=repeats, number=number)
    result: dict[str, Any] = {"matmul_tflops": flop / seconds / 1e12, "cublas_tflops": None, "matmul_ratio": None}
    print(f"matmul {n}x{n} float32, cellgraph: {seconds * 1e3:8.3f} ms  {result['matmul_tflops']:.2f} TFLOP/s")
    result.update(bench_tiles(np, cuda, a_dev, b_dev, repeats, number))
    if simulate:
        result["cublas_skipped"] = "the simulator has no cuBLAS"
        return result
    try:
        import cupy
    except ImportError:
        print(f"cupy is not installed, so there is no cuBLAS figure to compare with: {CUPY_HINT}")
        result.update(cupy_missing=True, install=CUPY_HINT)
        return result
    a_cp, b_cp = cupy.asarray(a_dev), cupy.asarray(b_dev)  # zero-copy views of the same device memory
    if not np.allclose(cupy.asnumpy(cupy.matmul(a_cp[:rows], b_cp)), want, rtol=1e-3, atol=1e-3 * np.sqrt(n)):
        raise SystemExit("cupy's matmul disagrees with NumPy")
    cublas = gpu_seconds(lambda: cupy.matmul(a_cp, b_cp), cuda, repeats=repeats, number=number)
    result["cublas_tflops"] = flop / cublas / 1e12
    result["matmul_ratio"] = result["matmul_tflops"] / result["cublas_tflops"]
    result["cupy"] = cupy.__version__
    print(f"matmul {n}x{n} float32, cuBLAS:    {cublas * 1e3:8.3f} ms  {result['cublas_tflops']:.2f} TFLOP/s")
    return result


def bench_tiles(np: Any, cuda: Any, a: Any, b: Any, repeats: int, number: int) -> dict[str, Any]:
    """TFLOP/s of ``a @ b`` on each tile shape of ``gemm.py``, and the shape ``choose_tiles`` picks."""
    from cellgraph.dataflow.kernels.cuda import gemm
    from cellgraph.dataflow.kernels.cuda.matmul import matmul

    m, k = a.shape
    flop = 2.0 * m * k * b.shape[1]
    figures = {}
    for tiles in gemm.TIMED:
        name = f"{tiles.bm}x{tiles.bn}x{tiles.bk}, {tiles.tm}x{tiles.tn} a thread"
        name += f", at most {tiles.max_registers} registers" if tiles.max_registers else ""
        seconds = gpu_seconds(
            functools.partial(matmul, a, b, False, False, tiles), cuda, repeats=repeats, number=number
        )
        figures[name] = flop / seconds / 1e12
        print(f"  tiles {name:>50}: {seconds * 1e3:8.3f} ms  {figures[name]:.2f} TFLOP/s")
    chosen = gemm.choose_tiles(m, b.shape[1], np.dtype(np.float32))
    return {"matmul_tiles": figures, "matmul_kernel": f"numba gemm.py, {chosen.bm}x{chosen.bn} tiles by default"}


def build_chain(cg: Any, size: int) -> tuple[Any, list[Any]]:
    """The 8-op chain as a graph: (output tensor, [x, b, d] placeholders)."""
    g = cg.Graph()
    with g.as_default():
        x, b, d = (cg.placeholder((size,), "float32", name=name) for name in ("x", "b", "d"))
        y = x * 0.5  # 1 Mul, scalar
        y = y + b  # 2 Add, same shape
        y = cg.maximum(y, 0.0)  # 3 Maximum (relu)
        y = y - 0.25  # 4 Sub, scalar
        y = cg.exp(y)  # 5 Exp
        y = y * d  # 6 Mul, same shape
        y = cg.maximum(y, -0.5)  # 7 Maximum, scalar
        y = y + 1.0  # 8 Add, scalar
    return y, [x, b, d]


def numpy_chain(np: Any, x: Any, b: Any, d: Any) -> Any:
    f32 = np.float32
    y = np.maximum(x * f32(0.5) + b, f32(0.0))
    return np.maximum(np.exp(y - f32(0.25)) * d, f32(-0.5)) + f32(1.0)


def bench_fused(cg: Any, np: Any, cuda: Any, size: int, repeats: int, number: int) -> dict[str, Any]:
    """The fused chain's GB/s, the unfused plan's, and a device-to-device copy of the same bytes."""
    out, feeds = build_chain(cg, size)
    fused, unfused = plan(cg, out, feeds), plan(cg, out, feeds, fuse=False)
    calls = [step for step in fused.steps if not step.constant]
    if len(calls) != 1 or len(calls[0].nodes) != OPS:
        raise SystemExit(f"expected the {OPS}-op chain to fuse into one kernel, got {[len(s.nodes) for s in calls]}")
    rng = np.random.default_rng(0)
    hosts = [rng.standard_normal(size, dtype=np.float32) for _ in range(3)]
    x, b, d = (cuda.to_device(h) for h in hosts)
    want = numpy_chain(np, *hosts)
    for name, p in (("fused", fused), ("unfused", unfused)):
        got = p(x, b, d)[0].copy_to_host()
        if not np.allclose(got, want, rtol=1e-5, atol=1e-6):
            raise SystemExit(f"the {name} chain on the GPU disagrees with NumPy")
    moved = ARRAYS_TOUCHED * size * 4
    fused_s = gpu_seconds(lambda: fused(x, b, d), cuda, repeats=repeats, number=number)
    unfused_s = gpu_seconds(lambda: unfused(x, b, d), cuda, repeats=repeats, number=max(number // 4, 1))
    # A copy reads and writes half the bytes each: the same traffic as one fused pass.
    src = cuda.to_device(np.concatenate(hosts[:2]))
    dst = cuda.device_array_like(src)
    copy_s = gpu_seconds(lambda: dst.copy_to_device(src), cuda, repeats=repeats, number=number)
    dispatch_s = host_seconds(lambda: fused(x, b, d), cuda, number=number)
    result = {
        "fused_dispatch_ms": dispatch_s * 1e3,
        "fused_gb_per_s": moved / fused_s / 1e9,
        "copy_gb_per_s": 2 * src.nbytes / copy_s / 1e9,
        "unfused_gb_per_s": moved / unfused_s / 1e9,
        "fused_ms": fused_s * 1e3,
        "unfused_ms": unfused_s * 1e3,
        "copy_ms": copy_s * 1e3,
    }
    result["fused_ratio"] = result["fused_gb_per_s"] / result["copy_gb_per_s"]
    for name in ("fused", "unfused", "copy"):
        print(f"{name:>8}: {result[f'{name}_ms']:8.3f} ms  {result[f'{name}_gb_per_s']:8.1f} GB/s")
    print(f"fused, host time to issue one call: {result['fused_dispatch_ms']:8.3f} ms")
    return result


def bench_host_copies(np: Any, cuda: Any, size: int, repeats: int, number: int) -> dict[str, Any]:
    """Host-to-GPU and GPU-to-host copies of ``size`` float32: plain (pageable) against the boundary's pinned ones.

    The pinned path is what a partition's feeds, fetches, Recvs and Sends use
    (``dataflow/kernels/cuda/staging.py``): a copy into a lent page-locked
    buffer, DMA on the copy stream, and, to the host, a copy out of it.
    """
    from cellgraph.dataflow.kernels.cuda import staging

    host = np.random.default_rng(1).standard_normal(size, dtype=np.float32)
    on_device = cuda.to_device(host)
    if not (np.array_equal(staging.to_host(staging.to_device(host)), host)):
        raise SystemExit("a pinned round trip through the GPU changed the values")
    seconds = {
        "h2d_pageable": gpu_seconds(lambda: cuda.to_device(host), cuda, repeats=repeats, number=number),
        "h2d_pinned": gpu_seconds(lambda: staging.to_device(host), cuda, repeats=repeats, number=number),
        "d2h_pageable": gpu_seconds(on_device.copy_to_host, cuda, repeats=repeats, number=number),
        "d2h_pinned": gpu_seconds(lambda: staging.to_host(on_device), cuda, repeats=repeats, number=number),
    }
    result: dict[str, Any] = {f"{name}_gb_per_s": host.nbytes / s / 1e9 for name, s in seconds.items()}
    for way in ("h2d", "d2h"):
        result[f"{way}_pinned_over_pageable"] = result[f"{way}_pinned_gb_per_s"] / result[f"{way}_pageable_gb_per_s"]
    result["host_copy_bytes"] = host.nbytes
    for name in seconds:
        print(f"{name:>13}: {result[f'{name}_gb_per_s']:8.1f} GB/s")
    return result


def main() -> None:
    cli = parser(__doc__.splitlines()[0])
    cli.add_argument("--simulate", action="store_true", help="Numba's CUDA simulator, tiny shapes: checks the script")
    args = cli.parse_args()
    setup_threads(args.threads)
    if args.simulate:
        os.environ["NUMBA_ENABLE_CUDASIM"] = "1"  # read once, when numba.cuda is first imported
    os.environ.setdefault("CUPY_TF32", "0")  # cuBLAS in full float32, like cellgraph's kernel
    started = time.perf_counter()

    import numpy as np
    from numba import cuda

    if not args.simulate and (os.environ.get("NUMBA_ENABLE_CUDASIM") == "1" or not cuda.is_available()):
        print("no CUDA GPU is present (numba.cuda sees none, or runs the simulator): nothing to measure")
        emit({"gpu": None, "skipped": "no CUDA GPU"})
        return

    import cellgraph as cg
    from cellgraph.dataflow.kernels.cuda import memory

    memory.install()  # before the name query below creates this process's CUDA context
    name = "Numba's CUDA simulator" if args.simulate else cuda.get_current_device().name
    gpu = name.decode() if isinstance(name, bytes) else str(name)
    print(f"GPU: {gpu}")
    matmul_n, size = (SIMULATED_MATMUL_N, SIMULATED_SIZE) if args.simulate else (MATMUL_N, SIZE)
    repeats, number = (1, 1) if args.simulate else (3, 2) if args.quick else (7, 5)
    result: dict[str, Any] = {"benchmark": "gpu_kernels", "gpu": gpu, "quick": args.quick, "simulated": args.simulate}
    result["cuda_pool"] = memory.active()  # device arrays from cellgraph's caching pool (kernels/cuda/memory.py)
    result.update(bench_matmul(cg, np, cuda, matmul_n, repeats, number, args.simulate))
    repeats, number = (1, 1) if args.simulate else (5, 10) if args.quick else (15, 40)
    result.update(bench_fused(cg, np, cuda, size, repeats, number))
    result.update(bench_host_copies(np, cuda, size // 4, repeats, number))  # 64 MiB on a GPU
    matmul_met = result["matmul_ratio"] is not None and result["matmul_ratio"] >= TARGET_MATMUL
    fused_met = result["fused_ratio"] >= TARGET_FUSED
    if result["matmul_ratio"] is not None:
        verdict = "met" if matmul_met else "NOT met"
        print(f"matmul / cuBLAS = {result['matmul_ratio']:.2f} (target >= {TARGET_MATMUL}: {verdict})")
    print(f"fused / copy = {result['fused_ratio']:.2f} (target >= {TARGET_FUSED}: {'met' if fused_met else 'NOT met'})")
    result.update(
        {
            "chain": CHAIN,
            "ops": OPS,
            "size": size,
            "matmul_n": matmul_n,
            "dtype": "float32",
            "target_matmul_ratio": TARGET_MATMUL,
            "target_fused_ratio": TARGET_FUSED,
            "target_matmul_met": matmul_met if result["matmul_ratio"] is not None else None,
            "target_fused_met": fused_met,
            "threads": args.threads,
            "total_s": time.perf_counter() - started,
            "machine": machine(),
            "versions": versions(),
            "source": source(),
        }
    )
    emit(result)


if __name__ == "__main__":
    main()
