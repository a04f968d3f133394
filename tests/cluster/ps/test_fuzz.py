"""Thousands of malformed requests, then the server still answers and its state is intact."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cellgraph.cluster.ps import OptimizerConfig, TrainingConfig
from cellgraph.cluster.ps.auth import token_metadata
from cellgraph.protos import parameter_service_pb2 as pb
from cellgraph.protos import parameter_service_pb2_grpc as pb_grpc
from cellgraph.protos import tensor_pb2

from .conftest import Servers

CALL_TIMEOUT = 5.0
# What a refusal may be. UNKNOWN (an exception the servicer did not expect) and INTERNAL
# (the server's fault) never are: bytes that are no message at all are INVALID_ARGUMENT too.
REFUSALS = {
    "INVALID_ARGUMENT",
    "NOT_FOUND",
    "FAILED_PRECONDITION",
    "ALREADY_EXISTS",
    "RESOURCE_EXHAUSTED",
    "DEADLINE_EXCEEDED",
}

names = st.sampled_from(["w", "b", "x", "", "w/m"])
chunks = st.builds(
    tensor_pb2.TensorChunk,
    name=names,
    dtype=st.integers(-1, 7),
    shape=st.builds(tensor_pb2.TensorShapeProto, dim=st.lists(st.integers(-2, 5), max_size=3)),
    offset=st.integers(-64, 96),
    content=st.binary(max_size=48),
)
headers = st.builds(pb.PushHeader, replica_id=st.integers(-2, 4), step=st.integers(-3, 4))
push_messages = st.lists(
    st.one_of(st.builds(pb.PushMessage, header=headers), st.builds(pb.PushMessage, chunk=chunks)), max_size=6
)
specs = st.builds(
    pb.VariableSpecProto,
    name=names,
    dtype=st.integers(-1, 7),
    shape=st.builds(tensor_pb2.TensorShapeProto, dim=st.lists(st.integers(-2, 1 << 40), max_size=3)),
    row_start=st.integers(-2, 5),
    row_stop=st.integers(-2, 5),
)
configs = st.builds(
    pb.JobConfig,
    job_id=st.sampled_from(["fuzz", "other", ""]),
    shard=st.integers(-1, 2),
    num_shards=st.integers(-1, 2),
    variables=st.lists(specs, max_size=3),
    optimizer=st.builds(pb.OptimizerConfigProto, kind=st.sampled_from(["sgd", "adam", "nope", ""])),
    training=st.builds(pb.TrainingConfigProto, mode=st.integers(0, 3), replicas_to_aggregate=st.integers(-1, 3)),
)
init_messages = st.lists(
    st.one_of(st.builds(pb.InitMessage, config=configs), st.builds(pb.InitMessage, chunk=chunks)), max_size=4
)
pulls = st.builds(
    pb.PullRequest,
    names=st.lists(names, max_size=3),
    replica_id=st.integers(-2, 4),
    max_chunk_bytes=st.integers(-5, 64),
)
step_messages = st.lists(
    st.builds(
        pb.StepRequest,
        header=st.one_of(st.none(), headers),
        chunks=st.lists(chunks, max_size=3),
        more=st.booleans(),
        pull=st.one_of(st.none(), pulls),
        wait_s=st.sampled_from([0.05, -1.0, float("nan")]),
    ),
    max_size=4,
)
requests = st.one_of(
    st.tuples(st.just("Push"), push_messages),
    st.tuples(st.just("Step"), step_messages),
    st.tuples(st.just("Init"), init_messages),
    st.tuples(st.just("Pull"), pulls),
    st.tuples(st.just("Register"), st.builds(pb.RegisterRequest, replica_id=st.integers(-3, 4))),
    st.tuples(st.just("Restore"), st.builds(pb.RestoreRequest, checkpoint=st.text(max_size=20))),
    st.tuples(st.just("Garbage"), st.binary(min_size=1, max_size=64)),
)


def send(
    channel: grpc.Channel,
    stub: pb_grpc.ParameterServiceStub,
    metadata: Any,
    kind: str,
    payload: Any,
    applied: Counter[str],
) -> str:
    """Send one request; return "OK" or the status name. Pushes a Step stream applied are counted in ``applied``."""

    def step() -> None:
        for answer in stub.Step(iter(payload), timeout=CALL_TIMEOUT, metadata=metadata):
            if answer.HasField("push") and answer.push.status == pb.PushResponse.APPLIED:
                applied["Step"] += 1

    calls = {
        "Step": step,
        "Push": lambda: stub.Push(iter(payload), timeout=CALL_TIMEOUT, metadata=metadata),
        "Init": lambda: stub.Init(iter(payload), timeout=CALL_TIMEOUT, metadata=metadata),
        "Pull": lambda: list(stub.Pull(payload, timeout=CALL_TIMEOUT, metadata=metadata)),
        "Register": lambda: stub.Register(payload, timeout=CALL_TIMEOUT, metadata=metadata),
        "Restore": lambda: stub.Restore(payload, timeout=CALL_TIMEOUT, metadata=metadata),
        "Garbage": lambda: channel.unary_unary("/cellgraph.ParameterService/Register")(
            payload, timeout=CALL_TIMEOUT, metadata=metadata
        ),
    }
    try:
        calls[kind]()
    except grpc.RpcError as err:
        return err.code().name  # type: ignore[no-any-return, attr-defined]
    return "OK"


@pytest.fixture
def fuzz_target(ps: Servers) -> Iterator[tuple[Servers, grpc.Channel]]:
    ps.start(1, checkpoint_dir=ps.tmp_path / "ckpt")
    client = ps.client()
    # lr = 0: a push that happens to be well-formed bumps versions but leaves values alone.
    values = {"w": np.arange(8, dtype=np.float32).reshape(2, 4), "b": np.ones(3)}
    client.init("fuzz", values, OptimizerConfig("sgd", 0.0), TrainingConfig("async"))
    client.register(0)
    with grpc.insecure_channel(ps.addresses[0]) as channel:
        yield ps, channel


@pytest.mark.slow
def test_malformed_requests_leave_the_server_answering_and_intact(fuzz_target: tuple[Servers, grpc.Channel]) -> None:
    ps, channel = fuzz_target
    stub = pb_grpc.ParameterServiceStub(channel)
    metadata = token_metadata(ps.token)
    before = ps.client().pull()
    outcomes: Counter[tuple[str, str]] = Counter()
    step_pushes: Counter[str] = Counter()

    @settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(st.lists(requests, min_size=1, max_size=8))
    def fuzz(batch: list[tuple[str, Any]]) -> None:
        for kind, payload in batch:
            status = send(channel, stub, metadata, kind, payload, step_pushes)
            outcomes[kind, status] += 1
            assert status == "OK" or status in REFUSALS, (
                kind,
                status,
                payload,
            )

    fuzz()
    sent = sum(outcomes.values())
    assert sent >= 1000, outcomes
    stats = ps.client().stats()[0]  # still answers
    assert stats.job_id == "fuzz"
    after = ps.client().pull()
    for name, value in before.values.items():
        np.testing.assert_array_equal(after.values[name], value)
    # Only well-formed pushes (if the fuzzer found any) were applied, each exactly once.
    applied = outcomes["Push", "OK"] + step_pushes["Step"]
    assert stats.pushes_applied == applied and after.global_step == applied
    assert all(v.version == applied for v in stats.variables)
