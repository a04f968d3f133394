"""Calls to a Dask cluster with a deadline: the client's blocking calls have none of their own.

Examples
--------
>>> call_with_deadline(lambda: 6 * 7, "a quick answer")
42
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent import futures
from typing import TypeVar

from .errors import ClusterError

T = TypeVar("T")

# Deadline of each question the cluster asks its workers or scheduler (client.run, plugin (un)registration).
CALL_TIMEOUT_S = 30.0


def call_with_deadline(call: Callable[[], T], what: str, timeout: float = CALL_TIMEOUT_S) -> T:
    """``call()``, or a ClusterError after ``timeout`` seconds naming ``what`` did not finish.

    The client's blocking calls have no deadline of their own; the call runs on
    a daemon thread that finishes when the cluster answers or the client closes.
    Not a ThreadPoolExecutor's thread: Python joins those at exit, so one call
    that never returns would keep the process (a CLI after Ctrl-C) from ending.
    """
    outcome: futures.Future[T] = futures.Future()

    def run() -> None:
        if not outcome.set_running_or_notify_cancel():
            return
        try:
            outcome.set_result(call())
        except BaseException as err:  # noqa: BLE001 - handed to the caller, who raises it
            outcome.set_exception(err)

    threading.Thread(target=run, name="cellgraph-cluster-call", daemon=True).start()
    try:
        return outcome.result(timeout)
    except futures.TimeoutError as err:
        raise ClusterError(
            f"{what}: no answer within {timeout:.3g} s; is a worker stuck (holding the GIL) or gone?"
        ) from err
