"""The client's side of the Step stream: held streams, their deadlines, and what a step sends and receives.

A ``ParameterClient`` keeps, per shard, a small pool of open Step streams (one
per thread that steps at the same time; a replica has one). A step puts its
request frames on a stream and reads the answer; the stream stays open for
the next step, so a step costs no call setup. A stream that failed is
dropped and the next step opens a new one.

Every held stream of a process runs on one event loop (``StepLoop``,
grpc.aio; step_loop.py), run by the thread that waits for a step. The stream itself has no
deadline (it lives across steps); each step has one: the caller waits for the
step's result that long, then cancels it.

``PullPlan`` receives pulled chunks straight into the destination arrays
(new ones, or the caller's ``out=``), one copy from the received bytes.

Examples
--------
>>> import numpy as np
>>> from cellgraph.cluster.ps.config import VariableSpec
>>> layout = {"w": [(0, VariableSpec("w", np.dtype("float32"), (4,)))]}
>>> plan = PullPlan(layout, ["w"], replica_id=0, max_chunk=1 << 20)
>>> pb.PullRequest.FromString(plan.wire_for(0, min_step=3)).min_step, plan.whole["w"].shape
(3, (4,))
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
import time
from collections.abc import Callable, Coroutine, Iterator, Mapping, Sequence
from typing import Any

import grpc
import numpy as np

from cellgraph.protos import parameter_service_pb2 as pb

from ..errors import ParameterServerError
from . import fused
from .aio_layer import keep_grpc_aio_up
from .chunks import TensorAssembler
from .config import VariableSpec
from .destinations import destinations, span
from .frames import Framed, parse_framed
from .sharding import Layout
from .step_loop import LoopTimeout, StepLoop

# How long closing a client waits for its Step channels to close.
CLOSE_WAIT_S = 1.0


class _FrameSource:
    """A step's frames (``step_requests.step_frames``), read by ``HeldStream._exchange`` like its queue: (frame, is_last)."""

    def __init__(self, frames: Iterator[bytes]) -> None:
        self._frames = frames
        self._next: bytes | None = next(frames)  # a step has at least one message

    async def get(self) -> tuple[bytes, bool]:
        frame = self._next
        assert frame is not None
        self._next = next(self._frames, None)
        return frame, self._next is None


class StepTimeout(grpc.RpcError):
    """A step that ran past its deadline (its exchange was cancelled): DEADLINE_EXCEEDED, in gRPC's own
    words, which the client replaces with the call's deadline."""

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.DEADLINE_EXCEEDED

    def details(self) -> str:
        return "Deadline Exceeded"


class StreamEnded(grpc.RpcError):
    """The server closed a Step stream without an answer or a status: reported as UNAVAILABLE."""

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return "the server closed the Step stream in the middle of a step"


class StreamBroken(grpc.RpcError):
    """A write on a Step stream that Core had already closed (the server ended the stream, or went away): reported
    as UNAVAILABLE, so that a sync step is tried again on a new stream, which gets the server's own answer.

    gRPC Python's asyncio client reports such a write as INTERNAL "Internal error from Core", in place of the
    status the server sent (grpc/grpc#36066): a killed parameter server then read as a refusal, which no replica
    rejoins after, and its job failed at once."""

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return "the Step stream broke while the step was being sent: the server ended it or went away"


# What gRPC's asyncio client says of a write on a stream that Core had closed (grpc/aio/_call.py, set_internal_error).
CORE_WRITE_FAILURE = "Internal error from Core"


class StreamFinished(grpc.RpcError):
    """A held stream the server had already ended (an idle limit, a refused step): its status, raised
    when the next step tries to write on it."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


class StepCancelled(Exception):
    """A step cancelled from outside (another shard of the same call failed)."""


async def _write(call: Any, frame: bytes) -> None:
    """Write one frame on a Step stream; a stream already ended raises StreamFinished (the server's status) or
    StreamBroken (Core's INTERNAL in place of it)."""
    try:
        await call.write(frame)
    except asyncio.InvalidStateError:  # the server ended the stream between steps: say why
        raise StreamFinished(await call.code(), await call.details() or "") from None
    except grpc.aio.AioRpcError as err:
        if err.code() == grpc.StatusCode.INTERNAL and err.details() == CORE_WRITE_FAILURE:
            raise StreamBroken() from None
        raise


STEP_LOOP = StepLoop()


def put_threadsafe(queue: asyncio.Queue[Any], item: Any) -> None:
    """Put ``item`` on ``queue``, a queue of the step loop, from any thread."""
    STEP_LOOP.soon(queue.put_nowait, item)


class HeldStream:
    """One open Step stream to one shard; its call lives on ``STEP_LOOP``."""

    def __init__(self, pool: StreamPool, metadata: Any) -> None:
        self.pool = pool
        self.metadata = metadata
        self.call: Any = None  # grpc.aio.StreamStreamCall, made on the loop at the first step
        self.broken = False

    def step(
        self, frames: Iterator[bytes], on_answer: Callable[[Framed[pb.StepResponse]], None], seconds: float, scope: Any
    ) -> None:
        """Send one step's frames (made on the step loop as each is sent) and hand each message of its answer
        to ``on_answer`` (on the step loop: this thread runs it while it waits, unless another one does)."""
        self.broken = True  # until the step's answer is read through
        try:
            STEP_LOOP.run(self._exchange(_FrameSource(frames), on_answer, []), seconds, scope)
        except LoopTimeout:
            raise StepTimeout() from None
        except concurrent.futures.CancelledError:
            raise StepCancelled() from None
        self.broken = False

    def start_streamed(
        self,
        frames: asyncio.Queue[tuple[bytes, bool]],
        on_answer: Callable[[Framed[pb.StepResponse]], None],
        sent: list[float],
        submit: Callable[[Coroutine[Any, Any, None]], concurrent.futures.Future[None]] = STEP_LOOP.submit,
        wrote: Callable[[], None] | None = None,
    ) -> concurrent.futures.Future[None]:
        """Start a step whose frames arrive over time (``frames``: (frame, is_last), put from any thread with
        ``put_threadsafe``); each write's start time goes to ``sent``, and ``wrote()`` is called as each write
        ends. The future ends with the answer. ``submit`` starts the exchange on the step loop
        (``StepLoop.drive``'s, for a step its caller drives)."""
        self.broken = True  # until the answer is read through (the caller sets it back)
        return submit(self._exchange(frames, on_answer, sent, wrote))

    async def _exchange(
        self,
        frames: asyncio.Queue[tuple[bytes, bool]] | _FrameSource,
        on_answer: Callable[[Framed[pb.StepResponse]], None],
        sent: list[float],
        wrote: Callable[[], None] | None = None,
    ) -> None:
        """Write the step's frames as they come (the last one marked), then read its answer to the end.

        A held stream the server ended between steps (its idle limit, a
        restart) is found by the step's first write, since nobody runs the
        step loop between steps: nothing of the step was sent then, so the
        frame goes again on a new stream, whatever the step (an async push
        included)."""
        reused = self.call is not None
        if self.call is None:
            self.call = self.pool.method()(metadata=self.metadata)
        call = self.call
        try:
            first = True
            while True:
                frame, last = await frames.get()
                sent.append(time.monotonic())
                try:
                    await _write(call, frame)
                except (StreamFinished, StreamBroken):
                    if not (first and reused):
                        raise
                    call.cancel()
                    call = self.call = self.pool.method()(metadata=self.metadata)
                    await _write(call, frame)
                first = False
                if wrote is not None:
                    wrote()
                if last:
                    break
            while True:
                answer = await call.read()
                if answer is grpc.aio.EOF:
                    raise StreamEnded()
                on_answer(answer)
                if answer.message.last:
                    return
        except BaseException:
            call.cancel()  # refused, cancelled or past its deadline: this stream is done
            raise

    def close(self) -> None:
        call, self.call = self.call, None
        if call is not None:
            STEP_LOOP.soon(call.cancel)


class StreamPool:
    """A shard's idle held streams: a step takes one (or opens one) and gives it back when it went well."""

    def __init__(self, open_channel: Callable[[], grpc.aio.Channel], service: str) -> None:
        self._open_channel = open_channel
        self._service = service
        self._channel: grpc.aio.Channel | None = None  # made on the loop, at the first step
        self._method: Any = None
        self._lock = threading.Lock()
        self._idle: list[HeldStream] = []
        self._closed = False

    def method(self) -> Any:
        """The Step multi-callable of this shard's aio channel (opened now if need be); on the step loop."""
        if self._method is None:
            keep_grpc_aio_up()
            self._channel = self._open_channel()
            self._method = self._channel.stream_stream(
                f"/{self._service}/Step",
                request_serializer=lambda frame: frame,
                response_deserializer=lambda data: parse_framed(data, pb.StepResponse),
            )
        return self._method

    def take(self, metadata: Any) -> HeldStream:
        with self._lock:
            if self._idle:
                return self._idle.pop()
        return HeldStream(self, metadata)

    def give_back(self, stream: HeldStream) -> None:
        with self._lock:
            if not stream.broken and not self._closed:
                self._idle.append(stream)
                return
        stream.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for stream in idle:
            stream.close()
        channel, self._channel, self._method = self._channel, None, None
        if channel is not None:
            with contextlib.suppress(LoopTimeout, concurrent.futures.CancelledError):
                STEP_LOOP.run(channel.close(), CLOSE_WAIT_S)


class PullPlan:
    """One pull's requests per shard, and the whole arrays their chunks are written into.

    A plan does not depend on the step: a replica pulls into the same arrays
    step after step, and the client keeps its plan (``ParameterClient._pull_plan``)
    with each shard's request serialized once; each pull adds its own
    ``min_step`` (``wire_for``).
    """

    def __init__(
        self,
        layout: Layout,
        wanted: list[str],
        replica_id: int,
        max_chunk: int,
        out: Mapping[str, np.ndarray] | None = None,
    ) -> None:
        self.whole = destinations(layout, wanted, out, max_chunk)
        self.shapes = {name: layout[name][0][1].whole_shape for name in wanted}
        self.specs: dict[int, dict[str, VariableSpec]] = {}
        for name in wanted:
            for shard, spec in layout[name]:
                self.specs.setdefault(shard, {})[name] = spec
        self.names = {shard: list(specs) for shard, specs in self.specs.items()}
        # What a pull waits for (a streamed step's ``Arrivals`` starts from copies): by shard, the variables it
        # sends a piece of, and by variable, how many pieces. A piece of no bytes is never sent a chunk: it is
        # whole already.
        self.owed: dict[int, frozenset[str]] = {
            shard: frozenset(name for name, spec in specs.items() if spec.nbytes) for shard, specs in self.specs.items()
        }
        self.pieces_owed: dict[str, int] = {}
        for names in self.owed.values():
            for name in names:
                self.pieces_owed[name] = self.pieces_owed.get(name, 0) + 1
        self.requests: dict[int, pb.PullRequest] = {
            shard: pb.PullRequest(names=list(specs), replica_id=replica_id, max_chunk_bytes=max_chunk, fuse=True)
            for shard, specs in self.specs.items()
        }
        self.wire = {shard: request.SerializeToString() for shard, request in self.requests.items()}
        # Each shard's assemblers of the last pull that read its answer through, received into again by the next
        # (a kept plan serves a replica step after step); one taken by a pull in progress is not shared.
        self._idle: dict[int, dict[str, TensorAssembler]] = {}
        # Each shard's fused answers, as checked against this plan's specs (fused.checked's ``layouts``).
        self._layouts: dict[int, dict[tuple[tuple[str, ...], int], fused.FusedLayout]] = {}
        # Each shard's fused answers, by their members: the one flat view of this plan's arrays they are copied
        # into when those lie side by side in the chunk's order (destinations.span), else None.
        self._spans: dict[int, dict[tuple[str, ...], np.ndarray | None]] = {}

    def wire_for(self, shard: int, min_step: int | None) -> bytes:
        """``shard``'s request, serialized, with ``min_step`` (None: answer at once). Protobuf reads a field
        appended to a message's bytes as set in it: the kept bytes are not serialized again."""
        wire = self.wire[shard]
        return wire if min_step is None else wire + pb.PullRequest(min_step=min_step).SerializeToString()

    def reuses(self, out: Mapping[str, np.ndarray]) -> bool:
        """Whether this plan may pull into ``out`` again: made for these very arrays, one for every variable it
        pulls (none of its own, which a second pull would overwrite), still writable and of their shapes."""
        whole, shapes = self.whole, self.shapes
        if len(out) != len(whole):
            return False
        for name, array in out.items():  # a loop, not a generator: a kept plan is checked every step
            if whole.get(name) is not array or not array.flags.writeable or array.shape != shapes[name]:
                return False
        return True

    def receiver(self, shard: int, on_piece: Callable[[Sequence[str]], None] | None = None) -> ShardReceiver:
        assemblers = self._idle.pop(shard, None)
        if assemblers is None:
            assemblers = {
                name: TensorAssembler(spec, f"variable '{name}' from shard {shard}", out=rows(self.whole[name], spec))
                for name, spec in self.specs[shard].items()
            }
        else:
            for assembler in assemblers.values():
                assembler.again()
        layouts = self._layouts.get(shard)
        if layouts is None:
            layouts = self._layouts[shard] = {}
        spans = self._spans.get(shard)
        if spans is None:
            spans = self._spans[shard] = {}
        return ShardReceiver(shard, assemblers, on_piece, self._idle, layouts, spans)


class ShardReceiver:
    """Writes one shard's pulled chunks into the whole arrays; knows its global step and the versions sent."""

    def __init__(
        self,
        shard: int,
        assemblers: dict[str, TensorAssembler],
        on_piece: Callable[[Sequence[str]], None] | None = None,
        idle: dict[int, dict[str, TensorAssembler]] | None = None,
        layouts: dict[tuple[tuple[str, ...], int], fused.FusedLayout] | None = None,
        spans: dict[tuple[str, ...], np.ndarray | None] | None = None,
    ) -> None:
        self.shard = shard
        self.assemblers = assemblers
        self._idle = idle  # where the assemblers go back once the answer is read through (PullPlan's)
        self._layouts = layouts  # the plan's fused layouts of this shard's answers
        self._spans = {} if spans is None else spans  # the plan's flat views of its arrays, by fused members
        self.on_piece = on_piece  # told the variables whose piece from this shard is whole (streamed steps)
        self.step = 0
        self.versions: dict[str, int] = {}

    def add(self, framed: Framed[Any], values: Sequence[pb.PullMessage]) -> None:
        """Write the chunks of ``values``, all the chunks ``framed`` carries, in place."""
        pairs = framed.paired([value.chunk for value in values])
        for value, (chunk, content) in zip(values, pairs):
            if chunk.members:
                self._add_fused(value, content)
                continue
            name = chunk.name
            assembler = self.assemblers.get(name)
            if assembler is None:
                raise ParameterServerError(f"shard {self.shard} sent '{name}', which was not asked for", "INTERNAL")
            assembler.add(chunk, content)
            self.step, self.versions[name] = value.global_step, value.version
            if self.on_piece is not None and assembler.received == assembler.total:
                self.on_piece((name,))

    def _add_fused(self, value: pb.PullMessage, content: memoryview) -> None:
        """Write each member of a fused chunk (checked whole first) into its array: in one copy where the
        arrays lie side by side in the chunk's order (``destinations.span``)."""
        assemblers = self.assemblers
        layout, flat = fused.checked(
            value.chunk,
            content,
            lambda name: assemblers[name].spec if name in assemblers else None,
            f"shard {self.shard}'s answer",
            lambda name: assemblers[name].received > 0,
            self._layouts,
        )
        self.step = value.global_step
        names = layout.names
        if names not in self._spans:  # worked out once per member list: a kept plan's arrays do not move
            self._spans[names] = span([assemblers[name].array for name in names], flat.dtype)
        whole = self._spans[names]
        if whole is not None:
            np.copyto(whole, flat)
            for name in names:
                assemblers[name].written_whole()
        else:
            for name, array in fused.members(layout, flat):
                assemblers[name].add_whole(array)
        versions, version = self.versions, value.version
        for name in names:
            versions[name] = version
        if self.on_piece is not None:
            self.on_piece(names)

    def finish(self) -> tuple[int, dict[str, int]]:
        for assembler in self.assemblers.values():
            assembler.finish()
        if self._idle is not None:
            self._idle[self.shard] = self.assemblers
        return self.step, self.versions


def rows(whole: np.ndarray, spec: VariableSpec) -> np.ndarray:
    """The rows of ``whole`` that piece ``spec`` covers (a contiguous view), or ``whole`` itself."""
    if spec.shape == spec.whole_shape or spec.rows is None:
        return whole
    return whole[spec.rows[0] : spec.rows[1]]
