"""A gradient bigger than a chunk is updated from its chunks as they lie (cluster/ps/pieces.py), with no copy.

What must hold: training from pieces moves every variable bit for bit as training from whole arrays does,
for every optimizer the registry has, in sync and async mode, moving statistics included; the server really
keeps the received bytes (no copy); a chunk that does not hold whole values falls back to one array; a NaN
in any piece is refused, naming the variable, and changes nothing.
"""

from __future__ import annotations

import numpy as np
import pytest

from cellgraph.cluster.errors import ParameterServerError
from cellgraph.cluster.ps import OptimizerConfig, TrainingConfig, VariableSpec
from cellgraph.cluster.ps.chunks import KEEP_PIECE_BYTES, TensorAssembler, tensor_chunks
from cellgraph.cluster.ps.pieces import Pieced, add_in_parts, parts, update_in_parts
from cellgraph.cluster.ps.updates import step_update
from cellgraph.dataflow.optimizer_registry import kinds

from .conftest import Servers

F32 = np.dtype(np.float32)
SMALL_CHUNK = (
    KEEP_PIECE_BYTES  # bytes of content per chunk (the smallest kept as it lies): each tensor below in several
)


def model(rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {
        "w": rng.standard_normal((300, 200)).astype(F32),  # 240,000 bytes: 4 chunks, the last one short
        "v": rng.standard_normal(20_000),  # float64: 160,000 bytes in 3
        "bn/mean": rng.standard_normal(50_000).astype(F32),  # a moving statistic, in 4
    }


def train(ps: Servers, kind: str, mode: str, max_chunk_bytes: int, job: str) -> dict[str, np.ndarray]:
    """Three steps of two replicas' gradients (sync: aggregated; async: one after the other) on a server of
    its own; the values."""
    rng = np.random.default_rng(7)
    values = model(rng)
    client = ps.client(ps.start(1), max_chunk_bytes=max_chunk_bytes)
    training = TrainingConfig(mode, replicas_to_aggregate=2) if mode == "sync" else TrainingConfig("async")
    client.init(job, values, OptimizerConfig(kind, learning_rate=0.05), training, moving={"bn/mean": 0.9})
    for rid in (0, 1):
        client.register(rid)
    for step in range(3):
        for rid in (0, 1):
            grads = {n: rng.standard_normal(v.shape).astype(v.dtype) for n, v in values.items()}
            client.push(grads, step=step if mode == "sync" else client.pull().global_step, replica_id=rid)
    result = client.pull()
    assert result.global_step == 3 if mode == "sync" else 6
    client.close()
    return result.values


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("kind", kinds())
def test_training_from_pieces_is_bit_for_bit_training_from_whole_arrays(ps: Servers, kind: str, mode: str) -> None:
    whole = train(ps, kind, mode, 1 << 20, f"whole-{kind}-{mode}")
    pieced = train(ps, kind, mode, SMALL_CHUNK, f"pieced-{kind}-{mode}")
    for name, value in whole.items():
        np.testing.assert_array_equal(pieced[name], value, err_msg=name)


def test_the_server_updates_from_the_received_bytes_without_a_copy() -> None:
    w = np.arange(100_000, dtype=F32)
    chunks = list(tensor_chunks("w", w, max_bytes=SMALL_CHUNK))
    contents = [memoryview(c.content) for c in chunks]
    assembler = TensorAssembler(VariableSpec("w", F32, w.shape), adopt=True, pieces=True)
    for chunk, content in zip(chunks, contents):
        assembler.add(chunk, content)
    grad = assembler.gradient()
    assert isinstance(grad, Pieced) and len(grad.pieces) == len(chunks) == 7
    for piece, content in zip(grad.pieces, contents):
        assert np.shares_memory(piece, np.frombuffer(content, np.uint8))
    np.testing.assert_array_equal(grad.whole(), w)
    np.testing.assert_array_equal(assembler.finish(), w)  # a reader that needs one array gets one


def test_a_chunk_that_splits_a_value_makes_one_array_of_every_piece_so_far() -> None:
    w = np.arange(10, dtype=F32)
    raw = w.tobytes()
    spec = VariableSpec("w", F32, w.shape)
    assembler = TensorAssembler(spec, adopt=True, pieces=True)
    for start, stop in ((0, 8), (8, 18), (18, 40)):  # the second chunk ends inside a float
        [chunk] = tensor_chunks("w", w[:0], max_bytes=64)
        chunk.offset, chunk.content = start, raw[start:stop]
        chunk.shape.dim[:] = [10]
        assembler.add(chunk)
    grad = assembler.gradient()
    assert isinstance(grad, np.ndarray)
    np.testing.assert_array_equal(grad, w)


def test_small_chunks_but_the_last_are_copied_into_one_array() -> None:
    """A big tensor in tiny chunks must not cost a Python object and a message per chunk: the first small
    chunk that is not the last makes one array, with what was kept so far copied in."""
    w = np.arange(3 * KEEP_PIECE_BYTES // 4, dtype=F32)  # three pieces' worth
    spec = VariableSpec("w", F32, w.shape)
    assembler = TensorAssembler(spec, adopt=True, pieces=True)
    assembler.add(next(tensor_chunks("w", w, max_bytes=KEEP_PIECE_BYTES)))  # the first third, kept as it lies
    tiny = list(tensor_chunks("w", w, max_bytes=1024))
    for chunk in tiny[len(tiny) // 3 :]:  # the rest in 1 KB chunks
        assembler.add(chunk)
    grad = assembler.gradient()
    assert isinstance(grad, np.ndarray) and grad.flags.writeable  # one array of its own
    np.testing.assert_array_equal(grad, w)
    last = TensorAssembler(spec, adopt=True, pieces=True)  # a short last chunk is kept like the others
    for chunk in tensor_chunks("w", w, max_bytes=KEEP_PIECE_BYTES + 4096):
        last.add(chunk)
    kept = last.gradient()
    assert isinstance(kept, Pieced) and kept.pieces[-1].nbytes < KEEP_PIECE_BYTES
    np.testing.assert_array_equal(kept.whole(), w)


def test_update_in_parts_counts_a_per_variable_slot_once() -> None:
    rng = np.random.default_rng(3)
    var, grad = rng.standard_normal(12).astype(F32), rng.standard_normal(12).astype(F32)
    slots = {"m": np.zeros(12, F32), "v": np.zeros(12, F32), "t": np.array(4.0)}
    whole_var, whole_slots = var.copy(), {k: s.copy() for k, s in slots.items()}
    update = step_update(OptimizerConfig("adam", learning_rate=0.1), 0)
    update(whole_var, whole_slots, grad)
    update_in_parts(update, var, slots, Pieced((12,), F32, [grad[:5], grad[5:9], grad[9:]]))
    assert float(slots["t"]) == 5.0
    np.testing.assert_array_equal(var, whole_var)
    for name in ("m", "v"):
        np.testing.assert_array_equal(slots[name], whole_slots[name])


def test_add_in_parts_and_parts_of_a_whole_array() -> None:
    total = np.zeros((2, 3))
    add_in_parts(total, Pieced((2, 3), np.dtype(np.float64), [np.ones(2), np.arange(4.0)]))
    add_in_parts(total, np.ones((2, 3)))
    np.testing.assert_array_equal(total, [[2, 2, 1], [2, 3, 4]])
    [(where, piece)] = parts(np.ones((2, 2)))
    assert (where.start, where.stop, piece.shape) == (0, 4, (4,))


def test_pieces_that_do_not_cover_the_shape_are_refused() -> None:
    with pytest.raises(ValueError, match=r"pieces of \[\(2,\)\] do not cover shape \(3,\)"):
        Pieced((3,), F32, [np.ones(2, F32)])


def test_a_nan_in_one_piece_is_refused_naming_the_variable_and_changes_nothing(ps: Servers) -> None:
    ps.start(1)
    client = ps.client(max_chunk_bytes=SMALL_CHUNK)
    values = model(np.random.default_rng(0))
    client.init("nan", values, OptimizerConfig("sgd", 0.1), TrainingConfig("async"), moving={"bn/mean": 0.9})
    client.register(0)
    grads = {n: np.ones_like(v) for n, v in values.items()}
    grads["w"][100, 3] = np.nan  # in the 2nd of its 4 chunks
    assert not client.watches_nonfinite(1)  # one shard: the server checks, piece by piece as they arrive
    with pytest.raises(
        ParameterServerError, match=r"gradient for 'w' at step 0 holds 1 NaN and 0 Inf of 60,000 values"
    ):
        client.push(grads, step=0, replica_id=0)
    after = client.pull()
    assert after.global_step == 0
    for name, value in values.items():
        np.testing.assert_array_equal(after.values[name], value)
