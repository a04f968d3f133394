"""Chunks made by hand are the protobuf messages they stand for, and reassemble bit-exact."""

from __future__ import annotations

import pickle

import ml_dtypes
import numpy as np
import pytest

from cellgraph.cluster.errors import ParameterServerError
from cellgraph.cluster.ps.chunks import TensorAssembler, byte_view, tensor_chunks, wire_view
from cellgraph.cluster.ps.config import VariableSpec
from cellgraph.cluster.ps.frames import tensor_chunk_frames
from cellgraph.protos import parameter_service_pb2 as pb

ARRAYS = {
    "empty": np.zeros((0, 3), np.float32),
    "scalar": np.array(2.5),
    "vector": np.arange(7, dtype=np.int32),
    "matrix, several chunks": np.arange(300, dtype=np.float64).reshape(20, 15) / 7,
    "bools": np.array([True, False, True]),
}


@pytest.mark.parametrize("array", ARRAYS.values(), ids=list(ARRAYS))
@pytest.mark.parametrize("max_bytes", [16, 1000, 1 << 22])
def test_frames_parse_as_the_messages_tensor_chunks_builds(array: np.ndarray, max_bytes: int) -> None:
    head = pb.PullMessage(global_step=12, version=3)
    make = lambda: pb.PullMessage(global_step=12, version=3)
    field = pb.PullMessage.DESCRIPTOR.fields_by_name["chunk"].number
    frames = list(tensor_chunk_frames("v", array, max_bytes, field=field, head=head.SerializeToString()))
    messages = list(tensor_chunks("v", array, max_bytes, make))
    assert [pb.PullMessage.FromString(f) for f in frames] == messages
    whole = TensorAssembler(VariableSpec("v", array.dtype, array.shape))
    for frame in frames:
        whole.add(pb.PullMessage.FromString(frame).chunk)
    assert whole.finish().tobytes() == array.tobytes()


def test_chunk_sizes_must_be_positive() -> None:
    for make in (
        lambda: list(tensor_chunks("v", np.zeros(3), 0)),
        lambda: list(tensor_chunk_frames("v", np.zeros(3), 0, field=1)),
    ):
        with pytest.raises(ParameterServerError, match="max_bytes must be positive, got 0"):
            make()


def test_an_assembler_writes_into_the_rows_it_is_given() -> None:
    whole = np.zeros((4, 2), np.float32)
    spec = VariableSpec("w", whole.dtype, (2, 2), (4, 2), (2, 4))
    piece = TensorAssembler(spec, out=whole[2:])
    for chunk in tensor_chunks("w", np.ones((2, 2), np.float32), 8):
        piece.add(chunk)
    piece.finish()
    assert whole.tolist() == [[0, 0], [0, 0], [1, 1], [1, 1]]
    with pytest.raises(ValueError, match=r"out must be a C-contiguous float32 array of shape \(2, 2\)"):
        TensorAssembler(spec, out=whole[:, :1])


def test_only_an_assembler_into_a_given_array_receives_again() -> None:
    spec = VariableSpec("w", np.dtype(np.float32), (3,))
    with pytest.raises(ValueError, match="only an assembler writing into a given out array receives again"):
        TensorAssembler(spec, adopt=True).again()
    out = np.zeros(3, np.float32)
    assembler = TensorAssembler(spec, out=out)
    assembler.add_whole(np.ones(3, np.float32))
    assembler.again()
    assert assembler.received == 0 and assembler.missing() == [(0, 12)]


def test_a_whole_array_goes_on_the_wire_as_its_own_buffer_whatever_made_its_dtype() -> None:
    # A dtype that went through pickle (as a replica's loaded plan's do) is not NumPy's singleton, and says
    # isbuiltin 0: its array is still sent from its own buffer, not through a byte view made every step.
    dtype = pickle.loads(pickle.dumps(np.dtype(np.float32)))
    assert dtype.isbuiltin == 0
    array = np.arange(6, dtype=dtype).reshape(2, 3)
    view = wire_view(array, 0, array.nbytes)
    assert view.obj is array and view.tobytes() == array.tobytes()
    # Part of it, or a plug-in dtype with no buffer format (bfloat16), goes through its byte view.
    assert wire_view(array, 4, 12).tobytes() == array.tobytes()[4:12]
    bf16 = np.arange(4).astype(ml_dtypes.bfloat16)
    assert wire_view(bf16, 0, bf16.nbytes).tobytes() == byte_view(bf16).tobytes() == bf16.tobytes()
