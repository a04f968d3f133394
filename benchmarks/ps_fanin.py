"""Parameter-service fan-in: sync pushes per second from 8 vs 256 replicas to one PS shard.

For each replica count n (8, then 256), a fresh ``cellgraph ps`` subprocess on
loopback holds a tiny model (one 256-float32 variable, 1 KB) in a sync job
with ``replicas_to_aggregate = n`` (SGD, learning rate 0). n replica threads
in the benchmark process (the reference machine has 2 cores: threads, not
processes), each with its own ``ParameterClient``, register, take a few
untimed warmup steps, meet at a barrier, then loop
``push_pull(grad, step=s, min_step=s + 1)``: push the gradient for step s and
wait for the update it joined, as a sync replica does. Every run does the same
total work, ``TOTAL_PUSHES`` pushes (``--quick``: fewer), split evenly over its
replicas. Failed calls are counted by status code and end that replica's loop.

    python benchmarks/ps_fanin.py [--quick]

``pushes_per_s_N`` is the successful pushes of the run with N replicas divided
by the seconds from the barrier to the last replica's last step. The last line
of stdout is one JSON object; targets: ``ratio`` (pushes/s at 256 / pushes/s
at 8) >= 0.8, and no call ending in DEADLINE_EXCEEDED.
"""

from __future__ import annotations

import tempfile
import threading
import time
from collections import Counter
from contextlib import ExitStack
from typing import Any

from _common import emit, machine, parser, setup_threads, source, versions
from ps_throughput import ps_servers

ELEMENTS = 256  # float32: 1 KB
REPLICAS = (8, 256)
TOTAL_PUSHES = 25_600  # per run, whatever its replica count (--quick: QUICK_PUSHES)
QUICK_PUSHES = 5_120
WARMUP_STEPS = 3
CALL_TIMEOUT_S = 30.0  # deadline of every RPC, sync waits included
RUN_DEADLINE_S = 300.0  # deadline of each run's barriers and joins
TARGET_RATIO = 0.8


def run(n: int, steps: int, np: Any) -> dict[str, Any]:
    """One sync job of ``n`` replicas on a fresh one-shard PS, ``steps`` timed steps each."""
    from cellgraph.cluster.errors import ParameterServerError
    from cellgraph.cluster.ps import OptimizerConfig, ParameterClient, TrainingConfig

    grad = {"w": np.full(ELEMENTS, 0.5, np.float32)}
    errors: Counter[str] = Counter()
    pushes = [0] * n
    ends = [0.0] * n
    start: list[float] = []
    lock = threading.Lock()
    barrier = threading.Barrier(n, action=lambda: start.append(time.perf_counter()))

    with tempfile.TemporaryDirectory(prefix="cellgraph-ps-fanin-") as tmp, ExitStack() as stack:
        (address,), token, _ = stack.enter_context(ps_servers(1, tmp))
        clients = [stack.enter_context(ParameterClient([address], token, timeout=CALL_TIMEOUT_S)) for _ in range(n)]
        clients[0].init(
            f"fanin-{n}",
            {"w": np.zeros(ELEMENTS, np.float32)},
            OptimizerConfig("sgd", learning_rate=0.0),
            TrainingConfig("sync", replicas_to_aggregate=n),
        )

        def fail(code: str) -> None:
            with lock:
                errors[code] += 1

        def replica(rid: int) -> None:
            client = clients[rid]
            try:
                step = client.register(rid).global_step
                for _ in range(WARMUP_STEPS):
                    _, pulled = client.push_pull(grad, step=step, replica_id=rid, min_step=step + 1)
                    step = pulled.global_step
            except ParameterServerError as err:
                fail(err.code)
                barrier.abort()
                return
            except Exception as err:  # noqa: BLE001 - counted and reported by the main thread
                fail(type(err).__name__)
                barrier.abort()
                return
            try:
                barrier.wait(RUN_DEADLINE_S)
            except threading.BrokenBarrierError:
                fail("BARRIER_BROKEN")
                return
            try:
                for _ in range(steps):
                    pushed, pulled = client.push_pull(grad, step=step, replica_id=rid, min_step=step + 1)
                    if pushed.status not in ("aggregated", "applied"):
                        fail(f"push_{pushed.status}")
                    pushes[rid] += 1
                    step = pulled.global_step
            except ParameterServerError as err:
                fail(err.code)
            except Exception as err:  # noqa: BLE001 - counted and reported by the main thread
                fail(type(err).__name__)
            ends[rid] = time.perf_counter()

        threads = [threading.Thread(target=replica, args=(r,), daemon=True, name=f"replica-{r}") for r in range(n)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + RUN_DEADLINE_S
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        hung = sum(t.is_alive() for t in threads)
        if hung:
            errors["HUNG"] += hung
            barrier.abort()
        [stats] = clients[0].stats()

    elapsed = max(ends) - start[0] if start and max(ends) > 0 else float("nan")
    done = sum(pushes)
    return {
        "replicas": n,
        "steps": steps,
        "pushes": done,
        "seconds": elapsed,
        "pushes_per_s": done / elapsed if elapsed > 0 else 0.0,
        "global_step": int(stats.global_step),
        "pushes_applied": int(stats.pushes_applied),
        "pushes_stale": int(stats.pushes_stale),
        "errors": dict(errors),
    }


def main() -> None:
    args = parser(__doc__.splitlines()[0]).parse_args()
    setup_threads(args.threads)
    started = time.perf_counter()

    import numpy as np

    total = QUICK_PUSHES if args.quick else TOTAL_PUSHES
    runs = {n: run(n, total // n, np) for n in REPLICAS}
    for r in runs.values():
        print(
            f"{r['replicas']:>4} replicas x {r['steps']} steps: {r['pushes']} pushes in {r['seconds']:.2f} s ="
            f" {r['pushes_per_s']:.0f} pushes/s (global step {r['global_step']},"
            f" stale {r['pushes_stale']}); errors {r['errors'] or 'none'}"
        )
    low, high = runs[REPLICAS[0]], runs[REPLICAS[-1]]
    ratio = high["pushes_per_s"] / low["pushes_per_s"] if low["pushes_per_s"] > 0 else 0.0
    errors: Counter[str] = Counter()
    for r in runs.values():
        errors.update(r["errors"])
    deadline_exceeded = errors.get("DEADLINE_EXCEEDED", 0)
    ratio_met = ratio >= TARGET_RATIO
    print(
        f"ratio {ratio:.3f} (target >= {TARGET_RATIO}): {'met' if ratio_met else 'NOT met'};"
        f" DEADLINE_EXCEEDED {deadline_exceeded} (target 0): {'met' if not deadline_exceeded else 'NOT met'}"
    )
    result: dict[str, Any] = {"benchmark": "ps_fanin"}
    for n, r in runs.items():
        result[f"pushes_per_s_{n}"] = r["pushes_per_s"]
        result[f"seconds_{n}"] = r["seconds"]
        result[f"pushes_{n}"] = r["pushes"]
        result[f"steps_{n}"] = r["steps"]
        result[f"pushes_stale_{n}"] = r["pushes_stale"]
    result |= {
        "ratio": ratio,
        "deadline_exceeded": deadline_exceeded,
        "errors": dict(errors),
        "target_ratio": TARGET_RATIO,
        "ratio_met": ratio_met,
        "no_deadline_exceeded_met": deadline_exceeded == 0,
        "variable_bytes": ELEMENTS * 4,
        "total_pushes_per_run": total,
        "warmup_steps": WARMUP_STEPS,
        "call_timeout_s": CALL_TIMEOUT_S,
        "quick": args.quick,
        "total_s": time.perf_counter() - started,
        "machine": machine(),
        "versions": versions(),
        "source": source(),
    }
    emit(result)


if __name__ == "__main__":
    main()
