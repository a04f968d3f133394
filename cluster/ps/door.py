"""The parameter server's door: requests decoded, checked and refused with a status.

gRPC answers a deserializer's exception with INTERNAL, which blames the
server; here undecodable bytes become ``_Undecodable`` and the handler refuses
them with INVALID_ARGUMENT. ``refusing`` turns a ``ParameterServerError`` into
the RPC's status and counts it; ``client_stream`` ends a stream that sends
nothing for too long. ``available_memory`` is what an Init may still take.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
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


def refusing_stream(method: Callable[..., AsyncIterator[R]]) -> Callable[..., AsyncIterator[R]]:
    """``refusing`` for a handler that streams its response."""

    @functools.wraps(method)
    async def handler(self: ParameterServicer, request: Any, context: Context) -> AsyncIterator[R]:
        self.counters.add(call=method.__name__)
        try:
            async for response in method(self, decoded(request), context):
                yield response
        except ParameterServerError as err:
            await _abort(self, err, context)

    return handler


def check_chunk_size(size: int, limit: int, what: str) -> None:
    if size > limit:
        raise ParameterServerError(
            f"a chunk of {what} carries {size:,} bytes, over this server's limit of {limit:,} per chunk",
            "RESOURCE_EXHAUSTED",
        )
