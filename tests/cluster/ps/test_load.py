"""A parameter server under load: 16 async replicas pushing into one variable at once lose no update."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from cellgraph.cluster.ps import OptimizerConfig, ParameterClient, TrainingConfig

from .conftest import TIMEOUT
from .processes import cellgraph_ps

REPLICAS = 16
PUSHES = 1_000  # per replica
SIZE = 256  # float32 elements of the one variable
JOIN_S = 600.0  # seconds for all the pushes; 20 to 30 s on two cores


def replica(address: str, rid: int, latencies: list[float], errors: list[BaseException]) -> None:
    """Register as replica ``rid`` and push ``PUSHES`` gradients of minus ones, each tagged with the last step seen."""
    try:
        with ParameterClient([address], None, timeout=TIMEOUT) as client:
            step = client.register(rid).global_step
            grad = {"w": -np.ones(SIZE, np.float32)}
            for _ in range(PUSHES):
                started = time.perf_counter()
                result = client.push(grad, step=step, replica_id=rid)
                latencies.append(time.perf_counter() - started)
                assert result.status == "applied", result
                step = result.global_step
    except BaseException as err:  # noqa: BLE001 - reported by the main thread
        errors.append(err)


@pytest.mark.slow
def test_sixteen_async_replicas_lose_no_push() -> None:
    # The server runs in its own process: in this one its handlers would share the GIL with the 16 clients
    # (create_server in-process took 27 to 33 s on two cores, the subprocess 22 to 25 s).
    with cellgraph_ps("--no-auth") as server:
        with ParameterClient([server.address], None, timeout=TIMEOUT) as client:
            # Learning rate 1 turns each gradient of minus ones into +1 on every element.
            client.init("load", {"w": np.zeros(SIZE, np.float32)}, OptimizerConfig("sgd", 1.0), TrainingConfig("async"))
            latencies: list[list[float]] = [[] for _ in range(REPLICAS)]
            errors: list[BaseException] = []
            threads = [
                threading.Thread(target=replica, args=(server.address, rid, latencies[rid], errors), daemon=True)
                for rid in range(REPLICAS)
            ]
            started = time.perf_counter()
            for thread in threads:
                thread.start()
            deadline = time.monotonic() + JOIN_S
            for thread in threads:
                thread.join(max(0.0, deadline - time.monotonic()))
            elapsed = time.perf_counter() - started
            assert not any(thread.is_alive() for thread in threads), f"replicas still pushing after {JOIN_S} s"
            assert not errors, errors

            total = REPLICAS * PUSHES
            every = np.array([s for per_replica in latencies for s in per_replica]) * 1e3
            p50, p99 = np.percentile(every, [50, 99])
            print(
                f"\n{total:,} pushes from {REPLICAS} replicas in {elapsed:.1f} s ({total / elapsed:,.0f}/s); "
                f"latency p50 {p50:.2f} ms, p99 {p99:.2f} ms, max {every.max():.2f} ms"
            )
            pulled = client.pull()
            np.testing.assert_array_equal(pulled.values["w"], np.full(SIZE, total, np.float32))
            assert (pulled.global_step, pulled.versions["w"]) == (total, total)
            [stats] = client.stats()
            assert (stats.pushes_applied, stats.pushes_rejected, stats.pushes_stale) == (total, 0, 0)
            assert stats.updates == total
            assert sorted((r.replica_id, r.pushes) for r in stats.replicas) == [(r, PUSHES) for r in range(REPLICAS)]
        assert server.stop() == (0, "cellgraph ps: stopped")
