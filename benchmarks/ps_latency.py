"""Parameter-service latency: push + pull round trips of a 1 KB variable (256 float32) to one PS.

One ``cellgraph ps`` subprocess on loopback holds one variable; the benchmark
process (``ParameterClient``, SGD with learning rate 0) pushes a gradient for
it and pulls it back, 10,000 times (``--quick``: 2,000), with
``client.push_pull(..., out=buffers)``: one step on the client's held Step
stream, into reused buffers, what a replica's step does. Beside it, in turns
(blocks of ``BLOCK`` calls each): the same push and pull as two steps
(``client.push`` then ``client.pull``), and the anchor, gRPC Python's own
unary round trip: the standard health ``Check`` RPC against the same server
over its own channel.

    python benchmarks/ps_latency.py [--quick]

The last line of stdout is one JSON object: ``p50_ratio_vs_unary`` and
``p99_ratio_vs_unary``, the push + pull round trip over the anchor's (targets:
at most 1.0 and 1.5), ``p50_ms`` and ``p99_ms`` themselves (reported against
the earlier absolute targets of 0.5 and 2 ms), ``two_calls_*`` for the pair of
steps, and ``grpc_unary_p50_ms`` / ``grpc_unary_p99_ms`` of the anchor.
"""

from __future__ import annotations

import tempfile
import time
from contextlib import ExitStack
from typing import Any

from _common import emit, machine, parser, setup_threads, source, versions
from ps_throughput import CALL_TIMEOUT_S, ps_servers

ELEMENTS = 256  # float32: 1 KB
BLOCK = 500  # calls per turn; the sides alternate blocks so a slow spell hits both
TARGET_P50_MS = 0.5
TARGET_P99_MS = 2.0
TARGET_P50_RATIO = 1.0  # PS step round trip p50 / bare unary call p50
TARGET_P99_RATIO = 1.5


def percentiles(np: Any, seconds: list[float]) -> dict[str, float]:
    ms = np.asarray(seconds) * 1e3
    return {
        "p50_ms": float(np.percentile(ms, 50)),
        "p90_ms": float(np.percentile(ms, 90)),
        "p99_ms": float(np.percentile(ms, 99)),
        "min_ms": float(ms.min()),
        "max_ms": float(ms.max()),
    }


def main() -> None:
    args = parser(__doc__.splitlines()[0]).parse_args()
    setup_threads(args.threads)
    started = time.perf_counter()

    import grpc
    import numpy as np
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from cellgraph.cluster.ps import OptimizerConfig, ParameterClient, TrainingConfig

    rounds, warmup = (2_000, 200) if args.quick else (10_000, 500)
    w = np.arange(ELEMENTS, dtype=np.float32)
    grad = {"w": np.full(ELEMENTS, 0.5, np.float32)}

    with tempfile.TemporaryDirectory(prefix="cellgraph-ps-bench-") as tmp, ExitStack() as stack:
        (address,), token, _ = stack.enter_context(ps_servers(1, tmp))
        client = stack.enter_context(ParameterClient([address], token, timeout=CALL_TIMEOUT_S))
        client.init("latency", {"w": w}, OptimizerConfig("sgd", learning_rate=0.0), TrainingConfig("async"))
        client.register(0)
        channel = stack.enter_context(grpc.insecure_channel(address))
        health = health_pb2_grpc.HealthStub(channel)
        check = health_pb2.HealthCheckRequest(service="")

        buffers = {"w": np.empty_like(w)}

        def fused() -> float:
            start = time.perf_counter()
            client.push_pull(grad, step=0, replica_id=0, out=buffers)
            return time.perf_counter() - start

        def round_trip() -> tuple[float, float]:
            start = time.perf_counter()
            client.push(grad, step=0, replica_id=0)
            mid = time.perf_counter()
            client.pull()
            return mid - start, time.perf_counter() - mid

        def unary() -> float:
            start = time.perf_counter()
            health.Check(check, timeout=CALL_TIMEOUT_S)
            return time.perf_counter() - start

        for _ in range(warmup):
            fused()
            round_trip()
            unary()
        fused_s: list[float] = []
        push_s: list[float] = []
        pull_s: list[float] = []
        unary_s: list[float] = []
        while len(push_s) < rounds:
            for _ in range(min(BLOCK, rounds - len(push_s))):
                fused_s.append(fused())
            for _ in range(min(BLOCK, rounds - len(push_s))):
                push, pull = round_trip()
                push_s.append(push)
                pull_s.append(pull)
            for _ in range(BLOCK):
                unary_s.append(unary())
        if not np.array_equal(client.pull().values["w"], w):
            raise SystemExit("pushes with learning rate 0 changed the PS's value")

    both = percentiles(np, fused_s)
    sides = {
        "push_pull": both,
        "push, pull": percentiles(np, [a + b for a, b in zip(push_s, pull_s)]),
        "push": percentiles(np, push_s),
        "pull": percentiles(np, pull_s),
        "grpc unary": percentiles(np, unary_s),
    }
    for name, p in sides.items():
        print(
            f"{name:>10}: p50 {p['p50_ms']:.3f} ms, p90 {p['p90_ms']:.3f}, p99 {p['p99_ms']:.3f}"
            f" (min {p['min_ms']:.3f}, max {p['max_ms']:.1f})"
        )
    anchor = sides["grpc unary"]
    p50_ratio, p99_ratio = both["p50_ms"] / anchor["p50_ms"], both["p99_ms"] / anchor["p99_ms"]
    met = p50_ratio <= TARGET_P50_RATIO and p99_ratio <= TARGET_P99_RATIO
    absolute_met = both["p50_ms"] <= TARGET_P50_MS and both["p99_ms"] <= TARGET_P99_MS
    print(
        f"push+pull / unary: p50 {p50_ratio:.2f} (target <= {TARGET_P50_RATIO}), p99 {p99_ratio:.2f}"
        f" (target <= {TARGET_P99_RATIO}): {'met' if met else 'NOT met'}; {rounds} rounds,"
        f" {len(unary_s)} unary calls, in alternating blocks of {BLOCK}"
    )
    print(
        f"reported: push+pull p50 {both['p50_ms']:.3f} ms (earlier target <= {TARGET_P50_MS}), p99"
        f" {both['p99_ms']:.3f} ms (<= {TARGET_P99_MS}): {'met' if absolute_met else 'not met'}"
    )
    emit(
        {
            "benchmark": "ps_latency",
            "p50_ms": both["p50_ms"],
            "p90_ms": both["p90_ms"],
            "p99_ms": both["p99_ms"],
            "min_ms": both["min_ms"],
            "two_calls_p50_ms": sides["push, pull"]["p50_ms"],
            "two_calls_p99_ms": sides["push, pull"]["p99_ms"],
            "push_p50_ms": sides["push"]["p50_ms"],
            "push_p99_ms": sides["push"]["p99_ms"],
            "pull_p50_ms": sides["pull"]["p50_ms"],
            "pull_p99_ms": sides["pull"]["p99_ms"],
            "grpc_unary_p50_ms": anchor["p50_ms"],
            "grpc_unary_p99_ms": anchor["p99_ms"],
            "grpc_unary_min_ms": anchor["min_ms"],
            "p50_ratio_vs_unary": p50_ratio,
            "p99_ratio_vs_unary": p99_ratio,
            "target_p50_ratio": TARGET_P50_RATIO,
            "target_p99_ratio": TARGET_P99_RATIO,
            "target_met": met,
            "target_p50_ms": TARGET_P50_MS,
            "target_p99_ms": TARGET_P99_MS,
            "absolute_target_met": absolute_met,
            "variable_bytes": int(w.nbytes),
            "rounds": rounds,
            "unary_calls": len(unary_s),
            "warmup": warmup,
            "quick": args.quick,
            "total_s": time.perf_counter() - started,
            "machine": machine(),
            "versions": versions(),
            "source": source(),
        }
    )


if __name__ == "__main__":
    main()
