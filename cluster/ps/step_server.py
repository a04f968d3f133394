"""The server's side of the Step stream: a replica's held bidirectional stream for its step traffic.

A replica opens one Step stream per shard and keeps it: each step sends one
StepRequest (a push whose gradients fit in one message, and the pull after
it) or several (a bigger push in pieces, ``more`` set on all but the last),
and gets back one or more StepResponses, the last marked ``last``. Between
steps the stream costs the server no thread and no buffer: it is an awaited
read. A push in pieces that stalls is ended after the server's per-stream idle
limit; a stream idle between steps, after ``held_idle_s``.

Answers are framed by hand (``frames``): the pulled chunks' contents are
views of the store's read-only snapshot until the one join that makes each
message.

Examples
--------
>>> import numpy as np
>>> values = {"w": (2, np.arange(3, dtype=np.float32))}
>>> [frame] = _answer_frames(pb.PushResponse(status=pb.PushResponse.APPLIED), 5, values, 1 << 20)
>>> answer = pb.StepResponse.FromString(frame)
>>> answer.last, answer.values[0].global_step, answer.values[0].version, answer.values[0].chunk.name
(True, 5, 2, 'w')
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from cellgraph.protos import parameter_service_pb2 as pb

from ..errors import ParameterServerError
from . import fused
from .chunks import MAX_MESSAGE_BYTES, release_all
from .door import IdleLimit, decoded
from .frames import Framed, chunk_parts, length_delimited, parts_size, varint

if TYPE_CHECKING:
    from .gradient_intake import Taken
    from .servicer import ParameterServicer
    from .store import ParameterStore

_PUSH = pb.StepResponse.DESCRIPTOR.fields_by_name["push"].number
_VALUES = pb.StepResponse.DESCRIPTOR.fields_by_name["values"].number
_LAST = varint(pb.StepResponse.DESCRIPTOR.fields_by_name["last"].number << 3) + b"\x01"
_CHUNK = pb.PullMessage.DESCRIPTOR.fields_by_name["chunk"].number
# Room kept in each answer message for the push's outcome and the `last` flag.
_MESSAGE_SLACK = 1024


async def _next(
    requests: AsyncIterator[Any], idle: IdleLimit, idle_s: float, mid_push: bool
) -> Framed[pb.StepRequest] | None:
    """The next request, or None when the replica closed the stream; silence longer than ``idle_s`` ends it."""
    idle.start(idle_s)
    try:
        return decoded(await anext(requests))  # type: ignore[no-any-return]
    except StopAsyncIteration:
        if mid_push:
            raise ParameterServerError(
                "the Step stream ended in the middle of a push (a message with `more` set was the last); "
                "the push was dropped",
                "INVALID_ARGUMENT",
            ) from None
        return None
    except asyncio.CancelledError:
        if not idle.fired:
            raise  # the call itself was cancelled
        if idle.task is not None:
            idle.task.uncancel()
        where = "in the middle of a push" if mid_push else "between steps"
        raise ParameterServerError(
            f"the Step stream sent nothing for {idle_s:g} s {where} (this server's idle limit); "
            "it was ended and what it had sent of the step was dropped",
            "DEADLINE_EXCEEDED",
        ) from None
    finally:
        idle.waiting = False


async def serve_steps(
    servicer: ParameterServicer, store: ParameterStore, requests: AsyncIterator[Any]
) -> AsyncIterator[bytes]:
    """Answer the steps of one Step stream until the replica closes it; a refused step ends the stream."""
    iterator = aiter(requests)
    assemblers: dict[str, Taken] = {}
    header: pb.PushHeader | None = None
    idle = IdleLimit()
    try:
        while True:
            mid_push = header is not None
            limit = servicer.stream_idle_s if mid_push else servicer.held_idle_s
            framed = await _next(iterator, idle, limit, mid_push)
            if framed is None:
                return
            request = framed.message
            if request.HasField("header"):
                if header is not None:
                    raise ParameterServerError(
                        f"replica {header.replica_id}'s push for step {header.step} has a second header; "
                        "a step carries one header, on its first message",
                        "INVALID_ARGUMENT",
                    )
                header = request.header
            if request.chunks and header is None:
                raise ParameterServerError(
                    "a Step message carries gradient chunks but no push header came first", "INVALID_ARGUMENT"
                )
            for chunk, content in framed.paired(request.chunks):
                assert header is not None
                servicer.receive_gradient(store, header, chunk, content, assemblers)
            if request.more:
                if header is None:
                    raise ParameterServerError(
                        "a Step message says more of a push follows, but no push header came first",
                        "INVALID_ARGUMENT",
                    )
                continue
            if header is None and not request.HasField("pull"):
                raise ParameterServerError("a Step message with neither a push nor a pull", "INVALID_ARGUMENT")
            wait_s = min(request.wait_s if request.wait_s > 0 else servicer.max_wait_s, servicer.max_wait_s)
            pushed = None
            if header is not None:
                await servicer.before_push(store, 0.5 * wait_s)  # half: the pull after it may wait too
                pushed = servicer.push(store, header, assemblers, request.nonfinite)
            release_all(assemblers)
            header = None
            if not request.HasField("pull"):
                assert pushed is not None
                yield b"".join([*length_delimited(_PUSH, [pushed.SerializeToString()]), _LAST])
                continue
            step, values, limit = await servicer.snapshot(store, request.pull, wait_s)
            servicer.counters.add(bytes_out=sum(value.nbytes for _, value in values.values()))
            for frame in _answer_frames(pushed, step, values, limit, request.pull.fuse):
                yield frame
            # Let go of the store's read-only views now: held until the next step, they would make its update
            # copy every tensor (copy on write) for nothing.
            del values
    finally:
        idle.close()
        release_all(assemblers)


def _answer_frames(
    pushed: pb.PushResponse | None,
    step: int,
    values: dict[str, tuple[int, np.ndarray]],
    limit: int,
    fuse: bool = False,
) -> Iterator[bytes]:
    """A step's answer as StepResponse frames of at most about one message's worth of content each; with
    ``fuse``, the small values of one dtype and version in one fused chunk each (fused.py)."""
    parts: list[Any] = length_delimited(_PUSH, [pushed.SerializeToString()]) if pushed is not None else []
    size = 0
    budget = MAX_MESSAGE_BYTES - _MESSAGE_SLACK
    heads: dict[int, bytes] = {}  # by version: a step's values share one, so it is serialized once
    groups = fused.answer_groups(values, limit) if fuse else ((v, [(n, a)]) for n, (v, a) in values.items())
    for version, members in groups:
        head = heads.get(version)
        if head is None:
            head = heads[version] = pb.PullMessage(global_step=step, version=version).SerializeToString()
        chunks = [fused.fused_parts(members)] if len(members) > 1 else chunk_parts(*members[0], limit)
        for chunk in chunks:
            value_parts = length_delimited(_VALUES, [head, *length_delimited(_CHUNK, chunk)])
            nbytes = parts_size(value_parts)
            if parts and size + nbytes > budget:
                yield b"".join(parts)
                parts, size = [], 0
            parts += value_parts
            size += nbytes
    yield b"".join([*parts, _LAST])
