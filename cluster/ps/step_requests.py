"""A step's StepRequest frames, joined from a kept recipe of the step's shape.

A replica sends the same gradients step after step: the same names, dtypes
and shapes, so the same chunks (``fused.chunk_plans``) and the same split into
messages. That shape is worked out once into a recipe (``step_recipe``): each
message as its fixed bytes and the places of the gradients' bytes between
them. A step then joins the header, the recipe's pieces with the gradients in
their places, and the pull: one ``b"".join`` a message, the one copy of the
gradients' bytes. Building the pieces again each step, generators and all,
cost a small step about 25 us of the client's CPU on this machine, a tenth
of its round trip (BENCHMARKS.md section 4).

Examples
--------
>>> import numpy as np
>>> from cellgraph.cluster.ps.config import VariableSpec
>>> w = VariableSpec("w", np.dtype("float32"), (4,))
>>> header = pb.PushHeader(replica_id=0, step=3)
>>> [frame] = step_frames([(w, np.ones(4, np.float32))], header, pb.PullRequest(names=["w"]), 1.0, 1 << 20)
>>> request = pb.StepRequest.FromString(frame)
>>> request.header.step, request.chunks[0].name, request.more, list(request.pull.names)
(3, 'w', False, ['w'])
>>> [len(message) for message in step_recipe(fused.entries([(w, np.ones(4, np.float32))]), 1 << 20)]
[2]
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from functools import lru_cache
from typing import Any

import numpy as np

from cellgraph.protos import parameter_service_pb2 as pb

from . import fused
from .chunks import MAX_MESSAGE_BYTES, wire_view
from .config import VariableSpec
from .frames import field_prefix, length_delimited, varint

_HEADER = pb.StepRequest.DESCRIPTOR.fields_by_name["header"].number
_CHUNKS = pb.StepRequest.DESCRIPTOR.fields_by_name["chunks"].number
_MORE = varint(pb.StepRequest.DESCRIPTOR.fields_by_name["more"].number << 3) + b"\x01"
_PULL = pb.StepRequest.DESCRIPTOR.fields_by_name["pull"].number
_WAIT = varint(pb.StepRequest.DESCRIPTOR.fields_by_name["wait_s"].number << 3 | 1)  # a double: 8 bytes follow
_NONFINITE = pb.StepRequest.DESCRIPTOR.fields_by_name["nonfinite"].number
# A step whose gradients (and their chunks' headers) fit in this many bytes is one message.
ONE_MESSAGE_BYTES = MAX_MESSAGE_BYTES - 64 * 1024

# A gradient's bytes in a message: (index of the gradient, first byte, end byte).
Slot = tuple[int, int, int]
Message = tuple[bytes | Slot, ...]


def step_frames(
    pieces: Sequence[tuple[VariableSpec, np.ndarray]],
    header: pb.PushHeader | None,
    pull: pb.PullRequest | bytes | None,
    wait_s: float,
    max_chunk: int,
    nonfinite: str = "",
) -> Iterator[bytes]:
    """A step's StepRequest frames: the header, the gradients' chunks packed into messages of up to about
    ``ONE_MESSAGE_BYTES`` (``more`` set on all but the last), and the pull on the last one (with
    ``nonfinite``, what the replica found wrong with a gradient of the push, when it did: nonfinite.py).

    A step of several messages makes each one as the stream asks for it: each
    is joined (the one copy of its gradients' bytes) while gRPC sends the one
    before, not all of a big push before its first byte leaves."""
    wire = pull.SerializeToString() if isinstance(pull, pb.PullRequest) else pull  # or serialized already
    tail = b"".join(length_delimited(_PULL, [wire]) if wire is not None else []) + _WAIT
    tail += struct.pack("<d", wait_s)
    if nonfinite:
        tail += b"".join(length_delimited(_NONFINITE, [nonfinite.encode()]))
    head: list[bytes] = length_delimited(_HEADER, [header.SerializeToString()]) if header is not None else []
    arrays = [array for _, array in pieces]
    recipe = step_recipe(fused.entries(pieces), max_chunk) if pieces else ((),)
    if len(recipe) == 1:
        return iter((b"".join([*head, *_filled(recipe[0], arrays), tail]),))
    return _each_message(recipe, arrays, head, tail)


def _each_message(
    recipe: tuple[Message, ...], arrays: list[np.ndarray], head: list[bytes], tail: bytes
) -> Iterator[bytes]:
    last = len(recipe) - 1
    for i, message in enumerate(recipe):
        yield b"".join([*(head if i == 0 else []), *_filled(message, arrays), tail if i == last else _MORE])


def _filled(message: Message, arrays: list[np.ndarray]) -> list[Any]:
    """``message``'s pieces with the gradients' bytes in their slots (views: the join copies them)."""
    return [item if isinstance(item, bytes) else wire_view(arrays[item[0]], item[1], item[2]) for item in message]


@lru_cache(maxsize=256)
def step_recipe(tensors: tuple[fused.Entry, ...], max_chunk: int) -> tuple[Message, ...]:
    """The messages a push of tensors of these names, dtypes and shapes goes in, each as its fixed bytes and
    slots (without the step's header, ``more`` and last message's pull: ``step_frames`` adds them)."""
    messages: list[Message] = []
    items: list[bytes | Slot] = []
    size = 0
    for plan in fused.chunk_plans(tensors, max_chunk):
        prefix = field_prefix(_CHUNKS, plan.nbytes)  # the chunk as a field of the StepRequest
        nbytes = len(prefix) + plan.nbytes
        if size and size + nbytes > ONE_MESSAGE_BYTES:
            messages.append(tuple(items))
            items, size = [], 0
        items.append(prefix + plan.head)
        items += plan.sources
        size += nbytes
    messages.append(tuple(items))
    return tuple(messages)


__all__ = ["ONE_MESSAGE_BYTES", "step_frames", "step_recipe"]
