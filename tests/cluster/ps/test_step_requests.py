"""A step's frames from a kept recipe: protobuf reads them as the step's own message, every gradient's values
in place, whatever the mix of dtypes, sizes, byte orders and layouts, and a kept recipe never carries one
step's values into the next."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from cellgraph.cluster.ps import fused
from cellgraph.cluster.ps.chunks import dtype_of
from cellgraph.cluster.ps.config import VariableSpec
from cellgraph.cluster.ps.step_requests import ONE_MESSAGE_BYTES, step_frames, step_recipe
from cellgraph.protos import parameter_service_pb2 as pb


def _pieces(arrays: dict[str, np.ndarray]) -> list[tuple[VariableSpec, np.ndarray]]:
    return [(VariableSpec(name, a.dtype.newbyteorder("="), a.shape), a) for name, a in arrays.items()]


def _received(
    frames: list[bytes], expected: dict[str, np.ndarray]
) -> tuple[dict[str, np.ndarray], list[pb.StepRequest]]:
    """Each gradient as a receiver rebuilds it from the parsed messages (fused members split by the sizes of
    ``expected``'s arrays, chunks joined)."""
    messages = [pb.StepRequest.FromString(frame) for frame in frames]
    parts: dict[str, list[tuple[int, bytes, np.dtype, tuple[int, ...]]]] = {}
    for message in messages:
        for chunk in message.chunks:
            dtype = dtype_of(chunk.dtype, "test")
            if chunk.members:
                flat = np.frombuffer(chunk.content, dtype)
                at = 0
                for name in chunk.members:
                    count = expected[name].size
                    parts.setdefault(name, []).append((0, flat[at : at + count].tobytes(), dtype, expected[name].shape))
                    at += count
                assert at == flat.size
                continue
            parts.setdefault(chunk.name, []).append((chunk.offset, chunk.content, dtype, tuple(chunk.shape.dim)))
    out = {}
    for name, pieces in parts.items():
        pieces.sort(key=lambda p: p[0])
        data = b"".join(p[1] for p in pieces)
        out[name] = np.frombuffer(data, pieces[0][2]).reshape(pieces[0][3])
    return out, messages


@pytest.mark.parametrize("max_chunk", [1 << 20, 1000])
def test_frames_carry_every_gradient_whatever_the_mix(max_chunk: int) -> None:
    rng = np.random.default_rng(0)
    arrays = {
        "bias": rng.normal(size=7).astype(np.float32),
        "kernel": rng.normal(size=(40, 30)).astype(np.float32),  # 4,800 bytes: cut into chunks at 1000
        "steps": np.arange(5, dtype=np.int64),
        "empty": np.zeros((0, 3), np.float32),
        "scale": rng.normal(size=(2, 2)).astype(np.float64),
        "big_endian": rng.normal(size=3).astype(">f4"),
        "strided": rng.normal(size=(6, 4)).astype(np.float32)[:, ::2],  # not C-contiguous
        "gamma": rng.normal(size=3).astype(np.float32),
        "half": rng.normal(size=4).astype(np.float16),
        "brain": rng.normal(size=4).astype(ml_dtypes.bfloat16),  # a plug-in dtype: no buffer format of its own
    }
    header = pb.PushHeader(replica_id=2, step=9)
    for _step in range(2):  # the second step reuses the recipe with new values
        frames = list(step_frames(_pieces(arrays), header, pb.PullRequest(names=["bias"]), 1.5, max_chunk, "x"))
        got, messages = _received(frames, arrays)
        assert sorted(got) == sorted(arrays)
        for name, array in arrays.items():
            np.testing.assert_array_equal(got[name], array, err_msg=name)
            assert got[name].dtype == array.dtype.newbyteorder("=")
        assert [m.more for m in messages] == [False]
        assert messages[0].header.step == 9 and messages[0].wait_s == 1.5 and messages[0].nonfinite == "x"
        arrays = {name: (a + 1 if a.dtype.kind in "fV" else a * 3).astype(a.dtype) for name, a in arrays.items()}


def test_a_push_over_one_message_goes_in_several_with_the_header_first_and_the_pull_last() -> None:
    big = np.arange(ONE_MESSAGE_BYTES // 4 + 1000, dtype=np.float32)
    small = np.ones(3, np.float32)
    pieces = _pieces({"small": small, "big": big})
    frames = list(step_frames(pieces, pb.PushHeader(replica_id=0, step=1), pb.PullRequest(names=["big"]), 1.0, 1 << 20))
    got, messages = _received(frames, {"small": small, "big": big})
    assert len(messages) > 1
    assert [m.more for m in messages] == [True] * (len(messages) - 1) + [False]
    assert [m.HasField("header") for m in messages] == [True] + [False] * (len(messages) - 1)
    assert [m.HasField("pull") for m in messages] == [False] * (len(messages) - 1) + [True]
    assert all(len(frame) <= ONE_MESSAGE_BYTES + 1024 for frame in frames)
    np.testing.assert_array_equal(got["big"], big)
    np.testing.assert_array_equal(got["small"], small)
    assert len(step_recipe(fused.entries(pieces), 1 << 20)) == len(messages)


def test_a_pull_alone_is_one_message_without_chunks() -> None:
    [frame] = step_frames([], None, pb.PullRequest(names=["w"], min_step=4), 2.0, 1 << 20)
    message = pb.StepRequest.FromString(frame)
    assert not message.HasField("header") and not message.chunks and not message.more
    assert list(message.pull.names) == ["w"] and message.pull.min_step == 4 and message.wait_s == 2.0


def test_varints_are_protobufs_own_on_both_sides_of_the_one_byte_table() -> None:
    from google.protobuf.internal.encoder import _VarintBytes  # protobuf's own encoder, the reference

    from cellgraph.cluster.ps.frames import parts_size, varint

    for n in [0, 1, 0x7F, 0x80, 300, 2**21, 2**35, 2**63 - 1]:
        assert varint(n) == _VarintBytes(n), n
    with pytest.raises(ValueError):
        varint(-1)  # not a length or a tag: refused, never a byte from the table
    assert parts_size([b"abc", memoryview(np.zeros(5, np.float32)).cast("B")]) == 3 + 20


def test_results_of_no_shard_at_all_are_refused_in_words() -> None:
    from cellgraph.cluster.ps.held import PullPlan
    from cellgraph.cluster.ps.results import push_result
    from cellgraph.cluster.ps.step_parts import pull_result

    with pytest.raises(ValueError, match="push_result needs at least one shard's answer"):
        push_result({})
    plan = PullPlan({"w": [(0, VariableSpec("w", np.dtype("float32"), (2,)))]}, ["w"], 0, 1 << 20)
    with pytest.raises(ValueError, match="pull_result needs at least one shard's answer"):
        pull_result(plan, {})
