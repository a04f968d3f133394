"""Keep gRPC's asyncio layer up for the life of the process, once it is used.

gRPC counts the asyncio channels, calls and servers alive and shuts its
asyncio layer down when the count reaches zero: it takes its wake-up socket
off every event loop it was bound to, from whichever thread dropped the last
object, and closes the socket. Another thread's loop that is handling gRPC
events at that moment reads a closed socket, and asyncio prints "Exception in
callback ... OSError: [Errno 9] Bad file descriptor" on stderr: in a notebook,
into the cell that closed a job. Here it happened about once in 75 client
closes while 8 threads' held streams were cancelled (the step loop was still
handling their events when the kernel's thread dropped the closed channel).

So the first step loop or parameter server of a process takes one reference
of its own and never returns it: the layer starts once and is never torn down
under a running loop (nor restarted, with a new poller thread, for each job).

Examples
--------
>>> import asyncio
>>> async def start():  # on the loop that gRPC would bind anyway
...     keep_grpc_aio_up()
>>> asyncio.run(start())
"""

from __future__ import annotations

import os
import threading

import grpc

_lock = threading.Lock()
_held_in = -1  # the process (pid) holding its reference; a forked child takes its own


def keep_grpc_aio_up() -> None:
    """Take this process's one lasting reference on gRPC's asyncio layer (no-op when taken).

    Call it on a running event loop that gRPC binds anyway (the step loop, a
    server's loop): taking a reference also binds the calling thread's loop.
    """
    global _held_in
    with _lock:
        if _held_in != os.getpid():
            grpc.aio.init_grpc_aio()
            _held_in = os.getpid()
