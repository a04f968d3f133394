"""Issue 14, limits and validation: sizes, undecodable bytes, long names, non-finite values, the Init lock.

Each test here failed on the code before these checks: the server answered
UNKNOWN, INTERNAL or RESOURCE_EXHAUSTED where the request was at fault, took a
NaN gradient or learning rate, or let one stalled Init block the next one.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import pytest

from cellgraph.cluster.errors import ParameterServerError
from cellgraph.cluster.job import train
from cellgraph.cluster.ps import OptimizerConfig, TrainingConfig, VariableSpec
from cellgraph.cluster.ps import shard_init as shard_init_module
from cellgraph.cluster.ps.auth import token_metadata
from cellgraph.cluster.ps.config import listed, quoted
from cellgraph.cluster.ps.store import ParameterStore
from cellgraph.cluster.training_graph import TrainingError
from cellgraph.protos import parameter_service_pb2 as pb
from cellgraph.protos import parameter_service_pb2_grpc as pb_grpc
from cellgraph.protos import tensor_pb2

from .conftest import TIMEOUT, Servers, status_of

F32 = np.dtype(np.float32)


def spec(*dims: int, name: str = "w") -> pb.VariableSpecProto:
    return pb.VariableSpecProto(name=name, dtype=tensor_pb2.DT_FLOAT32, shape=tensor_pb2.TensorShapeProto(dim=dims))


def job(*variables: pb.VariableSpecProto, **fields: Any) -> pb.InitMessage:
    config = pb.JobConfig(
        job_id="k",
        shard=0,
        num_shards=1,
        variables=variables or [spec(2, 4)],
        optimizer=pb.OptimizerConfigProto(kind="sgd", learning_rate=0.1),
        training=pb.TrainingConfigProto(mode=pb.ASYNC, replicas_to_aggregate=1),
    )
    for name, value in fields.items():
        getattr(config, name).CopyFrom(value)
    return pb.InitMessage(config=config)


def init_chunk(offset: int = 0, content: bytes = bytes(32)) -> pb.InitMessage:
    return pb.InitMessage(
        chunk=tensor_pb2.TensorChunk(
            name="w", dtype=tensor_pb2.DT_FLOAT32, shape=tensor_pb2.TensorShapeProto(dim=[2, 4]), offset=offset,
            content=content,
        )
    )  # fmt: skip


def refused(ps: Servers, messages: list[pb.InitMessage]) -> grpc.RpcError:
    """The status of an Init of ``messages``; the server must still be empty afterwards."""
    with grpc.insecure_channel(ps.addresses[0]) as channel:
        stub = pb_grpc.ParameterServiceStub(channel)
        metadata = token_metadata(ps.token)
        err = status_of(lambda: stub.Init(iter(messages), timeout=TIMEOUT, metadata=metadata))
        assert stub.Stats(pb.StatsRequest(), timeout=TIMEOUT, metadata=metadata).job_id == ""
    return err


# ------------------------------------------------------------------ sizes
SIZES = [
    # (what, dims, code, words): each was UNKNOWN before ("Unable to allocate", "array is too big")
    ("2**32 x 2**32 overflows int64", (2**32, 2**32), "INVALID_ARGUMENT", "variable 'w': shape (4294967296, 4294967296) of float32 is 73,786,976,294,838,206,464 bytes, more than any array can hold (9,223,372,036,854,775,807)"),
    ("2**62 x 4 overflows int64", (2**62, 4), "INVALID_ARGUMENT", "variable 'w': shape (4611686018427387904, 4) of float32 is 73,786,976,294,838,206,464 bytes, more than any array can hold"),
    ("1 TiB is more than this machine has", (2**38,), "RESOURCE_EXHAUSTED", "job 'k' needs about 2,199,023,255,552 bytes for shard 0 (1,099,511,627,776 bytes of variables, held 2 times: as received and in the store), more than the"),
]  # fmt: skip


@pytest.mark.parametrize(("what", "dims", "code", "words"), SIZES, ids=[s[0] for s in SIZES])
def test_an_init_too_big_to_hold_is_refused_with_its_size(
    ps: Servers, what: str, dims: tuple[int, ...], code: str, words: str
) -> None:
    ps.start(1, max_bytes=2**70)  # only the machine's memory and int64 limit it
    err = refused(ps, [job(spec(*dims))])
    assert err.code() == grpc.StatusCode[code], err.details()
    assert words in (err.details() or "")


def test_an_init_over_the_available_memory_says_how_much_is_available(
    ps: Servers, monkeypatch: pytest.MonkeyPatch
) -> None:
    ps.start(1)
    monkeypatch.setattr(shard_init_module, "available_memory", lambda: 1000)
    err = refused(ps, [job(spec(100, 4)), init_chunk()])
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert (
        "job 'k' needs about 3,200 bytes for shard 0 (1,600 bytes of variables, held 2 times: as received and "
        "in the store), more than the 1,000 bytes of memory available on this machine: use more parameter "
        "servers, or a machine with more memory"
    ) in (err.details() or "")


def test_the_memory_estimate_counts_slots_and_sums(ps: Servers, monkeypatch: pytest.MonkeyPatch) -> None:
    ps.start(1)
    monkeypatch.setattr(shard_init_module, "available_memory", lambda: 100)
    adam = pb.OptimizerConfigProto(kind="adam", learning_rate=0.1, beta1=0.9, beta2=0.999, epsilon=1e-8)
    sync = pb.TrainingConfigProto(mode=pb.SYNC, replicas_to_aggregate=1)
    err = refused(ps, [job(spec(2, 4), optimizer=adam, training=sync), init_chunk()])
    assert (
        "needs about 160 bytes for shard 0 (32 bytes of variables, held 5 times: as received, in the store, "
        "adam slots m and v, and the sync step's sum)"
    ) in (err.details() or "")


# ------------------------------------------------------------------ bytes that are no message
def test_undecodable_bytes_are_invalid_argument_not_internal(ps: Servers) -> None:
    ps.start(1)
    ps.client().init("j", {"w": np.zeros(3, np.float32)})
    garbage = b"\xff\xff\xff\xff"  # a tag whose varint never ends
    metadata = token_metadata(ps.token)
    with grpc.insecure_channel(ps.addresses[0]) as channel:
        unary = channel.unary_unary("/cellgraph.ParameterService/Register")
        err = status_of(lambda: unary(garbage, timeout=TIMEOUT, metadata=metadata))
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err.details()
        assert "a request of 4 bytes is not a valid cellgraph.RegisterRequest message" in (err.details() or "")
        stream = channel.stream_unary("/cellgraph.ParameterService/Push")
        header = pb.PushMessage(header=pb.PushHeader(replica_id=0, step=0)).SerializeToString()
        err = status_of(lambda: stream(iter([header, garbage]), timeout=TIMEOUT, metadata=metadata))
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err.details()
        assert "a request of 4 bytes is not a valid cellgraph.PushMessage message" in (err.details() or "")
    assert ps.client().stats()[0].pushes_rejected >= 2


# ------------------------------------------------------------------ long names
def test_listed_and_quoted_cut_untrusted_names() -> None:
    assert quoted("w") == "'w'"
    assert quoted("x" * 100_000) == f"'{'x' * 64}'... (100,000 characters)"
    assert listed([f"v{i}" for i in range(10_000)]) == ("'v0', 'v1', 'v2', 'v3', 'v4', 'v5', 'v6', 'v7' and 9,992 more")


def test_ten_thousand_unknown_names_are_not_found_in_a_short_message(ps: Servers) -> None:
    ps.start(1)
    ps.client().init("j", {"w": np.zeros(3, np.float32)})
    names = [f"nope-{i}-{'x' * 4}" for i in range(10_000)]  # ~89 KB of names were repeated in the message
    metadata = token_metadata(ps.token)
    with grpc.insecure_channel(ps.addresses[0]) as channel:
        stub = pb_grpc.ParameterServiceStub(channel)
        err = status_of(lambda: list(stub.Pull(pb.PullRequest(names=names), timeout=TIMEOUT, metadata=metadata)))
    assert err.code() == grpc.StatusCode.NOT_FOUND, err.details()
    details = err.details() or ""
    assert "job 'j': no variable 'nope-0-xxxx', 'nope-1-xxxx'" in details
    assert "and 9,992 more on this shard; it holds 'w'" in details
    assert len(details) < 1000


def test_a_long_variable_name_is_cut_in_the_message(ps: Servers) -> None:
    ps.start(1)
    ps.client().init("j", {"w": np.zeros(2, np.float32)})
    ps.client().register(0)
    name = "n" * 100_000
    chunk = tensor_pb2.TensorChunk(
        name=name, dtype=tensor_pb2.DT_FLOAT32, shape=tensor_pb2.TensorShapeProto(dim=[2]), content=bytes(8)
    )
    messages = [pb.PushMessage(header=pb.PushHeader(replica_id=0, step=0)), pb.PushMessage(chunk=chunk)]
    with grpc.insecure_channel(ps.addresses[0]) as channel:
        stub = pb_grpc.ParameterServiceStub(channel)
        err = status_of(lambda: stub.Push(iter(messages), timeout=TIMEOUT, metadata=token_metadata(ps.token)))
    assert err.code() == grpc.StatusCode.NOT_FOUND, err.details()
    assert f"gradient for unknown variable '{'n' * 64}'... (100,000 characters) in replica 0's push" in (
        err.details() or ""
    )


def test_a_long_job_id_or_checkpoint_name_is_refused(ps: Servers) -> None:
    ps.start(1, checkpoint_dir=ps.tmp_path / "ckpt")
    long_id = pb.InitMessage(config=pb.JobConfig(job_id="j" * 5000, num_shards=1, variables=[spec(2, 4)]))
    err = refused(ps, [long_id, init_chunk()])
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"job id '{'j' * 64}'... (5,000 characters) is longer than 200 characters" in (err.details() or "")
    ps.client().init("j", {"w": np.zeros(2, np.float32)})
    with grpc.insecure_channel(ps.addresses[0]) as channel:
        stub = pb_grpc.ParameterServiceStub(channel)
        request = pb.RestoreRequest(checkpoint="c" * 5000)
        err = status_of(lambda: stub.Restore(request, timeout=TIMEOUT, metadata=token_metadata(ps.token)))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"checkpoint name '{'c' * 64}'... (5,000 characters) is longer than 200 characters" in (err.details() or "")


# ------------------------------------------------------------------ hyperparameters
HYPERPARAMETERS = [
    ("a NaN learning rate", {"learning_rate": float("nan")}, "sgd optimizer: learning_rate must be a finite number, 0 or more, got nan"),
    ("a negative learning rate", {"learning_rate": -0.1}, "sgd optimizer: learning_rate must be a finite number, 0 or more, got -0.1"),
    ("an infinite learning rate", {"learning_rate": float("inf")}, "sgd optimizer: learning_rate must be a finite number, 0 or more, got inf"),
    ("a negative momentum", {"kind": "momentum", "momentum": -0.9}, "momentum optimizer: momentum must be a finite number, 0 or more, got -0.9"),
    ("a NaN epsilon", {"kind": "adam", "epsilon": float("nan")}, "adam optimizer: epsilon must be a finite number, 0 or more, got nan"),
    ("beta1 of 1", {"kind": "adam", "beta1": 1.0}, "adam optimizer: beta1 must be in [0, 1), got 1.0"),
    ("a NaN beta2", {"kind": "adam", "beta2": float("nan")}, "adam optimizer: beta2 must be in [0, 1), got nan"),
]  # fmt: skip


@pytest.mark.parametrize(("what", "fields", "words"), HYPERPARAMETERS, ids=[h[0] for h in HYPERPARAMETERS])
def test_non_finite_or_negative_hyperparameters_are_refused_at_init(
    ps: Servers, what: str, fields: dict[str, Any], words: str
) -> None:
    ps.start(1)
    optimizer = pb.OptimizerConfigProto(kind="sgd", learning_rate=0.1, momentum=0.9, beta1=0.9, beta2=0.999)
    for name, value in fields.items():
        setattr(optimizer, name, value)
    err = refused(ps, [job(optimizer=optimizer), init_chunk()])
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err.details()
    assert words in (err.details() or "")
    # The client refuses the same before sending anything.
    with pytest.raises(ParameterServerError, match=words.replace("(", r"\(").replace("[", r"\[").replace(")", r"\)")):
        OptimizerConfig(**{"kind": "sgd", **fields})


def test_an_unknown_nonfinite_mode_is_refused_at_init(ps: Servers) -> None:
    ps.start(1)
    training = pb.TrainingConfigProto(mode=pb.ASYNC, replicas_to_aggregate=1, nonfinite=7)  # type: ignore[arg-type]
    err = refused(ps, [job(training=training), init_chunk()])
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "nonfinite 7 is not REJECT (0), SKIP_STEP (1) or APPLY (2)" in (err.details() or "")
    with pytest.raises(ParameterServerError, match="nonfinite must be one of 'reject', 'skip_step', 'apply', got 'no'"):
        TrainingConfig(nonfinite="no")  # type: ignore[arg-type]


# ------------------------------------------------------------------ the Init lock
def test_a_stalled_init_does_not_block_the_next_one_past_a_deadline(ps: Servers) -> None:
    ps.start(1, init_wait_s=0.5)
    metadata = token_metadata(ps.token)
    started, release = threading.Event(), threading.Event()

    def stalled() -> Iterator[pb.InitMessage]:
        yield job()
        yield init_chunk(content=bytes(16))
        started.set()
        release.wait(TIMEOUT)  # half the value is sent, then nothing until the test says so
        yield init_chunk(offset=16, content=bytes(16))

    with grpc.insecure_channel(ps.addresses[0]) as channel:
        stub = pb_grpc.ParameterServiceStub(channel)
        first = stub.Init.future(stalled(), timeout=TIMEOUT, metadata=metadata)
        assert started.wait(TIMEOUT)
        err = status_of(lambda: stub.Init(iter([job(), init_chunk()]), timeout=TIMEOUT, metadata=metadata))
        assert err.code() == grpc.StatusCode.DEADLINE_EXCEEDED, err.details()
        assert "waited 0.5 s for another Init (of job 'k', in progress for" in (err.details() or "")
        assert "Init of job 'k' not started: retry once that one has finished or failed" in (err.details() or "")
        release.set()
        assert not first.result(timeout=TIMEOUT).already_initialized
        # The lock is free again: the same Init now finds the job there.
        assert stub.Init(iter([job(), init_chunk()]), timeout=TIMEOUT, metadata=metadata).already_initialized


def test_the_client_reports_the_init_wait_in_its_error(ps: Servers) -> None:
    ps.start(1, init_wait_s=0.0)
    servicer = ps.servicer()
    servicer.shard_init._lock.acquire()  # another Init holds it (as the stalled one above)
    try:
        with pytest.raises(ParameterServerError, match=r"refused Init of job 'j': waited 0 s for another Init"):
            ps.client().init("j", {"w": np.zeros(2, np.float32)})
    finally:
        servicer.shard_init._lock.release()


# ------------------------------------------------------------------ non-finite gradients
W = VariableSpec("w", F32, (2,))
NAN = np.array([np.nan, 1.0], F32)
INF = np.array([np.inf, -np.inf], F32)


def store(mode: str, nonfinite: str, k: int = 2) -> ParameterStore:
    training = TrainingConfig(mode, k if mode == "sync" else 1, nonfinite=nonfinite)  # type: ignore[arg-type]
    made = ParameterStore("j", [W], {"w": np.ones(2, F32)}, OptimizerConfig("sgd", 0.5), training)
    for replica in range(3):
        made.register(replica)
    return made


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize(
    ("grad", "counts"), [(NAN, "1 NaN and 0 Inf of 2 values"), (INF, "0 NaN and 2 Inf of 2 values")]
)
def test_a_non_finite_gradient_is_refused_by_default_and_changes_nothing(
    mode: str, grad: np.ndarray, counts: str
) -> None:
    refusing = store(mode, "reject")
    refusing.push(1, 0, {"w": np.ones(2, F32)})  # sync: a pending gradient the refusal must not disturb
    before = (
        refusing.state(),
        refusing._rules.contributors[:],
        refusing._rules.arithmetic.sums["w"].copy() if refusing._rules.arithmetic.sums else None,
    )
    stats = refusing.stats()
    with pytest.raises(ParameterServerError) as caught:
        refusing.push(0, 0 if mode == "sync" else 1, {"w": grad})
    assert caught.value.code == "INVALID_ARGUMENT"
    step = 0 if mode == "sync" else 1
    assert str(caught.value) == (
        f"replica 0's gradient for 'w' at step {step} holds {counts}; job 'j' refuses non-finite gradients "
        "(nonfinite='reject'; cg.train(..., nonfinite='skip_step') drops such a step instead)"
    )
    after = (
        refusing.state(),
        refusing._rules.contributors[:],
        refusing._rules.arithmetic.sums["w"].copy() if refusing._rules.arithmetic.sums else None,
    )
    assert repr(after) == repr(before)
    new = refusing.stats()
    assert (new.global_step, new.versions, new.pushes_applied, new.updates, new.replicas[0].pushes) == (
        stats.global_step, stats.versions, stats.pushes_applied, stats.updates, stats.replicas[0].pushes,
    )  # fmt: skip
    assert new.pushes_rejected == stats.pushes_rejected + 1


def test_skip_step_in_sync_mode_drops_the_whole_step_and_advances() -> None:
    skipping = store("sync", "skip_step", k=3)
    assert skipping.push(0, 0, {"w": np.ones(2, F32)}).status == "aggregated"
    assert skipping.push(1, 0, {"w": NAN}).status == "aggregated"
    outcome = skipping.push(2, 0, {"w": np.ones(2, F32)})
    assert (outcome.status, outcome.global_step) == ("skipped", 1)
    step, values = skipping.read()
    assert step == 1 and values["w"][0] == 0  # no update: the version stays
    np.testing.assert_array_equal(values["w"][1], np.ones(2, F32))
    stats = skipping.stats()
    assert (stats.steps_skipped, stats.updates, stats.pushes_applied) == (1, 0, 0)
    assert stats.last_skipped == "replica 1's gradient for 'w' at step 0 holds 1 NaN and 0 Inf of 2 values"
    # The next step is an ordinary one: nothing of the skipped one is left in its sum.
    for replica in range(3):
        last = skipping.push(replica, 1, {"w": np.full(2, 2.0, F32)})
    assert last.status == "applied"
    np.testing.assert_array_equal(skipping.read()[1]["w"][1], np.zeros(2, F32))  # 1 - 0.5 * 2


def test_skip_step_when_a_reconfigure_completes_the_step() -> None:
    skipping = store("sync", "skip_step", k=3)
    skipping.push(0, 0, {"w": INF})
    assert skipping.reconfigure(1) == 1
    assert skipping.stats().steps_skipped == 1
    np.testing.assert_array_equal(skipping.read()[1]["w"][1], np.ones(2, F32))


def test_skip_step_in_async_mode_drops_the_push_and_keeps_the_step() -> None:
    skipping = store("async", "skip_step")
    outcome = skipping.push(0, 0, {"w": NAN})
    assert (outcome.status, outcome.global_step) == ("skipped", 0)
    assert skipping.stats().steps_skipped == 1
    assert skipping.push(0, 0, {"w": np.ones(2, F32)}).status == "applied"
    np.testing.assert_array_equal(skipping.read()[1]["w"][1], np.full(2, 0.5, F32))


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_apply_takes_a_non_finite_gradient_as_it_is(mode: str) -> None:
    applying = store(mode, "apply", k=1)
    assert applying.push(0, 0, {"w": NAN}).status == "applied"
    assert np.isnan(applying.read()[1]["w"][1][0])
    assert applying.stats().steps_skipped == 0


def test_skip_step_through_the_server_is_counted_in_stats(ps: Servers) -> None:
    ps.start(1)
    client = ps.client()
    training = TrainingConfig("sync", replicas_to_aggregate=1, nonfinite="skip_step")
    client.init("j", {"w": np.ones(2, F32)}, OptimizerConfig("sgd", 0.5), training)
    info = client.register(0)
    assert info.training.nonfinite == "skip_step"
    pushed, pulled = client.push_pull({"w": NAN}, step=0, replica_id=0, min_step=1)
    assert pushed.status == "skipped" and pushed.by_shard == ("skipped",)
    assert pulled.global_step == 1
    np.testing.assert_array_equal(pulled.values["w"], np.ones(2, F32))
    stats = client.stats()[0]
    assert stats.steps_skipped == 1 and stats.training.nonfinite == pb.NONFINITE_SKIP_STEP
    assert stats.last_skipped == "replica 0's gradient for 'w' at step 0 holds 1 NaN and 0 Inf of 2 values"


# ------------------------------------------------------------------ cg.train
def test_cg_train_refuses_an_unknown_nonfinite_before_anything_starts() -> None:
    from cellgraph.cluster.cluster import Cluster

    class Open(Cluster):
        """Just enough of a cluster for train()'s argument checks (nothing is started)."""

        def __init__(self) -> None:
            self._closed = False

        def training_workers(self) -> list[str]:
            return ["w0", "w1"]

    with pytest.raises(
        TrainingError, match="cg.train: nonfinite must be one of 'reject', 'skip_step', 'apply', got 'ignore'"
    ):
        train(None, (), cluster=Open(), nonfinite="ignore")  # type: ignore[arg-type]


@pytest.mark.parametrize(("asked", "chunks"), [(1, 16), (255, 16), (512, 8), (0, 1)])
def test_a_pull_asking_for_tiny_chunks_gets_chunks_of_at_least_256_bytes(ps: Servers, asked: int, chunks: int) -> None:
    """At 1 byte a chunk, a 256 KiB variable held the server 48 s and sent 21 times its bytes (measured)."""
    ps.start(1)
    w = np.arange(1024, dtype=np.float32)  # 4 KiB
    ps.client().init("j", {"w": w})
    with grpc.insecure_channel(ps.addresses[0]) as channel:
        stub = pb_grpc.ParameterServiceStub(channel)
        request = pb.PullRequest(max_chunk_bytes=asked)
        got = list(stub.Pull(request, timeout=TIMEOUT, metadata=token_metadata(ps.token)))
    assert len(got) == chunks
    assert b"".join(m.chunk.content for m in got) == w.tobytes()
