"""Per-node dispatch overhead: a 200-node elementwise chain on 8-element tensors.

With 8 elements the arithmetic is free, so the time per node is what each
framework spends getting from one op to the next. ``cellgraph_us`` is the
executor's dispatch cost: the compiled plan (``Session.make_callable``) of a
``Session(fuse=False)``, one kernel call per node; ``cellgraph_run_us`` the
same through ``Session.run``. ``cellgraph_fused_us`` is the default session,
which fuses the whole chain into one Numba loop. Beside them: PyTorch eager,
and NumPy ufuncs called from a Python loop.

    python benchmarks/op_overhead.py [--quick] [--threads N]

The last line of stdout is one JSON object; ``ratio`` is cellgraph_us / torch_us
(dispatch with fusion off; target: at most 0.5), ``ratio_fused`` the same for
the fused plan.
"""

from __future__ import annotations

import time
from typing import Any

from _common import emit, import_torch, machine, parser, setup_threads, source, thread_pools, time_interleaved, versions

NODES = 200
SIZE = 8
TARGET_RATIO = 0.5

# The chain cycles through four ops; every other round uses a scalar operand,
# the rounds between a same-shape tensor. The constants keep values bounded
# (x -> max(0.5 * (x + c) - c', floor)), so no run drifts into inf or denormals.
OPS = ("add", "mul", "sub", "maximum")
SCALARS = {"add": 0.25, "mul": 0.5, "sub": 0.125, "maximum": -1.0}


def chain_steps() -> list[tuple[str, bool]]:
    """(op, operand is a scalar) for each of the ``NODES`` nodes."""
    return [(OPS[i % 4], (i // 4) % 2 == 0) for i in range(NODES)]


def tensor_operands(np: Any) -> dict[str, Any]:
    """The same-shape operand of each op (fixed values, float32)."""
    base = np.linspace(0.0, 1.0, SIZE, dtype=np.float32)
    return {
        "add": base * np.float32(0.5),
        "mul": np.float32(0.25) + base * np.float32(0.5),
        "sub": base * np.float32(0.25),
        "maximum": np.full(SIZE, -1.0, np.float32),
    }


def build_cellgraph(cg: Any, np: Any) -> tuple[Any, Any, Any]:
    """The chain as a graph: (graph, input placeholder, output tensor)."""
    g = cg.Graph()
    operands = tensor_operands(np)
    with g.as_default():
        x = cg.placeholder((SIZE,), "float32", name="x")
        y = x
        for op, scalar in chain_steps():
            y = getattr(cg, op)(y, SCALARS[op] if scalar else operands[op])
    return g, x, y


def numpy_chain(np: Any) -> Any:
    """The chain as NumPy ufunc calls from a Python loop."""
    operands = tensor_operands(np)
    ufuncs = {"add": np.add, "mul": np.multiply, "sub": np.subtract, "maximum": np.maximum}
    steps = [(ufuncs[op], np.float32(SCALARS[op]) if scalar else operands[op]) for op, scalar in chain_steps()]

    def run(x: Any) -> Any:
        for ufunc, operand in steps:
            x = ufunc(x, operand)
        return x

    return run


def torch_chain(torch: Any, np: Any) -> Any:
    """The chain as PyTorch eager calls (tensors without autograd)."""
    operands = {k: torch.from_numpy(v) for k, v in tensor_operands(np).items()}
    fns = {"add": torch.add, "mul": torch.mul, "sub": torch.sub, "maximum": torch.maximum}
    steps = []
    for op, scalar in chain_steps():
        if op == "maximum" and scalar:
            # torch.maximum takes tensors only; clamp(min=) is eager PyTorch's scalar maximum.
            steps.append((torch.clamp_min, SCALARS[op]))
        else:
            steps.append((fns[op], SCALARS[op] if scalar else operands[op]))

    def run(x: Any) -> Any:
        for fn, operand in steps:
            x = fn(x, operand)
        return x

    return run


def main() -> None:
    args = parser(__doc__.splitlines()[0]).parse_args()
    setup_threads(args.threads)
    started = time.perf_counter()

    import numpy as np

    import cellgraph as cg

    torch = import_torch(args.threads, "op_overhead")

    repeats, warmup, repeat_seconds = (7, 20, 0.05) if args.quick else (31, 100, 0.2)
    x = np.linspace(-2.0, 2.0, SIZE, dtype=np.float32)

    jit_start = time.perf_counter()
    graph, x_in, y_out = build_cellgraph(cg, np)
    sess = cg.Session(graph, fuse=False)
    plan = sess.make_callable([y_out], [x_in])
    (expected,) = plan(x)  # first call: Numba compiles (or loads from cache) each kernel
    jit_seconds = time.perf_counter() - jit_start
    fused = cg.Session(graph).make_callable([y_out], [x_in])
    fused(x)

    np_run = numpy_chain(np)
    x_torch = torch.from_numpy(x.copy())
    torch_run = torch_chain(torch, np)
    checks = (
        ("numpy", np_run(x)),
        ("torch", torch_run(x_torch).numpy()),
        ("run", sess.run(y_out, {x_in: x})),
        ("fused", fused(x)[0]),
    )
    for name, got in checks:
        if not np.allclose(got, expected, rtol=1e-5, atol=1e-6):
            raise SystemExit(f"{name} chain disagrees with the cellgraph plan: {got} vs {expected}")

    sides = {
        "cellgraph": lambda: plan(x),
        "cellgraph_run": lambda: sess.run(y_out, {x_in: x}),
        "cellgraph_fused": lambda: fused(x),
        "torch": lambda: torch_run(x_torch),
        "numpy": lambda: np_run(x),
    }
    timings = time_interleaved(sides, repeats=repeats, warmup=warmup, repeat_seconds=repeat_seconds)
    per_node_us = {k: v["median"] / NODES * 1e6 for k, v in timings.items()}
    for name, us in per_node_us.items():
        spread = timings[name]
        print(
            f"{name:>14}: {us:7.3f} us/node  (min {spread['min'] / NODES * 1e6:.3f},"
            f" max {spread['max'] / NODES * 1e6:.3f}; {repeats} repeats x {spread['calls_per_repeat']} calls)"
        )
    ratio = per_node_us["cellgraph"] / per_node_us["torch"]
    print(
        f"ratio cellgraph (fusion off) / torch = {ratio:.3f}"
        f" (target <= {TARGET_RATIO}: {'met' if ratio <= TARGET_RATIO else 'NOT met'});"
        f" fused: {per_node_us['cellgraph_fused'] / per_node_us['torch']:.4f}"
    )

    emit(
        {
            "benchmark": "op_overhead",
            "cellgraph_us": per_node_us["cellgraph"],
            "cellgraph_run_us": per_node_us["cellgraph_run"],
            "cellgraph_fused_us": per_node_us["cellgraph_fused"],
            "ratio_fused": per_node_us["cellgraph_fused"] / per_node_us["torch"],
            "torch_us": per_node_us["torch"],
            "numpy_us": per_node_us["numpy"],
            "ratio": ratio,
            "target_ratio": TARGET_RATIO,
            "target_met": ratio <= TARGET_RATIO,
            "nodes": NODES,
            "plan_nodes": len(plan.order),
            "plan_calls": sum(1 for step in plan.steps if not step.constant),
            "fused_plan_calls": sum(1 for step in fused.steps if not step.constant),
            "size": SIZE,
            "threads": args.threads,
            "quick": args.quick,
            "repeats": repeats,
            "first_call_s": jit_seconds,
            "total_s": time.perf_counter() - started,
            "machine": machine(),
            "versions": versions(),
            "thread_pools": thread_pools(),
            "source": source(),
        }
    )


if __name__ == "__main__":
    main()
