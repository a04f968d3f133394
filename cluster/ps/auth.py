"""Who may talk to a parameter server: a per-job token on every call, and TLS.

A parameter server holds a job's weights and applies whatever gradients it is
sent, so anyone who can reach its port can read the model or wreck it. Every
call therefore carries the job's token (``authorization: Bearer <token>``
metadata), checked by :class:`TokenAuthInterceptor` before any handler runs.
The token proves the caller belongs to the job; it does not hide the traffic.
On a network you do not trust, add TLS (:class:`ServerTLS`, :class:`ClientTLS`)
so the token and the tensors travel encrypted, and optionally mutual TLS so
only holders of a certificate from your CA can even connect.

Example
-------
>>> token = new_token()
>>> interceptor = TokenAuthInterceptor(token)
>>> server = grpc.server(executor, interceptors=[interceptor])  # doctest: +SKIP
>>> stub.Pull(request, metadata=token_metadata(token), timeout=10)  # doctest: +SKIP
"""

from __future__ import annotations

import hmac
import os
import secrets
import stat
import threading
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from cellgraph.dataflow.cells import CellgraphWarning

from ..errors import ParameterServerError

TOKEN_HEADER = "authorization"  # noqa: S105 -- a metadata key, not a secret
# Orchestrators (Kubernetes probes, load balancers) check health without the
# job's secret; the health service reveals only SERVING / NOT_SERVING.
HEALTH_PREFIX = "/grpc.health.v1.Health/"

_BEARER = "Bearer "
MISSING_TOKEN = (
    "missing token: every call to the parameter service must carry the job's token "
    f"(metadata '{TOKEN_HEADER}: {_BEARER}<token>')"
)
WRONG_TOKEN = "wrong token for this parameter server"  # noqa: S105 -- an error message

# Paths already warned about, so a client that re-reads its token file on
# every reconnect does not repeat the same warning.
_warned_paths: set[str] = set()
_warned_lock = threading.Lock()


def new_token() -> str:
    """A fresh random token for one job (256 bits, URL-safe text)."""
    return secrets.token_urlsafe(32)


def _check_token(token: str, where: str) -> str:
    """Return ``token`` if it can travel as gRPC metadata, else raise naming ``where``."""
    if not token:
        raise ParameterServerError(f"{where}: the token is empty", "INVALID_ARGUMENT")
    # gRPC sends ASCII metadata values as-is; anything else fails deep inside the
    # channel with a message that does not mention the token.
    if not all(33 <= ord(c) <= 126 for c in token):
        raise ParameterServerError(
            f"{where}: the token must be printable ASCII without spaces (it travels as gRPC metadata)",
            "INVALID_ARGUMENT",
        )
    return token


def read_token_file(path: str | Path) -> str:
    """Read a job's token from ``path`` (surrounding whitespace is ignored).

    Warns, once per path, when the file is open to group or others: whoever can
    read it can call the parameter service.

    Raises
    ------
    ParameterServerError
        ``INVALID_ARGUMENT`` when the file is missing, unreadable or empty.

    Example
    -------
    >>> token = read_token_file("~/.cellgraph/job.token")  # doctest: +SKIP
    """
    path = Path(path).expanduser()
    try:
        text = path.read_text(encoding="utf-8")
        mode = path.stat().st_mode
    except FileNotFoundError:
        raise ParameterServerError(f"token file '{path}' does not exist", "INVALID_ARGUMENT") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ParameterServerError(f"token file '{path}' cannot be read: {exc}", "INVALID_ARGUMENT") from exc
    token = text.strip()
    if not token:
        raise ParameterServerError(f"token file '{path}' is empty", "INVALID_ARGUMENT")
    _check_token(token, f"token file '{path}'")
    if mode & 0o077:
        with _warned_lock:
            first = str(path) not in _warned_paths
            _warned_paths.add(str(path))
        if first:
            warnings.warn(
                f"token file '{path}' is open to group or others (mode {stat.S_IMODE(mode):#o}); "
                f"anyone who can read it can call the parameter service: chmod 600 '{path}'",
                CellgraphWarning,
                stacklevel=2,
            )
    return token


def write_token_file(path: str | Path, token: str) -> Path:
    """Write ``token`` to ``path``, readable and writable by its owner only (mode 0o600)."""
    path = Path(path).expanduser()
    _check_token(token, f"token for '{path}'")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        # O_CREAT's mode applies only to a new file: tighten an existing one
        # before the secret is written into it.
        os.fchmod(fd, 0o600)
        os.write(fd, (token + "\n").encode("ascii"))
    finally:
        os.close(fd)
    return path


def token_metadata(token: str) -> tuple[tuple[str, str], ...]:
    """The metadata a client adds to every call: ``(("authorization", "Bearer <token>"),)``."""
    _check_token(token, "token_metadata")
    return ((TOKEN_HEADER, _BEARER + token),)


class TokenAuthInterceptor(grpc.ServerInterceptor):
    """Refuse, with ``UNAUTHENTICATED``, every call that does not carry the job's token.

    Methods whose full name starts with one of ``exempt_prefixes`` (by default
    the health service) pass without a token. A refused call never reaches its
    handler, so it reads and changes nothing. ``rejected`` counts refusals.

    Example
    -------
    >>> server = grpc.server(executor, interceptors=[TokenAuthInterceptor(token)])  # doctest: +SKIP
    """

    def __init__(self, token: str, exempt_prefixes: Sequence[str] = (HEALTH_PREFIX,)) -> None:
        self._token = _check_token(token, "TokenAuthInterceptor").encode("ascii")
        self._exempt = tuple(exempt_prefixes)
        self._lock = threading.Lock()
        self._rejected = 0

    @property
    def rejected(self) -> int:
        """How many calls were refused so far."""
        with self._lock:
            return self._rejected

    def _token_problem(self, metadata: Sequence[tuple[str, str | bytes]] | None) -> str | None:
        """Why a call with this metadata is refused, or ``None`` to let it through."""
        # A client can send the header more than once; only the first counts,
        # so an extra copy cannot be used to try a second token.
        value = next((v for k, v in metadata or () if k == TOKEN_HEADER), None)
        if not isinstance(value, str) or not value.startswith(_BEARER):
            return MISSING_TOKEN
        sent = value[len(_BEARER) :].strip().encode("utf-8")
        # Constant time, so response timing does not leak how much of a guess was right.
        if not hmac.compare_digest(sent, self._token):
            return WRONG_TOKEN
        return None

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        # Looking up the handler runs nothing; it only tells us the call's kind.
        handler = continuation(handler_call_details)
        reason = self.refusal(handler, handler_call_details)
        if reason is None:
            return handler
        assert handler is not None

        # One body serves all four kinds: it raises before a response (or a response
        # iterator) is needed, and it never reads the request (iterator).
        def abort(request: Any, context: grpc.ServicerContext) -> Any:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, reason)

        return _same_kind(handler, abort, abort)

    def refusal(self, handler: grpc.RpcMethodHandler | None, details: grpc.HandlerCallDetails) -> str | None:
        """Why the call is refused (and counted), or None when it may go on.

        An exempt method (health) goes on. So does an unknown one (no handler):
        gRPC answers UNIMPLEMENTED, which tells a caller without the token only
        that the name does not exist.
        """
        if handler is None or details.method.startswith(self._exempt):
            return None
        reason = self._token_problem(details.invocation_metadata)
        if reason is not None:
            with self._lock:
                self._rejected += 1
        return reason


def _same_kind(handler: grpc.RpcMethodHandler, unary: Any, streaming: Any) -> grpc.RpcMethodHandler:
    """A stand-in of the same kind as ``handler`` that runs ``unary`` (``streaming`` where it streams a response).

    gRPC drives a handler by its kind (unary or streaming on each side), so the
    stand-in must match it. It gets no request deserializer: a message from a
    caller we have not authenticated is never parsed.
    """
    serializer = handler.response_serializer
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(streaming, None, serializer)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(unary, None, serializer)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(streaming, None, serializer)
    return grpc.unary_unary_rpc_method_handler(unary, None, serializer)


class AsyncTokenAuthInterceptor(grpc.aio.ServerInterceptor):
    """``TokenAuthInterceptor`` for a ``grpc.aio`` server (the parameter server's): the same checks and count.

    Example
    -------
    >>> server = grpc.aio.server(interceptors=[AsyncTokenAuthInterceptor(token)])  # doctest: +SKIP
    """

    def __init__(self, token: str, exempt_prefixes: Sequence[str] = (HEALTH_PREFIX,)) -> None:
        self._check = TokenAuthInterceptor(token, exempt_prefixes)

    @property
    def rejected(self) -> int:
        """How many calls were refused so far."""
        return self._check.rejected

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        handler = await continuation(handler_call_details)
        reason = self._check.refusal(handler, handler_call_details)
        if reason is None:
            return handler
        assert handler is not None

        async def abort(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, reason)

        async def abort_stream(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[Any]:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, reason)
            yield  # an async generator, as gRPC expects of a streaming response

        return _same_kind(handler, abort, abort_stream)


def _read_bytes(path: str | Path, what: str) -> bytes:
    """The contents of a PEM file, or an error naming the file and its role."""
    path = Path(path).expanduser()
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ParameterServerError(f"{what} file '{path}' does not exist", "INVALID_ARGUMENT") from None
    except OSError as exc:
        raise ParameterServerError(f"{what} file '{path}' cannot be read: {exc}", "INVALID_ARGUMENT") from exc
    if not data.strip():
        raise ParameterServerError(f"{what} file '{path}' is empty", "INVALID_ARGUMENT")
    return data


@dataclass(frozen=True)
class ServerTLS:
    """A parameter server's TLS identity (PEM bytes).

    With ``client_ca`` set, clients must present a certificate issued by that CA
    (mutual TLS); without it, any client may connect and the token decides.

    Example
    -------
    >>> tls = ServerTLS.from_files("server.pem", "server.key", client_ca_file="ca.pem")  # doctest: +SKIP
    >>> server.add_secure_port("0.0.0.0:0", tls.credentials())  # doctest: +SKIP
    """

    cert_chain: bytes
    private_key: bytes
    client_ca: bytes | None = None

    def __post_init__(self) -> None:
        if not self.cert_chain or not self.private_key:
            raise ParameterServerError(
                "ServerTLS needs both a certificate chain and a private key (PEM bytes)", "INVALID_ARGUMENT"
            )

    @classmethod
    def from_files(
        cls, cert_file: str | Path, key_file: str | Path, client_ca_file: str | Path | None = None
    ) -> ServerTLS:
        """Load the server's certificate chain, its key and (for mutual TLS) the client CA."""
        return cls(
            cert_chain=_read_bytes(cert_file, "TLS certificate chain"),
            private_key=_read_bytes(key_file, "TLS private key"),
            client_ca=None if client_ca_file is None else _read_bytes(client_ca_file, "TLS client CA"),
        )

    def credentials(self) -> grpc.ServerCredentials:
        """Credentials for ``server.add_secure_port``."""
        return grpc.ssl_server_credentials(
            [(self.private_key, self.cert_chain)],
            root_certificates=self.client_ca,
            require_client_auth=self.client_ca is not None,
        )


@dataclass(frozen=True)
class ClientTLS:
    """How a client checks the server and, for mutual TLS, proves itself (PEM bytes).

    ``root_ca=None`` trusts the system's CAs. ``server_name`` overrides the name
    the server's certificate must carry, for when you dial an address that is
    not in it (an IP, a tunnel).

    Example
    -------
    >>> tls = ClientTLS.from_files(ca_file="ca.pem", cert_file="worker.pem", key_file="worker.key")  # doctest: +SKIP
    >>> grpc.secure_channel(address, tls.credentials(), options=tls.channel_options())  # doctest: +SKIP
    """

    root_ca: bytes | None = None
    cert_chain: bytes | None = None
    private_key: bytes | None = None
    server_name: str | None = None

    def __post_init__(self) -> None:
        # Half a client identity would be silently dropped by the handshake and
        # surface later as the server's "no certificate" refusal.
        if (self.cert_chain is None) != (self.private_key is None):
            raise ParameterServerError(
                "ClientTLS needs both cert_chain and private_key for a client certificate, or neither",
                "INVALID_ARGUMENT",
            )

    @classmethod
    def from_files(
        cls,
        ca_file: str | Path | None = None,
        cert_file: str | Path | None = None,
        key_file: str | Path | None = None,
        server_name: str | None = None,
    ) -> ClientTLS:
        """Load the CA to trust and (for mutual TLS) the client's certificate chain and key."""
        return cls(
            root_ca=None if ca_file is None else _read_bytes(ca_file, "TLS CA"),
            cert_chain=None if cert_file is None else _read_bytes(cert_file, "TLS certificate chain"),
            private_key=None if key_file is None else _read_bytes(key_file, "TLS private key"),
            server_name=server_name,
        )

    def credentials(self) -> grpc.ChannelCredentials:
        """Credentials for ``grpc.secure_channel``."""
        return grpc.ssl_channel_credentials(
            root_certificates=self.root_ca, private_key=self.private_key, certificate_chain=self.cert_chain
        )

    def channel_options(self) -> list[tuple[str, str]]:
        """Channel options for ``grpc.secure_channel`` (the target-name override, when set)."""
        return [] if self.server_name is None else [("grpc.ssl_target_name_override", self.server_name)]
