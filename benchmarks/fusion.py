"""Elementwise fusion: an 8-op chain on 4M float32 elements, fused vs unfused vs NumPy.

The chain ``y = max(tanh(relu(x * 0.5 + b) - 0.25) * d, -0.5) + 1.0`` mixes
scalar operands (0.5, 0.25, -0.5, 1.0), same-shape operands (``b``, ``d``, fed
like ``x``) and unary ops. It runs as cellgraph's default plan (the 8 ops fused
into one Numba loop), as ``Session(fuse=False)`` (one kernel and one
intermediate array per op), and as 8 NumPy ufunc calls; one thread everywhere.
Fused, the chain should be memory-bound: one pass reading ``x``, ``b`` and ``d``
and writing ``y``.

    python benchmarks/fusion.py [--quick] [--threads N]

The last line of stdout is one JSON object with ``fused_ms``, ``unfused_ms``,
``numpy_ms``, ``ratio_vs_unfused`` = unfused / fused (target: at least 3) and
``ratio_vs_numpy`` = numpy / fused (target: at least 2).
"""

from __future__ import annotations

import time
from typing import Any

from _common import emit, machine, parser, setup_threads, source, thread_pools, time_interleaved, versions

SIZE = 4 * 1024 * 1024  # 4,194,304 float32 elements: 16 MiB per array
TARGET_VS_UNFUSED = 3.0
TARGET_VS_NUMPY = 2.0
CHAIN = "max(tanh(relu(x * 0.5 + b) - 0.25) * d, -0.5) + 1.0"
OPS = 8
ARRAYS_TOUCHED = 4  # a fused pass reads x, b, d and writes y


def inputs(np: Any) -> tuple[Any, Any, Any]:
    """x, b, d: fixed random float32 arrays of ``SIZE`` elements."""
    rng = np.random.default_rng(0)
    return tuple(rng.standard_normal(SIZE, dtype=np.float32) for _ in range(3))  # type: ignore[return-value]


def build_cellgraph(cg: Any) -> tuple[Any, list[Any], Any]:
    """The chain as a graph: (graph, [x, b, d] placeholders, output tensor)."""
    g = cg.Graph()
    with g.as_default():
        x, b, d = (cg.placeholder((SIZE,), "float32", name=name) for name in ("x", "b", "d"))
        y = x * 0.5  # 1 Mul, scalar
        y = y + b  # 2 Add, same shape
        y = cg.relu(y)  # 3 Relu
        y = y - 0.25  # 4 Sub, scalar
        y = cg.tanh(y)  # 5 Tanh
        y = y * d  # 6 Mul, same shape
        y = cg.maximum(y, -0.5)  # 7 Maximum, scalar
        y = y + 1.0  # 8 Add, scalar
    return g, [x, b, d], y


def numpy_chain(np: Any) -> Any:
    """The chain as 8 NumPy ufunc calls, float32 throughout."""
    f32 = np.float32

    def run(x: Any, b: Any, d: Any) -> Any:
        y = np.multiply(x, f32(0.5))
        y = np.add(y, b)
        y = np.maximum(y, f32(0.0))
        y = np.subtract(y, f32(0.25))
        y = np.tanh(y)
        y = np.multiply(y, d)
        y = np.maximum(y, f32(-0.5))
        return np.add(y, f32(1.0))

    return run


def main() -> None:
    args = parser(__doc__.splitlines()[0]).parse_args()
    setup_threads(args.threads)
    started = time.perf_counter()

    import numpy as np

    import cellgraph as cg

    repeats, warmup, repeat_seconds = (5, 2, 0.3) if args.quick else (15, 5, 1.0)
    x, b, d = inputs(np)

    graph, feeds, y_out = build_cellgraph(cg)
    jit_start = time.perf_counter()
    fused = cg.Session(graph).make_callable([y_out], feeds)
    (expected,) = fused(x, b, d)  # first call: Numba compiles (or loads from cache) the fused loop
    first_call_s = time.perf_counter() - jit_start
    unfused = cg.Session(graph, fuse=False).make_callable([y_out], feeds)
    np_run = numpy_chain(np)

    calls = [step for step in fused.steps if not step.constant]
    if len(calls) != 1 or len(calls[0].nodes) != OPS:
        raise SystemExit(f"expected the {OPS}-op chain to fuse into one call, got {[len(s.nodes) for s in calls]}")
    for name, got in (("unfused", unfused(x, b, d)[0]), ("numpy", np_run(x, b, d))):
        if got.dtype != expected.dtype or not np.allclose(got, expected, rtol=1e-5, atol=1e-6):
            worst = float(np.max(np.abs(got.astype(np.float64) - expected)))
            raise SystemExit(f"{name} chain disagrees with the fused plan: max |difference| {worst:g}")

    sides = {
        "fused": lambda: fused(x, b, d),
        "unfused": lambda: unfused(x, b, d),
        "numpy": lambda: np_run(x, b, d),
    }
    timings = time_interleaved(sides, repeats=repeats, warmup=warmup, repeat_seconds=repeat_seconds)
    ms = {name: t["median"] * 1e3 for name, t in timings.items()}
    for name, t in timings.items():
        print(
            f"{name:>8}: {ms[name]:8.3f} ms  (min {t['min'] * 1e3:.3f}, max {t['max'] * 1e3:.3f};"
            f" {repeats} repeats x {t['calls_per_repeat']} calls)"
        )
    vs_unfused = ms["unfused"] / ms["fused"]
    vs_numpy = ms["numpy"] / ms["fused"]
    bytes_per_call = ARRAYS_TOUCHED * SIZE * np.dtype(np.float32).itemsize
    fused_gb_per_s = bytes_per_call / (ms["fused"] * 1e-3) / 1e9
    print(f"fused: {fused_gb_per_s:.1f} GB/s over the {ARRAYS_TOUCHED} arrays one pass must touch")
    for label, ratio, target in (("unfused", vs_unfused, TARGET_VS_UNFUSED), ("numpy", vs_numpy, TARGET_VS_NUMPY)):
        print(f"ratio {label} / fused = {ratio:.2f} (target >= {target}: {'met' if ratio >= target else 'NOT met'})")

    emit(
        {
            "benchmark": "fusion",
            "chain": CHAIN,
            "fused_ms": ms["fused"],
            "unfused_ms": ms["unfused"],
            "numpy_ms": ms["numpy"],
            "ratio_vs_unfused": vs_unfused,
            "ratio_vs_numpy": vs_numpy,
            "target_vs_unfused": TARGET_VS_UNFUSED,
            "target_vs_numpy": TARGET_VS_NUMPY,
            "target_vs_unfused_met": vs_unfused >= TARGET_VS_UNFUSED,
            "target_vs_numpy_met": vs_numpy >= TARGET_VS_NUMPY,
            "bytes_per_call": bytes_per_call,
            "fused_gb_per_s": fused_gb_per_s,
            "ops": OPS,
            "plan_calls": len(calls),
            "size": SIZE,
            "dtype": "float32",
            "threads": args.threads,
            "quick": args.quick,
            "repeats": repeats,
            "first_call_s": first_call_s,
            "total_s": time.perf_counter() - started,
            "machine": machine(),
            "versions": versions(),
            "thread_pools": thread_pools(),
            "source": source(),
        }
    )


if __name__ == "__main__":
    main()
