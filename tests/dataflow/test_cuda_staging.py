"""Copies across the GPU boundary: pinned buffers lent again, Sends delivered in order, their errors reported.

On the simulator every copy is synchronous, so these tests check values,
order, buffer reuse and errors; the overlap itself needs a GPU
(``benchmarks/gpu_check.py`` runs this file there).
"""

from __future__ import annotations

import concurrent.futures

import numpy as np
import pytest

import cellgraph as cg
from cellgraph.dataflow.errors import ExecutionError
from cellgraph.dataflow.kernels.cuda import staging
from cellgraph.dataflow.transport import InProcessTransport
from cellgraph.examples import models

CPU = "/job:worker/task:0/device:cpu:0"
GPU = "/job:worker/task:0/device:gpu:0"
PS = "/job:ps/task:0/device:cpu:0"


def gpu_then_cpu() -> tuple[cg.Graph, cg.Tensor, cg.Tensor, dict[str, str]]:
    """x * 2 and its sum on the GPU; + 1 on the CPU: two Sends from the GPU (a matrix and a scalar) each run.

    Returns the graph, the two CPU results, and the placement; ``doubled:0`` and
    ``total:0`` are fetched from the GPU."""
    g = cg.Graph()
    with g.as_default():
        x = cg.placeholder((3, 4), name="x")
        with cg.device(GPU):
            doubled = cg.mul(x, 2.0, name="doubled")
            total = cg.reduce_sum(doubled, name="total")
        with cg.device(CPU):
            shifted = cg.add(doubled, 1.0, name="shifted")
            scaled = cg.mul(total, 0.5, name="scaled")
    return g, shifted, scaled, {n.name: n.device or CPU for n in g.nodes}


@pytest.mark.cuda
def test_every_run_gets_its_own_values_through_the_lent_buffers() -> None:
    g, shifted, scaled, placement = gpu_then_cpu()
    sess = cg.PartitionedSession(g, placement, timeout=60)
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((3, 4)).astype(np.float32) for _ in range(12)]
    # The same buffers each run: a value left from the run before, or a fetch that is a lent buffer (and so
    # overwritten by the runs after it), would show here.
    results = [sess.run([shifted, scaled, "doubled:0", "total:0"], {"x:0": x}) for x in xs]
    for x, (got_shifted, got_scaled, got_doubled, got_total) in zip(xs, results, strict=True):
        np.testing.assert_allclose(got_shifted, x * 2 + 1, rtol=1e-6)  # through two Sends
        np.testing.assert_allclose(got_scaled, (x * 2).sum() * 0.5, rtol=1e-5)
        np.testing.assert_allclose(got_doubled, x * 2, rtol=1e-6)  # fetched from the GPU
        np.testing.assert_allclose(got_total, (x * 2).sum(), rtol=1e-5)
        assert np.shape(got_scaled) == np.shape(got_total) == ()


@pytest.mark.cuda
def test_a_training_step_pins_nothing_new_after_its_first() -> None:
    m = models.mlp(hidden=8, optimizer=cg.optim.SGD(0.1))
    placement = cg.placement.place(m.graph, [PS, CPU, GPU])
    sess = cg.PartitionedSession(m.graph, placement, timeout=120)
    rng = np.random.default_rng(1)
    xb, yb = rng.random((4, 64), dtype=np.float32), np.array([0, 1, 2, 3], np.int32)
    sess.run([m.train_op, m.loss], {m.x: xb, m.y: yb})
    pinned, reused = staging.pool().allocated, staging.pool().reused
    for _ in range(2):
        sess.run([m.train_op, m.loss], {m.x: xb, m.y: yb})
    assert staging.pool().allocated == pinned
    assert staging.pool().reused > reused


class RefusingTransport(InProcessTransport):
    """A transport that refuses one key, as a closed connection would."""

    def send(self, key: str, value: np.ndarray) -> None:
        if "total" in key:
            raise ExecutionError("the link to the CPU is down")
        super().send(key, value)


@pytest.mark.cuda
def test_a_send_that_fails_after_its_copy_fails_the_run_with_its_words() -> None:
    g, shifted, scaled, placement = gpu_then_cpu()
    sess = cg.PartitionedSession(g, placement, transport=RefusingTransport(), timeout=5)
    with pytest.raises(ExecutionError, match="a Send from the GPU failed: the link to the CPU is down"):
        sess.run([shifted, scaled], {"x:0": np.ones((3, 4), np.float32)})


@pytest.mark.cuda
def test_without_pinned_memory_the_copies_go_through_pageable_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(staging.PINNED_LIMIT_ENV, "0")
    staging.pool.cache_clear()
    try:
        g, shifted, scaled, placement = gpu_then_cpu()
        x = np.arange(12, dtype=np.float32).reshape(3, 4)
        got_shifted, got_scaled = cg.PartitionedSession(g, placement, timeout=60).run([shifted, scaled], {"x:0": x})
        np.testing.assert_allclose(got_shifted, x * 2 + 1)
        assert float(got_scaled) == 66.0  # (0 + ... + 11) * 2 * 0.5
        assert staging.pool().allocated == 0
    finally:
        staging.pool.cache_clear()


def test_a_pool_at_its_limit_lends_nothing_and_lends_back_in_order() -> None:
    pool = staging.PinnedPool(limit_bytes=48)
    assert pool.take((0, 4), np.dtype(np.float32)) is None  # an empty tensor is copied without a pinned buffer
    first, second = np.zeros((3, 4), np.float32), np.ones((3, 4), np.float32)
    assert pool.take((4, 4), np.dtype(np.float32)) is None  # 64 bytes: over the limit, nothing pinned
    pool.give(first)
    pool.give(second)
    assert pool.take((3, 4), np.dtype(np.float32)) is first  # the oldest first: its copy finishes first
    assert pool.take((3, 4), np.dtype(np.float32)) is second
    assert (pool.allocated, pool.reused) == (0, 2)


@pytest.mark.parametrize(("value", "words"), [("lots", "is not a whole number of MiB"), ("-1", "is negative")])
def test_a_bad_pinned_limit_is_refused_with_its_name(monkeypatch: pytest.MonkeyPatch, value: str, words: str) -> None:
    monkeypatch.setenv(staging.PINNED_LIMIT_ENV, value)
    with pytest.raises(ExecutionError, match=f"CELLGRAPH_PINNED_MIB='{value}' {words}"):
        staging.pinned_limit_bytes()


def test_sends_not_delivered_by_the_deadline_are_reported() -> None:
    never: concurrent.futures.Future[None] = concurrent.futures.Future()
    staging._pending.futures = [never]
    with pytest.raises(ExecutionError, match=r"1 of this run's 1 Sends from the GPU were not delivered within 0.05 s"):
        staging.wait_sent(timeout=0.05)
    staging.wait_sent(timeout=0.05)  # the list was cleared: the next run does not wait on this one's


@pytest.mark.cuda
def test_a_streamed_run_hands_each_fetch_over_once_its_copy_from_the_gpu_is_done() -> None:
    """A GPU replica's gradients leave during backprop: a fetch computed on the GPU is handed over by the sender
    thread, once copied, while the partition goes on; a CPU fetch by its partition's thread; both as ``run``'s."""
    import threading

    g, shifted, scaled, placement = gpu_then_cpu()
    sess = cg.PartitionedSession(g, placement, timeout=60)
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    fetches = [shifted, g.tensor("doubled:0"), g.tensor("total:0"), scaled]
    handed: dict[int, tuple[np.ndarray, str]] = {}

    def on_fetch(i: int, value: np.ndarray) -> None:
        assert i not in handed, f"fetch {i} was handed over twice"
        handed[i] = (np.array(value), threading.current_thread().name)

    streamed = sess.stream(fetches, {"x:0": x}, on_fetch)
    expected = sess.run(fetches, {"x:0": x})
    assert sorted(handed) == [0, 1, 2, 3]
    for i, want in enumerate(expected):
        np.testing.assert_allclose(streamed[i], want, rtol=1e-6)
        np.testing.assert_allclose(handed[i][0], want, rtol=1e-6)
    assert handed[1][1].startswith("cellgraph-gpu-send") and handed[2][1].startswith("cellgraph-gpu-send")
    assert not handed[0][1].startswith("cellgraph-gpu-send")  # computed on the CPU: handed over between kernels
