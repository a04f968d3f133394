"""Tensors as streams of chunks, and the checks that put them back together.

gRPC caps a message at 4 MiB by default. Rather than raising the cap (as
TensorFlow did, to 2 GiB), every tensor travels as ``TensorChunk`` messages of
at most ``MAX_CHUNK_BYTES`` of content, each naming its tensor, dtype, whole
shape and byte offset. The receiver preallocates the whole array and writes
each chunk straight into it, checking as it goes that the chunks agree with
the expected dtype and shape, stay inside the tensor, never overlap, and in
the end leave no gap.

Examples
--------
>>> import numpy as np
>>> from cellgraph.cluster.ps.config import VariableSpec
>>> w = np.arange(10, dtype=np.float32)
>>> chunks = list(tensor_chunks("w", w, max_bytes=16))
>>> len(chunks)
3
>>> whole = TensorAssembler(VariableSpec("w", w.dtype, w.shape))
>>> for chunk in chunks:
...     whole.add(chunk)
>>> bool((whole.finish() == w).all())
True
"""

from __future__ import annotations

import bisect
import functools
import sys
from collections.abc import Callable, Iterator
from typing import Any, Protocol, TypeVar

import numpy as np

from cellgraph.dataflow.dtypes import DTYPES, STRING
from cellgraph.dataflow.graphdef import DTYPE_ENUM, DTYPE_NAME
from cellgraph.dataflow.shapes import fmt
from cellgraph.protos import tensor_pb2

from ..errors import ParameterServerError
from .config import VariableSpec
from .pieces import Pieced

# The largest message either side sends or takes (gRPC's own limit is set to it in server.py and the client).
MAX_MESSAGE_BYTES = 4 * 1024 * 1024
# Content bytes per chunk: 4 MiB less room for the chunk's other fields and the
# message that wraps it, so that every message fits gRPC's default limit.
MAX_CHUNK_BYTES = 4 * 1024 * 1024 - 4096

# A server keeps a gradient's chunk where it lies only if it is at least this big (or the tensor's last): a
# client sending a big tensor in tiny chunks would otherwise hold a Python object and a message per few bytes.
KEEP_PIECE_BYTES = 64 * 1024

M = TypeVar("M", bound=Any)


@functools.lru_cache(maxsize=64)
def dtype_enum(dtype: np.dtype) -> int:
    """The ``DataType`` of a NumPy dtype the parameter service can hold; kept by dtype, since a dtype's
    ``name`` costs more than an assembler's other work (a server makes one for each gradient of every push)."""
    try:
        return int(DTYPE_ENUM[dtype.name])
    except KeyError:
        raise ParameterServerError(
            f"dtype {dtype.name} cannot travel as a tensor; known: {', '.join(DTYPE_ENUM)}", "INVALID_ARGUMENT"
        ) from None


def dtype_of(enum: int, where: str) -> np.dtype:
    """The NumPy dtype of a ``DataType`` read off the wire; ``where`` says which message had it."""
    name = DTYPE_NAME.get(enum)  # type: ignore[call-overload]
    if name == STRING:  # variables are numbers: a string tensor has no bytes to chunk, sum or apply
        raise ParameterServerError(
            f"{where}: DataType DT_STRING: the parameter service holds numbers, not strings", "INVALID_ARGUMENT"
        )
    try:
        return np.dtype(DTYPES[name])  # type: ignore[index]
    except KeyError:
        known = ", ".join(tensor_pb2.DataType.Name(e) for e in DTYPE_ENUM.values() if e != tensor_pb2.DT_STRING)
        raise ParameterServerError(
            f"{where}: DataType {enum} is not a tensor dtype; known: {known}", "INVALID_ARGUMENT"
        ) from None


def byte_view(array: np.ndarray) -> np.ndarray:
    """The flat ``uint8`` bytes of ``array``'s values as the wire carries them: little-endian, C order.

    A view of every array this package makes (native order, C-contiguous), so
    chunks are written into it in place. A big-endian array (read from a file
    written elsewhere, say) is converted first: its values travel, not its
    bytes reinterpreted.
    """
    if array.dtype.byteorder == ">" or (array.dtype.byteorder == "=" and sys.byteorder == "big"):
        array = array.astype(array.dtype.newbyteorder("<"))
    return np.ascontiguousarray(array).reshape(-1).view(np.uint8)


_LITTLE = sys.byteorder == "little"


def wire_view(array: np.ndarray, start: int, end: int) -> memoryview:
    """Bytes ``start`` to ``end`` of ``array`` as the wire carries them (``byte_view``), as a view: the array's
    own buffer when that is all of it and already as the wire has it (C order, little-endian), which costs a
    fifth of making its byte view (the join of a message is the one copy either way)."""
    dtype = array.dtype
    native = dtype.byteorder in "<|" or (dtype.byteorder == "=" and _LITTLE)
    # NumPy's own dtypes only: one from a plug-in (ml_dtypes' bfloat16, ``isbuiltin`` 2) has no buffer format.
    # Not ``isbuiltin == 1``: a dtype that went through pickle (a replica's loaded plan) says 0.
    if start == 0 and end == array.nbytes and array.flags.c_contiguous and native and dtype.isbuiltin != 2:
        return array.data
    return byte_view(array)[start:end].data


def tensor_chunks(
    name: str, array: np.ndarray, max_bytes: int = MAX_CHUNK_BYTES, make: Callable[[], M] | None = None
) -> Iterator[M]:
    """Split ``array`` into chunks of at most ``max_bytes`` of content (one empty chunk for an empty array).

    Each chunk is the ``chunk`` field of a new ``make()`` message (a
    ``PullMessage``, a ``PushMessage``, ...), or a bare ``TensorChunk`` when
    ``make`` is None. The chunk is filled in place: building a message with a
    chunk passed to its constructor costs a copy of the content, and for 4 MiB
    chunks that copy was most of a pull's time.
    """
    if max_bytes < 1:
        raise ParameterServerError(f"max_bytes must be positive, got {max_bytes}", "INVALID_ARGUMENT")
    raw = byte_view(array)
    dtype = dtype_enum(array.dtype)
    offsets = range(0, raw.size, max_bytes) if raw.size else range(1)
    for offset in offsets:
        message = make() if make is not None else tensor_pb2.TensorChunk()
        chunk = message.chunk if make is not None else message  # type: ignore[attr-defined]
        chunk.name, chunk.dtype, chunk.offset = name, dtype, offset
        # Only the first chunk needs the shape, but every chunk carries it so
        # that each can be checked on its own; it is a few bytes.
        chunk.shape.dim.extend(array.shape)
        chunk.content = raw[offset : offset + max_bytes].tobytes()
        yield message  # type: ignore[misc]


class TensorAssembler:
    """Receives the chunks of one tensor of a known spec into a preallocated array.

    Parameters
    ----------
    spec
        The tensor expected: its name, dtype and shape. Chunks that disagree
        are refused before a byte of them is written.
    what
        How messages name the tensor, e.g. ``"gradient for 'w'"``.
    out
        Where to write: a C-contiguous array of the spec's dtype and shape (a
        client passes the rows of the whole variable that this piece covers).
        A new array by default.
    adopt
        Without ``out``: a chunk that is the whole tensor becomes the array
        itself, a read-only view of the received bytes.
    pieces
        With ``adopt``: the chunks of a bigger tensor are kept as they lie too,
        and ``gradient()`` hands them on as a ``Pieced`` (a server's gradients).
    """

    def __init__(
        self,
        spec: VariableSpec,
        what: str | None = None,
        out: np.ndarray | None = None,
        *,
        adopt: bool = False,
        pieces: bool = False,
    ) -> None:
        self.spec = spec
        self.what = what or f"tensor '{spec.name}'"
        if out is not None and (out.shape != spec.shape or out.dtype != spec.dtype or not out.flags.c_contiguous):
            raise ValueError(f"out must be a C-contiguous {spec.dtype.name} array of shape {fmt(spec.shape)}")
        # Made at the first chunk that needs it: a whole tensor in one chunk may be adopted instead, and with
        # ``pieces``, the chunks of a bigger one are kept as they lie (by start byte) until a reader needs one
        # array (``finish``); ``gradient`` hands them on as they are (pieces.py).
        self.array: np.ndarray | None = out
        self._bytes: np.ndarray | None = None
        self._adopt = adopt and out is None
        self._keeps_pieces = pieces and self._adopt
        self._pieces: dict[int, np.ndarray] = {}
        self.total = spec.nbytes
        # The spec's DataType: a chunk that says it is checked without a lookup or a message made for nothing.
        try:
            self._enum: int | None = dtype_enum(spec.dtype)
        except ParameterServerError:  # a chunk can never match it: ``add`` says what the chunk was instead
            self._enum = None
        # Received byte ranges, sorted by start; they never overlap.
        self._starts: list[int] = []
        self._stops: list[int] = []
        self.received = 0
        # Set by a server that checked the whole tensor for NaN and Inf as it arrived (the store skips it then).
        self.finite = False
        # Set by a server on the first member of a fused chunk: the members' names and the chunk's content as
        # one flat array, which the store may sum or apply whole (store.py's ``fused``).
        self.fused_with: tuple[tuple[str, ...], np.ndarray] | None = None

    def _buffer(self) -> np.ndarray:
        """The flat bytes written into (the array made now if it was not yet, with the pieces kept so far)."""
        if self._bytes is None:
            if self.array is None:
                self.array = np.empty(self.spec.shape, dtype=self.spec.dtype)
            self._bytes = byte_view(self.array)
            pieces, self._pieces = self._pieces, {}
            for start, piece in pieces.items():
                self._bytes[start : start + piece.nbytes] = piece.view(np.uint8)
        return self._bytes

    def _keep(self, content: bytes | memoryview, start: int, size: int) -> bool:
        """Keep a chunk of a tensor that is not whole as it lies (a read-only view of the received bytes), when
        it holds whole values, is not small (``KEEP_PIECE_BYTES``, unless it is the last), and no array was made
        yet; whether it was kept. (Unaligned views are fine: NumPy and the Numba kernels read them at the same
        speed here.)"""
        itemsize = self.spec.dtype.itemsize
        if not self._keeps_pieces or self._bytes is not None or start % itemsize or size % itemsize:
            return False
        if size < KEEP_PIECE_BYTES and start + size != self.total:
            return False
        self._pieces[start] = np.frombuffer(content, dtype=self.spec.dtype)
        return True

    def add(self, chunk: tensor_pb2.TensorChunk, content: bytes | memoryview | None = None) -> None:
        """Check ``chunk`` against the spec and the chunks so far, then write it in place.

        ``content`` is the chunk's content when it was cut out of the received
        bytes (``frames.parse_framed``); by default, ``chunk.content``.
        """
        if content is None:
            content = chunk.content
        spec, what = self.spec, self.what
        if self._enum is None or chunk.dtype != self._enum:
            dtype = dtype_of(chunk.dtype, f"chunk of {what}")
            if dtype != spec.dtype:
                raise ParameterServerError(
                    f"chunk of {what} is {dtype.name}, the variable is {spec.dtype.name}", "INVALID_ARGUMENT"
                )
        shape = tuple(chunk.shape.dim)
        if shape != spec.shape:
            raise ParameterServerError(
                f"chunk of {what} says shape {fmt(shape)}, the variable's is {fmt(spec.shape)}", "INVALID_ARGUMENT"
            )
        view = memoryview(content)
        start, size, total = chunk.offset, view.nbytes, self.total
        stop = start + size
        if start < 0 or stop > total:
            raise ParameterServerError(
                f"chunk of {what} at bytes [{start}, {stop}) runs outside the tensor's {total} bytes",
                "INVALID_ARGUMENT",
            )
        where = bisect.bisect_right(self._starts, start)
        before = where - 1
        if before >= 0 and self._stops[before] > start or where < len(self._starts) and self._starts[where] < stop:
            hit = before if before >= 0 and self._stops[before] > start else where
            raise ParameterServerError(
                f"chunk of {what} at bytes [{start}, {stop}) overlaps bytes "
                f"[{self._starts[hit]}, {self._stops[hit]}) already received",
                "INVALID_ARGUMENT",
            )
        if size:
            if not self._adopt or not (self._take_whole(content, start, size) or self._keep(content, start, size)):
                if view.format == "B" and view.ndim == 1:  # received bytes: a third of NumPy's cost for a small one
                    self._buffer().data[start:stop] = view
                else:
                    self._buffer()[start:stop] = np.frombuffer(content, dtype=np.uint8)
            self._starts.insert(where, start)
            self._stops.insert(where, stop)
        self.received += size

    def add_whole(self, array: np.ndarray) -> None:
        """The whole tensor at once, already checked against the spec (a member of a fused chunk:
        ``fused.checked``): adopted as it is where this assembler adopts, else copied into its array."""
        if self._starts:  # any byte received already
            raise ParameterServerError(f"{self.what} arrived a second time", "INVALID_ARGUMENT")
        if self._adopt and self.array is None:
            self.array = array
        else:
            self._buffer()
            assert self.array is not None
            np.copyto(self.array, array)
        self.written_whole()

    def written_whole(self) -> None:
        """Every byte is in: written by ``add_whole``, or into ``out`` by the caller (a fused chunk's members
        copied at once into arrays that lie side by side in its order: ``ShardReceiver``)."""
        if self._starts:
            raise ParameterServerError(f"{self.what} arrived a second time", "INVALID_ARGUMENT")
        if self.total:
            self._starts, self._stops = [0], [self.total]
        self.received = self.total

    def _take_whole(self, content: bytes | memoryview, start: int, size: int) -> bool:
        """Adopt a chunk that is the whole tensor as the array itself, a read-only view of the received
        bytes (no copy; aligned or not: every reader reads it or copies it); whether it was."""
        if self.array is not None or start != 0 or size != self.total:
            return False
        self.array = np.frombuffer(content, dtype=self.spec.dtype).reshape(self.spec.shape)
        return True

    def missing(self) -> list[tuple[int, int]]:
        """The byte ranges not received yet."""
        if self.received == self.total:  # ranges never overlap: every byte is there
            return []
        gaps, at = [], 0
        for start, stop in zip(self._starts, self._stops):
            if start > at:
                gaps.append((at, start))
            at = stop
        if at < self.total:
            gaps.append((at, self.total))
        return gaps

    def finish(self) -> np.ndarray:
        """The whole tensor; every byte must have arrived."""
        gaps = self.missing()
        if gaps:
            shown = ", ".join(f"[{a}, {b})" for a, b in gaps[:3]) + (", ..." if len(gaps) > 3 else "")
            raise ParameterServerError(
                f"{self.what} is incomplete: bytes {shown} of {self.total} never arrived", "INVALID_ARGUMENT"
            )
        if self._pieces:
            self._buffer()  # one array, the pieces copied in
        if self.array is None:  # a tensor of no bytes
            self.array = np.empty(self.spec.shape, dtype=self.spec.dtype)
        return self.array

    def gradient(self) -> np.ndarray | Pieced:
        """The whole tensor, as its pieces where it was kept in several (no copy), else as ``finish`` gives it."""
        if len(self._pieces) > 1 and not self.missing():
            return Pieced(self.spec.shape, self.spec.dtype, [self._pieces[start] for start in sorted(self._pieces)])
        return self.finish()

    def again(self) -> None:
        """Ready to receive the same tensor again into the same ``out`` (a kept pull plan's next step)."""
        if self._adopt:
            raise ValueError("only an assembler writing into a given out array receives again")
        self._starts.clear()
        self._stops.clear()
        self.received = 0

    def release(self) -> None:
        """Drop the buffer now (a cancelled or refused stream): nothing must wait for the cycle collector."""
        self.array = self._bytes = None
        self._pieces = {}


class _Releasable(Protocol):
    def release(self) -> None: ...


_R = TypeVar("_R", bound=_Releasable)


def release_all(assemblers: dict[str, _R]) -> None:
    """Drop the buffers of a stream's assemblers now (refused, cancelled or done)."""
    for assembler in assemblers.values():
        assembler.release()
    assemblers.clear()
