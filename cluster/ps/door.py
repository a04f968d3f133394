"""The parameter server's door: requests decoded, checked and refused with a status.

gRPC answers a deserializer's exception with INTERNAL, which blames the
server; here undecodable bytes become ``_Undecodable`` and the handler refuses
them with INVALID_ARGUMENT. ``refusing`` turns a ``ParameterServerError`` into
the RPC's status and counts it; ``client_stream`` ends a stream that sends
nothing for too long, and ``written`` a call that takes none of its answer. ``available_memory`` is what an Init may still take.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import threading
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias, TypeVar

import grpc
from google.protobuf.message import DecodeError, Message

from ..errors import ParameterServerError
from .frames import Framed, parse_framed

if TYPE_CHECKING:
    from .servicer import ParameterServicer

R = TypeVar("R")


class _Undecodable:
    """A request whose bytes are no message of its type: the handler refuses it with INVALID_ARGUMENT.

    gRPC answers a deserializer's exception with INTERNAL ("Exception deserializing
    request!"), which says the server is at fault; here the request is.
    """

    def __init__(self, message: type[Message], data: bytes, error: DecodeError) -> None:
        self.problem = (
            f"a request of {len(data):,} bytes is not a valid {message.DESCRIPTOR.full_name} message: {error}"
        )


def lenient(message: type[Message], framed: bool = False) -> Callable[[bytes], Message | Framed[Any] | _Undecodable]:
    """The request deserializer of ``message``: undecodable bytes become ``_Undecodable``, not an exception.

    With ``framed``, the chunks' contents are cut out of the received bytes
    rather than copied by protobuf's parse (``frames.parse_framed``): the
    handler gets a ``Framed`` message.
    """

    def parse(data: bytes) -> Message | Framed[Any] | _Undecodable:
        try:
            return parse_framed(data, message) if framed else message.FromString(data)
        except DecodeError as err:
            return _Undecodable(message, data, err)

    return parse


def decoded(request: Any) -> Any:
    """``request`` checked for ``_Undecodable``; a stream's messages are checked as they are read (``client_stream``).

    Examples
    --------
    >>> from cellgraph.protos import parameter_service_pb2 as pb
    >>> type(decoded(lenient(pb.StatsRequest)(b""))).__name__
    'StatsRequest'
    >>> try:
    ...     decoded(lenient(pb.StatsRequest)(b"\\xff"))
    ... except ParameterServerError as err:
    ...     print(err.code)
    INVALID_ARGUMENT
    """
    if isinstance(request, _Undecodable):
        raise ParameterServerError(request.problem, "INVALID_ARGUMENT")
    return request


class IdleLimit:
    """Cancels a call's task when one wait (for the client's next message, or for it to take the
    server's last one) lasts over ``limit`` seconds; ``fired`` then says the cancel was this limit's.

    One lazy timer per stream, moved only when it fires: a message costs an
    attribute write, not a timer made and cancelled (``asyncio.timeout`` per
    message was a good part of a small step's time on the server).
    """

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.task = asyncio.current_task()
        self.limit = 0.0
        self.since = 0.0
        self.waiting = False
        self.fired = False
        self._handle: asyncio.TimerHandle | None = None

    def start(self, limit: float) -> None:
        """A wait starts now, for at most ``limit`` seconds (``waiting = False`` ends it)."""
        self.limit, self.since, self.waiting = limit, self.loop.time(), True
        due = self.since + limit
        if self._handle is not None and self._handle.when() > due:  # a shorter limit than the one scheduled
            self._handle.cancel()
            self._handle = None
        if self._handle is None:
            self._handle = self.loop.call_at(due, self._check)

    def _check(self) -> None:
        self._handle = None
        due = self.since + self.limit
        if self.waiting and self.loop.time() >= due and self.task is not None:
            self.fired = True
            self.task.cancel()
        elif self.waiting:  # a message came and a new wait began since: check again when that one is due
            self._handle = self.loop.call_at(due, self._check)
        # Not waiting (the step is being served): the next start() schedules a check.

    def close(self) -> None:
        self.limit, self.waiting = 0.0, False
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None


async def client_stream(requests: AsyncIterator[Any], what: str, idle_s: float) -> AsyncIterator[Any]:
    """The decoded messages of a client stream; one that sends nothing for ``idle_s`` seconds is ended."""
    iterator = aiter(requests)
    while True:
        try:
            async with asyncio.timeout(idle_s):
                message = await anext(iterator)
        except StopAsyncIteration:
            return
        except TimeoutError:
            raise ParameterServerError(
                f"the {what} stream sent nothing for {idle_s:g} s (this server's idle limit per stream); "
                "it was ended and what it had sent was dropped",
                "DEADLINE_EXCEEDED",
            ) from None
        yield decoded(message)


def available_memory() -> int | None:
    """Bytes this process could still allocate: MemAvailable, less where a cgroup limit is tighter; None if unknown."""
    found = []
    with contextlib.suppress(OSError, ValueError, IndexError):
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    found.append(int(line.split()[1]) * 1024)
    with contextlib.suppress(OSError, ValueError):
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            found.append(int(limit) - int(Path("/sys/fs/cgroup/memory.current").read_text()))
    if not found and hasattr(os, "sysconf"):
        with contextlib.suppress(OSError, ValueError):
            found.append(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    return max(0, min(found)) if found else None


class Counters:
    """Bytes in and out and refused requests, shared by the handler threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.bytes_in = self.bytes_out = self.rejected = 0
        self.calls: dict[str, int] = {}

    def add(self, *, bytes_in: int = 0, bytes_out: int = 0, rejected: int = 0, call: str | None = None) -> None:
        with self._lock:
            self.bytes_in += bytes_in
            self.bytes_out += bytes_out
            self.rejected += rejected
            if call is not None:
                self.calls[call] = self.calls.get(call, 0) + 1

    def calls_so_far(self) -> dict[str, int]:
        with self._lock:
            return dict(self.calls)


Context: TypeAlias = "grpc.aio.ServicerContext[Any, Any]"


async def _abort(self: ParameterServicer, err: ParameterServerError, context: Context) -> None:
    if err.code != "DEADLINE_EXCEEDED":
        self.counters.add(rejected=1)
    await context.abort(grpc.StatusCode[err.code], str(err))


def refusing(method: Callable[..., Awaitable[R]]) -> Callable[..., Awaitable[R]]:
    """Turn a ParameterServerError raised by a handler into the RPC's status, and count it."""

    @functools.wraps(method)
    async def handler(self: ParameterServicer, request: Any, context: Context) -> R:
        self.counters.add(call=method.__name__)
        try:
            return await method(self, decoded(request), context)
        except ParameterServerError as err:
            await _abort(self, err, context)
            raise AssertionError("context.abort returns only by raising") from err

    return handler


def refusing_stream(method: Callable[..., AsyncGenerator[R, None]]) -> Callable[..., Awaitable[None]]:
    """``refusing`` for a handler that streams its response; each response is written with ``written``."""

    @functools.wraps(method)
    async def handler(self: ParameterServicer, request: Any, context: Context) -> None:
        self.counters.add(call=method.__name__)
        try:
            # Closed at once when the call ends, so the responses' generator lets go of what it holds.
            async with contextlib.aclosing(method(self, decoded(request), context)) as responses:
                await written(responses, context, method.__name__, self.stream_idle_s)
        except ParameterServerError as err:
            await _abort(self, err, context)

    return handler


async def written(responses: AsyncIterator[Any], context: Context, what: str, idle_s: float) -> None:
    """Write each response; a caller that takes none for ``idle_s`` seconds (it stopped reading) is ended.

    A write waits while the caller's flow-control window is full. Without a
    limit, a client that opens a Pull or Step and never reads would hold its
    call, and the snapshot of the variables it was answered from, for ever:
    one more copy of the model in memory for every such call.
    """
    stalled = IdleLimit()
    try:
        async for response in responses:
            stalled.start(idle_s)
            try:
                await context.write(response)
            except asyncio.CancelledError:
                if not stalled.fired:
                    raise  # the call itself was cancelled
                if stalled.task is not None:
                    stalled.task.uncancel()
                raise ParameterServerError(
                    f"the {what} call took nothing of its answer for {idle_s:g} s (this server's idle limit per "
                    "stream); it was ended and the rest of its answer dropped",
                    "DEADLINE_EXCEEDED",
                ) from None
            finally:
                stalled.waiting = False
    finally:
        stalled.close()


def check_chunk_size(size: int, limit: int, what: str) -> None:
    if size > limit:
        raise ParameterServerError(
            f"a chunk of {what} carries {size:,} bytes, over this server's limit of {limit:,} per chunk",
            "RESOURCE_EXHAUSTED",
        )
