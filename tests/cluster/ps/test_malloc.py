"""The malloc thresholds: set once per process where glibc has mallopt, and they keep message-sized
buffers mapped (fewer page faults for the same allocations)."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

from cellgraph.cluster.ps.malloc import tune_malloc

# Allocations of message sizes (1 to 6 MiB), each freed before the next pair: what a process that
# receives and sends chunks does. Prints the minor page faults they cost.
PATTERN = """
import resource, sys
import numpy as np
if sys.argv[1] == "tuned":
    from cellgraph.cluster.ps.malloc import tune_malloc
    assert tune_malloc()
sizes = [4 << 20, 3 << 20, 6 << 20, 1 << 20]
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for i in range(200):
    a = np.ones(sizes[i % 4] // 8)
    b = bytes(sizes[(i + 1) % 4])
    del a, b
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""
GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"


def faults(mode: str) -> int:
    done = subprocess.run([sys.executable, "-c", PATTERN, mode], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return int(done.stdout.strip())


@pytest.mark.skipif(not GLIBC, reason="mallopt is glibc's")
def test_tuned_malloc_keeps_message_buffers_mapped() -> None:
    assert tune_malloc() is True
    assert tune_malloc() is True  # once per process; asking again is harmless
    plain, tuned = faults("plain"), faults("tuned")
    assert tuned < 0.85 * plain, (plain, tuned)


def test_servers_and_clients_tune_malloc_in_their_process() -> None:
    # Every process that moves tensors sets the thresholds: a parameter server and a client.
    from cellgraph.cluster.ps import client, server

    assert "tune_malloc" in server.create_server.__code__.co_names
    assert "tune_malloc" in client.ParameterClient.__init__.__code__.co_names
