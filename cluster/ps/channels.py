"""A parameter client's channels to one shard: the blocking one and its stub, and the asyncio one of its
held Step streams. Both carry the same message limits and, for TLS servers, the same certificates.

Examples
--------
>>> channel = open_channel("127.0.0.1:1", tls=None)  # opens lazily: nothing is dialled yet
>>> stub = ServiceStub(channel)
>>> callable(stub.Init), callable(stub.Register)
(True, True)
>>> channel.close()
"""

from __future__ import annotations

import grpc
import grpc.experimental  # a submodule: ChannelOptions is not there until it is imported

from cellgraph.protos import parameter_service_pb2 as pb
from cellgraph.protos import parameter_service_pb2_grpc as pb_grpc

from .auth import ClientTLS
from .chunks import MAX_MESSAGE_BYTES
from .fanout import Cancellable
from .frames import serialize
from .server import SERVICE_NAME

_MESSAGE_LIMITS: list[tuple[str, int | str]] = [
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
]


class ServiceStub(pb_grpc.ParameterServiceStub):
    """The generated stub, except that Init sends frames serialized by hand (``tensor_chunk_frames``)."""

    def __init__(self, channel: grpc.Channel) -> None:
        super().__init__(channel)
        self.Init = channel.stream_unary(  # type: ignore[misc]
            f"/{SERVICE_NAME}/Init", request_serializer=serialize, response_deserializer=pb.InitResponse.FromString
        )
        # Every call of a fan-out over shards goes through _Cancellable, so a failed shard can cancel the others'.
        # (Push, Pull and PushPull are not used: steps go over the held Step stream, held.py.)
        for name in ("Init", "Register", "Save", "Restore", "Reconfigure", "Stats"):
            setattr(self, name, Cancellable(getattr(self, name)))


def open_channel(address: str, tls: ClientTLS | None) -> grpc.Channel:
    """The blocking channel of ``address``'s unary calls (Init, Register, Save, ...)."""
    options = [
        *_MESSAGE_LIMITS,
        # Read a Pull's messages on the calling thread, with no hop through a second thread per message.
        (grpc.experimental.ChannelOptions.SingleThreadedUnaryStream, 1),
    ]
    if tls is None:
        return grpc.insecure_channel(address, options=options)
    return grpc.secure_channel(address, tls.credentials(), options=options + list(tls.channel_options()))


def open_aio_channel(address: str, tls: ClientTLS | None) -> grpc.aio.Channel:
    """The asyncio channel of ``address``'s held Step streams (made on the step loop, held.py)."""
    if tls is None:
        return grpc.aio.insecure_channel(address, options=_MESSAGE_LIMITS)
    return grpc.aio.secure_channel(address, tls.credentials(), options=_MESSAGE_LIMITS + list(tls.channel_options()))
