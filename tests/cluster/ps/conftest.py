"""Real parameter servers for the tests: gRPC servers on 127.0.0.1 port 0, stopped at the end."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from cellgraph.cluster.ps import ParameterClient, create_server, new_token

TIMEOUT = 20.0  # seconds: the deadline of every call a test makes


class Servers:
    """Start servers for one test; ``client()`` reaches all of them."""

    def __init__(self, tmp_path: Path) -> None:
        self.token = new_token()
        self.tmp_path = tmp_path
        self.servers: list[grpc.Server] = []
        self.addresses: list[str] = []
        self.clients: list[ParameterClient] = []

    def start(self, count: int = 1, **options: object) -> list[str]:
        options.setdefault("token", self.token)
        for _ in range(count):
            server, port = create_server("127.0.0.1:0", **options)  # type: ignore[arg-type]
            self.servers.append(server)
            self.addresses.append(f"127.0.0.1:{port}")
        return self.addresses[-count:]

    def client(self, addresses: list[str] | None = None, **options: object) -> ParameterClient:
        options.setdefault("timeout", TIMEOUT)
        token = options.pop("token", self.token)
        client = ParameterClient(addresses or self.addresses, token, **options)  # type: ignore[arg-type]
        self.clients.append(client)
        return client

    def servicer(self, index: int = 0):  # type: ignore[no-untyped-def]
        return self.servers[index].servicer  # type: ignore[attr-defined]

    def stop(self) -> None:
        for client in self.clients:
            client.close()
        for server in self.servers:
            server.stop(None).wait(TIMEOUT)


@pytest.fixture
def ps(tmp_path: Path) -> Iterator[Servers]:
    servers = Servers(tmp_path)
    try:
        yield servers
    finally:
        servers.stop()


def status_of(call: Callable[[], object]) -> grpc.RpcError:
    """The RpcError ``call`` raises; fails the test when it raises none."""
    try:
        call()
    except grpc.RpcError as err:
        return err
    pytest.fail("the call succeeded; expected a gRPC error")
