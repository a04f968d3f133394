"""The caching pool of device memory (kernels/cuda/memory.py): blocks come back, values stay right."""

from __future__ import annotations

import numpy as np
import pytest

import cellgraph as cg
from cellgraph.dataflow.executor import Plan
from cellgraph.dataflow.kernels import cuda as cuda_kernels
from cellgraph.dataflow.kernels.cuda import memory
from cellgraph.dataflow.variables import VariableStore


def test_sizes_round_to_their_block() -> None:
    assert [memory.size_class(n) for n in (1, 512, 513, 1 << 20)] == [512, 512, 1024, 1 << 20]
    assert memory.size_class((1 << 20) + 1) == 2 << 20  # above 1 MiB: 2 MiB steps
    assert memory.size_class(5 << 20) == 6 << 20


def test_the_pool_is_off_on_the_simulator_and_when_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NUMBA_ENABLE_CUDASIM", "1")
    assert not memory.enabled()
    monkeypatch.setenv("NUMBA_ENABLE_CUDASIM", "0")
    monkeypatch.setenv(memory.POOL_ENV, "0")
    assert not memory.enabled()
    monkeypatch.delenv(memory.POOL_ENV)
    assert memory.enabled()


@pytest.mark.cuda
def test_a_plan_run_many_times_reuses_freed_blocks_and_keeps_its_numbers() -> None:
    from numba import cuda

    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((None, 33), "float32", name="x")
        out = cg.reduce_sum(cg.exp(x * 0.5) - x, axis=1)
    plan = Plan(g, [out], [], [x], VariableStore(), device="cuda", fuse=False)
    rng = np.random.default_rng(0)
    manager = cuda.current_context().memory_manager if memory.active() else None
    reused_before = manager.reused if manager is not None else 0
    for rows in (5, 7, 5, 5, 7):  # sizes that repeat: the second of each size is served by a kept block
        host = rng.standard_normal((rows, 33)).astype(np.float32)
        (got,) = plan(cuda.to_device(host))
        want = (np.exp(host.astype(np.float64) * 0.5) - host).sum(axis=1)
        np.testing.assert_allclose(got.copy_to_host(), want, rtol=1e-5)
        del got
    if manager is not None:  # a GPU: the pool served allocations, and gives its blocks back when asked
        assert manager.reused > reused_before
        assert memory.release_cached() > 0 and manager.cached_bytes == 0
    else:
        assert cuda_kernels.simulator() and memory.release_cached() == 0
