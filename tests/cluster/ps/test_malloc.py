"""The malloc thresholds: set once per process where glibc has mallopt, so that message-sized buffers come
from the heap and are reused, instead of a fresh mmap each (checked with glibc's own mallinfo2)."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

from cellgraph.cluster.ps.malloc import tune_malloc

# In a fresh process: a 16 MiB buffer (four 4 MiB messages), and how many of its bytes glibc mmapped for it.
PATTERN = """
import ctypes, ctypes.util, sys
libc = ctypes.CDLL(ctypes.util.find_library("c"))
if sys.argv[1] == "tuned":
    from cellgraph.cluster.ps.malloc import tune_malloc
    assert tune_malloc()

class Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

libc.mallinfo2.restype = Mallinfo2
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
before = libc.mallinfo2().hblkhd
buffer = libc.malloc(16 << 20)
print(libc.mallinfo2().hblkhd - before)
libc.free(buffer)
"""
GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"


def mmapped_bytes(mode: str) -> int:
    done = subprocess.run([sys.executable, "-c", PATTERN, mode], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return int(done.stdout.strip())


@pytest.mark.skipif(not GLIBC, reason="mallopt is glibc's")
def test_tuned_malloc_serves_message_buffers_from_the_heap() -> None:
    assert tune_malloc() is True
    assert tune_malloc() is True  # once per process; asking again is harmless
    assert mmapped_bytes("plain") >= 16 << 20  # glibc's default: a fresh mapping, unmapped again when freed
    assert mmapped_bytes("tuned") == 0  # the heap, kept and reused


def test_servers_and_clients_tune_malloc_in_their_process() -> None:
    # Every process that moves tensors sets the thresholds: a parameter server and a client.
    from cellgraph.cluster.ps import client, server, shard_calls

    assert "tune_malloc" in server.create_server.__code__.co_names
    assert "tune_malloc" in shard_calls.ShardCalls.__init__.__code__.co_names  # every client's connections
    assert issubclass(client.ParameterClient, shard_calls.ShardCalls)
