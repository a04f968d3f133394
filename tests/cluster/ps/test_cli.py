"""``cellgraph ps``: the command line's own process, reached by real clients over 127.0.0.1."""

from __future__ import annotations

import re
import signal
import socket
import stat
from pathlib import Path

import grpc
import numpy as np
import pytest
import trustme
from grpc_health.v1 import health_pb2, health_pb2_grpc

from cellgraph.cluster.errors import ParameterServerError
from cellgraph.cluster.ps import (
    ClientTLS,
    OptimizerConfig,
    ParameterClient,
    create_server,
    new_token,
    write_token_file,
)
from cellgraph.cluster.ps.server import host_port

from .conftest import TIMEOUT
from .processes import START_S, PsProcess, cellgraph_ps, run_ps


@pytest.fixture
def token_file(tmp_path: Path) -> tuple[Path, str]:
    token = new_token()
    return write_token_file(tmp_path / "job.token", token), token


def train_one_step(client: ParameterClient) -> None:
    """Init, register, push and pull through ``client``: the service works end to end."""
    assert client.init("cli", {"w": np.arange(4, dtype=np.float32)}, OptimizerConfig("sgd", learning_rate=0.5)) == 0
    assert client.register(0).global_step == 0
    assert client.push({"w": np.ones(4, np.float32)}, step=0, replica_id=0).status == "applied"
    pulled = client.pull()
    np.testing.assert_array_equal(pulled.values["w"], np.arange(4, dtype=np.float32) - 0.5)
    assert pulled.global_step == 1


def health_of(address: str, credentials: grpc.ChannelCredentials | None = None) -> int:
    channel = grpc.insecure_channel(address) if credentials is None else grpc.secure_channel(address, credentials)
    with channel:
        stub = health_pb2_grpc.HealthStub(channel)
        return stub.Check(health_pb2.HealthCheckRequest(service="cellgraph.ParameterService"), timeout=TIMEOUT).status


# ---------------------------------------------------------------- serving and stopping


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_serves_with_a_token_file_and_stops_on_a_signal(token_file: tuple[Path, str], signum: int) -> None:
    path, token = token_file
    with cellgraph_ps("--port", "0", "--token-file", path) as ps:
        assert ps.settings == f"token from {path}, no TLS, no checkpoint directory"
        with ParameterClient([ps.address], token, timeout=TIMEOUT) as client:
            train_one_step(client)
        assert health_of(ps.address) == health_pb2.HealthCheckResponse.SERVING
        with ParameterClient([ps.address], new_token(), timeout=TIMEOUT) as stranger:
            with pytest.raises(ParameterServerError, match="refused Stats: wrong token for this parameter server"):
                stranger.stats()
        assert ps.stop(signum) == (0, "cellgraph ps: stopped")  # its waits have deadlines: a hang fails it
        assert ps.python_stderr() == ""


def test_new_token_writes_an_owner_only_token_file_that_then_works(tmp_path: Path) -> None:
    path = tmp_path / "fresh.token"
    with cellgraph_ps("--token-file", path, "--new-token") as ps:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        token = path.read_text().strip()
        assert len(token) >= 40
        with ParameterClient([ps.address], token, timeout=TIMEOUT) as client:
            train_one_step(client)
        assert ps.stop() == (0, "cellgraph ps: stopped")


def test_no_auth_serves_without_a_token() -> None:
    with cellgraph_ps("--no-auth") as ps:
        assert ps.settings == "NO authentication, no TLS, no checkpoint directory"
        with ParameterClient([ps.address], None, timeout=TIMEOUT) as client:
            train_one_step(client)
        assert ps.stop() == (0, "cellgraph ps: stopped")


def test_checkpoint_dir_is_where_save_writes(tmp_path: Path) -> None:
    directory = tmp_path / "ckpt"
    with cellgraph_ps("--no-auth", "--checkpoint-dir", directory) as ps:
        assert ps.settings == f"NO authentication, no TLS, checkpoints in {directory}"
        with ParameterClient([ps.address], None, timeout=TIMEOUT) as client:
            train_one_step(client)
            assert client.save() == "ckpt-0000000001"
        assert sorted(p.name for p in (directory / "ckpt-0000000001").iterdir()) == [
            "shard-0-of-1.json",
            "shard-0-of-1.safetensors",
        ]
        assert ps.stop() == (0, "cellgraph ps: stopped")


def test_tls_from_the_command_line(tmp_path: Path, token_file: tuple[Path, str]) -> None:
    ca = trustme.CA()
    cert = ca.issue_cert("localhost", "127.0.0.1")
    (tmp_path / "server.pem").write_bytes(b"".join(pem.bytes() for pem in cert.cert_chain_pems))
    cert.private_key_pem.write_to_path(str(tmp_path / "server.key"))
    path, token = token_file
    with cellgraph_ps(
        "--token-file", path, "--tls-cert", tmp_path / "server.pem", "--tls-key", tmp_path / "server.key"
    ) as ps:
        assert ps.settings == f"token from {path}, TLS, no checkpoint directory"
        tls = ClientTLS(root_ca=ca.cert_pem.bytes())
        with ParameterClient([ps.address], token, tls=tls, timeout=TIMEOUT) as client:
            train_one_step(client)
        assert health_of(ps.address, tls.credentials()) == health_pb2.HealthCheckResponse.SERVING
        # Plain TCP does not get through: the handshake fails, so the client sees the server as unavailable.
        with ParameterClient([ps.address], token, timeout=5.0, retries=1) as plain:
            with pytest.raises(ParameterServerError, match="did not answer Stats after 1 attempt") as err:
                plain.stats()
        assert err.value.code == "UNAVAILABLE"
        assert ps.stop() == (0, "cellgraph ps: stopped")


# ---------------------------------------------------------------- bad arguments: exit 2, saying why


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--token-file", "{d}/nowhere.token"], "token file '{d}/nowhere.token' does not exist"),
        (["--no-auth", "--new-token"], "--new-token needs --token-file, not --no-auth"),
        (["--no-auth", "--tls-cert", "{d}/server.pem"], "TLS needs both --tls-cert and --tls-key"),
        (["--no-auth", "--tls-key", "{d}/server.key"], "TLS needs both --tls-cert and --tls-key"),
        (["--no-auth", "--tls-client-ca", "{d}/ca.pem"], "--tls-client-ca needs --tls-cert and --tls-key"),
        (
            ["--no-auth", "--tls-cert", "{d}/none.pem", "--tls-key", "{d}/none.key"],
            "TLS certificate chain file '{d}/none.pem' does not exist",
        ),
        (
            ["--no-auth", "--checkpoint-dir", "{d}/a_file"],
            "checkpoint directory '{d}/a_file' is a file, not a folder: give a folder (made if missing)",
        ),
        (["--token-file", "{d}", "--new-token"], "--new-token: cannot write token file '{d}': Is a directory"),
        (
            ["--token-file", "{d}/a_file/t", "--new-token"],
            "--new-token: cannot write token file '{d}/a_file/t': Not a directory",
        ),
        (
            ["--no-auth", "--tls-cert", "{d}/a_file", "--tls-key", "{d}/a_file"],
            "could not bind the parameter server to 127.0.0.1:0: is the port in use, or the address not this "
            "machine's, or the TLS certificate and key not a matching PEM pair?",
        ),
    ],
    ids=[
        "missing-token-file",
        "new-token-no-auth",
        "cert-without-key",
        "key-without-cert",
        "ca-alone",
        "no-cert-file",
        "checkpoint-dir-a-file",
        "new-token-a-folder",
        "new-token-under-a-file",
        "tls-not-pem",
    ],  # fmt: skip
)
def test_bad_arguments_exit_2_saying_why(tmp_path: Path, args: list[str], message: str) -> None:
    (tmp_path / "a_file").write_text("not PEM, not a folder")
    done = run_ps(*(arg.format(d=tmp_path) for arg in args))
    # The last line: gRPC's own log may come first (a TLS pair it refused).
    assert (done.returncode, done.stderr.splitlines()[-1], done.stdout) == (
        2,
        f"cellgraph ps: {message.format(d=tmp_path)}",
        "",
    )
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--port", "-1"], "argument --port: expected an int from 0 to 65535, got '-1'"),
        (["--port", "70000"], "argument --port: expected an int from 0 to 65535, got '70000'"),
        (["--keep", "0"], "argument --keep: expected an int 1 or more, got '0'"),
    ],
)
def test_a_port_or_keep_out_of_range_is_an_argparse_error(args: list[str], words: str) -> None:
    """gRPC served port -1 on 65535 and 70000 on 4464; --keep 0 was taken."""
    done = run_ps("--no-auth", *args)
    assert done.returncode == 2 and f"cellgraph ps: error: {words}" in done.stderr and done.stdout == ""


@pytest.mark.parametrize(
    ("address", "options", "words"),
    [
        ("127.0.0.1:-1", {}, "address '127.0.0.1:-1' needs a port in 0..65535 after the host (0 picks a free one)"),
        ("127.0.0.1:70000", {}, "address '127.0.0.1:70000' needs a port in 0..65535 after the host"),
        ("localhost", {}, "address 'localhost' needs a port in 0..65535 after the host"),
        ("::1:0", {}, "address '::1:0': an IPv6 host needs brackets before the port, like [::1]:0 (host_port() makes"),
        ("127.0.0.1:0", {"keep_checkpoints": 0}, "keep_checkpoints must be 1 or more (Restore reads the newest kept)"),
    ],
)
def test_create_server_refuses_an_address_or_keep_it_would_serve_wrongly(
    address: str, options: dict[str, int], words: str
) -> None:
    with pytest.raises(ParameterServerError) as err:
        create_server(address, token=None, **options)  # type: ignore[arg-type]
    assert words in str(err.value) and err.value.code == "INVALID_ARGUMENT"


@pytest.mark.parametrize(
    ("host", "port", "address"),
    [("::1", 0, "[::1]:0"), ("[::1]", 5000, "[::1]:5000"), ("fe80::1%eth0", 1, "[fe80::1%eth0]:1"),
     ("127.0.0.1", 0, "127.0.0.1:0"), ("localhost", 80, "localhost:80")],
)  # fmt: skip
def test_host_port_brackets_an_ipv6_host(host: str, port: int, address: str) -> None:
    assert host_port(host, port) == address


def ipv6_loopback_binds() -> bool:
    """Whether this machine can listen on ::1 (a CI container may have no IPv6)."""
    if not socket.has_ipv6:
        return False
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True


def test_host_ipv6_is_bracketed_in_the_bind_and_the_printed_address() -> None:
    """``--host ::1`` bound '::1:0' and failed; where ::1 cannot be bound, the refusal names '[::1]:0'."""
    if not ipv6_loopback_binds():
        done = run_ps("--no-auth", "--host", "::1")
        assert done.returncode == 2
        assert done.stderr.splitlines()[-1].startswith("cellgraph ps: could not bind the parameter server to [::1]:0:")
        return
    ps = PsProcess("--no-auth", "--host", "::1")
    try:
        line = ps.line(START_S)
        match = re.fullmatch(r"cellgraph ps: serving on \[::1\]:(\d+) \(NO authentication, .*\)", line)
        assert match, line
        with ParameterClient([f"[::1]:{match[1]}"], None, timeout=TIMEOUT) as client:
            train_one_step(client)
        assert ps.stop() == (0, "cellgraph ps: stopped")
    finally:
        ps.kill()


def test_neither_a_token_file_nor_no_auth_is_an_argparse_error() -> None:
    done = run_ps("--port", "0")
    assert done.returncode == 2
    assert "error: one of the arguments --token-file --no-auth is required" in done.stderr
    assert done.stdout == ""


def test_a_port_in_use_is_refused(token_file: tuple[Path, str]) -> None:
    path, _ = token_file
    with cellgraph_ps("--token-file", path) as first:
        done = run_ps("--token-file", path, "--port", str(first.port))
        assert done.returncode == 2
        assert done.stderr.splitlines()[-1] == (
            f"cellgraph ps: could not bind the parameter server to 127.0.0.1:{first.port}: "
            "is the port in use, or the address not this machine's?"
        ), done.stderr
        assert first.stop() == (0, "cellgraph ps: stopped")
