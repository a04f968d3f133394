"""The parameter service's door: tokens and TLS, against real gRPC servers on port 0."""

from __future__ import annotations

import contextlib
import stat
import threading
import warnings
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest
import trustme
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from cellgraph.cluster.errors import ParameterServerError
from cellgraph.cluster.ps.auth import (
    HEALTH_PREFIX,
    TOKEN_HEADER,
    ClientTLS,
    ServerTLS,
    TokenAuthInterceptor,
    new_token,
    read_token_file,
    token_metadata,
    write_token_file,
)
from cellgraph.dataflow.cells import CellgraphWarning

TIMEOUT = 10  # seconds; every RPC below carries it

# ---------------------------------------------------------------- a test-only service with all four RPC kinds

KINDS = ["unary_unary", "unary_stream", "stream_unary", "stream_stream"]
METHODS = {
    "unary_unary": "UnaryUnary",
    "unary_stream": "UnaryStream",
    "stream_unary": "StreamUnary",
    "stream_stream": "StreamStream",
}


def echo_handler(ran: list[str]) -> grpc.GenericRpcHandler:
    """``test.Echo`` with bytes in and out; each body appends its kind to ``ran`` when it runs."""

    def unary_unary(request: bytes, context: grpc.ServicerContext) -> bytes:
        ran.append("unary_unary")
        return request

    def unary_stream(request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
        ran.append("unary_stream")
        yield request
        yield request

    def stream_unary(requests: Iterator[bytes], context: grpc.ServicerContext) -> bytes:
        ran.append("stream_unary")
        return b"".join(requests)

    def stream_stream(requests: Iterator[bytes], context: grpc.ServicerContext) -> Iterator[bytes]:
        ran.append("stream_stream")
        yield from requests

    # No (de)serializers: gRPC hands the raw bytes through.
    return grpc.method_handlers_generic_handler(
        "test.Echo",
        {
            "UnaryUnary": grpc.unary_unary_rpc_method_handler(unary_unary),
            "UnaryStream": grpc.unary_stream_rpc_method_handler(unary_stream),
            "StreamUnary": grpc.stream_unary_rpc_method_handler(stream_unary),
            "StreamStream": grpc.stream_stream_rpc_method_handler(stream_stream),
        },
    )


# What each kind answers to b"hi" (unary request) or [b"h", b"i"] (streamed request).
EXPECTED = {
    "unary_unary": [b"hi"],
    "unary_stream": [b"hi", b"hi"],
    "stream_unary": [b"hi"],
    "stream_stream": [b"h", b"i"],
}


def call(channel: grpc.Channel, kind: str, metadata: tuple[tuple[str, str], ...] | None = None) -> list[bytes]:
    """Call ``test.Echo`` by kind and return its responses as a list."""
    method = f"/test.Echo/{METHODS[kind]}"
    stub = getattr(channel, kind)(method)
    request = b"hi" if kind.startswith("unary") else iter([b"h", b"i"])
    answer = stub(request, timeout=TIMEOUT, metadata=metadata)
    return list(answer) if kind.endswith("stream") else [answer]


def check_health(channel: grpc.Channel, metadata: tuple[tuple[str, str], ...] | None = None) -> int:
    stub = health_pb2_grpc.HealthStub(channel)
    return stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=TIMEOUT, metadata=metadata).status


@contextlib.contextmanager
def serve(
    interceptor: TokenAuthInterceptor | None = None, tls: ServerTLS | None = None
) -> Iterator[tuple[int, list[str]]]:
    """A server with the health service and ``test.Echo``; yields its port and the bodies that ran."""
    ran: list[str] = []
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8), interceptors=[interceptor] if interceptor else [])
    health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
    server.add_generic_rpc_handlers((echo_handler(ran),))
    if tls is None:
        port = server.add_insecure_port("127.0.0.1:0")
    else:
        port = server.add_secure_port("127.0.0.1:0", tls.credentials())
    server.start()
    try:
        yield port, ran
    finally:
        server.stop(grace=None)


@contextlib.contextmanager
def channel_to(port: int, tls: ClientTLS | None = None, host: str = "127.0.0.1") -> Iterator[grpc.Channel]:
    target = f"{host}:{port}"
    channel = (
        grpc.insecure_channel(target)
        if tls is None
        else grpc.secure_channel(target, tls.credentials(), options=tls.channel_options())
    )
    with channel:
        yield channel


@pytest.fixture(scope="module")
def token() -> str:
    return new_token()


# ---------------------------------------------------------------- tokens on the wire


@pytest.mark.parametrize("kind", KINDS)
def test_right_token_reaches_the_handler(kind: str, token: str) -> None:
    auth = TokenAuthInterceptor(token)
    with serve(auth) as (port, ran), channel_to(port) as channel:
        assert call(channel, kind, token_metadata(token)) == EXPECTED[kind]
    assert ran == [kind]
    assert auth.rejected == 0


@pytest.mark.parametrize("kind", KINDS)
def test_missing_token_is_refused_before_the_handler(kind: str, token: str) -> None:
    auth = TokenAuthInterceptor(token)
    with serve(auth) as (port, ran), channel_to(port) as channel:
        with pytest.raises(grpc.RpcError) as info:
            call(channel, kind)
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert info.value.details() == (
        "missing token: every call to the parameter service must carry the job's token "
        "(metadata 'authorization: Bearer <token>')"
    )
    assert ran == []
    assert auth.rejected == 1


@pytest.mark.parametrize("kind", KINDS)
def test_wrong_token_is_refused_before_the_handler(kind: str, token: str) -> None:
    auth = TokenAuthInterceptor(token)
    guess = new_token()
    with serve(auth) as (port, ran), channel_to(port) as channel:
        with pytest.raises(grpc.RpcError) as info:
            call(channel, kind, token_metadata(guess))
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert info.value.details() == "wrong token for this parameter server"
    assert guess not in info.value.details() and token not in info.value.details()
    assert ran == []
    assert auth.rejected == 1


@pytest.mark.parametrize("kind", ["stream_unary", "stream_stream"])
def test_a_streaming_caller_is_refused_before_it_sends_anything(kind: str, token: str) -> None:
    # The refusal has the real handler's kind, so gRPC does not wait for a first
    # request message from an unauthenticated caller (a unary stand-in would).
    # The caller's requests block until the test has its answer: the answer
    # comes while it has sent nothing (a server waiting for a first request
    # would answer DEADLINE_EXCEEDED at the call's deadline, the requests'
    # wait being longer).
    release, ended = threading.Event(), threading.Event()

    def silent() -> Iterator[bytes]:
        release.wait(3 * TIMEOUT)
        ended.set()
        yield from ()

    with serve(TokenAuthInterceptor(token)) as (port, ran), channel_to(port) as channel:
        try:
            with pytest.raises(grpc.RpcError) as info:
                answer = getattr(channel, kind)(f"/test.Echo/{METHODS[kind]}")(silent(), timeout=TIMEOUT)
                if kind == "stream_stream":
                    list(answer)  # a streamed answer reports its status when read
            assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert not ended.is_set()  # answered while the request stream was held open, empty
        finally:
            release.set()
    assert ran == []


@pytest.mark.parametrize("value", ["Basic dXNlcjpwYXNz", "", "bearer-without-space"])
def test_a_header_without_a_bearer_token_counts_as_missing(value: str, token: str) -> None:
    with serve(TokenAuthInterceptor(token)) as (port, ran), channel_to(port) as channel:
        with pytest.raises(grpc.RpcError) as info:
            call(channel, "unary_unary", ((TOKEN_HEADER, value),))
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert info.value.details().startswith("missing token:")
    assert ran == []


def test_health_answers_without_a_token(token: str) -> None:
    auth = TokenAuthInterceptor(token)
    with serve(auth) as (port, ran), channel_to(port) as channel:
        assert check_health(channel) == health_pb2.HealthCheckResponse.SERVING
        # The exemption covers the health service only.
        with pytest.raises(grpc.RpcError) as info:
            call(channel, "unary_unary")
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert auth.rejected == 1


def test_exempt_prefixes_replace_the_default(token: str) -> None:
    auth = TokenAuthInterceptor(token, exempt_prefixes=("/test.Echo/Unary",))
    with serve(auth) as (port, ran), channel_to(port) as channel:
        assert call(channel, "unary_unary") == [b"hi"]
        assert call(channel, "unary_stream") == [b"hi", b"hi"]
        with pytest.raises(grpc.RpcError) as info:
            check_health(channel)  # no longer exempt
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert HEALTH_PREFIX == "/grpc.health.v1.Health/"


def test_unknown_method_is_unimplemented(token: str) -> None:
    with serve(TokenAuthInterceptor(token)) as (port, _), channel_to(port) as channel:
        with pytest.raises(grpc.RpcError) as info:
            channel.unary_unary("/test.Echo/Nope")(b"", timeout=TIMEOUT, metadata=token_metadata(token))
    assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_rejections_are_counted_across_threads(token: str) -> None:
    auth = TokenAuthInterceptor(token)
    with serve(auth) as (port, ran), channel_to(port) as channel:
        stub = channel.unary_unary("/test.Echo/UnaryUnary")
        calls = [stub.future(b"x", timeout=TIMEOUT) for _ in range(32)]
        codes = {c.exception(timeout=TIMEOUT).code() for c in calls}
    assert codes == {grpc.StatusCode.UNAUTHENTICATED}
    assert auth.rejected == 32 and ran == []


@pytest.mark.parametrize(
    ("bad", "words"),
    [
        ("", "TokenAuthInterceptor: the token is empty"),
        ("two words", "TokenAuthInterceptor: the token must be printable ASCII without spaces"),
    ],
)
def test_interceptor_refuses_a_token_that_cannot_travel(bad: str, words: str) -> None:
    with pytest.raises(ParameterServerError, match=words) as info:
        TokenAuthInterceptor(bad)
    assert info.value.code == "INVALID_ARGUMENT"


def test_token_metadata_and_new_token() -> None:
    first, second = new_token(), new_token()
    assert first != second and len(first) >= 43  # 32 random bytes, base64url
    assert token_metadata(first) == (("authorization", f"Bearer {first}"),)
    with pytest.raises(ParameterServerError, match="token_metadata: the token is empty"):
        token_metadata("")


# ---------------------------------------------------------------- token files


def test_write_token_file_is_owner_only_and_reads_back(tmp_path: Path, token: str) -> None:
    path = write_token_file(tmp_path / "job.token", token)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert read_token_file(path) == token


def test_write_token_file_tightens_an_existing_file(tmp_path: Path, token: str) -> None:
    path = tmp_path / "job.token"
    path.write_text("old")
    path.chmod(0o644)
    write_token_file(path, token)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_text() == token + "\n"


def test_write_token_file_refuses_an_empty_token(tmp_path: Path) -> None:
    with pytest.raises(ParameterServerError, match="token for '.*job.token': the token is empty"):
        write_token_file(tmp_path / "job.token", "")
    assert not (tmp_path / "job.token").exists()


def test_read_token_file_strips_whitespace(tmp_path: Path) -> None:
    path = tmp_path / "job.token"
    path.write_text("  abc-DEF_123 \n\n")
    path.chmod(0o600)
    assert read_token_file(str(path)) == "abc-DEF_123"


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (None, "does not exist"),
        ("", "is empty"),
        (" \n\t\n", "is empty"),
        ("two words", "the token must be printable ASCII without spaces"),
        ("dir", "cannot be read"),
    ],
)
def test_read_token_file_errors_name_the_file(tmp_path: Path, content: str | None, words: str) -> None:
    path = tmp_path / "job.token"
    if content == "dir":
        path.mkdir()
    elif content is not None:
        path.write_text(content)
        path.chmod(0o600)
    with pytest.raises(ParameterServerError, match=words) as info:
        read_token_file(path)
    assert f"token file '{path}'" in str(info.value)
    assert info.value.code == "INVALID_ARGUMENT"


def test_read_token_file_warns_once_when_others_can_read_it(tmp_path: Path, token: str) -> None:
    path = write_token_file(tmp_path / "job.token", token)
    path.chmod(0o640)
    with pytest.warns(CellgraphWarning) as record:
        assert read_token_file(path) == token
    assert len(record) == 1
    message = str(record[0].message)
    assert f"token file '{path}' is open to group or others (mode 0o640)" in message
    assert "anyone who can read it can call the parameter service" in message
    assert f"chmod 600 '{path}'" in message
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert read_token_file(path) == token  # once per path, not on every re-read


# ---------------------------------------------------------------- TLS


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="module")
def server_tls(ca: trustme.CA) -> ServerTLS:
    cert = ca.issue_cert("localhost", "127.0.0.1")
    return ServerTLS(b"".join(b.bytes() for b in cert.cert_chain_pems), cert.private_key_pem.bytes())


def client_identity(ca: trustme.CA) -> tuple[bytes, bytes]:
    cert = ca.issue_cert("worker-0")
    return b"".join(b.bytes() for b in cert.cert_chain_pems), cert.private_key_pem.bytes()


def test_tls_server_and_client(ca: trustme.CA, server_tls: ServerTLS) -> None:
    with serve(tls=server_tls) as (port, ran), channel_to(port, ClientTLS(root_ca=ca.cert_pem.bytes())) as channel:
        assert call(channel, "unary_unary") == [b"hi"]
        assert check_health(channel) == health_pb2.HealthCheckResponse.SERVING
    assert ran == ["unary_unary"]


def test_tls_server_name_override(ca: trustme.CA, server_tls: ServerTLS) -> None:
    root = ca.cert_pem.bytes()
    assert ClientTLS(root_ca=root).channel_options() == []
    good = ClientTLS(root_ca=root, server_name="localhost")
    bad = ClientTLS(root_ca=root, server_name="not-in-the-cert.example")
    assert good.channel_options() == [("grpc.ssl_target_name_override", "localhost")]
    with serve(tls=server_tls) as (port, _):
        with channel_to(port, good) as channel:
            assert call(channel, "unary_unary") == [b"hi"]
        with channel_to(port, bad) as channel, pytest.raises(grpc.RpcError) as info:
            call(channel, "unary_unary")
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE


def test_insecure_client_cannot_talk_to_a_tls_server(server_tls: ServerTLS) -> None:
    with serve(tls=server_tls) as (port, ran), channel_to(port) as channel:
        with pytest.raises(grpc.RpcError) as info:
            call(channel, "unary_unary")
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    assert ran == []


def test_client_refuses_a_server_from_another_ca(server_tls: ServerTLS) -> None:
    stranger = ClientTLS(root_ca=trustme.CA().cert_pem.bytes())
    with serve(tls=server_tls) as (port, ran), channel_to(port, stranger) as channel:
        with pytest.raises(grpc.RpcError) as info:
            call(channel, "unary_unary")
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    assert ran == []


def test_mutual_tls_requires_a_client_certificate_from_the_ca(ca: trustme.CA, server_tls: ServerTLS) -> None:
    root = ca.cert_pem.bytes()
    mutual = ServerTLS(server_tls.cert_chain, server_tls.private_key, client_ca=root)
    chain, key = client_identity(ca)
    other_chain, other_key = client_identity(trustme.CA())
    with serve(tls=mutual) as (port, ran):
        with channel_to(port, ClientTLS(root_ca=root, cert_chain=chain, private_key=key)) as channel:
            assert call(channel, "stream_stream") == [b"h", b"i"]
        for refused in (
            ClientTLS(root_ca=root),
            ClientTLS(root_ca=root, cert_chain=other_chain, private_key=other_key),
        ):
            with channel_to(port, refused) as channel, pytest.raises(grpc.RpcError) as info:
                call(channel, "unary_unary")
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    assert ran == ["stream_stream"]


def test_tls_and_token_together(ca: trustme.CA, server_tls: ServerTLS, token: str) -> None:
    auth = TokenAuthInterceptor(token)
    client = ClientTLS(root_ca=ca.cert_pem.bytes())
    with serve(auth, tls=server_tls) as (port, ran), channel_to(port, client) as channel:
        assert call(channel, "unary_stream", token_metadata(token)) == [b"hi", b"hi"]
        with pytest.raises(grpc.RpcError) as info:
            call(channel, "unary_stream")
        assert check_health(channel) == health_pb2.HealthCheckResponse.SERVING
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert ran == ["unary_stream"] and auth.rejected == 1


def test_tls_from_files(tmp_path: Path, ca: trustme.CA) -> None:
    cert = ca.issue_cert("localhost", "127.0.0.1")
    cert.cert_chain_pems[0].write_to_path(str(tmp_path / "server.pem"))
    cert.private_key_pem.write_to_path(str(tmp_path / "server.key"))
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    worker = ca.issue_cert("worker-0")
    worker.cert_chain_pems[0].write_to_path(str(tmp_path / "worker.pem"))
    worker.private_key_pem.write_to_path(str(tmp_path / "worker.key"))

    server = ServerTLS.from_files(tmp_path / "server.pem", tmp_path / "server.key", tmp_path / "ca.pem")
    client = ClientTLS.from_files(
        tmp_path / "ca.pem", tmp_path / "worker.pem", str(tmp_path / "worker.key"), server_name="localhost"
    )
    assert server.client_ca == ca.cert_pem.bytes()
    with serve(tls=server) as (port, ran), channel_to(port, client) as channel:
        assert call(channel, "stream_unary") == [b"hi"]
    assert ran == ["stream_unary"]


@pytest.mark.parametrize(
    ("load", "words"),
    [
        (
            lambda d: ServerTLS.from_files(d / "none.pem", d / "key.pem"),
            "TLS certificate chain file '{d}/none.pem' does not exist",
        ),
        (
            lambda d: ServerTLS.from_files(d / "cert.pem", d / "none.key"),
            "TLS private key file '{d}/none.key' does not exist",
        ),
        (
            lambda d: ServerTLS.from_files(d / "cert.pem", d / "key.pem", d / "none.pem"),
            "TLS client CA file '{d}/none.pem' does not exist",
        ),
        (lambda d: ClientTLS.from_files(ca_file=d / "none.pem"), "TLS CA file '{d}/none.pem' does not exist"),
        (lambda d: ClientTLS.from_files(ca_file=d / "empty.pem"), "TLS CA file '{d}/empty.pem' is empty"),
        (lambda d: ClientTLS.from_files(ca_file=d), "TLS CA file '{d}' cannot be read"),
        (
            lambda d: ClientTLS.from_files(cert_file=d / "cert.pem"),
            "ClientTLS needs both cert_chain and private_key for a client certificate, or neither",
        ),
        (lambda d: ServerTLS(b"", b"key"), "ServerTLS needs both a certificate chain and a private key"),
    ],
)
def test_tls_errors_name_the_file(tmp_path: Path, load: Callable[[Path], object], words: str) -> None:
    for name in ("cert.pem", "key.pem"):
        (tmp_path / name).write_bytes(b"-----BEGIN PLACEHOLDER-----\n")
    (tmp_path / "empty.pem").write_bytes(b"")
    with pytest.raises(ParameterServerError) as info:
        load(tmp_path)
    assert words.format(d=tmp_path) in str(info.value)
    assert info.value.code == "INVALID_ARGUMENT"
