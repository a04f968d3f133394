"""``cellgraph ps``: the command line's own process, reached by real clients over 127.0.0.1."""

from __future__ import annotations

import contextlib
import os
import queue
import re
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import trustme
from grpc_health.v1 import health_pb2, health_pb2_grpc

from cellgraph.cluster.errors import ParameterServerError
from cellgraph.cluster.ps import ClientTLS, OptimizerConfig, ParameterClient, new_token, write_token_file

from .conftest import TIMEOUT

COMMAND = [sys.executable, "-m", "cellgraph.cli", "ps", "--host", "127.0.0.1"]
SERVING = re.compile(r"cellgraph ps: serving on 127\.0\.0\.1:(\d+) \((.*)\)")
GRPC_LOG = re.compile(r"[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ \S+:\d+\] ")  # gRPC core's own log lines
START_S = 30.0  # seconds for the process to import cellgraph and listen
STOP_S = 15.0  # seconds for it to stop after a signal (it polls every 0.5 s, then a 5 s grace)


class PsProcess:
    """A running ``cellgraph ps``; its output is read by threads, so no read can block a test."""

    def __init__(self, *args: str | os.PathLike[str]) -> None:
        self.proc = subprocess.Popen(
            [*COMMAND, *map(str, args)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.stdout: queue.Queue[str | None] = queue.Queue()  # None: stdout closed
        self.stderr: list[str] = []
        self._readers = [
            threading.Thread(target=self._read_stdout, daemon=True),
            threading.Thread(target=self._read_stderr, daemon=True),
        ]
        for reader in self._readers:
            reader.start()
        self.port = 0
        self.settings = ""

    def _read_stdout(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.stdout.put(line.rstrip("\n"))
        self.stdout.put(None)

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr.append(line.rstrip("\n"))

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def line(self, timeout: float) -> str:
        """The next line it prints, failing the test when none comes within ``timeout`` seconds."""
        try:
            line = self.stdout.get(timeout=timeout)
        except queue.Empty:
            pytest.fail(f"cellgraph ps printed nothing within {timeout} s; stderr: {self.stderr_text()}")
        if line is None:
            self.proc.wait(TIMEOUT)
            pytest.fail(
                f"cellgraph ps exited with {self.proc.returncode} before printing; stderr: {self.stderr_text()}"
            )
        return line

    def serving(self) -> PsProcess:
        """Wait for its "serving on" line and learn its port."""
        line = self.line(START_S)
        match = SERVING.fullmatch(line)
        assert match, line
        self.port, self.settings = int(match[1]), match[2]
        assert self.port > 0
        return self

    def stop(self, signum: int = signal.SIGTERM) -> tuple[int, str]:
        """Send ``signum``; its exit code and the next line it printed."""
        self.proc.send_signal(signum)
        line = self.line(STOP_S)
        return self.proc.wait(STOP_S), line

    def stderr_text(self) -> str:
        """What it wrote to stderr: all of it once it has exited, what has arrived so far before."""
        if self.proc.poll() is not None:
            self._readers[1].join(TIMEOUT)
        return "\n".join(self.stderr)

    def python_stderr(self) -> str:
        """``stderr_text`` without gRPC core's log lines: what Python printed (warnings, tracebacks)."""
        return "\n".join(line for line in self.stderr_text().splitlines() if not GRPC_LOG.match(line))

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(TIMEOUT)
        for reader in self._readers:
            reader.join(TIMEOUT)


@contextlib.contextmanager
def cellgraph_ps(*args: str | os.PathLike[str]) -> Iterator[PsProcess]:
    """A ``cellgraph ps`` that is listening; killed at the end however the test went."""
    ps = PsProcess(*args)
    try:
        yield ps.serving()
    finally:
        ps.kill()


def run_ps(*args: str | os.PathLike[str]) -> subprocess.CompletedProcess[str]:
    """``cellgraph ps`` for a run that must end by itself (bad arguments)."""
    return subprocess.run([*COMMAND, *map(str, args)], capture_output=True, text=True, timeout=START_S, check=False)


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
        started = time.monotonic()
        assert ps.stop(signum) == (0, "cellgraph ps: stopped")
        assert time.monotonic() - started < STOP_S
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
    ],
    ids=["missing-token-file", "new-token-no-auth", "cert-without-key", "key-without-cert", "ca-alone", "no-cert-file"],
)
def test_bad_arguments_exit_2_saying_why(tmp_path: Path, args: list[str], message: str) -> None:
    done = run_ps(*(arg.format(d=tmp_path) for arg in args))
    assert (done.returncode, done.stderr, done.stdout) == (2, f"cellgraph ps: {message.format(d=tmp_path)}\n", "")


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
