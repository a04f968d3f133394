"""Fused chunks (cluster/ps/fused.py): a step's small tensors of one dtype travel as one chunk.

What must hold: a fused step trains exactly as tensor-by-tensor chunks do (checked against NumPy's own
arithmetic), the wire really carries fused chunks, and a fused chunk that is wrong anywhere is refused with
words that say what is wrong, changing nothing on the server.
"""

from __future__ import annotations

import re

import grpc
import numpy as np
import pytest

from cellgraph.cluster.errors import ParameterServerError
from cellgraph.cluster.ps import OptimizerConfig, TrainingConfig, VariableSpec, fused, streaming
from cellgraph.cluster.ps.auth import token_metadata
from cellgraph.cluster.ps.chunks import TensorAssembler
from cellgraph.cluster.ps.frames import Framed
from cellgraph.cluster.ps.held import ShardReceiver
from cellgraph.cluster.ps.step_requests import step_frames
from cellgraph.cluster.ps.step_server import _answer_frames
from cellgraph.protos import parameter_service_pb2 as pb
from cellgraph.protos import parameter_service_pb2_grpc as pb_grpc
from cellgraph.protos import tensor_pb2

from .conftest import TIMEOUT, Servers, status_of

F32, F64 = np.dtype(np.float32), np.dtype(np.float64)
BIG = fused.FUSE_TENSOR_BYTES // 4 + 1  # float32 elements of a tensor too big to fuse


def model(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Small tensors of two dtypes (a scalar among them), an empty one and one too big to fuse."""
    return {
        "conv/w": rng.standard_normal((3, 3, 2, 4)).astype(F32),
        "conv/b": rng.standard_normal(4).astype(F32),
        "bn/scale": rng.standard_normal(()).astype(F32),
        "dense/w": rng.standard_normal((5, 3)),  # float64
        "dense/b": rng.standard_normal(3),
        "empty": np.zeros((0, 2), F32),
        "big": rng.standard_normal(BIG).astype(F32),
    }


def test_a_fused_step_trains_exactly_as_numpy_computes_it(ps: Servers) -> None:
    ps.start(2)  # variables on both shards: each shard's share is fused on its own
    client = ps.client()
    rng = np.random.default_rng(0)
    values = model(rng)
    lr = 0.25
    client.init("fused", values, OptimizerConfig("sgd", lr), TrainingConfig("sync", replicas_to_aggregate=2))
    for rid in (0, 1):
        client.register(rid)
    expected = {name: value.copy() for name, value in values.items()}
    for step in range(3):
        grads = [{n: rng.standard_normal(v.shape).astype(v.dtype) for n, v in values.items()} for _ in (0, 1)]
        client.push(grads[0], step=step, replica_id=0)
        pushed, pulled = client.push_pull(grads[1], step=step, replica_id=1, min_step=step + 1)
        assert pushed.status == "applied"
        for name in values:
            mean = (grads[0][name] + grads[1][name]) / expected[name].dtype.type(2)
            expected[name] = expected[name] - expected[name].dtype.type(lr) * mean
            np.testing.assert_allclose(pulled.values[name], expected[name], rtol=1e-6, atol=1e-6)
            assert pulled.values[name].dtype == values[name].dtype
        assert set(pulled.versions.values()) == {step + 1}


def test_a_streamed_step_fuses_its_small_gradients_and_pulls_fused_values(ps: Servers) -> None:
    ps.start(1)
    client = ps.client()
    rng = np.random.default_rng(1)
    values = model(rng)
    client.init("streamed", values, OptimizerConfig("sgd", 1.0))
    client.register(0)
    grads = {n: np.ones_like(v) for n, v in values.items()}
    step = client.start_step(step=0, replica_id=0)
    for name, grad in reversed(list(grads.items())):  # backprop order
        step.push(name, grad)
    result = step.finish()
    assert result.pushed.status == "applied"
    for name, value in values.items():
        np.testing.assert_array_equal(result.pulled.values[name], value - 1)


def test_the_wire_carries_the_small_tensors_of_each_dtype_fused_and_the_others_alone() -> None:
    values = model(np.random.default_rng(2))
    pieces = [(VariableSpec(n, v.dtype, v.shape), v) for n, v in values.items()]
    [frame] = step_frames(pieces, pb.PushHeader(replica_id=0, step=0), None, 1.0, 1 << 22)
    chunks = pb.StepRequest.FromString(frame).chunks
    groups = sorted(tuple(c.members) or (c.name,) for c in chunks)
    assert groups == [("big",), ("conv/w", "conv/b", "bn/scale"), ("dense/w", "dense/b"), ("empty",)]
    f32 = next(c for c in chunks if "conv/b" in c.members)
    assert f32.content == b"".join(values[n].tobytes() for n in f32.members)

    # The server's answer groups by dtype and by version (a message carries one version).
    answer = {n: (3, v) for n, v in values.items()} | {"conv/b": (2, values["conv/b"])}
    [frame] = _answer_frames(None, 7, answer, 1 << 22, fuse=True)
    sent = sorted(
        (m.version, tuple(m.chunk.members) or (m.chunk.name,)) for m in pb.StepResponse.FromString(frame).values
    )
    assert sent == [
        (2, ("conv/b",)),
        (3, ("big",)),
        (3, ("conv/w", "bn/scale")),
        (3, ("dense/w", "dense/b")),
        (3, ("empty",)),
    ]
    # Without fuse (a request that did not ask for it), one chunk per value, as before.
    [frame] = _answer_frames(None, 7, answer, 1 << 22)
    assert [m.chunk.name for m in pb.StepResponse.FromString(frame).values] == list(values)


def test_a_nonfinite_gradient_in_a_fused_chunk_is_refused_naming_its_variable(ps: Servers) -> None:
    ps.start(1)
    client = ps.client()
    values = {"a": np.zeros(4, F32), "b": np.zeros(3, F32)}
    client.init("nan", values, OptimizerConfig("sgd", 1.0))
    client.register(0)
    with pytest.raises(ParameterServerError, match="gradient for 'b' at step 0 holds 1 NaN") as err:
        client.push({"a": np.ones(4, F32), "b": np.array([0, np.nan, 0], F32)}, step=0, replica_id=0)
    assert err.value.code == "INVALID_ARGUMENT"
    pulled = client.pull()
    assert pulled.global_step == 0
    np.testing.assert_array_equal(pulled.values["a"], values["a"])


def _fused_chunk(
    members: list[str], content: bytes, dtype: int = tensor_pb2.DT_FLOAT32, offset: int = 0
) -> tensor_pb2.TensorChunk:
    return tensor_pb2.TensorChunk(members=members, dtype=dtype, offset=offset, content=content)  # type: ignore[arg-type]


F4 = np.ones(4, F32).tobytes()
F3 = np.ones(3, F32).tobytes()


@pytest.mark.parametrize(
    ("chunks", "code", "words"),
    [
        (
            [_fused_chunk(["a", "b"], F4 + F3 + b"\0\0\0\0")],
            grpc.StatusCode.INVALID_ARGUMENT,
            "the fused chunk of 'a', 'b' in replica 0's push for step 0 carries 32 bytes; its members are 28 bytes together",
        ),
        (
            [_fused_chunk(["a", "zz"], F4 + F3)],
            grpc.StatusCode.NOT_FOUND,
            "the fused chunk of 'a', 'zz' in replica 0's push for step 0 names 'zz', which was not expected here",
        ),
        (
            [_fused_chunk(["a", "a"], F4 + F4)],
            grpc.StatusCode.INVALID_ARGUMENT,
            "the fused chunk of 'a', 'a' in replica 0's push for step 0 carries 'a' a second time",
        ),
        (
            [
                tensor_pb2.TensorChunk(name="b", dtype=tensor_pb2.DT_FLOAT32, shape={"dim": [3]}, content=F3),
                _fused_chunk(["a", "b"], F4 + F3),
            ],
            grpc.StatusCode.INVALID_ARGUMENT,
            "carries 'b' a second time",
        ),
        (
            [_fused_chunk(["a", "b"], np.ones(7).tobytes(), dtype=tensor_pb2.DT_FLOAT64)],
            grpc.StatusCode.INVALID_ARGUMENT,
            "the fused chunk of 'a', 'b' in replica 0's push for step 0 is float64, but 'a' is float32",
        ),
        (
            [_fused_chunk(["a", "b"], F4 + F3, offset=8)],
            grpc.StatusCode.INVALID_ARGUMENT,
            "the fused chunk of 'a', 'b' in replica 0's push for step 0 has offset 8; a fused chunk is whole, at offset 0",
        ),
        (
            [
                _fused_chunk(["a", "b"], F4 + F3),
                tensor_pb2.TensorChunk(name="b", dtype=tensor_pb2.DT_FLOAT32, shape={"dim": [3]}, content=F3),
            ],
            grpc.StatusCode.INVALID_ARGUMENT,
            "gradient for 'b' arrived a second time",
        ),
    ],
    ids=["size", "unknown", "repeated", "received-already", "dtype", "offset", "plain-after-fused"],
)
def test_a_wrong_fused_chunk_is_refused_saying_why_and_changes_nothing(
    ps: Servers, chunks: list[tensor_pb2.TensorChunk], code: grpc.StatusCode, words: str
) -> None:
    [address] = ps.start(1)
    client = ps.client()
    values = {"a": np.zeros(4, F32), "b": np.zeros(3, F32)}
    client.init("bad-fused", values, OptimizerConfig("sgd", 1.0))
    client.register(0)
    request = pb.StepRequest(header=pb.PushHeader(replica_id=0, step=0), chunks=chunks, pull=pb.PullRequest())
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.ParameterServiceStub(channel)
        err = status_of(lambda: list(stub.Step(iter([request]), timeout=TIMEOUT, metadata=token_metadata(ps.token))))
    assert err.code() == code
    assert words in (err.details() or "")
    pulled = client.pull()
    assert pulled.global_step == 0
    for name, value in values.items():
        np.testing.assert_array_equal(pulled.values[name], value)
    # The server still takes a good step.
    assert client.push({"a": np.ones(4, F32), "b": np.ones(3, F32)}, step=0, replica_id=0).status == "applied"


def test_a_client_refuses_a_fused_answer_that_does_not_fit_what_it_asked_for() -> None:
    spec = VariableSpec("a", F32, (4,))
    receiver = ShardReceiver(0, {"a": TensorAssembler(spec, out=np.zeros(4, F32))})
    value = pb.PullMessage(chunk=_fused_chunk(["a", "x"], F4 + F4), global_step=1, version=1)
    with pytest.raises(ParameterServerError, match="the fused chunk of 'a', 'x' in shard 0's answer names 'x'"):
        receiver.add(Framed(value, [memoryview(value.chunk.content)]), [value])


def test_a_fused_chunk_over_the_servers_chunk_limit_is_refused_saying_so(ps: Servers) -> None:
    [address] = ps.start(1, max_chunk_bytes=16)
    client = ps.client()
    values = {"a": np.zeros(4, F32), "b": np.zeros(3, F32)}
    client.init("big-fused", values, OptimizerConfig("sgd", 1.0))
    client.register(0)
    request = pb.StepRequest(
        header=pb.PushHeader(replica_id=0, step=0), chunks=[_fused_chunk(["a", "b"], F4 + F3)], pull=pb.PullRequest()
    )
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.ParameterServiceStub(channel)
        err = status_of(lambda: list(stub.Step(iter([request]), timeout=TIMEOUT, metadata=token_metadata(ps.token))))
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert (
        "a chunk of fused gradients in replica 0's push for step 0 carries 28 bytes, over this server's limit of 16"
        in (err.details() or "")
    )
    assert client.pull().global_step == 0


def test_an_assembler_takes_a_whole_tensor_once() -> None:
    spec = VariableSpec("a", F32, (4,))
    assembler = TensorAssembler(spec, "gradient for 'a'")
    assembler.add_whole(np.arange(4, dtype=F32))
    np.testing.assert_array_equal(assembler.finish(), np.arange(4, dtype=F32))
    with pytest.raises(ParameterServerError, match="gradient for 'a' arrived a second time"):
        assembler.add_whole(np.arange(4, dtype=F32))


def test_small_values_asked_for_before_a_big_one_are_sent_before_it() -> None:
    small, big = np.ones(4, F32), np.ones(BIG, F32)
    answer = {"l1/b": (1, small), "l1/w": (1, big), "l2/b": (1, small), "l2/scale": (1, small), "l2/w": (1, big)}
    [frame] = _answer_frames(None, 1, answer, 1 << 22, fuse=True)
    sent = [tuple(m.chunk.members) or (m.chunk.name,) for m in pb.StepResponse.FromString(frame).values]
    assert sent == [("l1/b",), ("l1/w",), ("l2/b", "l2/scale"), ("l2/w",)]
    pieces = [(VariableSpec(n, v.dtype, v.shape), v) for n, (_, v) in answer.items()]
    [frame] = step_frames(pieces, pb.PushHeader(replica_id=0, step=0), None, 1.0, 1 << 22)
    pushed = [tuple(c.members) or (c.name,) for c in pb.StepRequest.FromString(frame).chunks]
    assert pushed == sent


def test_a_streamed_step_sends_the_small_gradients_before_a_big_one_ahead_of_it(
    ps: Servers, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(streaming, "FLUSH_BYTES", 8 * BIG * F32.itemsize)  # nothing leaves before the last push
    ps.start(1)
    client = ps.client()
    values = {"a": np.zeros(4, F32), "big": np.zeros(BIG, F32), "c": np.zeros(3, F32)}
    client.init("streamed-order", values, OptimizerConfig("sgd", 1.0))
    client.register(0)
    step = client.start_step(step=0, replica_id=0)
    for name, value in values.items():
        step.push(name, np.ones_like(value))
    [send] = step.shards.values()
    queued = [tuple(c.members) or (c.name,) for c in pb.StepRequest.FromString(b"".join(send.parts)).chunks]
    assert queued == [("a",), ("big",)]  # "c" waits for the message's flush, to be fused with what follows
    result = step.finish()
    for name, value in values.items():
        np.testing.assert_array_equal(result.pulled.values[name], value - 1)


def test_a_kept_layout_still_checks_what_changes_from_chunk_to_chunk() -> None:
    # A receiver keeps each member list's layout once checked against its specs; what a chunk may get wrong on
    # its own (its length, its offset, a member received already) is checked every time.
    specs = {"a": VariableSpec("a", F32, (4,)), "b": VariableSpec("b", F32, (3,))}
    layouts: dict = {}
    good = _fused_chunk(["a", "b"], F4 + F3)
    members = fused.members(*fused.checked(good, memoryview(good.content), specs.get, "push", layouts=layouts))
    assert [name for name, _ in members] == ["a", "b"] and list(layouts) == [(("a", "b"), tensor_pb2.DT_FLOAT32)]
    cases = [
        (_fused_chunk(["a", "b"], F4 + F3 + F4), lambda name: False, "carries 44 bytes; its members are 28 bytes"),
        (_fused_chunk(["a", "b"], F4 + F3), lambda name: name == "b", "carries 'b' a second time"),
        (_fused_chunk(["a", "b"], F4 + F3, offset=4), lambda name: False, "has offset 4; a fused chunk is whole"),
    ]
    for chunk, received, words in cases:
        with pytest.raises(ParameterServerError, match=re.escape(words)):
            fused.checked(chunk, memoryview(chunk.content), specs.get, "push", received, layouts)
    many = {f"v{i}": VariableSpec(f"v{i}", F32, (1,)) for i in range(fused.LAYOUTS_KEPT + 10)}
    for i in range(1, fused.LAYOUTS_KEPT + 10):  # a sender that varies its groups does not grow the receiver
        chunk = _fused_chunk(["v0", f"v{i}"], np.ones(2, F32).tobytes())
        fused.checked(chunk, memoryview(chunk.content), many.get, "push", layouts=layouts)
    assert len(layouts) == fused.LAYOUTS_KEPT
