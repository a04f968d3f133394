"""The anchors of ``ps_throughput.py``: the same model's bytes moved by bare gRPC, a raw socket and Dask.

Each anchor is a context manager that starts its server (a subprocess, or a
one-worker ``LocalCluster``) and yields what ``ps_throughput.main`` times:

- ``grpc_anchor``: bare gRPC Python with raw-bytes serializers, ``push(chunk)``
  and ``pull(chunk)`` of the model as ``chunk``-byte messages (the yardstick;
  both make each message from the model's memory as it is sent), and
  ``push_prebuilt(chunk)``, a push of messages made once beforehand (reported);
- ``tcp_anchor``: a socket, ``sendall`` one way and ``recv_into`` the other
  (the ceiling of the loopback);
- ``dask_anchor``: ``(push, pull)`` as ``Client.scatter`` and ``Client.gather``.

``spawned`` runs a subprocess that prints its address on its first line: the
anchors' servers and the benchmark's ``cellgraph ps`` servers alike.
"""

from __future__ import annotations

import os
import selectors
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

START_DEADLINE_S = 60.0  # a subprocess must print its address within this (imports, Numba cache)
STOP_DEADLINE_S = 10.0
CALL_TIMEOUT_S = 120.0  # deadline of every RPC and socket wait


def _read_line(proc: subprocess.Popen[bytes], deadline: float, what: str) -> str:
    """The first line ``proc`` writes to stdout, waiting at most until ``deadline``."""
    assert proc.stdout is not None
    buf = b""
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while b"\n" not in buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{what} printed nothing within {START_DEADLINE_S:g} s")
            if not sel.select(left):
                continue
            data = os.read(proc.stdout.fileno(), 4096)
            if not data:
                raise RuntimeError(f"{what} exited (code {proc.wait(STOP_DEADLINE_S)}) before printing its address")
            buf += data
    return buf.split(b"\n", 1)[0].decode()


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL if it has not exited within the deadline."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(STOP_DEADLINE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(STOP_DEADLINE_S)


@contextmanager
def spawned(argv: Sequence[str], what: str) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """Run ``argv``, yield it and its first stdout line; stop it on exit, error or not."""
    with tempfile.TemporaryFile() as errors:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=errors, stdin=subprocess.DEVNULL)
        try:
            try:
                line = _read_line(proc, time.monotonic() + START_DEADLINE_S, what)
            except (TimeoutError, RuntimeError) as err:
                errors.seek(0)
                tail = errors.read()[-2000:].decode(errors="replace")
                raise RuntimeError(f"{err}; its stderr ends:\n{tail}") from None
            yield proc, line
        finally:
            _stop(proc)
            if proc.stdout is not None:
                proc.stdout.close()


# The raw TCP anchor's server: 'U' + 8-byte length: receive that many bytes into
# a preallocated buffer, answer one byte; 'D' + length: send that many bytes.
TCP_SERVER = r"""
import socket, struct, sys
size = int(sys.argv[1])
buf = bytearray(size)
view = memoryview(buf)
srv = socket.create_server(("127.0.0.1", 0))
srv.settimeout(60)
print(srv.getsockname()[1], flush=True)
conn, _ = srv.accept()
conn.settimeout(120)
def recv_exact(n):
    got = 0
    while got < n:
        k = conn.recv_into(view[got:n])
        if not k:
            raise SystemExit(0)
        got += k
while True:
    head = conn.recv(9, socket.MSG_WAITALL)
    if len(head) < 9:
        break
    op, n = head[:1], struct.unpack("<Q", head[1:])[0]
    if op == b"U":
        recv_exact(n)
        conn.sendall(b"k")
    else:
        conn.sendall(view[:n])
"""


class TcpAnchor:
    """A socket to a subprocess that swallows (push) or sends (pull) the model's bytes."""

    def __init__(self, sock: Any, arrays: list[Any], np: Any) -> None:
        import struct

        self.sock, self.struct = sock, struct
        self.pid = 0
        self.views = [memoryview(a).cast("B") for a in arrays]
        self.nbytes = sum(v.nbytes for v in self.views)
        # Pulled bytes land in one preallocated buffer per variable, like the PS client's arrays.
        self.out = [memoryview(bytearray(v.nbytes)) for v in self.views]

    def push(self) -> None:
        self.sock.sendall(b"U" + self.struct.pack("<Q", self.nbytes))
        for view in self.views:
            self.sock.sendall(view)
        if self.sock.recv(1) != b"k":
            raise RuntimeError("the TCP anchor's server did not acknowledge the push")

    def pull(self) -> None:
        self.sock.sendall(b"D" + self.struct.pack("<Q", self.nbytes))
        for out in self.out:
            got = 0
            while got < out.nbytes:
                k = self.sock.recv_into(out[got:])
                if not k:
                    raise RuntimeError("the TCP anchor's server closed the connection mid-pull")
                got += k


@contextmanager
def tcp_anchor(arrays: list[Any], np: Any) -> Iterator[TcpAnchor]:
    import socket

    nbytes = sum(a.nbytes for a in arrays)
    with spawned([sys.executable, "-c", TCP_SERVER, str(nbytes)], "TCP anchor subprocess") as (proc, line):
        sock = socket.create_connection(("127.0.0.1", int(line)), timeout=CALL_TIMEOUT_S)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            anchor = TcpAnchor(sock, arrays, np)
            anchor.pid = proc.pid
            yield anchor
        finally:
            sock.close()


# The bare gRPC anchor's server: generic handlers with identity (raw-bytes)
# serializers. Push (stream-unary) copies the chunks into a preallocated buffer
# and answers the byte count; Pull (unary-stream) takes 16 bytes (total, chunk
# size) and sends that many bytes of the buffer as chunks of that size.
GRPC_SERVER = r"""
import sys
from concurrent import futures
import grpc
size = int(sys.argv[1])
view = memoryview(bytearray(size))
def push(chunks, context):
    got = 0
    for chunk in chunks:
        n = len(chunk)
        if got + n > size:
            context.abort(grpc.StatusCode.OUT_OF_RANGE, "more bytes than the model")
        view[got:got + n] = chunk
        got += n
    return got.to_bytes(8, "little")
def pull(request, context):
    n, step = int.from_bytes(request[:8], "little"), int.from_bytes(request[8:16], "little")
    for off in range(0, min(n, size), step):
        yield bytes(view[off:min(off + step, n)])
handler = grpc.method_handlers_generic_handler("bench.Raw", {
    "Push": grpc.stream_unary_rpc_method_handler(push),
    "Pull": grpc.unary_stream_rpc_method_handler(pull),
})
unlimited = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]
server = grpc.server(futures.ThreadPoolExecutor(max_workers=2), handlers=[handler], options=unlimited)
port = server.add_insecure_port("127.0.0.1:0")
server.start()
print(port, flush=True)
server.wait_for_termination()
"""


class GrpcAnchor:
    """Bare gRPC Python streams of raw-bytes messages to a subprocess: the model as ``chunk``-byte messages."""

    def __init__(self, channel: Any, arrays: list[Any], np: Any, pid: int) -> None:
        self.pid = pid
        flat = np.concatenate([a.reshape(-1).view(np.uint8) for a in arrays])
        self.nbytes = int(flat.nbytes)
        self.data = flat.tobytes()
        self.out = memoryview(bytearray(self.nbytes))  # pulled bytes land here, preallocated
        # Identity serializers (None): requests and responses are the bytes themselves.
        self._push = channel.stream_unary("/bench.Raw/Push")
        self._pull = channel.unary_stream("/bench.Raw/Pull")
        self._chunks: dict[int, list[bytes]] = {}

    def push(self, chunk: int) -> None:
        """The model as ``chunk``-byte messages, each made from the model's memory as the stream asks for it: the
        one copy that any sender of fresh arrays makes (gRPC Python sends ``bytes``), as this anchor's pull makes
        on its server's side and a parameter-service push makes of its gradients."""
        view = memoryview(self.data)
        self._send(bytes(view[o : o + chunk]) for o in range(0, self.nbytes, chunk))

    def push_prebuilt(self, chunk: int) -> None:
        """The same messages made once, outside the timed calls, and sent as they are (reported: the floor of a
        push that copies nothing in Python)."""
        if chunk not in self._chunks:
            view = memoryview(self.data)
            self._chunks[chunk] = [bytes(view[o : o + chunk]) for o in range(0, self.nbytes, chunk)]
        self._send(iter(self._chunks[chunk]))

    def _send(self, messages: Iterator[bytes]) -> None:
        reply = self._push(messages, timeout=CALL_TIMEOUT_S)
        if int.from_bytes(reply, "little") != self.nbytes:
            raise RuntimeError(
                f"the bare gRPC server received {int.from_bytes(reply, 'little')} of {self.nbytes} bytes"
            )

    def pull(self, chunk: int) -> None:
        got = 0
        for msg in self._pull(self.nbytes.to_bytes(8, "little") + chunk.to_bytes(8, "little"), timeout=CALL_TIMEOUT_S):
            n = len(msg)
            self.out[got : got + n] = msg
            got += n
        if got != self.nbytes:
            raise RuntimeError(f"the bare gRPC server sent {got} of {self.nbytes} bytes")

    def check(self) -> None:
        if self.out != memoryview(self.data):
            raise RuntimeError("the bare gRPC round trip changed the model's bytes")


@contextmanager
def grpc_anchor(arrays: list[Any], np: Any) -> Iterator[GrpcAnchor]:
    import grpc

    nbytes = sum(a.nbytes for a in arrays)
    with spawned([sys.executable, "-c", GRPC_SERVER, str(nbytes)], "bare gRPC anchor subprocess") as (proc, line):
        options = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]
        with grpc.insecure_channel(f"127.0.0.1:{int(line)}", options=options) as channel:
            grpc.channel_ready_future(channel).result(timeout=START_DEADLINE_S)
            yield GrpcAnchor(channel, arrays, np, proc.pid)


@contextmanager
def dask_anchor(arrays: list[Any]) -> Iterator[tuple[Callable[[], None], Callable[[], None]]]:
    """(push, pull) through Dask: scatter the arrays to one worker process, gather them back."""
    import logging

    from distributed import Client, LocalCluster

    logging.getLogger("distributed").setLevel(logging.ERROR)
    # The worker process logs a heartbeat traceback when the scheduler stops first; it is harmless noise.
    os.environ.setdefault("DASK_LOGGING__DISTRIBUTED", "critical")
    cluster = LocalCluster(n_workers=1, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address=None)
    try:
        client = Client(cluster, timeout=START_DEADLINE_S)
        try:
            held: list[Any] = []

            def push() -> None:
                # hash=False: no tokenizing of 100 MB (and no reuse of an earlier scatter's keys).
                held[:] = client.scatter(arrays, direct=True, hash=False, timeout=CALL_TIMEOUT_S)

            def pull() -> None:
                client.gather(held, direct=True)

            yield push, pull
            del held[:]
        finally:
            client.close(timeout=STOP_DEADLINE_S)
    finally:
        cluster.close(timeout=STOP_DEADLINE_S)
