"""A server's own checkpoints every N steps, and Reconfigure: real servers, real clients, real files."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest

from cellgraph.cluster.errors import ParameterServerError
from cellgraph.cluster.ps import OptimizerConfig, TrainingConfig, VariableSpec
from cellgraph.cluster.ps.autosave import CheckpointWriter
from cellgraph.cluster.ps.checkpoint import list_checkpoints, read_shard_checkpoint
from cellgraph.cluster.ps.store import ParameterStore, StoreState

from .conftest import TIMEOUT, Servers


def values() -> dict[str, np.ndarray]:
    return {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.zeros(3, np.float64)}


def grads_for(step: int) -> dict[str, np.ndarray]:
    return {name: np.full_like(value, step + 1) for name, value in values().items()}


def wait_until(check: object, what: str) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"still waiting after {TIMEOUT} s for {what}")
        time.sleep(0.02)


# ---------------------------------------------------------------------- the store
def sync_store(k: int, every: int = 0) -> ParameterStore:
    specs = [VariableSpec(n, v.dtype, v.shape) for n, v in values().items()]
    training = TrainingConfig("sync", replicas_to_aggregate=k, checkpoint_every=every)
    store = ParameterStore("job", specs, values(), OptimizerConfig("sgd", 1.0), training)
    for replica in range(3):
        store.register(replica)
    return store


def test_the_store_copies_its_state_at_exactly_each_multiple_of_checkpoint_every() -> None:
    store = sync_store(k=1, every=3)
    copies: list[StoreState] = []
    for step in range(7):
        store.push(0, step, grads_for(step))
        snapshot = store.take_snapshot()
        assert (snapshot is not None) == ((step + 1) % 3 == 0), step
        if snapshot is not None:
            copies.append(snapshot)
    assert [c.global_step for c in copies] == [3, 6]
    # Each copy is the state at its step, not the live arrays, which later pushes went on changing.
    for copy in copies:
        np.testing.assert_array_equal(copy.tensors["w"], values()["w"] - sum(range(1, copy.global_step + 1)))
    assert store.take_snapshot() is None  # taken once


def test_a_restore_forgets_a_copy_not_yet_written() -> None:
    store = sync_store(k=1, every=1)
    store.push(0, 0, grads_for(0))
    store.load_state(StoreState(0, {"w": 0, "b": 0}, store.state().tensors))
    assert store.take_snapshot() is None


def test_reconfigure_applies_a_step_that_already_has_enough_gradients() -> None:
    store = sync_store(k=3)
    assert store.push(0, 0, {n: np.full_like(v, 2) for n, v in values().items()}).status == "aggregated"
    assert store.push(1, 0, {n: np.full_like(v, 4) for n, v in values().items()}).status == "aggregated"
    assert store.reconfigure(2) == 1  # the two pushes make the step now: their mean, 3, is applied
    step, held = store.read()
    assert step == 1
    np.testing.assert_array_equal(held["w"][1], values()["w"] - 3)
    assert store.stats().pushes_applied == 2 and store.training.replicas_to_aggregate == 2
    # From now on two gradients make a step.
    store.push(0, 1, grads_for(1))
    assert store.push(1, 1, grads_for(1)).status == "applied"


def test_reconfigure_refuses_bad_values_and_async_jobs_changing_nothing() -> None:
    store = sync_store(k=2)
    store.push(0, 0, grads_for(0))
    before = store.state()
    with pytest.raises(ParameterServerError, match="replicas_to_aggregate must be at least 1, got 0") as err:
        store.reconfigure(0)
    assert err.value.code == "INVALID_ARGUMENT"
    assert store.training.replicas_to_aggregate == 2 and store.global_step == 0
    np.testing.assert_array_equal(store.state().tensors["w"], before.tensors["w"])
    assert store.push(1, 0, grads_for(0)).status == "applied"  # the pending gradient was kept

    specs = [VariableSpec(n, v.dtype, v.shape) for n, v in values().items()]
    lone = ParameterStore("job", specs, values(), OptimizerConfig(), TrainingConfig("async"))
    with pytest.raises(ParameterServerError, match="trains in async mode: replicas_to_aggregate applies to sync"):
        lone.reconfigure(1)


# ---------------------------------------------------------------------- the writer
def test_the_writer_keeps_the_error_of_a_failed_write_and_clears_it_after_a_good_one() -> None:
    written: list[int] = []
    fail = threading.Event()
    fail.set()

    def write(state: StoreState) -> str:
        if fail.is_set():
            raise OSError("disk full")
        written.append(state.global_step)
        return f"ckpt-{state.global_step}"

    writer = CheckpointWriter(write, "test-writer")
    try:
        writer.offer(StoreState(5, {}, {}))
        assert writer.flush(TIMEOUT)
        assert writer.error == "checkpoint at global step 5 failed: disk full"
        fail.clear()
        writer.offer(StoreState(10, {}, {}))
        assert writer.flush(TIMEOUT)
        assert writer.error == "" and written == [10]
    finally:
        writer.close()


def test_the_writer_outlives_a_write_that_fails_with_any_error() -> None:
    written: list[int] = []

    def write(state: StoreState) -> str:
        if state.global_step == 5:
            raise RuntimeError("Error while serializing: I/O error")  # not an OSError, as safetensors raises its own
        written.append(state.global_step)
        return f"ckpt-{state.global_step}"

    writer = CheckpointWriter(write, "test-writer")
    try:
        writer.offer(StoreState(5, {}, {}))
        assert writer.flush(TIMEOUT)
        assert writer.error == "checkpoint at global step 5 failed: RuntimeError: Error while serializing: I/O error"
        # The thread lives on: the next checkpoint is written (a dead one left it, and the step after it, waiting).
        writer.offer(StoreState(10, {}, {}))
        assert writer.flush(TIMEOUT)
        assert writer.error == "" and written == [10]
    finally:
        writer.close()


# ---------------------------------------------------------------------- over gRPC
def test_a_server_checkpoints_every_n_steps_by_itself(ps: Servers) -> None:
    directory = ps.tmp_path / "ckpt"
    ps.start(2, checkpoint_dir=directory)
    client = ps.client()
    training = TrainingConfig("sync", replicas_to_aggregate=1, checkpoint_every=4)
    client.init("auto", values(), OptimizerConfig("sgd", 1.0), training)  # w on one shard, b on the other
    client.register(0)
    for step in range(10):
        client.push(grads_for(step), step=step, replica_id=0)

    def both_saved_step_8() -> bool:
        return all(s.latest_checkpoint_step == 8 for s in client.stats())

    wait_until(both_saved_step_8, "both shards to report ckpt at step 8")
    stats = client.stats()
    assert {s.latest_checkpoint for s in stats} == {"ckpt-0000000008"}
    assert all(s.checkpoint_error == "" for s in stats)
    for shard in range(2):
        names = [info.name for info in list_checkpoints(directory, shard, 2)]
        assert names == ["ckpt-0000000004", "ckpt-0000000008"]
    # What was written is the state at exactly step 8 on both shards, although training went on to step 10.
    held = {}
    for shard in range(2):
        held.update(read_shard_checkpoint(directory, "ckpt-0000000008", shard, 2).tensors)
    np.testing.assert_array_equal(held["w"], values()["w"] - sum(range(1, 9)))
    np.testing.assert_array_equal(held["b"], values()["b"] - sum(range(1, 9)))
    assert client.restore("ckpt-0000000008") == 8


def test_a_job_that_checkpoints_by_itself_needs_a_server_with_a_checkpoint_directory(ps: Servers) -> None:
    ps.start(1)
    client = ps.client()
    with pytest.raises(ParameterServerError, match="this parameter server has no checkpoint directory") as err:
        client.init("auto", values(), OptimizerConfig(), TrainingConfig("sync", checkpoint_every=10))
    assert err.value.code == "FAILED_PRECONDITION"
    assert ps.servicer().store is None  # nothing was set up
    client.init("auto", values(), OptimizerConfig(), TrainingConfig("sync"))  # the server still takes a job


def test_reconfigure_releases_a_replica_waiting_for_a_step_that_would_need_a_gone_one(ps: Servers) -> None:
    ps.start(1)
    client = ps.client()
    client.init("scale", values(), OptimizerConfig("sgd", 1.0), TrainingConfig("sync", replicas_to_aggregate=2))
    client.register(0)
    answer: list[int] = []

    def waiting_replica() -> None:
        _, after = client.push_pull(grads_for(0), step=0, replica_id=0, min_step=1)
        answer.append(after.global_step)

    thread = threading.Thread(target=waiting_replica)
    thread.start()
    wait_until(lambda: any(r.pushes for r in client.stats()[0].replicas), "the replica's push")
    assert not answer  # it waits for a second gradient that will not come
    assert client.reconfigure(1) == 1
    thread.join(TIMEOUT)
    assert answer == [1]
    [stats] = client.stats()
    assert stats.training.replicas_to_aggregate == 1 and stats.pushes_applied == 1
    # Init again with the config as it is now is harmless (what a job does after a restart elsewhere).
    again = client.init("scale", values(), OptimizerConfig("sgd", 1.0), TrainingConfig("sync", replicas_to_aggregate=1))
    assert again == 1


# ---------------------------------------------------------------------- a push waits for its step's checkpoint
def test_a_push_waits_for_the_checkpoint_of_the_step_it_would_leave_until_it_is_written() -> None:
    disk = threading.Event()  # the disk answers when set
    fail = threading.Event()

    def write(state: StoreState) -> str:
        disk.wait(TIMEOUT)
        if fail.is_set():
            raise OSError("disk full")
        return f"ckpt-{state.global_step}"

    async def scenario(writer: CheckpointWriter) -> list[str]:
        seen = []
        await writer.before_push(3)  # nothing offered: no wait
        writer.offer(StoreState(4, {}, {}))
        await writer.before_push(3)  # a push of an earlier step: no wait either
        waiting = asyncio.ensure_future(writer.before_push(4))
        await asyncio.sleep(0.3)
        seen.append("waiting" if not waiting.done() else "went on")
        disk.set()
        await asyncio.wait_for(waiting, TIMEOUT)
        seen.append("went on")
        await writer.before_push(4)  # written: no wait
        # A write that fails lets the push go on too, and says why.
        disk.clear()
        fail.set()
        writer.offer(StoreState(8, {}, {}))
        waiting = asyncio.ensure_future(writer.before_push(8))
        await asyncio.sleep(0.1)
        disk.set()
        await asyncio.wait_for(waiting, TIMEOUT)
        seen.append(writer.error)
        # A write that takes longer than the wait lets the push go on, and says so.
        disk.clear()
        fail.clear()
        writer.offer(StoreState(12, {}, {}))
        await writer.before_push(12, timeout=0.2)
        seen.append(writer.error)
        disk.set()
        return seen

    writer = CheckpointWriter(write, "test-writer")
    try:
        assert asyncio.run(scenario(writer)) == [
            "waiting",
            "went on",
            "checkpoint at global step 8 failed: disk full",
            "the checkpoint at global step 12 was not written within 0.2 s; training went on without it",
        ]
    finally:
        disk.set()
        writer.close()


def test_no_step_passes_a_checkpoint_still_being_written_on_a_slow_disk(ps: Servers) -> None:
    # A killed server then finds a checkpoint at most checkpoint_every steps old: the replicas lose no more.
    directory = ps.tmp_path / "ckpt"
    ps.start(1, checkpoint_dir=directory)
    servicer = ps.servicer()
    write = servicer.checkpoints.write
    disk = threading.Event()  # the slow disk finishes a write once this is set

    def slow_disk(*args: object) -> object:
        disk.wait(TIMEOUT)
        return write(*args)  # type: ignore[arg-type]

    servicer.checkpoints.write = slow_disk  # type: ignore[method-assign]
    client = ps.client()
    client.init("slow", values(), OptimizerConfig("sgd", 1.0), TrainingConfig("sync", checkpoint_every=2))
    client.register(0)
    for step in range(2):
        client.push(grads_for(step), step=step, replica_id=0)
    assert [info.name for info in list_checkpoints(directory, 0, 1)] == []  # step 2's is being written
    pushed: list[object] = []
    third = threading.Thread(target=lambda: pushed.append(client.push(grads_for(2), step=2, replica_id=0)))
    third.start()
    try:
        third.join(0.5)
        assert third.is_alive() and not pushed  # the push that would move the step to 3 waits for the disk
    finally:
        disk.set()
        third.join(TIMEOUT)
    assert pushed and [info.name for info in list_checkpoints(directory, 0, 1)] == ["ckpt-0000000002"]
    assert client.stats()[0].global_step == 3
