"""Issue 14, faults 1 to 3 on the server: waits that hold no thread, stalled and cancelled streams, restore and stop.

Each test here failed on the threaded server (32 handler threads, each wait
holding one): more than 32 replicas on a shard stalled, cancelled long pulls and
half-sent streams starved the health check, a restore left PushPull waiting for
a step that would never come, and a cancelled Init kept its buffer until the
cycle collector ran.
"""

from __future__ import annotations

import gc
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from cellgraph.cluster.errors import ParameterServerError
from cellgraph.cluster.ps import OptimizerConfig, TrainingConfig, VariableSpec
from cellgraph.cluster.ps import shard_init as shard_init_module
from cellgraph.cluster.ps.auth import token_metadata
from cellgraph.cluster.ps.chunks import TensorAssembler
from cellgraph.protos import parameter_service_pb2 as pb
from cellgraph.protos import parameter_service_pb2_grpc as pb_grpc
from cellgraph.protos import tensor_pb2

from .conftest import TIMEOUT, Servers, status_of

MANY = 40  # more than the 32 handler threads of the threaded server
# The deadline of calls made to hold the server: longer than a health check's, so that a server whose held
# calls keep a thread each fails the health check rather than answering once their deadline frees the threads.
HOLD_S = 10 * TIMEOUT
F32 = np.dtype(np.float32)


def eventually(condition: Callable[[], bool], what: str) -> None:
    """Wait for ``condition`` at most TIMEOUT seconds; fail naming ``what``."""
    deadline = time.monotonic() + TIMEOUT
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"not within {TIMEOUT} s: {what}")
        time.sleep(0.01)


def healthy(address: str) -> int:
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        return stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=TIMEOUT).status


def calls(ps: Servers, name: str) -> int:
    return int(ps.servicer().counters.calls_so_far().get(name, 0))


def chunk(name: str, shape: tuple[int, ...], offset: int, content: bytes) -> tensor_pb2.TensorChunk:
    return tensor_pb2.TensorChunk(
        name=name, dtype=tensor_pb2.DT_FLOAT32, shape=tensor_pb2.TensorShapeProto(dim=shape), offset=offset,
        content=content,
    )  # fmt: skip


def replica(ps: Servers, rid: int, steps: int, errors: list[BaseException]) -> None:
    try:
        client = ps.client()
        step = client.register(rid).global_step
        for _ in range(steps):
            pushed, pulled = client.push_pull({"w": np.ones(4, F32)}, step=step, replica_id=rid, min_step=step + 1)
            assert pushed.status in ("aggregated", "applied"), pushed
            step = pulled.global_step
    except BaseException as err:  # noqa: BLE001 - reported by the test
        errors.append(err)


def test_more_replicas_than_handler_threads_finish_their_sync_steps(ps: Servers) -> None:
    ps.start(1)
    ps.client().init(
        "many", {"w": np.zeros(4, F32)}, OptimizerConfig("sgd", 1.0), TrainingConfig("sync", replicas_to_aggregate=MANY)
    )
    errors: list[BaseException] = []
    threads = [threading.Thread(target=replica, args=(ps, rid, 3, errors), daemon=True) for rid in range(MANY)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(TIMEOUT * 3)
    assert not any(thread.is_alive() for thread in threads), "replicas still waiting for their steps"
    assert not errors, errors[:3]
    [stats] = ps.client().stats()
    assert (stats.global_step, stats.pushes_applied, stats.pushes_stale) == (3, 3 * MANY, 0)


def test_a_health_check_answers_after_many_cancelled_long_pulls(ps: Servers) -> None:
    [address] = ps.start(1)
    ps.client().init("pulls", {"w": np.zeros(4, F32)})
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.ParameterServiceStub(channel)
        pulls = [
            stub.Pull(pb.PullRequest(min_step=2**62), timeout=HOLD_S, metadata=token_metadata(ps.token))
            for _ in range(MANY)
        ]
        eventually(lambda: calls(ps, "Pull") == MANY, f"{MANY} pulls reached the server")
        for call in pulls:
            call.cancel()
        assert healthy(address) == health_pb2.HealthCheckResponse.SERVING
        # The cancelled waits are gone, not merely outnumbered: nothing waits on the shard any more.
        eventually(lambda: ps.servicer().store.waiting == 0, "the cancelled pulls stopped waiting")
    assert ps.client().pull().global_step == 0


def test_a_health_check_answers_while_many_streams_stall_half_sent(ps: Servers) -> None:
    [address] = ps.start(1)
    ps.client().init("stalls", {"w": np.zeros(1024, F32)})
    release = threading.Event()

    def stalled(rid: int) -> Iterator[pb.PushMessage]:
        yield pb.PushMessage(header=pb.PushHeader(replica_id=rid, step=0))
        yield pb.PushMessage(chunk=chunk("w", (1024,), 0, bytes(2048)))  # half the gradient
        release.wait(HOLD_S)

    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.ParameterServiceStub(channel)
        pushes = [
            stub.Push.future(stalled(rid), timeout=HOLD_S, metadata=token_metadata(ps.token)) for rid in range(MANY)
        ]
        try:
            eventually(lambda: calls(ps, "Push") == MANY, f"{MANY} pushes reached the server")
            assert healthy(address) == health_pb2.HealthCheckResponse.SERVING
            assert ps.client().stats()[0].global_step == 0  # an authenticated call is served as well
        finally:
            release.set()
        for push in pushes:
            err = status_of(lambda push=push: push.result(timeout=TIMEOUT))
            assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err.details()
    assert ps.client().pull().global_step == 0  # no half push was applied


def test_a_stream_that_sends_nothing_is_ended_at_its_idle_deadline(ps: Servers) -> None:
    [address] = ps.start(1, stream_idle_s=0.2)
    ps.client().init("idle", {"w": np.zeros(1024, F32)})
    release = threading.Event()

    def stalled() -> Iterator[pb.PushMessage]:
        yield pb.PushMessage(header=pb.PushHeader(replica_id=0, step=0))
        release.wait(TIMEOUT)

    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.ParameterServiceStub(channel)
        try:
            err = status_of(lambda: stub.Push(stalled(), timeout=TIMEOUT, metadata=token_metadata(ps.token)))
        finally:
            release.set()
    assert err.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert "the Push stream sent nothing for 0.2 s (this server's idle limit per stream)" in (err.details() or "")


def test_a_pull_whose_caller_never_reads_is_ended_and_lets_go_of_its_values(ps: Servers) -> None:
    [address] = ps.start(1, stream_idle_s=0.3)
    ps.client().init("unread", {"w": np.zeros(4 << 20, F32)})  # 16 MB: more than the transport buffers
    table = ps.servicer().store._table
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.ParameterServiceStub(channel)
        answer = stub.Pull(pb.PullRequest(), timeout=TIMEOUT, metadata=token_metadata(ps.token))  # never read
        # Held for ever, the snapshot it was answered from would cost a copy of w at the next update.
        eventually(lambda: "w" in table._lent and table._lent["w"]() is None, "the unread Pull let go of w")
        err = status_of(lambda: list(answer))
    assert err.code() == grpc.StatusCode.DEADLINE_EXCEEDED, err.details()
    assert "the Pull call took nothing of its answer for 0.3 s (this server's idle limit per stream)" in (
        err.details() or ""
    )
    assert ps.client().pull().values["w"].shape == (4 << 20,)  # the server answers the next caller


def waiting_push_pull(ps: Servers) -> tuple[threading.Thread, list[BaseException]]:
    """Replica 0 of a sync job of two pushes for step 0 and waits for step 1; returns once it waits."""
    raised: list[BaseException] = []

    def run() -> None:
        client = ps.client()
        client.register(0)
        try:
            client.push_pull({"w": np.ones(4, F32)}, step=0, replica_id=0, min_step=1)
        except BaseException as err:  # noqa: BLE001 - reported by the test
            raised.append(err)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    eventually(lambda: ps.servicer().store.waiting == 1, "the push_pull waits for step 1")
    return thread, raised


def test_restore_releases_a_push_pull_waiting_for_a_later_step(ps: Servers, tmp_path: Path) -> None:
    ps.start(1, checkpoint_dir=tmp_path)
    setup = ps.client()
    setup.init("restore", {"w": np.zeros(4, F32)}, training=TrainingConfig("sync", replicas_to_aggregate=2))
    name = setup.save()
    thread, raised = waiting_push_pull(ps)
    setup.restore(name)
    thread.join(TIMEOUT)
    assert not thread.is_alive(), "the push_pull still waits after the restore"
    [err] = raised
    assert isinstance(err, ParameterServerError) and err.code == "ABORTED", err
    assert f"shard 0 was restored from checkpoint {name} (job 'restore', global step 0) while this call waited" in str(
        err
    )
    assert ps.servicer().store.waiting == 0


def test_stopping_releases_a_pull_waiting_for_a_later_step(ps: Servers) -> None:
    [address] = ps.start(1)
    ps.client().init("stop", {"w": np.zeros(4, F32)})
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.ParameterServiceStub(channel)
        call = stub.Pull(pb.PullRequest(min_step=5), timeout=TIMEOUT, metadata=token_metadata(ps.token))
        eventually(lambda: ps.servicer().store.waiting == 1, "the pull waits for step 5")
        assert ps.servers[0].stop(TIMEOUT).wait(TIMEOUT)
        err = status_of(lambda: list(call))
    assert err.code() == grpc.StatusCode.UNAVAILABLE
    assert f"parameter server 127.0.0.1:{address.rsplit(':', 1)[1]} is stopping" in (err.details() or "")


def test_a_cancelled_init_drops_its_buffer_at_once(ps: Servers, monkeypatch: pytest.MonkeyPatch) -> None:
    [address] = ps.start(1)
    buffers: list[weakref.ref[np.ndarray]] = []

    class Watched(TensorAssembler):
        def _buffer(self) -> np.ndarray:  # the array is made at the first chunk that is not the whole tensor
            made = self.array is None
            flat = super()._buffer()
            if made:
                buffers.append(weakref.ref(self.array))  # type: ignore[arg-type]
            return flat

    monkeypatch.setattr(shard_init_module, "TensorAssembler", Watched)
    size = 96 * 1024 * 1024 // F32.itemsize  # 96 MiB of float32
    spec = VariableSpec("big", F32, (size,))
    config = pb.JobConfig(
        job_id="big", shard=0, num_shards=1,
        variables=[pb.VariableSpecProto(name="big", dtype=tensor_pb2.DT_FLOAT32, shape=tensor_pb2.TensorShapeProto(dim=[size]))],
        optimizer=pb.OptimizerConfigProto(kind="sgd", learning_rate=0.1),
        training=pb.TrainingConfigProto(mode=pb.ASYNC, replicas_to_aggregate=1),
    )  # fmt: skip
    release = threading.Event()

    def stalled() -> Iterator[pb.InitMessage]:
        yield pb.InitMessage(config=config)
        yield pb.InitMessage(chunk=chunk("big", spec.shape, 0, bytes(1024 * 1024)))
        release.wait(TIMEOUT)

    gc.disable()  # the buffer must go by reference counting alone
    try:
        with grpc.insecure_channel(address) as channel:
            stub = pb_grpc.ParameterServiceStub(channel)
            init = stub.Init.future(stalled(), timeout=TIMEOUT, metadata=token_metadata(ps.token))
            eventually(lambda: ps.servicer().counters.bytes_in == 1024 * 1024, "the first chunk arrived")
            [buffer] = buffers
            assert buffer() is not None
            init.cancel()
            eventually(lambda: buffer() is None, "the cancelled Init's 96 MiB buffer was freed")
    finally:
        release.set()
        gc.enable()
