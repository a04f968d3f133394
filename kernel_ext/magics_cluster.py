"""``%cluster up | connect ADDRESS | status | scale N | down``: a ``cg.Cluster`` kept in the namespace as ``cluster``."""

from __future__ import annotations

import contextlib
import importlib
import re
from typing import TYPE_CHECKING, Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class
from IPython.core.magic_arguments import argument, kwds, magic_arguments

from cellgraph.cluster.reach import tls_configured
from cellgraph.dataflow.errors import CellgraphError

from .arguments import MagicFormatter, count, parse, positive_float, positive_int, ps_count, usage_error
from .display import show_as
from .interrupted import InterruptibleStart

if TYPE_CHECKING:
    import argparse

    from cellgraph.cluster.cluster import Cluster

    from .extension import Extension

ACTIONS = ("up", "connect", "status", "scale", "down")
UP_OPTIONS = {"workers": "--workers", "ps": "--ps", "gpus": "--gpus", "threads": "--threads"}
TLS_HELP = (
    "set distributed.comm.tls.ca-file, distributed.comm.tls.client.cert and .key in Dask's configuration, "
    "or connect in Python: cluster = cg.Cluster.connect(ADDRESS, security=distributed.security.Security(...))"
)
# How often %cluster scale looks at the scheduler's workers while it waits for them to come or go.
SCALE_POLL_S = 0.2


@magics_class
class ClusterMagics(Magics):
    """``%cluster``."""

    def __init__(self, shell: Any, ext: Extension) -> None:
        super().__init__(shell)
        self.ext = ext

    @magic_arguments()
    @kwds(formatter_class=MagicFormatter)
    @argument("-h", "--help", action="store_true", help="show this help and do nothing")
    @argument("--workers", type=positive_int, default=None, help="up: training worker processes (default 2)")
    @argument(
        "--ps",
        type=ps_count,
        default=None,
        help="up: parameter-server processes (default 1), or colocated: a shard in each training worker",
    )
    @argument("--gpus", type=count, default=None, help="up: GPUs each training worker offers (default none)")
    @argument("--threads", type=positive_int, default=None, help="up: threads per worker process (default 1)")
    @argument(
        "--timeout",
        type=positive_float,
        default=60.0,
        help="up, scale: seconds to wait for the workers to start or leave; connect: seconds to wait for the "
        "scheduler to answer (a refused port or an unknown host fails at once); default 60",
    )
    @argument("action", choices=ACTIONS, metavar="{up,connect,status,scale,down}", help="what to do")
    @argument("value", nargs="?", metavar="ADDRESS|N", help="connect: the scheduler's address; scale: training workers")
    @line_magic
    def cluster(self, line: str) -> None:
        """Start, join, show, scale or close the cluster that %train and %placement use.

        up starts a local Dask cluster (processes on this machine); connect joins
        the scheduler at ADDRESS (tcp://host:8786); status shows the cluster;
        scale N makes a local cluster's training workers N; down closes the cluster
        (and the jobs %train started on it). The cluster is bound to `cluster`.
        """
        args = parse(self.cluster, line)
        if args is None:
            return
        self._check(args)
        if args.action == "up":
            self._up(args)
        elif args.action == "connect":
            self._connect(args)
        elif args.action == "status":
            self._status()
        elif args.action == "scale":
            self._scale(int(args.value), args.timeout)
        else:
            self._down()

    def _check(self, args: argparse.Namespace) -> None:
        """Every problem with the arguments taken together, before anything starts."""
        given = [flag for key, flag in UP_OPTIONS.items() if getattr(args, key) is not None]
        if given and args.action != "up":
            raise usage_error(self.cluster, f"{', '.join(given)} only go with %cluster up, not {args.action}")
        if args.action == "connect" and args.value is None:
            raise usage_error(
                self.cluster, "connect needs the scheduler's ADDRESS, e.g. %cluster connect tcp://host:8786"
            )
        if args.action == "scale":
            if args.value is None or not re.fullmatch(r"[0-9]+", args.value) or int(args.value) < 1:
                raise usage_error(
                    self.cluster, f"scale needs N, a number of training workers of 1 or more, got {args.value!r}"
                )
        elif args.action != "connect" and args.value is not None:
            raise usage_error(self.cluster, f"{args.action} takes no {args.value!r}")
        # The two refusals below are about the notebook's state, not the arguments: no usage with them.
        current = self.ext.current_cluster()
        if args.action in ("up", "connect") and current is not None:
            # Most often the cell that started it, run again: that cleared its view from the cell, shown again here.
            show_as("cluster_view", "ClusterView", current)
            raise UsageError(
                f"%cluster {args.action}: a cluster is up already ({current.scheduler_address}, shown above): "
                "%cluster down first"
            )
        if args.action == "scale" and current is None:
            raise UsageError("%cluster scale: no cluster is up to scale: %cluster up first")

    def _up(self, args: argparse.Namespace) -> None:
        from cellgraph.cluster.cluster import Cluster

        options = {"workers": args.workers or 2, "ps": 1 if args.ps is None else args.ps}
        with InterruptibleStart() as start:
            try:
                cluster = Cluster.local(
                    **options, threads_per_worker=args.threads or 1, gpus=args.gpus, timeout=args.timeout
                )
            except CellgraphError as err:
                raise UsageError(f"%cluster up: {err}") from None
            except KeyboardInterrupt:  # Kernel > Interrupt: Cluster.local closed what it had started
                interrupted = True
            else:
                interrupted = False
        if interrupted:
            raise UsageError(
                f"%cluster up: interrupted while the local cluster started: its scheduler is closed and "
                f"{start.cleanup()}; nothing of it is left running (%cluster up starts one again)"
            )
        self._adopt(cluster)

    def _connect(self, args: argparse.Namespace) -> None:
        from cellgraph.cluster.cluster import Cluster

        # Cluster.connect refuses it too; here the hint fits a magic, which cannot pass security=.
        if args.value.startswith("tls://") and not tls_configured():
            raise UsageError(
                f"%cluster connect: {args.value} is a TLS address, and Dask's configuration has no client "
                f"certificates: {TLS_HELP}"
            )
        try:  # a refused port or an unknown host fails within seconds, saying which (Cluster.connect looks first)
            cluster = Cluster.connect(args.value, timeout=args.timeout)
        except CellgraphError as err:
            raise UsageError(f"%cluster connect: {err}") from None
        except KeyboardInterrupt:  # Kernel > Interrupt while the scheduler keeps silent: the wait's frames say nothing
            raise UsageError(
                f"%cluster connect: interrupted while waiting for the Dask scheduler at {args.value} to answer; not "
                f"connected (--timeout {args.timeout:g} s gives up by itself)"
            ) from None
        self._adopt(cluster)

    def _adopt(self, cluster: Cluster) -> None:
        self.ext.adopt_cluster(cluster)
        show_as("cluster_view", "ClusterView", cluster)
        # The training monitor's modules (bqplot) load here, in a command that takes seconds anyway, so that the
        # first %train on this cluster returns at once. Without them %train shows a text summary and says why.
        with contextlib.suppress(ImportError):
            importlib.import_module("cellgraph.widgets.training_monitor")

    def _status(self) -> None:
        cluster = self.ext.current_cluster()
        if cluster is None:
            print("no cluster is up: %cluster up starts one on this machine, %cluster connect ADDRESS joins one")
            return
        show_as("cluster_view", "ClusterView", cluster)

    def _down(self) -> None:
        current = self.ext.current_cluster()
        live = [(job, name, job.status) for job, name in self.ext.live_jobs() if job.cluster is current]
        cluster = self.ext.close_cluster()
        if cluster is None:
            print("no cluster is up: nothing to close")
            return
        if cluster.kind == "local":
            print(f"closed the cluster at {cluster.scheduler_address}")
        else:  # %cluster connect's (or a wrapped client's): only this notebook's hold on it goes
            print(
                f"disconnected from the cluster at {cluster.scheduler_address} ({cluster.kind}): its scheduler and "
                "workers keep running"
            )
        # Its jobs end with it: a job that was training must not stop without a word.
        for job, name, was in live:
            print(stopped_job_line(job.job_id, name, was, job.steps, job.events, job.status))

    def _scale(self, n: int, timeout: float) -> None:
        cluster = self.ext.current_cluster()
        assert cluster is not None  # _check made sure
        before = len(cluster.training_workers())
        with InterruptibleStart() as start:  # its workers start as %cluster up's do: quiet if interrupted
            try:
                cluster.scale(n, timeout)
            except CellgraphError as err:
                raise UsageError(f"%cluster {err}") from None
            except KeyboardInterrupt:
                interrupted = True
                # Dask goes on starting the new workers: until each has joined or died (and been logged).
                start.settle(lambda alive: len(alive) <= len(cluster.training_workers()) - before)
            else:
                interrupted = False
        if interrupted:  # the workers that joined stay; those still starting were stopped by the scale
            now = len(cluster.training_workers())
            raise UsageError(
                f"%cluster scale: interrupted while the training workers went from {before} to {n}: the cluster has "
                f"{now} now (%cluster scale {n} asks again)"
            )
        print(f"training workers: {before} -> {n}")
        show_as("cluster_view", "ClusterView", cluster)


_AT_STEP = re.compile(r"at global step (\d+)")


def stopped_job_line(job_id: str, name: str | None, was: str, steps: int, events: list[str], status: str) -> str:
    """The line ``%cluster down`` says of a job that was starting or running on the cluster it closed.

    >>> stopped_job_line("job-1a2b3c4d", "job", "running", 1000, ["12:00:02 closed while training, at global step 120: the job is stopped"], "stopped")
    'job job-1a2b3c4d (`job`), which was running on it, is stopped at global step 120 of 1000'
    """
    bound = f" (`{name}`)" if name else ""
    # The job's own event says where it stopped: the servers are gone now, and job.global_step() with them.
    found = next((m for m in map(_AT_STEP.search, reversed(events)) if m is not None), None)
    where = f" at global step {found.group(1)} of {steps}" if found is not None and was == "running" else ""
    return f"job {job_id}{bound}, which was {'still starting' if was == 'starting' else was} on it, is {status}{where}"
