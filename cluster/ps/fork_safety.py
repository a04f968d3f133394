"""Keep gRPC's fork handlers out of a notebook's ``!cmd``.

grpcio (1.81 and newer) installs ``pthread_atfork`` handlers that restart its
poller thread in every forked child. A child that closes the descriptors it
inherited before it execs (IPython's ``!echo``, pexpect, ptyprocess) closes
the poller's epoll descriptor under it, and gRPC then aborts the child or
prints ``epoll_wait error: Bad file descriptor`` into its output
(grpc/grpc#43055). Measured here: about one ``!echo hi`` in four, run while a
gRPC channel is busy, printed nothing or that line instead of ``hi``.

cellgraph never uses gRPC in a forked child (Dask starts its workers with
``spawn``; a parameter client in a forked child opens fresh channels but is
not supported), so the handlers are switched off. gRPC reads the setting
once, when it is first imported, so this runs before any cellgraph module
imports ``grpc`` (``cluster/ps/__init__.py`` imports this module first). A user's own ``GRPC_ENABLE_FORK_SUPPORT`` is left as it is.

Examples
--------
>>> import os
>>> import cellgraph.cluster.ps
>>> os.environ.get("GRPC_ENABLE_FORK_SUPPORT") in ("false", "0", "1", "true")  # ours, or the user's own
True
"""

from __future__ import annotations

import os
import sys
import warnings

from cellgraph.dataflow import CellgraphWarning

VARIABLE = "GRPC_ENABLE_FORK_SUPPORT"

TOO_LATE = (
    "grpc was imported before cellgraph's parameter service, with {variable} unset: gRPC's fork handlers are on, "
    "and a shell command run while a job trains (`!ls` in a notebook, subprocess with close_fds) may die or print "
    "'epoll_wait error: Bad file descriptor' (grpc/grpc#43055). Set {variable}=false before anything imports grpc."
)


def switch_off_grpc_fork_handlers() -> None:
    """Set ``GRPC_ENABLE_FORK_SUPPORT=false`` unless the user set it; warn when grpc was already imported."""
    if VARIABLE in os.environ:
        return
    if "grpc" in sys.modules:
        warnings.warn(TOO_LATE.format(variable=VARIABLE), CellgraphWarning, stacklevel=2)
        return
    os.environ[VARIABLE] = "false"


switch_off_grpc_fork_handlers()
