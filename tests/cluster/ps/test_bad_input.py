"""Every malformed request is refused at the door with its status and words, and changes nothing."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import numpy as np
import pytest

from cellgraph.cluster.ps import OptimizerConfig, TrainingConfig
from cellgraph.cluster.ps.auth import token_metadata
from cellgraph.cluster.ps.chunks import dtype_enum
from cellgraph.protos import parameter_service_pb2 as pb
from cellgraph.protos import parameter_service_pb2_grpc as pb_grpc
from cellgraph.protos import tensor_pb2

from .conftest import TIMEOUT, Servers, status_of

W = np.arange(8, dtype=np.float32).reshape(2, 4)  # 32 bytes
B = np.zeros(3, np.float64)  # 24 bytes


@dataclass
class Door:
    """A raw stub to a server holding job 'j' (variables w and b, sync, k = 2), and a way to read its state."""

    ps: Servers
    stub: pb_grpc.ParameterServiceStub
    metadata: tuple[tuple[str, str], ...]

    def push(self, messages: list[pb.PushMessage]) -> pb.PushResponse:
        return self.stub.Push(iter(messages), timeout=TIMEOUT, metadata=self.metadata)

    def state(self) -> tuple[Any, ...]:
        """Values, versions, the global step and the pending aggregation, to compare before and after."""
        pulled = self.ps.client().pull()
        stats = self.ps.client().stats()[0]
        store = self.ps.servicer().store
        pending = (
            tuple(sorted(store._rules.contributors)),
            tuple(t.tobytes() for t in store._rules.arithmetic.sums.values()),
        )
        return (
            tuple(v.tobytes() for v in pulled.values.values()),
            tuple(sorted(pulled.versions.items())),
            stats.global_step,
            stats.pushes_applied,
            stats.updates,
            pending,
        )


@pytest.fixture
def door(ps: Servers) -> Iterator[Door]:
    ps.start(1, max_chunk_bytes=64)
    client = ps.client()
    client.init("j", {"w": W, "b": B}, OptimizerConfig("sgd", 1.0), TrainingConfig("sync", replicas_to_aggregate=2))
    client.register(0)
    client.register(1)
    # Replica 1's gradient for step 0 is pending: a bad request must not disturb it either.
    client.push({"w": np.ones_like(W), "b": np.ones_like(B)}, step=0, replica_id=1)
    channel = grpc.insecure_channel(ps.addresses[0])
    try:
        yield Door(ps, pb_grpc.ParameterServiceStub(channel), token_metadata(ps.token))
    finally:
        channel.close()


def header(replica: int = 0, step: int = 0) -> pb.PushMessage:
    return pb.PushMessage(header=pb.PushHeader(replica_id=replica, step=step))


def chunk(
    name: str = "w",
    value: np.ndarray = W,
    offset: int = 0,
    content: bytes | None = None,
    dtype: int | None = None,
    shape: tuple[int, ...] | None = None,
) -> pb.PushMessage:
    raw = value.tobytes()
    return pb.PushMessage(
        chunk=tensor_pb2.TensorChunk(
            name=name,
            dtype=dtype_enum(value.dtype) if dtype is None else dtype,  # type: ignore[arg-type]
            shape=tensor_pb2.TensorShapeProto(dim=value.shape if shape is None else shape),
            offset=offset,
            content=raw[offset:] if content is None else content,
        )
    )


def whole(name: str, value: np.ndarray) -> list[pb.PushMessage]:
    raw = value.tobytes()
    return [chunk(name, value, offset, raw[offset : offset + 16]) for offset in range(0, len(raw), 16)]


GOOD_B = whole("b", B)
W_NAN = np.where(W == 3, np.nan, W).astype(np.float32)

PUSHES = [
    # (what, messages, status, words)
    ("an empty stream", [], "INVALID_ARGUMENT", "a Push stream must start with a header (replica_id, step)"),
    ("no header", [chunk()], "INVALID_ARGUMENT", "a Push stream must start with a header (replica_id, step)"),
    ("two headers", [header(), header()], "INVALID_ARGUMENT", "replica 0's push for step 0 has a second header"),
    ("unknown variable", [header(), chunk("nope")], "NOT_FOUND", "gradient for unknown variable 'nope' in replica 0's push for step 0; this shard holds: w, b"),
    ("wrong dtype", [header(), chunk(value=W.astype(np.float64))], "INVALID_ARGUMENT", "chunk of gradient for 'w' is float64, the variable is float32"),
    ("bad DataType", [header(), chunk(dtype=99)], "INVALID_ARGUMENT", "chunk of gradient for 'w': DataType 99 is not a tensor dtype"),
    ("a string DataType", [header(), chunk(dtype=11)], "INVALID_ARGUMENT", "chunk of gradient for 'w': DataType DT_STRING: the parameter service holds numbers, not strings"),
    ("wrong shape", [header(), chunk(shape=(4, 2))], "INVALID_ARGUMENT", "chunk of gradient for 'w' says shape (4, 2), the variable's is (2, 4)"),
    ("overlapping chunks", [header(), chunk(content=bytes(16)), chunk(offset=8, content=bytes(16))], "INVALID_ARGUMENT", "chunk of gradient for 'w' at bytes [8, 24) overlaps bytes [0, 16) already received"),
    ("a gap", [header(), chunk(content=bytes(8)), chunk(offset=16, content=bytes(16)), *GOOD_B], "INVALID_ARGUMENT", "gradient for 'w' is incomplete: bytes [8, 16) of 32 never arrived"),
    ("past the end", [header(), chunk(offset=24, content=bytes(16))], "INVALID_ARGUMENT", "chunk of gradient for 'w' at bytes [24, 40) runs outside the tensor's 32 bytes"),
    ("a negative offset", [header(), chunk(offset=-8, content=bytes(8))], "INVALID_ARGUMENT", "chunk of gradient for 'w' at bytes [-8, 0) runs outside the tensor's 32 bytes"),
    ("a missing variable", [header(), *whole("w", W)], "INVALID_ARGUMENT", "replica 0's push for step 0 lacks a gradient for 'b'"),
    ("a step from the future", [header(step=5), *whole("w", W), *GOOD_B], "INVALID_ARGUMENT", "step 5 is from the future: the global step is 0"),
    ("an unregistered replica", [header(replica=7), *whole("w", W), *GOOD_B], "FAILED_PRECONDITION", "replica 7 is not registered with job 'j'; call Register first"),
    ("a second push for the step", [header(replica=1), *whole("w", W), *GOOD_B], "ALREADY_EXISTS", "replica 1 already pushed a gradient for step 0"),
    ("a NaN gradient", [header(), *whole("w", W_NAN), *GOOD_B], "INVALID_ARGUMENT", "replica 0's gradient for 'w' at step 0 holds 1 NaN and 0 Inf of 8 values; job 'j' refuses non-finite gradients"),
    ("an Inf gradient", [header(), *whole("w", W), *whole("b", np.full(3, -np.inf))], "INVALID_ARGUMENT", "replica 0's gradient for 'b' at step 0 holds 0 NaN and 3 Inf of 3 values"),
]  # fmt: skip


@pytest.mark.parametrize(("what", "messages", "code", "words"), PUSHES, ids=[p[0] for p in PUSHES])
def test_a_bad_push_is_refused_and_changes_nothing(
    door: Door, what: str, messages: list[Any], code: str, words: str
) -> None:
    before = door.state()
    err = status_of(lambda: door.push(messages))
    assert err.code() == grpc.StatusCode[code], err.details()
    assert words in (err.details() or "")
    assert door.state() == before
    assert door.ps.client().stats()[0].pushes_rejected >= 1


def test_a_chunk_over_the_servers_limit_is_resource_exhausted(door: Door) -> None:
    before = door.state()
    big = np.zeros(20, np.float32)  # one 80-byte chunk; the server takes at most 64
    err = status_of(lambda: door.push([header(), chunk("w", W, content=big.tobytes())]))
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "a chunk of gradient for 'w' carries 80 bytes, over this server's limit of 64 per chunk" in (
        err.details() or ""
    )
    assert door.state() == before


def test_a_push_cut_off_mid_stream_changes_nothing(door: Door) -> None:
    before = door.state()
    sent = threading.Event()
    release = threading.Event()

    def messages() -> Iterator[pb.PushMessage]:
        yield header()
        yield chunk(content=bytes(16))
        sent.set()
        release.wait(TIMEOUT)  # the rest never comes: the call is cancelled first

    future = door.stub.Push.future(messages(), timeout=TIMEOUT, metadata=door.metadata)
    assert sent.wait(TIMEOUT)
    future.cancel()
    release.set()
    with pytest.raises(grpc.FutureCancelledError):
        future.result(timeout=TIMEOUT)
    assert door.state() == before


def test_a_push_that_ends_early_is_incomplete(door: Door) -> None:
    before = door.state()
    err = status_of(lambda: door.push([header(), chunk(content=bytes(16))]))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "gradient for 'w' is incomplete: bytes [16, 32) of 32 never arrived" in (err.details() or "")
    assert door.state() == before


def test_a_good_push_after_all_that_still_works(door: Door) -> None:
    for _, messages, _, _ in PUSHES:
        status_of(lambda messages=messages: door.push(messages))
    answer = door.push([header(), *whole("w", np.ones_like(W)), *whole("b", np.ones_like(B))])
    assert answer.status == pb.PushResponse.APPLIED and answer.global_step == 1
    np.testing.assert_array_equal(door.ps.client().pull().values["w"], W - 1)


def config(**fields: Any) -> pb.JobConfig:
    spec = pb.VariableSpecProto(
        name="w",
        dtype=tensor_pb2.DT_FLOAT32,
        shape=tensor_pb2.TensorShapeProto(dim=[2, 4]),
        full_shape=tensor_pb2.TensorShapeProto(dim=[2, 4]),
        row_stop=2,
    )
    base: dict[str, Any] = {
        "job_id": "k",
        "shard": 0,
        "num_shards": 1,
        "variables": [spec],
        "optimizer": pb.OptimizerConfigProto(kind="sgd", learning_rate=0.1),
        "training": pb.TrainingConfigProto(mode=pb.ASYNC, replicas_to_aggregate=1),
    }
    base.update(fields)
    return pb.JobConfig(**base)


def init_chunk(name: str = "w", offset: int = 0, content: bytes = bytes(32)) -> pb.InitMessage:
    return pb.InitMessage(
        chunk=tensor_pb2.TensorChunk(
            name=name,
            dtype=tensor_pb2.DT_FLOAT32,
            shape=tensor_pb2.TensorShapeProto(dim=[2, 4]),
            offset=offset,
            content=content,
        )
    )


def named(name: str) -> pb.JobConfig:
    job = config()
    job.variables[0].name = name
    return job


def negative_dims() -> pb.JobConfig:
    job = config()
    job.variables[0].shape.dim[0] = -2
    return job


INITS = [
    ("no config", [init_chunk()], "INVALID_ARGUMENT", "an Init stream must start with the job's config"),
    ("no job id", [pb.InitMessage(config=config(job_id=""))], "INVALID_ARGUMENT", "the job config has no job_id"),
    ("a shard out of range", [pb.InitMessage(config=config(shard=2, num_shards=2))], "INVALID_ARGUMENT", "shard 2 is not in [0, 2) (num_shards)"),
    ("no variables", [pb.InitMessage(config=config(variables=[]))], "INVALID_ARGUMENT", "job 'k' gives shard 0 no variables"),
    # Each was held before: a NUL, a newline, 100 KB of name.
    ("a NUL in a name", [pb.InitMessage(config=named("w\x00x")), init_chunk("w\x00x")], "INVALID_ARGUMENT", "variable 'w\\x00x': a name must be printable characters; character 1 is '\\x00' (no NUL, newline or other control character)"),
    ("a newline in a name", [pb.InitMessage(config=named("w\n"))], "INVALID_ARGUMENT", "variable 'w\\n': a name must be printable characters; character 1 is '\\n'"),
    ("a 100 KB name", [pb.InitMessage(config=named("n" * 100_000))], "INVALID_ARGUMENT", f"variable '{'n' * 64}'... (100,000 characters): a name of 100,000 bytes is longer than the limit of 1,024 bytes"),
    ("1,025 bytes of name", [pb.InitMessage(config=named("é" * 512 + "n"))], "INVALID_ARGUMENT", "a name of 1,025 bytes is longer than the limit of 1,024 bytes"),
    ("a negative dim", [pb.InitMessage(config=negative_dims())], "INVALID_ARGUMENT", "variable 'w': shape (-2, 4) has a negative dim"),
    ("an unknown optimizer", [pb.InitMessage(config=config(optimizer=pb.OptimizerConfigProto(kind="lamb")))], "INVALID_ARGUMENT", "optimizer kind 'lamb' is not one of sgd, momentum, adam, rmsprop, adagrad, adamw"),
    ("no training mode", [pb.InitMessage(config=config(training=pb.TrainingConfigProto()))], "INVALID_ARGUMENT", "training mode 0 is not SYNC (1) or ASYNC (2)"),
    ("a NaN learning rate", [pb.InitMessage(config=config(optimizer=pb.OptimizerConfigProto(kind="sgd", learning_rate=float("nan"))))], "INVALID_ARGUMENT", "sgd optimizer: learning_rate must be a finite number, 0 or more, got nan"),
    ("a negative learning rate", [pb.InitMessage(config=config(optimizer=pb.OptimizerConfigProto(kind="sgd", learning_rate=-1.0)))], "INVALID_ARGUMENT", "sgd optimizer: learning_rate must be a finite number, 0 or more, got -1.0"),
    ("k of 0", [pb.InitMessage(config=config(training=pb.TrainingConfigProto(mode=pb.SYNC)))], "INVALID_ARGUMENT", "replicas_to_aggregate must be at least 1, got 0"),
    ("a second config", [pb.InitMessage(config=config()), pb.InitMessage(config=config())], "INVALID_ARGUMENT", "an Init stream carries one config, then only chunks"),
    ("a value for another variable", [pb.InitMessage(config=config()), init_chunk("x")], "NOT_FOUND", "initial value for 'x', which is not a variable of this shard; it holds: w"),
    ("a missing value", [pb.InitMessage(config=config())], "INVALID_ARGUMENT", "initial value of 'w' is incomplete: bytes [0, 32) of 32 never arrived"),
    ("too many bytes", [pb.InitMessage(config=config(variables=[pb.VariableSpecProto(name="w", dtype=tensor_pb2.DT_FLOAT32, shape=tensor_pb2.TensorShapeProto(dim=[1 << 20]))]))], "RESOURCE_EXHAUSTED", "job 'k' declares 4,194,304 bytes of variables for shard 0, over this server's limit of 1,000,000"),
]  # fmt: skip


@pytest.mark.parametrize(("what", "messages", "code", "words"), INITS, ids=[i[0] for i in INITS])
def test_a_bad_init_is_refused_and_leaves_the_server_empty(
    ps: Servers, what: str, messages: list[Any], code: str, words: str
) -> None:
    ps.start(1, max_bytes=1_000_000)
    with grpc.insecure_channel(ps.addresses[0]) as channel:
        stub = pb_grpc.ParameterServiceStub(channel)
        metadata = token_metadata(ps.token)
        err = status_of(lambda: stub.Init(iter(messages), timeout=TIMEOUT, metadata=metadata))
        assert err.code() == grpc.StatusCode[code], err.details()
        assert words in (err.details() or "")
        assert stub.Stats(pb.StatsRequest(), timeout=TIMEOUT, metadata=metadata).job_id == ""
        # The server is still empty and takes a good Init afterwards.
        good = stub.Init(iter([pb.InitMessage(config=config()), init_chunk()]), timeout=TIMEOUT, metadata=metadata)
        assert not good.already_initialized


def test_requests_before_init_say_to_init_first(ps: Servers) -> None:
    ps.start(1)
    with grpc.insecure_channel(ps.addresses[0]) as channel:
        stub = pb_grpc.ParameterServiceStub(channel)
        metadata = token_metadata(ps.token)
        calls = {
            "Register": lambda: stub.Register(pb.RegisterRequest(), timeout=TIMEOUT, metadata=metadata),
            "Pull": lambda: list(stub.Pull(pb.PullRequest(), timeout=TIMEOUT, metadata=metadata)),
            "Push": lambda: stub.Push(iter([header()]), timeout=TIMEOUT, metadata=metadata),
            "Save": lambda: stub.Save(pb.SaveRequest(), timeout=TIMEOUT, metadata=metadata),
            "Restore": lambda: stub.Restore(pb.RestoreRequest(), timeout=TIMEOUT, metadata=metadata),
        }
        for name, call in calls.items():
            err = status_of(call)
            assert err.code() == grpc.StatusCode.FAILED_PRECONDITION, name
            assert "this parameter server holds no job yet: a client must call Init first" in (err.details() or "")


def test_pull_of_an_unknown_variable_is_not_found(door: Door) -> None:
    err = status_of(
        lambda: list(door.stub.Pull(pb.PullRequest(names=["w", "zz"]), timeout=TIMEOUT, metadata=door.metadata))
    )
    assert err.code() == grpc.StatusCode.NOT_FOUND
    assert "'zz'" in (err.details() or "")


@pytest.mark.parametrize("asked", [-1, -(2**63)])
def test_a_pull_with_a_negative_chunk_size_is_refused_and_changes_nothing(door: Door, asked: int) -> None:
    """A negative max_chunk_bytes was taken as 0 (the server's default); 0 still is (the proto says so)."""
    before = door.state()
    request = pb.PullRequest(names=["w"], max_chunk_bytes=asked)
    err = status_of(lambda: list(door.stub.Pull(request, timeout=TIMEOUT, metadata=door.metadata)))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err.details()
    assert f"max_chunk_bytes must be 0 (the server's default) or more, got {asked:,}" in (err.details() or "")
    assert door.state() == before


def test_a_name_of_1024_bytes_is_taken(ps: Servers) -> None:
    ps.start(1)
    name = "é" * 511 + "ab"  # 1,024 bytes of UTF-8, printable
    ps.client().init("j", {name: np.zeros(2, np.float32)})
    assert list(ps.client().pull().values) == [name]


def test_checkpoint_requests_are_checked(door: Door, ps: Servers) -> None:
    err = status_of(lambda: door.stub.Save(pb.SaveRequest(), timeout=TIMEOUT, metadata=door.metadata))
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "this parameter server has no checkpoint directory: start it with checkpoint_dir=..." in (
        err.details() or ""
    )
    door.ps.servicer().checkpoints.directory = ps.tmp_path / "ckpt"
    before = door.state()
    for name, code in (("../../etc/passwd", "INVALID_ARGUMENT"), ("ckpt-0000000042", "NOT_FOUND")):
        err = status_of(
            lambda name=name: door.stub.Restore(
                pb.RestoreRequest(checkpoint=name), timeout=TIMEOUT, metadata=door.metadata
            )
        )
        assert err.code() == grpc.StatusCode[code], err.details()
        assert name in (err.details() or "")
    err = status_of(lambda: door.stub.Restore(pb.RestoreRequest(), timeout=TIMEOUT, metadata=door.metadata))
    assert err.code() == grpc.StatusCode.NOT_FOUND
    assert "no complete checkpoint of shard 0 of 1" in (err.details() or "")
    assert door.state() == before


@pytest.mark.parametrize("token", [None, "wrong-token"])
def test_a_call_without_the_right_token_is_unauthenticated_and_touches_nothing(door: Door, token: str | None) -> None:
    before = door.state()
    metadata = token_metadata(token) if token else ()
    good_push = [header(), *whole("w", np.ones_like(W)), *GOOD_B]
    err = status_of(lambda: door.stub.Push(iter(good_push), timeout=TIMEOUT, metadata=metadata))
    assert err.code() == grpc.StatusCode.UNAUTHENTICATED
    words = "missing token" if token is None else "wrong token for this parameter server"
    assert words in (err.details() or "")
    err = status_of(lambda: door.stub.Stats(pb.StatsRequest(), timeout=TIMEOUT, metadata=metadata))
    assert err.code() == grpc.StatusCode.UNAUTHENTICATED
    assert door.state() == before
    assert door.ps.client().stats()[0].pushes_rejected >= 2
