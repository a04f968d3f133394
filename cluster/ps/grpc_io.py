"""gRPC's socket I/O: its classic epoll poller rather than EventEngine threads, for small messages' sake.

grpcio 1.85 moves TCP bytes through EventEngine by default: a message that
arrives wakes an EventEngine thread, which hands it to the completion queue,
whose poller thread wakes the asyncio loop. gRPC's classic I/O path reads the
socket in the thread that polls the completion queue, one hand-over fewer at
each end. Measured here (2 cores, loopback, a 1 KB message ping-ponged on a
held stream, 3,000 round trips): 0.102-0.121 ms a round trip against
0.166-0.202 ms, and about 65 us of CPU per round trip on each side against
90-110 us. The parameter service's 1 KB push and pull went from 0.44 to
0.31-0.35 ms (BENCHMARKS.md section 4). Bulk transfers do not change (their
time is copying).

The switch is gRPC's own ``GRPC_EXPERIMENTS`` variable: the EventEngine
experiments for client, listener and other endpoints turned off. gRPC reads it
when it is first imported, so this module runs before anything in cellgraph
imports ``grpc`` (``cluster/ps/__init__.py`` imports it, after
``fork_safety``); processes started afterwards (Dask's workers, ``cellgraph
ps``) inherit it. It is set only:

- when the user has not set ``GRPC_EXPERIMENTS`` (theirs is left alone);
- when ``grpc`` is not imported yet (too late then: nothing is changed, and
  nothing is wrong, only slower);
- for the grpcio versions it was measured on (``MEASURED``): a later gRPC may
  rename or drop these experiments, and it prints an error line for a name
  it does not know.

Examples
--------
>>> setting({}, "1.85.1", grpc_imported=False)
'-event_engine_client,-event_engine_listener,-event_engine_for_all_other_endpoints'
>>> setting({"GRPC_EXPERIMENTS": "-event_engine_dns"}, "1.85.1", grpc_imported=False) is None  # the user's own
True
>>> setting({}, "1.99.0", grpc_imported=False) is None  # not measured there
True
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from importlib import metadata

VARIABLE = "GRPC_EXPERIMENTS"
CLASSIC_IO = "-event_engine_client,-event_engine_listener,-event_engine_for_all_other_endpoints"
# grpcio's (major, minor) versions where these experiments exist and the classic path was measured faster.
MEASURED = frozenset({(1, 85)})


def _major_minor(version: str) -> tuple[int, int] | None:
    parts = version.split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return None


def setting(environ: Mapping[str, str], grpcio_version: str | None, grpc_imported: bool) -> str | None:
    """The value to give ``GRPC_EXPERIMENTS``, or None to leave it as it is (see the module's docstring)."""
    if VARIABLE in environ or grpc_imported or grpcio_version is None:
        return None
    return CLASSIC_IO if _major_minor(grpcio_version) in MEASURED else None


def installed_grpcio() -> str | None:
    """grpcio's version, read from its metadata (importing grpc to ask would be too late)."""
    try:
        return metadata.version("grpcio")
    except metadata.PackageNotFoundError:
        return None


def use_classic_io() -> None:
    """Set ``GRPC_EXPERIMENTS`` for gRPC's classic I/O path where ``setting`` says so."""
    value = setting(os.environ, installed_grpcio(), "grpc" in sys.modules)
    if value is not None:
        os.environ[VARIABLE] = value


use_classic_io()
