"""The Dask side of ``Cluster``: starting an embedded ``LocalCluster`` with named workers, listing a
scheduler's workers (with a deadline), closing what was started, and telling a script without a main
guard why its workers never come.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import sys
import time
from pathlib import Path
from types import FrameType
from typing import Any

import dask
from distributed import Client, LocalCluster, Nanny
from distributed.security import Security
from distributed.system import MEMORY_LIMIT

from . import worker_signals
from .calls import CALL_TIMEOUT_S
from .errors import ClusterError

CHECK_CONNECT = (
    "check that the scheduler is running, that the address and port are right (e.g. tcp://host:8786), "
    "and that no firewall blocks the port"
)


def start_local(
    roles: dict[str, dict[str, float]], threads_per_worker: int, secure: bool, timeout: float, script: str | None
) -> tuple[Client, LocalCluster]:
    """A ``LocalCluster`` on 127.0.0.1 with one worker process per entry of ``roles`` (its name: its Dask
    resources), and a client of it, once every worker has joined; a ``ClusterError`` after ``timeout`` s
    (``script``: the script whose top level called, named in that error), with nothing left running."""
    deadline = time.monotonic() + timeout
    security = Security.temporary() if secure else None
    processes = len(roles)
    # No workers yet: they differ in resources, so each gets its own entry in the worker spec below.
    local = LocalCluster(
        n_workers=0,
        threads_per_worker=threads_per_worker,
        processes=True,
        host="127.0.0.1",
        # The scheduler serves HTTP (the dashboard, or without bokeh a page saying to install it) even
        # with dashboard_address=None, then on port 8787: port 0 never clashes with another cluster.
        dashboard_address="127.0.0.1:0",
        security=security,
        memory_limit=MEMORY_LIMIT // processes,
    )
    client: Client | None = None
    try:
        # Each worker process ignores Ctrl-C, which a notebook's interrupt sends to the kernel's whole
        # process group (worker_signals.py).
        template = {**local.new_spec["options"], "preload": [worker_signals.PRELOAD]}
        for name, resources in roles.items():
            local.worker_spec[name] = {"cls": Nanny, "options": {**template, "resources": dict(resources)}}
        # SpecCluster.scale(n) with n entries already in worker_spec adds none and starts the missing ones.
        local.scale(processes)
        # A Client given the LocalCluster object would wait for its workers with no deadline (it awaits
        # the cluster); given the scheduler's address it does not, and wait_for_workers has one.
        client = Client(local.scheduler_address, security=local.security, timeout=timeout, set_as_default=False)
        # Dask reads a falsy timeout as "no deadline": once this one has passed (LocalCluster alone can
        # take longer than a short timeout), wait a millisecond, never 0.
        client.wait_for_workers(processes, timeout=max(1e-3, deadline - time.monotonic()))
    except (TimeoutError, OSError) as err:
        arrived = 0
        with contextlib.suppress(Exception):  # the count only makes the message better
            arrived = len(scheduler_workers(client)) if client is not None else 0
        # A close that runs past its own deadline (workers still starting, at a load of 15 on 2 cores) must not
        # hide why the start failed: the ClusterError below is what the user needs to read.
        with contextlib.suppress(Exception):
            close_quietly(client, local)
        hint = f'; if {script} starts the cluster outside `if __name__ == "__main__":`, see above' if script else ""
        raise ClusterError(
            f"Cluster.local: only {arrived} of {processes} worker processes started within {timeout:g} s "
            f"({err}); is the machine short of memory or processes? Try a larger timeout= or fewer workers"
            f"{hint}"
        ) from err
    except BaseException:
        close_quietly(client, local)
        raise
    return client, local


def scheduler_workers(client: Client) -> dict[str, dict[str, Any]]:
    """Every worker the scheduler knows, with its info, asked for now, within ``CALL_TIMEOUT_S``.

    Not ``client.scheduler_info(n_workers=-1)``: it stores the answer on the
    client and returns the stored value, and the client's periodic refresh
    (every 2 s, which asks for no workers) can replace it in between, so that
    a cluster with workers reads as one without. It also has no deadline.
    """
    try:
        identity: dict[str, Any] = client.sync(client.scheduler.identity, n_workers=-1, callback_timeout=CALL_TIMEOUT_S)
    except TimeoutError as err:
        raise ClusterError(
            f"the Dask scheduler at {client.scheduler.address} did not list its workers within "
            f"{CALL_TIMEOUT_S:g} s (stopped, overloaded or cut off?): {CHECK_CONNECT}"
        ) from err
    workers: dict[str, dict[str, Any]] = identity["workers"]
    return workers


# Dask starts each worker process by spawning a fresh interpreter, which imports the user's script as
# ``__mp_main__``: a script that starts a cluster at its top level would start one in every worker, which
# cannot start processes of its own, and the workers never arrive.
_UNGUARDED_SCRIPT = (
    "Cluster.local was called while a worker process was importing the main script: Dask's worker processes "
    'import it, so a script must start its cluster under `if __name__ == "__main__":` (a notebook needs nothing)'
)


def refuse_a_worker_importing_the_script() -> None:
    """A ClusterError when the caller runs in a worker process importing the main script."""
    # A spawned child runs the script's code with ``__name__ == "__mp_main__"`` (runpy's run_name): a frame
    # of it among the callers means the script's own top level called here.
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        if frame.f_globals.get("__name__") == "__mp_main__":
            raise ClusterError(_UNGUARDED_SCRIPT)
        frame = frame.f_back


def script_top_level(caller: FrameType) -> str | None:
    """The script's path when ``caller`` is a script's top level (not a function, a notebook or a test)."""
    if caller.f_code.co_name == "<module>" and caller.f_globals.get("__name__") == "__main__":
        return caller.f_globals.get("__file__")
    return None


def refuse_an_unguarded_script(script: str | None, line: int) -> None:
    """A ClusterError, before anything starts, when ``script``'s top level calls at ``line`` outside
    ``if __name__ == "__main__":`` and Dask spawns its worker processes (its default): each would import the
    script and start a cluster of its own, and the caller would wait out its timeout for workers that never
    come. Nothing is said when the script cannot be read back (the workers then say it themselves)."""
    if script is None or dask.config.get("distributed.worker.multiprocessing-method", "spawn") == "fork":
        return
    try:
        tree = ast.parse(Path(script).read_text(), script)
    except (OSError, SyntaxError, ValueError):
        return
    for node in tree.body:
        # Any test that compares __name__ with "__main__" (`... and len(sys.argv) > 1` too) counts as a guard.
        if isinstance(node, ast.If) and any(_is_main_guard(part) for part in ast.walk(node.test)):
            if node.lineno <= line <= (node.end_lineno or node.lineno):
                return
    raise ClusterError(
        f"Cluster.local was called at the top level of {script} (line {line}), outside "
        '`if __name__ == "__main__":`: Dask\'s worker processes import the script, and each would start a cluster '
        "of its own; put the code that starts the cluster under that guard (a notebook needs nothing)"
    )


def _is_main_guard(test: ast.AST) -> bool:
    """``__name__ == "__main__"``, either way round."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
        return False
    sides = [test.left, test.comparators[0]]
    names = [s.id for s in sides if isinstance(s, ast.Name)]
    values = [s.value for s in sides if isinstance(s, ast.Constant)]
    return names == ["__name__"] and values == ["__main__"]


def close_quietly(client: Client | None, local: LocalCluster | None, timeout: float = 30.0) -> None:
    """Close ``client`` then ``local`` (each may be None), the second even when the first fails."""
    deadline = time.monotonic() + timeout
    try:
        if client is not None:
            client.close(timeout=timeout)
    finally:
        if local is not None:
            remaining = max(1.0, deadline - time.monotonic())
            for worker in list(local.workers.values()):
                # LocalCluster closes each worker with Nanny.close's default 5 s, and a worker process still there
                # after 4 s is killed with a "Worker process still alive" warning, which lands in the user's cell:
                # too short for a process that ran Numba and gRPC on a loaded machine (5.5 s measured at a load of
                # 20 on 2 cores). The same close, in Dask's own order, with this close's deadline.
                worker.close = functools.partial(worker.close, timeout=remaining)  # type: ignore[method-assign]
            local.close(timeout=remaining)
