"""What every benchmark shares: thread setup, timing, the anchor import, the JSON line.

This module imports neither NumPy nor Numba at the top: the thread counts of
OpenBLAS, OpenMP and Numba are read from the environment when those libraries
load, so ``setup_threads`` has to run before the first ``import numpy``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

TORCH_VERSION = "2.13.0"
TORCH_HINT = f"pip install torch=={TORCH_VERSION}"

# One thread by default: the reference machine has 2 shared cores, and a
# single thread on each side measures the per-core cost without scheduler noise.
DEFAULT_THREADS = 1

# CELLGRAPH_NUM_THREADS is cellgraph's own knob: its first plan limits both
# OpenBLAS pools to it (default 1), whatever OPENBLAS_NUM_THREADS says.
_THREAD_VARS = (
    "CELLGRAPH_NUM_THREADS",
    "NUMBA_NUM_THREADS",
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
)


def parser(description: str) -> argparse.ArgumentParser:
    """The options every benchmark takes: ``--quick`` and ``--threads``."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--quick", action="store_true", help="fewer repeats: under a minute, JIT warmup included")
    p.add_argument(
        "--threads",
        type=int,
        default=DEFAULT_THREADS,
        help=f"threads on both sides (torch.set_num_threads; CELLGRAPH/NUMBA/OMP/OPENBLAS/MKL); default {DEFAULT_THREADS}",
    )
    return p


def setup_threads(n: int) -> None:
    """Pin every thread pool to ``n`` threads; call before NumPy, Numba or torch load."""
    if n < 1:
        raise SystemExit(f"--threads must be at least 1, got {n}")
    loaded = [m for m in ("numpy", "numba", "torch") if sys.modules.get(m) is not None]
    if loaded:
        raise RuntimeError(
            f"setup_threads must run before importing {', '.join(loaded)}: their pools are already sized"
        )
    for var in _THREAD_VARS:
        os.environ[var] = str(n)


def import_torch(n_threads: int, benchmark: str) -> Any:
    """``torch`` with ``n_threads`` intra-op threads; without torch, say how to get it and exit 0."""
    try:
        import torch
    except ImportError:
        print(f"torch is not installed; the anchor side of this benchmark needs it: {TORCH_HINT}")
        emit({"benchmark": benchmark, "torch_missing": True, "install": TORCH_HINT})
        raise SystemExit(0) from None
    torch.set_num_threads(n_threads)
    return torch


def time_interleaved(
    fns: dict[str, Callable[[], Any]], *, repeats: int, warmup: int, repeat_seconds: float
) -> dict[str, dict[str, float]]:
    """Seconds per call of each function: the median (and min, max) over ``repeats`` timed blocks.

    Each function first runs ``warmup`` untimed calls (JIT, caches, thread
    pools), then is timed for about a tenth of ``repeat_seconds`` to size its
    block: ``number`` back-to-back calls lasting about ``repeat_seconds``. The
    blocks of the different functions take turns (A B C, A B C, ...), so a slow
    spell on a shared machine hits every side alike instead of one side's run.
    """
    numbers = {}
    for name, fn in fns.items():
        for _ in range(warmup):
            fn()
        calls, start = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - start) < repeat_seconds / 10 or calls < 3:
            fn()
            calls += 1
        numbers[name] = max(1, round(repeat_seconds * calls / elapsed))
    per_call: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            number = numbers[name]
            start = time.perf_counter()
            for _ in range(number):
                fn()
            per_call[name].append((time.perf_counter() - start) / number)
    return {
        name: {"median": statistics.median(t), "min": min(t), "max": max(t), "calls_per_repeat": numbers[name]}
        for name, t in per_call.items()
    }


def machine() -> dict[str, Any]:
    """What a reader needs to compare figures across machines."""
    info: dict[str, Any] = {"cpus": os.cpu_count(), "python": platform.python_version()}
    try:
        with open("/proc/cpuinfo") as f:
            models = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        info["cpu_model"] = models[0] if models else platform.processor()
    except OSError:
        info["cpu_model"] = platform.processor()
    info["openblas_coretype"] = os.environ.get("OPENBLAS_CORETYPE")
    return info


def versions() -> dict[str, str]:
    """Versions of the loaded numeric libraries (call after importing them)."""
    out = {}
    for name in ("numpy", "numba", "torch", "grpc"):
        module = sys.modules.get(name)
        if module is not None:
            out[name] = module.__version__
    if "grpc" in sys.modules:  # which of gRPC's I/O paths ran (cluster/ps/grpc_io.py)
        out["grpc_experiments"] = os.environ.get("GRPC_EXPERIMENTS", "")
    return out


def source() -> dict[str, Any]:
    """The commit measured, and whether tracked files differed from it (read-only git calls)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10
        )
        status = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return {}
    if commit.returncode != 0:
        return {}
    return {"commit": commit.stdout.strip(), "dirty": bool(status.stdout.strip())}


def thread_pools() -> list[dict[str, Any]]:
    """The native thread pools actually loaded (BLAS, OpenMP) and their sizes, via threadpoolctl if present."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return []
    keep = ("internal_api", "architecture", "num_threads", "version")
    return [
        {k: pool.get(k) for k in keep} | {"library": os.path.basename(pool["filepath"])} for pool in threadpool_info()
    ]


def emit(result: dict[str, Any]) -> None:
    """The benchmark's result as one JSON object: always the last line of stdout."""
    print(json.dumps(result, sort_keys=True), flush=True)
