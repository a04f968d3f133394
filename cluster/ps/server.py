"""The parameter server: a gRPC service in front of one shard's store.

The RPCs themselves are ``servicer.ParameterServicer``'s; this module hosts
them: a ``grpc.aio`` server on an event loop of its own thread, with the
token interceptor, TLS and the standard health service.

``create_server(address, token=...)`` returns ``(server, port)`` so tests bind
port 0. Authentication is on unless ``token=None`` is passed on purpose; TLS
is the ``tls=`` argument; the standard health service answers without a token.

Examples
--------
>>> from cellgraph.cluster.ps import ParameterClient, create_server, new_token
>>> import numpy as np
>>> token = new_token()
>>> server, port = create_server("127.0.0.1:0", token=token)
>>> client = ParameterClient([f"127.0.0.1:{port}"], token=token)
>>> client.init("demo", {"w": np.zeros(3, np.float32)})
0
>>> client.close(); server.stop(None).wait()
True
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio

from cellgraph.protos import parameter_service_pb2 as pb

from ..errors import ParameterServerError
from .aio_layer import keep_grpc_aio_up
from .auth import AsyncTokenAuthInterceptor, ServerTLS
from .chunks import MAX_CHUNK_BYTES, MAX_MESSAGE_BYTES
from .door import lenient
from .frames import chunk_fields, serialize
from .malloc import tune_malloc
from .servicer import (
    DEFAULT_HELD_IDLE_S,
    DEFAULT_INIT_WAIT_S,
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_WAIT_S,
    DEFAULT_STREAM_IDLE_S,
    ParameterServicer,
)

SERVICE_NAME = "cellgraph.ParameterService"
# How long stop() lets the calls in flight finish when asked for no grace, and how long it waits for the loop.
STOP_WAIT_S = 30.0


def _method_handlers(servicer: ParameterServicer) -> dict[str, grpc.RpcMethodHandler]:
    """The handlers the generated ``add_ParameterServiceServicer_to_server`` would register, except that a
    response may be a frame serialized by hand (``tensor_chunk_frames``)."""
    kinds = {
        (False, False): grpc.unary_unary_rpc_method_handler,
        (False, True): grpc.unary_stream_rpc_method_handler,
        (True, False): grpc.stream_unary_rpc_method_handler,
        (True, True): grpc.stream_stream_rpc_method_handler,
    }
    handlers = {}
    for method in pb.DESCRIPTOR.services_by_name["ParameterService"].methods:
        kind = kinds[method.client_streaming, method.server_streaming]
        request = getattr(pb, method.input_type.name)
        # Requests that carry tensor chunks are read without protobuf's copy of their contents.
        framed = bool(chunk_fields(request.DESCRIPTOR))
        handlers[method.name] = kind(getattr(servicer, method.name), lenient(request, framed), serialize)
    return handlers


class ParameterServer:
    """A running parameter server: a ``grpc.aio`` server on an event loop of its own thread.

    Its face is synchronous, like ``grpc.Server``'s, for the plugin, the CLI and
    the tests: ``stop(grace)`` returns an event set once it has stopped, and
    ``wait_for_termination(timeout)`` blocks. ``servicer`` is the shard's servicer.
    """

    def __init__(
        self, server: grpc.aio.Server, servicer: ParameterServicer, loop: asyncio.AbstractEventLoop, address: str
    ) -> None:
        self._server = server
        self.servicer = servicer
        self._loop = loop
        self._address = address
        self._stopped = threading.Event()
        self._stopping = False
        self._lock = threading.Lock()

    def stop(self, grace: float | None) -> threading.Event:
        """Wake every waiting call (UNAVAILABLE), let the others finish within ``grace`` seconds, then stop."""
        with self._lock:
            if not self._stopping:
                self._stopping = True
                if self._loop.is_closed():
                    self._stopped.set()
                else:
                    asyncio.run_coroutine_threadsafe(self._stop(grace), self._loop)
        return self._stopped

    async def _stop(self, grace: float | None) -> None:
        try:
            self.servicer.stopping(self._address)
            await self._server.stop(grace)
        finally:
            self._stopped.set()
            self._loop.call_soon(self._loop.stop)

    def wait_for_termination(self, timeout: float | None = None) -> bool:
        """Block until the server has stopped, at most ``timeout`` seconds; whether it has."""
        return self._stopped.wait(timeout)


def _run_loop(loop: asyncio.AbstractEventLoop) -> None:
    asyncio.set_event_loop(loop)
    try:
        loop.run_forever()
    finally:
        loop.close()


def create_server(
    address: str = "127.0.0.1:0",
    *,
    token: str | None,
    tls: ServerTLS | None = None,
    checkpoint_dir: str | Path | None = None,
    keep_checkpoints: int = 5,
    max_chunk_bytes: int = MAX_CHUNK_BYTES,
    max_bytes: int = DEFAULT_MAX_BYTES,
    max_wait_s: float = DEFAULT_MAX_WAIT_S,
    init_wait_s: float = DEFAULT_INIT_WAIT_S,
    stream_idle_s: float = DEFAULT_STREAM_IDLE_S,
    held_idle_s: float = DEFAULT_HELD_IDLE_S,
) -> tuple[ParameterServer, int]:
    """Start a parameter server on ``address``; return the running server and its port.

    The server is asynchronous (``grpc.aio``) on an event loop of its own
    thread: a call waiting for a step holds a future, not a thread, so any
    number of replicas may wait on one shard, and health checks answer whatever
    the calls in progress.

    Parameters
    ----------
    address
        ``host:port``, an IPv6 host in brackets (``[::1]:0``; ``host_port`` makes
        one); port 0 picks a free port. Bind to 127.0.0.1 (the default) unless
        other machines must reach it.
    token
        The job's token: every call but the health check must carry it.
        ``None`` turns authentication off, and must be asked for explicitly.
    tls
        Certificates for TLS (and, with ``client_ca``, for checking clients'
        certificates). Plain TCP when ``None``.
    checkpoint_dir
        Where ``Save`` writes and ``Restore`` reads; ``keep_checkpoints`` are kept.
    max_bytes, init_wait_s
        The most bytes of variables one Init may declare (and never more than
        this machine's available memory); how long an Init waits for another
        one in progress before DEADLINE_EXCEEDED.
    stream_idle_s
        How long an Init or Push stream, or a push in pieces on a Step stream,
        may send nothing before it is ended (DEADLINE_EXCEEDED) and its
        buffers dropped; and how long a Pull or Step caller may take nothing
        of its answer (it stopped reading) before it is ended likewise.
    held_idle_s
        How long a replica's Step stream may stay silent between steps (it
        holds no buffer then) before it is ended; the replica reopens it.

    Examples
    --------
    >>> server, port = create_server("127.0.0.1:0", token="s3cret")
    >>> port > 0
    True
    >>> server.stop(None).wait()
    True
    """
    _check_settings(address, checkpoint_dir, keep_checkpoints)
    tune_malloc()  # this process moves tensors in 4 MiB messages: keep their buffers (malloc.py)
    auth = AsyncTokenAuthInterceptor(token) if token is not None else None
    servicer = ParameterServicer(
        checkpoint_dir=checkpoint_dir,
        keep_checkpoints=keep_checkpoints,
        max_chunk_bytes=max_chunk_bytes,
        max_bytes=max_bytes,
        max_wait_s=max_wait_s,
        init_wait_s=init_wait_s,
        stream_idle_s=stream_idle_s,
        held_idle_s=held_idle_s,
        auth=auth,
    )
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=_run_loop, args=(loop,), name=f"cellgraph-ps-{address}", daemon=True)
    thread.start()
    try:
        server, port = asyncio.run_coroutine_threadsafe(_start(address, servicer, auth, tls), loop).result()
    except BaseException:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(STOP_WAIT_S)
        raise
    return ParameterServer(server, servicer, loop, f"{address.rsplit(':', 1)[0]}:{port}"), port


def host_port(host: str, port: int) -> str:
    """``host:port`` for gRPC and for clients: an IPv6 host is bracketed (gRPC read ``::1:0`` as host ``::1:0``).

    Examples
    --------
    >>> host_port("::1", 0), host_port("[::1]", 5000), host_port("127.0.0.1", 0), host_port("localhost", 80)
    ('[::1]:0', '[::1]:5000', '127.0.0.1:0', 'localhost:80')
    """
    if ":" in host and not (host.startswith("[") and host.endswith("]")):
        return f"[{host}]:{port}"
    return f"{host}:{port}"


def _check_settings(address: str, checkpoint_dir: str | Path | None, keep_checkpoints: int) -> None:
    """Refuse, naming it, a setting that served wrongly: gRPC took port -1 as 65535 and 70000 as 4464, a
    checkpoint directory that is a file failed at the first Save, and keep_checkpoints 0 kept none."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or int(port) > 65535:
        raise ParameterServerError(
            f"address {address!r} needs a port in 0..65535 after the host (0 picks a free one), like 127.0.0.1:0",
            "INVALID_ARGUMENT",
        )
    if ":" in host and not (host.startswith("[") and host.endswith("]")):  # "::1:0" could be a port or not
        raise ParameterServerError(
            f"address {address!r}: an IPv6 host needs brackets before the port, like [::1]:0 (host_port() makes one)",
            "INVALID_ARGUMENT",
        )
    if checkpoint_dir is not None and Path(checkpoint_dir).exists() and not Path(checkpoint_dir).is_dir():
        raise ParameterServerError(
            f"checkpoint directory '{checkpoint_dir}' is a file, not a folder: give a folder (made if missing)",
            "INVALID_ARGUMENT",
        )
    if isinstance(keep_checkpoints, bool) or not isinstance(keep_checkpoints, int) or keep_checkpoints < 1:
        raise ParameterServerError(
            f"keep_checkpoints must be 1 or more (Restore reads the newest kept), got {keep_checkpoints!r}",
            "INVALID_ARGUMENT",
        )


async def _start(
    address: str, servicer: ParameterServicer, auth: AsyncTokenAuthInterceptor | None, tls: ServerTLS | None
) -> tuple[grpc.aio.Server, int]:
    """Make, bind and start the aio server, on the loop that will run it."""
    keep_grpc_aio_up()
    options = [
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        # Two servers must never share a port silently.
        ("grpc.so_reuseport", 0),
    ]
    server = grpc.aio.server(interceptors=[auth] if auth is not None else [], options=options)
    handlers = _method_handlers(servicer)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
    health_servicer = health_aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    try:
        port = (
            server.add_secure_port(address, tls.credentials()) if tls is not None else server.add_insecure_port(address)
        )
    except RuntimeError:  # grpcio >= 1.57 raises where older versions returned port 0
        port = 0
    if port == 0:
        await server.stop(None)
        # gRPC refuses a certificate and key that are not a PEM pair only here, as a bind that failed.
        pair = ", or the TLS certificate and key not a matching PEM pair" if tls is not None else ""
        raise ParameterServerError(
            f"could not bind the parameter server to {address}: is the port in use, or the address not this "
            f"machine's{pair}?",
            "UNAVAILABLE",
        )
    await server.start()
    for service in ("", SERVICE_NAME):
        await health_servicer.set(service, health_pb2.HealthCheckResponse.SERVING)
    return server, port


def serve_forever(server: ParameterServer, stop: threading.Event, grace_s: float = 5.0) -> None:
    """Block until ``stop`` is set, then stop ``server``, letting calls in flight finish within ``grace_s``."""
    with contextlib.suppress(KeyboardInterrupt):
        while not stop.wait(0.5):
            pass
    server.stop(grace_s).wait(grace_s + 1.0)
    close_servicer(server)


def close_servicer(server: ParameterServer) -> None:
    """After ``server.stop``: let its background checkpoint in progress finish."""
    servicer = getattr(server, "servicer", None)
    if isinstance(servicer, ParameterServicer):
        servicer.close()
